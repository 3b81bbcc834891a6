//! The gated attention unit (GAU) and FLASH's mixed chunk attention (Hua et al. 2022, §2–3).
//!
//! One GAU layer, input X: [B, T, d], e = expansion · d, s = shared Q/K width:
//! ```text
//!   h          = norm(X)
//!   [U, V, Z]  = silu(h W + b)          U, V: [B, T, e]   Z: [B, T, s]     (one projection, appendix Code 1)
//!   heads      = rope(γ_i ⊙ Z + β_i)    2 heads (Q, K) for FLASH-Quad, 4 (Q_quad, K_quad, Q_lin, K_lin) for FLASH
//!   Â          = relu²(Q Kᵀ / n + bias)  full (FLASH-Quad) or mixed chunk attention (FLASH)
//!   out        = X + (U ⊙ Â V) W_o
//! ```

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;

use crate::attention::{
    ChunkParts, MixedChunkSpec, mixed_chunk_attention, relu2_attention, relu2_attention_rank_bias,
};
use crate::fused::Activation;
use crate::layers::{
    Direction, GlobalScaling, Norm, NormKind, RelPosBias, Relu2Scaling, Rope, ScaleOffset, add_to,
    append, linear, linear_columns_activated, normal_init, relu2,
};

/// How a GAU layer spans the sequence.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum GauSpan {
    /// Full quadratic attention over windows of up to `window` positions (FLASH-Quad); the scaling
    /// and the relative position bias are those of `window`.
    Quad {
        /// The attention window n (the model's context).
        window: usize,
    },
    /// Mixed chunk attention with chunks of `chunk` positions (FLASH).
    MixedChunk {
        /// Chunk size C (paper default 256).
        chunk: usize,
        /// Which parts are kept (FLASH, LocalOnly, GlobalOnly).
        parts: ChunkParts,
    },
}

impl GauSpan {
    fn heads(self) -> usize {
        match self {
            GauSpan::Quad { .. } => 2,
            GauSpan::MixedChunk { .. } => 4,
        }
    }
    /// The window of the relu² scores: n for Quad, C for MixedChunk.
    fn window(self) -> usize {
        match self {
            GauSpan::Quad { window } => window,
            GauSpan::MixedChunk { chunk, .. } => chunk,
        }
    }
}

/// Configuration of one GAU layer.
#[derive(Config, Debug)]
pub struct GauConfig {
    /// Model width d.
    pub d_model: usize,
    /// e = expansion_factor · d (paper: 2).
    #[config(default = 2)]
    pub expansion_factor: usize,
    /// Width s of the shared representation Z and of every Q/K head (paper: 128).
    #[config(default = 128)]
    pub d_qk: usize,
    /// Full or mixed chunk attention.
    pub span: GauSpan,
    /// Attention direction.
    pub direction: Direction,
    /// Score scaling convention (paper appendix: divide by the window).
    #[config(default = "Relu2Scaling::Window")]
    pub scaling: Relu2Scaling,
    /// Scaling of FLASH's global (linear) term (the appendix code's ports: by n bidirectional, by
    /// C causal).
    #[config(default = "GlobalScaling::Appendix")]
    pub global_scaling: GlobalScaling,
    /// Pre-norm kind (LayerNorm; ScaleNorm in some of the paper's MLM models).
    #[config(default = "NormKind::LayerNorm")]
    pub norm: NormKind,
}

impl GauConfig {
    /// Builds the layer.
    pub fn init(&self, device: &Device) -> Gau {
        let e = self.expansion_factor * self.d_model;
        let s = self.d_qk;
        let uses_bias = match self.span {
            GauSpan::Quad { .. } => true,
            GauSpan::MixedChunk { parts, .. } => parts.local(),
        };
        Gau {
            norm: Norm::new(self.norm, self.d_model, device),
            proj: LinearConfig::new(self.d_model, 2 * e + s)
                .with_initializer(normal_init())
                .init(device),
            heads: ScaleOffset::new(self.span.heads(), s, device),
            bias: uses_bias.then(|| RelPosBias::new(self.span.window(), device)),
            out: LinearConfig::new(e, self.d_model)
                .with_initializer(normal_init())
                .init(device),
            d_e: e,
            d_qk: s,
            span: self.span,
            direction: self.direction,
            scaling: self.scaling,
            global_scaling: self.global_scaling,
        }
    }
}

