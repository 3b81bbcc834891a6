//! `run`: the uptraining experiment end to end (pre-train, convert, uptrain, fine-tune, score, time),
//! and its `--dry-run`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Result, anyhow};
use burn::prelude::*;
use data::registry::{self, Split};
use data::source::{SourceOptions, split_files};
use data::tasks::Seq2SeqTask;
use data::tokenize::{self, TokenizerSpec};
use model::t5::{T5Config, T5Model, convert_kv_heads};
use training::t5_task::{
    FineTuneTask, RandomCopyTask, SpanCorruptionTask, first_examples, generate,
};
use training::trainer::{Task, TrainConfig, stop_on_ctrl_c};
use training::write_atomic;

use super::config::{ModelSpec, PipelineConfig, TaskConfig, pretrain_origin};
use super::render::render;
use super::scores::{BaselineRow, ScoreRow, score, trivial_baselines, write_scores};
use super::stages::{
    Scoring, Sources, SpanLosses, Stage, UpstreamModel, load_pretrained, model_key, time_per_sample,
};
use crate::Cli;

/// Runs the pipeline: every stage the config's models need (resuming or reusing what the stage
/// directory holds), scored, timed and rendered.
pub(crate) fn run(cli: &Cli, config: &PipelineConfig) -> Result<()> {
    let options = SourceOptions::from_config(&config.data_dir, &config.data_dirs)?;
    let corpus = registry::lookup(&config.corpus)?;
    let corpus_files = split_files(corpus, Split::Train, &options)?;
    let tokenizer: TokenizerSpec = config.tokenizer.parse()?;
    let tok = tokenize::for_corpus(&tokenizer, corpus, &corpus_files, &options)?;
    let sources = Sources { options, tok };
    let provenance = cli.save_provenance(config)?;
    let device = cli.one_device()?.train_device()?;
    let stop = stop_on_ctrl_c();
    let stages = if config.stages.is_empty() {
        cli.out.join("stages")
    } else {
        PathBuf::from(&config.stages)
    };
    // Every model's held-out span-corruption loss is read on uptraining's held-out windows (the
    // same windows and noise for all): the multi-head model's, and a converted one's right after
    // conversion (α = 0) and after uptraining.
    let held_out = RefCell::new(SpanCorruptionTask::new(
        sources.data(&config.corpus)?,
        config.pretrain.batch,
        config.input_length,
        config.pretrain.eval_size,
        (config.seed.wrapping_add(1), config.pretrain_objective),
    )?);
    let mut pipeline = Pipeline {
        config,
        sources,
        stages,
        device: &device,
        stop: &stop,
        sizes: BTreeMap::new(),
        pretrained_models: RefCell::default(),
        held_out,
    };
    pipeline.resolve_sizes()?;

    crate::write_csv(
        &cli.out.join("baselines.csv"),
        &task_baselines(config, &pipeline.sources)?,
    )?;

    pipeline.announce_reused()?;
    pipeline.finetune_all(&cli.out, &provenance.device)?;
    render(&cli.out)?;
    eprintln!("wrote {}", cli.out.display());
    Ok(())
}

/// The trivial baselines of every task, on the examples the models are scored on.
fn task_baselines(config: &PipelineConfig, sources: &Sources) -> Result<Vec<BaselineRow>> {
    let mut baselines = Vec::new();
    for task_config in &config.tasks {
        let data = sources.data(&task_config.dataset)?;
        let format = Seq2SeqTask {
            input_length: task_config.input_length,
            target_length: task_config.target_length,
        };
        let references: Vec<Vec<String>> = first_examples(
            data.spec,
            data.eval_files.clone(),
            &data.tok,
            format,
            config.score_examples,
        )?
        .into_iter()
        .map(|e| e.references)
        .collect();
        baselines.extend(trivial_baselines(task_config, &data, &references)?);
    }
    Ok(baselines)
}

