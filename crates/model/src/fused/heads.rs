//! Attention heads out of and back into the model width, one parallel pass each way: a
//! projection's [B, T, H·dh] output becomes heads [B·H, T, dh] (with RoPE folded in, for queries
//! and keys), and the attention output's heads go back to [B, T, H·dh].
//!
//! As burn ops a split is `reshape → swap_dims → reshape`, whose copy (flex's `copy_2d_tiled`) runs
//! on the calling thread, RoPE then makes a pass of its own, and autodiff's backward copies once
//! more each way. In Transformer++'s step at 512 tokens (table11's shapes) those copies took about
//! 0.18 s of 1.84 (measured against a build that skipped them, `profile_step`, a 2-core Zen 4
//! EPYC).

#[allow(unused_imports)]
use super::*;

use std::mem::MaybeUninit;

use super::rotary::{Turn, turn_pair};

/// dh-vectors per parallel task.
const HEAD_VECTORS: usize = 512;

/// Which way [`move_heads`] moves vectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Move {
    /// [B, T, H, dh] → [B, H, T, dh].
    ToHeads,
    /// [B, H, T, dh] → [B, T, H, dh].
    FromHeads,
}

/// (B, T, H, dh)
type HeadDims = (usize, usize, usize, usize);

impl Move {
    fn reversed(self) -> Self {
        match self {
            Move::ToHeads => Move::FromHeads,
            Move::FromHeads => Move::ToHeads,
        }
    }

    /// The shape of what this move makes.
    fn output_shape(self, (b, t, h, dh): HeadDims) -> Vec<usize> {
        match self {
            Move::ToHeads => vec![b * h, t, dh],
            Move::FromHeads => vec![b, t, h * dh],
        }
    }
}

/// `src`'s dh-vectors moved as `way` says, each turned by RoPE at its position t (`turn` of the
/// tables, which cover T positions of width dh) when `rotary` is given.
fn move_heads(
    src: &[f32],
    (b, t, h, dh): HeadDims,
    way: Move,
    rotary: Option<(&RotaryTables, Turn)>,
) -> Vec<f32> {
    let _timer = profile::Timer::start(profile::Part::Elementwise);
    let n = b * t * h * dh;
    assert_eq!(src.len(), n, "attention heads: input size");
    let half = dh / 2;
    if let Some((tab, _)) = rotary {
        assert!(
            dh.is_multiple_of(2) && tab.len == t && tab.cos.len() == t * half,
            "attention heads: RoPE tables for {} positions of width {}, heads of {t} × {dh}",
            tab.len,
            2 * tab.cos.len() / tab.len.max(1)
        );
    }
    let mut out: Vec<f32> = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let level = simd::current();
    // Output vector `o` ↔ (batch, head, position) ↔ the source vector it comes from.
    let source = |o: usize| -> (usize, usize) {
        match way {
            Move::ToHeads => {
                let (bh, ti) = (o / t, o % t);
                (((bh / h) * t + ti) * h + bh % h, ti)
            }
            Move::FromHeads => {
                let (bt, hh) = (o / h, o % h);
                (((bt / t) * h + hh) * t + bt % t, bt % t)
            }
        }
    };
    out.spare_capacity_mut()[..n]
        .par_chunks_mut(HEAD_VECTORS * dh)
        .enumerate()
        .for_each(|(c, dst)| {
            level.run(
                #[inline(always)]
                || {
                    for (i, d) in dst.chunks_mut(dh).enumerate() {
                        let (from, p) = source(c * HEAD_VECTORS + i);
                        let s = &src[from * dh..(from + 1) * dh];
                        match rotary {
                            None => write_copy(d, s),
                            Some((tab, Turn::Forward)) => write_turned(d, s, tab, p, Turn::Forward),
                            Some((tab, Turn::Back)) => write_turned(d, s, tab, p, Turn::Back),
                        }
                    }
                },
            )
        });
    // SAFETY: the chunks above cover all n elements, and every vector of every chunk was written.
    unsafe { out.set_len(n) };
    out
}

#[inline(always)]
fn write_copy(dst: &mut [MaybeUninit<f32>], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(s);
    }
}

