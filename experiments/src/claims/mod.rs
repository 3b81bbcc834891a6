//! `results/claims.md`: one row per claim of the FLASH and GQA papers that has an experiment here, with the
//! numbers and a verdict computed from the committed CSVs (`just claims`). A claim whose results
//! are missing or in an older format gets no verdict, and the row says why. Every row also names
//! the scale it was decided at ([`crate::scale`]).
//!
//! - **F1** latency: FLASH's training step grows less from the shortest to the longest context than
//!   Transformer++'s (same tokens per step), `table11`: the ratio of the two growths over the
//!   fastest and slowest timed steps.
//! - **F2** FLASH-Quad reaches Transformer++'s final perplexity at lower cost (speedup > 1), masked
//!   (`fig5`) and causal (`fig6`), per context.
//! - **F3** Performer is the slowest model in causal training (`fig6`, the step-time calibration):
//!   Performer's step time over the slowest other model's.
//! - **F4** FLASH reaches Transformer++'s final perplexity at lower cost, masked and causal, per
//!   context.
//!
//! - **F5** LocalOnly and GlobalOnly are both clearly worse than FLASH (`fig7`): their final
//!   perplexity over FLASH's, above 1 over every seed pair, per context.
//! - **F6** chunking costs the GAU less than the Transformer (`table5`): (MC-TFM++ / Transformer++)
//!   / (FLASH / FLASH-Quad) in final perplexity, above 1 over every combination of seeds.
//! - **F7** GAU stacks are competitive with the Transformer at every size (`fig3`): per size,
//!   FLASH-Quad's final perplexity over Transformer++'s below 1 + [`PPL_MARGIN`] over its whole
//!   range (refuted when wholly above).
//! - **F8** every change to a layer's default hurts (`table1` for the GAU, `table2` for
//!   Transformer++): per context, every ablation's final perplexity clearly above the default's;
//!   refuted when one is clearly below, with the counts of each outcome.
//! - **F9** FLASH fine-tunes as well as Transformer+ at lower cost (`table4`): the F1 difference
//!   over seed pairs within ±[`crate::qa_finetune::F1_MARGIN`] and the pre-training step-time
//!   ratio above 1.
//! - **F10** larger chunks help more at longer contexts (`fig8`): the final perplexity of FLASH
//!   with the smallest chunk over that with the largest grows from the shortest context to the
//!   longest, per seed.
//!
//! - **G1-time** (the GQA paper) GQA-8 decodes close to MQA's speed, both far faster than MHA
//!   (`gqa_fig6`, XXL per-layer shapes): per interleaved round, MHA's decoding step time over MQA's
//!   and GQA-8's above [`FAR_FASTER`], and GQA-8's over MQA's below [`CLOSE_TO_MQA`].
//! - **G1**, **G2**, **G3** (the GQA paper's quality claims) from `gqa_table1`, `gqa_fig4` and
//!   `gqa_fig5`: see [`crate::gqa::quality`].
//!
//! `table3` (causal LM on long books, Transformer+ as the baseline, the paper's PG-19 table) adds
//! F2 and F4 rows of its own.

mod flash_cost;
mod flash_layers;
mod gqa;
mod sources;

pub use self::flash_cost::TOKEN_LEVEL_PERFORMER;
pub use self::gqa::{CLOSE_TO_MQA, FAR_FASTER};

use std::path::Path;

use anyhow::Result;

use self::flash_cost::{latency_claim, performer_claims, speedup_claims};
use self::flash_layers::{
    ablation_claims, chunk_size_claims, chunking_claims, finetune_claim, layer_ablation_claims,
    size_claims,
};
use self::gqa::{decode_claim, gqa_quality_claims};
use self::sources::{scale_of, source_dir};
use crate::claim::Claim;
use crate::verdict::PPL_MARGIN;

