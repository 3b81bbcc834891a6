//! The fused CPU kernels against their plain burn references (flash-linear-attention style):
//! outputs and gradients of every input, odd lengths spanning several row blocks, both thread
//! layouts (one batch element: parallel inside; several: parallel across), masked and unmasked.

use burn::prelude::*;
use model::attention::{
    global_chunk_attention, global_chunk_attention_reference, local_chunk_attention,
    rank_bias_pays, relu2_attention_rank_bias, relu2_attention_reference,
    scored_attention_reference, softmax_attention_reference,
};
use model::fused::simd::{self, SimdLevel};
use model::fused::{
    self, Activation, AttentionSpec, Gate, HeadLayout, ROW_BLOCK, SHORT_ROW_BLOCK,
    SHORT_ROW_BLOCK_MAX_FLOATS, ScoreFn, activation, bias_activation, fast_exp, gated_activation,
};
use model::gau::{GauConfig, GauSpan};
use model::layers::Rope;
use model::lm::cross_entropy_rows_reference;
use model::{Direction, cross_entropy};

use crate::common::{
    assert_close, assert_grads_close, at_every_simd_level, autodiff_device, backward_with, device,
    grad, randn, values,
};

fn reference(
    spec: AttentionSpec,
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    bias: Option<Tensor<2>>,
) -> Tensor<3> {
    let direction = if spec.causal {
        Direction::Causal
    } else {
        Direction::Bidirectional
    };
    match spec.score {
        ScoreFn::Relu2 => relu2_attention_reference(q, k, v, bias, spec.scale as f64, direction),
        // With a bias (GAU's softmax ablation): the generic reference.
        ScoreFn::Softmax if bias.is_some() => scored_attention_reference(q, k, v, bias, None, spec),
        ScoreFn::Softmax => {
            // The Transformers' softmax reference scales by 1/sqrt(dk): fold the scale into q.
            let dk = q.dims()[2] as f64;
            softmax_attention_reference(
                q.mul_scalar(spec.scale as f64 * dk.sqrt()),
                k,
                v,
                None,
                direction,
            )
        }
    }
}

fn cases() -> Vec<(AttentionSpec, bool)> {
    let mut out = Vec::new();
    for causal in [true, false] {
        for (score, scale) in [(ScoreFn::Relu2, 1.0 / 150.0), (ScoreFn::Softmax, 0.25)] {
            let biases: &[bool] = match score {
                ScoreFn::Relu2 => &[true, false],
                ScoreFn::Softmax => &[true, false],
            };
            for &bias in biases {
                out.push((
                    AttentionSpec {
                        score,
                        scale,
                        causal,
                    },
                    bias,
                ));
            }
        }
    }
    out
}

#[test]
fn attention_matches_reference_outputs_and_gradients() {
    at_every_simd_level(attention_matches_reference_outputs_and_gradients_at_this_level);
}

fn attention_matches_reference_outputs_and_gradients_at_this_level() {
    // dK's width is summed transposed by the backward, dV's (over 128) directly: both paths.
    // Causal attention this small runs in short row blocks, the rest in ROW_BLOCK rows.
    let (dk, dv) = (16, 136);
    let t = 2 * ROW_BLOCK + 37; // three row blocks, the last one partial
    assert_eq!(fused::row_block(true, t, dv), SHORT_ROW_BLOCK);
    assert_eq!(fused::row_block(false, t, dv), ROW_BLOCK);
    check_attention((t, dk, dv), &[1, 3], cases());
}

#[test]
fn causal_attention_over_wide_values_runs_in_long_row_blocks() {
    // V wide enough for causal attention to take blocks of ROW_BLOCK rows (FLASH-Quad's long
    // sequences); the other tests' causal shapes take the short blocks.
    let t = 2 * ROW_BLOCK + 37;
    let dv = SHORT_ROW_BLOCK_MAX_FLOATS / t + 1;
    assert_eq!(fused::row_block(true, t, dv), ROW_BLOCK);
    let causal = cases()
        .into_iter()
        .filter(|(spec, _)| spec.causal)
        .collect();
    check_attention((t, 16, dv), &[1], causal);
}

/// Fused attention against the reference, outputs and every gradient (kept and recomputed
/// scores), for each case at shape (T, dk, dv) and each batch size in `ns`.
fn check_attention(
    (t, dk, dv): (usize, usize, usize),
    ns: &[usize],
    cases: Vec<(AttentionSpec, bool)>,
) {
    for &n in ns {
        for &(spec, with_bias) in &cases {
            let what = format!("N={n} {spec:?} bias={with_bias}");
            // Forward on the plain device.
            let dev = device();
            let q = randn([n, t, dk], 1, &dev);
            let k = randn([n, t, dk], 2, &dev);
            let v = randn([n, t, dv], 3, &dev);
            let bias = with_bias.then(|| randn([t, t], 4, &dev).mul_scalar(0.1));
            let fused_out = fused::attention(&q, &k, &v, bias.as_ref(), spec)
                .expect("flex runs the fused kernel");
            let ref_out = reference(spec, q, k, v, bias);
            assert_close(&values(fused_out), &values(ref_out), 2e-5, &what);

            // Gradients of every input on the autodiff device, under a random upstream gradient.
            let dev = autodiff_device();
            let leaf = |x: Tensor<3>| x.require_grad();
            let q = leaf(randn([n, t, dk], 1, &dev));
            let k = leaf(randn([n, t, dk], 2, &dev));
            let v = leaf(randn([n, t, dv], 3, &dev));
            let bias = with_bias.then(|| randn([t, t], 4, &dev).mul_scalar(0.1).require_grad());
            let w = randn([n, t, dv], 5, &dev);
            let grads_of = |out: Tensor<3>| {
                let gr = backward_with(out, &w);
                let mut g: Vec<Vec<f32>> = [&q, &k, &v].iter().map(|x| grad(x, &gr)).collect();
                g.extend(bias.iter().map(|b| grad(b, &gr)));
                g
            };
            let g_ref = grads_of(reference(
                spec,
                q.clone(),
                k.clone(),
                v.clone(),
                bias.clone(),
            ));
            // Both backward paths: the forward's scores (relu²) or probabilities (softmax) kept
            // under the default limit, and recomputed from Q and K under a zero limit.
            for (limit, path) in [(fused::kept_scores_limit(), "kept"), (0, "recomputed")] {
                let g_fused = fused::with_kept_scores_limit(limit, || {
                    grads_of(
                        fused::attention(&q, &k, &v, bias.as_ref(), spec).expect("fused autodiff"),
                    )
                });
                let what = format!("{what} {path}");
                assert_grads_close(&["dq", "dk", "dv", "dbias"], &g_fused, &g_ref, 5e-5, &what);
            }
        }
    }
}

#[test]
fn grouped_attention_matches_expanded_heads_outputs_and_gradients() {
    at_every_simd_level(grouped_attention_matches_expanded_heads_at_this_level);
}

/// T5's attention through [`fused::attention_grouped`]: H query heads over G K/V heads (read in
/// place), a trained bias table per head, dense ([H, T, S]) or by offset ([H, T + S − 1], query i
/// and key j reading entry T − 1 − i + j: T5's relative position bias), a constant mask per
/// sequence, causal or not; against the same thing written with K and V expanded to H heads and
/// the bias built densely (the offsets gathered by an index written by hand), in burn ops.
/// Outputs on the plain device; the gradients of Q, K, V and the table on the autodiff device,
/// with the forward's probabilities kept and recomputed. One sequence with G = 1 runs the key/value
/// elements one at a time (threads inside), the rest in parallel; blocks of up to four query rows
/// run in parallel take the direct loops instead of gemm. Each case also with attention dropout
/// ([`fused::attention_grouped_dropout`]) against the reference multiplied by the same mask
/// ([`fused::DropoutMask::keeps`]).
fn grouped_attention_matches_expanded_heads_at_this_level() {
    for dropout in [None, Some(fused::DropoutMask::new(0.3, 11))] {
        for layout in [TableLayout::Dense, TableLayout::Offsets] {
            grouped_attention_matches_expanded_heads_with(dropout, layout);
        }
    }
}

