//! The GQA paper's uptraining experiments (Table 1 / Figure 3, Figure 4, Figure 5): a multi-head
//! T5.1.1 is pre-trained with span corruption, converted to MQA / GQA-G by pooling its K/V heads
//! (mean, first head or random), uptrained for a fraction α of its pre-training steps on the same
//! objective, fine-tuned on each task, decoded greedily on held-out examples, scored with the
//! paper's metric for that task, and timed per sample.
//!
//! Every stage keeps its own run directory under `<out>/stages/` (or the config's `stages`):
//! checkpoints, `metrics.csv`, the final model in Hugging Face layout under `model/` and, for a
//! fine-tuning stage, its predictions and scored `result.json`. Running the command again resumes
//! an interrupted stage and reuses finished ones; a stage directory made with another configuration
//! is refused. A scored fine-tuning stage is reused from its `result.json` alone, and a model is
//! trained or loaded only when a stage downstream of it has no result yet, so a clone that has the
//! committed results but no weights trains only what is missing. One library for the three
//! experiments; each binary only picks its configs.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, anyhow, bail};
use burn::prelude::*;
use data::registry::{self, Split};
use data::source::{SourceOptions, split_files};
use data::tasks::PretrainObjective;
use data::tasks::{Seq2SeqExample, Seq2SeqTask};
use data::tokenize::{self, Tok, TokenizerSpec};
use model::t5::{KvConversion, Stop, T5Config, T5Model, convert_kv_heads};
use model::t5_hf;
use report::{LineChart, Scale, Series};
use serde::{Deserialize, Serialize};
use training::lm_task::LmData;
use training::optimizer::OptimizerConfig;
use training::schedule::{Decay, Schedule};
use training::t5_task::{
    FineTuneTask, RandomCopyTask, SpanCorruptionTask, first_examples, generate, pad_batch,
};
use training::trainer::{
    KeepModel, MetricsRow, Progress, RunOptions, Task, TrainConfig, stop_on_ctrl_c, train,
};
use training::write_atomic;

use crate::Cli;
use crate::run_store;
use crate::verdict::Spread;

/// A T5.1.1 shape (the paper's Large and XXL, shrunk at the smaller scales).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SizeConfig {
    /// Model width.
    pub d_model: usize,
    /// Feed-forward width.
    pub d_ff: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Head width.
    pub d_kv: usize,
    /// Layers per stack.
    pub n_layers: usize,
    /// A pre-trained multi-head checkpoint of this shape to start from instead of pre-training
    /// here: a directory with `config.json` + safetensors, or `hub:OWNER/NAME[@REVISION]` (the
    /// paper: `hub:google/t5-v1_1-large`, `hub:google/t5-v1_1-xxl`). `pretrain.steps` then counts
    /// the checkpoint's pre-training steps (T5.1.1: 1,000,000), which α multiplies.
    #[serde(default)]
    pub checkpoint: Option<String>,
}

/// One row of the table: a size, its attention, and how it got there.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Row name, e.g. `GQA-8-XXL`.
    pub name: String,
    /// A key of `sizes`.
    pub size: String,
    /// K/V heads after conversion; absent = the multi-head model as pre-trained.
    pub kv_heads: Option<usize>,
    /// How converted K/V heads start: `mean` (the paper's), `first` or `random`.
    #[serde(default = "default_conversion")]
    pub conversion: String,
    /// Uptraining steps as a fraction of pre-training steps (the paper: 0.05; ablated 0, 0.1).
    #[serde(default)]
    pub alpha: f64,
}

fn default_conversion() -> String {
    "mean".into()
}

impl ModelSpec {
    fn conversion(&self) -> Result<KvConversion> {
        Ok(match self.conversion.as_str() {
            "mean" => KvConversion::Mean,
            "first" => KvConversion::First,
            "random" => KvConversion::Random,
            other => bail!(
                "model `{}`: unknown conversion `{other}`; choose mean, first or random",
                self.name
            ),
        })
    }
}

/// How one training stage runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    /// Optimizer steps (uptraining: α × the pre-training steps instead).
    pub steps: usize,
    /// Examples per step.
    pub batch: usize,
    /// Optimizer (the paper: Adafactor).
    pub optimizer: OptimizerConfig,
    /// Peak learning rate.
    pub peak_lr: f64,
    /// Warm-up steps.
    pub warmup_steps: usize,
    /// Decay after warm-up (pre-training: inverse square root; fine-tuning: constant 0.001).
    pub decay: Decay,
    /// Dropout (pre-training 0, fine-tuning 0.1).
    pub dropout: f64,
    /// Evaluate every this many steps.
    pub eval_every: usize,
    /// Held-out windows (span corruption) or examples (fine-tuning) per evaluation.
    pub eval_size: usize,
    /// Checkpoint every this many steps.
    pub checkpoint_every: usize,
    /// Which model the stage ends with: `last` (the default) or `best_eval`, the evaluation with
    /// the lowest held-out loss. The paper's fine-tuned models are scored at their best held-out
    /// checkpoint (as T5 reports them), so the GQA configs' fine-tuning keeps `best_eval`; here
    /// "best" is by held-out loss, evaluated every `eval_every` steps, not by the task's metric
    /// (which would need a decoding pass per checkpoint).
    #[serde(default)]
    pub keep: KeepModel,
}

impl StageConfig {
    fn train(&self, steps: usize, seed: u64) -> TrainConfig {
        TrainConfig {
            steps,
            optimizer: self.optimizer,
            schedule: Schedule::new(
                self.peak_lr,
                self.warmup_steps.min(steps.saturating_sub(1)),
                self.decay,
            ),
            grad_accum: 1,
            clip_norm: None,
            eval_every: self.eval_every.min(steps).max(1),
            checkpoint_every: self.checkpoint_every,
            seed,
            keep: self.keep,
        }
    }
}

/// The score a task reports (GQA paper Table 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskMetric {
    /// ROUGE-1 F (summaries), rouge-score 0.1.2 with T5's sentence splitting, no stemming.
    Rouge1,
    /// Corpus BLEU, sacrebleu 2.6.0 with tokenizer 13a (sacrebleu's default; the cpu scale's
    /// translation-like task).
    Bleu,
    /// Corpus BLEU with sacrebleu's `intl` tokenizer, which T5's evaluation used for WMT (the paper
    /// configs' WMT task).
    BleuIntl,
    /// TriviaQA F1 against every answer.
    F1,
}

