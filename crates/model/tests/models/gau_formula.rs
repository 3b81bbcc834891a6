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
//!
//! The Table 1 ablations, by the same hand: softmax scoring `A[i, ·] = softmax_j(q_i·k_j / sqrt(s) +
//! w[j − i + n − 1])` over the visible j; h heads (heads q_1..q_h, k_1..k_h; head g mixes V's
//! columns g·e/h .. (g + 1)·e/h); no gate (U ≡ 1, the projection without U's columns); no bias; no
//! RoPE.

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use model::ChunkParts;
use model::gau::{Gau, GauConfig, GauScoring, GauSpan};
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

/// The Table 1 ablation fields of one layer (the paper's GAU: `Ablation::PAPER`).
#[derive(Clone, Copy, Debug)]
struct Ablation {
    scoring: GauScoring,
    heads: usize,
    gated: bool,
    bias: bool,
    rope: bool,
}

impl Ablation {
    const PAPER: Ablation = Ablation {
        scoring: GauScoring::Relu2,
        heads: 1,
        gated: true,
        bias: true,
        rope: true,
    };
    /// Width of U in the projection.
    fn d_u(self) -> usize {
        if self.gated { E } else { 0 }
    }
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
    /// Toeplitz weights, 2n − 1 (n the bias window); none without the bias.
    rel: Option<Vec<f64>>,
    /// [e, d]
    wo: Vec<f64>,
    bo: Vec<f64>,
}

fn weights(layer: &Gau, heads: usize, window: usize, abl: Ablation) -> Weights {
    let p = parameters(layer);
    let shapes: Vec<&Vec<usize>> = p.iter().map(|(s, _)| s).collect();
    let width = abl.d_u() + E + S;
    let mut want: Vec<Vec<usize>> = vec![
        vec![D],
        vec![D],
        vec![D, width],
        vec![width],
        vec![heads, S],
        vec![heads, S],
    ];
    if abl.bias {
        want.push(vec![2 * window - 1]);
    }
    want.extend([vec![E, D], vec![D]]);
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
        rel: abl.bias.then(&mut next),
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
fn formula(
    x: &[f64],
    t: usize,
    w: &Weights,
    (span, direction): (GauSpan, Direction),
    abl: Ablation,
) -> Vec<f64> {
    let du = abl.d_u();
    let width = du + E + S;
    // h = LayerNorm(x); [U | V | Z] = silu(h W + b); U ≡ 1 without the gate.
    let mut u = vec![vec![1.0; E]; t];
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
                o if o < du => u[i][o] = y,
                o if o < du + E => v[i][o - du] = y,
                o => z[i][o - du - E] = y,
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
                if !abl.rope {
                    return y;
                }
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
    let rel = |idx: usize| w.rel.as_ref().map_or(0.0, |r| r[idx]);
    // a[g][i][j], the full T×T mixing matrix of head g (one head but with h heads).
    let mut heads_a = vec![vec![vec![0.0; t]; t]; abl.heads];
    match span {
        GauSpan::Quad { window: n } => {
            for (g, a) in heads_a.iter_mut().enumerate() {
                let (q, k) = (head(g), head(abl.heads + g));
                for i in 0..t {
                    let visible = if causal { i + 1 } else { t };
                    let scores: Vec<f64> = (0..visible)
                        .map(|j| {
                            let qk = dot(&q[i], &k[j]);
                            match abl.scoring {
                                GauScoring::Relu2 => qk / n as f64 + rel(j + n - 1 - i),
                                GauScoring::Softmax => qk / (S as f64).sqrt() + rel(j + n - 1 - i),
                            }
                        })
                        .collect();
                    match abl.scoring {
                        GauScoring::Relu2 => {
                            for (j, s) in scores.iter().enumerate() {
                                a[i][j] = s.max(0.0).powi(2);
                            }
                        }
                        GauScoring::Softmax => {
                            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                            for (j, s) in scores.iter().enumerate() {
                                a[i][j] = (s - max).exp() / total;
                            }
                        }
                    }
                }
            }
        }
        GauSpan::MixedChunk { chunk: c, parts } => {
            let a = &mut heads_a[0];
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
                        let s = dot(&qq[i], &kq[j]) / c as f64 + rel(j % c + c - 1 - i % c);
                        a[i][j] += s.max(0.0).powi(2);
                    }
                    if parts != ChunkParts::LocalOnly && (!causal || gj < gi) {
                        a[i][j] += dot(&ql[i], &kl[j]) * f_global;
                    }
                }
            }
        }
    }
    // out = x + (U ⊙ A V) W_o + b_o, column c mixed by head c / (e/h).
    let mut out = x.to_vec();
    let group = E / abl.heads;
    for i in 0..t {
        let gated: Vec<f64> = (0..E)
            .map(|c| {
                let a = &heads_a[c / group];
                u[i][c] * (0..t).map(|j| a[i][j] * v[j][c]).sum::<f64>()
            })
            .collect();
        for o in 0..D {
            out[i * D + o] += (0..E).map(|c| gated[c] * w.wo[c * D + o]).sum::<f64>() + w.bo[o];
        }
    }
    out
}

