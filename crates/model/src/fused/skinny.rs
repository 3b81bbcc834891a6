//! Products with few rows: `C += A · B` for A [m, k] with m ≤ [`SKINNY_MAX_ROWS`] and B [k, n]
//! row-major, the shape of every projection in a decoding step (one row per sequence of the
//! batch, against a weight matrix read once).
//!
//! gemm packs B into its own layout on every call, a pass over all of B (read and write) before the
//! product proper, which at few rows is most of the work. Here B is read in place, once per call
//! (T5's decoding steps, whose weights stay the same from step to step, pack them once instead:
//! [`packed`](super::packed), which reads B faster than the blocks below):
//!
//! - one row (m = 1, batch-1 decoding): each thread streams a contiguous range of columns of B's
//!   rows, four rows at a time, onto its range of C's row (in L1): sequential reads the hardware
//!   prefetchers follow; with AVX-512 likewise up to `STREAM_ROWS_MAX` rows, each vector of B
//!   applied to every row of C;
//! - more rows: each thread takes ranges of `PANELS_PER_TASK` panels of 32 (AVX-512) or 16 (AVX2)
//!   columns; per block of `KC` rows of B, panel after panel, the rows of A go through in groups
//!   of up to `MR`, each group's [MR, panel] tile of C held in registers across the block and
//!   updated with one fused multiply-add per element of the tile per row of B.
//!
//! Why blocks of so few rows: a panel's consecutive rows are a whole row of B apart, a stride the
//! hardware prefetchers do not follow. With `KC` = 16 the block's rows are 16 pages read forward
//! panel after panel, few enough streams for the L2 streamer to track and run ahead on, so the
//! products read B at close to the bandwidth of a plain sequential read; with 128 rows per block
//! they read it at half of that. The first group's pass also prefetches `PREFETCH_ROWS` rows
//! ahead in software and copies the block into a contiguous buffer that the later groups read
//! (rows of B a power-of-two stride apart share a few L1 sets); A's block is copied once per block
//! into [KC, m] order, so that a tile's broadcasts at one depth are adjacent floats.
//!
//! Each task accumulates into a copy of its columns of C whose rows are padded apart
//! ([`C_PAD`]): C's own rows are a multiple of 4 KiB apart at the T5 widths, and a row group's
//! loads of its tile right after the group above stored its own, at the same offset within a
//! page, waited on those stores (4K aliasing), which held 16 and 32 rows to about half the
//! machine's product rate even with B in cache.
//!
//! At the scalar level the product stays with gemm. Columns past the last whole panel are done by
//! a plain loop. `cargo run --release -p model --example skinny_bench` times both against each
//! other at T5-XXL's decoding shapes, each call on another copy of B so that B comes from memory
//! as in a decoding step (`SK_COPIES=6`); on a 2-core Zen 4 EPYC (AVX-512, gemm's 2048³ product
//! at 213 GFLOP/s; GFLOP/s, gemm → here): the 4096 × 10240 feed-forward 8.2 → 14.6 at 1 row,
//! 57 → 99 at 8, 126 → 155–160 at 32; the 4096 × 32128 LM head 8.1 → 16.3, 70 → 93, 141 → 160–165
//! (B read at 29–33 GB/s at one row, 23–26 at 8); with `REPRO_SIMD=avx2` at 32 rows 126 → 133
//! and 142 → 142.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use rayon::prelude::*;

use super::simd::SimdLevel;

/// Rows of A up to which a product takes this kernel instead of gemm.
pub const SKINNY_MAX_ROWS: usize = 32;

/// Rows of A per register tile with AVX-512 (the tile is MR × 2 vector registers: 16 of its 32
/// registers accumulate).
const MR: usize = 8;

/// Rows of A per register tile with AVX2, whose 16 registers hold 6 × 2 accumulators, the block
/// row's two vectors and a broadcast (8 rows would spill accumulators to the stack).
const MR_AVX2: usize = 6;

/// Rows of B per block (see the module's docs): a block of one AVX-512 panel is 16 × 32 floats,
/// 2 KiB; `skinny_bench` with B from memory, 8 rows: 16 rows per block 80–108 GFLOP/s, 32 rows
/// 45–110 (the 40 KiB row stride of the feed-forward the slowest), 128 rows 45–55.
const KC: usize = 16;

