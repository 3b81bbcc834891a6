//! FLASH Table 4: fine-tuning pre-trained causal LMs on question answering (TriviaQA in the paper;
//! the offline extractive task `shakespeare_speaker_qa` at cpu scale), scored with TriviaQA's F1 /
//! EM, with the cost of pre-training and of fine-tuning per model.
//!
//! The pre-trained models are the runs of another LM sweep (`pretrain`, e.g. `table3`) at one
//! context: table4 first runs that sweep restricted to its models and that context (into
//! `<out>/pretrain/`: every run trained or reused from the run store, its step times calibrated,
//! its table rendered), then fine-tunes each run's final weights (`<run>/checkpoint/model.bpk`;
//! the store commits metrics, not weights, so a run trained on another machine must be trained
//! again here, see the error) into `<store>/<arch>_qa-<context>-<hash>/`, generates answers
//! greedily for the held-out questions, scores them, and times every model's fine-tuning step
//! round-robin in one session.
//!
//! Claim F9 ([`f9`], in `outputs.rs` with `table.md` and the chart): the claimed model's F1 within
//! ±[`F1_MARGIN`] of the baseline's over every seed pair, at lower cost (the pre-training step-time
//! ratio baseline / model above 1 over the calibration's interquartile range); inconclusive when
//! the baseline does not clear the trivial baseline.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use model::{Direction, LanguageModel};
use serde::{Deserialize, Serialize};
use training::lm_qa_task::{LmQaFormat, LmQaTask, greedy_answers};
use training::lm_task::LmData;
use training::optimizer::OptimizerConfig;
use training::schedule::{Decay, Schedule};
use training::trainer::{
    KeepModel, MetricsRow, Progress, RunOptions, Stepper, TrainConfig, stop_on_ctrl_c, train,
};
use training::write_json;

mod outputs;
mod plan;

pub use self::outputs::{F1_MARGIN, F9, f9, render, scale};

use self::plan::dry_run_finetune;
use crate::dry_run::DryRun;
use crate::experiment::{Experiment, dispatch};
use crate::lm_sweep::LmSweep;
use crate::lm_sweep::{LmSweepConfig, StoredRun, stored_runs, sweep_data};
use crate::verdict::{StepTime, SweepRow};
use crate::{Cli, Profile, configs, read_csv, run_store};

/// `experiments/configs/table4/<profile>.toml`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table4Config {
    pub description: String,
    /// The LM sweep whose runs are the pre-trained models (its config of the same profile).
    pub pretrain: String,
    /// Fields of the pre-training sweep's config changed (as its `--set` would), e.g.
    /// `{ data_dir = "..." }`.
    #[serde(default)]
    pub pretrain_set: toml::Table,
    /// The pre-training context whose runs are fine-tuned (the QA sequences are at most this long).
    pub context: usize,
    /// The models fine-tuned, by their names in the pre-training sweep (every seed of each).
    pub models: Vec<String>,
    /// The model the others are compared with (the paper: Transformer+).
    pub baseline: String,
    /// The model of claim F9 (the paper: FLASH).
    pub claimed: String,
    /// The QA dataset (`datasets list`).
    pub dataset: String,
    /// A root holding one folder per dataset, `<data_dir>/<dataset>/`, each in the dataset's hub
    /// layout (as `datasets --data-dir`; the offline corpus's folder is `gutenberg_shakespeare`);
    /// empty, or a dataset with no folder there: the Hugging Face cache / hub, or `data/` for the
    /// offline corpus.
    pub data_dir: String,
    /// A dataset's own folder, by dataset name (e.g. `{ pg19 = "/mnt/pg19" }`), read before
    /// `data_dir`.
    #[serde(default)]
    pub data_dirs: BTreeMap<String, String>,
    /// Answer tokens trained and generated at most, EOS included.
    pub answer_length: usize,
    /// Examples per fine-tuning step.
    pub batch: usize,
    /// Fine-tuning steps.
    pub steps: usize,
    pub optimizer: OptimizerConfig,
    pub peak_lr: f64,
    pub warmup_steps: usize,
    pub decay: Decay,
    /// Evaluate the held-out answer loss every this many steps.
    pub eval_every: usize,
    /// Held-out questions: the first this many of the validation split (loss, answers, scores).
    pub eval_examples: usize,
    /// Fine-tuning step-time calibration: timed rounds after one untimed round, every model in
    /// turn (default 9, as the LM sweeps').
    pub timing_rounds: usize,
    /// Fine-tuning examples held in the shuffle buffer, drawn at random with each run's seed (1:
    /// the files' order). Default seqio's 1,000 (`data::epochs::DEFAULT_SHUFFLE_BUFFER`); the paper
    /// does not state its own.
    #[serde(default = "default_shuffle_buffer")]
    pub shuffle_buffer: usize,
}

