//! The pipeline's stages: each a run directory (checkpoints, metrics, the model, a fine-tuning
//! stage's predictions and `result.json`), reused when its whole lineage matches; decoding, scoring
//! and timing a fine-tuned model.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, anyhow, bail};
use burn::prelude::*;
use data::registry::{self, Split};
use data::source::{SourceOptions, split_files};
use data::tasks::Seq2SeqExample;
use data::tokenize::Tok;
use model::t5::{Stop, T5Config, T5Model};
use model::t5_hf;
use serde::{Deserialize, Serialize};
use training::lm_task::LmData;
use training::t5_task::pad_batch;
use training::trainer::{MetricsRow, Progress, RunOptions, Task, TrainConfig, train};
use training::write_atomic;

use super::config::ModelSpec;
use super::scores::ScoreRow;
use crate::run_store;

/// A model's held-out span-corruption losses (see [`ScoreRow`]).
pub(super) struct SpanLosses {
    /// Right after conversion (α = 0); none for a multi-head model.
    pub(super) converted: Option<f64>,
    /// Of the model fine-tuning starts from.
    pub(super) start: f64,
}

/// A model before fine-tuning, as records: its config, the record of where it came from, and its
/// uptraining stage (none for a multi-head model or α = 0).
pub(super) type UpstreamModel<'a> = (T5Config, serde_json::Value, Option<Stage<'a>>);

/// How a fine-tuned model is scored: a result is reused only when scored the same way (the
/// stage's lineage, checked separately, covers everything else).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Scoring {
    /// Held-out examples decoded and scored.
    pub(super) score_examples: usize,
    /// Decoding batch (it sets the measured time per sample).
    pub(super) inference_batch: usize,
}

/// A scored fine-tuning stage's `result.json`: its row of `scores.csv` (the measured fields:
/// score, losses, time per sample and the device that timed it) and how it was scored. With it a
/// later run reuses the stage without its weights, which are not committed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct StageResult {
    pub(super) scoring: Scoring,
    pub(super) row: ScoreRow,
    /// The code that finished and scored the stage (a stage resumed from a checkpoint may have
    /// trained under other commits before); results without it name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) finished_by: Option<FinishedBy>,
}

/// The commit and UTC date of the run that wrote a [`StageResult`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct FinishedBy {
    pub(super) git_commit: String,
    pub(super) date: String,
}

/// Where the data and tokenizer come from, shared by every stage.
pub(super) struct Sources {
    pub(super) options: SourceOptions,
    pub(super) tok: Tok,
}

impl Sources {
    pub(super) fn data(&self, dataset: &str) -> Result<LmData> {
        let spec = registry::lookup(dataset)?;
        Ok(LmData {
            spec,
            train_files: split_files(spec, Split::Train, &self.options)?,
            eval_files: split_files(spec, Split::Validation, &self.options)?,
            tok: self.tok.clone(),
        })
    }
}

/// A scored fine-tuning stage's result file ([`StageResult`]).
pub(super) const RESULT_FILE: &str = "result.json";

