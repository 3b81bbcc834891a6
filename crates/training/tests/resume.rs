//! Interrupting a training run and resuming it gives the same losses, step for step, as an
//! uninterrupted run (model, optimizer state, schedule, data position and dropout RNG restored).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

mod common;

use anyhow::Result;
use burn::module::Module;
use burn::tensor::{Device, Tensor};
use model::{Architecture, Direction, LanguageModel, ModelConfig};
use training::lm_task::{CausalLmTask, LmData, MaskedLmTask, WindowOrder, WindowStream};
use training::optimizer::OptimizerConfig;
use training::schedule::{Decay, Schedule};
use training::trainer::{KeepModel, Progress, RunOptions, Task, TrainConfig, train};

fn corpus(dir: &Path) {
    for split in ["train", "validation"] {
        let texts: Vec<String> = (0..6)
            .map(|i| {
                format!("{split} book {i}: ")
                    + &"Now is the winter of our discontent made glorious summer. ".repeat(3 + i)
            })
            .collect();
        data::corpus::write_parquet(
            &dir.join(format!("data/{split}-00000-of-00001.parquet")),
            vec![(
                "text",
                Arc::new(arrow_array::StringArray::from(texts)) as arrow_array::ArrayRef,
            )],
        )
        .unwrap();
    }
}

/// The corpus written under `dir`, read with the byte tokenizer.
fn lm_data(dir: &Path) -> LmData {
    corpus(dir);
    common::lm_data(dir, "gutenberg_shakespeare")
}

/// Sets `stop` after `after` training batches: a Ctrl-C arriving mid-run.
struct Interrupting<T> {
    inner: T,
    stop: Arc<AtomicBool>,
    after: usize,
    calls: usize,
}

impl<T: Task<LanguageModel>> Task<LanguageModel> for Interrupting<T> {
    type State = T::State;
    fn train_loss(&mut self, m: &LanguageModel, d: &Device) -> Result<(Tensor<1>, usize)> {
        self.calls += 1;
        if self.calls == self.after {
            self.stop.store(true, Ordering::SeqCst);
        }
        self.inner.train_loss(m, d)
    }
    fn eval_loss(&mut self, m: &LanguageModel, d: &Device) -> Result<f64> {
        self.inner.eval_loss(m, d)
    }
    fn select_loss(&mut self, m: &LanguageModel, d: &Device) -> Result<Option<f64>> {
        self.inner.select_loss(m, d)
    }
    fn state(&self) -> T::State {
        self.inner.state()
    }
    fn restore(&mut self, s: T::State) -> Result<()> {
        self.inner.restore(s)
    }
}

/// Model initialisation and dropout draw from the device's global generator, so the tests of this
/// file take turns.
static GLOBAL_SEED: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn interrupted_and_resumed_run_matches_uninterrupted() {
    let _turn = GLOBAL_SEED.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let data = lm_data(dir.path());
    let causal = || CausalLmTask::new(data.clone(), 2, 32, 4).unwrap();
    check_resume(&dir.path().join("causal"), causal, Direction::Causal);
    // The masked objective resumes exactly too: its state includes the masking generator. (In the
    // same test, not a parallel one: model initialisation draws from the device's global seed.)
    let masked = || MaskedLmTask::new(data.clone(), 2, 32, 4, 7).unwrap();
    check_resume(&dir.path().join("masked"), masked, Direction::Bidirectional);
    // Shuffled streams (blocks of 5 windows: the interruption falls inside a block) with a
    // selection split resume exactly too, and the last row carries the selection loss.
    let order = WindowOrder::Shuffled { block_tokens: 165 };
    let shuffled = || {
        CausalLmTask::new(data.clone(), 2, 32, 4)
            .unwrap()
            .with_order(order, 3)
            .unwrap()
            .with_selection(data.spec, data.eval_files.clone(), 3)
            .unwrap()
    };
    let dir_shuffled = dir.path().join("causal_shuffled");
    check_resume(&dir_shuffled, shuffled, Direction::Causal);
    let csv = std::fs::read_to_string(dir_shuffled.join("whole/metrics.csv")).unwrap();
    let last: Vec<&str> = csv.lines().last().unwrap().split(',').collect();
    assert!(last[9].parse::<f64>().unwrap().is_finite(), "{csv}");
    let first: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(
        first[9], "",
        "the selection loss is evaluated at the end only: {csv}"
    );
    let masked = || {
        MaskedLmTask::new(data.clone(), 2, 32, 4, 7)
            .unwrap()
            .with_order(order)
            .unwrap()
    };
    check_resume(
        &dir.path().join("masked_shuffled"),
        masked,
        Direction::Bidirectional,
    );
}