/// One invocation's shared state: the config, the data, where the stages live, the device, and the
/// models made so far. A stage is only named and recorded until it runs, and it runs (or loads its
/// finished model) only when a stage downstream of it has no scored result yet.
struct Pipeline<'a> {
    config: &'a PipelineConfig,
    sources: Sources,
    /// The stage directories' root.
    stages: PathBuf,
    device: &'a Device,
    stop: &'a Arc<AtomicBool>,
    /// One multi-head model per size used: its config and the record of where it came from (its
    /// pre-training stage, or its given checkpoint).
    sizes: BTreeMap<String, (T5Config, serde_json::Value)>,
    /// The pre-trained model of each size, once made or loaded.
    pretrained_models: RefCell<BTreeMap<String, T5Model>>,
    /// Uptraining's held-out windows, the same for every model.
    held_out: RefCell<SpanCorruptionTask>,
}

/// What a fine-tuned model's score row records beside its score.
struct Scored<'r> {
    model: &'r ModelSpec,
    seed: u64,
    task: &'r TaskConfig,
    kv_heads: usize,
    losses: &'r SpanLosses,
    /// The device the row was computed on, as `env.json` names it.
    device: &'r str,
}

impl<'a> Pipeline<'a> {
    /// A pre-training or uptraining stage: span corruption on the corpus with the pre-training
    /// schedule.
    fn span_stage(
        &self,
        (dir, label): (String, String),
        origin: serde_json::Value,
        train: TrainConfig,
        t5: &T5Config,
    ) -> Stage<'a> {
        let c = self.config;
        let span_targets = c.pretrain_objective.target_length(c.input_length);
        Stage {
            dir: self.stages.join(dir),
            label,
            origin,
            train,
            flops_per_step: t5.train_flops(c.pretrain.batch, c.input_length, span_targets),
            config: t5.clone(),
            device: self.device,
            stop: self.stop,
        }
    }

    /// Span corruption on the corpus, its windows and noise seeded by `data_seed`.
    fn span_task(&self, data_seed: u64) -> Result<SpanCorruptionTask> {
        let c = self.config;
        Ok(SpanCorruptionTask::new(
            self.sources.data(&c.corpus)?,
            c.pretrain.batch,
            c.input_length,
            c.pretrain.eval_size,
            (data_seed, c.pretrain_objective),
        )?
        .with_random_copy(c.pretrain_random_copy))
    }

    /// The copy warm-up before pre-training (none when `copy_warmup.steps` is 0).
    fn copy_warmup_stage(&self, size: &str, t5: &T5Config) -> Option<Stage<'a>> {
        let c = self.config;
        let warmup = &c.copy_warmup;
        (warmup.steps > 0).then(|| Stage {
            dir: self.stages.join(format!("copy-warmup-{size}")),
            label: format!("copy warm-up {size}"),
            origin: serde_json::json!({ "init": "random", "seed": c.seed }),
            train: warmup.train(&c.pretrain, c.seed),
            flops_per_step: t5.train_flops(warmup.batch, warmup.length + 1, warmup.length + 1),
            config: t5.clone(),
            device: self.device,
            stop: self.stop,
        })
    }

    /// Pre-training from the warm-up's model (or from random weights), recording the warm-up in its
    /// lineage.
    fn pretrain_stage(&self, size: &str, t5: &T5Config, warmup: Option<&Stage>) -> Stage<'a> {
        let c = self.config;
        self.span_stage(
            (format!("pretrain-{size}"), format!("pretrain {size}")),
            pretrain_origin(c, warmup.map(Stage::record)),
            c.pretrain.train(c.pretrain.steps, c.seed),
            t5,
        )
    }

    /// Each size's multi-head config and origin: its pre-training stage's record, or its given
    /// checkpoint (loaded here).
    fn resolve_sizes(&mut self) -> Result<()> {
        let c = self.config;
        let vocab = self.sources.tok.vocab_size();
        for m in &c.models {
            if self.sizes.contains_key(&m.size) {
                continue;
            }
            let t5 = c.t5(&m.size, c.pretrain.dropout)?.with_vocab_size(vocab);
            if let Some(spec) = &c.sizes[&m.size].checkpoint {
                let (t5, model) = load_pretrained(spec, &m.size, t5, self.device)?;
                self.pretrained_models
                    .borrow_mut()
                    .insert(m.size.clone(), model);
                let origin = serde_json::json!({ "checkpoint": spec });
                self.sizes.insert(m.size.clone(), (t5, origin));
                continue;
            }
            let warmup = self.copy_warmup_stage(&m.size, &t5);
            let record = self.pretrain_stage(&m.size, &t5, warmup.as_ref()).record();
            self.sizes.insert(m.size.clone(), (t5, record));
        }
        Ok(())
    }

    /// The pre-trained model of a size: the copy warm-up, then pre-training, each trained here or
    /// reused when finished.
    fn pretrained(&self, size: &str) -> Result<T5Model> {
        if let Some(model) = self.pretrained_models.borrow().get(size) {
            return Ok(model.clone());
        }
        let c = self.config;
        let t5 = &self.sizes[size].0;
        self.device.seed(c.seed);
        let mut init = t5.init(self.device);
        let warmup = self.copy_warmup_stage(size, t5);
        if let Some(stage) = &warmup {
            let w = &c.copy_warmup;
            let mut task = RandomCopyTask::new(
                self.sources.tok.clone(),
                (w.length, w.batch),
                c.pretrain.eval_size,
                c.seed,
            );
            init = stage.run(init, &mut task)?;
        }
        let model = self
            .pretrain_stage(size, t5, warmup.as_ref())
            .run(init, &mut self.span_task(c.seed)?)?;
        self.pretrained_models
            .borrow_mut()
            .insert(size.to_string(), model.clone());
        Ok(model)
    }

    /// A model of replicate `seed` before fine-tuning, as records: its config, where it came from,
    /// and its uptraining stage (none for a multi-head model or α = 0). Conversion and uptraining:
    /// α × the pre-training steps, on other windows of the corpus.
    /// Fine-tuning, decoding, scoring and timing: every model on every task, `scores.csv` in `out`
    /// written as the rows come. `device` names the device in the rows it scores.
    fn finetune_all(&self, out: &Path, device: &str) -> Result<()> {
        // Fine-tuning, decoding, scoring and timing: every model on every task. A fine-tuning stage
        // with a result scored the same way ([`StageResult`]) is reused as it is, so that neither it
        // nor anything upstream of it needs weights: a fresh clone, which has the committed results
        // but no models, trains only what has no result yet.
        let mut rows: Vec<ScoreRow> = Vec::new();
        for seed in self.config.replicate_seeds() {
            for m in &self.config.models {
                let upstream = self.upstream(m, seed)?;
                // Made when the first task without a result needs it.
                let mut start: Option<(T5Model, SpanLosses)> = None;
                for task_config in &self.config.tasks {
                    let stage = self.finetune_stage(m, seed, task_config, &upstream);
                    if let Some(row) = stage.result(&self.scoring())? {
                        eprintln!(
                            "{} on {} (seed {seed}): {} {:.2}, the result in {} (device {})",
                            m.name,
                            task_config.name,
                            row.metric,
                            row.score,
                            stage.dir.display(),
                            row.device
                        );
                        rows.push(ScoreRow {
                            model: m.name.clone(),
                            ..row
                        });
                        write_scores(out, &rows)?;
                        continue;
                    }
                    let (model, losses) = match start.take() {
                        Some(made) => made,
                        None => self.start_model(m, seed, upstream.2.as_ref())?,
                    };
                    let scored = Scored {
                        model: m,
                        seed,
                        task: task_config,
                        kv_heads: upstream.0.n_kv_heads,
                        losses: &losses,
                        device,
                    };
                    let row = self.finetune_and_score(&stage, model.clone(), scored)?;
                    rows.push(row);
                    write_scores(out, &rows)?;
                    start = Some((model, losses));
                }
            }
        }
        Ok(())
    }

    /// Says how many of the fine-tuned models already have a result scored the same way in the
    /// stage directory, which this run reuses instead of training them again (a fresh clone
    /// reuses the committed ones).
    fn announce_reused(&self) -> Result<()> {
        let (mut finished, mut total) = (0, 0);
        for seed in self.config.replicate_seeds() {
            for m in &self.config.models {
                let upstream = self.upstream(m, seed)?;
                for task_config in &self.config.tasks {
                    let stage = self.finetune_stage(m, seed, task_config, &upstream);
                    finished += usize::from(stage.result(&self.scoring())?.is_some());
                    total += 1;
                }
            }
        }
        if finished > 0 {
            eprintln!(
                "{finished} of these {total} fine-tuned models have a result in {} and are reused, \
                 not retrained (`--set stages=DIR` with a new DIR trains every stage anew)",
                self.stages.display()
            );
        }
        Ok(())
    }

    fn upstream(&self, m: &ModelSpec, seed: u64) -> Result<UpstreamModel<'a>> {
        let c = self.config;
        let (t5, pretrain) = self.sizes[&m.size].clone();
        let Some(groups) = m.kv_heads else {
            return Ok((t5, pretrain, None));
        };
        let t5 = t5.with_n_kv_heads(groups);
        let origin = serde_json::json!({
            "from": pretrain,
            "conversion": m.conversion,
            "kv_heads": groups,
            "seed": seed,
        });
        let steps = (m.alpha * c.pretrain.steps as f64).round() as usize;
        if steps == 0 {
            return Ok((t5, origin, None));
        }
        let stage = self.span_stage(
            (
                format!("uptrain-{}{}", model_key(m), c.replicate_suffix(seed)),
                format!("uptrain {} (seed {seed})", m.name),
            ),
            origin,
            c.uptrain(steps, seed),
            &t5,
        );
        Ok((t5, stage.record(), Some(stage)))
    }

    /// The model fine-tuning starts from, and its held-out span losses: the pre-trained model, or
    /// that model converted (seeded by the replicate) and uptrained.
    fn start_model(
        &self,
        m: &ModelSpec,
        seed: u64,
        uptrain: Option<&Stage>,
    ) -> Result<(T5Model, SpanLosses)> {
        let base = self
            .pretrained(&m.size)?
            .with_dropout(self.config.pretrain.dropout);
        let Some(groups) = m.kv_heads else {
            let start = self.held_out.borrow_mut().eval_loss(&base, self.device)?;
            let losses = SpanLosses {
                converted: None,
                start,
            };
            return Ok((base, losses));
        };
        self.device.seed(seed);
        let converted = convert_kv_heads(base, groups, m.conversion()?).map_err(|e| anyhow!(e))?;
        let at_conversion = self
            .held_out
            .borrow_mut()
            .eval_loss(&converted, self.device)?;
        eprintln!(
            "{} (seed {seed}): held-out span loss right after conversion {at_conversion:.4}",
            m.name
        );
        let Some(stage) = uptrain else {
            let losses = SpanLosses {
                converted: Some(at_conversion),
                start: at_conversion,
            };
            return Ok((converted, losses));
        };
        let model = stage.run(converted, &mut self.span_task(seed.wrapping_add(1))?)?;
        let losses = SpanLosses {
            converted: Some(at_conversion),
            start: self.held_out.borrow_mut().eval_loss(&model, self.device)?,
        };
        Ok((model, losses))
    }

    /// How every fine-tuned model is scored.
    fn scoring(&self) -> Scoring {
        Scoring {
            score_examples: self.config.score_examples,
            inference_batch: self.config.inference_batch,
        }
    }

    /// The fine-tuning stage of `m` (replicate `seed`) on `task_config`.
    fn finetune_stage(
        &self,
        m: &ModelSpec,
        seed: u64,
        task_config: &TaskConfig,
        (t5, origin, _): &UpstreamModel,
    ) -> Stage<'a> {
        let c = self.config;
        let t5_ft = t5.clone().with_dropout(c.finetune.dropout);
        let dir = self.stages.join(format!(
            "finetune-{}-{}{}",
            model_key(m),
            task_config.name,
            c.replicate_suffix(seed)
        ));
        Stage {
            label: format!("finetune {} on {} (seed {seed})", m.name, task_config.name),
            origin: serde_json::json!({
                "from": origin, "task": task_config, "shuffle_buffer": c.shuffle_buffer,
            }),
            train: c.finetune.train(c.finetune.steps, seed),
            flops_per_step: t5_ft.train_flops(
                c.finetune.batch,
                task_config.input_length,
                task_config.target_length,
            ),
            config: t5_ft,
            dir,
            device: self.device,
            stop: self.stop,
        }
    }

    /// Fine-tunes `model` in `stage`, decodes the scored examples greedily, scores and times them,
    /// and saves the predictions and the stage's result.
    fn finetune_and_score(
        &self,
        stage: &Stage,
        model: T5Model,
        scored: Scored,
    ) -> Result<ScoreRow> {
        let c = self.config;
        let (m, seed, task_config) = (scored.model, scored.seed, scored.task);
        let format = Seq2SeqTask {
            input_length: task_config.input_length,
            target_length: task_config.target_length,
        };
        let data = self.sources.data(&task_config.dataset)?;
        let examples = first_examples(
            data.spec,
            data.eval_files.clone(),
            &data.tok,
            format,
            c.score_examples,
        )?;
        let shuffle = data::epochs::Shuffle {
            buffer: c.shuffle_buffer,
            seed,
        };
        let mut task = FineTuneTask::new(
            data,
            format,
            (c.finetune.batch, c.finetune.eval_size),
            shuffle,
        )?;
        let tuned = stage.run(model.with_dropout(c.finetune.dropout), &mut task)?;
        let finetune_step = stage.kept_step()?;
        let eval_loss = task.eval_loss(&tuned.valid(), self.device)?;
        let inference = self.device.clone().without_autodiff();
        let tuned = tuned.valid().to_device(&inference);
        let predictions = generate(
            &tuned,
            &examples,
            c.inference_batch,
            task_config.target_length,
            task.tokenizer(),
            &inference,
        )?;
        let s_per_sample = time_per_sample(
            &tuned,
            &examples,
            c.inference_batch,
            task_config.target_length,
            &inference,
        );
        let references: Vec<Vec<String>> = examples.iter().map(|e| e.references.clone()).collect();
        let value = score(task_config.metric, &predictions, &references);
        let lines: String = predictions
            .iter()
            .zip(&references)
            .map(|(p, r)| serde_json::json!({"prediction": p, "references": r}).to_string() + "\n")
            .collect();
        write_atomic(&stage.dir.join("predictions.jsonl"), lines.as_bytes())?;
        eprintln!(
            "{} on {} (seed {seed}): {:?} {value:.2}, {s_per_sample:.4} s/sample",
            m.name, task_config.name, task_config.metric
        );
        let row = ScoreRow {
            model: m.name.clone(),
            size: m.size.clone(),
            kv_heads: scored.kv_heads,
            conversion: if m.kv_heads.is_some() {
                m.conversion.clone()
            } else {
                "-".into()
            },
            alpha: m.alpha,
            seed,
            task: task_config.name.clone(),
            metric: format!("{:?}", task_config.metric).to_lowercase(),
            score: value,
            eval_loss,
            s_per_sample,
            span_loss_converted: scored.losses.converted,
            span_loss: Some(scored.losses.start),
            examples: examples.len(),
            finetune_step: Some(finetune_step),
            device: scored.device.to_string(),
        };
        stage.save_result(&self.scoring(), &row)?;
        Ok(row)
    }
}
