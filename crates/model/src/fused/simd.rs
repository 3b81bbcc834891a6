//! The instruction set the fused kernels' hot loops run at, chosen once at run time.
//!
//! The workspace compiles for baseline x86-64 (SSE2: 4 floats per instruction), since results and CI
//! run on machines of different kinds and `target-cpu=native` would tie a binary to one. The kernels'
//! inner loops are plain Rust written so that LLVM vectorises them (branch-free bodies, `fast_exp`,
//! reductions split over independent lanes); [`SimdLevel::run`] compiles such a loop a second and
//! third time with AVX2+FMA (8 floats) and AVX-512 (16 floats) enabled, through `pulp` — the crate
//! gemm already uses for the same job — and calls the widest version this CPU supports. gemm picks
//! its own kernels the same way, so products and elementwise work use the same width.
//!
//! `REPRO_SIMD=scalar|avx2|avx512` overrides the choice (for benchmarks and for tests of each
//! level); asking for a level the CPU lacks falls back to the best it has, with a warning.

use std::cell::Cell;
use std::sync::OnceLock;

/// An instruction-set level of the fused kernels' hot loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdLevel {
    /// The baseline build: SSE2 on x86-64, whatever the target allows elsewhere.
    Scalar,
    /// x86-64-v3: AVX2 and FMA (8 floats per instruction).
    Avx2,
    /// x86-64-v4: AVX-512 F/BW/CD/DQ/VL (16 floats per instruction).
    Avx512,
}

