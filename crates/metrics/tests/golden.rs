//! Our metrics against golden values computed by the reference packages (rouge-score 0.1.2,
//! sacrebleu 2.6.0, NLTK's Porter stemmer) with `tests/golden/make_golden.py`; the versions used
//! are in `tests/golden/VERSIONS`.

use metrics::bleu::{self, BleuStats, BleuTokenizer};
use metrics::porter;
use metrics::rouge::{self, RougeOptions, SummaryPrep};
use serde_json::Value;

fn golden(name: &str) -> String {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn assert_close(ours: f64, reference: f64, what: &str) {
    assert!(
        (ours - reference).abs() <= 1e-9 * reference.abs().max(1.0),
        "{what}: ours {ours}, reference {reference}"
    );
}

#[test]
fn porter_stems_equal_nltk() {
    let table: serde_json::Map<String, Value> =
        serde_json::from_str(&golden("porter.json")).unwrap();
    assert!(
        table.len() > 100,
        "golden stem table too small: {}",
        table.len()
    );
    let wrong: Vec<String> = table
        .iter()
        .filter(|(word, stem)| porter::stem(word) != stem.as_str().unwrap())
        .map(|(word, stem)| format!("{word}: ours {}, nltk {stem}", porter::stem(word)))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn rouge_equals_rouge_score() {
    let text = golden("rouge.jsonl");
    let mut rows = 0;
    for line in text.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        let target = row["target"].as_str().unwrap();
        let prediction = row["prediction"].as_str().unwrap();
        for (variant, stem, prep) in [
            ("plain", false, SummaryPrep::None),
            ("stem", true, SummaryPrep::None),
            ("t5", false, SummaryPrep::T5),
        ] {
            let ours = rouge::score(target, prediction, RougeOptions { stem, prep });
            for (key, score) in [
                ("rouge1", ours.rouge1),
                ("rouge2", ours.rouge2),
                ("rougeL", ours.rouge_l),
                ("rougeLsum", ours.rouge_lsum),
            ] {
                let reference = &row[variant][key];
                for (i, value) in [score.precision, score.recall, score.fmeasure]
                    .iter()
                    .enumerate()
                {
                    let what = format!("{variant} {key}[{i}] of {target:?} / {prediction:?}");
                    assert_close(*value, reference[i].as_f64().unwrap(), &what);
                }
            }
        }
        rows += 1;
    }
    assert!(rows >= 10, "only {rows} golden ROUGE rows");
}

#[test]
fn bleu_equals_sacrebleu() {
    let corpora: Vec<Value> = serde_json::from_str(&golden("bleu.json")).unwrap();
    assert!(corpora.len() >= 5);
    for corpus in &corpora {
        let segments: Vec<(&str, Vec<&str>)> = corpus["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let refs = s["references"].as_array().unwrap();
                (
                    s["hypothesis"].as_str().unwrap(),
                    refs.iter().map(|r| r.as_str().unwrap()).collect(),
                )
            })
            .collect();
        for (name, tokenizer) in [
            ("13a", BleuTokenizer::Thirteen),
            ("intl", BleuTokenizer::Intl),
        ] {
            let reference = &corpus[name];
            let what = format!("{name} on {:?}", segments[0].0);
            let mut stats = BleuStats::default();
            for (h, r) in &segments {
                stats.add(&BleuStats::segment(h, r, tokenizer));
            }
            let counts: Vec<usize> = reference["counts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let totals: Vec<usize> = reference["totals"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(stats.correct.to_vec(), counts, "{what}: matched n-grams");
            assert_eq!(stats.total.to_vec(), totals, "{what}: hypothesis n-grams");
            assert_eq!(
                stats.sys_len as u64,
                reference["sys_len"].as_u64().unwrap(),
                "{what}"
            );
            assert_eq!(
                stats.ref_len as u64,
                reference["ref_len"].as_u64().unwrap(),
                "{what}"
            );
            let ours = bleu::corpus(segments.clone(), tokenizer);
            assert_close(ours.bleu, reference["bleu"].as_f64().unwrap(), &what);
            assert_close(ours.bp, reference["bp"].as_f64().unwrap(), &what);
        }
    }
}
