//! Gated activations `act(x + b) ⊙ gate`, one pass each way.
//!
//! Two places in the models multiply an activated projection by a gate, and burn did each in four
//! single-threaded passes over [N, f] (the activation's own pass aside): the product forward and,
//! backward, `g ⊙ gate` and `g ⊙ act(x + b)` as separate tensors.
//! - GAU's gate `U ⊙ Â V` (FLASH §2, Eq. 1, `U = φ_u(X W_u)` with φ = SiLU): U's activation is
//!   folded in, the gate is the attention output ([`Gate::Tensor`]).
//! - The GLU feed-forward `gelu(x W₁ + b₁) ⊙ (x W₂ + b₂)` (Shazeer 2020, Transformer++):
//!   both halves come from one product `x [W₁ W₂]`, so `x` is used once and its gradient is one
//!   product instead of two summed ([`Gate::SecondHalf`]).

#[allow(unused_imports)]
use super::*;

use super::activation::{
    Activation, ELEMENTWISE_CHUNK, add_bias, gelu, gelu_derivative, gelu_tanh,
    gelu_tanh_derivative, silu, silu_derivative,
};

/// Where the gate of [`gated_activation`] comes from.
// Built once per call and moved in: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Gate<const D: usize> {
    /// A tensor of the output's shape: `act(x + b) ⊙ gate` (GAU's `U ⊙ A`, the bias `[f]` U's).
    Tensor(Tensor<D>),
    /// The input's second half: `x` is `[.., 2f]`, the output `act(x[.., :f] + b[:f]) ⊙
    /// (x[.., f:] + b[f:])` (GLU; the bias `[2f]` covers both halves).
    SecondHalf,
}

/// How the gate is laid out in the kernels' buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GateLayout {
    /// A buffer of its own, rows of width f.
    Separate,
    /// Columns f..2f of the input's rows (width 2f).
    SecondHalf,
}

/// `o = act(xa + ba) ⊙ (xg + bg)` over one row.
#[inline(always)]
fn forward_row(
    o: &mut [f32],
    (xa, xg): (&[f32], &[f32]),
    (ba, bg): (&[f32], &[f32]),
    act: impl Fn(f32) -> f32,
) {
    let inputs = xa.iter().zip(xg);
    let biases = ba.iter().zip(bg);
    for ((o, (&a, &g)), (&ba, &bg)) in o.iter_mut().zip(inputs).zip(biases) {
        *o = act(a + ba) * (g + bg);
    }
}

/// `dxa = g ⊙ (xg + bg) ⊙ act'(xa + ba)`, `dxg = g ⊙ act(xa + ba)` over one row, both added into
/// the bias sums `dba`, `dbg`.
#[inline(always)]
#[allow(clippy::type_complexity)]
fn backward_row(
    (dxa, dxg): (&mut [f32], &mut [f32]),
    (xa, xg, g): (&[f32], &[f32], &[f32]),
    (ba, bg): (&[f32], &[f32]),
    (dba, dbg): (&mut [f32], &mut [f32]),
    (act, act_derivative): (impl Fn(f32) -> f32, impl Fn(f32) -> f32),
) {
    let outs = dxa.iter_mut().zip(dxg.iter_mut());
    let ins = xa.iter().zip(xg).zip(g);
    let biases = ba.iter().zip(bg);
    let sums = dba.iter_mut().zip(dbg.iter_mut());
    for ((((da, dg), ((&a, &gt), &g)), (&ba, &bg)), (sa, sg)) in outs.zip(ins).zip(biases).zip(sums)
    {
        let pre = a + ba;
        let d_act = g * (gt + bg) * act_derivative(pre);
        let d_gate = g * act(pre);
        *da = d_act;
        *dg = d_gate;
        *sa += d_act;
        *sg += d_gate;
    }
}

