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

use std::fmt;

use report::speedup_to_baseline;
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
    fn round_ratios(&self, baseline: &str, model: &str, context: usize) -> Option<Vec<f64>> {
        let (b, m) = (
            self.seconds(baseline, context),
            self.seconds(model, context),
        );
        (!b.is_empty() && b.len() == m.len())
            .then(|| b.iter().zip(&m).map(|(b, m)| b / m).collect())
    }
}

/// Where a claim's number must lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The whole range lies on the paper's side.
    Reproduced,
    /// The whole range lies on the other side.
    Refuted,
    /// The range straddles the threshold.
    Inconclusive,
}

impl Verdict {
    /// The verdict on "greater than `threshold`" for a range of values.
    pub fn above(range: &Spread, threshold: f64) -> Self {
        if range.min > threshold {
            Verdict::Reproduced
        } else if range.max < threshold {
            Verdict::Refuted
        } else {
            Verdict::Inconclusive
        }
    }
}

impl Verdict {
    /// The verdict on an equivalence claim ("close to", "within", "competitive") for a range of
    /// values: reproduced when the whole range lies inside [`lo`, `hi`], refuted when it lies
    /// wholly outside (entirely below `lo` or entirely above `hi`), inconclusive otherwise.
    pub fn within(range: &Spread, lo: f64, hi: f64) -> Self {
        if range.min >= lo && range.max <= hi {
            Verdict::Reproduced
        } else if range.max < lo || range.min > hi {
            Verdict::Refuted
        } else {
            Verdict::Inconclusive
        }
    }

    /// The verdict on "less than `threshold`" for a range of values.
    pub fn below(range: &Spread, threshold: f64) -> Self {
        match Self::above(range, threshold) {
            Verdict::Reproduced => Verdict::Refuted,
            Verdict::Refuted => Verdict::Reproduced,
            Verdict::Inconclusive => Verdict::Inconclusive,
        }
    }

    /// The verdict on a claim made of several parts that must all hold: refuted when one part is,
    /// reproduced when every part is, inconclusive otherwise.
    pub fn all(parts: &[Verdict]) -> Self {
        if parts.contains(&Verdict::Refuted) {
            Verdict::Refuted
        } else if parts.iter().all(|&v| v == Verdict::Reproduced) {
            Verdict::Reproduced
        } else {
            Verdict::Inconclusive
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Verdict::Reproduced => "reproduced",
            Verdict::Refuted => "refuted",
            Verdict::Inconclusive => "inconclusive",
        })
    }
}

/// The margin of "competitive" final perplexities (F7): a ratio of at most 1 + this is not worse.
/// At the cpu scale one model's seeds land within about ±1.5% of their mean (Transformer++ in
/// fig6: 196.9–202.6 around 200.6), and the paper calls "competitive" differences of 1–2% in
/// Figure 3; 3% allows for both, fixed before the runs it judges.
pub const PPL_MARGIN: f64 = 0.03;

/// How the seeds of two models' runs pair in a comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pairing {
    /// Seed s of each model read the same training windows in the same order (a stream shuffled
    /// by the seed): a difference is taken per seed, and its range is over the seeds.
    BySeed,
    /// Every seed read the same windows (file order), so no seed of one model is the partner of
    /// one of the other: the range is over every (seed, seed) pair.
    AllPairs,
}

impl Pairing {
    /// The pairing of the runs of a sweep whose training windows come in `order`.
    pub fn of(order: training::lm_task::WindowOrder) -> Self {
        match order {
            training::lm_task::WindowOrder::File => Pairing::AllPairs,
            training::lm_task::WindowOrder::Shuffled { .. } => Pairing::BySeed,
        }
    }

    /// How a table says it.
    pub fn describe(self) -> &'static str {
        match self {
            Pairing::BySeed => "range over seeds, each seed's runs paired (the same data order)",
            Pairing::AllPairs => "range over every pair of seeds",
        }
    }
}

