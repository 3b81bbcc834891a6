//! Fused CPU kernels with hand-written backward passes, for burn's `flex` backend.
//!
//! A plain burn graph materialises every intermediate of attention and of the loss: the [N, T, S]
//! scores, their scaled, biased, masked and normalised copies, and one autodiff record per step,
//! each a full pass over memory. XLA fuses those chains; to compare architectures fairly against the
//! JAX anchor (`shared/notes/performance.md`) every architecture gets the same treatment here:
//!
//! - [`attention`]: `score(Q Kᵀ · scale + bias) V` for score ∈ {softmax, relu²}, optionally causal,
//!   computed in blocks of query rows (the block's scores live in one reused buffer, as in
//!   FlashAttention), with the backward recomputing the block's scores instead of storing them;
//!   causal blocks stop at the diagonal.
//! - [`chunk_linear_attention`]: the global part of mixed chunk attention, with the running sums of
//!   `K_linᵀ V` kept in one [s, e] buffer per sequence instead of a [G, s, e] tensor and its cumsum;
//! - [`rotary`]: RoPE, with GAU's per-head scale and offset folded in, one pass each way;
//! - [`activation`]: SiLU and GELU in one pass each way (burn records four to six ops for each);
//! - [`matmul_2d`]: dense products (projections, feed-forward layers, the LM head) with gemm
//!   called directly, forward and backward;
//! - [`cross_entropy_rows`]: `logsumexp(x) − x[target]` per row, whose gradient is
//!   `softmax(x) − onehot(target)`: one pass forward, one backward.
//! - [`flush_denormals`]: flush-to-zero for the threads that compute, as XLA's CPU runtime does.
//!
//! Each returns `None` when the tensors do not live on `flex` (plain, or autodiff without gradient
//! checkpointing); callers then use the plain burn reference in `attention.rs` / `lm.rs`, which the
//! tests compare these kernels against (outputs and gradients, odd lengths). `REPRO_KERNELS=reference`
//! forces the reference everywhere (for benchmarks of the two).

use std::fmt;
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, BackendTypes, DispatchDevice, Flex, GradientCheckpointingStrategy};
use burn::prelude::*;
use gemm::Parallelism;
use rayon::prelude::*;

type Ad = Autodiff<Flex>;

/// Query rows per block: the block's scores are `ROW_BLOCK × S` floats (4 MB at S = 8192).
pub const ROW_BLOCK: usize = 128;

/// How a kernel uses the thread pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Threads {
    /// Batch elements run in parallel, each single-threaded.
    PerBatch,
    /// One batch element at a time, with multi-threaded matrix products and rows.
    Within,
}

impl Threads {
    fn gemm(self) -> Parallelism {
        match self {
            Threads::PerBatch => Parallelism::None,
            Threads::Within => Parallelism::Rayon(0),
        }
    }
}

/// Where a tensor's computation can go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// `flex` with autodiff (no gradient checkpointing): fused forward and backward.
    Autodiff,
    /// Plain `flex`: fused forward.
    Plain,
    /// Anything else: the caller's reference implementation.
    Reference,
}

/// Whether `REPRO_KERNELS=reference` asks for the plain burn implementations.
pub fn forced_reference() -> bool {
    std::env::var("REPRO_KERNELS").is_ok_and(|v| v == "reference")
}

fn route(device: &Device) -> Route {
    if forced_reference() {
        return Route::Reference;
    }
    match device.as_dispatch() {
        DispatchDevice::Flex(_) => Route::Plain,
        DispatchDevice::Autodiff(ad)
            if ad.gradient_checkpointing_strategy() == GradientCheckpointingStrategy::Disabled
                && matches!(ad.clone().inner(), DispatchDevice::Flex(_)) =>
        {
            Route::Autodiff
        }
        _ => Route::Reference,
    }
}

/// Records a fused op on the autodiff graph: `output` is its forward result, `state` what its
/// backward needs (dropped when no input is tracked).
fn record<Op: Backward<Flex, P>, const P: usize>(
    op: Op,
    nodes: [NodeGuard; P],
    state: Op::State,
    output: FlexTensor,
) -> <Ad as BackendTypes>::FloatTensorPrimitive {
    match op
        .prepare::<NoCheckpointing>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// Whether the fused kernels run for tensors on `device`.
pub fn available(device: &Device) -> bool {
    route(device) != Route::Reference
}

// ---------------------------------------------------------------------------------------------
// Raw buffers.

/// The f32 elements of a flex tensor in row-major order (copied only when not contiguous).
fn contiguous(t: &FlexTensor) -> FlexTensor {
    if t.is_contiguous() && t.as_slice::<f32>().is_some() {
        t.clone()
    } else {
        t.to_contiguous()
    }
}

fn slice(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>()
        .expect("fused kernels take contiguous f32 tensors")
}

fn flex_from(data: Vec<f32>, shape: Vec<usize>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(data, shape))
}

fn dims(t: &FlexTensor) -> Vec<usize> {
    t.layout().shape().to_vec()
}

/// `dst[m×n] (+)= beta · A[m×k] · B[k×n]`, each matrix given by a pointer and (row, column) strides;
/// `dst` is row-major with row stride `dst_rs`.
#[allow(clippy::too_many_arguments)]
unsafe fn matmul(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    a: (*const f32, usize, usize),
    b: (*const f32, usize, usize),
    beta: f32,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the caller guarantees that every index reached through the strides is in bounds.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            accumulate,
            a.0,
            a.2 as isize,
            a.1 as isize,
            b.0,
            b.2 as isize,
            b.1 as isize,
            1.0,
            beta,
            false,
            false,
            false,
            par,
        );
    }
}

/// `exp(x)` for f32 by range reduction and a degree-6 polynomial (Cephes `expf`), written without
/// branches so that it vectorises; relative error below 2e-7 on [−87, 88], 0 below −87.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Round to nearest by adding and subtracting 1.5·2²³: `f32::round` is a library call on
    // baseline x86-64 and would keep the loop from vectorising.
    const ROUNDER: f32 = 12_582_912.0;
    let xc = x.clamp(-87.0, 88.0);
    let n = (xc * LOG2E + ROUNDER) - ROUNDER;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5e-1;
    let p = p * r * r + r + 1.0;
    // SAFETY: n is an integer in [−126, 127] after the clamp, so the conversion is exact.
    let n = unsafe { n.to_int_unchecked::<i32>() };
    let scale = f32::from_bits(((n + 127) as u32) << 23);
    let y = p * scale;
    if x < -87.0 { 0.0 } else { y }
}

