//! Products of few rows against a weight matrix packed once: `C += A · B` for A [m, k] and a B
//! [k, n] that does not change between calls (a decoding step's projections and LM head).
//!
//! [`skinny`](super::skinny) reads B where it lies, row-major: a panel of B's columns has its
//! consecutive rows a whole row of B apart, a stride the hardware prefetchers do not follow, so it
//! reads B in blocks of 16 rows and updates C's tile once per block. Packing B once into
//! [`PANEL`]-column panels, each panel's rows contiguous ([n / PANEL][k][PANEL]), turns every
//! task's read of B into one sequential stream: a tile of C stays in registers over a chunk of
//! [`KC`] rows (its loads and stores of C, and their 4K aliasing, once per chunk), and the first
//! row group's pass prefetches `PREFETCH_ROWS` ahead, which the later groups then find in L1/L2.
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

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::fmt;
use std::sync::Arc;

use burn::backend::Flex;
use burn::prelude::*;
use rayon::prelude::*;

use super::simd::SimdLevel;
// The tile heights are the in-place kernel's: the same register budget.
use super::skinny::{MR, MR_AVX2, SharedC};
use super::{Route, contiguous, flex_from, profile, route, simd, slice};

/// Columns per packed panel: two AVX-512 vectors (an AVX2 tile takes its two halves in turn).
pub const PANEL: usize = 32;

/// Rows of B per chunk: a panel's chunk is 32 KiB, which the row groups after the first read from
/// L1/L2; C's tile is loaded and stored once per chunk.
const KC: usize = 256;

/// Panels per parallel task: 4 panels of the XXL attention projection give 32 tasks over 2
/// threads, few enough for each to stream long runs of B and enough to balance the threads.
const PANELS_PER_TASK: usize = 4;

/// Packed rows ahead that the first row group prefetches (4 KiB of the panel).
const PREFETCH_ROWS: usize = 32;

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
    let shared = SharedC(c.as_mut_ptr());
    (0..whole.div_ceil(PANELS_PER_TASK))
        .into_par_iter()
        .for_each(|t| {
            let panels = t * PANELS_PER_TASK..((t + 1) * PANELS_PER_TASK).min(whole);
            for p in panels {
                // SAFETY: this task writes only panel p's columns of C, which no other task
                // writes; a holds m × k floats, the panel k × PANEL, C m × n with p's columns < n.
                unsafe {
                    panel(
                        level,
                        shared.ptr().add(p * PANEL),
                        a.as_ptr(),
                        b.panels.as_ptr().add(p * k * PANEL),
                        (m, k, n),
                    )
                };
            }
        });
    // The columns past the last whole panel.
    let w = n - whole * PANEL;
    if w > 0 {
        for i in 0..m {
            for t in 0..k {
                let x = a[i * k + t];
                let row = &b.tail[t * w..(t + 1) * w];
                for (d, &v) in c[i * n + whole * PANEL..(i + 1) * n].iter_mut().zip(row) {
                    *d += x * v;
                }
            }
        }
    }
    true
}

/// One panel: `c` at the panel's first column (row stride n), `b` at the packed panel. Per chunk
/// of `KC` rows and per vector-pair of columns (one with AVX-512, two with AVX2), the rows of A in
/// groups of the level's tile height, the first group prefetching.
///
/// # Safety
/// a holds m × k floats, b the packed panel (k × PANEL), c m rows of n with PANEL columns from c.
unsafe fn panel(
    level: SimdLevel,
    c: *mut f32,
    a: *const f32,
    b: *const f32,
    (m, k, n): (usize, usize, usize),
) {
    let (tiles, width): (&[Tile], usize) = match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => (&TILES_AVX512, 32),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => (&TILES_AVX2, 16),
        _ => unreachable!("no packed kernel at this level"),
    };
    for k0 in (0..k).step_by(KC) {
        let depth = KC.min(k - k0);
        for j in (0..PANEL).step_by(width) {
            let mut i0 = 0;
            while i0 < m {
                let rows = (m - i0).min(tiles.len());
                // SAFETY: rows i0..i0 + rows of A and C, the chunk's rows of the panel, columns
                // j..j + width of the panel (the caller's ranges).
                unsafe {
                    tiles[rows - 1](
                        (c.add(i0 * n + j), n),
                        (a.add(i0 * k + k0), k),
                        b.add(k0 * PANEL + j),
                        depth,
                        i0 == 0 && j == 0,
                    );
                }
                i0 += rows;
            }
        }
    }
}

