//! Corpus BLEU as sacrebleu 2.6.0 computes it (`metrics/bleu.py`, `tokenizers/tokenizer_13a.py`,
//! `tokenizer_re.py`, `tokenizer_intl.py`), with its defaults: 4-gram, 'exp' smoothing, no
//! lowercasing, closest reference length (ties to the shorter).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::LazyLock;

use anyhow::{Result, bail};
use regex::Regex;
use serde::Serialize;

use crate::text::{py_collapse_whitespace, py_rstrip, py_split};

/// The highest n-gram order (sacrebleu's `max_ngram_order`).
pub const MAX_ORDER: usize = 4;

/// sacrebleu's `my_log(0)`: a zero precision makes the score 0 without a -inf.
const LOG_ZERO: f64 = -9_999_999_999.0;

/// How segments are tokenized before counting n-grams. The GQA paper does not say; sacrebleu's
/// default `13a` is ours (T5's WMT numbers used `intl`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum BleuTokenizer {
    /// mteval-v13a, sacrebleu's default and WMT's standard.
    #[default]
    #[serde(rename = "13a")]
    Thirteen,
    /// mteval-v14 international: split Unicode punctuation not between digits, split symbols.
    #[serde(rename = "intl")]
    Intl,
    /// Whitespace only.
    #[serde(rename = "none")]
    None,
}

impl FromStr for BleuTokenizer {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "13a" => Self::Thirteen,
            "intl" => Self::Intl,
            "none" => Self::None,
            other => bail!("unknown BLEU tokenizer `{other}`: choose 13a, intl or none"),
        })
    }
}

/// The regular expressions of `TokenizerRegexp` (13a's second half), in order.
static RE_13A: LazyLock<[(Regex, &str); 4]> = LazyLock::new(|| {
    let re = |p: &str| Regex::new(p).expect("valid 13a pattern");
    [
        // Language-dependent part (Western languages): `{|}~ [\]^_` space!"#$%& ()*+ :;<=>?@ /`.
        (
            re(r"([\x7B-\x7E\x5B-\x60\x20-\x26\x28-\x2B\x3A-\x40\x2F])"),
            " ${1} ",
        ),
        // Period and comma unless preceded by a digit.
        (re(r"([^0-9])([.,])"), "${1} ${2} "),
        // Period and comma unless followed by a digit.
        (re(r"([.,])([^0-9])"), " ${1} ${2}"),
        // Dash when preceded by a digit.
        (re(r"([0-9])(-)"), "${1} ${2} "),
    ]
});

/// The regular expressions of `TokenizerV14International`, in order.
static RE_INTL: LazyLock<[(Regex, &str); 3]> = LazyLock::new(|| {
    let re = |p: &str| Regex::new(p).expect("valid intl pattern");
    [
        (re(r"(\P{N})(\p{P})"), "${1} ${2} "),
        (re(r"(\p{P})(\P{N})"), " ${1} ${2}"),
        (re(r"(\p{S})"), " ${1} "),
    ]
});

fn substitute_all(mut line: String, rules: &[(Regex, &str)]) -> String {
    for (re, replacement) in rules {
        line = re.replace_all(&line, *replacement).into_owned();
    }
    line
}

impl BleuTokenizer {
    /// Tokenizes one segment; tokens are separated by single spaces.
    pub fn tokenize(self, line: &str) -> String {
        match self {
            BleuTokenizer::Thirteen => {
                let mut line = line
                    .replace("<skipped>", "")
                    .replace("-\n", "")
                    .replace('\n', " ");
                if line.contains('&') {
                    line = line
                        .replace("&quot;", "\"")
                        .replace("&amp;", "&")
                        .replace("&lt;", "<")
                        .replace("&gt;", ">");
                }
                py_collapse_whitespace(&substitute_all(format!(" {line} "), &*RE_13A))
            }
            BleuTokenizer::Intl => {
                py_collapse_whitespace(&substitute_all(line.to_string(), &*RE_INTL))
            }
            BleuTokenizer::None => line.to_string(),
        }
    }

