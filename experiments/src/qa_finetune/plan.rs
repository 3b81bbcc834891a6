//! `--dry-run` of Table 4's fine-tuning stage.

use anyhow::Result;
use model::Direction;

use super::{Table4Config, train_config};
use crate::Cli;
use crate::lm_sweep::LmSweepConfig;

/// `--dry-run` of the fine-tuning stage (the pre-training sweep's plan is printed before it):
/// per model, the pre-trained model fine-tuned on `batch` sequences of the context, and the
/// decoding cache of a greedy answer. The real step (`step`) fine-tunes the model as a causal LM on
/// one synthetic sequence: the QA task's loss has the same shapes with a weight per token.
pub(super) fn dry_run_finetune(
    cli: &Cli,
    config: &Table4Config,
    pre_config: &LmSweepConfig,
    devices: &[burn::tensor::Device],
    mode: crate::dry_run::DryRun,
) -> Result<()> {
    let build_device = devices[0].clone().without_autodiff();
    let mut plans = Vec::new();
    let mut model_configs = Vec::new();
    for name in &config.models {
        let model_config = crate::lm_sweep::planned_model(pre_config, name, config.context)?;
        let model = model_config.init(Direction::Causal, &build_device);
        let (params, optimizer_floats) = crate::dry_run::param_stats(&model, &config.optimizer);
        let tokens = config.batch * config.context;
        plans.push(crate::dry_run::RunPlan {
            label: format!("{name} QA fine-tuning @ {}", config.context),
            runs: pre_config.seeds.len(),
            params,
            tokens_per_step: tokens,
            steps: config.steps,
            optimizer_floats,
            activation_floats: model_config.activation_floats_per_token(config.context)
                * tokens as f64,
            kv_cache_floats: model_config.kv_cache_floats_per_sequence(config.context),
            train_flops: model_config.train_flops_per_step(config.batch, config.context)
                * config.steps as f64,
            step_seconds: None,
        });
        model_configs.push(model_config);
    }
    crate::dry_run::print(cli, &format!(": fine-tuning on {}", config.dataset), &plans);
    crate::dry_run::print_data(
        &data::source::SourceOptions::from_config(&config.data_dir, &config.data_dirs)?,
        &[(
            config.dataset.as_str(),
            &[data::Split::Train, data::Split::Validation],
        )],
    )?;
    if mode == crate::dry_run::DryRun::Step {
        let train = train_config(config, 0);
        for (plan, model_config) in plans.iter().zip(&model_configs) {
            crate::dry_run::real_lm_step(plan, model_config, false, &train, &devices[0])?;
        }
    }
    Ok(())
}
