//! The verdicts of the tables built on a sweep: the chunking loss (FLASH Table 5) and the layer
//! ablations (Tables 1 and 2, claim F8).

use super::rows::SweepRow;
use super::rule::{Pairing, Spread, Verdict};
use super::summary::{final_ppl_by_seed, final_ppls, ppl_ratio};

/// The perplexity lost by chunking at one context (FLASH Table 5): chunked / unchunked final
/// perplexity for the GAU (FLASH-Quad → FLASH) and for the Transformer (Transformer++ → MC-TFM++,
/// and from the relu² Transformer++, which differs from MC-TFM++ only in the chunking).
#[derive(Clone, Debug)]
pub struct ChunkingLoss {
    pub context: usize,
    /// FLASH / FLASH-Quad.
    pub gau: Spread,
    /// MC-TFM++ / Transformer++ (chunking and relu² scoring together).
    pub transformer: Spread,
    /// MC-TFM++ / relu² Transformer++ (chunking alone), when the control was trained.
    pub transformer_relu2: Option<Spread>,
    /// The Transformer's loss over the GAU's, (MC-TFM++ / Transformer++) / (FLASH / FLASH-Quad):
    /// above 1 when the GAU loses less (the paper's claim F6), the range over every combination of
    /// the four models' seeds.
    pub ratio: Spread,
}

/// The models a chunking-loss table needs, by name.
pub const CHUNKING_MODELS: [&str; 4] = ["flash_quad", "flash", "transformer_plusplus", "mc_tfmpp"];

/// The chunking loss at `context`, if the four models of [`CHUNKING_MODELS`] have runs there.
pub fn chunking_loss(rows: &[SweepRow], context: usize, pairing: Pairing) -> Option<ChunkingLoss> {
    let gau = ppl_ratio(rows, "flash", "flash_quad", context, pairing)?;
    let transformer = ppl_ratio(rows, "mc_tfmpp", "transformer_plusplus", context, pairing)?;
    let ratio = match pairing {
        Pairing::AllPairs => transformer.div(&gau),
        Pairing::BySeed => {
            let of = |m: &str| final_ppl_by_seed(rows, m, context);
            let (f, fq, mc, tpp) = (
                of("flash"),
                of("flash_quad"),
                of("mc_tfmpp"),
                of("transformer_plusplus"),
            );
            let per_seed: Vec<f64> = f
                .iter()
                .filter_map(|(s, f)| Some((mc.get(s)? / tpp.get(s)?) / (f / fq.get(s)?)))
                .collect();
            if per_seed.is_empty() {
                return None;
            }
            Spread::of(&per_seed)
        }
    };
    Some(ChunkingLoss {
        context,
        gau,
        transformer,
        transformer_relu2: ppl_ratio(
            rows,
            "mc_tfmpp",
            "transformer_plusplus_relu2",
            context,
            pairing,
        ),
        ratio,
    })
}

/// One row of a layer-ablation table (FLASH Tables 1 and 2): a model changed in one component,
/// against the default layer.
#[derive(Clone, Debug)]
pub struct AblationRow {
    pub model: String,
    pub context: usize,
    /// Its final perplexity over the default's: ratio of the seed means, range over seed pairs.
    pub ratio: Spread,
    /// Its own seeds and the default's.
    pub seeds: (usize, usize),
}

impl AblationRow {
    /// How the row compares with the default: `Reproduced` when the change clearly hurts (the
    /// whole ratio range above 1), `Refuted` when the ablation is clearly better (wholly below 1),
    /// else `Inconclusive` (the range straddles 1).
    pub fn verdict(&self) -> Verdict {
        Verdict::above(&self.ratio, 1.0)
    }
}

/// Every model of `rows` but `default` at `context`, against `default` (first-appearance order).
pub fn ablation_rows(
    rows: &[SweepRow],
    default: &str,
    context: usize,
    pairing: Pairing,
) -> Vec<AblationRow> {
    let mut models: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.context == context) {
        if r.model != default && !models.contains(&r.model.as_str()) {
            models.push(&r.model);
        }
    }
    models
        .into_iter()
        .filter_map(|m| {
            Some(AblationRow {
                model: m.to_string(),
                context,
                ratio: ppl_ratio(rows, m, default, context, pairing)?,
                seeds: (
                    final_ppls(rows, m, context).len(),
                    final_ppls(rows, default, context).len(),
                ),
            })
        })
        .collect()
}

/// Claim F8 over the rows of one table and context, the paper's "every change hurts": reproduced
/// only when every ablation is clearly worse than the default, refuted when some ablation is
/// clearly better, inconclusive otherwise; none without rows.
pub fn every_change_hurts(rows: &[AblationRow]) -> Option<Verdict> {
    if rows.is_empty() {
        return None;
    }
    let verdicts: Vec<Verdict> = rows.iter().map(AblationRow::verdict).collect();
    Some(Verdict::all(&verdicts))
}

/// The counts of a layer-ablation table: (clearly worse, inconclusive, clearly better) ablations.
pub fn ablation_counts(rows: &[AblationRow]) -> (usize, usize, usize) {
    let count = |v| rows.iter().filter(|r| r.verdict() == v).count();
    (
        count(Verdict::Reproduced),
        count(Verdict::Inconclusive),
        count(Verdict::Refuted),
    )
}