/// Mean and range of a set of values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (not empty).
    pub fn of(values: &[f64]) -> Self {
        let n = values.len() as f64;
        Self {
            mean: values.iter().sum::<f64>() / n,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }

    /// The median and the interquartile range of `values` (not empty; quartiles interpolated
    /// linearly between order statistics, numpy's default), in `mean`, `min` and `max`: the
    /// central value and precision of a repeated measurement of one quantity (a step-time ratio),
    /// where the full range only grows with the number of repeats.
    pub fn quartiles(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |p: f64| {
            let pos = p * (v.len() - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
        };
        Self {
            mean: at(0.5),
            min: at(0.25),
            max: at(0.75),
        }
    }

    /// `self / other` for positive quantities with independent errors: the ratio of the centres,
    /// the range from the extreme quotients.
    pub fn div(&self, other: &Spread) -> Spread {
        Spread {
            mean: self.mean / other.mean,
            min: self.min / other.max,
            max: self.max / other.min,
        }
    }

    /// `mean [min–max]` with `digits` decimals, or the mean alone when all values are equal.
    pub fn show(&self, digits: usize) -> String {
        if self.min == self.max {
            format!("{:.digits$}", self.mean)
        } else {
            format!(
                "{:.digits$} [{:.digits$}–{:.digits$}]",
                self.mean, self.min, self.max
            )
        }
    }
}

/// The rows of one run (one model, context and seed), in training order.
#[derive(Clone, Debug)]
pub struct Run<'a> {
    pub seed: u64,
    pub rows: Vec<&'a SweepRow>,
}

impl Run<'_> {
    fn curve(&self, x: fn(&SweepRow) -> f64) -> Vec<(f64, f64)> {
        self.rows
            .iter()
            .map(|r| (x(r), r.metrics.eval_ppl))
            .collect()
    }
    fn last(&self) -> &SweepRow {
        self.rows.last().expect("a run has rows")
    }
    /// Training device-hours per step.
    fn hours_per_step(&self) -> f64 {
        let last = self.last();
        last.metrics.device_hours / last.metrics.step.max(1) as f64
    }
    /// Relative improvement of held-out loss over the last quarter of training:
    /// (loss at the first evaluation at or after 3/4 of the steps − final loss) / that loss.
    pub fn last_quarter_improvement(&self) -> f64 {
        let last = self.last();
        let quarter = self
            .rows
            .iter()
            .find(|r| 4 * r.metrics.step >= 3 * last.metrics.step)
            .expect("the last row qualifies");
        (quarter.metrics.eval_loss - last.metrics.eval_loss) / quarter.metrics.eval_loss
    }
}

/// The runs of `model` at `context`, one per seed, in seed order.
pub fn runs<'a>(rows: &'a [SweepRow], model: &str, context: usize) -> Vec<Run<'a>> {
    let mut seeds: Vec<u64> = rows
        .iter()
        .filter(|r| r.model == model && r.context == context)
        .map(|r| r.seed)
        .collect();
    seeds.sort_unstable();
    seeds.dedup();
    seeds
        .into_iter()
        .map(|seed| Run {
            seed,
            rows: rows
                .iter()
                .filter(|r| r.model == model && r.context == context && r.seed == seed)
                .collect(),
        })
        .collect()
}

/// One model at one context against the baseline.
#[derive(Clone, Debug)]
pub struct Summary {
    pub model: String,
    pub context: usize,
    pub seeds: usize,
    pub steps: usize,
    /// Training device-hours (mean over seeds).
    pub device_hours: f64,
    pub tokens_per_s: f64,
    pub final_ppl: Spread,
    /// Speedup in device-hours over (model seed, baseline seed) pairs; a pair where the model never
    /// reaches the baseline's final perplexity counts as 0. For the baseline itself, the pairs of
    /// different seeds: how far apart two runs of one model land (1× when it has one seed).
    pub speedup: Spread,
    /// The same in training steps.
    pub steps_ratio: Spread,
    /// Baseline step time / model step time: when timed, the median and interquartile range of
    /// the calibration's per-round ratios ([`Spread::quartiles`]); else the mean and range over
    /// the pairs of runs (hours per step).
    pub step_time_ratio: Spread,
    /// The model's median calibrated seconds per step, when the sweep timed it.
    pub timed_seconds: Option<f64>,
    /// Pairs where the model reaches the baseline's final perplexity, of all pairs.
    pub reached: (usize, usize),
    /// Largest last-quarter improvement of held-out loss over the seeds.
    pub last_quarter: f64,
}