// ---------------------------------------------------------------------------------------------
// Attention.

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
        }
    }

    /// Keys visible to the query block ending (exclusively) at row `i1`.
    fn key_limit(&self, i1: usize) -> usize {
        if self.spec.causal { i1 } else { self.s }
    }

    /// Whether batch elements run in parallel (each with a single-threaded gemm) or one after
    /// another (with a multi-threaded gemm and parallel rows).
    fn parallel_batches(&self) -> bool {
        self.n >= rayon::current_num_threads()
    }

    /// Scores of query rows `i0..i1` of batch element `b` against keys `0..kmax`, scaled and
    /// biased, into `buf` ([i1 − i0, kmax] row-major); masked entries are `−inf`.
    fn scores(&self, b: usize, i0: usize, i1: usize, buf: &mut [f32], par: Threads) {
        let kmax = self.key_limit(i1);
        let (q, k) = (slice(&self.q), slice(&self.k));
        let (dk, rows) = (self.dk, i1 - i0);
        let qp = q[(b * self.t + i0) * dk..].as_ptr();
        let kp = k[b * self.s * dk..].as_ptr();
        // SAFETY: rows × dk of q from row i0 and kmax × dk of k are inside b's slices; buf holds rows × kmax.
        unsafe {
            matmul(
                (rows, kmax, dk),
                buf.as_mut_ptr(),
                kmax,
                false,
                (qp, dk, 1),
                (kp, 1, dk),
                self.spec.scale,
                par.gemm(),
            );
        }
        let bias = self.bias.as_ref().map(slice);
        let causal = self.spec.causal;
        let s = self.s;
        let fix_row = |(r, row): (usize, &mut [f32])| {
            let i = i0 + r;
            if let Some(bias) = bias {
                let brow = &bias[i * s..i * s + kmax];
                row.iter_mut().zip(brow).for_each(|(x, b)| *x += b);
            }
            if causal {
                row[i + 1..].iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
            }
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
#[inline]
fn score_row(score: ScoreFn, row: &mut [f32]) -> f32 {
    match score {
        ScoreFn::Softmax => {
            let m = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            let mut l = 0.0f32;
            for x in row.iter_mut() {
                *x = fast_exp(*x - m);
                l += *x;
            }
            let inv = 1.0 / l;
            row.iter_mut().for_each(|x| *x *= inv);
            m + l.ln()
        }
        ScoreFn::Relu2 => {
            row.iter_mut().for_each(|x| {
                let r = x.max(0.0);
                *x = r * r;
            });
            0.0
        }
    }
}

/// Forward of one batch element: writes `out` ([T, dv]) and `lse` ([T], softmax only).
fn attn_forward_one(
    x: &AttnInputs,
    b: usize,
    out: &mut [f32],
    lse: &mut [f32],
    buf: &mut Vec<f32>,
    par: Threads,
) {
    let v = slice(&x.v);
    let vp = v[b * x.s * x.dv..].as_ptr();
    for i0 in (0..x.t).step_by(ROW_BLOCK) {
        let i1 = (i0 + ROW_BLOCK).min(x.t);
        let kmax = x.key_limit(i1);
        let rows = i1 - i0;
        buf.resize(rows * kmax, 0.0);
        x.scores(b, i0, i1, buf, par);
        let score = x.spec.score;
        let lse_blk = &mut lse[i0..i1];
        if par == Threads::PerBatch {
            buf.chunks_mut(kmax)
                .zip(lse_blk.iter_mut())
                .for_each(|(row, l)| *l = score_row(score, row));
        } else {
            buf.par_chunks_mut(kmax)
                .zip(lse_blk.par_iter_mut())
                .for_each(|(row, l)| *l = score_row(score, row));
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

/// Forward over all batch elements: ([N, T, dv], log-sum-exp [N, T]).
fn attn_forward(x: &AttnInputs) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![0f32; x.n * x.t * x.dv];
    let mut lse = vec![0f32; x.n * x.t];
    if x.parallel_batches() {
        out.par_chunks_mut(x.t * x.dv)
            .zip(lse.par_chunks_mut(x.t))
            .enumerate()
            .for_each_init(Vec::new, |buf, (b, (o, l))| {
                attn_forward_one(x, b, o, l, buf, Threads::PerBatch)
            });
    } else {
        let mut buf = Vec::new();
        for (b, (o, l)) in out
            .chunks_mut(x.t * x.dv)
            .zip(lse.chunks_mut(x.t))
            .enumerate()
        {
            attn_forward_one(x, b, o, l, &mut buf, Threads::Within);
        }
    }
    (out, lse)
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
    (buf, dp): (&mut Vec<f32>, &mut Vec<f32>),
    par: Threads,
) {
    let (q, k, v) = (slice(&x.q), slice(&x.k), slice(&x.v));
    let (t, s, dkw, dvw) = (x.t, x.s, x.dk, x.dv);
    // This batch element's rows of the forward output, log-sum-exp and upstream gradient.
    let out = &out[b * t * dvw..(b + 1) * t * dvw];
    let lse = &lse[b * t..(b + 1) * t];
    let grad = &grad[b * t * dvw..(b + 1) * t * dvw];
    let qb = &q[b * t * dkw..(b + 1) * t * dkw];
    let kp = k[b * s * dkw..].as_ptr();
    let vp = v[b * s * dvw..].as_ptr();
    let score = x.spec.score;
    for i0 in (0..t).step_by(ROW_BLOCK) {
        let i1 = (i0 + ROW_BLOCK).min(t);
        let kmax = x.key_limit(i1);
        let rows = i1 - i0;
        buf.resize(rows * kmax, 0.0);
        dp.resize(rows * kmax, 0.0);
        x.scores(b, i0, i1, buf, par);
        // dP = dO Vᵀ: [rows, kmax].
        // SAFETY: grad rows i0..i1 × dv, v's kmax × dv, dp rows × kmax.
        unsafe {
            matmul(
                (rows, kmax, dvw),
                dp.as_mut_ptr(),
                kmax,
                false,
                (grad[i0 * dvw..].as_ptr(), dvw, 1),
                (vp, 1, dvw),
                1.0,
                par.gemm(),
            );
        }
        // buf ← P (the probabilities / relu² weights), dp ← dX (gradient of the biased scores).
        let row_fn = |(r, (p_row, d_row)): (usize, (&mut [f32], &mut [f32]))| {
            let i = i0 + r;
            match score {
                ScoreFn::Softmax => {
                    let l = lse[i];
                    let o = &out[i * dvw..(i + 1) * dvw];
                    let g = &grad[i * dvw..(i + 1) * dvw];
                    let delta: f32 = o.iter().zip(g).map(|(a, b)| a * b).sum();
                    for (p, d) in p_row.iter_mut().zip(d_row.iter_mut()) {
                        *p = fast_exp(*p - l);
                        *d = *p * (*d - delta);
                    }
                }
                ScoreFn::Relu2 => {
                    for (p, d) in p_row.iter_mut().zip(d_row.iter_mut()) {
                        let r = p.max(0.0);
                        *p = r * r;
                        *d *= 2.0 * r;
                    }
                }
            }
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
        if let Some(db) = dbias.as_deref_mut() {
            for (r, d_row) in dp.chunks(kmax).enumerate() {
                let i = i0 + r;
                db[i * s..i * s + kmax]
                    .iter_mut()
                    .zip(d_row)
                    .for_each(|(a, d)| *a += d);
            }
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
            matmul(
                (kmax, dkw, rows),
                dk.as_mut_ptr(),
                dkw,
                true,
                (dp.as_ptr(), 1, kmax),
                (qb[i0 * dkw..].as_ptr(), dkw, 1),
                scale,
                par.gemm(),
            );
            // dV += Pᵀ dO
            matmul(
                (kmax, dvw, rows),
                dv.as_mut_ptr(),
                dvw,
                true,
                (buf.as_ptr(), 1, kmax),
                (grad[i0 * dvw..].as_ptr(), dvw, 1),
                1.0,
                par.gemm(),
            );
        }
    }
}

/// Gradients (dQ, dK, dV, dBias) of [`attention`] given the upstream gradient [N, T, dv].
fn attn_backward(
    x: &AttnInputs,
    out: &[f32],
    lse: &[f32],
    grad: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
    let (n, t, s, dkw, dvw) = (x.n, x.t, x.s, x.dk, x.dv);
    let mut dq = vec![0f32; n * t * dkw];
    let mut dk = vec![0f32; n * s * dkw];
    let mut dv = vec![0f32; n * s * dvw];
    let has_bias = x.bias.is_some();
    let dbias = if x.parallel_batches() {
        let partial: Vec<Option<Vec<f32>>> = dq
            .par_chunks_mut(t * dkw)
            .zip(dk.par_chunks_mut(s * dkw))
            .zip(dv.par_chunks_mut(s * dvw))
            .enumerate()
            .map_init(
                || (Vec::new(), Vec::new()),
                |(buf, dp), (b, ((dq, dk), dv))| {
                    let mut db = has_bias.then(|| vec![0f32; t * s]);
                    attn_backward_one(
                        x,
                        b,
                        (out, lse, grad),
                        (dq, dk, dv),
                        db.as_deref_mut(),
                        (buf, dp),
                        Threads::PerBatch,
                    );
                    db
                },
            )
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
        let (mut buf, mut dp) = (Vec::new(), Vec::new());
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
                (&mut buf, &mut dp),
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
    out: Arc<Vec<f32>>,
    lse: Arc<Vec<f32>>,
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
        let (dq, dk, dv, dbias) = attn_backward(x, &saved.out, &saved.lse, slice(&grad));
        let shapes = [
            vec![x.n, x.t, x.dk],
            vec![x.n, x.s, x.dk],
            vec![x.n, x.s, x.dv],
            vec![x.t, x.s],
        ];
        let results = [Some(dq), Some(dk), Some(dv), dbias];
        for ((parent, data), shape) in ops.parents.iter().zip(results).zip(shapes) {
            if let (Some(node), Some(data)) = (parent, data) {
                grads.register::<Flex>(node.id, flex_from(data, shape));
            }
        }
    }
}

fn attention_autodiff<const P: usize>(
    tensors: [<Ad as BackendTypes>::FloatTensorPrimitive; P],
    spec: AttentionSpec,
) -> <Ad as BackendTypes>::FloatTensorPrimitive {
    let nodes = tensors.each_ref().map(|t| t.node());
    let prims: Vec<FlexTensor> = tensors.iter().map(|t| t.primitive().clone()).collect();
    let inputs = AttnInputs::new(&prims[0], &prims[1], &prims[2], prims.get(3), spec);
    let (out, lse) = attn_forward(&inputs);
    let shape = vec![inputs.n, inputs.t, inputs.dv];
    let out = Arc::new(out);
    let output = flex_from(out.as_ref().clone(), shape);
    record(
        AttnBackward,
        nodes,
        AttnSaved {
            inputs,
            out,
            lse: Arc::new(lse),
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
            let (out, _) = attn_forward(&inputs);
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

// ---------------------------------------------------------------------------------------------
// Chunked linear attention (the global part of FLASH's mixed chunk attention).

/// Runs `f(b, item, threads)` for every batch element: in parallel across elements when there are
/// at least as many as threads, else one at a time with multi-threaded matrix products.
fn for_each_batch<T: Send>(items: Vec<T>, f: impl Fn(usize, T, Threads) + Sync) {
    if items.len() >= rayon::current_num_threads() {
        items
            .into_par_iter()
            .enumerate()
            .for_each(|(b, item)| f(b, item, Threads::PerBatch));
    } else {
        for (b, item) in items.into_iter().enumerate() {
            f(b, item, Threads::Within);
        }
    }
}

/// Inputs of [`chunk_linear_attention`] as contiguous flex tensors.
#[derive(Clone)]
struct LinInputs {
    ql: FlexTensor,
    kl: FlexTensor,
    v: FlexTensor,
    chunk: usize,
    factor: f32,
    causal: bool,
    /// (N, T, s, e)
    n: usize,
    t: usize,
    s: usize,
    e: usize,
}

impl fmt::Debug for LinInputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LinInputs(chunk {}, causal {})", self.chunk, self.causal)
    }
}

impl LinInputs {
    fn new(
        ql: &FlexTensor,
        kl: &FlexTensor,
        v: &FlexTensor,
        chunk: usize,
        factor: f32,
        causal: bool,
    ) -> Self {
        let (qd, vd) = (dims(ql), dims(v));
        let [n, t, s] = [qd[0], qd[1], qd[2]];
        assert_eq!(dims(kl), qd, "chunk linear attention: K_lin shape");
        assert_eq!((vd[0], vd[1]), (n, t), "chunk linear attention: V shape");
        assert!(
            chunk > 0 && t.is_multiple_of(chunk),
            "chunk linear attention: length {t} is not a multiple of the chunk {chunk}"
        );
        Self {
            ql: contiguous(ql),
            kl: contiguous(kl),
            v: contiguous(v),
            chunk,
            factor,
            causal,
            n,
            t,
            s,
            e: vd[2],
        }
    }

    /// Pointers to chunk `g` of batch element `b`: (Q_lin, K_lin, V).
    fn chunk_ptrs(&self, b: usize, g: usize) -> (*const f32, *const f32, *const f32) {
        let row = b * self.t + g * self.chunk;
        (
            slice(&self.ql)[row * self.s..].as_ptr(),
            slice(&self.kl)[row * self.s..].as_ptr(),
            slice(&self.v)[row * self.e..].as_ptr(),
        )
    }

    /// `sum += scale · Xᵀ Y` for chunk matrices X: [C, a] and Y: [C, w]; `sum`: [a, w].
    ///
    /// # Safety
    /// `x` and `y` point at C rows of widths `a` and `w`.
    unsafe fn add_xt_y(
        &self,
        sum: &mut [f32],
        (x, a): (*const f32, usize),
        (y, w): (*const f32, usize),
        scale: f32,
        par: Threads,
    ) {
        // SAFETY: forwarded from the caller; sum holds a × w.
        unsafe {
            matmul(
                (a, w, self.chunk),
                sum.as_mut_ptr(),
                w,
                true,
                (x, 1, a),
                (y, w, 1),
                scale,
                par.gemm(),
            );
        }
    }

    /// The summaries seen by each chunk, in chunk order: before chunk g (causal) or all (bidirectional).
    /// `each(g, summary)` is called with the [s, e] summary for chunk g.
    fn summaries(&self, b: usize, par: Threads, mut each: impl FnMut(usize, &[f32])) {
        let (c, s, e) = (self.chunk, self.s, self.e);
        let chunks = self.t / c;
        let mut kv = vec![0f32; s * e];
        if !self.causal {
            for g in 0..chunks {
                let (_, k, v) = self.chunk_ptrs(b, g);
                // SAFETY: chunk g of b has C rows of K_lin (width s) and V (width e).
                unsafe { self.add_xt_y(&mut kv, (k, s), (v, e), 1.0, par) };
            }
        }
        for g in 0..chunks {
            each(g, &kv);
            if self.causal {
                let (_, k, v) = self.chunk_ptrs(b, g);
                // SAFETY: as above.
                unsafe { self.add_xt_y(&mut kv, (k, s), (v, e), 1.0, par) };
            }
        }
    }
}

fn lin_forward(x: &LinInputs) -> Vec<f32> {
    let (c, s, e) = (x.chunk, x.s, x.e);
    let mut out = vec![0f32; x.n * x.t * e];
    let items: Vec<&mut [f32]> = out.chunks_mut(x.t * e).collect();
    for_each_batch(items, |b, out, par| {
        x.summaries(b, par, |g, kv| {
            let (q, _, _) = x.chunk_ptrs(b, g);
            // SAFETY: Q_lin chunk is C × s, kv is s × e, out's chunk g is C × e.
            unsafe {
                matmul(
                    (c, e, s),
                    out[g * c * e..].as_mut_ptr(),
                    e,
                    false,
                    (q, s, 1),
                    (kv.as_ptr(), e, 1),
                    x.factor,
                    par.gemm(),
                );
            }
        });
    });
    out
}

/// (dQ_lin, dK_lin, dV) of [`chunk_linear_attention`] for the upstream gradient [N, T, e].
fn lin_backward(x: &LinInputs, grad: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (c, s, e, t) = (x.chunk, x.s, x.e, x.t);
    let chunks = t / c;
    let mut dq = vec![0f32; x.n * t * s];
    let mut dk = vec![0f32; x.n * t * s];
    let mut dv = vec![0f32; x.n * t * e];
    let items: Vec<_> = dq
        .chunks_mut(t * s)
        .zip(dk.chunks_mut(t * s))
        .zip(dv.chunks_mut(t * e))
        .collect();
    for_each_batch(items, |b, ((dq, dk), dv), par| {
        let dout = |g: usize| grad[(b * t + g * c) * e..].as_ptr();
        // dQ_g = f · dO_g · summary_gᵀ
        x.summaries(b, par, |g, kv| unsafe {
            // SAFETY: dO chunk C × e, kvᵀ e × s, dq chunk C × s.
            matmul(
                (c, s, e),
                dq[g * c * s..].as_mut_ptr(),
                s,
                false,
                (dout(g), e, 1),
                (kv.as_ptr(), 1, e),
                x.factor,
                par.gemm(),
            );
        });
        // D_g = f · Σ over the chunks that see chunk g of Q_lin,hᵀ dO_h; then dK_g = V_g D_gᵀ, dV_g = K_g D_g.
        let mut d = vec![0f32; s * e];
        if !x.causal {
            for h in 0..chunks {
                // SAFETY: Q_lin and dO chunks are C rows of widths s and e.
                unsafe {
                    x.add_xt_y(
                        &mut d,
                        (x.chunk_ptrs(b, h).0, s),
                        (dout(h), e),
                        x.factor,
                        par,
                    )
                };
            }
        }
        for g in (0..chunks).rev() {
            let (q, k, v) = x.chunk_ptrs(b, g);
            // SAFETY: V chunk C × e, Dᵀ e × s, dk chunk C × s; K chunk C × s, D s × e, dv chunk C × e.
            unsafe {
                matmul(
                    (c, s, e),
                    dk[g * c * s..].as_mut_ptr(),
                    s,
                    false,
                    (v, e, 1),
                    (d.as_ptr(), 1, e),
                    1.0,
                    par.gemm(),
                );
                matmul(
                    (c, e, s),
                    dv[g * c * e..].as_mut_ptr(),
                    e,
                    false,
                    (k, s, 1),
                    (d.as_ptr(), e, 1),
                    1.0,
                    par.gemm(),
                );
                if x.causal {
                    x.add_xt_y(&mut d, (q, s), (dout(g), e), x.factor, par);
                }
            }
        }
    });
    (dq, dk, dv)
}

#[derive(Debug)]
struct LinBackward;

impl Backward<Flex, 3> for LinBackward {
    type State = LinInputs;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let x = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let (dq, dk, dv) = lin_backward(&x, slice(&grad));
        let shapes = [
            vec![x.n, x.t, x.s],
            vec![x.n, x.t, x.s],
            vec![x.n, x.t, x.e],
        ];
        for ((parent, data), shape) in ops.parents.iter().zip([dq, dk, dv]).zip(shapes) {
            if let Some(node) = parent {
                grads.register::<Flex>(node.id, flex_from(data, shape));
            }
        }
    }
}

/// The global part of FLASH's mixed chunk attention fused, or `None` off `flex`:
/// `out_g = f · Q_lin,g · Σ_h K_lin,hᵀ V_h` over chunks h < g (causal) or all h (bidirectional).
/// The backward recomputes the running sums instead of storing one per chunk.
///
/// ql, kl: [N, T, s]; v: [N, T, e], T a multiple of `chunk` → [N, T, e].
pub fn chunk_linear_attention(
    ql: &Tensor<3>,
    kl: &Tensor<3>,
    v: &Tensor<3>,
    chunk: usize,
    factor: f32,
    causal: bool,
) -> Option<Tensor<3>> {
    match route(&ql.device()) {
        Route::Reference => None,
        Route::Plain => {
            let p = |t: &Tensor<3>| t.clone().try_into_primitive::<Flex>().ok();
            let x = LinInputs::new(&p(ql)?, &p(kl)?, &p(v)?, chunk, factor, causal);
            let shape = vec![x.n, x.t, x.e];
            Some(Tensor::from_primitive::<Flex>(flex_from(
                lin_forward(&x),
                shape,
            )))
        }
        Route::Autodiff => {
            let p = |t: &Tensor<3>| t.clone().try_into_primitive::<Ad>().ok();
            let (q, k, vv) = (p(ql)?, p(kl)?, p(v)?);
            let x = LinInputs::new(
                q.primitive(),
                k.primitive(),
                vv.primitive(),
                chunk,
                factor,
                causal,
            );
            let output = flex_from(lin_forward(&x), vec![x.n, x.t, x.e]);
            let out = record(LinBackward, [q.node(), k.node(), vv.node()], x, output);
            Some(Tensor::from_primitive::<Ad>(out))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rotary position embedding, with GAU's per-head scale and offset folded in.

/// Rows per parallel task of the rotary kernel.
const ROTARY_ROWS: usize = 256;

/// RoPE tables as host slices: cos and sin, each [T, dim / 2].
#[derive(Clone, Debug)]
pub struct RotaryTables {
    /// cos(p · ω_i), row-major [T, dim / 2].
    pub cos: Arc<Vec<f32>>,
    /// sin(p · ω_i), row-major [T, dim / 2].
    pub sin: Arc<Vec<f32>>,
    /// Number of positions T.
    pub len: usize,
}

#[derive(Clone)]
struct RotSaved {
    input: FlexTensor,
    gamma: Option<Arc<Vec<f32>>>,
    tables: RotaryTables,
}

impl fmt::Debug for RotSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RotSaved({} positions)", self.tables.len)
    }
}

/// `rotate(γ ⊙ x + β)` rows of width `dim`, in place in `out` (which holds x).
fn rotate_rows(
    out: &mut [f32],
    first_row: usize,
    dim: usize,
    affine: Option<(&[f32], &[f32])>,
    tab: &RotaryTables,
) {
    let half = dim / 2;
    for (r, row) in out.chunks_mut(dim).enumerate() {
        let p = (first_row + r) % tab.len;
        if let Some((g, b)) = affine {
            row.iter_mut()
                .zip(g)
                .zip(b)
                .for_each(|((x, g), b)| *x = *x * g + b);
        }
        let (cos, sin) = (
            &tab.cos[p * half..(p + 1) * half],
            &tab.sin[p * half..(p + 1) * half],
        );
        let (x1, x2) = row.split_at_mut(half);
        for i in 0..half {
            let (a, b) = (x1[i], x2[i]);
            x1[i] = a * cos[i] - b * sin[i];
            x2[i] = b * cos[i] + a * sin[i];
        }
    }
}

fn rotate_forward(
    x: &[f32],
    dim: usize,
    affine: Option<(&[f32], &[f32])>,
    tab: &RotaryTables,
) -> Vec<f32> {
    let mut out = x.to_vec();
    out.par_chunks_mut(ROTARY_ROWS * dim)
        .enumerate()
        .for_each(|(c, rows)| rotate_rows(rows, c * ROTARY_ROWS, dim, affine, tab));
    out
}

#[derive(Debug)]
struct RotBackward;

impl<const P: usize> Backward<Flex, P> for RotBackward {
    type State = RotSaved;

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, _: &mut Checkpointer) {
        let saved = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let (x, g) = (slice(&saved.input), slice(&grad));
        let shape = dims(&saved.input);
        let dim = *shape.last().expect("rank ≥ 1");
        let half = dim / 2;
        let tab = &saved.tables;
        let gamma = saved.gamma.as_deref();
        // dY = Rᵀ dOut (the inverse rotation); dX = γ ⊙ dY; dγ = Σ X ⊙ dY; dβ = Σ dY.
        let mut dx = vec![0f32; x.len()];
        let (dgamma, dbeta) = dx
            .par_chunks_mut(ROTARY_ROWS * dim)
            .zip(x.par_chunks(ROTARY_ROWS * dim))
            .zip(g.par_chunks(ROTARY_ROWS * dim))
            .enumerate()
            .map(|(c, ((dx, x), g))| {
                let (mut dgam, mut dbet) = (vec![0f32; dim], vec![0f32; dim]);
                for (r, ((dx, x), g)) in dx
                    .chunks_mut(dim)
                    .zip(x.chunks(dim))
                    .zip(g.chunks(dim))
                    .enumerate()
                {
                    let p = (c * ROTARY_ROWS + r) % tab.len;
                    let (cos, sin) = (
                        &tab.cos[p * half..(p + 1) * half],
                        &tab.sin[p * half..(p + 1) * half],
                    );
                    for i in 0..half {
                        let (d1, d2) = (g[i], g[half + i]);
                        dx[i] = d1 * cos[i] + d2 * sin[i];
                        dx[half + i] = d2 * cos[i] - d1 * sin[i];
                    }
                    if let Some(gamma) = gamma {
                        for i in 0..dim {
                            dgam[i] += x[i] * dx[i];
                            dbet[i] += dx[i];
                            dx[i] *= gamma[i];
                        }
                    }
                }
                (dgam, dbet)
            })
            // Collected in order and summed serially: the same sums in the same order every run
            // (rayon's reduce tree depends on work stealing), so training is reproducible.
            .collect::<Vec<_>>()
            .into_iter()
            .fold(
                (vec![0f32; dim], vec![0f32; dim]),
                |(mut a, mut b), (c, d)| {
                    a.iter_mut().zip(&c).for_each(|(a, c)| *a += c);
                    b.iter_mut().zip(&d).for_each(|(b, d)| *b += d);
                    (a, b)
                },
            );
        let results = [Some(dx), Some(dgamma), Some(dbeta)];
        let shapes = [shape, vec![dim], vec![dim]];
        for ((parent, data), shape) in ops.parents.iter().zip(results).zip(shapes) {
            if let (Some(node), Some(data)) = (parent, data) {
                grads.register::<Flex>(node.id, flex_from(data, shape));
            }
        }
    }
}

fn host_vec(t: &Tensor<1>) -> Vec<f32> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 data")
}

/// Rotary position embedding (FLASH's convention: the two halves of each vector rotate) of
/// `γ ⊙ x + β`, or of `x` without `affine`, fused, or `None` off `flex`.
///
/// x: [.., T, dim] with T = `tables.len`; γ, β: [dim] → [.., T, dim].
pub fn rotary<const D: usize>(
    x: &Tensor<D>,
    affine: Option<(&Tensor<1>, &Tensor<1>)>,
    tables: &RotaryTables,
) -> Option<Tensor<D>> {
    let dims_x = x.dims();
    assert_eq!(
        dims_x[D - 2],
        tables.len,
        "RoPE tables cover {} positions, input has {}",
        tables.len,
        dims_x[D - 2]
    );
    let route = route(&x.device());
    if route == Route::Reference {
        return None;
    }
    let host = affine.map(|(g, b)| (host_vec(g), host_vec(b)));
    let host_ref = host.as_ref().map(|(g, b)| (g.as_slice(), b.as_slice()));
    let dim = dims_x[D - 1];
    match route {
        Route::Plain => {
            let p = contiguous(&x.clone().try_into_primitive::<Flex>().ok()?);
            let out = rotate_forward(slice(&p), dim, host_ref, tables);
            Some(Tensor::from_primitive::<Flex>(flex_from(out, dims(&p))))
        }
        Route::Autodiff => {
            let t = x.clone().try_into_primitive::<Ad>().ok()?;
            let input = contiguous(t.primitive());
            let output = flex_from(
                rotate_forward(slice(&input), dim, host_ref, tables),
                dims(&input),
            );
            let gamma = host.map(|(g, _)| Arc::new(g));
            let saved = RotSaved {
                input,
                gamma,
                tables: tables.clone(),
            };
            let out = match affine {
                Some((g, b)) => {
                    let g = g.clone().try_into_primitive::<Ad>().ok()?;
                    let b = b.clone().try_into_primitive::<Ad>().ok()?;
                    record(RotBackward, [t.node(), g.node(), b.node()], saved, output)
                }
                None => record(RotBackward, [t.node()], saved, output),
            };
            Some(Tensor::from_primitive::<Ad>(out))
        }
        Route::Reference => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Elementwise activations.

/// An activation computed in one pass forward and one backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x · σ(x)` (GAU's projections, FLASH appendix Code 1).
    Silu,
    /// `x · Φ(x)` with the exact normal CDF (burn's `gelu`; Transformer FFNs).
    Gelu,
}

/// `erf(x)` (Abramowitz & Stegun 7.1.26; absolute error below 1.5e-7).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152 + t * 1.061_405_4))));
    let y = 1.0 - poly * fast_exp(-a * a);
    y.copysign(x)
}

impl Activation {
    #[inline(always)]
    fn value(self, x: f32) -> f32 {
        match self {
            Activation::Silu => x / (1.0 + fast_exp(-x)),
            Activation::Gelu => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
        }
    }

    #[inline(always)]
    fn derivative(self, x: f32) -> f32 {
        match self {
            Activation::Silu => {
                let s = 1.0 / (1.0 + fast_exp(-x));
                s * (1.0 + x * (1.0 - s))
            }
            Activation::Gelu => {
                const INV_SQRT_2PI: f32 = 0.398_942_3;
                let cdf = 0.5 * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2));
                cdf + x * INV_SQRT_2PI * fast_exp(-0.5 * x * x)
            }
        }
    }

    /// The same activation as plain burn operations.
    pub fn reference<const D: usize>(self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Activation::Silu => burn::tensor::activation::silu(x),
            Activation::Gelu => burn::tensor::activation::gelu(x),
        }
    }
}

/// Elements per parallel task of the elementwise kernels.
const ELEMENTWISE_CHUNK: usize = 1 << 14;

/// `act(x + bias)` elementwise, the bias broadcast along the last dimension (width `dim`).
fn act_forward(x: &[f32], bias: Option<&[f32]>, dim: usize, act: Activation) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    // Whole rows per task, so that each task's rows line up with the bias.
    let chunk = ELEMENTWISE_CHUNK.div_ceil(dim) * dim;
    out.par_chunks_mut(chunk)
        .zip(x.par_chunks(chunk))
        .for_each(|(o, x)| match bias {
            Some(b) => o.chunks_mut(dim).zip(x.chunks(dim)).for_each(|(o, x)| {
                for ((o, &x), &b) in o.iter_mut().zip(x).zip(b) {
                    *o = act.value(x + b);
                }
            }),
            None => o.iter_mut().zip(x).for_each(|(o, &x)| *o = act.value(x)),
        });
    out
}

