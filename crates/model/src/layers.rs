//! Building blocks shared by every architecture: norms, positions, the relu² kernel, masks and the
//! chunk helpers of mixed chunk attention. Each paper concept is a named function so tests can
//! target it directly.

use burn::module::Param;
use burn::nn::{Initializer, LayerNorm, LayerNormConfig, Linear};
use burn::prelude::*;
use std::sync::Arc;

use crate::fused::{self, Activation, RotaryTables};

/// Standard deviation of the truncated-normal-like initialiser of the FLASH code (`WEIGHT_INITIALIZER`).
pub const INIT_STD: f64 = 0.02;

/// Base of the rotary and sinusoidal frequencies (Vaswani et al. 2017; Su et al. 2021).
pub const ROPE_BASE: f64 = 10_000.0;

/// `(cos, sin)` of the angles `p · ROPE_BASE^(−i/half)` for positions `p` in `offset .. offset +
/// len` and `i` in `0 .. half`, each [len, half] row-major: the tables of [`Rope`] and
/// [`ScaledSinusoidal`], rebuilt every forward. Positions run in parallel (at 8192 positions the
/// two models' tables are 1.5 M sines and cosines, about 0.05 s a step on one thread); each
/// frequency is computed once, the same `powf` for every position as before.
fn sinusoid_tables(offset: usize, len: usize, half: usize) -> (Vec<f32>, Vec<f32>) {
    use rayon::prelude::*;
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| ROPE_BASE.powf(-(i as f64) / half as f64))
        .collect();
    let (mut cos, mut sin) = (vec![0f32; len * half], vec![0f32; len * half]);
    if half > 0 {
        cos.par_chunks_mut(half)
            .zip(sin.par_chunks_mut(half))
            .enumerate()
            .for_each(|(row, (c, s))| {
                let p = (offset + row) as f64;
                for ((c, s), f) in c.iter_mut().zip(s.iter_mut()).zip(&inv_freq) {
                    let (sa, ca) = (p * f).sin_cos();
                    *c = ca as f32;
                    *s = sa as f32;
                }
            });
    }
    (cos, sin)
}

/// Below this window length the relative position bias is a Toeplitz matrix; at or above it, the
/// RoPE product of two learned vectors (FLASH appendix, Code 4).
pub const TOEPLITZ_MAX_WINDOW: usize = 512;

/// Width of the two learned vectors of the RoPE-product bias (FLASH appendix, Code 4).
pub const ROPE_BIAS_DIM: usize = 128;

/// A normal initialiser with the FLASH code's standard deviation.
pub fn normal_init() -> Initializer {
    Initializer::Normal {
        mean: 0.0,
        std: INIT_STD,
    }
}

/// Which normalisation a pre-norm residual branch uses.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// LayerNorm with scale and offset (eps 1e-5).
    LayerNorm,
    /// ScaleNorm (Nguyen & Salazar 2019): `g · x / ‖x‖`, one learned scalar g initialised to sqrt(d).
    ScaleNorm,
}

/// LayerNorm's ε: burn's `LayerNormConfig` default, set explicitly so that the fused kernel
/// ([`fused::layer_norm`]) and burn's module use the same value.
pub const LAYER_NORM_EPS: f64 = 1e-5;

/// LayerNorm or ScaleNorm, chosen by [`NormKind`].
#[derive(Module, Debug)]
pub enum Norm {
    /// See [`NormKind::LayerNorm`].
    Layer(LayerNorm),
    /// See [`NormKind::ScaleNorm`].
    Scale(ScaleNorm),
}

impl Norm {
    /// Builds the norm for width `d_model`.
    pub fn new(kind: NormKind, d_model: usize, device: &Device) -> Self {
        match kind {
            NormKind::LayerNorm => Norm::Layer(
                LayerNormConfig::new(d_model)
                    .with_epsilon(LAYER_NORM_EPS)
                    .init(device),
            ),
            NormKind::ScaleNorm => Norm::Scale(ScaleNorm::new(d_model, device)),
        }
    }

