use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::Gradients;
use model::fused::simd::{self, SimdLevel};
use model::gau::GauScoring;
pub use model::testing::{max_rel_diff, token_tensor, tokens, values};
use model::{Architecture, ModelConfig};

/// Runs `check` with the fused kernels at each SIMD level this CPU supports (`fused::simd`'s run-time
/// dispatch), so that every compiled version of a kernel meets the same independent reference.
pub fn at_every_simd_level(check: impl Fn()) {
    for level in SimdLevel::supported_levels() {
        // Printed so that a failure names the level (the test harness shows it on failure).
        eprintln!("fused kernels at SIMD level {}", level.name());
        simd::with_level(level, &check);
    }
}

pub fn device() -> Device {
    Device::flex()
}

pub fn autodiff_device() -> Device {
    Device::flex().autodiff()
}

pub fn randn<const D: usize>(shape: [usize; D], seed: u64, device: &Device) -> Tensor<D> {
    device.seed(seed);
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
}

pub fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    let d = max_rel_diff(a, b);
    assert!(d <= tol, "{what}: max relative difference {d:e} > {tol:e}");
}

/// Backward pass of `sum(out * upstream)`: the vector-Jacobian product of `out` with a (random)
/// upstream gradient, which checks every output element's gradient path, unlike `out.sum()`.
pub fn backward_with<const D: usize>(out: Tensor<D>, upstream: &Tensor<D>) -> Gradients {
    (out * upstream.clone()).sum().backward()
}

/// The gradient of leaf `x` in `grads`, as plain values.
pub fn grad<const D: usize>(x: &Tensor<D>, grads: &Gradients) -> Vec<f32> {
    values(x.grad(grads).expect("leaf has a gradient"))
}

/// Asserts each pair of gradients close, naming the failing one.
pub fn assert_grads_close(names: &[&str], a: &[Vec<f32>], b: &[Vec<f32>], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: gradient counts differ");
    for ((name, x), y) in names.iter().zip(a).zip(b) {
        assert_close(x, y, tol, &format!("{what}: {name}"));
    }
}

/// Gradients of every float parameter of `module`, in visiting order (None where absent).
pub fn param_grads<M: Module>(module: &M, grads: &Gradients) -> Vec<Option<Vec<f32>>> {
    struct Collect<'a> {
        grads: &'a Gradients,
        out: Vec<Option<Vec<f32>>>,
    }
    impl ModuleVisitor for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.out.push(param.val().grad(self.grads).map(values));
        }
    }
    let mut c = Collect {
        grads,
        out: Vec::new(),
    };
    module.visit(&mut c);
    c.out
}

/// Adds N(0, std) noise to every float parameter on `flex` (see `model::testing::perturb`).
pub fn perturb<M: Module>(module: M, std: f64, seed: u64) -> M {
    model::testing::perturb(module, std, &device(), seed)
}

/// Every architecture's tiny preset, then the GAU ablations of FLASH Table 1 on tiny FLASH-Quad
/// (softmax, 2 heads, both, no gate, no bias, no RoPE) and those the chunked layer takes on tiny
/// FLASH (no gate, no RoPE).
pub fn tiny_models() -> Vec<ModelConfig> {
    let quad = || ModelConfig::tiny(Architecture::FlashQuad);
    let flash = || ModelConfig::tiny(Architecture::Flash);
    let mut all: Vec<ModelConfig> = Architecture::ALL.map(ModelConfig::tiny).into();
    all.extend([
        quad().with_gau_scoring(GauScoring::Softmax),
        quad().with_gau_heads(2),
        quad()
            .with_gau_heads(2)
            .with_gau_scoring(GauScoring::Softmax),
        quad().with_gau_gated(false),
        quad().with_gau_relative_bias(false),
        quad().with_gau_rope(false),
        flash().with_gau_gated(false),
        flash().with_gau_rope(false),
    ]);
    all
}

/// A short name of a tiny model for messages: the architecture and its non-default GAU fields.
pub fn describe(config: &ModelConfig) -> String {
    format!(
        "{} (scoring {:?}, heads {}, gated {}, bias {}, rope {})",
        config.arch,
        config.gau_scoring,
        config.gau_heads,
        config.gau_gated,
        config.gau_relative_bias,
        config.gau_rope
    )
}
