//! The GQA paper's claims: G1-time (decoding time against K/V groups) and G1-G3 (quality).

use std::path::Path;

use anyhow::{Context, Result};

use crate::claim::Claim;
use crate::gqa::decode_render::RoundRow;
use crate::verdict::{Spread, Verdict};

/// "Far faster" in G1-time: MHA's decoding step over MQA's and GQA-8's at least this (the paper's
/// 6.3× and 5.4× per sample are on hardware where only memory traffic counts; half of the
/// smaller is our bar).
pub const FAR_FASTER: f64 = 2.0;
/// "Close to MQA" in G1-time: GQA-8's decoding step over MQA's at most this (the paper: 0.28 /
/// 0.24 = 1.17 per sample).
pub const CLOSE_TO_MQA: f64 = 1.25;

/// TPU v4's peak bf16 rate per chip, FLOP/s, the paper's hardware (Google Cloud's TPU v4 system
/// architecture page and Jouppi et al. 2023, "TPU v4: An Optically Reconfigurable Supercomputer
/// for Machine Learning": 275 TFLOPS).
pub const TPU_V4_PEAK_FLOPS: f64 = 275e12;
/// TPU v4's HBM bandwidth per chip, bytes/s (the same sources: 1,200 GB/s).
pub const TPU_V4_HBM_BYTES_PER_S: f64 = 1.2e12;
/// Bytes per value on the TPU (bf16, as the paper's T5X runs compute) over ours (f32): the byte
/// counts of `decode_time.csv` are f32's.
pub const TPU_BYTES_OVER_OURS: f64 = 0.5;

/// A decoding step's roofline time (`gqa::decode::roofline_seconds`) at `gflops` and `gbps`, with
/// its bytes scaled by `byte_scale`.
fn step_roofline(
    row: &crate::gqa::decode_render::DecodeRow,
    (gflops, gbps, byte_scale): (f64, f64, f64),
) -> Option<f64> {
    let bytes = (row.kv_bytes_per_token + row.weight_bytes_per_token) * byte_scale;
    crate::gqa::decode::roofline_seconds(row.flops_per_token, bytes, gflops, gbps)
}

/// What the roofline predicts for MHA / MQA and MHA / GQA-8 at the measured shapes, on this
/// machine (its measured product rate and read bandwidth) and on a TPU v4: a prediction beside
/// the verdict, never part of it. Empty when the rows carry no roofline.
fn roofline_prediction(rows: &[crate::gqa::decode_render::DecodeRow], h: usize) -> String {
    let row = |g: usize| rows.iter().find(|r| r.groups == g);
    let (Some(mha), Some(mqa), Some(gqa8)) = (row(h), row(1), row(8)) else {
        return String::new();
    };
    if mha.machine_gflops <= 0.0 || mha.flops_per_token <= 0.0 {
        return String::new();
    }
    let predict = |hw: (f64, f64, f64)| -> Option<(f64, f64)> {
        let t = |r| step_roofline(r, hw);
        Some((t(mha)? / t(mqa)?, t(mha)? / t(gqa8)?))
    };
    let here = (mha.machine_gflops, mha.machine_read_gbps, 1.0);
    let tpu = (
        TPU_V4_PEAK_FLOPS / 1e9,
        TPU_V4_HBM_BYTES_PER_S / 1e9,
        TPU_BYTES_OVER_OURS,
    );
    match (predict(here), predict(tpu)) {
        (Some((a, b)), Some((c, d))) => format!(
            "; the roofline (max of FLOPs / rate and bytes / bandwidth) predicts MHA / MQA {a:.2}×, MHA / GQA-8 {b:.2}× on this machine and {c:.2}×, {d:.2}× on a TPU v4 (bf16) at the same shapes — predictions, not verdicts"
        ),
        _ => String::new(),
    }
}

