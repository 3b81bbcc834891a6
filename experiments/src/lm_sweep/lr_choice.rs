//! Peak learning rates chosen per model and context on the validation split, apart from the test
//! split the curves and verdicts read (an LM sweep's `lr_grid`).
//!
//! Each model of the sweep's `models` trains its first seed at every rate of the grid; the rate
//! whose run ends with the lowest validation loss (the trainer's `select_loss`) is the model's, and
//! its other seeds train there. A choice at the grid's edge says the grid is too narrow: the sweep
//! refuses to go on until the grid is widened. The second-best rate is kept to tell whether a
//! verdict survives a change of rate (the "robust to the rate" column).

use std::fmt::Write as _;

use std::path::Path;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::config::{EvalSplit, LmSweepConfig};
use crate::verdict::SweepRow;

/// A grid run whose training loss stopped being finite: its rate lost (validation perplexity
/// +∞). A row of a sweep's `diverged.csv`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DivergedRun {
    pub model: String,
    pub context: usize,
    pub seed: u64,
    pub peak_lr: f64,
    /// The step whose loss was not finite.
    pub step: usize,
}

/// The file of a sweep's diverged grid runs.
pub const DIVERGED: &str = "diverged.csv";

/// The diverged grid runs of the sweep in `out` (none when it has no `diverged.csv`).
pub fn read_diverged(out: &Path) -> Result<Vec<DivergedRun>> {
    let path = out.join(DIVERGED);
    if !path.exists() {
        return Ok(Vec::new());
    }
    crate::read_csv(&path)
}

/// One model's rate at one context, chosen on validation.
#[derive(Clone, Debug, PartialEq)]
pub struct RateChoice {
    pub model: String,
    pub context: usize,
    /// Every rate of the grid with the final validation perplexity of its first-seed run.
    pub grid: Vec<(f64, f64)>,
    /// The rate of the lowest validation perplexity.
    pub chosen: f64,
    /// The rate of the second lowest.
    pub second: f64,
}

impl RateChoice {
    /// The chosen rate lies strictly inside the grid (not its lowest or highest rate).
    pub fn interior(&self) -> bool {
        let lo = self.grid.iter().map(|g| g.0).fold(f64::INFINITY, f64::min);
        let hi = self
            .grid
            .iter()
            .map(|g| g.0)
            .fold(f64::NEG_INFINITY, f64::max);
        self.chosen > lo && self.chosen < hi
    }
}

/// Checks a sweep's `lr_grid` before anything trains.
pub fn check_grid(config: &LmSweepConfig) -> Result<()> {
    let grid = &config.lr_grid;
    if grid.is_empty() {
        return Ok(());
    }
    if grid.len() < 3 {
        bail!(
            "lr_grid {grid:?} has {} rates; give at least 3, so that the chosen one can lie inside it",
            grid.len()
        );
    }
    if grid.iter().any(|&lr| !(lr.is_finite() && lr > 0.0)) || grid.windows(2).any(|w| w[0] >= w[1])
    {
        bail!("lr_grid {grid:?} must be positive learning rates in increasing order");
    }
    if config.eval_split != EvalSplit::Test {
        bail!(
            "lr_grid chooses rates on the validation split, which the curves read too: set eval_split = \"test\""
        );
    }
    if !config.peak_lr_by_model.is_empty() {
        bail!(
            "lr_grid and peak_lr_by_model both set rates: give one (lr_grid chooses every model's rate)"
        );
    }
    Ok(())
}

/// The final row of `model`'s run at (`context`, `seed`, `lr`), if the rows hold one.
fn final_row<'a>(
    rows: &'a [SweepRow],
    (model, context, seed): (&str, usize, u64),
    lr: f64,
) -> Option<&'a SweepRow> {
    rows.iter()
        .filter(|r| {
            r.model == model && r.context == context && r.seed == seed && r.peak_lr == Some(lr)
        })
        .max_by_key(|r| r.metrics.step)
}

/// Every model's choice at every context of the sweep, from the grid runs in `rows` and those
/// that diverged (validation perplexity +∞); an error naming the first grid run that has not
/// finished or has no validation loss.
pub fn choose(
    rows: &[SweepRow],
    diverged: &[DivergedRun],
    config: &LmSweepConfig,
) -> Result<Vec<RateChoice>> {
    let seed = config.seeds[0];
    let mut out = Vec::new();
    for &context in &config.contexts {
        for model in &config.models {
            let mut grid = Vec::new();
            for &lr in &config.lr_grid {
                let lost = diverged.iter().any(|d| {
                    &d.model == model && d.context == context && d.seed == seed && d.peak_lr == lr
                });
                if lost {
                    grid.push((lr, f64::INFINITY));
                    continue;
                }
                let row = final_row(rows, (model, context, seed), lr)
                    .filter(|r| r.metrics.step == config.steps);
                let Some(loss) = row.and_then(|r| r.metrics.select_loss) else {
                    bail!(
                        "{model} @ {context}, seed {seed}, peak_lr {lr}: no finished grid run with a validation loss"
                    );
                };
                grid.push((lr, loss.exp()));
            }
            let mut order: Vec<&(f64, f64)> = grid.iter().collect();
            order.sort_by(|a, b| a.1.total_cmp(&b.1));
            out.push(RateChoice {
                model: model.clone(),
                context,
                chosen: order[0].0,
                second: order[1].0,
                grid,
            });
        }
    }
    Ok(out)
}

