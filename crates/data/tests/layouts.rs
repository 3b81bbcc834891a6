//! Every dataset read through the user's code path (`datasets peek --data-dir`) from files written
//! in its hub layout and schema; bad input gives one-line errors naming the file and the fix.

mod common;

use common::*;
use serde_json::json;

#[test]
fn every_hub_dataset_reads_from_its_layout() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_all_fixtures(root);

    let c4 = peek("c4", "train", root);
    let texts: Vec<&str> = c4.iter().map(|e| e["text"].as_str().unwrap()).collect();
    assert_eq!(
        texts,
        [
            "c4 doc 0-0",
            "c4 doc 0-1",
            "c4 doc 0-2",
            "c4 doc 1-0",
            "c4 doc 1-1",
            "c4 doc 1-2"
        ]
    );
    assert_eq!(
        peek("c4", "validation", root),
        [json!({"text": "c4 validation doc"})]
    );

    assert_eq!(
        peek("wiki40b", "train", root),
        [
            json!({"text": "Ada Lovelace\n\nLife\n\nBorn 1815.\nDied 1852."}),
            json!({"text": "Charles Babbage\n\nMathematician."})
        ]
    );
    assert_eq!(
        peek("pg19", "train", root),
        [
            json!({"text": "Chapter I. It was a dark night."}),
            json!({"text": "Chapter I. Morning came."})
        ]
    );
    assert_eq!(
        peek("trivia_qa", "validation", root),
        [json!({
            "question": "Which city hosted the 1900 Olympics?",
            "context": "Paris hosted the 1900 Summer Olympics.\nThe 1900 Games were held in Paris, France.",
            "answers": ["paris", "paree"]
        })]
    );
    assert_eq!(
        peek("cnn_dailymail", "test", root),
        [json!({"source": "(CNN) A long article about a storm.", "target": "A storm came."})]
    );
    // arXiv and PubMed share one layout (`section/{split}-*.parquet`): side by side under one
    // root, each is read from its own folder only.
    for name in ["arxiv", "pubmed"] {
        assert_eq!(
            peek(name, "validation", root),
            [
                json!({"source": format!("{name} article one"), "target": format!("{name} abstract one")}),
                json!({"source": format!("{name} article two"), "target": format!("{name} abstract two")})
            ]
        );
    }
    assert_eq!(
        peek("mediasum", "test", root),
        [
            json!({"source": "HOST: Welcome to the show.\nGUEST: Thank you.", "target": "A host interviews a guest."})
        ]
    );
    assert_eq!(
        peek("multi_news", "validation", root),
        [
            json!({"source": "First story \n second line\n\nSecond story", "target": "Two stories."}),
            json!({"source": "Only story", "target": "One story."})
        ]
    );
    assert_eq!(
        peek("wmt14_de_en", "validation", root),
        [
            json!({"source": "Good morning.", "target": "Guten Morgen."}),
            json!({"source": "Thank you.", "target": "Danke."})
        ]
    );
}

