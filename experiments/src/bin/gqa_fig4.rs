//! Figure 4 of the GQA paper: converting a multi-head checkpoint to MQA by mean pooling, by
//! keeping each group's first head, or by random initialisation, each uptrained for the config's α
//! (the paper's 0.05; the cpu config adds 0.4).
//! `just repro gqa_fig4 [--profile smoke|cpu|paper]`; configs in `experiments/configs/gqa_fig4/`.

use experiments::Profile;

fn builtin(profile: Profile) -> &'static str {
    match profile {
        Profile::Smoke => include_str!("../../configs/gqa_fig4/smoke.toml"),
        Profile::Cpu => include_str!("../../configs/gqa_fig4/cpu.toml"),
        Profile::Paper => include_str!("../../configs/gqa_fig4/paper.toml"),
    }
}

fn main() {
    experiments::main_with("gqa_fig4", |cli| experiments::gqa::run(cli, &builtin));
}