/// The windows `stream` hands out next, `n` of them.
fn take(stream: &mut WindowStream, n: usize) -> Vec<Vec<u32>> {
    (0..n).map(|_| stream.next_window().unwrap()).collect()
}

/// A shuffled stream hands out each epoch's windows once, in an order that depends on the seed and
/// differs between epochs; a stream restored from any position hands out what the uninterrupted
/// one does; one block per epoch is a permutation of the file-order epoch.
#[test]
fn shuffled_stream_is_seeded_permuted_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let data = lm_data(dir.path());
    let open = |order: WindowOrder, seed: u64| {
        WindowStream::ordered(
            data.spec,
            data.train_files.clone(),
            data.tok.clone(),
            33,
            order,
            seed,
        )
        .unwrap()
    };
    let mut file = open(WindowOrder::File, 0);
    // The file-order epoch: until the first window comes round again.
    let first = file.next_window().unwrap();
    let mut epoch = vec![first.clone()];
    loop {
        let w = file.next_window().unwrap();
        if w == first {
            break;
        }
        epoch.push(w);
    }
    let n = epoch.len();
    assert!(n >= 20, "the test corpus holds {n} windows");
    let sorted = |mut v: Vec<Vec<u32>>| {
        v.sort();
        v
    };

    let whole = WindowOrder::Shuffled {
        block_tokens: 1 << 20,
    };
    let (a, b) = (
        take(&mut open(whole, 0), 2 * n),
        take(&mut open(whole, 1), 2 * n),
    );
    assert_ne!(
        a[..n],
        b[..n],
        "two seeds read the windows in the same order"
    );
    assert_ne!(a[..n], epoch[..], "the shuffled epoch is in file order");
    assert_ne!(a[..n], a[n..], "two epochs in the same order");
    for e in [&a[..n], &a[n..], &b[..n]] {
        assert_eq!(
            sorted(e.to_vec()),
            sorted(epoch.clone()),
            "not a permutation of the epoch"
        );
    }

    // Blocks of 4 windows: each block a permutation of 4 consecutive file-order windows.
    let small = WindowOrder::Shuffled {
        block_tokens: 4 * 33,
    };
    let blocks = take(&mut open(small, 5), n);
    for (got, want) in blocks.chunks(4).zip(epoch.chunks(4)) {
        assert_eq!(sorted(got.to_vec()), sorted(want.to_vec()));
    }

    // Restored at every position (inside blocks, at their edges, across the epoch's end).
    for order in [whole, small] {
        let reference = take(&mut open(order, 9), 3 * n);
        for at in [0, 1, 3, 4, 7, n - 1, n, n + 2] {
            let mut s = open(order, 9);
            take(&mut s, at);
            let state = s.state();
            let mut resumed = open(order, 9);
            resumed.restore(state).unwrap();
            assert_eq!(
                take(&mut resumed, n + 3),
                reference[at..at + n + 3],
                "at {at}"
            );
        }
    }
}

/// Two replicas (the second a fork, on the same CPU here: the only device this machine has) with one
/// micro-batch each take the same steps as one device accumulating two micro-batches: the replica's
/// gradients reach the main device and count once, and device-hours count both devices.
#[test]
fn data_parallel_replicas_equal_gradient_accumulation() {
    let _turn = GLOBAL_SEED.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let data = lm_data(dir.path());
    let device = Device::flex().autodiff();
    let run = |devices: &[Device], grad_accum: usize, name: &str| {
        device.seed(1);
        let model = ModelConfig::tiny(Architecture::TransformerPlusPlus)
            .with_vocab_size(359)
            .init(Direction::Causal, &device);
        let cfg = TrainConfig {
            steps: 4,
            optimizer: OptimizerConfig::adafactor(),
            schedule: Schedule {
                peak_lr: 0.01,
                warmup_steps: 1,
                decay: Decay::Cosine {
                    final_fraction: 0.1,
                },
                start_step: 0,
            },
            grad_accum,
            clip_norm: None,
            eval_every: 2,
            checkpoint_every: 0,
            seed: 5,
            keep: KeepModel::Last,
        };
        let opts = RunOptions {
            stop: Arc::new(AtomicBool::new(false)),
            flops_per_step: 1e6,
            label: name.into(),
            progress: Progress::Auto,
        };
        let mut task = CausalLmTask::new(data.clone(), 2, 32, 4).unwrap();
        train(
            &cfg,
            model,
            &mut task,
            devices,
            &dir.path().join(name),
            &opts,
        )
        .unwrap()
    };
    let parallel = run(&[device.clone(), device.clone()], 1, "parallel");
    let accumulated = run(std::slice::from_ref(&device), 2, "accumulated");
    let single = run(std::slice::from_ref(&device), 1, "single");
    assert_eq!(parallel.losses, accumulated.losses);
    assert_ne!(parallel.losses, single.losses, "the replica's batch counts");
    assert_eq!(parallel.rows.last().unwrap().tokens, 4 * 2 * 2 * 32);
    for (rows, devices) in [(&parallel.rows, 2.0), (&accumulated.rows, 1.0)] {
        for r in rows {
            // tokens_per_s is per wall-second, device_hours = wall-seconds × devices.
            let wall_seconds = r.device_hours * 3600.0 / devices;
            let tokens = r.tokens_per_s * wall_seconds;
            assert!((tokens / r.tokens as f64 - 1.0).abs() < 1e-9, "{r:?}");
        }
    }
}

