//! Helpers shared by the training crate's integration tests.

use std::path::Path;

use data::registry::{self, Split};
use data::source::{SourceOptions, split_files};
use data::tokenize::Tok;
use training::lm_task::LmData;

/// Dataset `name` as written under `dir` (a test's small files in the dataset's layout), read with
/// the byte tokenizer.
pub fn lm_data(dir: &Path, name: &str) -> LmData {
    let spec = registry::lookup(name).unwrap();
    let opts = SourceOptions::with_dataset_dir(name, dir);
    LmData {
        spec,
        train_files: split_files(spec, Split::Train, &opts).unwrap(),
        eval_files: split_files(spec, Split::Validation, &opts).unwrap(),
        tok: Tok::bytes(),
    }
}
