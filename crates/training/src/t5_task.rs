//! The T5 tasks of the GQA experiments, for [`T5Model`]: span-corruption pre-training and
//! uptraining on packed windows (T5's objective, on which the GQA paper uptrains converted
//! checkpoints, §2.1), supervised fine-tuning on seq2seq and QA examples, and batched greedy
//! generation for scoring.

use std::path::PathBuf;

use anyhow::{Result, bail};
use burn::module::Module;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use data::epochs::{EpochState, EpochStream, Shuffle};
use data::registry::DatasetSpec;
use data::rng::SplitMix64;
use data::source::{ExampleStream, StreamPosition};
use data::tasks::{
    PretrainObjective, Seq2SeqExample, Seq2SeqTask, SpanCorruption, SpanExample,
    random_copy_example, t5_span_lengths,
};
use data::tokenize::Tok;
use model::t5::{Stop, T5Model};
use serde::{Deserialize, Serialize};

use crate::lm_task::{LmData, LmState, WindowStream};
use crate::trainer::Task;

/// Pads sequences with T5's pad id (0) to the longest: ids [B, L] and `keep` [B, L] (true = token).
pub fn pad_batch(seqs: &[Vec<u32>], device: &Device) -> (Tensor<2, Int>, Tensor<2, Bool>) {
    let b = seqs.len();
    let len = seqs.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut ids = vec![model::t5::PAD_ID; b * len];
    let mut keep = vec![false; b * len];
    for (row, seq) in seqs.iter().enumerate() {
        for (i, &t) in seq.iter().enumerate() {
            ids[row * len + i] = t as i64;
            keep[row * len + i] = true;
        }
    }
    (
        Tensor::from_data(TensorData::new(ids, [b, len]), device),
        Tensor::from_data(TensorData::new(keep, [b, len]), device),
    )
}

/// An example as (input tokens, target tokens).
trait Pair {
    fn pair(&self) -> (&[u32], &[u32]);
}

impl Pair for SpanExample {
    fn pair(&self) -> (&[u32], &[u32]) {
        (&self.inputs, &self.targets)
    }
}

impl Pair for Seq2SeqExample {
    fn pair(&self) -> (&[u32], &[u32]) {
        (&self.inputs, &self.targets)
    }
}

/// Mean target-token loss of a batch of examples and its number of target tokens.
fn seq2seq_loss<E: Pair>(model: &T5Model, examples: &[E], device: &Device) -> (Tensor<1>, usize) {
    let inputs: Vec<Vec<u32>> = examples.iter().map(|e| e.pair().0.to_vec()).collect();
    let targets: Vec<Vec<u32>> = examples.iter().map(|e| e.pair().1.to_vec()).collect();
    let (inputs, keep) = pad_batch(&inputs, device);
    let (targets_t, _) = pad_batch(&targets, device);
    let n = targets.iter().map(Vec::len).sum();
    (model.loss(inputs, &keep, targets_t), n)
}

/// Token-level mean loss over `examples`, in batches of `batch`, on the non-autodiff device.
fn eval_seq2seq<E: Pair>(model: &T5Model, examples: &[E], batch: usize, device: &Device) -> f64 {
    // On the weights without autodiff, whatever the caller passes: a training model's forward
    // records a graph that keeps every activation (the logits alone are [B, T, V]) until a
    // backward pass that never comes; the GQA pipeline's held-out evaluations of its autodiff
    // models grew the process past 24 GiB that way.
    let model = &model.valid();
    let inner = device.clone().without_autodiff();
    let (mut total, mut count) = (0.0, 0usize);
    for chunk in examples.chunks(batch) {
        let (loss, n) = seq2seq_loss(model, chunk, &inner);
        total += loss.into_scalar::<f32>() as f64 * n as f64;
        count += n;
    }
    total / count.max(1) as f64
}

/// Position of the span-corruption stream: the windows' position and the noise generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpanState {
    pub stream: LmState,
    pub rng: SplitMix64,
}

/// T5's span corruption on packed windows: raw windows of the length that corrupts to
/// `input_length` tokens ([`t5_span_lengths`]; 568 → 512 inputs, 114 targets at T5's defaults).
pub struct SpanCorruptionTask {
    stream: WindowStream,
    corruption: SpanCorruption,
    /// What the targets are (T5's span corruption, or the whole window).
    objective: PretrainObjective,
    /// Fraction of training windows replaced by a random-token copying example
    /// ([`SpanCorruption::random_copy`]); 0 (the default) draws nothing, so runs without it are
    /// unchanged. The held-out windows are always text.
    random_copy: f64,
    batch: usize,
    /// Held-out windows corrupted once with their own seed: every evaluation sees the same noise.
    eval: Vec<SpanExample>,
}

