//! Figure 6 / Table 13 of the FLASH paper: causal LM on Wiki-40B (offline: the Gutenberg
//! Shakespeare corpus), held-out perplexity vs training device-hours for each model and context,
//! and the speedup to reach Transformer++'s final perplexity.
//! `just repro fig6 [--profile smoke|cpu|paper]`; configs in `experiments/configs/fig6/`.

fn main() {
    experiments::registry::main("fig6");
}
