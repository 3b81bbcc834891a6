//! Verdicts computed from the sweeps' rows, never written by hand: per model and context, the final
//! perplexity over seeds, the speedup to the baseline's final perplexity over every (model seed,
//! baseline seed) pair, decomposed as (steps ratio) × (step-time ratio), and whether the whole
//! range lies on the paper's side of 1.
//!
//! The step-time ratio comes from the sweep's step-time calibration when it has one
//! ([`StepCost::Timed`]: every model's training step timed round-robin in one session, after the
//! runs), else from the runs' own device-hours ([`StepCost::RunHours`]). The runs of a sweep may be
//! trained in pieces over several sessions, and this machine's speed differs between sessions by
//! tens of percent; the steps ratio does not depend on the machine, the calibration compares step
//! costs measured together.
//!
//! `rows` (what verdicts read), `rule` (the verdict and its rules), `summary` (per model and
//! context), `tables` (chunking loss, ablations).

mod rows;
mod rule;
mod summary;
mod tables;
#[cfg(test)]
mod tests;

pub use self::rows::*;
pub use self::rule::*;
pub use self::summary::*;
pub use self::tables::*;