    /// sacrebleu's signature name.
    pub fn name(self) -> &'static str {
        match self {
            BleuTokenizer::Thirteen => "13a",
            BleuTokenizer::Intl => "intl",
            BleuTokenizer::None => "none",
        }
    }
}

/// All n-grams of orders 1..=MAX_ORDER of a tokenized segment, and its length in tokens.
fn ngrams(tokenized: &str) -> (HashMap<Vec<&str>, usize>, usize) {
    let tokens: Vec<&str> = py_split(tokenized).collect();
    let mut counts = HashMap::new();
    for n in 1..=MAX_ORDER {
        for gram in tokens.windows(n) {
            *counts.entry(gram.to_vec()).or_insert(0) += 1;
        }
    }
    (counts, tokens.len())
}

/// The reference length closest to the hypothesis length, ties to the shorter
/// (`_get_closest_ref_len`).
fn closest_reference_length(hyp_len: usize, ref_lens: &[usize]) -> usize {
    let mut best: Option<(usize, usize)> = None; // (length, distance)
    for &len in ref_lens {
        let diff = hyp_len.abs_diff(len);
        best = match best {
            Some((best_len, best_diff))
                if diff > best_diff || (diff == best_diff && len >= best_len) =>
            {
                Some((best_len, best_diff))
            }
            _ => Some((len, diff)),
        };
    }
    best.map_or(0, |(len, _)| len)
}

/// The sufficient statistics of corpus BLEU, summed over segments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BleuStats {
    pub sys_len: usize,
    pub ref_len: usize,
    /// Matched n-grams per order, each clipped by its maximum count in any one reference.
    pub correct: [usize; MAX_ORDER],
    /// Hypothesis n-grams per order.
    pub total: [usize; MAX_ORDER],
}

impl BleuStats {
    /// Statistics of one segment against its references.
    pub fn segment(hypothesis: &str, references: &[&str], tokenizer: BleuTokenizer) -> Self {
        let hyp = tokenizer.tokenize(py_rstrip(hypothesis));
        let refs: Vec<String> = references
            .iter()
            .map(|r| tokenizer.tokenize(py_rstrip(r)))
            .collect();
        let mut max_ref_counts: HashMap<Vec<&str>, usize> = HashMap::new();
        let mut ref_lens = Vec::with_capacity(refs.len());
        for r in &refs {
            let (counts, len) = ngrams(r);
            ref_lens.push(len);
            for (gram, count) in counts {
                let slot = max_ref_counts.entry(gram).or_insert(0);
                *slot = (*slot).max(count);
            }
        }
        let (hyp_counts, hyp_len) = ngrams(&hyp);
        let mut stats = BleuStats {
            sys_len: hyp_len,
            ref_len: closest_reference_length(hyp_len, &ref_lens),
            ..Default::default()
        };
        for (gram, count) in &hyp_counts {
            let order = gram.len() - 1;
            stats.total[order] += count;
            if let Some(&max_ref) = max_ref_counts.get(gram) {
                stats.correct[order] += (*count).min(max_ref);
            }
        }
        stats
    }

    /// Adds another segment's statistics (corpus BLEU sums them before computing the score).
    pub fn add(&mut self, other: &BleuStats) {
        self.sys_len += other.sys_len;
        self.ref_len += other.ref_len;
        for n in 0..MAX_ORDER {
            self.correct[n] += other.correct[n];
            self.total[n] += other.total[n];
        }
    }
}

/// A corpus BLEU score and its parts, as sacrebleu's `BLEUScore`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BleuScore {
    /// BLEU ×100.
    pub bleu: f64,
    /// Smoothed n-gram precisions ×100.
    pub precisions: [f64; MAX_ORDER],
    /// Brevity penalty.
    pub bp: f64,
    pub sys_len: usize,
    pub ref_len: usize,
    pub tokenize: &'static str,
    /// Number of segments.
    pub n: usize,
}

