//! Decoding time against the number of K/V groups (the GQA paper's Figure 6): greedy decoding of a
//! T5.1.1-shaped model with G ∈ {1, 4, 8, 16, 32, 64} K/V heads for H = 64 query heads, every
//! sequence decoding exactly the output length, time per sample = wall time / batch (encoder
//! included, as the paper's "time per sample").

use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use model::t5::{Stop, T5Config};
use report::{LineChart, Scale, Series};
use serde::{Deserialize, Serialize};
use training::write_atomic;

use crate::{Cli, Profile, Progress, median, write_csv};

/// The sweep, one file per scale under `experiments/configs/gqa_fig6/`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeConfig {
    /// What the run reproduces.
    pub description: String,
    /// Model width.
    pub d_model: usize,
    /// Feed-forward width.
    pub d_ff: usize,
    /// Query heads H (every entry of `groups` must divide it).
    pub n_heads: usize,
    /// Head width.
    pub d_kv: usize,
    /// Encoder layers.
    pub n_encoder_layers: usize,
    /// Decoder layers.
    pub n_decoder_layers: usize,
    /// Vocabulary (the LM head's cost per decoded token).
    pub vocab_size: usize,
    /// K/V head counts G to time.
    pub groups: Vec<usize>,
    /// Input tokens per sample (paper: 2048).
    pub input_length: usize,
    /// Decoded tokens per sample (paper: 512).
    pub output_length: usize,
    /// Samples decoded together.
    pub batch: usize,
    /// Untimed decodes before timing.
    pub warmup: usize,
    /// Timed decodes; the median is reported.
    pub repeats: usize,
    /// Seed of the weights and inputs.
    pub seed: u64,
}

impl DecodeConfig {
    fn model(&self, groups: usize) -> T5Config {
        T5Config::new(
            self.d_model,
            self.d_ff,
            self.n_heads,
            self.n_encoder_layers,
            self.n_decoder_layers,
            groups,
        )
        .with_d_kv(self.d_kv)
        .with_vocab_size(self.vocab_size)
    }

    /// Bytes of the decoding cache at the end of a decode: self-attention K/V of every output
    /// position plus cross-attention K/V of every input position, per decoder layer, f32.
    fn cache_bytes(&self, groups: usize) -> usize {
        self.n_decoder_layers
            * (self.input_length + self.output_length)
            * 2
            * self.batch
            * groups
            * self.d_kv
            * 4
    }
}

/// One row of `decode_time.csv`.
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
    /// Decoding cache at the end, MiB.
    pub kv_cache_mib: f64,
    /// Median seconds per batch.
    pub median_s: f64,
    /// Median seconds per sample.
    pub s_per_sample: f64,
    /// Backend and machine.
    pub device: String,
}

fn builtin(profile: Profile) -> &'static str {
    match profile {
        Profile::Smoke => include_str!("../configs/gqa_fig6/smoke.toml"),
        Profile::Cpu => include_str!("../configs/gqa_fig6/cpu.toml"),
        Profile::Paper => include_str!("../configs/gqa_fig6/paper.toml"),
    }
}

/// Runs the sweep (or only the report, with `--report`).
/// `--dry-run`: per group count, the decoded model's size, its weights and the decoding cache
/// of one batch (what the figure's timing depends on); nothing is trained, so the training
/// columns are zero, and the decoding itself is the real step.
fn dry_run(cli: &Cli, config: &DecodeConfig, device: &Device) -> Result<()> {
    let mut plans = Vec::new();
    for &groups in &config.groups {
        let t5 = config.model(groups);
        let (params, _) = crate::dry_run::param_stats(
            &t5.init(device),
            &training::optimizer::OptimizerConfig::adafactor(),
        );
        plans.push(crate::dry_run::RunPlan {
            label: format!("decode G = {groups}, batch {}", config.batch),
            runs: 1,
            params,
            tokens_per_step: config.batch * (config.input_length + config.output_length),
            steps: 0,
            optimizer_floats: 0.0,
            activation_floats: 0.0,
            kv_cache_floats: config.batch as f64
                * t5.kv_cache_floats_per_sequence(config.input_length, config.output_length),
            train_flops: 0.0,
            step_seconds: None,
        });
    }
    crate::dry_run::print(
        cli,
        " (inference only: the cache column is the whole batch's)",
        &plans,
    );
    Ok(())
}

