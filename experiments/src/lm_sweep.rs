//! Quality vs training cost (the FLASH paper's Figures 5–6 and Tables 3, 12, 13): every model at
//! every context length trained on the same data for the same steps, perplexity against
//! device-hours, and the speedup to reach the baseline's final perplexity. One library for the
//! three experiments; each binary only picks its configs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use data::registry::{self, Split};
use data::source::{SourceOptions, split_files};
use data::tokenize::{self, TokenizerSpec};
use model::{Architecture, Direction, ModelConfig};
use report::quality::{QualityChart, SeedCurve, SeedPoint};
use serde::{Deserialize, Serialize};
use training::lm_task::{CausalLmTask, LmData, MaskedLmTask, WindowOrder};
use training::optimizer::OptimizerConfig;
use training::schedule::{Decay, Schedule};

use training::trainer::{
    Diverged, KeepModel, MetricsRow, Progress, RunOptions, Stepper, TrainConfig, stop_on_ctrl_c,
    train,
};
use training::{Provenance, write_atomic, write_json};

use crate::dry_run::{DryRun, RunPlan};
use crate::lr_choice::{self, RateChoice};
use crate::run_store;
pub use crate::verdict::SweepRow;
use crate::verdict::{Pairing, StepCost, StepTime, Summary, Verdict, summarize};
use crate::{Cli, Machine};

/// The training objective of a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Next-token prediction with causal models (Wiki-40B, PG-19: Figure 6, Table 3).
    Causal,
    /// BERT-style masked-token prediction with bidirectional models (C4: Figure 5); perplexity over
    /// the masked tokens only.
    Masked,
}

impl Objective {
    fn direction(self) -> Direction {
        match self {
            Objective::Causal => Direction::Causal,
            Objective::Masked => Direction::Bidirectional,
        }
    }
}

/// What a sweep's `table.md` shows after the per-model summary (perplexity and speedup).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepTable {
    /// The summary only (Tables 3, 12, 13; Figure 7).
    #[default]
    Speedup,
    /// Also the perplexity lost by chunking per context (Table 5): FLASH-Quad → FLASH against
    /// Transformer++ → MC-TFM++ (and the relu² Transformer++ control when trained), with the
    /// verdict on "the GAU loses less".
    ChunkingLoss,
    /// Also a layer-ablation table (Tables 1 and 2): per context, every model's final perplexity
    /// over the baseline's (the default layer), with the verdict on "the default is the best or
    /// within its seed spread" (F8).
    Ablation,
    /// Also perplexity against model size (Figure 3; [`crate::scaling`]): each family's final
    /// perplexity per size, FLASH-Quad against Transformer++ per size (F7), and a chart against
    /// parameters.
    Scaling,
    /// Also the claimed models' speedup against run length ([`crate::length_trend`]): this
    /// sweep's runs beside the shorter runs of the sweeps in `length_trend_of`.
    LengthTrend,
}

/// One sweep, one file per scale under `experiments/configs/<id>/`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LmSweepConfig {
    /// What the run reproduces and what the paper reports.
    pub description: String,
    /// Causal or masked language modelling.
    pub objective: Objective,
    /// Dataset name (`datasets list`).
    pub dataset: String,
    /// A root holding one folder per dataset, `<data_dir>/<dataset>/`, each in the dataset's hub
    /// layout (as `datasets --data-dir`; the offline corpus's folder is `gutenberg_shakespeare`);
    /// empty, or a dataset with no folder there: the Hugging Face cache / hub, or `data/` for the
    /// offline corpus.
    pub data_dir: String,
    /// A dataset's own folder, by dataset name (e.g. `{ pg19 = "/mnt/pg19" }`), read before
    /// `data_dir`.
    #[serde(default)]
    pub data_dirs: BTreeMap<String, String>,
    /// `bytes`, `bpe:N`, `unigram:N`, `file:PATH` or `hub:REPO`.
    pub tokenizer: String,
    /// Architectures by name, each trained once per seed of `seeds`.
    pub models: Vec<String>,
    /// Architectures trained with the first seed only (references beside the claim's models).
    #[serde(default)]
    pub one_seed_models: Vec<String>,
    /// Seeds (model initialisation, data order, masking): a claim that rests on a difference
    /// between models needs the spread over seeds.
    pub seeds: Vec<u64>,
    /// Models the paper says reach the baseline's final perplexity sooner (speedup > 1); each gets
    /// a verdict in `table.md`.
    #[serde(default)]
    pub claimed_faster: Vec<String>,
    /// Model-config fields changed for every model (e.g. `{ d_model = 128, n_blocks = 2 }`),
    /// applied to the preset before a variant's own `set`.
    #[serde(default)]
    pub set: toml::Table,
    /// Extra models: an architecture with some model-config fields changed (e.g. FLASH with chunk
    /// 512), trained and drawn beside the others under their own name.
    #[serde(default)]
    pub variants: Vec<Variant>,
    /// Models timed by the step-time calibration but never trained: the cost of a variant whose
    /// quality the sweep does not need (fig6: Performer with token-level prefix sums, the paper's
    /// Performer, beside the blockwise one it trains).
    #[serde(default)]
    pub timed_variants: Vec<Variant>,
    /// The model whose final perplexity the others must reach (the paper: Transformer++, or
    /// Transformer+ for PG-19).
    pub baseline: String,
    /// Context lengths.
    pub contexts: Vec<usize>,
    /// Model size preset (`tiny`, `latency_bench`, `paper_base`, `paper_large`).
    pub preset: String,
    /// Tokens per batch; batch = max(1, tokens_per_batch / context).
    pub tokens_per_batch: usize,
    /// Optimizer steps per run.
    pub steps: usize,
    pub optimizer: OptimizerConfig,
    /// Peak learning rate of every model not named in `peak_lr_by_model`.
    pub peak_lr: f64,
    /// Peak learning rates of named models (names as in `models`, `one_seed_models` or
    /// `variants`) that replace `peak_lr` for them, e.g. `{ transformer_plusplus = 0.002 }`. Not
    /// in the paper's text (its hyperparameter tables are in the PDF only); for a scale at which
    /// one rate does not suit every model, each model's rate chosen by a pilot that the config's
    /// comment gives, so that no model is compared at a rate that handicaps it. Default: none.
    #[serde(default)]
    pub peak_lr_by_model: std::collections::BTreeMap<String, f64>,
    pub warmup_steps: usize,
    pub decay: Decay,
    /// Micro-batches per step.
    pub grad_accum: usize,
    /// Per-parameter gradient-norm clipping; 0 = off.
    pub clip_norm: f32,
    /// Evaluate every this many steps.
    pub eval_every: usize,
    /// Held-out tokens per evaluation, the same at every context: `eval_tokens / context` windows
    /// (at least one) of `context + 1` tokens (`context` for the masked objective) from the
    /// validation split, the same windows at every evaluation.
    pub eval_tokens: usize,
    /// Checkpoint every this many steps (0 = at the end and on Ctrl-C).
    pub checkpoint_every: usize,
    /// Step-time calibration, after the runs: rounds in which every model takes one training step
    /// of its runs' kind (same model, batch, optimizer, objective), in turn, per context, after
    /// one untimed round; the speedups' step-time ratios come from these rounds
    /// (`step_times.csv`), since runs trained in different sessions were timed on a machine of a
    /// different speed. 0: no calibration (the ratios come from the runs' own device-hours).
    /// Default 9 (not in the paper, which trains every model on its own TPU slice): single steps on
    /// a shared 2-core machine jitter by ±20%, and the ratio's interquartile range narrows with
    /// more rounds.
    #[serde(default = "default_timing_rounds")]
    pub timing_rounds: usize,
    /// What `table.md` shows beyond the summary.
    #[serde(default)]
    pub table: SweepTable,
    /// The order of the training windows: `{ kind = "shuffled", block_tokens = N }` (the
    /// papers' pipelines read their corpora shuffled; the seed of a run draws its order) or
    /// `{ kind = "file" }`. Default (a config that does not say): file order, what the sweeps
    /// read before the field existed.
    #[serde(default)]
    pub train_order: WindowOrder,
    /// The split the held-out curves and the verdicts read: `test`, with the validation split
    /// evaluated at each run's end for the choices made between runs (`lr_grid`), or
    /// `validation` (default: what the sweeps read before the field existed; then nothing may be
    /// chosen on held-out data).
    #[serde(default)]
    pub eval_split: EvalSplit,
    /// Peak learning rates each model of `models` is tried at, with the first seed; each model
    /// and context then trains its other seeds at the rate whose run ends with the lowest
    /// validation loss (which must lie inside the grid, not at its edge). `one_seed_models` and
    /// the variants train at the rate the baseline chose. Empty (default): no choice, every model
    /// at `peak_lr` / `peak_lr_by_model`. Needs `eval_split = "test"`.
    #[serde(default)]
    pub lr_grid: Vec<f64>,
    /// With `table = "length_trend"`: the experiments whose results hold the same models at
    /// fewer steps (e.g. `["fig6"]`), read from beside this sweep's output directory.
    #[serde(default)]
    pub length_trend_of: Vec<String>,
    /// An experiment whose rate choices (its `lr_grid`, read from its results beside this
    /// sweep's output directory) set this sweep's rates per model and context: a model it chose
    /// for takes that rate, a variant its base model's, any other the rate of the model
    /// `lr_family` names. For the ablation artifacts, which keep one rate per model family
    /// (GAU variants at FLASH-Quad's, Transformer variants at Transformer++'s). Empty (default):
    /// `peak_lr` / `peak_lr_by_model`.
    #[serde(default)]
    pub peak_lr_from: String,
    /// With `peak_lr_from`: the model of the other sweep whose rate a model takes, e.g.
    /// `{ mc_tfmpp = "transformer_plusplus" }`.
    #[serde(default)]
    pub lr_family: std::collections::BTreeMap<String, String>,
}

/// The held-out split of a sweep's curves and verdicts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalSplit {
    /// Curves and verdicts on validation; no selection split.
    #[default]
    Validation,
    /// Curves and verdicts on test; choices on validation.
    Test,
}

fn default_timing_rounds() -> usize {
    9
}

/// A named architecture variant: `set` overrides fields of the preset's [`ModelConfig`] (any of its
/// fields, by name: `chunk_size`, `d_qk`, `expansion_factor`, `scaling`, ...).
///
/// ```toml
/// [[variants]]
/// name = "flash_c512"
/// model = "flash"
/// set = { chunk_size = 512 }
/// ```
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// The name in `metrics.csv`, the charts and `table.md`.
    pub name: String,
    /// The architecture it starts from.
    pub model: String,
    /// Model-config fields to change.
    pub set: toml::Table,
}

