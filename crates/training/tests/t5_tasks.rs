//! The T5 tasks train a tiny T5 (its loss falls), resume exactly after an interruption, and
//! fine-tuning reads a seq2seq dataset in its parquet layout and generates text for every example.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

mod common;

use anyhow::Result;
use burn::module::Module;
use burn::tensor::{Device, Tensor};
use common::lm_data;
use data::tasks::Seq2SeqTask;
use data::tokenize::Tok;
use model::t5::{T5Config, T5Model};
use training::optimizer::OptimizerConfig;
use training::schedule::{Decay, Schedule};
use training::t5_task::{FineTuneTask, SpanCorruptionTask, generate};
use training::trainer::{KeepModel, Progress, RunOptions, Task, TrainConfig, train};

fn write(dir: &Path, file: &str, columns: Vec<(&str, Vec<String>)>) {
    let columns = columns
        .into_iter()
        .map(|(name, values)| {
            (
                name,
                Arc::new(arrow_array::StringArray::from(values)) as arrow_array::ArrayRef,
            )
        })
        .collect();
    data::corpus::write_parquet(&dir.join(file), columns).unwrap();
}

/// The offline corpus's book texts and its `modernize` pairs, in their layouts.
fn corpus(dir: &Path) {
    for split in ["train", "validation"] {
        let texts: Vec<String> = (0..6)
            .map(|i| {
                format!("{split} book {i}: ")
                    + &"Now is the winter of our discontent made glorious summer. ".repeat(4 + i)
            })
            .collect();
        write(
            dir,
            &format!("data/{split}-00000-of-00001.parquet"),
            vec![("text", texts)],
        );
        let sources: Vec<String> = (0..8)
            .map(|i| format!("Thou art {i} tymes fayre"))
            .collect();
        let targets: Vec<String> = (0..8).map(|i| format!("You are {i} times fair")).collect();
        write(
            dir,
            &format!("modernize/{split}-00000-of-00001.parquet"),
            vec![("source", sources), ("target", targets)],
        );
    }
}

fn config(steps: usize) -> TrainConfig {
    TrainConfig {
        steps,
        optimizer: OptimizerConfig::adafactor(),
        schedule: Schedule {
            peak_lr: 0.01,
            warmup_steps: 2,
            decay: Decay::Cosine {
                final_fraction: 0.1,
            },
            start_step: 0,
        },
        grad_accum: 1,
        clip_norm: Some(1.0),
        eval_every: 4,
        checkpoint_every: 0,
        seed: 3,
        keep: KeepModel::Last,
    }
}

fn options(stop: Arc<AtomicBool>) -> RunOptions {
    RunOptions {
        stop,
        flops_per_step: 1e6,
        label: "t5".into(),
        progress: Progress::Auto,
    }
}

/// Model initialisation and training draw from the device's global seed: tests that train run one
/// at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn tiny(device: &Device, seed: u64) -> T5Model {
    device.seed(seed);
    T5Config::tiny()
        .with_vocab_size(Tok::bytes().vocab_size())
        .with_n_kv_heads(2)
        .init(device)
}

/// Span corruption on the corpus in `dir`: batches of 2 windows of 48 inputs, the first
/// `eval_windows` held out, noise seed 11.
fn span_task(dir: &Path, eval_windows: usize) -> SpanCorruptionTask {
    SpanCorruptionTask::new(
        lm_data(dir, "gutenberg_shakespeare"),
        2,
        48,
        eval_windows,
        (11, Default::default()),
    )
    .unwrap()
}

/// Sets `stop` after `after` training batches: a Ctrl-C arriving mid-run.
struct Interrupting<T> {
    inner: T,
    stop: Arc<AtomicBool>,
    after: usize,
    calls: usize,
}

