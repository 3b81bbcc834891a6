//! Elementwise activations (SiLU, GELU), a bias folded in, one pass each way.

#[allow(unused_imports)]
use super::*;

/// An activation computed in one pass forward and one backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x · σ(x)` (GAU's projections, FLASH appendix Code 1).
    Silu,
    /// `x · Φ(x)` with the exact normal CDF (burn's `gelu`; Transformer FFNs).
    Gelu,
    /// GELU with the tanh approximation of Φ, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`
    /// (burn's `gelu_approximate`; T5.1.1's gated feed-forward, `gelu_new` in transformers).
    GeluTanh,
}

/// `erf(x)` (Abramowitz & Stegun 7.1.26; absolute error below 1.5e-7).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152 + t * 1.061_405_4))));
    let y = 1.0 - poly * fast_exp(-a * a);
    y.copysign(x)
}

#[inline(always)]
pub(super) fn silu(x: f32) -> f32 {
    x / (1.0 + fast_exp(-x))
}

#[inline(always)]
pub(super) fn silu_derivative(x: f32) -> f32 {
    let s = 1.0 / (1.0 + fast_exp(-x));
    s * (1.0 + x * (1.0 - s))
}

#[inline(always)]
pub(super) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
pub(super) fn gelu_derivative(x: f32) -> f32 {
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    let cdf = 0.5 * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2));
    cdf + x * INV_SQRT_2PI * fast_exp(-0.5 * x * x)
}

/// `tanh(u)` as `1 − 2 / (e^{2u} + 1)` with [`fast_exp`] (branch-free, so that it vectorises);
/// exactly ±1 once `|u|` is past ~44, where f32's tanh is ±1 too.
#[inline(always)]
fn fast_tanh(u: f32) -> f32 {
    1.0 - 2.0 / (fast_exp(2.0 * u) + 1.0)
}

/// √(2/π), the tanh GELU's scale.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The tanh GELU's cubic coefficient.
const GELU_TANH_CUBIC: f32 = 0.044_715;

#[inline(always)]
pub(super) fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + fast_tanh(SQRT_2_OVER_PI * (x + GELU_TANH_CUBIC * x * x * x)))
}

#[inline(always)]
pub(super) fn gelu_tanh_derivative(x: f32) -> f32 {
    let th = fast_tanh(SQRT_2_OVER_PI * (x + GELU_TANH_CUBIC * x * x * x));
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_CUBIC * x * x);
    0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du
}

impl Activation {
    /// The same activation as plain burn operations.
    pub fn reference<const D: usize>(self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Activation::Silu => burn::tensor::activation::silu(x),
            Activation::Gelu => burn::tensor::activation::gelu(x),
            Activation::GeluTanh => burn::tensor::activation::gelu_approximate(x),
        }
    }
}

/// `x + bias` with the bias ([d]) broadcast along the last dimension, in burn's own ops (the
/// kernels' references); `x` without a bias.
pub(super) fn add_bias<const D: usize>(x: Tensor<D>, bias: Option<Tensor<1>>) -> Tensor<D> {
    match bias {
        Some(b) => {
            let mut shape = [1usize; D];
            shape[D - 1] = b.dims()[0];
            x + b.reshape(shape)
        }
        None => x,
    }
}

/// Elements per parallel task of the elementwise kernels.
pub(super) const ELEMENTWISE_CHUNK: usize = 1 << 14;

/// `o = f(x + bias)` over rows of width `dim` (`for` loops, not `for_each`: an iterator's `fold`
/// that LLVM leaves out of line is compiled for the baseline target, outside the level's features).
#[inline(always)]
fn forward_rows(
    o: &mut [f32],
    x: &[f32],
    bias: Option<&[f32]>,
    dim: usize,
    f: impl Fn(f32) -> f32,
) {
    match bias {
        Some(b) => {
            for (o, x) in o.chunks_mut(dim).zip(x.chunks(dim)) {
                for ((o, &x), &b) in o.iter_mut().zip(x).zip(b) {
                    *o = f(x + b);
                }
            }
        }
        None => {
            for (o, &x) in o.iter_mut().zip(x) {
                *o = f(x);
            }
        }
    }
}

/// `o = g · f'(x + bias)` over rows of width `dim`, the bias's gradient (Σ over rows) added into
/// `db` (empty without a bias).
#[inline(always)]
fn backward_rows(
    (o, x, g): (&mut [f32], &[f32], &[f32]),
    bias: Option<&[f32]>,
    db: &mut [f32],
    dim: usize,
    f: impl Fn(f32) -> f32,
) {
    for ((o, x), g) in o.chunks_mut(dim).zip(x.chunks(dim)).zip(g.chunks(dim)) {
        match bias {
            // Zipped, not indexed: indexing the bias and its sums kept this loop from
            // vectorising (bounds checks).
            Some(b) => {
                let (ox, gb) = (o.iter_mut().zip(x), g.iter().zip(b));
                for (((o, &x), (&g, &b)), db) in ox.zip(gb).zip(db.iter_mut()) {
                    let d = g * f(x + b);
                    *o = d;
                    *db += d;
                }
            }
            None => {
                for ((o, &x), &g) in o.iter_mut().zip(x).zip(g) {
                    *o = g * f(x);
                }
            }
        }
    }
}

