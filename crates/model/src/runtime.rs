//! Process-wide settings of a training or benchmark process, kept apart from the kernels: mimalloc
//! with purging off and flush-to-zero on the compute threads. A library sets no global allocator:
//! the binaries declare mimalloc as theirs ([`Allocator`]; the `experiments` binaries through that
//! crate's default feature `mimalloc`, why in the workspace `Cargo.toml`) and call [`configure`]
//! once at start; tests run without it (the results do not depend on it, only
//! the speed: values below f32's smallest normal become 0 under flush-to-zero).

/// The allocator the binaries declare: `#[global_allocator] static A: model::runtime::Allocator =
/// model::runtime::Allocator;` ([`keep_freed_memory`] tunes it).
pub use mimalloc::MiMalloc as Allocator;

/// Both settings of this module: [`flush_denormals`] and [`keep_freed_memory`].
pub fn configure() {
    flush_denormals();
    keep_freed_memory();
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

/// Stops mimalloc (where a binary made it the global allocator) from returning freed memory to the OS. By
/// default it decommits memory freed 10 ms ago, and the next large tensor pays its page faults
/// again: FLASH's training step at 8192 tokens took 6.0 s instead of 4.1. The process keeps its
/// peak footprint instead, as XLA's buffer allocator does.
pub fn keep_freed_memory() {
    // SAFETY: sets one integer option of the allocator; −1 is a documented value ("no purging").
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
}

/// The median wall time of 5 runs of `f` after one warm-up run, in seconds (the benchmark examples'
/// measure).
pub fn median_seconds(mut f: impl FnMut()) -> f64 {
    f();
    let mut ts: Vec<f64> = (0..5)
        .map(|_| {
            let s = std::time::Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    ts[2]
}

/// This machine's memory read bandwidth in GB/s: every core's thread sums its share of a buffer
/// of `bytes` (far larger than the caches), the median of `rounds` (at least one) passes after an
/// untimed one.
/// Sixteen independent sums per thread let the compiler vectorise the loop, so it is bound by
/// memory, not by the adds.
pub fn read_bandwidth_gbps(bytes: usize, rounds: usize) -> f64 {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let data = vec![1.0f32; (bytes / 4).max(16)];
    let chunk = data.len().div_ceil(threads);
    let sum = |xs: &[f32]| -> f32 {
        let mut acc = [0f32; 16];
        let mut blocks = xs.chunks_exact(16);
        for block in &mut blocks {
            for (a, x) in acc.iter_mut().zip(block) {
                *a += x;
            }
        }
        acc.iter().sum::<f32>() + blocks.remainder().iter().sum::<f32>()
    };
    let mut times = Vec::new();
    for round in 0..=rounds.max(1) {
        let start = std::time::Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let handles: Vec<_> = data
                .chunks(chunk)
                .map(|c| s.spawn(move || sum(c)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("summing thread"))
                .sum()
        });
        std::hint::black_box(total);
        if round > 0 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let n = times.len();
    let median = (times[(n - 1) / 2] + times[n / 2]) / 2.0;
    (data.len() * 4) as f64 / median / 1e9
}

/// This machine's matrix-product rate in GFLOP/s: one f32 `[n, n] · [n, n]` product through the
/// fused path where the device has it (the product the models' dense layers use), else the
/// backend's own, timed as the `matmul_ceiling` benchmark times it
/// ([`median_seconds`]).
pub fn product_gflops(n: usize, device: &burn::prelude::Device) -> f64 {
    use burn::prelude::Tensor;
    use burn::tensor::Distribution;
    let a = Tensor::<2>::random([n, n], Distribution::Normal(0.0, 1.0), device);
    let b = Tensor::<2>::random([n, n], Distribution::Normal(0.0, 1.0), device);
    let fused = crate::fused::available(device);
    let seconds = median_seconds(|| {
        let c = if fused {
            crate::fused::matmul_2d(a.clone(), b.clone())
        } else {
            a.clone().matmul(b.clone())
        };
        // One element read back: the product has run (a lazy backend would not have).
        let _ = c.slice([0..1, 0..1]).into_data();
    });
    2.0 * (n as f64).powi(3) / seconds / 1e9
}
