//! Table 2 of the FLASH paper: the Transformer's design space — Transformer++ with one component
//! changed at a time (relu² instead of softmax, one head or more heads, a plain GELU MLP instead of
//! the GLU), each a named variant. Claim F8 (the default Transformer++ is the best or within its
//! seed spread) is computed in `table.md` and by `just claims`.
//! `just repro table2 [--profile smoke|cpu|paper]`; configs in `experiments/configs/table2/`.

fn main() {
    experiments::registry::main("table2");
}
