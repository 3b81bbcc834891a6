//! The step-based training loop: gradient accumulation, an external LR schedule, evaluation every N
//! steps, cost accounting, atomic checkpoints with exact resume, Ctrl-C, and `metrics.csv`.
//!
//! Exact resume: a checkpoint holds the model, the optimizer state, the step and counters, the
//! task's state (data position and RNGs) and the metrics so far; dropout is reseeded from
//! `seed + step` before every step, so a resumed run takes the same steps as an uninterrupted one.
//!
//! Faults: checkpoints are written to `checkpoint.tmp/` and swapped in by renames, with a
//! checksum of each file in `state.json`, so a process killed at any moment leaves either the
//! previous checkpoint or the new one, complete ([`recover_checkpoint`]), and a checkpoint damaged
//! on disk afterwards is refused with a message naming the file, not loaded. `metrics.csv` is
//! written atomically. `experiments/tests/faults.rs` kills a real training process at many moments
//! (SIGKILL, and the [`FAULT_ENV`] hook inside evaluation, metrics and checkpoint writing) and checks
//! that the run ends exactly as an uninterrupted one.
//!
//! Several devices: data parallelism as burn-train's `MultiDeviceOptim::OptimMainDevice` strategy
//! does it, with burn's own pieces: each step, every device gets a fork of the model
//! (`Module::fork`) and its own micro-batches; the gradients move to the main device (the first)
//! (`GradientsParams::to_device`), are summed there (`GradientsAccumulator`), and the optimizer steps
//! there. The replicas are launched one after another from this thread (burn-train's `Learner` uses
//! a thread per device); on asynchronous backends (wgpu, cuda) their kernels still overlap.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Tensor};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::optimizer::OptimizerConfig;
use crate::schedule::Schedule;

/// How to train (the run-type layer of an experiment's config).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Optimizer steps.
    pub steps: usize,
    pub optimizer: OptimizerConfig,
    pub schedule: Schedule,
    /// Micro-batches whose gradients are summed into one step (1 = none).
    pub grad_accum: usize,
    /// Per-parameter gradient L2-norm clipping; `None` = off.
    pub clip_norm: Option<f32>,
    /// Evaluate (and write a metrics row) every this many steps, and at the last step.
    pub eval_every: usize,
    /// Checkpoint every this many steps (0 = only at the end and on Ctrl-C).
    pub checkpoint_every: usize,
    /// Seeds dropout (reseeded every step from `seed + step`).
    pub seed: u64,
    /// Which model the run returns: the last step's (default) or the one of the evaluation with
    /// the lowest held-out loss. Left out of the serialized config when `Last`, so the identities
    /// of runs recorded before it existed do not change.
    #[serde(default, skip_serializing_if = "KeepModel::is_last")]
    pub keep: KeepModel,
}

/// Which model [`train`] returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeepModel {
    /// The model after the last step.
    #[default]
    Last,
    /// The model at the evaluation with the lowest held-out loss (the earliest on a tie): the
    /// "best held-out checkpoint" at which the GQA paper scores fine-tuned models (as T5 does).
    /// Kept in `best/` beside the checkpoint, with the step it was taken at.
    BestEval,
}

impl KeepModel {
    fn is_last(&self) -> bool {
        *self == KeepModel::Last
    }

    /// The step of the kept model among a finished run's evaluations (`metrics.csv`'s rows):
    /// the last row's, or the row's with the lowest held-out loss (the earliest on a tie).
    pub fn step(self, rows: &[MetricsRow]) -> Option<usize> {
        match self {
            KeepModel::Last => rows.last(),
            KeepModel::BestEval => rows.iter().fold(None::<&MetricsRow>, |best, r| match best {
                Some(b) if b.eval_loss <= r.eval_loss => Some(b),
                _ => Some(r),
            }),
        }
        .map(|r| r.step)
    }
}

