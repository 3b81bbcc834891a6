//! The sweep's configuration: objective, models, contexts, rates, seeds, what its table decides.

use std::collections::BTreeMap;

use anyhow::{Context, Result, anyhow, bail};
use model::{Direction, ModelConfig};
use serde::{Deserialize, Serialize};
use training::lm_task::WindowOrder;
use training::optimizer::OptimizerConfig;
use training::schedule::{Decay, Schedule};
use training::trainer::{KeepModel, TrainConfig};

/// The training objective of a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Next-token prediction with causal models (Wiki-40B, PG-19: Figure 6, Table 3).
    Causal,
    /// BERT-style masked-token prediction with bidirectional models (C4: Figure 5); perplexity over
    /// the masked tokens only.
    Masked,
}

impl Objective {
    pub(super) fn direction(self) -> Direction {
        match self {
            Objective::Causal => Direction::Causal,
            Objective::Masked => Direction::Bidirectional,
        }
    }
}

/// What a sweep's `table.md` shows after the per-model summary (perplexity and speedup).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepTable {
    /// The summary only (Tables 3, 12, 13; Figure 7).
    #[default]
    Speedup,
    /// Also the perplexity lost by chunking per context (Table 5): FLASH-Quad → FLASH against
    /// Transformer++ → MC-TFM++ (and the relu² Transformer++ control when trained), with the
    /// verdict on "the GAU loses less".
    ChunkingLoss,
    /// Also a layer-ablation table (Tables 1 and 2): per context, every model's final perplexity
    /// over the baseline's (the default layer), with the verdict on "the default is the best or
    /// within its seed spread" (F8).
    Ablation,
    /// Also perplexity against model size (Figure 3; [`crate::lm_sweep::scaling`]): each family's final
    /// perplexity per size, FLASH-Quad against Transformer++ per size (F7), and a chart against
    /// parameters.
    Scaling,
    /// Also the claimed models' speedup against run length ([`crate::lm_sweep::length_trend`]): this
    /// sweep's runs beside the shorter runs of the sweeps in `length_trend_of`.
    LengthTrend,
}

