//! Transformer blocks: multi-head self-attention + feed-forward, pre-norm, with the attention of the
//! baselines of the FLASH paper (§4.1):
//!
//! | model          | attention                                   | positions   | FFN        |
//! |----------------|---------------------------------------------|-------------|------------|
//! | Transformer    | softmax MHSA                                | scaled sin. | GELU MLP   |
//! | Transformer+   | softmax MHSA                                | RoPE        | GELU MLP   |
//! | Transformer++  | softmax MHSA                                | RoPE        | GELU-GLU   |
//! | Performer      | FAVOR+ (Choromanski et al. 2021)            | RoPE        | GELU-GLU   |
//! | Combiner       | local + chunk summaries (Ren et al. 2021)   | RoPE        | GELU-GLU   |
//! | MC-TFM++       | mixed chunk attention, per head             | RoPE        | GELU-GLU   |
//! | TFM++ (relu²)  | relu²(QKᵀ/n) per head, unchunked            | RoPE        | GELU-GLU   |
//!
//! The last row is not in the paper: it is MC-TFM++ without the chunking (its scores, unchunked),
//! the control that separates MC-TFM++'s two changes to Transformer++ (relu² for softmax, and
//! chunking).

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::softmax;

use crate::attention::{
    ChunkParts, FavorPrefix, MixedChunkSpec, combiner_attention, favor_attention, favor_exponent,
    favor_features, favor_query_features, favor_ratio, mixed_chunk_attention, relu2_attention,
    softmax_attention,
};
use crate::fused::{self, Activation, Gate, gated_activation};
use crate::layers::{
    Direction, GlobalScaling, Norm, NormKind, Relu2Scaling, Rope, add_to, append, linear,
    linear_bias_columns, linear_columns, linear_columns_activated, linear_columns_unbiased,
    normal_init, relu2,
};

/// Block size of the blockwise prefix sums of causal FAVOR+ (an implementation detail: any value
/// gives the same result).
pub const FAVOR_CAUSAL_BLOCK: usize = 256;

/// The attention of a Transformer block.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Softmax attention over the whole sequence.
    Softmax,
    /// FAVOR+ with `features` orthogonal random features per head.
    Favor {
        /// Number of random features m.
        features: usize,
        /// How the causal form sums over the prefix.
        prefix: FavorPrefix,
    },
    /// Combiner: local attention in chunks plus one mean summary per chunk.
    Combiner {
        /// Chunk size.
        chunk: usize,
    },
    /// Mixed chunk attention (FLASH §3.2) per head: relu² within chunks, linear across them, the
    /// same Q and K for both parts.
    MixedChunk {
        /// Chunk size.
        chunk: usize,
        /// Scaling of the global (linear) term.
        global_scaling: GlobalScaling,
    },
    /// GAU's scoring per head, unchunked: `relu²(Q Kᵀ / n) V` with n the window (no relative
    /// position bias: the heads have RoPE, as MC-TFM++'s). With a single chunk (C = n, causal),
    /// MC-TFM++ is exactly this.
    Relu2 {
        /// The attention window n (the model's context).
        window: usize,
    },
}

/// Which feed-forward network a block has.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum FeedForwardKind {
    /// `gelu(x W1 + b1) W2 + b2`.
    Mlp,
    /// `(gelu(x Wa) ⊙ x Wg) W2`: the gated linear unit of Transformer++ (Shazeer 2020, GEGLU).
    Glu,
}

/// Configuration of one Transformer block.
#[derive(Config, Debug)]
pub struct TransformerBlockConfig {
    /// Model width d.
    pub d_model: usize,
    /// Number of heads (head width d / heads).
    pub n_heads: usize,
    /// Hidden width of the feed-forward network.
    pub d_ff: usize,
    /// Attention kind.
    pub attention: AttentionKind,
    /// Feed-forward kind.
    pub feed_forward: FeedForwardKind,
    /// Attention direction.
    pub direction: Direction,
    /// Norm of both pre-norm branches.
    #[config(default = "NormKind::LayerNorm")]
    pub norm: NormKind,
    /// Seed of the FAVOR+ random features.
    #[config(default = 0)]
    pub seed: u64,
}