#[derive(Clone)]
struct ActSaved {
    input: FlexTensor,
    bias: Option<Arc<Vec<f32>>>,
    act: Activation,
}

impl fmt::Debug for ActSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ActSaved({:?})", self.act)
    }
}

#[derive(Debug)]
struct ActBackward;

impl<const P: usize> Backward<Flex, P> for ActBackward {
    type State = ActSaved;

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, _: &mut Checkpointer) {
        let saved = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let shape = dims(&saved.input);
        let dim = *shape.last().expect("rank ≥ 1");
        let (x, g) = (slice(&saved.input), slice(&grad));
        let (act, bias) = (saved.act, saved.bias.as_deref());
        let chunk = ELEMENTWISE_CHUNK.div_ceil(dim) * dim;
        let mut dx = vec![0f32; x.len()];
        // dpre = g · act'(x + b); dx = dpre; dbias = Σ over rows of dpre.
        let dbias = dx
            .par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk))
            .zip(g.par_chunks(chunk))
            .map(|((o, x), g)| {
                let mut db = vec![0f32; if bias.is_some() { dim } else { 0 }];
                for ((o, x), g) in o.chunks_mut(dim).zip(x.chunks(dim)).zip(g.chunks(dim)) {
                    match bias {
                        Some(b) => {
                            for (i, ((o, &x), &g)) in o.iter_mut().zip(x).zip(g).enumerate() {
                                *o = g * act.derivative(x + b[i]);
                                db[i] += *o;
                            }
                        }
                        None => {
                            for ((o, &x), &g) in o.iter_mut().zip(x).zip(g) {
                                *o = g * act.derivative(x);
                            }
                        }
                    }
                }
                db
            })
            // In order, serially: reproducible sums (see the rotary backward).
            .collect::<Vec<_>>()
            .into_iter()
            .fold(Vec::new(), |mut a, b| {
                if a.is_empty() {
                    return b;
                }
                a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                a
            });
        let results = [Some(dx), bias.map(|_| dbias)];
        let shapes = [shape, vec![dim]];
        for ((parent, data), shape) in ops.parents.iter().zip(results).zip(shapes) {
            if let (Some(node), Some(data)) = (parent, data) {
                grads.register::<Flex>(node.id, flex_from(data, shape));
            }
        }
    }
}

