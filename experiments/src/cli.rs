//! The experiments' command line: the three profiles, the options every binary takes (`--profile`,
//! `--config`, `--set`, `--out`, `--device`, `--report`, `--dry-run`, `--print-config`, the LM
//! sweeps' `--jobs` and `--store`), loading the layered config, and each binary's `main`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde::de::DeserializeOwned;
use training::{Backend, Provenance, write_json};

use crate::configs::{self, Profile};

/// What `--dry-run` does after resolving the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DryRun {
    /// Build each model and print the plan; nothing is trained or written.
    Plan,
    /// The plan, then one real training step of each model with one sequence per batch.
    Step,
}

/// The command line every experiment accepts (`<id> --help` prints it).
#[derive(Clone, Debug)]
pub struct Cli {
    /// Experiment id (the binary's name).
    pub id: &'static str,
    /// Scale.
    pub profile: Profile,
    /// Backend.
    pub backend: Backend,
    /// Devices to train on, data-parallel (`--devices N`; 1 unless the experiment trains LMs).
    pub devices: usize,
    /// A config file replacing the profile's.
    pub config: Option<PathBuf>,
    /// `key=value` overrides, applied in order.
    pub sets: Vec<(String, String)>,
    /// Output directory.
    pub out: PathBuf,
    /// The run store the LM sweeps train into and reuse runs from (`--store DIR`; default
    /// `results/runs` for the cpu profile, whose runs are committed, else `runs/store/<profile>`).
    pub store: PathBuf,
    /// Re-render charts and tables from the existing CSVs instead of running.
    pub report_only: bool,
    /// Print the resolved configuration (profile, `extends`, `--config`, `--set` and every
    /// default) as TOML and exit.
    pub print_config: bool,
    /// Print what each run needs (and with `step`, take one real step of each model) instead of
    /// running.
    pub dry_run: Option<DryRun>,
    /// The LM sweeps' worker processes (`--jobs N`; 1: the command trains its runs itself).
    pub jobs: usize,
    /// Set in a worker process of `--jobs`: its number, 1..=N (it trains the runs it can claim
    /// and exits; the command that started it collects, calibrates and renders).
    pub worker: Option<usize>,
}

/// The options as clap parses them; [`Cli`] adds the defaults that depend on the experiment.
#[derive(clap::Parser, Debug)]
// A repeated option takes its last value (a `just` recipe's defaults before the user's), and
// `--set` accumulates.
#[command(disable_version_flag = true, args_override_self = true)]
struct Args {
    /// Scale: smoke (seconds; what CI runs), cpu (the committed small-scale reproduction on a
    /// 2-core CPU), paper (the paper's settings, for GPUs and the real datasets).
    #[arg(long, value_enum, default_value_t = Profile::Cpu)]
    profile: Profile,
    /// Backend: flex (burn's CPU backend with the fused kernels); wgpu, tch, cuda (the plain
    /// reference kernels; each needs the binary built with its cargo feature).
    #[arg(long = "device", value_name = "BACKEND", default_value = "flex", value_parser = parse_backend)]
    device: Backend,
    /// Train data-parallel on devices 0..N of the backend (the LM sweeps only).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = positive_count)]
    devices: usize,
    /// A TOML config replacing the profile's built-in one (experiments/configs/<id>/<profile>.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Override a config field, in TOML syntax: `--set steps=100`, `--set 'contexts=[512, 1024]'`,
    /// `--set pretrain.steps=5` (repeatable, applied in order; a misspelt field is refused).
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_set)]
    sets: Vec<(String, String)>,
    /// Output directory [default: results/<id> for the cpu profile, runs/<id>/<profile> otherwise].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The run store the LM sweeps train into and reuse finished runs from [default: results/runs
    /// for the cpu profile, runs/store/<profile> otherwise].
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
    /// Re-render the charts and tables from the CSVs already in the output directory; runs nothing.
    #[arg(long)]
    report: bool,
    /// Print the resolved configuration (the profile's file with its `extends` chain, `--config`,
    /// `--set` and every default) as TOML, and exit; runs nothing.
    #[arg(long)]
    print_config: bool,
    /// Resolve the configuration, build every model on the device and print per run its
    /// parameters, tokens per step, memory and (where this device's step time is known)
    /// device-hours; train and write nothing. `--dry-run=step` also takes one real training step
    /// of each model with one sequence per batch.
    #[arg(long, value_enum, value_name = "MODE", num_args = 0..=1, require_equals = true, default_missing_value = "plan")]
    dry_run: Option<DryRun>,
    /// Train the LM sweeps' runs in N worker processes side by side, each with its share of the
    /// CPU's threads (RAYON_NUM_THREADS = cores / N unless set): a 2-core machine finishes a sweep
    /// sooner with two one-thread workers than with one two-thread process, and a run trains to
    /// the same bits on any thread count. Then this command calibrates and renders as usual.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = positive_count)]
    jobs: usize,
    /// A worker of `--jobs` (set by the command that starts it, never by hand).
    #[arg(long, value_name = "K", hide = true)]
    worker: Option<usize>,
}

