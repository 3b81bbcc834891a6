//! Where a training step's time goes: the wall time spent inside each fused kernel, summed by part.
//!
//! Off by default (one relaxed atomic load per kernel call). The `profile_step` example turns it on
//! around whole training steps and reports each part's share; what the kernels do not account for is
//! burn's own work (layer norms, residual adds, reshapes, embedding lookups, the autodiff graph).
//! Timers sit at the kernels' entry points, which run on the calling thread (the kernels use the
//! thread pool inside), so parts never overlap and never double count.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// A group of fused kernels, forward and backward together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Dense products through gemm (projections, feed-forward layers, the LM head).
    Products,
    /// Quadratic attention (softmax or relu² scores) and the chunked linear (global) attention.
    Attention,
    /// RoPE and the SiLU / GELU activations.
    Elementwise,
    /// The cross-entropy rows of the loss.
    CrossEntropy,
}

impl Part {
    /// Every part, in report order.
    pub const ALL: [Part; 4] = [
        Part::Products,
        Part::Attention,
        Part::Elementwise,
        Part::CrossEntropy,
    ];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Part::Products => "products (gemm)",
            Part::Attention => "attention kernels",
            Part::Elementwise => "elementwise (RoPE, activations)",
            Part::CrossEntropy => "cross-entropy",
        }
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// Starts (or stops) accumulating kernel times.
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// The seconds accumulated per part since the last call, then zeroes them.
pub fn take() -> [(Part, f64); 4] {
    Part::ALL.map(|p| {
        (
            p,
            NANOS[p as usize].swap(0, Ordering::Relaxed) as f64 * 1e-9,
        )
    })
}

/// Adds the time from its creation to its drop to `part`, when profiling is on.
pub(crate) struct Timer(Option<(Part, Instant)>);

impl Timer {
    pub(crate) fn start(part: Part) -> Self {
        Timer(
            ENABLED
                .load(Ordering::Relaxed)
                .then(|| (part, Instant::now())),
        )
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some((part, start)) = self.0 {
            let ns = start.elapsed().as_nanos() as u64;
            NANOS[part as usize].fetch_add(ns, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_count_only_while_enabled() {
        // Other tests may run kernels concurrently, so only this test's own part is checked, and
        // only for being at least what was slept.
        enable(true);
        {
            let _t = Timer::start(Part::CrossEntropy);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let got = take()[Part::CrossEntropy as usize].1;
        enable(false);
        assert!(got >= 0.019, "{got}");
        {
            let _t = Timer::start(Part::CrossEntropy);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(take()[Part::CrossEntropy as usize].1 < 0.005);
    }
}