/// The files' order, where the order does not matter (the held-out set, the timed steps).
const UNSHUFFLED: data::epochs::Shuffle = data::epochs::Shuffle { buffer: 1, seed: 0 };

fn default_shuffle_buffer() -> usize {
    data::epochs::DEFAULT_SHUFFLE_BUFFER
}

/// One fine-tuned run's scores: a row of `scores.csv`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScoreRow {
    pub model: String,
    pub seed: u64,
    /// The pre-training run and the fine-tuning run in the store.
    pub pretrain_run: String,
    pub finetune_run: String,
    /// The pre-training run's final held-out perplexity.
    pub pretrain_ppl: f64,
    /// Held-out answer loss after fine-tuning.
    pub eval_loss: f64,
    /// TriviaQA F1 and EM (×100) over `n` held-out questions.
    pub f1: f64,
    pub exact_match: f64,
    pub n: usize,
}

const SCORES: &str = "scores.csv";
const TRIVIAL: &str = "trivial_baseline.json";

/// The answer a model that ignores the question would give: the training split's most frequent
/// first answer, scored on the held-out questions as the models are.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrivialBaseline {
    pub answer: String,
    pub f1: f64,
    pub exact_match: f64,
}

fn trivial_baseline(
    data: &LmData,
    format: LmQaFormat,
    eval_examples: usize,
) -> Result<TrivialBaseline> {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    let docs = data::source::ExampleStream::open_at(
        data.spec,
        data.train_files.clone(),
        Default::default(),
    )?;
    for example in docs {
        if let data::example::Example::Qa { answers, .. } = example?
            && let Some(a) = answers.into_iter().next()
        {
            *counts.entry(a).or_default() += 1;
        }
    }
    // The most frequent; ties to the first in sort order (deterministic).
    let answer = counts
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(a, _)| a.clone())
        .unwrap_or_default();
    let eval = LmQaTask::new(data.clone(), format, (1, eval_examples), UNSHUFFLED)?;
    let score = metrics::triviaqa::corpus(eval.eval_examples().iter().map(|e| {
        (
            Some(answer.as_str()),
            e.references.iter().map(String::as_str).collect(),
        )
    }));
    Ok(TrivialBaseline {
        answer,
        f1: score.f1,
        exact_match: score.exact_match,
    })
}
const FT_STEP_TIMES: &str = "finetune_step_times.csv";

fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The pre-training sweep's command line: `pretrain`'s config of this profile restricted to the
/// fine-tuned models and the context, into `<out>/pretrain`.
fn pretrain_cli(cli: &Cli, config: &Table4Config) -> Result<Cli> {
    let Some(&id) = configs::IDS.iter().find(|&&i| i == config.pretrain) else {
        bail!(
            "pretrain = `{}` is not an experiment with configs; known: {}",
            config.pretrain,
            configs::IDS.join(", ")
        );
    };
    let list = |names: &[String]| {
        let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
        format!("[{}]", quoted.join(", "))
    };
    Ok(Cli {
        id,
        profile: cli.profile,
        backend: cli.backend,
        devices: cli.devices,
        config: None,
        sets: [
            ("contexts".to_string(), format!("[{}]", config.context)),
            (
                "claimed_faster".into(),
                list(std::slice::from_ref(&config.claimed)),
            ),
            ("baseline".into(), format!("\"{}\"", config.baseline)),
        ]
        .into_iter()
        .chain(
            config
                .pretrain_set
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string())),
        )
        .collect(),
        out: cli.out.join("pretrain"),
        store: cli.store.clone(),
        report_only: cli.report_only,
        print_config: false,
        dry_run: cli.dry_run,
        // table4 trains its pre-training runs itself (`--jobs` is the LM sweeps' option).
        jobs: 1,
        worker: None,
    })
}

