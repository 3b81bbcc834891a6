//! FLASH's chunked computation against plain references: FLASH-Quad's full attention (C = T, causal)
//! and the full T×T mixed attention matrix (both directions, lengths not multiples of C), comparing
//! outputs and gradients.

use burn::prelude::*;
use model::attention::{ChunkParts, mixed_chunk_attention, relu2_attention};
use model::layers::{Direction, RelPosBias, Relu2Scaling, exclusive_chunk_sum, relu2};

use crate::common::*;

const S: usize = 8;
const E: usize = 6;

struct Inputs {
    qq: Tensor<3>,
    kq: Tensor<3>,
    ql: Tensor<3>,
    kl: Tensor<3>,
    v: Tensor<3>,
}

fn inputs(n: usize, t: usize, device: &Device) -> Inputs {
    let leaf = |x: Tensor<3>| x.require_grad();
    Inputs {
        qq: leaf(randn([n, t, S], 1, device)),
        kq: leaf(randn([n, t, S], 2, device)),
        ql: leaf(randn([n, t, S], 3, device)),
        kl: leaf(randn([n, t, S], 4, device)),
        v: leaf(randn([n, t, E], 5, device)),
    }
}

/// The mixed attention matrix written out in full: for query i in chunk g(i) and key j,
/// `A[i, j] = relu²(qq_i·kq_j f + b[i mod C, j mod C])` when g(j) = g(i) (and j ≤ i if causal),
/// plus `ql_i·kl_j f` when g(j) < g(i) (causal) or for every j (bidirectional); output `A V`.
fn reference(x: &Inputs, bias: &Tensor<2>, chunk: usize, direction: Direction) -> Tensor<3> {
    let [_, t, _] = x.qq.dims();
    let device = x.qq.device();
    let f = 1.0 / chunk as f64;
    let mut same = vec![0f32; t * t];
    let mut global = vec![0f32; t * t];
    let mut bias_idx = vec![0i64; t * t];
    for i in 0..t {
        for j in 0..t {
            let (gi, gj) = (i / chunk, j / chunk);
            let visible = direction == Direction::Bidirectional || j <= i;
            same[i * t + j] = (gi == gj && visible) as u8 as f32;
            global[i * t + j] = match direction {
                Direction::Causal => (gj < gi) as u8 as f32,
                Direction::Bidirectional => 1.0,
            };
            bias_idx[i * t + j] = ((i % chunk) * chunk + j % chunk) as i64;
        }
    }
    let mask =
        |d: Vec<f32>| Tensor::<2>::from_data(TensorData::new(d, [t, t]), &device).unsqueeze::<3>();
    let idx = Tensor::<1, Int>::from_data(TensorData::new(bias_idx, [t * t]), &device);
    let full_bias = bias
        .clone()
        .reshape([chunk * chunk])
        .select(0, idx)
        .reshape([t, t])
        .unsqueeze::<3>();
    let local = relu2(
        x.qq.clone()
            .matmul(x.kq.clone().swap_dims(1, 2))
            .mul_scalar(f)
            + full_bias,
    ) * mask(same);
    let lin =
        x.ql.clone()
            .matmul(x.kl.clone().swap_dims(1, 2))
            .mul_scalar(f)
            * mask(global);
    (local + lin).matmul(x.v.clone())
}

fn grads_of(out: Tensor<3>, x: &Inputs, weights: &Tensor<3>) -> Vec<Vec<f32>> {
    let grads = (out * weights.clone()).sum().backward();
    [&x.qq, &x.kq, &x.ql, &x.kl, &x.v]
        .iter()
        // An input with no path to the output (causal K_lin with a single chunk) has zero gradient.
        .map(|t| {
            t.grad(&grads)
                .map(values)
                .unwrap_or_else(|| vec![0.0; t.shape().num_elements()])
        })
        .collect()
}