/// What the loop trains on. The task owns the data and the loss.
pub trait Task<M> {
    /// Saved in checkpoints: data position, RNG states.
    type State: Serialize + DeserializeOwned + Clone;
    /// Loss of the next training micro-batch (on the autodiff device), and the tokens it holds.
    fn train_loss(&mut self, model: &M, device: &Device) -> Result<(Tensor<1>, usize)>;
    /// Token-level mean loss on the held-out data; `model` is in validation mode.
    fn eval_loss(&mut self, model: &M, device: &Device) -> Result<f64>;
    /// Token-level mean loss on the selection split (validation, where `eval_loss` reads test),
    /// evaluated once, at the end of a run: what choices between runs (learning rates) read, so
    /// that the verdicts' split is never the one they were tuned on. None: no selection split.
    fn select_loss(&mut self, _model: &M, _device: &Device) -> Result<Option<f64>> {
        Ok(None)
    }
    fn state(&self) -> Self::State;
    fn restore(&mut self, state: Self::State) -> Result<()>;
}

/// A run whose training loss stopped being finite: the error [`train`] returns then (found in
/// an error's chain with `downcast_ref`), so that a learning-rate sweep can count the rate as
/// diverged instead of stopping.
#[derive(Debug, Clone)]
pub struct Diverged {
    /// The step whose loss was not finite.
    pub step: usize,
    pub loss: f64,
    /// The last good checkpoint and its step, if one was written.
    pub checkpoint: Option<(std::path::PathBuf, usize)>,
}

impl std::fmt::Display for Diverged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (step, loss) = (self.step, self.loss);
        match &self.checkpoint {
            Some((dir, last)) => write!(
                f,
                "step {step}: the training loss is {loss}; the last good checkpoint is {} (step {last}); lower the learning rate or resume from it",
                dir.display()
            ),
            None => write!(
                f,
                "step {step}: the training loss is {loss}; the last good checkpoint is none; lower the learning rate"
            ),
        }
    }
}

impl std::error::Error for Diverged {}

/// One row of `metrics.csv` (one per evaluation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsRow {
    pub step: usize,
    pub tokens: u64,
    /// Training device-seconds (evaluation excluded) × devices, in hours.
    pub device_hours: f64,
    /// Analytic training FLOPs so far.
    pub flops: f64,
    /// Mean training loss since the previous row.
    pub train_loss: f64,
    pub eval_loss: f64,
    pub eval_ppl: f64,
    pub tokens_per_s: f64,
    pub lr: f64,
    /// [`Task::select_loss`] at the last step; empty elsewhere, in runs of tasks without a
    /// selection split, and in files written before the column existed.
    #[serde(default, deserialize_with = "optional_number")]
    pub select_loss: Option<f64>,
}

/// An optional number of a CSV or JSON file: empty (or absent, with `#[serde(default)]`) is none.
/// (Serde's own `Option<f64>` fails on an empty cell inside a `#[serde(flatten)]`ed row, where
/// the csv crate hands the cell over as text.)
pub fn optional_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Cell {
        Number(f64),
        Text(String),
    }
    match Option::<Cell>::deserialize(d)? {
        None => Ok(None),
        Some(Cell::Number(x)) => Ok(Some(x)),
        Some(Cell::Text(t)) if t.trim().is_empty() => Ok(None),
        Some(Cell::Text(t)) => t
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("`{t}` is not a number"))),
    }
}

/// The columns of [`MetricsRow`], in order.
pub const METRICS_HEADER: &str =
    "step,tokens,device_hours,flops,train_loss,eval_loss,eval_ppl,tokens_per_s,lr,select_loss";

