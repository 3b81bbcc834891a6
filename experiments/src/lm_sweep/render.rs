//! The sweep's report: `table.md` with its verdicts, and the quality charts.

use std::path::Path;

use anyhow::Result;
use report::quality::{QualityChart, SeedCurve, SeedPoint};
use training::lm_task::WindowOrder;
use training::write_atomic;

use super::calibrate::read_step_times;
use super::config::{EvalSplit, LmSweepConfig, Objective, SweepTable};
use super::lr_choice;
use super::lr_choice::RateChoice;
use super::results::{model_order, read_rows, saved_config, speedup_verdict, summaries};
use crate::verdict::{Pairing, StepCost, Summary, SweepRow, Verdict};

/// `model`'s curve at `context` over its seeds, evaluation by evaluation (the seeds evaluate at the
/// same steps; a seed with fewer evaluations limits the curve).
pub(super) fn seed_curve(
    rows: &[SweepRow],
    model: &str,
    context: usize,
    timed_seconds: Option<f64>,
    label: String,
) -> Option<SeedCurve> {
    let runs = crate::verdict::runs(rows, model, context);
    let evals = runs.iter().map(|r| r.rows.len()).min()?;
    let points = (0..evals)
        .map(|i| {
            let at: Vec<&SweepRow> = runs.iter().map(|r| r.rows[i]).collect();
            let ppl: Vec<f64> = at.iter().map(|r| r.metrics.eval_ppl).collect();
            let spread = crate::verdict::Spread::of(&ppl);
            SeedPoint {
                hours: match timed_seconds {
                    Some(t) => at[0].metrics.step as f64 * t / 3600.0,
                    None => {
                        at.iter().map(|r| r.metrics.device_hours).sum::<f64>() / at.len() as f64
                    }
                },
                step: at[0].metrics.step as f64,
                mean: spread.mean,
                min: spread.min,
                max: spread.max,
            }
        })
        .collect();
    Some(SeedCurve {
        model: model.to_string(),
        label,
        points,
    })
}

/// Charts `ppl_<context>` (perplexity vs device-hours and vs steps: the seed mean and range) and
/// `table.md` (the paper's `table`: final perplexity over seeds and the speedup to the baseline's
/// final perplexity over seed pairs, with its decomposition and verdict) from `metrics.csv`.
pub fn render(out: &Path, table: &str, config: Option<&LmSweepConfig>) -> Result<()> {
    let config = match config {
        Some(c) => c.clone(),
        None => saved_config(out)?,
    };
    let every_rate = read_rows(out)?;
    let diverged = lr_choice::read_diverged(out)?;
    let rows = lr_choice::at_chosen_rates(&every_rate, &diverged, &config)?;
    let choices = if config.lr_grid.is_empty() {
        Vec::new()
    } else {
        lr_choice::choose(&every_rate, &diverged, &config)?
    };
    let unigram = read_unigram_ppl(out);
    let baseline = &config.baseline;
    let step_times = read_step_times(out)?;
    let cost = match &step_times {
        Some(times) => StepCost::Timed(times),
        None => StepCost::RunHours,
    };
    let mut md = legend(table, baseline, cost);
    let all = summaries(&rows, &config, cost);
    // The body (below the heading and the legend) is also what the artifact's README shows.
    let mut body = data_note(&config, &all, unigram);
    body += &speedup_table(&all, &config, cost, (&every_rate, &rows), &choices);
    if !choices.is_empty() {
        body += &lr_choice::table(&choices, &config);
    }
    body += &extra_tables(out, &rows, &all, &config)?;
    md += &body;
    quality_charts(out, &rows, &all, &config, cost, unigram)?;
    write_atomic(&out.join("table.md"), md.as_bytes())?;
    report::readme::fill(&out.join("README.md"), "table.md", &body)?;
    Ok(())
}

/// `table.md`'s heading and legend: what each column is, and where the step-time ratio comes from.
fn legend(table: &str, baseline: &str, cost: StepCost) -> String {
    let step_time_source = match cost {
        StepCost::Timed(_) => format!(
            "The step-time ratio is {baseline}'s seconds per training step / the model's, the median and interquartile range\n\
             over the rounds of the step-time calibration (`step_times.csv`: every model's step timed in turn, in one\n\
             session, after the runs; s/step is the model's median), so the speedup is the steps ratio × that ratio (mean ×\n\
             median, min × lower quartile, max × upper quartile), and the charts' device-hours are steps × the median step\n\
             time. The runs' own device-hours and tokens/s (their sessions' machine speed) are in the two columns\n\
             after `steps`; a row marked † has no timings and uses them."
        ),
        StepCost::RunHours => format!(
            "The step-time ratio is {baseline}'s device-hours per step / the model's, from the runs themselves (this sweep\n\
             has no step-time calibration)."
        ),
    };
    format!(
        "# {table}: perplexity and speedup to {baseline}'s final perplexity\n\n\
         Per model and context, over its seeds: the final held-out perplexity (mean [min–max]); the speedup, {baseline}'s\n\
         training time divided by the time the model takes to reach {baseline}'s final perplexity (linear between\n\
         evaluations), in device-hours, over every (model seed, {baseline} seed) pair (a pair that never reaches it counts\n\
         as 0); its decomposition into the same ratio in training steps × the step-time ratio; and the verdict on the\n\
         paper's claim that the model is faster (speedup > 1): reproduced when the whole range is above 1, refuted when\n\
         it is below, else inconclusive. {baseline}'s own row pairs its different seeds: how far apart two runs of one\n\
         model land. tokens/s: training tokens over training seconds.\n\
         {step_time_source}\n\
         Generated from `metrics.csv` (each row names its run in the run store).\n\n"
    )
}

