//! The README's "Use the real datasets" walkthrough: its `./just repro` lines (dry runs) run as
//! written against a local hub serving PG-19's layout; the dry run's data lines report the split's
//! size from the hub's listing, or the folder under `$DATASETS`. Its `./just datasets` lines are run
//! by `crates/data/tests/walkthrough.rs`. One test in its own binary: the experiment binaries are
//! pointed at the local hub through the environment of each command.

#[path = "../../crates/data/tests/common/hub_server.rs"]
#[allow(dead_code)]
mod hub_server;
#[path = "../../crates/data/tests/common/walkthrough.rs"]
mod walkthrough;

use std::collections::BTreeMap;
use std::process::Command;

use walkthrough::{Command as Line, commands};

#[test]
fn the_readme_repro_commands_run() {
    // The dry run lists files and never reads them: any bytes in PG-19's names will do.
    let files: BTreeMap<String, Vec<u8>> = [
        ("data/train-00000-of-00002-aa11.parquet", 3_000_000),
        ("data/train-00001-of-00002-bb22.parquet", 2_000_000),
        ("data/validation-00000-of-00001-cc33.parquet", 700_000),
        ("data/test-00000-of-00001-dd44.parquet", 500_000),
    ]
    .into_iter()
    .map(|(name, size)| (name.to_string(), vec![7u8; size]))
    .collect();
    let hub = hub_server::Hub::start_repo("emozilla/pg19", files);
    let home = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    for split in ["train", "validation", "test"] {
        let path = local
            .path()
            .join(format!("pg19/data/{split}-00000-of-00001.parquet"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, vec![1u8; 1_500_000]).unwrap();
    }
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let lines = commands(&readme, local.path().to_str().unwrap());
    let repro: Vec<(&String, &Vec<String>)> = lines
        .iter()
        .filter_map(|l| match l {
            Line::Repro { id, args } => Some((id, args)),
            Line::Datasets(_) => None,
        })
        .collect();
    assert!(repro.len() >= 2, "{lines:?}");
    let placed = format!("placed in {}", local.path().join("pg19").display());
    for (id, args) in repro {
        assert_eq!(
            id, "table3",
            "the walkthrough's experiment has no binary here: {id}"
        );
        assert!(
            args.iter().any(|a| a == "--dry-run"),
            "a walkthrough line that trains cannot run in a test: {args:?}"
        );
        let out = Command::new(env!("CARGO_BIN_EXE_table3"))
            .args(args)
            .env("HF_ENDPOINT", hub.endpoint())
            .env("HF_HOME", home.path())
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "table3 {args:?}: {stderr}");
        if args.iter().any(|a| a.starts_with("data_dir=")) {
            for split in ["train", "validation", "test"] {
                let line = format!("- pg19 {split}: {placed}: 1 files, 1.5 MB");
                assert!(stdout.contains(&line), "missing `{line}`:\n{stdout}");
            }
        } else {
            for (split, n, mb) in [
                ("train", 2, "5.0"),
                ("validation", 1, "0.7"),
                ("test", 1, "0.5"),
            ] {
                let line = format!(
                    "- pg19 {split}: hub emozilla/pg19@main: {n} files, {mb} MB for the whole split (0.0 MB cached)"
                );
                assert!(stdout.contains(&line), "missing `{line}`:\n{stdout}");
            }
        }
    }
    // The dry runs listed the repo and downloaded nothing.
    assert!(hub.fetched().is_empty(), "{:?}", hub.fetched());
}
