//! Figure 6 of the GQA paper: decoding time per sample against the number of K/V groups
//! (1 = MQA … 64 = MHA for 64 query heads). `just repro gqa_fig6 [--profile smoke|cpu|paper]`;
//! configs in `experiments/configs/gqa_fig6/`.

fn main() {
    experiments::registry::main("gqa_fig6");
}