fn parse_backend(s: &str) -> Result<Backend> {
    s.parse()
}

fn positive_count(s: &str) -> Result<usize> {
    s.parse()
        .ok()
        .filter(|&n| n > 0)
        .with_context(|| format!("expects a positive count, got `{s}`"))
}

fn parse_set(kv: &str) -> Result<(String, String)> {
    let (k, v) = kv
        .split_once('=')
        .with_context(|| format!("expects key=value, got `{kv}`"))?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}

/// The clap command of experiment `id`, described by `about`.
fn command(id: &'static str, about: &'static str) -> clap::Command {
    <Args as clap::CommandFactory>::command()
        .name(id)
        .bin_name(id)
        .about(about)
        .after_help(format!(
            "Configs: experiments/configs/{id}/{{smoke,cpu,paper}}.toml; `just repro {id} ...` runs this binary."
        ))
}

impl Cli {
    /// Parses `args` (without the program name) for experiment `id` (`about`: its one line in
    /// `--help`); usage errors and `--help` come back as clap's error (its message, and `exit()`
    /// with status 2, or 0 for help).
    pub fn try_parse(
        id: &'static str,
        about: &'static str,
        args: impl IntoIterator<Item = String>,
    ) -> std::result::Result<Self, clap::Error> {
        let matches =
            command(id, about).try_get_matches_from(std::iter::once(id.to_string()).chain(args))?;
        let a = <Args as clap::FromArgMatches>::from_arg_matches(&matches)?;
        // Committed results come from the cpu scale; other scales write under runs/ (not committed).
        let out = a.out.unwrap_or_else(|| match a.profile {
            Profile::Cpu => PathBuf::from("results").join(id),
            _ => PathBuf::from("runs").join(id).join(a.profile.name()),
        });
        let store = a.store.unwrap_or_else(|| match a.profile {
            Profile::Cpu => PathBuf::from("results").join("runs"),
            _ => PathBuf::from("runs").join("store").join(a.profile.name()),
        });
        Ok(Self {
            id,
            profile: a.profile,
            backend: a.device,
            devices: a.devices,
            config: a.config,
            sets: a.sets,
            out,
            store,
            report_only: a.report,
            print_config: a.print_config,
            dry_run: a.dry_run,
            jobs: a.jobs,
            worker: a.worker,
        })
    }

    /// [`Cli::try_parse`] with the error as text.
    pub fn parse(
        id: &'static str,
        about: &'static str,
        args: impl IntoIterator<Item = String>,
    ) -> Result<Self> {
        Self::try_parse(id, about, args).map_err(|e| anyhow::anyhow!("{}", e.render()))
    }

    /// Loads the experiment config: `--config FILE` or the profile's built-in file, its `extends`
    /// chain resolved ([`configs::resolve`]), then the `--set` overrides. Unknown keys and wrong types
    /// are errors naming the key.
    pub fn load_config<C: DeserializeOwned + Serialize>(
        &self,
        builtin: &dyn Fn(Profile) -> &'static str,
    ) -> Result<C> {
        let (text, source) = match &self.config {
            Some(path) => (
                std::fs::read_to_string(path).with_context(|| {
                    format!("cannot read config {}: check the path", path.display())
                })?,
                path.display().to_string(),
            ),
            None => (
                builtin(self.profile).to_string(),
                format!(
                    "experiments/configs/{}/{}.toml",
                    self.id,
                    self.profile.name()
                ),
            ),
        };
        let table: toml::Table = text
            .parse()
            .with_context(|| format!("config {source} is not valid TOML"))?;
        let mut table = configs::resolve(table, self.profile, &source)?;
        for (key, raw) in &self.sets {
            set_field(&mut table, key, parse_value(raw))
                .with_context(|| format!("--set {key}: no such field in {source}"))?;
        }
        let config = C::deserialize(toml::Value::Table(table))
            .with_context(|| format!("bad config {source}"))?;
        if self.print_config {
            let text = toml::to_string_pretty(&config).context("printing the resolved config")?;
            print!("# {source}, resolved\n{text}");
            return Err(ConfigPrinted.into());
        }
        Ok(config)
    }

