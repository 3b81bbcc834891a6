//! Task builders: token windows for causal LM, BERT masking for masked LM, T5 span corruption, and
//! seq2seq/QA pairs. Each is deterministic given its seed and has a serialisable state; restoring a
//! state (and reopening the example stream at the state's position) continues the identical stream.

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::example::Example;
use crate::rng::SplitMix64;
use crate::source::{ExampleStream, StreamPosition};
use crate::tokenize::Tok;

/// A stream of examples that knows where it is.
pub trait Documents: Iterator<Item = Result<Example>> {
    /// Position of the next example.
    fn stream_position(&self) -> StreamPosition;
}

impl Documents for ExampleStream {
    fn stream_position(&self) -> StreamPosition {
        ExampleStream::position(self)
    }
}

/// Where a packer is: the document the next window starts in, and the token offset inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PackState {
    pub doc: StreamPosition,
    pub offset: usize,
}

/// Concatenates tokenized documents, each followed by a separator (EOS), and cuts fixed windows
/// (the FLASH paper's LM setting; T5's span-corruption inputs are packed the same way).
pub struct Packer {
    window: usize,
    separator: u32,
    buffer: Vec<u32>,
    buffer_doc: StreamPosition,
    offset: usize,
    resume_offset: Option<usize>,
}

impl Packer {
    pub fn new(window: usize, separator: u32) -> Self {
        Self::resume(window, separator, PackState::default())
    }

    /// Continues from `state`; the documents must be reopened at `state.doc`.
    pub fn resume(window: usize, separator: u32, state: PackState) -> Self {
        assert!(window > 0, "window must be positive");
        Self {
            window,
            separator,
            buffer: Vec::new(),
            buffer_doc: state.doc,
            offset: 0,
            resume_offset: Some(state.offset),
        }
    }

    pub fn state(&self) -> PackState {
        PackState {
            doc: self.buffer_doc,
            offset: self.offset.max(self.resume_offset.unwrap_or(0)),
        }
    }

    /// The next window of `window` tokens, or `None` when the documents run out (a partial last
    /// window is dropped).
    pub fn next_window(
        &mut self,
        docs: &mut impl Documents,
        tok: &Tok,
    ) -> Result<Option<Vec<u32>>> {
        let mut out = Vec::with_capacity(self.window);
        while out.len() < self.window {
            if self.offset >= self.buffer.len() || self.buffer.is_empty() {
                let at = docs.stream_position();
                let Some(example) = docs.next().transpose()? else {
                    return Ok(None);
                };
                self.buffer = tok.encode(&example.all_text())?;
                self.buffer.push(self.separator);
                self.buffer_doc = at;
                self.offset = self
                    .resume_offset
                    .take()
                    .unwrap_or(0)
                    .min(self.buffer.len());
                continue;
            }
            let take = (self.window - out.len()).min(self.buffer.len() - self.offset);
            out.extend_from_slice(&self.buffer[self.offset..self.offset + take]);
            self.offset += take;
        }
        Ok(Some(out))
    }
}

/// Label of positions that carry no loss.
pub const NO_LOSS: i64 = -100;

/// Masked-LM inputs, as BERT's `create_pretraining_data.py`: `round(0.15 · n)` non-special
/// positions chosen uniformly without replacement; of those 80% → mask, 10% → a random
/// non-special token, 10% unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BertMasking {
    pub rng: SplitMix64,
    /// Fraction of tokens predicted (BERT: 0.15).
    pub mask_rate_per_mille: u32,
}

/// One masked-LM example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskedExample {
    pub inputs: Vec<u32>,
    /// The original token at predicted positions, [`NO_LOSS`] elsewhere.
    pub labels: Vec<i64>,
}

impl BertMasking {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: SplitMix64::new(seed),
            mask_rate_per_mille: 150,
        }
    }

    pub fn apply(&mut self, tokens: &[u32], tok: &Tok) -> MaskedExample {
        let mut candidates: Vec<usize> = (0..tokens.len())
            .filter(|&i| !tok.is_special(tokens[i]))
            .collect();
        let n = ((tokens.len() as u64 * self.mask_rate_per_mille as u64 + 500) / 1000) as usize;
        let n = n.clamp(1, candidates.len().max(1)).min(candidates.len());
        self.rng.shuffle(&mut candidates);
        let mut inputs = tokens.to_vec();
        let mut labels = vec![NO_LOSS; tokens.len()];
        let (lo, hi) = (3u64, (tok.vocab_size() - crate::tokenize::SENTINELS) as u64);
        for &i in &candidates[..n] {
            labels[i] = tokens[i] as i64;
            let r = self.rng.next_f64();
            if r < 0.8 {
                inputs[i] = tok.mask_id();
            } else if r < 0.9 {
                inputs[i] = (lo + self.rng.below(hi - lo)) as u32;
            }
        }
        MaskedExample { inputs, labels }
    }
}

