//! Where one causal-LM training step's time goes, at table11's anchor configuration (8192 tokens per
//! batch, `ModelConfig::latency_bench`): forward, backward, the LM head and loss, the optimizer.
//!
//! `cargo run --release -p model --example profile_step -- ARCH CONTEXT [REPS]`, e.g. `flash 2048`;
//! `REPRO_KERNELS=reference` times the plain burn kernels instead of the fused ones.
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use model::*;
use std::time::Instant;

fn time<R>(label: &str, reps: usize, mut f: impl FnMut() -> R) {
    let _ = f();
    let mut ts = vec![];
    for _ in 0..reps {
        let s = Instant::now();
        let _ = f();
        ts.push(s.elapsed().as_secs_f64());
    }
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    eprintln!("{label:<40} {:8.3} s (min {:.3})", ts[ts.len() / 2], ts[0]);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: profile_step ARCH CONTEXT [REPS]";
    let arch: Architecture = args.get(1).expect(usage).parse().expect(usage);
    let t: usize = args.get(2).expect(usage).parse().expect(usage);
    let reps: usize = args.get(3).map_or(2, |s| s.parse().expect(usage));
    let b = 8192 / t;
    // As the experiment binaries run (experiments::main_with).
    model::runtime::configure();
    let plain = Device::flex();
    let ad = plain.clone().autodiff();
    ad.seed(0);
    let cfg = ModelConfig::latency_bench(arch, t);
    let model = cfg.init(Direction::Causal, &ad);
    let tokens = Tensor::<2, Int>::random(
        [b, t + 1],
        burn::tensor::Distribution::Uniform(0.0, 8000.0),
        &ad,
    );
    let inputs = tokens.clone().narrow(1, 0, t);
    time("plain forward (hidden)", reps, || {
        let m = model.valid();
        let x = m.hidden(inputs.clone().to_device(&plain), None);
        x.into_data()
    });
    time("autodiff forward (hidden)", reps, || {
        model.hidden(inputs.clone(), None).into_data()
    });
    time("autodiff hidden fwd+bwd (sum)", reps, || {
        let h = model.hidden(inputs.clone(), None);
        let g = h.sum().backward();
        drop(g);
    });
    time("autodiff loss fwd", reps, || {
        causal_lm_loss(&model, tokens.clone()).into_data()
    });
    time("autodiff loss fwd+bwd", reps, || {
        let g = causal_lm_loss(&model, tokens.clone()).backward();
        drop(g);
    });
    let hid = Tensor::<3>::random(
        [b, t, 256],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &ad,
    )
    .require_grad();
    let w = Tensor::<2>::random(
        [8192, 256],
        burn::tensor::Distribution::Normal(0.0, 0.02),
        &ad,
    )
    .require_grad();
    let targets = tokens.clone().narrow(1, 1, t).reshape([b * t]);
    time("head+CE fwd+bwd", reps, || {
        let logits = hid
            .clone()
            .reshape([b * t, 256])
            .matmul(w.clone().transpose());
        let g = cross_entropy(logits, targets.clone(), None).backward();
        drop(g);
    });
    time("head matmul 2D fwd+bwd", reps, || {
        let logits = hid
            .clone()
            .reshape([b * t, 256])
            .matmul(w.clone().transpose());
        let g = logits.sum().backward();
        drop(g);
    });
    time("head matmul 3D bcast fwd+bwd", reps, || {
        let logits = hid.clone().matmul(w.clone().transpose().unsqueeze::<3>());
        let g = logits.sum().backward();
        drop(g);
    });
    let lg = Tensor::<2>::random(
        [b * t, 8192],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &ad,
    )
    .require_grad();
    time("CE alone fwd+bwd", reps, || {
        let g = cross_entropy(lg.clone(), targets.clone(), None).backward();
        drop(g);
    });
    let mut optim = AdamConfig::new().init();
    let mut m = Some(model);
    time("full step", reps, || {
        let model = m.take().unwrap();
        let loss = causal_lm_loss(&model, tokens.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        m = Some(optim.step(1e-4, model, grads));
    });
}
