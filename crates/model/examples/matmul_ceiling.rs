//! The matrix-product ceiling that table11's model-FLOP utilisation is quoted against: one f32
//! product of `N³` (default 2048) through `fused::matmul_2d` (gemm, as the models' dense layers
//! call it) and through flex's own `matmul`, median of 5 after a warm-up.
//!
//! `cargo run --release -p model --example matmul_ceiling [-- N]`
use burn::prelude::*;
use burn::tensor::Distribution;
use model::fused;
use model::runtime::median_seconds;

#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(2048, |s| s.parse().expect("usage: matmul_ceiling [N]"));
    model::runtime::configure();
    let device = Device::flex();
    let a = Tensor::<2>::random([n, n], Distribution::Normal(0.0, 1.0), &device);
    let b = Tensor::<2>::random([n, n], Distribution::Normal(0.0, 1.0), &device);
    let flops = 2.0 * (n as f64).powi(3);
    let gemm = median_seconds(|| {
        fused::matmul_2d(a.clone(), b.clone()).into_data();
    });
    let flex = median_seconds(|| {
        a.clone().matmul(b.clone()).into_data();
    });
    for (name, s) in [("fused::matmul_2d (gemm)", gemm), ("flex matmul", flex)] {
        println!(
            "{name:<24} {n}³: {:7.1} ms  {:6.1} GFLOP/s",
            s * 1e3,
            flops / s / 1e9
        );
    }
}
