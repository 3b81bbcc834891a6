//! Table 11 of the FLASH paper: training latency of every causal architecture vs context length.
//! `just repro table11 [--profile smoke|cpu|paper]`; configs in `experiments/configs/table11/`.

fn main() {
    experiments::registry::main("table11");
}