/// `act(x)` elementwise, fused on `flex` (one pass forward, one backward), burn's own elsewhere.
pub fn activation<const D: usize>(x: Tensor<D>, act: Activation) -> Tensor<D> {
    bias_activation(x, None, act)
}

/// `act(x + bias)` with the bias ([d]) broadcast along the last dimension: one pass each way on
/// `flex` (the bias add of a linear layer folded into its activation), burn's own elsewhere.
pub fn bias_activation<const D: usize>(
    x: Tensor<D>,
    bias: Option<Tensor<1>>,
    act: Activation,
) -> Tensor<D> {
    let reference = |x: Tensor<D>, bias: Option<Tensor<1>>| {
        let x = match bias {
            Some(b) => {
                let mut shape = [1usize; D];
                shape[D - 1] = b.dims()[0];
                x + b.reshape(shape)
            }
            None => x,
        };
        act.reference(x)
    };
    let dim = x.dims()[D - 1];
    if let Some(b) = &bias {
        assert_eq!(b.dims()[0], dim, "activation bias width");
    }
    match route(&x.device()) {
        Route::Reference => reference(x, bias),
        Route::Plain => {
            let Ok(p) = x.clone().try_into_primitive::<Flex>() else {
                return reference(x, bias);
            };
            let p = contiguous(&p);
            let host = bias.as_ref().map(host_vec);
            let out = act_forward(slice(&p), host.as_deref(), dim, act);
            Tensor::from_primitive::<Flex>(flex_from(out, dims(&p)))
        }
        Route::Autodiff => {
            let t = x.clone().try_into_primitive::<Ad>();
            let b = bias.clone().map(|b| b.try_into_primitive::<Ad>());
            let (Ok(t), Some(Ok(_)) | None) = (t, &b) else {
                return reference(x, bias);
            };
            let input = contiguous(t.primitive());
            let host = bias.as_ref().map(|b| Arc::new(host_vec(b)));
            let output = flex_from(
                act_forward(
                    slice(&input),
                    host.as_deref().map(|v| v.as_slice()),
                    dim,
                    act,
                ),
                dims(&input),
            );
            let saved = ActSaved {
                input,
                bias: host,
                act,
            };
            let out = match b {
                Some(Ok(b)) => record(ActBackward, [t.node(), b.node()], saved, output),
                Some(Err(_)) => unreachable!("checked above"),
                None => record(ActBackward, [t.node()], saved, output),
            };
            Tensor::from_primitive::<Ad>(out)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Dense matrix products.

/// How a product operand's buffer holds the [rows, cols] matrix it stands for.
#[derive(Clone, Copy)]
enum Stored {
    /// Row-major [rows, cols].
    AsIs,
    /// Row-major [cols, rows]: the operand is that buffer transposed, read through its strides.
    Transposed,
}

/// `A · B` for A [m, k] and B [k, n], each held as `Stored` says, multi-threaded: row-major [m, n].
fn product(
    (a, a_stored): (&[f32], Stored),
    (b, b_stored): (&[f32], Stored),
    (m, k, n): (usize, usize, usize),
) -> Vec<f32> {
    assert_eq!((a.len(), b.len()), (m * k, k * n), "product operand sizes");
    // (row stride, column stride) of a [rows, cols] operand.
    let strides = |stored, rows: usize, cols: usize| match stored {
        Stored::AsIs => (cols, 1),
        Stored::Transposed => (1, rows),
    };
    let ((a_rs, a_cs), (b_rs, b_cs)) = (strides(a_stored, m, k), strides(b_stored, k, n));
    let mut c = vec![0f32; m * n];
    // SAFETY: a holds m × k and b k × n elements (checked), which either layout's strides stay
    // inside; c holds m × n, row-major.
    unsafe {
        matmul(
            (m, n, k),
            c.as_mut_ptr(),
            n,
            false,
            (a.as_ptr(), a_rs, a_cs),
            (b.as_ptr(), b_rs, b_cs),
            1.0,
            Parallelism::Rayon(0),
        );
    }
    c
}

#[derive(Clone)]
struct ProductSaved {
    a: FlexTensor,
    b: FlexTensor,
}

impl fmt::Debug for ProductSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProductSaved({:?} · {:?})", dims(&self.a), dims(&self.b))
    }
}

#[derive(Debug)]
struct ProductBackward;

impl Backward<Flex, 2> for ProductBackward {
    type State = ProductSaved;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let ProductSaved { a, b } = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let (m, k, n) = (dims(&a)[0], dims(&a)[1], dims(&b)[1]);
        let (a, b, g) = (slice(&a), slice(&b), slice(&grad));
        let [a_node, b_node] = &ops.parents;
        if let Some(node) = a_node {
            // dA = dC · Bᵀ: [m, n] · [n, k].
            let da = product((g, Stored::AsIs), (b, Stored::Transposed), (m, n, k));
            grads.register::<Flex>(node.id, flex_from(da, vec![m, k]));
        }
        if let Some(node) = b_node {
            // dB = Aᵀ · dC: [k, m] · [m, n].
            let db = product((a, Stored::Transposed), (g, Stored::AsIs), (k, m, n));
            grads.register::<Flex>(node.id, flex_from(db, vec![k, n]));
        }
    }
}