    /// The training devices: `--devices` of the backend, for the experiments that train data-parallel
    /// (the LM sweeps).
    pub fn train_devices(&self) -> Result<Vec<burn::tensor::Device>> {
        self.backend.train_devices(self.devices)
    }

    /// The backend of an experiment that runs on one device; `--devices N > 1` is refused rather
    /// than ignored.
    pub fn one_device(&self) -> Result<Backend> {
        if self.devices > 1 {
            bail!(
                "--devices {}: `{}` runs on one device (fig5, fig6 and table3 train data-parallel)",
                self.devices,
                self.id
            );
        }
        Ok(self.backend)
    }

    /// The backend and machine this command runs on, as its `env.json` names them (`device`).
    pub fn device_description(&self) -> String {
        let device = training::device::describe(self.backend);
        if self.devices > 1 {
            format!("{device} × {} devices", self.devices)
        } else {
            device
        }
    }

    /// The machine this command runs on, as its `env.json` will name it.
    pub fn machine(&self) -> Machine {
        let level = model::fused::simd::SimdLevel::selected().name();
        (self.device_description(), level.to_string())
    }

    /// The machine named in the output directory's `env.json` (the last command that wrote the
    /// directory), if it is there and readable: timings in the directory are that machine's.
    pub fn output_machine(&self) -> Option<Machine> {
        read_machine(&self.out.join("env.json"))
    }

    /// Saves the resolved config and the provenance beside the results.
    pub fn save_provenance<C: Serialize>(&self, config: &C) -> Result<Provenance> {
        let provenance = Provenance::collect(self.device_description());
        write_json(&self.out.join("config.json"), config)?;
        write_json(&self.out.join("env.json"), &provenance)?;
        Ok(provenance)
    }
}

/// A machine as an `env.json` names it: (device description, SIMD level of the fused kernels).
pub type Machine = (String, String);

/// The machine in an `env.json`, if it is there and readable.
pub fn read_machine(env: &Path) -> Option<Machine> {
    let text = std::fs::read_to_string(env).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    Some((field("device")?, field("simd_level").unwrap_or_default()))
}

/// Sets `key` (dotted for nested tables: `pretrain.steps`, `sizes.xxl.checkpoint`) in `table`.
/// Top-level fields must exist (every config file spells them all out); a nested field absent from
/// the file, an optional one, is added, and the config's `deny_unknown_fields` rejects misspellings.
fn set_field(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<()> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let leaf = parts.pop().unwrap_or(key);
    let mut here = table;
    for part in &parts {
        let fields = here.keys().cloned().collect::<Vec<_>>().join(", ");
        here = match here.get_mut(*part) {
            Some(toml::Value::Table(t)) => t,
            _ => bail!("`{part}` is not a table here; fields: {fields}"),
        };
    }
    if parts.is_empty() && !here.contains_key(leaf) {
        let fields = here.keys().cloned().collect::<Vec<_>>().join(", ");
        bail!("fields: {fields}");
    }
    here.insert(leaf.to_string(), value);
    Ok(())
}

/// A `--set` value: TOML syntax when it parses (`3`, `1e-3`, `[512, 1024]`, `"x"`), else a string.
fn parse_value(raw: &str) -> toml::Value {
    format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

/// What [`Cli::load_config`] returns under `--print-config` once it has printed the config: the
/// experiment stops there, and its `main` exits with success.
#[derive(Debug)]
pub struct ConfigPrinted;

impl std::fmt::Display for ConfigPrinted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the resolved config was printed")
    }
}

