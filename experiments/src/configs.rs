//! The experiments' built-in configs (`experiments/configs/<id>/<profile>.toml`, compiled in), and
//! layering: a config may start from another experiment's config of the same profile,
//!
//! ```toml
//! extends = "fig6"          # fig6's config of this profile, then the fields below over it
//! objective = "masked"
//! set = { chunk_size = 512 } # tables merge field by field (fig6's d_model etc. kept)
//! ```
//!
//! as t5x layers size → run type → experiment, so that an experiment's file holds only what makes
//! it differ. What an experiment's three profiles share lives in its `base.toml`, which each
//! profile extends as `extends = "fig6/base"`; a profile file then holds only what its scale
//! changes. The resolved configuration is what each experiment saves in its `config.json` (and
//! `--print-config` prints).

use anyhow::{Context, Result, bail};

use std::str::FromStr;

use serde::Serialize;

/// The three scales every experiment has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Seconds; CI runs it.
    Smoke,
    /// A real small-scale reproduction on a 2-core CPU (the committed results).
    Cpu,
    /// The paper's hyper-parameters, for GPU machines and the real datasets.
    Paper,
}

impl Profile {
    /// Every profile.
    pub const ALL: [Profile; 3] = [Profile::Smoke, Profile::Cpu, Profile::Paper];

    /// The profile's name, also its config file's stem.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Smoke => "smoke",
            Profile::Cpu => "cpu",
            Profile::Paper => "paper",
        }
    }
}

impl FromStr for Profile {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .with_context(|| format!("unknown profile `{s}`: choose smoke, cpu or paper"))
    }
}

macro_rules! builtin_configs {
    ($($id:literal),* $(,)?) => {
        /// The built-in config of experiment `id` at `profile`, if there is one.
        pub fn builtin(id: &str, profile: Profile) -> Option<&'static str> {
            match (id, profile) {
                $(
                    ($id, Profile::Smoke) => Some(include_str!(concat!("../configs/", $id, "/smoke.toml"))),
                    ($id, Profile::Cpu) => Some(include_str!(concat!("../configs/", $id, "/cpu.toml"))),
                    ($id, Profile::Paper) => Some(include_str!(concat!("../configs/", $id, "/paper.toml"))),
                )*
                _ => None,
            }
        }

        /// Every experiment id with built-in configs.
        pub const IDS: &[&str] = &[$($id),*];
    };
}

builtin_configs!(
    "table11",
    "fig5",
    "fig6",
    "table3",
    "fig7",
    "table5",
    "fig8",
    "table1",
    "table2",
    "fig3",
    "f4_length",
    "table4",
    "gqa_fig6",
    "gqa_table1",
    "gqa_fig4",
    "gqa_fig5",
);

macro_rules! base_configs {
    ($($id:literal),* $(,)?) => {
        /// The base config of experiment `id` (`configs/<id>/base.toml`: what its profiles share),
        /// if it has one.
        pub fn base(id: &str) -> Option<&'static str> {
            match id {
                $($id => Some(include_str!(concat!("../configs/", $id, "/base.toml"))),)*
                _ => None,
            }
        }
    };
}

base_configs!("fig6");

/// The text of the layer `extends` names: `ID` (experiment ID's config of `profile`) or `ID/base`
/// (ID's base config).
fn layer(name: &str, profile: Profile) -> Option<&'static str> {
    match name.strip_suffix("/base") {
        Some(id) => base(id),
        None => builtin(name, profile),
    }
}

/// The LM sweeps (their binaries' `main` is [`crate::lm_sweep::main`]): the experiments whose runs
/// can train in `--jobs` worker processes.
pub const LM_SWEEPS: &[&str] = &[
    "fig5",
    "fig6",
    "table3",
    "fig7",
    "table5",
    "fig8",
    "table1",
    "table2",
    "fig3",
    "f4_length",
];

/// How many `extends` links a config may chain (a cycle is an error, not a hang).
const MAX_DEPTH: usize = 8;

