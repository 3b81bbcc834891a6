//! The latency benchmark (the FLASH paper's Table 11 and Figure 5(a)): seconds per causal-LM
//! training step (forward + backward + Adam) of each architecture at a fixed number of tokens per
//! batch, over context lengths.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::optim::AdamConfig;
use burn::optim::ModuleOptimizer;
use burn::prelude::*;
use model::{Architecture, Direction, LanguageModel, ModelConfig};
use report::timing::{Timed, TimedSeries, TimingChart};
use serde::{Deserialize, Serialize};
use training::write_atomic;

use crate::{Cli, Profile, Progress, median, write_csv};

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

fn builtin(profile: Profile) -> &'static str {
    match profile {
        Profile::Smoke => include_str!("../configs/table11/smoke.toml"),
        Profile::Cpu => include_str!("../configs/table11/cpu.toml"),
        Profile::Paper => include_str!("../configs/table11/paper.toml"),
    }
}

/// Where the anchors are listed: `experiments/anchors/manifest.toml`, read from the repository
/// root at run time, so that a new timing session edits the manifest, not the code.
const ANCHOR_MANIFEST: &str = "experiments/anchors/manifest.toml";

/// The repository root the anchors are read from: the working directory when it is the root (as
/// under `just`), else the checkout this binary was built in (tests run in the crate's directory).
fn anchors_root() -> PathBuf {
    if Path::new(ANCHOR_MANIFEST).exists() {
        PathBuf::from(".")
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }
}

/// The anchors' manifest (`experiments/anchors/manifest.toml`).
#[derive(Deserialize)]
struct AnchorManifest {
    /// The recorded JAX step times the first parity check reads.
    reference: AnchorEntry,
    /// The anchors timed interleaved with the committed `latency.csv`.
    same_session: Vec<AnchorEntry>,
}

/// One anchor of the manifest.
#[derive(Deserialize)]
struct AnchorEntry {
    /// The framework, as the tables name it.
    name: String,
    /// Its CSV (`model,context,median_s_per_step`), relative to the repository root.
    file: String,
    /// The largest ours / anchor ratio the project aims for on every row (same-session anchors).
    #[serde(default)]
    target: Option<f64>,
}

/// The anchors of the manifest under the repository root `root`: the reference's times and the
/// same-session anchors.
fn read_anchors(root: &Path) -> Result<(AnchorTimes, Vec<SessionAnchor>)> {
    let manifest = root.join(ANCHOR_MANIFEST);
    let text = std::fs::read_to_string(&manifest).with_context(|| {
        format!(
            "cannot read {}: run from the repository root",
            manifest.display()
        )
    })?;
    let m: AnchorManifest = toml::from_str(&text)
        .with_context(|| format!("bad anchor manifest {}", manifest.display()))?;
    let read = |file: &str| {
        std::fs::read_to_string(root.join(file))
            .with_context(|| format!("anchor {file} (listed in {})", manifest.display()))
            .and_then(|csv| read_anchor(&csv))
    };
    let reference = read(&m.reference.file)?;
    let session = m
        .same_session
        .into_iter()
        .map(|a| {
            let target = a.target.with_context(|| {
                format!(
                    "anchor `{}` in {}: give its `target`",
                    a.name,
                    manifest.display()
                )
            })?;
            Ok(SessionAnchor {
                times: read(&a.file)?,
                name: a.name,
                file: a.file,
                target,
            })
        })
        .collect::<Result<_>>()?;
    Ok((reference, session))
}

