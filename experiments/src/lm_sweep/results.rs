//! A sweep's results read back: its rows (`metrics.csv`), its saved config, and each model's summary
//! and speedup verdict against the baseline.

use std::path::Path;

use anyhow::{Context, Result};
use training::write_atomic;

use burn::module::Module;

use super::config::LmSweepConfig;
use super::models::planned_model;
use crate::scale::Scale;
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

/// The scale of an LM sweep's result directory.
pub fn sweep_scale(dir: &Path) -> Result<Scale> {
    let config = saved_config(dir)?;
    let (profile, device) = crate::scale::provenance(dir)?;
    let params = lm_params(&config)?;
    Ok(Scale {
        profile,
        params,
        tokens_per_run: (config.steps * config.tokens_per_batch * config.grad_accum) as f64,
        seeds: config.seeds.len(),
        device,
    })
}

/// The smallest and largest parameter count (without the tied token embedding) of the sweep's
/// models at its first context.
fn lm_params(config: &LmSweepConfig) -> Result<(usize, usize)> {
    let device = burn::tensor::Device::flex();
    let context = *config
        .contexts
        .first()
        .context("a sweep without contexts")?;
    let names: Vec<String> = config
        .models
        .iter()
        .chain(&config.one_seed_models)
        .cloned()
        .chain(config.variants.iter().map(|v| v.name.clone()))
        .collect();
    let mut range = (usize::MAX, 0);
    for name in names {
        let model = planned_model(config, &name, context)?;
        let all = model.init(model::Direction::Causal, &device).num_params();
        let p = all - model.vocab_size * model.d_model;
        range = (range.0.min(p), range.1.max(p));
    }
    Ok(range)
}