impl TransformerBlockConfig {
    /// Builds the block.
    pub fn init(&self, device: &Device) -> TransformerBlock {
        let d = self.d_model;
        let dh = d / self.n_heads;
        assert_eq!(
            dh * self.n_heads,
            d,
            "d_model {d} is not divisible by {} heads",
            self.n_heads
        );
        let linear = |i, o| {
            LinearConfig::new(i, o)
                .with_initializer(normal_init())
                .init(device)
        };
        let ffn_in = match self.feed_forward {
            FeedForwardKind::Mlp => self.d_ff,
            FeedForwardKind::Glu => 2 * self.d_ff,
        };
        let omega = match self.attention {
            AttentionKind::Favor { features, .. } => {
                Some(orthogonal_features(dh, features, self.seed, device))
            }
            _ => None,
        };
        TransformerBlock {
            norm1: Norm::new(self.norm, d, device),
            qkv: linear(d, 3 * d),
            attn_out: linear(d, d),
            norm2: Norm::new(self.norm, d, device),
            ffn_in: linear(d, ffn_in),
            ffn_out: linear(self.d_ff, d),
            omega,
            n_heads: self.n_heads,
            d_ff: self.d_ff,
            attention: self.attention,
            feed_forward: self.feed_forward,
            direction: self.direction,
        }
    }
}

/// Orthogonal random features for FAVOR+ (Choromanski et al. 2021 §2.4): blocks of `dh` orthogonal
/// Gaussian directions, each row rescaled to the norm of a Gaussian vector. Returns ω: [dh, m].
pub fn orthogonal_features(dh: usize, m: usize, seed: u64, device: &Device) -> Tensor<2> {
    let mut rng = SplitMix64(seed ^ 0x5eed_fa70);
    let mut rows: Vec<Vec<f64>> = Vec::with_capacity(m);
    while rows.len() < m {
        // Gram–Schmidt on a block of Gaussian vectors.
        let mut block: Vec<Vec<f64>> = Vec::with_capacity(dh);
        for _ in 0..dh {
            let mut v: Vec<f64> = (0..dh).map(|_| rng.gaussian()).collect();
            for b in &block {
                let dot: f64 = v.iter().zip(b).map(|(x, y)| x * y).sum();
                v.iter_mut().zip(b).for_each(|(x, y)| *x -= dot * y);
            }
            let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
            v.iter_mut().for_each(|x| *x /= norm);
            block.push(v);
        }
        for mut v in block.into_iter().take(m - rows.len()) {
            let scale = (0..dh).map(|_| rng.gaussian().powi(2)).sum::<f64>().sqrt();
            v.iter_mut().for_each(|x| *x *= scale);
            rows.push(v);
        }
    }
    let mut data = vec![0f32; dh * m];
    for (j, row) in rows.iter().enumerate() {
        for (i, x) in row.iter().enumerate() {
            data[i * m + j] = *x as f32;
        }
    }
    Tensor::from_data(TensorData::new(data, [dh, m]), device)
}

/// A small deterministic generator so that random features do not depend on the backend's RNG.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn gaussian(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// A pre-norm Transformer block.
#[derive(Module, Debug)]
pub struct TransformerBlock {
    norm1: Norm,
    /// d → [Q | K | V].
    qkv: Linear,
    attn_out: Linear,
    norm2: Norm,
    /// d → d_ff (MLP) or 2·d_ff (GLU: [A | gate]).
    ffn_in: Linear,
    ffn_out: Linear,
    /// FAVOR+ features ω: [dh, m] (a constant, not trained).
    omega: Option<Tensor<2>>,
    n_heads: usize,
    d_ff: usize,
    #[module(skip)]
    attention: AttentionKind,
    #[module(skip)]
    feed_forward: FeedForwardKind,
    #[module(skip)]
    direction: Direction,
}

