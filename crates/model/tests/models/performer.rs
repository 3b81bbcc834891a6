//! FAVOR+ is an unbiased estimate of softmax attention: its error falls as random features grow.

use model::attention::{favor_attention, softmax_attention};
use model::layers::Direction;
use model::transformer::orthogonal_features;

use crate::common::*;

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
        let approx = values(favor_attention(q, k, v, None, &omega, direction, 8));
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