fn builtin_of(id: &'static str) -> impl Fn(Profile) -> &'static str {
    move |p| configs::builtin(id, p).expect("an experiment of configs::IDS")
}

/// The fine-tuning schedule of every run, with `seed`.
fn train_config(config: &Table4Config, seed: u64) -> TrainConfig {
    TrainConfig {
        steps: config.steps,
        optimizer: config.optimizer,
        schedule: Schedule::new(config.peak_lr, config.warmup_steps, config.decay),
        grad_accum: 1,
        clip_norm: None,
        eval_every: config.eval_every,
        checkpoint_every: 0,
        seed,
        keep: KeepModel::Last,
    }
}

/// The pre-trained model of `run`, from its final checkpoint.
fn pretrained(run: &StoredRun, device: &burn::tensor::Device) -> Result<LanguageModel> {
    let weights = run.dir.join("checkpoint/model.bpk");
    if !weights.exists() {
        bail!(
            "the pre-trained weights of {} are not on this machine (the run store commits metrics, not weights); delete {} and run again to train it here",
            run.dir.display(),
            run.dir.join("metrics.csv").display()
        );
    }
    Ok(run
        .model_config
        .init(Direction::Causal, device)
        .load_file(weights))
}

/// Table 4 of the FLASH paper: LMs pre-trained by an LM sweep (`pretrain`), fine-tuned on question
/// answering and scored.
pub struct QaFinetune;

impl Experiment for QaFinetune {
    type Config = Table4Config;

    fn check(&self, cli: &Cli, config: &Table4Config) -> Result<()> {
        if !config.models.contains(&config.baseline) || !config.models.contains(&config.claimed) {
            bail!(
                "baseline `{}` and claimed `{}` must be among models {:?}",
                config.baseline,
                config.claimed,
                config.models
            );
        }
        cli.train_devices()?;
        pretrain_cli(cli, config)?;
        Ok(())
    }

    /// The pre-training sweep's plan, then the fine-tuning's.
    fn plan(&self, cli: &Cli, config: &Table4Config, mode: DryRun) -> Result<()> {
        let (pre_cli, pre_config) = pretraining(cli, config)?;
        dispatch(&LmSweep { id: pre_cli.id }, &pre_cli)?;
        dry_run_finetune(cli, config, &pre_config, &cli.train_devices()?, mode)
    }

    fn execute(&self, cli: &Cli, config: Table4Config) -> Result<()> {
        let (pre_cli, pre_config) = pretraining(cli, &config)?;
        dispatch(&LmSweep { id: pre_cli.id }, &pre_cli)?;
        finetune_all(cli, &config, &pre_config)
    }

    fn render(&self, out: &Path) -> Result<()> {
        render(out)
    }

    fn scale(&self, dir: &Path) -> Result<String> {
        scale(dir)
    }
}

/// The pre-training sweep's command line and resolved config.
fn pretraining(cli: &Cli, config: &Table4Config) -> Result<(Cli, LmSweepConfig)> {
    let pre_cli = pretrain_cli(cli, config)?;
    let pre_config: LmSweepConfig = pre_cli.load_config(&builtin_of(pre_cli.id))?;
    Ok((pre_cli, pre_config))
}

/// Fine-tunes and scores every pre-trained run (trained, or reused from the store), times the
/// fine-tuning step of each model, and renders.
fn finetune_all(cli: &Cli, config: &Table4Config, pre_config: &LmSweepConfig) -> Result<()> {
    let devices = cli.train_devices()?;
    let lm_data = sweep_data(pre_config)?;
    let runs: Vec<StoredRun> = stored_runs(
        pre_config,
        &lm_data,
        (&cli.store, devices.len()),
        config.context,
        &cli.out.join("pretrain"),
    )?
    .into_iter()
    .filter(|r| config.models.contains(&r.model))
    .collect();
    for m in &config.models {
        if !runs.iter().any(|r| &r.model == m) {
            bail!("`{m}` is not a model of {}'s sweep", config.pretrain);
        }
    }
    // 2. Fine-tuning data: the QA set with the pre-training tokenizer.
    let qa_data = qa_data(config, &lm_data)?;
    let format = LmQaFormat {
        context: config.context,
        answer_length: config.answer_length,
    };
    std::fs::create_dir_all(&cli.out)?;
    let provenance = cli.save_provenance(config)?;
    // The trivial baseline every model must beat: the training split's most frequent answer.
    let trivial = trivial_baseline(&qa_data, format, config.eval_examples)?;
    write_json(&cli.out.join(TRIVIAL), &trivial)?;
    let stop = stop_on_ctrl_c();
    let mut scores: Vec<ScoreRow> = Vec::new();
    let mut metrics: Vec<SweepRow> = Vec::new();
    let finetune = Finetune {
        config,
        devices: &devices,
        stop: &stop,
        provenance: &provenance,
    };
    for r in &runs {
        let (row, ft_dir) = finetune.scored(r, (&qa_data, format), &cli.store)?;
        metrics.extend(read_metrics(&ft_dir)?.into_iter().map(|m| SweepRow {
            model: r.model.clone(),
            context: config.context,
            seed: r.seed,
            run: row.finetune_run.clone(),
            peak_lr: None,
            metrics: m,
        }));
        scores.push(row);
        crate::write_csv(&cli.out.join(SCORES), &scores)?;
    }
    // `metrics.csv`: the fine-tuning runs' evaluations, in the LM sweeps' layout.
    crate::lm_sweep::write_rows(&cli.out, &metrics)?;
    // 3. Every model's fine-tuning step timed in turn, in this session.
    calibrate_finetune(config, &runs, &qa_data, format, &devices, &cli.out)?;
    render(&cli.out)?;
    eprintln!("wrote {} ({})", cli.out.display(), provenance.device);
    Ok(())
}

/// The QA dataset's splits with the pre-training sweep's tokenizer.
fn qa_data(config: &Table4Config, lm_data: &LmData) -> Result<LmData> {
    let spec = data::registry::lookup(&config.dataset)?;
    let source = data::source::SourceOptions::from_config(&config.data_dir, &config.data_dirs)?;
    Ok(LmData {
        spec,
        train_files: data::source::split_files(spec, data::registry::Split::Train, &source)?,
        eval_files: data::source::split_files(spec, data::registry::Split::Validation, &source)?,
        tok: lm_data.tok.clone(),
    })
}

/// What fine-tuning one pre-trained run needs besides the run.
struct Finetune<'a> {
    config: &'a Table4Config,
    devices: &'a [burn::tensor::Device],
    stop: &'a std::sync::Arc<std::sync::atomic::AtomicBool>,
    provenance: &'a training::Provenance,
}

