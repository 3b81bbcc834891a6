//! FAVOR+ is an unbiased estimate of softmax attention: its error falls as random features grow.

use burn::prelude::*;
use model::attention::{FavorPrefix, favor_attention, softmax_attention};
use model::layers::Direction;
use model::transformer::orthogonal_features;

use crate::common::*;

const BLOCKS_OF_8: FavorPrefix = FavorPrefix::Blockwise { block: 8 };

fn mean_abs_error(m: usize, direction: Direction) -> f32 {
    let device = device();
    let (n, t, dh) = (4, 24, 16);
    let mut total = 0.0;
    let seeds = 4;
    for seed in 0..seeds {
        let q = randn([n, t, dh], 100 + seed, &device).mul_scalar(0.5);
        let k = randn([n, t, dh], 200 + seed, &device).mul_scalar(0.5);
        let v = randn([n, t, dh], 300 + seed, &device);
        let omega = orthogonal_features(dh, m, seed, &device);
        let exact = values(softmax_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            None,
            direction,
        ));
        let approx = values(favor_attention(
            q,
            k,
            v,
            None,
            &omega,
            direction,
            BLOCKS_OF_8,
        ));
        total += exact
            .iter()
            .zip(&approx)
            .map(|(a, b)| (a - b).abs())
            .sum::<f32>()
            / exact.len() as f32;
    }
    total / seeds as f32
}

#[test]
fn favor_approaches_softmax_as_features_grow() {
    for direction in [Direction::Bidirectional, Direction::Causal] {
        let errors: Vec<f32> = [4, 32, 256, 2048]
            .iter()
            .map(|&m| mean_abs_error(m, direction))
            .collect();
        println!("{direction:?}: mean |FAVOR+ - softmax| for m = 4, 32, 256, 2048: {errors:?}");
        for w in errors.windows(2) {
            assert!(
                w[1] < w[0],
                "{direction:?}: error did not fall with more features: {errors:?}"
            );
        }
        assert!(
            errors[3] < 0.05,
            "{direction:?}: 2048 features still far from softmax: {errors:?}"
        );
        assert!(errors[3] < errors[0] / 5.0, "{direction:?}: {errors:?}");
    }
}

/// A trained-looking extreme: queries and the later half of the keys aligned with the longest
/// random feature ω₀ at the norm that maximises its exponent (`x / dh^¼ = ω₀`, exponent |ω₀|²/2 ≈ 40),
/// the earlier keys long and random (exponents near −130, so their features underflow against the
/// shift). Early causal queries then see no key with a representable feature, and the causal form's
/// padding rows have a zero numerator over a denominator whose square underflows (the NaN a
/// Performer run hit at step 16). Every output and gradient must stay finite with a square that
/// fits f32 (Adafactor squares the gradients).
#[test]
fn favor_gradients_stay_squarable_when_features_underflow() {
    let device = autodiff_device();
    // 30 positions in blocks of 8: the causal form pads two rows, whose numerator is 0.
    let (n, t, dh, m) = (2, 30, 64, 256);
    let omega = orthogonal_features(dh, m, 0, &device);
    // The longest feature: the largest exponent, hence the largest stabilising shifts.
    let norms: Vec<f32> = values(omega.clone().square().sum_dim(0));
    let longest = (0..m).fold(0, |b, j| if norms[j] > norms[b] { j } else { b });
    let w0 = omega
        .clone()
        .narrow(1, longest, 1)
        .reshape([1, 1, dh])
        .mul_scalar((dh as f64).powf(0.25));
    let aligned = w0.expand([n, t, dh]);
    let long_random = randn([n, t / 2, dh], 2, &device).mul_scalar(5.7);
    for direction in [Direction::Causal, Direction::Bidirectional] {
        let q = aligned.clone().detach().require_grad();
        let k = Tensor::cat(
            vec![long_random.clone(), aligned.clone().narrow(1, 0, t / 2)],
            1,
        )
        .detach()
        .require_grad();
        let v = randn([n, t, dh], 3, &device).require_grad();
        let out = favor_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            None,
            &omega,
            direction,
            BLOCKS_OF_8,
        );
        let grads = backward_with(out.clone(), &randn([n, t, dh], 4, &device));
        for (name, x) in [
            ("output", values(out)),
            ("dq", grad(&q, &grads)),
            ("dk", grad(&k, &grads)),
            ("dv", grad(&v, &grads)),
        ] {
            // `f32::max` skips NaN: count the non-finite values first.
            let bad = x.iter().filter(|x| !x.is_finite()).count();
            assert_eq!(bad, 0, "{direction:?}: {bad} non-finite values in {name}");
            let worst = x.iter().fold(0f32, |w, x| w.max(x.abs()));
            assert!(
                (worst * worst).is_finite(),
                "{direction:?}: largest |{name}| is {worst:e}"
            );
        }
    }
}

/// The token-level causal prefix sum (the paper's Performer) and the blockwise one compute the
/// same attention: equal outputs and gradients of q, k and v over random inputs, a length that is
/// not a multiple of the block, and masked keys. A wrong prefix (one that lets a query see the
/// next key, or misses its own) would differ by the size of a whole term.
#[test]
fn token_level_and_blockwise_prefix_sums_agree_on_values_and_gradients() {
    let device = autodiff_device();
    let (n, t, dh, m) = (3, 29, 16, 32);
    for seed in 0..3 {
        let omega = orthogonal_features(dh, m, seed, &device);
        let q0 = randn([n, t, dh], 10 + seed, &device).mul_scalar(0.5);
        let k0 = randn([n, t, dh], 20 + seed, &device).mul_scalar(0.5);
        let v0 = randn([n, t, dh], 30 + seed, &device);
        let keep: Vec<f32> = (0..n * t)
            .map(|i| if i % 7 == 3 { 0.0 } else { 1.0 })
            .collect();
        let keep = Tensor::<3>::from_data(TensorData::new(keep, [n, t, 1]), &device);
        let upstream = randn([n, t, dh], 40 + seed, &device);
        let run = |prefix: FavorPrefix| {
            let (q, k, v) = (
                q0.clone().require_grad(),
                k0.clone().require_grad(),
                v0.clone().require_grad(),
            );
            let out = favor_attention(
                q.clone(),
                k.clone(),
                v.clone(),
                Some(keep.clone()),
                &omega,
                Direction::Causal,
                prefix,
            );
            let grads = backward_with(out.clone(), &upstream);
            [
                values(out),
                grad(&q, &grads),
                grad(&k, &grads),
                grad(&v, &grads),
            ]
        };
        let token = run(FavorPrefix::TokenLevel);
        for block in [4, 8, 32] {
            let blockwise = run(FavorPrefix::Blockwise { block });
            for (name, (a, b)) in ["output", "dq", "dk", "dv"]
                .iter()
                .zip(token.iter().zip(&blockwise))
            {
                let scale = a.iter().fold(0f32, |w, x| w.max(x.abs()));
                let worst = a.iter().zip(b).fold(0f32, |w, (x, y)| w.max((x - y).abs()));
                assert!(
                    worst <= 1e-5 * scale.max(1.0),
                    "seed {seed}, block {block}: {name} differs by {worst:e} (scale {scale:e})"
                );
            }
        }
    }
}
