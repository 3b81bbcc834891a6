//! Figure 6's outputs from `decode_time.csv` and `rounds.csv` (written by [`super::decode`]):
//! `table.md` (the step and per-sample times per G, and the roofline section), the seconds-per-sample,
//! speedup and step-against-roofline charts, and the readers the claims use.

use std::path::Path;

use anyhow::{Result, bail};
use report::timing::StackedBars;
use report::{LineChart, Scale, Series};
use serde::{Deserialize, Serialize};
use training::write_atomic;

use crate::read_csv;

/// One row of `decode_time.csv`: the medians of one group count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DecodeRow {
    /// K/V heads G.
    pub groups: usize,
    /// Query heads H.
    pub n_heads: usize,
    /// Samples per decode.
    pub batch: usize,
    pub input_length: usize,
    pub output_length: usize,
    /// Parameters of the model.
    pub params: usize,
    /// Decoding cache of the batch at the end, MiB.
    pub kv_cache_mib: f64,
    /// Encoder seconds per sample (the same encoder for every G, timed once).
    pub encoder_s_per_sample: f64,
    /// Cross-attention K/V projection of the encoder output, seconds per sample.
    pub cross_kv_s_per_sample: f64,
    /// Median seconds of one decoding step of the batch (one generated token per sample).
    pub decoder_s_per_token: f64,
    /// Encoder + K/V projection + decoding steps, seconds per sample.
    pub s_per_sample: f64,
    /// Cached K/V bytes one decoding step reads (mean over the steps).
    pub kv_bytes_per_token: f64,
    /// Weight bytes one decoding step reads.
    pub weight_bytes_per_token: f64,
    /// (K/V + weight bytes per step) / seconds per step, GB/s.
    pub effective_gbps: f64,
    /// This machine's memory read bandwidth, GB/s, the median over the rounds (0: not measured).
    pub machine_read_gbps: f64,
    /// Backend and machine.
    pub device: String,
    /// Matrix-product FLOPs of one decoding step of the batch (mean over the steps).
    #[serde(default)]
    pub flops_per_token: f64,
    /// This machine's matrix-product rate, GFLOP/s, the median over the rounds (0: not measured).
    #[serde(default)]
    pub machine_gflops: f64,
    /// The step's roofline: max(FLOPs / product rate, bytes read / read bandwidth), seconds (0:
    /// a ceiling not measured).
    #[serde(default)]
    pub roofline_s_per_token: f64,
    /// Measured seconds per decoding step over the roofline's (0: no roofline).
    #[serde(default)]
    pub measured_over_roofline: f64,
    /// The LM head's share of a step (the batch's hidden states through it, timed in the same
    /// rounds; the same head for every G), median seconds (0: not timed).
    #[serde(default)]
    pub lm_head_s_per_token: f64,
    /// The step without the LM head (the decoder layers, their norms and the embedding): the
    /// median over rounds of step − LM head, seconds.
    #[serde(default)]
    pub layers_s_per_token: f64,
    /// The roofline of the step without the LM head's FLOPs and weights, seconds (0: none).
    #[serde(default)]
    pub layers_roofline_s_per_token: f64,
}

impl DecodeRow {
    /// The step's time if its products (FLOPs at the product rate, or their weights at the read
    /// bandwidth, whichever is slower) and then its attention's K/V reads (at the read bandwidth)
    /// ran one after the other, without overlapping, seconds (`None`: a ceiling not measured).
    /// A lower bound for a step whose attention waits on its projections and whose next
    /// projections wait on its attention, as a decoding step's do: the roofline assumes the two
    /// overlap.
    pub fn products_then_kv_seconds(&self) -> Option<f64> {
        let (rate, bandwidth) = (self.machine_gflops * 1e9, self.machine_read_gbps * 1e9);
        (rate > 0.0 && bandwidth > 0.0).then(|| {
            let products =
                (self.flops_per_token / rate).max(self.weight_bytes_per_token / bandwidth);
            products + self.kv_bytes_per_token / bandwidth
        })
    }
}

