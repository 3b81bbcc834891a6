//! Hugging Face T5.1.1 checkpoints (`google/t5-v1_1-{small,base,large,xl,xxl}`: `config.json` and
//! `model.safetensors`, or shards listed in `model.safetensors.index.json`) loaded into [`T5Model`],
//! and our models saved under the same names, so a converted GQA model can go back to PyTorch.
//!
//! Hugging Face stores Linear weights as [out, in] (burn: [in, out]) and calls the RMSNorm scale
//! `weight` (burn: `gamma`); burn-store's PyTorch adapters transpose and rename. Row h·d_kv + j of
//! a K or V weight belongs to head h in both layouts, so pooled GQA heads keep their meaning.

use std::collections::BTreeSet;
use std::path::Path;

use burn::prelude::*;
use burn_store::{BurnToPyTorchAdapter, ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore};
use serde::Deserialize;

use crate::t5::{T5Config, T5Model};

/// Hugging Face name → our module path, applied in order (each anchored and disjoint).
pub const HF_TO_OURS: [(&str, &str); 13] = [
    (
        r"^(encoder|decoder)\.block\.0\.layer\.0\.SelfAttention\.relative_attention_bias\.weight$",
        "$1.position_bias.embedding.weight",
    ),
    (
        r"^(encoder|decoder)\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.weight$",
        "$1.layers.$2.self_attention.$3.weight",
    ),
    (
        r"^(encoder|decoder)\.block\.(\d+)\.layer\.0\.layer_norm\.weight$",
        "$1.layers.$2.self_norm.weight",
    ),
    (
        r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.(wi_0|wi_1|wo)\.weight$",
        "encoder.layers.$1.ffn.$2.weight",
    ),
    (
        r"^encoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight$",
        "encoder.layers.$1.ffn_norm.weight",
    ),
    (
        r"^decoder\.block\.(\d+)\.layer\.1\.EncDecAttention\.([qkvo])\.weight$",
        "decoder.layers.$1.cross.attention.$2.weight",
    ),
    (
        r"^decoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight$",
        "decoder.layers.$1.cross.norm.weight",
    ),
    (
        r"^decoder\.block\.(\d+)\.layer\.2\.DenseReluDense\.(wi_0|wi_1|wo)\.weight$",
        "decoder.layers.$1.ffn.$2.weight",
    ),
    (
        r"^decoder\.block\.(\d+)\.layer\.2\.layer_norm\.weight$",
        "decoder.layers.$1.ffn_norm.weight",
    ),
    (
        r"^(encoder|decoder)\.final_layer_norm\.weight$",
        "$1.final_norm.weight",
    ),
    (r"^shared\.weight$", "shared.weight"),
    // Some exports keep the tied input embedding only under the encoder's name (no `shared`).
    (r"^encoder\.embed_tokens\.weight$", "shared.weight"),
    (r"^lm_head\.weight$", "lm_head.weight"),
];

/// Our module path → Hugging Face name (the inverse of [`HF_TO_OURS`]), applied in order.
pub const OURS_TO_HF: [(&str, &str); 11] = [
    (
        r"^(encoder|decoder)\.position_bias\.embedding\.weight$",
        "$1.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
    ),
    (
        r"^(encoder|decoder)\.layers\.(\d+)\.self_attention\.([qkvo])\.weight$",
        "$1.block.$2.layer.0.SelfAttention.$3.weight",
    ),
    (
        r"^(encoder|decoder)\.layers\.(\d+)\.self_norm\.weight$",
        "$1.block.$2.layer.0.layer_norm.weight",
    ),
    (
        r"^encoder\.layers\.(\d+)\.ffn\.(wi_0|wi_1|wo)\.weight$",
        "encoder.block.$1.layer.1.DenseReluDense.$2.weight",
    ),
    (
        r"^encoder\.layers\.(\d+)\.ffn_norm\.weight$",
        "encoder.block.$1.layer.1.layer_norm.weight",
    ),
    (
        r"^decoder\.layers\.(\d+)\.cross\.attention\.([qkvo])\.weight$",
        "decoder.block.$1.layer.1.EncDecAttention.$2.weight",
    ),
    (
        r"^decoder\.layers\.(\d+)\.cross\.norm\.weight$",
        "decoder.block.$1.layer.1.layer_norm.weight",
    ),
    (
        r"^decoder\.layers\.(\d+)\.ffn\.(wi_0|wi_1|wo)\.weight$",
        "decoder.block.$1.layer.2.DenseReluDense.$2.weight",
    ),
    (
        r"^decoder\.layers\.(\d+)\.ffn_norm\.weight$",
        "decoder.block.$1.layer.2.layer_norm.weight",
    ),
    (
        r"^(encoder|decoder)\.final_norm\.weight$",
        "$1.final_layer_norm.weight",
    ),
    (r"^(shared|lm_head)\.weight$", "$1.weight"),
];