    /// `x`: [.., d] → [.., d].
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Norm::Layer(n) => {
                let (gamma, beta) = (n.gamma.val(), n.beta.as_ref().map(|b| b.val()));
                fused::layer_norm(&x, &gamma, beta.as_ref(), LAYER_NORM_EPS)
                    .unwrap_or_else(|| n.forward(x))
            }
            Norm::Scale(n) => n.forward(x),
        }
    }
}

/// ScaleNorm: `g · x / max(‖x‖, eps)` with one learned scalar (Nguyen & Salazar 2019).
#[derive(Module, Debug)]
pub struct ScaleNorm {
    /// The scalar g, initialised to sqrt(d).
    pub scale: Param<Tensor<1>>,
}

impl ScaleNorm {
    const EPS: f64 = 1e-5;

    /// A ScaleNorm for width `d_model`.
    pub fn new(d_model: usize, device: &Device) -> Self {
        let init = Initializer::Constant {
            value: (d_model as f64).sqrt(),
        };
        Self {
            scale: init.init([1], device),
        }
    }

    /// `x`: [.., d] → [.., d].
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let norm = x
            .clone()
            .square()
            .sum_dim(D - 1)
            .sqrt()
            .clamp_min(Self::EPS);
        let g = self.scale.val().reshape([1; D]);
        x / norm * g
    }
}

/// Cosine and sine tables of rotary position embedding for one span of positions.
///
/// The FLASH code rotates the two *halves* of a vector (`[x1, x2] → [x1 cos − x2 sin, x2 cos + x1 sin]`),
/// not interleaved pairs as burn-nn's `RotaryEncoding` does.
#[derive(Clone, Debug)]
pub struct Rope {
    /// [T, dim/2]
    cos: Tensor<2>,
    /// [T, dim/2]
    sin: Tensor<2>,
    /// The same tables on the host, for the fused kernel.
    host: RotaryTables,
}

impl Rope {
    /// Tables for positions `offset .. offset + len` of vectors of width `dim` (even).
    pub fn new(dim: usize, offset: usize, len: usize, device: &Device) -> Self {
        assert!(dim.is_multiple_of(2), "RoPE needs an even width, got {dim}");
        let half = dim / 2;
        let (cos, sin) = sinusoid_tables(offset, len, half);
        let host = RotaryTables {
            cos: Arc::new(cos.clone()),
            sin: Arc::new(sin.clone()),
            len,
        };
        let cos = Tensor::from_data(TensorData::new(cos, [len, half]), device);
        let sin = Tensor::from_data(TensorData::new(sin, [len, half]), device);
        Self { cos, sin, host }
    }

    /// Number of positions covered.
    pub fn len(&self) -> usize {
        self.cos.dims()[0]
    }

    /// Whether the tables cover no position.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tables on the host, for fused kernels that rotate as they go
    /// ([`fused::split_heads`]).
    pub fn tables(&self) -> &RotaryTables {
        &self.host
    }

