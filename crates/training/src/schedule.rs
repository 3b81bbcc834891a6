//! Learning-rate schedules: linear warmup to a peak, then a decay. Pure functions of the step, so
//! resuming needs only the step number.

use serde::{Deserialize, Serialize};

/// What follows the warmup.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decay {
    /// Stay at the peak.
    Constant,
    /// Linear from the peak to `final_fraction · peak` at the last step.
    Linear { final_fraction: f64 },
    /// Half cosine from the peak to `final_fraction · peak` at the last step.
    Cosine { final_fraction: f64 },
    /// `peak · sqrt(warmup / step)` after the warmup (T5's `1/sqrt(max(step, 10^4))` with
    /// peak = 0.01, warmup = 10^4).
    InverseSqrt,
}

/// Warmup + decay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub peak_lr: f64,
    pub warmup_steps: usize,
    pub decay: Decay,
    /// Steps of an earlier run this one continues (uptraining after pre-training): step s of
    /// this run takes the rate of step `start_step + s` of a run of `start_step + total` steps.
    /// 0 (absent from configs, and left out when serialized, so run identities predate it): a
    /// fresh schedule.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub start_step: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Schedule {
    /// Warmup to `peak_lr` over `warmup_steps`, then `decay`, from step 1.
    pub fn new(peak_lr: f64, warmup_steps: usize, decay: Decay) -> Self {
        Self {
            peak_lr,
            warmup_steps,
            decay,
            start_step: 0,
        }
    }

    /// Learning rate of optimizer step `step` (1-based) out of `total` steps.
    pub fn lr(&self, step: usize, total: usize) -> f64 {
        let (step, total) = (step.max(1) + self.start_step, total + self.start_step);
        let w = self.warmup_steps;
        if w > 0 && step <= w && !matches!(self.decay, Decay::InverseSqrt) {
            return self.peak_lr * step as f64 / w as f64;
        }
        let progress = || {
            let span = total.saturating_sub(w).max(1) as f64;
            ((step - w.min(step)) as f64 / span).clamp(0.0, 1.0)
        };
        match self.decay {
            Decay::Constant => self.peak_lr,
            Decay::Linear { final_fraction } => {
                self.peak_lr * (1.0 - (1.0 - final_fraction) * progress())
            }
            Decay::Cosine { final_fraction } => {
                let c = 0.5 * (1.0 + (std::f64::consts::PI * progress()).cos());
                self.peak_lr * (final_fraction + (1.0 - final_fraction) * c)
            }
            Decay::InverseSqrt => self.peak_lr * (w.max(1) as f64 / step.max(w) as f64).sqrt(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let s = |decay| Schedule::new(1.0, 10, decay);
        assert_eq!(s(Decay::Constant).lr(5, 100), 0.5);
        assert_eq!(s(Decay::Constant).lr(50, 100), 1.0);
        let lin = s(Decay::Linear {
            final_fraction: 0.0,
        });
        assert!((lin.lr(55, 100) - 0.5).abs() < 1e-12);
        assert!(lin.lr(100, 100).abs() < 1e-12);
        let cos = s(Decay::Cosine {
            final_fraction: 0.1,
        });
        assert!((cos.lr(10, 100) - 1.0).abs() < 1e-12);
        assert!((cos.lr(55, 100) - 0.55).abs() < 1e-12);
        assert!((cos.lr(100, 100) - 0.1).abs() < 1e-12);
        // T5: 0.01 · sqrt(10^4 / max(step, 10^4)) = 1/sqrt(max(step, 10^4)).
        let t5 = Schedule::new(0.01, 10_000, Decay::InverseSqrt);
        assert!((t5.lr(1, 1_000_000) - 0.01).abs() < 1e-12);
        assert!((t5.lr(40_000, 1_000_000) - 1.0 / 200.0).abs() < 1e-12);
        // Continued after 1M steps: 1/sqrt(10^6 + s), not a new warm-up.
        let up = Schedule {
            start_step: 1_000_000,
            ..t5
        };
        assert!((up.lr(1, 50_000) - 1.0 / (1_000_001f64).sqrt()).abs() < 1e-12);
        // A continued cosine decays over the whole (earlier + this) run.
        let cos = Schedule {
            start_step: 90,
            ..s(Decay::Cosine {
                final_fraction: 0.1,
            })
        };
        assert!((cos.lr(10, 10) - 0.1).abs() < 1e-12);
        assert!(cos.lr(1, 10) < 0.2);
    }
}
