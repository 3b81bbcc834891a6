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
