//! Optimizers as configuration: the papers' Adafactor (burn-optim's, its update on the fused CPU
//! kernel where that runs: `model::fused::Adafactor`) and AdamW (burn-optim's), driven by an
//! external [`crate::schedule::Schedule`].

use burn::grad_clipping::GradientClippingConfig;
use burn::optim::{AdamWConfig, ModuleOptimizer};
use model::fused::{Adafactor, AdafactorSettings};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OptimizerConfig {
    /// Adafactor (Shazeer & Stern 2018) with the learning rate given by the schedule (burn's
    /// `relative_step` off: the schedule is the caller's), second-moment decay `1 - t^decay_rate`
    /// (T5: -0.8), update clipping at `clip_threshold` RMS (1.0).
    Adafactor {
        decay_rate: f64,
        clip_threshold: f32,
        weight_decay: f32,
        /// Multiply each parameter's update by `max(1e-3, RMS(parameter))`, so that the learning
        /// rate is relative to the parameter's scale (T5 and t5x: `multiply_by_parameter_scale`,
        /// the GQA paper configs' setting). Off (absent from a config, and left out when
        /// serialized, so the LM runs' identities predate it): the learning rate is absolute, as
        /// the FLASH sweeps were piloted.
        #[serde(default, skip_serializing_if = "is_false")]
        scale_parameter: bool,
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
            scale_parameter: false,
        }
    }

    /// Adafactor as T5 and t5x configure it: [`Self::adafactor`] with the update scaled by the
    /// parameter's RMS.
    pub fn adafactor_t5() -> Self {
        Self::Adafactor {
            decay_rate: -0.8,
            clip_threshold: 1.0,
            weight_decay: 0.0,
            scale_parameter: true,
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
                scale_parameter,
            } => {
                let optimizer = ModuleOptimizer::from(Adafactor::new(AdafactorSettings {
                    clip_threshold,
                    decay_rate,
                    relative_step: false,
                    scale_parameter,
                    weight_decay,
                    ..AdafactorSettings::t5()
                }));
                match clip {
                    Some(clip) => optimizer.with_grad_clipping(clip.init()),
                    None => optimizer,
                }
            }
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

impl OptimizerConfig {
    /// Floats of optimizer state for parameters of these shapes (`--dry-run`'s memory plan), as
    /// burn-optim 0.22 keeps them: Adafactor factors the second moment of a matrix (or a stack of
    /// them) into row and column means over its last two dimensions and keeps a vector's in full,
    /// without momentum; AdamW keeps both moments of every parameter.
    pub fn state_floats(&self, shapes: &[Vec<usize>]) -> f64 {
        shapes
            .iter()
            .map(|shape| {
                let numel: usize = shape.iter().product();
                match (self, shape.as_slice()) {
                    (Self::AdamW { .. }, _) => 2 * numel,
                    (Self::Adafactor { .. }, [.., rows, cols]) => {
                        numel / (rows * cols).max(1) * (rows + cols)
                    }
                    (Self::Adafactor { .. }, _) => numel,
                }
            })
            .sum::<usize>() as f64
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::{Module, Param};
    use burn::optim::GradientsParams;
    use burn::prelude::*;

    #[test]
    fn state_floats_follow_burn_optims_layout() {
        // A [2, 3] matrix and a [3] vector: Adafactor keeps 2 row + 3 column means and the full
        // vector; a stack of 4 such matrices four times that; AdamW two of every float.
        let shapes = [vec![2, 3], vec![3], vec![4, 2, 3]];
        assert_eq!(
            OptimizerConfig::adafactor().state_floats(&shapes),
            (2 + 3 + 3 + 4 * 5) as f64
        );
        assert_eq!(
            OptimizerConfig::adamw().state_floats(&shapes),
            (2 * (6 + 3 + 24)) as f64
        );
    }

    /// A module holding one [2, 3] matrix and one [3] vector.
    #[derive(Module, Debug)]
    struct Two {
        w: Param<Tensor<2>>,
        b: Param<Tensor<1>>,
    }

    /// One Adafactor step by hand (Shazeer & Stern 2018, Alg. 4 and §6-7, at t = 1 where the
    /// second-moment decay 1 - t^-0.8 is 0): V = G² + ε₁, factored for a matrix as
    /// R C / mean(R) with R, C the row and column means; U = G / sqrt(V); U /= max(1, RMS(U) / d);
    /// the step is lr · U, times max(ε₂, RMS(X)) with `scale_parameter`.
    fn by_hand(x: &[f64], g: &[f64], rows: usize, lr: f64, scale: bool) -> Vec<f64> {
        let cols = x.len() / rows;
        let sq: Vec<f64> = g.iter().map(|g| g * g + 1e-30).collect();
        let v: Vec<f64> = if rows > 1 {
            let r: Vec<f64> = (0..rows)
                .map(|i| (0..cols).map(|j| sq[i * cols + j]).sum::<f64>() / cols as f64)
                .collect();
            let c: Vec<f64> = (0..cols)
                .map(|j| (0..rows).map(|i| sq[i * cols + j]).sum::<f64>() / rows as f64)
                .collect();
            let r_mean = r.iter().sum::<f64>() / rows as f64;
            (0..rows * cols)
                .map(|k| r[k / cols] * c[k % cols] / r_mean)
                .collect()
        } else {
            sq
        };
        let mut u: Vec<f64> = g.iter().zip(&v).map(|(g, v)| g / v.sqrt()).collect();
        let rms = |a: &[f64]| (a.iter().map(|x| x * x).sum::<f64>() / a.len() as f64).sqrt();
        let clip = (rms(&u) / 1.0).max(1.0);
        u.iter_mut().for_each(|x| *x /= clip);
        let step = if scale { lr * rms(x).max(1e-3) } else { lr };
        x.iter().zip(&u).map(|(x, u)| x - step * u).collect()
    }

    #[test]
    fn adafactor_updates_equal_the_hand_computation() {
        let device = Device::flex().autodiff();
        let xw = [0.5, -1.0, 2.0, 0.25, -0.75, 1.5];
        let xb = [0.01, -0.02, 0.005];
        let gw = [0.3, -0.1, 0.2, -0.4, 0.05, 0.6];
        let gb = [1.0, -2.0, 0.5];
        for (config, scale) in [
            (OptimizerConfig::adafactor(), false),
            (OptimizerConfig::adafactor_t5(), true),
        ] {
            let module = Two {
                w: Param::from_tensor(Tensor::from_data(
                    TensorData::new(xw.to_vec(), [2, 3]),
                    &device,
                )),
                b: Param::from_tensor(Tensor::from_data(
                    TensorData::new(xb.to_vec(), [3]),
                    &device,
                )),
            };
            // loss = Σ W ⊙ Gw + Σ b ⊙ Gb, so the gradients are Gw and Gb.
            let loss = (module.w.val()
                * Tensor::from_data(TensorData::new(gw.to_vec(), [2, 3]), &device))
            .sum()
                + (module.b.val() * Tensor::from_data(TensorData::new(gb.to_vec(), [3]), &device))
                    .sum();
            let grads = GradientsParams::from_grads(loss.backward(), &module);
            let mut optim = config.init(None);
            let lr = 0.01;
            let module = optim.step(lr, module, grads);
            let got_w: Vec<f64> = module.w.val().into_data().try_to_vec_as::<f64>().unwrap();
            let got_b: Vec<f64> = module.b.val().into_data().try_to_vec_as::<f64>().unwrap();
            let want_w = by_hand(&xw, &gw, 2, lr, scale);
            let want_b = by_hand(&xb, &gb, 1, lr, scale);
            for (got, want) in got_w.iter().chain(&got_b).zip(want_w.iter().chain(&want_b)) {
                assert!((got - want).abs() < 1e-6, "scale {scale}: {got} vs {want}");
            }
        }
        // The two settings differ (the test can tell them apart): RMS(W) ≈ 1.19, RMS(b) = 0.013.
        assert!(
            (by_hand(&xb, &gb, 1, 0.01, true)[0] - by_hand(&xb, &gb, 1, 0.01, false)[0]).abs()
                > 1e-3
        );
    }

    /// Configs without the field read as before, and the field is left out at its default, so the
    /// LM runs' identities (which serialize the optimizer) keep their names.
    #[test]
    fn scale_parameter_defaults_off_and_is_omitted_off() {
        let old =
            r#"{"kind":"adafactor","decay_rate":-0.8,"clip_threshold":1.0,"weight_decay":0.0}"#;
        let c: OptimizerConfig = serde_json::from_str(old).unwrap();
        assert_eq!(c, OptimizerConfig::adafactor());
        assert_eq!(serde_json::to_string(&c).unwrap(), old);
        let t5 = serde_json::to_string(&OptimizerConfig::adafactor_t5()).unwrap();
        assert!(t5.contains("\"scale_parameter\":true"), "{t5}");
    }
}
