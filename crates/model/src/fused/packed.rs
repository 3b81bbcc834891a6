//! Products of few rows against a weight matrix packed once: `C += A · B` for A [m, k] and a B
//! [k, n] that does not change between calls (a decoding step's projections and LM head).
//!
//! [`skinny`](super::skinny) reads B where it lies, row-major: a panel of B's columns has its
//! consecutive rows a whole row of B apart, a stride the hardware prefetchers do not follow, so it
//! reads B in blocks of 16 rows and updates C's tile once per block. Packing B once into
//! [`PANEL`]-column panels, each panel's rows contiguous ([n / PANEL][k][PANEL]), turns every
//! task's read of B into a few sequential streams: a tile of C stays in registers over a chunk of
//! [`KC`] rows (its loads and stores of C, and their 4K aliasing, once per chunk), and the first
//! row group's pass prefetches ahead, which the later groups then find in L1/L2. The tiles are
//! the in-place kernel's, reading the packed rows at the panel's stride.
//! The price is a copy of B (one pass over it, and its memory) per packing, paid once per
//! decoding run (`T5Model::decoding_weights`), not per step.
//!
//! The sums run in the same order as [`skinny`](super::skinny)'s (depth after depth onto C's
//! value), so at the same level both give the same bits.
//!
//! `cargo run --release -p model --example skinny_bench` times this beside the in-place kernel and
//! gemm at T5-XXL's decoding shapes (`SK_COPIES=6`: B from memory, as in a decoding step); on a
//! 2-core Zen 4 EPYC (AVX-512; GFLOP/s, in place → packed): the 4096 × 10240 feed-forward 13.7 →
//! 16.9 at 1 row, 91 → 130 at 8 (B read at 22.7 → 32.6 GB/s, the machine's read bandwidth), 156
//! → 190 at 32 (gemm's large products: about 205); the 4096 × 32128 LM head 79 → 131 at 8 and
//! 156 → 190 at 32.

use std::fmt;
use std::sync::Arc;

use burn::backend::Flex;
use burn::prelude::*;
use rayon::prelude::*;

use super::simd::SimdLevel;
// The in-place kernel's tiles, reading the packed panels' rows as given, and its plain loops.
use super::skinny::{Block, SharedC, plain_columns, tiles_of};
use super::{Route, contiguous, flex_from, profile, route, simd, slice};

/// Columns per packed panel: two AVX-512 vectors (an AVX2 tile takes its two halves in turn).
pub const PANEL: usize = 32;

/// Rows of B per chunk: a panel's chunk is 32 KiB, which the row groups after the first read from
/// L1/L2; C's tile is loaded and stored once per chunk.
const KC: usize = 256;

/// Panels per parallel task: 4 panels of the XXL attention projection give 32 tasks over 2
/// threads, few enough for each to stream long runs of B and enough to balance the threads.
const PANELS_PER_TASK: usize = 4;

/// A [k, n] matrix packed for [`packed_product_acc`]: the whole panels' columns as
/// [n / PANEL][k][PANEL], the last `n % PANEL` columns row-major [k, n % PANEL].
pub struct PackedMatrix {
    k: usize,
    n: usize,
    panels: Vec<f32>,
    tail: Vec<f32>,
}

impl fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PackedMatrix[{}, {}]", self.k, self.n)
    }
}

impl PackedMatrix {
    /// Packs a row-major [k, n] matrix, panels in parallel.
    pub fn pack(b: &[f32], (k, n): (usize, usize)) -> Self {
        assert_eq!(b.len(), k * n, "packed matrix size");
        let whole = n / PANEL;
        let mut panels = vec![0f32; whole * k * PANEL];
        if k > 0 {
            panels
                .par_chunks_mut(k * PANEL)
                .enumerate()
                .for_each(|(p, panel)| {
                    for (t, row) in panel.chunks_mut(PANEL).enumerate() {
                        row.copy_from_slice(&b[t * n + p * PANEL..t * n + (p + 1) * PANEL]);
                    }
                });
        }
        let tail_width = n - whole * PANEL;
        let tail = (0..k)
            .flat_map(|t| b[t * n + whole * PANEL..(t + 1) * n].iter().copied())
            .collect();
        debug_assert_eq!(tail_width * k, b.len() - panels.len());
        Self { k, n, panels, tail }
    }

    /// [k, n].
    pub fn dims(&self) -> [usize; 2] {
        [self.k, self.n]
    }
}