/// Summaries of every model at `context` against `baseline`, in `models` order (models without
/// rows at that context are skipped). With timed step costs, the speedup is the steps ratio's
/// spread over the pairs times the step-time ratio's (mean × median, min × lower quartile,
/// max × upper quartile): with a constant step time the time to reach a perplexity is steps ×
/// seconds per step.
pub fn summarize(
    rows: &[SweepRow],
    models: &[String],
    baseline: &str,
    context: usize,
    cost: StepCost,
) -> Vec<Summary> {
    let base = runs(rows, baseline, context);
    let by_hours = |r: &SweepRow| r.metrics.device_hours;
    let by_step = |r: &SweepRow| r.metrics.step as f64;
    models
        .iter()
        .filter_map(|m| {
            let own = runs(rows, m, context);
            if own.is_empty() || base.is_empty() {
                return None;
            }
            // A baseline with one seed has no other seed to be compared with: 1× by definition.
            let lone_baseline = m == baseline && own.len() == 1;
            let (mut speedup, mut steps_ratio, mut step_time) = (vec![], vec![], vec![]);
            let mut reached = 0;
            for b in &base {
                // The baseline against itself: only its other seeds (the noise floor).
                for r in own.iter().filter(|r| m != baseline || r.seed != b.seed) {
                    let s = speedup_to_baseline(&b.curve(by_hours), &r.curve(by_hours));
                    reached += s.is_some() as usize;
                    speedup.push(s.unwrap_or(0.0));
                    let st = speedup_to_baseline(&b.curve(by_step), &r.curve(by_step));
                    steps_ratio.push(st.unwrap_or(0.0));
                    step_time.push(b.hours_per_step() / r.hours_per_step());
                }
            }
            if lone_baseline {
                (speedup, steps_ratio, step_time) = (vec![1.0], vec![1.0], vec![1.0]);
                reached = 1;
            }
            let pairs = speedup.len();
            let mut speedup = Spread::of(&speedup);
            let steps_ratio = Spread::of(&steps_ratio);
            let timed = cost.round_ratios(baseline, m, context);
            let step_time_ratio = match &timed {
                Some(ratios) => {
                    let t = Spread::quartiles(ratios);
                    speedup = Spread {
                        mean: steps_ratio.mean * t.mean,
                        min: steps_ratio.min * t.min,
                        max: steps_ratio.max * t.max,
                    };
                    t
                }
                None => Spread::of(&step_time),
            };
            let timed_seconds = timed.map(|_| crate::median(&mut cost.seconds(m, context)));
            let lasts: Vec<&SweepRow> = own.iter().map(|r| r.last()).collect();
            let mean = |f: fn(&SweepRow) -> f64| {
                Spread::of(&lasts.iter().map(|r| f(r)).collect::<Vec<_>>()).mean
            };
            Some(Summary {
                model: m.clone(),
                context,
                seeds: own.len(),
                steps: lasts[0].metrics.step,
                device_hours: mean(|r| r.metrics.device_hours),
                tokens_per_s: mean(|r| r.metrics.tokens_per_s),
                final_ppl: Spread::of(
                    &lasts.iter().map(|r| r.metrics.eval_ppl).collect::<Vec<_>>(),
                ),
                speedup,
                steps_ratio,
                step_time_ratio,
                timed_seconds,
                reached: (reached, pairs),
                last_quarter: own
                    .iter()
                    .map(Run::last_quarter_improvement)
                    .fold(f64::NEG_INFINITY, f64::max),
            })
        })
        .collect()
}

/// The final held-out perplexity of each of `model`'s seeds at `context` (seed order).
pub fn final_ppls(rows: &[SweepRow], model: &str, context: usize) -> Vec<f64> {
    runs(rows, model, context)
        .iter()
        .map(|r| r.last().metrics.eval_ppl)
        .collect()
}

