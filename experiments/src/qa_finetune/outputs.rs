//! table4's verdict and outputs: claim F9 ([`f9`]) and its scale cell, `table.md` and the
//! fine-tuning chart, from a table4 result directory.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};

use super::*;
use crate::verdict::{Spread, StepTime, Verdict};

/// Per round, `baseline`'s step seconds over `model`'s, as interquartile spread (above 1: the
/// model's step is cheaper).
fn step_ratio(times: &[StepTime], baseline: &str, model: &str) -> Option<Spread> {
    let of = |m: &str| -> Vec<f64> {
        times
            .iter()
            .filter(|t| t.model == m)
            .map(|t| t.seconds)
            .collect()
    };
    let (b, m) = (of(baseline), of(model));
    (!b.is_empty() && b.len() == m.len()).then(|| {
        let ratios: Vec<f64> = b.iter().zip(&m).map(|(b, m)| b / m).collect();
        Spread::quartiles(&ratios)
    })
}

/// Claim F9 from a table4 directory.
#[derive(Clone, Debug)]
pub struct F9 {
    pub claimed: String,
    pub baseline: String,
    /// F1 of each (mean, range over seeds).
    pub f1: (Spread, Spread),
    /// Claimed − baseline F1 over every seed pair (mean of differences of the means).
    pub f1_diff: Spread,
    /// Step-time ratios baseline / claimed, pre-training and fine-tuning.
    pub pretrain_cost: Spread,
    pub finetune_cost: Spread,
    /// F1 of the training split's most frequent answer.
    pub trivial_f1: f64,
    pub verdict: Verdict,
}

/// F9's margin, in F1 points: "within 0.3 F1" at the paper's scale (TriviaQA, thousands of
/// questions); our held-out set has a few dozen questions, where one question moves F1 by a point
/// or more, so the claimed model's F1 must lie within ±1 point of the baseline's.
pub const F1_MARGIN: f64 = 1.0;

/// The scale cell of `claims.md` for table4's result directory: the pre-training sweep's scale
/// and the fine-tuning's steps.
pub fn scale(out: &Path) -> Result<String> {
    let config: Table4Config = serde_json::from_slice(
        &std::fs::read(out.join("config.json"))
            .with_context(|| format!("cannot read {}", out.join("config.json").display()))?,
    )?;
    let pretrain = crate::lm_sweep::sweep_scale(&out.join("pretrain"))?;
    Ok(format!(
        "{}; fine-tuned {} steps of {} questions",
        pretrain.show(),
        config.steps,
        config.batch
    ))
}

/// F9 from `out`'s `config.json`, `scores.csv` and the two step-time calibrations.
pub fn f9(out: &Path) -> Result<F9> {
    let config: Table4Config = serde_json::from_slice(
        &std::fs::read(out.join("config.json"))
            .with_context(|| format!("cannot read {}", out.join("config.json").display()))?,
    )?;
    let scores: Vec<ScoreRow> = read_csv(&out.join(SCORES))?;
    let pre: Vec<StepTime> = read_csv(&out.join("pretrain").join(crate::lm_sweep::STEP_TIMES))?;
    let ft: Vec<StepTime> = read_csv(&out.join(FT_STEP_TIMES))?;
    let f1_of = |m: &str| -> Vec<f64> {
        scores
            .iter()
            .filter(|s| s.model == m)
            .map(|s| s.f1)
            .collect()
    };
    let (c, b) = (f1_of(&config.claimed), f1_of(&config.baseline));
    if c.is_empty() || b.is_empty() {
        bail!(
            "{} lacks {} or {}",
            out.join(SCORES).display(),
            config.claimed,
            config.baseline
        );
    }
    let diffs: Vec<f64> = c
        .iter()
        .flat_map(|x| b.iter().map(move |y| x - y))
        .collect();
    let (cs, bs) = (Spread::of(&c), Spread::of(&b));
    let mut f1_diff = Spread::of(&diffs);
    f1_diff.mean = cs.mean - bs.mean;
    let missing = || {
        anyhow!(
            "no step times of {} and {}",
            config.claimed,
            config.baseline
        )
    };
    let pretrain_cost = step_ratio(&pre, &config.baseline, &config.claimed).ok_or_else(missing)?;
    let finetune_cost = step_ratio(&ft, &config.baseline, &config.claimed).ok_or_else(missing)?;
    let trivial: TrivialBaseline = serde_json::from_slice(
        &std::fs::read(out.join(TRIVIAL))
            .with_context(|| format!("cannot read {}", out.join(TRIVIAL).display()))?,
    )?;
    // At the floor (the baseline model not clearly above the trivial answer) the F1 comparison
    // says nothing: no verdict either way. Else two parts: F1 within the margin (equivalence)
    // and a cheaper pre-training step (directional).
    let verdict = if bs.min <= trivial.f1 {
        Verdict::Inconclusive
    } else {
        Verdict::all(&[
            Verdict::within(&f1_diff, -F1_MARGIN, F1_MARGIN),
            Verdict::above(&pretrain_cost, 1.0),
        ])
    };
    Ok(F9 {
        claimed: config.claimed,
        baseline: config.baseline,
        f1: (cs, bs),
        f1_diff,
        pretrain_cost,
        finetune_cost,
        trivial_f1: trivial.f1,
        verdict,
    })
}

