//! Attention kernels as plain functions over `[N, T, dh]` tensors (N = batch × heads): full relu²
//! attention (GAU), mixed chunk attention (FLASH), softmax attention, FAVOR+ (Performer) and
//! Combiner's chunk-summary attention. Each has a full-sequence form and a one-token decoding step.
//!
//! Padding is handled by the callers through `keep` multipliers ([N, T, 1], 0 on padded keys).

use burn::prelude::*;
use burn::tensor::activation::softmax;

use crate::fused::{self, AttentionSpec, ScoreFn};
use crate::layers::{
    Direction, GlobalScaling, Relu2Scaling, causal_ones, exclusive_chunk_sum, future_mask,
    pad_time, padded_len, relu2, unpad_time,
};

/// Score given to masked keys before a softmax: exp underflows to exactly 0 in f32, and a row is never
/// all `-inf` (which would give NaN).
pub const MASKED_SCORE: f32 = -1.0e9;

/// Added to FAVOR+'s (unshifted) denominator: a query whose visible keys' features all underflowed
/// would otherwise give 0/0 (performer-pytorch uses the same 1e-6).
pub const FAVOR_EPS: f64 = 1e-6;

/// Smallest value of that ε in shifted units. Trained weights push the stabilising shifts up to
/// |ω|²/2 each (≈ 50 for dh = 64); then `ε·exp(−shift)` underflows, and a causal query whose visible
/// keys are all far below the sequence's largest key divides 0 by 0, or by a denominator whose
/// square (in the division's gradient) underflows: NaN (a Performer run hit it at step 16). The
/// floor only acts on such rows, whose features have underflowed anyway; google-research's FAVOR+
/// adds 1e-6 to every feature instead.
pub const FAVOR_EPS_FLOOR: f64 = 1e-12;

/// `ε·exp(−q_shift − k_shift)`, at least [`FAVOR_EPS_FLOOR`]: [`FAVOR_EPS`] in the shifted units
/// of the numerator and denominator, so that the result does not depend on the stabilising shifts
/// (and a causal query's output does not depend on a shift taken over future keys) while the floor
/// is not reached.
pub fn favor_eps<const D: usize>(q_shift: Tensor<D>, k_shift: Tensor<D>) -> Tensor<D> {
    (q_shift + k_shift)
        .neg()
        .exp()
        .mul_scalar(FAVOR_EPS)
        .clamp_min(FAVOR_EPS_FLOOR)
        .detach()
}

/// `num / (den + favor_eps(q_shift, k_shift))`.
pub fn favor_ratio(
    num: Tensor<3>,
    den: Tensor<3>,
    q_shift: Tensor<3>,
    k_shift: Tensor<3>,
) -> Tensor<3> {
    num / (den + favor_eps(q_shift, k_shift))
}

/// Which parts of mixed chunk attention are kept (FLASH §3.2 and its LocalOnly / GlobalOnly ablations).
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum ChunkParts {
    /// Local quadratic attention within each chunk plus global linear attention across chunks.
    Mixed,
    /// Local quadratic attention only.
    LocalOnly,
    /// Global linear attention only.
    GlobalOnly,
}

impl ChunkParts {
    /// Whether the local (quadratic, within-chunk) part is computed.
    pub fn local(self) -> bool {
        !matches!(self, ChunkParts::GlobalOnly)
    }
    /// Whether the global (linear, across-chunk) part is computed.
    pub fn global(self) -> bool {
        !matches!(self, ChunkParts::LocalOnly)
    }
}

/// Full relu² attention (GAU, FLASH §2): `relu²(Q Kᵀ · f + b) V`, with f = 1/window under
/// [`Relu2Scaling::Window`].
///
/// q, k: [N, T, s]; v: [N, T, e]; bias: [T, T] or none → [N, T, e].
pub fn relu2_attention(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    bias: Option<Tensor<2>>,
    factor: f64,
    direction: Direction,
) -> Tensor<3> {
    scored_attention(q, k, v, bias, score_spec(ScoreFn::Relu2, factor, direction))
}

