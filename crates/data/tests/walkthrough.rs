//! The README's "Use the real datasets" walkthrough: its `./just datasets` lines run as written
//! against a local hub serving PG-19's layout, in their order (its `./just repro` lines are run by
//! `experiments/tests/walkthrough.rs`).

mod common;

use common::hub_server::Hub;
use common::walkthrough::{Command, commands, shell_words};
use common::*;

#[test]
fn the_readme_datasets_commands_run() {
    let files = pg19_repo();
    let hub = Hub::start_repo("emozilla/pg19", files.clone());
    let home = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    write_pg19_book(
        &local
            .path()
            .join("pg19/data/validation-00000-of-00001-cc33.parquet"),
        "The local copy.",
    );
    let endpoint = hub.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.path().to_str().unwrap()),
    ];
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let lines = commands(&readme, local.path().to_str().unwrap());
    let datasets_lines: Vec<&Vec<String>> = lines
        .iter()
        .filter_map(|c| match c {
            Command::Datasets(args) => Some(args),
            Command::Repro { .. } => None,
        })
        .collect();
    assert!(datasets_lines.len() >= 3, "{lines:?}");
    for args in datasets_lines {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let before = hub.fetched();
        let (code, out, err) = datasets(&args, &env);
        assert_eq!(code, 0, "`datasets {}` failed: {err}", args.join(" "));
        let fetched: Vec<String> = hub
            .fetched()
            .into_keys()
            .filter(|f| !before.contains_key(f))
            .collect();
        match args[..] {
            ["fetch", "pg19", "--split", "train", "--max-shards", "1"] => {
                assert!(out.contains("the first 1 of 2 files"), "{out}");
                assert_eq!(fetched, ["data/train-00000-of-00002-aa11.parquet"]);
            }
            ["fetch", "pg19", "--split", "validation"] => {
                assert_eq!(fetched, ["data/validation-00000-of-00001-cc33.parquet"]);
            }
            [
                "peek",
                "pg19",
                "--split",
                "validation",
                "--n",
                "1",
                "--data-dir",
                _,
            ] => {
                assert!(out.contains("The local copy."), "{out}");
                assert!(
                    fetched.is_empty(),
                    "the local copy was fetched: {fetched:?}"
                );
            }
            ["list"] => assert!(out.contains("emozilla/pg19")),
            _ => panic!(
                "no check for the walkthrough line `datasets {}`",
                args.join(" ")
            ),
        }
    }
}

#[test]
fn shell_words_split_as_sh_does() {
    assert_eq!(
        shell_words(
            r#"./just repro t --set "data_dir=\"$DATASETS\"" 'a b' x  # note"#,
            "/d"
        ),
        [
            "./just",
            "repro",
            "t",
            "--set",
            "data_dir=\"/d\"",
            "a b",
            "x"
        ]
    );
}
