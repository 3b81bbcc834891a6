//! Quality vs training cost (the FLASH paper's Figures 5–6 and Tables 3, 12, 13): every model at
//! every context length trained on the same data for the same steps, perplexity against
//! device-hours, and the speedup to reach the baseline's final perplexity. One library for the
//! three experiments; each binary only picks its configs.

use std::path::Path;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, anyhow, bail};
use data::registry::{self, Split};
use data::source::{SourceOptions, split_files};
use data::tokenize::{self, TokenizerSpec};
use model::{Architecture, Direction, ModelConfig};
use report::{LineChart, Scale, Series, speedup_to_baseline};
use serde::{Deserialize, Serialize};
use training::lm_task::{CausalLmTask, LmData, MaskedLmTask};
use training::optimizer::OptimizerConfig;
use training::schedule::{Decay, Schedule};
use training::trainer::{RunOptions, TrainConfig, stop_on_ctrl_c, train};
use training::write_atomic;

use crate::Cli;

/// The training objective of a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Next-token prediction with causal models (Wiki-40B, PG-19: Figure 6, Table 3).
    Causal,
    /// BERT-style masked-token prediction with bidirectional models (C4: Figure 5); perplexity over
    /// the masked tokens only.
    Masked,
}

impl Objective {
    fn direction(self) -> Direction {
        match self {
            Objective::Causal => Direction::Causal,
            Objective::Masked => Direction::Bidirectional,
        }
    }
}

/// One sweep, one file per scale under `experiments/configs/<id>/`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LmSweepConfig {
    /// What the run reproduces and what the paper reports.
    pub description: String,
    /// Causal or masked language modelling.
    pub objective: Objective,
    /// Dataset name (`datasets list`).
    pub dataset: String,
    /// A directory holding the dataset's files in the hub repo's layout (as `datasets --data-dir`);
    /// empty: the Hugging Face cache / hub, or `data/` for the offline corpus.
    pub data_dir: String,
    /// `bytes`, `bpe:N`, `unigram:N`, `file:PATH` or `hub:REPO`.
    pub tokenizer: String,
    /// Architectures by name.
    pub models: Vec<String>,
    /// Extra models: an architecture with some model-config fields changed (e.g. FLASH with chunk
    /// 512), trained and drawn beside the others under their own name.
    #[serde(default)]
    pub variants: Vec<Variant>,
    /// The model whose final perplexity the others must reach (the paper: Transformer++, or
    /// Transformer+ for PG-19).
    pub baseline: String,
    /// Context lengths.
    pub contexts: Vec<usize>,
    /// Model size preset (`tiny`, `latency_bench`, `paper_base`, `paper_large`).
    pub preset: String,
    /// Tokens per batch; batch = max(1, tokens_per_batch / context).
    pub tokens_per_batch: usize,
    /// Optimizer steps per run.
    pub steps: usize,
    pub optimizer: OptimizerConfig,
    pub peak_lr: f64,
    pub warmup_steps: usize,
    pub decay: Decay,
    /// Micro-batches per step.
    pub grad_accum: usize,
    /// Per-parameter gradient-norm clipping; 0 = off.
    pub clip_norm: f32,
    /// Evaluate every this many steps.
    pub eval_every: usize,
    /// Held-out windows (of `context + 1` tokens, or `context` for the masked objective) from the
    /// validation split.
    pub eval_windows: usize,
    /// Checkpoint every this many steps (0 = at the end and on Ctrl-C).
    pub checkpoint_every: usize,
    pub seed: u64,
}

/// A named architecture variant: `set` overrides fields of the preset's [`ModelConfig`] (any of its
/// fields, by name: `chunk_size`, `d_qk`, `expansion_factor`, `scaling`, ...).
///
/// ```toml
/// [[variants]]
/// name = "flash_c512"
/// model = "flash"
/// set = { chunk_size = 512 }
/// ```
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// The name in `metrics.csv`, the charts and `table.md`.
    pub name: String,
    /// The architecture it starts from.
    pub model: String,
    /// Model-config fields to change.
    pub set: toml::Table,
}

