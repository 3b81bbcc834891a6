//! Smoke runs of the GQA experiments through the same code path as their binaries.

use experiments::Cli;
use experiments::gqa::decode_render as gqa_decode;
use experiments::registry;

/// Held by every test that trains: the backend's random generator (weights, dropout) is one for
/// the process, so two trainings at once would draw from each other's sequence and neither
/// would be reproducible.
static TRAINING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes [`TRAINING`] (also after another test panicked holding it).
fn training() -> std::sync::MutexGuard<'static, ()> {
    TRAINING.lock().unwrap_or_else(|e| e.into_inner())
}

fn cli(id: &'static str, out: &std::path::Path, extra: &[&str]) -> Cli {
    let mut args = vec![
        "--profile".to_string(),
        "smoke".into(),
        "--out".into(),
        out.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Cli::parse(id, "", args).unwrap()
}

#[test]
fn gqa_fig6_smoke_times_every_group_count_and_writes_its_files() {
    let out = std::env::temp_dir().join(format!("gqa-fig6-smoke-{}", std::process::id()));
    registry::run(&cli("gqa_fig6", &out, &[])).unwrap();
    let rows: Vec<gqa_decode::DecodeRow> = csv::Reader::from_path(out.join("decode_time.csv"))
        .unwrap()
        .deserialize()
        .collect::<Result<_, _>>()
        .unwrap();
    let groups: Vec<usize> = rows.iter().map(|r| r.groups).collect();
    assert_eq!(groups, [1, 2, 4, 8]);
    for r in &rows {
        assert!(r.s_per_sample > 0.0 && r.s_per_sample.is_finite(), "{r:?}");
        assert!(
            r.decoder_s_per_token > 0.0 && r.machine_read_gbps > 0.0,
            "{r:?}"
        );
        // Every part of a sample's time is counted: its decoding steps (8 outputs of a batch of 2).
        let parts = r.encoder_s_per_sample + r.cross_kv_s_per_sample + r.decoder_s_per_token * 4.0;
        assert!((r.s_per_sample - parts).abs() < 1e-9 * parts, "{r:?}");
        // The cache holds G heads: proportional to G.
        assert!((r.kv_cache_mib / rows[0].kv_cache_mib - r.groups as f64).abs() < 1e-9);
        // Bytes per step by hand for the smoke shapes (d 32, H 8 x 4, d_ff 64, V 256, 1 decoder
        // layer, batch 2, in 16 / out 8): K/V 2 samples x 2 (K, V) x G heads x 4 wide x 4 bytes
        // x (16 inputs + mean 4.5 outputs); weights 4 bytes x (Q, O twice: 4 x 32 x 32; self K, V:
        // 2 x 32 x 4G; FFN 3 x 32 x 64; head 32 x 256).
        let g = r.groups as f64;
        assert_eq!(r.kv_bytes_per_token, 2.0 * 2.0 * g * 4.0 * 4.0 * 20.5);
        assert_eq!(
            r.weight_bytes_per_token,
            4.0 * (4096.0 + 256.0 * g + 6144.0 + 8192.0)
        );
    }
    let rounds: Vec<gqa_decode::RoundRow> = csv::Reader::from_path(out.join("rounds.csv"))
        .unwrap()
        .deserialize()
        .collect::<Result<_, _>>()
        .unwrap();
    // 2 timed rounds of every G, the warm-up round left out.
    assert_eq!(rounds.len(), 2 * 4);
    assert_eq!(rounds.iter().map(|r| r.round).max(), Some(1));
    for file in [
        "decode_time.png",
        "decode_time.svg",
        "speedup.png",
        "rounds.csv",
        "table.md",
        "config.json",
        "env.json",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    std::fs::remove_file(out.join("table.md")).unwrap();
    registry::run(&cli("gqa_fig6", &out, &["--report"])).unwrap();
    assert!(out.join("table.md").is_file());
    let err = registry::run(&cli("gqa_fig6", &out, &["--set", "groups=[3]"])).unwrap_err();
    assert!(err.to_string().contains("must divide"), "{err}");
    let err = registry::run(&cli("gqa_fig6", &out, &["--set", "encoder_batch=3"])).unwrap_err();
    assert!(
        err.to_string()
            .contains("encoder_batch (3) must divide batch (2)"),
        "{err}"
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// Writes `file` of the offline corpus's folder under the `data_dir` root `dir`.
fn write(dir: &std::path::Path, file: &str, columns: Vec<(&str, Vec<String>)>) {
    let dir = dir.join("gutenberg_shakespeare");
    let columns = columns
        .into_iter()
        .map(|(name, values)| {
            (
                name,
                std::sync::Arc::new(arrow_array::StringArray::from(values))
                    as arrow_array::ArrayRef,
            )
        })
        .collect();
    data::corpus::write_parquet(&dir.join(file), columns).unwrap();
}

/// The offline corpus's book texts and two of its seq2seq tasks, in their layouts.
fn tiny_corpus(dir: &std::path::Path) {
    for split in ["train", "validation"] {
        let texts: Vec<String> = (0..4)
            .map(|i| {
                format!("{split} {i}: ")
                    + &"Friends, Romans, countrymen, lend me your ears. ".repeat(6)
            })
            .collect();
        write(
            dir,
            &format!("data/{split}-00000-of-00001.parquet"),
            vec![("text", texts)],
        );
        for task in ["cues", "modernize"] {
            let sources: Vec<String> = (0..4)
                .map(|i| format!("Thou art {i} tymes fayre"))
                .collect();
            let targets: Vec<String> = (0..4).map(|i| format!("You are {i} times fair")).collect();
            write(
                dir,
                &format!("{task}/{split}-00000-of-00001.parquet"),
                vec![("source", sources), ("target", targets)],
            );
        }
    }
}

#[test]
fn gqa_table1_smoke_runs_every_stage_and_resumes_finished_ones() {
    let _training = training();
    use experiments::gqa;
    let out = std::env::temp_dir().join(format!("gqa-table1-smoke-{}", std::process::id()));
    let corpus = out.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let tasks = "tasks=[{ name = \"Cues\", dataset = \"shakespeare_cues\", metric = \"rouge1\", input_length = 32, target_length = 8 }, \
                 { name = \"Modernize\", dataset = \"shakespeare_modernize\", metric = \"bleu\", input_length = 32, target_length = 8 }]";
    let run = |extra: &[&str]| {
        let mut args = vec!["--set", data_dir.as_str(), "--set", tasks];
        args.extend_from_slice(extra);
        registry::run_with(&cli("gqa_table1", &out, &args), &|_| {
            include_str!("../configs/gqa_table1/smoke.toml")
        })
    };
    run(&[]).unwrap();
    let rows: Vec<gqa::ScoreRow> = csv::Reader::from_path(out.join("scores.csv"))
        .unwrap()
        .deserialize()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), 4 * 2, "every model on every task");
    let heads: Vec<usize> = rows.iter().step_by(2).map(|r| r.kv_heads).collect();
    assert_eq!(heads, [4, 4, 1, 2]);
    for r in &rows {
        assert!(
            r.score.is_finite() && (0.0..=100.0).contains(&r.score),
            "{r:?}"
        );
        assert!(r.s_per_sample > 0.0, "{r:?}");
        // The span losses: right after conversion for converted models only, and uptraining
        // (α = 0.5 here) moves them.
        let start = r.span_loss.expect("every model's span loss");
        match r.span_loss_converted {
            None => assert_eq!(r.conversion, "-", "{r:?}"),
            Some(converted) => assert!((converted - start).abs() > 1e-6, "{r:?}"),
        }
    }
    // Both MHA-XXL rows (one per task) have the same start; the converted models start from it.
    assert_eq!(rows[2].span_loss, rows[3].span_loss);
    // The trivial baselines, by hand: the 4 training targets "You are i times fair" are equally
    // frequent, so the first in sorted order ("You are 0 times fair") is written for both scored
    // examples; ROUGE-1 F against "You are 0 …" is 1 and against "You are 1 …" 4/5: mean 90.
    let baselines: Vec<gqa::BaselineRow> = csv::Reader::from_path(out.join("baselines.csv"))
        .unwrap()
        .deserialize()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(baselines.len(), 2 * 2, "two baselines per task");
    let cues = |name: &str| {
        baselines
            .iter()
            .find(|b| b.task == "Cues" && b.baseline == name)
            .unwrap()
            .score
    };
    assert!((cues(gqa::MOST_FREQUENT) - 90.0).abs() < 1e-9);
    // Copying "Thou art i tymes fayre" shares only the number with "You are i times fair".
    assert!(cues(gqa::COPY_INPUT) <= 20.0 + 1e-9);
    for file in [
        "table.md",
        "score_vs_time.png",
        "score_vs_time.svg",
        "config.json",
        "env.json",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    let stages = out.join("stages");
    for stage in [
        "pretrain-large",
        "pretrain-xxl",
        "uptrain-xxl-g1-mean-a0.5",
        "finetune-xxl-g2-mean-a0.5-Modernize",
    ] {
        assert!(
            stages.join(stage).join("model/model.safetensors").is_file(),
            "{stage}"
        );
    }
    // A second run reuses every finished stage and scores the same.
    let before = std::fs::read_to_string(out.join("scores.csv")).unwrap();
    run(&[]).unwrap();
    let strip_times = strip_times;
    assert_eq!(
        strip_times(&before),
        strip_times(&std::fs::read_to_string(out.join("scores.csv")).unwrap())
    );

    // A size's `checkpoint` replaces its pre-training: the pre-trained XXL model given as one gives
    // the same MHA-XXL rows, with no pre-training stage.
    let checkpoint = format!(
        "sizes.xxl.checkpoint=\"{}\"",
        stages.join("pretrain-xxl/model").display()
    );
    let out2 = out.join("from-checkpoint");
    let run2 = |extra: &[&str]| {
        let mut args = vec!["--set", data_dir.as_str(), "--set", tasks];
        args.extend_from_slice(extra);
        registry::run_with(&cli("gqa_table1", &out2, &args), &|_| {
            include_str!("../configs/gqa_table1/smoke.toml")
        })
    };
    let xxl_only = "models=[{ name = \"MHA-XXL\", size = \"xxl\" }]";
    run2(&["--set", xxl_only, "--set", &checkpoint]).unwrap();
    assert!(!out2.join("stages/pretrain-xxl").exists());
    let mha_xxl = |s: &str| -> Vec<String> {
        strip_times(s)
            .into_iter()
            .filter(|l| l.starts_with("MHA-XXL,"))
            .collect()
    };
    assert_eq!(
        mha_xxl(&before),
        mha_xxl(&std::fs::read_to_string(out2.join("scores.csv")).unwrap())
    );
    // Stages record their lineage: sharing the first run's stages, the fine-tuning of a model
    // that came from the checkpoint does not reuse the one that came from pre-training here.
    let shared = format!("stages=\"{}\"", stages.display());
    let err = run2(&["--set", xxl_only, "--set", &checkpoint, "--set", &shared]).unwrap_err();
    assert!(
        format!("{err:#}").contains("finetune-xxl-Cues holds a run with another configuration"),
        "{err:#}"
    );
    // A checkpoint of another shape is refused, naming both shapes.
    let wrong = checkpoint.replace("sizes.xxl", "sizes.large");
    let large_only = "models=[{ name = \"MHA-Large\", size = \"large\" }]";
    let err = run2(&["--set", large_only, "--set", &wrong]).unwrap_err();
    assert!(
        format!("{err:#}").contains("make the size's fields the checkpoint's"),
        "{err:#}"
    );

    // Without any weights (a fresh clone has the committed stage results only), a run reuses every
    // scored fine-tuning stage as it is, the timings included, and trains nothing.
    let weights = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .flat_map(|stage| ["model", "checkpoint", "best"].map(|d| stage.join(d)))
            .filter(|p| p.exists())
            .collect()
    };
    let before = std::fs::read_to_string(out.join("scores.csv")).unwrap();
    for dir in weights(&stages) {
        std::fs::remove_dir_all(dir).unwrap();
    }
    run(&[]).unwrap();
    assert_eq!(
        before,
        std::fs::read_to_string(out.join("scores.csv")).unwrap()
    );
    assert_eq!(weights(&stages), Vec::<std::path::PathBuf>::new());
    // A result scored another way is not reused: the stages train again (to the same models) and
    // are scored on the examples asked for.
    run(&["--set", "score_examples=1"]).unwrap();
    let rescored = std::fs::read_to_string(out.join("scores.csv")).unwrap();
    let rows: Vec<gqa::ScoreRow> = csv::Reader::from_reader(rescored.as_bytes())
        .deserialize()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(rows.iter().all(|r| r.examples == 1), "{rows:?}");
    assert!(
        stages
            .join("finetune-xxl-g2-mean-a0.5-Modernize/model/model.safetensors")
            .is_file()
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// `scores.csv`'s lines without the timing column (`s_per_sample`, which varies run to run).
fn strip_times(csv: &str) -> Vec<String> {
    let header: Vec<&str> = csv.lines().next().unwrap_or_default().split(',').collect();
    let time = header
        .iter()
        .position(|c| *c == "s_per_sample")
        .expect("a timing column");
    csv.lines()
        .map(|l| {
            l.split(',')
                .enumerate()
                .filter(|(i, _)| *i != time)
                .map(|(_, v)| v.to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

/// Replicates: with `seeds = [0, 1]` every model is converted, uptrained and fine-tuned once per
/// seed from the same pre-trained model; seed 0's replicate is the single-seed run (the same stage
/// names, reused, and the same scores), seed 1's stages carry `-s1` and train differently, and the
/// table shows each cell's range over the seeds.
#[test]
fn gqa_pipeline_replicates_every_seed_from_one_pretrained_model() {
    let _training = training();
    use experiments::gqa;
    let out = std::env::temp_dir().join(format!("gqa-seeds-{}", std::process::id()));
    let corpus = out.join("corpus");
    tiny_corpus(&corpus);
    let data_dir = format!("data_dir=\"{}\"", corpus.display());
    let stages = format!("stages=\"{}\"", out.join("stages").display());
    let run = |dir: &str, seeds: &str| {
        let args = [
            "--set",
            data_dir.as_str(),
            "--set",
            stages.as_str(),
            "--set",
            "tasks=[{ name = \"Cues\", dataset = \"shakespeare_cues\", metric = \"rouge1\", input_length = 32, target_length = 8 }]",
            "--set",
            "models=[{ name = \"MHA-XXL\", size = \"xxl\" }, { name = \"MQA-XXL\", size = \"xxl\", kv_heads = 1, conversion = \"mean\", alpha = 0.5 }]",
            "--set",
            seeds,
        ];
        registry::run_with(&cli("gqa_table1", &out.join(dir), &args), &|_| {
            include_str!("../configs/gqa_table1/smoke.toml")
        })
        .unwrap();
        std::fs::read_to_string(out.join(dir).join("scores.csv")).unwrap()
    };
    let one = run("one", "seeds=[0]");
    let two = run("two", "seeds=[0, 1]");
    let rows = |csv: &str| -> Vec<gqa::ScoreRow> {
        csv::Reader::from_reader(csv.as_bytes())
            .deserialize()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let seeds: Vec<(String, u64)> = rows(&two)
        .iter()
        .map(|r| (r.model.clone(), r.seed))
        .collect();
    assert_eq!(
        seeds,
        [
            ("MHA-XXL", 0),
            ("MQA-XXL", 0),
            ("MHA-XXL", 1),
            ("MQA-XXL", 1)
        ]
        .map(|(m, s)| (m.to_string(), s))
    );
    // Seed 0's rows are the single-seed run's.
    assert_eq!(strip_times(&one)[1..], strip_times(&two)[1..3]);
    let stages = out.join("stages");
    for stage in [
        "pretrain-xxl",
        "uptrain-xxl-g1-mean-a0.5",
        "uptrain-xxl-g1-mean-a0.5-s1",
        "finetune-xxl-Cues-s1",
        "finetune-xxl-g1-mean-a0.5-Cues-s1",
    ] {
        assert!(
            stages.join(stage).join("model/model.safetensors").is_file(),
            "{stage}"
        );
    }
    assert!(
        !stages.join("pretrain-xxl-s1").exists(),
        "one pre-training for every seed"
    );
    // Seed 1 fine-tunes differently (data order, dropout): another held-out loss.
    let r = rows(&two);
    assert_ne!(r[0].eval_loss, r[2].eval_loss);
    assert_ne!(r[1].span_loss, r[3].span_loss, "and uptrains differently");
    // Both MHA rows start from the one pre-trained model.
    assert_eq!(r[0].span_loss, r[2].span_loss);
    let table = std::fs::read_to_string(out.join("two/table.md")).unwrap();
    let mha = table
        .lines()
        .find(|l| l.starts_with("| MHA-XXL |"))
        .unwrap();
    assert!(mha.contains(" | 2 | "), "two seeds: {mha}");
    // The span column of the converted model shows its range over the two seeds.
    let mqa = table
        .lines()
        .find(|l| l.starts_with("| MQA-XXL |"))
        .unwrap();
    assert!(mqa.contains('[') && mqa.contains('–'), "a range: {mqa}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn gqa_pipeline_refuses_a_repeated_seed() {
    let out = std::env::temp_dir().join(format!("gqa-repeated-seed-{}", std::process::id()));
    let smoke = include_str!("../configs/gqa_table1/smoke.toml");
    assert_pipeline_refuses(&out, &["--set", "seeds=[0, 1, 0]"], smoke, "repeats a seed");
    let _ = std::fs::remove_dir_all(&out);
}

/// gqa_table1 with `config` as its built-in profile and `args` fails with an error containing
/// `expect`, before writing any result.
fn assert_pipeline_refuses(
    out: &std::path::Path,
    args: &[&str],
    config: &'static str,
    expect: &str,
) {
    let err =
        experiments::registry::run_with(&cli("gqa_table1", out, args), &|_| config).unwrap_err();
    assert!(format!("{err:#}").contains(expect), "{args:?}: {err:#}");
    assert!(!out.join("scores.csv").exists(), "nothing written");
}

#[test]
fn gqa_pipeline_refuses_a_copy_warmup_without_length() {
    let out = std::env::temp_dir().join(format!("gqa-copy-warmup-{}", std::process::id()));
    // The cpu config: it has the `[copy_warmup]` table that `--set` edits.
    for set in [
        "copy_warmup.length=0",
        "copy_warmup.batch=0",
        "copy_warmup.lr=0.0",
    ] {
        let args = ["--set", "copy_warmup.steps=10", "--set", set];
        let cpu = include_str!("../configs/gqa_table1/cpu.toml");
        assert_pipeline_refuses(&out, &args, cpu, "must be positive when steps is 10");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn gqa_pipeline_refuses_a_random_copy_fraction_outside_0_1() {
    let out = std::env::temp_dir().join(format!("gqa-random-copy-{}", std::process::id()));
    for bad in ["1.0", "-0.1"] {
        let set = format!("pretrain_random_copy={bad}");
        let smoke = concat!(
            "pretrain_random_copy = 0.0\n",
            include_str!("../configs/gqa_table1/smoke.toml")
        );
        assert_pipeline_refuses(&out, &["--set", &set], smoke, "must be in [0, 1)");
    }
    let _ = std::fs::remove_dir_all(&out);
}