/// The decoding state of one Transformer block.
// One value per layer, built once: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum BlockCache {
    /// Softmax attention: every past key and value, [B·H, t, dh].
    Kv {
        /// keys
        k: Option<Tensor<3>>,
        /// values
        v: Option<Tensor<3>>,
    },
    /// FAVOR+: Σ φ(k) vᵀ [B·H, m, dh] and Σ φ(k) [B·H, 1, m], both under the running shift
    /// (the largest key exponent so far, [B·H, 1, 1]).
    Favor {
        /// Σ φ(k) vᵀ
        kv: Option<Tensor<3>>,
        /// Σ φ(k)
        z: Option<Tensor<3>>,
        /// running shift
        shift: Option<Tensor<3>>,
    },
    /// Combiner: current chunk's keys/values and the summaries of finished chunks, [B·H, ·, dh].
    Combiner {
        /// keys of the current chunk
        k: Option<Tensor<3>>,
        /// values of the current chunk
        v: Option<Tensor<3>>,
        /// summary keys of finished chunks
        k_sum: Option<Tensor<3>>,
        /// summary values of finished chunks
        v_sum: Option<Tensor<3>>,
    },
    /// Mixed chunk: Σ over finished chunks of KᵀV·f_g [B·H, dh, dh] and the current chunk's keys/values.
    MixedChunk {
        /// running sum
        kv_sum: Option<Tensor<3>>,
        /// keys of the current chunk
        k: Option<Tensor<3>>,
        /// values of the current chunk
        v: Option<Tensor<3>>,
    },
}

impl TransformerBlock {
    /// [B, T, d] → [B·H, T, dh], each head's vectors rotated by RoPE when `rope` is given: one
    /// fused pass on flex ([`fused::split_heads`]), burn's reshape / swap / reshape and RoPE
    /// elsewhere.
    fn split_heads(&self, x: Tensor<3>, rope: Option<&Rope>) -> Tensor<3> {
        let h = self.n_heads;
        if let Some(heads) = fused::split_heads(&x, h, rope.map(Rope::tables)) {
            return heads;
        }
        let [b, t, d] = x.dims();
        let heads = x
            .reshape([b, t, h, d / h])
            .swap_dims(1, 2)
            .reshape([b * h, t, d / h]);
        match rope {
            Some(rope) => rope.apply(heads),
            None => heads,
        }
    }

    /// [B·H, T, dh] → [B, T, d] (fused on flex, [`fused::merge_heads`]).
    fn merge_heads(&self, x: Tensor<3>) -> Tensor<3> {
        let h = self.n_heads;
        if let Some(merged) = fused::merge_heads(&x, h) {
            return merged;
        }
        let [bh, t, dh] = x.dims();
        x.reshape([bh / h, h, t, dh])
            .swap_dims(1, 2)
            .reshape([bh / h, t, h * dh])
    }

    /// Q, K, V as [B·H, T, dh], with RoPE on Q and K when given.
    fn qkv(&self, x: Tensor<3>, rope: Option<&Rope>) -> (Tensor<3>, Tensor<3>, Tensor<3>) {
        let d = x.dims()[2];
        let h = self.norm1.forward(x);
        let part =
            |i: usize, rope| self.split_heads(linear_columns(&self.qkv, h.clone(), i * d, d), rope);
        (part(0, rope), part(1, rope), part(2, None))
    }

    fn feed_forward(&self, x: Tensor<3>) -> Tensor<3> {
        let h = self.norm2.forward(x.clone());
        let h = match self.feed_forward {
            FeedForwardKind::Mlp => {
                linear_columns_activated(&self.ffn_in, h, (0, self.d_ff), Activation::Gelu)
            }
            FeedForwardKind::Glu => {
                // gelu(h W₁ + b₁) ⊙ (h W₂ + b₂) from one product h [W₁ W₂]: h's gradient is one
                // product, and the bias, GELU and gate take one pass each way.
                let both = (0, 2 * self.d_ff);
                let y = linear_columns_unbiased(&self.ffn_in, h, both);
                let bias = linear_bias_columns(&self.ffn_in, both);
                gated_activation(y, bias, Activation::Gelu, Gate::SecondHalf)
            }
        };
        x + linear(&self.ffn_out, h)
    }