/// One sweep, one file per scale under `experiments/configs/<id>/`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LmSweepConfig {
    /// What the run reproduces and what the paper reports.
    pub description: String,
    /// Causal or masked language modelling.
    pub objective: Objective,
    /// Dataset name (`datasets list`).
    pub dataset: String,
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
    /// Architectures by name, each trained once per seed of `seeds`.
    pub models: Vec<String>,
    /// Architectures trained with the first seed only (references beside the claim's models).
    #[serde(default)]
    pub one_seed_models: Vec<String>,
    /// Seeds (model initialisation, data order, masking): a claim that rests on a difference
    /// between models needs the spread over seeds.
    pub seeds: Vec<u64>,
    /// Models the paper says reach the baseline's final perplexity sooner (speedup > 1); each gets
    /// a verdict in `table.md`.
    #[serde(default)]
    pub claimed_faster: Vec<String>,
    /// Model-config fields changed for every model (e.g. `{ d_model = 128, n_blocks = 2 }`),
    /// applied to the preset before a variant's own `set`.
    #[serde(default)]
    pub set: toml::Table,
    /// Extra models: an architecture with some model-config fields changed (e.g. FLASH with chunk
    /// 512), trained and drawn beside the others under their own name.
    #[serde(default)]
    pub variants: Vec<Variant>,
    /// Models timed by the step-time calibration but never trained: the cost of a variant whose
    /// quality the sweep does not need (fig6: Performer with token-level prefix sums, the paper's
    /// Performer, beside the blockwise one it trains).
    #[serde(default)]
    pub timed_variants: Vec<Variant>,
    /// The model whose final perplexity the others must reach (the paper: Transformer++, or
    /// Transformer+ for PG-19).
    pub baseline: String,
    /// Context lengths.
    pub contexts: Vec<usize>,
    /// Model size preset (`tiny`, `latency_bench`, `paper_base`, `paper_large`).
    pub preset: String,
    /// Tokens per batch; batch = max(1, tokens_per_batch / context).
    pub tokens_per_batch: usize,
    /// Optimizer steps per run.
    pub steps: usize,
    pub optimizer: OptimizerConfig,
    /// Peak learning rate of every model not named in `peak_lr_by_model`.
    pub peak_lr: f64,
    /// Peak learning rates of named models (names as in `models`, `one_seed_models` or
    /// `variants`) that replace `peak_lr` for them, e.g. `{ transformer_plusplus = 0.002 }`. Not
    /// in the paper's text (its hyperparameter tables are in the PDF only); for a scale at which
    /// one rate does not suit every model, each model's rate chosen by a pilot that the config's
    /// comment gives, so that no model is compared at a rate that handicaps it. Default: none.
    #[serde(default)]
    pub peak_lr_by_model: std::collections::BTreeMap<String, f64>,
    pub warmup_steps: usize,
    pub decay: Decay,
    /// Micro-batches per step.
    pub grad_accum: usize,
    /// Per-parameter gradient-norm clipping; 0 = off.
    pub clip_norm: f32,
    /// Evaluate every this many steps.
    pub eval_every: usize,
    /// Held-out tokens per evaluation, the same at every context: `eval_tokens / context` windows
    /// (at least one) of `context + 1` tokens (`context` for the masked objective) from the
    /// validation split, the same windows at every evaluation.
    pub eval_tokens: usize,
    /// Checkpoint every this many steps (0 = at the end and on Ctrl-C).
    pub checkpoint_every: usize,
    /// Step-time calibration, after the runs: rounds in which every model takes one training step
    /// of its runs' kind (same model, batch, optimizer, objective), in turn, per context, after
    /// one untimed round; the speedups' step-time ratios come from these rounds
    /// (`step_times.csv`), since runs trained in different sessions were timed on a machine of a
    /// different speed. 0: no calibration (the ratios come from the runs' own device-hours).
    /// Default 9 (not in the paper, which trains every model on its own TPU slice): single steps on
    /// a shared 2-core machine jitter by ±20%, and the ratio's interquartile range narrows with
    /// more rounds.
    #[serde(default = "default_timing_rounds")]
    pub timing_rounds: usize,
    /// What `table.md` shows beyond the summary.
    #[serde(default)]
    pub table: SweepTable,
    /// The order of the training windows: `{ kind = "shuffled", block_tokens = N }` (the
    /// papers' pipelines read their corpora shuffled; the seed of a run draws its order) or
    /// `{ kind = "file" }`. Default (a config that does not say): file order, what the sweeps
    /// read before the field existed.
    #[serde(default)]
    pub train_order: WindowOrder,
    /// The split the held-out curves and the verdicts read: `test`, with the validation split
    /// evaluated at each run's end for the choices made between runs (`lr_grid`), or
    /// `validation` (default: what the sweeps read before the field existed; then nothing may be
    /// chosen on held-out data).
    #[serde(default)]
    pub eval_split: EvalSplit,
    /// Peak learning rates each model of `models` is tried at, with the first seed; each model
    /// and context then trains its other seeds at the rate whose run ends with the lowest
    /// validation loss (which must lie inside the grid, not at its edge). `one_seed_models` and
    /// the variants train at the rate the baseline chose. Empty (default): no choice, every model
    /// at `peak_lr` / `peak_lr_by_model`. Needs `eval_split = "test"`.
    #[serde(default)]
    pub lr_grid: Vec<f64>,
    /// With `table = "length_trend"`: the experiments whose results hold the same models at
    /// fewer steps (e.g. `["fig6"]`), read from beside this sweep's output directory.
    #[serde(default)]
    pub length_trend_of: Vec<String>,
    /// An experiment whose rate choices (its `lr_grid`, read from its results beside this
    /// sweep's output directory) set this sweep's rates per model and context: a model it chose
    /// for takes that rate, a variant its base model's, any other the rate of the model
    /// `lr_family` names. For the ablation artifacts, which keep one rate per model family
    /// (GAU variants at FLASH-Quad's, Transformer variants at Transformer++'s). Empty (default):
    /// `peak_lr` / `peak_lr_by_model`.
    #[serde(default)]
    pub peak_lr_from: String,
    /// With `peak_lr_from`: the model of the other sweep whose rate a model takes, e.g.
    /// `{ mc_tfmpp = "transformer_plusplus" }`.
    #[serde(default)]
    pub lr_family: std::collections::BTreeMap<String, String>,
}

/// The held-out split of a sweep's curves and verdicts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalSplit {
    /// Curves and verdicts on validation; no selection split.
    #[default]
    Validation,
    /// Curves and verdicts on test; choices on validation.
    Test,
}

pub(super) fn default_timing_rounds() -> usize {
    9
}

/// A named architecture variant: `set` overrides fields of the preset's [`ModelConfig`] (any of its
/// fields, by name: `chunk_size`, `d_qk`, `expansion_factor`, `scaling`, ...).
///
/// ```toml
/// [[variants]]
/// name = "flash_c512"
/// model = "flash"
/// set = { chunk_size = 512 }
/// ```
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// The name in `metrics.csv`, the charts and `table.md`.
    pub name: String,
    /// The architecture it starts from.
    pub model: String,
    /// Model-config fields to change.
    pub set: toml::Table,
}

