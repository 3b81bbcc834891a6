//! The GQA paper's uptraining experiments (Table 1 / Figure 3, Figure 4, Figure 5): a multi-head
//! T5.1.1 is pre-trained with span corruption, converted to MQA / GQA-G by pooling its K/V heads
//! (mean, first head or random), uptrained for a fraction α of its pre-training steps on the same
//! objective, fine-tuned on each task, decoded greedily on held-out examples, scored with the
//! paper's metric for that task, and timed per sample.
//!
//! Every stage keeps its own run directory under `<out>/stages/` (or the config's `stages`):
//! checkpoints, `metrics.csv`, the final model in Hugging Face layout under `model/` and, for a
//! fine-tuning stage, its predictions and scored `result.json`. Running the command again resumes
//! an interrupted stage and reuses finished ones; a stage directory made with another configuration
//! is refused. A scored fine-tuning stage is reused from its `result.json` alone, and a model is
//! trained or loaded only when a stage downstream of it has no result yet, so a clone that has the
//! committed results but no weights trains only what is missing. One library for the three
//! experiments; each binary only picks its configs.
//!
//! The files: `config` (what the TOML holds), `stages` (a stage's run directory, decoding and
//! scoring), `pipeline` (`run`), `scores` (`scores.csv`, `baselines.csv`), `render` (`table.md`),
//! `quality` (the G1–G3 verdicts), `decode` (Figure 6: decoding time against the K/V groups) and
//! `decode_render` (its table, charts and readers).

pub mod config;
pub mod decode;
pub mod decode_render;
mod dry_run;
pub mod pipeline;
pub mod quality;
mod render;
mod scale;
pub mod scores;
mod stages;

pub use self::config::{PipelineConfig, SizeConfig};
pub use self::decode::GqaDecode;
pub use self::render::render;
pub use self::scores::{
    BaselineRow, COPY_INPUT, MOST_FREQUENT, ScoreRow, average_scores, read_scores,
};

use std::path::Path;

use anyhow::Result;

use crate::Cli;
use crate::dry_run::DryRun;
use crate::experiment::Experiment;

/// The GQA paper's uptraining experiments (Table 1 / Figure 3, Figure 4, Figure 5): which models,
/// conversions, proportions and tasks is the config's.
pub struct GqaPipeline;

impl Experiment for GqaPipeline {
    type Config = PipelineConfig;

    fn check(&self, cli: &Cli, config: &PipelineConfig) -> Result<()> {
        config.validate()?;
        cli.one_device()?;
        Ok(())
    }

    fn plan(&self, cli: &Cli, config: &PipelineConfig, mode: DryRun) -> Result<()> {
        dry_run::dry_run_pipeline(cli, config, mode)
    }

    fn execute(&self, cli: &Cli, config: PipelineConfig) -> Result<()> {
        pipeline::run(cli, &config)
    }

    fn render(&self, out: &Path) -> Result<()> {
        render(out)
    }

    fn scale(&self, dir: &Path) -> Result<String> {
        Ok(scale::scale(dir)?.show())
    }
}
