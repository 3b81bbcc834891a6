//! Language models over every architecture: one [`ModelConfig`] names the architecture and its
//! sizes; [`LanguageModel`] embeds tokens, runs the layer stack and projects onto the vocabulary
//! with the tied embedding (causal LM and masked LM heads differ only by attention direction and
//! loss). Presets are named constructors stating only what differs from the defaults.

use std::fmt;
use std::str::FromStr;

use burn::nn::{Embedding, EmbeddingConfig};
use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use serde::{Deserialize, Serialize};

use crate::attention::{ChunkParts, FavorPrefix};
use crate::fused;
use crate::gau::{Gau, GauCache, GauConfig, GauScoring, GauSpan};
use crate::layers::{
    Direction, GlobalScaling, Norm, NormKind, Relu2Scaling, Rope, ScaledSinusoidal,
    keep_multiplier, normal_init,
};
use crate::transformer::{
    AttentionKind, BlockCache, FeedForwardKind, TransformerBlock, TransformerBlockConfig,
};

/// Every architecture of the FLASH paper's comparisons and ablations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    /// Vanilla Transformer: softmax MHSA + GELU MLP, scaled sinusoidal positions.
    Transformer,
    /// Transformer+: Transformer with RoPE.
    TransformerPlus,
    /// Transformer++: Transformer with RoPE and a GLU feed-forward.
    #[serde(rename = "transformer_plusplus")]
    TransformerPlusPlus,
    /// Performer: Transformer++ with FAVOR+ attention.
    Performer,
    /// Combiner: Transformer++ with chunk-summary attention.
    Combiner,
    /// FLASH-Quad: a stack of GAU layers with full relu² attention.
    FlashQuad,
    /// FLASH: GAU layers with mixed chunk attention.
    Flash,
    /// MC-TFM++: Transformer++ with mixed chunk attention per head.
    #[serde(rename = "mc_tfmpp")]
    McTfmPlusPlus,
    /// FLASH with the global (linear) part removed.
    FlashLocalOnly,
    /// FLASH with the local (quadratic) part removed.
    FlashGlobalOnly,
    /// Transformer++ with GAU's relu² scoring per head, unchunked: MC-TFM++ without the chunking
    /// (not in the paper; the control that isolates what chunking costs MC-TFM++).
    #[serde(rename = "transformer_plusplus_relu2")]
    TransformerPlusPlusRelu2,
}

impl Architecture {
    /// All architectures, in the order of the paper's tables.
    pub const ALL: [Architecture; 11] = [
        Architecture::Transformer,
        Architecture::TransformerPlus,
        Architecture::TransformerPlusPlus,
        Architecture::Performer,
        Architecture::Combiner,
        Architecture::FlashQuad,
        Architecture::Flash,
        Architecture::McTfmPlusPlus,
        Architecture::FlashLocalOnly,
        Architecture::FlashGlobalOnly,
        Architecture::TransformerPlusPlusRelu2,
    ];

    /// The name experiments use to pick the model.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Transformer => "transformer",
            Architecture::TransformerPlus => "transformer_plus",
            Architecture::TransformerPlusPlus => "transformer_plusplus",
            Architecture::Performer => "performer",
            Architecture::Combiner => "combiner",
            Architecture::FlashQuad => "flash_quad",
            Architecture::Flash => "flash",
            Architecture::McTfmPlusPlus => "mc_tfmpp",
            Architecture::FlashLocalOnly => "flash_local_only",
            Architecture::FlashGlobalOnly => "flash_global_only",
            Architecture::TransformerPlusPlusRelu2 => "transformer_plusplus_relu2",
        }
    }

    /// Whether the layers are GAUs (two per Transformer block) rather than Transformer blocks.
    pub fn is_gau(self) -> bool {
        matches!(
            self,
            Architecture::FlashQuad
                | Architecture::Flash
                | Architecture::FlashLocalOnly
                | Architecture::FlashGlobalOnly
        )
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for Architecture {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Architecture::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Architecture::ALL.iter().map(|a| a.name()).collect();
                format!("unknown model `{s}`; known models: {}", names.join(", "))
            })
    }
}