/// A fine-tuning task.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    /// Column name in the table, e.g. `CNN`.
    pub name: String,
    /// Dataset (`datasets list`).
    pub dataset: String,
    /// Its score.
    pub metric: TaskMetric,
    /// Input tokens (the paper: 512 for CNN/DM and WMT, 2048 for the long summaries and TriviaQA).
    pub input_length: usize,
    /// Target tokens, also the decoding limit (the paper: 256, 512 or 32).
    pub target_length: usize,
}

/// The pipeline, one file per scale under `experiments/configs/<id>/`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// What the run reproduces.
    pub description: String,
    /// A root holding one folder per dataset, `<data_dir>/<dataset>/`, each in the dataset's hub
    /// layout (as `datasets --data-dir`; the offline corpus's folder is `gutenberg_shakespeare`);
    /// empty, or a dataset with no folder there: the Hugging Face cache / hub, or `data/` for the
    /// offline corpus.
    pub data_dir: String,
    /// A dataset's own folder, by dataset name (e.g. `{ pg19 = "/mnt/pg19" }`), read before
    /// `data_dir`.
    #[serde(default)]
    pub data_dirs: BTreeMap<String, String>,
    /// `bytes`, `bpe:N`, `unigram:N`, `file:PATH` or `hub:REPO`.
    pub tokenizer: String,
    /// Pre-training (span corruption) corpus.
    pub corpus: String,
    /// Span-corruption input length (T5: 512, targets 114).
    pub input_length: usize,
    /// Named sizes.
    pub sizes: BTreeMap<String, SizeConfig>,
    /// Rows of the table.
    pub models: Vec<ModelSpec>,
    /// Pre-training of each size used (uptraining reuses it with α × its steps).
    pub pretrain: StageConfig,
    /// Fine-tuning on each task.
    pub finetune: StageConfig,
    /// Tasks, in table order.
    pub tasks: Vec<TaskConfig>,
    /// Held-out examples decoded and scored per task.
    pub score_examples: usize,
    /// Examples decoded together (the paper: up to 32 per chip).
    pub inference_batch: usize,
    /// Seed of pre-training (the copy warm-up's and pre-training's weights, data order and noise).
    pub seed: u64,
    /// Seeds of the replicates: each converts, uptrains, fine-tunes and scores every model again
    /// with its own seed (the random conversion's draws, data order, dropout), all from the same
    /// pre-trained models, as the paper's experiments all start from one public checkpoint per
    /// size. Empty (the default): one replicate, with `seed`. A replicate whose seed is not `seed`
    /// adds `-s<seed>` to its stage names.
    #[serde(default)]
    pub seeds: Vec<u64>,
    /// Directory of the stage runs; empty: `<out>/stages`. Experiments naming the same directory
    /// share every stage they have in common (each stage records its whole lineage and is reused
    /// only when that matches): the cpu configs of gqa_table1 / fig4 / fig5 share
    /// `results/gqa_cpu_stages_kv32`, so the three figures rest on the same pre-trained models.
    #[serde(default)]
    pub stages: String,
    /// The learning rate of uptraining: `continue` (the default) the pre-training schedule where
    /// the checkpoint left it (step S_pretrain + s), or `restart` it with a new warm-up.
    #[serde(default)]
    pub uptrain_schedule: UptrainSchedule,
    /// Pre-training's targets: `span_corruption` (T5's, the default and the paper's) or
    /// `reconstruct` (the same corrupted inputs, the whole window as target: teaches a small
    /// model to copy its input, which the cpu tasks need; `results/gqa_pilot`). Applies to
    /// uptraining and the held-out span losses too.
    #[serde(default)]
    pub pretrain_objective: PretrainObjective,
    /// Fraction of pre-training and uptraining windows replaced by random-token copying examples
    /// of a window's length (a curriculum for small models, not the paper's: T5's checkpoints copy
    /// already; a small T5 learns to copy 16–32 random tokens in a few hundred steps, text and
    /// 145 random tokens not within 1500, `results/gqa_pilot` pilot 6). 0, the default, is T5's
    /// data.
    #[serde(default)]
    pub pretrain_random_copy: f64,
    /// Random-token copying before pre-training (steps 0, the default: none, T5's recipe).
    #[serde(default)]
    pub copy_warmup: CopyWarmup,
    /// Fine-tuning examples held in the shuffle buffer, drawn at random with `seed` (1: the files'
    /// order). Default seqio's 1,000 (`data::epochs::DEFAULT_SHUFFLE_BUFFER`), which T5 and the
    /// paper's t5x read through; the paper does not state its own.
    #[serde(default = "default_shuffle_buffer")]
    pub shuffle_buffer: usize,
}

/// A warm-up stage before pre-training in which each multi-head model learns to copy sequences of
/// random tokens (input = target, no corruption): a curriculum for small models, not the paper's
/// (T5's checkpoints copy already). Pilot 6 (`results/gqa_pilot`) found that a small T5 learns to
/// copy 16–32 random tokens within a few hundred steps of T5's Adafactor at batch 32, but neither
/// text nor 145 random tokens within 1500 steps of pre-training; the warm-up gives pre-training a
/// model that copies already. Pilot 7: with 1000 warm-up steps (the transition came between 750
/// and 1000 on the 8192-id vocabulary) and reconstruction pre-training after it, MHA-Large clears
/// the Cues and SpeakerQA baselines and reaches Modernize's; with span corruption after it, the
/// skill is lost again. It trains at a constant rate; the pre-training stage records it in its
/// lineage.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyWarmup {
    /// Optimizer steps; 0: no warm-up.
    pub steps: usize,
    /// Sequences per step (pilot 6: 32).
    pub batch: usize,
    /// Random tokens per sequence, EOS excluded (pilot 6: 16 copied at ~570 steps, 32 at ~830).
    pub length: usize,
    /// Its optimizer (pilot 6: T5's Adafactor, the update scaled by the parameter's RMS; the
    /// absolute update at 0.001 took ~2700 steps for 16 tokens, and diverged at 0.01).
    pub optimizer: OptimizerConfig,
    /// Constant learning rate (pilot 6: 0.03 with T5's Adafactor; 0.1 diverged).
    pub lr: f64,
}

impl Default for CopyWarmup {
    /// No warm-up; the other fields are pilot 6's fastest copy setting.
    fn default() -> Self {
        Self {
            steps: 0,
            batch: 32,
            length: 16,
            optimizer: OptimizerConfig::adafactor_t5(),
            lr: 0.03,
        }
    }
}

