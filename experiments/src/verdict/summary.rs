//! Per model and context: its runs, the final perplexity over seeds, the speedup to the baseline's
//! final perplexity over seed pairs and its decomposition, and final-perplexity ratios.

use report::speedup_to_baseline;

use super::rows::{StepCost, SweepRow};
use super::rule::{Pairing, Spread};

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