/// T5's `compute_input_and_target_lengths`: the raw window length that corrupts to exactly
/// `inputs_length` tokens, and the resulting target length (512, 0.15, 3 → 568 raw, 114 targets).
pub fn t5_span_lengths(inputs_length: usize, noise_density: f64, mean_span: f64) -> (usize, usize) {
    let lengths = |tokens: usize| {
        let noise = (tokens as f64 * noise_density).round() as usize;
        let spans = (noise as f64 / mean_span).round() as usize;
        (tokens - noise + spans + 1, noise + spans + 1)
    };
    let mut tokens = inputs_length - 1;
    while lengths(tokens + 1).0 <= inputs_length {
        tokens += 1;
    }
    (tokens, lengths(tokens).1)
}

/// T5 span corruption (`random_spans_noise_mask` + `noise_span_to_unique_sentinel`): the window is
/// split into alternating non-noise/noise spans, starting with non-noise, with random lengths of
/// the right totals; each noise span becomes one sentinel in the inputs (`<extra_id_0>` first,
/// counting down from the top id) and the targets are each sentinel followed by its span, then EOS.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanCorruption {
    pub rng: SplitMix64,
    pub noise_density: f64,
    pub mean_span: f64,
}

/// What a corrupted window's targets are (T5 paper, Raffel et al. 2020, §3.3.1 and Table 4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PretrainObjective {
    /// T5's objective (and T5.1.1's, which the GQA paper starts from): each sentinel followed by
    /// the tokens it replaced. The targets are exactly what the inputs lack, so nothing in it asks
    /// the model to copy its input.
    #[default]
    SpanCorruption,
    /// The same corrupted inputs with the whole original window as the target (the paper's
    /// "BERT-style" / reconstruction variant): most target tokens are copies of input tokens, so
    /// pre-training also teaches copying, which a small model does not learn from fine-tuning alone
    /// (`results/gqa_pilot`, pilot 3).
    Reconstruct,
}

impl PretrainObjective {
    /// Target tokens of one window corrupted to `input_length` inputs at T5's noise density 0.15
    /// and mean span 3 (EOS included): what [`SpanCorruption::apply_objective`] produces.
    pub fn target_length(self, input_length: usize) -> usize {
        let (raw, targets) = t5_span_lengths(input_length, 0.15, 3.0);
        match self {
            PretrainObjective::SpanCorruption => targets,
            PretrainObjective::Reconstruct => raw + 1,
        }
    }
}

/// `len` ids drawn uniformly from `tok`'s non-special ids: sequences in which every position is
/// (almost surely) a unique anchor, the easiest thing for a small T5 to learn to copy.
pub fn random_tokens(rng: &mut SplitMix64, len: usize, tok: &Tok) -> Vec<u32> {
    let vocab = tok.vocab_size() as u64;
    (0..len)
        .map(|_| {
            loop {
                let id = rng.below(vocab) as u32;
                if !tok.is_special(id) {
                    break id;
                }
            }
        })
        .collect()
}

/// A plain copying example (no corruption): `len` [`random_tokens`], EOS-terminated, as both input
/// and target. The copy warm-up of the GQA cpu pipeline trains on these before pre-training
/// (`results/gqa_pilot`, pilot 7).
pub fn random_copy_example(rng: &mut SplitMix64, len: usize, tok: &Tok) -> SpanExample {
    let mut tokens = random_tokens(rng, len, tok);
    tokens.push(tok.eos_id());
    SpanExample {
        inputs: tokens.clone(),
        targets: tokens,
    }
}

/// Inputs and targets of one corrupted window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanExample {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
}

