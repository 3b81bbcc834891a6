//! T5.1.1 encoder-decoder (Raffel et al. 2020, the "v1.1" checkpoints) with multi-head, grouped-query
//! or multi-query attention in the decoder (Ainslie et al. 2023, "GQA").
//!
//! Exactly T5.1.1: pre-norm residual blocks with RMSNorm (eps 1e-6, no mean, no bias); the gated
//! tanh-GELU feed-forward `wo(gelu_tanh(wi_0 x) ⊙ wi_1 x)`; attention without biases and without
//! 1/sqrt(d_kv) (folded into the initialisation of Q); relative position buckets with one table per
//! stack shared by its layers (bidirectional encoder, causal decoder, none in cross-attention); one
//! input embedding shared by encoder and decoder, no input scaling; an untied LM head.
//!
//! GQA (paper §2): decoder self- and cross-attention have `n_kv_heads` = G key/value heads for H
//! query heads (G = H: MHA; G = 1: MQA); query head h reads K/V head h / (H/G), contiguous groups.
//! The encoder stays MHA. Scores are computed per group against the G heads themselves
//! ([`grouped_attention`]), so the decoding cache holds G heads; [`repeat_kv`] (expanding K/V to H
//! heads) is the plain reference the tests compare with. [`convert_kv_heads`] turns an MHA model
//! into GQA-G by mean-pooling each group's K and V projections.
//!
//! Shapes: B batch, S encoder length, T decoder length, H query heads, G K/V heads, dk = d_kv,
//! d = d_model, V vocabulary.

use std::sync::Arc;

use burn::module::Param;
use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, Initializer, Linear, LinearConfig, RmsNorm,
    RmsNormConfig,
};
use burn::prelude::*;
use burn::tensor::activation::softmax;

use crate::attention::MASKED_SCORE;
use crate::fused::{self, Activation, Gate, PackedWeight, gated_activation};
use crate::layers::{Direction, future_mask, linear};
use crate::lm::cross_entropy;

/// `norm(x)` through the fused RMSNorm on `flex`, burn's module elsewhere.
fn rms_norm<const D: usize>(norm: &RmsNorm, x: Tensor<D>) -> Tensor<D> {
    fused::rms_norm(&x, &norm.gamma.val(), norm.epsilon).unwrap_or_else(|| norm.forward(x))
}

/// Padding id; also the decoder's start token (T5's sentencepiece vocabulary).
pub const PAD_ID: i64 = 0;
/// End-of-sequence id.
pub const EOS_ID: i64 = 1;
/// Unknown-piece id.
pub const UNK_ID: i64 = 2;
/// `<extra_id_0>`, the first span-corruption sentinel; `<extra_id_i>` is `FIRST_SENTINEL_ID − i`.
pub const FIRST_SENTINEL_ID: i64 = 32099;
/// Number of sentinels in the T5 vocabulary.
pub const N_SENTINELS: usize = 100;

/// Configuration of a T5.1.1 encoder-decoder. Sizes: [`T5Config::small`] … [`T5Config::xxl`]
/// (the public `google/t5-v1_1-*` checkpoints), [`T5Config::tiny`] for tests.
#[derive(Config, Debug)]
pub struct T5Config {
    /// Vocabulary: 32000 SentencePiece pieces + 100 sentinels, padded to 32128 (T5.1.1).
    #[config(default = 32128)]
    pub vocab_size: usize,
    /// Model width d.
    pub d_model: usize,
    /// Hidden width of the gated feed-forward network.
    pub d_ff: usize,
    /// Query heads H (the encoder's K/V heads too).
    pub n_heads: usize,
    /// Width of one head; 64 in every T5.1.1 size, so H·d_kv need not equal d_model.
    #[config(default = 64)]
    pub d_kv: usize,
    /// Encoder layers.
    pub n_encoder_layers: usize,
    /// Decoder layers.
    pub n_decoder_layers: usize,
    /// K/V heads G of decoder self- and cross-attention: H = MHA, 1 = MQA, G = GQA-G (G divides H).
    pub n_kv_heads: usize,
    /// Relative position buckets per stack (T5: 32).
    #[config(default = 32)]
    pub relative_buckets: usize,
    /// Distance at which relative positions stop being distinguished (T5: 128).
    #[config(default = 128)]
    pub relative_max_distance: usize,
    /// RMSNorm epsilon (T5: 1e-6; burn's default 1e-5 is not T5's).
    #[config(default = 1e-6)]
    pub norm_eps: f64,
    /// Dropout on embeddings, attention weights, residual branches and the FFN's hidden layer:
    /// 0 in pre-training, 0.1 in fine-tuning (GQA paper §3.1).
    #[config(default = 0.0)]
    pub dropout: f64,
}

impl T5Config {
    /// A T5.1.1 size with multi-head attention.
    fn size(d_model: usize, d_ff: usize, heads: usize, layers: usize) -> Self {
        Self::new(d_model, d_ff, heads, layers, layers, heads)
    }

    /// `google/t5-v1_1-small`, ~77M parameters.
    pub fn small() -> Self {
        Self::size(512, 1024, 6, 8)
    }

    /// `google/t5-v1_1-base`, ~250M parameters.
    pub fn base() -> Self {
        Self::size(768, 2048, 12, 12)
    }

    /// `google/t5-v1_1-large`, ~800M parameters: MHA-Large of the GQA paper's Table 1.
    pub fn large() -> Self {
        Self::size(1024, 2816, 16, 24)
    }

    /// `google/t5-v1_1-xl`, ~3B parameters.
    pub fn xl() -> Self {
        Self::size(2048, 5120, 32, 24)
    }

    /// `google/t5-v1_1-xxl`, ~11B parameters: MHA-XXL, and with 8 or 1 K/V heads GQA-8-XXL and
    /// MQA-XXL of Table 1.
    pub fn xxl() -> Self {
        Self::size(4096, 10240, 64, 24)
    }

    /// A few-thousand-parameter model for tests: 4 heads of width 8, two layers per stack.
    pub fn tiny() -> Self {
        Self::new(32, 64, 4, 2, 2, 4)
            .with_d_kv(8)
            .with_vocab_size(128)
    }

    /// The same model with `n_kv_heads` K/V heads in the decoder (1 = MQA, `n_heads` = MHA).
    pub fn with_n_kv_heads(mut self, n_kv_heads: usize) -> Self {
        self.n_kv_heads = n_kv_heads;
        self
    }

