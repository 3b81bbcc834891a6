//! Datasets, tokenizers and task builders for the FLASH and GQA reproductions.
//!
//! - [`registry`]: the ten hub datasets and the offline Shakespeare corpus (repo, config, revision,
//!   layout, columns, how an example is built).
//! - [`source`]: finding a split's files — a `--data-dir` laid out like the hub repo, the Hugging Face
//!   cache, or a download through [`hub`] (feature `hub`).
//! - [`shards`]: hub files fetched as a stream reaches them (and a few ahead), not before.
//! - [`read`]: streaming readers (parquet row group by row group, json.gz lines, plain-text pairs).
//! - [`example`]: one typed example per dataset row (`text`, `source/target`, `question/context/answers`).
//! - [`tokenize`]: `tokenizer.json` files, trained BPE/Unigram tokenizers, a byte-level fallback.
//! - [`tasks`]: causal-LM packing, BERT masking, T5 span corruption, seq2seq and QA formatting, each
//!   deterministic given a seed and resumable from a saved position.
//! - [`files`]: a folder's listing and a file list's size on disk.
//! - [`corpus`]: building the offline `gutenberg_shakespeare` corpus and its derived seq2seq tasks.

pub mod corpus;
pub mod epochs;
pub mod example;
pub mod files;
#[cfg(feature = "hub")]
pub mod hub;
pub mod read;
pub mod registry;
pub mod rng;
pub mod shards;
pub mod source;
pub mod tasks;
pub mod tokenize;

pub use example::Example;
pub use registry::{DatasetSpec, Split};
