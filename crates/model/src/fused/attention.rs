//! Fused attention: `score(Q Kᵀ · scale + bias) V` in blocks of query rows, forward and backward.

#[allow(unused_imports)]
use super::*;

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
/// small. Measured (`profile_step`, a 2-core Zen 4 EPYC, 2026-12-05, attention kernels' seconds
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

/// Inputs of one attention call as contiguous flex tensors.
#[derive(Clone)]
struct AttnInputs {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    bias: Option<FlexTensor>,
    spec: AttentionSpec,
    /// (N, T, S, dk, dv)
    n: usize,
    t: usize,
    s: usize,
    dk: usize,
    dv: usize,
    /// The instruction set of the row loops (read on the calling thread at construction).
    level: simd::SimdLevel,
}

impl AttnInputs {
    fn new(
        q: &FlexTensor,
        k: &FlexTensor,
        v: &FlexTensor,
        bias: Option<&FlexTensor>,
        spec: AttentionSpec,
    ) -> Self {
        let (qd, kd, vd) = (dims(q), dims(k), dims(v));
        let [n, t, dk] = [qd[0], qd[1], qd[2]];
        let s = kd[1];
        let dv = vd[2];
        assert_eq!(
            (kd[0], kd[2], vd[0], vd[1]),
            (n, dk, n, s),
            "attention shapes"
        );
        if spec.causal {
            assert_eq!(t, s, "causal attention needs as many queries as keys");
        }
        if let Some(b) = bias {
            assert_eq!(dims(b), vec![t, s], "attention bias shape");
        }
        Self {
            q: contiguous(q),
            k: contiguous(k),
            v: contiguous(v),
            bias: bias.map(contiguous),
            spec,
            n,
            t,
            s,
            dk,
            dv,
            level: simd::current(),
        }
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
        self.n >= rayon::current_num_threads()
    }

    /// Kᵀ [dk, S] of batch element `b` into `kt`: the scores' right operand, n-contiguous
    /// (see [`transpose_into`]).
    fn transposed_keys(&self, b: usize, kt: &mut Vec<f32>, par: Threads) {
        let (s, dk) = (self.s, self.dk);
        transpose_into(&slice(&self.k)[b * s * dk..], (s, dk), kt, par);
    }

    /// Vᵀ [dv, S] of batch element `b` into `vt`: the right operand of the backward's `dO Vᵀ`.
    fn transposed_values(&self, b: usize, vt: &mut Vec<f32>, par: Threads) {
        let (s, dv) = (self.s, self.dv);
        transpose_into(&slice(&self.v)[b * s * dv..], (s, dv), vt, par);
    }

