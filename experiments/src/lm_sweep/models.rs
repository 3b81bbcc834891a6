//! The models of a sweep: its names, architectures, variants and seeds, each run's model
//! configuration, and the identity a run's model has in the run store.

use anyhow::{Result, anyhow, bail};
use model::{Architecture, ModelConfig};
use training::trainer::TrainConfig;

use super::config::{
    LmSweepConfig, SweepTable, Variant, apply_set, model_peak_lr, run_train_config_at,
};

/// The model configuration of `m`'s runs at `context`: the preset, the sweep's `set`, then the
/// variant's.
pub(super) fn run_model_config(
    config: &LmSweepConfig,
    m: &SweepModel,
    context: usize,
    vocab: usize,
) -> Result<ModelConfig> {
    let base = ModelConfig::preset(&config.preset, m.arch, context)
        .map_err(|e| anyhow!(e))?
        .with_vocab_size(vocab);
    let mut model_config = apply_set(base, &config.set, "the sweep's `set`")?;
    let mut what = "the sweep's `set`".to_string();
    if let Some(v) = m.variant {
        what = format!("variant `{}`", v.name);
        model_config = apply_set(model_config, &v.set, &what)?;
    }
    model_config
        .check()
        .map_err(|e| anyhow!("{what} of `{}`: {e}", m.name))?;
    Ok(model_config)
}

/// The model configuration a run's identity names ([`model_identity`]'s inverse): the fields it
/// leaves out take their defaults.
pub fn model_from_identity(model: &serde_json::Value) -> Result<ModelConfig> {
    let arch: Architecture = serde_json::from_value(model["arch"].clone())?;
    let mut json = serde_json::to_value(ModelConfig::new(arch))?;
    if let Some(fields) = model.as_object() {
        for (key, value) in fields {
            json[key] = value.clone();
        }
    }
    Ok(serde_json::from_value(json)?)
}

/// The model fields a run's identity names only where they differ from the architecture's default:
/// the paper's ablations (Table 1: the GAU's scoring, heads, gate, relative bias and RoPE) and
/// Performer's prefix sums. A run of the default model is named without them, so giving a model a
/// new ablation switch (at its default) renames no run of the store; the other fields are always
/// named.
const NAMED_WHEN_CHANGED: [&str; 6] = [
    "gau_scoring",
    "gau_heads",
    "gau_gated",
    "gau_relative_bias",
    "gau_rope",
    "performer_prefix",
];

/// A model configuration as a run's identity names it: the fields of [`NAMED_WHEN_CHANGED`] left
/// out at their defaults.
pub fn model_identity(model: &ModelConfig) -> Result<serde_json::Value> {
    let mut json = serde_json::to_value(model)?;
    let defaults = serde_json::to_value(ModelConfig::new(model.arch))?;
    if let Some(fields) = json.as_object_mut() {
        for key in NAMED_WHEN_CHANGED {
            if fields.get(key) == defaults.get(key) {
                fields.remove(key);
            }
        }
    }
    Ok(json)
}

/// Each model of the sweep with its resolved model configuration at `context` (vocabulary as the
/// preset's: what the claims read, chunk sizes and architectures, does not depend on it).
pub fn resolved_models(
    config: &LmSweepConfig,
    context: usize,
) -> Result<Vec<(String, ModelConfig)>> {
    sweep_models(config)?
        .iter()
        .map(|m| {
            let vocab = ModelConfig::preset(&config.preset, m.arch, context)
                .map_err(|e| anyhow!(e))?
                .vocab_size;
            Ok((m.name.clone(), run_model_config(config, m, context, vocab)?))
        })
        .collect()
}

/// The model configuration `name`'s runs of the sweep have at `context`, with the vocabulary the
/// sweep's tokenizer will give (no data read: `--dry-run` of the experiments built on a sweep).
pub fn planned_model(config: &LmSweepConfig, name: &str, context: usize) -> Result<ModelConfig> {
    let models = sweep_models(config)?;
    let Some(m) = models.iter().find(|m| m.name == name) else {
        bail!("`{name}` is not a model of the sweep");
    };
    let vocab = crate::dry_run::vocab_size(&config.tokenizer)?;
    run_model_config(config, m, context, vocab)
}

/// One model of a sweep: its name, architecture, variant (if any) and seeds.
pub(super) struct SweepModel<'a> {
    pub(super) name: String,
    pub(super) arch: Architecture,
    pub(super) variant: Option<&'a Variant>,
    pub(super) seeds: Vec<u64>,
}

