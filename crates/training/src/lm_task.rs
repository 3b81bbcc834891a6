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

/// The order in which a training stream hands out its windows.
///
/// The corpora the papers train on (C4, Wiki-40B, PG-19) are read shuffled; the offline corpus is a
/// few dozen books in file order, so a stream in file order reads book after book, every seed the
/// same windows at the same step, and every model's held-out loss moves with the book it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WindowOrder {
    /// The split's documents packed in file order, epoch after epoch in the same order.
    #[default]
    File,
    /// The windows of each block of `block_tokens` consecutive tokens (packed in file order) handed
    /// out in a permutation drawn from the run's seed, the epoch and the block: a split no larger
    /// than one block is permuted whole, every epoch anew. A resumed stream re-reads its block
    /// and draws the same permutation, so it hands out the same windows as one never stopped.
    Shuffled {
        /// Tokens per shuffled block (its windows are held in memory: 4 bytes a token).
        block_tokens: usize,
    },
}

impl WindowOrder {
    /// The default block of [`WindowOrder::Shuffled`]: 2^24 tokens (64 MiB of windows), more than
    /// the offline corpus's whole train split (so each of its epochs is one permutation), and a
    /// local shuffle over 16.8M tokens of a hub corpus, whose files are shuffled already (C4) or
    /// whole books (PG-19).
    pub const DEFAULT_BLOCK_TOKENS: usize = 1 << 24;

    /// Shuffled in blocks of [`Self::DEFAULT_BLOCK_TOKENS`].
    pub fn shuffled() -> Self {
        WindowOrder::Shuffled {
            block_tokens: Self::DEFAULT_BLOCK_TOKENS,
        }
    }
}

/// Where a shuffled stream is inside its current block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    /// The packer's state where the block starts.
    pub start: PackState,
    /// The block's index in its epoch (part of its permutation's seed).
    pub index: usize,
    /// Windows of the block already handed out.
    pub taken: usize,
}

/// Position in the training stream: epoch and packer state, and for a shuffled stream its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LmState {
    pub epoch: usize,
    pub pack: PackState,
    /// Absent in file order.
    #[serde(default)]
    pub block: Option<BlockState>,
}

/// The windows of one shuffled block, in the order they are handed out.
struct Block {
    state: BlockState,
    windows: Vec<Vec<u32>>,
    /// The split ended while the block was read: the next block starts the next epoch.
    last_of_epoch: bool,
}

/// A split's documents packed into windows of `window` tokens, epoch after epoch, resumable, in
/// file order or shuffled ([`WindowOrder`]).
pub struct WindowStream {
    spec: &'static DatasetSpec,
    files: Vec<PathBuf>,
    tok: Tok,
    window: usize,
    docs: ExampleStream,
    packer: Packer,
    epoch: usize,
    order: WindowOrder,
    seed: u64,
    /// The current block of a shuffled stream (read at the first window).
    block: Option<Block>,
}

impl WindowStream {
    /// A stream in file order.
    pub fn new(
        spec: &'static DatasetSpec,
        files: Vec<PathBuf>,
        tok: Tok,
        window: usize,
    ) -> Result<Self> {
        Self::ordered(spec, files, tok, window, WindowOrder::File, 0)
    }

    /// A stream in `order`; `seed` draws a shuffled stream's permutations.
    pub fn ordered(
        spec: &'static DatasetSpec,
        files: Vec<PathBuf>,
        tok: Tok,
        window: usize,
        order: WindowOrder,
        seed: u64,
    ) -> Result<Self> {
        if let WindowOrder::Shuffled { block_tokens } = order
            && block_tokens < window
        {
            bail!(
                "a shuffled stream's block_tokens ({block_tokens}) must hold at least one window of {window} tokens"
            );
        }
        let docs = ExampleStream::open_at(spec, files.clone(), StreamPosition::default())?;
        Ok(Self {
            spec,
            files,
            packer: Packer::new(window, tok.eos_id()),
            tok,
            window,
            docs,
            epoch: 0,
            order,
            seed,
            block: None,
        })
    }