/// The bias table layouts of [`fused::BiasTable`].
#[derive(Clone, Copy, Debug)]
enum TableLayout {
    Dense,
    Offsets,
}

/// [`grouped_attention_matches_expanded_heads_at_this_level`] with or without dropout, with the
/// table laid out as `layout` says (kept as [H, 1, T + S − 1] by offset, so that both are 3-D).
fn grouped_attention_matches_expanded_heads_with(
    dropout: Option<fused::DropoutMask>,
    layout: TableLayout,
) {
    let (h, dk) = (4, 8);
    for (b, g, t, s, causal) in [
        (2, 4, 45, 45, true),
        (2, 2, 45, 45, true),
        (2, 1, 37, 70, false),
        (3, 2, 37, 70, false),
        (1, 1, 45, 45, true),
        // Decoding's few rows per query element (the direct loops, keys read in place).
        (2, 2, 1, 70, false),
        (3, 1, 1, 70, false),
        (2, 4, 3, 70, false),
    ] {
        let what =
            format!("B {b}, H {h}, G {g}, T {t}, S {s}, causal {causal}, {dropout:?}, {layout:?}");
        // Entry (i, j) of a table by offset: T − 1 − i + j.
        let columns: Vec<i64> = (0..t * s).map(|x| (t - 1 - x / s + x % s) as i64).collect();
        let dense = |table: &Tensor<3>| -> Tensor<3> {
            match layout {
                TableLayout::Dense => table.clone(),
                TableLayout::Offsets => {
                    let index = TensorData::new(columns.clone(), [t * s]);
                    let index = Tensor::<1, Int>::from_data(index, &table.device());
                    table
                        .clone()
                        .reshape([h, t + s - 1])
                        .select(1, index)
                        .reshape([h, t, s])
                }
            }
        };
        let spec = AttentionSpec {
            score: ScoreFn::Softmax,
            scale: 1.0,
            causal,
        };
        // The dropout mask's multipliers [B·H, T, S] (query element n = b·H + h).
        let multipliers = |d: fused::DropoutMask, dev: &Device| {
            let scale = 1.0 / (1.0 - d.prob);
            let m: Vec<f32> = (0..b * h * t * s)
                .map(|x| {
                    let (n, i, j) = (x / (t * s), x / s % t, x % s);
                    if d.keeps(n, i, j) { scale } else { 0.0 }
                })
                .collect();
            Tensor::<3>::from_data(TensorData::new(m, [b * h, t, s]), dev)
        };
        // Sequence i's keys from 5 + 7i on are padding.
        let mask: Vec<f32> = (0..b * s)
            .map(|x| if x % s >= 5 + 7 * (x / s) { -1e9 } else { 0.0 })
            .collect();
        let run = |dev: &Device| {
            let q = randn([b * h, t, dk], 1, dev);
            let k = randn([b * g, s, dk], 2, dev);
            let v = randn([b * g, s, dk], 3, dev);
            let table = match layout {
                TableLayout::Dense => randn([h, t, s], 4, dev),
                TableLayout::Offsets => randn([h, 1, t + s - 1], 4, dev),
            };
            let key_mask = Tensor::<2>::from_data(TensorData::new(mask.clone(), [b, s]), dev);
            (q, k, v, table, key_mask)
        };
        let expanded = |(q, k, v, table, key_mask): &(_, _, _, _, Tensor<2>)| -> Tensor<3> {
            let (q, k, v, table): (&Tensor<3>, &Tensor<3>, &Tensor<3>, &Tensor<3>) =
                (q, k, v, table);
            let rep = |x: Tensor<3>| {
                x.reshape([b, g, 1, s, dk])
                    .expand([b, g, h / g, s, dk])
                    .reshape([b * h, s, dk])
            };
            let bias = dense(table).unsqueeze::<4>().expand([b, h, t, s])
                + key_mask.clone().reshape([b, 1, 1, s]);
            let mut scores =
                q.clone().matmul(rep(k.clone()).swap_dims(1, 2)) + bias.reshape([b * h, t, s]);
            if causal {
                let future = model::layers::future_mask(t, &q.device()).unsqueeze::<3>();
                scores = scores.mask_fill(future.expand([b * h, t, s]), f32::NEG_INFINITY);
            }
            let weights = burn::tensor::activation::softmax(scores, 2);
            let weights = match dropout {
                None => weights,
                Some(d) => weights * multipliers(d, &q.device()),
            };
            weights.matmul(rep(v.clone()))
        };
        let fused_of = |(q, k, v, table, key_mask): &(_, _, _, _, Tensor<2>)| {
            let table: &Tensor<3> = table;
            let offsets: Option<Tensor<2>> = match layout {
                TableLayout::Dense => None,
                TableLayout::Offsets => Some(table.clone().squeeze_dim(1)),
            };
            let table = match &offsets {
                None => fused::BiasTable::Dense(table),
                Some(offsets) => fused::BiasTable::Offsets(offsets),
            };
            let bias = fused::ScoreBias {
                table: Some(table),
                key_mask: Some(key_mask),
            };
            match dropout {
                None => fused::attention_grouped(q, k, v, bias, spec),
                Some(d) => fused::attention_grouped_dropout(q, k, v, bias, spec, d),
            }
            .expect("flex")
        };
        let plain = run(&device());
        assert_close(
            &values(fused_of(&plain)),
            &values(expanded(&plain)),
            2e-5,
            &what,
        );
        let dev = autodiff_device();
        let (q, k, v, table, key_mask) = run(&dev);
        let leaf = |x: Tensor<3>| x.require_grad();
        let tracked = (leaf(q), leaf(k), leaf(v), leaf(table), key_mask);
        let w = randn([b * h, t, dk], 5, &dev);
        let grads_of = |out: Tensor<3>| {
            let gr = backward_with(out, &w);
            let (q, k, v, table, _) = &tracked;
            vec![grad(q, &gr), grad(k, &gr), grad(v, &gr), grad(table, &gr)]
        };
        let g_ref = grads_of(expanded(&tracked));
        for (limit, path) in [(fused::kept_scores_limit(), "kept"), (0, "recomputed")] {
            let g = fused::with_kept_scores_limit(limit, || grads_of(fused_of(&tracked)));
            let what = format!("{what}, {path}");
            assert_grads_close(&["dq", "dk", "dv", "dtable"], &g, &g_ref, 5e-5, &what);
        }
    }
}

/// Dropout on an activation ([`fused::dropout`]): the output is the input times the mask's
/// multipliers (element (r, 0, j): column j of row r of the last dimension, over a tensor of
/// several parallel chunks) and the gradient the upstream gradient times the same multipliers,
/// at every SIMD level; on the plain device (inference) it declines, as burn's `Dropout` drops
/// nothing there.
#[test]
fn fused_dropout_multiplies_values_and_gradients_by_its_mask() {
    at_every_simd_level(|| {
        let (shape, dim) = ([4, 100, 129], 129);
        let mask = fused::DropoutMask::new(0.25, 9);
        let scale = 1.0 / (1.0 - 0.25f32);
        let dev = autodiff_device();
        let multipliers: Vec<f32> = (0..4 * 100 * dim)
            .map(|e| {
                if mask.keeps(e / dim, 0, e % dim) {
                    scale
                } else {
                    0.0
                }
            })
            .collect();
        let m = Tensor::<3>::from_data(TensorData::new(multipliers, shape), &dev);
        let x = randn(shape, 1, &dev).require_grad();
        let w = randn(shape, 2, &dev);
        let out = fused::dropout(&x, mask).expect("flex with autodiff");
        assert_close(
            &values(out.clone()),
            &values(x.clone() * m.clone()),
            1e-6,
            "values",
        );
        let gr = backward_with(out, &w);
        assert_close(&grad(&x, &gr), &values(w * m), 1e-6, "gradient");
        assert!(fused::dropout(&randn(shape, 3, &device()), mask).is_none());
    });
}

#[test]
fn causal_fused_attention_does_not_see_the_future() {
    at_every_simd_level(causal_fused_attention_does_not_see_the_future_at_this_level);
}

