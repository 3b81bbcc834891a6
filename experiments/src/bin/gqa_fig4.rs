//! Figure 4 of the GQA paper: converting a multi-head checkpoint to MQA by mean pooling, by
//! keeping each group's first head, or by random initialisation, each uptrained for the config's α
//! (the paper's 0.05; the cpu config adds 0.4).
//! `just repro gqa_fig4 [--profile smoke|cpu|paper]`; configs in `experiments/configs/gqa_fig4/`.

fn main() {
    experiments::registry::main("gqa_fig4");
}