/// G1-time from `gqa_fig6`'s `rounds.csv`: per round, MHA's (G = H) decoding step time over
/// MQA's (G = 1) and GQA-8's, and GQA-8's over MQA's; medians and interquartile ranges over the
/// rounds, which time every G back to back.
pub(super) fn decode_claim(results: &Path) -> Claim {
    let claim = format!(
        "GQA-8 decodes close to MQA's speed, both far faster than MHA (decoding step time: MHA / MQA and MHA / GQA-8 above {FAR_FASTER}×, GQA-8 / MQA below {CLOSE_TO_MQA}×)"
    );
    let paper = "MQA-XXL 6.3× and GQA-8-XXL 5.4× faster than MHA-XXL per sample (Table 1, TPUv4)";
    let source = "[gqa_fig6](gqa_fig6/table.md)".to_string();
    let computed = (|| -> Result<(String, Verdict)> {
        let dir = results.join("gqa_fig6");
        let rows = crate::gqa::decode_render::read_rows(&dir)?;
        let rounds = crate::gqa::decode_render::read_rounds(&dir)?;
        let h = rows.iter().map(|r| r.n_heads).max().context("no rows")?;
        let time_of =
            |g: usize, f: fn(&RoundRow) -> f64| -> std::collections::BTreeMap<usize, f64> {
                rounds
                    .iter()
                    .filter(|r| r.groups == g)
                    .map(|r| (r.round, f(r)))
                    .collect()
            };
        let step = |g: usize| time_of(g, |r| r.decoder_s_per_token);
        let ratio_of = |num: usize, den: usize, f: fn(&RoundRow) -> f64| -> Result<Spread> {
            let (a, b) = (time_of(num, f), time_of(den, f));
            let per_round: Vec<f64> = a
                .iter()
                .filter_map(|(round, x)| b.get(round).map(|y| x / y))
                .collect();
            anyhow::ensure!(
                !per_round.is_empty(),
                "gqa_fig6 timed no rounds of G = {num} and G = {den}"
            );
            Ok(Spread::quartiles(&per_round))
        };
        let ratio = |num: usize, den: usize| ratio_of(num, den, |r| r.decoder_s_per_token);
        let (mqa, gqa8, close) = (ratio(h, 1)?, ratio(h, 8)?, ratio(8, 1)?);
        // Beside the verdict: the same ratios without the LM head, which G does not change and
        // which one decoder layer here makes a large part of the step (XXL has 24).
        let without_head = if rounds.iter().all(|r| r.lm_head_s_per_token > 0.0) {
            let layers = |r: &RoundRow| r.decoder_s_per_token - r.lm_head_s_per_token;
            format!(
                "; without the LM head (timed apart in the same rounds) MHA / MQA {}×, MHA / GQA-8 {}×",
                ratio_of(h, 1, layers)?.show(2),
                ratio_of(h, 8, layers)?.show(2)
            )
        } else {
            String::new()
        };
        let shape = rows
            .first()
            .map(|r| {
                format!(
                    "H = {h}, in {} / out {}, batch {}",
                    r.input_length, r.output_length, r.batch
                )
            })
            .unwrap_or_default();
        Ok((
            format!(
                "{shape}: MHA / MQA {}×, MHA / GQA-8 {}×, GQA-8 / MQA {}× (median [interquartile range] over {} interleaved rounds){without_head}{}",
                mqa.show(2),
                gqa8.show(2),
                close.show(2),
                step(1).len(),
                roofline_prediction(&rows, h)
            ),
            Verdict::all(&[
                Verdict::above(&mqa, FAR_FASTER),
                Verdict::above(&gqa8, FAR_FASTER),
                Verdict::below(&close, CLOSE_TO_MQA),
            ]),
        ))
    })();
    match computed {
        Ok((ours, verdict)) => Claim {
            id: "G1-time",
            claim,
            source,
            ours,
            paper,
            verdict: Some(verdict),
        },
        Err(e) => Claim {
            id: "G1-time",
            claim,
            source,
            ours: format!("no result ({e:#}); run `just repro gqa_fig6 --profile cpu`"),
            paper,
            verdict: None,
        },
    }
}

