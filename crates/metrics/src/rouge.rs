//! ROUGE as Google's `rouge-score` 0.1.2 computes it (`rouge_scorer.py`, `tokenize.py`), with T5's
//! summary preparation (`t5.evaluation.metrics.rouge`).
//!
//! The corpus score is the plain mean of the per-example F-measures: the reference package's
//! bootstrap aggregator reports a resampled "mid" that changes with the random seed.

use std::collections::HashMap;

use serde::Serialize;

use crate::porter;

/// What happens to each text before scoring. The GQA paper does not say; T5 is the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SummaryPrep {
    /// T5's `_prepare_summary`: `" . "` → `" .\n"`, so that ROUGE-Lsum sees one sentence per line
    /// (the other scores do not see newlines).
    #[default]
    T5,
    /// The texts as given: ROUGE-Lsum splits on the newlines already there.
    None,
}

impl SummaryPrep {
    /// Applies the preparation.
    pub fn apply(self, text: &str) -> String {
        match self {
            SummaryPrep::T5 => text.replace(" . ", " .\n"),
            SummaryPrep::None => text.to_string(),
        }
    }
}

/// The switches of a ROUGE computation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RougeOptions {
    /// Stem tokens longer than 3 characters with NLTK's Porter stemmer (`use_stemmer=True`);
    /// T5 does not stem.
    pub stem: bool,
    /// Preparation of both texts before scoring.
    pub prep: SummaryPrep,
}

/// Precision, recall and F-measure of one comparison, in [0, 1].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Score {
    pub precision: f64,
    pub recall: f64,
    pub fmeasure: f64,
}

impl Score {
    fn new(precision: f64, recall: f64) -> Self {
        let fmeasure = if precision + recall > 0.0 {
            2.0 * precision * recall / (precision + recall)
        } else {
            0.0
        };
        Self {
            precision,
            recall,
            fmeasure,
        }
    }
}

/// The four ROUGE scores of one (target, prediction) pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RougeScores {
    pub rouge1: Score,
    pub rouge2: Score,
    #[serde(rename = "rougeL")]
    pub rouge_l: Score,
    #[serde(rename = "rougeLsum")]
    pub rouge_lsum: Score,
}

/// `tokenize.tokenize`: lowercase, every run of characters outside `[a-z0-9]` becomes a space
/// (so non-ASCII letters vanish: "café" → "caf"), split, stem tokens longer than 3 characters,
/// keep the tokens matching `^[a-z0-9]+$`.
pub fn tokenize(text: &str, stem: bool) -> Vec<String> {
    let lower = text.to_lowercase();
    let spaced: String = lower
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                ' '
            }
        })
        .collect();
    spaced
        .split(' ')
        .filter(|t| !t.is_empty())
        .map(|t| {
            if stem && t.len() > 3 {
                porter::stem(t)
            } else {
                t.to_string()
            }
        })
        .filter(|t| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
        .collect()
}

fn ngram_counts(tokens: &[String], n: usize) -> HashMap<&[String], usize> {
    let mut counts = HashMap::new();
    if tokens.len() >= n {
        for gram in tokens.windows(n) {
            *counts.entry(gram).or_insert(0) += 1;
        }
    }
    counts
}

/// ROUGE-N: clipped n-gram overlap over the prediction's (precision) and the target's (recall)
/// n-gram counts, each count floored at 1 in the denominator as the reference does.
pub fn rouge_n(target: &[String], prediction: &[String], n: usize) -> Score {
    let target_grams = ngram_counts(target, n);
    let prediction_grams = ngram_counts(prediction, n);
    let overlap: usize = target_grams
        .iter()
        .map(|(gram, &count)| count.min(prediction_grams.get(gram).copied().unwrap_or(0)))
        .sum();
    let target_total: usize = target_grams.values().sum();
    let prediction_total: usize = prediction_grams.values().sum();
    Score::new(
        overlap as f64 / prediction_total.max(1) as f64,
        overlap as f64 / target_total.max(1) as f64,
    )
}

/// The LCS dynamic-programming table, `(len(a)+1) × (len(b)+1)`, row-major.
fn lcs_table(a: &[String], b: &[String]) -> Vec<Vec<usize>> {
    let mut t = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            t[i][j] = if a[i - 1] == b[j - 1] {
                t[i - 1][j - 1] + 1
            } else {
                t[i - 1][j].max(t[i][j - 1])
            };
        }
    }
    t
}

/// Indices into `reference` of one longest common subsequence, chosen by the reference's
/// backtracking (`_backtrack_norec`: on ties, move up in `reference`).
pub fn lcs_indices(reference: &[String], candidate: &[String]) -> Vec<usize> {
    let t = lcs_table(reference, candidate);
    let (mut i, mut j) = (reference.len(), candidate.len());
    let mut indices = Vec::new();
    while i > 0 && j > 0 {
        if reference[i - 1] == candidate[j - 1] {
            indices.push(i - 1);
            i -= 1;
            j -= 1;
        } else if t[i][j - 1] > t[i - 1][j] {
            j -= 1;
        } else {
            i -= 1;
        }
    }
    indices.reverse();
    indices
}

/// ROUGE-L: longest common subsequence of the two token lists.
pub fn rouge_l(target: &[String], prediction: &[String]) -> Score {
    if target.is_empty() || prediction.is_empty() {
        return Score::default();
    }
    let lcs = lcs_table(target, prediction)[target.len()][prediction.len()] as f64;
    Score::new(lcs / prediction.len() as f64, lcs / target.len() as f64)
}