/// `base` with the fields of `set` changed; an unknown field or a wrong type is an error that
/// names `what` (the variant, or the sweep's `set`).
fn apply_set(base: ModelConfig, set: &toml::Table, what: &str) -> Result<ModelConfig> {
    let mut json = serde_json::to_value(&base)?;
    let fields = json
        .as_object_mut()
        .ok_or_else(|| anyhow!("model config is not a table"))?;
    for (key, value) in set {
        if !fields.contains_key(key) {
            let mut known: Vec<&String> = fields.keys().collect();
            known.sort();
            bail!("{what}: `{key}` is not a model-config field; known fields: {known:?}");
        }
        fields.insert(key.clone(), serde_json::to_value(value)?);
    }
    serde_json::from_value(json)
        .with_context(|| format!("{what}: a value in `set` has the wrong type"))
}

/// The paper's table that a sweep binary's `table.md` reproduces.
fn paper_table(id: &str) -> String {
    match id {
        "fig5" => "FLASH Table 12 (masked LM, Figure 5)".into(),
        "fig6" => "FLASH Table 13 (causal LM, Figure 6)".into(),
        "table3" => "FLASH Table 3 (causal LM on PG-19)".into(),
        "fig7" => "FLASH Figure 7 (ablations of mixed chunk attention)".into(),
        "table5" => "FLASH Table 5 (the perplexity lost by chunking)".into(),
        "fig8" => "FLASH Figure 8 (chunk sizes)".into(),
        "table1" => "FLASH Table 1 (GAU ablations)".into(),
        "table2" => "FLASH Table 2 (Transformer++ ablations)".into(),
        "fig3" => "FLASH Figure 3 (GAU against the Transformer across model sizes)".into(),
        "f4_length" => "FLASH's speedup (F4) against training length".into(),
        other => format!("`{other}`"),
    }
}

pub fn run(cli: Cli, builtin: &dyn Fn(crate::Profile) -> &'static str) -> Result<()> {
    let table = paper_table(cli.id);
    if cli.report_only {
        return cli.rerender(|out| render(out, &table, None));
    }
    let config: LmSweepConfig = cli.load_config(builtin)?;
    // Said once, by the command typed (its `--jobs` workers run with the same arguments).
    if let (None, Some(shadowed)) = (cli.worker, lr_set_shadowed(&cli.sets, &config)) {
        eprintln!("warning: {shadowed}");
    }
    // Before anything is written or a tokenizer trained: a device count the backend cannot give,
    // or a batch it does not divide at some context, is refused up front.
    let devices = cli.train_devices()?;
    if cli.jobs > 1 && devices.len() > 1 {
        bail!(
            "--jobs {} with --devices {}: give one of them (worker processes each train one run on one device)",
            cli.jobs,
            devices.len()
        );
    }
    for &context in &config.contexts {
        split_batch(config.tokens_per_batch, context, devices.len())?;
    }
    let models = sweep_models(&config)?;
    let timed_only = timed_only_models(&config)?;
    if let Some(mode) = cli.dry_run {
        return dry_run_sweep(&cli, &config, &models, &devices, mode);
    }
    let data = sweep_data(&config)?;
    let LmData {
        spec,
        train_files,
        eval_files,
        tok,
    } = data.clone();
    let tok_description = tok.description.clone();
    // Every run's model configuration resolves and is consistent before anything is written.
    for &context in &config.contexts {
        for m in models.iter().chain(&timed_only) {
            run_model_config(&config, m, context, tok.vocab_size())?;
        }
    }
    let stop = stop_on_ctrl_c();
    let select_files = selection_files(&config)?;
    let grid = !config.lr_grid.is_empty();
    let first = if grid {
        grid_keys(&config, &models)
    } else {
        configured_keys(&config, &models, &inherited_choices(&config, &cli.out)?)?
    };
    let first = plan_runs(&config, &first, &data, devices.len(), &cli.store)?;
    let (provenance, progress) = match cli.worker {
        // A worker of `--jobs` trains what it can claim; the command that started it writes the
        // output directory. Its runs' provenance names that command (without `--worker K`).
        Some(_) => {
            let mut provenance = Provenance::collect(cli.device_description());
            let args: Vec<String> = std::env::args().collect();
            provenance.command = args[..args.len().saturating_sub(2)].join(" ");
            (provenance, Progress::Lines)
        }
        None => {
            std::fs::create_dir_all(&cli.out)
                .with_context(|| format!("cannot create {}", cli.out.display()))?;
            // Read before this command's env.json replaces the one that names the calibration's
            // machine.
            forget_other_machines_step_times(&cli.out, cli.output_machine(), &cli.machine())?;
            let provenance = cli.save_provenance(&config)?;
            let eval_split = match config.eval_split {
                EvalSplit::Validation => "validation",
                EvalSplit::Test => "test",
            };
            write_atomic(
                &cli.out.join("data.json"),
                serde_json::to_string_pretty(&serde_json::json!({
                    "dataset": spec.name, "train_split": "train", "train_order": config.train_order,
                    "eval_split": eval_split, "select_files": select_files,
                    "train_files": train_files, "eval_files": eval_files, "tokenizer": tok_description,
                    "run_store": cli.store, "unigram_ppl": unigram_ppl(&data)?,
                }))?
                .as_bytes(),
            )?;
            (provenance, Progress::Auto)
        }
    };
    let trainer = RunTrainer {
        config: &config,
        data: &data,
        select_files: &select_files,
        devices: &devices,
        provenance: &provenance,
        stop,
        progress,
    };
    if let Some(worker) = cli.worker {
        // The command that started this worker trains the grid before the chosen rates' runs,
        // and starts workers for each in turn.
        let plan = match finished_rows(&first, config.steps)? {
            Some(done) if grid => {
                let diverged = diverged_runs(&first)?;
                chosen_plan(&config, &models, (&done, &diverged), &data, &cli)?
            }
            _ => first,
        };
        return train_as_worker(&trainer, &plan, worker);
    }
    let mut rows: Vec<SweepRow> = Vec::new();
    execute(&cli, &trainer, &first, &mut rows)?;
    if grid {
        let diverged = diverged_runs(&first)?;
        crate::write_csv(&cli.out.join(lr_choice::DIVERGED), &diverged)?;
        let second = chosen_plan(&config, &models, (&rows, &diverged), &data, &cli)?;
        execute(&cli, &trainer, &second, &mut rows)?;
    }
    let mut timed = models;
    timed.extend(timed_only);
    calibrate_step_times(&config, &timed, &data, &devices, &cli.out)?;
    render(&cli.out, &table, Some(&config))?;
    eprintln!("wrote {} ({})", cli.out.display(), provenance.device);
    Ok(())
}

/// Trains `plan`'s unfinished runs (in `cli.jobs` worker processes, then here whatever is left)
/// and appends every run's rows to `rows` (a run already there is skipped), writing the sweep's
/// `metrics.csv` as they come.
fn execute(
    cli: &Cli,
    trainer: &RunTrainer,
    plan: &[PlannedRun],
    rows: &mut Vec<SweepRow>,
) -> Result<()> {
    let steps = trainer.config.steps;
    if cli.worker.is_none() {
        let mut stored = 0;
        for run in plan {
            stored += usize::from(finished_metrics(&run.dir, steps)?.is_some());
        }
        if stored > 0 {
            eprintln!(
                "{stored} of these {} runs are finished in the run store {} and are reused, not retrained \
                 (`--store DIR` trains every run anew in DIR)",
                plan.len(),
                cli.store.display()
            );
        }
    }
    if cli.jobs > 1 {
        run_workers(cli, plan, steps)?;
    }
    for run in plan {
        if rows.iter().any(|r| r.run == run.name) {
            continue;
        }
        let metrics = match finished_metrics(&run.dir, steps)? {
            Some(done) => {
                eprintln!("{}: finished run {}", run.label, run.dir.display());
                done
            }
            None => {
                // Another process training this run (a second sweep on the same store) finishes
                // it first; this one then reuses it.
                let _lock = run_store::lock_training(&run.dir, Duration::from_secs(10))?;
                match finished_metrics(&run.dir, steps)? {
                    Some(done) => done,
                    None => match trainer.train(run, &run.label)? {
                        Some(done) => done,
                        None => {
                            write_rows(&cli.out, rows)?;
                            bail!(
                                "interrupted; run the same command again to resume from the checkpoint in {}",
                                run.dir.display()
                            );
                        }
                    },
                }
            }
        };
        rows.extend(metrics.into_iter().map(|metrics| run.row(metrics)));
        write_rows(&cli.out, rows)?;
    }
    Ok(())
}

/// The rows of every run of `plan`, if all have finished.
fn finished_rows(plan: &[PlannedRun], steps: usize) -> Result<Option<Vec<SweepRow>>> {
    let mut rows = Vec::new();
    for run in plan {
        let Some(metrics) = finished_metrics(&run.dir, steps)? else {
            return Ok(None);
        };
        rows.extend(metrics.into_iter().map(|m| run.row(m)));
    }
    Ok(Some(rows))
}

/// The grid runs of `plan` that diverged (their `diverged.json`).
fn diverged_runs(plan: &[PlannedRun]) -> Result<Vec<lr_choice::DivergedRun>> {
    let mut out = Vec::new();
    for run in plan {
        let path = run.dir.join(DIVERGED_MARK);
        let Ok(text) = std::fs::read(&path) else {
            continue;
        };
        let mark: serde_json::Value = serde_json::from_slice(&text).with_context(|| {
            format!(
                "malformed {}; delete it to train the run again",
                path.display()
            )
        })?;
        out.push(lr_choice::DivergedRun {
            model: run.model.clone(),
            context: run.context,
            seed: run.seed,
            peak_lr: run.peak_lr,
            step: mark["step"].as_u64().unwrap_or(0) as usize,
        });
    }
    Ok(out)
}

/// A run directory's mark of a grid run whose loss stopped being finite: the run is over, and its
/// rate lost.
const DIVERGED_MARK: &str = "diverged.json";

/// What a run's divergence (a non-finite training loss) means for the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OnDivergence {
    /// A grid run: its rate lost; the mark is written and the sweep goes on.
    Record,
    /// A run at a chosen or configured rate: an error that names the rate.
    Fail,
}