    /// The named sizes, for configs that pick one by name.
    pub const PRESETS: [&'static str; 6] = ["tiny", "small", "base", "large", "xl", "xxl"];

    /// A size by name (see [`T5Config::PRESETS`]).
    pub fn preset(name: &str) -> Result<Self, String> {
        Ok(match name {
            "tiny" => Self::tiny(),
            "small" => Self::small(),
            "base" => Self::base(),
            "large" => Self::large(),
            "xl" => Self::xl(),
            "xxl" => Self::xxl(),
            _ => {
                return Err(format!(
                    "unknown T5 size `{name}`; known: {}",
                    Self::PRESETS.join(", ")
                ));
            }
        })
    }

    /// Checks the fields that must agree with each other; the message names the field and the fix.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("d_ff", self.d_ff),
            ("n_heads", self.n_heads),
            ("d_kv", self.d_kv),
            ("n_kv_heads", self.n_kv_heads),
            ("relative_buckets", self.relative_buckets),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("T5 config: {name} must be positive"));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(format!(
                "T5 config: n_kv_heads {} must divide n_heads {} (1 = MQA, n_heads = MHA)",
                self.n_kv_heads, self.n_heads
            ));
        }
        if !self.relative_buckets.is_multiple_of(4) {
            return Err(format!(
                "T5 config: relative_buckets {} must be a multiple of 4 (two sides, exact and log halves)",
                self.relative_buckets
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!(
                "T5 config: dropout {} must be in [0, 1)",
                self.dropout
            ));
        }
        Ok(())
    }

    /// Builds the model with T5's initialisation (Mesh TensorFlow / Hugging Face `_init_weights`):
    /// N(0, 1) embedding; Q std (d·dk)^-½ (the missing 1/sqrt(dk) lives here), K and V std d^-½,
    /// O std (H·dk)^-½; wi std d^-½, wo std d_ff^-½; bias tables std d^-½. The untied LM head gets
    /// std d^-½ (Hugging Face uses 1.0, which starts training with logits of std sqrt(d)).
    pub fn init(&self, device: &Device) -> T5Model {
        if let Err(e) = self.validate() {
            panic!("{e}");
        }
        let d = self.d_model as f64;
        let inner = self.n_heads * self.d_kv;
        let normal = |std: f64| Initializer::Normal { mean: 0.0, std };
        let linear = |i: usize, o: usize, std: f64| {
            LinearConfig::new(i, o)
                .with_bias(false)
                .with_initializer(normal(std))
                .init(device)
        };
        let dropout = || DropoutConfig::new(self.dropout).init();
        let norm = || {
            RmsNormConfig::new(self.d_model)
                .with_epsilon(self.norm_eps)
                .init(device)
        };
        let attention = |kv_heads: usize| T5Attention {
            q: linear(self.d_model, inner, (d * self.d_kv as f64).powf(-0.5)),
            k: linear(self.d_model, kv_heads * self.d_kv, d.powf(-0.5)),
            v: linear(self.d_model, kv_heads * self.d_kv, d.powf(-0.5)),
            o: linear(inner, self.d_model, (inner as f64).powf(-0.5)),
            dropout: dropout(),
            n_heads: self.n_heads,
            n_kv_heads: kv_heads,
            d_kv: self.d_kv,
        };
        let ffn = || GatedGelu {
            wi_0: linear(self.d_model, self.d_ff, d.powf(-0.5)),
            wi_1: linear(self.d_model, self.d_ff, d.powf(-0.5)),
            wo: linear(self.d_ff, self.d_model, (self.d_ff as f64).powf(-0.5)),
            dropout: dropout(),
        };
        let bias = |direction| RelativePositionBias {
            embedding: EmbeddingConfig::new(self.relative_buckets, self.n_heads)
                .with_initializer(normal(d.powf(-0.5)))
                .init(device),
            direction,
            n_buckets: self.relative_buckets,
            max_distance: self.relative_max_distance,
        };
        T5Model {
            shared: EmbeddingConfig::new(self.vocab_size, self.d_model)
                .with_initializer(normal(1.0))
                .init(device),
            encoder: T5Stack {
                layers: (0..self.n_encoder_layers)
                    .map(|_| T5Layer {
                        self_norm: norm(),
                        self_attention: attention(self.n_heads),
                        cross: None,
                        ffn_norm: norm(),
                        ffn: ffn(),
                        dropout: dropout(),
                    })
                    .collect(),
                position_bias: bias(Direction::Bidirectional),
                final_norm: norm(),
                dropout: dropout(),
            },
            decoder: T5Stack {
                layers: (0..self.n_decoder_layers)
                    .map(|_| T5Layer {
                        self_norm: norm(),
                        self_attention: attention(self.n_kv_heads),
                        cross: Some(CrossAttention {
                            norm: norm(),
                            attention: attention(self.n_kv_heads),
                        }),
                        ffn_norm: norm(),
                        ffn: ffn(),
                        dropout: dropout(),
                    })
                    .collect(),
                position_bias: bias(Direction::Causal),
                final_norm: norm(),
                dropout: dropout(),
            },
            lm_head: linear(self.d_model, self.vocab_size, d.powf(-0.5)),
        }
    }
}

impl T5Config {
    /// Forward FLOPs of `batch` examples of `s` input and `t` target tokens: matrix products only,
    /// 2·m·n·k each, as [`crate::flops`] counts the FLASH models. The decoder's K/V projections of
    /// cross-attention run once per input token (the decoding cache's cost), its other products
    /// once per target token.
    pub fn forward_flops(&self, batch: usize, s: usize, t: usize) -> f64 {
        let (d, vocab) = (self.d_model as f64, self.vocab_size as f64);
        let kv = (self.n_kv_heads * self.d_kv) as f64;
        let encoder = self.encoder_flops(batch, s);
        let (s, t) = (s as f64, t as f64);
        let cross_kv_per_input = 2.0 * 2.0 * d * kv;
        let decoder = self.n_decoder_layers as f64
            * (t * self.decoder_token_flops(t, s) + s * cross_kv_per_input)
            + t * 2.0 * d * vocab;
        encoder + batch as f64 * decoder
    }

    /// One decoder layer's FLOPs per target token that attends to `self_keys` decoded positions
    /// and `cross_keys` encoder positions: self-attention's Q, O, K, V projections, its scores
    /// and weighted sum, cross-attention's Q and O (its K and V are applied once per input
    /// token) and its scores and weighted sum, the gated FFN.
    fn decoder_token_flops(&self, self_keys: f64, cross_keys: f64) -> f64 {
        let (d, ff) = (self.d_model as f64, self.d_ff as f64);
        let inner = (self.n_heads * self.d_kv) as f64;
        let kv = (self.n_kv_heads * self.d_kv) as f64;
        // QKᵀ and AV over n keys, all heads: 2·2·n·H·dk.
        let scores = |n: f64| 4.0 * n * inner;
        2.0 * 2.0 * d * (inner + kv)
            + scores(self_keys)
            + 2.0 * 2.0 * d * inner
            + scores(cross_keys)
            + 2.0 * 3.0 * d * ff
    }

    /// Training FLOPs of one step (backward ≈ 2 × forward).
    pub fn train_flops(&self, batch: usize, s: usize, t: usize) -> f64 {
        3.0 * self.forward_flops(batch, s, t)
    }

    /// Forward FLOPs of the encoder alone on `batch` inputs of `s` tokens (its share of
    /// [`T5Config::forward_flops`]).
    pub fn encoder_flops(&self, batch: usize, s: usize) -> f64 {
        let (d, ff) = (self.d_model as f64, self.d_ff as f64);
        let inner = (self.n_heads * self.d_kv) as f64;
        let token = 2.0 * 4.0 * d * inner + 4.0 * s as f64 * inner + 2.0 * 3.0 * d * ff;
        (batch * self.n_encoder_layers * s) as f64 * token
    }

    /// What one cached decoding step of `batch` sequences computes and reads, over `input` encoder
    /// positions and `self_positions` decoded ones (a step's own position included).
    pub fn decode_step_cost(
        &self,
        batch: usize,
        input: usize,
        self_positions: f64,
    ) -> DecodeStepCost {
        let (d, ff, vocab) = (
            self.d_model as f64,
            self.d_ff as f64,
            self.vocab_size as f64,
        );
        let (heads, kv_heads) = (self.n_heads * self.d_kv, self.n_kv_heads * self.d_kv);
        let (inner, kv) = (heads as f64, kv_heads as f64);
        let (b, layers) = (batch as f64, self.n_decoder_layers as f64);
        // Per decoder layer and sequence: its one token over the decoded and the input positions.
        let layer_flops = self.decoder_token_flops(self_positions, input as f64);
        // Per decoder layer, once for the batch: those projections' and the FFN's weights, f32.
        let layer_weights = 4.0 * (4.0 * d * inner + 2.0 * d * kv + 3.0 * d * ff);
        DecodeStepCost {
            flops: b * layers * layer_flops,
            weight_bytes: layers * layer_weights,
            kv_bytes: layers * b * 2.0 * kv * 4.0 * (input as f64 + self_positions),
            lm_head_flops: 2.0 * b * d * vocab,
            lm_head_bytes: 4.0 * d * vocab,
        }
    }
}

