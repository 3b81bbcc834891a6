//! Every architecture's tiny preset overfits one short batch (loss falls by at least 90%), and every
//! parameter receives a gradient: proof that gradients reach the whole model.

use burn::optim::{AdamConfig, GradientsParams};
use model::{Architecture, Direction, ModelConfig, causal_lm_loss};

use crate::common::*;

#[test]
fn tiny_presets_overfit_one_batch() {
    let device = autodiff_device();
    let (batch, len, steps, lr) = (2, 17, 150, 1e-2);
    for arch in Architecture::ALL {
        let config = ModelConfig::tiny(arch);
        device.seed(3);
        let mut model = config.init(Direction::Causal, &device);
        let ids = tokens(8, batch, len, config.vocab_size);
        let mut optim = AdamConfig::new().init();
        let mut first = None;
        let mut last = 0.0;
        for step in 0..steps {
            let loss = causal_lm_loss(&model, token_tensor(&ids, batch, &device));
            last = values(loss.clone())[0];
            first.get_or_insert(last);
            let grads = loss.backward();
            if step == 0 {
                let missing = param_grads(&model, &grads)
                    .iter()
                    .filter(|g| g.is_none())
                    .count();
                assert_eq!(
                    missing, 0,
                    "{arch}: {missing} parameters received no gradient"
                );
            }
            let grads = GradientsParams::from_grads(grads, &model);
            model = optim.step(lr, model, grads);
        }
        let first = first.unwrap();
        println!("{arch}: loss {first:.3} -> {last:.4}");
        assert!(
            last <= 0.1 * first,
            "{arch}: loss fell only from {first} to {last}"
        );
    }
}