/// One run to plan: a model of the sweep at a context, with a seed and a peak rate.
struct RunKey<'s, 'c> {
    m: &'s SweepModel<'c>,
    context: usize,
    seed: u64,
    peak_lr: f64,
    on_divergence: OnDivergence,
}

/// Every model's seeds at its configured rate (`peak_lr`, `peak_lr_by_model`): contexts, then
/// models, then seeds.
fn configured_keys<'s, 'c>(
    config: &LmSweepConfig,
    models: &'s [SweepModel<'c>],
    inherited: &[RateChoice],
) -> Result<Vec<RunKey<'s, 'c>>> {
    let mut keys = Vec::new();
    for &context in &config.contexts {
        for m in models {
            for &seed in &m.seeds {
                let peak_lr = if config.peak_lr_from.is_empty() {
                    model_peak_lr(config, &m.name)
                } else {
                    inherited_rate(config, m, context, inherited)?
                };
                keys.push(RunKey {
                    m,
                    context,
                    seed,
                    peak_lr,
                    on_divergence: OnDivergence::Fail,
                });
            }
        }
    }
    Ok(keys)
}

/// The rate `m` takes at `context` from the sweep named by `peak_lr_from` (its `choices`): the
/// rate chosen for a model of that name (or of the name `lr_family` gives it), else the same for
/// a variant's base model.
fn inherited_rate(
    config: &LmSweepConfig,
    m: &SweepModel,
    context: usize,
    choices: &[RateChoice],
) -> Result<f64> {
    let chosen = |name: &str| {
        choices
            .iter()
            .find(|c| c.model == name && c.context == context)
            .map(|c| c.chosen)
    };
    // The model itself, then a variant's base model; each by name, then through `lr_family`.
    let names = std::iter::once(m.name.as_str()).chain(m.variant.map(|v| v.model.as_str()));
    let of =
        |name: &str| chosen(name).or_else(|| config.lr_family.get(name).and_then(|f| chosen(f)));
    names
        .map(of)
        .find_map(|rate| rate)
        .ok_or_else(|| {
            let known: Vec<&str> = choices.iter().map(|c| c.model.as_str()).collect();
            anyhow!(
                "{} @ {context}: {} chose no rate for it or its base model; name one of {known:?} for it in `lr_family`",
                m.name,
                config.peak_lr_from
            )
        })
}

/// The rates chosen by the sweep `peak_lr_from` names, read from its results beside `out`.
fn inherited_choices(config: &LmSweepConfig, out: &Path) -> Result<Vec<RateChoice>> {
    if config.peak_lr_from.is_empty() {
        return Ok(Vec::new());
    }
    let (_, dir) = crate::length_trend::sibling(out, &config.peak_lr_from)?;
    let source = saved_config(&dir)?;
    if source.lr_grid.is_empty() {
        bail!(
            "peak_lr_from = \"{}\": {} chose no rates (its config has no lr_grid)",
            config.peak_lr_from,
            dir.display()
        );
    }
    chosen_in(&dir, &source).with_context(|| format!("the rates {} chose", dir.display()))
}

/// The rates the sweep of `config` chose, from its rows and diverged grid runs in `dir`.
fn chosen_in(dir: &Path, config: &LmSweepConfig) -> Result<Vec<RateChoice>> {
    let diverged = lr_choice::read_diverged(dir)?;
    lr_choice::choose(&read_rows(dir)?, &diverged, config)
}

/// The rate grid: each model of `models` (not the one-seed references or variants) with its
/// first seed at every rate of `lr_grid`.
fn grid_keys<'s, 'c>(config: &LmSweepConfig, models: &'s [SweepModel<'c>]) -> Vec<RunKey<'s, 'c>> {
    let mut keys = Vec::new();
    for &context in &config.contexts {
        for m in models.iter().filter(|m| config.models.contains(&m.name)) {
            for &peak_lr in &config.lr_grid {
                keys.push(RunKey {
                    m,
                    context,
                    seed: config.seeds[0],
                    peak_lr,
                    on_divergence: OnDivergence::Record,
                });
            }
        }
    }
    keys
}

/// The runs at the chosen rates (every model, every seed), from the finished grid runs' `rows`;
/// an error when a choice lies at the grid's edge.
fn chosen_plan(
    config: &LmSweepConfig,
    models: &[SweepModel],
    (rows, diverged): (&[SweepRow], &[lr_choice::DivergedRun]),
    data: &LmData,
    cli: &Cli,
) -> Result<Vec<PlannedRun>> {
    let choices = lr_choice::choose(rows, diverged, config)?;
    lr_choice::check_interior(&choices, &config.lr_grid)?;
    let mut keys = Vec::new();
    for &context in &config.contexts {
        for m in models {
            let peak_lr = lr_choice::rate_of(&choices, &config.baseline, &m.name, context)
                .ok_or_else(|| anyhow!("no rate chosen for {} @ {context}", m.name))?;
            for &seed in &m.seeds {
                keys.push(RunKey {
                    m,
                    context,
                    seed,
                    peak_lr,
                    on_divergence: OnDivergence::Fail,
                });
            }
        }
    }
    let devices = cli.train_devices()?.len();
    plan_runs(config, &keys, data, devices, &cli.store)
}

/// One run of a sweep as planned: what trains, and where it lives in the store.
struct PlannedRun {
    /// The model's name in the sweep (a variant's name for the ablations).
    model: String,
    context: usize,
    seed: u64,
    peak_lr: f64,
    on_divergence: OnDivergence,
    spec: RunSpec,
    dir: PathBuf,
    /// The directory's name, the `run` column of the sweep's rows.
    name: String,
    /// "model @ context, seed s", for progress lines.
    label: String,
    /// Training FLOPs of one optimizer step (the trainer's `flops` column; times the steps, the
    /// cost by which the `--jobs` workers take the costliest run first).
    flops_per_step: f64,
}

/// The runs of `keys` in their order, each directory claimed in `store` (created with its
/// `run_config.json`, or checked to hold the same run).
fn plan_runs(
    config: &LmSweepConfig,
    keys: &[RunKey],
    data: &LmData,
    devices: usize,
    store: &Path,
) -> Result<Vec<PlannedRun>> {
    let mut plan = Vec::new();
    for k in keys {
        let (m, context, seed) = (k.m, k.context, k.seed);
        let spec = run_spec(config, m, (context, seed, k.peak_lr), data, devices)?;
        let dir = run_store::run_dir(store, m.arch.name(), context, &spec.identity);
        run_store::claim(&dir, &spec.identity)?;
        let flops_per_step = spec
            .model_config
            .train_flops_per_step(spec.batch * config.grad_accum, context);
        let rate = if config.lr_grid.is_empty() {
            String::new()
        } else {
            format!(", peak_lr {}", k.peak_lr)
        };
        plan.push(PlannedRun {
            model: m.name.clone(),
            context,
            seed,
            peak_lr: k.peak_lr,
            on_divergence: k.on_divergence,
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            label: format!("{} @ {context}, seed {seed}{rate}", m.name),
            spec,
            dir,
            flops_per_step,
        });
    }
    Ok(plan)
}

impl PlannedRun {
    /// A row of the sweep's `metrics.csv` for one of this run's evaluations.
    fn row(&self, metrics: MetricsRow) -> SweepRow {
        SweepRow {
            model: self.model.clone(),
            context: self.context,
            seed: self.seed,
            run: self.name.clone(),
            peak_lr: Some(self.peak_lr),
            metrics,
        }
    }
}

/// What every run of a sweep trains with.
struct RunTrainer<'a> {
    config: &'a LmSweepConfig,
    data: &'a LmData,
    /// The selection split's files (validation, when the curves read test), else none.
    select_files: &'a [PathBuf],
    devices: &'a [burn::tensor::Device],
    /// Saved as each trained run's `env.json`.
    provenance: &'a Provenance,
    stop: Arc<AtomicBool>,
    progress: Progress,
}

impl RunTrainer<'_> {
    /// Trains `run` (from its checkpoint, if it has one) and gives its rows, or none when it was
    /// interrupted (Ctrl-C): then its checkpoint is in place for the next command.
    fn train(&self, run: &PlannedRun, label: &str) -> Result<Option<Vec<MetricsRow>>> {
        let (config, spec, device) = (self.config, &run.spec, &self.devices[0]);
        device.seed(run.seed);
        let model = spec.model_config.init(config.objective.direction(), device);
        let opts = RunOptions {
            stop: self.stop.clone(),
            flops_per_step: run.flops_per_step,
            label: label.to_string(),
            progress: self.progress,
        };
        let (data, windows, devices) = (self.data.clone(), spec.eval_windows, self.devices);
        let (train_config, dir) = (&spec.train_config, &run.dir);
        let trained = match config.objective {
            Objective::Causal => {
                let mut task = CausalLmTask::new(data, spec.device_batch, run.context, windows)?
                    .with_order(config.train_order, run.seed)?;
                if !self.select_files.is_empty() {
                    task =
                        task.with_selection(self.data.spec, self.select_files.to_vec(), windows)?;
                }
                train(train_config, model, &mut task, devices, dir, &opts)
            }
            Objective::Masked => {
                let mut task =
                    MaskedLmTask::new(data, spec.device_batch, run.context, windows, run.seed)?
                        .with_order(config.train_order)?;
                if !self.select_files.is_empty() {
                    task =
                        task.with_selection(self.data.spec, self.select_files.to_vec(), windows)?;
                }
                train(train_config, model, &mut task, devices, dir, &opts)
            }
        };
        let outcome = match trained {
            Ok(outcome) => outcome,
            Err(e) => {
                let diverged = e.chain().find_map(|c| c.downcast_ref::<Diverged>());
                return match (diverged, run.on_divergence) {
                    (Some(d), OnDivergence::Record) => {
                        eprintln!(
                            "{label}: diverged at step {} (loss {}): this rate loses",
                            d.step, d.loss
                        );
                        let mark =
                            serde_json::json!({ "step": d.step, "loss": d.loss.to_string() });
                        write_json(&run.dir.join(DIVERGED_MARK), &mark)?;
                        write_json(&run.dir.join("env.json"), self.provenance)?;
                        Ok(Some(Vec::new()))
                    }
                    (Some(_), OnDivergence::Fail) => Err(e.context(format!(
                        "{label} at peak_lr {}: this rate diverges",
                        run.peak_lr
                    ))),
                    (None, _) => Err(e),
                };
            }
        };
        // The run's provenance (commit, device, date, command) beside its rows.
        write_json(&run.dir.join("env.json"), self.provenance)?;
        let interrupted = outcome.interrupted || self.stop.load(Ordering::SeqCst);
        Ok((!interrupted).then_some(outcome.rows))
    }
}

