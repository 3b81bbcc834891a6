//! The pipeline's scores: one row per model, task and seed (`scores.csv`), the trivial baselines
//! (`baselines.csv`: copying the input, the most frequent answer), read back and averaged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use training::lm_task::LmData;
use training::write_atomic;

use super::config::{TaskConfig, TaskMetric};

/// One row of `scores.csv`: a model on a task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScoreRow {
    pub model: String,
    pub size: String,
    /// K/V heads of the decoder.
    pub kv_heads: usize,
    pub conversion: String,
    pub alpha: f64,
    /// The replicate's seed (conversion, uptraining, fine-tuning); absent from files written
    /// before replicates existed, which had one, with the pre-training seed 0.
    #[serde(default)]
    pub seed: u64,
    pub task: String,
    pub metric: String,
    /// The task's score ×100.
    pub score: f64,
    /// Held-out loss after fine-tuning.
    pub eval_loss: f64,
    /// Seconds per sample of greedy decoding (encoder included), batch `inference_batch`, every
    /// sample decoding the task's full `target_length` (see `time_per_sample`).
    pub s_per_sample: f64,
    /// Held-out span-corruption loss right after conversion (α = 0), before any uptraining;
    /// empty for a multi-head model. All span losses are on uptraining's held-out windows.
    #[serde(default)]
    pub span_loss_converted: Option<f64>,
    /// Held-out span-corruption loss of the model fine-tuning starts from (pre-trained, or
    /// converted and uptrained).
    #[serde(default)]
    pub span_loss: Option<f64>,
    /// Examples scored.
    pub examples: usize,
    /// The fine-tuning step of the scored model (the best held-out evaluation's with
    /// `keep = "best_eval"`, else the last); absent from files written before it was recorded.
    #[serde(default)]
    pub finetune_step: Option<usize>,
    pub device: String,
}

/// One row of `baselines.csv`: a trivial predictor's score on a task's scored examples, the floor
/// a fine-tuned model must clear before its score says anything.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BaselineRow {
    pub task: String,
    pub metric: String,
    /// [`COPY_INPUT`] or [`MOST_FREQUENT`].
    pub baseline: String,
    /// The score ×100.
    pub score: f64,
}

/// The copying baseline: every example's input (the source; a QA example's context), cut to the
/// task's output length in tokens: what a model that copies its input could write.
pub const COPY_INPUT: &str = "copy input";
/// The constant baseline: the most frequent target (a QA example's first answer) of the first
/// [`BASELINE_TRAIN_EXAMPLES`] training examples, written for every example.
pub const MOST_FREQUENT: &str = "most frequent answer";
/// Training examples counted for [`MOST_FREQUENT`].
pub(super) const BASELINE_TRAIN_EXAMPLES: usize = 5000;

/// The trivial baselines of `task` on the examples the models are scored on (`references`: the
/// first `references.len()` examples of the eval split, as [`first_examples`] reads them).
pub(super) fn trivial_baselines(
    task: &TaskConfig,
    data: &LmData,
    references: &[Vec<String>],
) -> Result<Vec<BaselineRow>> {
    use data::example::Example;
    use data::source::ExampleStream;
    let read = |files: &[PathBuf], n: usize| -> Result<Vec<Example>> {
        ExampleStream::open_at(data.spec, files.to_vec(), Default::default())?
            .take(n)
            .collect()
    };
    let parts = |e: &Example| -> (String, String) {
        match e {
            Example::Seq2Seq { source, target } => (source.clone(), target.clone()),
            Example::Qa {
                context, answers, ..
            } => (
                context.clone(),
                answers.first().cloned().unwrap_or_default(),
            ),
            Example::Text { text } => (text.clone(), String::new()),
        }
    };
    let copies: Vec<String> = read(&data.eval_files, references.len())?
        .iter()
        .map(|e| {
            let mut ids = data.tok.encode(&parts(e).0)?;
            ids.truncate(task.target_length.saturating_sub(1));
            data.tok.decode(&ids)
        })
        .collect::<Result<_>>()?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for e in read(&data.train_files, BASELINE_TRAIN_EXAMPLES)? {
        *counts.entry(parts(&e).1).or_default() += 1;
    }
    // The most frequent target; the first in sorted order among equals, so it is deterministic.
    let frequent = counts
        .iter()
        .fold(None, |best: Option<(&String, usize)>, (t, &n)| match best {
            Some((_, m)) if m >= n => best,
            _ => Some((t, n)),
        })
        .map(|(t, _)| t.clone())
        .with_context(|| format!("the {} train split holds no examples", task.dataset))?;
    let constant = vec![frequent; references.len()];
    Ok([(COPY_INPUT, copies), (MOST_FREQUENT, constant)]
        .into_iter()
        .map(|(baseline, predictions)| BaselineRow {
            task: task.name.clone(),
            metric: format!("{:?}", task.metric).to_lowercase(),
            baseline: baseline.into(),
            score: score(task.metric, &predictions, references),
        })
        .collect())
}