/// Whether `level` has a packed kernel (the scalar level leaves products to gemm).
pub fn has_kernel(level: SimdLevel) -> bool {
    level != SimdLevel::Scalar && level.supported()
}

/// `c += a · b` for a [m, k] and c [m, n] row-major and b packed, at `level`; returns `false` (c
/// untouched) where the level has no kernel (the scalar level), so the caller uses gemm.
pub fn packed_product_acc(
    level: SimdLevel,
    c: &mut [f32],
    a: &[f32],
    b: &PackedMatrix,
    m: usize,
) -> bool {
    let (k, n) = (b.k, b.n);
    assert_eq!(
        (a.len(), c.len()),
        (m * k, m * n),
        "packed product operand sizes"
    );
    if !has_kernel(level) {
        return false;
    }
    let whole = n / PANEL;
    // Aᵀ [k, m], once for all tasks: a tile's broadcasts at one depth are adjacent floats.
    let mut at = vec![0f32; k * m];
    for (i, row) in a.chunks(k.max(1)).enumerate().take(m) {
        for (t, &x) in row.iter().enumerate() {
            at[t * m + i] = x;
        }
    }
    let shared = SharedC(c.as_mut_ptr());
    (0..whole.div_ceil(PANELS_PER_TASK))
        .into_par_iter()
        .for_each(|t| {
            let panels = t * PANELS_PER_TASK..((t + 1) * PANELS_PER_TASK).min(whole);
            // SAFETY: this task writes only its panels' columns of C, which no other task writes;
            // C is m × n (checked), Aᵀ k × m, the panels are whole panels of b.
            unsafe { panels_task(level, shared.ptr(), &at, b, m, panels) };
        });
    // The columns past the last whole panel.
    let from = whole * PANEL;
    plain_columns(c, a, (&b.tail, n - from), (m, k, n), from);
    true
}

/// One task's whole panels of `c += a · b` given Aᵀ (`at`, [k, m]): per panel, per chunk of `KC`
/// rows and per vector-pair of its columns (one with AVX-512, two with AVX2), the rows of A in
/// groups of the level's tile height, through the in-place kernel's tiles reading the packed rows
/// as given ([`Block::AsGiven`]), the first group prefetching.
///
/// # Safety
/// c points at m × b.n floats that no other task writes in these panels' columns; at is b.k × m.
unsafe fn panels_task(
    level: SimdLevel,
    c: *mut f32,
    at: &[f32],
    b: &PackedMatrix,
    m: usize,
    panels: std::ops::Range<usize>,
) {
    let (k, n) = (b.k, b.n);
    let (tiles, width) = tiles_of(level);
    for p in panels {
        for k0 in (0..k).step_by(KC) {
            let depth = KC.min(k - k0);
            for j in (0..PANEL).step_by(width) {
                let mut i0 = 0;
                while i0 < m {
                    let rows = (m - i0).min(tiles.len());
                    // SAFETY: rows i0..i0 + rows of A and of C, the chunk's packed rows of panel p
                    // at columns j..j + width (row stride PANEL), C's columns p · PANEL + j.. of
                    // this task's panels.
                    unsafe {
                        let bp = b.panels.as_ptr().add((p * k + k0) * PANEL + j);
                        tiles[rows - 1](
                            (c.add(i0 * n + p * PANEL + j), n),
                            (at.as_ptr().add(k0 * m + i0), m),
                            (bp, PANEL),
                            depth,
                            Block::AsGiven { prefetch: i0 == 0 },
                        );
                    }
                    i0 += rows;
                }
            }
        }
    }
}

/// A weight matrix [d_in, d_out] (burn's `Linear` layout) with, where the fused kernels run
/// (plain `flex`), a copy packed for few-row products: what a decoding step multiplies by. The
/// tensor itself is kept (reference-counted, not copied) for every other case.
#[derive(Clone)]
pub struct PackedWeight {
    weight: Tensor<2>,
    packed: Option<Arc<PackedMatrix>>,
}

impl fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [k, n] = self.weight.dims();
        let how = if self.packed.is_some() {
            "packed"
        } else {
            "as is"
        };
        write!(f, "PackedWeight[{k}, {n}] ({how})")
    }
}

impl PackedWeight {
    /// `weight` [k, n], packed when it lives on plain `flex` (autodiff tensors, other backends and
    /// `REPRO_KERNELS=reference` keep the tensor only).
    pub fn new(weight: Tensor<2>) -> Self {
        let packed = match route(&weight.device()) {
            Route::Plain => weight.clone().try_into_primitive::<Flex>().ok().map(|p| {
                let p = contiguous(&p);
                Arc::new(PackedMatrix::pack(slice(&p), p_dims(&p)))
            }),
            Route::Autodiff | Route::Reference => None,
        };
        Self { weight, packed }
    }