/// A tile kernel: (C at the tile, its row stride), (A at the tile's first row and the chunk's first
/// column, A's row stride), B at the chunk's first packed row and the tile's first column, the
/// chunk's depth, whether to prefetch the panel ahead.
type Tile = unsafe fn((*mut f32, usize), (*const f32, usize), *const f32, usize, bool);

/// The AVX-512 tiles of 1..=MR rows.
#[cfg(target_arch = "x86_64")]
const TILES_AVX512: [Tile; MR] = [
    tile_avx512::<1>,
    tile_avx512::<2>,
    tile_avx512::<3>,
    tile_avx512::<4>,
    tile_avx512::<5>,
    tile_avx512::<6>,
    tile_avx512::<7>,
    tile_avx512::<8>,
];

/// The AVX2 tiles of 1..=MR_AVX2 rows.
#[cfg(target_arch = "x86_64")]
const TILES_AVX2: [Tile; MR_AVX2] = [
    tile_avx2::<1>,
    tile_avx2::<2>,
    tile_avx2::<3>,
    tile_avx2::<4>,
    tile_avx2::<5>,
    tile_avx2::<6>,
];

/// `$tile::<R>`: an [R, 2 · `$lanes`] tile of C held in registers over a chunk of packed rows
/// (row stride [`PANEL`]), one fused multiply-add per element of the tile per row. One macro for
/// both levels, so that they differ only in their intrinsics.
macro_rules! packed_tile {
    ($tile:ident, $feature:literal, $lanes:literal,
     $zero:ident, $load:ident, $store:ident, $set1:ident, $fma:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        unsafe fn $tile<const R: usize>(
            (c, n): (*mut f32, usize),
            (a, k): (*const f32, usize),
            b: *const f32,
            depth: usize,
            prefetch: bool,
        ) {
            // SAFETY (the whole body): the caller's ranges; the prefetch address may pass the
            // panel's end, which a prefetch does not fault on (computed with wrapping arithmetic).
            unsafe {
                let mut acc = [[$zero(); 2]; R];
                for (r, row) in acc.iter_mut().enumerate() {
                    row[0] = $load(c.add(r * n));
                    row[1] = $load(c.add(r * n + $lanes));
                }
                for t in 0..depth {
                    let bp = b.add(t * PANEL);
                    if prefetch {
                        // Both 64-byte lines of the packed row PREFETCH_ROWS ahead.
                        let ahead = bp.wrapping_add(PREFETCH_ROWS * PANEL) as *const i8;
                        _mm_prefetch::<_MM_HINT_T0>(ahead);
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
                    }
                    let b0 = $load(bp);
                    let b1 = $load(bp.add($lanes));
                    for (r, row) in acc.iter_mut().enumerate() {
                        let x = $set1(*a.add(r * k + t));
                        row[0] = $fma(x, b0, row[0]);
                        row[1] = $fma(x, b1, row[1]);
                    }
                }
                for (r, row) in acc.iter().enumerate() {
                    $store(c.add(r * n), row[0]);
                    $store(c.add(r * n + $lanes), row[1]);
                }
            }
        }
    };
}

packed_tile!(
    tile_avx512,
    "avx512f",
    16,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps
);
packed_tile!(
    tile_avx2,
    "avx2,fma",
    8,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps
);

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
    use super::super::product_test_support::{reference, value};
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
            for m in [1, 2, 5, 6, 7, 8, 9, 13, 17, 32, 40] {
                for k in [1, 5, 255, 256, 257, 600] {
                    for n in [1, 31, 32, 33, 100, 160, 513] {
                        let a: Vec<f32> = (0..m * k).map(|i| value(i, 1)).collect();
                        let b: Vec<f32> = (0..k * n).map(|i| value(i, 2)).collect();
                        let c0: Vec<f32> = (0..m * n).map(|i| value(i, 3)).collect();
                        let mut c = c0.clone();
                        let packed = PackedMatrix::pack(&b, (k, n));
                        assert!(packed_product_acc(level, &mut c, &a, &packed, m));
                        let want = reference(&c0, &a, &b, (m, k, n));
                        for (idx, (got, want)) in c.iter().zip(&want).enumerate() {
                            let tol = 1e-5 * (1.0 + k as f32).sqrt() * 4.0;
                            assert!(
                                (got - want).abs() <= tol,
                                "{} m {m} k {k} n {n} at {idx}: {got} against {want}",
                                level.name()
                            );
                        }
                    }
                }
            }
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