/// Writes `<results>/claims.md` from the committed results under `results`.
pub fn write(results: &Path) -> Result<()> {
    let mut claims = Vec::new();
    match latency_claim(results) {
        Ok(c) => claims.push(c),
        Err(e) => claims.push(Claim {
            id: "F1",
            claim: "FLASH's training step is flat in context, Transformer++'s grows".into(),
            source: "[table11](table11/latency.csv)".into(),
            ours: format!("no result ({e:#}); run `just repro table11`"),
            paper: "FLASH flat, Transformer++ quadratic",
            verdict: None,
        }),
    }
    let f2 = "FLASH-Quad 1.1–2.5× (C4 MLM), 1.2–2.5× (Wiki-40B LM) less training cost";
    let f4 = "FLASH 1.0–4.8× (C4 MLM), 1.2–4.9× (Wiki-40B LM) less training cost";
    claims.extend(speedup_claims(results, "fig5", "F2", "flash_quad", f2));
    claims.extend(speedup_claims(results, "fig6", "F2", "flash_quad", f2));
    claims.extend(performer_claims(results));
    claims.extend(speedup_claims(results, "fig5", "F4", "flash", f4));
    claims.extend(speedup_claims(results, "fig6", "F4", "flash", f4));
    let f2_pg19 = "FLASH-Quad 5.23× less training cost than Transformer+ (PG-19, context 8K)";
    let f4_pg19 = "FLASH 12.12× less training cost than Transformer+ (PG-19, context 8K)";
    claims.extend(speedup_claims(
        results,
        "table3",
        "F2",
        "flash_quad",
        f2_pg19,
    ));
    claims.extend(speedup_claims(results, "table3", "F4", "flash", f4_pg19));
    claims.extend(ablation_claims(results));
    claims.extend(chunking_claims(results));
    claims.extend(size_claims(results));
    claims.extend(layer_ablation_claims(results));
    claims.push(finetune_claim(results));
    claims.extend(chunk_size_claims(results));
    claims.push(decode_claim(results));
    claims.extend(gqa_quality_claims(results));
    let mut md = format!(
        "# The papers' claims, decided by the committed results\n\n\
         Generated by `just claims` from the CSVs under `results/` (never by hand). F1–F10 are the FLASH paper's, G1–G3 the\n\
         GQA paper's. Every verdict is one of three, by one of two rules fixed in code before the runs:\n\n\
         - **Directional claims** (\"faster\", \"better\", \"worse\", \"slowest\"): *reproduced* when the whole range of our\n\
           number lies on the paper's side of 1 (or of the threshold the claim names), *refuted* when it lies wholly on the\n\
           other side, *inconclusive* when it straddles it.\n\
         - **Equivalence claims** (\"competitive\", \"within\"), with a margin named in the row: *reproduced* when the whole\n\
           range lies inside the margin, *refuted* when it lies wholly outside it, *inconclusive* otherwise. F7's\n\
           \"competitive\" is one-sided (not worse by more than {:.0}% in final perplexity, `verdict::PPL_MARGIN`); G1's is a\n\
           paired score difference within ±{} point (`gqa::quality::SCORE_MARGIN`), on at least {} seeds.\n\
         - A claim of several parts (F7 at every size, F8 for every ablation, G1-time, G2) is reproduced when every part\n\
           is, refuted when one part is, inconclusive otherwise; F8 gives its counts.\n\n\
         Ranges: a speedup over every (model seed, baseline seed) pair; a step-time ratio over the interquartile range\n\
         of rounds timed together; a final-perplexity ratio over the seeds, each seed's runs paired where they read the\n\
         same data in the same order (a training stream shuffled by the seed), else over every pair of seeds; the GQA\n\
         scores per seed (every model of a seed converted from the same checkpoint). Sweeps that choose learning rates\n\
         choose them on the validation split; their curves and verdicts read the test split.\n\n\
         **Scale.** Each row names the scale it was decided at: ~1M parameters and ~1M training tokens per run on a\n\
         CPU, some 100× smaller and 30,000× shorter than the papers' runs. A verdict here says what these models do at\n\
         this scale; *refuted* means \"not seen at this scale\", not that the paper is wrong at its own. *No verdict*:\n\
         the result is missing.\n\n\
         | id | claim | ours | paper | verdict | scale | source |\n|---|---|---|---|---|---|---|\n",
        100.0 * PPL_MARGIN,
        crate::gqa::quality::SCORE_MARGIN,
        crate::gqa::quality::EQUIVALENCE_MIN_SEEDS,
    );
    for c in &claims {
        let verdict = c
            .verdict
            .map_or_else(|| "no verdict".into(), |v| format!("**{v}**"));
        let scale = scale_of(results, source_dir(&c.source));
        md += &format!(
            "| {} | {} | {} | {} | {verdict} | {scale} | {} |\n",
            c.id, c.claim, c.ours, c.paper, c.source
        );
    }
    training::write_atomic(&results.join("claims.md"), md.as_bytes())?;
    // The top README shows them at a glance, with each experiment's cost.
    let readme = results.parent().unwrap_or(Path::new(".")).join("README.md");
    crate::front_page::fill(&readme, results, &claims)
}
