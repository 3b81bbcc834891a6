//! The `score` binary: one JSON object of ×100 scores per file, and one-line errors for bad input.

use std::process::Command;

fn score(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_score"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &std::path::Path, name: &str, lines: &[serde_json::Value]) -> String {
    let path = dir.join(name);
    let text: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn scores_each_metric_as_the_papers_report_it() {
    let dir = tempfile::tempdir().unwrap();
    let rouge = write(
        dir.path(),
        "rouge.jsonl",
        &[serde_json::json!({
            "target": "The quick brown fox jumps over the lazy dog.\nIt was running fast.",
            "prediction": "A quick brown dog jumped over the lazy foxes. It runs."
        })],
    );
    let (ok, out, err) = score(&["rouge", "--input", &rouge, "--stem"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        (v["rouge1"].as_f64().unwrap() - 83.3333).abs() < 1e-3,
        "{v}"
    );
    assert_eq!(v["n"], 1);

    let bleu = write(
        dir.path(),
        "bleu.jsonl",
        &[
            serde_json::json!({"hypothesis": "The cat sat on the mat.", "references": ["The cat is on the mat."]}),
            serde_json::json!({"hypothesis": "Hello , world 2023.", "references": ["Hello, world 2023."]}),
        ],
    );
    let (ok, out, err) = score(&["bleu", "--input", &bleu, "--tokenize", "intl"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        (v["bleu"].as_f64().unwrap() - 63.404663).abs() < 1e-5,
        "{v}"
    );
    assert_eq!(v["tokenize"], "intl");

    let qa = write(
        dir.path(),
        "qa.jsonl",
        &[
            serde_json::json!({"prediction": "The Beatles!", "answers": ["beatles", "the fab four"]}),
            serde_json::json!({"prediction": null, "answers": ["x"]}),
        ],
    );
    let (ok, out, err) = score(&["triviaqa", "--input", &qa]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["exact_match"], 50.0);
    assert_eq!(v["f1"], 50.0);
}

#[test]
fn bad_input_fails_with_one_line_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let wrong_fields = write(
        dir.path(),
        "wrong.jsonl",
        &[
            serde_json::json!({"target": "a", "prediction": "b"}),
            serde_json::json!({"hyp": "a"}),
        ],
    );
    let broken = dir.path().join("broken.jsonl");
    std::fs::write(&broken, "{\"target\": \"a\", \"prediction\": \n").unwrap();
    let broken = broken.display().to_string();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    let empty = empty.display().to_string();
    for (args, needle) in [
        (
            vec!["rouge", "--input", "no/such.jsonl"],
            "cannot read no/such.jsonl",
        ),
        (vec!["rouge", "--input", &wrong_fields], "wrong.jsonl:2"),
        (vec!["bleu", "--input", &wrong_fields], "wrong.jsonl:1"),
        (vec!["rouge", "--input", &broken], "broken.jsonl:1"),
        (vec!["rouge", "--input", &empty], "no lines to score"),
    ] {
        let (ok, _, err) = score(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
    // Usage errors are clap's (the option or value named, the choices or the usage shown).
    for (args, needle) in [
        (vec!["meteor", "--input", &empty], "invalid value 'meteor'"),
        (
            vec!["bleu", "--input", &empty, "--tokenize", "zh"],
            "unknown BLEU tokenizer `zh`",
        ),
        (vec!["rouge"], "--input <FILE.jsonl>"),
        (vec!["rouge", "--input"], "--input <FILE.jsonl>"),
        (
            vec!["rouge", "--input", &empty, "--summary-prep", "x"],
            "unknown summary prep `x`",
        ),
    ] {
        let (ok, _, err) = score(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
    }
}
