//! Table 3 of the FLASH paper: causal LM on PG-19 with ~500M-parameter models (offline: the
//! Gutenberg Shakespeare corpus and small models), perplexity and the speedup to reach
//! Transformer+'s final perplexity, per context length.
//! `just repro table3 [--profile smoke|cpu|paper]`; configs in `experiments/configs/table3/`.

use experiments::Profile;

fn builtin(profile: Profile) -> &'static str {
    match profile {
        Profile::Smoke => include_str!("../../configs/table3/smoke.toml"),
        Profile::Cpu => include_str!("../../configs/table3/cpu.toml"),
        Profile::Paper => include_str!("../../configs/table3/paper.toml"),
    }
}

fn main() {
    experiments::main_with("table3", |cli| experiments::lm_sweep::run(cli, &builtin));
}