/// The sweep's `timed_variants`, trained with no seed (the step-time calibration times them).
pub(super) fn timed_only_models(config: &LmSweepConfig) -> Result<Vec<SweepModel<'_>>> {
    let trained = sweep_models(config)?;
    config
        .timed_variants
        .iter()
        .map(|v| {
            if trained.iter().any(|m| m.name == v.name) {
                bail!(
                    "timed_variants: `{}` is also a trained model of the sweep",
                    v.name
                );
            }
            Ok(SweepModel {
                name: v.name.clone(),
                arch: v.model.parse().map_err(|e: String| anyhow!(e))?,
                variant: Some(v),
                seeds: Vec::new(),
            })
        })
        .collect()
}

/// The sweep's models in order: `models` (every seed), `one_seed_models` (the first seed), then the
/// variants (every seed); names unique, the baseline among them.
pub(super) fn sweep_models(config: &LmSweepConfig) -> Result<Vec<SweepModel<'_>>> {
    let Some(&first) = config.seeds.first() else {
        bail!("`seeds` is empty; give at least one seed, e.g. seeds = [0]");
    };
    // Checked before anything is written or trained (the trainer would refuse them at the first run).
    for (name, value) in [
        ("steps", config.steps),
        ("eval_every", config.eval_every),
        ("grad_accum", config.grad_accum),
        ("tokens_per_batch", config.tokens_per_batch),
        ("eval_tokens", config.eval_tokens),
    ] {
        if value == 0 {
            bail!("`{name}` must be positive (got 0)");
        }
    }
    if config.contexts.is_empty() {
        bail!("`contexts` is empty; give at least one context, e.g. contexts = [512]");
    }
    let parse = |m: &String| -> Result<Architecture> { m.parse().map_err(|e: String| anyhow!(e)) };
    let mut models = Vec::new();
    for (names, seeds) in [
        (&config.models, config.seeds.clone()),
        (&config.one_seed_models, vec![first]),
    ] {
        for name in names {
            models.push(SweepModel {
                name: name.clone(),
                arch: parse(name)?,
                variant: None,
                seeds: seeds.clone(),
            });
        }
    }
    for v in &config.variants {
        models.push(SweepModel {
            name: v.name.clone(),
            arch: parse(&v.model)?,
            variant: Some(v),
            seeds: config.seeds.clone(),
        });
    }
    for (i, m) in models.iter().enumerate() {
        if m.name.is_empty() || m.name.contains([',', '"', '\n', '/']) {
            bail!(
                "model name `{}` must be non-empty without commas, quotes, slashes or newlines (it is a CSV field)",
                m.name
            );
        }
        if models[..i].iter().any(|o| o.name == m.name) {
            bail!("model name `{}` appears twice in the sweep", m.name);
        }
    }
    if !models.iter().any(|m| m.name == config.baseline) {
        let names: Vec<&String> = models.iter().map(|m| &m.name).collect();
        bail!(
            "baseline `{}` is not one of the models {names:?}",
            config.baseline
        );
    }
    for (name, &lr) in &config.peak_lr_by_model {
        if !models.iter().any(|m| &m.name == name) {
            bail!("peak_lr_by_model names `{name}`, which is not a model of the sweep");
        }
        if !(lr.is_finite() && lr > 0.0) {
            bail!("peak_lr_by_model: `{name}` = {lr} must be a positive learning rate");
        }
    }
    crate::lm_sweep::lr_choice::check_grid(config)?;
    for c in &config.claimed_faster {
        if !models.iter().any(|m| &m.name == c) {
            bail!("claimed_faster names `{c}`, which is not a model of the sweep");
        }
    }
    if config.table == SweepTable::ChunkingLoss {
        for needed in crate::verdict::CHUNKING_MODELS {
            if !models.iter().any(|m| m.name == needed) {
                bail!("table = \"chunking_loss\" needs the model `{needed}`; add it to `models`");
            }
        }
    }
    Ok(models)
}

/// How `m`'s runs of the sweep train, with `seed`, at its configured rate.
pub(super) fn run_train_config(config: &LmSweepConfig, m: &SweepModel, seed: u64) -> TrainConfig {
    run_train_config_at(config, seed, model_peak_lr(config, &m.name))
}