    /// Whether the packed copy exists (plain `flex`).
    pub fn is_packed(&self) -> bool {
        self.packed.is_some()
    }

    /// The weight tensor.
    pub fn weight(&self) -> &Tensor<2> {
        &self.weight
    }

    /// `x · W`: [m, k] → [m, n], through [`packed_product_acc`] when packed, `x` is on plain `flex`
    /// and the SIMD level has a kernel, else [`matmul_2d`](super::matmul_2d) on the tensor.
    pub fn matmul(&self, x: Tensor<2>) -> Tensor<2> {
        let level = simd::current();
        let plain = match (&self.packed, route(&x.device())) {
            (Some(packed), Route::Plain) if has_kernel(level) => Some(packed),
            _ => None,
        };
        let (Some(packed), Ok(px)) = (plain, x.clone().try_into_primitive::<Flex>()) else {
            return super::matmul_2d(x, self.weight.clone());
        };
        let _timer = profile::Timer::start(profile::Part::Products);
        let [m, k] = x.dims();
        let [k2, n] = packed.dims();
        assert_eq!(k, k2, "packed matmul: [{m}, {k}] · [{k2}, {n}]");
        let px = contiguous(&px);
        let mut c = vec![0f32; m * n];
        packed_product_acc(level, &mut c, slice(&px), packed, m);
        Tensor::from_primitive::<Flex>(flex_from(c, vec![m, n]))
    }
}

/// A 2-D flex tensor's (rows, cols).
fn p_dims(t: &burn::backend::flex::FlexTensor) -> (usize, usize) {
    let d = super::dims(t);
    (d[0], d[1])
}

#[cfg(test)]
mod tests {
    use super::super::product_test_support::{check_against_formula, value};
    use super::*;

    /// At every SIMD level with a kernel, over row counts on both sides of each level's tile
    /// height, depths on both sides of a chunk, and widths with and without a partial panel,
    /// within one task's panels and across several: `c + a · b` equals the formula, the
    /// accumulated c included.
    #[test]
    fn packed_products_equal_the_formula() {
        let levels: Vec<SimdLevel> = SimdLevel::supported_levels()
            .into_iter()
            .filter(|&l| has_kernel(l))
            .collect();
        for level in levels {
            check_against_formula(
                level.name(),
                (
                    &[1, 2, 5, 6, 7, 8, 9, 13, 17, 32, 40],
                    &[1, 5, 255, 256, 257, 600],
                    &[1, 31, 32, 33, 100, 160, 513],
                ),
                |c, a, b, (m, k, n)| {
                    packed_product_acc(level, c, a, &PackedMatrix::pack(b, (k, n)), m)
                },
            );
        }
    }

    /// At the same level, the packed and the in-place kernel sum in the same order: the same bits.
    #[test]
    fn packed_and_in_place_products_give_the_same_bits() {
        use super::super::skinny::{skinny_product_acc, takes};
        for level in SimdLevel::supported_levels() {
            for (m, k, n) in [(1, 300, 96), (4, 517, 64), (8, 40, 320), (13, 1000, 160)] {
                if !has_kernel(level) || !takes(level, m) {
                    continue;
                }
                let a: Vec<f32> = (0..m * k).map(|i| value(i, 4)).collect();
                let b: Vec<f32> = (0..k * n).map(|i| value(i, 5)).collect();
                let (mut c1, mut c2) = (vec![0f32; m * n], vec![0f32; m * n]);
                assert!(skinny_product_acc(level, &mut c1, &a, &b, (m, k, n)));
                let packed = PackedMatrix::pack(&b, (k, n));
                assert!(packed_product_acc(level, &mut c2, &a, &packed, m));
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&c1), bits(&c2), "{} m {m} k {k} n {n}", level.name());
            }
        }
    }

    /// The scalar level is left to gemm (c untouched).
    #[test]
    fn the_scalar_level_is_refused() {
        let (m, k, n) = (2, 3, 40);
        let packed = PackedMatrix::pack(&vec![1.0; k * n], (k, n));
        let mut c = vec![0.0; m * n];
        assert!(!packed_product_acc(
            SimdLevel::Scalar,
            &mut c,
            &vec![1.0; m * k],
            &packed,
            m
        ));
        assert!(c.iter().all(|&x| x == 0.0));
    }
}