/// The [`AttentionSpec`] of `score(Q Kᵀ · factor + b)` in `direction`.
pub fn score_spec(score: ScoreFn, factor: f64, direction: Direction) -> AttentionSpec {
    AttentionSpec {
        score,
        scale: factor as f32,
        causal: direction == Direction::Causal,
    }
}

/// `score(Q Kᵀ · scale + b) V` for either score function of [`AttentionSpec`] (GAU's relu² and
/// its softmax ablation, FLASH Table 1): the fused kernel on `flex`, else
/// [`scored_attention_reference`].
///
/// q, k: [N, T, s]; v: [N, T, e]; bias: [T, T] or none → [N, T, e].
pub fn scored_attention(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    bias: Option<Tensor<2>>,
    spec: AttentionSpec,
) -> Tensor<3> {
    fused::attention(&q, &k, &v, bias.as_ref(), spec)
        .unwrap_or_else(|| scored_attention_reference(q, k, v, bias, None, spec))
}

/// Largest [T, T] bias [`rank_bias_pays`] lets a layer build: 64 MiB (T = 4096); the bias and its
/// gradient are both held.
pub const SQUARE_BIAS_MAX_BYTES: usize = 64 << 20;

/// Whether a rank-r bias `A Bᵀ` ([T, r] factors) is cheaper kept in factored form
/// ([`scored_attention_rank_bias`]) than built as the [T, T] matrix and added to the scores, for
/// attention over `batch` sequences of T positions. The factored form widens every sequence's
/// score products (`Q Kᵀ` forward, dQ and dK backward) by r columns: 3 · batch · T² · r
/// multiply-adds, half of them causal; the square form builds the matrix and its gradient once for
/// all sequences (`A Bᵀ`, dA, dB): 3 · T² · r, whole. So the square form wins past two causal
/// sequences (table11's FLASH-Quad: 16 at 512 tokens, 1 at 8192) or one bidirectional one, as long
/// as the matrix fits [`SQUARE_BIAS_MAX_BYTES`].
pub fn rank_bias_pays(batch: usize, t: usize, direction: Direction) -> bool {
    let sequences_per_square = match direction {
        Direction::Causal => 2,
        Direction::Bidirectional => 1,
    };
    batch <= sequences_per_square || t * t * std::mem::size_of::<f32>() > SQUARE_BIAS_MAX_BYTES
}

/// [`relu2_attention`] with a bias given by factors, `b = A Bᵀ` (FLASH-Quad's RoPE-product bias,
/// [`crate::layers::RelPosBias::rope_factors`]), without building the [T, T] bias: the scores are
///
///   Q Kᵀ · f + A Bᵀ = [Q·f | A] · [K | B]ᵀ,
///
/// so the bias widens the query/key dimension by r instead of adding a dense [T, T] matrix and its
/// gradient; a causal kernel then also skips the bias above the diagonal.
///
/// q, k: [N, T, s]; v: [N, T, e]; a, b: [T, r] → [N, T, e].
pub fn relu2_attention_rank_bias(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    ab: (Tensor<2>, Tensor<2>),
    factor: f64,
    direction: Direction,
) -> Tensor<3> {
    scored_attention_rank_bias(q, k, v, ab, score_spec(ScoreFn::Relu2, factor, direction))
}

/// [`scored_attention`] with a bias given by factors `b = A Bᵀ` (see [`relu2_attention_rank_bias`]).
///
/// q, k: [N, T, s]; v: [N, T, e]; a, b: [T, r] → [N, T, e].
pub fn scored_attention_rank_bias(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    (a, b): (Tensor<2>, Tensor<2>),
    spec: AttentionSpec,
) -> Tensor<3> {
    let [n, t, _] = q.dims();
    let r = a.dims()[1];
    let per_batch = |x: Tensor<2>| x.unsqueeze::<3>().expand([n, t, r]);
    let q = Tensor::cat(vec![q.mul_scalar(spec.scale), per_batch(a)], 2); // [N, T, s + r]
    let k = Tensor::cat(vec![k, per_batch(b)], 2);
    scored_attention(q, k, v, None, AttentionSpec { scale: 1.0, ..spec })
}