fn causal_fused_attention_does_not_see_the_future_at_this_level() {
    let dev = device();
    let (n, t, d) = (2, ROW_BLOCK + 9, 8);
    let spec = AttentionSpec {
        score: ScoreFn::Softmax,
        scale: 0.3,
        causal: true,
    };
    let q = randn([n, t, d], 1, &dev);
    let k = randn([n, t, d], 2, &dev);
    let v = randn([n, t, d], 3, &dev);
    let base = values(fused::attention(&q, &k, &v, None, spec).unwrap());
    // Changing the last key and value changes only the last query's output.
    let k2 = k
        .clone()
        .slice_assign([0..n, t - 1..t, 0..d], randn([n, 1, d], 4, &dev));
    let v2 = v
        .clone()
        .slice_assign([0..n, t - 1..t, 0..d], randn([n, 1, d], 5, &dev));
    let moved = values(fused::attention(&q, &k2, &v2, None, spec).unwrap());
    for b in 0..n {
        for i in 0..t {
            let row = |x: &[f32]| x[(b * t + i) * d..(b * t + i + 1) * d].to_vec();
            let same = row(&base) == row(&moved);
            assert_eq!(same, i + 1 < t, "batch {b}, query {i}");
        }
    }
}

#[test]
fn local_chunk_attention_equals_full_relu2_attention_per_chunk() {
    // The fused local part of mixed chunk attention against the reference run on each chunk alone.
    let dev = autodiff_device();
    let (n, g, c, s, e) = (2, 3, 40, 8, 12);
    let qq = randn([n, g, c, s], 1, &dev).require_grad();
    let kq = randn([n, g, c, s], 2, &dev).require_grad();
    let vg = randn([n, g, c, e], 3, &dev).require_grad();
    let bias = randn([c, c], 4, &dev).mul_scalar(0.1).require_grad();
    let factor = 1.0 / c as f64;
    let w = randn([n, g, c, e], 5, &dev);
    for direction in [Direction::Causal, Direction::Bidirectional] {
        let fused_out = local_chunk_attention(
            qq.clone(),
            kq.clone(),
            vg.clone(),
            Some(bias.clone()),
            factor,
            direction,
        );
        let flat = |x: &Tensor<4>, w: usize| x.clone().reshape([n * g, c, w]);
        let ref_out = relu2_attention_reference(
            flat(&qq, s),
            flat(&kq, s),
            flat(&vg, e),
            Some(bias.clone()),
            factor,
            direction,
        )
        .reshape([n, g, c, e]);
        let what = format!("{direction:?}");
        assert_close(
            &values(fused_out.clone()),
            &values(ref_out.clone()),
            2e-5,
            &what,
        );
        let grads = |out: Tensor<4>| {
            let gr = backward_with(out, &w);
            vec![
                grad(&qq, &gr),
                grad(&kq, &gr),
                grad(&vg, &gr),
                grad(&bias, &gr),
            ]
        };
        let names = ["dq", "dk", "dv", "dbias"];
        assert_grads_close(&names, &grads(fused_out), &grads(ref_out), 5e-5, &what);
    }
}

#[test]
fn rank_bias_attention_equals_attention_with_the_dense_bias() {
    // FLASH-Quad's RoPE-product bias folded into the query/key dimension against the reference
    // with the [T, T] bias A Bᵀ built: outputs and the gradients of q, k, v, A and B, at an odd
    // length spanning several row blocks.
    let dev = autodiff_device();
    let (n, t, s, e, r) = (3, ROW_BLOCK * 2 + 7, 8, 12, 6);
    let q = randn([n, t, s], 1, &dev).require_grad();
    let k = randn([n, t, s], 2, &dev).require_grad();
    let v = randn([n, t, e], 3, &dev).require_grad();
    let a = randn([t, r], 4, &dev).mul_scalar(0.3).require_grad();
    let b = randn([t, r], 5, &dev).mul_scalar(0.3).require_grad();
    let w = randn([n, t, e], 6, &dev);
    let factor = 1.0 / t as f64;
    for direction in [Direction::Causal, Direction::Bidirectional] {
        let what = format!("{direction:?}");
        let folded = relu2_attention_rank_bias(
            q.clone(),
            k.clone(),
            v.clone(),
            (a.clone(), b.clone()),
            factor,
            direction,
        );
        let dense = relu2_attention_reference(
            q.clone(),
            k.clone(),
            v.clone(),
            Some(a.clone().matmul(b.clone().transpose())),
            factor,
            direction,
        );
        assert_close(&values(folded.clone()), &values(dense.clone()), 2e-5, &what);
        let grads = |out: Tensor<3>| {
            let gr = backward_with(out, &w);
            vec![
                grad(&q, &gr),
                grad(&k, &gr),
                grad(&v, &gr),
                grad(&a, &gr),
                grad(&b, &gr),
            ]
        };
        let names = ["dq", "dk", "dv", "da", "db"];
        assert_grads_close(&names, &grads(folded), &grads(dense), 5e-5, &what);
    }
}

#[test]
fn gau_layer_is_the_same_with_its_bias_factored_or_built() {
    // A FLASH-Quad layer over 512 positions has the RoPE-product bias; with one causal sequence it
    // keeps the bias factored, with three it builds the [T, T] matrix (`rank_bias_pays`). The
    // first sequence's output and input gradient must agree between the two.
    let dev = autodiff_device();
    let t = 512;
    assert!(rank_bias_pays(1, t, Direction::Causal));
    assert!(!rank_bias_pays(3, t, Direction::Causal));
    dev.seed(3);
    let layer = GauConfig::new(16, GauSpan::Quad { window: t }, Direction::Causal)
        .with_d_qk(8)
        .init(&dev);
    // Trained-looking weights (γ ~ N(0, 0.02), β = 0 and the bias's N(0, 0.02) would make the
    // attention term vanish beside the residual).
    let layer = model::testing::perturb(layer, 0.3, &dev, 11);
    let rope = Rope::new(8, 0, t, &dev);
    let x3 = randn([3, t, 16], 1, &dev).require_grad();
    let x1 = x3.clone().narrow(0, 0, 1).detach().require_grad();
    let w = randn([1, t, 16], 2, &dev);
    // The attention term alone: the layer's output less its residual input.
    let out1 = layer.forward(x1.clone(), &rope, None) - x1.clone();
    let out3 = (layer.forward(x3.clone(), &rope, None) - x3.clone()).narrow(0, 0, 1);
    assert_close(&values(out1.clone()), &values(out3.clone()), 2e-5, "output");
    let g1 = grad(&x1, &backward_with(out1, &w));
    let g3 = grad(&x3, &backward_with(out3, &w));
    assert_close(&g1, &g3[..t * 16], 5e-5, "input gradient");
}

#[test]
fn fused_matmul_matches_burn_values_and_gradients() {
    // Odd shapes, and operands that are views (a narrowed and a transposed weight, as the
    // projections and the tied LM head pass them).
    let dev = autodiff_device();
    let a = randn([37, 19], 1, &dev).require_grad();
    let w = randn([19, 53], 2, &dev).require_grad();
    let e = randn([29, 19], 3, &dev).require_grad();
    let up = randn([37, 29], 4, &dev);
    // (name, the weight leaf, how the operand is built from it: once per backward pass)
    type Operand = fn(Tensor<2>) -> Tensor<2>;
    let cases: [(&str, &Tensor<2>, Operand); 3] = [
        ("leading columns", &w, |w| w.narrow(1, 0, 29)),
        ("narrowed", &w, |w| w.narrow(1, 17, 29)),
        ("transposed", &e, |e| e.transpose()),
    ];
    for (what, leaf, operand) in cases {
        let fused_out = fused::matmul_2d(a.clone(), operand(leaf.clone()));
        let ref_out = a.clone().matmul(operand(leaf.clone()));
        assert_close(
            &values(fused_out.clone()),
            &values(ref_out.clone()),
            1e-5,
            what,
        );
        let grads = |out: Tensor<2>| {
            let gr = backward_with(out, &up);
            vec![grad(&a, &gr), grad(leaf, &gr)]
        };
        assert_grads_close(
            &["da", "dw"],
            &grads(fused_out),
            &grads(ref_out),
            1e-5,
            what,
        );
    }
    // Without autodiff: the forward alone.
    let plain = device();
    let (x, y) = (randn([5, 7], 5, &plain), randn([7, 3], 6, &plain));
    let what = "plain device";
    assert_close(
        &values(fused::matmul_2d(x.clone(), y.clone())),
        &values(x.matmul(y)),
        1e-5,
        what,
    );
}

