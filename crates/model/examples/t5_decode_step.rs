//! Where one cached T5 decoding step's time goes, at `gqa_fig6`'s shapes (T5-XXL per layer: d 4096,
//! d_ff 10240, 64 heads of 64, 1 + 1 layers, vocabulary 32128; input 2048), by part
//! (`model::fused::profile`) and the rest (burn's own ops: embedding, residual adds, the LM head's
//! Linear, reshapes).
//!
//! `cargo run --release -p model --example t5_decode_step -- [BATCH] [KV_HEADS,...] [STEPS]`
//! (defaults `32 64,8,1 8`). The encoder output is random (its cost is not the step's).
use burn::prelude::*;
use model::fused::profile::{self, Part};
use model::t5::T5Config;
use std::time::Instant;

#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

fn exit(msg: &str) -> ! {
    eprintln!("t5_decode_step: {msg} (usage: t5_decode_step [BATCH] [KV_HEADS,...] [STEPS])");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: usize| -> usize {
        args.get(i)
            .map_or(Ok(default), |s| s.parse())
            .unwrap_or_else(|_| exit("not a number"))
    };
    let batch = number(0, 32);
    let steps = number(2, 8);
    let groups: Vec<usize> = args
        .get(1)
        .map_or("64,8,1", |s| s.as_str())
        .split(',')
        .map(|g| {
            g.parse()
                .unwrap_or_else(|_| exit(&format!("K/V heads `{g}`")))
        })
        .collect();
    let input = 2048;
    model::runtime::configure();
    println!(
        "T5 decoding step, XXL per-layer shapes, 1 + 1 layers, batch {batch}, input {input}; \
         median of {steps} steps after 2 (seconds)\n"
    );
    let mut header = "| K/V heads | step |".to_string();
    for p in Part::ALL {
        header += &format!(" {} |", p.name());
    }
    println!("{header} rest |\n|---|---|---|---|---|---|---|");
    let device = Device::flex();
    for g in groups {
        let cfg = T5Config::new(4096, 10240, 64, 1, 1, g);
        if let Err(e) = cfg.validate() {
            exit(&format!("K/V heads {g}: {e}"));
        }
        device.seed(0);
        let model = cfg.init(&device);
        let encoded = Tensor::<3>::random(
            [batch, input, 4096],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            &device,
        );
        let keep = Tensor::<2, Int>::ones([batch, input], &device).bool();
        let mut cache = model.start_decoding(&encoded, &keep);
        cache.capacity = steps + 2;
        let tokens = Tensor::<2, Int>::ones([batch, 1], &device);
        let mut rows: Vec<(f64, [f64; 4])> = Vec::new();
        for step in 0..steps + 2 {
            profile::enable(step >= 2);
            let start = Instant::now();
            let logits = model.decode_step(tokens.clone(), &mut cache);
            let _: f32 = logits.slice([0..1, 0..1, 0..1]).into_scalar();
            let total = start.elapsed().as_secs_f64();
            profile::enable(false);
            let parts = profile::take().map(|(_, s)| s);
            if step >= 2 {
                rows.push((total, parts));
            }
        }
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (total, parts) = rows[rows.len() / 2];
        let mut row = format!("| {g} | {total:.3} |");
        for p in parts {
            row += &format!(" {p:.3} |");
        }
        println!("{row} {:.3} |", total - parts.iter().sum::<f64>());
    }
}
