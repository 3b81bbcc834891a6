//! Perplexity against model size (FLASH Figure 3: GAU stacks against MHSA + MLP and MHSA + GLU at
//! every size). A sweep with `table = "scaling"` trains each family (architecture) at several
//! sizes: the plain models at the sweep's `set`, and variants whose `set` changes the size fields;
//! models whose variants change the same fields to the same values are one size. Parameters are
//! counted without the tied token embedding (its size is the vocabulary's, not the layers'), from
//! the model built as its runs are.
//!
//! Claim F7: at every size, FLASH-Quad's final perplexity is within the seed spread of
//! Transformer++'s or better, i.e. the ratio FLASH-Quad / Transformer++ over seed pairs is not
//! entirely above 1.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::Result;
use burn::module::Module;
use model::{Architecture, Direction};
use report::{LineChart, Scale, Series};

use super::config::LmSweepConfig;
use super::models::resolved_models;
use crate::verdict::{PPL_MARGIN, Pairing, Spread, SweepRow, Verdict, final_ppls, ppl_ratio};

/// One model of a scaling sweep at one context.
#[derive(Clone, Debug)]
pub struct SizedModel {
    /// The model's name in the sweep.
    pub name: String,
    /// Its architecture (the chart's line).
    pub family: Architecture,
    /// The size: the variant's `set` as `field = value` text, empty for the sweep's own size.
    pub size: String,
    /// Parameters without the tied token embedding.
    pub params: usize,
}

/// Every model of `config` at `context` with its family, size and parameter count.
pub fn sized_models(config: &LmSweepConfig, context: usize) -> Result<Vec<SizedModel>> {
    let device = burn::tensor::Device::flex();
    resolved_models(config, context)?
        .into_iter()
        .map(|(name, model)| {
            let size = config
                .variants
                .iter()
                .find(|v| v.name == name)
                .map(|v| {
                    let fields: Vec<String> =
                        v.set.iter().map(|(k, x)| format!("{k} = {x}")).collect();
                    fields.join(", ")
                })
                .unwrap_or_default();
            let all = model.init(Direction::Causal, &device).num_params();
            Ok(SizedModel {
                name,
                family: model.arch,
                size,
                params: all - model.vocab_size * model.d_model,
            })
        })
        .collect()
}

/// FLASH-Quad against Transformer++ at one size.
#[derive(Clone, Debug)]
pub struct SizeComparison {
    /// The size (see [`SizedModel::size`]) and its two models.
    pub size: String,
    pub gau: SizedModel,
    pub transformer: SizedModel,
    /// FLASH-Quad's final perplexity / Transformer++'s ([`ppl_ratio`]).
    pub ratio: Spread,
}

impl SizeComparison {
    /// F7 at this size, "competitive": FLASH-Quad not worse than Transformer++ by more than
    /// [`PPL_MARGIN`]. Reproduced when the whole range lies below 1 + the margin, refuted when it
    /// lies wholly above, else inconclusive.
    pub fn verdict(&self) -> Verdict {
        Verdict::below(&self.ratio, 1.0 + PPL_MARGIN)
    }
}

/// FLASH-Quad against Transformer++ at every size where both have runs at `context`, smallest
/// first.
pub fn gau_vs_transformer(
    rows: &[SweepRow],
    models: &[SizedModel],
    context: usize,
    pairing: Pairing,
) -> Vec<SizeComparison> {
    let of = |family, size: &str| {
        models
            .iter()
            .find(|m| m.family == family && m.size == size)
            .cloned()
    };
    let sizes: BTreeSet<&str> = models.iter().map(|m| m.size.as_str()).collect();
    let mut out: Vec<SizeComparison> = sizes
        .into_iter()
        .filter_map(|size| {
            let gau = of(Architecture::FlashQuad, size)?;
            let transformer = of(Architecture::TransformerPlusPlus, size)?;
            let ratio = ppl_ratio(rows, &gau.name, &transformer.name, context, pairing)?;
            Some(SizeComparison {
                size: size.to_string(),
                gau,
                transformer,
                ratio,
            })
        })
        .collect();
    out.sort_by_key(|c| c.gau.params);
    out
}