/// Rows of B ahead that the first group's pass prefetches.
const PREFETCH_ROWS: usize = 32;

/// Panels per parallel task (a task is a contiguous range of columns): 32 AVX-512 panels are 4
/// KiB of each row of B, a page, which a block's pass reads forward from start to end.
const PANELS_PER_TASK: usize = 32;

/// A raw pointer to C shared by the tasks, each of which writes only its own columns.
#[derive(Clone, Copy)]
pub(super) struct SharedC(pub(super) *mut f32);
// SAFETY: tasks write disjoint columns of C (see `skinny_product_acc` and
// `packed::packed_product_acc`).
unsafe impl Send for SharedC {}
unsafe impl Sync for SharedC {}

impl SharedC {
    /// The pointer (a method, so that a closure captures the whole `SharedC`, not its field).
    pub(super) fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// Whether a product of `m` rows runs here at `level` (else with gemm).
pub fn takes(level: SimdLevel, m: usize) -> bool {
    (1..=SKINNY_MAX_ROWS).contains(&m) && level != SimdLevel::Scalar && level.supported()
}

/// `c += a · b` for a [m, k], b [k, n] and c [m, n], all row-major, at `level`; returns `false`
/// (c untouched) where the level has no kernel here (the scalar level) or m is out of range, so
/// the caller uses gemm.
pub fn skinny_product_acc(
    level: SimdLevel,
    c: &mut [f32],
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
) -> bool {
    assert_eq!(
        (a.len(), b.len(), c.len()),
        (m * k, k * n, m * n),
        "skinny product operand sizes"
    );
    if !takes(level, m) {
        return false;
    }
    let streamed_rows = match level {
        SimdLevel::Avx512 => STREAM_ROWS_MAX,
        _ => 1,
    };
    if m <= streamed_rows {
        rows_stream(level, c, a, b, (m, k, n));
        return true;
    }
    let (tiles, panel) = tiles_of(level);
    let whole = n / panel * panel;
    let task = panel * PANELS_PER_TASK;
    let shared = SharedC(c.as_mut_ptr());
    (0..whole.div_ceil(task)).into_par_iter().for_each(|t| {
        let (j0, j1) = (t * task, ((t + 1) * task).min(whole));
        // SAFETY: this task writes only columns j0..j1 of C, which no other task writes; a, b and
        // c hold m × k, k × n and m × n floats (checked), and j1 ≤ n.
        unsafe {
            columns(
                shared.ptr(),
                a.as_ptr(),
                b.as_ptr(),
                (m, k, n),
                (j0, j1),
                (panel, tiles),
            );
        }
    });
    // The columns past the last whole panel.
    plain_columns(c, a, (&b[whole..], n), (m, k, n), whole);
    true
}

/// A level's tiles (1.. rows each) and the columns one tile covers (two of its vectors).
pub(super) fn tiles_of(level: SimdLevel) -> (&'static [Tile], usize) {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => (&TILES_AVX512, 32),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => (&TILES_AVX2, 16),
        _ => unreachable!("no tile kernel at this level"),
    }
}

/// `c[:, from..n] += a · B'` by plain loops, for the columns past a kernel's last whole panel:
/// B' row t is `b[t · stride ..][.. n − from]` (B in place: `b` at column `from`, stride n; a
/// packed tail: stride n − from).
pub(super) fn plain_columns(
    c: &mut [f32],
    a: &[f32],
    (b, stride): (&[f32], usize),
    (m, k, n): (usize, usize, usize),
    from: usize,
) {
    let w = n - from;
    if w == 0 {
        return;
    }
    for i in 0..m {
        for t in 0..k {
            let x = a[i * k + t];
            let row = &b[t * stride..t * stride + w];
            for (d, &v) in c[i * n + from..(i + 1) * n].iter_mut().zip(row) {
                *d += x * v;
            }
        }
    }
}

/// Rows up to which AVX-512 streams B's rows for all of C's rows at once ([`rows_stream`]):
/// at 2–4 rows it reads B about twice as fast as the register tiles (`skinny_bench`: the XXL
/// feed-forward at 4 rows 38 → 64 GFLOP/s), at 8 rows no faster, its C updates then dominating.
const STREAM_ROWS_MAX: usize = 4;

