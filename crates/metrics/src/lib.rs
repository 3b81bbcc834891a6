//! The scores the GQA paper reports, computed exactly as the reference implementations compute them:
//!
//! - [`rouge`]: ROUGE-1/2/L/Lsum as Google's `rouge-score` 0.1.2, with NLTK's Porter stemmer
//!   ([`porter`]) as an option, and T5's sentence splitting for ROUGE-Lsum;
//! - [`bleu`]: corpus BLEU as sacrebleu 2.6.0, tokenizers `13a` (sacrebleu's default) and `intl`
//!   (mteval-v14 international, what T5 used for WMT);
//! - [`triviaqa`]: F1 and exact match as the official TriviaQA evaluation script.
//!
//! Every corpus score is ×100, as the papers print them. The `score` binary reads JSONL files
//! ([`jsonl`]) and prints one JSON object.

pub mod bleu;
pub mod jsonl;
pub mod porter;
pub mod rouge;
pub mod text;
pub mod triviaqa;
