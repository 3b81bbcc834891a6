//! Padding invariance: appending padded positions (masked) leaves the real positions' outputs unchanged.

use burn::prelude::*;
use model::Direction;

use crate::common::*;

#[test]
fn padding_does_not_change_real_outputs() {
    let device = device();
    let (batch, len, pad) = (2, 13, 6);
    for direction in [Direction::Bidirectional, Direction::Causal] {
        for config in tiny_models() {
            let arch = describe(&config);
            device.seed(5);
            let model = perturb(config.init(direction, &device), 0.3, 5);
            let ids = tokens(4, batch, len, config.vocab_size);
            let junk = tokens(9, batch, pad, config.vocab_size);
            let mut padded = Vec::new();
            let mut mask = Vec::new();
            for b in 0..batch {
                padded.extend_from_slice(&ids[b * len..(b + 1) * len]);
                padded.extend_from_slice(&junk[b * pad..(b + 1) * pad]);
                mask.extend((0..len + pad).map(|p| p >= len));
            }
            let plain = values(model.forward(token_tensor(&ids, batch, &device), None));
            let padding =
                Tensor::<2, Bool>::from_data(TensorData::new(mask, [batch, len + pad]), &device);
            let with_pad = model.forward(token_tensor(&padded, batch, &device), Some(padding));
            let real = values(with_pad.narrow(1, 0, len));
            assert_close(
                &real,
                &plain,
                1e-5,
                &format!("{arch}, {direction:?}: padded vs unpadded"),
            );
        }
    }
}
