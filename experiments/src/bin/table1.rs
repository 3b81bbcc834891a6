//! Table 1 of the FLASH paper: the GAU's design space — FLASH-Quad's layer with one component
//! changed at a time (softmax instead of relu², 2 or 4 heads, no gate, s and e smaller or larger, no
//! relative position bias, no RoPE), each a named variant of the model config's fields. Claim F8
//! (the default GAU is the best or within its seed spread) is computed in `table.md` and by
//! `just claims`.
//! `just repro table1 [--profile smoke|cpu|paper]`; configs in `experiments/configs/table1/`.

fn main() {
    experiments::registry::main("table1");
}