impl Variant {
    /// The preset's config with `set` applied; an unknown field or a wrong type is an error that
    /// names the variant.
    fn apply(&self, base: ModelConfig) -> Result<ModelConfig> {
        let mut json = serde_json::to_value(&base)?;
        let fields = json
            .as_object_mut()
            .ok_or_else(|| anyhow!("model config is not a table"))?;
        for (key, value) in &self.set {
            if !fields.contains_key(key) {
                let mut known: Vec<&String> = fields.keys().collect();
                known.sort();
                bail!(
                    "variant `{}`: `{key}` is not a model-config field; known fields: {known:?}",
                    self.name
                );
            }
            fields.insert(key.clone(), serde_json::to_value(value)?);
        }
        serde_json::from_value(json).with_context(|| {
            format!(
                "variant `{}`: a value in `set` has the wrong type",
                self.name
            )
        })
    }
}

/// One row of the sweep's `metrics.csv`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepRow {
    pub model: String,
    pub context: usize,
    pub step: usize,
    pub tokens: u64,
    pub device_hours: f64,
    pub flops: f64,
    pub train_loss: f64,
    pub eval_loss: f64,
    pub eval_ppl: f64,
    pub tokens_per_s: f64,
    pub lr: f64,
}

/// The paper's table that a sweep binary's `table.md` reproduces.
fn paper_table(id: &str) -> String {
    match id {
        "fig5" => "FLASH Table 12 (masked LM, Figure 5)".into(),
        "fig6" => "FLASH Table 13 (causal LM, Figure 6)".into(),
        "table3" => "FLASH Table 3 (causal LM on PG-19)".into(),
        other => format!("`{other}`"),
    }
}

