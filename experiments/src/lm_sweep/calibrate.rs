//! The step-time calibration: every model's training step timed in turn, in rounds, on this machine (`step_times.csv`).

use std::path::Path;

use anyhow::{Context, Result};
use training::lm_task::{CausalLmTask, LmData, MaskedLmTask};
use training::trainer::Stepper;

use super::config::{LmSweepConfig, Objective, split_batch};
use super::models::{SweepModel, model_identity, run_model_config, run_train_config};
use crate::Machine;
use crate::run_store;
use crate::verdict::{StepCost, StepTime};

/// The step-time calibration (`timing_rounds`): per context, every model of the sweep built as
/// its runs are (first seed), then one untimed round and `timing_rounds` timed rounds of one
/// training step each, models in turn, so that the machine's drift falls on every model of a round
/// alike. Written to `<out>/step_times.csv`; a file that already covers every model and context
/// with these rounds is kept (delete it to re-time).
pub(super) fn calibrate_step_times(
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
pub(super) fn forget_other_machines_step_times(
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
pub(super) fn step_cost_hash(
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

/// A stepper of either objective's task (the calibration steps the sweep's objective).
pub(super) enum TimedTask {
    Causal(Stepper<model::LanguageModel, CausalLmTask>),
    Masked(Stepper<model::LanguageModel, MaskedLmTask>),
}

impl TimedTask {
    /// One training step; its seconds.
    pub(super) fn step(&mut self) -> Result<f64> {
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
