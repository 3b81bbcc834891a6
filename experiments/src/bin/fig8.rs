//! Figure 8 of the FLASH paper: FLASH's chunk size C against quality and cost at several contexts
//! (causal LM). Claim F10 (larger chunks are better at longer contexts) is computed by `just claims`
//! from the final perplexities of the smallest and largest chunk.
//! `just repro fig8 [--profile smoke|cpu|paper]`; configs in `experiments/configs/fig8/`.

use experiments::Profile;

fn builtin(profile: Profile) -> &'static str {
    match profile {
        Profile::Smoke => include_str!("../../configs/fig8/smoke.toml"),
        Profile::Cpu => include_str!("../../configs/fig8/cpu.toml"),
        Profile::Paper => include_str!("../../configs/fig8/paper.toml"),
    }
}

fn main() {
    experiments::main_with("fig8", |cli| experiments::lm_sweep::run(cli, &builtin));
}