/// How far the baseline still improved over its last quarter, which split the table reads, how
/// the training windows were ordered, and the unigram reference.
fn data_note(config: &LmSweepConfig, all: &[Summary], unigram: Option<f64>) -> String {
    let baseline = &config.baseline;
    let base_rows: Vec<&Summary> = all.iter().filter(|s| &s.model == baseline).collect();
    let mut body =
        format!("Past the initial drop: {baseline}'s held-out loss improved by at most ");
    body += &base_rows
        .iter()
        .map(|s| format!("{:.2}% (context {})", 100.0 * s.last_quarter, s.context))
        .collect::<Vec<_>>()
        .join(", ");
    body +=
        " over the last quarter of its steps (worst seed; the cpu scale asks for under 2%).\n\n";
    body += &format!(
        "Held-out split: {}; training windows: {}.{}\n\n",
        match config.eval_split {
            EvalSplit::Validation => "validation (no choice was made on held-out data)",
            EvalSplit::Test => "test (rates chosen on validation)",
        },
        match config.train_order {
            WindowOrder::File => "the split in file order, every seed alike".to_string(),
            WindowOrder::Shuffled { block_tokens } => format!(
                "shuffled by each run's seed (blocks of {block_tokens} tokens)"
            ),
        },
        unigram.map_or_else(String::new, |u| format!(
            " Unigram reference (no context: the held-out split's own token frequencies): perplexity {u:.1}."
        )),
    );
    body
}

