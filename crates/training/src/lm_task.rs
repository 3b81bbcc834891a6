//! The language-model tasks of the FLASH experiments: documents packed into windows, batches of
//! `batch` windows and a fixed held-out set, for the causal objective (windows of `context + 1`
//! tokens, shifted targets) and the masked one (BERT masking of `context`-token windows).

use std::path::PathBuf;

use anyhow::{Result, bail};
use burn::tensor::{Device, Int, Tensor, TensorData};
use data::registry::DatasetSpec;
use data::rng::SplitMix64;
use data::source::{ExampleStream, StreamPosition};
use data::tasks::{BertMasking, MaskedExample, NO_LOSS, PackState, Packer};
use data::tokenize::Tok;
use model::{LanguageModel, causal_lm_loss, masked_lm_loss};
use serde::{Deserialize, Serialize};

use crate::trainer::Task;

/// Position in the training stream: epoch and packer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LmState {
    pub epoch: usize,
    pub pack: PackState,
}

/// A split's documents packed into windows of `window` tokens, epoch after epoch, resumable.
pub struct WindowStream {
    spec: &'static DatasetSpec,
    files: Vec<PathBuf>,
    tok: Tok,
    window: usize,
    docs: ExampleStream,
    packer: Packer,
    epoch: usize,
}

impl WindowStream {
    pub fn new(
        spec: &'static DatasetSpec,
        files: Vec<PathBuf>,
        tok: Tok,
        window: usize,
    ) -> Result<Self> {
        let docs = ExampleStream::open_at(spec, files.clone(), StreamPosition::default())?;
        Ok(Self {
            spec,
            files,
            packer: Packer::new(window, tok.eos_id()),
            tok,
            window,
            docs,
            epoch: 0,
        })
    }

    /// Tokens per window.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The first `n` windows of `files` (fewer if the split is shorter; an error if it holds none).
    pub fn first_windows(
        spec: &'static DatasetSpec,
        files: Vec<PathBuf>,
        tok: &Tok,
        window: usize,
        n: usize,
    ) -> Result<Vec<Vec<u32>>> {
        let mut docs = ExampleStream::open_at(spec, files, StreamPosition::default())?;
        let mut packer = Packer::new(window, tok.eos_id());
        let mut out = Vec::new();
        while out.len() < n {
            match packer.next_window(&mut docs, tok)? {
                Some(w) => out.push(w),
                None => break,
            }
        }
        if out.is_empty() {
            bail!(
                "the {} eval split holds less than one window of {window} tokens",
                spec.name
            );
        }
        Ok(out)
    }

    pub fn tokenizer(&self) -> &Tok {
        &self.tok
    }

    pub fn next_window(&mut self) -> Result<Vec<u32>> {
        loop {
            if let Some(w) = self.packer.next_window(&mut self.docs, &self.tok)? {
                return Ok(w);
            }
            // End of the split: next epoch, same order (the packer's leftover is dropped).
            self.epoch += 1;
            if self.epoch > 1000 {
                bail!(
                    "the {} train split holds less than one window of {} tokens",
                    self.spec.name,
                    self.window
                );
            }
            self.docs =
                ExampleStream::open_at(self.spec, self.files.clone(), StreamPosition::default())?;
            self.packer = Packer::new(self.window, self.tok.eos_id());
        }
    }

    pub fn state(&self) -> LmState {
        LmState {
            epoch: self.epoch,
            pack: self.packer.state(),
        }
    }

    pub fn restore(&mut self, state: LmState) -> Result<()> {
        self.epoch = state.epoch;
        self.docs = ExampleStream::open_at(self.spec, self.files.clone(), state.pack.doc)?;
        self.packer = Packer::resume(self.window, self.tok.eos_id(), state.pack);
        Ok(())
    }
}

fn int_tensor(rows: &[Vec<i64>], device: &Device) -> Tensor<2, Int> {
    let (b, t) = (rows.len(), rows[0].len());
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    Tensor::from_data(TensorData::new(flat, [b, t]), device)
}

fn window_tensor(windows: &[Vec<u32>], device: &Device) -> Tensor<2, Int> {
    let rows: Vec<Vec<i64>> = windows
        .iter()
        .map(|w| w.iter().map(|&x| x as i64).collect())
        .collect();
    int_tensor(&rows, device)
}

/// What every LM task reads: a dataset's train and held-out files ([`data::source::split_files`])
/// and the tokenizer.
#[derive(Clone)]
pub struct LmData {
    pub spec: &'static DatasetSpec,
    pub train_files: Vec<PathBuf>,
    pub eval_files: Vec<PathBuf>,
    pub tok: Tok,
}

/// Causal LM: windows of `context + 1` tokens, inputs and shifted targets.
pub struct CausalLmTask {
    stream: WindowStream,
    batch: usize,
    context: usize,
    eval: Vec<Vec<u32>>,
}

impl CausalLmTask {
    /// The first `eval_windows` windows of the eval files are the held-out set.
    pub fn new(data: LmData, batch: usize, context: usize, eval_windows: usize) -> Result<Self> {
        let LmData {
            spec,
            train_files,
            eval_files,
            tok,
        } = data;
        let eval = WindowStream::first_windows(spec, eval_files, &tok, context + 1, eval_windows)?;
        Ok(Self {
            stream: WindowStream::new(spec, train_files, tok, context + 1)?,
            batch,
            context,
            eval,
        })
    }

    pub fn tokenizer(&self) -> &Tok {
        self.stream.tokenizer()
    }
}

impl Task<LanguageModel> for CausalLmTask {
    type State = LmState;

