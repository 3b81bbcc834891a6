//! Fused attention: `score(Q Kᵀ · scale + bias) V` in blocks of query rows, forward and backward.

#[allow(unused_imports)]
use super::*;

use super::dropout::DropoutMask;

/// The function applied to the scores of [`attention`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreFn {
    /// Row-wise softmax (Transformers).
    Softmax,
    /// Elementwise `relu(x)²` (GAU, FLASH §2).
    Relu2,
}

/// What [`attention`] computes: `score(Q Kᵀ · scale + bias) V`, keys after the query masked out
/// when `causal`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    /// The score function.
    pub score: ScoreFn,
    /// Multiplies `Q Kᵀ` before the bias.
    pub scale: f32,
    /// Whether query i sees only keys j ≤ i.
    pub causal: bool,
}

/// Default of [`kept_scores_limit`]: 1 GiB per attention call, so that FLASH-Quad and the softmax
/// Transformers keep their block scores at the cpu scales (fig5's masked 4096 tokens: 64 MiB per
/// FLASH-Quad layer; table11's causal 8192: 136 MiB per FLASH-Quad layer, 8 layers, and 545 MiB
/// per Transformer++ layer of 4 heads, 4 layers: 2.2 GiB held until the backward) and fall back
/// to recomputing them beyond.
pub const DEFAULT_KEPT_SCORES_LIMIT: usize = 1 << 30;

thread_local! {
    static KEPT_SCORES_LIMIT: std::cell::Cell<usize> =
        const { std::cell::Cell::new(DEFAULT_KEPT_SCORES_LIMIT) };
}

/// The most bytes of relu² scores an attention forward on this thread keeps for its backward
/// ([`DEFAULT_KEPT_SCORES_LIMIT`] unless inside [`with_kept_scores_limit`]).
pub fn kept_scores_limit() -> usize {
    KEPT_SCORES_LIMIT.get()
}

/// Runs `f` with [`kept_scores_limit`] set to `bytes` on this thread (0: always recompute), for the
/// tests that compare the two backward paths and for memory-tight runs.
pub fn with_kept_scores_limit<R>(bytes: usize, f: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            KEPT_SCORES_LIMIT.set(self.0);
        }
    }
    let _restore = Restore(KEPT_SCORES_LIMIT.replace(bytes));
    f()
}

/// What an attention forward keeps for its backward besides its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Keep {
    /// Nothing: the backward recomputes each block's scores.
    Nothing,
    /// Each block's biased, masked scores before the score function (relu²).
    Scores,
    /// Each block's probabilities, the score function applied (softmax).
    Probabilities,
}

/// Query rows per block of causal attention over short keys and values ([`row_block`]).
pub const SHORT_ROW_BLOCK: usize = 32;

/// Floats of one batch element's K or V (keys × the wider of dk, dv) up to which causal attention
/// runs in blocks of [`SHORT_ROW_BLOCK`] rows (see [`row_block`]): FLASH's chunks
/// (256 × 512), Transformer++'s heads up to 8192 tokens (8192 × 64), FLASH-Quad up to 2048.
pub const SHORT_ROW_BLOCK_MAX_FLOATS: usize = 1 << 20;

/// Query rows per block of [`attention`] over `keys` keys whose K and V are at most `widest` wide:
/// [`SHORT_ROW_BLOCK`] for causal attention over short keys and values (at most
/// [`SHORT_ROW_BLOCK_MAX_FLOATS`] floats of K or V per batch element), else [`ROW_BLOCK`].
///
/// Why: a causal block computes its rows against every key up to its last row, and the
/// entries above the diagonal are masked, so blocks of r rows waste about r/T of the products;
/// over FLASH's 256-token chunks, 128-row blocks compute 49 152 score entries per chunk for
/// the 32 896 it needs, 32-row blocks 36 864. Smaller blocks also make smaller products, whose
/// packing of keys and values is shared by fewer rows: they pay while the keys and values are
/// small. Measured (`profile_step`, a 2-core Zen 4 EPYC, attention kernels' seconds
/// per step): 32-row blocks against 128, FLASH 512 0.41–0.44 against 0.47 (two runs each),
/// Transformer++ 1024 / 2048 / 4096 / 8192 0.33 / 0.61 / 1.21 / 2.47 against 0.35 / 0.66 / 1.26
/// / 2.51, FLASH-Quad (V 512 wide) 1024 0.83 against 0.89 but 4096 4.03 against 3.62 and 8192
/// 11.1 against 7.8 (one run each).
pub fn row_block(causal: bool, keys: usize, widest: usize) -> usize {
    if causal && keys * widest <= SHORT_ROW_BLOCK_MAX_FLOATS {
        SHORT_ROW_BLOCK
    } else {
        ROW_BLOCK
    }
}

/// The block scores a forward kept: per batch element, the blocks of [`row_block`] query rows in
/// order, each [rows, visible keys] row-major (`AttnInputs::block_scores_len` floats in all),
/// before or after the score function as `kind` says.
struct KeptScores {
    data: Vec<f32>,
    per_batch: usize,
    kind: Keep,
}

/// Additive terms of [`attention_grouped`]'s scores besides `Q Kᵀ · scale`.
#[derive(Clone, Copy, Default)]
pub struct ScoreBias<'a> {
    /// Hb tables, trained (they get a gradient): query element n adds table `n % Hb` (T5's
    /// relative position bias per head, with n = b·H + h; Hb = 1: one table for all).
    pub table: Option<BiasTable<'a>>,
    /// [Bm, S], constant (no gradient): query element n adds row `n / (N / Bm)` to every one of its
    /// score rows (T5's −10⁹ on padded keys, one row per sequence).
    pub key_mask: Option<&'a Tensor<2>>,
}

/// The tables of [`ScoreBias::table`], by layout.
#[derive(Clone, Copy)]
pub enum BiasTable<'a> {
    /// [Hb, T, S]: query row i, key j adds entry (i, j).
    Dense(&'a Tensor<3>),
    /// [Hb, T + S − 1]: query row i, key j adds entry T − 1 − i + j, a bias of the offset j − i
    /// alone (T5's relative position bias). Row i's terms are the S entries from T − 1 − i on, one
    /// contiguous run, so the [Hb, T, S] expansion (1 GiB for T5-XXL's 64 heads over 2048
    /// positions) is never made nor read; its gradient sums each offset's diagonal.
    Offsets(&'a Tensor<2>),
}

/// Where the bias terms of a query row start in its table ([`BiasTable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BiasLayout {
    Dense,
    Offsets,
}