/// A `--jobs` worker's loop: trains every unfinished run of `plan` that no other process
/// trains, the costliest first (so that the workers end at about the same time), then exits.
fn train_as_worker(trainer: &RunTrainer, plan: &[PlannedRun], worker: usize) -> Result<()> {
    let steps = trainer.config.steps;
    let mut order: Vec<&PlannedRun> = plan.iter().collect();
    // Every run has the same step count, so the costliest run has the costliest step.
    order.sort_by(|a, b| b.flops_per_step.total_cmp(&a.flops_per_step));
    for run in order {
        if finished_metrics(&run.dir, steps)?.is_some() {
            continue;
        }
        let Ok(_lock) = run_store::try_lock_training(&run.dir)? else {
            continue; // another worker trains it
        };
        if finished_metrics(&run.dir, steps)?.is_some() {
            continue; // finished while this worker looked
        }
        let label = format!("[worker {worker}] {}", run.label);
        eprintln!("{label}: training in {}", run.dir.display());
        if trainer.train(run, &label)?.is_none() {
            bail!(
                "{label}: interrupted; run the same command again to resume from the checkpoint in {}",
                run.dir.display()
            );
        }
    }
    Ok(())
}

/// Trains the sweep's unfinished runs in `cli.jobs` worker processes (this program again, with
/// `--worker K`), each with its share of the CPU's threads unless `RAYON_NUM_THREADS` is set,
/// and waits for them all.
fn run_workers(cli: &Cli, plan: &[PlannedRun], steps: usize) -> Result<()> {
    let mut unfinished = 0;
    for run in plan {
        if finished_metrics(&run.dir, steps)?.is_none() {
            unfinished += 1;
        }
    }
    if unfinished == 0 {
        return Ok(());
    }
    let jobs = cli.jobs.min(unfinished);
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / jobs).max(1).to_string()
    });
    let exe = std::env::current_exe().context("cannot find this program to start its workers")?;
    eprintln!("training {unfinished} runs in {jobs} worker processes, {threads} thread(s) each");
    let mut workers = Vec::new();
    for k in 1..=jobs {
        let child = std::process::Command::new(&exe)
            .args(std::env::args().skip(1))
            .args(["--worker", &k.to_string()])
            .env("RAYON_NUM_THREADS", &threads)
            .spawn()
            .with_context(|| format!("cannot start worker {k} ({})", exe.display()))?;
        workers.push((k, child));
    }
    let mut failed = Vec::new();
    for (k, mut child) in workers {
        let status = child.wait().with_context(|| format!("worker {k}"))?;
        if !status.success() {
            failed.push(format!("worker {k} ({status})"));
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} stopped before its runs finished (see above); run the same command again to resume from the runs' checkpoints",
            failed.join(", ")
        );
    }
    Ok(())
}

/// The split a sweep's curves and verdicts read.
fn eval_split(config: &LmSweepConfig) -> Split {
    match config.eval_split {
        EvalSplit::Validation => Split::Validation,
        EvalSplit::Test => Split::Test,
    }
}

/// The files of the selection split (validation) when the curves read test, else none.
fn selection_files(config: &LmSweepConfig) -> Result<Vec<PathBuf>> {
    if config.eval_split == EvalSplit::Validation {
        return Ok(Vec::new());
    }
    let spec = registry::lookup(&config.dataset)?;
    split_files(
        spec,
        Split::Validation,
        &SourceOptions::from_config(&config.data_dir, &config.data_dirs)?,
    )
}

/// The perplexity of the unigram distribution of the held-out split's tokens on those tokens,
/// exp(−Σ p log p): what a model with no context at all, fitted to the held-out split itself,
/// scores (a reference the charts and tables print beside the models).
fn unigram_ppl(data: &LmData) -> Result<f64> {
    let docs = data::source::ExampleStream::open_at(
        data.spec,
        data.eval_files.clone(),
        Default::default(),
    )?;
    // Ordered, so that the entropy sums in one order: the same digits on every run.
    let mut counts: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    let mut total = 0u64;
    for doc in docs {
        for id in data.tok.encode(&doc?.all_text())? {
            *counts.entry(id).or_default() += 1;
            total += 1;
        }
    }
    if total == 0 {
        bail!("the {} held-out split holds no tokens", data.spec.name);
    }
    let n = total as f64;
    let entropy: f64 = counts
        .values()
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.ln()
        })
        .sum();
    Ok(entropy.exp())
}

/// The data of a sweep: the dataset's train and held-out (`eval_split`) files and the tokenizer
/// (trained on the train split and saved under `tokenizers/` the first time).
pub fn sweep_data(config: &LmSweepConfig) -> Result<LmData> {
    let spec = registry::lookup(&config.dataset)?;
    let tokenizer: TokenizerSpec = config.tokenizer.parse()?;
    let source = SourceOptions::from_config(&config.data_dir, &config.data_dirs)?;
    let train_files = split_files(spec, Split::Train, &source)?;
    let eval_files = split_files(spec, eval_split(config), &source)?;
    let tok = tokenize::for_corpus(&tokenizer, spec, &train_files, &source)?;
    Ok(LmData {
        spec,
        train_files,
        eval_files,
        tok,
    })
}

/// How one run of a sweep trains, and its identity in the run store.
struct RunSpec {
    model_config: ModelConfig,
    train_config: TrainConfig,
    /// Sequences per step, and per device.
    batch: usize,
    device_batch: usize,
    eval_windows: usize,
    /// What the run's results depend on, and nothing else: its name in the store.
    identity: serde_json::Value,
}

/// The [`RunSpec`] of `m`'s run at (`context`, `seed`) on `devices` devices.
fn run_spec(
    config: &LmSweepConfig,
    m: &SweepModel,
    (context, seed, peak_lr): (usize, u64, f64),
    data: &LmData,
    devices: usize,
) -> Result<RunSpec> {
    let (batch, device_batch) = split_batch(config.tokens_per_batch, context, devices)?;
    let eval_windows = (config.eval_tokens / context).max(1);
    let model_config = run_model_config(config, m, context, data.tok.vocab_size())?;
    let train_config = run_train_config_at(config, seed, peak_lr);
    let mut train_json = serde_json::to_value(&train_config)?;
    train_json
        .as_object_mut()
        .map(|t| t.remove("checkpoint_every"));
    let mut identity = serde_json::json!({
        "objective": config.objective, "dataset": data.spec.name, "data_dir": config.data_dir,
        "tokenizer": data.tok.description, "model": model_identity(&model_config)?, "context": context,
        "batch": batch, "train": train_json, "eval_windows": eval_windows,
    });
    // Named only away from their defaults, so that the runs of the sweeps before these fields
    // existed keep their names.
    if !config.data_dirs.is_empty() {
        identity["data_dirs"] = serde_json::to_value(&config.data_dirs)?;
    }
    if config.train_order != WindowOrder::File {
        identity["train_order"] = serde_json::to_value(config.train_order)?;
    }
    if config.eval_split != EvalSplit::Validation {
        identity["eval_split"] = serde_json::to_value(config.eval_split)?;
    }
    // Named only when more than one: a run resumes only on the device count it started with (its
    // device-hours count them).
    if devices > 1 {
        identity["devices"] = devices.into();
    }
    Ok(RunSpec {
        model_config,
        train_config,
        batch,
        device_batch,
        eval_windows,
        identity,
    })
}

/// One run of a sweep in the store.
#[derive(Clone, Debug)]
pub struct StoredRun {
    /// The model's name in the sweep.
    pub model: String,
    pub seed: u64,
    pub context: usize,
    /// The model as the run built it.
    pub model_config: ModelConfig,
    /// `<store>/<arch>-<context>-<hash>`.
    pub dir: std::path::PathBuf,
}

/// Every run of `config` at `context` (every model and its seeds, each at the rate the sweep in
/// `sweep_out` chose for it when the sweep has a rate grid) with its directory in `store` on
/// `devices` devices, whether trained yet or not.
pub fn stored_runs(
    config: &LmSweepConfig,
    data: &LmData,
    (store, devices): (&Path, usize),
    context: usize,
    sweep_out: &Path,
) -> Result<Vec<StoredRun>> {
    let choices = if config.lr_grid.is_empty() {
        Vec::new()
    } else {
        chosen_in(sweep_out, config)?
    };
    let mut out = Vec::new();
    for m in sweep_models(config)? {
        for &seed in &m.seeds {
            let lr = if choices.is_empty() {
                model_peak_lr(config, &m.name)
            } else {
                lr_choice::rate_of(&choices, &config.baseline, &m.name, context)
                    .ok_or_else(|| anyhow!("no rate chosen for {} @ {context}", m.name))?
            };
            let spec = run_spec(config, &m, (context, seed, lr), data, devices)?;
            out.push(StoredRun {
                model: m.name.clone(),
                seed,
                context,
                dir: run_store::run_dir(store, m.arch.name(), context, &spec.identity),
                model_config: spec.model_config,
            });
        }
    }
    Ok(out)
}

/// The model configuration of `m`'s runs at `context`: the preset, the sweep's `set`, then the
/// variant's.
fn run_model_config(
    config: &LmSweepConfig,
    m: &SweepModel,
    context: usize,
    vocab: usize,
) -> Result<ModelConfig> {
    let base = ModelConfig::preset(&config.preset, m.arch, context)
        .map_err(|e| anyhow!(e))?
        .with_vocab_size(vocab);
    let mut model_config = apply_set(base, &config.set, "the sweep's `set`")?;
    let mut what = "the sweep's `set`".to_string();
    if let Some(v) = m.variant {
        what = format!("variant `{}`", v.name);
        model_config = apply_set(model_config, &v.set, &what)?;
    }
    model_config
        .check()
        .map_err(|e| anyhow!("{what} of `{}`: {e}", m.name))?;
    Ok(model_config)
}

/// The model configuration a run's identity names ([`model_identity`]'s inverse): the fields it
/// leaves out take their defaults.
pub fn model_from_identity(model: &serde_json::Value) -> Result<ModelConfig> {
    let arch: Architecture = serde_json::from_value(model["arch"].clone())?;
    let mut json = serde_json::to_value(ModelConfig::new(arch))?;
    if let Some(fields) = model.as_object() {
        for (key, value) in fields {
            json[key] = value.clone();
        }
    }
    Ok(serde_json::from_value(json)?)
}