/// The final held-out perplexity of each of `model`'s seeds at `context`, by seed.
pub fn final_ppl_by_seed(
    rows: &[SweepRow],
    model: &str,
    context: usize,
) -> std::collections::BTreeMap<u64, f64> {
    runs(rows, model, context)
        .iter()
        .map(|r| (r.seed, r.last().metrics.eval_ppl))
        .collect()
}

/// `a`'s final perplexity relative to `b`'s at `context`; none when either has no runs there
/// (or, paired by seed, no seed in common). [`Pairing::AllPairs`]: the ratio of the seed means,
/// the range over every (a seed, b seed) pair. [`Pairing::BySeed`]: the mean and range of the
/// per-seed ratios over the seeds both have.
pub fn ppl_ratio(
    rows: &[SweepRow],
    a: &str,
    b: &str,
    context: usize,
    pairing: Pairing,
) -> Option<Spread> {
    match pairing {
        Pairing::AllPairs => {
            let (a, b) = (final_ppls(rows, a, context), final_ppls(rows, b, context));
            (!a.is_empty() && !b.is_empty()).then(|| Spread::of(&a).div(&Spread::of(&b)))
        }
        Pairing::BySeed => {
            let b = final_ppl_by_seed(rows, b, context);
            let ratios: Vec<f64> = final_ppl_by_seed(rows, a, context)
                .iter()
                .filter_map(|(seed, x)| b.get(seed).map(|y| x / y))
                .collect();
            (!ratios.is_empty()).then(|| Spread::of(&ratios))
        }
    }
}

/// The perplexity lost by chunking at one context (FLASH Table 5): chunked / unchunked final
/// perplexity for the GAU (FLASH-Quad → FLASH) and for the Transformer (Transformer++ → MC-TFM++,
/// and from the relu² Transformer++, which differs from MC-TFM++ only in the chunking).
#[derive(Clone, Debug)]
pub struct ChunkingLoss {
    pub context: usize,
    /// FLASH / FLASH-Quad.
    pub gau: Spread,
    /// MC-TFM++ / Transformer++ (chunking and relu² scoring together).
    pub transformer: Spread,
    /// MC-TFM++ / relu² Transformer++ (chunking alone), when the control was trained.
    pub transformer_relu2: Option<Spread>,
    /// The Transformer's loss over the GAU's, (MC-TFM++ / Transformer++) / (FLASH / FLASH-Quad):
    /// above 1 when the GAU loses less (the paper's claim F6), the range over every combination of
    /// the four models' seeds.
    pub ratio: Spread,
}

/// The models a chunking-loss table needs, by name.
pub const CHUNKING_MODELS: [&str; 4] = ["flash_quad", "flash", "transformer_plusplus", "mc_tfmpp"];

/// The chunking loss at `context`, if the four models of [`CHUNKING_MODELS`] have runs there.
pub fn chunking_loss(rows: &[SweepRow], context: usize, pairing: Pairing) -> Option<ChunkingLoss> {
    let gau = ppl_ratio(rows, "flash", "flash_quad", context, pairing)?;
    let transformer = ppl_ratio(rows, "mc_tfmpp", "transformer_plusplus", context, pairing)?;
    let ratio = match pairing {
        Pairing::AllPairs => transformer.div(&gau),
        Pairing::BySeed => {
            let of = |m: &str| final_ppl_by_seed(rows, m, context);
            let (f, fq, mc, tpp) = (
                of("flash"),
                of("flash_quad"),
                of("mc_tfmpp"),
                of("transformer_plusplus"),
            );
            let per_seed: Vec<f64> = f
                .iter()
                .filter_map(|(s, f)| Some((mc.get(s)? / tpp.get(s)?) / (f / fq.get(s)?)))
                .collect();
            if per_seed.is_empty() {
                return None;
            }
            Spread::of(&per_seed)
        }
    };
    Some(ChunkingLoss {
        context,
        gau,
        transformer,
        transformer_relu2: ppl_ratio(
            rows,
            "mc_tfmpp",
            "transformer_plusplus_relu2",
            context,
            pairing,
        ),
        ratio,
    })
}