impl Finetune<'_> {
    /// The fine-tuned, scored model of pre-trained run `r` in the run store `store` (at its
    /// identity's directory): its `scores.json` when finished there, else fine-tuned and scored
    /// now. Returns the row and the directory.
    fn scored(
        &self,
        r: &StoredRun,
        (qa_data, format): (&LmData, LmQaFormat),
        store: &Path,
    ) -> Result<(ScoreRow, std::path::PathBuf)> {
        let config = self.config;
        let identity = serde_json::json!({
            "pretrained": dir_name(&r.dir), "dataset": qa_data.spec.name, "format": format,
            "batch": config.batch, "train": train_config(config, r.seed),
            "eval_examples": config.eval_examples, "shuffle_buffer": config.shuffle_buffer,
        });
        let ft_dir = run_store::run_dir(
            store,
            &format!("{}_qa", r.model_config.arch.name()),
            config.context,
            &identity,
        );
        run_store::claim(&ft_dir, &identity)?;
        let label = format!("{} QA fine-tuning, seed {}", r.model, r.seed);
        let shuffle = data::epochs::Shuffle {
            buffer: config.shuffle_buffer,
            seed: r.seed,
        };
        let mut task = LmQaTask::new(
            qa_data.clone(),
            format,
            (config.batch, config.eval_examples),
            shuffle,
        )?;
        let scores_path = ft_dir.join("scores.json");
        let row: ScoreRow = match std::fs::read(&scores_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("malformed {}", scores_path.display()))?,
            Err(_) => {
                let row = self.run(r, &ft_dir, &mut task, &label)?;
                write_json(&scores_path, &row)?;
                row
            }
        };
        eprintln!("{label}: F1 {:.2}, EM {:.2}", row.f1, row.exact_match);
        Ok((row, ft_dir))
    }

    /// Fine-tunes pre-trained run `r` on the QA task in `ft_dir` (resuming it), answers the
    /// held-out questions greedily, scores them with TriviaQA's F1 / EM and writes the
    /// predictions.
    fn run(
        &self,
        r: &StoredRun,
        ft_dir: &Path,
        task: &mut LmQaTask,
        label: &str,
    ) -> Result<ScoreRow> {
        let (config, device) = (self.config, &self.devices[0]);
        let train_cfg = train_config(config, r.seed);
        let model = pretrained(r, device)?;
        let opts = RunOptions {
            stop: self.stop.clone(),
            flops_per_step: 0.0,
            label: label.to_string(),
            progress: Progress::Auto,
        };
        let outcome = train(&train_cfg, model, task, self.devices, ft_dir, &opts)?;
        write_json(&ft_dir.join("env.json"), self.provenance)?;
        if outcome.interrupted {
            bail!(
                "interrupted; run the same command again to resume {}",
                ft_dir.display()
            );
        }
        eprintln!("{label}: generating {} answers", task.eval_examples().len());
        let model = outcome.model.valid();
        let inner = device.clone().without_autodiff();
        let answers = greedy_answers(
            &model,
            task.eval_examples(),
            (config.batch, config.answer_length),
            task.tokenizer(),
            &inner,
        )?;
        let score =
            metrics::triviaqa::corpus(task.eval_examples().iter().zip(&answers).map(|(e, a)| {
                (
                    Some(a.as_str()),
                    e.references.iter().map(String::as_str).collect(),
                )
            }));
        let predictions: Vec<serde_json::Value> = task
            .eval_examples()
            .iter()
            .zip(&answers)
            .map(|(e, a)| serde_json::json!({"prediction": a, "answers": e.references}))
            .collect();
        write_json(&ft_dir.join("predictions.json"), &predictions)?;
        Ok(ScoreRow {
            model: r.model.clone(),
            seed: r.seed,
            pretrain_run: dir_name(&r.dir),
            finetune_run: dir_name(ft_dir),
            pretrain_ppl: read_final_ppl(&r.dir)?,
            eval_loss: outcome.rows.last().map_or(f64::NAN, |m| m.eval_loss),
            f1: score.f1,
            exact_match: score.exact_match,
            n: score.n,
        })
    }
}