/// A model configuration as a run's identity names it: the fields of
/// [`ModelConfig::ABLATION_FIELDS`] are left out at their defaults, so that the runs trained
/// before those fields existed keep their names in the store.
pub fn model_identity(model: &ModelConfig) -> Result<serde_json::Value> {
    let mut json = serde_json::to_value(model)?;
    let defaults = serde_json::to_value(ModelConfig::new(model.arch))?;
    if let Some(fields) = json.as_object_mut() {
        for key in ModelConfig::ABLATION_FIELDS {
            if fields.get(key) == defaults.get(key) {
                fields.remove(key);
            }
        }
    }
    Ok(json)
}

/// Each model of the sweep with its resolved model configuration at `context` (vocabulary as the
/// preset's: what the claims read, chunk sizes and architectures, does not depend on it).
pub fn resolved_models(
    config: &LmSweepConfig,
    context: usize,
) -> Result<Vec<(String, ModelConfig)>> {
    sweep_models(config)?
        .iter()
        .map(|m| {
            let vocab = ModelConfig::preset(&config.preset, m.arch, context)
                .map_err(|e| anyhow!(e))?
                .vocab_size;
            Ok((m.name.clone(), run_model_config(config, m, context, vocab)?))
        })
        .collect()
}

/// The peak learning rate of the sweep's model `name`: its entry of `peak_lr_by_model`, else
/// `peak_lr`.
fn model_peak_lr(config: &LmSweepConfig, name: &str) -> f64 {
    config
        .peak_lr_by_model
        .get(name)
        .copied()
        .unwrap_or(config.peak_lr)
}

/// A note when the command line sets `peak_lr` but the config's `peak_lr_by_model` keeps some
/// models at their own rates (a pilot meant for every model would reuse their runs instead).
fn lr_set_shadowed(sets: &[(String, String)], config: &LmSweepConfig) -> Option<String> {
    let set_here = |key: &str| sets.iter().any(|(k, _)| k == key);
    if !set_here("peak_lr") || set_here("peak_lr_by_model") || config.peak_lr_by_model.is_empty() {
        return None;
    }
    let names: Vec<&String> = config.peak_lr_by_model.keys().collect();
    Some(format!(
        "--set peak_lr={} does not change {names:?}, which keep their rates from `peak_lr_by_model`; add --set 'peak_lr_by_model={{}}' to train every model at {}",
        config.peak_lr, config.peak_lr
    ))
}

/// How `m`'s runs of the sweep train, with `seed`, at its configured rate.
fn run_train_config(config: &LmSweepConfig, m: &SweepModel, seed: u64) -> TrainConfig {
    run_train_config_at(config, seed, model_peak_lr(config, &m.name))
}

/// How a run of the sweep trains, with `seed` and `peak_lr`.
fn run_train_config_at(config: &LmSweepConfig, seed: u64, peak_lr: f64) -> TrainConfig {
    TrainConfig {
        steps: config.steps,
        optimizer: config.optimizer,
        schedule: Schedule::new(peak_lr, config.warmup_steps, config.decay),
        grad_accum: config.grad_accum,
        clip_norm: (config.clip_norm > 0.0).then_some(config.clip_norm),
        eval_every: config.eval_every,
        checkpoint_every: config.checkpoint_every,
        seed,
        keep: KeepModel::Last,
    }
}

/// The step-time calibration (`timing_rounds`): per context, every model of the sweep built as
/// its runs are (first seed), then one untimed round and `timing_rounds` timed rounds of one
/// training step each, models in turn, so that the machine's drift falls on every model of a round
/// alike. Written to `<out>/step_times.csv`; a file that already covers every model and context
/// with these rounds is kept (delete it to re-time).
fn calibrate_step_times(
    config: &LmSweepConfig,
    models: &[SweepModel],
    data: &LmData,
    devices: &[burn::tensor::Device],
    out: &Path,
) -> Result<()> {
    let path = out.join(STEP_TIMES);
    if config.timing_rounds == 0 {
        let _ = std::fs::remove_file(&path);
        return Ok(());
    }
    let cell_hash = |m: &SweepModel, context: usize| {
        step_cost_hash(config, m, context, data.tok.vocab_size(), devices.len())
    };
    let mut wanted = Vec::new();
    for &c in &config.contexts {
        for m in models {
            wanted.push((m.name.clone(), c, cell_hash(m, c)?));
        }
    }
    let covered = read_step_times(out)?.is_some_and(|times| {
        wanted.iter().all(|(name, c, hash)| {
            let own: Vec<&StepTime> = times
                .iter()
                .filter(|t| &t.model == name && t.context == *c)
                .collect();
            own.len() == config.timing_rounds && own.iter().all(|t| &t.config == hash)
        })
    });
    if covered {
        eprintln!("step times: keeping {}", path.display());
        return Ok(());
    }
    let seed = config.seeds[0];
    let mut times: Vec<StepTime> = Vec::new();
    for &context in &config.contexts {
        let (_, device_batch) = split_batch(config.tokens_per_batch, context, devices.len())?;
        eprintln!(
            "step times at {context}: {} models, {} timed rounds",
            models.len(),
            config.timing_rounds
        );
        let mut cells = Vec::new();
        for m in models {
            let train_config = run_train_config(config, m, seed);
            let model_config = run_model_config(config, m, context, data.tok.vocab_size())?;
            devices[0].seed(seed);
            let model = model_config.init(config.objective.direction(), &devices[0]);
            let data = data.clone();
            let stepper = match config.objective {
                Objective::Causal => TimedTask::Causal(Stepper::new(
                    &train_config,
                    model,
                    CausalLmTask::new(data, device_batch, context, 1)?,
                    devices,
                )?),
                Objective::Masked => TimedTask::Masked(Stepper::new(
                    &train_config,
                    model,
                    MaskedLmTask::new(data, device_batch, context, 1, seed)?,
                    devices,
                )?),
            };
            cells.push((m.name.clone(), cell_hash(m, context)?, stepper));
        }
        for round in 0..=config.timing_rounds {
            for (name, hash, cell) in &mut cells {
                let seconds = cell.step()?;
                if round > 0 {
                    times.push(StepTime {
                        model: name.clone(),
                        context,
                        round: round - 1,
                        seconds,
                        config: hash.clone(),
                    });
                }
            }
        }
        for (name, ..) in &cells {
            let mut secs = StepCost::Timed(&times).seconds(name, context);
            eprintln!(
                "  {name:<24} {:.3} s/step (median of {})",
                crate::median(&mut secs),
                secs.len()
            );
        }
    }
    crate::write_csv(&path, &times)
}

/// Removes the output directory's step-time calibration when the command that last wrote the
/// directory (`previous`, its `env.json`'s machine) ran on another machine than `here`: a
/// calibration is otherwise kept while it covers the models' step-cost hashes, and another
/// machine's step times would price these runs. The invariant kept: `step_times.csv`, when
/// present, was timed on the machine named in `env.json` (which `--dry-run` relies on too).
fn forget_other_machines_step_times(
    out: &Path,
    previous: Option<Machine>,
    here: &Machine,
) -> Result<()> {
    let path = out.join(STEP_TIMES);
    if path.exists() && previous.as_ref() != Some(here) {
        eprintln!(
            "step times: {} was timed on another machine ({}); the calibration runs again after the runs",
            path.display(),
            previous.map_or("unknown".to_string(), |(d, l)| format!("{d}, {l}"))
        );
        std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    }
    Ok(())
}

/// What a step's cost depends on, per model and context: a calibration of another configuration
/// is not used.
fn step_cost_hash(
    config: &LmSweepConfig,
    m: &SweepModel,
    context: usize,
    vocab: usize,
    devices: usize,
) -> Result<String> {
    let (batch, device_batch) = split_batch(config.tokens_per_batch, context, devices)?;
    let model = run_model_config(config, m, context, vocab)?;
    Ok(run_store::run_hash(&serde_json::json!({
        "model": model_identity(&model)?, "objective": config.objective, "context": context, "batch": batch,
        "device_batch": device_batch, "devices": devices, "optimizer": config.optimizer,
        "grad_accum": config.grad_accum, "clip_norm": config.clip_norm,
    })))
}

/// `--dry-run` of a sweep: every (model, context) built on the device as its runs would be, the
/// plan printed (device-hours from the output directory's step-time calibration where it timed
/// this configuration on this machine); with `step`, one real training step of each, one sequence
/// per batch, on synthetic tokens (no data needed).
fn dry_run_sweep(
    cli: &Cli,
    config: &LmSweepConfig,
    models: &[SweepModel],
    devices: &[burn::tensor::Device],
    mode: DryRun,
) -> Result<()> {
    let vocab = crate::dry_run::vocab_size(&config.tokenizer)?;
    // Only a calibration made on this machine prices the plan (another machine's is re-timed
    // when the sweep runs).
    let timed_here = cli.output_machine() == Some(cli.machine());
    let times = if timed_here {
        read_step_times(&cli.out).ok().flatten().unwrap_or_default()
    } else {
        Vec::new()
    };
    let masked = matches!(config.objective, Objective::Masked);
    let build_device = devices[0].clone().without_autodiff();
    let mut plans = Vec::new();
    // Each plan's model and its configuration, in the plans' order.
    let mut built = Vec::new();
    for &context in &config.contexts {
        let (batch, device_batch) = split_batch(config.tokens_per_batch, context, devices.len())?;
        for m in models {
            let model_config = run_model_config(config, m, context, vocab)?;
            let model = model_config.init(config.objective.direction(), &build_device);
            let (params, optimizer_floats) = crate::dry_run::param_stats(&model, &config.optimizer);
            let hash = step_cost_hash(config, m, context, vocab, devices.len())?;
            let mut secs: Vec<f64> = times
                .iter()
                .filter(|t| t.model == m.name && t.context == context && t.config == hash)
                .map(|t| t.seconds)
                .collect();
            // With a rate grid, a model of `models` trains its first seed at every rate, then
            // its other seeds at the chosen one.
            let runs = if !config.lr_grid.is_empty() && config.models.contains(&m.name) {
                config.lr_grid.len() + m.seeds.len() - 1
            } else {
                m.seeds.len()
            };
            plans.push(RunPlan {
                label: format!("{} @ {context}", m.name),
                runs,
                params,
                tokens_per_step: batch * context * config.grad_accum,
                steps: config.steps,
                optimizer_floats,
                activation_floats: model_config.activation_floats_per_token(context)
                    * (device_batch * context) as f64,
                kv_cache_floats: 0.0,
                train_flops: model_config.train_flops_per_step(batch * config.grad_accum, context)
                    * config.steps as f64,
                step_seconds: (!secs.is_empty()).then(|| crate::median(&mut secs)),
            });
            built.push((m, model_config));
        }
    }
    crate::dry_run::print(cli, "", &plans);
    let splits = if config.eval_split == EvalSplit::Validation {
        vec![Split::Train, Split::Validation]
    } else {
        vec![Split::Train, Split::Validation, eval_split(config)]
    };
    crate::dry_run::print_data(
        &SourceOptions::from_config(&config.data_dir, &config.data_dirs)?,
        &[(config.dataset.as_str(), &splits)],
    )?;
    if mode == DryRun::Step {
        for (plan, (m, model_config)) in plans.iter().zip(&built) {
            let train = TrainConfig {
                grad_accum: 1,
                ..run_train_config(config, m, config.seeds[0])
            };
            crate::dry_run::real_lm_step(plan, model_config, masked, &train, &devices[0])?;
        }
    }
    Ok(())
}