#[test]
fn fused_cross_entropy_matches_log_softmax_values_and_gradients() {
    at_every_simd_level(fused_cross_entropy_matches_log_softmax_values_and_gradients_at_this_level);
}

fn fused_cross_entropy_matches_log_softmax_values_and_gradients_at_this_level() {
    let dev = autodiff_device();
    let (n, v) = (37, 50);
    // Large logits: the fused kernel must subtract the row maximum like log_softmax does.
    let logits = randn([n, v], 1, &dev).mul_scalar(30.0).require_grad();
    let targets: Vec<i64> = (0..n as i64).map(|i| (i * 7) % v as i64).collect();
    let targets = Tensor::<1, Int>::from_data(TensorData::new(targets, [n]), &dev);
    let weights = randn([n], 2, &dev).greater_elem(0.0).float();
    let fused_rows = fused::cross_entropy_rows(&logits, &targets).expect("flex");
    let ref_rows = cross_entropy_rows_reference(logits.clone(), targets.clone());
    assert_close(
        &values(fused_rows.clone()),
        &values(ref_rows.clone()),
        1e-5,
        "per-row loss",
    );
    let w = randn([n], 3, &dev);
    let g = |rows: Tensor<1>| grad(&logits, &backward_with(rows, &w));
    assert_close(&g(fused_rows), &g(ref_rows), 1e-5, "gradient");
    // The weighted mean of the public loss uses the fused rows.
    let loss = cross_entropy(logits.clone(), targets.clone(), Some(weights.clone()));
    let expect =
        (cross_entropy_rows_reference(logits, targets) * weights.clone()).sum() / weights.sum();
    assert_close(&values(loss), &values(expect), 1e-6, "weighted mean");
}

#[test]
fn fused_linear_cross_entropy_matches_head_and_loss_values_and_gradients() {
    at_every_simd_level(
        fused_linear_cross_entropy_matches_head_and_loss_values_and_gradients_at_this_level,
    );
}

/// The fused head + loss against `X Wᵀ` (burn's matmul), `log_softmax`, `gather` and the weighted
/// mean, values and the gradients of X and W (through a random upstream scale), with W stored
/// either way ([V, d] tied, [d, V] untied), over blocks that do not divide N, one block, weights
/// with zeros (skipped rows), all-zero weights, none.
fn fused_linear_cross_entropy_matches_head_and_loss_values_and_gradients_at_this_level() {
    let dev = autodiff_device();
    let (n, v, d) = (45, 70, 12);
    // Large logits: the row maximum must be subtracted.
    let x = randn([n, d], 1, &dev).mul_scalar(4.0).require_grad();
    let w = randn([v, d], 2, &dev).mul_scalar(2.0).require_grad();
    let targets: Vec<i64> = (0..n as i64).map(|i| (i * 11) % v as i64).collect();
    let targets = Tensor::<1, Int>::from_data(TensorData::new(targets, [n]), &dev);
    let some = randn([n], 3, &dev).greater_elem(0.3).float();
    let upstream = randn([1], 4, &dev);
    for (weights, which) in [
        (None, "no weights"),
        (Some(some), "0/1 weights"),
        (Some(Tensor::<1>::zeros([n], &dev)), "all-zero weights"),
    ] {
        let reference = cross_entropy_reference_loss(&x, &w, &targets, weights.clone());
        let grads = |loss: Tensor<1>| {
            let gr = backward_with(loss, &upstream);
            [grad(&x, &gr), grad(&w, &gr)]
        };
        let ref_grads = grads(reference.clone());
        for (layout, block_rows) in [
            (HeadLayout::VocabRows, 7),
            (HeadLayout::VocabRows, 64),
            (HeadLayout::VocabColumns, 7),
            (HeadLayout::VocabColumns, 64),
        ] {
            let what = format!("{which}, {layout:?}, blocks of {block_rows} rows");
            // The untied layout's weight is Wᵀ as its own leaf ([d, V]); its gradient is the
            // transpose of W's.
            let wt = Tensor::<2>::from_data(w.clone().transpose().into_data(), &dev).require_grad();
            let head = match layout {
                HeadLayout::VocabRows => &w,
                HeadLayout::VocabColumns => &wt,
            };
            let fused_loss = fused::linear_cross_entropy_in_blocks(
                &x,
                (head, layout),
                &targets,
                weights.as_ref(),
                block_rows,
            )
            .expect("flex");
            assert_close(
                &values(fused_loss.clone()),
                &values(reference.clone()),
                1e-5,
                &what,
            );
            let gr = backward_with(fused_loss, &upstream);
            let dw = match layout {
                HeadLayout::VocabRows => grad(&w, &gr),
                HeadLayout::VocabColumns => values(wt.grad(&gr).expect("dWᵀ").transpose()),
            };
            assert_grads_close(&["dX", "dW"], &[grad(&x, &gr), dw], &ref_grads, 1e-4, &what);
            // Without autodiff: the loss alone.
            let plain = fused::linear_cross_entropy_in_blocks(
                &x.clone().inner(),
                (&head.clone().inner(), layout),
                &targets.clone().inner(),
                weights.clone().map(|w| w.inner()).as_ref(),
                block_rows,
            )
            .expect("flex");
            assert_close(&values(plain), &values(reference.clone()), 1e-5, &what);
        }
    }
}

/// The unfused head and loss in plain burn operations: Σ w·nll / max(Σ w, 1), or the mean.
fn cross_entropy_reference_loss(
    x: &Tensor<2>,
    w: &Tensor<2>,
    targets: &Tensor<1, Int>,
    weights: Option<Tensor<1>>,
) -> Tensor<1> {
    let logits = x.clone().matmul(w.clone().transpose());
    let rows = cross_entropy_rows_reference(logits, targets.clone());
    match weights {
        Some(wt) => (rows * wt.clone()).sum() / wt.sum().clamp_min(1.0),
        None => rows.mean(),
    }
}

#[test]
fn fast_exp_is_accurate_over_the_f32_range() {
    let mut worst = 0f32;
    let mut x = -87.0f32;
    while x < 88.0 {
        let (a, b) = (fast_exp(x), x.exp());
        worst = worst.max((a - b).abs() / b);
        x += 0.001_37;
    }
    assert!(worst < 3e-7, "relative error {worst:e}");
    assert_eq!(fast_exp(-100.0), 0.0);
    assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
}

#[test]
fn global_chunk_attention_matches_reference_outputs_and_gradients() {
    let dev = autodiff_device();
    let (c, s, e) = (24, 8, 12);
    // One chunk (bidirectional only: causal, the output is zero and the reference's graph leaves
    // K and V without a gradient), two (causal: the first chunk's skipped products meet the
    // last's) and four; one sequence (products multi-threaded) and three (sequences in parallel).
    for g in [1, 2, 4] {
        for n in [1, 3] {
            let ql = randn([n, g, c, s], 1, &dev).require_grad();
            let kl = randn([n, g, c, s], 2, &dev).require_grad();
            let vg = randn([n, g, c, e], 3, &dev).require_grad();
            let w = randn([n, g, c, e], 4, &dev);
            for direction in [Direction::Causal, Direction::Bidirectional] {
                if g == 1 && direction == Direction::Causal {
                    continue;
                }
                let factor = 1.0 / c as f64;
                let ref_out = global_chunk_attention_reference(
                    ql.clone(),
                    kl.clone(),
                    vg.clone(),
                    factor,
                    direction,
                );
                let grads = |out: Tensor<4>| {
                    let gr = backward_with(out, &w);
                    [&ql, &kl, &vg].map(|x| grad(x, &gr))
                };
                let ref_grads = grads(ref_out.clone());
                // The backward with the forward's kept summaries (default limit) and recomputing
                // them (limit 0).
                for limit in [fused::DEFAULT_KEPT_SCORES_LIMIT, 0] {
                    let what = format!("G={g} N={n} {direction:?} kept-bytes limit {limit}");
                    let (fused_out, fused_grads) = fused::with_kept_scores_limit(limit, || {
                        let out = global_chunk_attention(
                            ql.clone(),
                            kl.clone(),
                            vg.clone(),
                            factor,
                            direction,
                        );
                        (values(out.clone()), grads(out))
                    });
                    assert_close(&fused_out, &values(ref_out.clone()), 2e-5, &what);
                    assert_grads_close(&["dq", "dk", "dv"], &fused_grads, &ref_grads, 2e-5, &what);
                }
            }
        }
    }
}