pub(super) fn write_scores(out: &Path, rows: &[ScoreRow]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)?;
    }
    write_atomic(&out.join("scores.csv"), &w.into_inner()?)
}

/// Reads `<dir>/scores.csv`.
pub fn read_scores(dir: &Path) -> Result<Vec<ScoreRow>> {
    crate::read_csv(&dir.join("scores.csv"))
}

/// One model's average score over the tasks (the paper's "Average" column), per seed: `rows` are
/// that model's rows.
pub fn average_scores(rows: &[&ScoreRow]) -> BTreeMap<u64, f64> {
    let mut by_seed: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for r in rows {
        by_seed.entry(r.seed).or_default().push(r.score);
    }
    by_seed
        .into_iter()
        .map(|(seed, xs)| (seed, xs.iter().sum::<f64>() / xs.len() as f64))
        .collect()
}

/// Scores `predictions` against the held-out references with the task's metric (×100).
pub(super) fn score(metric: TaskMetric, predictions: &[String], references: &[Vec<String>]) -> f64 {
    use metrics::{bleu, rouge, triviaqa};
    match metric {
        TaskMetric::Rouge1 => {
            let pairs = references
                .iter()
                .zip(predictions)
                .map(|(r, p)| (r[0].as_str(), p.as_str()));
            rouge::corpus(pairs, rouge::RougeOptions::default()).rouge1
        }
        TaskMetric::Bleu | TaskMetric::BleuIntl => {
            let segments = predictions
                .iter()
                .zip(references)
                .map(|(p, r)| (p.as_str(), r.iter().map(String::as_str).collect::<Vec<_>>()));
            let tokenizer = match metric {
                TaskMetric::BleuIntl => bleu::BleuTokenizer::Intl,
                _ => bleu::BleuTokenizer::Thirteen,
            };
            bleu::corpus(segments, tokenizer).bleu
        }
        TaskMetric::F1 => {
            let questions = predictions.iter().zip(references).map(|(p, r)| {
                (
                    Some(p.as_str()),
                    r.iter().map(String::as_str).collect::<Vec<_>>(),
                )
            });
            triviaqa::corpus(questions).f1
        }
    }
}

#[cfg(test)]
mod metric_tests {
    use super::*;

    /// The two BLEU metrics differ only in sacrebleu's tokenizer: `intl` splits Unicode
    /// punctuation off letters (here the German quotes), 13a does not, so only `intl` finds the
    /// hypothesis equal to the reference.
    #[test]
    fn wmt_bleu_uses_the_intl_tokenizer() {
        let refs = vec![vec!["Er sagte heute „ Hallo “ zu uns".to_string()]];
        let hyp = vec!["Er sagte heute „Hallo“ zu uns".to_string()];
        let thirteen = score(TaskMetric::Bleu, &hyp, &refs);
        let intl = score(TaskMetric::BleuIntl, &hyp, &refs);
        assert!((intl - 100.0).abs() < 1e-9, "intl: {intl}");
        assert!(thirteen < 100.0, "13a: {thirteen}");
        let paper = crate::configs::builtin("gqa_table1", crate::Profile::Paper).unwrap();
        assert!(paper.contains("metric = \"bleu_intl\""));
    }
}
