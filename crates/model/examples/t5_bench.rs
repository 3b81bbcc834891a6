//! T5 timings: where a training step's or a decoding step's time goes (by fused-kernel part,
//! `model::fused::profile`), and the rows `experiments/anchors/t5_session.py` compares with
//! transformers' `T5ForConditionalGeneration` (`experiments/anchors/t5_anchor.py`, the same rows).
//!
//! ```text
//! cargo run --release -p model --example t5_bench -- step [table1|d512] [KV_HEADS,...] [REPS] [DROPOUT]
//! cargo run --release -p model --example t5_bench -- decode [BATCH] [KV_HEADS,...] [STEPS]
//! cargo run --release -p model --example t5_bench -- row NAME [REPS]
//! cargo run --release -p model --example t5_bench -- ceiling
//! ```
//!
//! Training steps (span-corruption shapes, forward + backward + Adafactor with T5's settings):
//! `table1` is gqa_table1's cpu XXL stand-in (d 128, d_ff 256, 8 heads of 32, 2 + 2 layers,
//! vocabulary 8192, batch 8, input 128, targets 128), `d512` T5.1.1-small's width (d 512, d_ff 1024,
//! 8 heads of 64, 6 + 6 layers, vocabulary 32128, batch 8, input 512, targets 114). Decoding:
//! gqa_fig6's shapes (T5-XXL per layer: d 4096, d_ff 10240, 64 heads of 64, 1 + 1 layers,
//! vocabulary 32128, input 2048), a random encoder output. `DROPOUT` (default 0, pre-training) sets
//! every dropout of the model, 0.1 being the fine-tuning's (attention dropout included).
//!
//! `row` prints `NAME,SECONDS,FLOPS,BYTES` (the median of REPS after a warm-up; the row's
//! matrix-product FLOPs and, for decoding, the bytes of weights and K/V a step reads, from which
//! the session computes the row's floor on this machine), and the same row by part on stderr. Rows:
//! `train_table1`, `train_d512` (a step), `encoder_xxl` (the encoder on one input of 2048),
//! `decode_xxl_b1`, `decode_xxl_b8`, `decode_xxl_b32` (an MHA decoding step). `ceiling` prints
//! `ceiling,GFLOPS,GBPS`: this machine's product rate (a 2048³ product through the fused path)
//! and read bandwidth (a 1 GiB buffer), the floor's two ceilings.
//! `REPRO_KERNELS=reference` times the plain burn kernels; `REPRO_SIMD=scalar|avx2|avx512` picks
//! the fused kernels' instruction set.
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use model::fused::{
    self,
    profile::{self, Part},
};
use model::t5::{T5Config, T5Model};
use std::time::Instant;

#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

const USAGE: &str = "t5_bench step [table1|d512] [KV_HEADS,...] [REPS] [DROPOUT] | \
                     decode [BATCH] [KV_HEADS,...] [STEPS] | row NAME [REPS] | ceiling";

fn exit(msg: &str) -> ! {
    eprintln!("t5_bench: {msg} (usage: {USAGE})");
    std::process::exit(2)
}