#[cfg(test)]
impl DecodeRow {
    /// A row of gqa_fig6's cpu shapes with `flops` and `kv_bytes` per step, 1 GB of weights, a
    /// 1-second step, at 100 GFLOP/s and 10 GB/s (tests).
    pub(crate) fn example(groups: usize, flops: f64, kv_bytes: f64) -> Self {
        DecodeRow {
            groups,
            n_heads: 64,
            batch: 32,
            input_length: 2048,
            output_length: 64,
            params: 0,
            kv_cache_mib: 0.0,
            encoder_s_per_sample: 0.0,
            cross_kv_s_per_sample: 0.0,
            decoder_s_per_token: 1.0,
            s_per_sample: 0.0,
            kv_bytes_per_token: kv_bytes,
            weight_bytes_per_token: 1e9,
            effective_gbps: 0.0,
            machine_read_gbps: 10.0,
            device: "test".into(),
            flops_per_token: flops,
            machine_gflops: 100.0,
            roofline_s_per_token: 0.0,
            measured_over_roofline: 0.0,
            lm_head_s_per_token: 0.0,
            layers_s_per_token: 0.0,
            layers_roofline_s_per_token: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products, then K/V: the slower of the products' FLOPs and weights, plus the K/V bytes, at
    /// 100 GFLOP/s and 10 GB/s; none without both ceilings.
    #[test]
    fn products_then_kv_adds_the_kv_reads_to_the_slower_product_ceiling() {
        // Weights bound the products (1 GB: 0.1 s against 2 GFLOP: 0.02 s), then 0.5 GB of K/V.
        let weights_bound = DecodeRow::example(8, 2e9, 0.5e9);
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-12;
        assert!(close(weights_bound.products_then_kv_seconds(), 0.15));
        // FLOPs bound them (40 GFLOP: 0.4 s).
        let flops_bound = DecodeRow::example(64, 4e10, 0.5e9);
        assert!(close(flops_bound.products_then_kv_seconds(), 0.45));
        let mut unmeasured = flops_bound.clone();
        unmeasured.machine_read_gbps = 0.0;
        assert_eq!(unmeasured.products_then_kv_seconds(), None);
    }
}

/// One row of `rounds.csv`: one timed round of one group count (the interleaved measurements the
/// medians and the claim's interquartile ranges come from).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RoundRow {
    /// Timed round, from 0.
    pub round: usize,
    /// K/V heads G.
    pub groups: usize,
    /// Cross-attention K/V projection of `encoder_batch` samples, seconds.
    pub cross_kv_s: f64,
    /// All decoding steps of the batch, seconds.
    pub decoder_s: f64,
    /// Seconds per decoding step of the batch.
    pub decoder_s_per_token: f64,
    /// The LM head's seconds per step in this round (the same head for every G; 0: not timed).
    #[serde(default)]
    pub lm_head_s_per_token: f64,
    /// This machine's matrix-product rate measured at the round's start, GFLOP/s (0: not
    /// measured): the roofline's compute ceiling is the median over the rounds.
    #[serde(default)]
    pub machine_gflops: f64,
    /// This machine's read bandwidth measured at the round's start, GB/s (0: not measured).
    #[serde(default)]
    pub machine_read_gbps: f64,
}

/// The GQA paper's Table 1 times (seconds per sample, T5-XXL on TPUv4, its own lengths): the
/// speed ratios it reports, 6.3× for MQA and 5.4× for GQA-8 over MHA.
pub const PAPER_TABLE1: [(&str, f64); 3] =
    [("MHA-XXL", 1.51), ("GQA-8-XXL", 0.28), ("MQA-XXL", 0.24)];

/// Reads `decode_time.csv` from `out`.
pub fn read_rows(out: &Path) -> Result<Vec<DecodeRow>> {
    read_csv(&out.join("decode_time.csv"))
}

/// Reads `rounds.csv` from `out`.
pub fn read_rounds(out: &Path) -> Result<Vec<RoundRow>> {
    read_csv(&out.join("rounds.csv"))
}

/// Draws `decode_time.png/svg` (seconds per sample) and `speedup.png/svg` (over MHA, per decoded
/// token and per sample) and writes `table.md` from `decode_time.csv`.
pub fn render(out: &Path) -> Result<()> {
    let rows = read_rows(out)?;
    let device = rows.first().map(|r| r.device.clone()).unwrap_or_default();
    let Some(mha) = rows.iter().max_by_key(|r| r.groups) else {
        bail!("{}: no rows", out.join("decode_time.csv").display());
    };
    let points = |f: &dyn Fn(&DecodeRow) -> f64| per_group(&rows, f);
    let x_label = "K/V groups G (1 = MQA, H = MHA)".to_string();
    // From zero, the parts stacked: the encoder's share is what G cannot change.
    let encoder: Vec<f64> = rows.iter().map(|r| r.encoder_s_per_sample).collect();
    let cross: Vec<f64> = rows.iter().map(|r| r.cross_kv_s_per_sample).collect();
    let decoding: Vec<f64> = rows
        .iter()
        .map(|r| r.s_per_sample - r.encoder_s_per_sample - r.cross_kv_s_per_sample)
        .collect();
    StackedBars {
        title: format!("Time per sample vs K/V groups — {device}"),
        x_label: x_label.clone(),
        y_label: "seconds per sample (median)".into(),
        categories: rows.iter().map(|r| r.groups.to_string()).collect(),
        parts: vec![
            ("encoder".into(), encoder),
            ("cross-attention K/V projection".into(), cross),
            ("decoding steps".into(), decoding),
        ],
    }
    .save(&out.join("decode_time"))?;
    LineChart {
        title: format!("Speedup over MHA (G = {}) — {device}", mha.groups),
        x_label,
        y_label: "MHA's time / this G's (median)".into(),
        x_scale: Scale::Log2,
        y_scale: Scale::Linear,
    }
    .save(
        &out.join("speedup"),
        &[
            Series {
                name: "per decoded token (decoder step)".into(),
                points: points(&|r| mha.decoder_s_per_token / r.decoder_s_per_token),
            },
            Series {
                name: "per sample (encoder included)".into(),
                points: points(&|r| mha.s_per_sample / r.s_per_sample),
            },
        ],
    )?;
    let mib = |b: f64| b / (1 << 20) as f64;
    let mut md = format!(
        "# GQA Figure 6 on this machine: decoding time vs K/V groups\n\n\
         Greedy decoding, every sample decoding the full output length ({} in, {} out, batch {}). A decoding step\n\
         generates one token for every sample of the batch; per sample = encoder + K/V projection + the batch's\n\
         steps / batch. Medians over interleaved rounds (`rounds.csv`). Generated by `gqa_fig6` from `decode_time.csv`.\n\n\
         | G | encoder s / sample | K/V projection s / sample | decoder ms / step | speedup per token | s / sample | speedup per sample | K/V MiB read / step | weights MiB read / step | effective GB/s |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        mha.input_length, mha.output_length, mha.batch
    );
    for r in &rows {
        md += &format!(
            "| {} | {:.3} | {:.3} | {:.1} | {:.2}× | {:.3} | {:.2}× | {:.1} | {:.1} | {:.1} |\n",
            r.groups,
            r.encoder_s_per_sample,
            r.cross_kv_s_per_sample,
            r.decoder_s_per_token * 1e3,
            mha.decoder_s_per_token / r.decoder_s_per_token,
            r.s_per_sample,
            mha.s_per_sample / r.s_per_sample,
            mib(r.kv_bytes_per_token),
            mib(r.weight_bytes_per_token),
            r.effective_gbps
        );
    }
    if mha.machine_gflops > 0.0 {
        md += &roofline_table(&rows, mha);
        roofline_chart(out, &rows, &device)?;
    }
    if mha.lm_head_s_per_token > 0.0 {
        md += &layers_table(&rows, mha);
    }
    if mha.machine_read_gbps > 0.0 {
        md += &format!(
            "\nThis machine's memory read bandwidth (every core summing a buffer far larger than its caches, at \
             the start of every round; the median): {:.1} GB/s.\n",
            mha.machine_read_gbps
        );
    }
    md += "\nThe paper (T5-XXL, TPUv4, Table 1's own lengths), seconds per sample: ";
    let cells: Vec<String> = PAPER_TABLE1
        .iter()
        .map(|(m, t)| format!("{m} {t}"))
        .collect();
    md += &cells.join(", ");
    md += &format!(
        " — MQA {:.1}× and GQA-8 {:.1}× faster than MHA; its Figure 6 (XXL, input 2048, output 512) \
         shows the time growing slowly up to 8 groups and steeply after.\n",
        PAPER_TABLE1[0].1 / PAPER_TABLE1[2].1,
        PAPER_TABLE1[0].1 / PAPER_TABLE1[1].1
    );
    write_atomic(&out.join("table.md"), md.as_bytes())
}

/// The roofline section of `table.md`: per G the step's FLOPs and bytes, its time at this
/// machine's product rate and read bandwidth, and the measured step over it; beside it the bound
/// without overlap ([`DecodeRow::products_then_kv_seconds`]) and the measured step over that.
fn roofline_table(rows: &[DecodeRow], mha: &DecodeRow) -> String {
    let mut md = format!(
        "\nRoofline of a decoding step on this machine: max(FLOPs / {:.1} GFLOP/s, bytes read / {:.1} GB/s), the \
         product rate and read bandwidth measured at the start of every round, medians over the rounds. It \
         assumes the products and the K/V reads overlap; a step's attention waits on its projections and the \
         next projections on its attention, so *products, then K/V* adds the two instead (the products at \
         the slower of their FLOPs and their weights' bytes): a step cannot beat it without running \
         attention beside the products.\n\n\
         | G | GFLOP / step | MiB read / step | compute-bound ms | memory-bound ms | roofline ms | measured ms | measured / roofline | products, then K/V ms | measured / that |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        mha.machine_gflops, mha.machine_read_gbps
    );
    for r in rows {
        let bytes = r.kv_bytes_per_token + r.weight_bytes_per_token;
        let sequential = r.products_then_kv_seconds().unwrap_or(0.0);
        md += &format!(
            "| {} | {:.2} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}× | {:.2} | {:.2}× |\n",
            r.groups,
            r.flops_per_token / 1e9,
            bytes / (1 << 20) as f64,
            r.flops_per_token / (r.machine_gflops * 1e9) * 1e3,
            bytes / (r.machine_read_gbps * 1e9) * 1e3,
            r.roofline_s_per_token * 1e3,
            r.decoder_s_per_token * 1e3,
            r.measured_over_roofline,
            sequential * 1e3,
            r.decoder_s_per_token / sequential
        );
    }
    md
}

/// The section of `table.md` on the step without the LM head: one layer here against XXL's 24,
/// where the head is a small part of a step's weights.
fn layers_table(rows: &[DecodeRow], mha: &DecodeRow) -> String {
    let mut md = String::from(
        "\nThe step without the LM head (the LM head timed apart in the same rounds; the decoder layer, its norms \
         and the embedding remain): what G changes, without the G-independent head that one layer here makes \
         large.\n\n\
         | G | LM head ms / step | without the LM head, ms / step | speedup over MHA | its roofline ms | measured / roofline |\n\
         |---|---|---|---|---|---|\n",
    );
    for r in rows {
        let over = |x: f64| {
            if x > 0.0 {
                format!("{:.2}×", r.layers_s_per_token / x)
            } else {
                "—".into()
            }
        };
        md += &format!(
            "| {} | {:.1} | {:.1} | {:.2}× | {:.2} | {} |\n",
            r.groups,
            r.lm_head_s_per_token * 1e3,
            r.layers_s_per_token * 1e3,
            mha.layers_s_per_token / r.layers_s_per_token,
            r.layers_roofline_s_per_token * 1e3,
            over(r.layers_roofline_s_per_token)
        );
    }
    md
}

/// A chart series: `f` of each row against its group count.
fn per_group(rows: &[DecodeRow], f: &dyn Fn(&DecodeRow) -> f64) -> Vec<(f64, f64)> {
    rows.iter().map(|r| (r.groups as f64, f(r))).collect()
}

/// `step_vs_roofline.png/svg`: the measured decoding step and its roofline against G, from zero.
fn roofline_chart(out: &Path, rows: &[DecodeRow], device: &str) -> Result<()> {
    let points = |f: &dyn Fn(&DecodeRow) -> f64| per_group(rows, f);
    LineChart {
        title: format!("Decoding step: measured and roofline — {device}"),
        x_label: "K/V groups G (1 = MQA, H = MHA)".into(),
        y_label: "ms per decoding step of the batch".into(),
        x_scale: Scale::Log2,
        y_scale: Scale::LinearFromZero,
    }
    .save(
        &out.join("step_vs_roofline"),
        &[
            Series {
                name: "measured (median)".into(),
                points: points(&|r| r.decoder_s_per_token * 1e3),
            },
            Series {
                name: "roofline: max(FLOPs / rate, bytes / bandwidth)".into(),
                points: points(&|r| r.roofline_s_per_token * 1e3),
            },
        ],
    )
}
