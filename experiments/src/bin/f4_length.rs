//! FLASH's speedup to Transformer++ (claim F4, causal LM, context 4096) against training length:
//! fig6's runs and runs of the same models, seeds and rates with 8x the tokens. Writes the trend
//! (`trend.csv`, `speedup_vs_tokens.png`) beside the usual sweep outputs.
//! `just repro f4_length [--profile smoke|cpu|paper]` after `just repro fig6` at the same profile;
//! configs in `experiments/configs/f4_length/`.

fn main() {
    experiments::registry::main("f4_length");
}