/// `A · B` for A [m, k] and B [k, n] → [m, n], with gemm called directly on `flex` (forward and
/// both backward products), burn's `matmul` elsewhere.
///
/// flex's own `matmul` reaches about 60 GFLOP/s on the shapes of the models' dense layers
/// ([8192, 256] · [256, 1364], forward + backward) where the same gemm calls reach about 200:
/// every projection, feed-forward layer and the LM head goes through here.
pub fn matmul_2d(a: Tensor<2>, b: Tensor<2>) -> Tensor<2> {
    let ([m, k], [k2, n]) = (a.dims(), b.dims());
    assert_eq!(k, k2, "matmul_2d: [{m}, {k}] · [{k2}, {n}]");
    match route(&a.device()) {
        Route::Reference => a.matmul(b),
        Route::Plain => {
            let (Ok(pa), Ok(pb)) = (
                a.clone().try_into_primitive::<Flex>(),
                b.clone().try_into_primitive::<Flex>(),
            ) else {
                return a.matmul(b);
            };
            let (pa, pb) = (contiguous(&pa), contiguous(&pb));
            let c = product(
                (slice(&pa), Stored::AsIs),
                (slice(&pb), Stored::AsIs),
                (m, k, n),
            );
            Tensor::from_primitive::<Flex>(flex_from(c, vec![m, n]))
        }
        Route::Autodiff => {
            let (Ok(ta), Ok(tb)) = (
                a.clone().try_into_primitive::<Ad>(),
                b.clone().try_into_primitive::<Ad>(),
            ) else {
                return a.matmul(b);
            };
            let (pa, pb) = (contiguous(ta.primitive()), contiguous(tb.primitive()));
            let c = product(
                (slice(&pa), Stored::AsIs),
                (slice(&pb), Stored::AsIs),
                (m, k, n),
            );
            let out = record(
                ProductBackward,
                [ta.node(), tb.node()],
                ProductSaved { a: pa, b: pb },
                flex_from(c, vec![m, n]),
            );
            Tensor::from_primitive::<Ad>(out)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy.

/// Per-row `logsumexp(x) − x[target]` and the log-sum-exps.
fn ce_forward(logits: &[f32], v: usize, targets: &[i64]) -> (Vec<f32>, Vec<f32>) {
    let rows: Vec<(f32, f32)> = logits
        .par_chunks(v)
        .zip(targets.par_iter())
        .map(|(row, &t)| {
            let m = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            let l: f32 = row.iter().map(|&x| fast_exp(x - m)).sum();
            let lse = m + l.ln();
            (lse - row[t as usize], lse)
        })
        .collect();
    rows.into_iter().unzip()
}

#[derive(Clone)]
struct CeSaved {
    logits: FlexTensor,
    lse: Arc<Vec<f32>>,
    targets: Arc<Vec<i64>>,
}

impl fmt::Debug for CeSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CeSaved({} rows)", self.targets.len())
    }
}

#[derive(Debug)]
struct CeBackward;

impl Backward<Flex, 1> for CeBackward {
    type State = CeSaved;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let saved = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let Some(node) = &ops.parents[0] else {
            return;
        };
        let g = slice(&grad);
        let logits = slice(&saved.logits);
        let n = saved.targets.len();
        let v = logits.len() / n.max(1);
        let mut out = vec![0f32; logits.len()];
        out.par_chunks_mut(v)
            .zip(logits.par_chunks(v))
            .enumerate()
            .for_each(|(r, (o, x))| {
                let (l, gr) = (saved.lse[r], g[r]);
                o.iter_mut()
                    .zip(x)
                    .for_each(|(o, &x)| *o = gr * fast_exp(x - l));
                o[saved.targets[r] as usize] -= gr;
            });
        grads.register::<Flex>(node.id, flex_from(out, vec![n, v]));
    }
}