    /// Full-sequence forward. x: [B, T, d]; rope: tables of width dh for 0..T, or none (absolute
    /// positions); keep: [B, T, 1] (0 on padding) → [B, T, d].
    pub fn forward(
        &self,
        x: Tensor<3>,
        rope: Option<&Rope>,
        keep: Option<&Tensor<3>>,
    ) -> Tensor<3> {
        let [b, t, _] = x.dims();
        let h = self.n_heads;
        let (q, k, mut v) = self.qkv(x.clone(), rope);
        // Per-head copy of the keep multiplier: [B·H, T, 1].
        let keep_h = keep.map(|keep| {
            keep.clone()
                .unsqueeze_dim::<4>(1)
                .expand([b, h, t, 1])
                .reshape([b * h, t, 1])
        });
        let a = match self.attention {
            AttentionKind::Softmax => {
                let key_keep = keep_h.map(|k| k.swap_dims(1, 2).equal_elem(1.0));
                softmax_attention(q, k, v, key_keep, self.direction)
            }
            AttentionKind::Favor { prefix, .. } => {
                let omega = self.omega.as_ref().expect("FAVOR+ features");
                favor_attention(q, k, v, keep_h, omega, self.direction, prefix)
            }
            AttentionKind::Combiner { chunk } => {
                combiner_attention(q, k, v, keep_h, chunk, self.direction)
            }
            AttentionKind::MixedChunk {
                chunk,
                global_scaling,
            } => {
                let real_len = keep_h.as_ref().map(|k| k.clone().sum_dim(1)); // [B·H, 1, 1]
                if let Some(keep) = keep_h {
                    v = v * keep;
                }
                let spec = MixedChunkSpec {
                    chunk,
                    scaling: Relu2Scaling::Window,
                    global_scaling,
                    direction: self.direction,
                    parts: ChunkParts::Mixed,
                };
                mixed_chunk_attention([q.clone(), k.clone(), q, k], v, None, spec, real_len)
            }
            AttentionKind::Relu2 { window } => {
                if let Some(keep) = keep_h {
                    // Zero values at padded keys: relu² has no normaliser, so that removes them.
                    v = v * keep;
                }
                let factor = Relu2Scaling::Window.factor(window);
                relu2_attention(q, k, v, None, factor, self.direction)
            }
        };
        let x = x + linear(&self.attn_out, self.merge_heads(a));
        self.feed_forward(x)
    }

    /// An empty decoding state.
    pub fn empty_cache(&self) -> BlockCache {
        match self.attention {
            AttentionKind::Softmax | AttentionKind::Relu2 { .. } => {
                BlockCache::Kv { k: None, v: None }
            }
            AttentionKind::Favor { .. } => BlockCache::Favor {
                kv: None,
                z: None,
                shift: None,
            },
            AttentionKind::Combiner { .. } => BlockCache::Combiner {
                k: None,
                v: None,
                k_sum: None,
                v_sum: None,
            },
            AttentionKind::MixedChunk { .. } => BlockCache::MixedChunk {
                kv_sum: None,
                k: None,
                v: None,
            },
        }
    }

