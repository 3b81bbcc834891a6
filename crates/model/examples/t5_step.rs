//! Where one T5 training step's time goes (span-corruption shapes: encoder input, decoder targets,
//! forward + backward + Adafactor), by part (`model::fused::profile`), the optimizer, and the
//! rest (burn's own ops and the autodiff graph).
//!
//! `cargo run --release -p model --example t5_step -- [SCALE] [KV_HEADS,...] [REPS]`, where SCALE is
//! `table1` (gqa_table1's cpu XXL stand-in: d 128, d_ff 256, 8 heads of 32, 2 + 2 layers,
//! vocabulary 8192, batch 8, input 128, targets 128; the default) or `d512` (d 512, d_ff 1024,
//! 8 heads of 64, 6 + 6 layers, vocabulary 32128, batch 8, input 512, targets 114: T5.1.1-small's
//! width at the span-corruption lengths). KV_HEADS: the decoder's K/V heads (default `8,1`).
//! `REPRO_KERNELS=reference` times the plain burn kernels; `REPRO_SIMD=scalar|avx2|avx512` picks
//! the fused kernels' instruction set.
use burn::optim::{AdafactorConfig, GradientsParams};
use burn::prelude::*;
use model::fused::profile::{self, Part};
use model::t5::T5Config;
use model::*;
use std::time::Instant;

#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

/// A step's shapes: the model and (batch, input length, target length).
fn scale(name: &str) -> Option<(T5Config, [usize; 3])> {
    match name {
        "table1" => Some((
            T5Config::new(128, 256, 8, 2, 2, 8)
                .with_d_kv(32)
                .with_vocab_size(8192),
            [8, 128, 128],
        )),
        "d512" => Some((T5Config::new(512, 1024, 8, 6, 6, 8), [8, 512, 114])),
        _ => None,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.first().map_or("table1", |s| s.as_str());
    let (base, [b, s, t]) =
        scale(name).unwrap_or_else(|| exit(&format!("scale `{name}`: expected table1 or d512")));
    let kv_heads: Vec<usize> = args
        .get(1)
        .map_or("8,1", |s| s.as_str())
        .split(',')
        .map(|g| {
            g.parse()
                .unwrap_or_else(|_| exit(&format!("K/V heads `{g}`: not a number")))
        })
        .collect();
    let reps: usize = args
        .get(2)
        .map_or(Ok(5), |s| s.parse())
        .unwrap_or_else(|_| exit("REPS: not a number"));
    model::runtime::configure();
    println!(
        "T5 step at `{name}` (batch {b}, input {s}, targets {t}); fused kernels: {}; SIMD level: {}; \
         median of {reps} steps after one warm-up\n",
        if fused::forced_reference() {
            "reference (REPRO_KERNELS)"
        } else {
            "on"
        },
        fused::simd::SimdLevel::selected().name(),
    );
    let mut header = "| K/V heads | step (s) | forward | backward | optimizer |".to_string();
    for p in Part::ALL {
        header += &format!(" {} |", p.name());
    }
    println!("{header}\n|---|---|---|---|---|---|---|---|---|");
    for &g in &kv_heads {
        let cfg = base.clone().with_n_kv_heads(g);
        if let Err(e) = cfg.validate() {
            exit(&format!("K/V heads {g}: {e}"));
        }
        let steps = profile_one(&cfg, [b, s, t], reps);
        let median = |f: fn(&Split) -> f64| {
            let mut v: Vec<f64> = steps.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let mut row = format!(
            "| {g} | {:.3} | {:.3} | {:.3} | {:.3} |",
            median(|s| s.total),
            median(|s| s.forward),
            median(|s| s.backward),
            median(|s| s.optimizer)
        );
        for i in 0..Part::ALL.len() {
            let mut v: Vec<f64> = steps.iter().map(|s| s.parts[i]).collect();
            v.sort_by(f64::total_cmp);
            row += &format!(" {:.3} |", v[v.len() / 2]);
        }
        println!("{row}");
    }
}

/// Seconds of one step, by phase and fused-kernel part.
#[derive(Default, Clone, Copy)]
struct Split {
    total: f64,
    forward: f64,
    backward: f64,
    optimizer: f64,
    parts: [f64; 4],
}

fn exit(msg: &str) -> ! {
    eprintln!("t5_step: {msg} (usage: t5_step [table1|d512] [KV_HEADS,...] [REPS])");
    std::process::exit(2)
}

/// `reps` training steps after one warm-up, each split by phase.
fn profile_one(cfg: &T5Config, [b, s, t]: [usize; 3], reps: usize) -> Vec<Split> {
    let device = Device::flex().autodiff();
    device.seed(0);
    let mut model = Some(cfg.init(&device));
    let vocab = cfg.vocab_size as f64;
    let uniform = burn::tensor::Distribution::Uniform(2.0, vocab - 1.0);
    let inputs = Tensor::<2, Int>::random([b, s], uniform, &device);
    let targets = Tensor::<2, Int>::random([b, t], uniform, &device);
    let keep = Tensor::<2, Int>::ones([b, s], &device).bool();
    let mut optim = AdafactorConfig::new()
        .with_relative_step(false)
        .with_scale_parameter(true)
        .init();
    let mut out = Vec::new();
    for rep in 0..=reps {
        profile::enable(rep > 0);
        let start = Instant::now();
        let m = model.take().expect("model");
        let loss = m.loss(inputs.clone(), &keep, targets.clone());
        let _: f32 = loss.clone().into_scalar();
        let forward = start.elapsed().as_secs_f64();
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        let backward = start.elapsed().as_secs_f64() - forward;
        let opt_start = Instant::now();
        model = Some(optim.step(1e-3, m, grads));
        let optimizer = opt_start.elapsed().as_secs_f64();
        profile::enable(false);
        let parts = profile::take().map(|(_, p)| p);
        if rep > 0 {
            out.push(Split {
                total: start.elapsed().as_secs_f64(),
                forward,
                backward,
                optimizer,
                parts,
            });
        }
    }
    out
}
