//! The fused attention kernel, forward + backward, on the cpu-scale shapes of `fig5`/`fig6` at 4096
//! tokens (batch 1): FLASH-Quad's relu² scores (one head, s = 128 plus the rank-128 RoPE-product
//! bias folded into queries and keys, so dk = 256; e = 2d = 256), bidirectional (masked LM) and
//! causal, and Transformer++'s softmax (2 heads of 64); beside them one dense product of the same
//! size class ([T, 256] × [256, T]) as the ceiling. Median of 5 after a warm-up (relu²: kept and recomputed
//! scores interleaved round by round);
//! GFLOP/s counts the products of the recomputing backward (bidirectional: `QKᵀ` twice, `dQ`, `dK`
//! over dk; `PV`, `dO Vᵀ`, `dV` over dv; causal: the block-lower-triangular part), also for the
//! relu² rows that keep their scores and skip one `QKᵀ`, so that the rows compare as speeds.
//!
//! `cargo run --release -p model --example attention_bench [-- T]` (run it alone on the machine,
//! or with `RAYON_NUM_THREADS=1` for one core's figure).
use burn::prelude::*;
use burn::tensor::Distribution;
use model::fused::{AttentionSpec, ScoreFn, attention, row_block, with_kept_scores_limit};
use model::runtime::median_seconds;

/// Products' FLOPs of one forward + backward: 4 products over `dk` and 3 over `dv`, each `2·T·keys`
/// multiply-adds per output column, keys = all (bidirectional) or up to each row block's end (causal).
fn flops(n: usize, t: usize, dk: usize, dv: usize, causal: bool) -> f64 {
    let pairs: f64 = if causal {
        let rb = row_block(causal, t, dk.max(dv));
        (0..t)
            .step_by(rb)
            .map(|i0| {
                let i1 = (i0 + rb).min(t);
                ((i1 - i0) * i1) as f64
            })
            .sum()
    } else {
        (t * t) as f64
    };
    n as f64 * 2.0 * pairs * (4 * dk + 3 * dv) as f64
}

/// Seconds of `reps` calls of `f`, each timed alone, the median of them.
fn median_seconds_of(reps: usize, mut f: impl FnMut()) -> f64 {
    median(
        (0..reps)
            .map(|_| {
                let start = std::time::Instant::now();
                f();
                start.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

fn main() {
    model::runtime::configure();
    let t: usize = match std::env::args().nth(1) {
        None => 4096,
        Some(a) => a.parse().unwrap_or_else(|_| {
            eprintln!("error: the context `{a}` is not a whole number; pass e.g. 4096");
            std::process::exit(2)
        }),
    };
    let dev = Device::flex().autodiff();
    let cases = [
        (
            "relu² bidirectional (FLASH-Quad, masked)",
            ScoreFn::Relu2,
            false,
            1,
            256,
            256,
        ),
        (
            "relu² causal (FLASH-Quad, causal)",
            ScoreFn::Relu2,
            true,
            1,
            256,
            256,
        ),
        (
            "softmax causal (Transformer++, 2 heads)",
            ScoreFn::Softmax,
            true,
            2,
            64,
            64,
        ),
        (
            "softmax bidirectional (Transformer++, 2 heads)",
            ScoreFn::Softmax,
            false,
            2,
            64,
            64,
        ),
    ];
    println!("T = {t}, {} rayon threads", rayon::current_num_threads());
    println!("| kernel | N | dk | dv | fwd+bwd (ms) | GFLOP/s |");
    println!("|---|---|---|---|---|---|");
    for (name, score, causal, n, dk, dv) in cases {
        let r = |d: usize| {
            Tensor::<3>::random([n, t, d], Distribution::Normal(0.0, 0.3), &dev).require_grad()
        };
        let (q, k, v) = (r(dk), r(dk), r(dv));
        let spec = AttentionSpec {
            score,
            scale: 1.0 / (dk as f32).sqrt(),
            causal,
        };
        let step = || {
            let y = attention(&q, &k, &v, None, spec).expect("flex autodiff");
            drop(y.sum().backward());
        };
        // Relu² keeps its scores for the backward (up to a memory limit); limit 0 times the
        // recomputing backward beside it, the two interleaved round by round (the machine drifts).
        let rows = if score == ScoreFn::Relu2 {
            let (mut kept, mut recomputed) = (Vec::new(), Vec::new());
            step();
            for _ in 0..5 {
                kept.push(median_seconds_of(1, step));
                recomputed.push(with_kept_scores_limit(0, || median_seconds_of(1, step)));
            }
            vec![
                (name.to_string(), median(kept)),
                (format!("{name}, scores recomputed"), median(recomputed)),
            ]
        } else {
            vec![(name.to_string(), median_seconds(step))]
        };
        for (name, secs) in rows {
            let gflops = flops(n, t, dk, dv, causal) / secs / 1e9;
            println!(
                "| {name} | {n} | {dk} | {dv} | {:.1} | {gflops:.1} |",
                secs * 1e3
            );
        }
    }
    let plain = Device::flex();
    let a = Tensor::<2>::random([t, 256], Distribution::Normal(0.0, 1.0), &plain);
    let b = Tensor::<2>::random([256, t], Distribution::Normal(0.0, 1.0), &plain);
    let secs = median_seconds(|| drop(model::fused::matmul_2d(a.clone(), b.clone())));
    let gflops = 2.0 * (t * t * 256) as f64 / secs / 1e9;
    println!(
        "| ceiling: one product [T, 256] × [256, T] | | | | {:.1} | {gflops:.1} |",
        secs * 1e3
    );
}