fn read_metrics(dir: &Path) -> Result<Vec<MetricsRow>> {
    crate::read_csv(&dir.join("metrics.csv"))
}

fn read_final_ppl(dir: &Path) -> Result<f64> {
    read_metrics(dir)?
        .last()
        .map(|m| m.eval_ppl)
        .ok_or_else(|| anyhow!("{} has no evaluations", dir.display()))
}

/// One untimed and `timing_rounds` timed fine-tuning steps of every model (first seed), in turn.
fn calibrate_finetune(
    config: &Table4Config,
    runs: &[StoredRun],
    data: &LmData,
    format: LmQaFormat,
    devices: &[burn::tensor::Device],
    out: &Path,
) -> Result<()> {
    let mut steppers = Vec::new();
    for m in &config.models {
        let Some(r) = runs.iter().find(|r| &r.model == m) else {
            continue;
        };
        let task = LmQaTask::new(data.clone(), format, (config.batch, 1), UNSHUFFLED)?;
        let model = r.model_config.init(Direction::Causal, &devices[0]);
        let cfg = train_config(config, r.seed);
        steppers.push((m.clone(), Stepper::new(&cfg, model, task, devices)?));
    }
    let mut times = Vec::new();
    for round in 0..=config.timing_rounds {
        for (name, stepper) in steppers.iter_mut() {
            let (seconds, _) = stepper.step()?;
            if round > 0 {
                times.push(StepTime {
                    model: name.clone(),
                    context: config.context,
                    round,
                    seconds,
                    config: String::new(),
                });
            }
        }
        eprintln!(
            "fine-tuning step-time round {round}/{}",
            config.timing_rounds
        );
    }
    crate::write_csv(&out.join(FT_STEP_TIMES), &times)
}