pub fn run(cli: Cli) -> Result<()> {
    if cli.report_only {
        return render(&cli.out);
    }
    let config: DecodeConfig = cli.load_config(&builtin)?;
    if config.groups.is_empty() || config.repeats == 0 || config.batch == 0 {
        bail!("gqa_fig6 config: groups, repeats and batch must be non-empty / positive");
    }
    for &g in &config.groups {
        config.model(g).validate().map_err(anyhow::Error::msg)?;
    }
    let device = cli.one_device()?.device()?;
    if cli.dry_run.is_some() {
        return dry_run(&cli, &config, &device);
    }
    let provenance = cli.save_provenance(&config)?;
    eprintln!(
        "gqa_fig6 ({}): {} on {}",
        cli.profile.name(),
        config.description,
        provenance.device
    );
    let mut rows = Vec::new();
    let mut progress = Progress::new(config.groups.len());
    let ids: Vec<i64> = (0..config.batch * config.input_length)
        .map(|i| 3 + (i as i64 * 7919 + config.seed as i64) % (config.vocab_size as i64 - 103))
        .collect();
    for &groups in &config.groups {
        progress.running(format!("G = {groups}"));
        device.seed(config.seed);
        let model = config.model(groups).init(&device);
        let params = burn::module::Module::num_params(&model);
        let inputs = Tensor::<2, Int>::from_data(
            TensorData::new(ids.clone(), [config.batch, config.input_length]),
            &device,
        );
        let keep = inputs.clone().greater_elem(-1);
        let mut times = Vec::new();
        for i in 0..config.warmup + config.repeats {
            let start = std::time::Instant::now();
            let out =
                model.greedy_decode(inputs.clone(), &keep, config.output_length, Stop::Length);
            let elapsed = start.elapsed().as_secs_f64();
            debug_assert!(out.iter().all(|s| s.len() == config.output_length));
            if i >= config.warmup {
                times.push(elapsed);
            }
        }
        let med = median(&mut times);
        let row = DecodeRow {
            groups,
            n_heads: config.n_heads,
            batch: config.batch,
            input_length: config.input_length,
            output_length: config.output_length,
            params,
            kv_cache_mib: config.cache_bytes(groups) as f64 / (1 << 20) as f64,
            median_s: med,
            s_per_sample: med / config.batch as f64,
            device: provenance.device.clone(),
        };
        progress.item(format!(
            "G = {groups:<3} {:8.4} s/sample  cache {:8.1} MiB",
            row.s_per_sample, row.kv_cache_mib
        ));
        rows.push(row);
        write_csv(&cli.out.join("decode_time.csv"), &rows)?;
    }
    drop(progress);
    render(&cli.out)?;
    eprintln!("wrote {}", cli.out.display());
    Ok(())
}

/// The GQA paper's Table 1 times (seconds per sample, T5-XXL on TPUv4, its own lengths): the
/// speed ratios it reports, 6.3× for MQA and 5.4× for GQA-8 over MHA.
const PAPER_TABLE1: [(&str, f64); 3] = [("MHA-XXL", 1.51), ("GQA-8-XXL", 0.28), ("MQA-XXL", 0.24)];

/// Draws `decode_time.png/svg` and writes `table.md` from `decode_time.csv`.
pub fn render(out: &Path) -> Result<()> {
    let path = out.join("decode_time.csv");
    let rows: Vec<DecodeRow> = csv::Reader::from_path(&path)
        .with_context(|| format!("cannot read {}: run gqa_fig6 first", path.display()))?
        .deserialize()
        .collect::<Result<_, _>>()
        .with_context(|| format!("malformed {}", path.display()))?;
    let device = rows.first().map(|r| r.device.clone()).unwrap_or_default();
    let series = vec![Series {
        name: "time per sample".into(),
        points: rows
            .iter()
            .map(|r| (r.groups as f64, r.s_per_sample))
            .collect(),
    }];
    LineChart {
        title: format!("Decoding time per sample vs K/V groups — {device}"),
        x_label: "K/V groups G (1 = MQA, H = MHA)".into(),
        y_label: "seconds per sample (median)".into(),
        x_scale: Scale::Log2,
        y_scale: Scale::Linear,
    }
    .save(&out.join("decode_time"), &series)?;
    let mha = rows.iter().max_by_key(|r| r.groups).map(|r| r.s_per_sample);
    let mut md = String::from(
        "# GQA Figure 6 on this machine: time per sample vs K/V groups\n\n\
         Greedy decoding, every sample decoding the full output length; encoder included.\n\
         Generated by `gqa_fig6` from `decode_time.csv`.\n\n\
         | groups G | s / sample | speedup over MHA | KV cache (MiB) |\n|---|---|---|---|\n",
    );
    for r in &rows {
        let speedup = mha.map_or("—".into(), |m| format!("{:.2}×", m / r.s_per_sample));
        md += &format!(
            "| {} | {:.4} | {speedup} | {:.1} |\n",
            r.groups, r.s_per_sample, r.kv_cache_mib
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
