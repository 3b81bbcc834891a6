//! Table 5 of the FLASH paper: the perplexity lost by chunking, FLASH-Quad → FLASH against
//! Transformer++ → MC-TFM++ (and against relu² Transformer++, MC-TFM++'s unchunked control), per
//! context. The same runs as `fig7` (same configuration, so the run store shares them); its
//! `table.md` adds the chunking-loss table with the verdict on claim F6 (the GAU loses less).
//! `just repro table5 [--profile smoke|cpu|paper]`; configs in `experiments/configs/table5/`.

fn main() {
    experiments::registry::main("table5");
}