fn check_resume<T: Task<LanguageModel>>(dir: &Path, task: impl Fn() -> T, direction: Direction) {
    let device = Device::flex().autodiff();
    let model = |seed: u64| {
        device.seed(seed);
        ModelConfig::tiny(Architecture::Flash)
            .with_vocab_size(359)
            .init(direction, &device)
    };
    let cfg = TrainConfig {
        steps: 9,
        optimizer: OptimizerConfig::adafactor(),
        schedule: Schedule {
            peak_lr: 0.01,
            warmup_steps: 3,
            decay: Decay::Cosine {
                final_fraction: 0.1,
            },
            start_step: 0,
        },
        grad_accum: 2,
        clip_norm: Some(1.0),
        eval_every: 3,
        checkpoint_every: 0,
        seed: 5,
        keep: KeepModel::Last,
    };
    let run_opts = |stop: Arc<AtomicBool>| RunOptions {
        stop,
        flops_per_step: 1e6,
        label: "test".into(),
        progress: Progress::Auto,
    };

    let whole_dir = dir.join("whole");
    let whole = train(
        &cfg,
        model(1),
        &mut task(),
        std::slice::from_ref(&device),
        &whole_dir,
        &run_opts(Arc::new(AtomicBool::new(false))),
    )
    .unwrap();
    assert_eq!(whole.steps, 9);
    assert!(!whole.interrupted);
    assert!(whole.losses.iter().all(|l| l.is_finite()));
    assert!(
        whole.losses[8] < whole.losses[0],
        "it learns: {:?}",
        whole.losses
    );

    // Stop during step 5 (its 2nd micro-batch is the 10th batch): steps 1..=5 are done.
    let split_dir = dir.join("split");
    let stop = Arc::new(AtomicBool::new(false));
    let mut t = Interrupting {
        inner: task(),
        stop: stop.clone(),
        after: 10,
        calls: 0,
    };
    let first = train(
        &cfg,
        model(1),
        &mut t,
        std::slice::from_ref(&device),
        &split_dir,
        &run_opts(stop),
    )
    .unwrap();
    assert!(first.interrupted);
    assert_eq!(first.steps, 5);
    // A fresh process: another initialisation (overwritten by the checkpoint), a fresh task.
    let second = train(
        &cfg,
        model(99),
        &mut task(),
        std::slice::from_ref(&device),
        &split_dir,
        &run_opts(Arc::new(AtomicBool::new(false))),
    )
    .unwrap();
    assert_eq!(second.steps, 9);
    assert_eq!(second.losses, whole.losses, "losses after resuming differ");
    let csv = |d: &Path| std::fs::read_to_string(d.join("metrics.csv")).unwrap();
    let columns = |s: String| -> Vec<Vec<String>> {
        // device_hours and tokens_per_s are timings; everything else must match.
        s.lines()
            .map(|l| {
                l.split(',')
                    .enumerate()
                    .filter(|(i, _)| *i != 2 && *i != 7)
                    .map(|(_, v)| v.to_string())
                    .collect()
            })
            .collect()
    };
    assert_eq!(columns(csv(&split_dir)), columns(csv(&whole_dir)));
    assert_eq!(csv(&whole_dir).lines().count(), 1 + 3);
}

