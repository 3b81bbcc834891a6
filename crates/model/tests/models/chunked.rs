//! FLASH's chunked computation against plain references: FLASH-Quad's full attention (C = T, causal)
//! and the full T×T mixed attention matrix written out by hand (both directions, lengths not
//! multiples of C, each of FLASH / LocalOnly / GlobalOnly), comparing outputs and gradients.

use burn::module::Module;
use burn::prelude::*;
use model::attention::{ChunkParts, MixedChunkSpec, mixed_chunk_attention, relu2_attention};
use model::layers::{
    Direction, GlobalScaling, RelPosBias, Relu2Scaling, exclusive_chunk_sum, relu2,
};
use model::{Architecture, LanguageModel, ModelConfig};

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

impl Inputs {
    fn heads(&self) -> [Tensor<3>; 4] {
        [&self.qq, &self.kq, &self.ql, &self.kl].map(Clone::clone)
    }
}

/// The paper's mixed chunk attention with its default scalings, keeping `parts`.
fn spec(chunk: usize, direction: Direction, parts: ChunkParts) -> MixedChunkSpec {
    MixedChunkSpec {
        chunk,
        scaling: Relu2Scaling::Window,
        global_scaling: GlobalScaling::Appendix,
        direction,
        parts,
    }
}

/// The mixed attention matrix written out in full: for query i in chunk g(i) and key j,
/// `A[i, j] = relu²(qq_i·kq_j / C + b[i mod C, j mod C])` when g(j) = g(i) (and j ≤ i if causal),
/// plus `ql_i·kl_j f_g` when g(j) < g(i) (causal, f_g = 1/C) or for every j (bidirectional,
/// f_g = 1/T: the appendix code's ports divide the bidirectional global sum by the sequence
/// length); output `A V`. `parts` drops the local or the global term.
fn reference(
    x: &Inputs,
    bias: &Tensor<2>,
    chunk: usize,
    direction: Direction,
    parts: ChunkParts,
) -> Tensor<3> {
    let [_, t, _] = x.qq.dims();
    let device = x.qq.device();
    let f = 1.0 / chunk as f64;
    let f_global = match direction {
        Direction::Causal => 1.0 / chunk as f64,
        Direction::Bidirectional => 1.0 / t as f64,
    };
    let keep_local = !matches!(parts, ChunkParts::GlobalOnly) as u8 as f32;
    let keep_global = !matches!(parts, ChunkParts::LocalOnly) as u8 as f32;
    let mut same = vec![0f32; t * t];
    let mut global = vec![0f32; t * t];
    let mut bias_idx = vec![0i64; t * t];
    for i in 0..t {
        for j in 0..t {
            let (gi, gj) = (i / chunk, j / chunk);
            let visible = direction == Direction::Bidirectional || j <= i;
            same[i * t + j] = keep_local * (gi == gj && visible) as u8 as f32;
            global[i * t + j] = keep_global
                * match direction {
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
            .mul_scalar(f_global)
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

/// FLASH, LocalOnly and GlobalOnly each equal the hand-written T×T matrix with the same parts, on
/// the same inputs: LocalOnly is FLASH's output without the global term, GlobalOnly without the
/// local one.
#[test]
fn chunked_equals_full_matrix_reference_outputs_and_gradients() {
    let device = autodiff_device();
    let chunk = 8;
    let bias = RelPosBias::new(chunk, &device)
        .square(chunk, &device)
        .detach();
    for parts in [
        ChunkParts::Mixed,
        ChunkParts::LocalOnly,
        ChunkParts::GlobalOnly,
    ] {
        for direction in [Direction::Causal, Direction::Bidirectional] {
            for t in [5, 8, 13, 21, 32] {
                let x = inputs(2, t, &device);
                let chunked = mixed_chunk_attention(
                    x.heads(),
                    x.v.clone(),
                    Some(bias.clone()),
                    spec(chunk, direction, parts),
                    None,
                );
                let full = reference(&x, &bias, chunk, direction, parts);
                let what = format!("{parts:?}, {direction:?}, T = {t}");
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
}

/// On the same inputs, FLASH = LocalOnly + GlobalOnly (the two ablations remove one term each and
/// nothing else).
#[test]
fn flash_is_local_only_plus_global_only() {
    let device = autodiff_device();
    let chunk = 8;
    let bias = RelPosBias::new(chunk, &device).square(chunk, &device);
    for direction in [Direction::Causal, Direction::Bidirectional] {
        let x = inputs(2, 29, &device);
        let run = |parts| {
            values(mixed_chunk_attention(
                x.heads(),
                x.v.clone(),
                Some(bias.clone()),
                spec(chunk, direction, parts),
                None,
            ))
        };
        let sum: Vec<f32> = run(ChunkParts::LocalOnly)
            .iter()
            .zip(run(ChunkParts::GlobalOnly))
            .map(|(a, b)| a + b)
            .collect();
        assert_close(
            &run(ChunkParts::Mixed),
            &sum,
            1e-6,
            &format!("{direction:?}"),
        );
    }
}

/// Causal GlobalOnly: a token sees only strictly earlier chunks, so the first chunk's outputs are
/// exactly zero, and every later chunk's are not.
#[test]
fn causal_global_only_first_chunk_attends_to_nothing() {
    let device = autodiff_device();
    let (chunk, t) = (8, 24);
    let x = inputs(1, t, &device);
    let out = values(mixed_chunk_attention(
        x.heads(),
        x.v.clone(),
        None,
        spec(chunk, Direction::Causal, ChunkParts::GlobalOnly),
        None,
    ));
    let (first, rest) = out.split_at(chunk * E);
    assert!(first.iter().all(|&y| y == 0.0), "chunk 0 must see nothing");
    for g in 0..(t / chunk - 1) {
        let part = &rest[g * chunk * E..(g + 1) * chunk * E];
        assert!(
            part.iter().any(|&y| y != 0.0),
            "chunk {} sees chunk 0",
            g + 1
        );
    }
}

/// Bidirectional global scaling: the appendix's ports divide the global sum by the sequence length,
/// so a 4-chunk sequence's global term is a quarter of what dividing by C gives.
#[test]
fn bidirectional_global_term_is_divided_by_the_sequence_length() {
    let device = autodiff_device();
    let (chunk, t) = (8, 32);
    let x = inputs(1, t, &device);
    let global = |global_scaling| {
        let spec = MixedChunkSpec {
            global_scaling,
            ..spec(chunk, Direction::Bidirectional, ChunkParts::GlobalOnly)
        };
        values(mixed_chunk_attention(
            x.heads(),
            x.v.clone(),
            None,
            spec,
            None,
        ))
    };
    let by_chunk: Vec<f32> = global(GlobalScaling::Chunk)
        .iter()
        .map(|y| y * (chunk as f32 / t as f32))
        .collect();
    assert_close(
        &global(GlobalScaling::Appendix),
        &by_chunk,
        1e-6,
        "1/T = (C/T)·(1/C)",
    );
}

/// Causal FLASH with a single chunk (C = T) has no earlier chunk, so it is FLASH-Quad exactly.
#[test]
fn causal_flash_with_one_chunk_is_flash_quad() {
    let device = autodiff_device();
    for t in [16, 24] {
        let x = inputs(3, t, &device);
        let bias = RelPosBias::new(t, &device).square(t, &device);
        let flash = mixed_chunk_attention(
            x.heads(),
            x.v.clone(),
            Some(bias.clone()),
            spec(t, Direction::Causal, ChunkParts::Mixed),
            None,
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
        x.heads(),
        x.v.clone(),
        None,
        spec(t, Direction::Bidirectional, ChunkParts::Mixed),
        None,
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

/// MC-TFM++ changes two things in Transformer++: relu² scores for softmax, and chunking. Its
/// unchunked control (`transformer_plusplus_relu2`) keeps the first change only: with one chunk
/// (C = T, causal) MC-TFM++ is exactly the control on the same weights, and with four chunks it
/// is not; the control is not Transformer++ either.
#[test]
fn mc_tfmpp_with_one_chunk_is_its_unchunked_relu2_control() {
    let device = device();
    let t = 32;
    let ids = tokens(5, 2, t, 64);
    let logits = |arch: Architecture, chunk: usize, weights_of: &LanguageModel| {
        let model = ModelConfig::tiny(arch)
            .with_context(t)
            .with_chunk_size(chunk)
            .init(Direction::Causal, &device)
            .load_record(weights_of.clone().into_record());
        values(model.forward(token_tensor(&ids, 2, &device), None))
    };
    device.seed(3);
    let weights = perturb(
        ModelConfig::tiny(Architecture::McTfmPlusPlus)
            .with_context(t)
            .init(Direction::Causal, &device),
        0.2,
        4,
    );
    let control = logits(Architecture::TransformerPlusPlusRelu2, t, &weights);
    let one_chunk = logits(Architecture::McTfmPlusPlus, t, &weights);
    assert_close(&one_chunk, &control, 1e-5, "MC-TFM++ with C = T");
    let four_chunks = logits(Architecture::McTfmPlusPlus, t / 4, &weights);
    assert!(max_rel_diff(&four_chunks, &control) > 1e-3);
    let softmax = logits(Architecture::TransformerPlusPlus, t, &weights);
    assert!(max_rel_diff(&softmax, &control) > 1e-3);
}