    fn train_loss(&mut self, model: &LanguageModel, device: &Device) -> Result<(Tensor<1>, usize)> {
        let windows: Vec<Vec<u32>> = (0..self.batch)
            .map(|_| self.stream.next_window())
            .collect::<Result<_>>()?;
        Ok((
            causal_lm_loss(model, window_tensor(&windows, device)),
            self.batch * self.context,
        ))
    }

    fn eval_loss(&mut self, model: &LanguageModel, device: &Device) -> Result<f64> {
        let inner = device.clone().without_autodiff();
        let mut total = 0.0;
        for c in self.eval.chunks(self.batch) {
            let loss = causal_lm_loss(model, window_tensor(c, &inner)).into_scalar::<f32>() as f64;
            total += loss * c.len() as f64;
        }
        Ok(total / self.eval.len() as f64)
    }

    fn state(&self) -> LmState {
        self.stream.state()
    }

    fn restore(&mut self, state: LmState) -> Result<()> {
        self.stream.restore(state)
    }
}

/// Position of the masked-LM stream: the windows' position and the masking generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlmState {
    pub stream: LmState,
    pub rng: SplitMix64,
}

/// Masked LM (BERT's objective, the FLASH paper's C4 experiments): windows of `context` tokens,
/// 15% of them predicted (80% [MASK], 10% random, 10% kept); the loss counts predicted tokens only.
pub struct MaskedLmTask {
    stream: WindowStream,
    masking: BertMasking,
    batch: usize,
    context: usize,
    /// Held-out examples, masked once with their own seed so every evaluation sees the same masks.
    eval: Vec<MaskedExample>,
}

/// Seed offset of the held-out masks, so they never coincide with the training masks.
const EVAL_MASK_SEED: u64 = 0x5eed_e7a1;

impl MaskedLmTask {
    /// The first `eval_windows` windows of the eval files, masked once, are the held-out set;
    /// `seed` seeds the training masks.
    pub fn new(
        data: LmData,
        batch: usize,
        context: usize,
        eval_windows: usize,
        seed: u64,
    ) -> Result<Self> {
        let LmData {
            spec,
            train_files,
            eval_files,
            tok,
        } = data;
        let mut eval_masking = BertMasking::new(seed ^ EVAL_MASK_SEED);
        let eval = WindowStream::first_windows(spec, eval_files, &tok, context, eval_windows)?
            .iter()
            .map(|w| eval_masking.apply(w, &tok))
            .collect();
        Ok(Self {
            stream: WindowStream::new(spec, train_files, tok, context)?,
            masking: BertMasking::new(seed),
            batch,
            context,
            eval,
        })
    }

    /// (inputs, targets, predict) for a batch: targets are 0 where nothing is predicted (the
    /// weight `predict` is 0 there, so their value never counts).
    fn tensors(
        examples: &[MaskedExample],
        device: &Device,
    ) -> (Tensor<2, Int>, Tensor<2, Int>, Tensor<2>) {
        let inputs: Vec<Vec<i64>> = examples
            .iter()
            .map(|e| e.inputs.iter().map(|&x| x as i64).collect())
            .collect();
        let targets: Vec<Vec<i64>> = examples
            .iter()
            .map(|e| e.labels.iter().map(|&l| l.max(0)).collect())
            .collect();
        let (b, t) = (examples.len(), examples[0].labels.len());
        let predict: Vec<f32> = examples
            .iter()
            .flat_map(|e| {
                e.labels
                    .iter()
                    .map(|&l| if l == NO_LOSS { 0.0 } else { 1.0 })
            })
            .collect();
        (
            int_tensor(&inputs, device),
            int_tensor(&targets, device),
            Tensor::from_data(TensorData::new(predict, [b, t]), device),
        )
    }

    fn predicted(examples: &[MaskedExample]) -> usize {
        examples
            .iter()
            .map(|e| e.labels.iter().filter(|&&l| l != NO_LOSS).count())
            .sum()
    }
}

impl Task<LanguageModel> for MaskedLmTask {
    type State = MlmState;

    fn train_loss(&mut self, model: &LanguageModel, device: &Device) -> Result<(Tensor<1>, usize)> {
        let examples: Vec<MaskedExample> = (0..self.batch)
            .map(|_| {
                let w = self.stream.next_window()?;
                Ok(self.masking.apply(&w, self.stream.tokenizer()))
            })
            .collect::<Result<_>>()?;
        let (inputs, targets, predict) = Self::tensors(&examples, device);
        Ok((
            masked_lm_loss(model, inputs, targets, predict, None),
            self.batch * self.context,
        ))
    }

    /// Token-level: the mean loss over every predicted token of the held-out set.
    fn eval_loss(&mut self, model: &LanguageModel, device: &Device) -> Result<f64> {
        let inner = device.clone().without_autodiff();
        let (mut total, mut count) = (0.0, 0usize);
        for c in self.eval.chunks(self.batch) {
            let (inputs, targets, predict) = Self::tensors(c, &inner);
            let n = Self::predicted(c);
            let loss = masked_lm_loss(model, inputs, targets, predict, None).into_scalar::<f32>();
            total += loss as f64 * n as f64;
            count += n;
        }
        Ok(total / count.max(1) as f64)
    }

    fn state(&self) -> MlmState {
        MlmState {
            stream: self.stream.state(),
            rng: self.masking.rng,
        }
    }

    fn restore(&mut self, state: MlmState) -> Result<()> {
        self.masking.rng = state.rng;
        self.stream.restore(state.stream)
    }
}