/// `base` with the fields of `set` changed; an unknown field or a wrong type is an error that
/// names `what` (the variant, or the sweep's `set`).
pub(super) fn apply_set(base: ModelConfig, set: &toml::Table, what: &str) -> Result<ModelConfig> {
    let mut json = serde_json::to_value(&base)?;
    let fields = json
        .as_object_mut()
        .ok_or_else(|| anyhow!("model config is not a table"))?;
    for (key, value) in set {
        if !fields.contains_key(key) {
            let mut known: Vec<&String> = fields.keys().collect();
            known.sort();
            bail!("{what}: `{key}` is not a model-config field; known fields: {known:?}");
        }
        fields.insert(key.clone(), serde_json::to_value(value)?);
    }
    serde_json::from_value(json)
        .with_context(|| format!("{what}: a value in `set` has the wrong type"))
}

/// The paper's table that a sweep binary's `table.md` reproduces.
pub(super) fn paper_table(id: &str) -> String {
    match id {
        "fig5" => "FLASH Table 12 (masked LM, Figure 5)".into(),
        "fig6" => "FLASH Table 13 (causal LM, Figure 6)".into(),
        "table3" => "FLASH Table 3 (causal LM on PG-19)".into(),
        "fig7" => "FLASH Figure 7 (ablations of mixed chunk attention)".into(),
        "table5" => "FLASH Table 5 (the perplexity lost by chunking)".into(),
        "fig8" => "FLASH Figure 8 (chunk sizes)".into(),
        "table1" => "FLASH Table 1 (GAU ablations)".into(),
        "table2" => "FLASH Table 2 (Transformer++ ablations)".into(),
        "fig3" => "FLASH Figure 3 (GAU against the Transformer across model sizes)".into(),
        "f4_length" => "FLASH's speedup (F4) against training length".into(),
        other => format!("`{other}`"),
    }
}

/// The peak learning rate of the sweep's model `name`: its entry of `peak_lr_by_model`, else
/// `peak_lr`.
pub(super) fn model_peak_lr(config: &LmSweepConfig, name: &str) -> f64 {
    config
        .peak_lr_by_model
        .get(name)
        .copied()
        .unwrap_or(config.peak_lr)
}

/// A note when the command line sets `peak_lr` but the config's `peak_lr_by_model` keeps some
/// models at their own rates (a pilot meant for every model would reuse their runs instead).
pub(super) fn lr_set_shadowed(sets: &[(String, String)], config: &LmSweepConfig) -> Option<String> {
    let set_here = |key: &str| sets.iter().any(|(k, _)| k == key);
    if !set_here("peak_lr") || set_here("peak_lr_by_model") || config.peak_lr_by_model.is_empty() {
        return None;
    }
    let names: Vec<&String> = config.peak_lr_by_model.keys().collect();
    Some(format!(
        "--set peak_lr={} does not change {names:?}, which keep their rates from `peak_lr_by_model`; add --set 'peak_lr_by_model={{}}' to train every model at {}",
        config.peak_lr, config.peak_lr
    ))
}

/// How a run of the sweep trains, with `seed` and `peak_lr`.
pub(super) fn run_train_config_at(config: &LmSweepConfig, seed: u64, peak_lr: f64) -> TrainConfig {
    TrainConfig {
        steps: config.steps,
        optimizer: config.optimizer,
        schedule: Schedule::new(peak_lr, config.warmup_steps, config.decay),
        grad_accum: config.grad_accum,
        clip_norm: (config.clip_norm > 0.0).then_some(config.clip_norm),
        eval_every: config.eval_every,
        checkpoint_every: config.checkpoint_every,
        seed,
        keep: KeepModel::Last,
    }
}

/// The step's batch in sequences, max(1, tokens_per_batch / context), and each device's share of it:
/// data parallelism splits the batch, so a step sees the same tokens on any number of devices.
pub(super) fn split_batch(
    tokens_per_batch: usize,
    context: usize,
    devices: usize,
) -> Result<(usize, usize)> {
    let batch = (tokens_per_batch / context).max(1);
    if !batch.is_multiple_of(devices) {
        bail!(
            "--devices {devices}: a batch of {batch} sequences (tokens_per_batch {tokens_per_batch} / context {context}) does not split evenly; make tokens_per_batch a multiple of context × devices"
        );
    }
    Ok((batch, batch / devices))
}
