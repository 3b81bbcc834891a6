//! Can our T5 learn to copy its input? A pilot diagnostic for the GQA quality issue (17): a small
//! T5.1.1 trained from scratch on random token sequences whose target is the input itself, with the
//! GQA cpu configs' optimizer (Adafactor, absolute step), T5's Adafactor (update scaled by the
//! parameter's RMS) or AdamW. Prints the training loss and the exact-copy accuracy of
//! teacher-forced argmax every 50 steps.
//!
//! `cargo run --release -p training --example t5_copy -- [adafactor|adafactor_t5|adamw] [LR] [STEPS] [D_MODEL] [LENGTH]`
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Distribution;
use model::t5::T5Config;
use training::optimizer::OptimizerConfig;

#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = args.first().map_or("adafactor", |s| s.as_str());
    let lr: f64 = args.get(1).map_or(1e-3, |s| s.parse().expect("LR"));
    let steps: usize = args.get(2).map_or(600, |s| s.parse().expect("STEPS"));
    let d: usize = args.get(3).map_or(128, |s| s.parse().expect("D_MODEL"));
    let len: usize = args.get(4).map_or(16, |s| s.parse().expect("LENGTH"));
    model::runtime::configure();
    let dev = Device::flex().autodiff();
    dev.seed(0);
    let (vocab, batch) = (256usize, 32usize);
    // d_model, d_ff, heads, encoder layers, decoder layers, K/V heads.
    let cfg = T5Config::new(d, 2 * d, 8, 2, 2, 8)
        .with_d_kv(d / 8)
        .with_vocab_size(vocab);
    let mut model = cfg.init(&dev);
    let optim_cfg = match opt {
        "adamw" => OptimizerConfig::adamw(),
        "adafactor_t5" => OptimizerConfig::adafactor_t5(),
        "adafactor" => OptimizerConfig::adafactor(),
        other => {
            eprintln!("error: unknown optimizer `{other}`: use adafactor, adafactor_t5 or adamw");
            std::process::exit(2);
        }
    };
    let mut optim = optim_cfg.init(None);
    for step in 1..=steps {
        // Ids 3.. (0 pad, 1 EOS, 2 unused), the target the input itself.
        let x =
            Tensor::<2, Int>::random([batch, len], Distribution::Uniform(3.0, vocab as f64), &dev);
        let keep = x.clone().greater_elem(0);
        let loss = model.loss(x.clone(), &keep, x.clone());
        if step % 50 == 0 || step == 1 {
            let logits =
                model
                    .valid()
                    .forward(x.clone().inner(), &keep.clone().inner(), x.clone().inner());
            let pred = logits.argmax(2).reshape([batch, len]);
            let acc: f32 = pred.equal(x.clone().inner()).float().mean().into_scalar();
            let l: f32 = loss.clone().into_scalar();
            println!("step {step:4}  loss {l:.3}  teacher-forced copy accuracy {acc:.3}");
        }
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr, model, grads);
    }
}
