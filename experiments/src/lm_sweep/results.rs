//! A sweep's results read back: its rows (`metrics.csv`), its saved config, and each model's summary
//! and speedup verdict against the baseline.

use std::path::Path;

use anyhow::{Context, Result};
use training::write_atomic;

use super::config::LmSweepConfig;
use crate::verdict::{StepCost, Summary, SweepRow, Verdict, summarize};

/// Writes a sweep's `metrics.csv`.
pub fn write_rows(out: &Path, rows: &[SweepRow]) -> Result<()> {
    let mut text = SweepRow::header();
    text.push('\n');
    for r in rows {
        text.push_str(&r.csv_fields());
        text.push('\n');
    }
    write_atomic(&out.join("metrics.csv"), text.as_bytes())
}

/// Reads a sweep's `metrics.csv`.
pub fn read_rows(out: &Path) -> Result<Vec<SweepRow>> {
    let path = out.join("metrics.csv");
    csv::Reader::from_path(&path)
        .with_context(|| format!("cannot read {}: run the experiment first", path.display()))?
        .deserialize()
        .collect::<Result<_, _>>()
        .with_context(|| format!("malformed {}", path.display()))
}

/// The sweep config saved beside the results (`config.json`).
pub fn saved_config(out: &Path) -> Result<LmSweepConfig> {
    let path = out.join("config.json");
    let text = std::fs::read(&path)
        .with_context(|| format!("cannot read {}: run the experiment first", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("malformed {}", path.display()))
}

/// The models of the rows in first-appearance order.
pub(super) fn model_order(rows: &[SweepRow]) -> Vec<String> {
    let mut models: Vec<String> = Vec::new();
    for r in rows {
        if !models.contains(&r.model) {
            models.push(r.model.clone());
        }
    }
    models
}

/// The summaries of every model at every context of `rows`, against `config.baseline`, with the
/// step-time ratios from `cost`.
pub fn summaries(rows: &[SweepRow], config: &LmSweepConfig, cost: StepCost) -> Vec<Summary> {
    let contexts: std::collections::BTreeSet<usize> = rows.iter().map(|r| r.context).collect();
    let models = model_order(rows);
    contexts
        .into_iter()
        .flat_map(|c| summarize(rows, &models, &config.baseline, c, cost))
        .collect()
}

/// The verdict on a model's claimed speedup (> 1 over every seed pair), or none when the paper
/// claims none for it.
pub fn speedup_verdict(s: &Summary, config: &LmSweepConfig) -> Option<Verdict> {
    config
        .claimed_faster
        .contains(&s.model)
        .then(|| Verdict::above(&s.speedup, 1.0))
}
