//! The one trait every experiment implements, and the `main` that dispatches the options every
//! binary shares. An experiment is a config type, checks on it, a plan (`--dry-run`), a run
//! (`execute`) and a renderer (`--report`); this module, not the experiment, decides which of them a
//! command line calls:
//!
//! | option | what runs |
//! |---|---|
//! | `--report` | [`Experiment::render`] of the output directory; no config is read, no corpus built |
//! | `--print-config` | the config resolved and printed ([`Cli::load_config`]); nothing else |
//! | `--dry-run[=step]` | [`Experiment::check`], then [`Experiment::plan`]; nothing written |
//! | (none) | [`Experiment::check`], then [`Experiment::execute`] |
//! | `--jobs N > 1` | refused unless [`Experiment::workers`] allows worker processes |
//!
//! Adding an experiment: its folder of code, `experiments/configs/<id>/` (read by build.rs), a
//! line in [`crate::registry`] and a three-line binary.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cli::{Cli, ConfigPrinted, DryRun};
use crate::configs;

/// Whether an experiment can train in `--jobs` worker processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerProcesses {
    /// Its runs are independent (the LM sweeps): `--jobs N` trains them in N processes.
    Allowed,
    /// It runs in one process: `--jobs N > 1` is refused rather than ignored.
    Refused,
}

/// One paper artifact: `experiments/configs/<id>/{smoke,cpu,paper}.toml` resolve to
/// [`Experiment::Config`], and the command line picks what runs (the module's table).
pub trait Experiment {
    /// The resolved config, as `config.json` saves it and `--print-config` prints it.
    type Config: Serialize + DeserializeOwned;

    /// Whether `--jobs N` may train in worker processes.
    fn workers(&self) -> WorkerProcesses {
        WorkerProcesses::Refused
    }

    /// Refuses a config (or a command line) that cannot run, with a one-line reason, before
    /// anything is planned, built or written.
    fn check(&self, cli: &Cli, config: &Self::Config) -> Result<()>;

    /// `--dry-run`: prints what each run needs (and with [`DryRun::Step`] takes one real step of
    /// each model); writes nothing and builds no corpus.
    fn plan(&self, cli: &Cli, config: &Self::Config, mode: DryRun) -> Result<()>;

    /// Runs the experiment into `cli.out` (resuming what is there), renders, and says what it
    /// wrote.
    fn execute(&self, cli: &Cli, config: Self::Config) -> Result<()>;

    /// Renders the tables and charts of `out` from its CSVs.
    fn render(&self, out: &Path) -> Result<()>;

    /// The scale the result in `dir` was decided at, as `claims.md` shows it
    /// ([`crate::scale::Scale::show`]); by default the device of a timing-only experiment.
    fn scale(&self, dir: &Path) -> Result<String> {
        crate::scale::device(dir)
            .map(|d| format!("timing only, {d}"))
            .with_context(|| format!("no readable {}", dir.join("env.json").display()))
    }
}

/// Dispatches a parsed command line to `experiment` (the module's table), with its built-in configs.
pub fn dispatch<E: Experiment>(experiment: &E, cli: &Cli) -> Result<()> {
    dispatch_with(experiment, cli, &|profile| builtin(cli.id, profile))
}

/// [`dispatch`] with the configs of each profile given by `configs` instead of the built-in ones
/// (tests, and library users with configs of their own).
pub fn dispatch_with<E: Experiment>(
    experiment: &E,
    cli: &Cli,
    configs: &dyn Fn(configs::Profile) -> &'static str,
) -> Result<()> {
    if cli.report_only {
        experiment.render(&cli.out)?;
        eprintln!(
            "re-rendered {} from its CSVs (nothing trained or timed)",
            cli.out.display()
        );
        return Ok(());
    }
    let config: E::Config = cli.load_config(configs)?;
    experiment.check(cli, &config)?;
    match cli.dry_run {
        Some(mode) => experiment.plan(cli, &config, mode),
        None => experiment.execute(cli, config),
    }
}

/// The built-in config text of a registered experiment.
fn builtin(id: &str, profile: configs::Profile) -> &'static str {
    configs::builtin(id, profile)
        .with_context(|| format!("no experiments/configs/{id}/{}.toml", profile.name()))
        .expect("build.rs compiles in all three profiles of every experiment's configs")
}

/// The `main` of experiment `id`'s binary: the process-wide settings of
/// [`model::runtime::configure`] (denormals flushed to zero, freed memory kept for reuse), the
/// build's commit for provenance ([`training::provenance::set_build_commit`]), the
/// command line parsed (`--help` prints and exits 0; a usage error prints clap's message and exits
/// 2), [`dispatch`], and any error as one line on stderr with exit status 1.
pub fn main<E: Experiment>(id: &'static str, about: &'static str, experiment: E) {
    model::runtime::configure();
    // Provenance names the code this binary was built from, not the working tree's later state.
    training::provenance::set_build_commit(env!("REPRO_BUILD_COMMIT"));
    let cli = Cli::try_parse(id, about, std::env::args().skip(1)).unwrap_or_else(|e| e.exit());
    let outcome = if experiment.workers() == WorkerProcesses::Refused && cli.jobs > 1 {
        Err(anyhow::anyhow!(
            "--jobs {}: `{id}` runs in one process; drop --jobs (the LM sweeps train their independent runs in worker processes)",
            cli.jobs
        ))
    } else {
        dispatch(&experiment, &cli)
    };
    if let Err(e) = outcome {
        if e.is::<ConfigPrinted>() {
            return;
        }
        let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
        eprintln!("error: {}", chain.join(": "));
        std::process::exit(1);
    }
}