/// Trains one stage (or reuses its finished model) and returns the model.
pub(super) struct Stage<'a> {
    pub(super) dir: PathBuf,
    pub(super) label: String,
    /// Where the initial model came from (the upstream stages' records, or a checkpoint), so a
    /// stage directory is reused only for the same lineage.
    pub(super) origin: serde_json::Value,
    pub(super) config: T5Config,
    pub(super) train: TrainConfig,
    pub(super) flops_per_step: f64,
    pub(super) device: &'a Device,
    pub(super) stop: &'a std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Stage<'_> {
    pub(super) fn run<T: Task<T5Model>>(&self, init: T5Model, task: &mut T) -> Result<T5Model> {
        run_store::claim(&self.dir, &self.record())?;
        let final_dir = self.dir.join("model");
        let finished = || final_dir.join("model.safetensors").exists();
        if !finished() {
            // Another experiment sharing this stage directory may be training the stage now:
            // wait for it, then reuse what it trained.
            let _lock = run_store::lock_training(&self.dir, std::time::Duration::from_secs(10))?;
            if !finished() {
                return self.train(init, task, &final_dir);
            }
        }
        let (_, model) = t5_hf::load(&final_dir, self.device).map_err(|e| anyhow!(e))?;
        Ok(model)
    }

    /// Trains the stage (resuming its checkpoint) and saves the final model in `final_dir`.
    pub(super) fn train<T: Task<T5Model>>(
        &self,
        init: T5Model,
        task: &mut T,
        final_dir: &Path,
    ) -> Result<T5Model> {
        let opts = RunOptions {
            stop: self.stop.clone(),
            flops_per_step: self.flops_per_step,
            label: self.label.clone(),
            progress: Progress::Auto,
        };
        let devices = std::slice::from_ref(self.device);
        let outcome = train(&self.train, init, task, devices, &self.dir, &opts)?;
        if outcome.interrupted || self.stop.load(Ordering::SeqCst) {
            bail!(
                "interrupted; run the same command again to resume from {}",
                self.dir.display()
            );
        }
        let model = outcome.model;
        t5_hf::save(&model, &self.config, final_dir).map_err(|e| anyhow!(e))?;
        Ok(model)
    }

    /// The stage's scored result, if it has one scored as `scoring` says; refuses a directory that
    /// holds another lineage ([`run_store::claim`]). Creates nothing: a stage without a result is
    /// claimed when it runs.
    pub(super) fn result(&self, scoring: &Scoring) -> Result<Option<ScoreRow>> {
        let path = self.dir.join(RESULT_FILE);
        let Ok(text) = std::fs::read(&path) else {
            return Ok(None);
        };
        run_store::claim(&self.dir, &self.record())?;
        let saved: StageResult = serde_json::from_slice(&text).with_context(|| {
            format!(
                "{} is not a stage result; delete it to score the stage again",
                path.display()
            )
        })?;
        Ok((&saved.scoring == scoring).then_some(saved.row))
    }

    /// Saves the stage's scored result (see [`StageResult`]).
    pub(super) fn save_result(&self, scoring: &Scoring, row: &ScoreRow) -> Result<()> {
        let provenance = training::provenance::Provenance::collect(row.device.clone());
        let result = StageResult {
            scoring: scoring.clone(),
            row: row.clone(),
            finished_by: Some(FinishedBy {
                git_commit: provenance.git_commit,
                date: provenance.date,
            }),
        };
        write_atomic(
            &self.dir.join(RESULT_FILE),
            serde_json::to_string_pretty(&result)?.as_bytes(),
        )
    }

    /// The step of the model the finished stage ended with ([`KeepModel::step`] over its
    /// `metrics.csv`).
    pub(super) fn kept_step(&self) -> Result<usize> {
        let rows: Vec<MetricsRow> = crate::read_csv(&self.dir.join("metrics.csv"))?;
        self.train
            .keep
            .step(&rows)
            .ok_or_else(|| anyhow!("{} has no evaluations", self.dir.display()))
    }

    /// The stage's identity: model, training and origin (saved as its `run_config.json`).
    pub(super) fn record(&self) -> serde_json::Value {
        serde_json::json!({"model": self.config, "train": self.train, "origin": self.origin})
    }
}

/// A model's key in stage names: its size, then its K/V heads, conversion and α when converted.
pub(super) fn model_key(m: &ModelSpec) -> String {
    match m.kv_heads {
        None => m.size.clone(),
        Some(g) => format!("{}-g{g}-{}-a{}", m.size, m.conversion, m.alpha),
    }
}

/// A multi-head checkpoint standing in for pre-training. Its shape must be the size's (so the
/// config says what the table's rows are); its vocabulary must cover the tokenizer's (T5.1.1's 32128
/// rows cover SentencePiece's 32100 ids). Returns `t5` with the checkpoint's vocabulary size.
pub(super) fn load_pretrained(
    spec: &str,
    size: &str,
    t5: T5Config,
    device: &Device,
) -> Result<(T5Config, T5Model)> {
    let dir = data::source::checkpoint_dir(spec, false)?;
    let (loaded, model) = t5_hf::load(&dir, device).map_err(|e| anyhow!("{spec}: {e}"))?;
    let shape = |c: &T5Config| {
        [
            c.d_model,
            c.d_ff,
            c.n_heads,
            c.d_kv,
            c.n_encoder_layers,
            c.n_decoder_layers,
            c.n_kv_heads,
        ]
    };
    if shape(&loaded) != shape(&t5) {
        bail!(
            "size `{size}`: checkpoint {spec} has [d_model, d_ff, n_heads, d_kv, encoder layers, decoder layers, K/V heads] = {:?}, the size says {:?}; make the size's fields the checkpoint's",
            shape(&loaded),
            shape(&t5)
        );
    }
    if loaded.vocab_size < t5.vocab_size {
        bail!(
            "size `{size}`: checkpoint {spec} has {} embedding rows, fewer than the tokenizer's {} ids; use the checkpoint's tokenizer",
            loaded.vocab_size,
            t5.vocab_size
        );
    }
    let t5 = t5.with_vocab_size(loaded.vocab_size);
    Ok((t5, model))
}

/// Seconds per sample of greedy decoding (encoder included) with every sample decoding exactly
/// `length` tokens, in batches of `batch`: the same work for every model whatever it outputs (the
/// paper's models write outputs of similar lengths; small undertrained ones need not, and timing
/// their EOS-stopped generations would measure their output lengths, not their attention).
pub(super) fn time_per_sample(
    model: &T5Model,
    examples: &[Seq2SeqExample],
    batch: usize,
    length: usize,
    device: &Device,
) -> f64 {
    let start = std::time::Instant::now();
    for chunk in examples.chunks(batch) {
        let inputs: Vec<Vec<u32>> = chunk.iter().map(|e| e.inputs.clone()).collect();
        let (ids, keep) = pad_batch(&inputs, device);
        let _ = model.greedy_decode(ids, &keep, length, Stop::Length);
    }
    start.elapsed().as_secs_f64() / examples.len() as f64
}