/// `table` with its `extends` chain resolved: the base's fields, then `table`'s over them (tables
/// merged field by field, any other value replaced). `source` names the file in errors.
pub fn resolve(table: toml::Table, profile: Profile, source: &str) -> Result<toml::Table> {
    let mut layers = vec![table];
    let mut chain = vec![source.to_string()];
    loop {
        let top = layers.last_mut().expect("one layer at least");
        let Some(base) = top.remove("extends") else {
            break;
        };
        let Some(id) = base.as_str().map(str::to_string) else {
            bail!(
                "{}: `extends` must be an experiment id or its base, e.g. extends = \"fig6\" or \"fig6/base\"",
                chain[chain.len() - 1]
            );
        };
        if chain.len() > MAX_DEPTH || chain.contains(&id) {
            bail!(
                "`extends` chain {} → {id} loops or is too long",
                chain.join(" → ")
            );
        }
        let text = layer(&id, profile).with_context(|| {
            format!(
                "{}: extends `{id}`, which has no built-in config; known: {} (and ID/base where configs/ID/base.toml exists)",
                chain[chain.len() - 1],
                IDS.join(", ")
            )
        })?;
        let base: toml::Table = text
            .parse()
            .with_context(|| format!("config of `{id}` is not valid TOML"))?;
        layers.push(base);
        chain.push(id);
    }
    let mut resolved = layers.pop().expect("one layer at least");
    while let Some(over) = layers.pop() {
        merge(&mut resolved, over);
    }
    Ok(resolved)
}

/// `over`'s fields into `base`: a table into a table field by field, anything else replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn every_builtin_config_parses_and_resolves() {
        for id in IDS {
            for profile in Profile::ALL {
                let text = builtin(id, profile).unwrap();
                resolve(table(text), profile, id).unwrap_or_else(|e| panic!("{id}: {e:#}"));
            }
        }
    }

    #[test]
    fn a_delta_overrides_its_base_and_merges_tables() {
        let over = table(
            "extends = \"fig6\"\nobjective = \"masked\"\nset = { chunk_size = 512 }\ncontexts = [1024]\n",
        );
        let resolved = resolve(over, Profile::Cpu, "test").unwrap();
        let fig6 = table(builtin("fig6", Profile::Cpu).unwrap());
        assert_eq!(resolved["objective"].as_str(), Some("masked"));
        assert_eq!(resolved["contexts"], toml::Value::Array(vec![1024.into()]));
        // fig6's model fields kept beside the new one; fields not named kept as fig6's.
        let set = resolved["set"].as_table().unwrap();
        assert_eq!(set["chunk_size"].as_integer(), Some(512));
        assert_eq!(set["d_model"], fig6["set"]["d_model"]);
        assert_eq!(resolved["steps"], fig6["steps"]);
        assert!(!resolved.contains_key("extends"));
    }

    /// A profile holds what its scale changes over its experiment's base: the base's fields reach
    /// every profile unless the profile sets them (fig6's cpu profile sets `models`, the others keep
    /// the base's six).
    #[test]
    fn profiles_extend_their_base() {
        let base = table(base("fig6").unwrap());
        for profile in Profile::ALL {
            let r = resolve(table(builtin("fig6", profile).unwrap()), profile, "fig6").unwrap();
            assert!(!r.contains_key("extends"));
            assert_eq!(r["optimizer"], base["optimizer"], "{}", profile.name());
            assert_eq!(r["train_order"], base["train_order"]);
            let models = r["models"].as_array().unwrap().len();
            assert_eq!(models, if profile == Profile::Cpu { 3 } else { 6 });
        }
    }

    /// The GQA configs of a profile share one recipe (and at cpu scale one directory of stages), so
    /// everything but their rows (and description) must be the same, or a stage one trains would
    /// not be the one another expects.
    #[test]
    fn the_gqa_configs_of_a_profile_differ_only_in_their_models() {
        for profile in Profile::ALL {
            let resolved = |id: &str| {
                let mut t = resolve(table(builtin(id, profile).unwrap()), profile, id).unwrap();
                assert!(t.remove("models").is_some(), "{id} has models");
                t.remove("description");
                t
            };
            let table1 = resolved("gqa_table1");
            assert!(table1.contains_key("stages") && table1.contains_key("sizes"));
            for id in ["gqa_fig4", "gqa_fig5"] {
                assert_eq!(resolved(id), table1, "{id} at {}", profile.name());
            }
        }
    }

    #[test]
    fn unknown_bases_and_loops_are_refused() {
        let err = resolve(table("extends = \"fig99\""), Profile::Cpu, "mine.toml").unwrap_err();
        assert!(format!("{err:#}").contains("known: table11"), "{err:#}");
        let err = resolve(
            table("extends = \"table11/base\""),
            Profile::Cpu,
            "mine.toml",
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("ID/base"), "{err:#}");
        let err = resolve(table("extends = 6"), Profile::Cpu, "mine.toml").unwrap_err();
        assert!(format!("{err:#}").contains("experiment id"), "{err:#}");
        // fig7 is not allowed to extend itself through its own id.
        let err = resolve(table("extends = \"fig7\""), Profile::Cpu, "fig7").unwrap_err();
        assert!(format!("{err:#}").contains("loops"), "{err:#}");
    }
}
