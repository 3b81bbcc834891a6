//! No causal leakage, and incremental decoding equals the full forward, for every causal model.

use burn::prelude::*;
use model::layers::TOEPLITZ_MAX_WINDOW;
use model::{Architecture, Direction, ModelConfig};

use crate::common::*;

const BATCH: usize = 2;
/// Not a multiple of the tiny chunk size (8): the last chunk is partial.
const LEN: usize = 21;

/// Changing the tokens after position `t` leaves the logits at positions ≤ t, and the gradients of a
/// loss on those positions, unchanged.
#[test]
fn no_causal_leakage_in_outputs_or_gradients() {
    let device = autodiff_device();
    for config in tiny_models() {
        let arch = describe(&config);
        device.seed(7);
        let model = perturb(config.init(Direction::Causal, &device), 0.3, 7);
        let ids = tokens(1, BATCH, LEN, config.vocab_size);
        for t in [0, 7, 8, 13] {
            let mut changed = ids.clone();
            for b in 0..BATCH {
                for p in t + 1..LEN {
                    changed[b * LEN + p] =
                        (changed[b * LEN + p] + 1 + p as i64) % config.vocab_size as i64;
                }
            }
            let run = |ids: &[i64]| {
                let logits = model.forward(token_tensor(ids, BATCH, &device), None);
                let prefix = logits.narrow(1, 0, t + 1);
                let loss = (prefix.clone() * prefix.clone()).mean();
                let grads = loss.backward();
                (values(prefix), param_grads(&model, &grads))
            };
            let (out_a, grads_a) = run(&ids);
            let (out_b, grads_b) = run(&changed);
            assert_close(
                &out_a,
                &out_b,
                1e-5,
                &format!("{arch}: logits at <= {t} after changing the future"),
            );
            for (i, (ga, gb)) in grads_a.iter().zip(&grads_b).enumerate() {
                if let (Some(ga), Some(gb)) = (ga, gb) {
                    assert_close(
                        ga,
                        gb,
                        1e-4,
                        &format!("{arch}: gradient of parameter {i}, prefix <= {t}"),
                    );
                }
            }
        }
    }
}

/// Sanity check that the leakage test can fail: a bidirectional model does see the future.
#[test]
fn bidirectional_models_do_see_the_future() {
    let device = device();
    for arch in Architecture::ALL {
        let config = ModelConfig::tiny(arch);
        let model = perturb(config.init(Direction::Bidirectional, &device), 0.3, 8);
        let ids = tokens(2, 1, LEN, config.vocab_size);
        let mut changed = ids.clone();
        // The last token of the first chunk (seen by LocalOnly) and the last token (seen by the rest).
        for p in [7, LEN - 1] {
            changed[p] = (changed[p] + 1) % config.vocab_size as i64;
        }
        let a = values(
            model
                .forward(token_tensor(&ids, 1, &device), None)
                .narrow(1, 0, 1),
        );
        let b = values(
            model
                .forward(token_tensor(&changed, 1, &device), None)
                .narrow(1, 0, 1),
        );
        assert!(
            max_rel_diff(&a, &b) > 1e-6,
            "{arch}: first position ignores the last token"
        );
    }
}

/// Feeding tokens one at a time through the decoding state gives the full forward's logits, across
/// chunk boundaries (tiny chunk = 8, 21 steps). FLASH-Quad also runs with a 512-token window,
/// whose RoPE-product bias the forward folds into the queries and keys while decoding builds it.
#[test]
fn incremental_decoding_matches_full_forward() {
    let device = device();
    let rope_bias_quad =
        ModelConfig::tiny(Architecture::FlashQuad).with_context(TOEPLITZ_MAX_WINDOW);
    let rope_bias_softmax = rope_bias_quad
        .clone()
        .with_gau_scoring(model::gau::GauScoring::Softmax)
        .with_gau_heads(2);
    for config in tiny_models()
        .into_iter()
        .chain([rope_bias_quad, rope_bias_softmax])
    {
        let arch = describe(&config);
        device.seed(11);
        let model = perturb(config.init(Direction::Causal, &device), 0.3, 11);
        let ids = tokens(3, BATCH, LEN, config.vocab_size);
        let full = values(model.forward(token_tensor(&ids, BATCH, &device), None));
        let mut state = model.start_decoding();
        let mut steps = Vec::new();
        for p in 0..LEN {
            let col: Vec<i64> = (0..BATCH).map(|b| ids[b * LEN + p]).collect();
            steps.push(model.step(token_tensor(&col, BATCH, &device), &mut state));
        }
        let stepped = values(Tensor::cat(steps, 1));
        assert_close(
            &stepped,
            &full,
            1e-4,
            &format!("{arch}: decoding vs full forward"),
        );
    }
}
