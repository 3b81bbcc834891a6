//! The rows verdicts are computed from: a sweep's `metrics.csv` rows, and the step times of its
//! calibration (or the runs' own device-hours) as a step cost.

use serde::{Deserialize, Serialize};
use training::trainer::{METRICS_HEADER, MetricsRow};

/// One evaluation of one run: a row of a sweep's `metrics.csv`, the run's identity followed by the
/// trainer's row (one row type: the trainer's [`MetricsRow`], written by
/// [`MetricsRow::csv_fields`] in both files).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct SweepRow {
    /// Model name (architecture or variant).
    pub model: String,
    pub context: usize,
    pub seed: u64,
    /// The run's directory in the run store (relative to the store).
    pub run: String,
    /// The run's peak learning rate (absent in sweeps written before the column existed).
    #[serde(default, deserialize_with = "training::trainer::optional_number")]
    pub peak_lr: Option<f64>,
    #[serde(flatten)]
    pub metrics: MetricsRow,
}

impl SweepRow {
    /// The header of a sweep's `metrics.csv`.
    pub fn header() -> String {
        format!("model,context,seed,run,peak_lr,{METRICS_HEADER}")
    }
    /// The row as CSV (names never hold commas or quotes: architecture names, variant names
    /// checked when the sweep starts, and store directory names).
    pub fn csv_fields(&self) -> String {
        format!(
            "{},{},{},{},{},{}",
            self.model,
            self.context,
            self.seed,
            self.run,
            self.peak_lr.map_or(String::new(), |lr| lr.to_string()),
            self.metrics.csv_fields()
        )
    }
}

/// One timed training step of the step-time calibration (a row of a sweep's `step_times.csv`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepTime {
    pub model: String,
    pub context: usize,
    /// The round: in each round every model of the context takes one step, in turn.
    pub round: usize,
    /// Seconds of the step (forward, backward, optimizer update; the run's batch).
    pub seconds: f64,
    /// Hash of what the step's cost depends on (model configuration, objective, batch, optimizer,
    /// devices): a calibration of another configuration is not reused.
    pub config: String,
}

/// Where the step-time ratio of a speedup comes from.
#[derive(Clone, Copy, Debug)]
pub enum StepCost<'a> {
    /// The runs' own training device-hours per step. Runs trained at different times carry the
    /// machine's drift between them.
    RunHours,
    /// The calibration's rounds: per round, the baseline's seconds / the model's (a model or
    /// context without timings falls back to the runs' hours).
    Timed(&'a [StepTime]),
}

impl StepCost<'_> {
    /// The seconds of `model`'s timed steps at `context`, in round order.
    pub fn seconds(&self, model: &str, context: usize) -> Vec<f64> {
        let StepCost::Timed(times) = self else {
            return Vec::new();
        };
        let mut t: Vec<&StepTime> = times
            .iter()
            .filter(|t| t.model == model && t.context == context)
            .collect();
        t.sort_by_key(|t| t.round);
        t.iter().map(|t| t.seconds).collect()
    }

    /// Per round, `baseline`'s seconds / `model`'s at `context`; none unless both have the same
    /// rounds.
    pub(super) fn round_ratios(
        &self,
        baseline: &str,
        model: &str,
        context: usize,
    ) -> Option<Vec<f64>> {
        let (b, m) = (
            self.seconds(baseline, context),
            self.seconds(model, context),
        );
        (!b.is_empty() && b.len() == m.len())
            .then(|| b.iter().zip(&m).map(|(b, m)| b / m).collect())
    }
}
