//! Analytic memory estimates for `--dry-run` (what a run needs before a GPU is rented): the floats
//! the backward pass keeps per token, and the decoding cache per sequence. Like [`crate::flops`],
//! these count what the plain reference kernels compute and keep (the path the GPU backends run: a
//! causal softmax keeps the full T×T score matrix, chunked attention full C×C blocks); the fused
//! CPU kernels keep less: one float per visible score (relu² scores, softmax probabilities; a
//! causal block stops at the diagonal) up to 1 GiB per attention call, recomputing beyond (at
//! d = 128, context 4096 one Transformer++ step grew the peak by 0.42 GiB against 1.81 estimated,
//! FLASH's 0.62 against 0.61, measured before softmax kept its probabilities, `cbfda86`).
//! Left out: the allocator's slack and the transient buffers of one operation.

use crate::lm::{Architecture, ModelConfig};
use crate::t5::T5Config;

/// Score-matrix floats kept per score: the logits, the normalised (softmax or relu) scores and,
/// for relu², the square (softmax's backward needs its output only; 3 covers both plus the mask).
const KEPT_PER_SCORE: f64 = 3.0;

impl ModelConfig {
    /// Floats the backward pass keeps per token of a sequence of length `t`, all layers, the
    /// embedding and the LM head's logits and softmax included.
    pub fn activation_floats_per_token(&self, t: usize) -> f64 {
        let (d, v) = (self.d_model as f64, self.vocab_size as f64);
        // Embedding output, final norm, and the logits with their softmax.
        let ends = 2.0 * d + 2.0 * v;
        ends + self.layer_count() as f64 * self.activation_floats_per_layer_token(t)
    }

    /// Layers of the stack: two GAUs per Transformer block (FLASH §4.1).
    pub fn layer_count(&self) -> usize {
        if self.arch.is_gau() {
            2 * self.n_blocks
        } else {
            self.n_blocks
        }
    }

    /// One layer's kept floats per token at sequence length `t`.
    fn activation_floats_per_layer_token(&self, t: usize) -> f64 {
        let (d, n) = (self.d_model as f64, t as f64);
        let c = (self.chunk_size.min(self.context) as f64).min(n);
        if self.arch.is_gau() {
            let (e, s, h) = (
                (self.expansion_factor * self.d_model) as f64,
                self.d_qk as f64,
                self.gau_heads as f64,
            );
            let u = if self.gau_gated { e } else { 0.0 };
            // Residual input and its norm; [U|V|Z] before and after SiLU; Q and K per head, before
            // and after RoPE; A·V and the gated product.
            let dense = 2.0 * d + 2.0 * (u + e + s) + 4.0 * s * h + 2.0 * e;
            // Quadratic scores over n (or C) keys; the linear part's Q_lin, K_lin and its per-chunk
            // s × e state, kept and cumulated (2 s·e per chunk, per token 2 s·e / C).
            let quad = |keys: f64| KEPT_PER_SCORE * h * keys;
            let linear = 2.0 * s + 2.0 * s * e / c;
            dense
                + match self.arch {
                    Architecture::FlashQuad => quad(n),
                    Architecture::Flash => quad(c) + linear,
                    Architecture::FlashLocalOnly => quad(c),
                    Architecture::FlashGlobalOnly => linear,
                    _ => unreachable!("GAU architectures"),
                }
        } else {
            let h = self.n_heads as f64;
            let dh = d / h;
            let ff = self.d_ff() as f64;
            // Attention sublayer: residual and norm, Q K V, rotated Q and K, context, output.
            let attention = 2.0 * d + 3.0 * d + 2.0 * d + 2.0 * d;
            // Feed-forward sublayer: residual and norm, the hidden layer before and after its
            // activation (the GLU keeps both branches and their product).
            let hidden = match self.arch {
                Architecture::Transformer | Architecture::TransformerPlus => 2.0 * ff,
                _ => 4.0 * ff,
            };
            let m = self.performer_features as f64;
            let mixing = match self.arch {
                Architecture::Transformer
                | Architecture::TransformerPlus
                | Architecture::TransformerPlusPlus
                | Architecture::TransformerPlusPlusRelu2 => KEPT_PER_SCORE * h * n,
                // φ(q), φ(k) before and after the feature map, per head.
                Architecture::Performer => 4.0 * h * m,
                // C local keys plus one summary per chunk.
                Architecture::Combiner => KEPT_PER_SCORE * h * (c + n / c),
                // Local C × C blocks per head, plus the per-head dh × dh state per chunk.
                Architecture::McTfmPlusPlus => KEPT_PER_SCORE * h * c + 2.0 * h * dh * dh / c,
                _ => unreachable!("Transformer-family architectures"),
            };
            attention + 2.0 * d + hidden + mixing
        }
    }