impl<T: Task<T5Model>> Task<T5Model> for Interrupting<T> {
    type State = T::State;
    fn train_loss(&mut self, m: &T5Model, d: &Device) -> Result<(Tensor<1>, usize)> {
        self.calls += 1;
        if self.calls == self.after {
            self.stop.store(true, Ordering::SeqCst);
        }
        self.inner.train_loss(m, d)
    }
    fn eval_loss(&mut self, m: &T5Model, d: &Device) -> Result<f64> {
        self.inner.eval_loss(m, d)
    }
    fn state(&self) -> T::State {
        self.inner.state()
    }
    fn restore(&mut self, s: T::State) -> Result<()> {
        self.inner.restore(s)
    }
}

#[test]
fn span_corruption_trains_and_resumes_exactly() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let device = Device::flex().autodiff();
    let task = || span_task(dir.path(), 2);
    assert!(
        task().target_length() > 2,
        "targets hold sentinels, noise and EOS"
    );

    let whole_dir = dir.path().join("whole");
    let cfg = config(8);
    let fresh = || Arc::new(AtomicBool::new(false));
    let whole = train(
        &cfg,
        tiny(&device, 1),
        &mut task(),
        std::slice::from_ref(&device),
        &whole_dir,
        &options(fresh()),
    )
    .unwrap();
    assert_eq!(whole.steps, 8);
    assert!(whole.losses.iter().all(|l| l.is_finite()));
    assert!(
        whole.losses[7] < whole.losses[0],
        "it learns: {:?}",
        whole.losses
    );

    let split_dir = dir.path().join("split");
    let stop = fresh();
    let mut interrupted = Interrupting {
        inner: task(),
        stop: stop.clone(),
        after: 3,
        calls: 0,
    };
    let first = train(
        &cfg,
        tiny(&device, 1),
        &mut interrupted,
        std::slice::from_ref(&device),
        &split_dir,
        &options(stop),
    )
    .unwrap();
    assert!(first.interrupted);
    assert_eq!(first.steps, 3);
    let second = train(
        &cfg,
        tiny(&device, 77),
        &mut task(),
        std::slice::from_ref(&device),
        &split_dir,
        &options(fresh()),
    )
    .unwrap();
    assert_eq!(second.losses, whole.losses, "losses after resuming differ");
}

#[test]
fn fine_tuning_reads_a_seq2seq_dataset_and_generates() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let device = Device::flex().autodiff();
    let format = Seq2SeqTask {
        input_length: 32,
        target_length: 24,
    };
    let shuffle = data::epochs::Shuffle { buffer: 8, seed: 0 };
    let mut task = FineTuneTask::new(
        lm_data(dir.path(), "shakespeare_modernize"),
        format,
        (4, 3),
        shuffle,
    )
    .unwrap();
    assert_eq!(task.eval_examples().len(), 3);
    let out = train(
        &config(4),
        tiny(&device, 2),
        &mut task,
        std::slice::from_ref(&device),
        &dir.path().join("ft"),
        &options(Arc::new(AtomicBool::new(false))),
    )
    .unwrap();
    assert!(out.rows.last().unwrap().eval_loss.is_finite());
    let inner = device.clone().without_autodiff();
    let model = tiny(&inner, 2);
    let texts = generate(&model, task.eval_examples(), 2, 5, task.tokenizer(), &inner).unwrap();
    assert_eq!(texts.len(), 3);
}

/// A held-out loss is the model's in validation mode whatever the caller passes: a training model
/// (autodiff, dropout 0.5) evaluates exactly as its `valid()` copy, on every call. Evaluating the
/// training model itself would draw dropout masks (a different loss each call) and record an
/// autodiff graph holding every activation until a backward pass that never comes: the GQA
/// pipeline's held-out evaluations of its training models grew the process past 24 GiB that way.
#[test]
fn held_out_loss_of_a_training_model_is_its_validation_loss() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let device = Device::flex().autodiff();
    let mut task = span_task(dir.path(), 4);
    let training = tiny(&device, 5).with_dropout(0.5);
    let want = task.eval_loss(&training.valid(), &device).unwrap();
    for call in 0..3 {
        let got = task.eval_loss(&training, &device).unwrap();
        assert_eq!(got, want, "call {call}: the training model's own loss");
    }
}
