//! Quality vs training cost (the FLASH paper's Figures 5–6 and Tables 3, 12, 13): every model at
//! every context length trained on the same data for the same steps, perplexity against
//! device-hours, and the speedup to reach the baseline's final perplexity. One library for the
//! three experiments; each binary only picks its configs.

pub mod ablation;
mod calibrate;
mod config;
mod corpus;
pub mod length_trend;
pub mod lr_choice;
mod models;
mod plan;
mod render;
mod results;
pub mod scaling;
mod workers;

use anyhow::{Context, Result, bail};
use training::lm_task::LmData;
use training::trainer::{Progress, stop_on_ctrl_c};
use training::{Provenance, write_atomic};

use self::calibrate::{calibrate_step_times, forget_other_machines_step_times};
use self::config::{EvalSplit, lr_set_shadowed, paper_table, split_batch};
use self::corpus::{selection_files, unigram_ppl};
use self::models::{run_model_config, sweep_models, timed_only_models};
use self::plan::{
    chosen_plan, configured_keys, dry_run_sweep, grid_keys, inherited_choices, plan_runs,
};
use self::workers::{RunTrainer, diverged_runs, execute, finished_rows, train_as_worker};
use crate::Cli;
use crate::dry_run::DryRun;
use crate::experiment::{Experiment, WorkerProcesses};
use std::path::Path;

// What the other experiments read of a sweep: its config, its models, its runs and results.
pub use self::calibrate::{STEP_TIMES, read_step_times};
pub use self::config::LmSweepConfig;
pub use self::corpus::sweep_data;
pub use self::models::{model_from_identity, planned_model, resolved_models};
pub use self::plan::{StoredRun, stored_runs};
pub use self::results::{read_rows, saved_config, summaries, sweep_scale, write_rows};
pub use crate::verdict::SweepRow;

/// An LM sweep: experiment `id`'s models trained per context and seed (its config's `table` says
/// which paper table it renders).
pub struct LmSweep {
    /// The experiment id (`fig5`, `fig6`, `table3`, ...).
    pub id: &'static str,
}

/// The output directory of the command that runs the sweep (not of its `--jobs` workers), made
/// and described: its provenance (`env.json`, returned) and `data.json` (the dataset, splits,
/// files, tokenizer, run store and the unigram perplexity); step times calibrated on another
/// machine forgotten first.
fn prepare_output(
    cli: &Cli,
    config: &LmSweepConfig,
    data: &LmData,
    select_files: &[std::path::PathBuf],
) -> Result<Provenance> {
    std::fs::create_dir_all(&cli.out)
        .with_context(|| format!("cannot create {}", cli.out.display()))?;
    // Read before this command's env.json replaces the one that names the calibration's machine.
    forget_other_machines_step_times(&cli.out, cli.output_machine(), &cli.machine())?;
    let provenance = cli.save_provenance(config)?;
    let eval_split = match config.eval_split {
        EvalSplit::Validation => "validation",
        EvalSplit::Test => "test",
    };
    write_atomic(
        &cli.out.join("data.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "dataset": data.spec.name, "train_split": "train", "train_order": config.train_order,
            "eval_split": eval_split, "select_files": select_files,
            "train_files": data.train_files, "eval_files": data.eval_files,
            "tokenizer": data.tok.description, "run_store": cli.store,
            "unigram_ppl": unigram_ppl(data)?,
        }))?
        .as_bytes(),
    )?;
    Ok(provenance)
}

impl Experiment for LmSweep {
    type Config = LmSweepConfig;

    fn workers(&self) -> WorkerProcesses {
        WorkerProcesses::Allowed
    }

    /// A device count the backend cannot give, or a batch it does not divide at some context, is
    /// refused before anything is written or a tokenizer trained.
    fn check(&self, cli: &Cli, config: &LmSweepConfig) -> Result<()> {
        // Said once, by the command typed (its `--jobs` workers run with the same arguments).
        if let (None, Some(shadowed)) = (cli.worker, lr_set_shadowed(&cli.sets, config)) {
            eprintln!("warning: {shadowed}");
        }
        let devices = cli.train_devices()?;
        if cli.jobs > 1 && devices.len() > 1 {
            bail!(
                "--jobs {} with --devices {}: give one of them (worker processes each train one run on one device)",
                cli.jobs,
                devices.len()
            );
        }
        for &context in &config.contexts {
            split_batch(config.tokens_per_batch, context, devices.len())?;
        }
        sweep_models(config)?;
        timed_only_models(config)?;
        Ok(())
    }