    /// Floats of the decoding cache of one sequence at length `t`: the keys and values of every
    /// layer (for chunked models the current chunk's plus the running linear state; Performer only
    /// its state).
    pub fn kv_cache_floats_per_sequence(&self, t: usize) -> f64 {
        let (d, n) = (self.d_model as f64, t as f64);
        let c = (self.chunk_size.min(self.context) as f64).min(n);
        let per_layer = if self.arch.is_gau() {
            let (e, s) = (
                (self.expansion_factor * self.d_model) as f64,
                self.d_qk as f64,
            );
            match self.arch {
                // K (from Z, width s) and V (width e) of every position.
                Architecture::FlashQuad => n * (s + e),
                Architecture::Flash => c * (s + e) + s * e,
                Architecture::FlashLocalOnly => c * (s + e),
                Architecture::FlashGlobalOnly => s * e,
                _ => unreachable!("GAU architectures"),
            }
        } else {
            let h = self.n_heads as f64;
            let dh = d / h;
            match self.arch {
                Architecture::Performer => h * self.performer_features as f64 * (dh + 1.0),
                Architecture::Combiner => (c + n / c) * 2.0 * d,
                Architecture::McTfmPlusPlus => c * 2.0 * d + h * dh * dh,
                _ => n * 2.0 * d,
            }
        };
        self.layer_count() as f64 * per_layer
    }
}

impl T5Config {
    /// Floats the backward pass keeps for `batch` examples of `s` input and `t` target tokens
    /// (encoder self-attention multi-head, decoder attention with the model's K/V heads).
    pub fn activation_floats(&self, batch: usize, s: usize, t: usize) -> f64 {
        let (d, ff, h) = (self.d_model as f64, self.d_ff as f64, self.n_heads as f64);
        let inner = (self.n_heads * self.d_kv) as f64;
        let kv = (self.n_kv_heads * self.d_kv) as f64;
        let (s, t) = (s as f64, t as f64);
        // Residual and norm, then Q, context and output of an attention sublayer over n keys.
        let attention = |keys: f64, k_and_v: f64| {
            2.0 * d + inner + k_and_v + inner + d + KEPT_PER_SCORE * h * keys
        };
        // Gated-GELU feed-forward: residual and norm, both branches before and after, the product.
        let ffn = 2.0 * d + 4.0 * ff + d;
        let encoder_token = attention(s, 2.0 * inner) + ffn;
        let decoder_token = attention(t, 2.0 * kv) + attention(s, 0.0) + ffn;
        // Cross-attention keys and values of every input token, per decoder layer.
        let cross_kv = 2.0 * kv * s;
        let per_example = self.n_encoder_layers as f64 * s * encoder_token
            + self.n_decoder_layers as f64 * (t * decoder_token + cross_kv)
            + t * 2.0 * self.vocab_size as f64;
        batch as f64 * per_example
    }

