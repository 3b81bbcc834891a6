//! Rotary position embedding, with GAU's per-head scale and offset folded in, one pass each way.

#[allow(unused_imports)]
use super::*;

/// Rows per parallel task of the rotary kernel.
const ROTARY_ROWS: usize = 256;

/// RoPE tables as host slices: cos and sin, each [T, dim / 2].
#[derive(Clone, Debug)]
pub struct RotaryTables {
    /// cos(p · ω_i), row-major [T, dim / 2].
    pub cos: Arc<Vec<f32>>,
    /// sin(p · ω_i), row-major [T, dim / 2].
    pub sin: Arc<Vec<f32>>,
    /// Number of positions T.
    pub len: usize,
}

impl RotaryTables {
    /// (cos, sin) of position `p` for vectors of width `2 · half`: each `half` long.
    #[inline(always)]
    pub(super) fn at(&self, p: usize, half: usize) -> (&[f32], &[f32]) {
        let span = p * half..(p + 1) * half;
        (&self.cos[span.clone()], &self.sin[span])
    }
}

#[derive(Clone)]
struct RotSaved {
    input: FlexTensor,
    gamma: Option<Arc<Vec<f32>>>,
    tables: RotaryTables,
}

impl fmt::Debug for RotSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RotSaved({} positions)", self.tables.len)
    }
}

/// Which way [`turn_pair`] turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// RoPE's rotation (the forward).
    Forward,
    /// Its inverse, the transpose (the gradient of the rotation).
    Back,
}

/// One RoPE pair `(a, b)` (entries i and i + dim/2 of a vector: FLASH's convention) turned by the
/// angle whose cosine and sine are `(c, s)`.
#[inline(always)]
pub(super) fn turn_pair((a, b): (f32, f32), (c, s): (f32, f32), turn: Turn) -> (f32, f32) {
    match turn {
        Turn::Forward => (a * c - b * s, b * c + a * s),
        Turn::Back => (a * c + b * s, b * c - a * s),
    }
}

/// `rotate(γ ⊙ x + β)` rows of width `dim`, in place in `out` (which holds x).
#[inline(always)]
fn rotate_rows(
    out: &mut [f32],
    first_row: usize,
    dim: usize,
    affine: Option<(&[f32], &[f32])>,
    tab: &RotaryTables,
) {
    let half = dim / 2;
    for (r, row) in out.chunks_mut(dim).enumerate() {
        let p = (first_row + r) % tab.len;
        if let Some((g, b)) = affine {
            row.iter_mut()
                .zip(g)
                .zip(b)
                .for_each(|((x, g), b)| *x = *x * g + b);
        }
        let (cos, sin) = tab.at(p, half);
        let (x1, x2) = row.split_at_mut(half);
        for (((x1, x2), &c), &s) in x1.iter_mut().zip(x2.iter_mut()).zip(cos).zip(sin) {
            (*x1, *x2) = turn_pair((*x1, *x2), (c, s), Turn::Forward);
        }
    }
}

fn rotate_forward(
    x: &[f32],
    dim: usize,
    affine: Option<(&[f32], &[f32])>,
    tab: &RotaryTables,
) -> Vec<f32> {
    let _timer = profile::Timer::start(profile::Part::Elementwise);
    // Copied by the tasks (not `x.to_vec()` on the calling thread), each rotating its rows in place.
    let mut out = zeros(x.len());
    let level = simd::current();
    out.par_chunks_mut(ROTARY_ROWS * dim)
        .zip(x.par_chunks(ROTARY_ROWS * dim))
        .enumerate()
        .for_each(|(c, (rows, x))| {
            rows.copy_from_slice(x);
            level.run(
                #[inline(always)]
                || rotate_rows(rows, c * ROTARY_ROWS, dim, affine, tab),
            )
        });
    out
}

#[derive(Debug)]
struct RotBackward;

