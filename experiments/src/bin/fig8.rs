//! Figure 8 of the FLASH paper: FLASH's chunk size C against quality and cost at several contexts
//! (causal LM). Claim F10 (larger chunks are better at longer contexts) is computed by `just claims`
//! from the final perplexities of the smallest and largest chunk.
//! `just repro fig8 [--profile smoke|cpu|paper]`; configs in `experiments/configs/fig8/`.

fn main() {
    experiments::registry::main("fig8");
}