#[test]
fn fused_activations_match_burn_values_and_gradients() {
    at_every_simd_level(fused_activations_match_burn_values_and_gradients_at_this_level);
}

fn fused_activations_match_burn_values_and_gradients_at_this_level() {
    let dev = autodiff_device();
    let x = randn([3, 50, 7], 1, &dev).mul_scalar(4.0).require_grad();
    let w = randn([3, 50, 7], 2, &dev);
    for act in [Activation::Silu, Activation::Gelu, Activation::GeluTanh] {
        let fused_out = activation(x.clone(), act);
        let ref_out = act.reference(x.clone());
        let what = format!("{act:?}");
        assert_close(
            &values(fused_out.clone()),
            &values(ref_out.clone()),
            1e-6,
            &what,
        );
        let g = |out: Tensor<3>| grad(&x, &backward_with(out, &w));
        assert_close(
            &g(fused_out),
            &g(ref_out),
            2e-6,
            &format!("{what} gradient"),
        );
    }
}

#[test]
fn fused_rotary_matches_reference_values_and_gradients() {
    at_every_simd_level(fused_rotary_matches_reference_values_and_gradients_at_this_level);
}

fn fused_rotary_matches_reference_values_and_gradients_at_this_level() {
    let dev = autodiff_device();
    let (b, h, t, dim) = (2, 3, 300, 16); // more rows than one parallel task
    let rope = Rope::new(dim, 5, t, &dev);
    let x = randn([b, h, t, dim], 1, &dev).require_grad();
    let gamma = randn([dim], 2, &dev).require_grad();
    let beta = randn([dim], 3, &dev).require_grad();
    let w = randn([b, h, t, dim], 4, &dev);
    let plain = rope.apply(x.clone());
    let plain_ref = rope.apply_reference(x.clone());
    assert_close(
        &values(plain.clone()),
        &values(plain_ref.clone()),
        1e-6,
        "rope",
    );
    let gx = |out: Tensor<4>| grad(&x, &backward_with(out, &w));
    assert_close(&gx(plain), &gx(plain_ref), 1e-6, "rope gradient");

    let scaled = rope.apply_scaled(x.clone(), gamma.clone(), beta.clone());
    let scaled_ref = rope.apply_reference(
        x.clone() * gamma.clone().reshape([1, 1, 1, dim]) + beta.clone().reshape([1, 1, 1, dim]),
    );
    assert_close(
        &values(scaled.clone()),
        &values(scaled_ref.clone()),
        1e-6,
        "scaled rope",
    );
    let grads = |out: Tensor<4>| {
        let g = backward_with(out, &w);
        vec![grad(&x, &g), grad(&gamma, &g), grad(&beta, &g)]
    };
    let (a, b) = (grads(scaled), grads(scaled_ref));
    assert_close(&a[0], &b[0], 1e-6, "dx");
    assert_grads_close(&["dgamma", "dbeta"], &a[1..], &b[1..], 1e-5, "scaled rope");
}

#[test]
fn fused_head_split_and_merge_match_burn_values_and_gradients() {
    at_every_simd_level(fused_head_split_and_merge_match_burn_values_and_gradients_at_this_level);
}

/// `fused::split_heads` (with and without RoPE) and `fused::merge_heads` against burn's
/// reshape / swap / reshape and `Rope::apply_reference`: values and input gradients, with more
/// vectors than one parallel task and task edges inside a head's rows; an odd head width without
/// RoPE.
fn fused_head_split_and_merge_match_burn_values_and_gradients_at_this_level() {
    let dev = autodiff_device();
    for (b, t, h, dh) in [(2, 300, 3, 16), (3, 37, 2, 5), (1, 1, 1, 2)] {
        let case = format!("B {b}, T {t}, H {h}, dh {dh}");
        let split_ref = |x: Tensor<3>| {
            x.reshape([b, t, h, dh])
                .swap_dims(1, 2)
                .reshape([b * h, t, dh])
        };
        let x = randn([b, t, h * dh], 1, &dev).require_grad();
        let w = randn([b * h, t, dh], 2, &dev);
        let gx = |out: Tensor<3>| grad(&x, &backward_with(out, &w));

        // A plain split moves values: the same bits both ways.
        let split = fused::split_heads(&x, h, None).expect("flex autodiff");
        assert_eq!(
            values(split.clone()),
            values(split_ref(x.clone())),
            "split {case}"
        );
        assert_eq!(gx(split), gx(split_ref(x.clone())), "split gradient {case}");

        // Heads back: merge is split's inverse, and its gradient splits.
        let heads = randn([b * h, t, dh], 3, &dev).require_grad();
        let merged = fused::merge_heads(&heads, h).expect("flex autodiff");
        let merged_ref = heads
            .clone()
            .reshape([b, h, t, dh])
            .swap_dims(1, 2)
            .reshape([b, t, h * dh]);
        assert_eq!(
            values(merged.clone()),
            values(merged_ref.clone()),
            "merge {case}"
        );
        let wm = randn([b, t, h * dh], 4, &dev);
        let gh = |out: Tensor<3>| grad(&heads, &backward_with(out, &wm));
        assert_eq!(gh(merged), gh(merged_ref), "merge gradient {case}");

        if dh % 2 == 0 {
            // With RoPE: rotated as `Rope::apply_reference` rotates the split heads.
            let rope = Rope::new(dh, 5, t, &dev);
            let turned = fused::split_heads(&x, h, Some(rope.tables())).expect("flex autodiff");
            let turned_ref = rope.apply_reference(split_ref(x.clone()));
            assert_close(
                &values(turned.clone()),
                &values(turned_ref.clone()),
                1e-6,
                &format!("split with RoPE {case}"),
            );
            assert_close(
                &gx(turned),
                &gx(turned_ref),
                1e-6,
                &format!("split with RoPE gradient {case}"),
            );
        }
    }
}

#[test]
fn fused_bias_activation_matches_reference_values_and_gradients() {
    at_every_simd_level(fused_bias_activation_matches_reference_values_and_gradients_at_this_level);
}

fn fused_bias_activation_matches_reference_values_and_gradients_at_this_level() {
    let dev = autodiff_device();
    // Rows of 7 do not divide the kernel's task size: tasks must still cut at row boundaries.
    let x = randn([5, 3001, 7], 1, &dev).mul_scalar(3.0).require_grad();
    let bias = randn([7], 2, &dev).require_grad();
    let w = randn([5, 3001, 7], 3, &dev);
    for act in [Activation::Silu, Activation::Gelu, Activation::GeluTanh] {
        let fused_out = bias_activation(x.clone(), Some(bias.clone()), act);
        let ref_out = act.reference(x.clone() + bias.clone().reshape([1, 1, 7]));
        let what = format!("{act:?} with bias");
        assert_close(
            &values(fused_out.clone()),
            &values(ref_out.clone()),
            1e-6,
            &what,
        );
        let g = |out: Tensor<3>| {
            let gr = backward_with(out, &w);
            (grad(&x, &gr), grad(&bias, &gr))
        };
        let (a, b) = (g(fused_out), g(ref_out));
        assert_close(&a.0, &b.0, 2e-6, &format!("{what}: dx"));
        assert_close(&a.1, &b.1, 1e-5, &format!("{what}: dbias"));
    }
}

