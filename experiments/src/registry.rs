//! Every experiment, one line each: its id (its binary, `experiments/configs/<id>/`,
//! `results/<id>/`), the [`Experiment`] family that runs it, and one line on what it reproduces.
//! The binaries' `main`, `--help`, `claims.md`'s scale column and the front page's cost table
//! dispatch through here.

use std::path::Path;

use anyhow::Result;

use crate::experiment::{self, Experiment, dispatch_with};
use crate::{Cli, Profile};

/// The [`Experiment`] implementations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Language models trained per model × context × seed ([`crate::lm_sweep::LmSweep`]).
    LmSweep,
    /// Pre-trained LMs fine-tuned on question answering ([`crate::qa_finetune::QaFinetune`]).
    QaFinetune,
    /// Training-step latency against context ([`crate::latency::LatencySweep`]).
    Latency,
    /// T5 pre-trained, converted to GQA, uptrained, fine-tuned and scored ([`crate::gqa::GqaPipeline`]).
    GqaPipeline,
    /// T5 decoding timed per number of K/V groups ([`crate::gqa::GqaDecode`]).
    GqaDecode,
}

/// One registered experiment.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// Its id.
    pub id: &'static str,
    /// What runs it.
    pub family: Family,
    /// One line on what it reproduces (`--help`, the front page's cost table).
    pub about: &'static str,
}

const fn entry(id: &'static str, family: Family, about: &'static str) -> Entry {
    Entry { id, family, about }
}

/// Every experiment, in the order the front page lists them.
pub const EXPERIMENTS: &[Entry] = &[
    entry(
        "table11",
        Family::Latency,
        "FLASH Table 11 / Fig. 5(a): seconds per training step against context length",
    ),
    entry(
        "fig5",
        Family::LmSweep,
        "FLASH Fig. 5 / Table 12: masked-LM perplexity against training cost",
    ),
    entry(
        "fig6",
        Family::LmSweep,
        "FLASH Fig. 6 / Table 13: causal-LM perplexity against training cost",
    ),
    entry(
        "table3",
        Family::LmSweep,
        "FLASH Table 3: causal LM on long books (PG-19), speedup to Transformer+",
    ),
    entry(
        "fig7",
        Family::LmSweep,
        "FLASH Fig. 7: FLASH against LocalOnly, GlobalOnly and MC-TFM++",
    ),
    entry(
        "table5",
        Family::LmSweep,
        "FLASH Table 5: the perplexity lost by chunking",
    ),
    entry(
        "fig8",
        Family::LmSweep,
        "FLASH Fig. 8: FLASH's chunk size against quality and cost",
    ),
    entry(
        "table1",
        Family::LmSweep,
        "FLASH Table 1: the GAU's ablations (scoring, heads, gate, s, e, bias, RoPE)",
    ),
    entry(
        "table2",
        Family::LmSweep,
        "FLASH Table 2: Transformer++'s ablations (relu², heads, GLU vs MLP)",
    ),
    entry(
        "fig3",
        Family::LmSweep,
        "FLASH Fig. 3: GAU against the Transformer across model sizes",
    ),
    entry(
        "f4_length",
        Family::LmSweep,
        "FLASH's speedup to Transformer++ (F4) at fig6's length and at 8x the tokens",
    ),
    entry(
        "table4",
        Family::QaFinetune,
        "FLASH Table 4: pre-trained LMs fine-tuned on question answering (F1 / EM, cost)",
    ),
    entry(
        "gqa_fig6",
        Family::GqaDecode,
        "GQA Fig. 6: decoding time per sample against the number of K/V groups",
    ),
    entry(
        "gqa_table1",
        Family::GqaPipeline,
        "GQA Table 1 / Fig. 3: MHA, MQA and GQA uptrained, fine-tuned, scored and timed",
    ),
    entry(
        "gqa_fig4",
        Family::GqaPipeline,
        "GQA Fig. 4: converting to MQA by mean, first head or random",
    ),
    entry(
        "gqa_fig5",
        Family::GqaPipeline,
        "GQA Fig. 5: the uptraining proportion for MQA and GQA",
    ),
];