/// Matrix-product FLOPs and bytes read of one cached decoding step of a batch
/// ([`T5Config::decode_step_cost`]): the decoder layers' and the LM head's apart. Norms, position
/// biases and the batch's embedding rows are negligible and not counted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeStepCost {
    /// The decoder layers' products, 2·m·n·k each, as [`T5Config::forward_flops`] counts.
    pub flops: f64,
    /// The decoder layers' weights, read once for the whole batch, f32.
    pub weight_bytes: f64,
    /// The cached K/V the step reads: per layer and sequence, cross-attention's over the input
    /// and self-attention's over the decoded positions, f32.
    pub kv_bytes: f64,
    /// The LM head's [B, d] · [d, vocabulary] product.
    pub lm_head_flops: f64,
    /// The LM head's weights, f32.
    pub lm_head_bytes: f64,
}

impl DecodeStepCost {
    /// FLOPs of the whole step, LM head included.
    pub fn total_flops(&self) -> f64 {
        self.flops + self.lm_head_flops
    }

    /// Bytes of the whole step, LM head included.
    pub fn total_bytes(&self) -> f64 {
        self.weight_bytes + self.kv_bytes + self.lm_head_bytes
    }
}

/// T5's bucket of the relative position `key − query` (Mesh TensorFlow `_relative_position_bucket`,
/// Hugging Face `T5Attention._relative_position_bucket`).
///
/// Bidirectional: half the buckets per side, offset by half when the key is after the query.
/// Causal: all buckets for keys at or before the query (later keys share bucket 0; they are masked).
/// Within a side of `n` buckets, distances below n/2 have a bucket each, larger ones share
/// logarithmically spaced buckets up to `max_distance`, beyond which all share the last one. The
/// logarithm is taken in f32, as both references do.
pub fn relative_position_bucket(
    relative: i64,
    direction: Direction,
    n_buckets: usize,
    max_distance: usize,
) -> usize {
    let (side, offset, distance) = match direction {
        Direction::Bidirectional => {
            let side = n_buckets / 2;
            (
                side,
                if relative > 0 { side } else { 0 },
                relative.unsigned_abs(),
            )
        }
        Direction::Causal => (n_buckets, 0, (-relative).max(0) as u64),
    };
    let exact = side / 2;
    let distance = distance as usize;
    if distance < exact {
        return offset + distance;
    }
    let log_ratio =
        (distance as f32 / exact as f32).ln() / (max_distance as f32 / exact as f32).ln();
    let bucket = exact + (log_ratio * (side - exact) as f32) as usize;
    offset + bucket.min(side - 1)
}

/// The learned relative position bias of one stack: a [buckets, H] table shared by all its layers.
#[derive(Module, Debug)]
pub struct RelativePositionBias {
    /// [buckets, H]
    pub embedding: Embedding,
    #[module(skip)]
    direction: Direction,
    n_buckets: usize,
    max_distance: usize,
}

impl RelativePositionBias {
    /// Bias of queries at positions `q_start .. q_start + q_len` against keys `0 .. k_len`, one
    /// column per offset: [H, q_len + k_len − 1], query q and key k reading column
    /// q_len − 1 − q + k (the fused kernel's [`fused::BiasTable::Offsets`]; [`Self::forward`]
    /// expands it). The bias depends on the offset k − q only, so the columns run from the last
    /// query's first key (offset −(q_start + q_len − 1)) to the first query's last key.
    pub fn offsets(&self, q_start: usize, q_len: usize, k_len: usize) -> Tensor<2> {
        let weight = self.embedding.weight.val();
        let (direction, n, max) = (self.direction, self.n_buckets, self.max_distance);
        let lowest = -((q_start + q_len - 1) as i64);
        let offsets = q_len + k_len - 1;
        let buckets: Vec<i64> = (0..offsets as i64)
            .map(|o| relative_position_bucket(lowest + o, direction, n, max) as i64)
            .collect();
        let buckets =
            Tensor::<1, Int>::from_data(TensorData::new(buckets, [offsets]), &weight.device());
        weight.select(0, buckets).transpose()
    }

    /// The same bias per (query, key): [H, q_len, k_len].
    pub fn forward(&self, q_start: usize, q_len: usize, k_len: usize) -> Tensor<3> {
        expand_offsets(self.offsets(q_start, q_len, k_len), q_len, k_len)
    }
}

/// A bias by offset [H, T + S − 1] ([`RelativePositionBias::offsets`]) per (query, key):
/// [H, T, S], query q and key k reading column T − 1 − q + k.
fn expand_offsets(offsets: Tensor<2>, t: usize, s: usize) -> Tensor<3> {
    let [h, _] = offsets.dims();
    let columns: Vec<i64> = (0..t as i64)
        .flat_map(|q| (0..s as i64).map(move |k| k + (t as i64 - 1 - q)))
        .collect();
    let columns = Tensor::<1, Int>::from_data(TensorData::new(columns, [t * s]), &offsets.device());
    offsets.select(1, columns).reshape([h, t, s])
}

/// The additive terms of a T5 attention's scores, kept apart so that the fused kernel reads each
/// in place (the position table per head, the padding per sequence) instead of a dense
/// [B, H, T, S] sum.
#[derive(Clone, Debug)]
pub struct AttentionBias {
    /// The stack's relative position bias by offset, [H, T + S − 1]
    /// ([`RelativePositionBias::offsets`]; self-attention; none in cross-attention).
    pub position: Option<Tensor<2>>,
    /// [`Direction::Causal`]: keys after the query masked (the decoder's teacher-forced
    /// self-attention; T = S).
    pub direction: Direction,
    /// −10⁹ on padded keys, [B, S] (the encoder's self-attention, the decoder's cross-attention).
    pub padding: Option<Tensor<2>>,
}

impl AttentionBias {
    /// The same terms as one dense tensor [B or 1, H or 1, T or 1, S] (the reference path).
    pub fn dense(&self, t: usize, s: usize, device: &Device) -> Tensor<4> {
        let mut bias = Tensor::<4>::zeros([1, 1, 1, s], device);
        if let Some(position) = &self.position {
            bias = bias + expand_offsets(position.clone(), t, s).unsqueeze::<4>();
        }
        if self.direction == Direction::Causal {
            assert_eq!(t, s, "causal attention needs as many queries as keys");
            bias = bias + causal_bias(t, device);
        }
        if let Some(padding) = &self.padding {
            let [b, _] = padding.dims();
            bias = bias + padding.clone().reshape([b, 1, 1, s]);
        }
        bias
    }
}

/// [B, L, n·dk] → [B, n, L, dk], contiguous on `flex` (one parallel pass, [`fused::split_heads`]:
/// the decoding cache then holds each head's positions together, and the attention kernel reads
/// them without a copy), a strided view elsewhere.
fn split_heads(x: Tensor<3>, n: usize) -> Tensor<4> {
    let [b, l, w] = x.dims();
    match fused::split_heads(&x, n, None) {
        Some(heads) => heads.reshape([b, n, l, w / n]),
        None => x.reshape([b, l, n, w / n]).swap_dims(1, 2),
    }
}

/// [B, n, L, dk] → [B, L, n·dk] (one parallel pass on `flex`, [`fused::merge_heads`]).
fn merge_heads(x: Tensor<4>) -> Tensor<3> {
    let [b, n, l, dk] = x.dims();
    match fused::merge_heads(&x.clone().reshape([b * n, l, dk]), n) {
        Some(merged) => merged,
        None => x.swap_dims(1, 2).reshape([b, l, n * dk]),
    }
}