#[test]
fn fused_gated_activations_match_reference_values_and_gradients() {
    at_every_simd_level(fused_gated_activations_match_reference_values_and_gradients_at_this_level);
}

/// `act(x + b) ⊙ gate` written out in burn ops, against the fused kernel: GAU's gate (a separate
/// gate tensor, U's SiLU folded in) and the GLU (the input's two halves), with and without a bias,
/// rows of odd widths that do not divide the kernel's task size.
fn fused_gated_activations_match_reference_values_and_gradients_at_this_level() {
    let dev = autodiff_device();
    for (f, rows) in [(7, 3001), (33, 517), (1, 40)] {
        let x = randn([3, rows, f], 1, &dev).mul_scalar(3.0).require_grad();
        let x2 = randn([3, rows, 2 * f], 2, &dev)
            .mul_scalar(3.0)
            .require_grad();
        let gate = randn([3, rows, f], 3, &dev).require_grad();
        let b = randn([f], 4, &dev).require_grad();
        let b2 = randn([2 * f], 5, &dev).require_grad();
        let w = randn([3, rows, f], 6, &dev);
        let add_bias = |x: Tensor<3>, b: Option<&Tensor<1>>| match b {
            Some(b) => {
                let n = b.dims()[0];
                x + b.clone().reshape([1, 1, n])
            }
            None => x,
        };
        for act in [Activation::Silu, Activation::Gelu, Activation::GeluTanh] {
            for with_bias in [true, false] {
                // The separate gate: act(x + b) ⊙ gate.
                let what = format!("{act:?}, gate tensor, f {f}, bias {with_bias}");
                let bias = with_bias.then(|| b.clone());
                let fused_out =
                    gated_activation(x.clone(), bias.clone(), act, Gate::Tensor(gate.clone()));
                let ref_out = act.reference(add_bias(x.clone(), bias.as_ref())) * gate.clone();
                assert_close(
                    &values(fused_out.clone()),
                    &values(ref_out.clone()),
                    2e-6,
                    &what,
                );
                let grads = |out: Tensor<3>| {
                    let gr = backward_with(out, &w);
                    let mut v = vec![grad(&x, &gr), grad(&gate, &gr)];
                    if with_bias {
                        v.push(grad(&b, &gr));
                    }
                    v
                };
                let names = ["dx", "dgate", "dbias"];
                let (ga, gb) = (grads(fused_out), grads(ref_out));
                assert_grads_close(&names[..ga.len()], &ga, &gb, 2e-5, &what);

                // The GLU: act(x[.., :f] + b[:f]) ⊙ (x[.., f:] + b[f:]).
                let what = format!("{act:?}, second half, f {f}, bias {with_bias}");
                let bias = with_bias.then(|| b2.clone());
                let fused_out = gated_activation(x2.clone(), bias.clone(), act, Gate::SecondHalf);
                let pre = add_bias(x2.clone(), bias.as_ref());
                let ref_out = act.reference(pre.clone().narrow(2, 0, f)) * pre.narrow(2, f, f);
                assert_close(
                    &values(fused_out.clone()),
                    &values(ref_out.clone()),
                    2e-6,
                    &what,
                );
                let grads = |out: Tensor<3>| {
                    let gr = backward_with(out, &w);
                    let mut v = vec![grad(&x2, &gr)];
                    if with_bias {
                        v.push(grad(&b2, &gr));
                    }
                    v
                };
                let (ga, gb) = (grads(fused_out), grads(ref_out));
                assert_grads_close(&["dx", "dbias"][..ga.len()], &ga, &gb, 2e-5, &what);
            }
        }
    }
    // Without autodiff: the forward alone.
    let plain = device();
    let (x, g) = (randn([2, 5, 6], 7, &plain), randn([2, 5, 3], 8, &plain));
    let out = gated_activation(x.clone(), None, Activation::Gelu, Gate::SecondHalf);
    let expected =
        Activation::Gelu.reference(x.clone().narrow(2, 0, 3)) * x.clone().narrow(2, 3, 3);
    assert_close(&values(out), &values(expected), 2e-6, "plain, second half");
    let x3 = x.narrow(2, 0, 3);
    let out = gated_activation(x3.clone(), None, Activation::Silu, Gate::Tensor(g.clone()));
    let expected = Activation::Silu.reference(x3) * g;
    assert_close(&values(out), &values(expected), 2e-6, "plain, gate tensor");
}

#[test]
fn fused_affine_matches_burn_values_and_gradients() {
    // Odd shapes spanning several of the bias fill's and column sums' tasks, the weight and
    // bias narrowed as `linear_columns` passes them.
    let dev = autodiff_device();
    let (m, k, n) = (5000, 19, 29);
    let a = randn([m, k], 1, &dev).require_grad();
    let w = randn([k, 53], 2, &dev).require_grad();
    let b = randn([53], 3, &dev).require_grad();
    let up = randn([m, n], 4, &dev);
    let operands = || (w.clone().narrow(1, 17, n), b.clone().narrow(0, 17, n));
    let (w1, b1) = operands();
    let fused_out = fused::affine_2d(a.clone(), w1, b1);
    let (w2, b2) = operands();
    let ref_out = a.clone().matmul(w2) + b2.unsqueeze();
    assert_close(
        &values(fused_out.clone()),
        &values(ref_out.clone()),
        1e-5,
        "affine",
    );
    let grads = |out: Tensor<2>| {
        let gr = backward_with(out, &up);
        vec![grad(&a, &gr), grad(&w, &gr), grad(&b, &gr)]
    };
    assert_grads_close(
        &["da", "dw", "dbias"],
        &grads(fused_out),
        &grads(ref_out),
        1e-5,
        "affine",
    );
    let plain = device();
    let (x, y, c) = (
        randn([5, 7], 5, &plain),
        randn([7, 3], 6, &plain),
        randn([3], 7, &plain),
    );
    assert_close(
        &values(fused::affine_2d(x.clone(), y.clone(), c.clone())),
        &values(x.matmul(y) + c.unsqueeze()),
        1e-5,
        "plain device",
    );
}

/// LayerNorm by the formula in plain burn ops: `(x − mean) / sqrt(mean((x − mean)²) + eps) · γ + β`.
fn layer_norm_reference(x: Tensor<3>, gamma: Tensor<1>, beta: Option<Tensor<1>>) -> Tensor<3> {
    let d = gamma.dims()[0];
    let centered = x.clone() - x.mean_dim(2);
    let var = centered.clone().powi_scalar(2).mean_dim(2);
    let y =
        centered / var.add_scalar(model::layers::LAYER_NORM_EPS).sqrt() * gamma.reshape([1, 1, d]);
    match beta {
        Some(b) => y + b.reshape([1, 1, d]),
        None => y,
    }
}

#[test]
fn fused_layer_norm_matches_the_formula_values_and_gradients() {
    at_every_simd_level(fused_layer_norm_matches_the_formula_values_and_gradients_at_this_level);
}

fn fused_layer_norm_matches_the_formula_values_and_gradients_at_this_level() {
    let dev = autodiff_device();
    // 3 × 45 rows: not a multiple of the kernel's rows per task; width 37: not of the vector width.
    // A large common offset checks that the variance is taken about the mean.
    let x = randn([3, 45, 37], 1, &dev)
        .mul_scalar(2.0)
        .add_scalar(5.0)
        .require_grad();
    let gamma = randn([37], 2, &dev).add_scalar(1.0).require_grad();
    let beta = randn([37], 3, &dev).require_grad();
    let w = randn([3, 45, 37], 4, &dev);
    for with_beta in [true, false] {
        let b = with_beta.then(|| beta.clone());
        let what = format!("layer norm, offset {with_beta}");
        let fused_out =
            fused::layer_norm(&x, &gamma, b.as_ref(), model::layers::LAYER_NORM_EPS).expect("flex");
        let ref_out = layer_norm_reference(x.clone(), gamma.clone(), b.clone());
        assert_close(
            &values(fused_out.clone()),
            &values(ref_out.clone()),
            1e-5,
            &what,
        );
        let g = |out: Tensor<3>| {
            let gr = backward_with(out, &w);
            let mut gs = vec![grad(&x, &gr), grad(&gamma, &gr)];
            if with_beta {
                gs.push(grad(&beta, &gr));
            }
            gs
        };
        let (a, r) = (g(fused_out), g(ref_out));
        assert_grads_close(&["dx", "dgamma", "dbeta"], &a, &r, 2e-4, &what);
    }
}