/// [`relu2_attention`] as plain burn operations (the reference the fused kernel is tested against).
pub fn relu2_attention_reference(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    bias: Option<Tensor<2>>,
    factor: f64,
    direction: Direction,
) -> Tensor<3> {
    let spec = score_spec(ScoreFn::Relu2, factor, direction);
    scored_attention_reference(q, k, v, bias, None, spec)
}

/// [`scored_attention`] as plain burn operations, with an optional key mask (`key_keep`: [N, 1, T],
/// `true` on real keys) for the softmax, whose normalisation padded keys would otherwise share
/// (relu² needs none: a key with zero value adds nothing).
///
/// q, k: [N, T, s]; v: [N, T, e]; bias: [T, T] or none → [N, T, e].
pub fn scored_attention_reference(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    bias: Option<Tensor<2>>,
    key_keep: Option<Tensor<3, Bool>>,
    spec: AttentionSpec,
) -> Tensor<3> {
    let [n, t, _] = q.dims();
    let s = k.dims()[1];
    let mut scores = q
        .matmul(k.swap_dims(1, 2))
        .mul_scalar(f64::from(spec.scale)); // [N, T, S]
    if let Some(bias) = bias {
        scores = scores + bias.unsqueeze::<3>();
    }
    let a = match spec.score {
        ScoreFn::Relu2 => {
            let mut a = relu2(scores);
            if spec.causal {
                a = a * causal_ones(t, &v.device()).unsqueeze::<3>();
            }
            a
        }
        ScoreFn::Softmax => {
            if spec.causal {
                let mask = future_mask(t, &v.device())
                    .unsqueeze::<3>()
                    .expand([n, t, s]);
                scores = scores.mask_fill(mask, MASKED_SCORE);
            }
            if let Some(keep) = key_keep {
                scores = scores.mask_fill(keep.bool_not().expand([n, t, s]), MASKED_SCORE);
            }
            softmax(scores, 2)
        }
    };
    a.matmul(v)
}

/// The shape of one mixed chunk attention (FLASH §3.2): chunk size, the scaling of each part, the
/// direction and which parts are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MixedChunkSpec {
    /// Chunk size C.
    pub chunk: usize,
    /// Scaling of the local relu² scores (by C under [`Relu2Scaling::Window`]).
    pub scaling: Relu2Scaling,
    /// Scaling of the global sum `Σ_h K_lin,hᵀ V_h`.
    pub global_scaling: GlobalScaling,
    /// What a query may see.
    pub direction: Direction,
    /// Which parts are computed (FLASH, LocalOnly, GlobalOnly).
    pub parts: ChunkParts,
}

impl MixedChunkSpec {
    /// The factor of the local scores.
    pub fn local_factor(&self) -> f64 {
        self.scaling.factor(self.chunk)
    }
    /// The factor of the global sum for a sequence of `len` positions.
    pub fn global_factor(&self, len: usize) -> f64 {
        self.global_scaling.factor(self.chunk, len, self.direction)
    }
    /// Whether the global factor is 1 / (the sequence's length): then a padded sequence is scaled
    /// by its own count of real tokens.
    fn length_scaled(&self) -> bool {
        self.global_factor(1) == 1.0 && self.global_factor(2) == 0.5
    }
}