/// Expands K or V from G heads to H: [B, G, S, dk] → [B, H, S, dk], query head h reading group
/// h / (H/G). The plain reference of [`grouped_attention`]; never used on the decoding path.
pub fn repeat_kv(x: Tensor<4>, n_heads: usize) -> Tensor<4> {
    let [b, g, s, dk] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .expand([b, g, n_heads / g, s, dk])
        .reshape([b, n_heads, s, dk])
}

/// An additive attention bias (relative positions and/or −10⁹ on masked keys) broadcast to the
/// grouped layout: [Bb, Hb, Tb, S] with Hb ∈ {1, H}, Tb ∈ {1, T} → [Bb, G or 1, (H/G)·T or 1, S].
fn group_bias(bias: Tensor<4>, h: usize, g: usize, t: usize) -> Tensor<4> {
    let [bb, hb, tb, s] = bias.dims();
    if hb == 1 && tb == 1 {
        return bias;
    }
    bias.expand([bb, h, t, s]).reshape([bb, g, (h / g) * t, s])
}

/// Unscaled softmax attention (T5) of H query heads over G K/V heads. q: [B, H, T, dk];
/// k, v: [B, G, S, dk]; the bias's terms added to the scores → [B, H, T, dk].
///
/// The G heads are read as they are, never expanded (the bandwidth the paper saves in decoding):
/// on `flex` by the fused kernel ([`fused::attention_grouped`]), which reads each group's K and V
/// once for its H/G query heads, with attention dropout (fine-tuning) its mask drawn by hash from
/// a seed ([`fused::DropoutMask`]); elsewhere by stacking a group's query heads along the
/// query axis so that its scores are one product with its own K, with burn's `Dropout`.
pub fn grouped_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: &AttentionBias,
    dropout: Option<&Dropout>,
) -> Tensor<4> {
    let [b, h, t, dk] = q.dims();
    let [_, g, s, _] = v.dims();
    assert!(
        h.is_multiple_of(g),
        "{g} K/V heads do not divide {h} query heads"
    );
    let attention_dropout = dropout.and_then(|d| fused_dropout_mask(d, &q.device()));
    if let Some(out) = fused_attention(&q, (&k, &v, None), bias, attention_dropout) {
        return out;
    }
    let bias = bias.dense(t, s, &q.device());
    let q = q.reshape([b, g, (h / g) * t, dk]);
    let scores = q.matmul(k.swap_dims(2, 3)) + group_bias(bias, h, g, t); // [B, G, (H/G)·T, S]
    let mut weights = softmax(scores, 3);
    if let Some(dropout) = dropout {
        weights = dropout.forward(weights);
    }
    weights.matmul(v).reshape([b, h, t, dk])
}

/// [`grouped_attention`] over the first `used` positions of a decoding cache (k, v:
/// [B, G, L, dk], L ≥ used), read in place on `flex` (no copy of the cache per step); elsewhere
/// over a copy of that prefix. No dropout (decoding).
pub fn grouped_attention_cached(
    q: Tensor<4>,
    (k, v, used): (&Tensor<4>, &Tensor<4>, usize),
    bias: &AttentionBias,
) -> Tensor<4> {
    if let Some(out) = fused_attention(&q, (k, v, Some(used)), bias, None) {
        return out;
    }
    let prefix = |x: &Tensor<4>| x.clone().narrow(2, 0, used);
    grouped_attention(q, prefix(k), prefix(v), bias, None)
}

/// `x` through `dropout` where burn's `Dropout` would drop (a positive rate, in training): with a
/// hashed mask in one pass each way where the fused kernels run ([`fused::dropout`]), else burn's.
fn drop<const D: usize>(dropout: &Dropout, x: Tensor<D>) -> Tensor<D> {
    if let Some(mask) = fused_dropout_mask(dropout, &x.device())
        && let Some(out) = fused::dropout(&x, mask)
    {
        return out;
    }
    dropout.forward(x)
}

/// A fresh mask for `dropout` on the fused kernels: where burn's `Dropout` would drop (a positive
/// rate, in training: autodiff) and the fused kernels run; its seed drawn only then.
fn fused_dropout_mask(dropout: &Dropout, device: &Device) -> Option<fused::DropoutMask> {
    (dropout.prob > 0.0 && device.is_autodiff() && fused::available(device))
        .then(|| fused::DropoutMask::new(dropout.prob as f32, dropout_seed(device)))
}

/// A fresh seed for the fused kernels' dropout masks, from the device's generator (the
/// one burn's `Dropout` draws from), so that a seeded run draws the same masks.
fn dropout_seed(device: &Device) -> u64 {
    let uniform = burn::tensor::Distribution::Uniform(0.0, 1.0);
    let draws: Vec<f32> = Tensor::<1>::random([2], uniform, device)
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 draws");
    let bits = |x: f32| (x as f64 * (1u64 << 24) as f64) as u64;
    (bits(draws[0]) << 24) | bits(draws[1])
}

/// Grouped attention on the fused kernel (`None` off `flex`), over all keys or the first `used`,
/// with dropout on its weights if given (training). A single query position (a decoding step)
/// stacks each group's H/G query heads as the rows of one query element, so that its K and V are
/// read once for all of them in one product.
fn fused_attention(
    q: &Tensor<4>,
    (k, v, used): (&Tensor<4>, &Tensor<4>, Option<usize>),
    bias: &AttentionBias,
    dropout: Option<fused::DropoutMask>,
) -> Option<Tensor<4>> {
    // Off `flex` the reshapes below would copy strided heads for nothing.
    if !fused::available(&q.device()) {
        return None;
    }
    let [b, h, t, dk] = q.dims();
    let [_, g, l, dv] = v.dims();
    let r = h / g;
    let causal = bias.direction == Direction::Causal;
    let spec = fused::AttentionSpec {
        score: fused::ScoreFn::Softmax,
        scale: 1.0,
        causal,
    };
    let (k3, v3) = (
        k.clone().reshape([b * g, l, dk]),
        v.clone().reshape([b * g, l, dv]),
    );
    // Rows per query element: its positions (the position bias read by offset), or (one
    // position) the group's query heads, whose offsets [H, S] are then dense tables [G, H/G, S].
    let (q3, heads_as_rows) = if t == 1 && !causal {
        let table = bias.position.as_ref().map(|p| {
            let s = p.dims()[1];
            p.clone().reshape([g, r, s])
        });
        (q.clone().reshape([b * g, r, dk]), table)
    } else {
        (q.clone().reshape([b * h, t, dk]), None)
    };
    let table = match &heads_as_rows {
        Some(dense) => Some(fused::BiasTable::Dense(dense)),
        None => bias.position.as_ref().map(fused::BiasTable::Offsets),
    };
    let terms = fused::ScoreBias {
        table,
        key_mask: bias.padding.as_ref(),
    };
    let out = match (used, dropout) {
        (None, None) => fused::attention_grouped(&q3, &k3, &v3, terms, spec),
        (None, Some(d)) => fused::attention_grouped_dropout(&q3, &k3, &v3, terms, spec, d),
        (Some(used), None) => fused::attention_grouped_prefix(&q3, (&k3, &v3, used), terms, spec),
        (Some(_), Some(_)) => unreachable!("decoding has no dropout"),
    }?;
    Some(out.reshape([b, h, t, dv]))
}

/// [`grouped_attention`] by expanding K and V to H heads first ([`repeat_kv`]): the reference.
pub fn grouped_attention_reference(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
) -> Tensor<4> {
    let h = q.dims()[1];
    let k = repeat_kv(k, h);
    let v = repeat_kv(v, h);
    let scores = q.matmul(k.swap_dims(2, 3)) + bias;
    softmax(scores, 3).matmul(v)
}

