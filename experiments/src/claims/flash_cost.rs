//! The FLASH paper's cost claims: F1 (the step's growth with context), F2 and F4 (the speedup to
//! the baseline's final perplexity), F3 (Performer's step).

use std::path::Path;

use anyhow::{Context, Result};

use super::sources::{missing, model_name};
use crate::claim::Claim;
use crate::latency::LatencyRow;
use crate::lm_sweep::{read_rows, read_step_times, saved_config, summaries};
use crate::verdict::{Spread, StepCost, StepTime, SweepRow, Verdict};

/// F1 from `table11`'s `latency.csv`.
pub(super) fn latency_claim(results: &Path) -> Result<Claim> {
    let path = results.join("table11/latency.csv");
    let rows: Vec<LatencyRow> = csv::Reader::from_path(&path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .deserialize()
        .collect::<Result<_, _>>()
        .with_context(|| format!("malformed {}", path.display()))?;
    let of = |m: &str| -> Vec<&LatencyRow> { rows.iter().filter(|r| r.model == m).collect() };
    // (growth range over the timed steps, shortest and longest context) of a model.
    let growth = |m: &str| -> Option<(Spread, usize, usize)> {
        let rs = of(m);
        let short = rs.iter().min_by_key(|r| r.context)?;
        let long = rs.iter().max_by_key(|r| r.context)?;
        let g = [
            long.min_s_per_step / short.max_s_per_step,
            long.median_s_per_step / short.median_s_per_step,
            long.max_s_per_step / short.min_s_per_step,
        ];
        Some((
            Spread {
                mean: g[1],
                min: g[0],
                max: g[2],
            },
            short.context,
            long.context,
        ))
    };
    let (Some((flash, c0, c1)), Some((tfm, ..))) =
        (growth("flash"), growth("transformer_plusplus"))
    else {
        anyhow::bail!("{} lacks flash or transformer_plusplus", path.display());
    };
    let ratio = Spread {
        mean: tfm.mean / flash.mean,
        min: tfm.min / flash.max,
        max: tfm.max / flash.min,
    };
    Ok(Claim {
        id: "F1",
        claim: format!(
            "FLASH's training step is flat in context, Transformer++'s grows (step time at {c1} / at {c0} tokens, same tokens per step)"
        ),
        source: "[table11](table11/latency.csv)".into(),
        ours: format!(
            "FLASH {}×, Transformer++ {}×: growth ratio {}×",
            flash.show(2),
            tfm.show(2),
            ratio.show(2)
        ),
        paper: "FLASH flat, Transformer++ quadratic in the attention part (Table 11, V100/TPU)",
        verdict: Some(Verdict::above(&ratio, 1.0)),
    })
}

/// The verdict rows of one sweep (`fig5`, `fig6` or `table3`) for `model` against the sweep's
/// baseline, per context; or one row saying why there is none.
pub(super) fn speedup_claims(
    results: &Path,
    id: &'static str,
    claim_id: &'static str,
    model: &str,
    paper: &'static str,
) -> Vec<Claim> {
    let dir = results.join(id);
    let name = model_name(model);
    let setting = match id {
        "fig5" => "masked LM",
        "table3" => "causal LM on long books",
        _ => "causal LM",
    };
    let claim = |baseline: &str, c: Option<usize>| {
        format!(
            "{name} reaches {}'s final perplexity sooner in device-hours ({setting}{})",
            model_name(baseline),
            c.map(|c| format!(", context {c}")).unwrap_or_default()
        )
    };
    let source = format!("[{id}]({id}/table.md)");
    let loaded =
        read_rows(&dir).and_then(|rows| Ok((rows, saved_config(&dir)?, read_step_times(&dir)?)));
    let (rows, config, times) = match loaded {
        Ok(x) => x,
        Err(e) => {
            let baseline = if id == "table3" {
                "transformer_plus"
            } else {
                "transformer_plusplus"
            };
            return vec![Claim {
                id: claim_id,
                claim: claim(baseline, None),
                source,
                ours: format!("no result in the current format ({e:#}); re-run `just repro {id}`"),
                paper,
                verdict: None,
            }];
        }
    };
    let cost = times.as_deref().map_or(StepCost::RunHours, StepCost::Timed);
    let chosen = crate::lm_sweep::lr_choice::read_diverged(&dir).and_then(|diverged| {
        crate::lm_sweep::lr_choice::at_chosen_rates(&rows, &diverged, &config)
    });
    let rows = match chosen {
        Ok(rows) => rows,
        Err(e) => {
            return vec![missing(
                claim_id,
                &claim(&config.baseline, None),
                id,
                paper,
                e,
            )];
        }
    };
    let rows: Vec<Claim> = summaries(&rows, &config, cost)
        .into_iter()
        .filter(|s| s.model == model)
        .map(|s| Claim {
            id: claim_id,
            claim: claim(&config.baseline, Some(s.context)),
            source: source.clone(),
            ours: format!(
                "{}× over {} seed pairs ({} reach it) = {}× in steps × {}× step time; final ppl {}",
                s.speedup.show(2),
                s.reached.1,
                s.reached.0,
                s.steps_ratio.show(2),
                s.step_time_ratio.show(2),
                s.final_ppl.show(1),
            ),
            paper,
            verdict: Some(Verdict::above(&s.speedup, 1.0)),
        })
        .collect();
    if rows.is_empty() {
        // The sweep ran without this model (a partial or reduced run): say so, not nothing.
        return vec![Claim {
            id: claim_id,
            claim: claim(&config.baseline, None),
            source,
            ours: format!("no {name} runs in {id}'s results; run `just repro {id} --profile cpu`"),
            paper,
            verdict: None,
        }];
    }
    rows
}

/// F3 from `fig6`, per context: Performer's step time against the slowest other model's. From the
/// step-time calibration when the sweep has one (per round: Performer's seconds / the slowest
/// other model's in that round), else from the runs' training tokens/s (each run's average).
pub(super) fn performer_claims(results: &Path) -> Vec<Claim> {
    let dir = results.join("fig6");
    let paper = "Performer the slowest in causal training (Table 11, prefix sums)";
    let loaded = read_rows(&dir).and_then(|rows| Ok((rows, read_step_times(&dir)?)));
    let (rows, times) = match loaded {
        Ok(x) => x,
        Err(e) => {
            return vec![Claim {
                id: "F3",
                claim: "Performer is the slowest model in causal training".into(),
                source: "[fig6](fig6/table.md)".into(),
                ours: format!("no result in the current format ({e:#}); re-run `just repro fig6`"),
                paper,
                verdict: None,
            }];
        }
    };
    let contexts: std::collections::BTreeSet<usize> = rows.iter().map(|r| r.context).collect();
    contexts
        .into_iter()
        .filter_map(|c| {
            let (ratio, how) = match &times {
                Some(times) => timed_ratio(times, c)?,
                None => throughput_ratio(&rows, c)?,
            };
            Some(Claim {
                id: "F3",
                claim: format!("Performer is the slowest model in causal training (context {c})"),
                source: "[fig6](fig6/table.md)".into(),
                ours: how,
                paper,
                verdict: Some(Verdict::above(&ratio, 1.0)),
            })
        })
        .collect()
}

/// F3 at context `c` from the calibration's step times: a Performer's step time over the slowest
/// other model's per round (the token-level Performer's when timed, else the blockwise one), and
/// the text of the row.
fn timed_ratio(times: &[StepTime], c: usize) -> Option<(Spread, String)> {
    Some({
        let cost = StepCost::Timed(times);
        let mut models: Vec<&str> = times
            .iter()
            .filter(|t| t.context == c)
            .map(|t| t.model.as_str())
            .collect();
        models.sort_unstable();
        models.dedup();
        let performers = ["performer", TOKEN_LEVEL_PERFORMER];
        let others: Vec<Vec<f64>> = models
            .iter()
            .filter(|m| !performers.contains(m))
            .map(|m| cost.seconds(m, c))
            .collect();
        // Per round, a Performer's step time / the slowest other model's.
        let ratio = |name: &str| -> Option<(Spread, usize)> {
            let own = cost.seconds(name, c);
            if own.is_empty() || others.is_empty() || others.iter().any(|o| o.len() != own.len()) {
                return None;
            }
            let per_round: Vec<f64> = (0..own.len())
                .map(|r| own[r] / others.iter().map(|o| o[r]).fold(0.0, f64::max))
                .collect();
            Some((Spread::quartiles(&per_round), per_round.len()))
        };
        let (blockwise, rounds) = ratio("performer")?;
        match ratio(TOKEN_LEVEL_PERFORMER) {
            Some((token, _)) => (
                token,
                format!(
                    "step time / the slowest other model's, median and interquartile range over {rounds} rounds timed together: the paper's Performer (token-level prefix sums) {}×, ours as trained (blockwise, blocks of {}) {}×; the verdict reads the token-level one",
                    token.show(2),
                    model::transformer::FAVOR_CAUSAL_BLOCK,
                    blockwise.show(2)
                ),
            ),
            None => (
                blockwise,
                format!(
                    "Performer's step time / the slowest other model's, median and interquartile range over {rounds} rounds timed together: {}× (blockwise prefix sums, blocks of {}, not the paper's token-level cumulative sum, which this calibration did not time)",
                    blockwise.show(2),
                    model::transformer::FAVOR_CAUSAL_BLOCK
                ),
            ),
        }
    })
}

/// F3 at context `c` without a calibration: the slowest other run's training tokens/s over the
/// Performer's, and the text of the row.
fn throughput_ratio(rows: &[SweepRow], c: usize) -> Option<(Spread, String)> {
    Some({
        // Each run's average tokens/s: its last row's.
        let mut last = std::collections::BTreeMap::new();
        for r in rows.iter().filter(|r| r.context == c) {
            last.insert((r.model.as_str(), r.seed), r.metrics.tokens_per_s);
        }
        let speed = |performer: bool| -> Vec<f64> {
            last.iter()
                .filter(|((m, _), _)| (*m == "performer") == performer)
                .map(|(_, &v)| v)
                .collect()
        };
        let (performer, others) = (speed(true), speed(false));
        if performer.is_empty() || others.is_empty() {
            return None;
        }
        let p = Spread::of(&performer);
        let slowest_other = others.iter().copied().fold(f64::INFINITY, f64::min);
        let ratio = Spread {
            mean: slowest_other / p.mean,
            min: slowest_other / p.max,
            max: slowest_other / p.min,
        };
        (
            ratio,
            format!(
                "slowest other run / Performer, in the runs' training tokens/s: {}×",
                ratio.show(2)
            ),
        )
    })
}

/// The name of fig6's timed-only Performer with token-level prefix sums (its `timed_variants`).
pub const TOKEN_LEVEL_PERFORMER: &str = "performer_token";