impl CopyWarmup {
    /// The warm-up as a stage: its optimizer at a constant rate, with `pretrain`'s dropout,
    /// evaluation and checkpoint intervals.
    fn stage(&self, pretrain: &StageConfig) -> StageConfig {
        StageConfig {
            steps: self.steps,
            batch: self.batch,
            optimizer: self.optimizer,
            peak_lr: self.lr,
            warmup_steps: 0,
            decay: Decay::Constant,
            ..pretrain.clone()
        }
    }

    /// How the warm-up trains.
    fn train(&self, pretrain: &StageConfig, seed: u64) -> TrainConfig {
        self.stage(pretrain).train(self.steps, seed)
    }
}

/// The record of a pre-training stage's start: random weights, the seed, and the objective when
/// it is not T5's (so stages pre-trained before the field existed keep matching their lineage).
fn pretrain_origin(
    config: &PipelineConfig,
    copy_warmup: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut origin = serde_json::json!({ "init": "random", "seed": config.seed });
    if let Some(warmup) = copy_warmup {
        origin["copy_warmup"] = warmup;
    }
    if config.pretrain_objective != PretrainObjective::SpanCorruption {
        origin["objective"] = serde_json::to_value(config.pretrain_objective).expect("an enum");
    }
    if config.pretrain_random_copy > 0.0 {
        origin["random_copy"] = serde_json::json!(config.pretrain_random_copy);
    }
    origin
}

fn default_shuffle_buffer() -> usize {
    data::epochs::DEFAULT_SHUFFLE_BUFFER
}

/// Where uptraining's learning-rate schedule starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UptrainSchedule {
    /// The pre-training schedule continued: step s of uptraining takes the rate of step
    /// S_pretrain + s (the paper uptrains the public checkpoints "using the same pre-training
    /// recipe"; restarting a warm-up to the peak would shock a converged model).
    #[default]
    Continue,
    /// The pre-training schedule from its step 1 (warm-up included) over the uptraining steps.
    Restart,
}

impl PipelineConfig {
    /// How `steps` of uptraining train: the pre-training stage's optimizer and schedule, continued
    /// from step `pretrain.steps` or restarted ([`UptrainSchedule`]).
    pub fn uptrain(&self, steps: usize, seed: u64) -> TrainConfig {
        let mut train = self.pretrain.train(steps, seed);
        if self.uptrain_schedule == UptrainSchedule::Continue {
            // A continued schedule has long finished its warm-up.
            train.schedule.warmup_steps = self.pretrain.warmup_steps;
            train.schedule.start_step = self.pretrain.steps;
        }
        train
    }

    /// The replicates' seeds ([`PipelineConfig::seeds`], or `seed` alone).
    pub fn replicate_seeds(&self) -> Vec<u64> {
        if self.seeds.is_empty() {
            vec![self.seed]
        } else {
            self.seeds.clone()
        }
    }

    /// What a replicate adds to its stages' names: nothing for the pre-training seed (so the
    /// stages of single-seed runs keep their names), `-s<seed>` otherwise.
    fn replicate_suffix(&self, seed: u64) -> String {
        if seed == self.seed {
            String::new()
        } else {
            format!("-s{seed}")
        }
    }

    fn t5(&self, size: &str, dropout: f64) -> Result<T5Config> {
        let s = self
            .sizes
            .get(size)
            .with_context(|| format!("size `{size}` is not one of {:?}", self.sizes.keys()))?;
        let config = T5Config::new(
            s.d_model, s.d_ff, s.n_heads, s.n_layers, s.n_layers, s.n_heads,
        )
        .with_d_kv(s.d_kv)
        .with_dropout(dropout);
        config
            .validate()
            .map_err(|e| anyhow!("size `{size}`: {e}"))?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        if self.models.is_empty() || self.tasks.is_empty() {
            bail!("the config needs at least one model and one task");
        }
        for m in &self.models {
            let t5 = self.t5(&m.size, 0.0)?;
            m.conversion()?;
            if let Some(g) = m.kv_heads
                && (g == 0 || !t5.n_heads.is_multiple_of(g))
            {
                bail!(
                    "model `{}`: kv_heads {g} must divide the {} heads of size `{}`",
                    m.name,
                    t5.n_heads,
                    m.size
                );
            }
            if !(0.0..=1.0).contains(&m.alpha) {
                bail!("model `{}`: alpha {} must be in [0, 1]", m.name, m.alpha);
            }
        }
        let w = &self.copy_warmup;
        if w.steps > 0 && (w.batch == 0 || w.length == 0 || w.lr <= 0.0) {
            bail!(
                "copy_warmup: batch {}, length {} and lr {} must be positive when steps is {}; set steps = 0 for no warm-up",
                w.batch,
                w.length,
                w.lr,
                w.steps
            );
        }
        let mut seeds = self.seeds.clone();
        seeds.sort_unstable();
        seeds.dedup();
        if seeds.len() != self.seeds.len() {
            bail!(
                "seeds {:?} repeats a seed: each replicate needs its own",
                self.seeds
            );
        }
        if !(0.0..1.0).contains(&self.pretrain_random_copy) {
            bail!(
                "pretrain_random_copy {} must be in [0, 1): the fraction of pre-training windows replaced by random-token copying",
                self.pretrain_random_copy
            );
        }
        Ok(())
    }
}

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
const BASELINE_TRAIN_EXAMPLES: usize = 5000;

/// The trivial baselines of `task` on the examples the models are scored on (`references`: the
/// first `references.len()` examples of the eval split, as [`first_examples`] reads them).
fn trivial_baselines(
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

/// A model's held-out span-corruption losses (see [`ScoreRow`]).
struct SpanLosses {
    /// Right after conversion (α = 0); none for a multi-head model.
    converted: Option<f64>,
    /// Of the model fine-tuning starts from.
    start: f64,
}

/// A model before fine-tuning, as records: its config, the record of where it came from, and its
/// uptraining stage (none for a multi-head model or α = 0).
type UpstreamModel<'a> = (T5Config, serde_json::Value, Option<Stage<'a>>);

/// How a fine-tuned model is scored: a result is reused only when scored the same way (the
/// stage's lineage, checked separately, covers everything else).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Scoring {
    /// Held-out examples decoded and scored.
    score_examples: usize,
    /// Decoding batch (it sets the measured time per sample).
    inference_batch: usize,
}