/// T5 attention: Q, K, V, O projections without biases; K and V have `n_kv_heads` heads.
#[derive(Module, Debug)]
pub struct T5Attention {
    /// d → H·dk
    pub q: Linear,
    /// d → G·dk
    pub k: Linear,
    /// d → G·dk
    pub v: Linear,
    /// H·dk → d
    pub o: Linear,
    dropout: Dropout,
    /// H
    pub n_heads: usize,
    /// G
    pub n_kv_heads: usize,
    /// dk
    pub d_kv: usize,
}

impl T5Attention {
    /// The module's own projections.
    fn projections(&self) -> AttentionProj<'_> {
        AttentionProj {
            q: Proj::Module(&self.q),
            k: Proj::Module(&self.k),
            v: Proj::Module(&self.v),
            o: Proj::Module(&self.o),
        }
    }

    /// K and V of `source` [B, S, d] through `p`: [B, G, S, dk] each, the form the decoding cache
    /// stores.
    fn project_kv(&self, p: AttentionProj, source: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        let k = split_heads(p.k.forward(source.clone()), self.n_kv_heads);
        let v = split_heads(p.v.forward(source), self.n_kv_heads);
        (k, v)
    }

    /// Queries `x` [B, T, d] against given K, V [B, G, S, dk] with `bias`, Q and O through `p`
    /// → [B, T, d].
    fn attend(
        &self,
        p: AttentionProj,
        x: Tensor<3>,
        (k, v): (Tensor<4>, Tensor<4>),
        bias: &AttentionBias,
    ) -> Tensor<3> {
        let q = split_heads(p.q.forward(x), self.n_heads);
        let a = grouped_attention(q, k, v, bias, Some(&self.dropout));
        p.o.forward(merge_heads(a))
    }

    /// Queries `x` [B, 1, d] against the first `used` positions of a decoding cache's K, V
    /// ([B, G, L, dk]), Q and O through `p` → [B, 1, d] ([`grouped_attention_cached`]).
    fn attend_cached(
        &self,
        p: AttentionProj,
        x: Tensor<3>,
        (k, v, used): (&Tensor<4>, &Tensor<4>, usize),
        bias: &AttentionBias,
    ) -> Tensor<3> {
        let q = split_heads(p.q.forward(x), self.n_heads);
        let a = grouped_attention_cached(q, (k, v, used), bias);
        p.o.forward(merge_heads(a))
    }

    /// Queries `x` [B, T, d] against keys and values projected from `source` [B, S, d] → [B, T, d].
    pub fn forward(&self, x: Tensor<3>, source: Tensor<3>, bias: &AttentionBias) -> Tensor<3> {
        let p = self.projections();
        let kv = self.project_kv(p, source);
        self.attend(p, x, kv, bias)
    }
}

/// The gated-GELU feed-forward network of T5.1.1: `wo(gelu_tanh(wi_0 x) ⊙ wi_1 x)`.
#[derive(Module, Debug)]
pub struct GatedGelu {
    /// d → d_ff, through the tanh-approximated GELU.
    pub wi_0: Linear,
    /// d → d_ff, the linear gate.
    pub wi_1: Linear,
    /// d_ff → d
    pub wo: Linear,
    dropout: Dropout,
}

impl GatedGelu {
    /// The module's own projections.
    fn projections(&self) -> FfnProj<'_> {
        FfnProj {
            wi_0: Proj::Module(&self.wi_0),
            wi_1: Proj::Module(&self.wi_1),
            wo: Proj::Module(&self.wo),
        }
    }

    /// [B, L, d] → [B, L, d]
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.forward_through(self.projections(), x)
    }

    /// [`Self::forward`] with the projections `p`.
    fn forward_through(&self, p: FfnProj, x: Tensor<3>) -> Tensor<3> {
        let gate = Gate::Tensor(p.wi_1.forward(x.clone()));
        let h = gated_activation(p.wi_0.forward(x), None, Activation::GeluTanh, gate);
        p.wo.forward(drop(&self.dropout, h))
    }
}

/// One projection's weights as a layer multiplies by them: the module's own `Linear` (training,
/// teacher forcing, the encoder) or a copy packed for decoding ([`DecodingWeights`]).
#[derive(Clone, Copy)]
enum Proj<'a> {
    Module(&'a Linear),
    Packed(&'a PackedWeight),
}

impl Proj<'_> {
    /// [B, T, d_in] → [B, T, d_out]
    fn forward(self, x: Tensor<3>) -> Tensor<3> {
        match self {
            Proj::Module(l) => linear(l, x),
            Proj::Packed(w) => {
                let [b, t, d] = x.dims();
                let n = w.weight().dims()[1];
                w.matmul(x.reshape([b * t, d])).reshape([b, t, n])
            }
        }
    }
}

/// The projections of an attention sub-layer.
#[derive(Clone, Copy)]
struct AttentionProj<'a> {
    q: Proj<'a>,
    k: Proj<'a>,
    v: Proj<'a>,
    o: Proj<'a>,
}

/// The projections of a feed-forward network.
#[derive(Clone, Copy)]
struct FfnProj<'a> {
    wi_0: Proj<'a>,
    wi_1: Proj<'a>,
    wo: Proj<'a>,
}

/// The projections of a layer (cross-attention's in decoder layers).
#[derive(Clone, Copy)]
struct LayerProj<'a> {
    self_attention: AttentionProj<'a>,
    cross: Option<AttentionProj<'a>>,
    ffn: FfnProj<'a>,
}

/// The weights of a decoder layer that a decoding step multiplies by, packed
/// ([`fused::PackedWeight`]): self-attention's Q, K, V, O, cross-attention's Q and O (its K and V
/// are projected once, into the cache), the feed-forward network's three.
#[derive(Clone, Debug)]
struct PackedLayer {
    self_attention: [PackedWeight; 4],
    cross: [PackedWeight; 2],
    ffn: [PackedWeight; 3],
}

impl PackedLayer {
    fn new(layer: &T5Layer) -> Self {
        let pack = |l: &Linear| PackedWeight::new(l.weight.val());
        let (a, f) = (&layer.self_attention, &layer.ffn);
        let cross = &layer
            .cross
            .as_ref()
            .expect("decoder layers have cross-attention")
            .attention;
        Self {
            self_attention: [pack(&a.q), pack(&a.k), pack(&a.v), pack(&a.o)],
            cross: [pack(&cross.q), pack(&cross.o)],
            ffn: [pack(&f.wi_0), pack(&f.wi_1), pack(&f.wo)],
        }
    }

    /// The projections of `layer` (the layer these weights were packed from), packed.
    fn projections<'a>(&'a self, layer: &'a T5Layer) -> LayerProj<'a> {
        let [q, k, v, o] = &self.self_attention;
        let [cross_q, cross_o] = &self.cross;
        let [wi_0, wi_1, wo] = &self.ffn;
        LayerProj {
            self_attention: AttentionProj {
                q: Proj::Packed(q),
                k: Proj::Packed(k),
                v: Proj::Packed(v),
                o: Proj::Packed(o),
            },
            cross: layer.cross.as_ref().map(|c| AttentionProj {
                q: Proj::Packed(cross_q),
                o: Proj::Packed(cross_o),
                ..c.attention.projections()
            }),
            ffn: FfnProj {
                wi_0: Proj::Packed(wi_0),
                wi_1: Proj::Packed(wi_1),
                wo: Proj::Packed(wo),
            },
        }
    }
}

/// A model's decoder weights packed for decoding steps, whose products have one row per sequence
/// of the batch ([`fused::packed`]): made once per decoding run ([`T5Model::decoding_weights`]),
/// one pass over the decoder's and the LM head's weights, and held by the [`DecoderCache`]. Off
/// plain `flex` they hold the weight tensors only, and the steps use the modules' own path.
#[derive(Clone, Debug)]
pub struct DecodingWeights {
    layers: Vec<PackedLayer>,
    lm_head: PackedWeight,
}

