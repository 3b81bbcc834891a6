//! The layer-ablation artifacts (FLASH Tables 1 and 2): each variant of the sweep changes one
//! component of the default layer; `table.md` gets its ratio to the default per context with the
//! F8 verdict, and `ablation_<context>.png` the same ratios as a dot plot. Also the chart label of
//! any model of a sweep (the paper's name, or what a variant changes).

use std::path::Path;

use anyhow::Result;
use report::board::Outcome;
use report::dots::{DotPlot, DotRow};
use report::quality::display_name;

use super::config::LmSweepConfig;
use crate::verdict::{
    Pairing, Spread, SweepRow, Verdict, ablation_counts, ablation_rows, every_change_hurts,
    final_ppls,
};

/// A model's name on the sweep's charts: the paper's name of a model; for a variant what it
/// changes (`d_qk = 64`), after its base model's name when that is not the baseline
/// (`FLASH (chunk_size = 512)` in a sweep of Transformer++); a variant of another architecture
/// with no field changed, that architecture's name.
pub(crate) fn label(config: &LmSweepConfig, model: &str) -> String {
    match config.variants.iter().find(|v| v.name == model) {
        Some(v) if v.set.is_empty() || v.model == config.baseline => change(config, model),
        Some(v) => format!("{} ({})", display_name(&v.model), change(config, model)),
        None => display_name(model).to_string(),
    }
}

/// What an ablation changes, for the dot plot's rows: the fields it sets (`d_qk = 64`), or the
/// architecture it swaps in (`Transformer+`).
fn change(config: &LmSweepConfig, model: &str) -> String {
    match config.variants.iter().find(|v| v.name == model) {
        Some(v) if v.set.is_empty() => display_name(&v.model).to_string(),
        Some(v) => v
            .set
            .iter()
            .map(|(k, x)| format!("{k} = {x}"))
            .collect::<Vec<_>>()
            .join(", "),
        None => display_name(model).to_string(),
    }
}

/// `ablation_<context>.png/svg`: per context, every ablation's final perplexity over the default's
/// (mean and range, paired as the table pairs them), coloured by its row's outcome.
pub(crate) fn charts(out: &Path, rows: &[SweepRow], config: &LmSweepConfig) -> Result<()> {
    let pairing = Pairing::of(config.train_order);
    let contexts: std::collections::BTreeSet<usize> = rows.iter().map(|r| r.context).collect();
    for c in contexts {
        let table = ablation_rows(rows, &config.baseline, c, pairing);
        if table.is_empty() {
            continue;
        }
        DotPlot {
            title: format!(
                "Every change to {} (context {c}): final perplexity / the default's",
                display_name(&config.baseline)
            ),
            x_label: format!(
                "final perplexity / {}'s (dot: mean; bar: {})",
                display_name(&config.baseline),
                pairing.describe()
            ),
            rows: table
                .iter()
                .map(|r| DotRow {
                    label: change(config, &r.model),
                    mean: r.ratio.mean,
                    min: r.ratio.min,
                    max: r.ratio.max,
                    outcome: match r.verdict() {
                        Verdict::Reproduced => Outcome::Reproduced,
                        Verdict::Inconclusive => Outcome::Inconclusive,
                        Verdict::Refuted => Outcome::Refuted,
                    },
                })
                .collect(),
            outcome_names: [
                "the change hurts".into(),
                "inconclusive".into(),
                "the ablation is better".into(),
            ],
        }
        .save(&out.join(format!("ablation_{c}")))?;
    }
    Ok(())
}

/// The model-config fields a model of the sweep changes from its architecture's preset (the
/// variant's `set`), as `field = value` text; the architecture's name for a plain model whose name
/// differs from the baseline's architecture.
pub(crate) fn what_changes(config: &LmSweepConfig, model: &str) -> String {
    match config.variants.iter().find(|v| v.name == model) {
        Some(v) if v.set.is_empty() => format!("`{}`", v.model),
        Some(v) => {
            let fields: Vec<String> = v.set.iter().map(|(k, x)| format!("{k} = {x}")).collect();
            let base = if v.model == config.baseline {
                String::new()
            } else {
                format!("`{}`, ", v.model)
            };
            format!("{base}{}", fields.join(", "))
        }
        None => format!("`{model}`"),
    }
}

/// The layer-ablation section of `table.md` (FLASH Tables 1 and 2): per context, every model
/// against the baseline (the default layer), and the verdict on F8.
pub(crate) fn table(rows: &[SweepRow], config: &LmSweepConfig) -> String {
    let baseline = &config.baseline;
    let pairing = Pairing::of(config.train_order);
    let contexts: std::collections::BTreeSet<usize> = rows.iter().map(|r| r.context).collect();
    let mut md = format!(
        "\n## Layer ablations\n\n\
         Each model changes one component of the default layer `{baseline}`. Final perplexity / {baseline}'s ({}). Per row:\n\
         `change hurts` when the whole range is above 1, `ablation better` when it is below 1, else `inconclusive`. The\n\
         claim (F8), \"every change hurts\": reproduced only when every row is `change hurts`, refuted when some row is\n\
         `ablation better`, else inconclusive.\n\n\
         | context | model | what changes | seeds | final ppl | / {baseline} | row |\n\
         |---|---|---|---|---|---|---|\n",
        pairing.describe()
    );
    for c in contexts {
        let table = ablation_rows(rows, baseline, c, pairing);
        let base = final_ppls(rows, baseline, c);
        md += &format!(
            "| {c} | **{baseline}** | (the default) | {} | {} | 1 | — |\n",
            base.len(),
            Spread::of(&base).show(2)
        );
        for r in &table {
            let ppl = final_ppls(rows, &r.model, c);
            md += &format!(
                "| {c} | {} | {} | {} | {} | {}× | {} |\n",
                r.model,
                what_changes(config, &r.model),
                r.seeds.0,
                Spread::of(&ppl).show(2),
                r.ratio.show(3),
                match r.verdict() {
                    Verdict::Reproduced => "change hurts",
                    Verdict::Refuted => "ablation better",
                    Verdict::Inconclusive => "inconclusive",
                }
            );
        }
        if let Some(v) = every_change_hurts(&table) {
            let (worse, unsure, better) = ablation_counts(&table);
            md += &format!(
                "\nContext {c}: F8 {v}: of {} ablations, {worse} clearly worse than the default, {unsure} inconclusive, {better} clearly better.\n\n",
                table.len()
            );
        }
    }
    md
}