impl std::error::Error for ConfigPrinted {}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli> {
        Cli::parse("table11", "", args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_flags_and_defaults() {
        let cli = parse(&[
            "--profile",
            "smoke",
            "--set",
            "contexts=[16, 32]",
            "--device=flex",
        ])
        .unwrap();
        assert_eq!(cli.profile, Profile::Smoke);
        assert_eq!(cli.out, PathBuf::from("runs/table11/smoke"));
        assert_eq!(
            cli.sets,
            vec![("contexts".to_string(), "[16, 32]".to_string())]
        );
        assert_eq!(parse(&[]).unwrap().out, PathBuf::from("results/table11"));
        // Repeated: the last value wins; --set accumulates.
        let twice = parse(&["--out", "a", "--out", "b", "--set", "x=1", "--set", "y=2"]).unwrap();
        assert_eq!(twice.out, PathBuf::from("b"));
        assert_eq!(twice.sets.len(), 2);
    }

    #[test]
    fn rejects_bad_input_with_a_message() {
        let e = |args: &[&str]| parse(args).unwrap_err().to_string();
        let huge = e(&["--profile", "huge"]);
        assert!(
            huge.contains("'huge'") && huge.contains("smoke, cpu, paper"),
            "{huge}"
        );
        assert!(e(&["--device", "tpu"]).contains("unknown device `tpu`"));
        assert!(e(&["--frobnicate"]).contains("'--frobnicate'"));
        // A mistyped option suggests the right one.
        assert!(e(&["--profil", "cpu"]).contains("--profile"));
        assert!(e(&["--set", "novalue"]).contains("key=value"));
        assert!(e(&["--devices", "0"]).contains("positive count"));
        assert!(e(&["--devices", "two"]).contains("positive count"));
        // --help is not a failure: clap's kind says so (main exits 0 with it), and it describes
        // every option.
        let about = crate::registry::about("fig6");
        let help = Cli::try_parse("fig6", about, ["--help".to_string()]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        let text = help.render().to_string();
        for option in [
            "--profile",
            "--device",
            "--devices",
            "--config",
            "--set",
            "--out",
            "--store",
            "--report",
        ] {
            assert!(text.contains(option), "{option} missing from:\n{text}");
        }
        assert!(text.contains("causal-LM perplexity"), "{text}");
        let two = parse(&["--devices", "2"]).unwrap();
        assert_eq!(two.devices, 2);
        let err = two.one_device().unwrap_err().to_string();
        assert!(err.contains("`table11` runs on one device"), "{err}");
    }

    #[test]
    fn set_overrides_typed_fields_and_rejects_unknown_ones() {
        #[derive(serde::Deserialize, serde::Serialize, Debug)]
        struct C {
            steps: usize,
            names: Vec<String>,
        }
        let builtin = |_: Profile| "steps = 3\nnames = [\"a\"]\n";
        let cli = parse(&["--set", "steps=5", "--set", "names=[\"b\", \"c\"]"]).unwrap();
        let c: C = cli.load_config(&builtin).unwrap();
        assert_eq!(
            (c.steps, c.names),
            (5, vec!["b".to_string(), "c".to_string()])
        );
        let err = parse(&["--set", "stpes=5"])
            .unwrap()
            .load_config::<C>(&builtin)
            .unwrap_err();
        assert!(format!("{err:#}").contains("no such field"), "{err:#}");
        // Dotted keys reach nested tables; a nested field may be added, a missing table may not.
        #[derive(serde::Deserialize, serde::Serialize, Debug)]
        struct Nested {
            stage: Stage,
        }
        #[derive(serde::Deserialize, serde::Serialize, Debug)]
        #[serde(deny_unknown_fields)]
        struct Stage {
            steps: usize,
            checkpoint: Option<String>,
        }
        let nested = |_: Profile| "[stage]\nsteps = 3\n";
        let cli = parse(&["--set", "stage.steps=7", "--set", "stage.checkpoint=dir"]).unwrap();
        let c: Nested = cli.load_config(&nested).unwrap();
        assert_eq!(
            (c.stage.steps, c.stage.checkpoint.as_deref()),
            (7, Some("dir"))
        );
        let err = parse(&["--set", "stage.stpes=7"])
            .unwrap()
            .load_config::<Nested>(&nested)
            .unwrap_err();
        assert!(format!("{err:#}").contains("stpes"), "{err:#}");
        let err = parse(&["--set", "stag.steps=7"])
            .unwrap()
            .load_config::<Nested>(&nested)
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("`stag` is not a table"),
            "{err:#}"
        );
        let err = parse(&["--set", "steps=many"])
            .unwrap()
            .load_config::<C>(&builtin)
            .unwrap_err();
        assert!(format!("{err:#}").contains("steps"), "{err:#}");
    }
}