impl MetricsRow {
    /// The row's fields as CSV, in [`METRICS_HEADER`]'s order, at full precision (Rust prints the
    /// shortest decimal that reads back to the same f64). Every `metrics.csv` of the workspace
    /// (a run's, a sweep's after its identity columns) is written through this.
    pub fn csv_fields(&self) -> String {
        format!(
            "{},{},{},{},{},{},{},{},{},{}",
            self.step,
            self.tokens,
            self.device_hours,
            self.flops,
            self.train_loss,
            self.eval_loss,
            self.eval_ppl,
            self.tokens_per_s,
            self.lr,
            self.select_loss.map_or(String::new(), |l| l.to_string())
        )
    }
}

/// Where a run is; saved as `checkpoint/state.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RunState<S> {
    step: usize,
    tokens: u64,
    device_seconds: f64,
    /// Every training loss so far (one per step): the resume test compares them.
    losses: Vec<f64>,
    rows: Vec<MetricsRow>,
    task: S,
    /// FNV-1a 64 of `model.bpk` and `optimizer.bin` as written (absent in checkpoints written
    /// before checksums existed: those load unchecked).
    #[serde(default)]
    checksums: std::collections::BTreeMap<String, String>,
}

/// The environment variable of the fault hook: `<phase>@<step>` makes the process abort (as a
/// SIGKILL would: no unwinding, no cleanup) at that moment of that step, for tests of what a
/// killed run leaves behind. Phases: `step` (after the optimizer step, before anything is
/// written), `eval` (after evaluating, before the row is written), `metrics` (with the new
/// `metrics.csv` written beside the old one, before the rename), `checkpoint` (with the new
/// checkpoint's model written, before its optimizer state and `state.json`), `swap` (between
/// moving the old checkpoint aside and moving the new one in). Unset in normal runs.
pub const FAULT_ENV: &str = "REPRO_FAULT";

/// Aborts the process if [`FAULT_ENV`] names this `phase` and `step`.
fn fault(phase: &str, step: usize) {
    static AT: std::sync::OnceLock<Option<(String, usize)>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        let v = std::env::var(FAULT_ENV).ok()?;
        let (p, s) = v.split_once('@')?;
        Some((p.to_string(), s.parse().ok()?))
    });
    if let Some((p, s)) = at
        && p == phase
        && *s == step
    {
        eprintln!("{FAULT_ENV}: aborting at {phase}@{step}");
        std::process::abort();
    }
}

/// FNV-1a 64 of a file's bytes, as 16 hex digits.
fn checksum(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    Ok(format!("{h:016x}"))
}