/// `c += a · b` for the few rows the level streams (1..=`STREAM_ROWS_MAX` with AVX-512, one with
/// AVX2): each thread streams contiguous runs of B's rows (a range of columns) and updates every row
/// of C's range from each, that range of C held in L1.
fn rows_stream(
    level: SimdLevel,
    c: &mut [f32],
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
) {
    let tasks = rayon::current_num_threads().max(1) * ROW_STREAM_TASKS_PER_THREAD;
    let width = n.div_ceil(tasks).next_multiple_of(16).max(16);
    let shared = SharedC(c.as_mut_ptr());
    (0..n.div_ceil(width)).into_par_iter().for_each(|t| {
        let (j0, j1) = (t * width, ((t + 1) * width).min(n));
        // SAFETY: this task writes columns j0..j1 of C's m rows only; a is m × k, b k × n.
        unsafe {
            let (c, b) = (shared.ptr().add(j0), b.as_ptr().add(j0));
            let a = a.as_ptr();
            let w = j1 - j0;
            match (level, m) {
                #[cfg(target_arch = "x86_64")]
                (SimdLevel::Avx512, 1) => rows_avx512::<1, 4>(c, a, b, (k, n), w),
                #[cfg(target_arch = "x86_64")]
                (SimdLevel::Avx512, 2) => rows_avx512::<2, 4>(c, a, b, (k, n), w),
                #[cfg(target_arch = "x86_64")]
                (SimdLevel::Avx512, 3) => rows_avx512::<3, 4>(c, a, b, (k, n), w),
                #[cfg(target_arch = "x86_64")]
                (SimdLevel::Avx512, 4) => rows_avx512::<4, 4>(c, a, b, (k, n), w),
                #[cfg(target_arch = "x86_64")]
                (SimdLevel::Avx2, 1) => row_avx2(
                    std::slice::from_raw_parts_mut(c, w),
                    std::slice::from_raw_parts(a, k),
                    b,
                    (k, n),
                ),
                _ => unreachable!("rows_stream takes the rows its level streams"),
            }
        }
    });
}

/// Columns 0..w of `c += a · b` for R rows, c and b at the range's first column (row stride n), a
/// R × k: KU rows of B at a time, each 16-column vector of them applied to all R rows of C (R × KU
/// broadcasts of A held in registers across the range).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn rows_avx512<const R: usize, const KU: usize>(
    c: *mut f32,
    a: *const f32,
    b: *const f32,
    (k, n): (usize, usize),
    w: usize,
) {
    let whole = w / 16 * 16;
    // SAFETY (the whole body): rows < R of A and C, rows < k of B, columns < w of the range.
    unsafe {
        let mut kk = 0;
        while kk + KU <= k {
            let x: [[__m512; KU]; R] = std::array::from_fn(|r| {
                std::array::from_fn(|u| _mm512_set1_ps(*a.add(r * k + kk + u)))
            });
            let rows: [*const f32; KU] = std::array::from_fn(|u| b.add((kk + u) * n));
            for j in (0..whole).step_by(16) {
                let bv: [__m512; KU] = std::array::from_fn(|u| _mm512_loadu_ps(rows[u].add(j)));
                for (r, xr) in x.iter().enumerate() {
                    let p = c.add(r * n + j);
                    let mut acc = _mm512_loadu_ps(p);
                    for (xu, bu) in xr.iter().zip(&bv) {
                        acc = _mm512_fmadd_ps(*xu, *bu, acc);
                    }
                    _mm512_storeu_ps(p, acc);
                }
            }
            kk += KU;
        }
        while kk < k {
            let row = b.add(kk * n);
            for j in (0..whole).step_by(16) {
                let bv = _mm512_loadu_ps(row.add(j));
                for r in 0..R {
                    let p = c.add(r * n + j);
                    let x = _mm512_set1_ps(*a.add(r * k + kk));
                    _mm512_storeu_ps(p, _mm512_fmadd_ps(x, bv, _mm512_loadu_ps(p)));
                }
            }
            kk += 1;
        }
        for r in 0..R {
            for kk in 0..k {
                let x = *a.add(r * k + kk);
                for j in whole..w {
                    *c.add(r * n + j) += x * *b.add(kk * n + j);
                }
            }
        }
    }
}