/// How causal Performer sums its keys' random features over each query's prefix (a model-config
/// field; [`FavorPrefix`] is the attention's own form).
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum PerformerPrefix {
    /// Blocks of [`crate::transformer::FAVOR_CAUSAL_BLOCK`] positions, a sum per block carried
    /// across.
    Blockwise,
    /// One cumulative sum over every position (Choromanski et al. 2021; the FLASH paper's
    /// Performer).
    TokenLevel,
}

/// A language model: architecture and sizes. Defaults are the FLASH paper's (§4, appendix A).
#[derive(Config, Debug)]
pub struct ModelConfig {
    /// Which architecture.
    pub arch: Architecture,
    /// Vocabulary size (paper: a 32K SentencePiece vocabulary; 32768 assumed).
    #[config(default = 32768)]
    pub vocab_size: usize,
    /// Model width d.
    #[config(default = 768)]
    pub d_model: usize,
    /// Depth in Transformer blocks; GAU models have two GAU layers per block (FLASH §2: "two GAUs
    /// replace one Transformer block at similar size").
    #[config(default = 12)]
    pub n_blocks: usize,
    /// Attention heads of the Transformer-family models (head width 64).
    #[config(default = 12)]
    pub n_heads: usize,
    /// GAU expansion: e = expansion_factor · d (paper: 2).
    #[config(default = 2)]
    pub expansion_factor: usize,
    /// GAU shared Q/K width s (paper: 128).
    #[config(default = 128)]
    pub d_qk: usize,
    /// Chunk size C of FLASH, MC-TFM++ and Combiner (paper: 256).
    #[config(default = 256)]
    pub chunk_size: usize,
    /// Training context; FLASH-Quad's attention window n (its scaling and position bias).
    #[config(default = 1024)]
    pub context: usize,
    /// relu² score scaling (paper appendix: divide by the window).
    #[config(default = "Relu2Scaling::Window")]
    pub scaling: Relu2Scaling,
    /// Scaling of the global (linear) term of mixed chunk attention, FLASH's and MC-TFM++'s (the
    /// appendix code's public ports: by the sequence length n bidirectional, by C causal; see
    /// [`GlobalScaling`]).
    #[config(default = "GlobalScaling::Appendix")]
    pub global_scaling: GlobalScaling,
    /// Pre-norm kind.
    #[config(default = "NormKind::LayerNorm")]
    pub norm: NormKind,
    /// Random features per head of Performer (FAVOR+; 256 as in Choromanski et al.'s LM runs).
    #[config(default = 256)]
    pub performer_features: usize,
    /// How causal Performer sums its keys' features over the prefix: `blockwise` (blocks of
    /// [`crate::transformer::FAVOR_CAUSAL_BLOCK`] positions, the default: FLASH's chunked trick
    /// applied to FAVOR+) or `token_level` (one cumulative sum over every position, the paper's
    /// Performer baseline, T·m·dh floats per head). The same values.
    #[config(default = "PerformerPrefix::Blockwise")]
    pub performer_prefix: PerformerPrefix,
    /// Seed of Performer's random features.
    #[config(default = 0)]
    pub seed: u64,
    /// GAU ablation (FLASH Table 1): the quadratic attention's score function (paper: relu²).
    #[config(default = "GauScoring::Relu2")]
    pub gau_scoring: GauScoring,
    /// GAU ablation (FLASH Table 1): attention heads over the shared Z (paper: 1).
    #[config(default = 1)]
    pub gau_heads: usize,
    /// GAU ablation (FLASH Table 1): gate the attention output by U (paper: yes).
    #[config(default = true)]
    pub gau_gated: bool,
    /// GAU ablation (FLASH Table 1): add the relative position bias (paper: yes).
    #[config(default = true)]
    pub gau_relative_bias: bool,
    /// GAU ablation (FLASH Table 1): rotate Q and K with RoPE (paper: yes).
    #[config(default = true)]
    pub gau_rope: bool,
}