/// The registered experiment `id`.
pub fn lookup(id: &str) -> Option<&'static Entry> {
    EXPERIMENTS.iter().find(|e| e.id == id)
}

/// One line on what experiment `id` reproduces.
pub fn about(id: &str) -> &'static str {
    lookup(id).map_or("A paper artifact of this workspace", |e| e.about)
}

/// The `main` of experiment `id`'s binary.
pub fn main(id: &'static str) {
    let Some(e) = lookup(id) else {
        eprintln!("error: `{id}` is not in experiments/src/registry.rs: register it there");
        std::process::exit(1);
    };
    match e.family {
        Family::LmSweep => experiment::main(id, e.about, crate::lm_sweep::LmSweep { id }),
        Family::QaFinetune => experiment::main(id, e.about, crate::qa_finetune::QaFinetune),
        Family::Latency => experiment::main(id, e.about, crate::latency::LatencySweep),
        Family::GqaPipeline => experiment::main(id, e.about, crate::gqa::GqaPipeline),
        Family::GqaDecode => experiment::main(id, e.about, crate::gqa::GqaDecode),
    }
}

/// Runs experiment `cli.id` as its binary would (after the command line is parsed), with the
/// configs of each profile given by `configs` (tests, and library users with configs of their
/// own); [`crate::configs::builtin`] gives the built-in ones.
pub fn run_with(cli: &Cli, configs: &dyn Fn(Profile) -> &'static str) -> Result<()> {
    let Some(e) = lookup(cli.id) else {
        anyhow::bail!("`{}` is not a registered experiment", cli.id);
    };
    let id = e.id;
    match e.family {
        Family::LmSweep => dispatch_with(&crate::lm_sweep::LmSweep { id }, cli, configs),
        Family::QaFinetune => dispatch_with(&crate::qa_finetune::QaFinetune, cli, configs),
        Family::Latency => dispatch_with(&crate::latency::LatencySweep, cli, configs),
        Family::GqaPipeline => dispatch_with(&crate::gqa::GqaPipeline, cli, configs),
        Family::GqaDecode => dispatch_with(&crate::gqa::GqaDecode, cli, configs),
    }
}

/// [`run_with`] the built-in configs.
pub fn run(cli: &Cli) -> Result<()> {
    run_with(cli, &|profile| {
        crate::configs::builtin(cli.id, profile).expect("a registered experiment has configs")
    })
}

/// The scale the result in `dir` (experiment `id`'s) was decided at, as `claims.md` shows it.
pub fn scale(id: &'static str, dir: &Path) -> Result<String> {
    let Some(e) = lookup(id) else {
        anyhow::bail!("`{id}` is not a registered experiment");
    };
    match e.family {
        Family::LmSweep => crate::lm_sweep::LmSweep { id }.scale(dir),
        Family::QaFinetune => crate::qa_finetune::QaFinetune.scale(dir),
        Family::Latency => crate::latency::LatencySweep.scale(dir),
        Family::GqaPipeline => crate::gqa::GqaPipeline.scale(dir),
        Family::GqaDecode => crate::gqa::GqaDecode.scale(dir),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every registered experiment has configs (build.rs compiles in each folder of
    /// experiments/configs/) and a binary, and every config folder is registered.
    #[test]
    fn registry_configs_and_binaries_agree() {
        let bins = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bin");
        for e in EXPERIMENTS {
            assert!(crate::configs::IDS.contains(&e.id), "{}: no configs", e.id);
            assert!(
                bins.join(format!("{}.rs", e.id)).is_file(),
                "{}: no binary",
                e.id
            );
        }
        for id in crate::configs::IDS {
            assert!(
                lookup(id).is_some(),
                "experiments/configs/{id} is not registered"
            );
        }
    }
}
