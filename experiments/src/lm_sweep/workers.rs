//! Training the planned runs: in worker processes (`--jobs N`) or here, each resumable, reusing finished runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use training::lm_task::{CausalLmTask, LmData, MaskedLmTask};
use training::trainer::{Diverged, MetricsRow, Progress, RunOptions, train};
use training::{Provenance, write_json};

use super::config::{LmSweepConfig, Objective};
use super::lr_choice;
use super::plan::{DIVERGED_MARK, OnDivergence, PlannedRun};
use super::results::write_rows;
use crate::Cli;
use crate::run_store;
use crate::verdict::SweepRow;

/// Trains `plan`'s unfinished runs (in `cli.jobs` worker processes, then here whatever is left)
/// and appends every run's rows to `rows` (a run already there is skipped), writing the sweep's
/// `metrics.csv` as they come.
pub(super) fn execute(
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
pub(super) fn finished_rows(plan: &[PlannedRun], steps: usize) -> Result<Option<Vec<SweepRow>>> {
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
pub(super) fn diverged_runs(plan: &[PlannedRun]) -> Result<Vec<lr_choice::DivergedRun>> {
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

/// What every run of a sweep trains with.
pub(super) struct RunTrainer<'a> {
    pub(super) config: &'a LmSweepConfig,
    pub(super) data: &'a LmData,
    /// The selection split's files (validation, when the curves read test), else none.
    pub(super) select_files: &'a [PathBuf],
    pub(super) devices: &'a [burn::tensor::Device],
    /// Saved as each trained run's `env.json`.
    pub(super) provenance: &'a Provenance,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) progress: Progress,
}

impl RunTrainer<'_> {
    /// Trains `run` (from its checkpoint, if it has one) and gives its rows, or none when it was
    /// interrupted (Ctrl-C): then its checkpoint is in place for the next command.
    pub(super) fn train(&self, run: &PlannedRun, label: &str) -> Result<Option<Vec<MetricsRow>>> {
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
pub(super) fn train_as_worker(
    trainer: &RunTrainer,
    plan: &[PlannedRun],
    worker: usize,
) -> Result<()> {
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
pub(super) fn run_workers(cli: &Cli, plan: &[PlannedRun], steps: usize) -> Result<()> {
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

/// The rows of a run in the store that has finished all `steps` (its `metrics.csv` ends there), or
/// none: then the run is trained, or resumed from its checkpoint. Committed runs carry no
/// checkpoint, so this is how a fresh clone reuses them.
pub(super) fn finished_metrics(run_dir: &Path, steps: usize) -> Result<Option<Vec<MetricsRow>>> {
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