/// Mixed chunk attention (FLASH §3.2) over a sequence of any length: it is padded to a multiple of
/// `chunk` and cut back. The caller zeroes `v` at padded key positions (the internal padding has
/// zero `v` by construction), which removes them from both parts.
///
/// Local: `relu²(Q_quad K_quadᵀ · f + b) V` inside each chunk (causal: lower triangle with diagonal).
/// Global: `Q_lin · Σ_h K_lin,hᵀ V_h · f_g` over all chunks (bidirectional) or strictly earlier
/// chunks (causal, [`exclusive_chunk_sum`]); f = [`MixedChunkSpec::local_factor`], f_g =
/// [`MixedChunkSpec::global_factor`] of the sequence's length: T, or where the caller pads, each
/// sequence's count of real tokens (`real_len`), so that padding does not change real outputs.
///
/// qq, kq, ql, kl: [N, T, s]; v: [N, T, e]; bias: [C, C] or none; real_len: [N, 1, 1] or none
/// → [N, T, e].
pub fn mixed_chunk_attention(
    [qq, kq, ql, kl]: [Tensor<3>; 4],
    v: Tensor<3>,
    bias: Option<Tensor<2>>,
    spec: MixedChunkSpec,
    real_len: Option<Tensor<3>>,
) -> Tensor<3> {
    let [n, t, s] = qq.dims();
    let e = v.dims()[2];
    let chunk = spec.chunk;
    let tp = padded_len(t, chunk);
    let g = tp / chunk;
    let chunked = |x: Tensor<3>, w: usize| pad_time(x, tp).reshape([n, g, chunk, w]);
    let vg = chunked(v, e);
    let mut out: Option<Tensor<4>> = None;
    if spec.parts.local() {
        let (qq, kq) = (chunked(qq, s), chunked(kq, s));
        out = Some(local_chunk_attention(
            qq,
            kq,
            vg.clone(),
            bias,
            spec.local_factor(),
            spec.direction,
        ));
    }
    if spec.parts.global() {
        let (ql, kl) = (chunked(ql, s), chunked(kl, s));
        let lin = match real_len.filter(|_| spec.length_scaled()) {
            // The factor is 1/len: Q_lin·(Σ K_linᵀV / len) = (Q_lin·Σ K_linᵀV) / len, per sequence.
            Some(len) => {
                let unscaled = global_chunk_attention(ql, kl, vg, 1.0, spec.direction);
                unscaled / len.clamp_min(1.0).reshape([n, 1, 1, 1])
            }
            None => global_chunk_attention(ql, kl, vg, spec.global_factor(t), spec.direction),
        };
        out = Some(match out {
            Some(local) => local + lin,
            None => lin,
        });
    }
    let out = out.expect("mixed chunk attention needs at least one part");
    unpad_time(out.reshape([n, tp, e]), t)
}

/// The local part of mixed chunk attention: `relu²(Q Kᵀ · f + b) V` within each chunk (causal:
/// lower triangle with diagonal).
///
/// qq, kq: [N, G, C, s]; vg: [N, G, C, e]; bias: [C, C] or none → [N, G, C, e].
pub fn local_chunk_attention(
    qq: Tensor<4>,
    kq: Tensor<4>,
    vg: Tensor<4>,
    bias: Option<Tensor<2>>,
    factor: f64,
    direction: Direction,
) -> Tensor<4> {
    let [n, g, c, s] = qq.dims();
    let e = vg.dims()[3];
    // Every chunk is an independent sequence of C positions with the same [C, C] bias.
    let flat = |x: Tensor<4>, w: usize| x.reshape([n * g, c, w]);
    relu2_attention(
        flat(qq, s),
        flat(kq, s),
        flat(vg, e),
        bias,
        factor,
        direction,
    )
    .reshape([n, g, c, e])
}

/// The global part of mixed chunk attention: `Q_lin,g · Σ_h K_lin,hᵀ V_h · f` over strictly
/// earlier chunks h < g (causal, [`exclusive_chunk_sum`]) or all chunks (bidirectional).
///
/// ql, kl: [N, G, C, s]; vg: [N, G, C, e] → [N, G, C, e].
pub fn global_chunk_attention(
    ql: Tensor<4>,
    kl: Tensor<4>,
    vg: Tensor<4>,
    factor: f64,
    direction: Direction,
) -> Tensor<4> {
    let [n, g, c, s] = ql.dims();
    let e = vg.dims()[3];
    let flat = |x: &Tensor<4>, w: usize| x.clone().reshape([n, g * c, w]);
    let causal = direction == Direction::Causal;
    match fused::chunk_linear_attention(
        &flat(&ql, s),
        &flat(&kl, s),
        &flat(&vg, e),
        c,
        factor as f32,
        causal,
    ) {
        Some(out) => out.reshape([n, g, c, e]),
        None => global_chunk_attention_reference(ql, kl, vg, factor, direction),
    }
}

