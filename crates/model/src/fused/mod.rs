//! Fused CPU kernels with hand-written backward passes, for burn's `flex` backend.
//!
//! A plain burn graph materialises every intermediate of attention and of the loss: the [N, T, S]
//! scores, their scaled, biased, masked and normalised copies, and one autodiff record per step,
//! each a full pass over memory. XLA fuses those chains; to compare architectures fairly against the
//! JAX anchor (`experiments/anchors/`) every architecture gets the same treatment here, one file per kernel with its backward pass:
//!
//! - [`attention`]: `score(Q Kᵀ · scale + bias) V` for score ∈ {softmax, relu²}, optionally causal
//!   ([`attention_grouped`]: K/V heads shared by groups of query heads, read in place, a bias table
//!   per head and a key mask per sequence: T5 with GQA; [`attention_grouped_dropout`]: with
//!   dropout on the weights, its mask a hash the backward regenerates, [`DropoutMask`]),
//!   computed in blocks of query rows (the block's scores live in one reused buffer, as in
//!   FlashAttention); up to a memory limit the forward keeps each block for the backward (relu²
//!   its scores, the same bits as recomputing them; softmax its probabilities, equal to rounding),
//!   which then skips `Q Kᵀ`, and beyond it the backward recomputes them; causal blocks stop at
//!   the diagonal.
//! - [`chunk_linear_attention`]: the global part of mixed chunk attention, parallel over
//!   (sequence, chunk), causal products known to be zero skipped, the per-chunk sums kept for the
//!   backward;
//! - [`rotary`]: RoPE, with GAU's per-head scale and offset folded in, one pass each way;
//! - [`split_heads`] / [`merge_heads`]: a projection's [B, T, H·dh] into heads [B·H, T, dh] (with
//!   RoPE folded in) and back, one parallel pass each way (burn copies on one thread);
//! - [`dropout`]: dropout on an activation with a hashed mask, one pass each way;
//! - [`activation`]: SiLU and GELU in one pass each way (burn records four to six ops for each);
//! - [`gated_activation`]: `act(x + b) ⊙ gate`, GAU's gate with U's SiLU folded in and the GLU
//!   feed-forward from one product, one parallel pass each way;
//! - [`linear_cross_entropy`]: the LM head (tied, or untied: [`linear_head_cross_entropy`]) and its
//!   loss in blocks of rows, the gradients
//!   computed in the forward, never holding the [N, V] logits;
//! - [`matmul_2d`]: dense products (projections, feed-forward layers, the LM head) with gemm
//!   called directly, forward and backward; [`affine_2d`] the same with a linear layer's bias added
//!   inside the product (gemm accumulates onto the bias rows; its gradient a parallel column sum);
//!   a product of at most [`skinny::SKINNY_MAX_ROWS`] rows runs in [`skinny`], which reads the
//!   weights in place instead of packing them; a decoding step's products run against weights
//!   packed once per decoding run ([`PackedWeight`], [`packed`]), read as one sequential stream;
//! - [`layer_norm`]: LayerNorm, one pass each way (burn's autodiff records nine ops for it);
//!   [`rms_norm`] the same without centring (T5);
//! - [`cross_entropy_rows`]: `logsumexp(x) − x[target]` per row, whose gradient is
//!   `softmax(x) − onehot(target)`: one pass forward, one backward;
//! - [`adafactor_step`]: the optimizer's update of one parameter in three parallel passes
//!   (burn-optim's `Adafactor` is the reference).
//!
//! Each returns `None` when the tensors do not live on `flex` (plain, or autodiff without gradient
//! checkpointing); callers then use the plain burn reference in `attention.rs` / `lm.rs`, which the
//! tests compare these kernels against (outputs and gradients, odd lengths). `REPRO_KERNELS=reference`
//! forces the reference everywhere (for benchmarks of the two).

use std::fmt;
use std::sync::Arc;

use burn::backend::autodiff::NodeId;
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

/// Query rows per block of the attention kernels (causal attention over short keys and values
/// uses smaller blocks: `attention::row_block`): the block's scores are `ROW_BLOCK × S` floats
/// (4 MB at S = 8192).
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