pub fn run(cli: Cli, builtin: &dyn Fn(crate::Profile) -> &'static str) -> Result<()> {
    let table = paper_table(cli.id);
    if cli.report_only {
        return render(&cli.out, &table, None);
    }
    let config: LmSweepConfig = cli.load_config(builtin)?;
    // Before anything is written or a tokenizer trained: a device count the backend cannot give,
    // or a batch it does not divide at some context, is refused up front.
    let devices = cli.train_devices()?;
    let device = devices[0].clone();
    for &context in &config.contexts {
        split_batch(config.tokens_per_batch, context, devices.len())?;
    }
    let spec = registry::lookup(&config.dataset)?;
    let parse = |m: &String| -> Result<Architecture> { m.parse().map_err(|e: String| anyhow!(e)) };
    // (name, architecture, variant): the plain models, then the variants.
    let mut models: Vec<(String, Architecture, Option<&Variant>)> = config
        .models
        .iter()
        .map(|m| Ok((m.clone(), parse(m)?, None)))
        .collect::<Result<_>>()?;
    for v in &config.variants {
        if models.iter().any(|(name, ..)| name == &v.name) {
            bail!("variant name `{}` is already a model of the sweep", v.name);
        }
        models.push((v.name.clone(), parse(&v.model)?, Some(v)));
    }
    if !models.iter().any(|(name, ..)| name == &config.baseline) {
        let names: Vec<&String> = models.iter().map(|(n, ..)| n).collect();
        bail!(
            "baseline `{}` is not one of the models {names:?}",
            config.baseline
        );
    }
    let tokenizer: TokenizerSpec = config.tokenizer.parse()?;
    let source = SourceOptions {
        data_dir: (!config.data_dir.is_empty()).then(|| config.data_dir.clone().into()),
        ..SourceOptions::default()
    };
    let train_files = split_files(spec, Split::Train, &source)?;
    let eval_files = split_files(spec, Split::Validation, &source)?;
    let tok = tokenize::load(
        &tokenizer,
        spec.name,
        &source.local_root.join("tokenizers"),
        || {
            let docs = data::source::ExampleStream::open_at(
                spec,
                train_files.clone(),
                Default::default(),
            )?;
            Ok(Box::new(docs.filter_map(Result::ok).map(|e| e.all_text())))
        },
    )?;
    let tok_description = tok.description.clone();
    std::fs::create_dir_all(&cli.out)
        .with_context(|| format!("cannot create {}", cli.out.display()))?;
    let provenance = cli.save_provenance(&config)?;
    write_atomic(
        &cli.out.join("data.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "dataset": spec.name, "train_split": "train", "eval_split": "validation",
            "train_files": train_files, "eval_files": eval_files, "tokenizer": tok_description,
        }))?
        .as_bytes(),
    )?;
    let stop = stop_on_ctrl_c();
    let mut rows: Vec<SweepRow> = Vec::new();
    for &context in &config.contexts {
        for (name, arch, variant) in &models {
            let (batch, device_batch) =
                split_batch(config.tokens_per_batch, context, devices.len())?;
            let tok = tok.clone();
            let mut model_config = ModelConfig::preset(&config.preset, *arch, context)
                .map_err(|e| anyhow!(e))?
                .with_vocab_size(tok.vocab_size());
            if let Some(v) = variant {
                model_config = v.apply(model_config)?;
            }
            device.seed(config.seed);
            let model = model_config.init(config.objective.direction(), &device);
            let train_config = TrainConfig {
                steps: config.steps,
                optimizer: config.optimizer,
                schedule: Schedule {
                    peak_lr: config.peak_lr,
                    warmup_steps: config.warmup_steps,
                    decay: config.decay,
                },
                grad_accum: config.grad_accum,
                clip_norm: (config.clip_norm > 0.0).then_some(config.clip_norm),
                eval_every: config.eval_every,
                checkpoint_every: config.checkpoint_every,
                seed: config.seed,
            };
            let opts = RunOptions {
                stop: stop.clone(),
                flops_per_step: model_config
                    .train_flops_per_step(batch * config.grad_accum, context),
                label: format!("{name} @ {context}"),
            };
            let run_dir = cli.out.join("runs").join(format!("{name}-{context}"));
            let mut record =
                serde_json::json!({"model": model_config, "train": train_config, "batch": batch});
            // Named only when more than one, so single-device records stay as they were; a run is
            // resumed only on the device count it started with (its device-hours count them).
            if devices.len() > 1 {
                record["devices"] = devices.len().into();
            }
            guard_run_dir(&run_dir, &record)?;
            let data = LmData {
                spec,
                train_files: train_files.clone(),
                eval_files: eval_files.clone(),
                tok,
            };
            let (windows, seed) = (config.eval_windows, config.seed);
            let outcome = match config.objective {
                Objective::Causal => {
                    let mut task = CausalLmTask::new(data, device_batch, context, windows)?;
                    train(&train_config, model, &mut task, &devices, &run_dir, &opts)?
                }
                Objective::Masked => {
                    let mut task = MaskedLmTask::new(data, device_batch, context, windows, seed)?;
                    train(&train_config, model, &mut task, &devices, &run_dir, &opts)?
                }
            };
            rows.extend(outcome.rows.iter().map(|r| SweepRow {
                model: name.clone(),
                context,
                step: r.step,
                tokens: r.tokens,
                device_hours: r.device_hours,
                flops: r.flops,
                train_loss: r.train_loss,
                eval_loss: r.eval_loss,
                eval_ppl: r.eval_ppl,
                tokens_per_s: r.tokens_per_s,
                lr: r.lr,
            }));
            write_rows(&cli.out, &rows)?;
            if outcome.interrupted || stop.load(Ordering::SeqCst) {
                bail!(
                    "interrupted; run the same command again to resume from the checkpoints in {}",
                    cli.out.join("runs").display()
                );
            }
        }
    }
    render(&cli.out, &table, Some(&config.baseline))?;
    eprintln!("wrote {} ({})", cli.out.display(), provenance.device);
    Ok(())
}

/// A run directory resumes only the run it was made for: its resolved model and training config are
/// saved there, and a different one is an error rather than a silent mix.
/// The step's batch in sequences, max(1, tokens_per_batch / context), and each device's share of it:
/// data parallelism splits the batch, so a step sees the same tokens on any number of devices.
fn split_batch(tokens_per_batch: usize, context: usize, devices: usize) -> Result<(usize, usize)> {
    let batch = (tokens_per_batch / context).max(1);
    if !batch.is_multiple_of(devices) {
        bail!(
            "--devices {devices}: a batch of {batch} sequences (tokens_per_batch {tokens_per_batch} / context {context}) does not split evenly; make tokens_per_batch a multiple of context × devices"
        );
    }
    Ok((batch, batch / devices))
}

pub(crate) fn guard_run_dir(dir: &Path, resolved: &serde_json::Value) -> Result<()> {
    let path = dir.join("run_config.json");
    if let Ok(saved) = std::fs::read(&path) {
        let saved: serde_json::Value = serde_json::from_slice(&saved).unwrap_or_default();
        if &saved != resolved {
            bail!(
                "{} holds a run with another configuration; delete it (or pass --out DIR) to start this one",
                dir.display()
            );
        }
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    write_atomic(&path, serde_json::to_string_pretty(resolved)?.as_bytes())
}

fn write_rows(out: &Path, rows: &[SweepRow]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)?;
    }
    write_atomic(&out.join("metrics.csv"), &w.into_inner()?)
}