impl BiasLayout {
    /// Floats per table for T queries against S keys.
    fn len(self, t: usize, s: usize) -> usize {
        match self {
            BiasLayout::Dense => t * s,
            BiasLayout::Offsets => t + s - 1,
        }
    }

    /// Where query row i's S terms start in its table.
    fn row(self, i: usize, t: usize, s: usize) -> usize {
        match self {
            BiasLayout::Dense => i * s,
            BiasLayout::Offsets => t - 1 - i,
        }
    }

    /// One table's shape in the kernel's 3-D tensor of tables.
    fn shape(self, t: usize, s: usize) -> Vec<usize> {
        match self {
            BiasLayout::Dense => vec![t, s],
            BiasLayout::Offsets => vec![1, t + s - 1],
        }
    }
}

impl BiasTable<'_> {
    /// The tables as the kernel's [Hb, ·, ·] tensor ([`BiasLayout::shape`]), and their layout.
    fn as_3d(self) -> (Tensor<3>, BiasLayout) {
        match self {
            BiasTable::Dense(t) => (t.clone(), BiasLayout::Dense),
            BiasTable::Offsets(t) => (t.clone().unsqueeze_dim(1), BiasLayout::Offsets),
        }
    }
}

/// Inputs of one attention call as contiguous flex tensors.
#[derive(Clone)]
struct AttnInputs {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    /// Hb tables ([`BiasLayout::shape`] each).
    bias: Option<FlexTensor>,
    /// Hb
    bias_heads: usize,
    bias_layout: BiasLayout,
    /// [Bm, S] row-major, with query elements per row (N / Bm).
    key_mask: Option<(Arc<Vec<f32>>, usize)>,
    spec: AttentionSpec,
    /// (N, T, S, dk, dv): N query elements, N / r key/value elements.
    n: usize,
    t: usize,
    s: usize,
    dk: usize,
    dv: usize,
    /// Query elements per key/value element: query element n reads K/V element n / r.
    r: usize,
    /// Keys allocated per key/value element (k: [N / r, s_alloc, dk]); the first S are read (a
    /// decoding cache preallocated past the positions decoded so far).
    s_alloc: usize,
    /// Whether the scores read Kᵀ transposed once per key/value element (many query rows) or K
    /// in place (few: see [`KEYS_IN_PLACE_MAX_ROWS`]).
    transpose_keys: bool,
    /// The instruction set of the row loops (read on the calling thread at construction).
    level: simd::SimdLevel,
    /// Dropout on the weights (training only).
    dropout: Option<DropoutMask>,
}

/// Most query rows per key/value element (r · T) for which the scores read K in place
/// (k-contiguous) instead of transposing it first ([`transpose_into`]): the transposition reads
/// and writes all of K once per call, which pays when many rows share it but doubles the bytes of
/// a decoding step (one row per query head, K the cache), a step bound by those bytes.
pub const KEYS_IN_PLACE_MAX_ROWS: usize = 64;

impl AttnInputs {
    /// Attention over the first `used` keys of k and v (all of them: `None`).
    fn new(
        (q, k, v): (&FlexTensor, &FlexTensor, &FlexTensor),
        used: Option<usize>,
        bias: Option<(&FlexTensor, BiasLayout)>,
        key_mask: Option<(Vec<f32>, usize)>,
        spec: AttentionSpec,
    ) -> Self {
        let (qd, kd, vd) = (dims(q), dims(k), dims(v));
        let [n, t, dk] = [qd[0], qd[1], qd[2]];
        let (n_kv, s_alloc, dv) = (kd[0], kd[1], vd[2]);
        let s = used.unwrap_or(s_alloc);
        assert!(s <= s_alloc, "attention: {s} keys used of {s_alloc}");
        assert!(
            n_kv > 0 && n.is_multiple_of(n_kv),
            "attention: {n_kv} key/value elements for {n} queries"
        );
        assert_eq!(
            (kd[2], vd[0], vd[1]),
            (dk, n_kv, s_alloc),
            "attention shapes"
        );
        if spec.causal {
            assert_eq!(t, s, "causal attention needs as many queries as keys");
        }
        let bias_layout = bias.map_or(BiasLayout::Dense, |(_, layout)| layout);
        let bias_heads = bias.map_or(1, |(b, layout)| {
            let bd = dims(b);
            assert_eq!(bd[1..], layout.shape(t, s), "attention bias shape");
            assert!(n.is_multiple_of(bd[0]), "attention: {} bias tables", bd[0]);
            bd[0]
        });
        let key_mask = key_mask.map(|(mask, rows)| {
            assert!(
                rows > 0 && mask.len() == rows * s && n.is_multiple_of(rows),
                "attention key mask shape"
            );
            (Arc::new(mask), n / rows)
        });
        Self {
            q: contiguous(q),
            k: contiguous(k),
            v: contiguous(v),
            bias: bias.map(|(b, _)| contiguous(b)),
            bias_heads,
            bias_layout,
            key_mask,
            spec,
            n,
            t,
            s,
            dk,
            dv,
            r: n / n_kv,
            s_alloc,
            transpose_keys: (n / n_kv) * t > KEYS_IN_PLACE_MAX_ROWS,
            level: simd::current(),
            dropout: None,
        }
    }

    /// Whether a block of `rows` query rows, run single-threaded, takes the direct loops
    /// ([`direct_scores`], [`direct_values`]) instead of two gemm calls: a decoding step's blocks
    /// (one row per query element), for which a call's set-up costs more than its product.
    fn direct(&self, rows: usize, par: Threads) -> bool {
        !self.transpose_keys && rows <= DIRECT_MAX_ROWS && par == Threads::PerBatch
    }

    /// Offset of key/value element `kv`'s keys in k.
    fn key_offset(&self, kv: usize) -> usize {
        kv * self.s_alloc * self.dk
    }

    /// Offset of key/value element `kv`'s values in v.
    fn value_offset(&self, kv: usize) -> usize {
        kv * self.s_alloc * self.dv
    }

    /// Key/value elements.
    fn n_kv(&self) -> usize {
        self.n / self.r
    }

    /// The query blocks `(i0, i1)` in order: rows `i0..i1`, [`row_block`] rows each (the last
    /// one possibly fewer).
    fn row_blocks(&self) -> impl Iterator<Item = (usize, usize)> {
        let (t, rows) = (
            self.t,
            row_block(self.spec.causal, self.s, self.dk.max(self.dv)),
        );
        (0..t).step_by(rows).map(move |i0| (i0, (i0 + rows).min(t)))
    }