    /// One decoding step (RoPE tables of the token's position). x: [B, 1, d] → [B, 1, d].
    pub fn step(&self, x: Tensor<3>, rope: Option<&Rope>, cache: &mut BlockCache) -> Tensor<3> {
        assert_eq!(
            self.direction,
            Direction::Causal,
            "only causal blocks decode step by step"
        );
        let (q, k, v) = self.qkv(x.clone(), rope);
        let dh = q.dims()[2];
        let a = match (self.attention, cache) {
            (AttentionKind::Softmax, BlockCache::Kv { k: kc, v: vc }) => {
                let k = append(kc, k);
                let v = append(vc, v);
                let scores = q
                    .matmul(k.swap_dims(1, 2))
                    .mul_scalar(1.0 / (dh as f64).sqrt());
                softmax(scores, 2).matmul(v)
            }
            (AttentionKind::Relu2 { window }, BlockCache::Kv { k: kc, v: vc }) => {
                let k = append(kc, k);
                let v = append(vc, v);
                let scores = q
                    .matmul(k.swap_dims(1, 2))
                    .mul_scalar(Relu2Scaling::Window.factor(window));
                relu2(scores).matmul(v)
            }
            (AttentionKind::Favor { .. }, BlockCache::Favor { kv, z, shift }) => {
                let omega = self.omega.as_ref().expect("FAVOR+ features");
                let (fq, q_shift) = favor_query_features(q, omega); // [N, 1, m]
                let ak = favor_exponent(k, omega);
                let new_shift = match shift.take() {
                    Some(old) => {
                        let new = old.clone().max_pair(ak.clone().max_dim(2));
                        // Re-express the sums under the new shift: × exp(old − new) ≤ 1.
                        let rescale = (old - new.clone()).exp();
                        *kv = kv.take().map(|s| s * rescale.clone());
                        *z = z.take().map(|s| s * rescale);
                        new
                    }
                    None => ak.clone().max_dim(2),
                };
                *shift = Some(new_shift.clone());
                let fk = favor_features(ak, new_shift.clone());
                let kv = add_to(kv, fk.clone().swap_dims(1, 2).matmul(v)); // [N, m, dh]
                let z = add_to(z, fk); // [N, 1, m]
                let num = fq.clone().matmul(kv);
                let den = fq.matmul(z.swap_dims(1, 2));
                favor_ratio(num, den, q_shift, new_shift)
            }
            (
                AttentionKind::Combiner { chunk },
                BlockCache::Combiner {
                    k: kc,
                    v: vc,
                    k_sum,
                    v_sum,
                },
            ) => {
                let scale = 1.0 / (dh as f64).sqrt();
                let kl = append(kc, k);
                let vl = append(vc, v);
                let mut keys = kl.clone();
                let mut values = vl.clone();
                if let (Some(ks), Some(vs)) = (k_sum.as_ref(), v_sum.as_ref()) {
                    keys = Tensor::cat(vec![keys, ks.clone()], 1);
                    values = Tensor::cat(vec![values, vs.clone()], 1);
                }
                let p = softmax(q.matmul(keys.swap_dims(1, 2)).mul_scalar(scale), 2);
                let out = p.matmul(values);
                if kl.dims()[1] == chunk {
                    append(k_sum, kl.mean_dim(1));
                    append(v_sum, vl.mean_dim(1));
                    *kc = None;
                    *vc = None;
                }
                out
            }
            (
                AttentionKind::MixedChunk {
                    chunk,
                    global_scaling,
                },
                BlockCache::MixedChunk {
                    kv_sum,
                    k: kc,
                    v: vc,
                },
            ) => {
                let factor = Relu2Scaling::Window.factor(chunk);
                let f_global = global_scaling.factor(chunk, chunk, Direction::Causal);
                let kl = append(kc, k);
                let vl = append(vc, v);
                let mut out = relu2(
                    q.clone()
                        .matmul(kl.clone().swap_dims(1, 2))
                        .mul_scalar(factor),
                )
                .matmul(vl.clone());
                if let Some(kv) = kv_sum.as_ref() {
                    out = out + q.matmul(kv.clone());
                }
                if kl.dims()[1] == chunk {
                    add_to(kv_sum, kl.swap_dims(1, 2).matmul(vl).mul_scalar(f_global));
                    *kc = None;
                    *vc = None;
                }
                out
            }
            _ => panic!("decoding cache does not match the block"),
        };
        let x = x + linear(&self.attn_out, self.merge_heads(a));
        self.feed_forward(x)
    }
}