fn one_line_error(args: &[&str]) -> String {
    let (code, out, err) = datasets(args, &[]);
    assert_ne!(code, 0, "expected failure, got {out}");
    assert_eq!(err.trim().lines().count(), 1, "not one line: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    err
}

#[test]
fn bad_input_gives_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_all_fixtures(root);
    let d = root.to_str().unwrap().to_string();

    // A truncated parquet file: the error names it and says to fetch it again.
    let file = root.join("pg19/data/train-00000-of-00023-3f2a1b.parquet");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let err = one_line_error(&["peek", "pg19", "--split", "train", "--data-dir", &d]);
    assert!(
        err.contains("train-00000-of-00023-3f2a1b.parquet") && err.contains("fetch it again"),
        "{err}"
    );

    // A corrupt page inside an intact footer.
    let file = root.join("wiki40b/en/train-00000-of-00019.parquet");
    let mut bytes = std::fs::read(&file).unwrap();
    for b in &mut bytes[8..40] {
        *b = 0xAB;
    }
    std::fs::write(&file, &bytes).unwrap();
    let err = one_line_error(&["peek", "wiki40b", "--split", "train", "--data-dir", &d]);
    assert!(err.contains("train-00000-of-00019.parquet"), "{err}");

    // A missing column: named, with the columns the file has.
    write_parquet(
        &root.join("cnn_dailymail/3.0.0/train-00000-of-00003.parquet"),
        vec![("article", utf8(&["text"])), ("id", utf8(&["1"]))],
        16,
        Strings::Plain,
    );
    let err = one_line_error(&[
        "peek",
        "cnn_dailymail",
        "--split",
        "train",
        "--data-dir",
        &d,
    ]);
    assert!(
        err.contains("no column `highlights`") && err.contains("train-00000-of-00003.parquet"),
        "{err}"
    );

    // A truncated json.gz shard.
    let file = root.join("c4/en/c4-validation.00000-of-00008.json.gz");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 12]).unwrap();
    let err = one_line_error(&["peek", "c4", "--split", "validation", "--data-dir", &d]);
    assert!(
        err.contains("c4-validation.00000-of-00008.json.gz"),
        "{err}"
    );

    // Nothing in the layout: the expected file names and how to provide them.
    let err = one_line_error(&["peek", "arxiv", "--split", "train", "--data-dir", &d]);
    assert!(
        err.contains("section/train-NNNNN-of-MMMMM.parquet")
            && err.contains(&root.join("arxiv").display().to_string()),
        "{err}"
    );

    // A hub dataset with no folder under the root falls back to the hub cache; with none there
    // either, the error names the folder looked for and the fetch command.
    std::fs::remove_dir_all(root.join("mediasum")).unwrap();
    let home = tempfile::tempdir().unwrap();
    let (code, _, err) = datasets(
        &[
            "peek",
            "mediasum",
            "--split",
            "test",
            "--data-dir",
            &d,
            "--offline",
        ],
        &[("HF_HOME", home.path().to_str().unwrap())],
    );
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    for needle in [
        root.join("mediasum").display().to_string(),
        "datasets fetch mediasum".to_string(),
    ] {
        assert!(err.contains(&needle), "missing {needle}: {err}");
    }

    // Unknown names and values.
    let err = one_line_error(&["peek", "c5", "--split", "train"]);
    assert!(
        err.contains("unknown dataset `c5`") && err.contains("wmt14_de_en"),
        "{err}"
    );
    let err = one_line_error(&["peek", "c4", "--split", "dev2"]);
    assert!(err.contains("unknown split `dev2`"), "{err}");
    let err = one_line_error(&["stats", "c4", "--tokenizer", "wordpiece:9"]);
    assert!(err.contains("unknown tokenizer"), "{err}");
}

/// A dataset's own folder (a config's `data_dirs`) comes before the root's folder of its name;
/// the other datasets keep theirs; a folder for a name the registry lacks is refused.
#[test]
fn a_dataset_folder_of_its_own_overrides_the_root() {
    use data::registry::{Split, lookup};
    use data::source::{SourceOptions, split_files};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("hub");
    write_all_fixtures(&root);
    let own = dir.path().join("my-arxiv");
    write_parquet(
        &own.join("section/validation-00000-of-00001.parquet"),
        vec![
            ("article", utf8(&["mine"])),
            ("abstract", utf8(&["my abstract"])),
            ("section_names", utf8(&["s"])),
        ],
        16,
        Strings::Plain,
    );
    let dirs = [("arxiv".to_string(), own.display().to_string())].into();
    let opts = SourceOptions::from_config(root.to_str().unwrap(), &dirs).unwrap();
    let arxiv = split_files(lookup("arxiv").unwrap(), Split::Validation, &opts).unwrap();
    assert!(arxiv.iter().all(|f| f.starts_with(&own)), "{arxiv:?}");
    let pubmed = split_files(lookup("pubmed").unwrap(), Split::Validation, &opts).unwrap();
    assert!(
        !pubmed.is_empty() && pubmed.iter().all(|f| f.starts_with(root.join("pubmed"))),
        "{pubmed:?}"
    );
    let bad = [("arxive".to_string(), "x".to_string())].into();
    let err = SourceOptions::from_config("", &bad)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("arxive") && err.contains("datasets list"),
        "{err}"
    );
}
