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

/// The scale cell of a claim decided from `results/<dir>` ([`crate::scale`]).
pub(super) fn scale_of(results: &Path, dir: &str) -> String {
    let path = results.join(dir);
    let shown = match dir {
        "table11" | "gqa_fig6" => crate::scale::device(&path)
            .map(|d| format!("timing only, {d}"))
            .ok_or_else(|| anyhow::anyhow!("no env.json")),
        "gqa_table1" | "gqa_fig4" | "gqa_fig5" => crate::scale::gqa(&path).map(|s| s.show()),
        "table4" => crate::qa_finetune::scale(&path),
        _ => crate::scale::lm_sweep(&path).map(|s| s.show()),
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