    /// Keys visible to the query block ending (exclusively) at row `i1`.
    fn key_limit(&self, i1: usize) -> usize {
        if self.spec.causal { i1 } else { self.s }
    }

    /// Floats of one batch element's block scores: Σ over query blocks of rows × visible keys.
    fn block_scores_len(&self) -> usize {
        self.row_blocks()
            .map(|(i0, i1)| (i1 - i0) * self.key_limit(i1))
            .sum()
    }

    /// What a forward recorded for autodiff keeps for the backward, up to [`kept_scores_limit`]
    /// bytes; either way the backward skips one of its five products, `Q Kᵀ`. relu² keeps the
    /// scores before the score function (the same bits as recomputing them). Softmax keeps the
    /// probabilities the forward multiplied V by, and its backward needs no exponentials either;
    /// a recomputing backward rebuilds them from the log-sum-exp, which differs from the
    /// forward's normalised row in the last bits, so the two backward paths agree to rounding,
    /// not bit for bit.
    fn keep_for_backward(&self) -> Keep {
        let bytes = self.n * self.block_scores_len() * std::mem::size_of::<f32>();
        if bytes > kept_scores_limit() {
            return Keep::Nothing;
        }
        match self.spec.score {
            ScoreFn::Relu2 => Keep::Scores,
            ScoreFn::Softmax => Keep::Probabilities,
        }
    }

    /// Whether batch elements run in parallel (each with a single-threaded gemm) or one after
    /// another (with a multi-threaded gemm and parallel rows).
    fn parallel_batches(&self) -> bool {
        self.n_kv() >= rayon::current_num_threads()
    }

    /// Kᵀ [dk, S] of key/value element `b` into `kt`: the scores' right operand, n-contiguous
    /// (see [`transpose_into`]); nothing when the scores read K in place.
    fn transposed_keys(&self, b: usize, kt: &mut Vec<f32>, par: Threads) {
        if self.transpose_keys {
            let (s, dk) = (self.s, self.dk);
            transpose_into(&slice(&self.k)[self.key_offset(b)..], (s, dk), kt, par);
        }
    }

    /// Vᵀ [dv, S] of key/value element `b` into `vt`: the right operand of the backward's `dO Vᵀ`.
    fn transposed_values(&self, b: usize, vt: &mut Vec<f32>, par: Threads) {
        let (s, dv) = (self.s, self.dv);
        transpose_into(&slice(&self.v)[self.value_offset(b)..], (s, dv), vt, par);
    }

    /// Scores of query rows `i0..i1` of query element `b` against keys `0..kmax`, scaled and
    /// biased, into `buf` ([i1 − i0, kmax] row-major); masked entries are `−inf`. `kt`: the Kᵀ of
    /// its key/value element ([`AttnInputs::transposed_keys`]) when the keys are transposed.
    fn scores(&self, b: usize, i0: usize, i1: usize, kt: &[f32], buf: &mut [f32], par: Threads) {
        let kmax = self.key_limit(i1);
        let q = slice(&self.q);
        let (dk, rows) = (self.dk, i1 - i0);
        if self.direct(rows, par) {
            let keys = &slice(&self.k)[self.key_offset(b / self.r)..][..kmax * dk];
            let values = &slice(&self.v)[self.value_offset(b / self.r)..][..kmax * self.dv];
            let q = &q[(b * self.t + i0) * dk..][..rows * dk];
            direct_scores(self.level, q, (keys, values), dk, self.spec.scale, buf);
        } else {
            let keys = if self.transpose_keys {
                assert_eq!(kt.len(), dk * self.s, "attention: Kᵀ size");
                (kt.as_ptr(), self.s, 1)
            } else {
                (
                    slice(&self.k)[self.key_offset(b / self.r)..].as_ptr(),
                    1,
                    dk,
                )
            };
            let qp = q[(b * self.t + i0) * dk..].as_ptr();
            // SAFETY: rows × dk of q from row i0 are inside b's slice; Kᵀ's dk rows have
            // S ≥ kmax columns, or the K/V element's S ≥ kmax keys of dk are inside k; buf holds
            // rows × kmax.
            unsafe {
                matmul(
                    (rows, kmax, dk),
                    buf.as_mut_ptr(),
                    kmax,
                    false,
                    (qp, dk, 1),
                    keys,
                    self.spec.scale,
                    par.gemm(),
                );
            }
        }
        let (t, s, level, layout) = (self.t, self.s, self.level, self.bias_layout);
        let bias = self.bias.as_ref().map(|bias| {
            let len = layout.len(t, s);
            let at = (b % self.bias_heads) * len;
            &slice(bias)[at..at + len]
        });
        let mask = self
            .key_mask
            .as_ref()
            .map(|(mask, per)| &mask[(b / per) * s..(b / per) * s + kmax]);
        let causal = self.spec.causal;
        let fix_row = |(r, row): (usize, &mut [f32])| {
            let i = i0 + r;
            level.run(
                #[inline(always)]
                || {
                    if let Some(bias) = bias {
                        let brow = &bias[layout.row(i, t, s)..][..kmax];
                        for (x, b) in row.iter_mut().zip(brow) {
                            *x += b;
                        }
                    }
                    if let Some(mask) = mask {
                        for (x, m) in row.iter_mut().zip(mask) {
                            *x += m;
                        }
                    }
                    if causal {
                        row[i + 1..].fill(f32::NEG_INFINITY);
                    }
                },
            )
        };
        if par == Threads::PerBatch {
            buf.chunks_mut(kmax).enumerate().for_each(fix_row);
        } else {
            buf.par_chunks_mut(kmax).enumerate().for_each(fix_row);
        }
    }
}

/// Most query rows of a block that [`AttnInputs::direct`] runs through the direct loops.
const DIRECT_MAX_ROWS: usize = 4;

/// `buf[i, j] = scale · q_i · k_j` for query rows q [rows, dk] and keys [kmax, dk] read in place
/// (buf [rows, kmax]): one dot product per entry, keys outermost so that each key is read once
/// from memory for all rows (a decoding step's rows are a group's query heads, which share its
/// keys). The values ([kmax, dv]) are prefetched beside their keys, so that memory reads them
/// while the dot products run and [`direct_values`] finds them in cache.
fn direct_scores(
    level: simd::SimdLevel,
    q: &[f32],
    (keys, values): (&[f32], &[f32]),
    dk: usize,
    scale: f32,
    buf: &mut [f32],
) {
    let kmax = keys.len() / dk;
    let dv = values.len() / kmax.max(1);
    level.run(
        #[inline(always)]
        || {
            for (j, key) in keys.chunks_exact(dk).enumerate() {
                prefetch(&values[j * dv..(j + 1) * dv]);
                for (i, qi) in q.chunks_exact(dk).enumerate() {
                    buf[i * kmax + j] = scale * simd::dot(qi, key);
                }
            }
        },
    )
}

