//! The scale at which a committed result was decided, computed from its resolved config and
//! provenance (`config.json`, `env.json`), never typed: the profile, parameters without the
//! token embedding, training tokens per run, seeds and the device. `claims.md` puts it on every
//! row, because a verdict at ~1M parameters and ~1M tokens says what happens at that scale,
//! not at the paper's ~100M parameters and ~30B tokens.

use std::path::Path;

use anyhow::{Context, Result};
use burn::module::Module;

use crate::gqa::{PipelineConfig, SizeConfig};
use crate::lm_sweep::{LmSweepConfig, planned_model, saved_config};

/// What one result's runs were.
#[derive(Clone, Debug, PartialEq)]
pub struct Scale {
    /// The profile of the command that made the result (`smoke`, `cpu`, `paper`).
    pub profile: String,
    /// Parameters without the token embedding: the smallest and largest model of the result.
    pub params: (usize, usize),
    /// Training tokens each run saw (for the GQA pipeline: pre-training's).
    pub tokens_per_run: f64,
    /// Seeds per model (the claim's models).
    pub seeds: usize,
    /// The device of the command that made the result.
    pub device: String,
}

impl Scale {
    /// "cpu scale: 0.8–1.0M params, 0.66M tokens/run, 3 seeds, flex (…)".
    pub fn show(&self) -> String {
        let m = |p: usize| p as f64 / 1e6;
        let (lo, hi) = (
            format!("{:.2}", m(self.params.0)),
            format!("{:.2}", m(self.params.1)),
        );
        let params = if lo == hi {
            format!("{lo}M")
        } else {
            format!("{lo}–{hi}M")
        };
        format!(
            "{} scale: {params} params, {} tokens/run, {} seed{}, {}",
            self.profile,
            tokens(self.tokens_per_run),
            self.seeds,
            if self.seeds == 1 { "" } else { "s" },
            self.device
        )
    }
}

/// A token count as "0.66M", "33B".
fn tokens(n: f64) -> String {
    if n >= 1e9 {
        format!("{:.3}B", n / 1e9)
    } else if n >= 1e5 {
        format!("{:.2}M", n / 1e6)
    } else {
        format!("{:.0}K", n / 1e3)
    }
}

/// The device named in `dir`'s `env.json`, if it has one.
pub fn device(dir: &Path) -> Option<String> {
    let text = std::fs::read(dir.join("env.json")).ok()?;
    let env: serde_json::Value = serde_json::from_slice(&text).ok()?;
    env["device"].as_str().map(str::to_string)
}

/// The profile and device of the command that wrote `dir` (its `env.json`).
fn provenance(dir: &Path) -> Result<(String, String)> {
    let path = dir.join("env.json");
    let text = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let env: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("malformed {}", path.display()))?;
    let device = env["device"]
        .as_str()
        .unwrap_or("unknown device")
        .to_string();
    let command = env["command"].as_str().unwrap_or_default();
    let words: Vec<&str> = command.split_whitespace().collect();
    let profile = words
        .iter()
        .position(|w| *w == "--profile")
        .and_then(|i| words.get(i + 1))
        .or_else(|| {
            words
                .iter()
                .find_map(|w| w.strip_prefix("--profile=").map(|_| w))
        })
        .map(|p| p.trim_start_matches("--profile=").to_string())
        .unwrap_or_else(|| "cpu".into());
    Ok((profile, device))
}

/// The scale of an LM sweep's result directory.
pub fn lm_sweep(dir: &Path) -> Result<Scale> {
    let config = saved_config(dir)?;
    let (profile, device) = provenance(dir)?;
    let params = lm_params(&config)?;
    Ok(Scale {
        profile,
        params,
        tokens_per_run: (config.steps * config.tokens_per_batch * config.grad_accum) as f64,
        seeds: config.seeds.len(),
        device,
    })
}

/// The smallest and largest parameter count (without the tied token embedding) of the sweep's
/// models at its first context.
fn lm_params(config: &LmSweepConfig) -> Result<(usize, usize)> {
    let device = burn::tensor::Device::flex();
    let context = *config
        .contexts
        .first()
        .context("a sweep without contexts")?;
    let names: Vec<String> = config
        .models
        .iter()
        .chain(&config.one_seed_models)
        .cloned()
        .chain(config.variants.iter().map(|v| v.name.clone()))
        .collect();
    let mut range = (usize::MAX, 0);
    for name in names {
        let model = planned_model(config, &name, context)?;
        let all = model.init(model::Direction::Causal, &device).num_params();
        let p = all - model.vocab_size * model.d_model;
        range = (range.0.min(p), range.1.max(p));
    }
    Ok(range)
}

/// T5.1.1's parameters without the token embeddings and LM head: per encoder layer self-attention
/// (q, k, v, o) and the gated-GELU feed-forward (wi_0, wi_1, wo) and two RMSNorm scales; per
/// decoder layer the same with cross-attention and three norms; a final norm and the relative
/// position bias (32 buckets per head, T5's) per stack.
pub fn t5_params(s: &SizeConfig) -> usize {
    let attention = 4 * s.d_model * s.n_heads * s.d_kv;
    let feed_forward = 3 * s.d_model * s.d_ff;
    let per_stack = s.d_model + 32 * s.n_heads;
    let encoder = s.n_layers * (attention + feed_forward + 2 * s.d_model) + per_stack;
    let decoder = s.n_layers * (2 * attention + feed_forward + 3 * s.d_model) + per_stack;
    encoder + decoder
}

/// The scale of a GQA pipeline's result directory: the sizes' parameters (multi-head), the
/// pre-training tokens (steps × batch × input length) and the replicates.
pub fn gqa(dir: &Path) -> Result<Scale> {
    let path = dir.join("config.json");
    let text = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let config: PipelineConfig =
        serde_json::from_slice(&text).with_context(|| format!("malformed {}", path.display()))?;
    let (profile, device) = provenance(dir)?;
    let params: Vec<usize> = config.sizes.values().map(t5_params).collect();
    Ok(Scale {
        profile,
        params: (
            params.iter().copied().min().unwrap_or(0),
            params.iter().copied().max().unwrap_or(0),
        ),
        tokens_per_run: (config.pretrain.steps * config.pretrain.batch * config.input_length)
            as f64,
        seeds: config.seeds.len().max(1),
        device,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// T5.1.1-Base's published count: 247.6M parameters with its 32,128 × 768 shared embedding
    /// and untied 32,128 × 768 LM head (`T5ForConditionalGeneration.from_pretrained(
    /// "google/t5-v1_1-base").num_parameters()` = 247,577,856).
    #[test]
    fn t5_parameters_match_the_published_base_count() {
        let base = SizeConfig {
            d_model: 768,
            d_ff: 2048,
            n_heads: 12,
            d_kv: 64,
            n_layers: 12,
            checkpoint: None,
        };
        assert_eq!(t5_params(&base) + 2 * 32_128 * 768, 247_577_856);
    }

    #[test]
    fn the_scale_reads_like_a_sentence() {
        let s = Scale {
            profile: "cpu".into(),
            params: (800_000, 1_000_000),
            tokens_per_run: 655_360.0,
            seeds: 3,
            device: "flex (2 cores)".into(),
        };
        assert_eq!(
            s.show(),
            "cpu scale: 0.80–1.00M params, 0.66M tokens/run, 3 seeds, flex (2 cores)"
        );
    }
}