/// The `table.md` section: every model's size and final perplexity per context, then FLASH-Quad
/// against Transformer++ per size with the verdict on F7.
pub fn section(rows: &[SweepRow], config: &LmSweepConfig) -> Result<String> {
    let contexts: BTreeSet<usize> = rows.iter().map(|r| r.context).collect();
    let mut md = String::from(
        "\n## Perplexity against model size (FLASH Figure 3)\n\n\
         Parameters exclude the tied token embedding. A size is the fields a variant changes (blank: the sweep's own\n\
         `set`). Final perplexity: seed mean [min–max]. Chart: `size_<context>.png`.\n\n\
         | context | model | family | size | parameters | seeds | final ppl |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for &c in &contexts {
        let mut models = sized_models(config, c)?;
        models.sort_by_key(|m| (m.family.name(), m.params));
        for m in &models {
            let ppl = final_ppls(rows, &m.name, c);
            if ppl.is_empty() {
                continue;
            }
            md += &format!(
                "| {c} | {} | {} | {} | {} | {} | {} |\n",
                m.name,
                m.family,
                if m.size.is_empty() {
                    "(sweep)"
                } else {
                    &m.size
                },
                m.params,
                ppl.len(),
                Spread::of(&ppl).show(2)
            );
        }
    }
    let pairing = Pairing::of(config.train_order);
    md += &format!(
        "\nF7: FLASH-Quad's final perplexity / Transformer++'s at each size ({}), \"competitive\" with a\n\
         margin of {:.0}%: reproduced when the whole range is below {}, refuted when it is wholly above, else inconclusive.\n\n\
         | context | size | parameters (FLASH-Quad / Transformer++) | FLASH-Quad / Transformer++ | verdict |\n\
         |---|---|---|---|---|\n",
        pairing.describe(),
        100.0 * PPL_MARGIN,
        1.0 + PPL_MARGIN
    );
    for &c in &contexts {
        let models = sized_models(config, c)?;
        for s in gau_vs_transformer(rows, &models, c, pairing) {
            md += &format!(
                "| {c} | {} | {} / {} | {}× | {} |\n",
                if s.size.is_empty() {
                    "(sweep)"
                } else {
                    &s.size
                },
                s.gau.params,
                s.transformer.params,
                s.ratio.show(3),
                s.verdict()
            );
        }
    }
    Ok(md)
}

/// Charts `size_<context>`: final perplexity (seed mean) against parameters, one line per family.
pub fn charts(out: &Path, rows: &[SweepRow], config: &LmSweepConfig) -> Result<()> {
    let contexts: BTreeSet<usize> = rows.iter().map(|r| r.context).collect();
    for c in contexts {
        let models = sized_models(config, c)?;
        let mut families: Vec<Architecture> = Vec::new();
        for m in &models {
            if !families.contains(&m.family) {
                families.push(m.family);
            }
        }
        let series: Vec<Series> = families
            .into_iter()
            .map(|f| {
                let mut points: Vec<(f64, f64)> = models
                    .iter()
                    .filter(|m| m.family == f)
                    .filter_map(|m| {
                        let ppl = final_ppls(rows, &m.name, c);
                        (!ppl.is_empty()).then(|| (m.params as f64, Spread::of(&ppl).mean))
                    })
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    name: report::quality::display_name(f.name()).to_string(),
                    points,
                }
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        LineChart {
            title: format!(
                "{} on {}, context {c}: final perplexity vs model size",
                match config.objective {
                    super::config::Objective::Causal => "Causal LM",
                    super::config::Objective::Masked => "Masked LM",
                },
                config.dataset
            ),
            x_label: "parameters (without the token embedding)".into(),
            y_label: "held-out perplexity (seed mean)".into(),
            x_scale: Scale::Log2,
            y_scale: Scale::Log2,
        }
        .save(&out.join(format!("size_{c}")), &series)?;
    }
    Ok(())
}
