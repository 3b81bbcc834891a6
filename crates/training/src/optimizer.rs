//! Optimizers as configuration: the papers' Adafactor and AdamW, from burn-optim, driven by an
//! external [`crate::schedule::Schedule`].

use burn::grad_clipping::GradientClippingConfig;
use burn::optim::{AdafactorConfig, AdamWConfig, ModuleOptimizer};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OptimizerConfig {
    /// Adafactor (Shazeer & Stern 2018) with the learning rate given entirely by the schedule
    /// (burn's `relative_step` and `scale_parameter` off), second-moment decay `1 - t^decay_rate`
    /// (T5: -0.8), update clipping at `clip_threshold` RMS (1.0).
    Adafactor {
        decay_rate: f64,
        clip_threshold: f32,
        weight_decay: f32,
    },
    /// AdamW (Loshchilov & Hutter 2019).
    AdamW {
        beta_1: f32,
        beta_2: f32,
        epsilon: f32,
        weight_decay: f32,
    },
}

impl OptimizerConfig {
    /// The FLASH and T5 papers' optimizer with T5's settings.
    pub fn adafactor() -> Self {
        Self::Adafactor {
            decay_rate: -0.8,
            clip_threshold: 1.0,
            weight_decay: 0.0,
        }
    }

    pub fn adamw() -> Self {
        Self::AdamW {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-8,
            weight_decay: 0.01,
        }
    }

    /// Builds the optimizer; `clip_norm` clips each parameter's gradient to that L2 norm.
    pub fn init(&self, clip_norm: Option<f32>) -> ModuleOptimizer {
        let clip = clip_norm.map(GradientClippingConfig::Norm);
        match *self {
            Self::Adafactor {
                decay_rate,
                clip_threshold,
                weight_decay,
            } => AdafactorConfig::new()
                .with_relative_step(false)
                .with_scale_parameter(false)
                .with_decay_rate(decay_rate)
                .with_clip_threshold(clip_threshold)
                .with_weight_decay(weight_decay)
                .with_grad_clipping(clip)
                .init(),
            Self::AdamW {
                beta_1,
                beta_2,
                epsilon,
                weight_decay,
            } => AdamWConfig::new()
                .with_beta_1(beta_1)
                .with_beta_2(beta_2)
                .with_epsilon(epsilon)
                .with_weight_decay(weight_decay)
                .with_grad_clipping(clip)
                .init(),
        }
    }
}
