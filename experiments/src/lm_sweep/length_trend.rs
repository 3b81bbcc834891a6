//! The verdict against training length (`f4_length`): the same claim (FLASH reaches
//! Transformer++'s final perplexity sooner) decided at several run lengths, each a whole run with
//! its own schedule, so that a reader sees which way a small-scale verdict moves as training
//! lengthens. The shorter runs live in another sweep's results (`length_trend_of`, e.g. fig6's
//! 160-step runs); this sweep trains the longer ones at the same rates.
//!
//! Writes `trend.csv` (one row per model, context and length) and `speedup_vs_tokens.png/.svg`.

use std::path::Path;

use anyhow::{Context, Result};
use report::{LineChart, Scale, Series};
use serde::Serialize;

use super::calibrate::read_step_times;
use super::config::LmSweepConfig;
use super::results::{read_rows, saved_config, speedup_verdict, summaries};
use crate::verdict::{StepCost, Summary, Verdict};

/// One claimed model's speedup at one context and run length.
#[derive(Clone, Debug, Serialize)]
pub struct TrendRow {
    pub model: String,
    pub context: usize,
    /// The result directory the runs' rows come from.
    pub source: String,
    pub steps: usize,
    /// Training tokens per run.
    pub tokens: usize,
    pub seeds: usize,
    pub speedup_mean: f64,
    pub speedup_min: f64,
    pub speedup_max: f64,
    pub steps_ratio_mean: f64,
    pub step_time_ratio: f64,
    pub verdict: String,
}

/// The claimed models' summaries of the sweep in `dir` (its rows at its chosen rates, its own
/// step-time calibration), at the contexts of `contexts`.
fn claimed(dir: &Path, contexts: &[usize]) -> Result<(LmSweepConfig, Vec<Summary>)> {
    let config = saved_config(dir)?;
    let diverged = super::lr_choice::read_diverged(dir)?;
    let rows = super::lr_choice::at_chosen_rates(&read_rows(dir)?, &diverged, &config)?;
    let times = read_step_times(dir)?;
    let cost = times.as_deref().map_or(StepCost::RunHours, StepCost::Timed);
    let all = summaries(&rows, &config, cost)
        .into_iter()
        .filter(|s| config.claimed_faster.contains(&s.model) && contexts.contains(&s.context))
        .collect();
    Ok((config, all))
}

/// Where experiment `other` writes beside `out`: `out` with its last component that names an
/// experiment replaced by `other` (`results/f4_length` → `results/fig6`, `runs/f4_length/smoke` →
/// `runs/fig6/smoke`).
pub fn sibling(out: &Path, other: &str) -> Result<(String, std::path::PathBuf)> {
    let parts: Vec<String> = out
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let Some(at) = parts
        .iter()
        .rposition(|p| crate::configs::IDS.contains(&p.as_str()))
    else {
        anyhow::bail!(
            "cannot tell where {other}'s results lie beside {}: name the output directory after the experiment (the default --out)",
            out.display()
        );
    };
    let own = parts[at].clone();
    let mut path = std::path::PathBuf::new();
    for (i, p) in parts.iter().enumerate() {
        path.push(if i == at { other } else { p.as_str() });
    }
    Ok((own, path))
}

/// The trend rows: each directory of `config.length_trend_of` (beside `out`), then `out`.
pub fn rows(out: &Path, config: &LmSweepConfig) -> Result<Vec<TrendRow>> {
    let mut dirs: Vec<(String, std::path::PathBuf)> = Vec::new();
    let mut own = "this sweep".to_string();
    for other in &config.length_trend_of {
        let (this, path) = sibling(out, other)?;
        own = this;
        dirs.push((other.clone(), path));
    }
    dirs.push((own, out.to_path_buf()));
    let mut trend = Vec::new();
    for (source, dir) in dirs {
        let (sweep, summaries) = claimed(&dir, &config.contexts)
            .with_context(|| format!("the runs of {}", dir.display()))?;
        for s in summaries {
            if !config.claimed_faster.contains(&s.model) {
                continue;
            }
            let verdict = speedup_verdict(&s, &sweep).unwrap_or(Verdict::Inconclusive);
            trend.push(TrendRow {
                model: s.model.clone(),
                context: s.context,
                source: source.clone(),
                steps: s.steps,
                tokens: s.steps * sweep.tokens_per_batch * sweep.grad_accum,
                seeds: s.seeds,
                speedup_mean: s.speedup.mean,
                speedup_min: s.speedup.min,
                speedup_max: s.speedup.max,
                steps_ratio_mean: s.steps_ratio.mean,
                step_time_ratio: s.step_time_ratio.mean,
                verdict: verdict.to_string(),
            });
        }
    }
    trend.sort_by_key(|r| (r.model.clone(), r.context, r.tokens));
    Ok(trend)
}

