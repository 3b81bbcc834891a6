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