/// [`global_chunk_attention`] as plain burn operations (the reference of the fused kernel).
pub fn global_chunk_attention_reference(
    ql: Tensor<4>,
    kl: Tensor<4>,
    vg: Tensor<4>,
    factor: f64,
    direction: Direction,
) -> Tensor<4> {
    let kv = kl.swap_dims(2, 3).matmul(vg).mul_scalar(factor); // [N, G, s, e]
    let kv = match direction {
        Direction::Causal => exclusive_chunk_sum(kv),
        Direction::Bidirectional => kv.sum_dim(1), // [N, 1, s, e], broadcast over chunks
    };
    ql.matmul(kv) // [N, G, C, e]
}

/// Softmax attention `softmax(Q Kᵀ / sqrt(dh) + mask) V`.
///
/// q, k, v: [N, T, dh]; `key_keep`: [N, 1, T] (1 = real key) or none → [N, T, dh].
pub fn softmax_attention(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    key_keep: Option<Tensor<3, Bool>>,
    direction: Direction,
) -> Tensor<3> {
    let dh = q.dims()[2];
    let spec = AttentionSpec {
        score: ScoreFn::Softmax,
        scale: 1.0 / (dh as f32).sqrt(),
        causal: direction == Direction::Causal,
    };
    let fused_out = match key_keep {
        None => fused::attention(&q, &k, &v, None, spec),
        Some(_) => None,
    };
    fused_out.unwrap_or_else(|| softmax_attention_reference(q, k, v, key_keep, direction))
}

/// [`softmax_attention`] as plain burn operations (the reference the fused kernel is tested against).
pub fn softmax_attention_reference(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    key_keep: Option<Tensor<3, Bool>>,
    direction: Direction,
) -> Tensor<3> {
    let dh = q.dims()[2];
    let spec = score_spec(ScoreFn::Softmax, 1.0 / (dh as f64).sqrt(), direction);
    scored_attention_reference(q, k, v, None, key_keep, spec)
}

/// The exponent of the positive random features of FAVOR+ (Choromanski et al. 2021, Lemma 1):
/// `ωᵀx' − ‖x'‖²/2` with `x' = x / dh^¼`, so that `E[exp(a(q))ᵀexp(a(k))]/m = exp(qᵀk / sqrt(dh))`.
///
/// x: [N, T, dh]; omega: [dh, m] → [N, T, m].
pub fn favor_exponent(x: Tensor<3>, omega: &Tensor<2>) -> Tensor<3> {
    let dh = x.dims()[2];
    let x = x.mul_scalar((dh as f64).powf(-0.25));
    let sq = x.clone().square().sum_dim(2).mul_scalar(0.5); // [N, T, 1]
    x.matmul(omega.clone().unsqueeze::<3>()) - sq
}

/// `φ(x) = exp(a − shift) / sqrt(m)` for an exponent `a`: [N, T, m]. The shift is a stabiliser that
/// cancels between numerator and denominator as long as it is shared by all keys (a per-sequence
/// constant) or by all features of one query (a per-row constant); it is never differentiated.
pub fn favor_features(exponent: Tensor<3>, shift: Tensor<3>) -> Tensor<3> {
    let m = exponent.dims()[2];
    (exponent - shift.detach())
        .exp()
        .mul_scalar(1.0 / (m as f64).sqrt())
}

/// Query features, stabilised per row, and that shift: x: [N, T, dh] → ([N, T, m], [N, T, 1]).
pub fn favor_query_features(q: Tensor<3>, omega: &Tensor<2>) -> (Tensor<3>, Tensor<3>) {
    let a = favor_exponent(q, omega);
    let shift = a.clone().max_dim(2).detach();
    (favor_features(a, shift.clone()), shift)
}

