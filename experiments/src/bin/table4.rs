//! Table 4 of the FLASH paper: pre-trained causal LMs (Transformer+, FLASH-Quad, FLASH) fine-tuned
//! on question answering (TriviaQA; offline: `shakespeare_speaker_qa`), greedy answers scored with
//! TriviaQA's F1 / EM, and the cost of pre-training and fine-tuning per model. Claim F9 (FLASH's F1
//! within the seed spread of Transformer+'s at lower cost) is computed in `table.md` and by
//! `just claims`.
//! `just repro table4 [--profile smoke|cpu|paper]`; configs in `experiments/configs/table4/`.

fn main() {
    experiments::registry::main("table4");
}