/// Charts (perplexity vs device-hours, one per context) and `table.md` (the paper's `table`: final
/// perplexity and speedup to the baseline's final perplexity, in device-hours and in steps) from
/// `metrics.csv`.
pub fn render(out: &Path, table: &str, baseline: Option<&str>) -> Result<()> {
    let path = out.join("metrics.csv");
    let rows: Vec<SweepRow> = csv::Reader::from_path(&path)
        .with_context(|| format!("cannot read {}: run the experiment first", path.display()))?
        .deserialize()
        .collect::<Result<_, _>>()
        .with_context(|| format!("malformed {}", path.display()))?;
    let baseline = match baseline {
        Some(b) => b.to_string(),
        None => {
            let config: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join("config.json"))?)?;
            config["baseline"]
                .as_str()
                .unwrap_or("transformer_plusplus")
                .to_string()
        }
    };
    let mut contexts: Vec<usize> = rows.iter().map(|r| r.context).collect();
    contexts.sort_unstable();
    contexts.dedup();
    let mut models: Vec<String> = Vec::new();
    for r in &rows {
        if !models.contains(&r.model) {
            models.push(r.model.clone());
        }
    }
    let runs = |m: &str, c: usize| -> Vec<&SweepRow> {
        rows.iter()
            .filter(|r| r.model == m && r.context == c)
            .collect()
    };
    // (x, perplexity) per evaluation, x = device-hours or training step.
    let curve = |m: &str, c: usize, x: fn(&SweepRow) -> f64| -> Vec<(f64, f64)> {
        runs(m, c).iter().map(|r| (x(r), r.eval_ppl)).collect()
    };
    let by_hours = |r: &SweepRow| r.device_hours;
    let by_step = |r: &SweepRow| r.step as f64;
    let mut md = format!(
        "# {table}: perplexity and speedup to {baseline}'s final perplexity\n\n\
         Final held-out perplexity per model and context, and the speedup: {baseline}'s training time divided by the time\n\
         the model takes to reach {baseline}'s final perplexity (— when it never does; linear between evaluations), in\n\
         device-hours (the paper's measure) and in training steps (the same tokens per step for every model, so the\n\
         implementation's speed drops out). tokens/s: training tokens over training seconds. Generated from `metrics.csv`.\n\n\
         | model | context | steps | device-hours | tokens/s | final ppl | speedup | speedup in steps |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    for &c in &contexts {
        let mut series = Vec::new();
        for m in &models {
            let points = curve(m, c, by_hours);
            let Some(&(hours, ppl)) = points.last() else {
                continue;
            };
            let last = *runs(m, c).last().expect("a point per row");
            let (steps, tokens_per_s) = (last.step, last.tokens_per_s);
            let times = |s: Option<f64>| s.map_or_else(|| "—".into(), |s| format!("{s:.2}×"));
            let speedup = times(speedup_to_baseline(&curve(&baseline, c, by_hours), &points));
            let in_steps = times(speedup_to_baseline(
                &curve(&baseline, c, by_step),
                &curve(m, c, by_step),
            ));
            md += &format!(
                "| {m} | {c} | {steps} | {hours:.3e} | {tokens_per_s:.0} | {ppl:.2} | {speedup} | {in_steps} |\n"
            );
            series.push(Series {
                name: m.clone(),
                points,
            });
        }
        LineChart {
            title: format!("Held-out perplexity vs training cost, context {c}"),
            x_label: "device-hours (training only)".into(),
            y_label: "perplexity".into(),
            x_scale: Scale::Log2,
            y_scale: Scale::Log2,
        }
        .save(&out.join(format!("ppl_vs_hours_{c}")), &series)?;
    }
    write_atomic(&out.join("table.md"), md.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::split_batch;

    #[test]
    fn batch_splits_evenly_over_devices_or_is_refused() {
        assert_eq!(split_batch(4096, 512, 1).unwrap(), (8, 8));
        assert_eq!(split_batch(4096, 512, 2).unwrap(), (8, 4));
        assert_eq!(split_batch(4096, 8192, 1).unwrap(), (1, 1));
        let err = split_batch(4096, 4096, 2).unwrap_err().to_string();
        assert!(err.contains("does not split evenly"), "{err}");
    }
}