/// The model configuration `name`'s runs of the sweep have at `context`, with the vocabulary the
/// sweep's tokenizer will give (no data read: `--dry-run` of the experiments built on a sweep).
pub fn planned_model(config: &LmSweepConfig, name: &str, context: usize) -> Result<ModelConfig> {
    let models = sweep_models(config)?;
    let Some(m) = models.iter().find(|m| m.name == name) else {
        bail!("`{name}` is not a model of the sweep");
    };
    let vocab = crate::dry_run::vocab_size(&config.tokenizer)?;
    run_model_config(config, m, context, vocab)
}

/// A stepper of either objective's task (the calibration steps the sweep's objective).
enum TimedTask {
    Causal(Stepper<model::LanguageModel, CausalLmTask>),
    Masked(Stepper<model::LanguageModel, MaskedLmTask>),
}

impl TimedTask {
    /// One training step; its seconds.
    fn step(&mut self) -> Result<f64> {
        Ok(match self {
            TimedTask::Causal(s) => s.step()?.0,
            TimedTask::Masked(s) => s.step()?.0,
        })
    }
}

/// The calibration's file in a sweep's output directory.
pub const STEP_TIMES: &str = "step_times.csv";

/// The sweep's step-time calibration, if it has one.
pub fn read_step_times(out: &Path) -> Result<Option<Vec<StepTime>>> {
    let path = out.join(STEP_TIMES);
    let Ok(file) = std::fs::File::open(&path) else {
        return Ok(None);
    };
    let rows = csv::Reader::from_reader(file)
        .deserialize()
        .collect::<Result<_, _>>()
        .with_context(|| {
            format!(
                "malformed {}; delete it and run the sweep again to re-time",
                path.display()
            )
        })?;
    Ok(Some(rows))
}

/// One model of a sweep: its name, architecture, variant (if any) and seeds.
struct SweepModel<'a> {
    name: String,
    arch: Architecture,
    variant: Option<&'a Variant>,
    seeds: Vec<u64>,
}

/// The sweep's `timed_variants`, trained with no seed (the step-time calibration times them).
fn timed_only_models(config: &LmSweepConfig) -> Result<Vec<SweepModel<'_>>> {
    let trained = sweep_models(config)?;
    config
        .timed_variants
        .iter()
        .map(|v| {
            if trained.iter().any(|m| m.name == v.name) {
                bail!(
                    "timed_variants: `{}` is also a trained model of the sweep",
                    v.name
                );
            }
            Ok(SweepModel {
                name: v.name.clone(),
                arch: v.model.parse().map_err(|e: String| anyhow!(e))?,
                variant: Some(v),
                seeds: Vec::new(),
            })
        })
        .collect()
}

/// The sweep's models in order: `models` (every seed), `one_seed_models` (the first seed), then the
/// variants (every seed); names unique, the baseline among them.
fn sweep_models(config: &LmSweepConfig) -> Result<Vec<SweepModel<'_>>> {
    let Some(&first) = config.seeds.first() else {
        bail!("`seeds` is empty; give at least one seed, e.g. seeds = [0]");
    };
    // Checked before anything is written or trained (the trainer would refuse them at the first run).
    for (name, value) in [
        ("steps", config.steps),
        ("eval_every", config.eval_every),
        ("grad_accum", config.grad_accum),
        ("tokens_per_batch", config.tokens_per_batch),
        ("eval_tokens", config.eval_tokens),
    ] {
        if value == 0 {
            bail!("`{name}` must be positive (got 0)");
        }
    }
    if config.contexts.is_empty() {
        bail!("`contexts` is empty; give at least one context, e.g. contexts = [512]");
    }
    let parse = |m: &String| -> Result<Architecture> { m.parse().map_err(|e: String| anyhow!(e)) };
    let mut models = Vec::new();
    for (names, seeds) in [
        (&config.models, config.seeds.clone()),
        (&config.one_seed_models, vec![first]),
    ] {
        for name in names {
            models.push(SweepModel {
                name: name.clone(),
                arch: parse(name)?,
                variant: None,
                seeds: seeds.clone(),
            });
        }
    }
    for v in &config.variants {
        models.push(SweepModel {
            name: v.name.clone(),
            arch: parse(&v.model)?,
            variant: Some(v),
            seeds: config.seeds.clone(),
        });
    }
    for (i, m) in models.iter().enumerate() {
        if m.name.is_empty() || m.name.contains([',', '"', '\n', '/']) {
            bail!(
                "model name `{}` must be non-empty without commas, quotes, slashes or newlines (it is a CSV field)",
                m.name
            );
        }
        if models[..i].iter().any(|o| o.name == m.name) {
            bail!("model name `{}` appears twice in the sweep", m.name);
        }
    }
    if !models.iter().any(|m| m.name == config.baseline) {
        let names: Vec<&String> = models.iter().map(|m| &m.name).collect();
        bail!(
            "baseline `{}` is not one of the models {names:?}",
            config.baseline
        );
    }
    for (name, &lr) in &config.peak_lr_by_model {
        if !models.iter().any(|m| &m.name == name) {
            bail!("peak_lr_by_model names `{name}`, which is not a model of the sweep");
        }
        if !(lr.is_finite() && lr > 0.0) {
            bail!("peak_lr_by_model: `{name}` = {lr} must be a positive learning rate");
        }
    }
    crate::lr_choice::check_grid(config)?;
    for c in &config.claimed_faster {
        if !models.iter().any(|m| &m.name == c) {
            bail!("claimed_faster names `{c}`, which is not a model of the sweep");
        }
    }
    if config.table == SweepTable::ChunkingLoss {
        for needed in crate::verdict::CHUNKING_MODELS {
            if !models.iter().any(|m| m.name == needed) {
                bail!("table = \"chunking_loss\" needs the model `{needed}`; add it to `models`");
            }
        }
    }
    Ok(models)
}

/// The rows of a run in the store that has finished all `steps` (its `metrics.csv` ends there), or
/// none: then the run is trained, or resumed from its checkpoint. Committed runs carry no
/// checkpoint, so this is how a fresh clone reuses them.
fn finished_metrics(run_dir: &Path, steps: usize) -> Result<Option<Vec<MetricsRow>>> {
    // A grid run that diverged is over, without rows.
    if run_dir.join(DIVERGED_MARK).exists() {
        return Ok(Some(Vec::new()));
    }
    let path = run_dir.join("metrics.csv");
    let Ok(file) = std::fs::File::open(&path) else {
        return Ok(None);
    };
    let rows: Vec<MetricsRow> = csv::Reader::from_reader(file)
        .deserialize()
        .collect::<Result<_, _>>()
        .with_context(|| format!("malformed {}; delete it to retrain the run", path.display()))?;
    Ok(rows.last().is_some_and(|r| r.step == steps).then_some(rows))
}

/// The step's batch in sequences, max(1, tokens_per_batch / context), and each device's share of it:
/// data parallelism splits the batch, so a step sees the same tokens on any number of devices.
fn split_batch(tokens_per_batch: usize, context: usize, devices: usize) -> Result<(usize, usize)> {
    let batch = (tokens_per_batch / context).max(1);
    if !batch.is_multiple_of(devices) {
        bail!(
            "--devices {devices}: a batch of {batch} sequences (tokens_per_batch {tokens_per_batch} / context {context}) does not split evenly; make tokens_per_batch a multiple of context × devices"
        );
    }
    Ok((batch, batch / devices))
}

pub fn write_rows(out: &Path, rows: &[SweepRow]) -> Result<()> {
    let mut text = SweepRow::header();
    text.push('\n');
    for r in rows {
        text.push_str(&r.csv_fields());
        text.push('\n');
    }
    write_atomic(&out.join("metrics.csv"), text.as_bytes())
}

/// Reads a sweep's `metrics.csv`.
pub fn read_rows(out: &Path) -> Result<Vec<SweepRow>> {
    let path = out.join("metrics.csv");
    csv::Reader::from_path(&path)
        .with_context(|| format!("cannot read {}: run the experiment first", path.display()))?
        .deserialize()
        .collect::<Result<_, _>>()
        .with_context(|| format!("malformed {}", path.display()))
}