/// Finishes or undoes a checkpoint swap a killed process left half done: with no `checkpoint/`
/// but a `checkpoint.old/`, the process died between its two renames, after `checkpoint.tmp/` was
/// complete, so that one becomes the checkpoint; a `checkpoint.tmp/` without a `checkpoint.old/` may
/// be partial and is dropped (the previous checkpoint, if any, is still `checkpoint/`).
pub fn recover_checkpoint(out: &Path) -> Result<()> {
    let (dir, tmp, old) = (
        checkpoint_dir(out),
        out.join("checkpoint.tmp"),
        out.join("checkpoint.old"),
    );
    if !dir.exists() && old.exists() && tmp.join("state.json").exists() {
        std::fs::rename(&tmp, &dir)?;
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// Options that are not part of the experiment (they do not change results).
#[derive(Clone)]
pub struct RunOptions {
    /// Set by Ctrl-C (or a test): checkpoint at the next step boundary and stop.
    pub stop: Arc<AtomicBool>,
    /// Training FLOPs of one optimizer step (all micro-batches).
    pub flops_per_step: f64,
    /// Label for progress lines.
    pub label: String,
    /// How progress shows.
    pub progress: Progress,
}

/// How a run shows its progress on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// A bar with the step count and ETA when stderr is a terminal, a line per evaluation
    /// otherwise.
    Auto,
    /// A line per evaluation always: processes sharing one terminal (the `--jobs` workers) would
    /// draw their bars over each other.
    Lines,
}

/// How a run ended, and the model it ended with.
#[derive(Debug, Clone)]
pub struct Outcome<M> {
    pub steps: usize,
    pub interrupted: bool,
    pub losses: Vec<f64>,
    pub rows: Vec<MetricsRow>,
    /// The trained model: as of the last step taken, or of the best evaluation
    /// ([`KeepModel::BestEval`]).
    pub model: M,
    /// The step `model` is from.
    pub kept_step: usize,
}

/// Reseeds every device's generator for one step (dropout); device `i` gets `seed + i·2³²`, so
/// replicas draw different masks, and a device listed twice is seeded once.
fn seed_devices(devices: &[Device], seed: u64) {
    for (i, d) in devices.iter().enumerate() {
        if !devices[..i].contains(d) {
            d.seed(seed.wrapping_add((i as u64) << 32));
        }
    }
}

/// One optimizer step (step number `step`, learning rate `lr`): every device's micro-batches,
/// their gradients summed on the first device, the update; waits for the device. Returns the new
/// model, the mean training loss and the tokens seen. The training loop and [`Stepper`] share it.
fn take_step<M, T>(
    cfg: &TrainConfig,
    model: M,
    optim: &mut burn::optim::ModuleOptimizer,
    task: &mut T,
    devices: &[Device],
    step: usize,
    lr: f64,
) -> Result<(M, f64, usize)>
where
    M: Module + Clone,
    T: Task<M>,
{
    let device = &devices[0];
    seed_devices(devices, cfg.seed.wrapping_add(step as u64));
    let replicas: Vec<M> = std::iter::once(model.clone())
        .chain(devices[1..].iter().map(|d| model.clone().fork(d)))
        .collect();
    let micro_batches = cfg.grad_accum * devices.len();
    let mut accum = GradientsAccumulator::new();
    let mut losses = Vec::with_capacity(micro_batches);
    let mut tokens = 0;
    for _ in 0..cfg.grad_accum {
        for (replica, d) in replicas.iter().zip(devices) {
            let (loss, n) = task.train_loss(replica, d)?;
            let scaled = loss.clone() / micro_batches as f64;
            let grads = GradientsParams::from_grads(scaled.backward(), replica);
            accum.accumulate(&model, grads.to_device(device, &model));
            losses.push(loss);
            tokens += n;
        }
    }
    // Read after every replica has been launched, so no device waits on another's loss.
    let loss = losses
        .into_iter()
        .map(|l| l.into_scalar::<f32>() as f64)
        .sum::<f64>()
        / micro_batches as f64;
    if !loss.is_finite() {
        return Ok((model, loss, tokens));
    }
    let model = optim.step(lr, model, accum.grads());
    device.sync().map_err(|e| anyhow!("device: {e:?}"))?;
    Ok((model, loss, tokens))
}

/// A model, its optimizer and its task, stepped one training step at a time and timed: the same
/// step as [`train`]'s (same micro-batches, optimizer and schedule), without evaluation,
/// checkpoints or files. Timing several models' steps round-robin (one step each in turn) gives
/// them the same machine drift, so their step-time ratios compare implementations measured
/// together (the LM sweeps' step-time calibration).
pub struct Stepper<M, T> {
    cfg: TrainConfig,
    model: Option<M>,
    optim: burn::optim::ModuleOptimizer,
    task: T,
    devices: Vec<Device>,
    step: usize,
}

impl<M: Module + Clone, T: Task<M>> Stepper<M, T> {
    pub fn new(cfg: &TrainConfig, model: M, task: T, devices: &[Device]) -> Result<Self> {
        if devices.is_empty() || cfg.grad_accum == 0 || cfg.steps == 0 {
            bail!("a stepper needs a device, grad_accum > 0 and steps > 0");
        }
        Ok(Self {
            optim: cfg.optimizer.init(cfg.clip_norm),
            cfg: cfg.clone(),
            model: Some(model),
            task,
            devices: devices.to_vec(),
            step: 0,
        })
    }

    /// Takes the next step (the schedule's learning rate at that step) and returns its seconds and
    /// training loss.
    pub fn step(&mut self) -> Result<(f64, f64)> {
        self.step += 1;
        let lr = self
            .cfg
            .schedule
            .lr(self.step.min(self.cfg.steps), self.cfg.steps);
        let model = self
            .model
            .take()
            .expect("the stepper keeps its model between steps");
        let start = Instant::now();
        let (next, loss, _) = take_step(
            &self.cfg,
            model,
            &mut self.optim,
            &mut self.task,
            &self.devices,
            self.step,
            lr,
        )?;
        let seconds = start.elapsed().as_secs_f64();
        self.model = Some(next);
        Ok((seconds, loss))
    }
}

/// Installs a Ctrl-C handler that sets `stop` (once per process; later calls share the first flag).
pub fn stop_on_ctrl_c() -> Arc<AtomicBool> {
    static FLAG: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        if let Err(e) = ctrlc::set_handler(move || f.store(true, Ordering::SeqCst)) {
            eprintln!("warning: no Ctrl-C handler ({e}); interrupting loses progress since the last checkpoint");
        }
        flag
    })
    .clone()
}