/// One row of a layer-ablation table (FLASH Tables 1 and 2): a model changed in one component,
/// against the default layer.
#[derive(Clone, Debug)]
pub struct AblationRow {
    pub model: String,
    pub context: usize,
    /// Its final perplexity over the default's: ratio of the seed means, range over seed pairs.
    pub ratio: Spread,
    /// Its own seeds and the default's.
    pub seeds: (usize, usize),
}

impl AblationRow {
    /// How the row compares with the default: `Reproduced` when the change clearly hurts (the
    /// whole ratio range above 1), `Refuted` when the ablation is clearly better (wholly below 1),
    /// else `Inconclusive` (the range straddles 1).
    pub fn verdict(&self) -> Verdict {
        Verdict::above(&self.ratio, 1.0)
    }
}

/// Every model of `rows` but `default` at `context`, against `default` (first-appearance order).
pub fn ablation_rows(
    rows: &[SweepRow],
    default: &str,
    context: usize,
    pairing: Pairing,
) -> Vec<AblationRow> {
    let mut models: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.context == context) {
        if r.model != default && !models.contains(&r.model.as_str()) {
            models.push(&r.model);
        }
    }
    models
        .into_iter()
        .filter_map(|m| {
            Some(AblationRow {
                model: m.to_string(),
                context,
                ratio: ppl_ratio(rows, m, default, context, pairing)?,
                seeds: (
                    final_ppls(rows, m, context).len(),
                    final_ppls(rows, default, context).len(),
                ),
            })
        })
        .collect()
}

/// Claim F8 over the rows of one table and context, the paper's "every change hurts": reproduced
/// only when every ablation is clearly worse than the default, refuted when some ablation is
/// clearly better, inconclusive otherwise; none without rows.
pub fn every_change_hurts(rows: &[AblationRow]) -> Option<Verdict> {
    if rows.is_empty() {
        return None;
    }
    let verdicts: Vec<Verdict> = rows.iter().map(AblationRow::verdict).collect();
    Some(Verdict::all(&verdicts))
}

