//! Compiles in every experiment's configs: for each folder `configs/<id>/` with `smoke.toml`,
//! `cpu.toml` and `paper.toml` (and optionally `base.toml`, what the three share), a match arm of
//! `configs::builtin` / `configs::base`, so that adding an experiment's configs needs no code.
//! And the commit the binaries are built from (`REPRO_BUILD_COMMIT`, `-dirty` with uncommitted
//! changes to tracked files outside `results/` and `runs/`): what their provenance records, so that
//! a long run records the code that ran even after the working tree moves on.

use std::fmt::Write as _;
use std::path::Path;

const PROFILES: [&str; 3] = ["smoke", "cpu", "paper"];

include!("../crates/training/src/git_state.rs");

/// Sets `REPRO_BUILD_COMMIT`, rerun when a commit, the index or any source file changes.
fn build_commit() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for watched in ["src", "../crates", "../Cargo.toml", "../Cargo.lock"] {
        println!(
            "cargo:rerun-if-changed={}",
            manifest.join(watched).display()
        );
    }
    if let Some(git_dir) = git_in(Some(manifest), &["rev-parse", "--absolute-git-dir"]) {
        for watched in ["HEAD", "index", "refs/heads", "packed-refs"] {
            println!("cargo:rerun-if-changed={git_dir}/{watched}");
        }
    }
    let commit = tree_commit(Some(manifest));
    println!("cargo:rustc-env=REPRO_BUILD_COMMIT={commit}");
}

fn main() {
    build_commit();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut ids: Vec<String> = std::fs::read_dir(&root)
        .expect("experiments/configs")
        .map(|e| e.expect("a configs entry").path())
        .filter(|p| p.is_dir())
        .map(|p| {
            p.file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    ids.sort();
    let mut builtin = String::new();
    let mut base = String::new();
    for id in &ids {
        let dir = root.join(id);
        println!("cargo:rerun-if-changed={}", dir.display());
        for profile in PROFILES {
            let file = dir.join(format!("{profile}.toml"));
            assert!(
                file.is_file(),
                "{} is missing: every experiment has smoke, cpu and paper configs",
                file.display()
            );
            println!("cargo:rerun-if-changed={}", file.display());
            let variant = profile[..1].to_uppercase() + &profile[1..];
            writeln!(
                builtin,
                "        ({id:?}, Profile::{variant}) => Some(include_str!({:?})),",
                file.display().to_string()
            )
            .expect("a string");
        }
        let file = dir.join("base.toml");
        if file.is_file() {
            println!("cargo:rerun-if-changed={}", file.display());
            writeln!(
                base,
                "        {id:?} => Some(include_str!({:?})),",
                file.display().to_string()
            )
            .expect("a string");
        }
    }
    let code = format!(
        "/// The built-in config of experiment `id` at `profile`, if there is one.\n\
         pub fn builtin(id: &str, profile: Profile) -> Option<&'static str> {{\n    match (id, profile) {{\n{builtin}        _ => None,\n    }}\n}}\n\n\
         /// The base config of experiment `id` (`configs/<id>/base.toml`: what its profiles share),\n\
         /// if it has one.\n\
         pub fn base(id: &str) -> Option<&'static str> {{\n    match id {{\n{base}        _ => None,\n    }}\n}}\n\n\
         /// Every experiment id with built-in configs.\n\
         pub const IDS: &[&str] = &{ids:?};\n"
    );
    let out = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("builtin_configs.rs");
    std::fs::write(out, code).expect("writing builtin_configs.rs");
}