    /// The same split from its start in `order`, drawn with `seed`.
    pub fn reordered(self, order: WindowOrder, seed: u64) -> Result<Self> {
        Self::ordered(self.spec, self.files, self.tok, self.window, order, seed)
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

    /// The next window in file order; at the end of the split, the next epoch from its start (the
    /// packer's leftover is dropped).
    fn next_in_file_order(&mut self) -> Result<Option<Vec<u32>>> {
        self.packer.next_window(&mut self.docs, &self.tok)
    }

    fn start_epoch(&mut self, epoch: usize) -> Result<()> {
        self.epoch = epoch;
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
        Ok(())
    }

    pub fn next_window(&mut self) -> Result<Vec<u32>> {
        if let WindowOrder::Shuffled { block_tokens } = self.order {
            return self.next_shuffled(block_tokens);
        }
        loop {
            if let Some(w) = self.next_in_file_order()? {
                return Ok(w);
            }
            self.start_epoch(self.epoch + 1)?;
        }
    }

    /// Reads the block that starts at the packer's present state (`index` in its epoch) and draws
    /// its permutation; the packer is left after the block.
    fn read_block(&mut self, block_tokens: usize, index: usize, taken: usize) -> Result<Block> {
        let start = self.packer.state();
        let capacity = (block_tokens / self.window).max(1);
        let mut windows = Vec::with_capacity(capacity.min(1 << 16));
        let mut last_of_epoch = false;
        while windows.len() < capacity {
            match self.next_in_file_order()? {
                Some(w) => windows.push(w),
                None => {
                    last_of_epoch = true;
                    break;
                }
            }
        }
        // One generator per (seed, epoch, block): a block's permutation does not depend on how
        // many windows the blocks before it held.
        let mut rng = SplitMix64::new(
            self.seed
                ^ (self.epoch as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                ^ (index as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f),
        );
        rng.shuffle(&mut windows);
        Ok(Block {
            state: BlockState {
                start,
                index,
                taken,
            },
            windows,
            last_of_epoch,
        })
    }

    fn next_shuffled(&mut self, block_tokens: usize) -> Result<Vec<u32>> {
        loop {
            if let Some(block) = &mut self.block
                && block.state.taken < block.windows.len()
            {
                let w = std::mem::take(&mut block.windows[block.state.taken]);
                block.state.taken += 1;
                return Ok(w);
            }
            let index = match self.block.take() {
                None => 0,
                Some(done) if done.last_of_epoch => {
                    self.start_epoch(self.epoch + 1)?;
                    0
                }
                Some(done) => done.state.index + 1,
            };
            self.block = Some(self.read_block(block_tokens, index, 0)?);
            if self.block.as_ref().is_some_and(|b| b.windows.is_empty()) {
                // The split ended exactly at a block's edge: the next epoch.
                self.start_epoch(self.epoch + 1)?;
                self.block = None;
            }
        }
    }

    pub fn state(&self) -> LmState {
        match &self.block {
            Some(b) => LmState {
                epoch: self.epoch,
                pack: b.state.start,
                block: Some(b.state),
            },
            None => LmState {
                epoch: self.epoch,
                pack: self.packer.state(),
                block: None,
            },
        }
    }

    pub fn restore(&mut self, state: LmState) -> Result<()> {
        self.epoch = state.epoch;
        self.docs = ExampleStream::open_at(self.spec, self.files.clone(), state.pack.doc)?;
        self.packer = Packer::resume(self.window, self.tok.eos_id(), state.pack);
        self.block = None;
        match (self.order, state.block) {
            (WindowOrder::Shuffled { block_tokens }, Some(b)) => {
                let block = self.read_block(block_tokens, b.index, b.taken)?;
                if b.taken > block.windows.len() {
                    bail!(
                        "the saved stream position is past the end of its block ({} of {} windows): the split's files changed since the checkpoint",
                        b.taken,
                        block.windows.len()
                    );
                }
                self.block = Some(block);
            }
            (WindowOrder::Shuffled { .. }, None) | (WindowOrder::File, None) => {}
            (WindowOrder::File, Some(_)) => {
                bail!(
                    "the checkpoint is of a shuffled stream, this run reads the split in file order"
                )
            }
        }
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
    /// Held-out windows of the split that choices (learning rates, chunk sizes) read, evaluated
    /// at the end of a run ([`Task::select_loss`]); empty: none.
    select: Vec<Vec<u32>>,
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
            select: Vec::new(),
        })
    }