/// An error naming every choice at the grid's edge (the grid must be widened past it).
pub fn check_interior(choices: &[RateChoice], grid: &[f64]) -> Result<()> {
    let edge: Vec<String> = choices
        .iter()
        .filter(|c| !c.interior())
        .map(|c| format!("{} @ {}: {}", c.model, c.context, c.chosen))
        .collect();
    if !edge.is_empty() {
        bail!(
            "the lowest validation perplexity lies at the edge of lr_grid {grid:?} for {}; widen lr_grid past it and run again (the runs trained so far are kept)",
            edge.join(", ")
        );
    }
    Ok(())
}

/// The chosen rate of `model` at `context`: its own choice, or for a model that does not choose
/// (a one-seed reference, a variant) the baseline's.
pub fn rate_of(choices: &[RateChoice], baseline: &str, model: &str, context: usize) -> Option<f64> {
    let of = |m: &str| {
        choices
            .iter()
            .find(|c| c.model == m && c.context == context)
            .map(|c| c.chosen)
    };
    of(model).or_else(|| of(baseline))
}

/// The rows the verdicts read: every model's runs at its chosen rate (all of `rows` when the sweep
/// chooses no rate).
pub fn at_chosen_rates(
    rows: &[SweepRow],
    diverged: &[DivergedRun],
    config: &LmSweepConfig,
) -> Result<Vec<SweepRow>> {
    if config.lr_grid.is_empty() {
        return Ok(rows.to_vec());
    }
    let choices = choose(rows, diverged, config)?;
    Ok(rows
        .iter()
        .filter(|r| r.peak_lr == rate_of(&choices, &config.baseline, &r.model, r.context))
        .cloned()
        .collect())
}

/// `chosen` (the rows at the chosen rates) with `choice`'s model at its context replaced by its
/// runs at its second-best rate (the first seed only: the grid's run).
pub fn at_second_rate(all: &[SweepRow], chosen: &[SweepRow], choice: &RateChoice) -> Vec<SweepRow> {
    let this = |r: &SweepRow| r.model == choice.model && r.context == choice.context;
    chosen
        .iter()
        .filter(|r| !this(r))
        .chain(
            all.iter()
                .filter(|r| this(r) && r.peak_lr == Some(choice.second)),
        )
        .cloned()
        .collect()
}

