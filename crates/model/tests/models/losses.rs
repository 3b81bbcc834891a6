//! The training losses against hand computations.

use burn::prelude::*;
use model::{Architecture, Direction, ModelConfig, masked_lm_loss};

use crate::common::*;

/// The masked-LM loss is the cross-entropy of the masked positions only: equal to the mean of
/// −log p(target) computed by hand from the logits, and unchanged by the targets elsewhere.
#[test]
fn masked_lm_loss_counts_only_masked_positions() {
    let device = device();
    let config = ModelConfig::tiny(Architecture::Flash);
    let model = config.init(Direction::Bidirectional, &device);
    let (batch, len, vocab) = (2, 9, config.vocab_size);
    let inputs = token_tensor(&tokens(1, batch, len, vocab), batch, &device);
    let targets_a = tokens(2, batch, len, vocab);
    let predict: Vec<f32> = (0..batch * len)
        .map(|i| (i % 3 == 0) as u8 as f32)
        .collect();
    let mut targets_b = targets_a.clone();
    for (i, t) in targets_b.iter_mut().enumerate() {
        if predict[i] == 0.0 {
            *t = (*t + 5) % vocab as i64;
        }
    }
    let predict_t = Tensor::<2>::from_data(TensorData::new(predict.clone(), [batch, len]), &device);
    let loss = |targets: &[i64]| {
        let t = token_tensor(targets, batch, &device);
        values(masked_lm_loss(
            &model,
            inputs.clone(),
            t,
            predict_t.clone(),
            None,
        ))[0]
    };
    let logits = values(model.forward(inputs.clone(), None));
    let mut want = 0.0;
    for i in (0..batch * len).filter(|&i| predict[i] == 1.0) {
        let row = &logits[i * vocab..(i + 1) * vocab];
        let max = row.iter().cloned().fold(f32::MIN, f32::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
        want += lse - row[targets_a[i] as usize];
    }
    want /= predict.iter().sum::<f32>();
    let (a, b) = (loss(&targets_a), loss(&targets_b));
    assert!((a - want).abs() < 1e-4, "masked loss {a} vs by hand {want}");
    assert_eq!(a, b, "targets at unmasked positions changed the loss");
}
