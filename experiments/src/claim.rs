//! One row of `results/claims.md`: a paper's claim, our number beside the paper's, the verdict.

use crate::verdict::Verdict;

/// One row of `claims.md`.
pub(crate) struct Claim {
    pub(crate) id: &'static str,
    pub(crate) claim: String,
    pub(crate) source: String,
    pub(crate) ours: String,
    pub(crate) paper: &'static str,
    pub(crate) verdict: Option<Verdict>,
}
