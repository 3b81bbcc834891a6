//! Which runs a sweep trains: the rate grid and its choice, seeds, the run store's names and identities, the dry run's plan.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use data::registry::Split;
use data::source::SourceOptions;
use model::ModelConfig;
use training::lm_task::{LmData, WindowOrder};
use training::trainer::{MetricsRow, TrainConfig};

use super::calibrate::{read_step_times, step_cost_hash};
use super::config::{
    EvalSplit, LmSweepConfig, Objective, model_peak_lr, run_train_config_at, split_batch,
};
use super::corpus::eval_split;
use super::lr_choice;
use super::lr_choice::RateChoice;
use super::models::{SweepModel, model_identity, run_model_config, run_train_config, sweep_models};
use super::results::{read_rows, saved_config};
use crate::Cli;
use crate::dry_run::{DryRun, RunPlan};
use crate::run_store;
use crate::verdict::SweepRow;

/// A run directory's mark of a grid run whose loss stopped being finite: the run is over, and its
/// rate lost.
pub(super) const DIVERGED_MARK: &str = "diverged.json";

/// What a run's divergence (a non-finite training loss) means for the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OnDivergence {
    /// A grid run: its rate lost; the mark is written and the sweep goes on.
    Record,
    /// A run at a chosen or configured rate: an error that names the rate.
    Fail,
}

/// One run to plan: a model of the sweep at a context, with a seed and a peak rate.
pub(super) struct RunKey<'s, 'c> {
    pub(super) m: &'s SweepModel<'c>,
    pub(super) context: usize,
    pub(super) seed: u64,
    pub(super) peak_lr: f64,
    pub(super) on_divergence: OnDivergence,
}

/// Every model's seeds at its configured rate (`peak_lr`, `peak_lr_by_model`): contexts, then
/// models, then seeds.
pub(super) fn configured_keys<'s, 'c>(
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
pub(super) fn inherited_rate(
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
pub(super) fn inherited_choices(config: &LmSweepConfig, out: &Path) -> Result<Vec<RateChoice>> {
    if config.peak_lr_from.is_empty() {
        return Ok(Vec::new());
    }
    let (_, dir) = crate::lm_sweep::length_trend::sibling(out, &config.peak_lr_from)?;
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
pub(super) fn chosen_in(dir: &Path, config: &LmSweepConfig) -> Result<Vec<RateChoice>> {
    let diverged = lr_choice::read_diverged(dir)?;
    lr_choice::choose(&read_rows(dir)?, &diverged, config)
}

/// The rate grid: each model of `models` (not the one-seed references or variants) with its
/// first seed at every rate of `lr_grid`.
pub(super) fn grid_keys<'s, 'c>(
    config: &LmSweepConfig,
    models: &'s [SweepModel<'c>],
) -> Vec<RunKey<'s, 'c>> {
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
pub(super) fn chosen_plan(
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
pub(super) struct PlannedRun {
    /// The model's name in the sweep (a variant's name for the ablations).
    pub(super) model: String,
    pub(super) context: usize,
    pub(super) seed: u64,
    pub(super) peak_lr: f64,
    pub(super) on_divergence: OnDivergence,
    pub(super) spec: RunSpec,
    pub(super) dir: PathBuf,
    /// The directory's name, the `run` column of the sweep's rows.
    pub(super) name: String,
    /// "model @ context, seed s", for progress lines.
    pub(super) label: String,
    /// Training FLOPs of one optimizer step (the trainer's `flops` column; times the steps, the
    /// cost by which the `--jobs` workers take the costliest run first).
    pub(super) flops_per_step: f64,
}

/// The runs of `keys` in their order, each directory claimed in `store` (created with its
/// `run_config.json`, or checked to hold the same run).
pub(super) fn plan_runs(
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
    pub(super) fn row(&self, metrics: MetricsRow) -> SweepRow {
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

/// How one run of a sweep trains, and its identity in the run store.
pub(super) struct RunSpec {
    pub(super) model_config: ModelConfig,
    pub(super) train_config: TrainConfig,
    /// Sequences per step, and per device.
    pub(super) batch: usize,
    pub(super) device_batch: usize,
    pub(super) eval_windows: usize,
    /// What the run's results depend on, and nothing else: its name in the store.
    pub(super) identity: serde_json::Value,
}

/// The [`RunSpec`] of `m`'s run at (`context`, `seed`) on `devices` devices.
pub(super) fn run_spec(
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

/// `--dry-run` of a sweep: every (model, context) built on the device as its runs would be, the
/// plan printed (device-hours from the output directory's step-time calibration where it timed
/// this configuration on this machine); with `step`, one real training step of each, one sequence
/// per batch, on synthetic tokens (no data needed).
pub(super) fn dry_run_sweep(
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