/// An anchor timed in the same session as our rows: the JAX/XLA script (its
/// `transformer_plusplus` the faster of the anchor's own Transformer++ and the same model with
/// blockwise attention, `anchors/tfmpp_blockwise_jax.py`) or PyTorch eager running the public
/// implementations (`anchors/torch_anchor.py`: flash-pytorch 0.1.9 for FLASH and FLASH-Quad,
/// x-transformers for Transformer++), with the ratio of ours to theirs the project aims for.
struct SessionAnchor {
    /// The framework, as the tables name it.
    name: String,
    /// Its CSV, relative to the repository root.
    file: String,
    /// Its step times.
    times: AnchorTimes,
    /// The largest ours / anchor ratio the project aims for on every row.
    target: f64,
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

pub fn run(cli: Cli) -> Result<()> {
    let csv_path = cli.out.join("latency.csv");
    if cli.report_only {
        return cli.rerender(render);
    }
    let config: LatencyConfig = cli.load_config(&builtin)?;
    let archs: Vec<Architecture> = config
        .models
        .iter()
        .map(|m| m.parse().map_err(anyhow::Error::msg))
        .collect::<Result<_>>()?;
    if config.timed_steps == 0 || config.contexts.is_empty() || config.tokens_per_batch == 0 {
        bail!(
            "table11 config: timed_steps, contexts and tokens_per_batch must be non-empty / positive"
        );
    }
    let device = cli.one_device()?.train_device()?;
    if cli.dry_run.is_some() {
        return dry_run(&cli, &config, &archs, &device);
    }
    let provenance = cli.save_provenance(&config)?;
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
            .map(|&arch| Cell::new(&config, arch, context, &device))
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

/// Markdown: our seconds per step beside the JAX anchor's, row by row, and the growth 512 → 8192.
fn comparison(rows: &[LatencyRow]) -> Result<String> {
    let (anchor, session) = read_anchors(&anchors_root())?;
    let mut md = String::from(
        "# Table 11 on this machine: burn vs the JAX anchor\n\n\
         Seconds per causal-LM training step (median), same configuration as `experiments/anchors/flash_jax.py`.\n\
         Generated by `table11` from `latency.csv` and `experiments/anchors/flash_jax_cpu.csv`.\n\n\
         | model | context | batch | ours (s) | JAX anchor (s) | ours / anchor | tokens/s | model GFLOP/s |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (a_s, ratio) = match anchor_seconds(&anchor, &r.model, r.context) {
            Some(a) => (
                format!("{a:.2}"),
                format!("{:.2}×", r.median_s_per_step / a),
            ),
            None => ("—".into(), "—".into()),
        };
        md += &format!(
            "| {} | {} | {} | {:.3} | {a_s} | {ratio} | {:.0} | {:.1} |\n",
            r.model, r.context, r.batch, r.median_s_per_step, r.tokens_per_s, r.model_gflop_per_s
        );
    }
    md += &parity(
        rows,
        &anchor,
        "the recorded anchor (`experiments/anchors/flash_jax_cpu.csv`)",
    );
    md += &session_comparison(rows, &session);
    for a in &session {
        let what = format!("{} re-timed in this session (`{}`)", a.name, a.file);
        md += &parity(rows, &a.times, &what);
    }
    md += &format!(
        "\n## Growth from the shortest to the longest context (FLASH flat: at most {FLAT_BOUND}×)\n\n\
         | model | first context | last context | ratio of s/step |\n|---|---|---|---|\n"
    );
    let mut models: Vec<&str> = Vec::new();
    for r in rows {
        if !models.contains(&r.model.as_str()) {
            models.push(&r.model);
        }
    }
    for m in models {
        let mine: Vec<&LatencyRow> = rows.iter().filter(|r| r.model == m).collect();
        if let (Some(first), Some(last)) = (
            mine.iter().min_by_key(|r| r.context),
            mine.iter().max_by_key(|r| r.context),
        ) {
            let growth = last.median_s_per_step / first.median_s_per_step;
            let flat = match m {
                "flash" if growth <= FLAT_BOUND => " (flat)",
                "flash" => " (**not flat**)",
                _ => "",
            };
            md += &format!(
                "| {m} | {} | {} | {growth:.2}×{flat} |\n",
                first.context, last.context
            );
        }
    }
    Ok(md)
}

/// Markdown: each row beside every same-session anchor, with the ratio and whether it meets the
/// anchor's target, and a count of the rows that meet all targets.
fn session_comparison(rows: &[LatencyRow], anchors: &[SessionAnchor]) -> String {
    let mut md = String::from(
        "\n## Against the anchors re-timed in this session\n\n| model | context | ours (s) |",
    );
    let mut rule = String::from("|---|---|---|");
    for a in anchors {
        md += &format!(" {0} (s) | ours / {0} | ≤ {1}? |", a.name, a.target);
        rule += "---|---|---|";
    }
    md += &format!("\n{rule}\n");
    let (mut compared, mut met) = (0, 0);
    for r in rows {
        md += &format!(
            "| {} | {} | {:.3} |",
            r.model, r.context, r.median_s_per_step
        );
        let mut all = true;
        let mut any = false;
        for a in anchors {
            match anchor_seconds(&a.times, &r.model, r.context) {
                Some(t) => {
                    let ratio = r.median_s_per_step / t;
                    let ok = ratio <= a.target;
                    all &= ok;
                    any = true;
                    md += &format!(
                        " {t:.2} | {ratio:.2}× | {} |",
                        if ok { "yes" } else { "**no**" }
                    );
                }
                None => {
                    all = false;
                    md += " — | — | — |";
                }
            }
        }
        md += "\n";
        if any {
            compared += 1;
            met += usize::from(all);
        }
    }
    let files: Vec<String> = anchors.iter().map(|a| format!("`{}`", a.file)).collect();
    md += &format!(
        "\n{met} of {compared} rows meet every target (anchors: {}).\n",
        files.join(", ")
    );
    md
}

/// The project's parity requirement: at each context, no architecture's ours/anchor ratio may
/// exceed another's by more than this, or a speedup between them measures the implementations
/// rather than the algorithms.
pub const PARITY_BOUND: f64 = 1.3;

/// Markdown: per context, each model's ours/anchor ratio and the largest over the smallest.
fn parity(rows: &[LatencyRow], anchor: &[(String, usize, f64)], what: &str) -> String {
    let mut contexts: Vec<usize> = rows.iter().map(|r| r.context).collect();
    contexts.sort_unstable();
    contexts.dedup();
    let mut md = format!(
        "\n## Parity against {what}: ours / anchor per model, and the spread (bound {PARITY_BOUND})\n\n\
         | context | ratios | largest / smallest | within {PARITY_BOUND}? |\n|---|---|---|---|\n"
    );
    for context in contexts {
        let ratios: Vec<(&str, f64)> = rows
            .iter()
            .filter(|r| r.context == context)
            .filter_map(|r| {
                let a = anchor_seconds(anchor, &r.model, context)?;
                Some((r.model.as_str(), r.median_s_per_step / a))
            })
            .collect();
        if ratios.len() < 2 {
            continue;
        }
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &(_, r)| (lo.min(r), hi.max(r)));
        let listed: Vec<String> = ratios.iter().map(|(m, r)| format!("{m} {r:.2}×")).collect();
        let verdict = if hi / lo <= PARITY_BOUND {
            "yes"
        } else {
            "**no**"
        };
        md += &format!(
            "| {context} | {} | {:.2} | {verdict} |\n",
            listed.join(", "),
            hi / lo
        );
    }
    md
}

/// The anchor's seconds per step for `model` at `context`, if it timed that pair.
fn anchor_seconds(anchor: &[(String, usize, f64)], model: &str, context: usize) -> Option<f64> {
    anchor
        .iter()
        .find(|(m, c, _)| m == model && *c == context)
        .map(|&(_, _, s)| s)
}

/// An anchor's step times: (model, context, median seconds per step).
type AnchorTimes = Vec<(String, usize, f64)>;

fn read_anchor(csv: &str) -> Result<AnchorTimes> {
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    reader
        .deserialize::<(String, usize, f64)>()
        .map(|r| r.context("anchor CSV"))
        .collect()
}

#[cfg(test)]
mod tests {
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
