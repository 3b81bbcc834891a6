//! A training split read epoch after epoch, each epoch's order shuffled through a bounded buffer
//! seeded by the run (as `tf.data`'s `shuffle`, which T5's fine-tuning reads through), and resumable
//! exactly from a saved (epoch, examples taken) without keeping the buffer in the checkpoint.

use std::path::PathBuf;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::example::Example;
use crate::registry::DatasetSpec;
use crate::rng::SplitMix64;
use crate::source::{ExampleStream, StreamPosition};

/// seqio's default shuffle buffer (`seqio.SHUFFLE_BUFFER_SIZE`, 1,000 examples), the one T5 and the
/// GQA paper's t5x fine-tuning read their tasks through; the papers do not state theirs.
pub const DEFAULT_SHUFFLE_BUFFER: usize = 1000;

/// Where an [`EpochStream`] is: the epoch and how many examples it has given in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EpochState {
    pub epoch: usize,
    pub taken: usize,
}

/// How an [`EpochStream`] orders each epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shuffle {
    /// Examples held at once; each draw takes one of them at random and the next example of the
    /// files takes its place. 1 keeps the files' order.
    pub buffer: usize,
    /// The run's seed; epoch e draws with a generator seeded from (seed, e).
    pub seed: u64,
}

pub struct EpochStream {
    spec: &'static DatasetSpec,
    files: Vec<PathBuf>,
    shuffle: Shuffle,
    docs: ExampleStream,
    buffer: Vec<Example>,
    rng: SplitMix64,
    state: EpochState,
}

impl EpochStream {
    pub fn open(spec: &'static DatasetSpec, files: Vec<PathBuf>, shuffle: Shuffle) -> Result<Self> {
        if shuffle.buffer == 0 {
            bail!("shuffle buffer 0: give at least 1 (1 keeps the files' order)");
        }
        Ok(Self {
            docs: ExampleStream::open_at(spec, files.clone(), StreamPosition::default())?,
            rng: Self::epoch_rng(shuffle.seed, 0),
            spec,
            files,
            shuffle,
            buffer: Vec::with_capacity(shuffle.buffer),
            state: EpochState::default(),
        })
    }

    /// Epoch `epoch`'s generator: the run's seed and the epoch mixed, so that epochs differ.
    fn epoch_rng(seed: u64, epoch: usize) -> SplitMix64 {
        let mut mix = SplitMix64::new(seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        SplitMix64::new(mix.next_u64())
    }

    /// The next example: a random one of the buffer, refilled from the files; a new epoch when the
    /// files and the buffer are exhausted.
    pub fn next_example(&mut self) -> Result<Example> {
        loop {
            while self.buffer.len() < self.shuffle.buffer {
                match self.docs.next().transpose()? {
                    Some(e) => self.buffer.push(e),
                    None => break,
                }
            }
            if !self.buffer.is_empty() {
                let i = self.rng.below(self.buffer.len() as u64) as usize;
                self.state.taken += 1;
                // swap_remove keeps the draw O(1); which slot refills is part of the seeded order.
                return Ok(self.buffer.swap_remove(i));
            }
            if self.state.taken == 0 {
                bail!("the {} train split holds no examples", self.spec.name);
            }
            self.start_epoch(self.state.epoch + 1)?;
        }
    }

    fn start_epoch(&mut self, epoch: usize) -> Result<()> {
        self.docs =
            ExampleStream::open_at(self.spec, self.files.clone(), StreamPosition::default())?;
        self.buffer.clear();
        self.rng = Self::epoch_rng(self.shuffle.seed, epoch);
        self.state = EpochState { epoch, taken: 0 };
        Ok(())
    }

    pub fn state(&self) -> EpochState {
        self.state
    }

    /// Back to `state`: its epoch replayed from the start up to the examples already taken (the
    /// order is a function of the seed, the epoch and the files, so the replay is exact).
    pub fn restore(&mut self, state: EpochState) -> Result<()> {
        self.start_epoch(state.epoch)?;
        for _ in 0..state.taken {
            self.next_example()?;
        }
        Ok(())
    }
}