/// Held-out losses from a script (one per evaluation, in order), the training from `inner`: the
/// best evaluation is chosen by the test, not by how the model happens to learn.
struct ScriptedEval<T> {
    inner: T,
    script: Vec<f64>,
    evals: usize,
}

impl<T: Task<LanguageModel>> Task<LanguageModel> for ScriptedEval<T> {
    type State = T::State;
    fn train_loss(&mut self, m: &LanguageModel, d: &Device) -> Result<(Tensor<1>, usize)> {
        self.inner.train_loss(m, d)
    }
    fn eval_loss(&mut self, _: &LanguageModel, _: &Device) -> Result<f64> {
        self.evals += 1;
        Ok(self.script[self.evals - 1])
    }
    fn state(&self) -> T::State {
        self.inner.state()
    }
    fn restore(&mut self, s: T::State) -> Result<()> {
        self.inner.restore(s)
    }
}

/// `KeepModel::BestEval` returns the model of the evaluation with the lowest held-out loss (here
/// step 4 of 6), the same model a run stopped at step 4 ends with; also when the run was
/// interrupted after that evaluation and resumed.
#[test]
fn keep_best_eval_returns_the_model_of_the_lowest_held_out_loss() {
    let _turn = GLOBAL_SEED.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let data = lm_data(dir.path());
    let device = Device::flex().autodiff();
    let model = || {
        device.seed(3);
        ModelConfig::tiny(Architecture::TransformerPlusPlus)
            .with_vocab_size(359)
            .init(Direction::Causal, &device)
    };
    // A constant rate, so a 4-step run takes the same first 4 steps as a 6-step one.
    let cfg = |steps: usize, keep: KeepModel| TrainConfig {
        steps,
        optimizer: OptimizerConfig::adafactor(),
        schedule: Schedule::new(0.01, 0, Decay::Constant),
        grad_accum: 1,
        clip_norm: None,
        eval_every: 2,
        checkpoint_every: 0,
        seed: 5,
        keep,
    };
    let opts = |stop: Arc<AtomicBool>| RunOptions {
        stop,
        flops_per_step: 1e6,
        label: "best".into(),
        progress: Progress::Auto,
    };
    let never = || Arc::new(AtomicBool::new(false));
    let scripted = |evals: usize| ScriptedEval {
        inner: CausalLmTask::new(data.clone(), 2, 32, 4).unwrap(),
        script: vec![3.0, 1.0, 2.0],
        evals,
    };
    let run = |steps: usize, keep: KeepModel, name: &str| {
        let out = train(
            &cfg(steps, keep),
            model(),
            &mut scripted(0),
            std::slice::from_ref(&device),
            &dir.path().join(name),
            &opts(never()),
        )
        .unwrap();
        (out.kept_step, out.model)
    };
    // The real held-out loss of a model, to tell models apart.
    let held_out = |m: &LanguageModel| {
        CausalLmTask::new(data.clone(), 2, 32, 4)
            .unwrap()
            .eval_loss(&m.valid(), &device)
            .unwrap()
    };
    let (best_step, best) = run(6, KeepModel::BestEval, "best");
    let (four_step, four) = run(4, KeepModel::Last, "four");
    let (last_step, last) = run(6, KeepModel::Last, "last");
    assert_eq!((best_step, four_step, last_step), (4, 4, 6));
    assert_eq!(held_out(&best), held_out(&four));
    assert_ne!(
        held_out(&best),
        held_out(&last),
        "the last two steps change the model"
    );

    // Interrupted after step 5 (past the best evaluation), then resumed.
    let resumed_dir = dir.path().join("resumed");
    let stop = Arc::new(AtomicBool::new(false));
    let mut first = Interrupting {
        inner: scripted(0),
        stop: stop.clone(),
        after: 5,
        calls: 0,
    };
    let cut = train(
        &cfg(6, KeepModel::BestEval),
        model(),
        &mut first,
        std::slice::from_ref(&device),
        &resumed_dir,
        &opts(stop),
    )
    .unwrap();
    assert!(cut.interrupted);
    let resumed = train(
        &cfg(6, KeepModel::BestEval),
        model(),
        &mut scripted(2),
        std::slice::from_ref(&device),
        &resumed_dir,
        &opts(never()),
    )
    .unwrap();
    assert_eq!(resumed.kept_step, 4);
    assert_eq!(held_out(&resumed.model), held_out(&four));
    assert!(resumed_dir.join("best/model.bpk").exists());
}