/// Asks the cache for every 64-byte line of `xs` (a hint: nothing where the target has none).
#[inline(always)]
fn prefetch(xs: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in xs.chunks(16) {
        // SAFETY: a prefetch reads nothing architecturally; the address is inside `xs`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr() as *const i8
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = xs;
}

/// `out_i = Σ_j p[i, j] · v_j` for probabilities p [rows, kmax] and values [kmax, dv] read in
/// place (out [rows, dv], overwritten), values outermost so that each is read once for all rows;
/// each output element sums its terms in key order, as a row-by-row loop would.
fn direct_values(level: simd::SimdLevel, p: &[f32], values: &[f32], dv: usize, out: &mut [f32]) {
    let kmax = values.len() / dv;
    level.run(
        #[inline(always)]
        || {
            out.fill(0.0);
            for (j, v) in values.chunks_exact(dv).enumerate() {
                for (i, o) in out.chunks_exact_mut(dv).enumerate() {
                    let w = p[i * kmax + j];
                    for (x, &y) in o.iter_mut().zip(v) {
                        *x += w * y;
                    }
                }
            }
        },
    )
}

/// Applies the score function in place to one row of scores; returns the row's log-sum-exp
/// (softmax) or 0 (relu²).
#[inline(always)]
fn score_row(score: ScoreFn, row: &mut [f32]) -> f32 {
    match score {
        ScoreFn::Softmax => {
            let m = simd::max(row);
            for x in row.iter_mut() {
                *x = fast_exp(*x - m);
            }
            let l = simd::sum(row);
            let inv = 1.0 / l;
            for x in row.iter_mut() {
                *x *= inv;
            }
            m + l.ln()
        }
        ScoreFn::Relu2 => {
            for x in row.iter_mut() {
                let r = x.max(0.0);
                *x = r * r;
            }
            0.0
        }
    }
}

/// `dst.copy_from_slice(src)`, row by row on the thread pool when the block runs `Within` (one
/// thread would otherwise copy while the other waits).
fn copy_rows(dst: &mut [f32], src: &[f32], row: usize, par: Threads) {
    if par == Threads::PerBatch {
        dst.copy_from_slice(src);
    } else {
        dst.par_chunks_mut(row)
            .zip(src.par_chunks(row))
            .for_each(|(d, s)| d.copy_from_slice(s));
    }
}

/// Rows of a block's weights ([rows, kmax], query element b's rows from i0) through `dropout`:
/// from `src` into `dst`, or in place when `src` is `None`.
fn drop_rows(
    level: simd::SimdLevel,
    dropout: DropoutMask,
    (b, i0): (usize, usize),
    kmax: usize,
    src: Option<&[f32]>,
    dst: &mut [f32],
    par: Threads,
) {
    let row = |(r, d): (usize, &mut [f32])| {
        let at = (b, i0 + r);
        level.run(
            #[inline(always)]
            || match src {
                Some(src) => dropout.apply(at, &src[r * kmax..(r + 1) * kmax], d),
                None => dropout.apply_in_place(at, d),
            },
        )
    };
    if par == Threads::PerBatch {
        dst.chunks_mut(kmax).enumerate().for_each(row);
    } else {
        dst.par_chunks_mut(kmax).enumerate().for_each(row);
    }
}

/// One thread's buffers for the batch elements it runs, reused from one to the next.
#[derive(Default)]
struct Scratch {
    /// A row block's scores (made into the score function's values in place).
    scores: Vec<f32>,
    /// A row block's `dP` (backward).
    dp: Vec<f32>,
    /// The key/value element's Kᵀ [dk, S] ([`AttnInputs::transposed_keys`]).
    kt: Vec<f32>,
    /// The key/value element's Vᵀ [dv, S] (backward).
    vt: Vec<f32>,
    /// A row block's weights after dropout (with dropout only).
    dropped: Vec<f32>,
}

/// Forward of key/value element `kv` and its `r` query elements: writes `out` ([r, T, dv]) and
/// `lse` ([r, T], softmax only), and into `kept` what `keep` says (see [`KeptScores`]; `kept` is
/// empty for [`Keep::Nothing`]). K and V are read once for all r (GQA's point).
fn attn_forward_kv(
    x: &AttnInputs,
    kv: usize,
    (out, lse, kept): (&mut [f32], &mut [f32], &mut [f32]),
    keep: Keep,
    scratch: &mut Scratch,
    par: Threads,
) {
    x.transposed_keys(kv, &mut scratch.kt, par);
    let per_batch = if keep == Keep::Nothing {
        0
    } else {
        x.block_scores_len()
    };
    let (t, dv) = (x.t, x.dv);
    for j in 0..x.r {
        let parts = (
            &mut out[j * t * dv..(j + 1) * t * dv],
            &mut lse[j * t..(j + 1) * t],
            &mut kept[j * per_batch..(j + 1) * per_batch],
        );
        attn_forward_one(x, kv * x.r + j, parts, keep, scratch, par);
    }
}

/// Forward of query element `b` given its key/value element's Kᵀ in `scratch.kt`: writes `out`
/// ([T, dv]), `lse` ([T]) and `kept` as [`attn_forward_kv`] says.
fn attn_forward_one(
    x: &AttnInputs,
    b: usize,
    (out, lse, kept): (&mut [f32], &mut [f32], &mut [f32]),
    keep: Keep,
    scratch: &mut Scratch,
    par: Threads,
) {
    let Scratch {
        scores: buf,
        kt,
        dropped,
        ..
    } = scratch;
    let v = slice(&x.v);
    let vp = v[x.value_offset(b / x.r)..].as_ptr();
    let mut offset = 0;
    for (i0, i1) in x.row_blocks() {
        let kmax = x.key_limit(i1);
        let rows = i1 - i0;
        let len = rows * kmax;
        // Kept probabilities are computed in place in `kept`, the rest in the reused buffer (kept
        // scores copied out of it before the score function).
        let (buf, kept_scores): (&mut [f32], Option<&mut [f32]>) = match keep {
            Keep::Probabilities => (&mut kept[offset..offset + len], None),
            Keep::Scores => {
                buf.resize(len, 0.0);
                (buf, Some(&mut kept[offset..offset + len]))
            }
            Keep::Nothing => {
                buf.resize(len, 0.0);
                (buf, None)
            }
        };
        x.scores(b, i0, i1, kt, buf, par);
        if let Some(dst) = kept_scores {
            copy_rows(dst, buf, kmax, par);
        }
        offset += len;
        let (score, level) = (x.spec.score, x.level);
        let lse_blk = &mut lse[i0..i1];
        if par == Threads::PerBatch {
            buf.chunks_mut(kmax)
                .zip(lse_blk.iter_mut())
                .for_each(|(row, l)| {
                    *l = level.run(
                        #[inline(always)]
                        || score_row(score, row),
                    )
                });
        } else {
            buf.par_chunks_mut(kmax)
                .zip(lse_blk.par_iter_mut())
                .for_each(|(row, l)| {
                    *l = level.run(
                        #[inline(always)]
                        || score_row(score, row),
                    )
                });
        }
        // The weights that multiply V: the block's, or (dropout) a dropped copy, the block's kept
        // for the backward.
        let weights: &[f32] = match x.dropout {
            None => &buf[..len],
            Some(d) => {
                dropped.resize(len, 0.0);
                drop_rows(level, d, (b, i0), kmax, Some(&buf[..len]), dropped, par);
                &dropped[..len]
            }
        };
        if x.direct(rows, par) {
            let values = &v[x.value_offset(b / x.r)..][..kmax * x.dv];
            let out = &mut out[i0 * x.dv..i1 * x.dv];
            direct_values(x.level, weights, values, x.dv, out);
            continue;
        }
        // SAFETY: weights is rows × kmax, v's kmax × dv rows are inside b's K/V element, out
        // holds T × dv.
        unsafe {
            matmul(
                (rows, x.dv, kmax),
                out[i0 * x.dv..].as_mut_ptr(),
                x.dv,
                false,
                (weights.as_ptr(), kmax, 1),
                (vp, x.dv, 1),
                1.0,
                par.gemm(),
            );
        }
    }
}

/// Forward over all query elements: ([N, T, dv], log-sum-exp [N, T], the scores kept for the
/// backward when `keep` says so).
fn attn_forward(x: &AttnInputs, keep: Keep) -> (Vec<f32>, Vec<f32>, Option<KeptScores>) {
    let _timer = profile::Timer::start(profile::Part::Attention);
    let mut out = zeros(x.n * x.t * x.dv);
    let mut lse = zeros(x.n * x.t);
    let per_batch = x.block_scores_len();
    let mut kept = match keep {
        Keep::Scores | Keep::Probabilities => zeros(x.n * per_batch),
        Keep::Nothing => Vec::new(),
    };
    // One slice of `kept` per key/value element (its r query elements), empty when nothing is
    // kept.
    let mut kept_parts: Vec<&mut [f32]> = match keep {
        Keep::Scores | Keep::Probabilities => kept.chunks_mut(x.r * per_batch).collect(),
        Keep::Nothing => (0..x.n_kv()).map(|_| &mut [][..]).collect(),
    };
    let (out_len, lse_len) = (x.r * x.t * x.dv, x.r * x.t);
    if x.parallel_batches() {
        out.par_chunks_mut(out_len)
            .zip(lse.par_chunks_mut(lse_len))
            .zip(kept_parts.par_iter_mut())
            .enumerate()
            .for_each_init(Scratch::default, |scratch, (kv, ((o, l), k))| {
                attn_forward_kv(x, kv, (o, l, k), keep, scratch, Threads::PerBatch)
            });
    } else {
        let mut scratch = Scratch::default();
        for (kv, ((o, l), k)) in out
            .chunks_mut(out_len)
            .zip(lse.chunks_mut(lse_len))
            .zip(kept_parts.iter_mut())
            .enumerate()
        {
            attn_forward_kv(x, kv, (o, l, k), keep, &mut scratch, Threads::Within);
        }
    }
    let kept = (keep != Keep::Nothing).then_some(KeptScores {
        data: kept,
        per_batch,
        kind: keep,
    });
    (out, lse, kept)
}

/// Where a query element's bias gradient goes in the buffer handed to [`attn_backward_kv`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum BiasSlot {
    /// The whole [Hb, T, S] gradient: element n adds into table n % Hb.
    Table,
    /// The key/value element's own [r, T, S]: its j-th query element into part j.
    PerQuery,
}

