//! The model zoo of the FLASH paper ("Transformer Quality in Linear Time", Hua et al. 2022):
//! GAU, FLASH-Quad, FLASH (mixed chunk attention) and its LocalOnly / GlobalOnly ablations, and the
//! baselines Transformer, Transformer+, Transformer++, Performer, Combiner and MC-TFM++.
//!
//! - [`layers`]: norms, RoPE, relative position bias, scaled sinusoid, relu², chunk helpers;
//! - [`attention`]: the attention kernels as plain functions (full and one-token forms);
//! - [`fused`]: fused CPU kernels (attention, cross-entropy) with hand-written backward passes,
//!   one file per kernel; [`runtime`]: the process-wide settings binaries apply (allocator,
//!   flush-to-zero);
//! - [`gau`]: the GAU / FLASH layer; [`transformer`]: the Transformer block of the baselines;
//! - [`lm`]: [`ModelConfig`] (architecture by name, paper presets) and [`LanguageModel`];
//! - [`t5`]: T5.1.1 encoder-decoder with MHA / GQA / MQA decoder attention (the GQA paper);
//!   [`t5_hf`]: its Hugging Face checkpoints (safetensors) in and out.

pub mod attention;
pub mod flops;
pub mod fused;
pub mod gau;
pub mod layers;
pub mod lm;
pub mod memory;
pub mod runtime;
pub mod t5;
pub mod t5_hf;
pub mod testing;
pub mod transformer;

pub use attention::{ChunkParts, MixedChunkSpec};
pub use layers::{Direction, GlobalScaling, NormKind, Relu2Scaling};
pub use lm::{
    Architecture, DecodeState, LanguageModel, ModelConfig, PerformerPrefix, causal_lm_loss,
    cross_entropy, masked_lm_loss,
};
