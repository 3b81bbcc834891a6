//! Smoke run of every experiment through the same code path as the binaries: each writes its CSV,
//! charts and provenance.

use experiments::{Cli, registry};

mod common;
use common::{store_runs, tiny_corpus};

/// The smoke command line with `--out out` and the run store under it.
fn cli(id: &'static str, out: &std::path::Path, extra: &[&str]) -> Cli {
    let mut args = vec![
        "--profile".to_string(),
        "smoke".into(),
        "--out".into(),
        out.display().to_string(),
        "--store".into(),
        out.join("store").display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Cli::parse(id, "", args).unwrap()
}

#[test]
fn table11_smoke_writes_every_row_and_file() {
    let out = std::env::temp_dir().join(format!("table11-smoke-{}", std::process::id()));
    registry::run(&cli("table11", &out, &[])).unwrap();
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
    registry::run(&cli("table11", &out, &["--report"])).unwrap();
    assert!(out.join("latency.png").is_file());
}

#[test]
fn table11_rejects_unknown_models_and_missing_results() {
    let out = std::env::temp_dir().join(format!("table11-bad-{}", std::process::id()));
    let err = registry::run(&cli("table11", &out, &["--set", "models=[\"gpt5\"]"])).unwrap_err();
    assert!(err.to_string().contains("unknown model `gpt5`"), "{err}");
    let err = registry::run(&cli("table11", &out.join("none"), &["--report"])).unwrap_err();
    assert!(format!("{err:#}").contains("run table11 first"), "{err:#}");
}

#[test]
fn fig6_smoke_writes_every_file_and_reruns_from_checkpoints() {
    let out = std::env::temp_dir().join(format!("fig6-smoke-{}", std::process::id()));
    let corpus = out.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let run = |extra: &[&str]| {
        let mut args = vec!["--set", data_dir.as_str()];
        args.extend_from_slice(extra);
        registry::run_with(&cli("fig6", &out, &args), &|_| {
            include_str!("../configs/fig6/smoke.toml")
        })
    };
    // A bad value is refused before anything is written (no output directory, no store entry).
    let err = run(&["--set", "steps=0"]).unwrap_err();
    assert!(
        format!("{err:#}").contains("`steps` must be positive"),
        "{err:#}"
    );
    assert!(!out.join("config.json").exists() && !out.join("store").exists());
    run(&[]).unwrap();
    let csv = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    // 6 models × 2 contexts × 2 evaluations.
    assert_eq!(csv.lines().count(), 1 + 6 * 2 * 2, "{csv}");
    for file in [
        "table.md",
        "ppl_16.png",
        "ppl_32.svg",
        "config.json",
        "env.json",
        "data.json",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    let table = std::fs::read_to_string(out.join("table.md")).unwrap();
    assert!(
        table.contains("| transformer_plusplus | 16 | 1 | 4 |") && table.contains("1.00×"),
        "{table}"
    );
    // The step-time calibration: 6 models × 2 contexts × 2 rounds, each model's median in the table.
    let times = std::fs::read_to_string(out.join("step_times.csv")).unwrap();
    assert_eq!(times.lines().count(), 1 + 6 * 2 * 2, "{times}");
    assert!(
        table.contains("step_times.csv") && !table.contains("| † |"),
        "{table}"
    );
    // A second run finds every run finished in the store and rewrites the same numbers, also
    // without the checkpoints (committed runs carry none); the calibration is kept.
    let store = out.join("store");
    assert_eq!(store_runs(&store).len(), 6 * 2, "one store entry per run");
    for dir in store_runs(&store) {
        std::fs::remove_dir_all(dir.join("checkpoint")).unwrap();
    }
    run(&[]).unwrap();
    let again = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    assert_eq!(csv, again);
    assert_eq!(
        times,
        std::fs::read_to_string(out.join("step_times.csv")).unwrap()
    );
    // A changed configuration is another run, under another name; the first runs stay as they were.
    run(&["--set", "peak_lr=0.5"]).unwrap();
    assert_eq!(store_runs(&store).len(), 2 * 6 * 2);
    // A store entry whose configuration was edited is refused, not mixed in (the run named by
    // the first row of this sweep's metrics.csv).
    let first_run = csv.lines().nth(1).unwrap().split(',').nth(3).unwrap();
    let edited = store.join(first_run).join("run_config.json");
    std::fs::write(edited, "{\"edited\": true}").unwrap();
    let err = run(&[]).unwrap_err();
    assert!(
        format!("{err:#}").contains("holds a run with another configuration"),
        "{err:#}"
    );
    // --report redraws from the CSV alone, and fills the README's generated block with the
    // table (the README's own text kept).
    let table = std::fs::read_to_string(out.join("table.md")).unwrap();
    std::fs::remove_file(out.join("table.md")).unwrap();
    let readme =
        "# fig6\n<!-- generated: table.md -->\nstale\n<!-- end generated: table.md -->\nend\n";
    std::fs::write(out.join("README.md"), readme).unwrap();
    registry::run_with(&cli("fig6", &out, &["--report"]), &|_| "").unwrap();
    assert_eq!(
        std::fs::read_to_string(out.join("table.md")).unwrap(),
        table
    );
    let filled = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(
        filled.starts_with("# fig6\n") && filled.ends_with("end\n") && !filled.contains("stale"),
        "{filled}"
    );
    let row = table.lines().find(|l| l.starts_with("| flash |")).unwrap();
    assert!(filled.contains(row), "{filled}");
    std::fs::remove_dir_all(&out).unwrap();
}

/// Seeds: `models` train once per seed, `one_seed_models` once; table3 reuses the runs fig6 already
/// trained into the same store (same data, models, contexts and schedule), training none again.
#[test]
fn seeds_and_runs_shared_between_artifacts() {
    let out = std::env::temp_dir().join(format!("seeds-smoke-{}", std::process::id()));
    let corpus = out.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let store = out.join("store");
    let run = |id: &'static str, dir: &str, extra: &[&str], config: &'static str| {
        let mut args = vec!["--set", data_dir.as_str(), "--store"];
        let store = store.display().to_string();
        args.push(&store);
        args.extend_from_slice(extra);
        registry::run_with(&cli(id, &out.join(dir), &args), &|_| config)
    };
    let fig6 = include_str!("../configs/fig6/smoke.toml");
    let seeds = [
        "--set",
        "seeds=[0, 1]",
        "--set",
        r#"models=["transformer_plus", "transformer_plusplus", "flash_quad", "flash"]"#,
        "--set",
        r#"one_seed_models=["performer"]"#,
    ];
    run("fig6", "fig6", &seeds, fig6).unwrap();
    let csv = std::fs::read_to_string(out.join("fig6/metrics.csv")).unwrap();
    // (4 models × 2 seeds + 1) × 2 contexts × 2 evaluations.
    assert_eq!(csv.lines().count(), 1 + (4 * 2 + 1) * 2 * 2, "{csv}");
    assert_eq!(store_runs(&store).len(), (4 * 2 + 1) * 2);
    let table = std::fs::read_to_string(out.join("fig6/table.md")).unwrap();
    assert!(table.contains("| flash | 16 | 2 | 4 |"), "{table}");
    assert!(table.contains("| performer | 16 | 1 | 4 |"), "{table}");
    // table3's models and seeds are among fig6's runs: nothing new is trained.
    let table3 = include_str!("../configs/table3/smoke.toml");
    run("table3", "table3", &seeds[..2], table3).unwrap();
    assert_eq!(store_runs(&store).len(), (4 * 2 + 1) * 2);
    let t3 = std::fs::read_to_string(out.join("table3/metrics.csv")).unwrap();
    assert_eq!(t3.lines().count(), 1 + 4 * 2 * 2 * 2);
    std::fs::remove_dir_all(&out).unwrap();
}

/// fig7 trains FLASH's ablations beside fig6's models; table5 reads the same runs from the store
/// (training none) and adds the chunking-loss table with a verdict per context.
#[test]
fn fig7_and_table5_share_runs_and_table5_writes_the_chunking_loss() {
    let out = std::env::temp_dir().join(format!("fig7-smoke-{}", std::process::id()));
    let corpus = out.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let store = out.join("store");
    let run = |id: &'static str, config: &'static str| {
        let store = store.display().to_string();
        let args = ["--set", data_dir.as_str(), "--store", store.as_str()];
        registry::run_with(&cli(id, &out.join(id), &args), &|_| config)
    };
    run("fig7", include_str!("../configs/fig7/smoke.toml")).unwrap();
    // 7 models × 2 contexts.
    assert_eq!(store_runs(&store).len(), 7 * 2);
    run("table5", include_str!("../configs/table5/smoke.toml")).unwrap();
    assert_eq!(store_runs(&store).len(), 7 * 2, "table5 trains nothing new");
    let table = std::fs::read_to_string(out.join("table5/table.md")).unwrap();
    assert!(table.contains("perplexity lost by chunking"), "{table}");
    for c in [16, 32] {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| {c} | ")))
            .unwrap_or_else(|| panic!("no chunking row at {c}: {table}"));
        assert!(
            ["reproduced", "refuted", "inconclusive"]
                .iter()
                .any(|v| row.ends_with(&format!("| {v} |"))),
            "{row}"
        );
    }
    // A chunking-loss table without one of its four models is refused up front.
    let err = registry::run_with(
        &cli(
            "table5",
            &out.join("bad"),
            &[
                "--set",
                data_dir.as_str(),
                "--set",
                r#"models=["flash", "flash_quad", "transformer_plusplus"]"#,
            ],
        ),
        &|_| include_str!("../configs/table5/smoke.toml"),
    )
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("needs the model `mc_tfmpp`"),
        "{err:#}"
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// fig8 trains FLASH at three chunk sizes; `claims` then computes F10 from the chunk sizes it
/// resolves from the sweep's configuration (smallest against largest), as a trend from the
/// shortest context to the longest.
#[test]
fn fig8_smoke_and_its_claim() {
    let root = std::env::temp_dir().join(format!("fig8-smoke-{}", std::process::id()));
    let corpus = root.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let results = root.join("results");
    registry::run_with(
        &cli("fig8", &results.join("fig8"), &["--set", data_dir.as_str()]),
        &|_| include_str!("../configs/fig8/smoke.toml"),
    )
    .unwrap();
    let csv = std::fs::read_to_string(results.join("fig8/metrics.csv")).unwrap();
    // (flash + 2 chunk variants + Transformer++) × 2 contexts × 2 evaluations.
    assert_eq!(csv.lines().count(), 1 + 4 * 2 * 2, "{csv}");
    experiments::claims::write(&results).unwrap();
    let claims = std::fs::read_to_string(results.join("claims.md")).unwrap();
    let f10: Vec<&str> = claims
        .lines()
        .filter(|l| l.starts_with("| F10 |"))
        .collect();
    assert_eq!(f10.len(), 1, "one row: the trend across contexts: {claims}");
    assert!(
        f10[0].contains("with chunk 4 / with chunk 16"),
        "{}",
        f10[0]
    );
    assert!(f10[0].contains("contexts 16 → 32"), "{}", f10[0]);
    assert!(!f10[0].contains("no verdict"), "{}", f10[0]);
    std::fs::remove_dir_all(&root).unwrap();
}

/// fig5 (masked LM) and table3 (Transformer+ baseline) at smoke scale: every file, one row per
/// evaluation, the baseline's speedup to itself 1.00×, and a masked-LM perplexity that is finite.
#[test]
fn fig5_and_table3_smoke_write_every_file() {
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
        registry::run_with(&cli(id, &out, &["--set", data_dir.as_str()]), &|_| config).unwrap();
        let csv = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
        assert_eq!(csv.lines().count(), 1 + models * 2 * 2, "{id}: {csv}");
        for file in ["table.md", "ppl_16.png", "ppl_32.svg", "config.json"] {
            assert!(out.join(file).is_file(), "{id}: {file} missing");
        }
        let table = std::fs::read_to_string(out.join("table.md")).unwrap();
        assert!(
            table.contains(&format!("| {baseline} | 16 | 1 | 4 |")) && table.contains("1.00×"),
            "{id}: {table}"
        );
        let ppl: Vec<f64> = csv
            .lines()
            .skip(1)
            .map(|l| l.split(',').nth(10).unwrap().parse().unwrap())
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
    let out = std::env::temp_dir().join(format!("variant-smoke-{}", std::process::id()));
    let corpus = out.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let config = include_str!("../configs/table3/smoke.toml");
    let variant = r#"variants=[{name="flash_c4", model="flash", set={chunk_size=4}}]"#;
    let args = ["--set", data_dir.as_str(), "--set", variant];
    registry::run_with(&cli("table3", &out, &args), &|_| config).unwrap();
    let csv = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    assert_eq!(
        csv.lines().filter(|l| l.starts_with("flash_c4,")).count(),
        2 * 2,
        "{csv}"
    );
    let table = std::fs::read_to_string(out.join("table.md")).unwrap();
    assert!(table.contains("| flash_c4 | 16 | 1 | 4 |"), "{table}");
    let run_configs: Vec<String> = store_runs(&out.join("store"))
        .iter()
        .filter(|d| {
            d.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("flash-16-")
        })
        .map(|d| std::fs::read_to_string(d.join("run_config.json")).unwrap())
        .collect();
    assert_eq!(run_configs.len(), 2, "flash and flash_c4 at context 16");
    assert!(
        run_configs.iter().any(|c| c.contains("\"chunk_size\": 4")),
        "{run_configs:?}"
    );

    let bad = r#"variants=[{name="x", model="flash", set={chunk=4}}]"#;
    let err = registry::run_with(
        &cli(
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

/// table1 and table2 train their ablations as variants beside the default layer, `table.md` gets
/// the ablation section, and `claims` computes F8 for each; a variant whose fields contradict each
/// other (3 GAU heads do not split e = 64) is refused before anything is written.
#[test]
fn table1_and_table2_smoke_and_their_claims() {
    let root = std::env::temp_dir().join(format!("ablation-smoke-{}", std::process::id()));
    let corpus = root.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let results = root.join("results");
    for (id, config, models) in [
        ("table1", include_str!("../configs/table1/smoke.toml"), 11),
        ("table2", include_str!("../configs/table2/smoke.toml"), 5),
    ] {
        registry::run_with(
            &cli(id, &results.join(id), &["--set", data_dir.as_str()]),
            &|_| config,
        )
        .unwrap();
        let csv = std::fs::read_to_string(results.join(id).join("metrics.csv")).unwrap();
        // Every model × 1 context × 2 evaluations.
        assert_eq!(csv.lines().count(), 1 + models * 2, "{csv}");
        let table = std::fs::read_to_string(results.join(id).join("table.md")).unwrap();
        assert!(table.contains("## Layer ablations"), "{table}");
        assert_eq!(
            table.lines().filter(|l| l.starts_with("| 16 | ")).count(),
            models,
            "an ablation row per model, the default's included: {table}"
        );
    }
    let table1 = std::fs::read_to_string(results.join("table1/table.md")).unwrap();
    assert!(
        table1.contains("| gau_softmax | gau_scoring = \"Softmax\" | 1 |"),
        "{table1}"
    );
    experiments::claims::write(&results).unwrap();
    let claims = std::fs::read_to_string(results.join("claims.md")).unwrap();
    let f8: Vec<&str> = claims.lines().filter(|l| l.starts_with("| F8 |")).collect();
    assert_eq!(f8.len(), 2, "one row per table: {claims}");
    assert!(f8[0].contains("default GAU") && f8[0].contains("of 10 ablations"));
    assert!(f8[1].contains("default Transformer++") && f8[1].contains("of 4 ablations"));
    for row in f8 {
        assert!(!row.contains("no verdict"), "{row}");
    }

    let out = root.join("bad");
    let bad = r#"variants=[{name="gau_3_heads", model="flash_quad", set={gau_heads=3}}]"#;
    let err = registry::run_with(
        &cli("table1", &out, &["--set", data_dir.as_str(), "--set", bad]),
        &|_| include_str!("../configs/table1/smoke.toml"),
    )
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("variant `gau_3_heads`") && msg.contains("must divide e = 64"),
        "{msg}"
    );
    assert!(!out.exists(), "nothing written for a refused configuration");
    std::fs::remove_dir_all(&root).unwrap();
}

/// fig3 trains three families at three sizes; `table.md` lists each model's parameters and the
/// FLASH-Quad / Transformer++ ratio per size, the chart against parameters is drawn, and `claims`
/// computes F7 over every size.
#[test]
fn fig3_smoke_and_its_claim() {
    let root = std::env::temp_dir().join(format!("fig3-smoke-{}", std::process::id()));
    let corpus = root.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let results = root.join("results");
    registry::run_with(
        &cli("fig3", &results.join("fig3"), &["--set", data_dir.as_str()]),
        &|_| include_str!("../configs/fig3/smoke.toml"),
    )
    .unwrap();
    let out = results.join("fig3");
    assert!(out.join("size_16.png").exists() && out.join("size_16.svg").exists());
    let table = std::fs::read_to_string(out.join("table.md")).unwrap();
    let sizes: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("| 16 | ") && l.contains(" / "))
        .collect();
    assert_eq!(sizes.len(), 3, "one F7 row per size: {table}");
    // The smallest size first: d = 16, one block (2 GAU layers) against d = 32 x 2 and 48 x 2.
    assert!(sizes[0].contains("d_model = 16"), "{table}");
    experiments::claims::write(&results).unwrap();
    let claims = std::fs::read_to_string(results.join("claims.md")).unwrap();
    let f7: Vec<&str> = claims.lines().filter(|l| l.starts_with("| F7 |")).collect();
    assert_eq!(f7.len(), 1, "{claims}");
    assert_eq!(f7[0].matches("M: ").count(), 3, "{}", f7[0]);
    assert!(!f7[0].contains("no verdict"), "{}", f7[0]);
    std::fs::remove_dir_all(&root).unwrap();
}

/// A tiny QA set in `shakespeare_speaker_qa`'s layout (question, context, answers list).
fn tiny_qa(dir: &std::path::Path) {
    use arrow_array::builder::{ListBuilder, StringBuilder};
    for split in ["train", "validation"] {
        let n = 6;
        let mut answers = ListBuilder::new(StringBuilder::new());
        for i in 0..n {
            answers
                .values()
                .append_value(if i % 2 == 0 { "HAMLET" } else { "OPHELIA" });
            answers.append(true);
        }
        let column = |f: &dyn Fn(usize) -> String| {
            std::sync::Arc::new(arrow_array::StringArray::from_iter_values((0..n).map(f)))
                as arrow_array::ArrayRef
        };
        data::corpus::write_parquet(
            &dir.join(format!(
                "gutenberg_shakespeare/speaker_qa/{split}-00000-of-00001.parquet"
            )),
            vec![
                ("question", column(&|i| format!("Who says line {i}?"))),
                (
                    "context",
                    column(&|i| format!("{split} HAMLET. To be. OPHELIA. Line {i}.")),
                ),
                ("answers", std::sync::Arc::new(answers.finish())),
            ],
        )
        .unwrap();
    }
}

/// table4 pre-trains (table3's smoke models at its context), fine-tunes each run on QA, scores
/// greedy answers, times both steps, renders `table.md` with F9, and `claims` computes F9; a
/// second run reuses every pre-training and fine-tuning run.
#[test]
fn table4_smoke_and_its_claim() {
    let root = std::env::temp_dir().join(format!("table4-smoke-{}", std::process::id()));
    let corpus = root.join("corpus");
    tiny_corpus(&corpus);
    tiny_qa(&corpus);
    let results = root.join("results");
    let out = results.join("table4");
    let qa_dir = format!("data_dir=\"{}\"", corpus.display());
    let lm_dir = format!("pretrain_set.data_dir=\"{}\"", corpus.display());
    let run = || {
        let mut cli = cli("table4", &out, &["--set", &qa_dir, "--set", &lm_dir]);
        cli.store = root.join("store");
        experiments::registry::run_with(&cli, &|_| include_str!("../configs/table4/smoke.toml"))
    };
    run().unwrap();
    let scores = std::fs::read_to_string(out.join("scores.csv")).unwrap();
    // 3 models × 1 seed (smoke).
    assert_eq!(scores.lines().count(), 1 + 3, "{scores}");
    for f in [
        "table.md",
        "metrics.csv",
        "scores.csv",
        "finetune_loss.png",
        "finetune_step_times.csv",
        "trivial_baseline.json",
        "config.json",
        "env.json",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    assert!(out.join("pretrain/step_times.csv").exists());
    let table = std::fs::read_to_string(out.join("table.md")).unwrap();
    assert!(
        table.contains("F9 (flash against transformer_plus)"),
        "{table}"
    );
    experiments::claims::write(&results).unwrap();
    let claims = std::fs::read_to_string(results.join("claims.md")).unwrap();
    let f9: Vec<&str> = claims.lines().filter(|l| l.starts_with("| F9 |")).collect();
    assert_eq!(f9.len(), 1, "{claims}");
    assert!(!f9[0].contains("no verdict"), "{}", f9[0]);
    // Four steps learn nothing: the baseline's F1 is not above the most frequent answer's (HAMLET,
    // half the held-out questions), so the comparison has no verdict either way.
    assert!(f9[0].contains("inconclusive"), "{}", f9[0]);
    let trivial = std::fs::read_to_string(out.join("trivial_baseline.json")).unwrap();
    assert!(
        trivial.contains("\"HAMLET\"") && trivial.contains("\"f1\": 50.0"),
        "{trivial}"
    );
    // Everything is reused the second time: the scores do not change.
    run().unwrap();
    assert_eq!(
        std::fs::read_to_string(out.join("scores.csv")).unwrap(),
        scores
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// f4_length reads fig6's runs beside its own output and trains the same models for longer: its
/// `trend.csv` has one row per length, shortest first, and the chart is drawn.
#[test]
fn f4_length_smoke_writes_the_trend_beside_fig6() {
    let root = std::env::temp_dir().join(format!("f4-length-smoke-{}", std::process::id()));
    let corpus = root.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let results = root.join("results");
    // Both sweeps share one store (a later --store replaces cli's).
    let store = root.join("store").display().to_string();
    let with_store = |id: &'static str, extra: &[&str]| {
        let mut args = vec!["--set", data_dir.as_str(), "--store", store.as_str()];
        args.extend_from_slice(extra);
        cli(id, &results.join(id), &args)
    };
    let fig6 = with_store(
        "fig6",
        &[
            "--set",
            r#"models=["transformer_plusplus", "flash"]"#,
            "--set",
            r#"claimed_faster=["flash"]"#,
        ],
    );
    registry::run_with(&fig6, &|_| include_str!("../configs/fig6/smoke.toml")).unwrap();
    registry::run_with(&with_store("f4_length", &[]), &|p| {
        experiments::configs::builtin("f4_length", p).unwrap()
    })
    .unwrap();
    let trend = std::fs::read_to_string(results.join("f4_length/trend.csv")).unwrap();
    let lines: Vec<&str> = trend.lines().collect();
    assert_eq!(lines.len(), 1 + 2, "{trend}");
    assert!(
        lines[1].starts_with("flash,32,fig6,4,") && lines[2].starts_with("flash,32,f4_length,8,"),
        "{trend}"
    );
    assert!(results.join("f4_length/speedup_vs_tokens.png").is_file());
    let table = std::fs::read_to_string(results.join("f4_length/table.md")).unwrap();
    assert!(
        table.contains("## The verdict against training length"),
        "{table}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}