/// Seed offset of the held-out noise, so it never coincides with the training noise.
const EVAL_NOISE_SEED: u64 = 0x5eed_7a5c;

impl SpanCorruptionTask {
    /// Batches of `batch` windows corrupted to `input_length` tokens, with the targets `objective`
    /// asks for; the first `eval_windows` windows of the eval files are the held-out set.
    pub fn new(
        data: LmData,
        batch: usize,
        input_length: usize,
        eval_windows: usize,
        (seed, objective): (u64, PretrainObjective),
    ) -> Result<Self> {
        let LmData {
            spec,
            train_files,
            eval_files,
            tok,
        } = data;
        let corruption = SpanCorruption::new(seed);
        let (raw, _) =
            t5_span_lengths(input_length, corruption.noise_density, corruption.mean_span);
        let mut eval_corruption = SpanCorruption::new(seed ^ EVAL_NOISE_SEED);
        let eval = WindowStream::first_windows(spec, eval_files, &tok, raw, eval_windows)?
            .iter()
            .map(|w| eval_corruption.apply_objective(w, &tok, objective))
            .collect();
        Ok(Self {
            stream: WindowStream::new(spec, train_files, tok, raw)?,
            corruption,
            objective,
            random_copy: 0.0,
            batch,
            eval,
        })
    }

    /// Replaces this fraction of the training windows (drawn per window) by random-token copying
    /// examples of the same length.
    pub fn with_random_copy(mut self, fraction: f64) -> Self {
        self.random_copy = fraction;
        self
    }

    /// Target length of one corrupted window (sentinels, noise tokens and EOS).
    pub fn target_length(&self) -> usize {
        self.eval.first().map_or(0, |e| e.targets.len())
    }
}

impl Task<T5Model> for SpanCorruptionTask {
    type State = SpanState;

    fn train_loss(&mut self, model: &T5Model, device: &Device) -> Result<(Tensor<1>, usize)> {
        let examples: Vec<SpanExample> = (0..self.batch)
            .map(|_| {
                // Drawn only when asked for, so runs without copying see the same noise as before.
                if self.random_copy > 0.0 && self.corruption.rng.next_f64() < self.random_copy {
                    let (len, tok) = (self.stream.window(), self.stream.tokenizer());
                    return Ok(self.corruption.random_copy(len, tok));
                }
                let w = self.stream.next_window()?;
                let tok = self.stream.tokenizer();
                Ok(self.corruption.apply_objective(&w, tok, self.objective))
            })
            .collect::<Result<_>>()?;
        Ok(seq2seq_loss(model, &examples, device))
    }

    fn eval_loss(&mut self, model: &T5Model, device: &Device) -> Result<f64> {
        Ok(eval_seq2seq(model, &self.eval, self.batch, device))
    }

    fn state(&self) -> SpanState {
        SpanState {
            stream: self.stream.state(),
            rng: self.corruption.rng,
        }
    }

    fn restore(&mut self, state: SpanState) -> Result<()> {
        self.corruption.rng = state.rng;
        self.stream.restore(state.stream)
    }
}

/// Copying random tokens ([`random_copy_example`]): a warm-up before pre-training in which a small
/// T5 learns the circuit that copying needs (T5 has relative position biases only, none in
/// cross-attention, so the decoder must find the input position after the one it just wrote by
/// content). Not T5's recipe; `results/gqa_pilot`, pilots 6 and 7.
pub struct RandomCopyTask {
    tok: Tok,
    rng: SplitMix64,
    length: usize,
    batch: usize,
    /// Held-out sequences drawn once with their own seed.
    eval: Vec<SpanExample>,
}

impl RandomCopyTask {
    /// Batches of `batch` sequences of `length` random non-special ids (EOS added), and
    /// `eval_examples` held-out ones.
    pub fn new(tok: Tok, (length, batch): (usize, usize), eval_examples: usize, seed: u64) -> Self {
        let mut eval_rng = SplitMix64::new(seed ^ EVAL_NOISE_SEED);
        let eval = (0..eval_examples)
            .map(|_| random_copy_example(&mut eval_rng, length, &tok))
            .collect();
        Self {
            tok,
            rng: SplitMix64::new(seed),
            length,
            batch,
            eval,
        }
    }
}

impl Task<T5Model> for RandomCopyTask {
    type State = SplitMix64;

