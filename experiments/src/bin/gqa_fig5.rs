//! Figure 5 of the GQA paper: quality against the uptraining proportion α ∈ {0, 0.05, 0.10}
//! for MQA and GQA converted from the multi-head model.
//! `just repro gqa_fig5 [--profile smoke|cpu|paper]`; configs in `experiments/configs/gqa_fig5/`.

use experiments::Profile;

fn builtin(profile: Profile) -> &'static str {
    match profile {
        Profile::Smoke => include_str!("../../configs/gqa_fig5/smoke.toml"),
        Profile::Cpu => include_str!("../../configs/gqa_fig5/cpu.toml"),
        Profile::Paper => include_str!("../../configs/gqa_fig5/paper.toml"),
    }
}

fn main() {
    experiments::main_with("gqa_fig5", |cli| experiments::gqa::run(cli, &builtin));
}
