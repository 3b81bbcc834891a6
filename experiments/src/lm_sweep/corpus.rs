//! The sweep's data: the corpus's splits, the held-out split the verdicts read, the unigram reference.

use std::path::PathBuf;

use anyhow::{Result, bail};
use data::registry::{self, Split};
use data::source::{SourceOptions, split_files};
use data::tokenize::{self, TokenizerSpec};
use training::lm_task::LmData;

use super::config::{EvalSplit, LmSweepConfig};

/// The split a sweep's curves and verdicts read.
pub(super) fn eval_split(config: &LmSweepConfig) -> Split {
    match config.eval_split {
        EvalSplit::Validation => Split::Validation,
        EvalSplit::Test => Split::Test,
    }
}

/// The files of the selection split (validation) when the curves read test, else none.
pub(super) fn selection_files(config: &LmSweepConfig) -> Result<Vec<PathBuf>> {
    if config.eval_split == EvalSplit::Validation {
        return Ok(Vec::new());
    }
    let spec = registry::lookup(&config.dataset)?;
    split_files(
        spec,
        Split::Validation,
        &SourceOptions::from_config(&config.data_dir, &config.data_dirs)?,
    )
}

/// The perplexity of the unigram distribution of the held-out split's tokens on those tokens,
/// exp(−Σ p log p): what a model with no context at all, fitted to the held-out split itself,
/// scores (a reference the charts and tables print beside the models).
pub(super) fn unigram_ppl(data: &LmData) -> Result<f64> {
    let docs = data::source::ExampleStream::open_at(
        data.spec,
        data.eval_files.clone(),
        Default::default(),
    )?;
    // Ordered, so that the entropy sums in one order: the same digits on every run.
    let mut counts: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    let mut total = 0u64;
    for doc in docs {
        for id in data.tok.encode(&doc?.all_text())? {
            *counts.entry(id).or_default() += 1;
            total += 1;
        }
    }
    if total == 0 {
        bail!("the {} held-out split holds no tokens", data.spec.name);
    }
    let n = total as f64;
    let entropy: f64 = counts
        .values()
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.ln()
        })
        .sum();
    Ok(entropy.exp())
}

/// The data of a sweep: the dataset's train and held-out (`eval_split`) files and the tokenizer
/// (trained on the train split and saved under `tokenizers/` the first time).
pub fn sweep_data(config: &LmSweepConfig) -> Result<LmData> {
    let spec = registry::lookup(&config.dataset)?;
    let tokenizer: TokenizerSpec = config.tokenizer.parse()?;
    let source = SourceOptions::from_config(&config.data_dir, &config.data_dirs)?;
    let train_files = split_files(spec, Split::Train, &source)?;
    let eval_files = split_files(spec, eval_split(config), &source)?;
    let tok = tokenize::for_corpus(&tokenizer, spec, &train_files, &source)?;
    Ok(LmData {
        spec,
        train_files,
        eval_files,
        tok,
    })
}