    /// The training windows in `order`, drawn with `seed` (the run's seed, so that seeds differ in
    /// data order too).
    pub fn with_order(mut self, order: WindowOrder, seed: u64) -> Result<Self> {
        self.stream = self.stream.reordered(order, seed)?;
        Ok(self)
    }

    /// The first `windows` windows of `files` (the validation split, where the held-out set is
    /// the test split) are the selection set, evaluated at the end of a run.
    pub fn with_selection(
        mut self,
        spec: &'static DatasetSpec,
        files: Vec<PathBuf>,
        windows: usize,
    ) -> Result<Self> {
        let tok = self.stream.tokenizer();
        self.select = WindowStream::first_windows(spec, files, tok, self.context + 1, windows)?;
        Ok(self)
    }

    pub fn tokenizer(&self) -> &Tok {
        self.stream.tokenizer()
    }

    fn mean_loss(&self, windows: &[Vec<u32>], model: &LanguageModel, device: &Device) -> f64 {
        let inner = device.clone().without_autodiff();
        let mut total = 0.0;
        for c in windows.chunks(self.batch) {
            let loss = causal_lm_loss(model, window_tensor(c, &inner)).into_scalar::<f32>() as f64;
            total += loss * c.len() as f64;
        }
        total / windows.len() as f64
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
        Ok(self.mean_loss(&self.eval, model, device))
    }

    fn select_loss(&mut self, model: &LanguageModel, device: &Device) -> Result<Option<f64>> {
        Ok((!self.select.is_empty()).then(|| self.mean_loss(&self.select, model, device)))
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
    /// The selection set ([`CausalLmTask`]'s), masked once like `eval`; empty: none.
    select: Vec<MaskedExample>,
    /// The training masks' seed (the held-out masks derive from it).
    seed: u64,
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
            select: Vec::new(),
            seed,
        })
    }

    /// The training windows in `order`, drawn with the task's seed.
    pub fn with_order(mut self, order: WindowOrder) -> Result<Self> {
        self.stream = self.stream.reordered(order, self.seed)?;
        Ok(self)
    }

    /// As [`CausalLmTask::with_selection`], masked once with the held-out masks' seed.
    pub fn with_selection(
        mut self,
        spec: &'static DatasetSpec,
        files: Vec<PathBuf>,
        windows: usize,
    ) -> Result<Self> {
        let tok = self.stream.tokenizer();
        let mut masking = BertMasking::new(self.seed ^ EVAL_MASK_SEED);
        self.select = WindowStream::first_windows(spec, files, tok, self.context, windows)?
            .iter()
            .map(|w| masking.apply(w, tok))
            .collect();
        Ok(self)
    }

    /// Token-level: the mean loss over every predicted token of `examples`.
    fn mean_loss(&self, examples: &[MaskedExample], model: &LanguageModel, device: &Device) -> f64 {
        let inner = device.clone().without_autodiff();
        let (mut total, mut count) = (0.0, 0usize);
        for c in examples.chunks(self.batch) {
            let (inputs, targets, predict) = Self::tensors(c, &inner);
            let n = Self::predicted(c);
            let loss = masked_lm_loss(model, inputs, targets, predict, None).into_scalar::<f32>();
            total += loss as f64 * n as f64;
            count += n;
        }
        total / count.max(1) as f64
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
        Ok(self.mean_loss(&self.eval, model, device))
    }

    fn select_loss(&mut self, model: &LanguageModel, device: &Device) -> Result<Option<f64>> {
        Ok((!self.select.is_empty()).then(|| self.mean_loss(&self.select, model, device)))
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