/// Per-row cross-entropy `−log softmax(logits)[target]` fused (see the module doc), or `None` off
/// `flex`. logits: [N, V]; targets: [N] in `0..V` → [N].
pub fn cross_entropy_rows(logits: &Tensor<2>, targets: &Tensor<1, Int>) -> Option<Tensor<1>> {
    let route = route(&logits.device());
    if route == Route::Reference {
        return None;
    }
    let [n, v] = logits.dims();
    let targets: Vec<i64> = targets
        .clone()
        .into_data()
        .convert::<i64>()
        .try_into_vec::<i64>()
        .ok()?;
    if let Some(bad) = targets.iter().find(|&&t| t < 0 || t as usize >= v) {
        panic!("cross-entropy target {bad} outside the vocabulary 0..{v}");
    }
    match route {
        Route::Plain => {
            let x = contiguous(&logits.clone().try_into_primitive::<Flex>().ok()?);
            let (loss, _) = ce_forward(slice(&x), v, &targets);
            Some(Tensor::from_primitive::<Flex>(flex_from(loss, vec![n])))
        }
        Route::Autodiff => {
            let x = logits.clone().try_into_primitive::<Ad>().ok()?;
            let prim = contiguous(x.primitive());
            let (loss, lse) = ce_forward(slice(&prim), v, &targets);
            let output = flex_from(loss, vec![n]);
            let out = record(
                CeBackward,
                [x.node()],
                CeSaved {
                    logits: prim,
                    lse: Arc::new(lse),
                    targets: Arc::new(targets),
                },
                output,
            );
            Some(Tensor::from_primitive::<Ad>(out))
        }
        Route::Reference => None,
    }
}

