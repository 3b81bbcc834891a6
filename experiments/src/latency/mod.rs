//! The latency benchmark (the FLASH paper's Table 11 and Figure 5(a)): seconds per causal-LM
//! training step (forward + backward + Adam) of each architecture at a fixed number of tokens per
//! batch, over context lengths.

use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::optim::AdamConfig;
use burn::optim::ModuleOptimizer;
use burn::prelude::*;
use model::{Architecture, Direction, LanguageModel, ModelConfig};
use report::timing::{Timed, TimedSeries, TimingChart};
use serde::{Deserialize, Serialize};
use training::write_atomic;

use crate::dry_run::DryRun;
use crate::experiment::Experiment;
use crate::{Cli, Progress, median, write_csv};

mod anchors;

use self::anchors::comparison;

/// The sweep, one file per scale under `experiments/configs/table11/`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyConfig {
    /// What the run reproduces.
    pub description: String,
    /// Architectures by name (see `model::Architecture`).
    pub models: Vec<String>,
    /// Context lengths T.
    pub contexts: Vec<usize>,
    /// Tokens per batch; batch = max(1, tokens_per_batch / T).
    pub tokens_per_batch: usize,
    /// Model size preset (`model::lm::PRESETS`).
    pub preset: String,
    /// Untimed steps before timing.
    pub warmup_steps: usize,
    /// Timed steps; the median is reported.
    pub timed_steps: usize,
    /// Adam learning rate (irrelevant to speed; keeps the update real).
    pub learning_rate: f64,
    /// Seed of the weights and tokens.
    pub seed: u64,
}

/// One row of `latency.csv`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LatencyRow {
    /// Architecture name.
    pub model: String,
    /// Context length.
    pub context: usize,
    /// Sequences per batch.
    pub batch: usize,
    /// Trainable parameters.
    pub params: usize,
    /// Median seconds per step.
    pub median_s_per_step: f64,
    /// Fastest step.
    pub min_s_per_step: f64,
    /// Slowest step.
    pub max_s_per_step: f64,
    /// batch · context / median.
    pub tokens_per_s: f64,
    /// Model FLOPs of one training step (`ModelConfig::train_flops_per_step`, the count
    /// `metrics.csv` uses; attention counted over the full T × T).
    #[serde(default)]
    pub flops_per_step: f64,
    /// flops_per_step / median, in GFLOP/s.
    #[serde(default)]
    pub model_gflop_per_s: f64,
    /// Loss of the last step (a sanity value: ~ln(vocab) for random tokens).
    pub last_loss: f32,
    /// Backend and machine.
    pub device: String,
}

/// FLASH is "flat in context" when its step at the longest context is at most this many times its
/// step at the shortest (issue 19; the paper's Table 11 shows FLASH's latency nearly constant).
pub const FLAT_BOUND: f64 = 1.1;

/// Deterministic token ids in 0..vocab: [batch, len].
fn random_tokens(
    seed: u64,
    batch: usize,
    len: usize,
    vocab: usize,
    device: &Device,
) -> Tensor<2, Int> {
    let mut s = seed ^ 0x9E37_79B9_7F4A_7C15;
    let ids: Vec<i64> = (0..batch * len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as i64
        })
        .collect();
    Tensor::from_data(TensorData::new(ids, [batch, len]), device)
}

/// One model of the sweep at one context, with its optimizer, batch and timings.
struct Cell {
    arch: Architecture,
    context: usize,
    batch: usize,
    params: usize,
    flops_per_step: f64,
    model: Option<LanguageModel>,
    optim: ModuleOptimizer,
    tokens: Tensor<2, Int>,
    times: Vec<f64>,
    last_loss: f32,
}

impl Cell {
    fn new(
        config: &LatencyConfig,
        arch: Architecture,
        context: usize,
        device: &Device,
    ) -> Result<Self> {
        let model_config =
            ModelConfig::preset(&config.preset, arch, context).map_err(anyhow::Error::msg)?;
        let batch = (config.tokens_per_batch / context).max(1);
        device.seed(config.seed);
        let model = model_config.init(Direction::Causal, device);
        let tokens = random_tokens(
            config.seed,
            batch,
            context + 1,
            model_config.vocab_size,
            device,
        );
        Ok(Self {
            arch,
            context,
            batch,
            params: model.num_params(),
            flops_per_step: model_config.train_flops_per_step(batch, context),
            model: Some(model),
            optim: AdamConfig::new().init(),
            tokens,
            times: Vec::new(),
            last_loss: f32::NAN,
        })
    }

    /// One training step, timed when `timed`.
    fn step(&mut self, lr: f64, timed: bool) {
        let model = self.model.take().expect("model");
        let start = std::time::Instant::now();
        let (next, loss) =
            training::step::causal_lm_step(model, &mut self.optim, self.tokens.clone(), lr);
        if timed {
            self.times.push(start.elapsed().as_secs_f64());
        }
        self.model = Some(next);
        self.last_loss = loss;
    }