/// The forward over `rows` rows of width `f`: `x` rows of width f (separate gate) or 2f (second
/// half), `gate` the separate gate's rows (empty for the second half), `bias` [f] or [2f] (zeros
/// when the caller has none).
fn gated_forward(
    (x, gate, bias): (&[f32], &[f32], &[f32]),
    f: usize,
    layout: GateLayout,
    act: Activation,
) -> Vec<f32> {
    let _timer = profile::Timer::start(profile::Part::Elementwise);
    let x_width = f * layout.input_width_factor();
    let mut out = zeros(x.len() / x_width.max(1) * f);
    if f == 0 {
        return out;
    }
    let rows_per_task = ELEMENTWISE_CHUNK.div_ceil(f);
    let (ba, bg) = layout.bias_parts(bias, f);
    let (ba, bg) = (&ba[..], &bg[..]);
    let level = simd::current();
    out.par_chunks_mut(rows_per_task * f)
        .enumerate()
        .for_each(|(task, o)| {
            let first = task * rows_per_task;
            level.run(
                #[inline(always)]
                || {
                    for (i, o) in o.chunks_mut(f).enumerate() {
                        let r = first + i;
                        let xr = &x[r * x_width..(r + 1) * x_width];
                        let (xa, xg) = match layout {
                            GateLayout::Separate => (xr, &gate[r * f..(r + 1) * f]),
                            GateLayout::SecondHalf => xr.split_at(f),
                        };
                        // The activation is matched outside the element loop (see activation.rs).
                        match act {
                            Activation::Silu => forward_row(o, (xa, xg), (ba, bg), silu),
                            Activation::Gelu => forward_row(o, (xa, xg), (ba, bg), gelu),
                            Activation::GeluTanh => forward_row(o, (xa, xg), (ba, bg), gelu_tanh),
                        }
                    }
                },
            )
        });
    out
}

/// The backward: `(dx, dgate, dbias)` for the output gradient `g` [rows, f]; `dx` has the input's
/// width, `dgate` is empty for the second-half layout (its part is in `dx`), `dbias` has the
/// bias's width.
fn gated_backward(
    (x, gate, bias): (&[f32], &[f32], &[f32]),
    g: &[f32],
    f: usize,
    layout: GateLayout,
    act: Activation,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let _timer = profile::Timer::start(profile::Part::Elementwise);
    let x_width = f * layout.input_width_factor();
    let mut dx = zeros(x.len());
    let mut dgate = zeros(gate.len());
    if f == 0 {
        return (dx, dgate, vec![0f32; bias.len()]);
    }
    let rows_per_task = ELEMENTWISE_CHUNK.div_ceil(f);
    let (ba, bg) = layout.bias_parts(bias, f);
    let (ba, bg) = (&ba[..], &bg[..]);
    let level = simd::current();
    // One task per block of rows: its rows of dx (and of the separate dgate), its bias sums.
    let task = |first: usize, dxc: &mut [f32], mut dgc: Option<&mut [f32]>| {
        level.run(
            #[inline(always)]
            || {
                let mut dba = vec![0f32; f];
                let mut dbg = vec![0f32; f];
                for (i, dxr) in dxc.chunks_mut(x_width).enumerate() {
                    let r = first + i;
                    let xr = &x[r * x_width..(r + 1) * x_width];
                    let gr = &g[r * f..(r + 1) * f];
                    let (xa, xg, da, dg) = match dgc.as_deref_mut() {
                        Some(dgc) => (
                            xr,
                            &gate[r * f..(r + 1) * f],
                            dxr,
                            &mut dgc[i * f..(i + 1) * f],
                        ),
                        None => {
                            let (xa, xg) = xr.split_at(f);
                            let (da, dg) = dxr.split_at_mut(f);
                            (xa, xg, da, dg)
                        }
                    };
                    let sums = (&mut dba[..], &mut dbg[..]);
                    // Matched outside the element loop, as in the forward.
                    match act {
                        Activation::Silu => backward_row(
                            (da, dg),
                            (xa, xg, gr),
                            (ba, bg),
                            sums,
                            (silu, silu_derivative),
                        ),
                        Activation::Gelu => backward_row(
                            (da, dg),
                            (xa, xg, gr),
                            (ba, bg),
                            sums,
                            (gelu, gelu_derivative),
                        ),
                        Activation::GeluTanh => backward_row(
                            (da, dg),
                            (xa, xg, gr),
                            (ba, bg),
                            sums,
                            (gelu_tanh, gelu_tanh_derivative),
                        ),
                    }
                }
                (dba, dbg)
            },
        )
    };
    let partials: Vec<(Vec<f32>, Vec<f32>)> = match layout {
        GateLayout::Separate => dx
            .par_chunks_mut(rows_per_task * x_width)
            .zip(dgate.par_chunks_mut(rows_per_task * f))
            .enumerate()
            .map(|(t, (dxc, dgc))| task(t * rows_per_task, dxc, Some(dgc)))
            .collect(),
        GateLayout::SecondHalf => dx
            .par_chunks_mut(rows_per_task * x_width)
            .enumerate()
            .map(|(t, dxc)| task(t * rows_per_task, dxc, None))
            .collect(),
    };
    let (dba, dbg): (Vec<_>, Vec<_>) = partials.into_iter().unzip();
    let mut dbias = sum_in_order(dba, f);
    if layout == GateLayout::SecondHalf {
        dbias.extend(sum_in_order(dbg, f));
    }
    (dx, dgate, dbias)
}