/// Sets flush-to-zero and denormals-are-zero (MXCSR bits 15 and 6) on the calling thread and on
/// every thread of rayon's global pool, where flex, gemm and these kernels compute. As training
/// sharpens attention, exp-based attention (softmax, FAVOR+) produces probabilities and gradient
/// products below f32's smallest normal (1.2e-38), and x86 computes on such denormals at a small
/// fraction of normal speed: without this, softmax Transformers' steps slowed by up to 2.2× over
/// 40 training steps while relu² models stayed flat. XLA's CPU runtime (the JAX anchor) and
/// PyTorch's `set_flush_denormal` make the same trade; values below 1.2e-38 become 0. No-op off
/// x86-64.
pub fn flush_denormals() {
    #[cfg(target_arch = "x86_64")]
    fn set() {
        #[allow(deprecated)]
        // SAFETY: sets only the FTZ and DAZ flags of this thread's MXCSR; SSE is part of x86-64.
        unsafe {
            use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
            _mm_setcsr(_mm_getcsr() | 0x8040);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    fn set() {}
    set();
    rayon::broadcast(|_| set());
}

/// mimalloc's `mi_option_purge_delay`: its index in `mi_option_e` of mimalloc v3's
/// `include/mimalloc.h`, the version libmimalloc-sys 0.1.49 builds (pinned in the workspace, since
/// the sys crate exports no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Stops mimalloc (the global allocator, see lib.rs) from returning freed memory to the OS. By
/// default it decommits memory freed 10 ms ago, and the next large tensor pays its page faults
/// again: FLASH's training step at 8192 tokens took 6.0 s instead of 4.1. The process keeps its
/// peak footprint instead, as XLA's buffer allocator does.
pub fn keep_freed_memory() {
    // SAFETY: sets one integer option of the allocator; −1 is a documented value ("no purging").
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
}
