//! Helpers for the tests of this crate and the others (kept here so that each is written once).

use burn::module::{Module, ModuleMapper, Param};
use burn::prelude::*;
use burn::tensor::Distribution;

/// Adds N(0, `std`) noise to every float parameter, drawn on `device` after seeding it with
/// `seed`, keeping each parameter's `require_grad`. A freshly initialised model has paths that
/// start near zero (FLASH's γ ~ N(0, 0.02), zero biases), through which a leak or a dropped term
/// moves the outputs by ~1e-6 only; with noise of ~0.3 every path shows.
pub fn perturb<M: Module>(module: M, std: f64, device: &Device, seed: u64) -> M {
    struct Noise(f64);
    impl ModuleMapper for Noise {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let std = self.0;
            param.map(|t| {
                let grad = t.is_require_grad();
                let noisy =
                    (t.clone().detach() + t.random_like(Distribution::Normal(0.0, std))).detach();
                noisy.set_require_grad(grad)
            })
        }
    }
    device.seed(seed);
    module.map(&mut Noise(std))
}