/// The rate-choice section of a sweep's `table.md`: per model and context, the grid's validation
/// perplexities, the chosen and second-best rates.
pub fn table(choices: &[RateChoice], config: &LmSweepConfig) -> String {
    let mut md = format!(
        "\n## Peak learning rates, chosen on the validation split\n\n\
         Each model of {:?} trained its first seed (seed {}) at every peak rate of the grid {:?}; the table gives each\n\
         run's final perplexity on the validation split (the curves and verdicts above read the test split). The rate of\n\
         the lowest is the model's (bold), and its other seeds trained there; the others ({}) train at the rate\n\
         {} chose. `robust to the rate` in the table above: whether a verdict is the same with the model's runs at its\n\
         second-best rate (its first seed only) in place of its chosen ones.\n\n\
         | model | context |",
        config.models,
        config.seeds[0],
        config.lr_grid,
        if config.one_seed_models.is_empty() && config.variants.is_empty() {
            "none".to_string()
        } else {
            "one-seed references and variants".to_string()
        },
        config.baseline,
    );
    for lr in &config.lr_grid {
        let _ = write!(md, " {lr} |");
    }
    md += " chosen | second |\n|---|---|";
    md += &"---|".repeat(config.lr_grid.len() + 2);
    md += "\n";
    for c in choices {
        let _ = write!(md, "| {} | {} |", c.model, c.context);
        for (lr, ppl) in &c.grid {
            if ppl.is_infinite() {
                md += " diverged |";
            } else if *lr == c.chosen {
                let _ = write!(md, " **{ppl:.2}** |");
            } else {
                let _ = write!(md, " {ppl:.2} |");
            }
        }
        let edge = if c.interior() { "" } else { " (grid's edge)" };
        let _ = writeln!(md, " {}{edge} | {} |", c.chosen, c.second);
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use training::trainer::MetricsRow;

    fn row(model: &str, seed: u64, lr: f64, select: f64) -> SweepRow {
        SweepRow {
            model: model.into(),
            context: 512,
            seed,
            run: String::new(),
            peak_lr: Some(lr),
            metrics: MetricsRow {
                step: 10,
                tokens: 0,
                device_hours: 1.0,
                flops: 0.0,
                train_loss: 0.0,
                eval_loss: 1.0,
                eval_ppl: 1f64.exp(),
                tokens_per_s: 0.0,
                lr: 0.0,
                select_loss: Some(select),
            },
        }
    }

    fn config(grid: &[f64]) -> LmSweepConfig {
        let profile = crate::Profile::Smoke;
        let text = crate::configs::builtin("fig6", profile).expect("fig6 smoke");
        let table =
            crate::configs::resolve(text.parse().expect("toml"), profile, "fig6").expect("resolve");
        let mut c: LmSweepConfig = toml::Value::Table(table).try_into().expect("LmSweepConfig");
        c.models = vec!["transformer_plusplus".into(), "flash".into()];
        c.one_seed_models = vec!["performer".into()];
        c.baseline = "transformer_plusplus".into();
        c.contexts = vec![512];
        c.seeds = vec![0, 1];
        c.steps = 10;
        c.lr_grid = grid.to_vec();
        c.eval_split = EvalSplit::Test;
        c.peak_lr_by_model.clear();
        c
    }

    #[test]
    fn the_lowest_validation_loss_chooses_and_others_follow_the_baseline() {
        let c = config(&[0.001, 0.003, 0.01]);
        let rows = vec![
            row("transformer_plusplus", 0, 0.001, 5.0),
            row("transformer_plusplus", 0, 0.003, 4.8),
            row("transformer_plusplus", 0, 0.01, 4.9),
            row("transformer_plusplus", 1, 0.003, 4.7),
            row("flash", 0, 0.001, 5.2),
            row("flash", 0, 0.003, 4.6),
            row("flash", 0, 0.01, 4.5),
            row("performer", 0, 0.003, 5.5),
        ];
        let choices = choose(&rows, &[], &c).unwrap();
        assert_eq!((choices[0].chosen, choices[0].second), (0.003, 0.01));
        assert!(choices[0].interior());
        assert_eq!((choices[1].chosen, choices[1].second), (0.01, 0.003));
        assert!(!choices[1].interior());
        let err = check_interior(&choices, &c.lr_grid)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("flash @ 512: 0.01") && !err.contains("plusplus"),
            "{err}"
        );
        // The verdicts' rows: Transformer++'s two seeds at 0.003, FLASH's at 0.01, Performer at
        // the baseline's rate.
        let kept = at_chosen_rates(&rows, &[], &c).unwrap();
        let keys: Vec<(&str, u64, Option<f64>)> = kept
            .iter()
            .map(|r| (r.model.as_str(), r.seed, r.peak_lr))
            .collect();
        assert_eq!(
            keys,
            [
                ("transformer_plusplus", 0, Some(0.003)),
                ("transformer_plusplus", 1, Some(0.003)),
                ("flash", 0, Some(0.01)),
                ("performer", 0, Some(0.003)),
            ]
        );
        let second = at_second_rate(&rows, &kept, &choices[1]);
        assert!(
            second
                .iter()
                .any(|r| r.model == "flash" && r.peak_lr == Some(0.003))
                && !second
                    .iter()
                    .any(|r| r.model == "flash" && r.peak_lr == Some(0.01))
        );
        // A grid run missing is named.
        let err = choose(&rows[1..], &[], &c).unwrap_err().to_string();
        assert!(err.contains("peak_lr 0.001"), "{err}");
        // A diverged grid run loses: FLASH's 0.01 diverged, so 0.003 is its choice, inside.
        let diverged = [DivergedRun {
            model: "flash".into(),
            context: 512,
            seed: 0,
            peak_lr: 0.01,
            step: 7,
        }];
        let flash_rows: Vec<SweepRow> = rows
            .iter()
            .filter(|r| !(r.model == "flash" && r.peak_lr == Some(0.01)))
            .cloned()
            .collect();
        let choices = choose(&flash_rows, &diverged, &c).unwrap();
        assert_eq!((choices[1].chosen, choices[1].second), (0.003, 0.001));
        assert!(choices[1].interior() && choices[1].grid[2].1.is_infinite());
        assert!(table(&choices, &c).contains("diverged"));
    }

    #[test]
    fn grids_that_cannot_choose_are_refused() {
        assert!(check_grid(&config(&[0.001, 0.003, 0.01])).is_ok());
        assert!(check_grid(&config(&[0.001, 0.003])).is_err());
        assert!(check_grid(&config(&[0.003, 0.001, 0.01])).is_err());
        let mut on_validation = config(&[0.001, 0.003, 0.01]);
        on_validation.eval_split = EvalSplit::Validation;
        assert!(check_grid(&on_validation).is_err());
    }
}