    /// Floats of the decoding cache of one example: per decoder layer the self-attention keys and
    /// values of `t` generated tokens and the cross-attention keys and values of `s` input tokens,
    /// each `n_kv_heads × d_kv` wide (what MQA and GQA shrink, GQA paper §2).
    pub fn kv_cache_floats_per_sequence(&self, s: usize, t: usize) -> f64 {
        let kv = (self.n_kv_heads * self.d_kv) as f64;
        self.n_decoder_layers as f64 * 2.0 * kv * (s + t) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t5_cache_shrinks_with_the_kv_heads() {
        // T5.1.1-XXL (d 4096, 64 heads of 64, 24 + 24 layers): the cache of one example at input
        // 512 and target 128 is 24 · 2 · (64 · 64) · 640 floats with 64 K/V heads, 1/64 of that as
        // MQA and 8/64 as GQA-8.
        let xxl = |g| T5Config::new(4096, 10240, 64, 24, 24, g);
        let mha = xxl(64).kv_cache_floats_per_sequence(512, 128);
        assert_eq!(mha, 24.0 * 2.0 * 4096.0 * 640.0);
        assert_eq!(xxl(1).kv_cache_floats_per_sequence(512, 128), mha / 64.0);
        assert_eq!(xxl(8).kv_cache_floats_per_sequence(512, 128), mha / 8.0);
        // Training activations shrink too, but by far less: most are per-head scores and the
        // feed-forward, which the K/V heads do not touch.
        let (a_mha, a_mqa) = (
            xxl(64).activation_floats(1, 512, 128),
            xxl(1).activation_floats(1, 512, 128),
        );
        assert!(a_mqa < a_mha && a_mqa > 0.9 * a_mha, "{a_mqa} vs {a_mha}");
    }

    #[test]
    fn transformer_plusplus_by_hand() {
        // paper_base Transformer++: d = 768, 12 blocks, 12 heads, GLU width 2048, vocab 32768 at
        // t = 1024. Per block: 9d (attention) + 2d + 4·2048 (GLU) + 3·12·1024 (scores).
        let c = ModelConfig::paper_base(Architecture::TransformerPlusPlus).with_context(1024);
        let per_block = 9.0 * 768.0 + 2.0 * 768.0 + 4.0 * 2048.0 + 3.0 * 12.0 * 1024.0;
        let ends = 2.0 * 768.0 + 2.0 * c.vocab_size as f64;
        assert_eq!(c.activation_floats_per_token(1024), ends + 12.0 * per_block);
        // Cache: K and V of width d per position per block.
        assert_eq!(
            c.kv_cache_floats_per_sequence(1024),
            12.0 * 1024.0 * 2.0 * 768.0
        );
    }

    #[test]
    fn quadratic_models_grow_with_context_and_flash_does_not() {
        let per_token = |arch, t| {
            ModelConfig::paper_base(arch)
                .with_context(t)
                .activation_floats_per_token(t)
        };
        for arch in [Architecture::TransformerPlusPlus, Architecture::FlashQuad] {
            // The score term is linear in t per token: from 1K to 8K it more than doubles the
            // total (FLASH-Quad's one head: 3·1024 → 3·8192 of ~15K floats per layer-token).
            assert!(
                per_token(arch, 8192) > 2.0 * per_token(arch, 1024),
                "{arch:?}"
            );
        }
        for arch in [Architecture::Flash, Architecture::McTfmPlusPlus] {
            assert_eq!(per_token(arch, 8192), per_token(arch, 1024), "{arch:?}");
        }
        // FLASH's decoding cache is constant in t, FLASH-Quad's linear.
        let cache = |arch, t| {
            ModelConfig::paper_base(arch)
                .with_context(t)
                .kv_cache_floats_per_sequence(t)
        };
        assert_eq!(
            cache(Architecture::Flash, 8192),
            cache(Architecture::Flash, 1024)
        );
        assert_eq!(
            cache(Architecture::FlashQuad, 8192),
            8.0 * cache(Architecture::FlashQuad, 1024)
        );
    }
}