    fn train_loss(&mut self, model: &T5Model, device: &Device) -> Result<(Tensor<1>, usize)> {
        let examples: Vec<SpanExample> = (0..self.batch)
            .map(|_| random_copy_example(&mut self.rng, self.length, &self.tok))
            .collect();
        Ok(seq2seq_loss(model, &examples, device))
    }

    fn eval_loss(&mut self, model: &T5Model, device: &Device) -> Result<f64> {
        Ok(eval_seq2seq(model, &self.eval, self.batch, device))
    }

    fn state(&self) -> SplitMix64 {
        self.rng
    }

    fn restore(&mut self, state: SplitMix64) -> Result<()> {
        self.rng = state;
        Ok(())
    }
}

/// Supervised fine-tuning on a seq2seq or QA dataset, formatted and truncated by [`Seq2SeqTask`]
/// (input / output lengths per task), epoch after epoch, each epoch shuffled by the run's seed.
pub struct FineTuneTask {
    tok: Tok,
    format: Seq2SeqTask,
    train: EpochStream,
    batch: usize,
    eval: Vec<Seq2SeqExample>,
}

impl FineTuneTask {
    /// The first `eval_examples` examples of the eval files are the held-out set; the training
    /// examples come in `shuffle`'s order.
    pub fn new(
        data: LmData,
        format: Seq2SeqTask,
        (batch, eval_examples): (usize, usize),
        shuffle: Shuffle,
    ) -> Result<Self> {
        let LmData {
            spec,
            train_files,
            eval_files,
            tok,
        } = data;
        let eval = first_examples(spec, eval_files, &tok, format, eval_examples)?;
        Ok(Self {
            train: EpochStream::open(spec, train_files, shuffle)?,
            tok,
            format,
            batch,
            eval,
        })
    }

    /// The held-out examples (for generation and scoring).
    pub fn eval_examples(&self) -> &[Seq2SeqExample] {
        &self.eval
    }

    pub fn tokenizer(&self) -> &Tok {
        &self.tok
    }

    fn next_example(&mut self) -> Result<Seq2SeqExample> {
        let example = self.train.next_example()?;
        self.format.build(&example, &self.tok)
    }
}

/// The first `n` examples of `files`, formatted (an error if there are none).
pub fn first_examples(
    spec: &'static DatasetSpec,
    files: Vec<PathBuf>,
    tok: &Tok,
    format: Seq2SeqTask,
    n: usize,
) -> Result<Vec<Seq2SeqExample>> {
    let docs = ExampleStream::open_at(spec, files, StreamPosition::default())?;
    let examples: Vec<Seq2SeqExample> = docs
        .take(n)
        .map(|e| format.build(&e?, tok))
        .collect::<Result<_>>()?;
    if examples.is_empty() {
        bail!("the {} eval split holds no examples", spec.name);
    }
    Ok(examples)
}

impl Task<T5Model> for FineTuneTask {
    type State = EpochState;

    fn train_loss(&mut self, model: &T5Model, device: &Device) -> Result<(Tensor<1>, usize)> {
        let examples: Vec<Seq2SeqExample> = (0..self.batch)
            .map(|_| self.next_example())
            .collect::<Result<_>>()?;
        Ok(seq2seq_loss(model, &examples, device))
    }

    fn eval_loss(&mut self, model: &T5Model, device: &Device) -> Result<f64> {
        Ok(eval_seq2seq(model, &self.eval, self.batch, device))
    }

    fn state(&self) -> EpochState {
        self.train.state()
    }

    fn restore(&mut self, state: EpochState) -> Result<()> {
        self.train.restore(state)
    }
}

/// Greedy generation for each example's inputs, in batches of `batch`, at most `max_len` tokens,
/// decoded to text without specials.
pub fn generate(
    model: &T5Model,
    examples: &[Seq2SeqExample],
    batch: usize,
    max_len: usize,
    tok: &Tok,
    device: &Device,
) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(examples.len());
    for chunk in examples.chunks(batch) {
        let inputs: Vec<Vec<u32>> = chunk.iter().map(|e| e.inputs.clone()).collect();
        let (ids, keep) = pad_batch(&inputs, device);
        for seq in model.greedy_decode(ids, &keep, max_len, Stop::Eos) {
            let ids: Vec<u32> = seq
                .into_iter()
                .take_while(|&t| t != model::t5::EOS_ID)
                .map(|t| t as u32)
                .collect();
            out.push(tok.decode(&ids)?);
        }
    }
    Ok(out)
}