impl ModelConfig {
    /// The configuration of one GAU layer of this model for `span` and `direction`.
    fn gau(&self, span: GauSpan, direction: Direction) -> GauConfig {
        GauConfig::new(self.d_model, span, direction)
            .with_expansion_factor(self.expansion_factor)
            .with_d_qk(self.d_qk)
            .with_scaling(self.scaling)
            .with_global_scaling(self.global_scaling)
            .with_norm(self.norm)
            .with_scoring(self.gau_scoring)
            .with_heads(self.gau_heads)
            .with_gated(self.gau_gated)
            .with_relative_bias(self.gau_relative_bias)
            .with_rope(self.gau_rope)
    }

    /// The GAU span of a GAU architecture.
    fn gau_span(&self) -> GauSpan {
        let chunked = |parts| GauSpan::MixedChunk {
            chunk: self.chunk_size,
            parts,
        };
        match self.arch {
            Architecture::FlashQuad => GauSpan::Quad {
                window: self.context,
            },
            Architecture::Flash => chunked(ChunkParts::Mixed),
            Architecture::FlashLocalOnly => chunked(ChunkParts::LocalOnly),
            _ => chunked(ChunkParts::GlobalOnly),
        }
    }

    /// Checks the fields that can contradict each other (a user's `set` in an experiment config):
    /// a one-line message naming the field and the fix.
    pub fn check(&self) -> Result<(), String> {
        if self.d_model == 0 || self.n_blocks == 0 || self.n_heads == 0 {
            return Err("d_model, n_blocks and n_heads must be at least 1".into());
        }
        if self.arch.is_gau() {
            return self.gau(self.gau_span(), Direction::Causal).check();
        }
        if !self.d_model.is_multiple_of(self.n_heads) {
            return Err(format!(
                "n_heads = {} must divide d_model = {}; pick a divisor",
                self.n_heads, self.d_model
            ));
        }
        let gau_default = Self::new(self.arch);
        if (
            self.gau_scoring,
            self.gau_heads,
            self.gau_gated,
            self.gau_relative_bias,
            self.gau_rope,
        ) != (
            gau_default.gau_scoring,
            gau_default.gau_heads,
            gau_default.gau_gated,
            gau_default.gau_relative_bias,
            gau_default.gau_rope,
        ) {
            return Err(format!(
                "the gau_* fields change GAU layers only; `{}` has none (use flash_quad or flash)",
                self.arch
            ));
        }
        Ok(())
    }
}

impl ModelConfig {
    /// ~110M-parameter models of the C4 (MLM) and Wiki-40B (LM) experiments: d = 768, 12 blocks
    /// (24 GAU layers), 12 heads, 32768 tied vocabulary. The paper states the size, not the shapes;
    /// these are the BERT-base shapes that give it.
    pub fn paper_base(arch: Architecture) -> Self {
        Self::new(arch)
    }

    /// ~500M-parameter models of the PG-19 experiment. Assumed shapes (not given in the text):
    /// d = 1024, 36 blocks (72 GAU layers), 16 heads, context 8192.
    pub fn paper_large(arch: Architecture) -> Self {
        Self::new(arch)
            .with_d_model(1024)
            .with_n_blocks(36)
            .with_n_heads(16)
            .with_context(8192)
    }

    /// The latency benchmark's shapes (the JAX anchor's, `experiments/anchors/flash_jax.py`): d = 256,
    /// 4 blocks (8 GAU layers), 4 heads, vocabulary 8192, s = 128, e = 2d, chunk 256.
    pub fn latency_bench(arch: Architecture, context: usize) -> Self {
        Self::new(arch)
            .with_vocab_size(8192)
            .with_d_model(256)
            .with_n_blocks(4)
            .with_n_heads(4)
            .with_context(context)
    }

    /// A few-thousand-parameter model for tests: d = 32, 2 blocks, 2 heads, s = 16, chunk 8,
    /// context 32, vocabulary 64.
    pub fn tiny(arch: Architecture) -> Self {
        Self::new(arch)
            .with_vocab_size(64)
            .with_d_model(32)
            .with_n_blocks(2)
            .with_n_heads(2)
            .with_d_qk(16)
            .with_chunk_size(8)
            .with_context(32)
            .with_performer_features(64)
    }

