//! The `score` binary's input: one JSON object per line, with the fields each metric needs.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// A ROUGE line: `{"target": .., "prediction": ..}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RougeLine {
    pub target: String,
    pub prediction: String,
}

/// A BLEU line: `{"hypothesis": .., "references": [..]}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BleuLine {
    pub hypothesis: String,
    pub references: Vec<String>,
}

/// A TriviaQA line: `{"prediction": .., "answers": [..]}`; a `null` prediction scores 0.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriviaQaLine {
    pub prediction: Option<String>,
    pub answers: Vec<String>,
}

/// Reads every non-blank line of `path` as a `T`; an error names the file, the line and the
/// expected fields.
pub fn read<T: DeserializeOwned>(path: &Path, expected: &str) -> Result<Vec<T>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {}: check the path", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row = serde_json::from_str(line).with_context(|| {
            format!(
                "{}:{}: expected one JSON object {expected} per line",
                path.display(),
                i + 1
            )
        })?;
        rows.push(row);
    }
    if rows.is_empty() {
        bail!("{} has no lines to score", path.display());
    }
    Ok(rows)
}
