//! Figure 5 (b–f) / Table 12 of the FLASH paper: masked LM on C4 (offline: the Gutenberg Shakespeare
//! corpus), held-out perplexity over masked tokens vs training device-hours for each model and
//! context, and the speedup to reach Transformer++'s final perplexity. Panel (a), latency vs
//! context, is `table11`.
//! `just repro fig5 [--profile smoke|cpu|paper]`; configs in `experiments/configs/fig5/`.

fn main() {
    experiments::registry::main("fig5");
}