    /// Rotates `x`: [.., T, dim] with T equal to the table's length.
    pub fn apply<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        fused::rotary(&x, None, &self.host).unwrap_or_else(|| self.apply_reference(x))
    }

    /// Rotates `γ ⊙ x + β` (GAU's per-head scale and offset, then RoPE); γ, β: [dim].
    pub fn apply_scaled<const D: usize>(
        &self,
        x: Tensor<D>,
        gamma: Tensor<1>,
        beta: Tensor<1>,
    ) -> Tensor<D> {
        fused::rotary(&x, Some((&gamma, &beta)), &self.host).unwrap_or_else(|| {
            let mut shape = [1usize; D];
            shape[D - 1] = gamma.dims()[0];
            self.apply_reference(x * gamma.reshape(shape) + beta.reshape(shape))
        })
    }

    /// [`Rope::apply`] as plain burn operations (the reference of the fused kernel).
    pub fn apply_reference<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dims = x.dims();
        let (t, dim) = (dims[D - 2], dims[D - 1]);
        let half = dim / 2;
        assert_eq!(
            t,
            self.len(),
            "RoPE table covers {} positions, input has {t}",
            self.len()
        );
        assert_eq!(
            half,
            self.cos.dims()[1],
            "RoPE table width differs from input"
        );
        let mut shape = [1usize; D];
        shape[D - 2] = t;
        shape[D - 1] = half;
        let cos = self.cos.clone().reshape(shape);
        let sin = self.sin.clone().reshape(shape);
        let x1 = x.clone().narrow(D - 1, 0, half);
        let x2 = x.narrow(D - 1, half, half);
        let r1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
        let r2 = x2 * cos + x1 * sin;
        Tensor::cat(vec![r1, r2], D - 1)
    }
}

/// The scaled sinusoidal absolute position embedding of the FLASH code (`_get_scaledsin`):
/// `[sin(p·ω), cos(p·ω)] · a` with one learned scalar `a` initialised to 1/sqrt(d).
#[derive(Module, Debug)]
pub struct ScaledSinusoidal {
    /// The learned scalar.
    pub scale: Param<Tensor<1>>,
    /// Model width d.
    pub d_model: usize,
}

impl ScaledSinusoidal {
    /// An embedding for width `d_model` (even).
    pub fn new(d_model: usize, device: &Device) -> Self {
        let init = Initializer::Constant {
            value: 1.0 / (d_model as f64).sqrt(),
        };
        Self {
            scale: init.init([1], device),
            d_model,
        }
    }

    /// Embeddings of positions `offset .. offset + len`: [len, d].
    pub fn forward(&self, offset: usize, len: usize, device: &Device) -> Tensor<2> {
        let half = self.d_model / 2;
        let (cos, sin) = sinusoid_tables(offset, len, half);
        // Each row [sin | cos] (d odd: a last column of zeros).
        let mut data = vec![0f32; len * self.d_model];
        for (row, (c, s)) in data
            .chunks_mut(self.d_model.max(1))
            .zip(cos.chunks(half.max(1)).zip(sin.chunks(half.max(1))))
        {
            row[..half].copy_from_slice(s);
            row[half..2 * half].copy_from_slice(c);
        }
        let table = Tensor::<2>::from_data(TensorData::new(data, [len, self.d_model]), device);
        table * self.scale.val().reshape([1, 1])
    }
}

/// How relu² attention scales its scores; one convention is used by every path (full, chunked,
/// step-by-step) of a model.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Relu2Scaling {
    /// `relu²(QKᵀ/L + b)` with L the attention window: the configured context for FLASH-Quad, the
    /// chunk size C for FLASH's local part. This is the FLASH appendix code (Codes 1 and 8 divide by
    /// the length of the attended axis), the default. L is the configured window rather than the
    /// runtime length so that a prefix's outputs do not depend on how much follows it, which
    /// incremental decoding needs. (The global part's scaling is [`GlobalScaling`].)
    Window,
    /// `relu²(QKᵀ + b)` with no scaling: the pseudocode of the paper's Figure 2.
    None,
}

impl Relu2Scaling {
    /// The factor applied to the scores for a window of `window` positions.
    pub fn factor(self, window: usize) -> f64 {
        match self {
            Relu2Scaling::Window => 1.0 / window as f64,
            Relu2Scaling::None => 1.0,
        }
    }
}

