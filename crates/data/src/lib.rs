//! Datasets, tokenizers and task builders (issue 3). Empty so far: the workspace builds it so the
//! crate layout is in place; the experiments that exist (table11) use random tokens.