/// Column ranges per thread of [`rows_stream`].
const ROW_STREAM_TASKS_PER_THREAD: usize = 2;

/// `out += Σ_k a[k] · B[k, range]` with `b` at the range's first column of row 0 (row stride n),
/// four rows of B at a time, AVX2 + FMA; the last partial vector by a plain loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_avx2(out: &mut [f32], a: &[f32], b: *const f32, (k, n): (usize, usize)) {
    let w = out.len();
    let whole = w / 8 * 8;
    let o = out.as_mut_ptr();
    let mut kk = 0;
    // SAFETY: rows kk..kk + 4 ≤ k of B at columns < w of the range; out holds w floats.
    unsafe {
        while kk + 4 <= k {
            let (x0, x1, x2, x3) = (
                _mm256_set1_ps(a[kk]),
                _mm256_set1_ps(a[kk + 1]),
                _mm256_set1_ps(a[kk + 2]),
                _mm256_set1_ps(a[kk + 3]),
            );
            let r0 = b.add(kk * n);
            let (r1, r2, r3) = (r0.add(n), r0.add(2 * n), r0.add(3 * n));
            for j in (0..whole).step_by(8) {
                let mut acc = _mm256_loadu_ps(o.add(j));
                acc = _mm256_fmadd_ps(x0, _mm256_loadu_ps(r0.add(j)), acc);
                acc = _mm256_fmadd_ps(x1, _mm256_loadu_ps(r1.add(j)), acc);
                acc = _mm256_fmadd_ps(x2, _mm256_loadu_ps(r2.add(j)), acc);
                acc = _mm256_fmadd_ps(x3, _mm256_loadu_ps(r3.add(j)), acc);
                _mm256_storeu_ps(o.add(j), acc);
            }
            kk += 4;
        }
        while kk < k {
            let x = _mm256_set1_ps(a[kk]);
            let r = b.add(kk * n);
            for j in (0..whole).step_by(8) {
                let acc = _mm256_fmadd_ps(x, _mm256_loadu_ps(r.add(j)), _mm256_loadu_ps(o.add(j)));
                _mm256_storeu_ps(o.add(j), acc);
            }
            kk += 1;
        }
        for (kk, &x) in a.iter().enumerate() {
            for j in whole..w {
                *o.add(j) += x * *b.add(kk * n + j);
            }
        }
    }
}

/// Where a tile reads its block of B, and what it does with it beside the product.
#[derive(Clone, Copy)]
pub(super) enum Block {
    /// From B in place (row stride n), prefetching `PREFETCH_ROWS` ahead and copying each row of
    /// the block into `pack` (a [KC, panel] buffer) for the row groups after it.
    First { pack: *mut f32 },
    /// From B as given (at its row stride), prefetching `PREFETCH_ROWS` ahead if `prefetch`: the
    /// block's only pass here (no copy needed), and every pass of [`packed`](super::packed)
    /// over its packed panels (the first row group's prefetching).
    AsGiven { prefetch: bool },
    /// From the packed copy the first group wrote (row stride = the panel's width).
    Packed { pack: *const f32 },
}

/// A kernel of one [R, 2 vectors] tile of C over a block of B (see [`tile_avx512`]): (C, its row
/// stride), (A's block in [depth, rows] order, its stride), (B, its row stride), the block's
/// depth, where it reads B.
pub(super) type Tile =
    unsafe fn((*mut f32, usize), (*const f32, usize), (*const f32, usize), usize, Block);

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