/// `act(x + bias)` elementwise, the bias broadcast along the last dimension (width `dim`).
fn act_forward(x: &[f32], bias: Option<&[f32]>, dim: usize, act: Activation) -> Vec<f32> {
    let _timer = profile::Timer::start(profile::Part::Elementwise);
    let mut out = zeros(x.len());
    // Whole rows per task, so that each task's rows line up with the bias.
    let chunk = ELEMENTWISE_CHUNK.div_ceil(dim) * dim;
    let level = simd::current();
    out.par_chunks_mut(chunk)
        .zip(x.par_chunks(chunk))
        .for_each(|(o, x)| {
            // The activation is matched outside the loops: matched per element, LLVM computed
            // both activations for every element and selected one (if-conversion).
            level.run(
                #[inline(always)]
                || match act {
                    Activation::Silu => forward_rows(o, x, bias, dim, silu),
                    Activation::Gelu => forward_rows(o, x, bias, dim, gelu),
                    Activation::GeluTanh => forward_rows(o, x, bias, dim, gelu_tanh),
                },
            )
        });
    out
}

#[derive(Clone)]
struct ActSaved {
    input: FlexTensor,
    bias: Option<Arc<Vec<f32>>>,
    act: Activation,
}

impl fmt::Debug for ActSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ActSaved({:?})", self.act)
    }
}

#[derive(Debug)]
struct ActBackward;

impl<const P: usize> Backward<Flex, P> for ActBackward {
    type State = ActSaved;

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, _: &mut Checkpointer) {
        let _timer = profile::Timer::start(profile::Part::Elementwise);
        let saved = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let shape = dims(&saved.input);
        let dim = *shape.last().expect("rank ≥ 1");
        let (x, g) = (slice(&saved.input), slice(&grad));
        let (act, bias) = (saved.act, saved.bias.as_deref().map(Vec::as_slice));
        let chunk = ELEMENTWISE_CHUNK.div_ceil(dim) * dim;
        let mut dx = zeros(x.len());
        let level = simd::current();
        // dpre = g · act'(x + b); dx = dpre; dbias = Σ over rows of dpre.
        let dbias = dx
            .par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk))
            .zip(g.par_chunks(chunk))
            .map(|((o, x), g)| {
                level.run(
                    #[inline(always)]
                    || {
                        let mut db = vec![0f32; if bias.is_some() { dim } else { 0 }];
                        // Matched outside the loops, as in the forward.
                        match act {
                            Activation::Silu => {
                                backward_rows((o, x, g), bias, &mut db, dim, silu_derivative)
                            }
                            Activation::Gelu => {
                                backward_rows((o, x, g), bias, &mut db, dim, gelu_derivative)
                            }
                            Activation::GeluTanh => {
                                backward_rows((o, x, g), bias, &mut db, dim, gelu_tanh_derivative)
                            }
                        }
                        db
                    },
                )
            })
            .collect::<Vec<_>>();
        let dbias = bias.map(|_| sum_in_order(dbias, dim));
        let parents = ops.parents.iter().map(|p| p.as_ref().map(|n| n.id));
        register_grads(grads, parents, [(Some(dx), shape), (dbias, vec![dim])]);
    }
}

/// `act(x)` elementwise, fused on `flex` (one pass forward, one backward), burn's own elsewhere.
pub fn activation<const D: usize>(x: Tensor<D>, act: Activation) -> Tensor<D> {
    bias_activation(x, None, act)
}

/// `act(x + bias)` with the bias ([d]) broadcast along the last dimension: one pass each way on
/// `flex` (the bias add of a linear layer folded into its activation), burn's own elsewhere.
pub fn bias_activation<const D: usize>(
    x: Tensor<D>,
    bias: Option<Tensor<1>>,
    act: Activation,
) -> Tensor<D> {
    let reference = |x: Tensor<D>, bias: Option<Tensor<1>>| act.reference(add_bias(x, bias));
    let dim = x.dims()[D - 1];
    if let Some(b) = &bias {
        assert_eq!(b.dims()[0], dim, "activation bias width");
    }
    match route(&x.device()) {
        Route::Reference => reference(x, bias),
        Route::Plain => {
            let Ok(p) = x.clone().try_into_primitive::<Flex>() else {
                return reference(x, bias);
            };
            let p = contiguous(&p);
            let host = bias.as_ref().map(host_vec);
            let out = act_forward(slice(&p), host.as_deref(), dim, act);
            Tensor::from_primitive::<Flex>(flex_from(out, dims(&p)))
        }
        Route::Autodiff => {
            let t = x.clone().try_into_primitive::<Ad>();
            let b = bias.clone().map(|b| b.try_into_primitive::<Ad>());
            let (Ok(t), Some(Ok(_)) | None) = (t, &b) else {
                return reference(x, bias);
            };
            let input = contiguous(t.primitive());
            let host = bias.as_ref().map(|b| Arc::new(host_vec(b)));
            let output = flex_from(
                act_forward(
                    slice(&input),
                    host.as_deref().map(|v| v.as_slice()),
                    dim,
                    act,
                ),
                dims(&input),
            );
            let saved = ActSaved {
                input,
                bias: host,
                act,
            };
            let out = match b {
                Some(Ok(b)) => record(ActBackward, [t.node(), b.node()], saved, output),
                Some(Err(_)) => unreachable!("checked above"),
                None => record(ActBackward, [t.node()], saved, output),
            };
            Tensor::from_primitive::<Ad>(out)
        }
    }
}