impl DecodingWeights {
    /// Whether every weight has its packed copy (the model lives on plain `flex`).
    pub fn is_packed(&self) -> bool {
        let layer = |l: &PackedLayer| {
            (l.self_attention.iter().chain(&l.cross).chain(&l.ffn)).all(PackedWeight::is_packed)
        };
        self.lm_head.is_packed() && self.layers.iter().all(layer)
    }
}

/// The cross-attention sub-layer of a decoder layer.
#[derive(Module, Debug)]
pub struct CrossAttention {
    /// Pre-norm.
    pub norm: RmsNorm,
    /// Attention over the encoder output (no position bias).
    pub attention: T5Attention,
}

/// One pre-norm layer: self-attention, cross-attention (decoder only), feed-forward.
#[derive(Module, Debug)]
pub struct T5Layer {
    /// Pre-norm of self-attention.
    pub self_norm: RmsNorm,
    /// Self-attention.
    pub self_attention: T5Attention,
    /// Cross-attention (decoder layers).
    pub cross: Option<CrossAttention>,
    /// Pre-norm of the feed-forward network.
    pub ffn_norm: RmsNorm,
    /// Feed-forward network.
    pub ffn: GatedGelu,
    dropout: Dropout,
}

/// The cross-attention inputs of a decoder layer: the encoder output's K/V (or the output itself)
/// (its bias: the encoder's padding).
enum CrossSource<'a> {
    /// Project K/V from the encoder output [B, S, d].
    Encoded(&'a Tensor<3>),
    /// K/V already projected (the decoding cache), [B, G, S, dk] each.
    Cached(&'a Tensor<4>, &'a Tensor<4>),
}

/// Where a layer's self-attention keys and values come from.
enum SelfSource<'a> {
    /// Projected from the layer's input (teacher forcing, the encoder).
    Input,
    /// A decoding step at `position`: its K/V projected, written into the layer's cache
    /// ([B, G, L, dk] each, allocated for `capacity` positions and doubled when full), and the
    /// query attends to positions `0..=position` of it.
    Cache {
        kv: &'a mut Option<(Tensor<4>, Tensor<4>)>,
        position: usize,
        capacity: usize,
    },
}

/// `new` ([B, G, 1, dk]) written at `position` of a decoding cache ([B, G, L, dk]), in place when
/// the cache is allocated past it and held only here (burn's `slice_assign` on a uniquely owned
/// `flex` tensor); allocated for `capacity` positions at the first step, doubled when full.
fn write_position(
    cache: Option<Tensor<4>>,
    new: Tensor<4>,
    position: usize,
    capacity: usize,
) -> Tensor<4> {
    let [b, g, _, dk] = new.dims();
    let cache = match cache {
        Some(cache) if cache.dims()[2] > position => cache,
        old => {
            let len = capacity.max(2 * position).max(position + 1);
            let fresh = Tensor::<4>::zeros([b, g, len, dk], &new.device());
            match old {
                Some(old) => {
                    fresh.slice_assign([0..b, 0..g, 0..position, 0..dk], old.narrow(2, 0, position))
                }
                None => fresh,
            }
        }
    };
    cache.slice_assign([0..b, 0..g, position..position + 1, 0..dk], new)
}

impl T5Layer {
    /// The module's own projections.
    fn projections(&self) -> LayerProj<'_> {
        LayerProj {
            self_attention: self.self_attention.projections(),
            cross: self.cross.as_ref().map(|c| c.attention.projections()),
            ffn: self.ffn.projections(),
        }
    }

    /// x: [B, T, d]; p: the layer's projections (its own, or packed for decoding); self_source:
    /// where self-attention's K/V come from; self_bias: position bias + mask of self-attention.
    fn forward(
        &self,
        p: LayerProj,
        x: Tensor<3>,
        self_source: SelfSource,
        self_bias: &AttentionBias,
        cross: Option<(CrossSource, &AttentionBias)>,
    ) -> Tensor<3> {
        let h = rms_norm(&self.self_norm, x.clone());
        let attention = &self.self_attention;
        let a = match self_source {
            SelfSource::Input => {
                let kv = attention.project_kv(p.self_attention, h.clone());
                attention.attend(p.self_attention, h, kv, self_bias)
            }
            SelfSource::Cache {
                kv,
                position,
                capacity,
            } => {
                let (k_new, v_new) = attention.project_kv(p.self_attention, h.clone());
                let (k, v) = kv.take().unzip();
                let k = write_position(k, k_new, position, capacity);
                let v = write_position(v, v_new, position, capacity);
                let used = position + 1;
                let a = attention.attend_cached(p.self_attention, h, (&k, &v, used), self_bias);
                *kv = Some((k, v));
                a
            }
        };
        let mut x = x + drop(&self.dropout, a);
        if let (Some(layer), Some(pc), Some((source, mask))) = (&self.cross, p.cross, cross) {
            let h = rms_norm(&layer.norm, x.clone());
            let attention = &layer.attention;
            let kv = match source {
                CrossSource::Encoded(encoded) => attention.project_kv(pc, encoded.clone()),
                CrossSource::Cached(k, v) => (k.clone(), v.clone()),
            };
            x = x + drop(&self.dropout, attention.attend(pc, h, kv, mask));
        }
        let h = self
            .ffn
            .forward_through(p.ffn, rms_norm(&self.ffn_norm, x.clone()));
        x + drop(&self.dropout, h)
    }
}

/// An encoder or decoder stack: layers, the stack's position bias table, final norm.
#[derive(Module, Debug)]
pub struct T5Stack {
    /// Layers.
    pub layers: Vec<T5Layer>,
    /// Relative position bias, shared by all layers (Hugging Face stores it in layer 0).
    pub position_bias: RelativePositionBias,
    /// Final RMSNorm.
    pub final_norm: RmsNorm,
    dropout: Dropout,
}

/// −10⁹ where `keep` ([B, S], true = real token) is false: [B, S].
pub fn padding_bias(keep: &Tensor<2, Bool>) -> Tensor<2> {
    let [b, s] = keep.dims();
    Tensor::<2>::zeros([b, s], &keep.device()).mask_fill(keep.clone().bool_not(), MASKED_SCORE)
}

/// The bias of attention over the encoder output (the encoder's self-attention with its
/// `position` bias, the decoder's cross-attention without): its padding.
fn encoder_bias(position: Option<Tensor<2>>, keep: &Tensor<2, Bool>) -> AttentionBias {
    AttentionBias {
        position,
        direction: Direction::Bidirectional,
        padding: Some(padding_bias(keep)),
    }
}

/// −10⁹ on keys after the query: [1, 1, T, T].
fn causal_bias(t: usize, device: &Device) -> Tensor<4> {
    Tensor::<2>::zeros([t, t], device)
        .mask_fill(future_mask(t, device), MASKED_SCORE)
        .reshape([1, 1, t, t])
}

/// Decoder inputs for teacher forcing: the targets shifted right behind the start token (pad, 0).
/// targets: [B, T] → [B, T].
pub fn shift_right(targets: Tensor<2, Int>) -> Tensor<2, Int> {
    let [b, t] = targets.dims();
    let start = Tensor::<2, Int>::zeros([b, 1], &targets.device()).add_scalar(PAD_ID);
    Tensor::cat(vec![start, targets.narrow(1, 0, t - 1)], 1)
}

/// When greedy decoding stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// At EOS, or at the maximum length.
    Eos,
    /// Only at the maximum length: every sequence decodes exactly that many tokens (timing).
    Length,
}

/// A T5.1.1 encoder-decoder.
#[derive(Module, Debug)]
pub struct T5Model {
    /// Input embedding shared by encoder and decoder: [V, d].
    pub shared: Embedding,
    /// Encoder stack (multi-head attention).
    pub encoder: T5Stack,
    /// Decoder stack (G K/V heads in self- and cross-attention).
    pub decoder: T5Stack,
    /// Untied output projection d → V.
    pub lm_head: Linear,
}

