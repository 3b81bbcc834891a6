//! The LM head and its cross-entropy loss in one op, in blocks of rows: `logits = X Wᵀ` (W the
//! tied embedding [V, d]) or `X W` (an untied head stored as burn's `Linear`, [d, V]: T5),
//! the weighted mean of `logsumexp(logits) − logits[target]`, and (when autodiff tracks X or W)
//! the loss's gradients, without ever holding the [N, V] logits or their gradient.
//!
//! Unfused, the head writes N × V logits (table11: 8192 × 8192, 256 MiB), the cross-entropy reads
//! them, its backward writes a gradient of the same size, and both backward products read that.
//! Here each block of rows computes its logits, turns them in place into the block's gradient
//! `c_r (softmax − onehot)` (c_r: the row's weight over the weights' sum), and feeds both backward
//! products straight away: `dX_block = G W` and `dW += Gᵀ X_block`. The loss is a scalar, so the
//! backward only scales the two kept gradients by the upstream one. Rows of weight 0 (the
//! unpredicted positions of a masked LM) contribute nothing to the loss or the gradients and are
//! skipped: their logits are never computed.
//!
//! Time (`cargo run --release -p model --example head_bench`, table11's shapes): with every row
//! predicted, the same as unfused (the products are the same; the passes over the logits were
//! never the cost), but without the two 256 MiB buffers; with 15% of rows predicted (masked LM),
//! about a sixth of it.
//!
//! The same products and the same per-row formula as `matmul_2d` followed by
//! [`cross_entropy_rows`](super::cross_entropy_rows) and the weighted mean; the gradient of W sums
//! the blocks in row order, so results differ from the unfused path in rounding only.

#[allow(unused_imports)]
use super::*;

/// Bytes of one block's logits: 64 MiB (2048 rows of table11's 8192-word vocabulary), a quarter of
/// the unfused [N, V] logits at table11's 8192 rows. Why not smaller: the logits' product reads W
/// transposed (k-contiguous, see `transpose_into`), which gemm runs slower the fewer rows share
/// it. `head_bench` on a 2-core Zen 4 EPYC, every row predicted, fwd + bwd: 0.579 /
/// 0.590 s with blocks of 512 rows, 0.543 / 0.570 with 1024, 0.547 / 0.551 with 2048 (two runs
/// each); on an AVX-512 Xeon, 512 and 2048 rows time the same.
pub const HEAD_BLOCK_BYTES: usize = 64 << 20;

/// Rows per block for a vocabulary of `v` words under [`HEAD_BLOCK_BYTES`].
fn default_block_rows(v: usize) -> usize {
    (HEAD_BLOCK_BYTES / (v.max(1) * std::mem::size_of::<f32>())).max(1)
}

/// How the head's weight W is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadLayout {
    /// [V, d], one row per word: the tied input embedding (`logits = X Wᵀ`).
    VocabRows,
    /// [d, V], one column per word: burn's `Linear` (`logits = X W`), T5's untied head.
    VocabColumns,
}

impl HeadLayout {
    /// (V, d) of a weight of shape `dims` in this layout.
    fn vocab_and_width(self, [a, b]: [usize; 2]) -> (usize, usize) {
        match self {
            HeadLayout::VocabRows => (a, b),
            HeadLayout::VocabColumns => (b, a),
        }
    }

    /// The shape of a weight (and of its gradient) with V words of width d.
    fn shape(self, v: usize, d: usize) -> Vec<usize> {
        match self {
            HeadLayout::VocabRows => vec![v, d],
            HeadLayout::VocabColumns => vec![d, v],
        }
    }
}

/// The gradients a tracked forward computed, for a unit upstream gradient.
#[derive(Clone)]
struct HeadGrads {
    /// [N, d]
    dx: Arc<Vec<f32>>,
    /// W's shape ([V, d] or [d, V], see [`HeadLayout`])
    dw: Arc<Vec<f32>>,
    n: usize,
    v: usize,
    d: usize,
    layout: HeadLayout,
}

impl fmt::Debug for HeadGrads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HeadGrads(N {}, V {}, d {})", self.n, self.v, self.d)
    }
}

#[derive(Debug)]
struct HeadBackward;

impl Backward<Flex, 2> for HeadBackward {
    type State = HeadGrads;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let HeadGrads {
            dx,
            dw,
            n,
            v,
            d,
            layout,
        } = ops.state;
        let g = contiguous(&grads.consume::<Flex>(&ops.node));
        let g = slice(&g)[0];
        let scaled = |x: Arc<Vec<f32>>| {
            let mut x = Arc::unwrap_or_clone(x);
            if g != 1.0 {
                x.par_iter_mut().for_each(|x| *x *= g);
            }
            Some(x)
        };
        let parents = ops.parents.iter().map(|p| p.as_ref().map(|n| n.id));
        register_grads(
            grads,
            parents,
            [(scaled(dx), vec![n, d]), (scaled(dw), layout.shape(v, d))],
        );
    }
}