/// Columns j0..j1 (whole panels of `panel` columns) of `c += a · b`: per block of `KC` rows of B
/// and per panel, the rows of A in groups of up to the level's tile height (`MR`, `MR_AVX2`),
/// each through its level's tile (the first group prefetching the block), summed into a copy of
/// the task's columns of C with padded rows.
///
/// # Safety
/// a, b and c hold m × k, k × n and m × n floats, j1 ≤ n, and `tiles` are the running CPU's.
unsafe fn columns(
    c: *mut f32,
    a: *const f32,
    b: *const f32,
    (m, k, n): (usize, usize, usize),
    (j0, j1): (usize, usize),
    (panel, tiles): (usize, &[Tile]),
) {
    // The block's copy for the row groups after the first: contiguous, so that its rows do not
    // share the few L1 sets that rows a power-of-two stride apart in B map to.
    let mut pack = [0f32; KC * 32];
    let pack = pack.as_mut_ptr();
    // The block of A, [KC, m] (a row of A's block per column), so that a tile's broadcasts of
    // its rows at one depth are adjacent floats instead of floats a whole row of A apart.
    let mut a_block = [0f32; KC * SKINNY_MAX_ROWS];
    // The task's columns of C, copied to rows `cs` floats apart (see [`C_PAD`]) for the blocks
    // and back at the end.
    let w = j1 - j0;
    let cs = w + C_PAD;
    let mut local = vec![0f32; m * cs];
    for i in 0..m {
        // SAFETY: row i < m of C, columns j0..j1 ≤ n.
        let row = unsafe { std::slice::from_raw_parts(c.add(i * n + j0), w) };
        local[i * cs..i * cs + w].copy_from_slice(row);
    }
    let cl = local.as_mut_ptr();
    for k0 in (0..k).step_by(KC) {
        let k1 = (k0 + KC).min(k);
        for t in 0..k1 - k0 {
            for i in 0..m {
                // SAFETY: row i < m, column k0 + t < k of A.
                a_block[t * m + i] = unsafe { *a.add(i * k + k0 + t) };
            }
        }
        for j in (j0..j1).step_by(panel) {
            let mut i0 = 0;
            while i0 < m {
                let rows = (m - i0).min(tiles.len());
                let block = match (i0, m <= tiles.len()) {
                    (0, true) => Block::AsGiven { prefetch: true },
                    (0, false) => Block::First { pack },
                    _ => Block::Packed { pack },
                };
                // SAFETY: rows i0..i0 + rows of A and of the local C (columns j − j0 .. + panel
                // ≤ w), rows k0..k1 and the panel's columns of B; the pack holds KC rows of a
                // panel of at most 32 columns.
                unsafe {
                    let a = (a_block.as_ptr().add(i0), m);
                    let b = (b.add(k0 * n + j), n);
                    let c = (cl.add(i0 * cs + j - j0), cs);
                    tiles[rows - 1](c, a, b, k1 - k0, block);
                }
                i0 += rows;
            }
        }
    }
    for i in 0..m {
        // SAFETY: as above; this task alone writes these columns of C.
        let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * n + j0), w) };
        row.copy_from_slice(&local[i * cs..i * cs + w]);
    }
}

/// Floats past a row of the task's local C: rows `w + C_PAD` floats apart, not the multiple of
/// 4 KiB that C's own rows are at the T5 widths (4096, 10240, 32128 floats: 16, 40, 125.5 KiB),
/// where a row group's loads of its C tile right after the previous group's stores to the rows
/// above, at the same offset within a page, wait on those stores (4K aliasing): on Zen 4 the
/// 16- and 32-row products ran at 0.6–0.8× the 8-row one per FLOP.
const C_PAD: usize = 16;