/// The fields of a Hugging Face `T5Config` (`config.json`) that define a T5.1.1 model.
#[derive(Debug, Deserialize)]
pub struct HfT5Config {
    pub vocab_size: usize,
    pub d_model: usize,
    pub d_kv: usize,
    pub d_ff: usize,
    pub num_heads: usize,
    pub num_layers: usize,
    pub num_decoder_layers: Option<usize>,
    pub relative_attention_num_buckets: usize,
    #[serde(default = "default_max_distance")]
    pub relative_attention_max_distance: usize,
    pub layer_norm_epsilon: f64,
    #[serde(default)]
    pub feed_forward_proj: String,
    #[serde(default = "default_tie")]
    pub tie_word_embeddings: bool,
    /// Our extension: K/V heads of the decoder (absent in Hugging Face files: multi-head).
    pub num_key_value_heads: Option<usize>,
}

fn default_max_distance() -> usize {
    128
}

fn default_tie() -> bool {
    true
}

impl HfT5Config {
    /// Our config; an error unless the file describes a T5.1.1 model (gated GELU, untied head).
    pub fn to_config(&self) -> Result<T5Config, String> {
        if self.feed_forward_proj != "gated-gelu" {
            return Err(format!(
                "feed_forward_proj is `{}`, not `gated-gelu`: not a T5.1.1 checkpoint (the original T5 uses ReLU and a tied head)",
                self.feed_forward_proj
            ));
        }
        if self.tie_word_embeddings {
            return Err(
                "tie_word_embeddings is true: T5.1.1 checkpoints have an untied lm_head".into(),
            );
        }
        let config = T5Config::new(
            self.d_model,
            self.d_ff,
            self.num_heads,
            self.num_layers,
            self.num_decoder_layers.unwrap_or(self.num_layers),
            self.num_key_value_heads.unwrap_or(self.num_heads),
        )
        .with_vocab_size(self.vocab_size)
        .with_d_kv(self.d_kv)
        .with_relative_buckets(self.relative_attention_num_buckets)
        .with_relative_max_distance(self.relative_attention_max_distance)
        .with_norm_eps(self.layer_norm_epsilon);
        config.validate()?;
        Ok(config)
    }

    /// The Hugging Face config of ours (written beside a saved model).
    pub fn from_config(config: &T5Config) -> serde_json::Value {
        let mut value = serde_json::json!({
            "architectures": ["T5ForConditionalGeneration"],
            "model_type": "t5",
            "vocab_size": config.vocab_size,
            "d_model": config.d_model,
            "d_kv": config.d_kv,
            "d_ff": config.d_ff,
            "num_heads": config.n_heads,
            "num_layers": config.n_encoder_layers,
            "num_decoder_layers": config.n_decoder_layers,
            "relative_attention_num_buckets": config.relative_buckets,
            "relative_attention_max_distance": config.relative_max_distance,
            "layer_norm_epsilon": config.norm_eps,
            "dropout_rate": config.dropout,
            "feed_forward_proj": "gated-gelu",
            "tie_word_embeddings": false,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "decoder_start_token_id": 0,
        });
        if config.n_kv_heads != config.n_heads {
            value["num_key_value_heads"] = config.n_kv_heads.into();
        }
        value
    }
}