    fn plan(&self, cli: &Cli, config: &LmSweepConfig, mode: DryRun) -> Result<()> {
        let models = sweep_models(config)?;
        dry_run_sweep(cli, config, &models, &cli.train_devices()?, mode)
    }

    fn execute(&self, cli: &Cli, config: LmSweepConfig) -> Result<()> {
        run(cli, &config, &paper_table(self.id))
    }

    fn render(&self, out: &Path) -> Result<()> {
        render::render(out, &paper_table(self.id), None)
    }

    fn scale(&self, dir: &Path) -> Result<String> {
        Ok(sweep_scale(dir)?.show())
    }
}

/// Trains the sweep (resuming what the run store holds), calibrates the step times and renders.
fn run(cli: &Cli, config: &LmSweepConfig, table: &str) -> Result<()> {
    let devices = cli.train_devices()?;
    let models = sweep_models(config)?;
    let timed_only = timed_only_models(config)?;
    let data = sweep_data(config)?;
    // Every run's model configuration resolves and is consistent before anything is written.
    for &context in &config.contexts {
        for m in models.iter().chain(&timed_only) {
            run_model_config(config, m, context, data.tok.vocab_size())?;
        }
    }
    let stop = stop_on_ctrl_c();
    let select_files = selection_files(config)?;
    let grid = !config.lr_grid.is_empty();
    let first = if grid {
        grid_keys(config, &models)
    } else {
        configured_keys(config, &models, &inherited_choices(config, &cli.out)?)?
    };
    let first = plan_runs(config, &first, &data, devices.len(), &cli.store)?;
    let (provenance, progress) = match cli.worker {
        // A worker of `--jobs` trains what it can claim; the command that started it writes the
        // output directory. Its runs' provenance names that command (without `--worker K`).
        Some(_) => {
            let mut provenance = Provenance::collect(cli.device_description());
            let args: Vec<String> = std::env::args().collect();
            provenance.command = args[..args.len().saturating_sub(2)].join(" ");
            (provenance, Progress::Lines)
        }
        None => (
            prepare_output(cli, config, &data, &select_files)?,
            Progress::Auto,
        ),
    };
    let trainer = RunTrainer {
        config,
        data: &data,
        select_files: &select_files,
        devices: &devices,
        provenance: &provenance,
        stop,
        progress,
    };
    if let Some(worker) = cli.worker {
        // The command that started this worker trains the grid before the chosen rates' runs,
        // and starts workers for each in turn.
        let plan = match finished_rows(&first, config.steps)? {
            Some(done) if grid => {
                let diverged = diverged_runs(&first)?;
                chosen_plan(config, &models, (&done, &diverged), &data, cli)?
            }
            _ => first,
        };
        return train_as_worker(&trainer, &plan, worker);
    }
    let mut rows: Vec<SweepRow> = Vec::new();
    execute(cli, &trainer, &first, &mut rows)?;
    if grid {
        let diverged = diverged_runs(&first)?;
        crate::write_csv(&cli.out.join(lr_choice::DIVERGED), &diverged)?;
        let second = chosen_plan(config, &models, (&rows, &diverged), &data, cli)?;
        execute(cli, &trainer, &second, &mut rows)?;
    }
    let mut timed = models;
    timed.extend(timed_only);
    calibrate_step_times(config, &timed, &data, &devices, &cli.out)?;
    render::render(&cli.out, table, Some(config))?;
    eprintln!("wrote {} ({})", cli.out.display(), provenance.device);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::calibrate::{STEP_TIMES, forget_other_machines_step_times};
    use super::config::{LmSweepConfig, lr_set_shadowed, split_batch};
    use super::models::{model_from_identity, model_identity, run_train_config, sweep_models};
    use super::plan::inherited_rate;
    use crate::read_machine;
    use model::ModelConfig;

    /// A calibration made on another machine (per the directory's `env.json`) is removed before a
    /// sweep runs, one made on this machine is kept, and one beside no readable `env.json` is
    /// removed.
    #[test]
    fn step_times_of_another_machine_are_not_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let now = ("flex (CPU A, 2 cores)".to_string(), "avx2".to_string());
        let write = |device: &str, level: &str| {
            let env = serde_json::json!({ "device": device, "simd_level": level });
            std::fs::write(dir.path().join("env.json"), env.to_string()).expect("env");
            std::fs::write(dir.path().join(STEP_TIMES), "model,context\n").expect("times");
        };
        let times = dir.path().join(STEP_TIMES);
        write("flex (CPU A, 2 cores)", "avx2");
        let previous = read_machine(&dir.path().join("env.json"));
        forget_other_machines_step_times(dir.path(), previous, &now).expect("kept");
        assert!(times.exists(), "the same machine's calibration is kept");
        write("flex (CPU B, 2 cores)", "avx2");
        let previous = read_machine(&dir.path().join("env.json"));
        forget_other_machines_step_times(dir.path(), previous, &now).expect("removed");
        assert!(!times.exists(), "another CPU's calibration is removed");
        write("flex (CPU A, 2 cores)", "other-level");
        let previous = read_machine(&dir.path().join("env.json"));
        forget_other_machines_step_times(dir.path(), previous, &now).expect("removed");
        assert!(
            !times.exists(),
            "another SIMD level's calibration is removed"
        );
        write("flex (CPU A, 2 cores)", "avx2");
        std::fs::remove_file(dir.path().join("env.json")).expect("rm env");
        forget_other_machines_step_times(dir.path(), None, &now).expect("removed");
        assert!(
            !times.exists(),
            "a calibration of unknown origin is removed"
        );
    }

    /// fig5's cpu sweep as the binary resolves it, with `extra` (TOML fields) replacing its own.
    fn fig5_cpu(extra: &str) -> LmSweepConfig {
        let profile = crate::Profile::Cpu;
        let text = crate::configs::builtin("fig5", profile).expect("fig5 cpu");
        let mut table =
            crate::configs::resolve(text.parse().expect("toml"), profile, "fig5").expect("resolve");
        table.extend(extra.parse::<toml::Table>().expect("extra"));
        toml::Value::Table(table).try_into().expect("LmSweepConfig")
    }

    /// `peak_lr_by_model` changes the named model's schedule and no other's, and that model's run
    /// is the one a sweep with that rate for every model trains (a pilot's runs are reused).
    #[test]
    fn peak_lr_by_model_sets_one_models_rate() {
        let train = |config: &LmSweepConfig, name: &str| {
            let models = sweep_models(config).expect("models");
            let m = models.iter().find(|m| m.name == name).expect("model");
            serde_json::to_value(run_train_config(config, m, 1)).expect("json")
        };
        let common = fig5_cpu("peak_lr = 0.003\npeak_lr_by_model = {}");
        let by_model =
            fig5_cpu("peak_lr = 0.003\npeak_lr_by_model = { transformer_plusplus = 0.002 }");
        let all_low = fig5_cpu("peak_lr = 0.002\npeak_lr_by_model = {}");
        assert_eq!(
            train(&by_model, "transformer_plusplus"),
            train(&all_low, "transformer_plusplus")
        );
        assert_ne!(
            train(&by_model, "transformer_plusplus"),
            train(&common, "transformer_plusplus")
        );
        for other in ["flash", "flash_quad", "performer"] {
            assert_eq!(train(&by_model, other), train(&common, other), "{other}");
        }
        let peak = &train(&by_model, "transformer_plusplus")["schedule"]["peak_lr"];
        assert_eq!(peak.as_f64(), Some(0.002));
        // A name that is not a model of the sweep, or a rate that is not positive, is refused.
        let unknown = fig5_cpu("peak_lr_by_model = { transformer_plus_plus = 0.002 }");
        let err = sweep_models(&unknown)
            .err()
            .expect("unknown name refused")
            .to_string();
        assert!(err.contains("transformer_plus_plus"), "{err}");
        let zero = fig5_cpu("peak_lr_by_model = { flash = 0.0 }");
        assert!(sweep_models(&zero).is_err(), "a zero rate is refused");
        // `--set peak_lr=…` alone is shadowed for the named models, and says so.
        let set = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let warning = lr_set_shadowed(&set(&[("peak_lr", "0.0015")]), &by_model);
        assert!(warning.is_some_and(|w| w.contains("transformer_plusplus")));
        let both = set(&[("peak_lr", "0.0015"), ("peak_lr_by_model", "{}")]);
        assert_eq!(lr_set_shadowed(&both, &by_model), None);
        assert_eq!(
            lr_set_shadowed(&set(&[("peak_lr", "0.0015")]), &common),
            None
        );
    }

    /// Every run committed in `results/runs` keeps its name: its model configuration, read back
    /// (fields it predates take their defaults) and named as HEAD names it, is the one it was
    /// trained under, and the directory's hash is that identity's (a fine-tuning run's: its
    /// identity as written).
    #[test]
    fn committed_runs_keep_their_names() {
        let store = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/runs");
        let mut checked = 0;
        for entry in std::fs::read_dir(&store).expect("results/runs") {
            let dir = entry.unwrap().path();
            let Ok(text) = std::fs::read_to_string(dir.join("run_config.json")) else {
                continue;
            };
            let mut identity: serde_json::Value = serde_json::from_str(&text).unwrap();
            // A pre-training run: fields the run predates at their defaults, then the run's own.
            // A fine-tuning run (table4's `<arch>_qa-…`) names its pre-training run's identity
            // inside its own and is named by that whole identity.
            if identity.get("pretrained").is_none() {
                let model = model_from_identity(&identity["model"]).unwrap();
                identity["model"] = model_identity(&model).unwrap();
            }
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.ends_with(&crate::run_store::run_hash(&identity)),
                "{name}: HEAD names this run's configuration differently"
            );
            checked += 1;
        }
        assert!(checked >= 50, "only {checked} runs in results/runs");
        // An ablation field away from its default is part of the name.
        let base = ModelConfig::tiny(model::Architecture::FlashQuad);
        let ablated = base.clone().with_gau_heads(2);
        assert_ne!(
            model_identity(&base).unwrap(),
            model_identity(&ablated).unwrap()
        );
    }

    /// `peak_lr_from`: a model takes the rate chosen for its own name, else through `lr_family`,
    /// else its base model's; one with none of them is refused with the names it could take.
    #[test]
    fn inherited_rates_follow_names_families_and_base_models() {
        let profile = crate::Profile::Cpu;
        let text = crate::configs::builtin("fig3", profile).expect("fig3 cpu");
        let table =
            crate::configs::resolve(text.parse().expect("toml"), profile, "fig3").expect("resolve");
        let config: LmSweepConfig = toml::Value::Table(table).try_into().expect("config");
        let choice = |model: &str, chosen: f64| super::lr_choice::RateChoice {
            model: model.into(),
            context: 512,
            grid: vec![],
            chosen,
            second: chosen,
        };
        let choices = [
            choice("transformer_plusplus", 0.001),
            choice("flash_quad", 0.01),
        ];
        let models = sweep_models(&config).unwrap();
        let rate = |name: &str| {
            let m = models.iter().find(|m| m.name == name).unwrap();
            inherited_rate(&config, m, 512, &choices)
        };
        assert_eq!(rate("flash_quad").unwrap(), 0.01);
        assert_eq!(
            rate("flash_quad_d64x2").unwrap(),
            0.01,
            "a variant: its base model's"
        );
        assert_eq!(
            rate("transformer_plus").unwrap(),
            0.001,
            "through lr_family"
        );
        assert_eq!(
            rate("transformer_plus_d192x4").unwrap(),
            0.001,
            "its base, through lr_family"
        );
        let err = inherited_rate(&config, &models[0], 4096, &choices).unwrap_err();
        assert!(format!("{err}").contains("@ 4096"), "{err}");
    }

    #[test]
    fn batch_splits_evenly_over_devices_or_is_refused() {
        assert_eq!(split_batch(4096, 512, 1).unwrap(), (8, 8));
        assert_eq!(split_batch(4096, 512, 2).unwrap(), (8, 4));
        assert_eq!(split_batch(4096, 8192, 1).unwrap(), (1, 1));
        let err = split_batch(4096, 4096, 2).unwrap_err().to_string();
        assert!(err.contains("does not split evenly"), "{err}");
    }
}