/// `trend.csv`, the chart `speedup_vs_tokens` and the `table.md` section.
pub fn section(out: &Path, config: &LmSweepConfig) -> Result<String> {
    let trend = rows(out, config)?;
    crate::write_csv(&out.join("trend.csv"), &trend)?;
    let mut series = Vec::new();
    for (model, context) in trend
        .iter()
        .map(|r| (r.model.clone(), r.context))
        .collect::<std::collections::BTreeSet<_>>()
    {
        let of: Vec<&TrendRow> = trend
            .iter()
            .filter(|r| r.model == model && r.context == context)
            .collect();
        let name = report::quality::display_name(&model);
        for (what, y) in [
            (
                "mean",
                (|r: &TrendRow| r.speedup_mean) as fn(&TrendRow) -> f64,
            ),
            ("min", |r| r.speedup_min),
            ("max", |r| r.speedup_max),
        ] {
            series.push(Series {
                name: format!("{name} @ {context}: speedup {what} over seed pairs"),
                points: of.iter().map(|r| (r.tokens as f64, y(r))).collect(),
            });
        }
    }
    if let (Some(lo), Some(hi)) = (
        trend.iter().map(|r| r.tokens).min(),
        trend.iter().map(|r| r.tokens).max(),
    ) {
        series.push(Series {
            name: "1× (the baseline's cost)".into(),
            points: vec![(lo as f64, 1.0), (hi as f64, 1.0)],
        });
    }
    LineChart {
        title: format!(
            "Speedup to {}'s final perplexity against training tokens per run",
            report::quality::display_name(&config.baseline)
        ),
        x_label: "training tokens per run (log scale)".into(),
        y_label: "speedup in device-hours".into(),
        x_scale: Scale::Log2,
        y_scale: Scale::Linear,
    }
    .save(&out.join("speedup_vs_tokens"), &series)?;
    let mut md = format!(
        "\n## The verdict against training length\n\n\
         The claimed models' speedup to {}'s final perplexity at each run length (each length its own runs with their\n\
         own schedule; the shorter ones from {:?}), range over seed pairs: `trend.csv`, chart `speedup_vs_tokens.png`.\n\n\
         | model | context | from | steps | tokens/run | seeds | speedup | = in steps | × step time | verdict |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        config.baseline, config.length_trend_of
    );
    for r in &trend {
        md += &format!(
            "| {} | {} | {} | {} | {} | {} | {:.2} [{:.2}–{:.2}]× | {:.2}× | {:.2}× | {} |\n",
            r.model,
            r.context,
            r.source,
            r.steps,
            r.tokens,
            r.seeds,
            r.speedup_mean,
            r.speedup_min,
            r.speedup_max,
            r.steps_ratio_mean,
            r.step_time_ratio,
            r.verdict
        );
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::sibling;
    use std::path::Path;

    #[test]
    fn siblings_replace_the_experiments_component() {
        let (own, p) = sibling(Path::new("results/f4_length"), "fig6").unwrap();
        assert_eq!(
            (own.as_str(), p.as_path()),
            ("f4_length", Path::new("results/fig6"))
        );
        let (_, p) = sibling(Path::new("runs/f4_length/smoke"), "fig6").unwrap();
        assert_eq!(p, Path::new("runs/fig6/smoke"));
        assert!(sibling(Path::new("/tmp/out"), "fig6").is_err());
    }
}