#[test]
fn fused_rms_norm_matches_the_formula_values_and_gradients() {
    at_every_simd_level(fused_rms_norm_matches_the_formula_values_and_gradients_at_this_level);
}

/// RMSNorm (T5) by the formula in plain burn ops, `x / sqrt(mean(x²) + eps) · γ`, against the fused
/// kernel and against burn's `RmsNorm` module; a common offset that must *not* be removed.
fn fused_rms_norm_matches_the_formula_values_and_gradients_at_this_level() {
    let dev = autodiff_device();
    let eps = 1e-6;
    let x = randn([3, 45, 37], 1, &dev)
        .mul_scalar(2.0)
        .add_scalar(1.5)
        .require_grad();
    let gamma = randn([37], 2, &dev).add_scalar(1.0).require_grad();
    let w = randn([3, 45, 37], 4, &dev);
    let fused_out = fused::rms_norm(&x, &gamma, eps).expect("flex");
    let formula = x.clone() / x.clone().powi_scalar(2).mean_dim(2).add_scalar(eps).sqrt()
        * gamma.clone().reshape([1, 1, 37]);
    let module = burn::nn::RmsNorm {
        gamma: burn::module::Param::from_tensor(gamma.clone()),
        epsilon: eps,
    };
    let burn_out = module.forward(x.clone());
    assert_close(
        &values(fused_out.clone()),
        &values(formula.clone()),
        1e-5,
        "rms norm",
    );
    assert_close(
        &values(burn_out),
        &values(formula.clone()),
        1e-5,
        "burn's RmsNorm",
    );
    let g = |out: Tensor<3>| {
        let gr = backward_with(out, &w);
        vec![grad(&x, &gr), grad(&gamma, &gr)]
    };
    let (a, r) = (g(fused_out), g(formula));
    assert_grads_close(&["dx", "dgamma"], &a, &r, 2e-4, "rms norm");
}

/// Every fused kernel gives the same bits at every SIMD level: the kernels' reductions use the same
/// partial sums in the same order at every width, and Rust does not contract `a * b + c` into an
/// FMA, so a wider build may only change speed. (gemm picks its own kernels, the same for every
/// level here.)
#[test]
fn fused_kernels_give_the_same_bits_at_every_simd_level() {
    let dev = autodiff_device();
    // Inputs drawn once: the device's generator is shared with the tests running beside this one,
    // so drawing again per level could give other values.
    let x = randn([3, 41, 37], 1, &dev).mul_scalar(3.0).require_grad();
    let bias = randn([37], 2, &dev).require_grad();
    let w = randn([3, 41, 37], 3, &dev);
    let logits = randn([29, 83], 4, &dev).mul_scalar(10.0).require_grad();
    let targets = Tensor::<1, Int>::from_data(
        TensorData::new((0..29i64).map(|i| (i * 5) % 83).collect::<Vec<_>>(), [29]),
        &dev,
    );
    let (n, t, dk) = (2, ROW_BLOCK + 19, 13);
    let q = randn([n, t, dk], 5, &dev).require_grad();
    let k = randn([n, t, dk], 6, &dev).require_grad();
    let v = randn([n, t, dk], 7, &dev).require_grad();
    let ab = randn([t, t], 8, &dev).mul_scalar(0.1).require_grad();
    let w_att = randn([n, t, dk], 9, &dev);
    let rope = Rope::new(10, 5, 33, &dev);
    let r_in = randn([2, 33, 10], 10, &dev).require_grad();
    let w_rot = randn([2, 33, 10], 11, &dev);
    let glu_in = randn([3, 41, 74], 12, &dev).mul_scalar(3.0).require_grad();
    let glu_bias = randn([74], 13, &dev).require_grad();
    let run = || -> Vec<Vec<f32>> {
        let glu = gated_activation(
            glu_in.clone(),
            Some(glu_bias.clone()),
            Activation::Gelu,
            Gate::SecondHalf,
        );
        let g_glu = backward_with(glu.clone(), &w);
        let gate = gated_activation(
            x.clone(),
            Some(bias.clone()),
            Activation::Silu,
            Gate::Tensor(w.clone()),
        );
        let g_gate = backward_with(gate.clone(), &w);
        let aff = fused::affine_2d(
            x.clone().reshape([123, 37]),
            logits.clone().transpose().narrow(0, 0, 37),
            logits
                .clone()
                .narrow(0, 1, 1)
                .reshape([83])
                .narrow(0, 0, 29),
        );
        let g_aff = aff.clone().sum().backward();
        let act = bias_activation(x.clone(), Some(bias.clone()), Activation::Gelu);
        let g_act = backward_with(act.clone(), &w);
        let tanh_act = gated_activation(
            x.clone(),
            None,
            Activation::GeluTanh,
            Gate::Tensor(w.clone()),
        );
        let g_tanh_act = backward_with(tanh_act.clone(), &w);
        let rows = fused::cross_entropy_rows(&logits, &targets).expect("flex");
        let g_ce = rows.clone().sum().backward();
        let spec = AttentionSpec {
            score: ScoreFn::Softmax,
            scale: 0.3,
            causal: true,
        };
        let att = fused::attention(&q, &k, &v, Some(&ab), spec).expect("flex");
        let g_att = backward_with(att.clone(), &w_att);
        let rot = rope.apply(r_in.clone());
        let g_rot = backward_with(rot.clone(), &w_rot);
        let norm = fused::layer_norm(&x, &bias, Some(&bias), 1e-5).expect("flex");
        let g_norm = backward_with(norm.clone(), &w);
        let rms = fused::rms_norm(&x, &bias, 1e-6).expect("flex");
        let g_rms = backward_with(rms.clone(), &w);
        // The head + loss: X [41, 37] (x's first sequence), W [29, 37] (logits' rows as words).
        let hx = x.clone().narrow(0, 0, 1).reshape([41, 37]);
        let hw = logits.clone().narrow(1, 0, 37);
        let htargets = Tensor::<1, Int>::from_data(
            TensorData::new((0..41i64).map(|i| (i * 3) % 29).collect::<Vec<_>>(), [41]),
            &dev,
        );
        let head = fused::linear_cross_entropy_in_blocks(
            &hx,
            (&hw, HeadLayout::VocabRows),
            &htargets,
            None,
            16,
        )
        .expect("flex");
        let g_head = head.clone().backward();
        vec![
            values(glu),
            grad(&glu_in, &g_glu),
            grad(&glu_bias, &g_glu),
            values(gate),
            grad(&x, &g_gate),
            grad(&bias, &g_gate),
            values(aff),
            grad(&logits, &g_aff),
            values(act),
            grad(&x, &g_act),
            grad(&bias, &g_act),
            values(tanh_act),
            grad(&x, &g_tanh_act),
            values(rows),
            grad(&logits, &g_ce),
            values(att),
            grad(&q, &g_att),
            grad(&k, &g_att),
            grad(&v, &g_att),
            grad(&ab, &g_att),
            values(rot),
            grad(&r_in, &g_rot),
            values(norm),
            grad(&x, &g_norm),
            values(rms),
            grad(&x, &g_rms),
            grad(&bias, &g_rms),
            grad(&bias, &g_norm),
            values(head),
            grad(&x, &g_head),
            grad(&logits, &g_head),
        ]
    };
    let bits = |vs: Vec<Vec<f32>>| -> Vec<Vec<u32>> {
        vs.into_iter()
            .map(|v| v.into_iter().map(f32::to_bits).collect())
            .collect()
    };
    let scalar = bits(simd::with_level(SimdLevel::Scalar, run));
    for level in SimdLevel::supported_levels() {
        let got = bits(simd::with_level(level, run));
        for (i, (a, b)) in got.iter().zip(&scalar).enumerate() {
            assert!(a == b, "output {i} differs at SIMD level {}", level.name());
        }
    }
}