/// (dX [N, d], dW of W's shape) for a unit upstream gradient.
type DxDw = (Vec<f32>, Vec<f32>);

/// The loss and, when `with_grads`, the gradients (dX [N, d], dW of W's shape) for a unit
/// upstream gradient. x: [N, d], w: [V, d] or [d, V] as `layout` says, row-major; `coef[r]`: row
/// r's weight in the loss.
fn head_forward(
    (x, w, layout): (&[f32], &[f32], HeadLayout),
    (n, v, d): (usize, usize, usize),
    targets: &[i64],
    coef: &[f32],
    block_rows: usize,
    with_grads: bool,
) -> (f32, Option<DxDw>) {
    let rows: Vec<usize> = (0..n).filter(|&r| coef[r] != 0.0).collect();
    let mut grads = with_grads.then(|| (zeros(n * d), zeros(v * d)));
    let mut loss = 0f64;
    let mut xb = Vec::new();
    let mut logits: Vec<f32> = Vec::new();
    let mut dxb = Vec::new();
    let level = simd::current();
    for (i, block) in rows.chunks(block_rows.max(1)).enumerate() {
        let rb = block.len();
        // Gather the block's rows of X: [rb, d].
        xb.clear();
        for &r in block {
            xb.extend_from_slice(&x[r * d..(r + 1) * d]);
        }
        logits.resize(rb * v, 0.0);
        // W as the (d × v) right operand of the logits and as the (v × d) one of dX = G W, each
        // (row stride, column stride).
        let (w_dv, w_vd) = match layout {
            HeadLayout::VocabRows => ((1, d), (d, 1)),
            HeadLayout::VocabColumns => ((v, 1), (1, v)),
        };
        {
            let _timer = profile::Timer::start(profile::Part::Products);
            // SAFETY: xb is rb × d, w holds v · d floats read as d × v, logits rb × v.
            unsafe {
                matmul(
                    (rb, v, d),
                    logits.as_mut_ptr(),
                    v,
                    false,
                    (xb.as_ptr(), d, 1),
                    (w.as_ptr(), w_dv.0, w_dv.1),
                    1.0,
                    Parallelism::Rayon(0),
                );
            }
        }
        {
            let _timer = profile::Timer::start(profile::Part::CrossEntropy);
            // Per row: its weighted loss; with gradients, the row becomes c (softmax − onehot).
            let block_loss: f64 = logits
                .par_chunks_mut(v)
                .zip(block.par_iter())
                .map(|(row, &r)| {
                    let (t, c) = (targets[r] as usize, coef[r]);
                    level.run(
                        #[inline(always)]
                        || {
                            let lse = super::cross_entropy::log_sum_exp(row);
                            let nll = lse - row[t];
                            if with_grads {
                                for x in row.iter_mut() {
                                    *x = c * fast_exp(*x - lse);
                                }
                                row[t] -= c;
                            }
                            (c * nll) as f64
                        },
                    )
                })
                .collect::<Vec<f64>>()
                .iter()
                .sum();
            loss += block_loss;
        }
        let Some((dx, dw)) = grads.as_mut() else {
            continue;
        };
        let _timer = profile::Timer::start(profile::Part::Products);
        dxb.resize(rb * d, 0.0);
        // SAFETY: logits (now the block's gradient G) is rb × v, w v · d floats read as v × d,
        // dxb rb × d; Gᵀ is v × rb and xbᵀ d × rb read through their strides, dw v · d floats.
        unsafe {
            // dX_block = G W
            matmul(
                (rb, d, v),
                dxb.as_mut_ptr(),
                d,
                false,
                (logits.as_ptr(), v, 1),
                (w.as_ptr(), w_vd.0, w_vd.1),
                1.0,
                Parallelism::Rayon(0),
            );
            // dW += Gᵀ X_block ([V, d]) or X_blockᵀ G ([d, V]), blocks in row order
            match layout {
                HeadLayout::VocabRows => matmul(
                    (v, d, rb),
                    dw.as_mut_ptr(),
                    d,
                    i > 0,
                    (logits.as_ptr(), 1, v),
                    (xb.as_ptr(), d, 1),
                    1.0,
                    Parallelism::Rayon(0),
                ),
                HeadLayout::VocabColumns => matmul(
                    (d, v, rb),
                    dw.as_mut_ptr(),
                    v,
                    i > 0,
                    (xb.as_ptr(), 1, d),
                    (logits.as_ptr(), v, 1),
                    1.0,
                    Parallelism::Rayon(0),
                ),
            }
        }
        for (j, &r) in block.iter().enumerate() {
            dx[r * d..(r + 1) * d].copy_from_slice(&dxb[j * d..(j + 1) * d]);
        }
    }
    (loss as f32, grads)
}

