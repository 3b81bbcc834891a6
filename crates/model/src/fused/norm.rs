//! LayerNorm and RMSNorm over the last dimension: one pass forward, one backward.
//!
//! burn's autodiff has no LayerNorm op of its own: it records the decomposition of
//! `Backend::layer_norm` (mean, subtract, square, mean, add ε, sqrt, divide, scale, shift), nine
//! passes over the [tokens, d] activations forward and about twice as many backward, for each of a
//! model's 2 · blocks + 1 norms. Here each row of d values stays in L1: the forward computes
//! `y = (x − μ) · rstd · γ + β` with `rstd = 1 / sqrt(σ² + ε)` and keeps (μ, rstd) per row; the
//! backward computes, per row, with `x̂ = (x − μ) · rstd` and `ĝ = dy ⊙ γ`,
//! `dx = rstd · (ĝ − mean(ĝ) − x̂ · mean(ĝ ⊙ x̂))`, and sums `dγ = Σ dy ⊙ x̂`, `dβ = Σ dy` over rows.
//! RMSNorm (T5) is the same without centring: μ = 0, no β, and no `mean(ĝ)` term in `dx`
//! (burn's `RmsNorm` records six ops forward).

#[allow(unused_imports)]
use super::*;

/// Rows per parallel task.
const NORM_ROWS: usize = 64;

/// Which normalisation: the two differ only in whether rows are centred.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Formula {
    /// LayerNorm: `(x − μ) / sqrt(σ² + ε)`.
    Layer,
    /// RMSNorm: `x / sqrt(mean(x²) + ε)`.
    Rms,
}

/// Per-row statistics kept for the backward: the mean (0 for RMSNorm) and `1 / sqrt(var + eps)`
/// (var the mean square for RMSNorm).
struct RowStats {
    mean: Vec<f32>,
    rstd: Vec<f32>,
}

/// The normalised rows, scaled and shifted, and each row's statistics.
fn norm_forward(
    x: &[f32],
    d: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    (eps, formula): (f32, Formula),
) -> (Vec<f32>, RowStats) {
    let _timer = profile::Timer::start(profile::Part::Elementwise);
    let rows = x.len() / d;
    let mut out = zeros(x.len());
    let mut mean = vec![0f32; rows];
    let mut rstd = vec![0f32; rows];
    let level = simd::current();
    out.par_chunks_mut(NORM_ROWS * d)
        .zip(x.par_chunks(NORM_ROWS * d))
        .zip(mean.par_chunks_mut(NORM_ROWS))
        .zip(rstd.par_chunks_mut(NORM_ROWS))
        .for_each(|(((o, x), mu), rs)| {
            level.run(
                #[inline(always)]
                || {
                    let inv_d = 1.0 / d as f32;
                    for (((o, x), mu), rs) in o.chunks_mut(d).zip(x.chunks(d)).zip(mu).zip(rs) {
                        let m = match formula {
                            Formula::Layer => simd::sum(x) * inv_d,
                            Formula::Rms => 0.0,
                        };
                        let var = simd::sum_map(x, |v| (v - m) * (v - m)) * inv_d;
                        let r = 1.0 / (var + eps).sqrt();
                        match beta {
                            Some(beta) => {
                                for (((o, &x), &g), &b) in o.iter_mut().zip(x).zip(gamma).zip(beta)
                                {
                                    *o = (x - m) * r * g + b;
                                }
                            }
                            None => {
                                for ((o, &x), &g) in o.iter_mut().zip(x).zip(gamma) {
                                    *o = (x - m) * r * g;
                                }
                            }
                        }
                        (*mu, *rs) = (m, r);
                    }
                },
            )
        });
    (out, RowStats { mean, rstd })
}

/// (dx, dγ, dβ) for the upstream gradient `g`.
fn norm_backward(
    x: &[f32],
    g: &[f32],
    d: usize,
    gamma: &[f32],
    (stats, formula): (&RowStats, Formula),
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let _timer = profile::Timer::start(profile::Part::Elementwise);
    let mut dx = zeros(x.len());
    let level = simd::current();
    let (dgamma, dbeta): (Vec<_>, Vec<_>) = dx
        .par_chunks_mut(NORM_ROWS * d)
        .zip(x.par_chunks(NORM_ROWS * d))
        .zip(g.par_chunks(NORM_ROWS * d))
        .zip(stats.mean.par_chunks(NORM_ROWS))
        .zip(stats.rstd.par_chunks(NORM_ROWS))
        .map(|((((dx, x), g), mu), rs)| {
            level.run(
                #[inline(always)]
                || {
                    let (mut dgamma, mut dbeta) = (vec![0f32; d], vec![0f32; d]);
                    let mut xhat = vec![0f32; d];
                    let inv_d = 1.0 / d as f32;
                    let rows = dx.chunks_mut(d).zip(x.chunks(d)).zip(g.chunks(d));
                    for (((dx, x), g), (&m, &r)) in rows.zip(mu.iter().zip(rs)) {
                        // x̂ = (x − μ) · rstd and ĝ = g ⊙ γ (into dx); dγ, dβ summed.
                        let sums = dgamma.iter_mut().zip(dbeta.iter_mut());
                        let row = dx.iter_mut().zip(xhat.iter_mut());
                        for (((&x, &g), &gm), ((dx, xh), (dg, db))) in
                            x.iter().zip(g).zip(gamma).zip(row.zip(sums))
                        {
                            *xh = (x - m) * r;
                            *dx = g * gm;
                            *dg += g * *xh;
                            *db += g;
                        }
                        let mean_g = match formula {
                            Formula::Layer => simd::sum(dx) * inv_d,
                            Formula::Rms => 0.0,
                        };
                        let mean_gx = simd::dot(dx, &xhat) * inv_d;
                        for (dx, &xh) in dx.iter_mut().zip(&xhat) {
                            *dx = r * (*dx - mean_g - xh * mean_gx);
                        }
                    }
                    (dgamma, dbeta)
                },
            )
        })
        .unzip();
    (dx, sum_in_order(dgamma, d), sum_in_order(dbeta, d))
}

