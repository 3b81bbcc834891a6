//! Helpers shared by the experiment tests.

/// A corpus in the offline corpus's layout under `dir/gutenberg_shakespeare/` (`dir` is a
/// `data_dir` root), so the test does not need `just data`.
pub fn tiny_corpus(dir: &std::path::Path) {
    let dir = dir.join("gutenberg_shakespeare");
    for split in ["train", "validation", "test"] {
        let texts: Vec<String> = (0..4)
            .map(|i| {
                format!("{split} {i}: ") + &"To be, or not to be, that is the question. ".repeat(4)
            })
            .collect();
        data::corpus::write_parquet(
            &dir.join(format!("data/{split}-00000-of-00001.parquet")),
            vec![(
                "text",
                std::sync::Arc::new(arrow_array::StringArray::from(texts)) as arrow_array::ArrayRef,
            )],
        )
        .unwrap();
    }
}

/// The run directories of a store, by name.
pub fn store_runs(store: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(store)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}