/// `compute_bleu` with 'exp' smoothing (mteval's: each order with no match gets
/// `100 / (2^k · total)` for its k-th such order) and no effective order.
pub fn compute(stats: &BleuStats) -> ([f64; MAX_ORDER], f64, f64) {
    let mut precisions = [0.0; MAX_ORDER];
    let bp = if stats.sys_len < stats.ref_len {
        if stats.sys_len > 0 {
            (1.0 - stats.ref_len as f64 / stats.sys_len as f64).exp()
        } else {
            0.0
        }
    } else {
        1.0
    };
    if stats.correct[0] == 0 {
        return (precisions, bp, 0.0);
    }
    let mut smooth = 1.0;
    for (p, (&correct, &total)) in precisions
        .iter_mut()
        .zip(stats.correct.iter().zip(&stats.total))
    {
        if total == 0 {
            break;
        }
        *p = if correct == 0 {
            smooth *= 2.0;
            100.0 / (smooth * total as f64)
        } else {
            100.0 * correct as f64 / total as f64
        };
    }
    let log_sum: f64 = precisions
        .iter()
        .map(|&p| if p == 0.0 { LOG_ZERO } else { p.ln() })
        .sum();
    (precisions, bp, bp * (log_sum / MAX_ORDER as f64).exp())
}

/// `corpus_bleu(hypotheses, references)` where segment i has its own list of references.
pub fn corpus<'a>(
    segments: impl IntoIterator<Item = (&'a str, Vec<&'a str>)>,
    tokenizer: BleuTokenizer,
) -> BleuScore {
    let mut stats = BleuStats::default();
    let mut n = 0;
    for (hypothesis, references) in segments {
        stats.add(&BleuStats::segment(hypothesis, &references, tokenizer));
        n += 1;
    }
    let (precisions, bp, bleu) = compute(&stats);
    BleuScore {
        bleu,
        precisions,
        bp,
        sys_len: stats.sys_len,
        ref_len: stats.ref_len,
        tokenize: tokenizer.name(),
        n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores computed by sacrebleu 2.6.0.
    #[test]
    fn known_values_of_the_reference_package() {
        let segments = || {
            vec![
                ("The cat sat on the mat.", vec!["The cat is on the mat."]),
                ("Hello , world 2023.", vec!["Hello, world 2023."]),
            ]
        };
        let thirteen = corpus(segments(), BleuTokenizer::Thirteen);
        assert!((thirteen.bleu - 69.189129).abs() < 5e-6, "{thirteen:?}");
        let intl = corpus(segments(), BleuTokenizer::Intl);
        assert!((intl.bleu - 63.404663).abs() < 5e-6, "{intl:?}");
    }

    #[test]
    fn tokenizers_split_as_mteval() {
        let t = BleuTokenizer::Thirteen;
        assert_eq!(t.tokenize("Hello, world 2023."), "Hello , world 2023 .");
        assert_eq!(
            t.tokenize("3.5 and 1,000 - 2-3 &amp; x"),
            "3.5 and 1,000 - 2 - 3 & x"
        );
        // intl leaves a year's final dot attached (mteval-v14's known quirk, kept by sacrebleu).
        assert_eq!(
            BleuTokenizer::Intl.tokenize("Hello, world 2023."),
            "Hello , world 2023."
        );
        assert_eq!(BleuTokenizer::Intl.tokenize("a$b"), "a $ b");
    }

    #[test]
    fn closest_reference_length_prefers_the_shorter_on_ties() {
        assert_eq!(closest_reference_length(5, &[7, 3]), 3);
        assert_eq!(closest_reference_length(5, &[3, 7]), 3);
        assert_eq!(closest_reference_length(5, &[9, 6, 4]), 4);
    }
}