#[derive(Clone)]
struct NormSaved {
    input: FlexTensor,
    gamma: Arc<Vec<f32>>,
    stats: Arc<RowStats>,
    formula: Formula,
}

impl fmt::Debug for NormSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NormSaved({:?})", dims(&self.input))
    }
}

#[derive(Debug)]
struct NormBackward;

impl<const P: usize> Backward<Flex, P> for NormBackward {
    type State = NormSaved;

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, _: &mut Checkpointer) {
        let saved = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let shape = dims(&saved.input);
        let d = *shape.last().expect("rank ≥ 1");
        let (dx, dgamma, dbeta) = norm_backward(
            slice(&saved.input),
            slice(&grad),
            d,
            &saved.gamma,
            (&saved.stats, saved.formula),
        );
        let results = [
            (Some(dx), shape),
            (Some(dgamma), vec![d]),
            (Some(dbeta), vec![d]),
        ];
        let parents = ops.parents.iter().map(|p| p.as_ref().map(|n| n.id));
        register_grads(grads, parents, results);
    }
}

/// LayerNorm over the last dimension, `(x − μ) / sqrt(σ² + eps) · γ + β` (σ² the biased
/// variance, as burn's `LayerNorm`), fused on `flex` (see the module doc); `None` elsewhere, where
/// callers use burn's module.
///
/// x: [.., d]; gamma, beta: [d] → [.., d].
pub fn layer_norm<const D: usize>(
    x: &Tensor<D>,
    gamma: &Tensor<1>,
    beta: Option<&Tensor<1>>,
    eps: f64,
) -> Option<Tensor<D>> {
    normalise(x, gamma, beta, (eps as f32, Formula::Layer))
}

/// RMSNorm over the last dimension, `x / sqrt(mean(x²) + eps) · γ` (burn's `RmsNorm`, T5's
/// layer norm), fused on `flex` (see the module doc); `None` elsewhere, where callers use burn's
/// module.
///
/// x: [.., d]; gamma: [d] → [.., d].
pub fn rms_norm<const D: usize>(x: &Tensor<D>, gamma: &Tensor<1>, eps: f64) -> Option<Tensor<D>> {
    normalise(x, gamma, None, (eps as f32, Formula::Rms))
}

fn normalise<const D: usize>(
    x: &Tensor<D>,
    gamma: &Tensor<1>,
    beta: Option<&Tensor<1>>,
    (eps, formula): (f32, Formula),
) -> Option<Tensor<D>> {
    let d = x.dims()[D - 1];
    assert_eq!(gamma.dims()[0], d, "norm scale width");
    if let Some(b) = beta {
        assert_eq!(b.dims()[0], d, "norm offset width");
    }
    match route(&x.device()) {
        Route::Reference => None,
        Route::Plain => {
            let p = contiguous(&x.clone().try_into_primitive::<Flex>().ok()?);
            let (gamma, beta) = (host_vec(gamma), beta.map(host_vec));
            let (out, _) = norm_forward(slice(&p), d, &gamma, beta.as_deref(), (eps, formula));
            Some(Tensor::from_primitive::<Flex>(flex_from(out, dims(&p))))
        }
        Route::Autodiff => {
            let t = x.clone().try_into_primitive::<Ad>().ok()?;
            let tg = gamma.clone().try_into_primitive::<Ad>().ok()?;
            let tb = match beta {
                Some(b) => Some(b.clone().try_into_primitive::<Ad>().ok()?),
                None => None,
            };
            let input = contiguous(t.primitive());
            let gamma_host = Arc::new(host_vec(gamma));
            let beta_host = beta.map(host_vec);
            let (out, stats) = norm_forward(
                slice(&input),
                d,
                &gamma_host,
                beta_host.as_deref(),
                (eps, formula),
            );
            let output = flex_from(out, dims(&input));
            let saved = NormSaved {
                input,
                gamma: gamma_host,
                stats: Arc::new(stats),
                formula,
            };
            let out = match tb {
                Some(tb) => record(
                    NormBackward,
                    [t.node(), tg.node(), tb.node()],
                    saved,
                    output,
                ),
                None => record(NormBackward, [t.node(), tg.node()], saved, output),
            };
            Some(Tensor::from_primitive::<Ad>(out))
        }
    }
}
