//! The scale a GQA pipeline's result was decided at: its sizes' parameters and pre-training tokens.

use std::path::Path;

use anyhow::{Context, Result};

use super::config::{PipelineConfig, SizeConfig};
use crate::scale::Scale;

/// T5.1.1's parameters without the token embeddings and LM head: per encoder layer self-attention
/// (q, k, v, o) and the gated-GELU feed-forward (wi_0, wi_1, wo) and two RMSNorm scales; per
/// decoder layer the same with cross-attention and three norms; a final norm and the relative
/// position bias (32 buckets per head, T5's) per stack.
pub(super) fn t5_params(s: &SizeConfig) -> usize {
    let attention = 4 * s.d_model * s.n_heads * s.d_kv;
    let feed_forward = 3 * s.d_model * s.d_ff;
    let per_stack = s.d_model + 32 * s.n_heads;
    let encoder = s.n_layers * (attention + feed_forward + 2 * s.d_model) + per_stack;
    let decoder = s.n_layers * (2 * attention + feed_forward + 3 * s.d_model) + per_stack;
    encoder + decoder
}

/// The scale of a GQA pipeline's result directory: the sizes' parameters (multi-head), the
/// pre-training tokens (steps × batch × input length) and the replicates.
pub(super) fn scale(dir: &Path) -> Result<Scale> {
    let path = dir.join("config.json");
    let text = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let config: PipelineConfig =
        serde_json::from_slice(&text).with_context(|| format!("malformed {}", path.display()))?;
    let (profile, device) = crate::scale::provenance(dir)?;
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
}