/// A GAU layer (FLASH-Quad) or a FLASH layer (mixed chunk attention), with its residual.
#[derive(Module, Debug)]
pub struct Gau {
    norm: Norm,
    /// d → [U | V | Z] (2e + s).
    proj: Linear,
    heads: ScaleOffset,
    /// Relative position bias of the quadratic part (absent for GlobalOnly).
    bias: Option<RelPosBias>,
    out: Linear,
    d_e: usize,
    d_qk: usize,
    #[module(skip)]
    span: GauSpan,
    #[module(skip)]
    direction: Direction,
    #[module(skip)]
    scaling: Relu2Scaling,
    #[module(skip)]
    global_scaling: GlobalScaling,
}

/// The decoding state of one GAU layer.
// One value per layer, built once: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum GauCache {
    /// FLASH-Quad: every past key and value.
    Quad {
        /// [B, t, s]
        k: Option<Tensor<3>>,
        /// [B, t, e]
        v: Option<Tensor<3>>,
    },
    /// FLASH: Σ over finished chunks of K_linᵀV·f_g plus the current chunk's keys and values.
    MixedChunk {
        /// [B, s, e]
        kv_sum: Option<Tensor<3>>,
        /// [B, i, s] quadratic keys of the current chunk.
        k_quad: Option<Tensor<3>>,
        /// [B, i, s] linear keys of the current chunk.
        k_lin: Option<Tensor<3>>,
        /// [B, i, e] values of the current chunk.
        v: Option<Tensor<3>>,
    },
}

impl Gau {
    /// The mixed chunk attention of this layer, for chunks of `chunk` keeping `parts`.
    fn chunk_spec(&self, chunk: usize, parts: ChunkParts) -> MixedChunkSpec {
        MixedChunkSpec {
            chunk,
            scaling: self.scaling,
            global_scaling: self.global_scaling,
            direction: self.direction,
            parts,
        }
    }

    /// Splits the projection into U, V and the scale/offset heads (RoPE applied).
    fn project(
        &self,
        x: Tensor<3>,
        rope: &Rope,
        keep: Option<&Tensor<3>>,
    ) -> (Tensor<3>, Tensor<3>, Vec<Tensor<3>>) {
        let h = self.norm.forward(x);
        let part = |start, len| {
            linear_columns_activated(&self.proj, h.clone(), (start, len), Activation::Silu)
        };
        let u = part(0, self.d_e);
        let mut v = part(self.d_e, self.d_e);
        let z = part(2 * self.d_e, self.d_qk);
        if let Some(keep) = keep {
            // Zero values at padded positions: that removes them from every attention part.
            v = v * keep.clone();
        }
        let heads = self.heads.forward_rotated(z, rope);
        (u, v, heads)
    }

