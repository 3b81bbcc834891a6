//! Smoke run of every experiment through the same code path as the binaries: each writes its CSV,
//! charts and provenance.

use experiments::{Cli, latency};

fn cli(id: &'static str, out: &std::path::Path, extra: &[&str]) -> Cli {
    let mut args = vec![
        "--profile".to_string(),
        "smoke".into(),
        "--out".into(),
        out.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Cli::parse(id, args).unwrap()
}

#[test]
fn table11_smoke_writes_every_row_and_file() {
    let out = std::env::temp_dir().join(format!("table11-smoke-{}", std::process::id()));
    latency::run(cli("table11", &out, &[])).unwrap();
    let csv = std::fs::read_to_string(out.join("latency.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 10 * 2, "one row per architecture and context");
    for row in &rows {
        let secs: f64 = row.split(',').nth(4).unwrap().parse().unwrap();
        assert!(secs > 0.0 && secs.is_finite(), "bad timing in {row}");
    }
    for file in [
        "latency.png",
        "latency.svg",
        "comparison.md",
        "config.json",
        "env.json",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    // --report re-renders from the CSV alone.
    std::fs::remove_file(out.join("latency.png")).unwrap();
    latency::run(cli("table11", &out, &["--report"])).unwrap();
    assert!(out.join("latency.png").is_file());
}

#[test]
fn table11_rejects_unknown_models_and_missing_results() {
    let out = std::env::temp_dir().join(format!("table11-bad-{}", std::process::id()));
    let err = latency::run(cli("table11", &out, &["--set", "models=[\"gpt5\"]"])).unwrap_err();
    assert!(err.to_string().contains("unknown model `gpt5`"), "{err}");
    let err = latency::run(cli("table11", &out.join("none"), &["--report"])).unwrap_err();
    assert!(format!("{err:#}").contains("run table11 first"), "{err:#}");
}

/// A corpus in the offline corpus's layout, so the test does not need `just data`.
fn tiny_corpus(dir: &std::path::Path) {
    for split in ["train", "validation"] {
        let texts: Vec<String> = (0..4)
            .map(|i| {
                format!("{split} {i}: ") + &"To be, or not to be, that is the question. ".repeat(4)
            })
            .collect();
        data::corpus::write_parquet(
            &dir.join(format!("data/{split}-00000-of-00001.parquet")),
            vec![(
                "text",
                std::sync::Arc::new(arrow_array::StringArray::from(texts)) as arrow_array::ArrayRef,
            )],
        )
        .unwrap();
    }
}

#[test]
fn fig6_smoke_writes_every_file_and_reruns_from_checkpoints() {
    use experiments::lm_sweep;
    let out = std::env::temp_dir().join(format!("fig6-smoke-{}", std::process::id()));
    let corpus = out.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let run = |extra: &[&str]| {
        let mut args = vec!["--set", data_dir.as_str()];
        args.extend_from_slice(extra);
        lm_sweep::run(cli("fig6", &out, &args), &|_| {
            include_str!("../configs/fig6/smoke.toml")
        })
    };
    run(&[]).unwrap();
    let csv = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    // 6 models × 2 contexts × 2 evaluations.
    assert_eq!(csv.lines().count(), 1 + 6 * 2 * 2, "{csv}");
    for file in [
        "table.md",
        "ppl_vs_hours_16.png",
        "ppl_vs_hours_32.svg",
        "config.json",
        "env.json",
        "data.json",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    let table = std::fs::read_to_string(out.join("table.md")).unwrap();
    assert!(
        table.contains("| transformer_plusplus | 16 | 4 |") && table.contains("1.00×"),
        "{table}"
    );
    // A second run finds every checkpoint finished and rewrites the same numbers.
    run(&[]).unwrap();
    let again = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    assert_eq!(csv, again);
    // A changed configuration does not silently resume another run's checkpoints.
    let err = run(&["--set", "peak_lr=0.5"]).unwrap_err();
    assert!(
        format!("{err:#}").contains("holds a run with another configuration"),
        "{err:#}"
    );
    // --report redraws from the CSV alone.
    std::fs::remove_file(out.join("table.md")).unwrap();
    lm_sweep::run(cli("fig6", &out, &["--report"]), &|_| "").unwrap();
    assert!(out.join("table.md").is_file());
    std::fs::remove_dir_all(&out).unwrap();
}

/// fig5 (masked LM) and table3 (Transformer+ baseline) at smoke scale: every file, one row per
/// evaluation, the baseline's speedup to itself 1.00×, and a masked-LM perplexity that is finite.
#[test]
fn fig5_and_table3_smoke_write_every_file() {
    use experiments::lm_sweep;
    for (id, config, baseline, models) in [
        (
            "fig5",
            include_str!("../configs/fig5/smoke.toml"),
            "transformer_plusplus",
            6,
        ),
        (
            "table3",
            include_str!("../configs/table3/smoke.toml"),
            "transformer_plus",
            4,
        ),
    ] {
        let out = std::env::temp_dir().join(format!("{id}-smoke-{}", std::process::id()));
        let corpus = out.join("corpus");
        tiny_corpus(&corpus);
        let data_dir = format!("data_dir=\"{}\"", corpus.display());
        lm_sweep::run(cli(id, &out, &["--set", data_dir.as_str()]), &|_| config).unwrap();
        let csv = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
        assert_eq!(csv.lines().count(), 1 + models * 2 * 2, "{id}: {csv}");
        for file in [
            "table.md",
            "ppl_vs_hours_16.png",
            "ppl_vs_hours_32.svg",
            "config.json",
        ] {
            assert!(out.join(file).is_file(), "{id}: {file} missing");
        }
        let table = std::fs::read_to_string(out.join("table.md")).unwrap();
        assert!(
            table.contains(&format!("| {baseline} | 16 | 4 |")) && table.contains("1.00×"),
            "{id}: {table}"
        );
        let ppl: Vec<f64> = csv
            .lines()
            .skip(1)
            .map(|l| l.split(',').nth(8).unwrap().parse().unwrap())
            .collect();
        assert!(
            ppl.iter().all(|p| p.is_finite() && *p > 1.0),
            "{id}: {ppl:?}"
        );
        std::fs::remove_dir_all(&out).unwrap();
    }
}

/// A variant from the command line (no recompiling): FLASH with another chunk size is trained and
/// reported beside the others; a misspelt field is refused with its name.
#[test]
fn a_variant_from_set_is_trained_beside_the_models() {
    use experiments::lm_sweep;
    let out = std::env::temp_dir().join(format!("variant-smoke-{}", std::process::id()));
    let corpus = out.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let config = include_str!("../configs/table3/smoke.toml");
    let variant = r#"variants=[{name="flash_c4", model="flash", set={chunk_size=4}}]"#;
    let args = ["--set", data_dir.as_str(), "--set", variant];
    lm_sweep::run(cli("table3", &out, &args), &|_| config).unwrap();
    let csv = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    assert_eq!(
        csv.lines().filter(|l| l.starts_with("flash_c4,")).count(),
        2 * 2,
        "{csv}"
    );
    let table = std::fs::read_to_string(out.join("table.md")).unwrap();
    assert!(table.contains("| flash_c4 | 16 | 4 |"), "{table}");
    let run_config = std::fs::read_to_string(out.join("runs/flash_c4-16/run_config.json")).unwrap();
    assert!(run_config.contains("\"chunk_size\": 4"), "{run_config}");

    let bad = r#"variants=[{name="x", model="flash", set={chunk=4}}]"#;
    let err = lm_sweep::run(
        cli(
            "table3",
            &out.join("bad"),
            &["--set", data_dir.as_str(), "--set", bad],
        ),
        &|_| config,
    )
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("`chunk` is not a model-config field"),
        "{err:#}"
    );
    std::fs::remove_dir_all(&out).unwrap();
}