/// The tile kernel of one SIMD level: `$tile::<R>`, one [R, panel] tile of C (row stride n) plus a
/// block of rows of A ([depth, m] order, `a` at the tile's first row) times the same rows of B's
/// panel (row stride n), the block read as its [`Block`] says; and `$pass::<R, PREFETCH>`, the pass
/// over a block whose row t is at `src + t · stride`, prefetching `PREFETCH_ROWS` rows ahead if
/// `PREFETCH` and copying each row into `pack` if given. A panel is two vectors of `$lanes`
/// floats. One macro for both levels, so that they differ only in their intrinsics.
macro_rules! tile_kernel {
    ($tile:ident, $pass:ident, $feature:literal, $lanes:literal,
     $zero:ident, $load:ident, $store:ident, $set1:ident, $fma:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        #[inline]
        unsafe fn $tile<const R: usize>(
            (c, n): (*mut f32, usize),
            a: (*const f32, usize),
            b: (*const f32, usize),
            depth: usize,
            block: Block,
        ) {
            const PANEL: usize = 2 * $lanes;
            // SAFETY: the caller's ranges (see `columns`); the pack holds the block's rows.
            unsafe {
                match block {
                    Block::AsGiven { prefetch: true } => $pass::<R, true>(c, n, a, b, depth, None),
                    Block::AsGiven { prefetch: false } => {
                        $pass::<R, false>(c, n, a, b, depth, None)
                    }
                    Block::First { pack } => $pass::<R, true>(c, n, a, b, depth, Some(pack)),
                    Block::Packed { pack } => {
                        $pass::<R, false>(c, n, a, (pack, PANEL), depth, None)
                    }
                }
            }
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        #[inline]
        unsafe fn $pass<const R: usize, const PREFETCH: bool>(
            c: *mut f32,
            n: usize,
            (a, a_stride): (*const f32, usize),
            (src, stride): (*const f32, usize),
            depth: usize,
            pack: Option<*mut f32>,
        ) {
            const PANEL: usize = 2 * $lanes;
            // SAFETY (the whole body): the caller's ranges; the prefetch address may pass B's end,
            // which a prefetch does not fault on (it is computed with wrapping arithmetic).
            unsafe {
                let mut acc = [[$zero(); 2]; R];
                for (r, row) in acc.iter_mut().enumerate() {
                    row[0] = $load(c.add(r * n));
                    row[1] = $load(c.add(r * n + $lanes));
                }
                for t in 0..depth {
                    let bp = src.add(t * stride);
                    if PREFETCH {
                        // Every 64-byte line of the panel's row PREFETCH_ROWS ahead.
                        let ahead = bp.wrapping_add(PREFETCH_ROWS * stride) as *const i8;
                        for line in 0..PANEL * 4 / 64 {
                            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line));
                        }
                    }
                    let b0 = $load(bp);
                    let b1 = $load(bp.add($lanes));
                    if let Some(pack) = pack {
                        let p = pack.add(t * PANEL);
                        $store(p, b0);
                        $store(p.add($lanes), b1);
                    }
                    for (r, row) in acc.iter_mut().enumerate() {
                        let x = $set1(*a.add(t * a_stride + r));
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

tile_kernel!(
    tile_avx512,
    pass_avx512,
    "avx512f",
    16,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps
);
tile_kernel!(
    tile_avx2,
    pass_avx2,
    "avx2,fma",
    8,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps
);

#[cfg(test)]
mod tests {
    use super::super::product_test_support::check_against_formula;
    use super::*;

    /// At every SIMD level with a kernel, over row counts on both sides of each level's tile
    /// height and of the streamed rows, depths on both sides of a block, and widths with and
    /// without a partial panel, within one task's columns and across several: `c + a · b` equals
    /// the formula, the accumulated c included.
    #[test]
    fn skinny_products_equal_the_formula() {
        let levels: Vec<SimdLevel> = SimdLevel::supported_levels()
            .into_iter()
            .filter(|&l| takes(l, 1))
            .collect();
        for level in levels {
            check_against_formula(
                level.name(),
                (
                    &[1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17, 32],
                    &[1, 5, 130, 300],
                    &[1, 15, 16, 17, 33, 100, 513, 2100],
                ),
                |c, a, b, shape| skinny_product_acc(level, c, a, b, shape),
            );
        }
    }

    /// Rows beyond the limit, and the scalar level, are left to gemm (c untouched).
    #[test]
    fn out_of_range_products_are_refused() {
        let (m, k, n) = (SKINNY_MAX_ROWS + 1, 3, 4);
        let (a, b) = (vec![1.0; m * k], vec![1.0; k * n]);
        let mut c = vec![0.0; m * n];
        assert!(!skinny_product_acc(
            SimdLevel::best(),
            &mut c,
            &a,
            &b,
            (m, k, n)
        ));
        assert!(!skinny_product_acc(
            SimdLevel::Scalar,
            &mut c[..n],
            &a[..k],
            &b,
            (1, k, n)
        ));
        assert!(c.iter().all(|&x| x == 0.0));
    }
}