impl<const P: usize> Backward<Flex, P> for RotBackward {
    type State = RotSaved;

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, _: &mut Checkpointer) {
        let _timer = profile::Timer::start(profile::Part::Elementwise);
        let saved = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let (x, g) = (slice(&saved.input), slice(&grad));
        let shape = dims(&saved.input);
        let dim = *shape.last().expect("rank ≥ 1");
        let half = dim / 2;
        let tab = &saved.tables;
        let gamma = saved.gamma.as_deref();
        // dY = Rᵀ dOut (the inverse rotation); dX = γ ⊙ dY; dγ = Σ X ⊙ dY; dβ = Σ dY.
        let mut dx = zeros(x.len());
        let level = simd::current();
        let (dgamma, dbeta) = dx
            .par_chunks_mut(ROTARY_ROWS * dim)
            .zip(x.par_chunks(ROTARY_ROWS * dim))
            .zip(g.par_chunks(ROTARY_ROWS * dim))
            .enumerate()
            .map(|(c, ((dx, x), g))| {
                level.run(
                    #[inline(always)]
                    || {
                        let (mut dgam, mut dbet) = (vec![0f32; dim], vec![0f32; dim]);
                        for (r, ((dx, x), g)) in dx
                            .chunks_mut(dim)
                            .zip(x.chunks(dim))
                            .zip(g.chunks(dim))
                            .enumerate()
                        {
                            let p = (c * ROTARY_ROWS + r) % tab.len;
                            let (cos, sin) = tab.at(p, half);
                            let (g1, g2) = g.split_at(half);
                            let (dx1, dx2) = dx.split_at_mut(half);
                            let pairs = dx1.iter_mut().zip(dx2.iter_mut()).zip(g1.iter().zip(g2));
                            for (((o1, o2), (&d1, &d2)), (&c, &s)) in pairs.zip(cos.iter().zip(sin))
                            {
                                (*o1, *o2) = turn_pair((d1, d2), (c, s), Turn::Back);
                            }
                            if let Some(gamma) = gamma {
                                let sums = dgam.iter_mut().zip(dbet.iter_mut());
                                for (((dg, db), (&x, dx)), &gm) in
                                    sums.zip(x.iter().zip(dx)).zip(gamma)
                                {
                                    *dg += x * *dx;
                                    *db += *dx;
                                    *dx *= gm;
                                }
                            }
                        }
                        (dgam, dbet)
                    },
                )
            })
            .unzip::<_, _, Vec<_>, Vec<_>>();
        let (dgamma, dbeta) = (sum_in_order(dgamma, dim), sum_in_order(dbeta, dim));
        let results = [
            (Some(dx), shape),
            (Some(dgamma), vec![dim]),
            (Some(dbeta), vec![dim]),
        ];
        let parents = ops.parents.iter().map(|p| p.as_ref().map(|n| n.id));
        register_grads(grads, parents, results);
    }
}

/// Rotary position embedding (FLASH's convention: the two halves of each vector rotate) of
/// `γ ⊙ x + β`, or of `x` without `affine`, fused, or `None` off `flex`.
///
/// x: [.., T, dim] with T = `tables.len`; γ, β: [dim] → [.., T, dim].
pub fn rotary<const D: usize>(
    x: &Tensor<D>,
    affine: Option<(&Tensor<1>, &Tensor<1>)>,
    tables: &RotaryTables,
) -> Option<Tensor<D>> {
    let dims_x = x.dims();
    assert_eq!(
        dims_x[D - 2],
        tables.len,
        "RoPE tables cover {} positions, input has {}",
        tables.len,
        dims_x[D - 2]
    );
    let route = route(&x.device());
    if route == Route::Reference {
        return None;
    }
    let host = affine.map(|(g, b)| (host_vec(g), host_vec(b)));
    let host_ref = host.as_ref().map(|(g, b)| (g.as_slice(), b.as_slice()));
    let dim = dims_x[D - 1];
    match route {
        Route::Plain => {
            let p = contiguous(&x.clone().try_into_primitive::<Flex>().ok()?);
            let out = rotate_forward(slice(&p), dim, host_ref, tables);
            Some(Tensor::from_primitive::<Flex>(flex_from(out, dims(&p))))
        }
        Route::Autodiff => {
            let t = x.clone().try_into_primitive::<Ad>().ok()?;
            let input = contiguous(t.primitive());
            let output = flex_from(
                rotate_forward(slice(&input), dim, host_ref, tables),
                dims(&input),
            );
            let gamma = host.map(|(g, _)| Arc::new(g));
            let saved = RotSaved {
                input,
                gamma,
                tables: tables.clone(),
            };
            let out = match affine {
                Some((g, b)) => {
                    let g = g.clone().try_into_primitive::<Ad>().ok()?;
                    let b = b.clone().try_into_primitive::<Ad>().ok()?;
                    record(RotBackward, [t.node(), g.node(), b.node()], saved, output)
                }
                None => record(RotBackward, [t.node()], saved, output),
            };
            Some(Tensor::from_primitive::<Ad>(out))
        }
        Route::Reference => None,
    }
}
