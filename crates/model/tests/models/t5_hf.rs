//! Hugging Face checkpoints: a tiny model saved under Hugging Face's names has exactly the names
//! and [out, in] shapes of `google/t5-v1_1-*` files, and loads back into an identical model.

use std::collections::BTreeMap;

use model::t5::{T5Config, T5Model};
use model::t5_hf;

use crate::common::{device, token_tensor, tokens, values};

/// The tensor names and shapes a Hugging Face T5.1.1 file of this config holds
/// (Hugging Face's `modeling_t5.py` names), Linear weights as [out, in].
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

/// The golden files made by `transformers` (`crates/model/tests/golden/make_t5_golden.py`, random
/// weights N(0, 0.5), T5.1.1: gated-GELU, untied LM head): our loader reads them and our forward
/// pass gives `transformers`' logits within 1e-4 (relative to the largest logit), with a padded
/// input. The same file with the input embedding renamed `encoder.embed_tokens.weight` and no
/// `shared.weight` loads to the same logits.
#[test]
fn transformers_t5_matches_its_logits() {
    use burn::prelude::*;
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/t5_tiny");
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden.join("logits.json")).unwrap())
            .unwrap();
    let ids = |key: &str| -> (Vec<i64>, [usize; 2]) {
        let rows = g[key].as_array().unwrap();
        let flat: Vec<i64> = rows
            .iter()
            .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()))
            .collect();
        let shape = [rows.len(), flat.len() / rows.len()];
        (flat, shape)
    };
    let want: Vec<f32> = g["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b.as_array().unwrap().iter())
        .flat_map(|t| {
            t.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
        })
        .collect();
    // The same checkpoint with `shared.weight` renamed to `encoder.embed_tokens.weight`.
    let renamed = tempfile::tempdir().unwrap();
    std::fs::copy(
        golden.join("config.json"),
        renamed.path().join("config.json"),
    )
    .unwrap();
    let bytes = std::fs::read(golden.join("model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, safetensors::tensor::TensorView)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let name = if name == "shared.weight" {
                "encoder.embed_tokens.weight".to_string()
            } else {
                name
            };
            (name, view)
        })
        .collect();
    safetensors::serialize_to_file(tensors, None, &renamed.path().join("model.safetensors"))
        .unwrap();

    let dev = device();
    for dir in [golden.as_path(), renamed.path()] {
        let (_, model) = t5_hf::load(dir, &dev).unwrap();
        let (inputs, in_shape) = ids("input_ids");
        let (mask, _) = ids("attention_mask");
        let (dec, dec_shape) = ids("decoder_input_ids");
        let inputs = Tensor::<2, Int>::from_data(TensorData::new(inputs, in_shape), &dev);
        let keep =
            Tensor::<2, Int>::from_data(TensorData::new(mask, in_shape), &dev).greater_elem(0);
        let dec = Tensor::<2, Int>::from_data(TensorData::new(dec, dec_shape), &dev);
        let encoded = model.encode(inputs, &keep);
        let ours = values(model.decode(dec, &encoded, &keep));
        assert_eq!(ours.len(), want.len());
        let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
        let diff = ours
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff / scale <= 1e-4,
            "{}: max |ours - transformers| = {diff} (largest logit {scale})",
            dir.display()
        );
    }
}
