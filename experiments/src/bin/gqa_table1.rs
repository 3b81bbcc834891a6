//! Table 1 / Figure 3 of the GQA paper: MHA-Large, MHA-XXL, and MQA-XXL / GQA-8-XXL converted from
//! MHA-XXL and uptrained with α = 0.05, fine-tuned and scored on every task, with inference time
//! per sample. `just repro gqa_table1 [--profile smoke|cpu|paper]`; configs in
//! `experiments/configs/gqa_table1/`.

fn main() {
    experiments::registry::main("gqa_table1");
}
