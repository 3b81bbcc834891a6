//! One GAU / FLASH layer against the paper's formula written out by hand in f64 (FLASH §2–3.2 and
//! appendix Codes 1, 4 and 8), from the layer's own parameters: no function of the model crate
//! (norms, projections, SiLU, scale/offset, RoPE, the position bias, the kernels) is reused, so a
//! wrong activation on Z, a swapped head or a mis-scaled term fails here even though the forward
//! pass and decoding share them.
//!
//! ```text
//!   h = LayerNorm(x)                          (eps 1e-5, biased variance)
//!   [U | V | Z] = silu(h W + b)               U, V: [T, e]   Z: [T, s]
//!   head_i = rope(γ_i ⊙ Z + β_i)              half-split rotation, base 10000, global positions
//!   FLASH-Quad: A[i, j] = relu(q_i·k_j / n + w[j − i + n − 1])²            (causal: j ≤ i)
//!   FLASH:      A[i, j] = relu(qq_i·kq_j / C + w[j%C − i%C + C − 1])²      same chunk (causal: j ≤ i)
//!             + ql_i·kl_j · f_g          other chunks: causal j's chunk < i's (f_g = 1/C),
//!                                        bidirectional every j (f_g = 1/T, own chunk included)
//!   out = x + (U ⊙ A V) W_o + b_o
//! ```

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use model::ChunkParts;
use model::gau::{Gau, GauConfig, GauSpan};
use model::layers::{Direction, Rope};

use crate::common::*;

const D: usize = 12;
const S: usize = 8;
const E: usize = 2 * D;

/// Every float parameter of the layer in visiting order (declaration order of its fields), with
/// its shape.
fn parameters(layer: &Gau) -> Vec<(Vec<usize>, Vec<f64>)> {
    struct Collect(Vec<(Vec<usize>, Vec<f64>)>);
    impl ModuleVisitor for Collect {
        fn visit_float<const N: usize>(&mut self, param: &Param<Tensor<N>>) {
            let t = param.val();
            let shape = t.dims().to_vec();
            self.0
                .push((shape, values(t).into_iter().map(f64::from).collect()));
        }
    }
    let mut c = Collect(Vec::new());
    layer.visit(&mut c);
    c.0
}

/// The layer's parameters by name, shapes checked.
struct Weights {
    ln_gamma: Vec<f64>,
    ln_beta: Vec<f64>,
    /// [d, 2e + s], row-major (burn's Linear stores [d_in, d_out]).
    w: Vec<f64>,
    b: Vec<f64>,
    /// [heads, s]
    gamma: Vec<f64>,
    beta: Vec<f64>,
    /// Toeplitz weights, 2n − 1 (n the bias window).
    rel: Vec<f64>,
    /// [e, d]
    wo: Vec<f64>,
    bo: Vec<f64>,
}

fn weights(layer: &Gau, heads: usize, window: usize) -> Weights {
    let p = parameters(layer);
    let shapes: Vec<&Vec<usize>> = p.iter().map(|(s, _)| s).collect();
    let want: Vec<Vec<usize>> = vec![
        vec![D],
        vec![D],
        vec![D, 2 * E + S],
        vec![2 * E + S],
        vec![heads, S],
        vec![heads, S],
        vec![2 * window - 1],
        vec![E, D],
        vec![D],
    ];
    assert_eq!(
        shapes,
        want.iter().collect::<Vec<_>>(),
        "parameter layout changed"
    );
    let mut it = p.into_iter().map(|(_, v)| v);
    let mut next = || it.next().expect("parameter");
    Weights {
        ln_gamma: next(),
        ln_beta: next(),
        w: next(),
        b: next(),
        gamma: next(),
        beta: next(),
        rel: next(),
        wo: next(),
        bo: next(),
    }
}