    /// Feed-forward width: 4d for the GELU MLP; 8d/3 for the GLU, so that its three matrices hold
    /// the MLP's 8d² parameters.
    pub fn d_ff(&self) -> usize {
        match self.feed_forward() {
            FeedForwardKind::Mlp => 4 * self.d_model,
            FeedForwardKind::Glu => 8 * self.d_model / 3,
        }
    }

    fn feed_forward(&self) -> FeedForwardKind {
        match self.arch {
            Architecture::Transformer | Architecture::TransformerPlus => FeedForwardKind::Mlp,
            _ => FeedForwardKind::Glu,
        }
    }

    /// Width of the RoPE tables the layers need (GAU: s; Transformers: head width), none for the
    /// vanilla Transformer.
    fn rope_dim(&self) -> Option<usize> {
        match self.arch {
            Architecture::Transformer => None,
            a if a.is_gau() => Some(self.d_qk),
            _ => Some(self.d_model / self.n_heads),
        }
    }

    /// Whether the scaled sinusoidal absolute embedding is added to the token embeddings: the
    /// vanilla Transformer (its only position signal) and the GAU models (FLASH appendix,
    /// `_get_scaledsin`, used together with RoPE and the relative bias).
    fn uses_sinusoid(&self) -> bool {
        self.arch == Architecture::Transformer || self.arch.is_gau()
    }

    /// Builds the model for `direction` (causal LM or masked LM).
    pub fn init(&self, direction: Direction, device: &Device) -> LanguageModel {
        let layers = if self.arch.is_gau() {
            let gau = self.gau(self.gau_span(), direction);
            (0..2 * self.n_blocks)
                .map(|_| Layer::Gau(gau.init(device)))
                .collect()
        } else {
            let attention = match self.arch {
                Architecture::Performer => AttentionKind::Favor {
                    features: self.performer_features,
                    prefix: match self.performer_prefix {
                        PerformerPrefix::Blockwise => FavorPrefix::Blockwise {
                            block: crate::transformer::FAVOR_CAUSAL_BLOCK,
                        },
                        PerformerPrefix::TokenLevel => FavorPrefix::TokenLevel,
                    },
                },
                Architecture::Combiner => AttentionKind::Combiner {
                    chunk: self.chunk_size,
                },
                Architecture::McTfmPlusPlus => AttentionKind::MixedChunk {
                    chunk: self.chunk_size,
                    global_scaling: self.global_scaling,
                },
                Architecture::TransformerPlusPlusRelu2 => AttentionKind::Relu2 {
                    window: self.context,
                },
                _ => AttentionKind::Softmax,
            };
            (0..self.n_blocks)
                .map(|i| {
                    let block = TransformerBlockConfig::new(
                        self.d_model,
                        self.n_heads,
                        self.d_ff(),
                        attention,
                        self.feed_forward(),
                        direction,
                    )
                    .with_norm(self.norm)
                    .with_seed(self.seed.wrapping_add(i as u64));
                    Layer::Block(block.init(device))
                })
                .collect()
        };
        LanguageModel {
            embedding: EmbeddingConfig::new(self.vocab_size, self.d_model)
                .with_initializer(normal_init())
                .init(device),
            sinusoid: self
                .uses_sinusoid()
                .then(|| ScaledSinusoidal::new(self.d_model, device)),
            layers,
            final_norm: Norm::new(self.norm, self.d_model, device),
            rope_dim: self.rope_dim().unwrap_or(0),
            context: self.context,
            direction,
        }
    }
}

/// One layer of the stack.
// One value per layer, built once: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Layer {
    /// A GAU (FLASH-Quad, FLASH and its ablations).
    Gau(Gau),
    /// A Transformer block (the baselines).
    Block(TransformerBlock),
}

/// Per-layer decoding state plus the position of the next token.
#[derive(Clone, Debug)]
pub struct DecodeState {
    /// Position of the next token.
    pub pos: usize,
    caches: Vec<LayerCache>,
}