/// Positions a decoding cache is allocated for at its first step unless told more
/// ([`DecoderCache::capacity`]); it doubles when full.
pub const DECODER_CACHE_POSITIONS: usize = 64;

/// The decoding state: per decoder layer the self-attention K/V of every past position and the
/// cross-attention K/V of the encoder output, all with G heads ([B, G, ·, dk]).
#[derive(Clone, Debug)]
pub struct DecoderCache {
    /// Self-attention keys and values per layer: [B, G, L, dk], positions `0..position` written,
    /// L ≥ position (allocated ahead, so that a step writes one position instead of copying the
    /// cache); `None` before the first step.
    pub self_kv: Vec<Option<(Tensor<4>, Tensor<4>)>>,
    /// Positions the self-attention caches are allocated for at the first step (doubled when
    /// full): [`DECODER_CACHE_POSITIONS`], or the output length when the caller knows it.
    pub capacity: usize,
    /// Cross-attention keys and values per layer: [B, G, S, dk].
    pub cross_kv: Vec<(Tensor<4>, Tensor<4>)>,
    /// Cross-attention's bias: the encoder's padding ([B, S]).
    pub encoder_bias: AttentionBias,
    /// Positions decoded so far.
    pub position: usize,
    /// The decoder's weights packed for the steps: those of the model that started the cache.
    pub weights: Arc<DecodingWeights>,
}

impl DecoderCache {
    /// The cache of a batch made of `times` copies of this one's (sample i of copy c is sample
    /// i): a large batch's decoding state without encoding every sample. Only a cache at
    /// position 0 (no self-attention K/V yet) is accepted.
    pub fn repeat_batch(&self, times: usize) -> DecoderCache {
        assert_eq!(
            self.position, 0,
            "repeat_batch: the cache has started decoding"
        );
        let rep = |t: &Tensor<4>| t.clone().repeat_dim(0, times);
        let padding = self.encoder_bias.padding.as_ref();
        DecoderCache {
            self_kv: self.self_kv.clone(),
            capacity: self.capacity,
            cross_kv: self
                .cross_kv
                .iter()
                .map(|(k, v)| (rep(k), rep(v)))
                .collect(),
            encoder_bias: AttentionBias {
                padding: padding.map(|p| p.clone().repeat_dim(0, times)),
                ..self.encoder_bias.clone()
            },
            position: 0,
            weights: Arc::clone(&self.weights),
        }
    }

    /// Number of cached key and value elements (self-attention's written positions + cross, all
    /// layers): proportional to G.
    pub fn elements(&self) -> usize {
        let count =
            |(k, v): &(Tensor<4>, Tensor<4>)| k.shape().num_elements() + v.shape().num_elements();
        let written = |(k, v): &(Tensor<4>, Tensor<4>)| {
            let ([b, g, _, dk], dv) = (k.dims(), v.dims()[3]);
            b * g * self.position * (dk + dv)
        };
        self.self_kv.iter().flatten().map(written).sum::<usize>()
            + self.cross_kv.iter().map(count).sum::<usize>()
    }
}

impl T5Model {
    /// Number of K/V heads of the decoder's attention (G).
    pub fn n_kv_heads(&self) -> usize {
        self.decoder.layers[0].self_attention.n_kv_heads
    }

    /// The same weights with every dropout set to `prob` (pre-training 0, fine-tuning 0.1): a
    /// checkpoint carries no dropout rate, the stage that trains it decides.
    pub fn with_dropout(mut self, prob: f64) -> Self {
        let set = |d: &mut Dropout| d.prob = prob;
        for stack in [&mut self.encoder, &mut self.decoder] {
            set(&mut stack.dropout);
            for layer in &mut stack.layers {
                set(&mut layer.dropout);
                set(&mut layer.ffn.dropout);
                set(&mut layer.self_attention.dropout);
                if let Some(cross) = &mut layer.cross {
                    set(&mut cross.attention.dropout);
                }
            }
        }
        self
    }

    /// Encoder output. inputs: [B, S]; keep: [B, S] (true = real token) → [B, S, d].
    pub fn encode(&self, inputs: Tensor<2, Int>, keep: &Tensor<2, Bool>) -> Tensor<3> {
        let s = inputs.dims()[1];
        let stack = &self.encoder;
        let mut x = drop(&stack.dropout, self.shared.forward(inputs));
        // The position bias [H, S, S] and the key padding [B, S].
        let bias = encoder_bias(Some(stack.position_bias.offsets(0, s, s)), keep);
        for layer in &stack.layers {
            x = layer.forward(layer.projections(), x, SelfSource::Input, &bias, None);
        }
        drop(&stack.dropout, rms_norm(&stack.final_norm, x))
    }

    /// Teacher-forced decoder logits. decoder_inputs: [B, T]; encoded: [B, S, d]; keep: [B, S]
    /// → [B, T, V].
    pub fn decode(
        &self,
        decoder_inputs: Tensor<2, Int>,
        encoded: &Tensor<3>,
        keep: &Tensor<2, Bool>,
    ) -> Tensor<3> {
        linear(
            &self.lm_head,
            self.decode_hidden(decoder_inputs, encoded, keep),
        )
    }

    /// The decoder's final hidden states (after its final norm and dropout), the LM head's input:
    /// [B, T, d].
    fn decode_hidden(
        &self,
        decoder_inputs: Tensor<2, Int>,
        encoded: &Tensor<3>,
        keep: &Tensor<2, Bool>,
    ) -> Tensor<3> {
        let t = decoder_inputs.dims()[1];
        let stack = &self.decoder;
        let mut x = drop(&stack.dropout, self.shared.forward(decoder_inputs));
        let self_bias = AttentionBias {
            position: Some(stack.position_bias.offsets(0, t, t)),
            direction: Direction::Causal,
            padding: None,
        };
        let cross_bias = encoder_bias(None, keep);
        for layer in &stack.layers {
            let cross = Some((CrossSource::Encoded(encoded), &cross_bias));
            x = layer.forward(layer.projections(), x, SelfSource::Input, &self_bias, cross);
        }
        drop(&stack.dropout, rms_norm(&stack.final_norm, x))
    }

    /// Logits of `targets` [B, T] given `inputs` [B, S] (teacher forcing) → [B, T, V].
    pub fn forward(
        &self,
        inputs: Tensor<2, Int>,
        keep: &Tensor<2, Bool>,
        targets: Tensor<2, Int>,
    ) -> Tensor<3> {
        let encoded = self.encode(inputs, keep);
        self.decode(shift_right(targets), &encoded, keep)
    }

    /// Mean token cross-entropy over the non-pad target tokens.
    pub fn loss(
        &self,
        inputs: Tensor<2, Int>,
        keep: &Tensor<2, Bool>,
        targets: Tensor<2, Int>,
    ) -> Tensor<1> {
        let [b, t] = targets.dims();
        let encoded = self.encode(inputs, keep);
        let hidden = self.decode_hidden(shift_right(targets.clone()), &encoded, keep);
        let d = hidden.dims()[2];
        let hidden = hidden.reshape([b * t, d]);
        let targets = targets.reshape([b * t]);
        let weights = targets.clone().not_equal_elem(PAD_ID).float();
        // The head and its loss in blocks of rows, never holding the [B·T, V] logits.
        let head = self.lm_head.weight.val();
        fused::linear_head_cross_entropy(&hidden, &head, &targets, Some(&weights))
            .unwrap_or_else(|| cross_entropy(self.lm_head.forward(hidden), targets, Some(weights)))
    }