fn checkpoint_dir(out: &Path) -> PathBuf {
    out.join("checkpoint")
}

/// Writes the checkpoint next to the old one, then swaps directories, so a crash mid-write
/// leaves the previous checkpoint intact.
fn save_checkpoint<M: Module + Clone, S: Serialize + Clone>(
    out: &Path,
    model: &M,
    optim: &burn::optim::ModuleOptimizer,
    state: &RunState<S>,
) -> Result<()> {
    let dir = checkpoint_dir(out);
    let tmp = out.join("checkpoint.tmp");
    let old = out.join("checkpoint.old");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    model
        .clone()
        .save_file(tmp.join("model.bpk"))
        .map_err(|e| anyhow!("saving the model: {e:?}"))?;
    fault("checkpoint", state.step);
    optim
        .save(tmp.join("optimizer.bin"))
        .map_err(|e| anyhow!("saving the optimizer: {e:?}"))?;
    let mut state = state.clone();
    for file in CHECKPOINT_FILES {
        state
            .checksums
            .insert(file.to_string(), checksum(&tmp.join(file))?);
    }
    // state.json last: a `checkpoint.tmp/` with it is complete.
    std::fs::write(tmp.join("state.json"), serde_json::to_vec(&state)?)?;
    let _ = std::fs::remove_dir_all(&old);
    if dir.exists() {
        std::fs::rename(&dir, &old)?;
    }
    fault("swap", state.step);
    std::fs::rename(&tmp, &dir)?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// The files of a checkpoint whose checksums `state.json` records.
const CHECKPOINT_FILES: [&str; 2] = ["model.bpk", "optimizer.bin"];

fn write_metrics(out: &Path, rows: &[MetricsRow]) -> Result<()> {
    let mut csv = String::from(METRICS_HEADER);
    csv.push('\n');
    for r in rows {
        csv.push_str(&r.csv_fields());
        csv.push('\n');
    }
    // write_atomic, with the fault hook between its write and its rename.
    let (path, tmp) = (out.join("metrics.csv"), out.join("metrics.partial"));
    std::fs::write(&tmp, csv.as_bytes())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    fault("metrics", rows.last().map_or(0, |r| r.step));
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
}

/// Trains `model` on `task` for `cfg.steps` steps, writing `metrics.csv` and `checkpoint/` under
/// `out`. A checkpoint already in `out` is resumed from.
///
/// `devices`: the model lives, steps and is evaluated on the first; each step takes `cfg.grad_accum`
/// micro-batches on every device, so a step holds `grad_accum × devices.len()` micro-batches, and
/// device-hours are training seconds × `devices.len()`.
pub fn train<M, T>(
    cfg: &TrainConfig,
    model: M,
    task: &mut T,
    devices: &[Device],
    out: &Path,
    opts: &RunOptions,
) -> Result<Outcome<M>>
where
    M: Module + Clone,
    T: Task<M>,
{
    let Some(device) = devices.first() else {
        bail!("training needs at least one device");
    };
    if cfg.steps == 0 || cfg.grad_accum == 0 || cfg.eval_every == 0 {
        bail!(
            "steps, grad_accum and eval_every must be positive (got {}, {}, {})",
            cfg.steps,
            cfg.grad_accum,
            cfg.eval_every
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut optim = cfg.optimizer.init(cfg.clip_norm);
    let mut model = model;
    let ckpt = checkpoint_dir(out);
    recover_checkpoint(out)?;
    let mut run: RunState<T::State> = if ckpt.join("state.json").exists() {
        let state: RunState<T::State> =
            serde_json::from_slice(&std::fs::read(ckpt.join("state.json"))?).map_err(|e| {
                anyhow!(
                    "{} is not a checkpoint of this run ({e}); delete {} to start over",
                    ckpt.display(),
                    ckpt.display()
                )
            })?;
        for (file, want) in &state.checksums {
            let path = ckpt.join(file);
            if !path.exists() || &checksum(&path)? != want {
                bail!(
                    "checkpoint {} is damaged: {} is missing or does not match the checksum in its state.json (truncated or changed on disk); delete {} to train the run again from the start",
                    ckpt.display(),
                    path.display(),
                    ckpt.display()
                );
            }
        }
        model = model.load_file(ckpt.join("model.bpk"));
        optim = optim
            .load(ckpt.join("optimizer.bin"))
            .map_err(|e| anyhow!("loading {}: {e:?}", ckpt.join("optimizer.bin").display()))?;
        eprintln!(
            "{}: resuming from {} at step {}",
            opts.label,
            ckpt.display(),
            state.step
        );
        state
    } else {
        RunState {
            step: 0,
            tokens: 0,
            device_seconds: 0.0,
            losses: Vec::new(),
            rows: Vec::new(),
            task: task.state(),
            checksums: Default::default(),
        }
    };
    task.restore(run.task.clone())?;

    let bar = (opts.progress == Progress::Auto && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(cfg.steps as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix} [{bar:30}] {pos}/{len} steps {msg} ETA {eta}",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        bar.set_prefix(opts.label.clone());
        bar.set_position(run.step as u64);
        bar
    });
    let mut interrupted = false;
    while run.step < cfg.steps {
        if opts.stop.load(Ordering::SeqCst) {
            interrupted = true;
            break;
        }
        let step = run.step + 1;
        let lr = cfg.schedule.lr(step, cfg.steps);
        let start = Instant::now();
        let (next, loss, tokens) = take_step(cfg, model, &mut optim, task, devices, step, lr)?;
        model = next;
        if !loss.is_finite() {
            return Err(anyhow::Error::new(Diverged {
                step,
                loss,
                checkpoint: ckpt.exists().then(|| (ckpt.clone(), run.step)),
            }));
        }
        run.device_seconds += start.elapsed().as_secs_f64();
        run.tokens += tokens as u64;
        run.step = step;
        run.losses.push(loss);
        fault("step", step);

        if step % cfg.eval_every == 0 || step == cfg.steps {
            let eval_loss = task.eval_loss(&model.valid(), device)?;
            let select_loss = if step == cfg.steps {
                task.select_loss(&model.valid(), device)?
            } else {
                None
            };
            fault("eval", step);
            // From the run's losses, not a buffer, so a resumed run writes the same row.
            let since = &run.losses[run.rows.last().map_or(0, |r| r.step)..];
            let row = MetricsRow {
                step,
                tokens: run.tokens,
                device_hours: run.device_seconds * devices.len() as f64 / 3600.0,
                flops: opts.flops_per_step * step as f64,
                train_loss: since.iter().sum::<f64>() / since.len().max(1) as f64,
                eval_loss,
                eval_ppl: eval_loss.exp(),
                tokens_per_s: run.tokens as f64 / run.device_seconds.max(1e-9),
                lr,
                select_loss,
            };
            let msg = format!(
                "loss {:.3} eval {:.3} {:.0} tok/s",
                row.train_loss, eval_loss, row.tokens_per_s
            );
            match &bar {
                Some(b) => b.set_message(msg),
                None => eprintln!("{} step {step}/{}: {msg}", opts.label, cfg.steps),
            }
            let best_so_far = run.rows.iter().all(|r| eval_loss < r.eval_loss);
            run.rows.push(row);
            // The last step's row is written after the final checkpoint (below): a complete
            // `metrics.csv` is what marks a run finished (`lm_sweep` then skips it), so it must
            // not appear before that checkpoint is in place.
            if step < cfg.steps {
                write_metrics(out, &run.rows)?;
            }
            if cfg.keep == KeepModel::BestEval && best_so_far {
                save_best(out, &model, step)?;
            }
        }
        if let Some(b) = &bar {
            b.set_position(step as u64);
        }
        if cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0 {
            run.task = task.state();
            save_checkpoint(out, &model, &optim, &run)?;
        }
    }
    run.task = task.state();
    save_checkpoint(out, &model, &optim, &run)?;
    // Rows up to the checkpoint's step (the last one when the run is complete); a process killed
    // between the checkpoint and this write resumes at the last step and writes them then.
    write_metrics(out, &run.rows)?;
    if let Some(b) = &bar {
        b.finish();
    }
    if interrupted {
        eprintln!(
            "{}: stopped at step {}; checkpoint in {} (run again to resume)",
            opts.label,
            run.step,
            ckpt.display()
        );
    }
    let (model, kept_step) = match cfg.keep {
        KeepModel::Last => (model, run.step),
        KeepModel::BestEval if interrupted => (model, run.step),
        KeepModel::BestEval => load_best(out, model, &run.rows)?,
    };
    Ok(Outcome {
        steps: run.step,
        interrupted,
        losses: run.losses,
        rows: run.rows,
        model,
        kept_step,
    })
}

fn best_dir(out: &Path) -> PathBuf {
    out.join("best")
}

/// Saves the model of `step`'s evaluation as the best so far (`best/model.bpk` and `best/step`),
/// written beside the old one and swapped in by a rename.
fn save_best<M: Module + Clone>(out: &Path, model: &M, step: usize) -> Result<()> {
    let tmp = out.join("best.tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    model
        .clone()
        .save_file(tmp.join("model.bpk"))
        .map_err(|e| anyhow!("saving the best model: {e:?}"))?;
    std::fs::write(tmp.join("step"), step.to_string())?;
    let dir = best_dir(out);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir)?;
    Ok(())
}

/// The model `best/` holds and its step, which must be the step of the lowest held-out loss in
/// `rows` (a resumed run re-evaluates the steps after its checkpoint, and rewrites `best/` when
/// one of them is the best).
fn load_best<M: Module + Clone>(out: &Path, model: M, rows: &[MetricsRow]) -> Result<(M, usize)> {
    let want = KeepModel::BestEval
        .step(rows)
        .ok_or_else(|| anyhow!("no evaluation was recorded, so there is no best model"))?;
    let dir = best_dir(out);
    let got: Option<usize> = std::fs::read_to_string(dir.join("step"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    if got != Some(want) {
        bail!(
            "{} holds the model of step {} but the lowest held-out loss in metrics.csv is at step {want}; delete {} and its checkpoint/ to train the run again",
            dir.display(),
            got.map_or("(none)".to_string(), |s| s.to_string()),
            out.display()
        );
    }
    Ok((model.load_file(dir.join("model.bpk")), want))
}
