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
//!
//! The ablations of the paper's Table 1 are fields of [`GauConfig`], each defaulting to the paper's
//! GAU: softmax scoring ([`GauScoring`]), several heads (`heads`), no gate (`gated`), no relative
//! position bias (`relative_bias`), no RoPE (`rope`); s and e are `d_qk` and `expansion_factor`.
//! With h heads, Z and its scale/offset pairs give h query and h key heads of width s, V is split
//! into h groups of e/h columns, and head i mixes group i (multi-head attention over GAU's shared Z,
//! the parameter count changing only by the 2(h − 1)·s extra scale/offset pairs).

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::softmax;

use crate::attention::{
    ChunkParts, MixedChunkSpec, mixed_chunk_attention, rank_bias_pays, score_spec,
    scored_attention, scored_attention_rank_bias, scored_attention_reference,
};
use crate::fused::{Activation, Gate, ScoreFn, gated_activation};
use crate::layers::{
    Direction, GlobalScaling, Norm, NormKind, RelPosBias, Relu2Scaling, Rope, ScaleOffset, add_to,
    append, linear, linear_bias_columns, linear_columns_activated, linear_columns_unbiased,
    normal_init, relu2,
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

/// The score function of a GAU layer's quadratic attention.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum GauScoring {
    /// `relu²(Q Kᵀ · f + b)`, f from [`Relu2Scaling`] (FLASH §2; the paper's GAU).
    Relu2,
    /// `softmax(Q Kᵀ / sqrt(s) + b)` over the visible keys (FLASH Table 1's softmax row).
    Softmax,
}