/// G1 (quality), G2 and G3 from the GQA uptraining experiments ([`crate::gqa::quality`]).
pub(super) fn gqa_quality_claims(results: &Path) -> Vec<Claim> {
    use crate::gqa::quality::{Results, g1, g2, g2_loss, g3};
    type Decide = fn(&Results) -> Result<crate::gqa::quality::Decided>;
    let claims: [(&str, &str, &str, &str, Decide); 4] = [
        (
            "G1",
            "GQA-XXL's quality is close to MHA-XXL's (average score over the tasks, GQA − MHA within ±1 point on every seed; the time side is G1-time)",
            "gqa_table1",
            "GQA-8-XXL average 47.1 against MHA-XXL 47.2 and MQA-XXL 46.6, at 0.28 s per sample against 1.51 and 0.24 (Table 1)",
            g1,
        ),
        (
            "G2",
            "Converting by mean pooling beats the first head, which beats random initialisation (MQA, after uptraining α = 0.05 and fine-tuning)",
            "gqa_fig4",
            "mean > first > random (Figure 4, T5-Large → MQA, α = 0.05)",
            g2,
        ),
        (
            "G2-loss",
            "The same order on our finer measure: mean pooling leaves a lower held-out span loss after uptraining (α = 0.05) than the first head, which leaves a lower one than random initialisation (MQA)",
            "gqa_fig4",
            "mean > first > random (Figure 4 reports scores only)",
            g2_loss,
        ),
        (
            "G3",
            "Right after conversion (α = 0) GQA is closer to its uptrained quality than MQA",
            "gqa_fig5",
            "GQA works reasonably without uptraining, MQA needs it (Figure 5, α ∈ {0, 0.05, 0.10})",
            g3,
        ),
    ];
    claims
        .into_iter()
        .map(|(id, claim, dir, paper, decide)| {
            let source = format!("[{dir}]({dir}/table.md)");
            match Results::read(&results.join(dir)).and_then(|r| decide(&r)) {
                Ok(d) => Claim {
                    id,
                    claim: claim.into(),
                    source,
                    ours: d.ours,
                    paper,
                    verdict: Some(d.verdict),
                },
                Err(e) => Claim {
                    id,
                    claim: claim.into(),
                    source,
                    ours: format!("no result ({e:#}); run `just repro {dir} --profile cpu`"),
                    paper,
                    verdict: None,
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gqa::decode_render::DecodeRow;

    /// G1-time from a `gqa_fig6` folder: the verdict reads the whole step's per-round ratios, and
    /// the ratios without the LM head (step − the round's LM head time) come beside it.
    #[test]
    fn decode_claim_reads_the_step_and_reports_it_without_the_head() {
        let dir = std::env::temp_dir().join(format!("g1_time_{}", std::process::id()));
        let fig6 = dir.join("gqa_fig6");
        std::fs::create_dir_all(&fig6).unwrap();
        let rows = [
            DecodeRow::example(64, 1e9, 3e9),
            DecodeRow::example(8, 1e9, 0.5e9),
            DecodeRow::example(1, 1e9, 0.0),
        ];
        crate::write_csv(&fig6.join("decode_time.csv"), &rows).unwrap();
        // Step seconds per G, and an LM head of 0.1 s in every round.
        let rounds: Vec<RoundRow> = (0..3)
            .flat_map(|round| {
                [(64, 0.4), (8, 0.18), (1, 0.15)].map(|(groups, step)| RoundRow {
                    round,
                    groups,
                    cross_kv_s: 0.0,
                    decoder_s: step * 64.0,
                    decoder_s_per_token: step,
                    lm_head_s_per_token: 0.1,
                    machine_gflops: 0.0,
                    machine_read_gbps: 0.0,
                })
            })
            .collect();
        crate::write_csv(&fig6.join("rounds.csv"), &rounds).unwrap();
        let claim = decode_claim(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        // The whole step: MHA / MQA 2.67, MHA / GQA-8 2.22 (both above 2), GQA-8 / MQA 1.2.
        assert_eq!(claim.verdict, Some(Verdict::Reproduced), "{}", claim.ours);
        assert!(claim.ours.contains("MHA / MQA 2.67"), "{}", claim.ours);
        // Without the head: 0.3 / 0.05 and 0.3 / 0.08.
        assert!(
            claim
                .ours
                .contains("without the LM head (timed apart in the same rounds) MHA / MQA 6.00"),
            "{}",
            claim.ours
        );
        assert!(claim.ours.contains("MHA / GQA-8 3.75"), "{}", claim.ours);
    }

    /// Bytes-bound on both machines: the predicted ratios are the byte ratios (f32 here, bf16 on
    /// the TPU, which halves both sides alike). Compute-bound here (equal FLOPs): 1×.
    #[test]
    fn roofline_prediction_is_the_ratio_of_the_bound_side() {
        // 1 GB of weights; K/V 3 GB (MHA), 0.5 GB (GQA-8), 0 (MQA); 1 GFLOP: bytes-bound at
        // 100 GFLOP/s and 10 GB/s (0.01 s of compute against ≥ 0.1 s of bytes).
        let rows = [
            DecodeRow::example(64, 1e9, 3e9),
            DecodeRow::example(8, 1e9, 0.5e9),
            DecodeRow::example(1, 1e9, 0.0),
        ];
        let text = roofline_prediction(&rows, 64);
        assert!(
            text.contains(
                "MHA / MQA 4.00×, MHA / GQA-8 2.67× on this machine and 4.00×, 2.67× on a TPU v4"
            ),
            "{text}"
        );
        // 100 GFLOP per step: compute-bound here (1 s against ≤ 0.4 s), bytes-bound on the TPU.
        let rows = [
            DecodeRow::example(64, 1e11, 3e9),
            DecodeRow::example(8, 1e11, 0.5e9),
            DecodeRow::example(1, 1e11, 0.0),
        ];
        let text = roofline_prediction(&rows, 64);
        assert!(
            text.contains("MHA / MQA 1.00×, MHA / GQA-8 1.00× on this machine"),
            "{text}"
        );
        // No measured rate: no prediction.
        let mut rows = rows.to_vec();
        rows.iter_mut().for_each(|r| r.machine_gflops = 0.0);
        assert!(roofline_prediction(&rows, 64).is_empty());
    }
}