/// How the global (linear, across-chunk) term of mixed chunk attention scales its sum
/// `Σ_h K_lin,hᵀ V_h` (FLASH §3.2). The paper's text gives no scaling; its appendix code and the
/// public ports of it do. One convention is used by every path (fused, reference, decoding).
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum GlobalScaling {
    /// The appendix code as its public ports run it (lucidrains/FLASH-pytorch, `flash_pytorch.py`:
    /// `lin_kv = einsum(..) / n` when bidirectional, `/ g` when causal): bidirectional divides by the
    /// sequence length n (the input's, before padding to a multiple of C), causal by the chunk size C
    /// (so that a causal prefix's outputs do not depend on how much follows it). The default.
    Appendix,
    /// Divides by C in both directions, which makes the bidirectional global term n / C times the
    /// appendix's (32× at n = 8192, C = 256).
    Chunk,
    /// No scaling (goes with [`Relu2Scaling::None`], the paper's Figure 2 pseudocode).
    None,
}

impl GlobalScaling {
    /// The factor applied to `Σ_h K_lin,hᵀ V_h` for chunks of `chunk` positions in a sequence of
    /// `len` positions attended in `direction`.
    pub fn factor(self, chunk: usize, len: usize, direction: Direction) -> f64 {
        match (self, direction) {
            (GlobalScaling::Appendix, Direction::Bidirectional) => 1.0 / len as f64,
            (GlobalScaling::Appendix, Direction::Causal) | (GlobalScaling::Chunk, _) => {
                1.0 / chunk as f64
            }
            (GlobalScaling::None, _) => 1.0,
        }
    }
}

/// `relu(x)²`, the GAU attention kernel (FLASH §2).
pub fn relu2<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    burn::tensor::activation::relu(x).square()
}

/// The relative position bias of the FLASH appendix (Code 4), for one fixed window length n:
/// a Toeplitz matrix of 2n − 1 learned weights when n < 512, else `rope(a) · rope(b)ᵀ` of two learned
/// 128-vectors. Any square sub-block starting at the origin is the bias of a shorter sequence.
#[derive(Module, Debug)]
pub enum RelPosBias {
    /// `b[i, j] = w[j − i + n − 1]`, w: [2n − 1].
    Toeplitz(Param<Tensor<1>>),
    /// `b[i, j] = rope(a)_i · rope(b)_j`, a and b: [128] each, stacked as [2, 128].
    RopeProduct(Param<Tensor<2>>),
}

impl RelPosBias {
    /// The bias for attention windows of `window` positions.
    pub fn new(window: usize, device: &Device) -> Self {
        if window < TOEPLITZ_MAX_WINDOW {
            RelPosBias::Toeplitz(normal_init().init([2 * window - 1], device))
        } else {
            RelPosBias::RopeProduct(normal_init().init([2, ROPE_BIAS_DIM], device))
        }
    }

    /// The window length n this bias was built for, if it is fixed (Toeplitz).
    fn toeplitz_window(&self) -> Option<usize> {
        match self {
            RelPosBias::Toeplitz(w) => Some(w.dims()[0].div_ceil(2)),
            RelPosBias::RopeProduct(_) => None,
        }
    }

    /// Bias rows `rows` (query positions) against columns `0 .. cols` (key positions): [rows.len(), cols].
    pub fn block(&self, rows: std::ops::Range<usize>, cols: usize, device: &Device) -> Tensor<2> {
        let n_rows = rows.len();
        match self {
            RelPosBias::Toeplitz(w) => {
                let n = self.toeplitz_window().expect("toeplitz");
                assert!(
                    rows.end <= n && cols <= n,
                    "relative position bias built for {n} positions, asked for {}x{cols}",
                    rows.end
                );
                let idx: Vec<i64> = rows
                    .clone()
                    .flat_map(|i| (0..cols).map(move |j| (j + n - 1 - i) as i64))
                    .collect();
                let idx =
                    Tensor::<1, Int>::from_data(TensorData::new(idx, [n_rows * cols]), device);
                w.val().select(0, idx).reshape([n_rows, cols])
            }
            RelPosBias::RopeProduct(_) => {
                let (a, b) = self.rope_factors(rows, cols, device).expect("rope product");
                fused::matmul_2d(a, b.transpose())
            }
        }
    }