/// `loss = Σ_r c_r · (logsumexp(x_r Wᵀ) − x_r · w_target(r))` with `c_r = weight_r / max(Σ weight, 1)`
/// (all weights 1 without `weights`: the mean over rows), fused as the module doc says, or `None`
/// off `flex`. x: [N, d] (the final hidden states); w: [V, d] (the tied embedding); targets: [N]
/// in `0..V`; weights: [N] → [1].
pub fn linear_cross_entropy(
    x: &Tensor<2>,
    w: &Tensor<2>,
    targets: &Tensor<1, Int>,
    weights: Option<&Tensor<1>>,
) -> Option<Tensor<1>> {
    let v = w.dims()[0];
    let block = default_block_rows(v);
    linear_cross_entropy_in_blocks(x, (w, HeadLayout::VocabRows), targets, weights, block)
}

/// [`linear_cross_entropy`] for an untied head stored as burn's `Linear` without a bias: w is
/// [d, V] and the logits are `x w` (T5.1.1's `lm_head`).
pub fn linear_head_cross_entropy(
    x: &Tensor<2>,
    w: &Tensor<2>,
    targets: &Tensor<1, Int>,
    weights: Option<&Tensor<1>>,
) -> Option<Tensor<1>> {
    let v = w.dims()[1];
    let block = default_block_rows(v);
    linear_cross_entropy_in_blocks(x, (w, HeadLayout::VocabColumns), targets, weights, block)
}

/// [`linear_cross_entropy`] or [`linear_head_cross_entropy`] as `layout` says, with `block_rows`
/// rows per block (the tests use blocks that do not divide N).
pub fn linear_cross_entropy_in_blocks(
    x: &Tensor<2>,
    (w, layout): (&Tensor<2>, HeadLayout),
    targets: &Tensor<1, Int>,
    weights: Option<&Tensor<1>>,
    block_rows: usize,
) -> Option<Tensor<1>> {
    let route = route(&x.device());
    if route == Route::Reference {
        return None;
    }
    let [n, d] = x.dims();
    let (v, d2) = layout.vocab_and_width(w.dims());
    assert_eq!(
        d,
        d2,
        "linear_cross_entropy: X [{n}, {d}] against W {:?} ({layout:?})",
        w.dims()
    );
    let targets = super::cross_entropy::host_targets(targets, v)?;
    assert_eq!(targets.len(), n, "linear_cross_entropy: one target per row");
    let coef: Vec<f32> = match weights {
        Some(weights) => {
            let w = host_vec(weights);
            assert_eq!(w.len(), n, "linear_cross_entropy: one weight per row");
            let total = w.iter().sum::<f32>().max(1.0);
            w.iter().map(|&x| x / total).collect()
        }
        None => vec![1.0 / n.max(1) as f32; n],
    };
    let loss_tensor = |loss: f32| flex_from(vec![loss], vec![1]);
    match route {
        Route::Plain => {
            let (px, pw) = (
                contiguous(&x.clone().try_into_primitive::<Flex>().ok()?),
                contiguous(&w.clone().try_into_primitive::<Flex>().ok()?),
            );
            let (loss, _) = head_forward(
                (slice(&px), slice(&pw), layout),
                (n, v, d),
                &targets,
                &coef,
                block_rows,
                false,
            );
            Some(Tensor::from_primitive::<Flex>(loss_tensor(loss)))
        }
        Route::Autodiff => {
            let (tx, tw) = (
                x.clone().try_into_primitive::<Ad>().ok()?,
                w.clone().try_into_primitive::<Ad>().ok()?,
            );
            let (px, pw) = (contiguous(tx.primitive()), contiguous(tw.primitive()));
            let inputs = ((slice(&px), slice(&pw), layout), (n, v, d));
            let out = match HeadBackward
                .prepare::<NoCheckpointing>([tx.node(), tw.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (loss, grads) =
                        head_forward(inputs.0, inputs.1, &targets, &coef, block_rows, true);
                    let (dx, dw) = grads.expect("gradients computed when tracked");
                    let state = HeadGrads {
                        dx: Arc::new(dx),
                        dw: Arc::new(dw),
                        n,
                        v,
                        d,
                        layout,
                    };
                    prep.finish(state, loss_tensor(loss))
                }
                OpsKind::UnTracked(prep) => {
                    let (loss, _) =
                        head_forward(inputs.0, inputs.1, &targets, &coef, block_rows, false);
                    prep.finish(loss_tensor(loss))
                }
            };
            Some(Tensor::from_primitive::<Ad>(out))
        }
        Route::Reference => None,
    }
}
