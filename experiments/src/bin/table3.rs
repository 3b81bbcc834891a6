//! Table 3 of the FLASH paper: causal LM on PG-19 with ~500M-parameter models (offline: the
//! Gutenberg Shakespeare corpus and small models), perplexity and the speedup to reach
//! Transformer+'s final perplexity, per context length.
//! `just repro table3 [--profile smoke|cpu|paper]`; configs in `experiments/configs/table3/`.

fn main() {
    experiments::registry::main("table3");
}
