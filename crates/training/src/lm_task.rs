//! The causal-LM task of the FLASH experiments: documents packed into windows of `context + 1`
//! tokens (inputs and shifted targets), batches of `batch` windows, and a fixed held-out set.

use std::path::PathBuf;

use anyhow::{Result, bail};
use burn::tensor::{Device, Int, Tensor, TensorData};
use data::registry::DatasetSpec;
use data::source::{ExampleStream, StreamPosition};
use data::tasks::{PackState, Packer};
use data::tokenize::Tok;
use model::{LanguageModel, causal_lm_loss};
use serde::{Deserialize, Serialize};

use crate::trainer::Task;

/// Position in the training stream: epoch and packer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LmState {
    pub epoch: usize,
    pub pack: PackState,
}

pub struct CausalLmTask {
    spec: &'static DatasetSpec,
    files: Vec<PathBuf>,
    tok: Tok,
    batch: usize,
    context: usize,
    docs: ExampleStream,
    packer: Packer,
    epoch: usize,
    eval: Vec<Vec<u32>>,
}

impl CausalLmTask {
    /// `train_files`/`eval_files` are a split's files ([`data::source::split_files`]); the first
    /// `eval_windows` windows of the eval split are the held-out set.
    pub fn new(
        spec: &'static DatasetSpec,
        train_files: Vec<PathBuf>,
        eval_files: Vec<PathBuf>,
        tok: Tok,
        batch: usize,
        context: usize,
        eval_windows: usize,
    ) -> Result<Self> {
        let mut eval_docs = ExampleStream::open_at(spec, eval_files, StreamPosition::default())?;
        let mut eval_packer = Packer::new(context + 1, tok.eos_id());
        let mut eval = Vec::new();
        while eval.len() < eval_windows {
            match eval_packer.next_window(&mut eval_docs, &tok)? {
                Some(w) => eval.push(w),
                None => break,
            }
        }
        if eval.is_empty() {
            bail!(
                "the {} eval split holds less than one window of {} tokens",
                spec.name,
                context + 1
            );
        }
        let docs = ExampleStream::open_at(spec, train_files.clone(), StreamPosition::default())?;
        Ok(Self {
            spec,
            files: train_files,
            packer: Packer::new(context + 1, tok.eos_id()),
            tok,
            batch,
            context,
            docs,
            epoch: 0,
            eval,
        })
    }

    pub fn tokenizer(&self) -> &Tok {
        &self.tok
    }

    fn next_window(&mut self) -> Result<Vec<u32>> {
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
                    self.context + 1
                );
            }
            self.docs =
                ExampleStream::open_at(self.spec, self.files.clone(), StreamPosition::default())?;
            self.packer = Packer::new(self.context + 1, self.tok.eos_id());
        }
    }

    fn tensor(windows: &[Vec<u32>], device: &Device) -> Tensor<2, Int> {
        let (b, t) = (windows.len(), windows[0].len());
        let flat: Vec<i64> = windows.iter().flatten().map(|&x| x as i64).collect();
        Tensor::from_data(TensorData::new(flat, [b, t]), device)
    }
}

impl Task<LanguageModel> for CausalLmTask {
    type State = LmState;

    fn train_loss(&mut self, model: &LanguageModel, device: &Device) -> Result<(Tensor<1>, usize)> {
        let windows: Vec<Vec<u32>> = (0..self.batch)
            .map(|_| self.next_window())
            .collect::<Result<_>>()?;
        Ok((
            causal_lm_loss(model, Self::tensor(&windows, device)),
            self.batch * self.context,
        ))
    }

    fn eval_loss(&mut self, model: &LanguageModel, device: &Device) -> Result<f64> {
        let inner = device.clone().without_autodiff();
        let mut total = 0.0;
        let chunks: Vec<&[Vec<u32>]> = self.eval.chunks(self.batch).collect();
        for c in &chunks {
            let loss = causal_lm_loss(model, Self::tensor(c, &inner)).into_scalar::<f32>() as f64;
            total += loss * c.len() as f64;
        }
        Ok(total / self.eval.len() as f64)
    }

    fn state(&self) -> LmState {
        LmState {
            epoch: self.epoch,
            pack: self.packer.state(),
        }
    }

    fn restore(&mut self, state: LmState) -> Result<()> {
        self.epoch = state.epoch;
        self.docs = ExampleStream::open_at(self.spec, self.files.clone(), state.pack.doc)?;
        self.packer = Packer::resume(self.context + 1, self.tok.eos_id(), state.pack);
        Ok(())
    }
}