#[test]
fn chunked_equals_full_matrix_reference_outputs_and_gradients() {
    let device = autodiff_device();
    let chunk = 8;
    let bias = RelPosBias::new(chunk, &device)
        .square(chunk, &device)
        .detach();
    for direction in [Direction::Causal, Direction::Bidirectional] {
        for t in [5, 8, 13, 21, 32] {
            let x = inputs(2, t, &device);
            let chunked = mixed_chunk_attention(
                x.qq.clone(),
                x.kq.clone(),
                x.ql.clone(),
                x.kl.clone(),
                x.v.clone(),
                Some(bias.clone()),
                chunk,
                Relu2Scaling::Window,
                direction,
                ChunkParts::Mixed,
            );
            let full = reference(&x, &bias, chunk, direction);
            let what = format!("{direction:?}, T = {t}");
            assert_close(
                &values(chunked.clone()),
                &values(full.clone()),
                1e-5,
                &format!("outputs, {what}"),
            );
            let w = randn([2, t, E], 9, &device);
            let g_chunked = grads_of(chunked, &x, &w);
            let g_full = grads_of(full, &x, &w);
            for (name, (a, b)) in ["qq", "kq", "ql", "kl", "v"]
                .iter()
                .zip(g_chunked.iter().zip(&g_full))
            {
                assert_close(a, b, 1e-5, &format!("gradient of {name}, {what}"));
            }
        }
    }
}

/// Causal FLASH with a single chunk (C = T) has no earlier chunk, so it is FLASH-Quad exactly.
#[test]
fn causal_flash_with_one_chunk_is_flash_quad() {
    let device = autodiff_device();
    for t in [16, 24] {
        let x = inputs(3, t, &device);
        let bias = RelPosBias::new(t, &device).square(t, &device);
        let flash = mixed_chunk_attention(
            x.qq.clone(),
            x.kq.clone(),
            x.ql.clone(),
            x.kl.clone(),
            x.v.clone(),
            Some(bias.clone()),
            t,
            Relu2Scaling::Window,
            Direction::Causal,
            ChunkParts::Mixed,
        );
        let quad = relu2_attention(
            x.qq,
            x.kq,
            x.v,
            Some(bias),
            Relu2Scaling::Window.factor(t),
            Direction::Causal,
        );
        assert_close(&values(flash), &values(quad), 1e-6, &format!("T = C = {t}"));
    }
}

/// Bidirectionally, the global part still adds the chunk's own K_linᵀV, so C = T is not FLASH-Quad.
#[test]
fn bidirectional_flash_with_one_chunk_is_not_flash_quad() {
    let device = autodiff_device();
    let t = 16;
    let x = inputs(1, t, &device);
    let flash = mixed_chunk_attention(
        x.qq.clone(),
        x.kq.clone(),
        x.ql,
        x.kl,
        x.v.clone(),
        None,
        t,
        Relu2Scaling::Window,
        Direction::Bidirectional,
        ChunkParts::Mixed,
    );
    let quad = relu2_attention(
        x.qq,
        x.kq,
        x.v,
        None,
        Relu2Scaling::Window.factor(t),
        Direction::Bidirectional,
    );
    assert!(max_rel_diff(&values(flash), &values(quad)) > 1e-3);
}

#[test]
fn exclusive_chunk_sum_matches_loop() {
    let device = device();
    let x = randn([2, 5, 3, 4], 21, &device);
    let got = values(exclusive_chunk_sum(x.clone()));
    let xs = values(x);
    let mut want = vec![0f32; xs.len()];
    let per_chunk = 12;
    for b in 0..2 {
        for g in 0..5 {
            for h in 0..g {
                for k in 0..per_chunk {
                    want[(b * 5 + g) * per_chunk + k] += xs[(b * 5 + h) * per_chunk + k];
                }
            }
        }
    }
    assert_close(&got, &want, 1e-6, "exclusive chunk sum");
}