fn check(span: GauSpan, direction: Direction, t: usize) {
    check_ablation(span, direction, t, Ablation::PAPER);
}

fn check_ablation(span: GauSpan, direction: Direction, t: usize, abl: Ablation) {
    let device = device();
    device.seed(7);
    let layer = GauConfig::new(D, span, direction)
        .with_d_qk(S)
        .with_scoring(abl.scoring)
        .with_heads(abl.heads)
        .with_gated(abl.gated)
        .with_relative_bias(abl.bias)
        .with_rope(abl.rope)
        .init(&device);
    // Trained-looking weights: γ starts at N(0, 0.02) and β at 0, which would hide most of Q and K.
    let layer = perturb(layer, 0.3, 11);
    let (heads, window) = match span {
        GauSpan::Quad { window } => (2 * abl.heads, window),
        GauSpan::MixedChunk { chunk, .. } => (4, chunk),
    };
    let w = weights(&layer, heads, window, abl);
    let x = randn([2, t, D], 3, &device);
    let ours = values(layer.forward(x.clone(), &Rope::new(S, 0, t, &device), None));
    let xs: Vec<f64> = values(x).into_iter().map(f64::from).collect();
    let want: Vec<f32> = (0..2)
        .flat_map(|b| {
            let x = &xs[b * t * D..(b + 1) * t * D];
            formula(x, t, &w, (span, direction), abl)
        })
        .map(|y| y as f32)
        .collect();
    assert_close(
        &ours,
        &want,
        1e-5,
        &format!("{span:?}, {direction:?}, T = {t}, {abl:?}"),
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

#[test]
fn gau_ablations_equal_the_formula() {
    let p = Ablation::PAPER;
    let rows = [
        Ablation {
            scoring: GauScoring::Softmax,
            ..p
        },
        Ablation { heads: 2, ..p },
        Ablation { heads: 4, ..p },
        Ablation { gated: false, ..p },
        Ablation { bias: false, ..p },
        Ablation { rope: false, ..p },
        Ablation {
            scoring: GauScoring::Softmax,
            heads: 2,
            ..p
        },
    ];
    for abl in rows {
        for direction in [Direction::Causal, Direction::Bidirectional] {
            check_ablation(GauSpan::Quad { window: 16 }, direction, 13, abl);
        }
    }
    // The chunked layer takes the gate, bias and RoPE ablations too.
    for abl in [
        Ablation { gated: false, ..p },
        Ablation { rope: false, ..p },
    ] {
        let span = GauSpan::MixedChunk {
            chunk: 8,
            parts: ChunkParts::Mixed,
        };
        check_ablation(span, Direction::Causal, 21, abl);
    }
}