/// Gradients of key/value element `kv` (dK, dV: [S, dk], [S, dv]) and of its r query elements
/// (dQ: [r, T, dk]; the bias's into `dbias` as its slot says), given the forward's output and
/// log-sum-exp ([N, T, dv], [N, T]), the upstream gradient [N, T, dv] and `kept_of(n)`, the
/// scores the forward kept for query element n (all or none).
#[allow(clippy::too_many_arguments)]
fn attn_backward_kv<'k>(
    x: &AttnInputs,
    kv: usize,
    saved: (&[f32], &[f32], &[f32]),
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
    mut dbias: Option<(&mut [f32], BiasSlot)>,
    scratch: &mut Scratch,
    kept_of: impl Fn(usize) -> Option<(&'k [f32], Keep)>,
    par: Threads,
) {
    if kept_of(kv * x.r).is_none() {
        x.transposed_keys(kv, &mut scratch.kt, par);
    }
    x.transposed_values(kv, &mut scratch.vt, par);
    let len = x.bias_layout.len(x.t, x.s);
    let (mut dk_acc, mut dv_acc) = (KeyGrad::new(dk, x.dk, x.s), KeyGrad::new(dv, x.dv, x.s));
    for j in 0..x.r {
        let n = kv * x.r + j;
        let db = dbias.as_mut().map(|(db, slot)| {
            let at = match slot {
                BiasSlot::Table => (n % x.bias_heads) * len,
                BiasSlot::PerQuery => j * len,
            };
            &mut db[at..at + len]
        });
        let dq = &mut dq[j * x.t * x.dk..(j + 1) * x.t * x.dk];
        let acc = (&mut dk_acc, &mut dv_acc);
        attn_backward_one(x, n, saved, (dq, acc), db, scratch, kept_of(n), par);
    }
    dk_acc.finish(par);
    dv_acc.finish(par);
}