    /// The two factors of a [`RelPosBias::RopeProduct`] bias, `rope(a)` for rows `rows` ([rows.len(),
    /// 128]) and `rope(b)` for columns `0 .. cols` ([cols, 128]), whose product is [`Self::block`];
    /// `None` for a Toeplitz bias. Attention can take the bias in this rank-128 form and never build
    /// the [T, T] matrix ([`crate::attention::relu2_attention_rank_bias`]).
    pub fn rope_factors(
        &self,
        rows: std::ops::Range<usize>,
        cols: usize,
        device: &Device,
    ) -> Option<(Tensor<2>, Tensor<2>)> {
        let RelPosBias::RopeProduct(ab) = self else {
            return None;
        };
        let n_rows = rows.len();
        let ab = ab.val();
        let a = ab.clone().narrow(0, 0, 1); // [1, 128]
        let b = ab.narrow(0, 1, 1);
        let a = Rope::new(ROPE_BIAS_DIM, rows.start, n_rows, device)
            .apply(a.expand([n_rows, ROPE_BIAS_DIM]));
        let b = Rope::new(ROPE_BIAS_DIM, 0, cols, device).apply(b.expand([cols, ROPE_BIAS_DIM]));
        Some((a, b))
    }

    /// The square bias of a sequence of `len` positions: [len, len].
    pub fn square(&self, len: usize, device: &Device) -> Tensor<2> {
        self.block(0..len, len, device)
    }
}

/// Output columns `start .. start + len` of `linear` applied to `x`: [B, T, d_in] → [B, T, len],
/// multiplying by that slice of the weight only.
///
/// Splitting a fused projection this way instead of narrowing its output keeps the backward pass
/// small: the gradient of a narrowed [B, T, d_out] activation is a zero-filled tensor of the full
/// width per slice, while the gradient of a narrowed weight is only [d_in, d_out].
pub fn linear_columns(linear: &Linear, x: Tensor<3>, start: usize, len: usize) -> Tensor<3> {
    let [b, t, d] = x.dims();
    let w = linear.weight.val().narrow(1, start, len); // [d_in, len]
    let x = x.reshape([b * t, d]);
    let y = match &linear.bias {
        Some(bias) => fused::affine_2d(x, w, bias.val().narrow(0, start, len)),
        None => fused::matmul_2d(x, w),
    };
    y.reshape([b, t, len])
}

/// `linear` applied to `x` ([B, T, d_in] → [B, T, d_out]) through [`fused::matmul_2d`].
pub fn linear(linear: &Linear, x: Tensor<3>) -> Tensor<3> {
    let d_out = linear.weight.dims()[1];
    linear_columns(linear, x, 0, d_out)
}

/// `x W[:, cols]` without the bias: [B, T, d_in] → [B, T, len], for the kernels that add the bias
/// in their own pass ([`fused::bias_activation`], [`fused::gated_activation`]); the bias slice
/// `b[cols]` is [`linear_bias_columns`].
pub fn linear_columns_unbiased(
    linear: &Linear,
    x: Tensor<3>,
    (start, len): (usize, usize),
) -> Tensor<3> {
    let [b, t, d] = x.dims();
    let w = linear.weight.val().narrow(1, start, len); // [d_in, len]
    fused::matmul_2d(x.reshape([b * t, d]), w).reshape([b, t, len])
}

/// The bias entries `b[start .. start + len]` of `linear`, if it has a bias.
pub fn linear_bias_columns(linear: &Linear, (start, len): (usize, usize)) -> Option<Tensor<1>> {
    linear.bias.as_ref().map(|b| b.val().narrow(0, start, len))
}

/// `act(x W[:, cols] + b[cols])`: [`linear_columns`] followed by an activation, the bias folded
/// into the activation's single pass ([`fused::bias_activation`]).
pub fn linear_columns_activated(
    linear: &Linear,
    x: Tensor<3>,
    (start, len): (usize, usize),
    act: Activation,
) -> Tensor<3> {
    let y = linear_columns_unbiased(linear, x, (start, len));
    fused::bias_activation(y, linear_bias_columns(linear, (start, len)), act)
}