/// A scored fine-tuning stage's `result.json`: its row of `scores.csv` (the measured fields:
/// score, losses, time per sample and the device that timed it) and how it was scored. With it a
/// later run reuses the stage without its weights, which are not committed.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct StageResult {
    scoring: Scoring,
    row: ScoreRow,
}

/// Where the data and tokenizer come from, shared by every stage.
struct Sources {
    options: SourceOptions,
    tok: Tok,
}

impl Sources {
    fn data(&self, dataset: &str) -> Result<LmData> {
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
const RESULT_FILE: &str = "result.json";

/// Trains one stage (or reuses its finished model) and returns the model.
struct Stage<'a> {
    dir: PathBuf,
    label: String,
    /// Where the initial model came from (the upstream stages' records, or a checkpoint), so a
    /// stage directory is reused only for the same lineage.
    origin: serde_json::Value,
    config: T5Config,
    train: TrainConfig,
    flops_per_step: f64,
    device: &'a Device,
    stop: &'a std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Stage<'_> {
    fn run<T: Task<T5Model>>(&self, init: T5Model, task: &mut T) -> Result<T5Model> {
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
    fn train<T: Task<T5Model>>(
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
    fn result(&self, scoring: &Scoring) -> Result<Option<ScoreRow>> {
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
    fn save_result(&self, scoring: &Scoring, row: &ScoreRow) -> Result<()> {
        let result = StageResult {
            scoring: scoring.clone(),
            row: row.clone(),
        };
        write_atomic(
            &self.dir.join(RESULT_FILE),
            serde_json::to_string_pretty(&result)?.as_bytes(),
        )
    }

    /// The step of the model the finished stage ended with ([`KeepModel::step`] over its
    /// `metrics.csv`).
    fn kept_step(&self) -> Result<usize> {
        let rows: Vec<MetricsRow> = crate::read_csv(&self.dir.join("metrics.csv"))?;
        self.train
            .keep
            .step(&rows)
            .ok_or_else(|| anyhow!("{} has no evaluations", self.dir.display()))
    }

    /// The stage's identity: model, training and origin (saved as its `run_config.json`).
    fn record(&self) -> serde_json::Value {
        serde_json::json!({"model": self.config, "train": self.train, "origin": self.origin})
    }
}

/// A model's key in stage names: its size, then its K/V heads, conversion and α when converted.
fn model_key(m: &ModelSpec) -> String {
    match m.kv_heads {
        None => m.size.clone(),
        Some(g) => format!("{}-g{g}-{}-a{}", m.size, m.conversion, m.alpha),
    }
}

/// A multi-head checkpoint standing in for pre-training. Its shape must be the size's (so the
/// config says what the table's rows are); its vocabulary must cover the tokenizer's (T5.1.1's 32128
/// rows cover SentencePiece's 32100 ids). Returns `t5` with the checkpoint's vocabulary size.
fn load_pretrained(
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
fn time_per_sample(
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

/// Scores `predictions` against the held-out references with the task's metric (×100).
fn score(metric: TaskMetric, predictions: &[String], references: &[Vec<String>]) -> f64 {
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

/// Runs the pipeline (or only the report, with `--report`).
/// `--dry-run` of the pipeline: every stage it would train (pre-training per size without a
/// checkpoint, uptraining per converted model, fine-tuning per model and task) built on the
/// device and planned, the decoding cache per example beside the fine-tuned models; with `step`,
/// one real step of each stage on one synthetic example.
fn dry_run_pipeline(
    cli: &Cli,
    config: &PipelineConfig,
    mode: crate::dry_run::DryRun,
) -> Result<()> {
    use crate::dry_run::{RunPlan, SyntheticSeq2Seq, param_stats, real_step};
    let device = cli.one_device()?.train_device()?;
    let build = device.clone().without_autodiff();
    let vocab = crate::dry_run::vocab_size(&config.tokenizer)?;
    let span_targets = config.pretrain_objective.target_length(config.input_length);
    // (plan, model, train config, input and target lengths)
    let mut stages: Vec<(RunPlan, T5Config, TrainConfig, (usize, usize))> = Vec::new();
    let mut plan = |(label, runs): (String, usize),
                    t5: T5Config,
                    (stage, train): (&StageConfig, TrainConfig),
                    (s, t): (usize, usize),
                    decodes: bool| {
        let (params, optimizer_floats) = param_stats(&t5.init(&build), &stage.optimizer);
        stages.push((
            RunPlan {
                label,
                runs,
                params,
                tokens_per_step: stage.batch * (s + t),
                steps: train.steps,
                optimizer_floats,
                activation_floats: t5.activation_floats(stage.batch, s, t),
                kv_cache_floats: if decodes {
                    t5.kv_cache_floats_per_sequence(s, t)
                } else {
                    0.0
                },
                train_flops: t5.train_flops(stage.batch, s, t) * train.steps as f64,
                step_seconds: None,
            },
            t5,
            train,
            (s, t),
        ));
    };
    let span = (config.input_length, span_targets);
    // Uptraining and fine-tuning run once per replicate.
    let replicates = config.replicate_seeds().len();
    let mut sizes_done = Vec::new();
    for m in &config.models {
        let t5 = config
            .t5(&m.size, config.pretrain.dropout)?
            .with_vocab_size(vocab);
        if config.sizes[&m.size].checkpoint.is_none() && !sizes_done.contains(&m.size) {
            sizes_done.push(m.size.clone());
            let warmup = &config.copy_warmup;
            if warmup.steps > 0 {
                let stage = warmup.stage(&config.pretrain);
                let train = warmup.train(&config.pretrain, config.seed);
                let len = warmup.length + 1;
                plan(
                    (format!("copy warm-up {}", m.size), 1),
                    t5.clone(),
                    (&stage, train),
                    (len, len),
                    false,
                );
            }
            let train = config.pretrain.train(config.pretrain.steps, config.seed);
            plan(
                (format!("pretrain {}", m.size), 1),
                t5.clone(),
                (&config.pretrain, train),
                span,
                false,
            );
        }
        let t5 = match m.kv_heads {
            Some(groups) => t5.with_n_kv_heads(groups),
            None => t5,
        };
        let steps = (m.alpha * config.pretrain.steps as f64).round() as usize;
        if m.kv_heads.is_some() && steps > 0 {
            plan(
                (format!("uptrain {}", m.name), replicates),
                t5.clone(),
                (&config.pretrain, config.uptrain(steps, config.seed)),
                span,
                false,
            );
        }
        for task in &config.tasks {
            let train = config.finetune.train(config.finetune.steps, config.seed);
            plan(
                (format!("finetune {} on {}", m.name, task.name), replicates),
                t5.clone().with_dropout(config.finetune.dropout),
                (&config.finetune, train),
                (task.input_length, task.target_length),
                true,
            );
        }
    }
    let plans: Vec<RunPlan> = stages.iter().map(|(p, ..)| p.clone()).collect();
    crate::dry_run::print(cli, "", &plans);
    let both = [Split::Train, Split::Validation];
    let reads: Vec<(&str, &[Split])> = std::iter::once(config.corpus.as_str())
        .chain(config.tasks.iter().map(|t| t.dataset.as_str()))
        .map(|d| (d, &both[..]))
        .collect();
    crate::dry_run::print_data(
        &SourceOptions::from_config(&config.data_dir, &config.data_dirs)?,
        &reads,
    )?;
    if mode == crate::dry_run::DryRun::Step {
        for (p, t5, train, (s, t)) in &stages {
            let estimate = p.bytes_with_activations(t5.activation_floats(1, *s, *t));
            real_step(
                &p.label,
                (estimate, s + t),
                || t5.init(&device),
                SyntheticSeq2Seq::new(*s, *t, t5.vocab_size),
                train,
                &device,
            )?;
        }
    }
    Ok(())
}

pub fn run(cli: Cli, builtin: &dyn Fn(crate::Profile) -> &'static str) -> Result<()> {
    if cli.report_only {
        return cli.rerender(render);
    }
    let config: PipelineConfig = cli.load_config(builtin)?;
    config.validate()?;
    if let Some(mode) = cli.dry_run {
        return dry_run_pipeline(&cli, &config, mode);
    }
    let options = SourceOptions::from_config(&config.data_dir, &config.data_dirs)?;
    let corpus = registry::lookup(&config.corpus)?;
    let corpus_files = split_files(corpus, Split::Train, &options)?;
    let tokenizer: TokenizerSpec = config.tokenizer.parse()?;
    let tok = tokenize::for_corpus(&tokenizer, corpus, &corpus_files, &options)?;
    let sources = Sources { options, tok };
    let provenance = cli.save_provenance(&config)?;
    let device = cli.one_device()?.train_device()?;
    let stop = stop_on_ctrl_c();
    let stages = if config.stages.is_empty() {
        cli.out.join("stages")
    } else {
        PathBuf::from(&config.stages)
    };
    let vocab = sources.tok.vocab_size();
    let span_targets = config.pretrain_objective.target_length(config.input_length);

    // Pre-training and uptraining: span corruption on the corpus with the pre-training schedule.
    // A stage is only named and recorded here; it trains (or loads its finished model) when run,
    // which happens only when a stage downstream of it has no scored result yet.
    let (device_ref, stop_ref) = (&device, &stop);
    let span_stage = |dir: String,
                      label: String,
                      origin: serde_json::Value,
                      train: TrainConfig,
                      t5: &T5Config| Stage {
        dir: stages.join(dir),
        label,
        origin,
        train,
        flops_per_step: t5.train_flops(config.pretrain.batch, config.input_length, span_targets),
        config: t5.clone(),
        device: device_ref,
        stop: stop_ref,
    };
    let span_task = |data_seed: u64| {
        anyhow::Ok(
            SpanCorruptionTask::new(
                sources.data(&config.corpus)?,
                config.pretrain.batch,
                config.input_length,
                config.pretrain.eval_size,
                (data_seed, config.pretrain_objective),
            )?
            .with_random_copy(config.pretrain_random_copy),
        )
    };

    // The copy warm-up before pre-training (none when `copy_warmup.steps` is 0), and pre-training
    // from its model (or from random weights), recording the warm-up in its lineage.
    let copy_warmup_stage = |size: &str, t5: &T5Config| {
        let warmup = &config.copy_warmup;
        (warmup.steps > 0).then(|| Stage {
            dir: stages.join(format!("copy-warmup-{size}")),
            label: format!("copy warm-up {size}"),
            origin: serde_json::json!({ "init": "random", "seed": config.seed }),
            train: warmup.train(&config.pretrain, config.seed),
            flops_per_step: t5.train_flops(warmup.batch, warmup.length + 1, warmup.length + 1),
            config: t5.clone(),
            device: device_ref,
            stop: stop_ref,
        })
    };
    let pretrain_stage = |size: &str, t5: &T5Config, warmup: Option<&Stage>| {
        span_stage(
            format!("pretrain-{size}"),
            format!("pretrain {size}"),
            pretrain_origin(&config, warmup.map(Stage::record)),
            config.pretrain.train(config.pretrain.steps, config.seed),
            t5,
        )
    };

    // One multi-head model per size used: its config and the record of where it came from (its
    // pre-training stage, or its given checkpoint).
    let mut sizes: BTreeMap<String, (T5Config, serde_json::Value)> = BTreeMap::new();
    let pretrained_models: RefCell<BTreeMap<String, T5Model>> = RefCell::default();
    for m in &config.models {
        if sizes.contains_key(&m.size) {
            continue;
        }
        let t5 = config
            .t5(&m.size, config.pretrain.dropout)?
            .with_vocab_size(vocab);
        if let Some(spec) = &config.sizes[&m.size].checkpoint {
            let (t5, model) = load_pretrained(spec, &m.size, t5, &device)?;
            pretrained_models.borrow_mut().insert(m.size.clone(), model);
            sizes.insert(
                m.size.clone(),
                (t5, serde_json::json!({ "checkpoint": spec })),
            );
            continue;
        }
        let warmup = copy_warmup_stage(&m.size, &t5);
        let record = pretrain_stage(&m.size, &t5, warmup.as_ref()).record();
        sizes.insert(m.size.clone(), (t5, record));
    }
    // The pre-trained model of a size: the copy warm-up, then pre-training, each trained here or
    // reused when finished.
    let pretrained = |size: &str| -> Result<T5Model> {
        if let Some(model) = pretrained_models.borrow().get(size) {
            return Ok(model.clone());
        }
        let t5 = &sizes[size].0;
        device.seed(config.seed);
        let mut init = t5.init(&device);
        let warmup = copy_warmup_stage(size, t5);
        if let Some(stage) = &warmup {
            let w = &config.copy_warmup;
            let mut task = RandomCopyTask::new(
                sources.tok.clone(),
                (w.length, w.batch),
                config.pretrain.eval_size,
                config.seed,
            );
            init = stage.run(init, &mut task)?;
        }
        let model =
            pretrain_stage(size, t5, warmup.as_ref()).run(init, &mut span_task(config.seed)?)?;
        pretrained_models
            .borrow_mut()
            .insert(size.to_string(), model.clone());
        Ok(model)
    };

    // Conversion and uptraining: α × the pre-training steps, on other windows of the corpus.
    // Every model's held-out span-corruption loss on uptraining's held-out windows (the same
    // windows and noise for all): the multi-head model's, and a converted one's right after
    // conversion (α = 0) and after uptraining.
    let held_out = RefCell::new(SpanCorruptionTask::new(
        sources.data(&config.corpus)?,
        config.pretrain.batch,
        config.input_length,
        config.pretrain.eval_size,
        (config.seed.wrapping_add(1), config.pretrain_objective),
    )?);
    // A model of replicate `seed` before fine-tuning, as records: its config, where it came from,
    // and its uptraining stage (none for a multi-head model or α = 0).
    let upstream = |m: &ModelSpec, seed: u64| -> Result<UpstreamModel> {
        let (t5, pretrain) = sizes[&m.size].clone();
        let Some(groups) = m.kv_heads else {
            return Ok((t5, pretrain, None));
        };
        let t5 = t5.with_n_kv_heads(groups);
        let origin = serde_json::json!({
            "from": pretrain,
            "conversion": m.conversion,
            "kv_heads": groups,
            "seed": seed,
        });
        let steps = (m.alpha * config.pretrain.steps as f64).round() as usize;
        if steps == 0 {
            return Ok((t5, origin, None));
        }
        let stage = span_stage(
            format!("uptrain-{}{}", model_key(m), config.replicate_suffix(seed)),
            format!("uptrain {} (seed {seed})", m.name),
            origin,
            config.uptrain(steps, seed),
            &t5,
        );
        Ok((t5, stage.record(), Some(stage)))
    };
    // The model fine-tuning starts from, and its held-out span losses: the pre-trained model, or
    // that model converted (seeded by the replicate) and uptrained.
    let start_model = |m: &ModelSpec, seed: u64, uptrain: Option<&Stage>| {
        let base = pretrained(&m.size)?.with_dropout(config.pretrain.dropout);
        let Some(groups) = m.kv_heads else {
            let start = held_out.borrow_mut().eval_loss(&base, &device)?;
            let losses = SpanLosses {
                converted: None,
                start,
            };
            return anyhow::Ok((base, losses));
        };
        device.seed(seed);
        let converted = convert_kv_heads(base, groups, m.conversion()?).map_err(|e| anyhow!(e))?;
        let at_conversion = held_out.borrow_mut().eval_loss(&converted, &device)?;
        eprintln!(
            "{} (seed {seed}): held-out span loss right after conversion {at_conversion:.4}",
            m.name
        );
        let Some(stage) = uptrain else {
            let losses = SpanLosses {
                converted: Some(at_conversion),
                start: at_conversion,
            };
            return Ok((converted, losses));
        };
        let model = stage.run(converted, &mut span_task(seed.wrapping_add(1))?)?;
        let losses = SpanLosses {
            converted: Some(at_conversion),
            start: held_out.borrow_mut().eval_loss(&model, &device)?,
        };
        Ok((model, losses))
    };

    // The trivial baselines of every task, on the examples the models are scored on.
    let mut baselines = Vec::new();
    for task_config in &config.tasks {
        let data = sources.data(&task_config.dataset)?;
        let format = Seq2SeqTask {
            input_length: task_config.input_length,
            target_length: task_config.target_length,
        };
        let references: Vec<Vec<String>> = first_examples(
            data.spec,
            data.eval_files.clone(),
            &data.tok,
            format,
            config.score_examples,
        )?
        .into_iter()
        .map(|e| e.references)
        .collect();
        baselines.extend(trivial_baselines(task_config, &data, &references)?);
    }
    crate::write_csv(&cli.out.join("baselines.csv"), &baselines)?;

    // Fine-tuning, decoding, scoring and timing: every model on every task. A fine-tuning stage
    // with a result scored the same way ([`StageResult`]) is reused as it is, so that neither it
    // nor anything upstream of it needs weights: a fresh clone, which has the committed results
    // but no models, trains only what has no result yet.
    let inference = device.clone().without_autodiff();
    let scoring = Scoring {
        score_examples: config.score_examples,
        inference_batch: config.inference_batch,
    };
    let mut rows: Vec<ScoreRow> = Vec::new();
    for seed in config.replicate_seeds() {
        let suffix = config.replicate_suffix(seed);
        for m in &config.models {
            let (t5, origin, uptrain) = upstream(m, seed)?;
            // Made when the first task without a result needs it.
            let mut start: Option<(T5Model, SpanLosses)> = None;
            for task_config in &config.tasks {
                let format = Seq2SeqTask {
                    input_length: task_config.input_length,
                    target_length: task_config.target_length,
                };
                let t5_ft = t5.clone().with_dropout(config.finetune.dropout);
                let dir = stages.join(format!(
                    "finetune-{}-{}{suffix}",
                    model_key(m),
                    task_config.name
                ));
                let stage = Stage {
                    label: format!("finetune {} on {} (seed {seed})", m.name, task_config.name),
                    origin: serde_json::json!({
                        "from": origin, "task": task_config, "shuffle_buffer": config.shuffle_buffer,
                    }),
                    train: config.finetune.train(config.finetune.steps, seed),
                    flops_per_step: t5_ft.train_flops(
                        config.finetune.batch,
                        task_config.input_length,
                        task_config.target_length,
                    ),
                    config: t5_ft.clone(),
                    dir,
                    device: &device,
                    stop: &stop,
                };
                if let Some(row) = stage.result(&scoring)? {
                    eprintln!(
                        "{} on {} (seed {seed}): {} {:.2}, the result in {} (device {})",
                        m.name,
                        task_config.name,
                        row.metric,
                        row.score,
                        stage.dir.display(),
                        row.device
                    );
                    rows.push(ScoreRow {
                        model: m.name.clone(),
                        ..row
                    });
                    write_scores(&cli.out, &rows)?;
                    continue;
                }
                let (model, losses) = match start.take() {
                    Some(made) => made,
                    None => start_model(m, seed, uptrain.as_ref())?,
                };
                let data = sources.data(&task_config.dataset)?;
                let examples = first_examples(
                    data.spec,
                    data.eval_files.clone(),
                    &data.tok,
                    format,
                    config.score_examples,
                )?;
                let shuffle = data::epochs::Shuffle {
                    buffer: config.shuffle_buffer,
                    seed,
                };
                let mut task = FineTuneTask::new(
                    data,
                    format,
                    (config.finetune.batch, config.finetune.eval_size),
                    shuffle,
                )?;
                let tuned = stage.run(
                    model.clone().with_dropout(config.finetune.dropout),
                    &mut task,
                )?;
                let finetune_step = stage.kept_step()?;
                let eval_loss = task.eval_loss(&tuned.valid(), &device)?;
                let tuned = tuned.valid().to_device(&inference);
                let predictions = generate(
                    &tuned,
                    &examples,
                    config.inference_batch,
                    task_config.target_length,
                    task.tokenizer(),
                    &inference,
                )?;
                let s_per_sample = time_per_sample(
                    &tuned,
                    &examples,
                    config.inference_batch,
                    task_config.target_length,
                    &inference,
                );
                let references: Vec<Vec<String>> =
                    examples.iter().map(|e| e.references.clone()).collect();
                let value = score(task_config.metric, &predictions, &references);
                let predictions_path = stage.dir.join("predictions.jsonl");
                let lines: String = predictions
                    .iter()
                    .zip(&references)
                    .map(|(p, r)| {
                        serde_json::json!({"prediction": p, "references": r}).to_string() + "\n"
                    })
                    .collect();
                write_atomic(&predictions_path, lines.as_bytes())?;
                eprintln!(
                    "{} on {} (seed {seed}): {:?} {value:.2}, {s_per_sample:.4} s/sample",
                    m.name, task_config.name, task_config.metric
                );
                let row = ScoreRow {
                    model: m.name.clone(),
                    size: m.size.clone(),
                    kv_heads: t5.n_kv_heads,
                    conversion: if m.kv_heads.is_some() {
                        m.conversion.clone()
                    } else {
                        "-".into()
                    },
                    alpha: m.alpha,
                    seed,
                    task: task_config.name.clone(),
                    metric: format!("{:?}", task_config.metric).to_lowercase(),
                    score: value,
                    eval_loss,
                    s_per_sample,
                    span_loss_converted: losses.converted,
                    span_loss: Some(losses.start),
                    examples: examples.len(),
                    finetune_step: Some(finetune_step),
                    device: provenance.device.clone(),
                };
                stage.save_result(&scoring, &row)?;
                rows.push(row);
                write_scores(&cli.out, &rows)?;
                start = Some((model, losses));
            }
        }
    }
    render(&cli.out)?;
    eprintln!("wrote {}", cli.out.display());
    Ok(())
}

fn write_scores(out: &Path, rows: &[ScoreRow]) -> Result<()> {
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

/// Writes `table.md` (Table 1's layout: time per sample, average, one column per task),
/// `score_vs_time.png/svg` (Figure 3: average score against time per sample) and
/// `loss_vs_time.png/svg` (the fine-tuned held-out loss against time per sample: the finer measure
/// when the scores are at their floor, as at cpu scale) from `scores.csv`; the tables also fill the
/// `table.md` block of the artifact's README, if it has one.
pub fn render(out: &Path) -> Result<()> {
    let rows = read_scores(out)?;
    let mut tasks: Vec<String> = Vec::new();
    let mut models: Vec<String> = Vec::new();
    for r in &rows {
        if !tasks.contains(&r.task) {
            tasks.push(r.task.clone());
        }
        if !models.contains(&r.model) {
            models.push(r.model.clone());
        }
    }
    let mut md = String::from(
        "# GQA uptraining on this machine\n\nGenerated from `scores.csv`. T_infer: seconds per sample of \
         greedy decoding (encoder included; every sample decodes the task's full output length), \
         mean over the tasks; speedup: the multi-head model of \
         the same size's T_infer over this one's; avg: mean of the task scores; loss: mean over the \
         tasks of the fine-tuned model's held-out token cross-entropy (teacher forced), the finer \
         measure of quality when scores are small; span α=0 / span: held-out span-corruption loss \
         right after conversion / of the model fine-tuning starts from (after uptraining); ft step: \
         the fine-tuning step of the scored model (the evaluation with the lowest held-out loss \
         under `keep = \"best_eval\"`), its range over tasks and seeds. With \
         several seeds (each converts, uptrains and fine-tunes again from the same pre-trained \
         model), a cell is the mean over the seeds with their range in brackets.\n\n",
    );
    // The tables (not the explanation above them) also go into the README's generated block.
    let tables_start = md.len();
    md += &format!(
        "| model | K/V heads | conversion | α | seeds | span α=0 | span | ft step | T_infer (s) | speedup | avg | loss | {} |\n|{}\n",
        tasks.join(" | "),
        "---|".repeat(12 + tasks.len())
    );
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let t_infer =
        |mine: &[&ScoreRow]| mean(&mine.iter().map(|r| r.s_per_sample).collect::<Vec<_>>());
    let (mut points, mut loss_points) = (Vec::new(), Vec::new());
    for m in &models {
        let mine: Vec<&ScoreRow> = rows.iter().filter(|r| &r.model == m).collect();
        let first = mine[0];
        let t = t_infer(&mine);
        // The unconverted row of this size (conversion "-") is the baseline of the speedup.
        let mha: Vec<&ScoreRow> = rows
            .iter()
            .filter(|r| r.size == first.size && r.conversion == "-")
            .collect();
        let speedup = if mha.is_empty() {
            "—".to_string()
        } else {
            format!("{:.2}×", t_infer(&mha) / t)
        };
        let per_seed = average_scores(&mine);
        let avg = Spread::of(&per_seed.values().copied().collect::<Vec<_>>());
        let loss = mean(&mine.iter().map(|r| r.eval_loss).collect::<Vec<_>>());
        let cells: Vec<String> = tasks
            .iter()
            .map(|task| {
                let scores: Vec<f64> = mine
                    .iter()
                    .filter(|r| &r.task == task)
                    .map(|r| r.score)
                    .collect();
                if scores.is_empty() {
                    "—".into()
                } else {
                    Spread::of(&scores).show(1)
                }
            })
            .collect();
        let span = |x: fn(&ScoreRow) -> Option<f64>| {
            let xs: Vec<f64> = mine.iter().filter_map(|r| x(r)).collect();
            if xs.is_empty() {
                "—".into()
            } else {
                Spread::of(&xs).show(3)
            }
        };
        let steps: Vec<usize> = mine.iter().filter_map(|r| r.finetune_step).collect();
        let ft_step = match (steps.iter().min(), steps.iter().max()) {
            (Some(lo), Some(hi)) if lo == hi => lo.to_string(),
            (Some(lo), Some(hi)) => format!("{lo}–{hi}"),
            _ => "—".into(),
        };
        md += &format!(
            "| {m} | {} | {} | {} | {} | {} | {} | {ft_step} | {t:.4} | {speedup} | {} | {loss:.3} | {} |\n",
            first.kv_heads,
            first.conversion,
            first.alpha,
            per_seed.len(),
            span(|r| r.span_loss_converted),
            span(|r| r.span_loss),
            avg.show(1),
            cells.join(" | ")
        );
        points.push(Series {
            name: m.clone(),
            points: vec![(t, avg.mean)],
        });
        loss_points.push(Series {
            name: m.clone(),
            points: vec![(t, loss)],
        });
    }
    let baselines = out.join("baselines.csv");
    if baselines.exists() {
        let baselines: Vec<BaselineRow> = crate::read_csv(&baselines)?;
        md += &format!(
            "\nTrivial baselines on the same examples (`baselines.csv`): *{COPY_INPUT}* writes each example's \
             input (a QA example's context) cut to the output length; *{MOST_FREQUENT}* writes the most \
             frequent target of the first {BASELINE_TRAIN_EXAMPLES} training examples for every example.\n\n\
             | baseline | {} |\n|{}\n",
            tasks.join(" | "),
            "---|".repeat(1 + tasks.len())
        );
        for name in [COPY_INPUT, MOST_FREQUENT] {
            let cells: Vec<String> = tasks
                .iter()
                .map(|task| {
                    baselines
                        .iter()
                        .find(|b| &b.task == task && b.baseline == name)
                        .map_or("—".into(), |b| format!("{:.1}", b.score))
                })
                .collect();
            md += &format!("| {name} | {} |\n", cells.join(" | "));
        }
    }
    let device = rows.first().map(|r| r.device.clone()).unwrap_or_default();
    for (file, what, y_label, series) in [
        ("score_vs_time", "Average score", "average score", &points),
        (
            "loss_vs_time",
            "Fine-tuned held-out loss",
            "held-out token cross-entropy (mean over tasks)",
            &loss_points,
        ),
    ] {
        LineChart {
            title: format!("{what} vs time per sample — {device}"),
            x_label: "seconds per sample".into(),
            y_label: y_label.into(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
        }
        .save(&out.join(file), series)?;
    }
    write_atomic(&out.join("table.md"), md.as_bytes())?;
    report::readme::fill(&out.join("README.md"), "table.md", &md[tables_start..])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paper() -> PipelineConfig {
        let text = crate::configs::builtin("gqa_table1", crate::Profile::Paper).unwrap();
        let table =
            crate::configs::resolve(text.parse().unwrap(), crate::Profile::Paper, "paper").unwrap();
        PipelineConfig::deserialize(toml::Value::Table(table)).unwrap()
    }

    /// Uptraining continues the pre-training schedule by default: at XXL's 1M pre-training steps
    /// and the inverse-square-root schedule, uptraining's first step runs at 1/sqrt(10^6 + 1)
    /// ≈ 1e-3, not at the restarted schedule's peak 0.01.
    #[test]
    fn uptraining_continues_the_pretraining_schedule_by_default() {
        let config = paper();
        assert_eq!(config.uptrain_schedule, UptrainSchedule::Continue);
        let s_pre = config.pretrain.steps;
        let steps = (0.05 * s_pre as f64) as usize;
        let up = config.uptrain(steps, config.seed);
        let pre = config.pretrain.train(s_pre, config.seed);
        for s in [1, steps / 2, steps] {
            let want = pre.schedule.lr(s_pre + s, s_pre + steps);
            assert!((up.schedule.lr(s, steps) - want).abs() < 1e-15, "step {s}");
        }
        assert!((up.schedule.lr(1, steps) - 1.0 / ((s_pre + 1) as f64).sqrt()).abs() < 1e-12);
        let restart = PipelineConfig {
            uptrain_schedule: UptrainSchedule::Restart,
            ..config
        };
        // T5's schedule holds its peak through the 10^4 warm-up steps: a restart jumps back to 0.01.
        let first = restart.uptrain(steps, restart.seed).schedule.lr(1, steps);
        assert!(
            (first - 0.01).abs() < 1e-12,
            "a restart starts at the peak: {first}"
        );
    }

    /// Without a copy warm-up the pre-training lineage is what it was before the field existed
    /// (so committed stages are reused); with one, the warm-up's record is in it, and the warm-up
    /// trains with its own optimizer at a constant rate.
    #[test]
    fn copy_warmup_enters_the_lineage_only_when_it_trains() {
        let config = paper();
        assert_eq!(config.copy_warmup.steps, 0, "the paper has no warm-up");
        assert_eq!(
            pretrain_origin(&config, None),
            serde_json::json!({ "init": "random", "seed": config.seed })
        );
        let record = serde_json::json!({ "train": "the warm-up" });
        let origin = pretrain_origin(&config, Some(record.clone()));
        assert_eq!(origin["copy_warmup"], record);
        let warmup = CopyWarmup {
            steps: 600,
            ..CopyWarmup::default()
        };
        let train = warmup.train(&config.pretrain, config.seed);
        assert_eq!(train.steps, 600);
        assert_eq!(train.optimizer, OptimizerConfig::adafactor_t5());
        for s in [1, 300, 600] {
            assert!((train.schedule.lr(s, 600) - 0.03).abs() < 1e-15, "step {s}");
        }
    }

    /// T5's Adafactor (update scaled by the parameter's RMS) in every paper-scale stage.
    #[test]
    fn paper_configs_use_t5s_adafactor() {
        let config = paper();
        for stage in [&config.pretrain, &config.finetune] {
            assert_eq!(stage.optimizer, OptimizerConfig::adafactor_t5());
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