/// A training step's shapes: the model and (batch, input length, target length).
fn train_scale(name: &str) -> Option<(T5Config, [usize; 3])> {
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

/// gqa_fig6's decoding model with `g` K/V heads, and its input length.
fn decode_model(g: usize) -> (T5Config, usize) {
    (T5Config::new(4096, 10240, 64, 1, 1, g), 2048)
}

/// Seconds of one timed call, by fused-kernel part.
#[derive(Clone, Copy, Default)]
struct Timed {
    total: f64,
    parts: [f64; 4],
}

/// Runs `f` `reps` times after `warmup` calls, each timed with the kernel profile on.
fn time(warmup: usize, reps: usize, mut f: impl FnMut()) -> Vec<Timed> {
    let mut out = Vec::new();
    for i in 0..warmup + reps {
        profile::enable(i >= warmup);
        let start = Instant::now();
        f();
        let total = start.elapsed().as_secs_f64();
        profile::enable(false);
        let parts = profile::take().map(|(_, s)| s);
        if i >= warmup {
            out.push(Timed { total, parts });
        }
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Training steps of `cfg` at (batch, input, targets): the timings of `reps` after one warm-up.
fn train_steps(cfg: &T5Config, [b, s, t]: [usize; 3], reps: usize) -> Vec<Timed> {
    let device = Device::flex().autodiff();
    device.seed(0);
    let mut model = Some(cfg.init(&device));
    let uniform = burn::tensor::Distribution::Uniform(2.0, cfg.vocab_size as f64 - 1.0);
    let inputs = Tensor::<2, Int>::random([b, s], uniform, &device);
    let targets = Tensor::<2, Int>::random([b, t], uniform, &device);
    let keep = Tensor::<2, Int>::ones([b, s], &device).bool();
    // T5's Adafactor (t5x: relative to the parameter's scale, decay −0.8, update clipping 1), its
    // update fused as in the GQA runs (the training crate's optimizer).
    let settings = fused::AdafactorSettings::t5();
    let mut optim = ModuleOptimizer::from(fused::Adafactor::new(settings));
    time(1, reps, || {
        let m = model.take().expect("model");
        let loss = m.loss(inputs.clone(), &keep, targets.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        model = Some(optim.step(1e-3, m, grads));
    })
}

/// Cached decoding steps of `model` at batch `b` over a random encoder output of `input`
/// positions: the timings of `reps` after two warm-ups.
fn decode_steps(model: &T5Model, b: usize, input: usize, reps: usize) -> Vec<Timed> {
    let device = Device::flex();
    let d = model.shared.weight.dims()[1];
    let normal = burn::tensor::Distribution::Normal(0.0, 1.0);
    let encoded = Tensor::<3>::random([b, input, d], normal, &device);
    let keep = Tensor::<2, Int>::ones([b, input], &device).bool();
    let mut cache = model.start_decoding(&encoded, &keep);
    cache.capacity = reps + 2;
    let tokens = Tensor::<2, Int>::ones([b, 1], &device);
    time(2, reps, || {
        let logits = model.decode_step(tokens.clone(), &mut cache);
        let _: f32 = logits.slice([0..1, 0..1, 0..1]).into_scalar();
    })
}

fn header(first: &str) -> String {
    let mut h = format!("| {first} | total |");
    for p in Part::ALL {
        h += &format!(" {} |", p.name());
    }
    h + " rest |\n|---|---|---|---|---|---|---|"
}

fn row(label: String, timed: &[Timed]) -> String {
    let total = median(timed.iter().map(|t| t.total).collect());
    let mut out = format!("| {label} | {total:.3} |");
    let mut parts = 0.0;
    for i in 0..Part::ALL.len() {
        let p = median(timed.iter().map(|t| t.parts[i]).collect());
        parts += p;
        out += &format!(" {p:.3} |");
    }
    out + &format!(" {:.3} |", (total - parts).max(0.0))
}

fn kernels() -> String {
    format!(
        "fused kernels: {}; SIMD level: {}",
        if fused::forced_reference() {
            "reference (REPRO_KERNELS)"
        } else {
            "on"
        },
        fused::simd::SimdLevel::selected().name(),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let number = |i: usize, default: usize| -> usize {
        arg(i)
            .map_or(Ok(default), str::parse)
            .unwrap_or_else(|_| exit(&format!("`{}`: not a number", args[i])))
    };
    let groups = |i: usize, default: &str| -> Vec<usize> {
        arg(i)
            .unwrap_or(default)
            .split(',')
            .map(|g| {
                g.parse()
                    .unwrap_or_else(|_| exit(&format!("K/V heads `{g}`")))
            })
            .collect()
    };
    model::runtime::configure();
    match arg(0).unwrap_or("step") {
        "step" => {
            let name = arg(1).unwrap_or("table1");
            let (base, shape) = train_scale(name)
                .unwrap_or_else(|| exit(&format!("scale `{name}`: expected table1 or d512")));
            let reps = number(3, 5);
            let dropout: f64 = arg(4).map_or(Ok(0.0), str::parse).unwrap_or_else(|_| {
                exit(&format!("dropout `{}`: not a number", args[4]));
            });
            println!(
                "T5 training step at `{name}` {shape:?}, dropout {dropout}; {}\n",
                kernels()
            );
            println!("{}", header("K/V heads"));
            for g in groups(2, "8,1") {
                let cfg = base.clone().with_n_kv_heads(g).with_dropout(dropout);
                cfg.validate()
                    .unwrap_or_else(|e| exit(&format!("K/V heads {g}: {e}")));
                println!("{}", row(g.to_string(), &train_steps(&cfg, shape, reps)));
            }
        }
        "decode" => {
            let (b, steps) = (number(1, 32), number(3, 8));
            println!(
                "T5 decoding step, XXL per-layer shapes, batch {b}; {}\n",
                kernels()
            );
            println!("{}", header("K/V heads"));
            for g in groups(2, "64,8,1") {
                let (cfg, input) = decode_model(g);
                cfg.validate()
                    .unwrap_or_else(|e| exit(&format!("K/V heads {g}: {e}")));
                let model = cfg.init(&Device::flex());
                println!(
                    "{}",
                    row(g.to_string(), &decode_steps(&model, b, input, steps))
                );
            }
        }
        "row" => {
            let name = arg(1).unwrap_or_else(|| exit("row: which one?"));
            let reps = number(2, 5);
            let (timed, flops, bytes) = match name {
                "train_table1" | "train_d512" => {
                    let (cfg, shape) = train_scale(&name[6..]).expect("known scale");
                    let [b, s, t] = shape;
                    (
                        train_steps(&cfg, shape, reps),
                        cfg.train_flops(b, s, t),
                        0.0,
                    )
                }
                "encoder_xxl" => {
                    let (cfg, input) = decode_model(64);
                    let device = Device::flex();
                    let model = cfg.init(&device);
                    let uniform = burn::tensor::Distribution::Uniform(2.0, 32000.0);
                    let inputs = Tensor::<2, Int>::random([1, input], uniform, &device);
                    let keep = Tensor::<2, Int>::ones([1, input], &device).bool();
                    let timed = time(1, reps, || {
                        let out = model.encode(inputs.clone(), &keep);
                        let _: f32 = out.slice([0..1, 0..1, 0..1]).into_scalar();
                    });
                    (timed, cfg.encoder_flops(1, input), 0.0)
                }
                _ => match name.strip_prefix("decode_xxl_b").map(str::parse::<usize>) {
                    Some(Ok(b)) => {
                        let (cfg, input) = decode_model(64);
                        let model = cfg.init(&Device::flex());
                        // The timed steps attend to 3..=REPS + 2 positions (after two warm-ups).
                        let positions = (reps as f64 + 5.0) / 2.0;
                        let cost = cfg.decode_step_cost(b, input, positions);
                        let timed = decode_steps(&model, b, input, reps);
                        (timed, cost.total_flops(), cost.total_bytes())
                    }
                    _ => exit(&format!("row `{name}`: not one of the rows")),
                },
            };
            let seconds = median(timed.iter().map(|t| t.total).collect());
            println!("{name},{seconds:.6},{flops:.6e},{bytes:.6e}");
            // The same row by part, on stderr so that the anchor session reads one line.
            eprintln!("{}\n{}", header("row"), row(name.to_string(), &timed));
        }
        "ceiling" => {
            let gflops = model::runtime::product_gflops(2048, &Device::flex());
            let gbps = model::runtime::read_bandwidth_gbps(1 << 30, 3);
            println!("ceiling,{gflops:.1},{gbps:.2}");
        }
        other => exit(&format!("`{other}`: expected step, decode, row or ceiling")),
    }
}