    /// The decoder's and the LM head's weights packed for decoding steps (one pass over them):
    /// made once and shared by the caches of several decoding runs
    /// ([`Self::start_decoding_with`]), or made per run by [`Self::start_decoding`].
    pub fn decoding_weights(&self) -> Arc<DecodingWeights> {
        Arc::new(DecodingWeights {
            layers: self.decoder.layers.iter().map(PackedLayer::new).collect(),
            lm_head: PackedWeight::new(self.lm_head.weight.val()),
        })
    }

    /// Starts cached decoding: packs the decoding weights ([`Self::decoding_weights`]) and
    /// projects every decoder layer's cross-attention K/V once.
    pub fn start_decoding(&self, encoded: &Tensor<3>, keep: &Tensor<2, Bool>) -> DecoderCache {
        self.start_decoding_with(self.decoding_weights(), encoded, keep)
    }

    /// [`Self::start_decoding`] with weights already packed from this model.
    pub fn start_decoding_with(
        &self,
        weights: Arc<DecodingWeights>,
        encoded: &Tensor<3>,
        keep: &Tensor<2, Bool>,
    ) -> DecoderCache {
        assert_eq!(
            weights.layers.len(),
            self.decoder.layers.len(),
            "decoding weights of another model"
        );
        let cross_kv = self
            .decoder
            .layers
            .iter()
            .map(|layer| {
                let attention = &layer
                    .cross
                    .as_ref()
                    .expect("decoder layers have cross-attention")
                    .attention;
                attention.project_kv(attention.projections(), encoded.clone())
            })
            .collect();
        DecoderCache {
            self_kv: vec![None; self.decoder.layers.len()],
            capacity: DECODER_CACHE_POSITIONS,
            cross_kv,
            encoder_bias: encoder_bias(None, keep),
            position: 0,
            weights,
        }
    }

    /// One cached decoding step: `tokens` [B, 1] at position `cache.position` → logits [B, 1, V].
    pub fn decode_step(&self, tokens: Tensor<2, Int>, cache: &mut DecoderCache) -> Tensor<3> {
        let stack = &self.decoder;
        let t = cache.position;
        let mut x = self.shared.forward(tokens);
        // The query at position t sees keys 0..=t: no causal mask needed.
        let self_bias = AttentionBias {
            position: Some(stack.position_bias.offsets(t, 1, t + 1)),
            direction: Direction::Bidirectional,
            padding: None,
        };
        let weights = Arc::clone(&cache.weights);
        for (i, (layer, packed)) in stack.layers.iter().zip(&weights.layers).enumerate() {
            let (ck, cv) = &cache.cross_kv[i];
            let cross = Some((CrossSource::Cached(ck, cv), &cache.encoder_bias));
            let source = SelfSource::Cache {
                kv: &mut cache.self_kv[i],
                position: t,
                capacity: cache.capacity,
            };
            x = layer.forward(packed.projections(layer), x, source, &self_bias, cross);
        }
        cache.position += 1;
        Proj::Packed(&weights.lm_head).forward(rms_norm(&stack.final_norm, x))
    }

    /// Greedy decoding of a batch with the KV cache: at most `max_len` tokens per sequence; with
    /// [`Stop::Eos`] a sequence stops at EOS (kept in its output) and the batch when all have
    /// stopped. inputs: [B, S]; keep: [B, S] → token ids per sequence.
    pub fn greedy_decode(
        &self,
        inputs: Tensor<2, Int>,
        keep: &Tensor<2, Bool>,
        max_len: usize,
        stop: Stop,
    ) -> Vec<Vec<i64>> {
        let encoded = self.encode(inputs, keep);
        self.greedy_decode_cached(self.start_decoding(&encoded, keep), max_len, stop)
    }

    /// The decoding loop of [`Self::greedy_decode`] from a started cache (its batch is the
    /// cache's): what a decoding benchmark times apart from the encoder and the cross-attention
    /// K/V projection.
    pub fn greedy_decode_cached(
        &self,
        mut cache: DecoderCache,
        max_len: usize,
        stop: Stop,
    ) -> Vec<Vec<i64>> {
        cache.capacity = cache.capacity.max(cache.position + max_len);
        let (k, _) = &cache.cross_kv[0];
        let (b, device) = (k.dims()[0], k.device());
        let mut outputs: Vec<Vec<i64>> = vec![Vec::new(); b];
        let mut done = vec![false; b];
        let mut next = vec![PAD_ID; b];
        for _ in 0..max_len {
            let tokens =
                Tensor::<2, Int>::from_data(TensorData::new(next.clone(), [b, 1]), &device);
            let logits = self.decode_step(tokens, &mut cache); // [B, 1, V]
            let best: Vec<i64> = logits
                .argmax(2)
                .into_data()
                .convert::<i64>()
                .try_into_vec::<i64>()
                .expect("argmax ids");
            for i in 0..b {
                if done[i] {
                    next[i] = PAD_ID;
                    continue;
                }
                outputs[i].push(best[i]);
                next[i] = best[i];
                done[i] = stop == Stop::Eos && best[i] == EOS_ID;
            }
            if done.iter().all(|&d| d) {
                break;
            }
        }
        outputs
    }
}

/// How the K/V heads of a group are initialised when converting MHA to GQA (GQA paper §2.1, Fig. 4).
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum KvConversion {
    /// Mean of the group's heads (the paper's method).
    Mean,
    /// The group's first head.
    First,
    /// Fresh random weights with T5's K/V initialisation (std d^-½); the paper does not say how.
    Random,
}

/// Pools a K or V projection [d, H·dk] (burn's [in, out] layout; column h·dk + j belongs to head h)
/// to [d, G·dk] with contiguous groups of H/G heads.
pub fn pool_kv_heads(
    weight: Tensor<2>,
    n_heads: usize,
    groups: usize,
    method: KvConversion,
) -> Tensor<2> {
    let [d, w] = weight.dims();
    let dk = w / n_heads;
    let grouped = weight.reshape([d, groups, n_heads / groups, dk]);
    let pooled = match method {
        KvConversion::Mean => grouped.mean_dim(2),
        KvConversion::First => grouped.narrow(2, 0, 1),
        KvConversion::Random => {
            let device = grouped.device();
            Tensor::random(
                [d, groups, 1, dk],
                burn::tensor::Distribution::Normal(0.0, (d as f64).powf(-0.5)),
                &device,
            )
        }
    };
    pooled.reshape([d, groups * dk])
}

/// Converts the decoder's self- and cross-attention to `groups` K/V heads (GQA paper §2.1): each
/// K and V projection is pooled by [`pool_kv_heads`]; Q, O and the position bias are unchanged.
/// The model must still be multi-head (its G = H); `groups` must divide H.
pub fn convert_kv_heads(
    mut model: T5Model,
    groups: usize,
    method: KvConversion,
) -> Result<T5Model, String> {
    let attention = &model.decoder.layers[0].self_attention;
    let (h, g) = (attention.n_heads, attention.n_kv_heads);
    if g != h {
        return Err(format!(
            "conversion starts from a multi-head checkpoint; this one already has {g} K/V heads for {h} query heads"
        ));
    }
    if groups == 0 || !h.is_multiple_of(groups) {
        return Err(format!(
            "groups {groups} must divide the {h} heads (1 = MQA, {h} = MHA)"
        ));
    }
    let pool = |linear: &mut Linear| {
        // A new leaf: on an autodiff device the pooled weight is trained from here on.
        let pooled = pool_kv_heads(linear.weight.val(), h, groups, method).detach();
        linear.weight = Param::from_tensor(pooled);
    };
    for layer in &mut model.decoder.layers {
        let cross = layer
            .cross
            .as_mut()
            .expect("decoder layers have cross-attention");
        for attention in [&mut layer.self_attention, &mut cross.attention] {
            pool(&mut attention.k);
            pool(&mut attention.v);
            attention.n_kv_heads = groups;
        }
    }
    Ok(model)
}