impl SimdLevel {
    /// The level's name, as `REPRO_SIMD` spells it.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the level.
    pub fn supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => pulp::x86::V3::try_new().is_some(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => pulp::x86::V4::try_new().is_some(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every level this CPU can run, narrowest first (what the per-level tests iterate over).
    pub fn supported_levels() -> Vec<SimdLevel> {
        [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512]
            .into_iter()
            .filter(|l| l.supported())
            .collect()
    }

    /// The widest level this CPU supports.
    pub fn best() -> SimdLevel {
        *Self::supported_levels()
            .last()
            .expect("scalar is always supported")
    }

    /// The level the kernels use: `REPRO_SIMD` if set (and supported), else [`SimdLevel::best`];
    /// decided once per process.
    pub fn selected() -> SimdLevel {
        static SELECTED: OnceLock<SimdLevel> = OnceLock::new();
        *SELECTED.get_or_init(|| {
            let Ok(asked) = std::env::var("REPRO_SIMD") else {
                return Self::best();
            };
            let level = match asked.as_str() {
                "scalar" => SimdLevel::Scalar,
                "avx2" => SimdLevel::Avx2,
                "avx512" => SimdLevel::Avx512,
                other => {
                    eprintln!(
                        "warning: REPRO_SIMD={other} is not one of scalar, avx2, avx512; using {}",
                        Self::best().name()
                    );
                    return Self::best();
                }
            };
            if level.supported() {
                level
            } else {
                eprintln!(
                    "warning: REPRO_SIMD={asked}: this CPU lacks it; using {}",
                    Self::best().name()
                );
                Self::best()
            }
        })
    }

    /// Runs `f` compiled for this level: its body (and everything it calls that is
    /// `#[inline(always)]`) is inlined into a function with the level's target features enabled.
    /// Call it inside each parallel task, around the task's loops: a thread-pool closure is a
    /// function of its own and does not inherit the features of its caller.
    ///
    /// Mark the closure `#[inline(always)]` (`level.run(#[inline(always)] || …)`) and write its
    /// loops as `for` loops, not `for_each` / `fold` over iterator adaptors: LLVM inlines bottom up,
    /// so a closure that has absorbed its callees is too large to be inlined into pulp's
    /// feature-enabled function, and an out-of-line `fold` is a function of its own; either is then
    /// compiled for the baseline target (SSE2) whatever the level. written otherwise, `perf annotate` of a
    /// step shows every row loop of these kernels on `xmm` registers under the `avx2` level; the
    /// `simd_levels` example measures the levels against each other.
    ///
    /// Panics if the CPU lacks the level (callers pass [`SimdLevel::selected`] or a level from
    /// [`SimdLevel::supported_levels`]).
    #[inline(always)]
    pub fn run<R>(self, f: impl FnOnce() -> R) -> R {
        match self {
            SimdLevel::Scalar => f(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => pulp::x86::V3::try_new()
                .expect("AVX2 level on a CPU without AVX2/FMA")
                .vectorize(f),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => pulp::x86::V4::try_new()
                .expect("AVX-512 level on a CPU without AVX-512")
                .vectorize(f),
            #[cfg(not(target_arch = "x86_64"))]
            _ => f(),
        }
    }
}

thread_local! {
    /// A level forced on this thread by [`with_level`].
    static FORCED: Cell<Option<SimdLevel>> = const { Cell::new(None) };
}

/// The level a kernel called on this thread uses: the one [`with_level`] forces, else
/// [`SimdLevel::selected`]. Kernels read it once at entry, on the calling thread, and hand it to
/// their parallel tasks.
pub fn current() -> SimdLevel {
    FORCED.get().unwrap_or_else(SimdLevel::selected)
}

/// Runs `f` with every fused kernel it calls on this thread (forward, and the backward passes
/// `f` runs) at `level`: the per-level tests use it.
///
/// Panics if this CPU lacks `level`.
pub fn with_level<R>(level: SimdLevel, f: impl FnOnce() -> R) -> R {
    assert!(
        level.supported(),
        "this CPU lacks SIMD level {}",
        level.name()
    );
    struct Restore(Option<SimdLevel>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FORCED.set(self.0);
        }
    }
    let _restore = Restore(FORCED.replace(Some(level)));
    f()
}

/// Lanes of the split reductions: 16 independent partial sums, so that a sum vectorises at every
/// level (one AVX-512 register, two AVX2, four SSE2) without reassociation by the compiler.
const LANES: usize = 16;

/// `Σ xs`, summed in [`LANES`] interleaved partial sums, then the partials in order.
#[inline(always)]
pub fn sum(xs: &[f32]) -> f32 {
    sum_map(xs, |x| x)
}

/// `max xs` (−∞ for an empty slice), in [`LANES`] interleaved partial maxima.
#[inline(always)]
pub fn max(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    acc.iter().fold(tail, |a, &x| a.max(x))
}

/// `Σ xs[i] · ys[i]` over the common length, in [`LANES`] interleaved partial sums.
#[inline(always)]
pub fn dot(xs: &[f32], ys: &[f32]) -> f32 {
    sum_map2(xs, ys, |x, y| x * y)
}

/// `Σ f(xs[i], ys[i])` over the common length, in [`LANES`] interleaved partial sums (`f`
/// inlined: keep it branch-free).
#[inline(always)]
pub fn sum_map2(xs: &[f32], ys: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let n = xs.len().min(ys.len());
    let (xs, ys) = (&xs[..n], &ys[..n]);
    let mut acc = [0f32; LANES];
    let (mut cx, mut cy) = (xs.chunks_exact(LANES), ys.chunks_exact(LANES));
    for (a, b) in (&mut cx).zip(&mut cy) {
        for ((s, &x), &y) in acc.iter_mut().zip(a).zip(b) {
            *s += f(x, y);
        }
    }
    let tail: f32 = cx
        .remainder()
        .iter()
        .zip(cy.remainder())
        .map(|(&x, &y)| f(x, y))
        .sum();
    acc.iter().sum::<f32>() + tail
}

/// `Σ f(xs[i])`, in [`LANES`] interleaved partial sums (`f` inlined: keep it branch-free).
#[inline(always)]
pub fn sum_map(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f(x);
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|&x| f(x)).sum();
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [−4, 4) with a few large ones.
    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let h = (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) >> 8;
                let x = (h % 8000) as f32 / 1000.0 - 4.0;
                if h.is_multiple_of(17) { 30.0 * x } else { x }
            })
            .collect()
    }

    #[test]
    fn reductions_match_f64_and_give_the_same_bits_at_every_level() {
        // Lengths around the lane count and the vector widths, tails included.
        for n in (0..70).chain([255, 256, 257, 1000]) {
            let (xs, ys) = (data(n, 1), data(n, 2));
            let exact_sum: f64 = xs.iter().map(|&x| x as f64).sum();
            let exact_dot: f64 = xs.iter().zip(&ys).map(|(&x, &y)| x as f64 * y as f64).sum();
            let exact_max = xs.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            let scale: f64 = xs.iter().map(|&x| (x as f64).abs()).sum::<f64>() + 1.0;
            let scale_dot: f64 = xs
                .iter()
                .zip(&ys)
                .map(|(&x, &y)| (x as f64 * y as f64).abs())
                .sum::<f64>()
                + 1.0;
            let at = |level: SimdLevel| {
                level.run(
                    #[inline(always)]
                    || {
                        (
                            sum(&xs),
                            max(&xs),
                            dot(&xs, &ys),
                            sum_map(&xs, |x| 2.0 * x + 1.0),
                        )
                    },
                )
            };
            let scalar = at(SimdLevel::Scalar);
            assert!(
                (scalar.0 as f64 - exact_sum).abs() / scale < 1e-6,
                "sum n={n}"
            );
            assert!(
                (scalar.2 as f64 - exact_dot).abs() / scale_dot < 1e-6,
                "dot n={n}"
            );
            assert_eq!(scalar.1, exact_max, "max n={n}");
            let mapped = 2.0 * exact_sum + n as f64;
            assert!((scalar.3 as f64 - mapped).abs() / (2.0 * scale + n as f64) < 1e-6);
            for level in SimdLevel::supported_levels() {
                // Same partial sums in the same order at every width: identical bits.
                let got = at(level);
                assert_eq!(
                    [got.0, got.1, got.2, got.3].map(f32::to_bits),
                    [scalar.0, scalar.1, scalar.2, scalar.3].map(f32::to_bits),
                    "level {} n={n}",
                    level.name()
                );
            }
        }
    }

    #[test]
    fn fast_exp_gives_the_same_bits_at_every_level() {
        let xs: Vec<f32> = (0..4001).map(|i| -100.0 + 0.047 * i as f32).collect();
        let at = |level: SimdLevel| -> Vec<u32> {
            level.run(
                #[inline(always)]
                || {
                    xs.iter()
                        .map(|&x| super::super::fast_exp(x).to_bits())
                        .collect()
                },
            )
        };
        let scalar = at(SimdLevel::Scalar);
        for level in SimdLevel::supported_levels() {
            assert_eq!(at(level), scalar, "level {}", level.name());
        }
    }

    #[test]
    fn with_level_forces_and_restores() {
        let before = current();
        assert!(before.supported());
        for level in SimdLevel::supported_levels() {
            simd_nested(level);
            assert_eq!(current(), before);
        }
    }

    fn simd_nested(level: SimdLevel) {
        with_level(level, || {
            assert_eq!(current(), level);
            with_level(SimdLevel::Scalar, || {
                assert_eq!(current(), SimdLevel::Scalar)
            });
            assert_eq!(current(), level);
        });
    }
}