/// Per-dimension scale and offset producing `heads` cheap heads from one shared representation Z
/// (FLASH §2: `Q = γ_q ⊙ Z + β_q`, `K = γ_k ⊙ Z + β_k`).
#[derive(Module, Debug)]
pub struct ScaleOffset {
    /// γ: [heads, s], initialised N(0, 0.02) as the FLASH code.
    pub gamma: Param<Tensor<2>>,
    /// β: [heads, s], initialised to zero.
    pub beta: Param<Tensor<2>>,
}

impl ScaleOffset {
    /// `heads` scale/offset pairs of width `dim`.
    pub fn new(heads: usize, dim: usize, device: &Device) -> Self {
        Self {
            gamma: normal_init().init([heads, dim], device),
            beta: Initializer::Zeros.init([heads, dim], device),
        }
    }

    /// `z`: [B, T, s] → one [B, T, s] tensor per head.
    pub fn forward(&self, z: Tensor<3>) -> Vec<Tensor<3>> {
        let [heads, s] = self.gamma.dims();
        let gamma = self.gamma.val();
        let beta = self.beta.val();
        (0..heads)
            .map(|h| {
                let g = gamma.clone().narrow(0, h, 1).reshape([1, 1, s]);
                let b = beta.clone().narrow(0, h, 1).reshape([1, 1, s]);
                z.clone() * g + b
            })
            .collect()
    }
}

impl ScaleOffset {
    /// `rope(γ_h ⊙ z + β_h)` for every head h: `z`: [B, T, s] → one [B, T, s] tensor per head.
    pub fn forward_rotated(&self, z: Tensor<3>, rope: &Rope) -> Vec<Tensor<3>> {
        let [heads, s] = self.gamma.dims();
        let row = |p: &Param<Tensor<2>>, h| p.val().narrow(0, h, 1).reshape([s]);
        (0..heads)
            .map(|h| rope.apply_scaled(z.clone(), row(&self.gamma, h), row(&self.beta, h)))
            .collect()
    }
}

/// Attention direction: what a query may see.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Keys at or before the query (language modelling).
    Causal,
    /// All keys (masked language modelling).
    Bidirectional,
}

/// A [T, T] mask, `true` strictly above the diagonal (the future a causal query must not see).
pub fn future_mask(len: usize, device: &Device) -> Tensor<2, Bool> {
    // burn's `tril_mask` marks what lies *outside* the lower triangle (diagonal included).
    Tensor::<2, Bool>::tril_mask([len, len], 0, device)
}

/// A [T, T] matrix of ones on and below the diagonal, zeros above: multiplies a non-negative
/// kernel (relu²) to make it causal without a `-inf` fill.
pub fn causal_ones(len: usize, device: &Device) -> Tensor<2> {
    Tensor::<2>::ones([len, len], device).tril(0)
}

/// For chunk summaries `x`: [B, G, ..] returns `y[:, g] = Σ_{h < g} x[:, h]` — the strictly earlier
/// chunks only (FLASH §3.2, causal global attention). The first chunk sees zeros. Inclusive sums here
/// would leak the current chunk's future tokens (pitfall 1 of the notes).
pub fn exclusive_chunk_sum<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let dims = x.dims();
    let g = dims[1];
    let inclusive = x.cumsum(1);
    let mut zero_shape = dims;
    zero_shape[1] = 1;
    let zeros = Tensor::<D>::zeros(zero_shape, &inclusive.device());
    if g == 1 {
        return zeros;
    }
    Tensor::cat(vec![zeros, inclusive.narrow(1, 0, g - 1)], 1)
}

/// Appends `x`: [B, n, ..] to a decoding cache along time and returns the whole cache.
pub fn append(cache: &mut Option<Tensor<3>>, x: Tensor<3>) -> Tensor<3> {
    let all = match cache.take() {
        Some(prev) => Tensor::cat(vec![prev, x], 1),
        None => x,
    };
    *cache = Some(all.clone());
    all
}