/// Gradients of query element `b` (dQ [T, dk], its bias's [T, S] added into `dbias`), its share of
/// its key/value element's dK and dV added into the accumulators; Kᵀ and Vᵀ of that element in
/// `scratch` ([`attn_backward_kv`]).
#[allow(clippy::too_many_arguments)]
fn attn_backward_one(
    x: &AttnInputs,
    b: usize,
    (out, lse, grad): (&[f32], &[f32], &[f32]),
    (dq, (dk_acc, dv_acc)): (&mut [f32], (&mut KeyGrad, &mut KeyGrad)),
    mut dbias: Option<&mut [f32]>,
    scratch: &mut Scratch,
    kept: Option<(&[f32], Keep)>,
    par: Threads,
) {
    let Scratch {
        scores: buf,
        dp,
        kt,
        vt,
        dropped,
    } = scratch;
    let (q, k) = (slice(&x.q), slice(&x.k));
    let (t, s, dkw, dvw) = (x.t, x.s, x.dk, x.dv);
    // This query element's rows of the forward output, log-sum-exp and upstream gradient.
    let out = &out[b * t * dvw..(b + 1) * t * dvw];
    let lse = &lse[b * t..(b + 1) * t];
    let grad = &grad[b * t * dvw..(b + 1) * t * dvw];
    let qb = &q[b * t * dkw..(b + 1) * t * dkw];
    let kp = k[x.key_offset(b / x.r)..].as_ptr();
    let score = x.spec.score;
    let mut offset = 0;
    for (i0, i1) in x.row_blocks() {
        let kmax = x.key_limit(i1);
        let rows = i1 - i0;
        let len = rows * kmax;
        dp.resize(len, 0.0);
        let kept_blk = kept.map(|(data, kind)| (&data[offset..offset + len], kind));
        offset += len;
        // Kept probabilities are read in place; otherwise `buf` gets the block's scores (the
        // forward's own: the same bits as recomputing them), made into P below.
        match kept_blk {
            Some((_, Keep::Probabilities)) => {}
            Some((scores, _)) => {
                buf.resize(len, 0.0);
                copy_rows(buf, scores, kmax, par);
            }
            None => {
                buf.resize(len, 0.0);
                x.scores(b, i0, i1, kt, buf, par);
            }
        }
        // dP = dO Vᵀ: [rows, kmax].
        // SAFETY: grad rows i0..i1 × dv, Vᵀ's dv rows of S ≥ kmax columns, dp rows × kmax.
        unsafe {
            matmul(
                (rows, kmax, dvw),
                dp.as_mut_ptr(),
                kmax,
                false,
                (grad[i0 * dvw..].as_ptr(), dvw, 1),
                (vt.as_ptr(), s, 1),
                1.0,
                par.gemm(),
            );
        }
        let level = x.level;
        // With dropout, O = (P ∘ M) V for the mask M (its kept entries 1 / (1 − prob)): what
        // came back is the gradient of P ∘ M, and P's is M ∘ it. Softmax's δ below stays
        // O · dO: Σ_j P_ij (M ∘ dP)_ij = Σ_j (P ∘ M)_ij dP_ij.
        if let Some(d) = x.dropout {
            drop_rows(level, d, (b, i0), kmax, None, &mut dp[..len], par);
        }
        // Softmax's δ_i = Σ_j P_ij dP_ij = O_i · dO_i.
        let delta =
            |i: usize| simd::dot(&out[i * dvw..(i + 1) * dvw], &grad[i * dvw..(i + 1) * dvw]);
        // p ← P (the probabilities / relu² weights), dp ← dX (gradient of the biased scores).
        let p: &[f32] = match kept_blk {
            Some((probs, Keep::Probabilities)) => {
                let row_fn = |(r, (p_row, d_row)): (usize, (&[f32], &mut [f32]))| {
                    level.run(
                        #[inline(always)]
                        || {
                            let dl = delta(i0 + r);
                            for (p, d) in p_row.iter().zip(d_row.iter_mut()) {
                                *d = p * (*d - dl);
                            }
                        },
                    )
                };
                if par == Threads::PerBatch {
                    probs
                        .chunks(kmax)
                        .zip(dp.chunks_mut(kmax))
                        .enumerate()
                        .for_each(row_fn);
                } else {
                    probs
                        .par_chunks(kmax)
                        .zip(dp.par_chunks_mut(kmax))
                        .enumerate()
                        .for_each(row_fn);
                }
                probs
            }
            _ => {
                let row_fn = |(r, (p_row, d_row)): (usize, (&mut [f32], &mut [f32]))| {
                    let i = i0 + r;
                    level.run(
                        #[inline(always)]
                        || match score {
                            ScoreFn::Softmax => {
                                let (l, dl) = (lse[i], delta(i));
                                for (p, d) in p_row.iter_mut().zip(d_row.iter_mut()) {
                                    *p = fast_exp(*p - l);
                                    *d = *p * (*d - dl);
                                }
                            }
                            ScoreFn::Relu2 => {
                                for (p, d) in p_row.iter_mut().zip(d_row.iter_mut()) {
                                    let r = p.max(0.0);
                                    *p = r * r;
                                    *d *= 2.0 * r;
                                }
                            }
                        },
                    )
                };
                if par == Threads::PerBatch {
                    buf.chunks_mut(kmax)
                        .zip(dp.chunks_mut(kmax))
                        .enumerate()
                        .for_each(row_fn);
                } else {
                    buf.par_chunks_mut(kmax)
                        .zip(dp.par_chunks_mut(kmax))
                        .enumerate()
                        .for_each(row_fn);
                }
                &buf[..len]
            }
        };
        if let Some(db) = dbias.as_deref_mut() {
            level.run(
                #[inline(always)]
                || {
                    for (r, d_row) in dp.chunks(kmax).enumerate() {
                        let i = i0 + r;
                        let at = x.bias_layout.row(i, x.t, s);
                        for (a, d) in db[at..at + kmax].iter_mut().zip(d_row) {
                            *a += d;
                        }
                    }
                },
            );
        }
        let scale = x.spec.scale;
        // SAFETY: all operands are inside b's slices and its K/V element's: dp, buf rows × kmax;
        // q, dq rows i0..i1; k, dk, v, dv rows 0..kmax.
        unsafe {
            // dQ = dX K · scale
            matmul(
                (rows, dkw, kmax),
                dq[i0 * dkw..].as_mut_ptr(),
                dkw,
                false,
                (dp.as_ptr(), kmax, 1),
                (kp, dkw, 1),
                scale,
                par.gemm(),
            );
            // dK += dXᵀ Q · scale
            dk_acc.add_xt_y(
                dp.as_ptr(),
                qb[i0 * dkw..].as_ptr(),
                (rows, kmax),
                scale,
                par,
            );
            // dV += Pᵀ dO, with dropout (P ∘ M)ᵀ dO.
            let p = match x.dropout {
                None => p,
                Some(d) => {
                    dropped.resize(len, 0.0);
                    drop_rows(level, d, (b, i0), kmax, Some(p), dropped, par);
                    &dropped[..len]
                }
            };
            dv_acc.add_xt_y(
                p.as_ptr(),
                grad[i0 * dvw..].as_ptr(),
                (rows, kmax),
                1.0,
                par,
            );
        }
    }
}