    /// Scores of query rows `i0..i1` of batch element `b` against keys `0..kmax`, scaled and
    /// biased, into `buf` ([i1 − i0, kmax] row-major); masked entries are `−inf`. `kt`: the batch
    /// element's Kᵀ ([`AttnInputs::transposed_keys`]).
    fn scores(&self, b: usize, i0: usize, i1: usize, kt: &[f32], buf: &mut [f32], par: Threads) {
        let kmax = self.key_limit(i1);
        let q = slice(&self.q);
        let (dk, rows) = (self.dk, i1 - i0);
        assert_eq!(kt.len(), dk * self.s, "attention: Kᵀ size");
        let qp = q[(b * self.t + i0) * dk..].as_ptr();
        // SAFETY: rows × dk of q from row i0 are inside b's slice, Kᵀ's dk rows have S ≥ kmax
        // columns; buf holds rows × kmax.
        unsafe {
            matmul(
                (rows, kmax, dk),
                buf.as_mut_ptr(),
                kmax,
                false,
                (qp, dk, 1),
                (kt.as_ptr(), self.s, 1),
                self.spec.scale,
                par.gemm(),
            );
        }
        let bias = self.bias.as_ref().map(slice);
        let causal = self.spec.causal;
        let (s, level) = (self.s, self.level);
        let fix_row = |(r, row): (usize, &mut [f32])| {
            let i = i0 + r;
            level.run(
                #[inline(always)]
                || {
                    if let Some(bias) = bias {
                        let brow = &bias[i * s..i * s + kmax];
                        for (x, b) in row.iter_mut().zip(brow) {
                            *x += b;
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

/// One thread's buffers for the batch elements it runs, reused from one to the next.
#[derive(Default)]
struct Scratch {
    /// A row block's scores (made into the score function's values in place).
    scores: Vec<f32>,
    /// A row block's `dP` (backward).
    dp: Vec<f32>,
    /// The batch element's Kᵀ [dk, S] ([`AttnInputs::transposed_keys`]).
    kt: Vec<f32>,
    /// The batch element's Vᵀ [dv, S] (backward).
    vt: Vec<f32>,
}

/// Forward of one batch element: writes `out` ([T, dv]) and `lse` ([T], softmax only), and into
/// `kept` what `keep` says (see [`KeptScores`]; `kept` is empty for [`Keep::Nothing`]).
fn attn_forward_one(
    x: &AttnInputs,
    b: usize,
    (out, lse, kept): (&mut [f32], &mut [f32], &mut [f32]),
    keep: Keep,
    scratch: &mut Scratch,
    par: Threads,
) {
    let Scratch {
        scores: buf, kt, ..
    } = scratch;
    x.transposed_keys(b, kt, par);
    let v = slice(&x.v);
    let vp = v[b * x.s * x.dv..].as_ptr();
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
        // SAFETY: buf is rows × kmax, v's kmax × dv rows are inside b's slice, out holds T × dv.
        unsafe {
            matmul(
                (rows, x.dv, kmax),
                out[i0 * x.dv..].as_mut_ptr(),
                x.dv,
                false,
                (buf.as_ptr(), kmax, 1),
                (vp, x.dv, 1),
                1.0,
                par.gemm(),
            );
        }
    }
}

/// Forward over all batch elements: ([N, T, dv], log-sum-exp [N, T], the scores kept for the
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
    // One slice of `kept` per batch element, empty when nothing is kept.
    let mut kept_parts: Vec<&mut [f32]> = match keep {
        Keep::Scores | Keep::Probabilities => kept.chunks_mut(per_batch).collect(),
        Keep::Nothing => (0..x.n).map(|_| &mut [][..]).collect(),
    };
    if x.parallel_batches() {
        out.par_chunks_mut(x.t * x.dv)
            .zip(lse.par_chunks_mut(x.t))
            .zip(kept_parts.par_iter_mut())
            .enumerate()
            .for_each_init(Scratch::default, |scratch, (b, ((o, l), k))| {
                attn_forward_one(x, b, (o, l, k), keep, scratch, Threads::PerBatch)
            });
    } else {
        let mut scratch = Scratch::default();
        for (b, ((o, l), k)) in out
            .chunks_mut(x.t * x.dv)
            .zip(lse.chunks_mut(x.t))
            .zip(kept_parts.iter_mut())
            .enumerate()
        {
            attn_forward_one(x, b, (o, l, k), keep, &mut scratch, Threads::Within);
        }
    }
    let kept = (keep != Keep::Nothing).then_some(KeptScores {
        data: kept,
        per_batch,
        kind: keep,
    });
    (out, lse, kept)
}

/// Gradients of batch element `b`, given the forward's output and log-sum-exp ([N, T, dv], [N, T])
/// and the upstream gradient [N, T, dv].
#[allow(clippy::too_many_arguments)]
fn attn_backward_one(
    x: &AttnInputs,
    b: usize,
    (out, lse, grad): (&[f32], &[f32], &[f32]),
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
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
    } = scratch;
    if kept.is_none() {
        x.transposed_keys(b, kt, par);
    }
    x.transposed_values(b, vt, par);
    let (q, k) = (slice(&x.q), slice(&x.k));
    let (t, s, dkw, dvw) = (x.t, x.s, x.dk, x.dv);
    // This batch element's rows of the forward output, log-sum-exp and upstream gradient.
    let out = &out[b * t * dvw..(b + 1) * t * dvw];
    let lse = &lse[b * t..(b + 1) * t];
    let grad = &grad[b * t * dvw..(b + 1) * t * dvw];
    let qb = &q[b * t * dkw..(b + 1) * t * dkw];
    let kp = k[b * s * dkw..].as_ptr();
    let score = x.spec.score;
    let (mut dk_acc, mut dv_acc) = (KeyGrad::new(dk, dkw, s), KeyGrad::new(dv, dvw, s));
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
                        for (a, d) in db[i * s..i * s + kmax].iter_mut().zip(d_row) {
                            *a += d;
                        }
                    }
                },
            );
        }
        let scale = x.spec.scale;
        // SAFETY: all operands are inside b's slices: dp, buf rows × kmax; q, dq rows i0..i1;
        // k, dk, v, dv rows 0..kmax.
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
            // dV += Pᵀ dO
            dv_acc.add_xt_y(
                p.as_ptr(),
                grad[i0 * dvw..].as_ptr(),
                (rows, kmax),
                1.0,
                par,
            );
        }
    }
    dk_acc.finish(par);
    dv_acc.finish(par);
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
/// forward's scores, if it kept them).
fn attn_backward(
    x: &AttnInputs,
    (out, lse, kept): (&[f32], &[f32], Option<&KeptScores>),
    grad: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
    let kept_of =
        |b: usize| kept.map(|k| (&k.data[b * k.per_batch..(b + 1) * k.per_batch], k.kind));
    let _timer = profile::Timer::start(profile::Part::Attention);
    let (n, t, s, dkw, dvw) = (x.n, x.t, x.s, x.dk, x.dv);
    let mut dq = zeros(n * t * dkw);
    let mut dk = zeros(n * s * dkw);
    let mut dv = zeros(n * s * dvw);
    let has_bias = x.bias.is_some();
    let dbias = if x.parallel_batches() {
        let partial: Vec<Option<Vec<f32>>> = dq
            .par_chunks_mut(t * dkw)
            .zip(dk.par_chunks_mut(s * dkw))
            .zip(dv.par_chunks_mut(s * dvw))
            .enumerate()
            .map_init(Scratch::default, |scratch, (b, ((dq, dk), dv))| {
                let mut db = has_bias.then(|| vec![0f32; t * s]);
                attn_backward_one(
                    x,
                    b,
                    (out, lse, grad),
                    (dq, dk, dv),
                    db.as_deref_mut(),
                    scratch,
                    kept_of(b),
                    Threads::PerBatch,
                );
                db
            })
            .collect();
        partial.into_iter().reduce(|a, b| match (a, b) {
            (Some(mut a), Some(b)) => {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                Some(a)
            }
            _ => None,
        })
    } else {
        let mut db = has_bias.then(|| vec![0f32; t * s]);
        let mut scratch = Scratch::default();
        for (b, ((dq, dk), dv)) in dq
            .chunks_mut(t * dkw)
            .zip(dk.chunks_mut(s * dkw))
            .zip(dv.chunks_mut(s * dvw))
            .enumerate()
        {
            attn_backward_one(
                x,
                b,
                (out, lse, grad),
                (dq, dk, dv),
                db.as_deref_mut(),
                &mut scratch,
                kept_of(b),
                Threads::Within,
            );
        }
        Some(db)
    }
    .flatten();
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
            (Some(dk), vec![x.n, x.s, x.dk]),
            (Some(dv), vec![x.n, x.s, x.dv]),
            (dbias, vec![x.t, x.s]),
        ];
        let parents = ops.parents.iter().map(|p| p.as_ref().map(|n| n.id));
        register_grads(grads, parents, results);
    }
}

