//! The few-row products against gemm at a decoding step's shapes (T5-XXL per-layer widths), per
//! number of rows: `fused::skinny` (the weight matrix read in place) and `fused::packed` (packed
//! once beforehand, as decoding does); GFLOP/s and B's bytes read per second, the best of several
//! calls, on every thread.
//!
//! `cargo run --release -p model --example skinny_bench [-- ROWS...]`; `SK_COPIES=N` calls each
//! product on N copies of B in turn (6 puts them past this machine's last-level cache, as a
//! decoding step's weights are), `SK_SHAPE=k,n` times one shape of one's own, `SK_HUGE=1` puts B
//! on 2 MiB pages.
use std::time::Instant;

use model::fused::packed::{PackedMatrix, packed_product_acc};
use model::fused::simd::SimdLevel;
use model::fused::skinny::skinny_product_acc;

/// (what, k, n)
const SHAPES: [(&str, usize, usize); 3] = [
    ("attention projection 4096 x 4096", 4096, 4096),
    ("feed-forward wi 4096 x 10240", 4096, 10240),
    ("LM head 4096 x 32128", 4096, 32128),
];

fn gemm_acc(c: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) {
    // SAFETY: a is m × k, b k × n, c m × n, all row-major.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            true,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
}

/// A buffer of `len` floats on 2 MiB pages where the kernel grants them (`SK_HUGE=1`).
fn huge(len: usize) -> &'static mut [f32] {
    let layout = std::alloc::Layout::from_size_align(len * 4, 2 << 20).unwrap();
    // SAFETY: a fresh allocation of len floats, initialised below before use.
    unsafe {
        let p = std::alloc::alloc(layout) as *mut f32;
        if std::env::var("SK_HUGE").is_ok() {
            libc::madvise(p as *mut libc::c_void, len * 4, libc::MADV_HUGEPAGE);
        }
        let s = std::slice::from_raw_parts_mut(p, len);
        for (i, x) in s.iter_mut().enumerate() {
            *x = ((i * 7919) % 1000) as f32 / 1000.0 - 0.5;
        }
        s
    }
}

/// Seconds of the fastest of `reps` calls.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let rows: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("ROWS are counts"))
        .collect();
    let rows = if rows.is_empty() {
        vec![1, 8, 32]
    } else {
        rows
    };
    let level = SimdLevel::selected();
    println!("level {}", level.name());
    println!(
        "| shape | rows | gemm GFLOP/s | skinny GFLOP/s | packed GFLOP/s | gemm GB/s of B | skinny GB/s of B | packed GB/s of B | max abs diff |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    // `SK_SHAPE=k,n` times one shape of one's own instead of the three.
    let own = std::env::var("SK_SHAPE").ok().map(|s| {
        let v: Vec<usize> = s
            .split(',')
            .map(|x| x.parse().expect("SK_SHAPE is k,n"))
            .collect();
        ("SK_SHAPE", v[0], v[1])
    });
    let shapes: Vec<(&str, usize, usize)> = match own {
        Some(shape) => vec![shape],
        None => SHAPES.to_vec(),
    };
    for (what, k, n) in shapes {
        // Distinct copies of B, called in turn, so that their total passes the last-level cache
        // as a decoding step's weights do (`SK_COPIES`, default 1).
        let copies: usize = std::env::var("SK_COPIES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        let bs: Vec<&[f32]> = (0..copies).map(|_| &*huge(k * n)).collect();
        let b = bs[0];
        let packs: Vec<PackedMatrix> = bs.iter().map(|b| PackedMatrix::pack(b, (k, n))).collect();
        for &m in &rows {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 104729) % 997) as f32 / 997.0 - 0.5)
                .collect();
            let mut c1 = vec![0f32; m * n];
            let mut c2 = vec![0f32; m * n];
            gemm_acc(&mut c1, &a, b, (m, k, n));
            assert!(
                skinny_product_acc(level, &mut c2, &a, b, (m, k, n)),
                "no skinny kernel"
            );
            let mut c3 = vec![0f32; m * n];
            assert!(
                packed_product_acc(level, &mut c3, &a, &packs[0], m),
                "no packed kernel"
            );
            let diff = c1
                .iter()
                .zip(&c2)
                .chain(c1.iter().zip(&c3))
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            let reps = 7;
            let mut turn = 0;
            let tg = best(reps, || {
                turn += 1;
                gemm_acc(&mut c1, &a, bs[turn % copies], (m, k, n))
            });
            let ts = best(reps, || {
                turn += 1;
                skinny_product_acc(level, &mut c2, &a, bs[turn % copies], (m, k, n));
            });
            let tp = best(reps, || {
                turn += 1;
                packed_product_acc(level, &mut c3, &a, &packs[turn % copies], m);
            });
            let flops = 2.0 * (m * k * n) as f64;
            let bytes = 4.0 * (k * n) as f64;
            println!(
                "| {what} | {m} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {diff:.2e} |",
                flops / tg / 1e9,
                flops / ts / 1e9,
                flops / tp / 1e9,
                bytes / tg / 1e9,
                bytes / ts / 1e9,
                bytes / tp / 1e9
            );
        }
    }
}
