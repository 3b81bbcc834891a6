//! Figure 7 of the FLASH paper: mixed chunk attention's parts and its Transformer counterpart —
//! FLASH against LocalOnly (no global term), GlobalOnly (no local term) and MC-TFM++ (Transformer++
//! with chunked relu² attention), with FLASH-Quad, Transformer++ and relu² Transformer++ for
//! reference; causal LM, held-out perplexity vs training cost per context. Claim F5 (LocalOnly and
//! GlobalOnly both clearly worse than FLASH) is computed by `just claims`.
//! `just repro fig7 [--profile smoke|cpu|paper]`; configs in `experiments/configs/fig7/`.

fn main() {
    experiments::registry::main("fig7");
}