#[derive(Clone, Debug)]
enum LayerCache {
    Gau(GauCache),
    Block(BlockCache),
}

/// Token embedding → layers → final norm → tied output projection.
#[derive(Module, Debug)]
pub struct LanguageModel {
    embedding: Embedding,
    sinusoid: Option<ScaledSinusoidal>,
    layers: Vec<Layer>,
    final_norm: Norm,
    /// Width of the RoPE tables (0: no RoPE).
    rope_dim: usize,
    /// The training context (the longest sequence FLASH-Quad's bias covers).
    context: usize,
    #[module(skip)]
    direction: Direction,
}

impl LanguageModel {
    /// The attention direction the model was built for.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    fn rope(&self, offset: usize, len: usize, device: &Device) -> Option<Rope> {
        (self.rope_dim > 0).then(|| Rope::new(self.rope_dim, offset, len, device))
    }

    fn embed(&self, tokens: Tensor<2, Int>, offset: usize) -> Tensor<3> {
        let [_, t] = tokens.dims();
        let device = tokens.device();
        let x = self.embedding.forward(tokens);
        match &self.sinusoid {
            Some(s) => x + s.forward(offset, t, &device).unsqueeze::<3>(),
            None => x,
        }
    }

    fn logits(&self, x: Tensor<3>) -> Tensor<3> {
        let x = self.final_norm.forward(x);
        let [b, t, d] = x.dims();
        let embedding = self.embedding.weight.val(); // [V, d]
        let vocab = embedding.dims()[0];
        fused::matmul_2d(x.reshape([b * t, d]), embedding.transpose()).reshape([b, t, vocab])
    }

    /// Weighted mean cross-entropy of the next-token (or masked-token) predictions from `hidden`
    /// ([B, T, d], before the final norm) against `targets` ([B·T]); `weights` ([B·T], 0 or 1) as
    /// [`cross_entropy`] takes them. The head and the loss run fused on `flex`
    /// ([`fused::linear_cross_entropy`]), else as the logits and [`cross_entropy`].
    pub fn head_loss(
        &self,
        hidden: Tensor<3>,
        targets: Tensor<1, Int>,
        weights: Option<Tensor<1>>,
    ) -> Tensor<1> {
        let x = self.final_norm.forward(hidden);
        let [b, t, d] = x.dims();
        let x = x.reshape([b * t, d]);
        let embedding = self.embedding.weight.val(); // [V, d]
        fused::linear_cross_entropy(&x, &embedding, &targets, weights.as_ref()).unwrap_or_else(
            || cross_entropy(fused::matmul_2d(x, embedding.transpose()), targets, weights),
        )
    }

    /// Hidden states before the output projection. tokens: [B, T]; padding: [B, T], `true` on
    /// padded positions (they never influence real positions) → [B, T, d].
    pub fn hidden(&self, tokens: Tensor<2, Int>, padding: Option<Tensor<2, Bool>>) -> Tensor<3> {
        let [_, t] = tokens.dims();
        let device = tokens.device();
        let rope = self.rope(0, t, &device);
        let keep = padding.as_ref().map(keep_multiplier);
        let mut x = self.embed(tokens, 0);
        for layer in &self.layers {
            x = match layer {
                Layer::Gau(g) => g.forward(x, rope.as_ref().expect("GAU uses RoPE"), keep.as_ref()),
                Layer::Block(b) => b.forward(x, rope.as_ref(), keep.as_ref()),
            };
        }
        x
    }

    /// Logits over the vocabulary: [B, T, V].
    pub fn forward(&self, tokens: Tensor<2, Int>, padding: Option<Tensor<2, Bool>>) -> Tensor<3> {
        self.logits(self.hidden(tokens, padding))
    }

    /// A fresh decoding state (causal models only).
    pub fn start_decoding(&self) -> DecodeState {
        assert_eq!(
            self.direction,
            Direction::Causal,
            "masked LMs do not decode"
        );
        let caches = self
            .layers
            .iter()
            .map(|l| match l {
                Layer::Gau(g) => LayerCache::Gau(g.empty_cache()),
                Layer::Block(b) => LayerCache::Block(b.empty_cache()),
            })
            .collect();
        DecodeState { pos: 0, caches }
    }

    /// Feeds one token per sequence and returns the next-token logits. token: [B, 1] → [B, 1, V].
    pub fn step(&self, token: Tensor<2, Int>, state: &mut DecodeState) -> Tensor<3> {
        let device = token.device();
        let pos = state.pos;
        let rope = self.rope(pos, 1, &device);
        let mut x = self.embed(token, pos);
        for (layer, cache) in self.layers.iter().zip(state.caches.iter_mut()) {
            x = match (layer, cache) {
                (Layer::Gau(g), LayerCache::Gau(c)) => {
                    g.step(x, pos, rope.as_ref().expect("GAU uses RoPE"), c)
                }
                (Layer::Block(b), LayerCache::Block(c)) => b.step(x, rope.as_ref(), c),
                _ => unreachable!("caches are built from the layers"),
            };
        }
        state.pos += 1;
        self.logits(x)
    }
}