impl GateLayout {
    /// The layout of a separate gate buffer (`Some`) or of the input's second half (`None`).
    fn of(gate: Option<&FlexTensor>) -> GateLayout {
        match gate {
            Some(_) => GateLayout::Separate,
            None => GateLayout::SecondHalf,
        }
    }

    /// The activation's and the gate's bias (`[f]` each; the separate gate has none: zeros).
    fn bias_parts(self, bias: &[f32], f: usize) -> (Vec<f32>, Vec<f32>) {
        match self {
            GateLayout::Separate => (bias.to_vec(), vec![0f32; f]),
            GateLayout::SecondHalf => (bias[..f].to_vec(), bias[f..].to_vec()),
        }
    }

    /// The input's row width in units of the output's.
    fn input_width_factor(self) -> usize {
        match self {
            GateLayout::Separate => 1,
            GateLayout::SecondHalf => 2,
        }
    }
}

#[derive(Clone)]
struct GatedSaved {
    x: FlexTensor,
    /// The separate gate (none for the second-half layout).
    gate: Option<FlexTensor>,
    /// The bias on the host (zeros when the caller has none; then no gradient is registered).
    bias: Arc<Vec<f32>>,
    has_bias: bool,
    f: usize,
    act: Activation,
}

impl fmt::Debug for GatedSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GatedSaved({:?}, {:?})", self.act, dims(&self.x))
    }
}

#[derive(Debug)]
struct GatedBackward;

impl<const P: usize> Backward<Flex, P> for GatedBackward {
    type State = GatedSaved;

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, _: &mut Checkpointer) {
        let s = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let layout = GateLayout::of(s.gate.as_ref());
        let gate = s.gate.as_ref().map(slice).unwrap_or(&[]);
        let (dx, dgate, dbias) = gated_backward(
            (slice(&s.x), gate, &s.bias),
            slice(&grad),
            s.f,
            layout,
            s.act,
        );
        // Parents in the order they were recorded: x, the separate gate, the bias.
        let mut results = vec![(Some(dx), dims(&s.x))];
        if let Some(gt) = &s.gate {
            results.push((Some(dgate), dims(gt)));
        }
        if s.has_bias {
            results.push((Some(dbias), vec![s.bias.len()]));
        }
        let parents = ops.parents.iter().map(|p| p.as_ref().map(|n| n.id));
        register_grads(grads, parents, results);
    }
}

/// The forward on contiguous flex tensors: the separate gate `pg`, or none for the second half.
fn forward_flex(
    px: &FlexTensor,
    pg: Option<&FlexTensor>,
    bias: &[f32],
    f: usize,
    act: Activation,
    out_shape: &[usize],
) -> FlexTensor {
    let layout = GateLayout::of(pg);
    let gate = pg.map(slice).unwrap_or(&[]);
    let out = gated_forward((slice(px), gate, bias), f, layout, act);
    flex_from(out, out_shape.to_vec())
}