/// How causal FAVOR+ sums its keys' features over each query's prefix. Both give the same values
/// (up to rounding; tested); they differ in memory and in the kind of work.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum FavorPrefix {
    /// In blocks of `block` positions: exact within a block (a masked [block, block] product), one
    /// sum per block carried across ([`exclusive_chunk_sum`]): FLASH's chunked form applied to
    /// FAVOR+, N·(T / block)·m·dh floats of state.
    Blockwise {
        /// Positions per block.
        block: usize,
    },
    /// One cumulative sum of φ(k_s) v_sᵀ over every position, as Choromanski et al. (2021) write
    /// causal FAVOR+ and as the FLASH paper times its Performer baseline: N·T·m·dh floats of state.
    TokenLevel,
}

/// FAVOR+ attention (Performer). Bidirectional: `φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1)`. Causal: the same with
/// prefix sums over keys, blockwise or token by token ([`FavorPrefix`]).
///
/// q, k, v: [N, T, dh]; key_keep: [N, T, 1] multiplier or none; omega: [dh, m] → [N, T, dh].
pub fn favor_attention(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    key_keep: Option<Tensor<3>>,
    omega: &Tensor<2>,
    direction: Direction,
    prefix: FavorPrefix,
) -> Tensor<3> {
    let [n, t, dh] = q.dims();
    let m = omega.dims()[1];
    let (fq, q_shift) = favor_query_features(q, omega);
    let ak = favor_exponent(k, omega);
    // One shift per sequence (the largest real key exponent): keys' features do not underflow, and
    // the shift cancels in the ratio.
    let shift = match &key_keep {
        Some(keep) => ak
            .clone()
            .mask_fill(keep.clone().equal_elem(0.0), MASKED_SCORE),
        None => ak.clone(),
    }
    .max_dim(2)
    .max_dim(1)
    .detach(); // [N, 1, 1]
    let mut fk = favor_features(ak, shift.clone());
    if let Some(keep) = key_keep {
        fk = fk * keep;
    }
    match (direction, prefix) {
        (Direction::Bidirectional, _) => {
            let kv = fk.clone().swap_dims(1, 2).matmul(v); // [N, m, dh]
            let z = fk.sum_dim(1).swap_dims(1, 2); // [N, m, 1]
            let num = fq.clone().matmul(kv);
            let den = fq.matmul(z);
            favor_ratio(num, den, q_shift, shift)
        }
        (Direction::Causal, FavorPrefix::TokenLevel) => {
            // S_t = Σ_{s ≤ t} φ(k_s) v_sᵀ and z_t = Σ_{s ≤ t} φ(k_s), every position's own.
            let s = fk
                .clone()
                .reshape([n, t, m, 1])
                .matmul(v.reshape([n, t, 1, dh]))
                .cumsum(1); // [N, T, m, dh]
            let z = fk.cumsum(1); // [N, T, m]
            let num = fq
                .clone()
                .reshape([n, t, 1, m])
                .matmul(s)
                .reshape([n, t, dh]);
            let den = (fq * z).sum_dim(2); // [N, T, 1]
            favor_ratio(num, den, q_shift, shift)
        }
        (Direction::Causal, FavorPrefix::Blockwise { block: chunk }) => {
            let tp = padded_len(t, chunk);
            let g = tp / chunk;
            let fq = pad_time(fq, tp).reshape([n, g, chunk, m]);
            let fk = pad_time(fk, tp).reshape([n, g, chunk, m]);
            let vg = pad_time(v, tp).reshape([n, g, chunk, dh]);
            let causal = causal_ones(chunk, &vg.device()).unsqueeze::<4>();
            let a = fq.clone().matmul(fk.clone().swap_dims(2, 3)) * causal; // [N, G, C, C]
            let local_num = a.clone().matmul(vg.clone());
            let local_den = a.sum_dim(3);
            let kv = exclusive_chunk_sum(fk.clone().swap_dims(2, 3).matmul(vg)); // [N, G, m, dh]
            let z = exclusive_chunk_sum(fk.sum_dim(2)).swap_dims(2, 3); // [N, G, m, 1]
            let num = local_num + fq.clone().matmul(kv);
            let den = local_den + fq.matmul(z);
            let q_shift = pad_time(q_shift, tp).reshape([n, g, chunk, 1]);
            let out = num / (den + favor_eps(q_shift, shift.unsqueeze_dim::<4>(1)));
            unpad_time(out.reshape([n, tp, dh]), t)
        }
    }
}