/// Mean cross-entropy of `logits`: [N, V] against `targets`: [N], over the positions where
/// `weights` ([N], 0 or 1) is 1, or all positions.
pub fn cross_entropy(
    logits: Tensor<2>,
    targets: Tensor<1, Int>,
    weights: Option<Tensor<1>>,
) -> Tensor<1> {
    let nll = crate::fused::cross_entropy_rows(&logits, &targets)
        .unwrap_or_else(|| cross_entropy_rows_reference(logits, targets));
    match weights {
        Some(w) => (nll * w.clone()).sum() / w.sum().clamp_min(1.0),
        None => nll.mean(),
    }
}

/// Per-row `−log softmax(logits)[target]` as plain burn operations (the reference of the fused
/// kernel). logits: [N, V]; targets: [N] → [N].
pub fn cross_entropy_rows_reference(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    let [n, _] = logits.dims();
    log_softmax(logits, 1)
        .gather(1, targets.reshape([n, 1]))
        .reshape([n])
        .neg()
}

/// Next-token loss of a causal LM: predicts `tokens[:, 1:]` from `tokens[:, :-1]`. tokens: [B, T + 1].
pub fn causal_lm_loss(model: &LanguageModel, tokens: Tensor<2, Int>) -> Tensor<1> {
    let [b, t1] = tokens.dims();
    let t = t1 - 1;
    let inputs = tokens.clone().narrow(1, 0, t);
    let targets = tokens.narrow(1, 1, t).reshape([b * t]);
    model.head_loss(model.hidden(inputs, None), targets, None)
}

/// Masked-LM loss: cross-entropy on the positions where `predict` ([B, T], 1.0 = masked token) is set.
pub fn masked_lm_loss(
    model: &LanguageModel,
    inputs: Tensor<2, Int>,
    targets: Tensor<2, Int>,
    predict: Tensor<2>,
    padding: Option<Tensor<2, Bool>>,
) -> Tensor<1> {
    let [b, t] = inputs.dims();
    model.head_loss(
        model.hidden(inputs, padding),
        targets.reshape([b * t]),
        Some(predict.reshape([b * t])),
    )
}

/// The named size presets, for experiment configs that pick a preset by name.
pub const PRESETS: [&str; 4] = ["tiny", "latency_bench", "paper_base", "paper_large"];

impl ModelConfig {
    /// A preset by name (see [`PRESETS`]) with its context set to `context`.
    pub fn preset(name: &str, arch: Architecture, context: usize) -> Result<Self, String> {
        let config = match name {
            "tiny" => Self::tiny(arch),
            "latency_bench" => Self::latency_bench(arch, context),
            "paper_base" => Self::paper_base(arch),
            "paper_large" => Self::paper_large(arch),
            _ => {
                return Err(format!(
                    "unknown model preset `{name}`; known presets: {}",
                    PRESETS.join(", ")
                ));
            }
        };
        Ok(config.with_context(context))
    }
}