impl GauScoring {
    fn score_fn(self) -> ScoreFn {
        match self {
            GauScoring::Relu2 => ScoreFn::Relu2,
            GauScoring::Softmax => ScoreFn::Softmax,
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
    /// Score function of the quadratic attention (paper: relu²; softmax is a Table 1 ablation).
    /// Full attention only ([`GauSpan::Quad`]).
    #[config(default = "GauScoring::Relu2")]
    pub scoring: GauScoring,
    /// Attention heads h over the shared Z (paper: 1; 2 and 4 are Table 1 ablations); must divide
    /// e. Full attention only.
    #[config(default = 1)]
    pub heads: usize,
    /// Whether the output is gated by U (paper: yes; without it, `out = X + (Â V) W_o` and the
    /// projection has no U columns).
    #[config(default = true)]
    pub gated: bool,
    /// Whether the relative position bias is added to the scores (paper: yes).
    #[config(default = true)]
    pub relative_bias: bool,
    /// Whether RoPE rotates the query and key heads (paper: yes).
    #[config(default = true)]
    pub rope: bool,
}

impl GauConfig {
    /// Builds the layer.
    pub fn init(&self, device: &Device) -> Gau {
        let e = self.expansion_factor * self.d_model;
        let s = self.d_qk;
        let uses_bias = self.relative_bias
            && match self.span {
                GauSpan::Quad { .. } => true,
                GauSpan::MixedChunk { parts, .. } => parts.local(),
            };
        let d_u = if self.gated { e } else { 0 };
        Gau {
            norm: Norm::new(self.norm, self.d_model, device),
            proj: LinearConfig::new(self.d_model, d_u + e + s)
                .with_initializer(normal_init())
                .init(device),
            heads: ScaleOffset::new(self.span.heads() * self.heads, s, device),
            bias: uses_bias.then(|| RelPosBias::new(self.span.window(), device)),
            out: LinearConfig::new(e, self.d_model)
                .with_initializer(normal_init())
                .init(device),
            d_u,
            d_e: e,
            d_qk: s,
            n_heads: self.heads,
            rope: self.rope,
            span: self.span,
            direction: self.direction,
            scaling: self.scaling,
            global_scaling: self.global_scaling,
            scoring: self.scoring,
        }
    }

    /// Checks the ablation fields against the span: softmax scoring and several heads are defined
    /// for full attention only, and the heads must split e evenly.
    pub fn check(&self) -> Result<(), String> {
        let e = self.expansion_factor * self.d_model;
        if self.heads == 0 || !e.is_multiple_of(self.heads) {
            return Err(format!(
                "GAU heads = {} must divide e = {e} (expansion_factor x d_model); pick a divisor",
                self.heads
            ));
        }
        if let GauSpan::MixedChunk { .. } = self.span
            && (self.heads != 1 || self.scoring != GauScoring::Relu2)
        {
            return Err(
                "GAU softmax scoring and several heads are defined for full attention (flash_quad) only; set gau_heads = 1 and gau_scoring = \"Relu2\" for chunked models"
                    .into(),
            );
        }
        Ok(())
    }
}

/// A GAU layer (FLASH-Quad) or a FLASH layer (mixed chunk attention), with its residual.
#[derive(Module, Debug)]
pub struct Gau {
    norm: Norm,
    /// d → [U | V | Z] (2e + s; e + s without the gate).
    proj: Linear,
    heads: ScaleOffset,
    /// Relative position bias of the quadratic part (absent for GlobalOnly).
    bias: Option<RelPosBias>,
    out: Linear,
    /// Width of U: e, or 0 without the gate.
    d_u: usize,
    d_e: usize,
    d_qk: usize,
    /// Attention heads over Z (1 in the paper).
    n_heads: usize,
    /// Whether RoPE rotates the heads.
    rope: bool,
    #[module(skip)]
    span: GauSpan,
    #[module(skip)]
    direction: Direction,
    #[module(skip)]
    scaling: Relu2Scaling,
    #[module(skip)]
    global_scaling: GlobalScaling,
    #[module(skip)]
    scoring: GauScoring,
}

/// Folds h heads into the batch: h tensors [B, T, w] → [h·B, T, w] (head-major).
fn fold_heads(heads: Vec<Tensor<3>>) -> Tensor<3> {
    if heads.len() == 1 {
        return heads.into_iter().next().expect("one head");
    }
    Tensor::cat(heads, 0)
}

/// Splits V's e columns into h groups folded into the batch: [B, T, e] → [h·B, T, e/h].
fn fold_columns(v: Tensor<3>, h: usize) -> Tensor<3> {
    if h == 1 {
        return v;
    }
    Tensor::cat(v.chunk(h, 2), 0)
}

/// The inverse of [`fold_columns`]: [h·B, T, e/h] → [B, T, e].
fn unfold_columns(a: Tensor<3>, h: usize) -> Tensor<3> {
    if h == 1 {
        return a;
    }
    Tensor::cat(a.chunk(h, 0), 2)
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

    /// Splits the projection into U (none without the gate), V and the scale/offset heads (RoPE
    /// applied unless ablated).
    fn project(
        &self,
        x: Tensor<3>,
        rope: &Rope,
        keep: Option<&Tensor<3>>,
    ) -> (Option<Tensor<3>>, Tensor<3>, Vec<Tensor<3>>) {
        let h = self.norm.forward(x);
        let part = |start, len| {
            linear_columns_activated(&self.proj, h.clone(), (start, len), Activation::Silu)
        };
        // U before its bias and SiLU, which the gate applies in its own pass (`output`).
        let u =
            (self.d_u > 0).then(|| linear_columns_unbiased(&self.proj, h.clone(), (0, self.d_u)));
        let mut v = part(self.d_u, self.d_e);
        let z = part(self.d_u + self.d_e, self.d_qk);
        if let Some(keep) = keep {
            // Zero values at padded positions: that removes them from every relu² attention part
            // (the softmax ablation also masks them out of its normalisation).
            v = v * keep.clone();
        }
        let heads = if self.rope {
            self.heads.forward_rotated(z, rope)
        } else {
            self.heads.forward(z)
        };
        (u, v, heads)
    }

    /// `x + (U ⊙ A) W_o`, or `x + A W_o` without the gate; `u_pre`: U before its bias and SiLU
    /// (`U = silu(X W_u + b_u)`, FLASH Eq. 1), folded into the gate's single pass.
    fn output(&self, x: Tensor<3>, u_pre: Option<Tensor<3>>, a: Tensor<3>) -> Tensor<3> {
        let mixed = match u_pre {
            Some(u_pre) => {
                let bias = linear_bias_columns(&self.proj, (0, self.d_u));
                gated_activation(u_pre, bias, Activation::Silu, Gate::Tensor(a))
            }
            None => a,
        };
        x + linear(&self.out, mixed)
    }

    /// The score spec of the full attention over a window of `window` positions.
    fn quad_spec(&self, window: usize) -> crate::fused::AttentionSpec {
        let factor = match self.scoring {
            GauScoring::Relu2 => self.scaling.factor(window),
            GauScoring::Softmax => 1.0 / (self.d_qk as f64).sqrt(),
        };
        score_spec(self.scoring.score_fn(), factor, self.direction)
    }

    /// Full-sequence forward. x: [B, T, d]; rope: tables for positions 0..T of width s;
    /// keep: [B, T, 1] (0 on padding) → [B, T, d].
    pub fn forward(&self, x: Tensor<3>, rope: &Rope, keep: Option<&Tensor<3>>) -> Tensor<3> {
        let t = x.dims()[1];
        let device = x.device();
        let (u, v, mut heads) = self.project(x.clone(), rope, keep);
        let a = match self.span {
            GauSpan::Quad { window } => {
                // Heads [q_1 .. q_h, k_1 .. k_h], folded into the batch: [h·B, T, ·].
                let h = self.n_heads;
                let k = fold_heads(heads.split_off(h));
                let q = fold_heads(heads);
                let v = fold_columns(v, h);
                let spec = self.quad_spec(window);
                let masked_softmax = self.scoring == GauScoring::Softmax && keep.is_some();
                let rank = self
                    .bias
                    .as_ref()
                    .filter(|_| !masked_softmax && rank_bias_pays(q.dims()[0], t, self.direction))
                    .and_then(|b| b.rope_factors(0..t, t, &device));
                let a = match (rank, keep) {
                    (Some(ab), _) => scored_attention_rank_bias(q, k, v, ab, spec),
                    (None, Some(keep)) if masked_softmax => {
                        // Padded keys leave the softmax's normalisation: [h·B, 1, T].
                        let b = keep.dims()[0];
                        let key_keep = keep
                            .clone()
                            .reshape([b, 1, t])
                            .greater_elem(0.5)
                            .repeat_dim(0, h);
                        let bias = self.bias.as_ref().map(|b| b.square(t, &device));
                        scored_attention_reference(q, k, v, bias, Some(key_keep), spec)
                    }
                    (None, _) => {
                        let bias = self.bias.as_ref().map(|b| b.square(t, &device));
                        scored_attention(q, k, v, bias, spec)
                    }
                };
                unfold_columns(a, h)
            }
            GauSpan::MixedChunk { chunk, parts } => {
                let heads: [Tensor<3>; 4] = heads.try_into().expect("four heads");
                let bias = self.bias.as_ref().map(|b| b.square(chunk, &device));
                // Real tokens per sequence, where the global term is scaled by the length.
                let real_len = keep.map(|k| k.clone().sum_dim(1)); // [B, 1, 1]
                mixed_chunk_attention(heads, v, bias, self.chunk_spec(chunk, parts), real_len)
            }
        };
        self.output(x, u, a)
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
                // Heads folded into the batch as in `forward`; the cache holds [h·B, t, ·].
                let h = self.n_heads;
                let k = append(kc, fold_heads(heads.split_off(h)));
                let q = fold_heads(heads);
                let v = append(vc, fold_columns(v, h));
                let spec = self.quad_spec(window);
                let mut scores = q
                    .matmul(k.swap_dims(1, 2))
                    .mul_scalar(f64::from(spec.scale));
                if let Some(b) = &self.bias {
                    scores = scores + b.block(pos..pos + 1, pos + 1, &device).unsqueeze::<3>();
                }
                let a = match self.scoring {
                    GauScoring::Relu2 => relu2(scores),
                    GauScoring::Softmax => softmax(scores, 2),
                };
                unfold_columns(a.matmul(v), h)
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
        self.output(x, u, a)
    }
}