/// `act(x + bias) ⊙ gate`, one pass forward and one backward on `flex` (parallel), burn's own
/// operations elsewhere. With [`Gate::Tensor`] `x`, the gate and the output share a shape and the
/// bias is `[f]`; with [`Gate::SecondHalf`] `x` is `[.., 2f]`, the bias `[2f]`, the output `[.., f]`.
pub fn gated_activation<const D: usize>(
    x: Tensor<D>,
    bias: Option<Tensor<1>>,
    act: Activation,
    gate: Gate<D>,
) -> Tensor<D> {
    let width = x.dims()[D - 1];
    let f = match &gate {
        Gate::Tensor(g) => {
            assert_eq!(
                g.dims(),
                x.dims(),
                "gated_activation: gate and input shapes"
            );
            width
        }
        Gate::SecondHalf => {
            assert_eq!(width % 2, 0, "gated_activation: odd input width {width}");
            width / 2
        }
    };
    if let Some(b) = &bias {
        assert_eq!(b.dims()[0], width, "gated_activation: bias width");
    }
    let reference = |x: Tensor<D>, bias: Option<Tensor<1>>, gate: Gate<D>| {
        let x = add_bias(x, bias);
        match gate {
            Gate::Tensor(g) => act.reference(x) * g,
            Gate::SecondHalf => {
                act.reference(x.clone().narrow(D - 1, 0, f)) * x.narrow(D - 1, f, f)
            }
        }
    };
    let mut out_shape = x.dims();
    out_shape[D - 1] = f;
    let host_bias = |b: &Option<Tensor<1>>| {
        Arc::new(
            b.as_ref()
                .map(host_vec)
                .unwrap_or_else(|| vec![0f32; width]),
        )
    };
    match route(&x.device()) {
        Route::Reference => reference(x, bias, gate),
        Route::Plain => {
            let px = x.clone().try_into_primitive::<Flex>();
            let pg = match &gate {
                Gate::Tensor(g) => g.clone().try_into_primitive::<Flex>().map(Some),
                Gate::SecondHalf => Ok(None),
            };
            let (Ok(px), Ok(pg)) = (px, pg) else {
                return reference(x, bias, gate);
            };
            let (px, pg) = (contiguous(&px), pg.map(|g| contiguous(&g)));
            let out = forward_flex(&px, pg.as_ref(), &host_bias(&bias), f, act, &out_shape);
            Tensor::from_primitive::<Flex>(out)
        }
        Route::Autodiff => {
            let tx = x.clone().try_into_primitive::<Ad>();
            let tg = match &gate {
                Gate::Tensor(g) => g.clone().try_into_primitive::<Ad>().map(Some),
                Gate::SecondHalf => Ok(None),
            };
            let tb = bias
                .clone()
                .map(|b| b.try_into_primitive::<Ad>())
                .transpose();
            let (Ok(tx), Ok(tg), Ok(tb)) = (tx, tg, tb) else {
                return reference(x, bias, gate);
            };
            let px = contiguous(tx.primitive());
            let pg = tg.as_ref().map(|g| contiguous(g.primitive()));
            let b = host_bias(&bias);
            let output = forward_flex(&px, pg.as_ref(), &b, f, act, &out_shape);
            let saved = GatedSaved {
                x: px,
                gate: pg,
                bias: b,
                has_bias: tb.is_some(),
                f,
                act,
            };
            let out = match (tg, tb) {
                (None, None) => record(GatedBackward, [tx.node()], saved, output),
                (Some(g), None) => record(GatedBackward, [tx.node(), g.node()], saved, output),
                (None, Some(b)) => record(GatedBackward, [tx.node(), b.node()], saved, output),
                (Some(g), Some(b)) => record(
                    GatedBackward,
                    [tx.node(), g.node(), b.node()],
                    saved,
                    output,
                ),
            };
            Tensor::from_primitive::<Ad>(out)
        }
    }
}
