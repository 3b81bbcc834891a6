//! One language-model training step: forward, backward, optimizer update.

use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use model::{LanguageModel, causal_lm_loss};

/// Forward + backward + optimizer step on `tokens`: [B, T + 1]. Returns the updated model and the
/// loss; returns once the device has finished the step.
pub fn causal_lm_step(
    model: LanguageModel,
    optim: &mut ModuleOptimizer,
    tokens: Tensor<2, Int>,
    lr: f64,
) -> (LanguageModel, f32) {
    let loss = causal_lm_loss(&model, tokens);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let device = loss.device();
    let model = optim.step(lr, model, grads);
    let loss = loss.into_scalar::<f32>();
    // Asynchronous backends (GPU) may still be applying the update: wait, so timings are whole steps.
    device.sync().expect("device synchronisation");
    (model, loss)
}