/// Reads `dir/config.json`.
pub fn read_config(dir: &Path) -> Result<T5Config, String> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "cannot read {}: {e}; a checkpoint directory holds config.json and model.safetensors",
            path.display()
        )
    })?;
    let hf: HfT5Config = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a Hugging Face T5 config: {e}", path.display()))?;
    hf.to_config()
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The safetensors files of a checkpoint directory: `model.safetensors`, or the shards named in
/// `model.safetensors.index.json`.
fn weight_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).map_err(|_| {
        format!(
            "{} has neither model.safetensors nor model.safetensors.index.json",
            dir.display()
        )
    })?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not valid JSON: {e}", index.display()))?;
    let shards: BTreeSet<String> = value["weight_map"]
        .as_object()
        .ok_or_else(|| format!("{} has no weight_map", index.display()))?
        .values()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    Ok(shards.into_iter().map(|s| dir.join(s)).collect())
}

/// Loads a checkpoint directory (Hugging Face names and layout) into a new model on `device`.
/// Every parameter of the model must be found; the input embedding is `shared.weight`, or
/// `encoder.embed_tokens.weight` where a file has no `shared` (its tied copy; where both are present
/// they are the same tensor), and `decoder.embed_tokens` copies are ignored.
pub fn load(dir: &Path, device: &Device) -> Result<(T5Config, T5Model), String> {
    let config = read_config(dir)?;
    let mut model = config.init(device);
    let expected: BTreeSet<String> = model
        .collect(None, None, false)
        .into_iter()
        .map(|t| t.name)
        .collect();
    let mut applied = BTreeSet::new();
    for file in weight_files(dir)? {
        let mut store = SafetensorsStore::from_file(&file)
            .with_from_adapter(PyTorchToBurnAdapter)
            .allow_partial(true);
        for (from, to) in HF_TO_OURS {
            store = store.with_key_remapping(from, to);
        }
        let result = model
            .load_from(&mut store)
            .map_err(|e| format!("cannot load {}: {e}", file.display()))?;
        if !result.errors.is_empty() {
            return Err(format!(
                "{}: {} tensors do not fit the model (first: {:?})",
                file.display(),
                result.errors.len(),
                result.errors[0]
            ));
        }
        applied.extend(result.applied);
    }
    let missing: Vec<&String> = expected.difference(&applied).collect();
    if !missing.is_empty() {
        return Err(format!(
            "{} lacks {} of the model's {} tensors (first: {}); is it a T5.1.1 checkpoint of this size?",
            dir.display(),
            missing.len(),
            expected.len(),
            missing[0]
        ));
    }
    Ok((config, model))
}

/// Saves `model` with Hugging Face names ([out, in] weights) as `dir/model.safetensors` plus
/// `dir/config.json`, each written to a temporary file and renamed.
pub fn save(model: &T5Model, config: &T5Config, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let tmp = dir.join("model.safetensors.tmp");
    let mut store = SafetensorsStore::from_file(&tmp).with_to_adapter(BurnToPyTorchAdapter);
    for (from, to) in OURS_TO_HF {
        store = store.with_key_remapping(from, to);
    }
    model
        .save_into(&mut store)
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join("model.safetensors"))
        .map_err(|e| format!("cannot rename {}: {e}", tmp.display()))?;
    let json =
        serde_json::to_string_pretty(&HfT5Config::from_config(config)).expect("config serialises");
    let tmp = dir.join("config.json.tmp");
    std::fs::write(&tmp, json + "\n")
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join("config.json"))
        .map_err(|e| format!("cannot rename {}: {e}", tmp.display()))
}