    fn row(mut self, device: &str) -> LatencyRow {
        let (min, max) = self
            .times
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), &t| (a.min(t), b.max(t)));
        let med = median(&mut self.times);
        LatencyRow {
            model: self.arch.name().to_string(),
            context: self.context,
            batch: self.batch,
            params: self.params,
            median_s_per_step: med,
            min_s_per_step: min,
            max_s_per_step: max,
            tokens_per_s: (self.batch * self.context) as f64 / med,
            flops_per_step: self.flops_per_step,
            model_gflop_per_s: self.flops_per_step / med / 1e9,
            last_loss: self.last_loss,
            device: device.to_string(),
        }
    }
}

/// Runs the sweep (or only the report, with `--report`).
/// `--dry-run`: per model and context, the timed model's size and training memory (the benchmark
/// trains with Adam: two moments per parameter), and device-hours from this output directory's
/// `latency.csv` where it timed that cell on this machine. The benchmark's steps are themselves the
/// real step, so `step` adds nothing.
fn dry_run(
    cli: &Cli,
    config: &LatencyConfig,
    archs: &[Architecture],
    device: &Device,
) -> Result<()> {
    let timed: Vec<LatencyRow> = if cli.output_machine() == Some(cli.machine()) {
        csv::Reader::from_path(cli.out.join("latency.csv"))
            .ok()
            .map(|mut r| r.deserialize().filter_map(Result::ok).collect())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let build = device.clone().without_autodiff();
    let mut plans = Vec::new();
    for &context in &config.contexts {
        let batch = (config.tokens_per_batch / context).max(1);
        for &arch in archs {
            let model_config =
                ModelConfig::preset(&config.preset, arch, context).map_err(anyhow::Error::msg)?;
            let model = model_config.init(Direction::Causal, &build);
            let (params, optimizer_floats) =
                crate::dry_run::param_stats(&model, &training::optimizer::OptimizerConfig::adamw());
            let steps = config.warmup_steps + config.timed_steps;
            plans.push(crate::dry_run::RunPlan {
                label: format!("{} @ {context}", arch.name()),
                runs: 1,
                params,
                tokens_per_step: batch * context,
                steps,
                optimizer_floats,
                activation_floats: model_config.activation_floats_per_token(context)
                    * (batch * context) as f64,
                kv_cache_floats: 0.0,
                train_flops: model_config.train_flops_per_step(batch, context) * steps as f64,
                step_seconds: timed
                    .iter()
                    .find(|r| r.model == arch.name() && r.context == context && r.batch == batch)
                    .map(|r| r.median_s_per_step),
            });
        }
    }
    crate::dry_run::print(cli, "", &plans);
    Ok(())
}

/// Table 11 of the FLASH paper: every configured architecture's training step timed per context.
pub struct LatencySweep;

impl Experiment for LatencySweep {
    type Config = LatencyConfig;

    fn check(&self, cli: &Cli, config: &LatencyConfig) -> Result<()> {
        architectures(config)?;
        if config.timed_steps == 0 || config.contexts.is_empty() || config.tokens_per_batch == 0 {
            bail!(
                "table11 config: timed_steps, contexts and tokens_per_batch must be non-empty / positive"
            );
        }
        cli.one_device()?;
        Ok(())
    }

    fn plan(&self, cli: &Cli, config: &LatencyConfig, _mode: DryRun) -> Result<()> {
        let device = cli.one_device()?.train_device()?;
        dry_run(cli, config, &architectures(config)?, &device)
    }

    fn execute(&self, cli: &Cli, config: LatencyConfig) -> Result<()> {
        run(cli, &config)
    }

    fn render(&self, out: &Path) -> Result<()> {
        render(out)
    }
}

/// The config's models.
fn architectures(config: &LatencyConfig) -> Result<Vec<Architecture>> {
    config
        .models
        .iter()
        .map(|m| m.parse().map_err(anyhow::Error::msg))
        .collect()
}

/// Times every model at every context, interleaved, and renders.
fn run(cli: &Cli, config: &LatencyConfig) -> Result<()> {
    let csv_path = cli.out.join("latency.csv");
    let archs = architectures(config)?;
    let device = cli.one_device()?.train_device()?;
    let provenance = cli.save_provenance(config)?;
    eprintln!(
        "table11 ({}): {} on {}",
        cli.profile.name(),
        config.description,
        provenance.device
    );
    let mut rows = Vec::new();
    let mut progress = Progress::new(archs.len() * config.contexts.len());
    for &context in &config.contexts {
        progress.running(format!("{} models at {context}", archs.len()));
        let mut cells = archs
            .iter()
            .map(|&arch| Cell::new(config, arch, context, &device))
            .collect::<Result<Vec<_>>>()?;
        // Round-robin over the models, one step each: the machine's speed drifts by tens of
        // percent over minutes, and interleaving gives every model of a context the same drift,
        // so their ratios (the parity check) are not skewed by when each ran.
        for step in 0..config.warmup_steps + config.timed_steps {
            for cell in &mut cells {
                cell.step(config.learning_rate, step >= config.warmup_steps);
            }
        }
        for cell in cells {
            let row = cell.row(&provenance.device);
            progress.item(format!(
                "{:<20} T={context:<5} B={:<3} {:8.3} s/step  loss {:.3}",
                row.model, row.batch, row.median_s_per_step, row.last_loss
            ));
            rows.push(row);
        }
        // One block of rows per model, as configured, each in context order.
        rows.sort_by_key(|r| (archs.iter().position(|a| a.name() == r.model), r.context));
        // Rewritten after every context so an interrupted sweep leaves a valid CSV of what it measured.
        write_csv(&csv_path, &rows)?;
    }
    drop(progress);
    render(&cli.out)?;
    eprintln!("wrote {}", cli.out.display());
    Ok(())
}

/// Draws `latency.png/svg` and writes `comparison.md` (ours vs the JAX anchor) from `latency.csv`.
pub fn render(out: &Path) -> Result<()> {
    let rows: Vec<LatencyRow> = csv::Reader::from_path(out.join("latency.csv"))
        .with_context(|| {
            format!(
                "cannot read {}: run table11 first",
                out.join("latency.csv").display()
            )
        })?
        .deserialize()
        .collect::<Result<_, _>>()
        .with_context(|| format!("malformed {}", out.join("latency.csv").display()))?;
    let mut series: Vec<TimedSeries> = Vec::new();
    for row in &rows {
        let point = Timed {
            x: row.context as f64,
            median: row.median_s_per_step,
            min: row.min_s_per_step,
            max: row.max_s_per_step,
        };
        match series.iter_mut().find(|s| s.model == row.model) {
            Some(s) => s.points.push(point),
            None => series.push(TimedSeries {
                model: row.model.clone(),
                points: vec![point],
            }),
        }
    }
    let device = rows.first().map(|r| r.device.clone()).unwrap_or_default();
    TimingChart {
        title: format!("Training step latency vs context — {device}"),
        x_label: "context length (tokens)".into(),
        y_label: "seconds per step (median; bar: fastest to slowest step)".into(),
    }
    .save(&out.join("latency"), &series)?;
    write_atomic(&out.join("comparison.md"), comparison(&rows)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::anchors::*;
    use super::*;

    fn row(model: &str, context: usize, seconds: f64) -> LatencyRow {
        LatencyRow {
            model: model.into(),
            context,
            batch: 8192 / context,
            params: 0,
            median_s_per_step: seconds,
            min_s_per_step: seconds,
            max_s_per_step: seconds,
            tokens_per_s: 8192.0 / seconds,
            flops_per_step: 0.0,
            model_gflop_per_s: 0.0,
            last_loss: 0.0,
            device: "test".into(),
        }
    }

    /// The committed manifest names files that exist and parse, each same-session anchor with a
    /// target.
    #[test]
    fn the_committed_anchor_manifest_resolves() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let (reference, session) = read_anchors(&root).unwrap();
        assert!(reference.iter().any(|(m, c, _)| m == "flash" && *c == 512));
        assert_eq!(
            session.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
            ["JAX", "PyTorch"]
        );
        assert!(
            session
                .iter()
                .all(|a| !a.times.is_empty() && a.target > 0.0)
        );
    }

    #[test]
    fn session_comparison_states_each_ratio_against_its_target_and_counts_the_rows() {
        let anchors = [
            SessionAnchor {
                name: "JAX".into(),
                file: "jax.csv".into(),
                times: read_anchor(
                    "model,context,median_s_per_step\nflash,512,5.0\nflash,1024,4.0\n",
                )
                .unwrap(),
                target: 0.7,
            },
            SessionAnchor {
                name: "PyTorch".into(),
                file: "torch.csv".into(),
                times: read_anchor("model,context,median_s_per_step\nflash,512,4.0\n").unwrap(),
                target: 0.8,
            },
        ];
        // 3.0 / 5.0 = 0.60 (meets 0.7), 3.0 / 4.0 = 0.75 (meets 0.8): the row meets both.
        // 3.0 / 4.0 = 0.75 against JAX misses 0.7; PyTorch has no 1024 row: not all met.
        // A model neither anchor timed is not counted.
        let rows = [
            row("flash", 512, 3.0),
            row("flash", 1024, 3.0),
            row("performer", 512, 1.0),
        ];
        let md = session_comparison(&rows, &anchors);
        assert!(
            md.contains("| flash | 512 | 3.000 | 5.00 | 0.60× | yes | 4.00 | 0.75× | yes |"),
            "{md}"
        );
        assert!(
            md.contains("| flash | 1024 | 3.000 | 4.00 | 0.75× | **no** | — | — | — |"),
            "{md}"
        );
        assert!(md.contains("1 of 2 rows meet every target"), "{md}");
    }
}
