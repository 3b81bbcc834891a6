//! `--dry-run` of the pipeline: every stage planned with its memory and FLOPs, or one real step of
//! each (`--dry-run=step`).

use anyhow::Result;
use data::registry::Split;
use data::source::SourceOptions;
use model::t5::T5Config;
use training::trainer::TrainConfig;

use super::config::{PipelineConfig, StageConfig};
use crate::Cli;
use crate::dry_run::RunPlan;

/// `--dry-run` of the pipeline: every stage it would train (pre-training per size without a
/// checkpoint, uptraining per converted model, fine-tuning per model and task) built on the
/// device and planned, the decoding cache per example beside the fine-tuned models; with `step`,
/// one real step of each stage on one synthetic example.
pub(super) fn dry_run_pipeline(
    cli: &Cli,
    config: &PipelineConfig,
    mode: crate::dry_run::DryRun,
) -> Result<()> {
    use crate::dry_run::{SyntheticSeq2Seq, real_step};
    let device = cli.one_device()?.train_device()?;
    let stages = planned_stages(config, &device.clone().without_autodiff())?;
    let plans: Vec<RunPlan> = stages.iter().map(|(p, ..)| p.clone()).collect();
    crate::dry_run::print(cli, "", &plans);
    let both = [Split::Train, Split::Validation];
    let reads: Vec<(&str, &[Split])> = std::iter::once(config.corpus.as_str())
        .chain(config.tasks.iter().map(|t| t.dataset.as_str()))
        .map(|d| (d, &both[..]))
        .collect();
    crate::dry_run::print_data(
        &SourceOptions::from_config(&config.data_dir, &config.data_dirs)?,
        &reads,
    )?;
    if mode == crate::dry_run::DryRun::Step {
        for (p, t5, train, (s, t)) in &stages {
            let estimate = p.bytes_with_activations(t5.activation_floats(1, *s, *t));
            real_step(
                &p.label,
                (estimate, s + t),
                || t5.init(&device),
                SyntheticSeq2Seq::new(*s, *t, t5.vocab_size),
                train,
                &device,
            )?;
        }
    }
    Ok(())
}

/// Whether a planned stage's model decodes (fine-tuning: its decoding cache is planned too).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Decodes {
    Yes,
    No,
}

/// A planned stage: its plan, model, training config and (input, target) lengths.
type PlannedStage = (RunPlan, T5Config, TrainConfig, (usize, usize));

/// Every stage the pipeline would train, in order, each model built on `build` to count it.
fn planned_stages(
    config: &PipelineConfig,
    build: &burn::prelude::Device,
) -> Result<Vec<PlannedStage>> {
    use crate::dry_run::param_stats;
    let vocab = crate::dry_run::vocab_size(&config.tokenizer)?;
    let span_targets = config.pretrain_objective.target_length(config.input_length);
    let mut stages: Vec<PlannedStage> = Vec::new();
    let mut plan = |(label, runs): (String, usize),
                    t5: T5Config,
                    (stage, train): (&StageConfig, TrainConfig),
                    (s, t): (usize, usize),
                    decodes: Decodes| {
        let (params, optimizer_floats) = param_stats(&t5.init(build), &stage.optimizer);
        stages.push((
            RunPlan {
                label,
                runs,
                params,
                tokens_per_step: stage.batch * (s + t),
                steps: train.steps,
                optimizer_floats,
                activation_floats: t5.activation_floats(stage.batch, s, t),
                kv_cache_floats: if decodes == Decodes::Yes {
                    t5.kv_cache_floats_per_sequence(s, t)
                } else {
                    0.0
                },
                train_flops: t5.train_flops(stage.batch, s, t) * train.steps as f64,
                step_seconds: None,
            },
            t5,
            train,
            (s, t),
        ));
    };
    let span = (config.input_length, span_targets);
    // Uptraining and fine-tuning run once per replicate.
    let replicates = config.replicate_seeds().len();
    let mut sizes_done = Vec::new();
    for m in &config.models {
        let t5 = config
            .t5(&m.size, config.pretrain.dropout)?
            .with_vocab_size(vocab);
        if config.sizes[&m.size].checkpoint.is_none() && !sizes_done.contains(&m.size) {
            sizes_done.push(m.size.clone());
            let warmup = &config.copy_warmup;
            if warmup.steps > 0 {
                let stage = warmup.stage(&config.pretrain);
                let train = warmup.train(&config.pretrain, config.seed);
                let len = warmup.length + 1;
                plan(
                    (format!("copy warm-up {}", m.size), 1),
                    t5.clone(),
                    (&stage, train),
                    (len, len),
                    Decodes::No,
                );
            }
            let train = config.pretrain.train(config.pretrain.steps, config.seed);
            plan(
                (format!("pretrain {}", m.size), 1),
                t5.clone(),
                (&config.pretrain, train),
                span,
                Decodes::No,
            );
        }
        let t5 = match m.kv_heads {
            Some(groups) => t5.with_n_kv_heads(groups),
            None => t5,
        };
        let steps = (m.alpha * config.pretrain.steps as f64).round() as usize;
        if m.kv_heads.is_some() && steps > 0 {
            plan(
                (format!("uptrain {}", m.name), replicates),
                t5.clone(),
                (&config.pretrain, config.uptrain(steps, config.seed)),
                span,
                Decodes::No,
            );
        }
        for task in &config.tasks {
            let train = config.finetune.train(config.finetune.steps, config.seed);
            plan(
                (format!("finetune {} on {}", m.name, task.name), replicates),
                t5.clone().with_dropout(config.finetune.dropout),
                (&config.finetune, train),
                (task.input_length, task.target_length),
                Decodes::Yes,
            );
        }
    }
    Ok(stages)
}
