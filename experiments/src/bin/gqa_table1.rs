//! Table 1 / Figure 3 of the GQA paper: MHA-Large, MHA-XXL, and MQA-XXL / GQA-8-XXL converted from
//! MHA-XXL and uptrained with α = 0.05, fine-tuned and scored on every task, with inference time
//! per sample. `just repro gqa_table1 [--profile smoke|cpu|paper]`; configs in
//! `experiments/configs/gqa_table1/`.

use experiments::Profile;

fn builtin(profile: Profile) -> &'static str {
    match profile {
        Profile::Smoke => include_str!("../../configs/gqa_table1/smoke.toml"),
        Profile::Cpu => include_str!("../../configs/gqa_table1/cpu.toml"),
        Profile::Paper => include_str!("../../configs/gqa_table1/paper.toml"),
    }
}

fn main() {
    experiments::main_with("gqa_table1", |cli| experiments::gqa::run(cli, &builtin));
}