fn attention_autodiff<const P: usize>(
    tensors: [<Ad as BackendTypes>::FloatTensorPrimitive; P],
    spec: AttentionSpec,
) -> <Ad as BackendTypes>::FloatTensorPrimitive {
    let nodes = tensors.each_ref().map(|t| t.node());
    let prims: Vec<FlexTensor> = tensors.iter().map(|t| t.primitive().clone()).collect();
    let inputs = AttnInputs::new(&prims[0], &prims[1], &prims[2], prims.get(3), spec);
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
    match route(&q.device()) {
        Route::Reference => None,
        Route::Plain => {
            let p = |t: &Tensor<3>| t.clone().try_into_primitive::<Flex>().ok();
            let (q, k, v) = (p(q)?, p(k)?, p(v)?);
            let bias = match bias {
                Some(b) => Some(b.clone().try_into_primitive::<Flex>().ok()?),
                None => None,
            };
            let inputs = AttnInputs::new(&q, &k, &v, bias.as_ref(), spec);
            let (out, _, _) = attn_forward(&inputs, Keep::Nothing);
            let shape = vec![inputs.n, inputs.t, inputs.dv];
            Some(Tensor::from_primitive::<Flex>(flex_from(out, shape)))
        }
        Route::Autodiff => {
            let p = |t: &Tensor<3>| t.clone().try_into_primitive::<Ad>().ok();
            let (q, k, v) = (p(q)?, p(k)?, p(v)?);
            let out = match bias {
                Some(b) => {
                    let b = b.clone().try_into_primitive::<Ad>().ok()?;
                    attention_autodiff([q, k, v, b], spec)
                }
                None => attention_autodiff([q, k, v], spec),
            };
            Some(Tensor::from_primitive::<Ad>(out))
        }
    }
}