/// The counts of a layer-ablation table: (clearly worse, inconclusive, clearly better) ablations.
pub fn ablation_counts(rows: &[AblationRow]) -> (usize, usize, usize) {
    let count = |v| rows.iter().filter(|r| r.verdict() == v).count();
    (
        count(Verdict::Reproduced),
        count(Verdict::Inconclusive),
        count(Verdict::Refuted),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(model: &str, seed: u64, step: usize, hours: f64, ppl: f64) -> SweepRow {
        SweepRow {
            model: model.into(),
            context: 512,
            seed,
            run: String::new(),
            peak_lr: None,
            metrics: MetricsRow {
                step,
                tokens: 0,
                device_hours: hours,
                flops: 0.0,
                train_loss: 0.0,
                eval_loss: ppl.ln(),
                eval_ppl: ppl,
                tokens_per_s: 0.0,
                lr: 0.0,
                select_loss: None,
            },
        }
    }

    #[test]
    fn speedup_range_is_over_seed_pairs_and_decomposes() {
        // Baseline seeds end at 10 and 12 after 4 steps of 1 h; the model's step takes 0.5 h and
        // its two seeds reach 10 at step 2 and 12 at step 2 (from 30 at step 1).
        let mut rows = vec![];
        for (seed, end) in [(0, 10.0), (1, 12.0)] {
            rows.extend([1, 2, 3, 4].map(|s| {
                row(
                    "base",
                    seed,
                    s,
                    s as f64,
                    30.0 - (30.0 - end) * s as f64 / 4.0,
                )
            }));
        }
        for (seed, at2) in [(0, 10.0), (1, 11.0)] {
            rows.extend([1, 2, 3, 4].map(|s| {
                row(
                    "m",
                    seed,
                    s,
                    0.5 * s as f64,
                    if s == 1 { 30.0 } else { at2 },
                )
            }));
        }
        let s = &summarize(
            &rows,
            &["base".into(), "m".into()],
            "base",
            512,
            StepCost::RunHours,
        )[1];
        assert_eq!(
            s.reached,
            (3, 4),
            "model seed 1 (11) never reaches baseline seed 0's 10"
        );
        // Pairs (b0, m0): target 10 reached at step 2 → 4 / 1 h = 4×; (b0, m1): never (0);
        // (b1, m0): target 12 crossed at step 1 + 18/20 → 4 / 0.95 h; (b1, m1): 1 + 18/19.
        assert_eq!(s.speedup.min, 0.0);
        assert!((s.speedup.max - 4.0 / 0.95).abs() < 1e-9, "{:?}", s.speedup);
        assert!((s.step_time_ratio.mean - 2.0).abs() < 1e-12);
        assert_eq!(Verdict::above(&s.speedup, 1.0), Verdict::Inconclusive);
        // The baseline against its other seeds (never a run against itself): the noise floor.
        // (b0 → b1's 12: crossed at 3 + 3/5 h → 4 / 3.6); (b1 → b0's 10): never.
        let base = &summarize(&rows, &["base".into()], "base", 512, StepCost::RunHours)[0];
        assert_eq!(base.reached, (1, 2));
        assert!(
            (base.speedup.max - 4.0 / 3.6).abs() < 1e-9,
            "{:?}",
            base.speedup
        );
        assert_eq!(base.final_ppl.min, 10.0);
    }

    #[test]
    fn timed_step_costs_replace_the_runs_hours() {
        // The model learns twice as fast per step (reaches the baseline's final 10 at step 2 of
        // 4), and its runs' hours are deliberately wrong (10 h per step, as if trained on a slow
        // day); the calibration times its step at half the baseline's in one round and equal in
        // another.
        let mut rows = vec![];
        rows.extend([1, 2, 3, 4].map(|s| row("base", 0, s, s as f64, 30.0 - 5.0 * s as f64)));
        rows.extend([1, 2, 3, 4].map(|s| {
            row(
                "m",
                0,
                s,
                10.0 * s as f64,
                (30.0 - 10.0 * s as f64).max(8.0),
            )
        }));
        let t = |model: &str, round, seconds| StepTime {
            model: model.into(),
            context: 512,
            round,
            seconds,
            config: String::new(),
        };
        let times = [
            t("base", 0, 2.0),
            t("m", 0, 1.0),
            t("base", 1, 3.0),
            t("m", 1, 3.0),
        ];
        let models = ["base".to_string(), "m".to_string()];
        let s = &summarize(&rows, &models, "base", 512, StepCost::Timed(&times))[1];
        // Round ratios 2 and 1: median 1.5, quartiles 1.25 and 1.75.
        assert_eq!(s.steps_ratio.mean, 2.0);
        let t = s.step_time_ratio;
        assert_eq!((t.min, t.mean, t.max), (1.25, 1.5, 1.75));
        assert_eq!(
            (s.speedup.min, s.speedup.mean, s.speedup.max),
            (2.5, 3.0, 3.5)
        );
        assert_eq!(s.timed_seconds, Some(2.0));
        // From the runs' hours instead: 4 h / 20 h.
        let h = &summarize(&rows, &models, "base", 512, StepCost::RunHours)[1];
        assert!((h.speedup.mean - 0.2).abs() < 1e-12, "{:?}", h.speedup);
        assert_eq!(h.timed_seconds, None);
        // A model without timings falls back to its runs' hours.
        let partial = &summarize(&rows, &models, "base", 512, StepCost::Timed(&times[..1]))[1];
        assert_eq!(partial.timed_seconds, None);
    }

    #[test]
    fn a_row_reads_back_from_its_csv_exactly() {
        let mut r = row("flash", 3, 40, 1.0 / 3.0, 123.456_789_012_345);
        r.run = "flash-512-00ab".into();
        r.metrics.lr = 0.01;
        r.metrics.flops = 0.0;
        let text = format!("{}\n{}\n", SweepRow::header(), r.csv_fields());
        let back: Vec<SweepRow> = csv::Reader::from_reader(text.as_bytes())
            .deserialize()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back, vec![r]);
    }

    #[test]
    fn quartiles_interpolate_between_order_statistics() {
        // numpy.percentile([4, 1, 3, 2, 5], [25, 50, 75]) = [2, 3, 4];
        // numpy.percentile([1, 2, 3, 10], [25, 50, 75]) = [1.75, 2.5, 4.75].
        let q = Spread::quartiles(&[4.0, 1.0, 3.0, 2.0, 5.0]);
        assert_eq!((q.min, q.mean, q.max), (2.0, 3.0, 4.0));
        let q = Spread::quartiles(&[1.0, 2.0, 3.0, 10.0]);
        assert_eq!((q.min, q.mean, q.max), (1.75, 2.5, 4.75));
        assert_eq!(Spread::quartiles(&[7.0]).min, 7.0);
    }

    /// F8 ("every change hurts") gives each of its three outcomes: reproduced only when every
    /// ablation is clearly worse, inconclusive when one straddles the default, refuted when one is
    /// clearly better.
    #[test]
    fn the_default_layer_loses_f8_only_to_a_clearly_better_ablation() {
        let end = |m: &str, seed, ppl| row(m, seed, 10, 1.0, ppl);
        let mut rows = vec![
            end("gau", 0, 100.0),
            end("gau", 1, 104.0),
            // Clearly worse: 110–115 / 100–104.
            end("softmax", 0, 110.0),
            end("softmax", 1, 115.0),
            // Within the spread: 99–105.
            end("heads2", 0, 99.0),
            end("heads2", 1, 105.0),
        ];
        let table = ablation_rows(&rows, "gau", 512, Pairing::AllPairs);
        assert_eq!(table.len(), 2);
        assert_eq!(table[0].model, "softmax");
        assert!((table[0].ratio.min - 110.0 / 104.0).abs() < 1e-12);
        assert_eq!(table[0].verdict(), Verdict::Reproduced);
        assert_eq!(table[1].verdict(), Verdict::Inconclusive);
        assert_eq!(table[1].seeds, (2, 2));
        assert_eq!(every_change_hurts(&table[..1]), Some(Verdict::Reproduced));
        assert_eq!(every_change_hurts(&table), Some(Verdict::Inconclusive));
        assert_eq!(ablation_counts(&table), (1, 1, 0));
        // Paired by seed, heads2 is 0.99 and 1.0096 of the default: still inconclusive.
        let paired = ablation_rows(&rows, "gau", 512, Pairing::BySeed);
        assert!((paired[1].ratio.min - 0.99).abs() < 1e-12);
        assert!((paired[1].ratio.max - 105.0 / 104.0).abs() < 1e-12);
        // An ablation below the default's whole range refutes it.
        rows.extend([end("no_gate", 0, 90.0), end("no_gate", 1, 95.0)]);
        let table = ablation_rows(&rows, "gau", 512, Pairing::AllPairs);
        assert_eq!(table[2].verdict(), Verdict::Refuted);
        assert_eq!(every_change_hurts(&table), Some(Verdict::Refuted));
        assert_eq!(ablation_counts(&table), (1, 1, 1));
        assert_eq!(every_change_hurts(&[]), None);
    }

    /// Pairing by seed takes each seed's ratio: here seed 0 and seed 1 each favour `a` by 5%,
    /// while across seeds the runs overlap (the unpaired range straddles 1).
    #[test]
    fn paired_ratios_are_per_seed() {
        let end = |m: &str, seed, ppl| row(m, seed, 10, 1.0, ppl);
        let rows = vec![
            end("a", 0, 95.0),
            end("a", 1, 114.0),
            end("b", 0, 100.0),
            end("b", 1, 120.0),
        ];
        let paired = ppl_ratio(&rows, "a", "b", 512, Pairing::BySeed).unwrap();
        assert!((paired.min - 0.95).abs() < 1e-12 && (paired.max - 0.95).abs() < 1e-12);
        assert_eq!(Verdict::below(&paired, 1.0), Verdict::Reproduced);
        let unpaired = ppl_ratio(&rows, "a", "b", 512, Pairing::AllPairs).unwrap();
        assert_eq!(Verdict::below(&unpaired, 1.0), Verdict::Inconclusive);
        // No seed in common: no paired ratio.
        assert!(ppl_ratio(&rows[1..2], "a", "b", 512, Pairing::BySeed).is_none());
    }

    #[test]
    fn chunking_loss_compares_the_two_ratios_over_every_seed() {
        let mut rows = vec![];
        // Final perplexities: FLASH-Quad 100 / 110, FLASH 105 / 105 (GAU loses 0.95–1.05×),
        // Transformer++ 100 / 100, MC-TFM++ 120 / 132 (the Transformer loses 1.2–1.32×).
        for (model, finals) in [
            ("flash_quad", [100.0, 110.0]),
            ("flash", [105.0, 105.0]),
            ("transformer_plusplus", [100.0, 100.0]),
            ("mc_tfmpp", [120.0, 132.0]),
        ] {
            for (seed, end) in finals.into_iter().enumerate() {
                rows.push(row(model, seed as u64, 1, 1.0, 500.0));
                rows.push(row(model, seed as u64, 2, 2.0, end));
            }
        }
        let c = chunking_loss(&rows, 512, Pairing::AllPairs).unwrap();
        assert!((c.gau.min - 105.0 / 110.0).abs() < 1e-12 && c.gau.max == 1.05);
        assert!((c.transformer.mean - 1.26).abs() < 1e-12);
        assert!(c.transformer_relu2.is_none());
        // Worst case for the claim: 1.2 / 1.05; best: 1.32 / (105 / 110).
        assert!((c.ratio.min - 1.2 / 1.05).abs() < 1e-12, "{:?}", c.ratio);
        assert!((c.ratio.max - 1.32 * 110.0 / 105.0).abs() < 1e-12);
        assert_eq!(Verdict::above(&c.ratio, 1.0), Verdict::Reproduced);
        assert!(chunking_loss(&rows, 1024, Pairing::AllPairs).is_none());
        // Paired by seed: seed 0 (1.2 / 1.05), seed 1 (1.32 / (105 / 110)).
        let p = chunking_loss(&rows, 512, Pairing::BySeed).unwrap();
        assert!((p.ratio.min - 1.2 / 1.05).abs() < 1e-12);
        assert!((p.ratio.max - 1.32 * 110.0 / 105.0).abs() < 1e-12);
    }

    #[test]
    fn verdicts_need_the_whole_range() {
        let r = |min, max| Spread {
            mean: 0.0,
            min,
            max,
        };
        assert_eq!(Verdict::above(&r(1.1, 3.0), 1.0), Verdict::Reproduced);
        assert_eq!(Verdict::above(&r(0.0, 0.9), 1.0), Verdict::Refuted);
        assert_eq!(Verdict::above(&r(0.8, 1.2), 1.0), Verdict::Inconclusive);
        assert_eq!(Verdict::below(&r(0.5, 0.9), 1.0), Verdict::Reproduced);
        assert_eq!(Verdict::below(&r(1.1, 1.5), 1.0), Verdict::Refuted);
        assert_eq!(Verdict::below(&r(0.9, 1.1), 1.0), Verdict::Inconclusive);
    }

    /// The equivalence rule's three outcomes: inside the margin, wholly outside it (on either
    /// side), and straddling its edge.
    #[test]
    fn equivalence_needs_the_whole_range_inside_the_margin() {
        let r = |min, max| Spread {
            mean: 0.0,
            min,
            max,
        };
        assert_eq!(
            Verdict::within(&r(-0.5, 0.8), -1.0, 1.0),
            Verdict::Reproduced
        );
        assert_eq!(Verdict::within(&r(-4.9, -1.2), -1.0, 1.0), Verdict::Refuted);
        assert_eq!(Verdict::within(&r(1.5, 2.0), -1.0, 1.0), Verdict::Refuted);
        // G1's committed 2-seed differences: +0.45 and −4.92.
        assert_eq!(
            Verdict::within(&r(-4.92, 0.45), -1.0, 1.0),
            Verdict::Inconclusive
        );
    }

    #[test]
    fn last_quarter_improvement_is_relative_to_the_three_quarter_loss() {
        let rows: Vec<SweepRow> = (1..=8)
            .map(|s| row("m", 0, s * 10, 0.0, (10.0 - s as f64 * 0.5).exp()))
            .collect();
        let run = &runs(&rows, "m", 512)[0];
        // Step 60 of 80 is the first at 3/4: loss 7.0, final 6.0.
        assert!((run.last_quarter_improvement() - 1.0 / 7.0).abs() < 1e-12);
    }
}
