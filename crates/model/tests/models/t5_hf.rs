//! Hugging Face checkpoints: a tiny model saved under Hugging Face's names has exactly the names
//! and [out, in] shapes of `google/t5-v1_1-*` files, and loads back into an identical model.

use std::collections::BTreeMap;

use model::t5::{T5Config, T5Model};
use model::t5_hf;

use crate::common::{device, token_tensor, tokens, values};

/// The tensor names and shapes a Hugging Face T5.1.1 file of this config holds
/// (`../shared/notes/gqa-t5.md`), Linear weights as [out, in].
fn hugging_face_layout(c: &T5Config) -> BTreeMap<String, Vec<usize>> {
    let (d, inner, kv) = (c.d_model, c.n_heads * c.d_kv, c.n_kv_heads * c.d_kv);
    let mut m = BTreeMap::new();
    let mut put = |name: String, shape: &[usize]| {
        m.insert(name, shape.to_vec());
    };
    put("shared.weight".into(), &[c.vocab_size, d]);
    put("lm_head.weight".into(), &[c.vocab_size, d]);
    for stack in ["encoder", "decoder"] {
        put(
            format!("{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
            &[c.relative_buckets, c.n_heads],
        );
        put(format!("{stack}.final_layer_norm.weight"), &[d]);
    }
    for i in 0..c.n_encoder_layers {
        let p = format!("encoder.block.{i}.layer");
        put(format!("{p}.0.SelfAttention.q.weight"), &[inner, d]);
        put(format!("{p}.0.SelfAttention.k.weight"), &[inner, d]);
        put(format!("{p}.0.SelfAttention.v.weight"), &[inner, d]);
        put(format!("{p}.0.SelfAttention.o.weight"), &[d, inner]);
        put(format!("{p}.0.layer_norm.weight"), &[d]);
        put(format!("{p}.1.DenseReluDense.wi_0.weight"), &[c.d_ff, d]);
        put(format!("{p}.1.DenseReluDense.wi_1.weight"), &[c.d_ff, d]);
        put(format!("{p}.1.DenseReluDense.wo.weight"), &[d, c.d_ff]);
        put(format!("{p}.1.layer_norm.weight"), &[d]);
    }
    for i in 0..c.n_decoder_layers {
        let p = format!("decoder.block.{i}.layer");
        for (sub, name) in [(0, "SelfAttention"), (1, "EncDecAttention")] {
            put(format!("{p}.{sub}.{name}.q.weight"), &[inner, d]);
            put(format!("{p}.{sub}.{name}.k.weight"), &[kv, d]);
            put(format!("{p}.{sub}.{name}.v.weight"), &[kv, d]);
            put(format!("{p}.{sub}.{name}.o.weight"), &[d, inner]);
            put(format!("{p}.{sub}.layer_norm.weight"), &[d]);
        }
        put(format!("{p}.2.DenseReluDense.wi_0.weight"), &[c.d_ff, d]);
        put(format!("{p}.2.DenseReluDense.wi_1.weight"), &[c.d_ff, d]);
        put(format!("{p}.2.DenseReluDense.wo.weight"), &[d, c.d_ff]);
        put(format!("{p}.2.layer_norm.weight"), &[d]);
    }
    m
}

fn logits(model: &T5Model) -> Vec<f32> {
    let dev = device();
    let inputs = token_tensor(&tokens(3, 2, 6, 100), 2, &dev);
    let keep = inputs.clone().greater_elem(-1);
    let targets = token_tensor(&tokens(4, 2, 5, 100), 2, &dev);
    values(model.forward(inputs, &keep, targets))
}

#[test]
fn saved_checkpoint_has_hugging_face_names_and_loads_back() {
    for kv_heads in [4, 2] {
        let config = T5Config::tiny().with_n_kv_heads(kv_heads);
        let model = config.init(&device());
        let dir = tempfile::tempdir().unwrap();
        t5_hf::save(&model, &config, dir.path()).unwrap();

        let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let found: BTreeMap<String, Vec<usize>> = file
            .tensors()
            .into_iter()
            .map(|(name, view)| (name, view.shape().to_vec()))
            .collect();
        assert_eq!(found, hugging_face_layout(&config), "G = {kv_heads}");

        let (loaded_config, loaded) = t5_hf::load(dir.path(), &device()).unwrap();
        assert_eq!(loaded_config.n_kv_heads, kv_heads);
        assert_eq!(logits(&loaded), logits(&model), "G = {kv_heads}");
    }
}

#[test]
fn loading_rejects_what_is_not_a_t5_1_1_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let err = t5_hf::load(dir.path(), &device()).unwrap_err();
    assert!(err.contains("config.json"), "{err}");
    let config = T5Config::tiny();
    let mut json = t5_hf::HfT5Config::from_config(&config);
    json["feed_forward_proj"] = "relu".into();
    std::fs::write(dir.path().join("config.json"), json.to_string()).unwrap();
    let err = t5_hf::load(dir.path(), &device()).unwrap_err();
    assert!(err.contains("gated-gelu"), "{err}");
    json["feed_forward_proj"] = "gated-gelu".into();
    std::fs::write(dir.path().join("config.json"), json.to_string()).unwrap();
    let err = t5_hf::load(dir.path(), &device()).unwrap_err();
    assert!(err.contains("model.safetensors"), "{err}");
}