/// Widest key-side gradient (dK's dk, dV's dv) accumulated transposed by [`KeyGrad`]. Measured
/// single-threaded (gemm 0.19, AVX2 EPYC) for a block of 128 query rows against 4096–8192 keys:
/// `dKᵀ += Qᵀ dX` at 54–70 GFLOP/s where `dK += dXᵀ Q` ran at 27–49 for a width of 64
/// (Transformer++'s heads); 74 against 61 for FLASH-Quad's 128 over 512 keys; equal for a width
/// of 512 (GAU's V).
const TRANSPOSED_KEY_GRAD_MAX_WIDTH: usize = 128;

/// A key-side gradient [S, width] (dK or dV of one batch element) summed over query blocks, each
/// adding `scale · Xᵀ Y` for the block's X [rows, keys] (dX or P) and Y [rows, width] (Q or dO).
/// Narrow gradients are summed transposed, `[width, S] += scale · Yᵀ X`, a product gemm runs
/// faster (the long dimension becomes the product's columns), and transposed back at the end.
struct KeyGrad<'a> {
    out: &'a mut [f32],
    width: usize,
    s: usize,
    transposed: Option<Vec<f32>>,
}

impl<'a> KeyGrad<'a> {
    fn new(out: &'a mut [f32], width: usize, s: usize) -> Self {
        let transposed = (width <= TRANSPOSED_KEY_GRAD_MAX_WIDTH).then(|| vec![0f32; width * s]);
        Self {
            out,
            width,
            s,
            transposed,
        }
    }

    /// Adds `scale · Xᵀ Y` to the gradient's first `keys` rows.
    ///
    /// # Safety
    /// `x` points at `rows × keys` floats (row stride `keys`), `y` at `rows × width` (row stride
    /// `width`); `keys` ≤ S.
    unsafe fn add_xt_y(
        &mut self,
        x: *const f32,
        y: *const f32,
        (rows, keys): (usize, usize),
        scale: f32,
        par: Threads,
    ) {
        let w = self.width;
        // SAFETY: forwarded from the caller; out holds S × width, transposed width × S.
        unsafe {
            match &mut self.transposed {
                None => matmul(
                    (keys, w, rows),
                    self.out.as_mut_ptr(),
                    w,
                    true,
                    (x, 1, keys),
                    (y, w, 1),
                    scale,
                    par.gemm(),
                ),
                Some(t) => matmul(
                    (w, keys, rows),
                    t.as_mut_ptr(),
                    self.s,
                    true,
                    (y, 1, w),
                    (x, keys, 1),
                    scale,
                    par.gemm(),
                ),
            }
        }
    }

    /// Writes a transposed sum back into `out` ([S, width]).
    fn finish(self, par: Threads) {
        if let Some(t) = self.transposed {
            transpose(&t, (self.width, self.s), self.out, par);
        }
    }
}

/// Gradients (dQ, dK, dV, dBias) of [`attention`] given the upstream gradient [N, T, dv] (and the
/// forward's scores, if it kept them). The bias's gradient sums its query elements in order, the
/// same bits on one thread or many.
fn attn_backward(
    x: &AttnInputs,
    (out, lse, kept): (&[f32], &[f32], Option<&KeptScores>),
    grad: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
    let kept_of =
        |b: usize| kept.map(|k| (&k.data[b * k.per_batch..(b + 1) * k.per_batch], k.kind));
    let _timer = profile::Timer::start(profile::Part::Attention);
    let (n, t, s, dkw, dvw, r) = (x.n, x.t, x.s, x.dk, x.dv, x.r);
    let n_kv = x.n_kv();
    let mut dq = zeros(n * t * dkw);
    let mut dk = zeros(n_kv * s * dkw);
    let mut dv = zeros(n_kv * s * dvw);
    let table_len = x.bias_layout.len(t, s);
    let has_bias = x.bias.is_some();
    let mut dbias = has_bias.then(|| vec![0f32; x.bias_heads * table_len]);
    let saved = (out, lse, grad);
    if x.parallel_batches() {
        // Each key/value element's query elements' bias gradients apart, then summed per table in
        // query order.
        let partial: Vec<Option<Vec<f32>>> = dq
            .par_chunks_mut(r * t * dkw)
            .zip(dk.par_chunks_mut(s * dkw))
            .zip(dv.par_chunks_mut(s * dvw))
            .enumerate()
            .map_init(Scratch::default, |scratch, (kv, ((dq, dk), dv))| {
                let mut db = has_bias.then(|| vec![0f32; r * table_len]);
                let slot = db.as_deref_mut().map(|db| (db, BiasSlot::PerQuery));
                let par = Threads::PerBatch;
                attn_backward_kv(x, kv, saved, (dq, dk, dv), slot, scratch, kept_of, par);
                db
            })
            .collect();
        if let Some(dbias) = dbias.as_mut() {
            for (kv, part) in partial.iter().enumerate() {
                let part = part.as_ref().expect("bias gradients");
                for (j, p) in part.chunks(table_len).enumerate() {
                    let h = (kv * r + j) % x.bias_heads;
                    let table = &mut dbias[h * table_len..(h + 1) * table_len];
                    table.iter_mut().zip(p).for_each(|(a, b)| *a += b);
                }
            }
        }
    } else {
        let mut scratch = Scratch::default();
        for (kv, ((dq, dk), dv)) in dq
            .chunks_mut(r * t * dkw)
            .zip(dk.chunks_mut(s * dkw))
            .zip(dv.chunks_mut(s * dvw))
            .enumerate()
        {
            let slot = dbias.as_deref_mut().map(|db| (db, BiasSlot::Table));
            let par = Threads::Within;
            attn_backward_kv(x, kv, saved, (dq, dk, dv), slot, &mut scratch, kept_of, par);
        }
    }
    (dq, dk, dv, dbias)
}

/// What the attention backward keeps from the forward.
#[derive(Clone)]
struct AttnSaved {
    inputs: AttnInputs,
    /// The forward's output, shared with the graph (not copied).
    out: FlexTensor,
    lse: Arc<Vec<f32>>,
    kept: Option<Arc<KeptScores>>,
}

impl fmt::Debug for AttnSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AttnSaved({:?})", self.inputs.spec)
    }
}

#[derive(Debug)]
struct AttnBackward;