/// `table.md` (and the README's generated block) from `out`'s files.
pub fn render(out: &Path) -> Result<()> {
    let config: Table4Config = serde_json::from_slice(
        &std::fs::read(out.join("config.json"))
            .with_context(|| format!("cannot read {}", out.join("config.json").display()))?,
    )?;
    let scores: Vec<ScoreRow> = read_csv(&out.join(SCORES))?;
    let pre: Vec<StepTime> =
        read_csv(&out.join("pretrain").join(crate::lm_sweep::STEP_TIMES)).unwrap_or_default();
    let ft: Vec<StepTime> = read_csv(&out.join(FT_STEP_TIMES)).unwrap_or_default();
    let b = &config.baseline;
    let mut body = format!(
        "Per model over its seeds (mean [min–max]): the pre-training run's final held-out perplexity; TriviaQA F1 and EM\n\
         (×100) of greedy answers to {} held-out questions after {} fine-tuning steps; and the step-time ratios\n\
         {b} / model (median [interquartile range] over the calibration rounds, pre-training from `pretrain/step_times.csv`,\n\
         fine-tuning from `finetune_step_times.csv`; above 1: the model's step is cheaper).\n\n\
         | model | seeds | pre-training ppl | F1 | EM | pre-training step ratio | fine-tuning step ratio |\n\
         |---|---|---|---|---|---|---|\n",
        config.eval_examples, config.steps
    );
    for m in &config.models {
        let rows: Vec<&ScoreRow> = scores.iter().filter(|s| &s.model == m).collect();
        if rows.is_empty() {
            continue;
        }
        let of =
            |f: fn(&ScoreRow) -> f64| Spread::of(&rows.iter().map(|r| f(r)).collect::<Vec<_>>());
        let ratio = |times: &[StepTime]| {
            step_ratio(times, b, m).map_or_else(|| "—".to_string(), |r| format!("{}×", r.show(2)))
        };
        body += &format!(
            "| {m} | {} | {} | {} | {} | {} | {} |\n",
            rows.len(),
            of(|r| r.pretrain_ppl).show(2),
            of(|r| r.f1).show(2),
            of(|r| r.exact_match).show(2),
            ratio(&pre),
            ratio(&ft),
        );
    }
    match f9(out) {
        Ok(f) => {
            body += &format!(
                "\nF9 ({} against {}): F1 difference {} (over seed pairs), pre-training step ratio {}×, fine-tuning {}×: **{}**\n\
                 (reproduced: the F1 difference not entirely below 0 and the pre-training step ratio above 1; refuted: F1\n\
                 clearly lower or the step clearly dearer; inconclusive whenever the baseline's F1 is not above the trivial\n\
                 answer's, {:.2}: the training split's most frequent answer, `trivial_baseline.json`).\n",
                f.claimed,
                f.baseline,
                f.f1_diff.show(2),
                f.pretrain_cost.show(2),
                f.finetune_cost.show(2),
                f.verdict,
                f.trivial_f1
            );
        }
        Err(e) => body += &format!("\nF9: no verdict ({e:#}).\n"),
    }
    body += "\n![held-out answer loss during fine-tuning](finetune_loss.png)\n";
    finetune_chart(out, &config)?;
    let md = format!("# FLASH Table 4: fine-tuning on question answering\n\n{body}");
    training::write_atomic(&out.join("table.md"), md.as_bytes())?;
    report::readme::fill(&out.join("README.md"), "table.md", &body)?;
    Ok(())
}

/// `finetune_loss.png/.svg`: the held-out answer loss against fine-tuning steps, seed mean per model.
fn finetune_chart(out: &Path, config: &Table4Config) -> Result<()> {
    let rows = crate::lm_sweep::read_rows(out)?;
    let series: Vec<report::Series> = config
        .models
        .iter()
        .filter_map(|m| {
            let mut steps: Vec<usize> = rows
                .iter()
                .filter(|r| &r.model == m)
                .map(|r| r.metrics.step)
                .collect();
            steps.sort_unstable();
            steps.dedup();
            let points: Vec<(f64, f64)> = steps
                .into_iter()
                .map(|step| {
                    let at: Vec<f64> = rows
                        .iter()
                        .filter(|r| &r.model == m && r.metrics.step == step)
                        .map(|r| r.metrics.eval_loss)
                        .collect();
                    (step as f64, Spread::of(&at).mean)
                })
                .collect();
            (!points.is_empty()).then(|| report::Series {
                name: report::quality::display_name(m).to_string(),
                points,
            })
        })
        .collect();
    report::LineChart {
        title: format!(
            "Fine-tuning on {}: held-out answer loss (seed mean)",
            config.dataset
        ),
        x_label: "fine-tuning step".into(),
        y_label: "answer cross-entropy (nats)".into(),
        x_scale: report::Scale::Linear,
        y_scale: report::Scale::Linear,
    }
    .save(&out.join("finetune_loss"), &series)
}
