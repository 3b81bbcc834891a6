//! The fused attention of one decoding step at gqa_fig6's shapes: T5-XXL per layer (64 query
//! heads of 64), 2048 keys, one query position, G K/V heads (the query heads of a group stacked
//! as the rows of one query element, as `t5::grouped_attention_cached` runs them). For each G the
//! fastest of 7 calls, the K/V bytes it reads and the rate it reads them at, beside this machine's
//! read bandwidth (`runtime::read_bandwidth_gbps`) measured first: how far cross-attention is from
//! its memory roofline, apart from the products around it (`t5_bench decode` times the whole step).
//!
//! `cargo run --release -p model --example decode_attention_bench [-- BATCH]` (default 32; run it
//! alone on the machine).
use burn::prelude::*;
use burn::tensor::Distribution;
use model::fused::{self, AttentionSpec, ScoreBias, ScoreFn};
use std::time::Instant;

#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

/// T5-XXL's query heads, their width, and gqa_fig6's input length.
const HEADS: usize = 64;
const D_KV: usize = 64;
const KEYS: usize = 2048;

fn main() {
    model::runtime::configure();
    let batch: usize = match std::env::args().nth(1) {
        None => 32,
        Some(a) => a.parse().unwrap_or_else(|_| {
            eprintln!("error: the batch `{a}` is not a whole number; pass e.g. 32");
            std::process::exit(2)
        }),
    };
    let device = Device::flex();
    let gbps = model::runtime::read_bandwidth_gbps(1 << 30, 3);
    println!(
        "batch {batch}, {KEYS} keys, {HEADS} query heads of {D_KV}; read bandwidth {gbps:.1} GB/s\n"
    );
    println!("| G | rows per K/V head | K/V MiB | ms | GB/s | bandwidth / GB/s |");
    println!("|---|---|---|---|---|---|");
    let spec = AttentionSpec {
        score: ScoreFn::Softmax,
        scale: 1.0,
        causal: false,
    };
    for g in [64, 32, 16, 8, 4, 1] {
        let r = HEADS / g;
        let normal =
            |shape: [usize; 3]| Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let q = normal([batch * g, r, D_KV]);
        let (k, v) = (
            normal([batch * g, KEYS, D_KV]),
            normal([batch * g, KEYS, D_KV]),
        );
        let mut best = f64::MAX;
        for _ in 0..7 {
            let start = Instant::now();
            let out = fused::attention_grouped(&q, &k, &v, ScoreBias::default(), spec)
                .expect("the fused kernels run on flex");
            // One element read back: the call has run.
            let _ = out.slice([0..1, 0..1, 0..1]).into_data();
            best = best.min(start.elapsed().as_secs_f64());
        }
        let bytes = (2 * batch * g * KEYS * D_KV * 4) as f64;
        let rate = bytes / best / 1e9;
        println!(
            "| {g} | {r} | {:.0} | {:.1} | {rate:.1} | {:.2} |",
            bytes / (1 << 20) as f64,
            best * 1e3,
            gbps / rate
        );
    }
}