impl<const P: usize> Backward<Flex, P> for AttnBackward {
    type State = AttnSaved;

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, _: &mut Checkpointer) {
        let saved = ops.state;
        let x = &saved.inputs;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let kept = saved.kept.as_deref();
        let (dq, dk, dv, dbias) =
            attn_backward(x, (slice(&saved.out), &saved.lse, kept), slice(&grad));
        let results = [
            (Some(dq), vec![x.n, x.t, x.dk]),
            (Some(dk), vec![x.n_kv(), x.s, x.dk]),
            (Some(dv), vec![x.n_kv(), x.s, x.dv]),
            (
                dbias,
                [vec![x.bias_heads], x.bias_layout.shape(x.t, x.s)].concat(),
            ),
        ];
        let parents = ops.parents.iter().map(|p| p.as_ref().map(|n| n.id));
        register_grads(grads, parents, results);
    }
}

/// `tensors`: Q, K, V and, if any, the bias tables laid out as `layout` says.
fn attention_autodiff<const P: usize>(
    tensors: [<Ad as BackendTypes>::FloatTensorPrimitive; P],
    (layout, key_mask): (BiasLayout, Option<(Vec<f32>, usize)>),
    (spec, dropout): (AttentionSpec, Option<DropoutMask>),
) -> <Ad as BackendTypes>::FloatTensorPrimitive {
    let nodes = tensors.each_ref().map(|t| t.node());
    let prims: Vec<FlexTensor> = tensors.iter().map(|t| t.primitive().clone()).collect();
    let qkv = (&prims[0], &prims[1], &prims[2]);
    let inputs = AttnInputs {
        dropout,
        ..AttnInputs::new(qkv, None, prims.get(3).map(|b| (b, layout)), key_mask, spec)
    };
    let (out, lse, kept) = attn_forward(&inputs, inputs.keep_for_backward());
    let shape = vec![inputs.n, inputs.t, inputs.dv];
    let output = flex_from(out, shape);
    record(
        AttnBackward,
        nodes,
        AttnSaved {
            inputs,
            out: output.clone(),
            lse: Arc::new(lse),
            kept: kept.map(Arc::new),
        },
        output,
    )
}

/// `score(Q Kᵀ · scale + bias) V` fused (see the module doc), or `None` off `flex`.
///
/// q: [N, T, dk]; k: [N, S, dk]; v: [N, S, dv]; bias: [T, S] → [N, T, dv].
pub fn attention(
    q: &Tensor<3>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    bias: Option<&Tensor<2>>,
    spec: AttentionSpec,
) -> Option<Tensor<3>> {
    let table = bias.map(|b| b.clone().unsqueeze::<3>());
    let bias = ScoreBias {
        table: table.as_ref().map(BiasTable::Dense),
        key_mask: None,
    };
    attention_grouped(q, k, v, bias, spec)
}

/// [`attention`] with key/value elements shared by groups of query elements and with the bias
/// split into a trained table per head and a constant mask per sequence (T5 with GQA):
/// `score(Q_n K_{n / r}ᵀ · scale + table_{n % Hb} + mask_{n / (N / Bm)}) V_{n / r}`, K and V read
/// once per group and never expanded, or `None` off `flex`.
///
/// q: [N, T, dk]; k: [N / r, S, dk]; v: [N / r, S, dv]; bias: see [`ScoreBias`] → [N, T, dv].
pub fn attention_grouped(
    q: &Tensor<3>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    bias: ScoreBias,
    spec: AttentionSpec,
) -> Option<Tensor<3>> {
    grouped(q, (k, v, None), bias, (spec, None))
}

/// [`attention_grouped`] with dropout on the weights ([`DropoutMask`]: T5's fine-tuning),
/// the mask regenerated in the backward from its seed, or `None` off `flex`.
pub fn attention_grouped_dropout(
    q: &Tensor<3>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    bias: ScoreBias,
    spec: AttentionSpec,
    dropout: DropoutMask,
) -> Option<Tensor<3>> {
    grouped(q, (k, v, None), bias, (spec, Some(dropout)))
}

/// [`attention_grouped`] over the first `used` keys and values of k and v ([N / r, L, dk] and
/// [N / r, L, dv], L ≥ used), read in place: a decoding step over a cache preallocated past the
/// positions decoded so far. Inference only: `None` off plain `flex` (and on its autodiff device).
pub fn attention_grouped_prefix(
    q: &Tensor<3>,
    (k, v, used): (&Tensor<3>, &Tensor<3>, usize),
    bias: ScoreBias,
    spec: AttentionSpec,
) -> Option<Tensor<3>> {
    if route(&q.device()) != Route::Plain {
        return None;
    }
    grouped(q, (k, v, Some(used)), bias, (spec, None))
}

fn grouped(
    q: &Tensor<3>,
    (k, v, used): (&Tensor<3>, &Tensor<3>, Option<usize>),
    bias: ScoreBias,
    (spec, dropout): (AttentionSpec, Option<DropoutMask>),
) -> Option<Tensor<3>> {
    let route = route(&q.device());
    if route == Route::Reference {
        return None;
    }
    let key_mask = bias
        .key_mask
        .map(|m| (host_vec(&m.clone().flatten::<1>(0, 1)), m.dims()[0]));
    let table = bias.table.map(BiasTable::as_3d);
    match route {
        Route::Reference => None,
        Route::Plain => {
            let p = |t: &Tensor<3>| t.clone().try_into_primitive::<Flex>().ok();
            let (q, k, v) = (p(q)?, p(k)?, p(v)?);
            let table = match &table {
                Some((b, layout)) => Some((p(b)?, *layout)),
                None => None,
            };
            let bias = table.as_ref().map(|(b, layout)| (b, *layout));
            let inputs = AttnInputs {
                dropout,
                ..AttnInputs::new((&q, &k, &v), used, bias, key_mask, spec)
            };
            let (out, _, _) = attn_forward(&inputs, Keep::Nothing);
            let shape = vec![inputs.n, inputs.t, inputs.dv];
            Some(Tensor::from_primitive::<Flex>(flex_from(out, shape)))
        }
        Route::Autodiff => {
            let p = |t: &Tensor<3>| t.clone().try_into_primitive::<Ad>().ok();
            let (q, k, v) = (p(q)?, p(k)?, p(v)?);
            let out = match &table {
                Some((b, layout)) => {
                    let tensors = [q, k, v, p(b)?];
                    attention_autodiff(tensors, (*layout, key_mask), (spec, dropout))
                }
                None => {
                    let layout = BiasLayout::Dense;
                    attention_autodiff([q, k, v], (layout, key_mask), (spec, dropout))
                }
            };
            Some(Tensor::from_primitive::<Ad>(out))
        }
    }
}