/// The sweep config saved beside the results (`config.json`).
pub fn saved_config(out: &Path) -> Result<LmSweepConfig> {
    let path = out.join("config.json");
    let text = std::fs::read(&path)
        .with_context(|| format!("cannot read {}: run the experiment first", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("malformed {}", path.display()))
}

/// The models of the rows in first-appearance order.
fn model_order(rows: &[SweepRow]) -> Vec<String> {
    let mut models: Vec<String> = Vec::new();
    for r in rows {
        if !models.contains(&r.model) {
            models.push(r.model.clone());
        }
    }
    models
}

/// The summaries of every model at every context of `rows`, against `config.baseline`, with the
/// step-time ratios from `cost`.
pub fn summaries(rows: &[SweepRow], config: &LmSweepConfig, cost: StepCost) -> Vec<Summary> {
    let contexts: std::collections::BTreeSet<usize> = rows.iter().map(|r| r.context).collect();
    let models = model_order(rows);
    contexts
        .into_iter()
        .flat_map(|c| summarize(rows, &models, &config.baseline, c, cost))
        .collect()
}

/// The verdict on a model's claimed speedup (> 1 over every seed pair), or none when the paper
/// claims none for it.
pub fn speedup_verdict(s: &Summary, config: &LmSweepConfig) -> Option<Verdict> {
    config
        .claimed_faster
        .contains(&s.model)
        .then(|| Verdict::above(&s.speedup, 1.0))
}

/// `model`'s curve at `context` over its seeds, evaluation by evaluation (the seeds evaluate at the
/// same steps; a seed with fewer evaluations limits the curve).
fn seed_curve(
    rows: &[SweepRow],
    model: &str,
    context: usize,
    timed_seconds: Option<f64>,
    label: String,
) -> Option<SeedCurve> {
    let runs = crate::verdict::runs(rows, model, context);
    let evals = runs.iter().map(|r| r.rows.len()).min()?;
    let points = (0..evals)
        .map(|i| {
            let at: Vec<&SweepRow> = runs.iter().map(|r| r.rows[i]).collect();
            let ppl: Vec<f64> = at.iter().map(|r| r.metrics.eval_ppl).collect();
            let spread = crate::verdict::Spread::of(&ppl);
            SeedPoint {
                hours: match timed_seconds {
                    Some(t) => at[0].metrics.step as f64 * t / 3600.0,
                    None => {
                        at.iter().map(|r| r.metrics.device_hours).sum::<f64>() / at.len() as f64
                    }
                },
                step: at[0].metrics.step as f64,
                mean: spread.mean,
                min: spread.min,
                max: spread.max,
            }
        })
        .collect();
    Some(SeedCurve {
        model: model.to_string(),
        label,
        points,
    })
}

/// Charts `ppl_<context>` (perplexity vs device-hours and vs steps: the seed mean and range) and
/// `table.md` (the paper's `table`: final perplexity over seeds and the speedup to the baseline's
/// final perplexity over seed pairs, with its decomposition and verdict) from `metrics.csv`.
pub fn render(out: &Path, table: &str, config: Option<&LmSweepConfig>) -> Result<()> {
    let config = match config {
        Some(c) => c.clone(),
        None => saved_config(out)?,
    };
    let every_rate = read_rows(out)?;
    let diverged = lr_choice::read_diverged(out)?;
    let rows = lr_choice::at_chosen_rates(&every_rate, &diverged, &config)?;
    let choices = if config.lr_grid.is_empty() {
        Vec::new()
    } else {
        lr_choice::choose(&every_rate, &diverged, &config)?
    };
    let unigram = read_unigram_ppl(out);
    let baseline = &config.baseline;
    let step_times = read_step_times(out)?;
    let cost = match &step_times {
        Some(times) => StepCost::Timed(times),
        None => StepCost::RunHours,
    };
    let step_time_source = match cost {
        StepCost::Timed(_) => format!(
            "The step-time ratio is {baseline}'s seconds per training step / the model's, the median and interquartile range\n\
             over the rounds of the step-time calibration (`step_times.csv`: every model's step timed in turn, in one\n\
             session, after the runs; s/step is the model's median), so the speedup is the steps ratio × that ratio (mean ×\n\
             median, min × lower quartile, max × upper quartile), and the charts' device-hours are steps × the median step\n\
             time. The runs' own device-hours and tokens/s (their sessions' machine speed) are in the two columns\n\
             after `steps`; a row marked † has no timings and uses them."
        ),
        StepCost::RunHours => format!(
            "The step-time ratio is {baseline}'s device-hours per step / the model's, from the runs themselves (this sweep\n\
             has no step-time calibration)."
        ),
    };
    let mut md = format!(
        "# {table}: perplexity and speedup to {baseline}'s final perplexity\n\n\
         Per model and context, over its seeds: the final held-out perplexity (mean [min–max]); the speedup, {baseline}'s\n\
         training time divided by the time the model takes to reach {baseline}'s final perplexity (linear between\n\
         evaluations), in device-hours, over every (model seed, {baseline} seed) pair (a pair that never reaches it counts\n\
         as 0); its decomposition into the same ratio in training steps × the step-time ratio; and the verdict on the\n\
         paper's claim that the model is faster (speedup > 1): reproduced when the whole range is above 1, refuted when\n\
         it is below, else inconclusive. {baseline}'s own row pairs its different seeds: how far apart two runs of one\n\
         model land. tokens/s: training tokens over training seconds.\n\
         {step_time_source}\n\
         Generated from `metrics.csv` (each row names its run in the run store).\n\n"
    );
    let all = summaries(&rows, &config, cost);
    let base_rows: Vec<&Summary> = all.iter().filter(|s| &s.model == baseline).collect();
    // The body (below the heading and the legend) is also what the artifact's README shows.
    let mut body =
        format!("Past the initial drop: {baseline}'s held-out loss improved by at most ");
    body += &base_rows
        .iter()
        .map(|s| format!("{:.2}% (context {})", 100.0 * s.last_quarter, s.context))
        .collect::<Vec<_>>()
        .join(", ");
    body +=
        " over the last quarter of its steps (worst seed; the cpu scale asks for under 2%).\n\n";
    body += &format!(
        "Held-out split: {}; training windows: {}.{}\n\n",
        match config.eval_split {
            EvalSplit::Validation => "validation (no choice was made on held-out data)",
            EvalSplit::Test => "test (rates chosen on validation)",
        },
        match config.train_order {
            WindowOrder::File => "the split in file order, every seed alike".to_string(),
            WindowOrder::Shuffled { block_tokens } => format!(
                "shuffled by each run's seed (blocks of {block_tokens} tokens)"
            ),
        },
        unigram.map_or_else(String::new, |u| format!(
            " Unigram reference (no context: the held-out split's own token frequencies): perplexity {u:.1}."
        )),
    );
    let robust_column = !choices.is_empty();
    body += "| model | context | seeds | steps | run device-hours | run tokens/s | s/step (timed) | final ppl | speedup (device-hours) | = in steps | × step time | reached | verdict |";
    body += if robust_column {
        " robust to the rate |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    } else {
        "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    };
    for s in &all {
        let verdict = speedup_verdict(s, &config);
        let robust = match (robust_column, verdict) {
            (false, _) => String::new(),
            (true, None) => " — |".into(),
            (true, Some(v)) => {
                format!(
                    " {} |",
                    robust_to_rate(s, v, (&every_rate, &rows), &choices, &config, cost)
                )
            }
        };
        let verdict = verdict.map_or_else(|| "—".into(), |v| v.to_string());
        body += &format!(
            "| {} | {} | {} | {} | {:.3e} | {:.0} | {} | {} | {}× | {}× | {}× | {}/{} | {verdict} |{robust}\n",
            s.model,
            s.context,
            s.seeds,
            s.steps,
            s.device_hours,
            s.tokens_per_s,
            match (s.timed_seconds, cost) {
                (Some(t), _) => format!("{t:.3}"),
                (None, StepCost::Timed(_)) => "†".into(),
                (None, StepCost::RunHours) => "—".into(),
            },
            s.final_ppl.show(2),
            s.speedup.show(2),
            s.steps_ratio.show(2),
            s.step_time_ratio.show(2),
            s.reached.0,
            s.reached.1,
        );
    }
    if !choices.is_empty() {
        body += &lr_choice::table(&choices, &config);
    }
    match config.table {
        SweepTable::Speedup => {}
        SweepTable::ChunkingLoss => {
            body += &chunking_table(&rows, &all, Pairing::of(config.train_order))
        }
        SweepTable::Ablation => {
            body += &crate::ablation::table(&rows, &config);
            crate::ablation::charts(out, &rows, &config)?;
        }
        SweepTable::Scaling => {
            body += &crate::scaling::section(&rows, &config)?;
            crate::scaling::charts(out, &rows, &config)?;
        }
        SweepTable::LengthTrend => body += &crate::length_trend::section(out, &config)?,
    }
    md += &body;
    let objective = match config.objective {
        Objective::Causal => "Causal LM",
        Objective::Masked => "Masked LM",
    };
    let models = model_order(&rows);
    for c in all
        .iter()
        .map(|s| s.context)
        .collect::<std::collections::BTreeSet<_>>()
    {
        let curves: Vec<SeedCurve> = models
            .iter()
            .filter_map(|m| {
                let timed = all
                    .iter()
                    .find(|s| &s.model == m && s.context == c)
                    .and_then(|s| s.timed_seconds);
                seed_curve(&rows, m, c, timed, crate::ablation::label(&config, m))
            })
            .collect();
        let Some(base) = all.iter().find(|s| &s.model == baseline && s.context == c) else {
            continue;
        };
        QualityChart {
            title: format!(
                "{objective} on {}, context {c}: {} perplexity vs training cost{}",
                config.dataset,
                match config.eval_split {
                    EvalSplit::Validation => "validation",
                    EvalSplit::Test => "test",
                },
                unigram.map_or_else(String::new, |u| format!(" (unigram {u:.0})")),
            ),
            baseline: (baseline.clone(), base.final_ppl.mean),
            hours_label: match cost {
                StepCost::Timed(_) => format!(
                    "device-hours on {} (steps × calibrated step time)",
                    crate::scale::device(out).unwrap_or_else(|| "this device".into())
                ),
                StepCost::RunHours => "device-hours (the runs' training time)".into(),
            },
        }
        .save(&out.join(format!("ppl_{c}")), &curves)?;
    }
    write_atomic(&out.join("table.md"), md.as_bytes())?;
    report::readme::fill(&out.join("README.md"), "table.md", &body)?;
    Ok(())
}

/// The unigram reference perplexity the sweep saved in `data.json`, if it did.
fn read_unigram_ppl(out: &Path) -> Option<f64> {
    let text = std::fs::read(out.join("data.json")).ok()?;
    let json: serde_json::Value = serde_json::from_slice(&text).ok()?;
    json.get("unigram_ppl")?.as_f64()
}

/// Whether `verdict`, on `s`'s speedup with its runs at its chosen rate, is the same with its
/// runs at its second-best rate: "yes", or "no (…)" with the other verdict.
fn robust_to_rate(
    s: &Summary,
    verdict: Verdict,
    (every_rate, chosen): (&[SweepRow], &[SweepRow]),
    choices: &[RateChoice],
    config: &LmSweepConfig,
    cost: StepCost,
) -> String {
    let Some(choice) = choices
        .iter()
        .find(|c| c.model == s.model && c.context == s.context)
    else {
        return "—".into();
    };
    let rows = lr_choice::at_second_rate(every_rate, chosen, choice);
    let other = summaries(&rows, config, cost)
        .into_iter()
        .find(|o| o.model == s.model && o.context == s.context)
        .and_then(|o| speedup_verdict(&o, config).map(|v| (v, o.speedup)));
    match other {
        Some((v, _)) if v == verdict => format!("yes (at {}: {v})", choice.second),
        Some((v, speedup)) => format!("no (at {}: {v}, {}×)", choice.second, speedup.show(2)),
        None => "—".into(),
    }
}

/// The chunking-loss section of `table.md` (FLASH Table 5), one row per context.
fn chunking_table(rows: &[SweepRow], all: &[Summary], pairing: Pairing) -> String {
    let contexts: std::collections::BTreeSet<usize> = all.iter().map(|s| s.context).collect();
    let mut md = format!(
        "\n## The perplexity lost by chunking (FLASH Table 5)\n\n\
         Chunked / unchunked final perplexity ({}): for the GAU\n\
         FLASH / FLASH-Quad, for the Transformer MC-TFM++ / Transformer++ (chunking and relu² scoring together) and\n\
         MC-TFM++ / relu² Transformer++ (chunking alone). The claim (F6): the GAU loses less, i.e. (MC-TFM++ /\n\
         Transformer++) / (FLASH / FLASH-Quad) > 1, over the whole range.\n\n\
         | context | FLASH / FLASH-Quad | MC-TFM++ / Transformer++ | MC-TFM++ / relu² Transformer++ | Transformer's loss / GAU's | verdict |\n\
         |---|---|---|---|---|---|\n",
        pairing.describe()
    );
    for c in contexts {
        let Some(l) = crate::verdict::chunking_loss(rows, c, pairing) else {
            continue;
        };
        md += &format!(
            "| {c} | {}× | {}× | {} | {}× | {} |\n",
            l.gau.show(3),
            l.transformer.show(3),
            l.transformer_relu2
                .map_or_else(|| "—".into(), |r| format!("{}×", r.show(3))),
            l.ratio.show(3),
            Verdict::above(&l.ratio, 1.0),
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::{
        LmSweepConfig, STEP_TIMES, forget_other_machines_step_times, inherited_rate,
        lr_set_shadowed, model_from_identity, model_identity, run_train_config, split_batch,
        sweep_models,
    };
    use crate::read_machine;
    use model::ModelConfig;

    /// A calibration made on another machine (per the directory's `env.json`) is removed before a
    /// sweep runs, one made on this machine is kept, and one beside no readable `env.json` is
    /// removed.
    #[test]
    fn step_times_of_another_machine_are_not_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let now = ("flex (CPU A, 2 cores)".to_string(), "avx2".to_string());
        let write = |device: &str, level: &str| {
            let env = serde_json::json!({ "device": device, "simd_level": level });
            std::fs::write(dir.path().join("env.json"), env.to_string()).expect("env");
            std::fs::write(dir.path().join(STEP_TIMES), "model,context\n").expect("times");
        };
        let times = dir.path().join(STEP_TIMES);
        write("flex (CPU A, 2 cores)", "avx2");
        let previous = read_machine(&dir.path().join("env.json"));
        forget_other_machines_step_times(dir.path(), previous, &now).expect("kept");
        assert!(times.exists(), "the same machine's calibration is kept");
        write("flex (CPU B, 2 cores)", "avx2");
        let previous = read_machine(&dir.path().join("env.json"));
        forget_other_machines_step_times(dir.path(), previous, &now).expect("removed");
        assert!(!times.exists(), "another CPU's calibration is removed");
        write("flex (CPU A, 2 cores)", "other-level");
        let previous = read_machine(&dir.path().join("env.json"));
        forget_other_machines_step_times(dir.path(), previous, &now).expect("removed");
        assert!(
            !times.exists(),
            "another SIMD level's calibration is removed"
        );
        write("flex (CPU A, 2 cores)", "avx2");
        std::fs::remove_file(dir.path().join("env.json")).expect("rm env");
        forget_other_machines_step_times(dir.path(), None, &now).expect("removed");
        assert!(
            !times.exists(),
            "a calibration of unknown origin is removed"
        );
    }

    /// fig5's cpu sweep as the binary resolves it, with `extra` (TOML fields) replacing its own.
    fn fig5_cpu(extra: &str) -> LmSweepConfig {
        let profile = crate::Profile::Cpu;
        let text = crate::configs::builtin("fig5", profile).expect("fig5 cpu");
        let mut table =
            crate::configs::resolve(text.parse().expect("toml"), profile, "fig5").expect("resolve");
        table.extend(extra.parse::<toml::Table>().expect("extra"));
        toml::Value::Table(table).try_into().expect("LmSweepConfig")
    }

    /// `peak_lr_by_model` changes the named model's schedule and no other's, and that model's run
    /// is the one a sweep with that rate for every model trains (a pilot's runs are reused).
    #[test]
    fn peak_lr_by_model_sets_one_models_rate() {
        let train = |config: &LmSweepConfig, name: &str| {
            let models = sweep_models(config).expect("models");
            let m = models.iter().find(|m| m.name == name).expect("model");
            serde_json::to_value(run_train_config(config, m, 1)).expect("json")
        };
        let common = fig5_cpu("peak_lr = 0.003\npeak_lr_by_model = {}");
        let by_model =
            fig5_cpu("peak_lr = 0.003\npeak_lr_by_model = { transformer_plusplus = 0.002 }");
        let all_low = fig5_cpu("peak_lr = 0.002\npeak_lr_by_model = {}");
        assert_eq!(
            train(&by_model, "transformer_plusplus"),
            train(&all_low, "transformer_plusplus")
        );
        assert_ne!(
            train(&by_model, "transformer_plusplus"),
            train(&common, "transformer_plusplus")
        );
        for other in ["flash", "flash_quad", "performer"] {
            assert_eq!(train(&by_model, other), train(&common, other), "{other}");
        }
        let peak = &train(&by_model, "transformer_plusplus")["schedule"]["peak_lr"];
        assert_eq!(peak.as_f64(), Some(0.002));
        // A name that is not a model of the sweep, or a rate that is not positive, is refused.
        let unknown = fig5_cpu("peak_lr_by_model = { transformer_plus_plus = 0.002 }");
        let err = sweep_models(&unknown)
            .err()
            .expect("unknown name refused")
            .to_string();
        assert!(err.contains("transformer_plus_plus"), "{err}");
        let zero = fig5_cpu("peak_lr_by_model = { flash = 0.0 }");
        assert!(sweep_models(&zero).is_err(), "a zero rate is refused");
        // `--set peak_lr=…` alone is shadowed for the named models, and says so.
        let set = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let warning = lr_set_shadowed(&set(&[("peak_lr", "0.0015")]), &by_model);
        assert!(warning.is_some_and(|w| w.contains("transformer_plusplus")));
        let both = set(&[("peak_lr", "0.0015"), ("peak_lr_by_model", "{}")]);
        assert_eq!(lr_set_shadowed(&both, &by_model), None);
        assert_eq!(
            lr_set_shadowed(&set(&[("peak_lr", "0.0015")]), &common),
            None
        );
    }

    /// Every run committed in `results/runs` keeps its name: its model configuration, read back
    /// (fields it predates take their defaults) and named as HEAD names it, is the one it was
    /// trained under, and the directory's hash is that identity's (a fine-tuning run's: its
    /// identity as written).
    #[test]
    fn committed_runs_keep_their_names() {
        let store = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/runs");
        let mut checked = 0;
        for entry in std::fs::read_dir(&store).expect("results/runs") {
            let dir = entry.unwrap().path();
            let Ok(text) = std::fs::read_to_string(dir.join("run_config.json")) else {
                continue;
            };
            let mut identity: serde_json::Value = serde_json::from_str(&text).unwrap();
            // A pre-training run: fields the run predates at their defaults, then the run's own.
            // A fine-tuning run (table4's `<arch>_qa-…`) names its pre-training run's identity
            // inside its own and is named by that whole identity.
            if identity.get("pretrained").is_none() {
                let model = model_from_identity(&identity["model"]).unwrap();
                identity["model"] = model_identity(&model).unwrap();
            }
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.ends_with(&crate::run_store::run_hash(&identity)),
                "{name}: HEAD names this run's configuration differently"
            );
            checked += 1;
        }
        assert!(checked >= 50, "only {checked} runs in results/runs");
        // An ablation field away from its default is part of the name.
        let base = ModelConfig::tiny(model::Architecture::FlashQuad);
        let ablated = base.clone().with_gau_heads(2);
        assert_ne!(
            model_identity(&base).unwrap(),
            model_identity(&ablated).unwrap()
        );
    }

    /// `peak_lr_from`: a model takes the rate chosen for its own name, else through `lr_family`,
    /// else its base model's; one with none of them is refused with the names it could take.
    #[test]
    fn inherited_rates_follow_names_families_and_base_models() {
        let profile = crate::Profile::Cpu;
        let text = crate::configs::builtin("fig3", profile).expect("fig3 cpu");
        let table =
            crate::configs::resolve(text.parse().expect("toml"), profile, "fig3").expect("resolve");
        let config: LmSweepConfig = toml::Value::Table(table).try_into().expect("config");
        let choice = |model: &str, chosen: f64| crate::lr_choice::RateChoice {
            model: model.into(),
            context: 512,
            grid: vec![],
            chosen,
            second: chosen,
        };
        let choices = [
            choice("transformer_plusplus", 0.001),
            choice("flash_quad", 0.01),
        ];
        let models = sweep_models(&config).unwrap();
        let rate = |name: &str| {
            let m = models.iter().find(|m| m.name == name).unwrap();
            inherited_rate(&config, m, 512, &choices)
        };
        assert_eq!(rate("flash_quad").unwrap(), 0.01);
        assert_eq!(
            rate("flash_quad_d64x2").unwrap(),
            0.01,
            "a variant: its base model's"
        );
        assert_eq!(
            rate("transformer_plus").unwrap(),
            0.001,
            "through lr_family"
        );
        assert_eq!(
            rate("transformer_plus_d192x4").unwrap(),
            0.001,
            "its base, through lr_family"
        );
        let err = inherited_rate(&config, &models[0], 4096, &choices).unwrap_err();
        assert!(format!("{err}").contains("@ 4096"), "{err}");
    }

    #[test]
    fn batch_splits_evenly_over_devices_or_is_refused() {
        assert_eq!(split_batch(4096, 512, 1).unwrap(), (8, 8));
        assert_eq!(split_batch(4096, 512, 2).unwrap(), (8, 4));
        assert_eq!(split_batch(4096, 8192, 1).unwrap(), (1, 1));
        let err = split_batch(4096, 4096, 2).unwrap_err().to_string();
        assert!(err.contains("does not split evenly"), "{err}");
    }
}