impl SpanCorruption {
    /// T5's defaults: noise density 0.15, mean noise span 3.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: SplitMix64::new(seed),
            noise_density: 0.15,
            mean_span: 3.0,
        }
    }

    /// `num_items` split into `num_segments` random positive lengths (T5's `_random_segmentation`).
    fn random_segmentation(&mut self, num_items: usize, num_segments: usize) -> Vec<usize> {
        let mut first = vec![false; num_items - 1];
        for f in first.iter_mut().take(num_segments - 1) {
            *f = true;
        }
        self.rng.shuffle(&mut first);
        let mut lengths = vec![1usize];
        for f in first {
            if f {
                lengths.push(1);
            } else {
                *lengths.last_mut().expect("non-empty") += 1;
            }
        }
        lengths
    }

    /// Boolean noise mask of length `n` (true = noise).
    pub fn noise_mask(&mut self, n: usize) -> Vec<bool> {
        let noise = ((n as f64 * self.noise_density).round() as usize).clamp(1, n - 1);
        let spans = ((noise as f64 / self.mean_span).round() as usize).max(1);
        let noise_lengths = self.random_segmentation(noise, spans);
        let keep_lengths = self.random_segmentation(n - noise, spans);
        let mut mask = Vec::with_capacity(n);
        for (k, z) in keep_lengths.iter().zip(&noise_lengths) {
            mask.extend(std::iter::repeat_n(false, *k));
            mask.extend(std::iter::repeat_n(true, *z));
        }
        mask
    }

    /// The corrupted window with the targets `objective` asks for.
    pub fn apply_objective(
        &mut self,
        tokens: &[u32],
        tok: &Tok,
        objective: PretrainObjective,
    ) -> SpanExample {
        let mut example = self.apply(tokens, tok);
        if objective == PretrainObjective::Reconstruct {
            example.targets = tokens.iter().copied().chain([tok.eos_id()]).collect();
        }
        example
    }

    /// A synthetic copying example: `len` ids drawn uniformly from the non-special ids, corrupted
    /// like a window, with the whole drawn sequence as the target (the reconstruction target
    /// whatever the run's objective). Random tokens give every position a unique anchor: a small T5
    /// learns to copy 16–32 of them in a few hundred steps, sooner than it learns from text, but
    /// not 145 within 1500 steps (`results/gqa_pilot`, pilot 6).
    pub fn random_copy(&mut self, len: usize, tok: &Tok) -> SpanExample {
        let tokens = random_tokens(&mut self.rng, len, tok);
        self.apply_objective(&tokens, tok, PretrainObjective::Reconstruct)
    }

    pub fn apply(&mut self, tokens: &[u32], tok: &Tok) -> SpanExample {
        let mask = self.noise_mask(tokens.len());
        let (mut inputs, mut targets) = (Vec::new(), Vec::new());
        let mut span = 0;
        for (i, (&t, &noise)) in tokens.iter().zip(&mask).enumerate() {
            let starts_span = noise && (i == 0 || !mask[i - 1]);
            if starts_span {
                let sentinel = tok.sentinel_id(span.min(crate::tokenize::SENTINELS - 1));
                inputs.push(sentinel);
                targets.push(sentinel);
                span += 1;
            }
            if noise {
                targets.push(t);
            } else {
                inputs.push(t);
            }
        }
        inputs.push(tok.eos_id());
        targets.push(tok.eos_id());
        SpanExample { inputs, targets }
    }
}

/// A tokenized seq2seq example; `references` keeps every acceptable answer text for scoring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seq2SeqExample {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
    pub references: Vec<String>,
}

/// Formats and truncates seq2seq and QA examples to a task's input/output lengths (the GQA paper's
/// fine-tuning setting), each ending with EOS. QA inputs are `question: Q context: C` (T5's
/// TriviaQA format); the target is the first answer and all answers are kept as references.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seq2SeqTask {
    pub input_length: usize,
    pub target_length: usize,
}

impl Seq2SeqTask {
    pub fn build(&self, example: &Example, tok: &Tok) -> Result<Seq2SeqExample> {
        let (source, target, references) = match example {
            Example::Seq2Seq { source, target } => {
                (source.clone(), target.clone(), vec![target.clone()])
            }
            Example::Qa {
                question,
                context,
                answers,
            } => (
                qa_input(question, context),
                answers.first().cloned().unwrap_or_default(),
                answers.clone(),
            ),
            Example::Text { text } => (text.clone(), String::new(), Vec::new()),
        };
        let cut = |text: &str, len: usize| -> Result<Vec<u32>> {
            let mut ids = tok.encode(text)?;
            ids.truncate(len.saturating_sub(1));
            ids.push(tok.eos_id());
            Ok(ids)
        };
        Ok(Seq2SeqExample {
            inputs: cut(&source, self.input_length)?,
            targets: cut(&target, self.target_length)?,
            references,
        })
    }
}

/// T5's TriviaQA input format.
pub fn qa_input(question: &str, context: &str) -> String {
    format!("question: {question} context: {context}")
}
