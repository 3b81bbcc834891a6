//! Figure 3 of the FLASH paper: GAU stacks (FLASH-Quad) against the Transformer with an MLP
//! (Transformer+) and with a GLU (Transformer++) at several model sizes, causal LM at context 512:
//! final perplexity against parameters (`size_<context>`) and against device-hours (`ppl_<context>`).
//! Claim F7 (FLASH-Quad within the seed spread of Transformer++ or better at every size) is
//! computed in `table.md` and by `just claims`.
//! `just repro fig3 [--profile smoke|cpu|paper]`; configs in `experiments/configs/fig3/`.

fn main() {
    experiments::registry::main("fig3");
}