/// Combiner's attention (Ren et al. 2021, the "fixed" factorisation with mean-pooled summaries):
/// sequence split into chunks of `chunk`; each query attends, in one softmax, to the keys of its own
/// chunk (causal: up to itself) and to one summary key per other chunk (causal: strictly earlier
/// chunks), each summary the mean of its chunk's keys and values.
///
/// q, k, v: [N, T, dh]; key_keep: [N, T, 1] multiplier or none → [N, T, dh].
pub fn combiner_attention(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    key_keep: Option<Tensor<3>>,
    chunk: usize,
    direction: Direction,
) -> Tensor<3> {
    let [n, t, dh] = q.dims();
    let device = q.device();
    let tp = padded_len(t, chunk);
    let g = tp / chunk;
    // 1 on real keys, 0 on padding (both the caller's and the chunk padding).
    let keep = pad_time(
        key_keep.unwrap_or_else(|| Tensor::ones([n, t, 1], &device)),
        tp,
    )
    .reshape([n, g, chunk, 1]);
    let qg = pad_time(q, tp).reshape([n, g, chunk, dh]);
    let kg = pad_time(k, tp).reshape([n, g, chunk, dh]);
    let vg = pad_time(v, tp).reshape([n, g, chunk, dh]);
    let count = keep.clone().sum_dim(2); // [N, G, 1, 1]
    let k_sum = (kg.clone() * keep.clone()).sum_dim(2) / count.clone().clamp_min(1.0); // [N, G, 1, dh]
    let v_sum = (vg.clone() * keep.clone()).sum_dim(2) / count.clone().clamp_min(1.0);
    let k_sum = k_sum.reshape([n, 1, g, dh]);
    let v_sum = v_sum.reshape([n, 1, g, dh]);
    let scale = 1.0 / (dh as f64).sqrt();

    let mut local = qg.clone().matmul(kg.swap_dims(2, 3)).mul_scalar(scale); // [N, G, C, C]
    let key_pad = keep.clone().swap_dims(2, 3).equal_elem(0.0); // [N, G, 1, C]
    local = local.mask_fill(key_pad.expand([n, g, chunk, chunk]), MASKED_SCORE);
    if direction == Direction::Causal {
        let mask = future_mask(chunk, &device)
            .unsqueeze::<4>()
            .expand([n, g, chunk, chunk]);
        local = local.mask_fill(mask, MASKED_SCORE);
    }
    let mut summary = qg.matmul(k_sum.swap_dims(2, 3)).mul_scalar(scale); // [N, G, C, G]
    // Summary h is visible from chunk g when h < g (causal) or h ≠ g (bidirectional), and non-empty.
    let hidden_pairs = match direction {
        Direction::Causal => Tensor::<2, Bool>::tril_mask([g, g], -1, &device),
        Direction::Bidirectional => Tensor::<2, Bool>::diag_mask([g, g], 0, &device).bool_not(),
    };
    let empty = count.reshape([n, 1, 1, g]).equal_elem(0.0); // [N, 1, 1, G]
    let hidden = hidden_pairs
        .reshape([1, g, 1, g])
        .expand([n, g, chunk, g])
        .bool_or(empty.expand([n, g, chunk, g]));
    summary = summary.mask_fill(hidden, MASKED_SCORE);
    let p = softmax(Tensor::cat(vec![local, summary], 3), 3);
    let p_local = p.clone().narrow(3, 0, chunk);
    let p_summary = p.narrow(3, chunk, g);
    let out = p_local.matmul(vg) + p_summary.matmul(v_sum);
    unpad_time(out.reshape([n, tp, dh]), t)
}