fn silu(y: f64) -> f64 {
    y / (1.0 + (-y).exp())
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The formula of the module doc for one sequence x: [T, d] (row-major) → [T, d].
fn formula(x: &[f64], t: usize, w: &Weights, span: GauSpan, direction: Direction) -> Vec<f64> {
    let width = 2 * E + S;
    // h = LayerNorm(x); [U | V | Z] = silu(h W + b).
    let mut u = vec![vec![0.0; E]; t];
    let mut v = vec![vec![0.0; E]; t];
    let mut z = vec![vec![0.0; S]; t];
    for i in 0..t {
        let row = &x[i * D..(i + 1) * D];
        let mean = row.iter().sum::<f64>() / D as f64;
        let var = row.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / D as f64;
        let h: Vec<f64> = (0..D)
            .map(|c| (row[c] - mean) / (var + 1e-5).sqrt() * w.ln_gamma[c] + w.ln_beta[c])
            .collect();
        for o in 0..width {
            let y = silu((0..D).map(|c| h[c] * w.w[c * width + o]).sum::<f64>() + w.b[o]);
            match o {
                o if o < E => u[i][o] = y,
                o if o < 2 * E => v[i][o - E] = y,
                o => z[i][o - 2 * E] = y,
            }
        }
    }
    // head_k = rope(γ_k ⊙ Z + β_k).
    let half = S / 2;
    let head = |k: usize| -> Vec<Vec<f64>> {
        (0..t)
            .map(|p| {
                let y: Vec<f64> = (0..S)
                    .map(|c| z[p][c] * w.gamma[k * S + c] + w.beta[k * S + c])
                    .collect();
                let mut r = vec![0.0; S];
                for c in 0..half {
                    let angle = p as f64 * 10_000f64.powf(-(c as f64) / half as f64);
                    let (sin, cos) = angle.sin_cos();
                    r[c] = y[c] * cos - y[c + half] * sin;
                    r[c + half] = y[c + half] * cos + y[c] * sin;
                }
                r
            })
            .collect()
    };
    let causal = direction == Direction::Causal;
    // A[i][j], the full T×T mixing matrix.
    let mut a = vec![vec![0.0; t]; t];
    match span {
        GauSpan::Quad { window: n } => {
            let (q, k) = (head(0), head(1));
            for i in 0..t {
                for j in 0..t {
                    if causal && j > i {
                        continue;
                    }
                    let s = dot(&q[i], &k[j]) / n as f64 + w.rel[j + n - 1 - i];
                    a[i][j] = s.max(0.0).powi(2);
                }
            }
        }
        GauSpan::MixedChunk { chunk: c, parts } => {
            let (qq, kq, ql, kl) = (head(0), head(1), head(2), head(3));
            let f_global = if causal {
                1.0 / c as f64
            } else {
                1.0 / t as f64
            };
            for i in 0..t {
                for j in 0..t {
                    let (gi, gj) = (i / c, j / c);
                    if parts != ChunkParts::GlobalOnly && gi == gj && !(causal && j > i) {
                        let s = dot(&qq[i], &kq[j]) / c as f64 + w.rel[j % c + c - 1 - i % c];
                        a[i][j] += s.max(0.0).powi(2);
                    }
                    if parts != ChunkParts::LocalOnly && (!causal || gj < gi) {
                        a[i][j] += dot(&ql[i], &kl[j]) * f_global;
                    }
                }
            }
        }
    }
    // out = x + (U ⊙ A V) W_o + b_o.
    let mut out = x.to_vec();
    for i in 0..t {
        let gated: Vec<f64> = (0..E)
            .map(|c| u[i][c] * (0..t).map(|j| a[i][j] * v[j][c]).sum::<f64>())
            .collect();
        for o in 0..D {
            out[i * D + o] += (0..E).map(|c| gated[c] * w.wo[c * D + o]).sum::<f64>() + w.bo[o];
        }
    }
    out
}

fn check(span: GauSpan, direction: Direction, t: usize) {
    let device = device();
    device.seed(7);
    let layer = GauConfig::new(D, span, direction)
        .with_d_qk(S)
        .init(&device);
    // Trained-looking weights: γ starts at N(0, 0.02) and β at 0, which would hide most of Q and K.
    let layer = perturb(layer, 0.3, 11);
    let (heads, window) = match span {
        GauSpan::Quad { window } => (2, window),
        GauSpan::MixedChunk { chunk, .. } => (4, chunk),
    };
    let w = weights(&layer, heads, window);
    let x = randn([2, t, D], 3, &device);
    let ours = values(layer.forward(x.clone(), &Rope::new(S, 0, t, &device), None));
    let xs: Vec<f64> = values(x).into_iter().map(f64::from).collect();
    let want: Vec<f32> = (0..2)
        .flat_map(|b| formula(&xs[b * t * D..(b + 1) * t * D], t, &w, span, direction))
        .map(|y| y as f32)
        .collect();
    assert_close(
        &ours,
        &want,
        1e-5,
        &format!("{span:?}, {direction:?}, T = {t}"),
    );
}

#[test]
fn gau_layer_equals_the_papers_formula() {
    for direction in [Direction::Causal, Direction::Bidirectional] {
        check(GauSpan::Quad { window: 16 }, direction, 16);
        check(GauSpan::Quad { window: 16 }, direction, 11);
    }
}

#[test]
fn flash_layer_equals_the_papers_formula() {
    for parts in [ChunkParts::Mixed, ChunkParts::LocalOnly] {
        for direction in [Direction::Causal, Direction::Bidirectional] {
            // 21 = two full chunks of 8 and a padded one.
            check(GauSpan::MixedChunk { chunk: 8, parts }, direction, 21);
        }
    }
}
