//! Analytic FLOP counts for cost accounting (the FLASH paper reports cost as TPU-hours; FLOPs make
//! runs on different machines comparable). Only matrix multiplications are counted, 2·m·n·k each,
//! as this crate computes them: a causal softmax still computes the full T×T score matrix, chunked
//! attention computes full C×C blocks. Training = 3 × forward (backward ≈ 2 × forward).

use crate::lm::{Architecture, ModelConfig};

impl ModelConfig {
    /// Forward FLOPs per token at sequence length `t`, LM head included.
    pub fn forward_flops_per_token(&self, t: usize) -> f64 {
        self.dense_flops_per_token() + self.attention_flops_per_token(t)
    }

    /// The projections, feed-forward layers and LM head: 2 FLOPs per weight per token.
    pub fn dense_flops_per_token(&self) -> f64 {
        let d = self.d_model as f64;
        let head = 2.0 * d * self.vocab_size as f64;
        if self.arch.is_gau() {
            let (e, s) = (
                (self.expansion_factor * self.d_model) as f64,
                self.d_qk as f64,
            );
            // [U | V | Z] (no U without the gate) and W_o.
            let u = if self.gau_gated { e } else { 0.0 };
            head + 2.0 * self.n_blocks as f64 * (2.0 * d * (u + e + s) + 2.0 * e * d)
        } else {
            let matrices = match self.arch {
                Architecture::Transformer | Architecture::TransformerPlus => 2.0,
                _ => 3.0,
            };
            head + self.n_blocks as f64 * (8.0 * d * d + matrices * 2.0 * d * self.d_ff() as f64)
        }
    }

    /// The token-mixing part at sequence length `t`, all layers.
    pub fn attention_flops_per_token(&self, t: usize) -> f64 {
        let (d, t) = (self.d_model as f64, t as f64);
        let c = (self.chunk_size.min(self.context) as f64).min(t);
        if self.arch.is_gau() {
            let (e, s) = (
                (self.expansion_factor * self.d_model) as f64,
                self.d_qk as f64,
            );
            // Q Kᵀ per head (h heads of width s over Z), A V over e columns in all.
            let heads = self.gau_heads as f64;
            let quad = |n: f64| 2.0 * n * s * heads + 2.0 * n * e;
            // Σ K_linᵀV per token, and Q_lin times the running sum.
            let linear = 4.0 * s * e;
            let per_layer = match self.arch {
                Architecture::FlashQuad => quad(t),
                Architecture::Flash => quad(c) + linear,
                Architecture::FlashLocalOnly => quad(c),
                Architecture::FlashGlobalOnly => linear,
                _ => unreachable!("GAU architectures"),
            };
            2.0 * self.n_blocks as f64 * per_layer
        } else {
            let dh = (self.d_model / self.n_heads) as f64;
            let m = self.performer_features as f64;
            let per_layer = match self.arch {
                // QKᵀ and AV over all t keys, all heads together.
                Architecture::Transformer
                | Architecture::TransformerPlus
                | Architecture::TransformerPlusPlus
                | Architecture::TransformerPlusPlusRelu2 => 4.0 * t * d,
                // φ(q), φ(k): d·m each; Σ φ(k)vᵀ and φ(q)·S: m·d each.
                Architecture::Performer => 2.0 * (2.0 * d * m) + 2.0 * (2.0 * m * d),
                // C local keys plus one summary key per chunk.
                Architecture::Combiner => 4.0 * d * (c + t / c),
                // Local C×C blocks per head, plus the per-head linear state (dh × dh).
                Architecture::McTfmPlusPlus => 4.0 * c * d + 4.0 * d * dh,
                _ => unreachable!("Transformer-family architectures"),
            };
            self.n_blocks as f64 * per_layer
        }
    }

    /// Training FLOPs of one step over `batch` sequences of length `t`.
    pub fn train_flops_per_step(&self, batch: usize, t: usize) -> f64 {
        3.0 * self.forward_flops_per_token(t) * (batch * t) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Module;

    #[test]
    fn dense_part_is_two_flops_per_parameter_per_token() {
        // The dense part costs 2 FLOPs per parameter per token (the tied embedding counted once, as
        // the LM head): the familiar 6·N per token for training. The parameter count comes from the
        // initialised model, independently of the formula (norms and biases are the 1% slack).
        let device = burn::tensor::Device::flex();
        for arch in Architecture::ALL {
            let c = ModelConfig::paper_base(arch);
            let params = c.init(crate::Direction::Causal, &device).num_params() as f64;
            let f = c.dense_flops_per_token();
            assert!(
                (f - 2.0 * params).abs() / f < 0.01,
                "{arch:?}: {f} vs 2 × {params}"
            );
        }
    }

    #[test]
    fn attention_cost_scales_as_the_paper_says() {
        let per_token = |arch, t| {
            ModelConfig::paper_base(arch)
                .with_context(t)
                .forward_flops_per_token(t)
        };
        // Quadratic models: per-token cost grows with t; FLASH's is flat in t.
        assert!(
            per_token(Architecture::TransformerPlusPlus, 8192)
                > 2.0 * per_token(Architecture::TransformerPlusPlus, 512)
        );
        assert_eq!(
            per_token(Architecture::Flash, 8192),
            per_token(Architecture::Flash, 1024)
        );
        assert!(per_token(Architecture::Flash, 8192) < per_token(Architecture::FlashQuad, 8192));
        // Hand count for Transformer++ at t = 1024: 12 layers × (QKᵀ + AV) = 12 · 4 · 1024 · 768.
        let c = ModelConfig::paper_base(Architecture::TransformerPlusPlus);
        assert_eq!(
            c.attention_flops_per_token(1024),
            12.0 * 4.0 * 1024.0 * 768.0
        );
        // FLASH at t = 1024, C = 256: 24 GAU layers × (2·256·(128 + 1536) + 4·128·1536).
        let f = ModelConfig::paper_base(Architecture::Flash);
        assert_eq!(
            f.attention_flops_per_token(1024),
            24.0 * (2.0 * 256.0 * (128.0 + 1536.0) + 4.0 * 128.0 * 1536.0)
        );
    }
}
