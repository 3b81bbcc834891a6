//! What every claim row shares: the result directory it links to, the scale its result was decided
//! at, the row for a missing result, and the models' display names.

use std::path::Path;

use crate::claim::Claim;

/// The result directory a claim's `source` links to (`[fig6](fig6/table.md)` → `fig6`).
pub(super) fn source_dir(source: &str) -> &str {
    source
        .strip_prefix('[')
        .and_then(|s| s.split(']').next())
        .unwrap_or(source)
}

/// The scale cell of a claim decided from `results/<dir>` (the experiment's
/// [`crate::experiment::Experiment::scale`]).
pub(super) fn scale_of(results: &Path, dir: &str) -> String {
    let shown = match crate::registry::lookup(dir) {
        Some(e) => crate::registry::scale(e.id, &results.join(dir)),
        None => Err(anyhow::anyhow!("`{dir}` is not a registered experiment")),
    };
    shown.unwrap_or_else(|e| format!("unknown ({e:#})"))
}

/// A claim row saying why `id`'s result is missing.
pub(super) fn missing(
    claim_id: &'static str,
    claim: &str,
    id: &str,
    paper: &'static str,
    e: anyhow::Error,
) -> Claim {
    Claim {
        id: claim_id,
        claim: claim.into(),
        source: format!("[{id}]({id}/table.md)"),
        ours: format!("no result ({e:#}); run `just repro {id} --profile cpu`"),
        paper,
        verdict: None,
    }
}

pub(super) fn model_name(model: &str) -> &str {
    report::quality::display_name(model)
}
