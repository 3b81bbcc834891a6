//! The GQA pipeline's configuration: the T5.1.1 sizes, the models (conversion, α), the stages'
//! training recipes, the tasks and their metrics, the copy warm-up.

use std::collections::BTreeMap;

use anyhow::{Context, Result, anyhow, bail};
use data::tasks::PretrainObjective;
use model::t5::{KvConversion, T5Config};
use serde::{Deserialize, Serialize};
use training::optimizer::OptimizerConfig;
use training::schedule::{Decay, Schedule};
use training::trainer::{KeepModel, TrainConfig};

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

pub(super) fn default_conversion() -> String {
    "mean".into()
}

impl ModelSpec {
    pub(super) fn conversion(&self) -> Result<KvConversion> {
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
    pub(super) fn train(&self, steps: usize, seed: u64) -> TrainConfig {
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
    /// `results/gqa_table1/stages`, so the three figures rest on the same pre-trained models.
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
    pub(super) fn stage(&self, pretrain: &StageConfig) -> StageConfig {
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
    pub(super) fn train(&self, pretrain: &StageConfig, seed: u64) -> TrainConfig {
        self.stage(pretrain).train(self.steps, seed)
    }
}

/// The record of a pre-training stage's start: random weights, the seed, and the objective when
/// it is not T5's (so stages pre-trained before the field existed keep matching their lineage).
pub(super) fn pretrain_origin(
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

pub(super) fn default_shuffle_buffer() -> usize {
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
    pub(super) fn replicate_suffix(&self, seed: u64) -> String {
        if seed == self.seed {
            String::new()
        } else {
            format!("-s{seed}")
        }
    }

    pub(super) fn t5(&self, size: &str, dropout: f64) -> Result<T5Config> {
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

    pub(super) fn validate(&self) -> Result<()> {
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