/// Adds `x` to a decoding state's running sum (starting from `x`) and returns the new sum.
pub fn add_to(acc: &mut Option<Tensor<3>>, x: Tensor<3>) -> Tensor<3> {
    let sum = match acc.take() {
        Some(prev) => prev + x,
        None => x,
    };
    *acc = Some(sum.clone());
    sum
}

/// Pads `x`: [B, T, ..] with zeros along dim 1 to `len` positions.
pub fn pad_time<const D: usize>(x: Tensor<D>, len: usize) -> Tensor<D> {
    let dims = x.dims();
    let t = dims[1];
    if t == len {
        return x;
    }
    let mut pad_shape = dims;
    pad_shape[1] = len - t;
    let zeros = Tensor::<D>::zeros(pad_shape, &x.device());
    Tensor::cat(vec![x, zeros], 1)
}

/// The first `len` positions of `x` (dim 1): [`pad_time`]'s inverse. Returns `x` itself when
/// nothing was padded: a full-length `narrow` still records a slice whose backward writes the
/// whole gradient into a fresh zero tensor on the calling thread (FLASH at 1024 tokens, 8192 × 512
/// floats per layer).
pub fn unpad_time<const D: usize>(x: Tensor<D>, len: usize) -> Tensor<D> {
    if x.dims()[1] == len {
        x
    } else {
        x.narrow(1, 0, len)
    }
}

/// Smallest multiple of `chunk` that holds `len` positions.
pub fn padded_len(len: usize, chunk: usize) -> usize {
    len.div_ceil(chunk) * chunk
}

/// A [B, T, 1] multiplier, 1 on real tokens and 0 on padding, from a padding mask (`true` = pad).
pub fn keep_multiplier(padding: &Tensor<2, Bool>) -> Tensor<3> {
    let [b, t] = padding.dims();
    padding.clone().bool_not().float().reshape([b, t, 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinusoid_tables_are_the_definition_bit_for_bit() {
        // Against `sin` and `cos` of `p · base^(−i/half)` one at a time, at positions up to
        // table11's longest context, from an offset (incremental decoding).
        for (offset, len, half) in [
            (0, 8192, 64),
            (5, 33, 5),
            (100, 1, 128),
            (0, 0, 4),
            (3, 4, 0),
        ] {
            let (cos, sin) = sinusoid_tables(offset, len, half);
            assert_eq!((cos.len(), sin.len()), (len * half, len * half));
            for row in 0..len {
                for i in 0..half {
                    let angle = (offset + row) as f64 * ROPE_BASE.powf(-(i as f64) / half as f64);
                    let at = row * half + i;
                    assert_eq!(
                        cos[at].to_bits(),
                        (angle.cos() as f32).to_bits(),
                        "cos {row} {i}"
                    );
                    assert_eq!(
                        sin[at].to_bits(),
                        (angle.sin() as f32).to_bits(),
                        "sin {row} {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn exclusive_chunk_sum_excludes_current_chunk() {
        let dev = Device::flex();
        let x = Tensor::<3>::from_floats([[[1.0], [2.0], [4.0]]], &dev); // [1, 3, 1]
        let y: Vec<f32> = exclusive_chunk_sum(x)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(y, vec![0.0, 1.0, 3.0]);
    }

    #[test]
    fn toeplitz_bias_depends_only_on_offset() {
        let dev = Device::flex();
        let bias = RelPosBias::new(8, &dev);
        let m: Vec<f32> = bias
            .square(5, &dev)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for i in 1..5 {
            for j in 1..5 {
                assert_eq!(m[i * 5 + j], m[(i - 1) * 5 + (j - 1)]);
            }
        }
        assert_ne!(m[1], m[5], "b[0,1] and b[1,0] use different weights");
    }
}