/// `dst` ← `src` turned at position `p`: pairs (i, i + dh/2) as in [`rotary`](super::rotary).
#[inline(always)]
fn write_turned(
    dst: &mut [MaybeUninit<f32>],
    src: &[f32],
    tab: &RotaryTables,
    p: usize,
    turn: Turn,
) {
    let half = src.len() / 2;
    let (cos, sin) = tab.at(p, half);
    let (d1, d2) = dst.split_at_mut(half);
    let (s1, s2) = src.split_at(half);
    for ((((d1, d2), (&a, &b)), &c), &s) in d1
        .iter_mut()
        .zip(d2)
        .zip(s1.iter().zip(s2))
        .zip(cos)
        .zip(sin)
    {
        let (x1, x2) = turn_pair((a, b), (c, s), turn);
        d1.write(x1);
        d2.write(x2);
    }
}

#[derive(Clone)]
struct MoveSaved {
    dims: HeadDims,
    /// The forward's direction.
    way: Move,
    /// The tables the forward turned by, if any.
    rotary: Option<RotaryTables>,
}

impl fmt::Debug for MoveSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MoveSaved({:?}, {:?})", self.dims, self.way)
    }
}

#[derive(Debug)]
struct MoveBackward;

/// The gradient moves back the other way, turned back where the forward turned.
impl Backward<Flex, 1> for MoveBackward {
    type State = MoveSaved;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let MoveSaved { dims, way, rotary } = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let dx = move_heads(
            slice(&grad),
            dims,
            way.reversed(),
            rotary.as_ref().map(|tab| (tab, Turn::Back)),
        );
        let shape = way.reversed().output_shape(dims);
        let parents = ops.parents.iter().map(|p| p.as_ref().map(|n| n.id));
        register_grads(grads, parents, [(Some(dx), shape)]);
    }
}

/// [`split_heads`] and [`merge_heads`] on flex, or `None` elsewhere.
fn move_heads_op(
    x: &Tensor<3>,
    dims: HeadDims,
    way: Move,
    rotary: Option<&RotaryTables>,
) -> Option<Tensor<3>> {
    let forward = |p: &FlexTensor| {
        let out = move_heads(slice(p), dims, way, rotary.map(|tab| (tab, Turn::Forward)));
        flex_from(out, way.output_shape(dims))
    };
    match route(&x.device()) {
        Route::Reference => None,
        Route::Plain => {
            let p = contiguous(&x.clone().try_into_primitive::<Flex>().ok()?);
            Some(Tensor::from_primitive::<Flex>(forward(&p)))
        }
        Route::Autodiff => {
            let tx = x.clone().try_into_primitive::<Ad>().ok()?;
            let output = forward(&contiguous(tx.primitive()));
            let saved = MoveSaved {
                dims,
                way,
                rotary: rotary.cloned(),
            };
            let out = record(MoveBackward, [tx.node()], saved, output);
            Some(Tensor::from_primitive::<Ad>(out))
        }
    }
}

/// `x` [B, T, H·dh] as H heads [B·H, T, dh] (`reshape → swap_dims(1, 2) → reshape`), each vector
/// turned by RoPE at its position when `rotary` is given (tables of T positions of width dh), in
/// one parallel pass each way; `None` off flex.
pub fn split_heads(
    x: &Tensor<3>,
    heads: usize,
    rotary: Option<&RotaryTables>,
) -> Option<Tensor<3>> {
    let [b, t, d] = x.dims();
    assert!(
        heads > 0 && d.is_multiple_of(heads),
        "split_heads: width {d} is not a multiple of {heads} heads"
    );
    move_heads_op(x, (b, t, heads, d / heads), Move::ToHeads, rotary)
}

/// Heads [B·H, T, dh] back to [B, T, H·dh] (the inverse of [`split_heads`] without RoPE), in one
/// parallel pass each way; `None` off flex.
pub fn merge_heads(x: &Tensor<3>, heads: usize) -> Option<Tensor<3>> {
    let [bh, t, dh] = x.dims();
    assert!(
        heads > 0 && bh.is_multiple_of(heads),
        "merge_heads: {bh} rows of heads is not a multiple of {heads} heads"
    );
    move_heads_op(x, (bh / heads, t, heads, dh), Move::FromHeads, None)
}
