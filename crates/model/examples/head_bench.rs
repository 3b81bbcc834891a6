//! The tied LM head and its loss, forward + backward, unfused (`fused::matmul_2d` then
//! `cross_entropy`: the [N, V] logits and their gradient in memory) against
//! `fused::linear_cross_entropy` (blocks of rows), at table11's shapes (8192 rows, d = 256, vocabulary
//! 8192), every row predicted (causal LM) and 15% of them (masked LM), interleaved, median of 5.
//!
//! `cargo run --release -p model --example head_bench [-- BLOCK_ROWS]` (default: the fused op's own
//! choice, `HEAD_BLOCK_BYTES` of logits per block).
use burn::prelude::*;
use burn::tensor::Distribution;
use model::fused;
use std::time::Instant;

#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

fn main() {
    model::runtime::configure();
    let dev = Device::flex().autodiff();
    let (n, v, d) = (8192, 8192, 256);
    // None: the fused op's own block size (`linear_cross_entropy`).
    let block: Option<usize> = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("usage: head_bench [BLOCK_ROWS]"));
    let x = Tensor::<2>::random([n, d], Distribution::Normal(0.0, 1.0), &dev).require_grad();
    let w = Tensor::<2>::random([v, d], Distribution::Normal(0.0, 0.1), &dev).require_grad();
    let ids: Vec<i64> = (0..n as i64).map(|i| (i * 7919) % v as i64).collect();
    let targets = Tensor::<1, Int>::from_data(TensorData::new(ids, [n]), &dev);
    let fused_loss = |weights: Option<&Tensor<1>>| {
        match block {
            Some(rows) => fused::linear_cross_entropy_in_blocks(
                &x,
                (&w, fused::HeadLayout::VocabRows),
                &targets,
                weights,
                rows,
            ),
            None => fused::linear_cross_entropy(&x, &w, &targets, weights),
        }
        .expect("flex")
    };
    let masked = Tensor::<1>::random([n], Distribution::Uniform(0.0, 1.0), &dev).lower_elem(0.15);
    let masked = masked.float();
    let step = |loss: Tensor<1>| {
        let g = loss.backward();
        let _ = (
            x.grad(&g).unwrap().into_data(),
            w.grad(&g).unwrap().into_data(),
        );
    };
    for (what, weights) in [("every row", None), ("15% of rows", Some(masked))] {
        let (mut unfused, mut fused_s) = (Vec::new(), Vec::new());
        for rep in 0..6 {
            let t0 = Instant::now();
            let logits = fused::matmul_2d(x.clone(), w.clone().transpose());
            step(model::cross_entropy(
                logits,
                targets.clone(),
                weights.clone(),
            ));
            let a = t0.elapsed().as_secs_f64();
            let t0 = Instant::now();
            step(fused_loss(weights.as_ref()));
            let b = t0.elapsed().as_secs_f64();
            if rep > 0 {
                unfused.push(a);
                fused_s.push(b);
            }
        }
        let median = |mut xs: Vec<f64>| {
            xs.sort_by(f64::total_cmp);
            xs[xs.len() / 2]
        };
        let rows = block.map_or("default".to_string(), |r| r.to_string());
        println!(
            "{what:>12}: unfused {:.3} s, fused ({rows} rows per block) {:.3} s",
            median(unfused),
            median(fused_s)
        );
    }
}