/// Outputs and every input's gradient of one fused attention call (weighted sum of the output).
fn attention_outputs_and_grads(
    (q, k, v, bias): (&Tensor<3>, &Tensor<3>, &Tensor<3>, Option<&Tensor<2>>),
    w: &Tensor<3>,
    spec: AttentionSpec,
) -> Vec<Vec<u32>> {
    let y = fused::attention(q, k, v, bias, spec).expect("flex");
    let g = backward_with(y.clone(), w);
    let mut out = vec![values(y), grad(q, &g), grad(k, &g), grad(v, &g)];
    if let Some(b) = bias {
        out.push(grad(b, &g));
    }
    out.into_iter()
        .map(|v| v.into_iter().map(f32::to_bits).collect())
        .collect()
}

/// A relu² forward keeps its block scores for the backward (up to `kept_scores_limit`), which then
/// skips the `Q Kᵀ` product: the gradients must be the recomputing backward's to the bit, for both
/// thread layouts, causal and not, with and without a bias, over several row blocks and a ragged
/// last one.
#[test]
fn relu2_attention_with_kept_scores_gives_the_recomputed_bits() {
    let dev = autodiff_device();
    let t = 2 * ROW_BLOCK + 19;
    assert!(
        fused::kept_scores_limit() >= 3 * t * t * 4,
        "the default limit keeps these scores"
    );
    for n in [1, 3] {
        let q = randn([n, t, 13], 21, &dev).require_grad();
        let k = randn([n, t, 13], 22, &dev).require_grad();
        let v = randn([n, t, 11], 23, &dev).require_grad();
        let ab = randn([t, t], 24, &dev).mul_scalar(0.1).require_grad();
        let w = randn([n, t, 11], 25, &dev);
        for causal in [true, false] {
            for bias in [None, Some(&ab)] {
                let spec = AttentionSpec {
                    score: ScoreFn::Relu2,
                    scale: 0.2,
                    causal,
                };
                let run = || attention_outputs_and_grads((&q, &k, &v, bias), &w, spec);
                let kept = run();
                let recomputed = fused::with_kept_scores_limit(0, run);
                for (i, (a, b)) in kept.iter().zip(&recomputed).enumerate() {
                    assert!(
                        a == b,
                        "output {i} differs with kept scores (n {n}, causal {causal}, bias {})",
                        bias.is_some()
                    );
                }
            }
        }
    }
}

/// The fused attention gives the same bits on one thread and on two: one batch element runs its
/// products multi-threaded (gemm splits the output, not the sums), several run one per thread, and
/// the training runs of a sweep may be trained on either (`fig5`'s re-run split over two one-thread
/// processes relies on it).
#[test]
fn fused_attention_gives_the_same_bits_on_one_and_two_threads() {
    let dev = autodiff_device();
    let t = ROW_BLOCK + 37;
    let q = randn([2, t, 16], 31, &dev);
    let k = randn([2, t, 16], 32, &dev);
    let v = randn([2, t, 12], 33, &dev);
    let w = randn([2, t, 12], 34, &dev);
    let pool = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool")
    };
    let (one, two) = (pool(1), pool(2));
    for n in [1, 2] {
        let part = |x: &Tensor<3>| x.clone().narrow(0, 0, n).require_grad();
        let (q, k, v, w) = (part(&q), part(&k), part(&v), w.clone().narrow(0, 0, n));
        for score in [ScoreFn::Relu2, ScoreFn::Softmax] {
            for causal in [true, false] {
                let spec = AttentionSpec {
                    score,
                    scale: 0.25,
                    causal,
                };
                let run = || attention_outputs_and_grads((&q, &k, &v, None), &w, spec);
                let (a, b) = (one.install(run), two.install(run));
                for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                    assert!(
                        x == y,
                        "output {i} differs between 1 and 2 threads ({score:?}, causal {causal}, n {n})"
                    );
                }
            }
        }
    }
}

/// [`fused::Adafactor`] against burn-optim's `Adafactor` built from the same fields, four steps
/// with a new random gradient each (so the second moments' moving average runs), at every SIMD
/// level: a stack of matrices, a matrix whose row tasks end short, one whose rows are wider than a
/// task, and a vector; T5's settings (update scaled by RMS(W)), unscaled with a clip never reached,
/// and weight decay with a relative step and a tight clip. Parameters and both second moments agree.
#[test]
fn fused_adafactor_matches_burn_optims() {
    at_every_simd_level(|| {
        let t5 = fused::AdafactorSettings::t5();
        // A loose clip, which the normalised update (RMS about 1) stays under.
        let flash = fused::AdafactorSettings {
            scale_parameter: false,
            clip_threshold: 4.0,
            ..t5
        };
        let decayed = fused::AdafactorSettings {
            relative_step: true,
            weight_decay: 0.1,
            clip_threshold: 0.05,
            ..t5
        };
        for (name, settings) in [("t5", t5), ("flash", flash), ("decayed", decayed)] {
            // burn's, configured here apart from `fused::Adafactor::new` (its epsilons the defaults).
            let reference = burn::optim::AdafactorConfig::new()
                .with_weight_decay(settings.weight_decay)
                .with_scale_parameter(settings.scale_parameter)
                .with_relative_step(settings.relative_step)
                .with_decay_rate(settings.decay_rate)
                .with_clip_threshold(settings.clip_threshold)
                .build();
            // The fused update runs on the plain device, and declines on the reference path.
            let (w, g) = (randn([3, 4], 1, &device()), randn([3, 4], 2, &device()));
            assert!(fused::adafactor_step(&settings, 0.01, 1, (&w, &g), None).is_some());
            let declined = fused::with_reference(|| {
                fused::adafactor_step(&settings, 0.01, 1, (&w, &g), None).is_none()
            });
            assert!(declined);
            let fused = fused::Adafactor::new(settings);
            let optims = (&fused, &reference);
            adafactor_agrees(name, optims, [3, 37, 53]);
            adafactor_agrees(name, optims, [1000, 41]);
            adafactor_agrees(name, optims, [5, 40000]);
            adafactor_agrees(name, optims, [129]);
        }
    });
}

/// Four steps of `fused` and `reference` from the same parameter of `shape` with the same
/// gradients: the parameters and second moments (row and column, or a vector's) agree.
fn adafactor_agrees<const D: usize>(
    name: &str,
    (fused, reference): (&fused::Adafactor, &burn::optim::Adafactor),
    shape: [usize; D],
) {
    use burn::optim::{AdafactorState, Optimizer};
    // The parameter and the four gradients, drawn once for both (the device's generator is shared
    // with the tests running beside this one).
    let dev = device();
    let w = randn(shape, 1, &dev);
    let gs: Vec<Tensor<D>> = (0..4)
        .map(|step| randn(shape, 10 + step, &dev).mul_scalar(0.1 + step as f32))
        .collect();
    let run = |optim: &dyn Fn(
        Tensor<D>,
        Tensor<D>,
        Option<AdafactorState<D>>,
    ) -> (Tensor<D>, Option<AdafactorState<D>>)| {
        let (mut w, mut state) = (w.clone(), None);
        for g in &gs {
            (w, state) = optim(w, g.clone(), state);
        }
        let state = state.expect("a state");
        assert_eq!(state.time, 4);
        let mut out = vec![values(w), values(state.second_moment)];
        out.extend(state.column_second_moment.map(values));
        out
    };
    let ours = run(&|w, g, s| fused.step(0.01, w, g, s));
    let theirs = run(&|w, g, s| reference.step(0.01, w, g, s));
    assert_eq!(ours.len(), theirs.len(), "{name}, {shape:?}: state layout");
    assert_eq!(ours.len(), if D == 1 { 2 } else { 3 });
    for ((what, a), b) in ["W", "rows", "columns"].iter().zip(&ours).zip(&theirs) {
        assert_close(a, b, 2e-5, &format!("{name}, {shape:?}: {what}"));
    }
}