thread_local! {
    /// Set inside [`with_reference`].
    static REFERENCE_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every fused kernel called from this thread taking the plain burn reference, as
/// `REPRO_KERNELS=reference` does for the whole process: for tests that compare a whole model's
/// outputs and gradients on both paths.
pub fn with_reference<R>(f: impl FnOnce() -> R) -> R {
    // Restored on unwinding too, as `with_kept_scores_limit` does.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            REFERENCE_HERE.set(self.0);
        }
    }
    let _restore = Restore(REFERENCE_HERE.replace(true));
    f()
}

fn route(device: &Device) -> Route {
    if forced_reference() || REFERENCE_HERE.get() {
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

/// Registers a fused op's gradients, one per input in the op's input order: each computed
/// gradient (row-major data, shape) for its parent's node. Untracked parents and gradients not
/// computed (`None`) register nothing. `parents`: `ops.parents` as node ids.
fn register_grads(
    grads: &mut Gradients,
    parents: impl IntoIterator<Item = Option<NodeId>>,
    results: impl IntoIterator<Item = (Option<Vec<f32>>, Vec<usize>)>,
) {
    for (id, (data, shape)) in parents.into_iter().zip(results) {
        if let (Some(id), Some(data)) = (id, data) {
            grads.register::<Flex>(id, flex_from(data, shape));
        }
    }
}

/// `n` zeros written by the thread pool. The allocator (mimalloc, which keeps freed memory) hands
/// back reused blocks, so `vec![0f32; n]` memsets them on the calling thread while the other cores
/// wait for the parallel pass that follows: on a 2-core Xeon, `perf` put 3% of a FLASH step's
/// samples in such serial memsets (activations, attention, norms, their backward outputs).
/// Below `ZEROS_SERIAL_MAX` elements the plain memset is cheaper than a fork-join.
fn zeros(n: usize) -> Vec<f32> {
    const ZEROS_SERIAL_MAX: usize = 1 << 16;
    const ZEROS_CHUNK: usize = 1 << 16;
    if n <= ZEROS_SERIAL_MAX {
        return vec![0f32; n];
    }
    let mut v: Vec<f32> = Vec::with_capacity(n);
    v.spare_capacity_mut()[..n]
        .par_chunks_mut(ZEROS_CHUNK)
        .for_each(|c| c.fill(std::mem::MaybeUninit::new(0.0)));
    // SAFETY: the first n elements (within the capacity) were all written just above.
    unsafe { v.set_len(n) };
    v
}

/// `Σ partials` elementwise (each `len` long), added one after another in the given order from
/// zeros: the backward passes sum their parallel tasks' partial parameter gradients this way, the
/// same sums in the same order every run (rayon's reduce tree depends on work stealing), so that
/// training is reproducible.
fn sum_in_order(partials: impl IntoIterator<Item = Vec<f32>>, len: usize) -> Vec<f32> {
    let mut sum = vec![0f32; len];
    for p in partials {
        sum.iter_mut().zip(&p).for_each(|(a, b)| *a += b);
    }
    sum
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

/// A 1-D tensor's values on the host, as f32.
fn host_vec(t: &Tensor<1>) -> Vec<f32> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 data")
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

/// `dst` ← `src`ᵀ: `src` row-major [rows, cols], `dst` row-major [cols, rows] (resized to fit).
///
/// Why: gemm runs a product whose right operand B [k, n] is stored k-contiguous (a row-major
/// matrix read transposed, as in `Q Kᵀ` or `dO Vᵀ`) far below its speed for an n-contiguous B when
/// the product has few rows — the attention kernels' blocks of [`ROW_BLOCK`] query rows. Measured
/// on a Zen 4 EPYC (`gemm_layouts` example), for `[128, 512] · [512, 8192]`: 115 against 197
/// GFLOP/s on two threads, 59 against 93 on one; for FLASH's chunk `[128, 512] · [512, 256]`, 61
/// against 111 on one thread. Transposing the operand once per batch element (its size is the
/// product's `k · n`, read once, against the product's `m · k · n` multiply-adds) recovers it.
fn transpose_into(src: &[f32], (rows, cols): (usize, usize), dst: &mut Vec<f32>, par: Threads) {
    dst.resize(rows * cols, 0.0);
    transpose(src, (rows, cols), dst, par);
}

/// `dst` ← `src`ᵀ into a destination of exactly `rows × cols` floats (see [`transpose_into`]).
fn transpose(src: &[f32], (rows, cols): (usize, usize), dst: &mut [f32], par: Threads) {
    /// Destination rows (source columns) per task.
    const BAND: usize = 32;
    assert!(src.len() >= rows * cols, "transpose source size");
    assert_eq!(dst.len(), rows * cols, "transpose destination size");
    if rows == 0 || cols == 0 {
        return;
    }
    let level = simd::current();
    // One band of BAND destination rows (source columns c0 ..) at a time, in 8 × 8 squares read
    // row by row and written column by column (2.0 Gfloat/s for a 256 × 512 chunk of V on a
    // Zen 4 EPYC, against 0.8 for element-wise strided reads); the ragged edges element-wise.
    let band = |(bi, out): (usize, &mut [f32])| {
        let c0 = bi * BAND;
        let width = out.len() / rows;
        level.run(
            #[inline(always)]
            || {
                let (full_r, full_c) = (rows - rows % 8, width - width % 8);
                for r in (0..full_r).step_by(8) {
                    for c in (0..full_c).step_by(8) {
                        let mut square = [[0f32; 8]; 8];
                        for (i, row) in square.iter_mut().enumerate() {
                            let at = (r + i) * cols + c0 + c;
                            row.copy_from_slice(&src[at..at + 8]);
                        }
                        for (j, at) in (0..8).map(|j| (j, (c + j) * rows + r)) {
                            let out_row: &mut [f32; 8] =
                                (&mut out[at..at + 8]).try_into().expect("eight");
                            for (i, o) in out_row.iter_mut().enumerate() {
                                *o = square[i][j];
                            }
                        }
                    }
                }
                // Columns past the last full square, and the rows past the last full square of
                // the others.
                for dc in 0..width {
                    let first_r = if dc < full_c { full_r } else { 0 };
                    for r in first_r..rows {
                        out[dc * rows + r] = src[r * cols + c0 + dc];
                    }
                }
            },
        )
    };
    match par {
        Threads::PerBatch => dst.chunks_mut(BAND * rows).enumerate().for_each(band),
        Threads::Within => dst.par_chunks_mut(BAND * rows).enumerate().for_each(band),
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

mod activation;
mod adafactor;
mod attention;
mod chunk_linear;
mod cross_entropy;
mod dropout;
mod gate;
mod heads;
mod linear_ce;
mod norm;
pub mod packed;
mod product;
pub mod profile;
mod rotary;
pub mod simd;
pub mod skinny;

pub use activation::{Activation, activation, bias_activation, erf};
pub use adafactor::{Adafactor, AdafactorSettings, Moments, adafactor_step};
pub use attention::{
    AttentionSpec, BiasTable, DEFAULT_KEPT_SCORES_LIMIT, KEYS_IN_PLACE_MAX_ROWS, SHORT_ROW_BLOCK,
    SHORT_ROW_BLOCK_MAX_FLOATS, ScoreBias, ScoreFn, attention, attention_grouped,
    attention_grouped_dropout, attention_grouped_prefix, kept_scores_limit, row_block,
    with_kept_scores_limit,
};
pub use chunk_linear::chunk_linear_attention;
pub use cross_entropy::cross_entropy_rows;
pub use dropout::{DropoutMask, dropout};
pub use gate::{Gate, gated_activation};
pub use heads::{merge_heads, split_heads};
pub use linear_ce::{
    HEAD_BLOCK_BYTES, HeadLayout, linear_cross_entropy, linear_cross_entropy_in_blocks,
    linear_head_cross_entropy,
};
pub use norm::{layer_norm, rms_norm};
pub use packed::PackedWeight;
pub use product::{affine_2d, matmul_2d};
pub use rotary::{RotaryTables, rotary};

/// What the few-row product kernels' tests share: reproducible operands and the formula.
#[cfg(test)]
mod product_test_support {
    /// A reproducible value in [-0.5, 0.5) from an index and a salt.
    pub fn value(i: usize, salt: usize) -> f32 {
        let h = (i as u64 ^ (salt as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_mul(0xD1B5_4A32_D192_ED03);
        ((h >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    /// `c + a · b` summed in f64, row-major, the formula written out.
    pub fn reference(
        c: &[f32],
        a: &[f32],
        b: &[f32],
        (m, k, n): (usize, usize, usize),
    ) -> Vec<f32> {
        let mut out = c.to_vec();
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (0..k)
                    .map(|t| a[i * k + t] as f64 * b[t * n + j] as f64)
                    .sum();
                out[i * n + j] = (c[i * n + j] as f64 + dot) as f32;
            }
        }
        out
    }

    /// For every (m, k, n) of the grids, `product(c, a, b, (m, k, n))` on reproducible operands
    /// (it returns whether it ran) equals `c + a · b` summed in f64, within a tolerance growing
    /// with √k; `what` names the kernel and level in a failure.
    pub fn check_against_formula(
        what: &str,
        (ms, ks, ns): (&[usize], &[usize], &[usize]),
        product: impl Fn(&mut [f32], &[f32], &[f32], (usize, usize, usize)) -> bool,
    ) {
        for &m in ms {
            for &k in ks {
                for &n in ns {
                    let a: Vec<f32> = (0..m * k).map(|i| value(i, 1)).collect();
                    let b: Vec<f32> = (0..k * n).map(|i| value(i, 2)).collect();
                    let c0: Vec<f32> = (0..m * n).map(|i| value(i, 3)).collect();
                    let mut c = c0.clone();
                    assert!(product(&mut c, &a, &b, (m, k, n)), "{what}: refused");
                    let want = reference(&c0, &a, &b, (m, k, n));
                    for (idx, (got, want)) in c.iter().zip(&want).enumerate() {
                        let tol = 1e-5 * (1.0 + k as f32).sqrt() * 4.0;
                        assert!(
                            (got - want).abs() <= tol,
                            "{what} m {m} k {k} n {n} at {idx}: {got} against {want}"
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Threads, simd, transpose_into, zeros};

    #[test]
    fn zeros_are_zero_over_reused_memory_at_every_length() {
        // Lengths around the serial limit and the task chunk (2^16), one not a multiple of it;
        // each allocation first freed full of NaN, so that a block the allocator hands back
        // dirty and a chunk the tasks skip would show.
        for n in [0, 1, 1 << 16, (1 << 16) + 1, 3 * (1 << 16) + 17, 1 << 20] {
            drop(vec![f32::NAN; n]);
            let z = zeros(n);
            assert_eq!(z.len(), n);
            assert!(z.iter().all(|&v| v.to_bits() == 0), "length {n}");
        }
    }

    #[test]
    fn transpose_into_matches_the_definition() {
        // Shapes with and without ragged 8 × 8 squares and bands, under both thread modes and
        // at every SIMD level; the destination starts with the wrong size and stale values.
        for level in simd::SimdLevel::supported_levels() {
            simd::with_level(level, || {
                for (rows, cols) in [(1, 1), (8, 8), (13, 70), (256, 512), (293, 3579), (64, 3)] {
                    let src: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5 - 7.0).collect();
                    for par in [Threads::PerBatch, Threads::Within] {
                        let mut dst = vec![1.0; 5];
                        transpose_into(&src, (rows, cols), &mut dst, par);
                        assert_eq!(dst.len(), rows * cols);
                        for r in 0..rows {
                            for c in 0..cols {
                                assert_eq!(
                                    dst[c * rows + r].to_bits(),
                                    src[r * cols + c].to_bits(),
                                    "{rows}x{cols} ({r}, {c}) {par:?} {}",
                                    level.name()
                                );
                            }
                        }
                    }
                }
            });
        }
    }
}