    /// Full-sequence forward. x: [B, T, d]; rope: tables for positions 0..T of width s;
    /// keep: [B, T, 1] (0 on padding) → [B, T, d].
    pub fn forward(&self, x: Tensor<3>, rope: &Rope, keep: Option<&Tensor<3>>) -> Tensor<3> {
        let t = x.dims()[1];
        let device = x.device();
        let (u, v, mut heads) = self.project(x.clone(), rope, keep);
        let a = match self.span {
            GauSpan::Quad { window } => {
                let k = heads.pop().expect("k");
                let q = heads.pop().expect("q");
                let factor = self.scaling.factor(window);
                let rank = self
                    .bias
                    .as_ref()
                    .and_then(|b| b.rope_factors(0..t, t, &device));
                match rank {
                    Some(ab) => relu2_attention_rank_bias(q, k, v, ab, factor, self.direction),
                    None => {
                        let bias = self.bias.as_ref().map(|b| b.square(t, &device));
                        relu2_attention(q, k, v, bias, factor, self.direction)
                    }
                }
            }
            GauSpan::MixedChunk { chunk, parts } => {
                let heads: [Tensor<3>; 4] = heads.try_into().expect("four heads");
                let bias = self.bias.as_ref().map(|b| b.square(chunk, &device));
                // Real tokens per sequence, where the global term is scaled by the length.
                let real_len = keep.map(|k| k.clone().sum_dim(1)); // [B, 1, 1]
                mixed_chunk_attention(heads, v, bias, self.chunk_spec(chunk, parts), real_len)
            }
        };
        x + linear(&self.out, u * a)
    }

    /// An empty decoding state.
    pub fn empty_cache(&self) -> GauCache {
        match self.span {
            GauSpan::Quad { .. } => GauCache::Quad { k: None, v: None },
            GauSpan::MixedChunk { .. } => GauCache::MixedChunk {
                kv_sum: None,
                k_quad: None,
                k_lin: None,
                v: None,
            },
        }
    }

    /// One decoding step at position `pos`. x: [B, 1, d]; rope: tables for position `pos` → [B, 1, d].
    pub fn step(&self, x: Tensor<3>, pos: usize, rope: &Rope, cache: &mut GauCache) -> Tensor<3> {
        assert_eq!(
            self.direction,
            Direction::Causal,
            "only causal layers decode step by step"
        );
        let device = x.device();
        let (u, v, mut heads) = self.project(x.clone(), rope, None);
        let a = match (self.span, cache) {
            (GauSpan::Quad { window }, GauCache::Quad { k: kc, v: vc }) => {
                let k = append(kc, heads.pop().expect("k"));
                let q = heads.pop().expect("q");
                let v = append(vc, v);
                let mut scores = q
                    .matmul(k.swap_dims(1, 2))
                    .mul_scalar(self.scaling.factor(window));
                if let Some(b) = &self.bias {
                    scores = scores + b.block(pos..pos + 1, pos + 1, &device).unsqueeze::<3>();
                }
                relu2(scores).matmul(v)
            }
            (
                GauSpan::MixedChunk { chunk, parts },
                GauCache::MixedChunk {
                    kv_sum,
                    k_quad,
                    k_lin,
                    v: vc,
                },
            ) => {
                let [qq, kq, ql, kl]: [Tensor<3>; 4] = heads.try_into().expect("four heads");
                let spec = self.chunk_spec(chunk, parts);
                let factor = spec.local_factor();
                let i = pos % chunk;
                let kq = append(k_quad, kq);
                let kl = append(k_lin, kl);
                let vs = append(vc, v.clone());
                let mut out = Tensor::<3>::zeros(v.dims(), &device);
                if parts.local() {
                    let mut scores = qq.matmul(kq.swap_dims(1, 2)).mul_scalar(factor);
                    if let Some(b) = &self.bias {
                        scores = scores + b.block(i..i + 1, i + 1, &device).unsqueeze::<3>();
                    }
                    out = out + relu2(scores).matmul(vs.clone());
                }
                if parts.global()
                    && let Some(kv) = kv_sum.as_ref()
                {
                    out = out + ql.matmul(kv.clone());
                }
                if i + 1 == chunk {
                    let f_global = spec.global_factor(pos + 1);
                    add_to(kv_sum, kl.swap_dims(1, 2).matmul(vs).mul_scalar(f_global));
                    *k_quad = None;
                    *k_lin = None;
                    *vc = None;
                }
                out
            }
            _ => panic!("decoding cache does not match the layer"),
        };
        x + linear(&self.out, u * a)
    }
}
