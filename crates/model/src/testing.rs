//! Helpers for the tests of this crate and the others (kept here so that each is written once).

use burn::module::{Module, ModuleMapper, Param};
use burn::prelude::*;
use burn::tensor::Distribution;

/// Deterministic pseudo-random token ids in 0..vocab, `batch × len` of them (a 64-bit LCG: the same
/// stream on every device).
pub fn tokens(seed: u64, batch: usize, len: usize, vocab: usize) -> Vec<i64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..batch * len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as i64
        })
        .collect()
}

/// `ids` as a [batch, ids.len() / batch] tensor.
pub fn token_tensor(ids: &[i64], batch: usize, device: &Device) -> Tensor<2, Int> {
    let len = ids.len() / batch;
    Tensor::from_data(TensorData::new(ids.to_vec(), [batch, len]), device)
}

/// A float tensor's values.
pub fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec_as::<f32>().unwrap()
}

/// Largest absolute difference, relative to the largest magnitude of `b` (at least 1).
pub fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let scale = b.iter().fold(1f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

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
