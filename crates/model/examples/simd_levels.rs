//! The fused elementwise kernels at each SIMD level this CPU supports, on table11's shapes (8192
//! tokens, FLASH's GAU width 2e + s = 1152, vocabulary 8192): forward + backward, median of 5.
//!
//! `cargo run --release -p model --example simd_levels`
//!
//! The wider levels must be faster here: when they are not, a loop inside `SimdLevel::run` was left
//! out of line by LLVM and compiled for the baseline target (see `fused::simd`), as every kernel's
//! row loop was until the closures were marked `#[inline(always)]`. The copy column is the memory
//! bound the elementwise passes approach.
use burn::prelude::*;
use burn::tensor::Distribution;
use model::fused::simd::{self, SimdLevel};
use model::fused::{Activation, bias_activation, cross_entropy_rows};
use model::runtime::median_seconds;

#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

fn main() {
    model::runtime::configure();
    let dev = Device::flex().autodiff();
    let x = Tensor::<2>::random([8192, 1152], Distribution::Normal(0.0, 1.0), &dev).require_grad();
    let bias = Tensor::<1>::random([1152], Distribution::Normal(0.0, 1.0), &dev).require_grad();
    let logits =
        Tensor::<2>::random([8192, 8192], Distribution::Normal(0.0, 1.0), &dev).require_grad();
    let targets = Tensor::<1, Int>::random([8192], Distribution::Uniform(0.0, 8000.0), &dev);
    println!(
        "| level | SiLU(x + b) fwd+bwd [8192, 1152] (ms) | SiLU(x) fwd only (ms) | cross-entropy fwd+bwd [8192, 8192] (ms) | copy x·2 [8192, 1152] (ms) |"
    );
    println!("|---|---|---|---|---|");
    for level in SimdLevel::supported_levels() {
        let act = median_seconds(|| {
            simd::with_level(level, || {
                let y = bias_activation(x.clone(), Some(bias.clone()), Activation::Silu);
                drop(y.sum().backward());
            })
        });
        let plain = Device::flex();
        let xp = x.clone().inner().to_device(&plain);
        let fwd = median_seconds(|| {
            simd::with_level(level, || {
                let y = model::fused::activation(xp.clone(), Activation::Silu);
                drop(y);
            })
        });
        let copy = median_seconds(|| drop(xp.clone().mul_scalar(2.0)));
        let ce = median_seconds(|| {
            simd::with_level(level, || {
                let l = cross_entropy_rows(&logits, &targets).expect("flex");
                drop(l.sum().backward());
            })
        });
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            level.name(),
            act * 1e3,
            fwd * 1e3,
            ce * 1e3,
            copy * 1e3
        );
    }
}
