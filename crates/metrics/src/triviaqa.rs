//! TriviaQA F1 and exact match as the official evaluation script computes them
//! (`triviaqa/evaluation/triviaqa_evaluation.py`, `utils/utils.py`).
//!
//! Unlike SQuAD's script, punctuation becomes a space rather than vanishing, so "A's" → "a s".

use serde::Serialize;

use crate::text::{py_is_word, py_split};

/// ASCII punctuation (`string.punctuation`) plus the quotes the script adds: ‘ ’ ´ `.
fn is_excluded_punctuation(c: char) -> bool {
    c.is_ascii_punctuation() || matches!(c, '\u{2018}' | '\u{2019}' | '\u{b4}')
}

/// `normalize_answer`: `_` → space, lowercase, punctuation → space, the words a/an/the → space
/// (`re.sub(r'\b(a|an|the)\b', ' ', text)`), whitespace collapsed, stripped.
pub fn normalize(text: &str) -> String {
    let lowered = text.replace('_', " ").to_lowercase();
    let spaced: String = lowered
        .chars()
        .map(|c| if is_excluded_punctuation(c) { ' ' } else { c })
        .collect();
    // `\b(a|an|the)\b` matches exactly the maximal runs of word characters equal to an article.
    let mut without_articles = String::with_capacity(spaced.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if matches!(run.as_str(), "a" | "an" | "the") {
            out.push(' ');
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in spaced.chars() {
        if py_is_word(c) {
            run.push(c);
        } else {
            flush(&mut run, &mut without_articles);
            without_articles.push(c);
        }
    }
    flush(&mut run, &mut without_articles);
    py_split(&without_articles).collect::<Vec<_>>().join(" ")
}

/// Token F1 between the normalized prediction and one normalized ground truth, in [0, 1].
pub fn f1(prediction: &str, ground_truth: &str) -> f64 {
    let p = normalize(prediction);
    let g = normalize(ground_truth);
    let p_tokens: Vec<&str> = py_split(&p).collect();
    let mut g_tokens: Vec<&str> = py_split(&g).collect();
    let g_len = g_tokens.len();
    let mut same = 0usize;
    for t in &p_tokens {
        if let Some(i) = g_tokens.iter().position(|g| g == t) {
            g_tokens.swap_remove(i);
            same += 1;
        }
    }
    if same == 0 {
        return 0.0;
    }
    let precision = same as f64 / p_tokens.len() as f64;
    let recall = same as f64 / g_len as f64;
    2.0 * precision * recall / (precision + recall)
}

/// Exact match of the normalized strings.
pub fn exact_match(prediction: &str, ground_truth: &str) -> bool {
    normalize(prediction) == normalize(ground_truth)
}

/// Corpus scores ×100.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TriviaQaScore {
    pub exact_match: f64,
    pub f1: f64,
    /// Number of questions.
    pub n: usize,
}

/// Scores `(prediction, answers)` pairs: the best F1 and EM over each question's answers,
/// averaged over questions. A question without a prediction (`None`) scores 0, as in the script.
pub fn corpus<'a>(
    questions: impl IntoIterator<Item = (Option<&'a str>, Vec<&'a str>)>,
) -> TriviaQaScore {
    let mut sum = TriviaQaScore::default();
    for (prediction, answers) in questions {
        sum.n += 1;
        let Some(prediction) = prediction else {
            continue;
        };
        sum.f1 += answers
            .iter()
            .map(|a| f1(prediction, a))
            .fold(0.0, f64::max);
        if answers.iter().any(|a| exact_match(prediction, a)) {
            sum.exact_match += 1.0;
        }
    }
    let scale = if sum.n == 0 {
        0.0
    } else {
        100.0 / sum.n as f64
    };
    TriviaQaScore {
        exact_match: sum.exact_match * scale,
        f1: sum.f1 * scale,
        n: sum.n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Normalisations computed by the official TriviaQA evaluation script.
    #[test]
    fn normalization_known_values() {
        assert_eq!(normalize("The Beatles!"), "beatles");
        assert_eq!(normalize("an_apple"), "apple");
        assert_eq!(normalize("A\u{2019}s  and\tthe-end"), "s and end");
        // Articles only as whole words; U+001F is whitespace to Python's split().
        assert_eq!(normalize("Theatre anthem\u{1f}a"), "theatre anthem");
    }

    #[test]
    fn f1_counts_token_multisets() {
        assert_eq!(f1("the cat cat", "cat"), 2.0 * 0.5 * 1.0 / 1.5);
        assert_eq!(f1("dog", "cat"), 0.0);
        let s = corpus([
            (Some("Paris"), vec!["paris", "Paris, France"]),
            (Some("London city"), vec!["London"]),
            (None, vec!["Rome"]),
        ]);
        assert_eq!(s.n, 3);
        assert!((s.exact_match - 100.0 / 3.0).abs() < 1e-9);
        assert!((s.f1 - 100.0 * (1.0 + 2.0 / 3.0) / 3.0).abs() < 1e-9);
    }
}
