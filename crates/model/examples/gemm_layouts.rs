//! Why the attention kernels transpose a product's right operand first (`fused::transpose_into`):
//! gemm's speed for `C [m, n] = A [m, k] · B [k, n]` (row-major C and A) with B stored
//! n-contiguous (row-major [k, n]) against k-contiguous (a row-major [n, k] read transposed, as
//! `Q Kᵀ` and `dO Vᵀ` are), at the attention kernels' shapes: few rows (a block of query rows),
//! many keys. Best of 5 timings of repeated calls, on one thread and on every thread.
//!
//! `cargo run --release -p model --example gemm_layouts`
use std::time::Instant;

/// (what, m, n, k)
const SHAPES: [(&str, usize, usize, usize); 6] = [
    ("FLASH-Quad 8192: dO Vᵀ", 128, 8192, 512),
    ("FLASH-Quad 8192: Q Kᵀ (with the rank bias)", 128, 8192, 256),
    ("FLASH chunk: dO Vᵀ", 128, 256, 512),
    ("FLASH global: dO Sᵀ", 256, 128, 512),
    ("Transformer++ 8192: dO Vᵀ", 128, 8192, 64),
    ("dense layer (8192 rows): dY Wᵀ", 8192, 256, 1024),
];

/// GFLOP/s of the product with B n-contiguous (`k_contiguous` false) or k-contiguous.
fn gflops((m, n, k): (usize, usize, usize), k_contiguous: bool, par: gemm::Parallelism) -> f64 {
    let a = vec![0.5f32; m * k];
    let b = vec![0.25f32; k * n];
    let mut c = vec![0f32; m * n];
    let (b_cs, b_rs) = if k_contiguous {
        (k as isize, 1)
    } else {
        (1, n as isize)
    };
    let mut run = || {
        // SAFETY: a is m × k (row stride k), b k × n through (b_rs, b_cs), c m × n (row stride n).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                k as isize,
                b.as_ptr(),
                b_cs,
                b_rs,
                1.0,
                1.0,
                false,
                false,
                false,
                par,
            )
        }
    };
    let flops = 2.0 * (m * n * k) as f64;
    let reps = (1e9 / flops) as usize + 1;
    run();
    let best = (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..reps {
                run();
            }
            start.elapsed().as_secs_f64() / reps as f64
        })
        .fold(f64::INFINITY, f64::min);
    flops / best / 1e9
}

#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

fn main() {
    model::runtime::configure();
    let threads = rayon::current_num_threads();
    println!(
        "| product | m × n × k | threads | B n-contiguous (GFLOP/s) | B k-contiguous (GFLOP/s) |"
    );
    println!("|---|---|---|---|---|");
    for (what, m, n, k) in SHAPES {
        for (par, t) in [
            (gemm::Parallelism::None, 1),
            (gemm::Parallelism::Rayon(0), threads),
        ] {
            println!(
                "| {what} | {m} × {n} × {k} | {t} | {:.1} | {:.1} |",
                gflops((m, n, k), false, par),
                gflops((m, n, k), true, par)
            );
        }
    }
}
