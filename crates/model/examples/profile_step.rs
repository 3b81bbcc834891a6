//! Where one causal-LM training step's time goes, at table11's anchor configuration (8192 tokens per
//! batch, `ModelConfig::latency_bench`, Adam): the fused kernels by part (`model::fused::profile`),
//! the optimizer, and the rest (burn's own ops — layer norms, residual adds, reshapes, the embedding
//! — and the autodiff graph), per model and context.
//!
//! `cargo run --release -p model --example profile_step -- [ARCH,...] [CONTEXT,...] [REPS]`, e.g.
//! `flash,flash_quad,transformer_plusplus 512,8192 3` (the defaults). With `--scale fig5` the step
//! is instead `fig5`'s cpu-scale one (`experiments/configs/fig5/cpu.toml`): masked LM (15% of
//! positions predicted), d = 128, 4 blocks, 2 heads, vocabulary 4096, 4096 tokens per step. `REPRO_SIMD=scalar|avx2|avx512`
//! picks the fused kernels' instruction set (default: the best this CPU has);
//! `REPRO_KERNELS=reference` times the plain burn kernels instead of the fused ones.
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use model::fused::profile::{self, Part};
use model::*;
use std::time::Instant;

/// Seconds of one profiled step, by part.
#[derive(Default, Clone, Copy)]
struct Split {
    total: f64,
    optimizer: f64,
    parts: [f64; 4],
}

/// Which training step is profiled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scale {
    /// table11's anchor configuration: causal LM, `latency_bench`, 8192 tokens per step.
    Table11,
    /// fig5's cpu scale: masked LM, d = 128, 4 blocks, 2 heads, vocabulary 4096, 4096 tokens.
    Fig5,
}

#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let scale = match args.iter().position(|a| a == "--scale") {
        None => Scale::Table11,
        Some(i) => {
            let value = args.get(i + 1).cloned().unwrap_or_default();
            args.drain(i..(i + 2).min(args.len()));
            match value.as_str() {
                "table11" => Scale::Table11,
                "fig5" => Scale::Fig5,
                other => exit(&format!("--scale `{other}`: expected table11 or fig5")),
            }
        }
    };
    let list = |i: usize, default: &str| -> Vec<String> {
        args.get(i)
            .map_or(default, |s| s.as_str())
            .split(',')
            .map(str::to_string)
            .collect()
    };
    let archs: Vec<Architecture> = list(0, "flash,flash_quad,transformer_plusplus")
        .iter()
        .map(|a| {
            a.parse()
                .unwrap_or_else(|e| exit(&format!("architecture {a}: {e}")))
        })
        .collect();
    let contexts: Vec<usize> = list(1, "512,8192")
        .iter()
        .map(|c| {
            c.parse()
                .unwrap_or_else(|_| exit(&format!("context {c}: not a number")))
        })
        .collect();
    let reps: usize = args
        .get(2)
        .map_or(Ok(3), |s| s.parse())
        .unwrap_or_else(|_| exit("REPS: not a number"));
    // As the experiment binaries run (experiments::experiment::main).
    model::runtime::configure();
    println!(
        "fused kernels: {}; SIMD level: {}; {reps} steps each after one warm-up\n",
        if fused::forced_reference() {
            "reference (REPRO_KERNELS)"
        } else {
            "on"
        },
        fused::simd::SimdLevel::selected().name(),
    );
    let mut header = "| model | context | step (s) | optimizer |".to_string();
    for p in Part::ALL {
        header += &format!(" {} |", p.name());
    }
    println!("{header} rest (burn ops, autodiff) |\n|---|---|---|---|---|---|---|---|---|");
    for &arch in &archs {
        for &t in &contexts {
            let s = profile_one(arch, t, reps, scale);
            let pct = |x: f64| format!("{x:.3} s ({:.0}%)", 100.0 * x / s.total);
            let rest = s.total - s.optimizer - s.parts.iter().sum::<f64>();
            let mut row = format!("| {arch} | {t} | {:.3} | {} |", s.total, pct(s.optimizer));
            for p in s.parts {
                row += &format!(" {} |", pct(p));
            }
            println!("{row} {} |", pct(rest));
        }
    }
}

fn exit(msg: &str) -> ! {
    eprintln!("profile_step: {msg} (usage: profile_step [ARCH,...] [CONTEXT,...] [REPS])");
    std::process::exit(2)
}

/// The mean split of `reps` training steps of `arch` at context `t`, after one warm-up step.
fn profile_one(arch: Architecture, t: usize, reps: usize, scale: Scale) -> Split {
    let device = Device::flex().autodiff();
    device.seed(0);
    let (cfg, tokens_per_step, direction) = match scale {
        Scale::Table11 => (ModelConfig::latency_bench(arch, t), 8192, Direction::Causal),
        Scale::Fig5 => (
            ModelConfig::latency_bench(arch, t)
                .with_vocab_size(4096)
                .with_d_model(128)
                .with_n_blocks(4)
                .with_n_heads(2),
            4096,
            Direction::Bidirectional,
        ),
    };
    let b = (tokens_per_step / t).max(1);
    let vocab = cfg.vocab_size as f64;
    let mut model = Some(cfg.init(direction, &device));
    let uniform = |hi: f64| burn::tensor::Distribution::Uniform(0.0, hi);
    let tokens = Tensor::<2, Int>::random([b, t + 1], uniform(vocab - 1.0), &device);
    // Masked LM: 15% of positions predicted (which ones does not change the step's cost).
    let predict = Tensor::<2>::random([b, t], uniform(1.0), &device)
        .lower_elem(0.15)
        .float();
    let mut optim = AdamConfig::new().init();
    let mut sum = Split::default();
    for rep in 0..=reps {
        profile::enable(rep > 0);
        let start = Instant::now();
        let m = model.take().expect("model");
        let loss = match direction {
            Direction::Causal => causal_lm_loss(&m, tokens.clone()),
            Direction::Bidirectional => {
                let inputs = tokens.clone().narrow(1, 0, t);
                masked_lm_loss(&m, inputs.clone(), inputs, predict.clone(), None)
            }
        };
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        let opt_start = Instant::now();
        model = Some(optim.step(1e-4, m, grads));
        let (opt, total) = (
            opt_start.elapsed().as_secs_f64(),
            start.elapsed().as_secs_f64(),
        );
        profile::enable(false);
        let parts = profile::take();
        if rep > 0 {
            sum.total += total / reps as f64;
            sum.optimizer += opt / reps as f64;
            for (s, (_, p)) in sum.parts.iter_mut().zip(parts) {
                *s += p / reps as f64;
            }
        }
    }
    sum
}
