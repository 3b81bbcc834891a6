//! Figure 5 of the GQA paper: quality against the uptraining proportion α ∈ {0, 0.05, 0.10}
//! for MQA and GQA converted from the multi-head model.
//! `just repro gqa_fig5 [--profile smoke|cpu|paper]`; configs in `experiments/configs/gqa_fig5/`.

fn main() {
    experiments::registry::main("gqa_fig5");
}