/// The speedup table: per model and context its final perplexity, speedup, decomposition and
/// verdict, and with a rate grid whether the verdict holds at the second-best rate.
fn speedup_table(
    all: &[Summary],
    config: &LmSweepConfig,
    cost: StepCost,
    (every_rate, rows): (&[SweepRow], &[SweepRow]),
    choices: &[RateChoice],
) -> String {
    let robust_column = !choices.is_empty();
    let mut body = String::from(
        "| model | context | seeds | steps | run device-hours | run tokens/s | s/step (timed) | final ppl | speedup (device-hours) | = in steps | × step time | reached | verdict |",
    );
    body += if robust_column {
        " robust to the rate |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    } else {
        "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    };
    for s in all {
        let verdict = speedup_verdict(s, config);
        let robust = match (robust_column, verdict) {
            (false, _) => String::new(),
            (true, None) => " — |".into(),
            (true, Some(v)) => {
                format!(
                    " {} |",
                    robust_to_rate(s, v, (every_rate, rows), choices, config, cost)
                )
            }
        };
        let verdict = verdict.map_or_else(|| "—".into(), |v| v.to_string());
        body += &format!(
            "| {} | {} | {} | {} | {:.3e} | {:.0} | {} | {} | {}× | {}× | {}× | {}/{} | {verdict} |{robust}\n",
            s.model,
            s.context,
            s.seeds,
            s.steps,
            s.device_hours,
            s.tokens_per_s,
            match (s.timed_seconds, cost) {
                (Some(t), _) => format!("{t:.3}"),
                (None, StepCost::Timed(_)) => "†".into(),
                (None, StepCost::RunHours) => "—".into(),
            },
            s.final_ppl.show(2),
            s.speedup.show(2),
            s.steps_ratio.show(2),
            s.step_time_ratio.show(2),
            s.reached.0,
            s.reached.1,
        );
    }
    body
}

/// The table the config's `table` adds (chunking loss, ablations, sizes, the trend with
/// length), with its charts.
fn extra_tables(
    out: &Path,
    rows: &[SweepRow],
    all: &[Summary],
    config: &LmSweepConfig,
) -> Result<String> {
    Ok(match config.table {
        SweepTable::Speedup => String::new(),
        SweepTable::ChunkingLoss => chunking_table(rows, all, Pairing::of(config.train_order)),
        SweepTable::Ablation => {
            super::ablation::charts(out, rows, config)?;
            super::ablation::table(rows, config)
        }
        SweepTable::Scaling => {
            let section = super::scaling::section(rows, config)?;
            super::scaling::charts(out, rows, config)?;
            section
        }
        SweepTable::LengthTrend => super::length_trend::section(out, config)?,
    })
}

/// `ppl_<context>.png/svg`: per context, every model's held-out perplexity against device-hours
/// and steps (seed mean and range).
fn quality_charts(
    out: &Path,
    rows: &[SweepRow],
    all: &[Summary],
    config: &LmSweepConfig,
    cost: StepCost,
    unigram: Option<f64>,
) -> Result<()> {
    let baseline = &config.baseline;
    let objective = match config.objective {
        Objective::Causal => "Causal LM",
        Objective::Masked => "Masked LM",
    };
    let models = model_order(rows);
    for c in all
        .iter()
        .map(|s| s.context)
        .collect::<std::collections::BTreeSet<_>>()
    {
        let curves: Vec<SeedCurve> = models
            .iter()
            .filter_map(|m| {
                let timed = all
                    .iter()
                    .find(|s| &s.model == m && s.context == c)
                    .and_then(|s| s.timed_seconds);
                seed_curve(rows, m, c, timed, super::ablation::label(config, m))
            })
            .collect();
        let Some(base) = all.iter().find(|s| &s.model == baseline && s.context == c) else {
            continue;
        };
        QualityChart {
            title: format!(
                "{objective} on {}, context {c}: {} perplexity vs training cost{}",
                config.dataset,
                match config.eval_split {
                    EvalSplit::Validation => "validation",
                    EvalSplit::Test => "test",
                },
                unigram.map_or_else(String::new, |u| format!(" (unigram {u:.0})")),
            ),
            baseline: (baseline.clone(), base.final_ppl.mean),
            hours_label: match cost {
                StepCost::Timed(_) => format!(
                    "device-hours on {} (steps × calibrated step time)",
                    crate::scale::device(out).unwrap_or_else(|| "this device".into())
                ),
                StepCost::RunHours => "device-hours (the runs' training time)".into(),
            },
        }
        .save(&out.join(format!("ppl_{c}")), &curves)?;
    }
    Ok(())
}

/// The unigram reference perplexity the sweep saved in `data.json`, if it did.
pub(super) fn read_unigram_ppl(out: &Path) -> Option<f64> {
    let text = std::fs::read(out.join("data.json")).ok()?;
    let json: serde_json::Value = serde_json::from_slice(&text).ok()?;
    json.get("unigram_ppl")?.as_f64()
}

/// Whether `verdict`, on `s`'s speedup with its runs at its chosen rate, is the same with its
/// runs at its second-best rate: "yes", or "no (…)" with the other verdict.
pub(super) fn robust_to_rate(
    s: &Summary,
    verdict: Verdict,
    (every_rate, chosen): (&[SweepRow], &[SweepRow]),
    choices: &[RateChoice],
    config: &LmSweepConfig,
    cost: StepCost,
) -> String {
    let Some(choice) = choices
        .iter()
        .find(|c| c.model == s.model && c.context == s.context)
    else {
        return "—".into();
    };
    let rows = lr_choice::at_second_rate(every_rate, chosen, choice);
    let other = summaries(&rows, config, cost)
        .into_iter()
        .find(|o| o.model == s.model && o.context == s.context)
        .and_then(|o| speedup_verdict(&o, config).map(|v| (v, o.speedup)));
    match other {
        Some((v, _)) if v == verdict => format!("yes (at {}: {v})", choice.second),
        Some((v, speedup)) => format!("no (at {}: {v}, {}×)", choice.second, speedup.show(2)),
        None => "—".into(),
    }
}

/// The chunking-loss section of `table.md` (FLASH Table 5), one row per context.
pub(super) fn chunking_table(rows: &[SweepRow], all: &[Summary], pairing: Pairing) -> String {
    let contexts: std::collections::BTreeSet<usize> = all.iter().map(|s| s.context).collect();
    let mut md = format!(
        "\n## The perplexity lost by chunking (FLASH Table 5)\n\n\
         Chunked / unchunked final perplexity ({}): for the GAU\n\
         FLASH / FLASH-Quad, for the Transformer MC-TFM++ / Transformer++ (chunking and relu² scoring together) and\n\
         MC-TFM++ / relu² Transformer++ (chunking alone). The claim (F6): the GAU loses less, i.e. (MC-TFM++ /\n\
         Transformer++) / (FLASH / FLASH-Quad) > 1, over the whole range.\n\n\
         | context | FLASH / FLASH-Quad | MC-TFM++ / Transformer++ | MC-TFM++ / relu² Transformer++ | Transformer's loss / GAU's | verdict |\n\
         |---|---|---|---|---|---|\n",
        pairing.describe()
    );
    for c in contexts {
        let Some(l) = crate::verdict::chunking_loss(rows, c, pairing) else {
            continue;
        };
        md += &format!(
            "| {c} | {}× | {}× | {} | {}× | {} |\n",
            l.gau.show(3),
            l.transformer.show(3),
            l.transformer_relu2
                .map_or_else(|| "—".into(), |r| format!("{}×", r.show(3))),
            l.ratio.show(3),
            Verdict::above(&l.ratio, 1.0),
        );
    }
    md
}