/// ROUGE-Lsum: for each target sentence, the union of its LCS with every predicted sentence;
/// each token counted at most as often as it occurs in both texts (`_summary_level_lcs`).
pub fn rouge_lsum(target: &[Vec<String>], prediction: &[Vec<String>]) -> Score {
    let target_len: usize = target.iter().map(Vec::len).sum();
    let prediction_len: usize = prediction.iter().map(Vec::len).sum();
    if target_len == 0 || prediction_len == 0 {
        return Score::default();
    }
    let mut target_counts: HashMap<&str, usize> = HashMap::new();
    let mut prediction_counts: HashMap<&str, usize> = HashMap::new();
    for t in target.iter().flatten() {
        *target_counts.entry(t).or_insert(0) += 1;
    }
    for t in prediction.iter().flatten() {
        *prediction_counts.entry(t).or_insert(0) += 1;
    }
    let mut hits = 0usize;
    for sentence in target {
        let mut union: Vec<usize> = prediction
            .iter()
            .flat_map(|candidate| lcs_indices(sentence, candidate))
            .collect();
        union.sort_unstable();
        union.dedup();
        for token in union.into_iter().map(|i| sentence[i].as_str()) {
            let (Some(r), Some(c)) = (
                target_counts.get_mut(token),
                prediction_counts.get_mut(token),
            ) else {
                continue;
            };
            if *r > 0 && *c > 0 {
                hits += 1;
                *r -= 1;
                *c -= 1;
            }
        }
    }
    Score::new(
        hits as f64 / prediction_len as f64,
        hits as f64 / target_len as f64,
    )
}

/// Sentences for ROUGE-Lsum: the text split on `"\n"`, empty lines dropped, each tokenized.
fn sentences(text: &str, stem: bool) -> Vec<Vec<String>> {
    text.split('\n')
        .filter(|s| !s.is_empty())
        .map(|s| tokenize(s, stem))
        .collect()
}

/// `RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"]).score(target, prediction)` after
/// the chosen preparation.
pub fn score(target: &str, prediction: &str, options: RougeOptions) -> RougeScores {
    let target = options.prep.apply(target);
    let prediction = options.prep.apply(prediction);
    let t = tokenize(&target, options.stem);
    let p = tokenize(&prediction, options.stem);
    RougeScores {
        rouge1: rouge_n(&t, &p, 1),
        rouge2: rouge_n(&t, &p, 2),
        rouge_l: rouge_l(&t, &p),
        rouge_lsum: rouge_lsum(
            &sentences(&target, options.stem),
            &sentences(&prediction, options.stem),
        ),
    }
}

/// Corpus ROUGE: the mean F-measure of each score over the pairs, ×100.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CorpusRouge {
    pub rouge1: f64,
    pub rouge2: f64,
    #[serde(rename = "rougeL")]
    pub rouge_l: f64,
    #[serde(rename = "rougeLsum")]
    pub rouge_lsum: f64,
    /// Number of pairs.
    pub n: usize,
}

/// Scores `(target, prediction)` pairs and averages the F-measures (×100).
pub fn corpus<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    options: RougeOptions,
) -> CorpusRouge {
    let mut sum = CorpusRouge::default();
    for (target, prediction) in pairs {
        let s = score(target, prediction, options);
        sum.rouge1 += s.rouge1.fmeasure;
        sum.rouge2 += s.rouge2.fmeasure;
        sum.rouge_l += s.rouge_l.fmeasure;
        sum.rouge_lsum += s.rouge_lsum.fmeasure;
        sum.n += 1;
    }
    let scale = if sum.n == 0 {
        0.0
    } else {
        100.0 / sum.n as f64
    };
    CorpusRouge {
        rouge1: sum.rouge1 * scale,
        rouge2: sum.rouge2 * scale,
        rouge_l: sum.rouge_l * scale,
        rouge_lsum: sum.rouge_lsum * scale,
        n: sum.n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: &str = "The quick brown fox jumps over the lazy dog.\nIt was running fast.";
    const PREDICTION: &str = "A quick brown dog jumped over the lazy foxes. It runs.";

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 5e-7
    }

    /// Scores computed by rouge-score 0.1.2 (no T5 preparation).
    #[test]
    fn known_values_of_the_reference_package() {
        let plain = RougeOptions {
            stem: false,
            prep: SummaryPrep::None,
        };
        let s = score(TARGET, PREDICTION, plain);
        assert!(close(s.rouge1.fmeasure, 0.583333), "{s:?}");
        assert!(close(s.rouge2.fmeasure, 0.272727), "{s:?}");
        assert!(close(s.rouge_l.fmeasure, 0.5), "{s:?}");
        let stemmed = score(
            TARGET,
            PREDICTION,
            RougeOptions {
                stem: true,
                ..plain
            },
        );
        assert!(close(stemmed.rouge1.fmeasure, 0.833333), "{stemmed:?}");
        assert!(close(stemmed.rouge2.fmeasure, 0.363636), "{stemmed:?}");
        assert!(close(stemmed.rouge_l.fmeasure, 0.666667), "{stemmed:?}");
    }

    #[test]
    fn tokenizer_drops_non_ascii_letters_and_stems_long_tokens_only() {
        assert_eq!(tokenize("Café, RUNS!", false), ["caf", "runs"]);
        assert_eq!(tokenize("Café runs running", true), ["caf", "run", "run"]);
        assert_eq!(tokenize("ties", true), ["tie"]);
        assert_eq!(tokenize("is", true), ["is"]);
    }

    #[test]
    fn lsum_without_newlines_equals_l_and_empty_texts_score_zero() {
        let t = tokenize("a b c d e", false);
        let p = tokenize("a c e b", false);
        assert_eq!(
            rouge_lsum(std::slice::from_ref(&t), std::slice::from_ref(&p)),
            rouge_l(&t, &p)
        );
        assert_eq!(rouge_l(&t, &[]), Score::default());
        assert_eq!(rouge_n(&[], &p, 2).fmeasure, 0.0);
    }
}
