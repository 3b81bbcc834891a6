//! Faults survived by a real process: `fig6` at smoke scale (FLASH and Transformer++, 12 steps,
//! a checkpoint every 2) runs as a child process that is killed again and again — by the trainer's
//! fault hook (`REPRO_FAULT`, an abort at a chosen moment of evaluation, `metrics.csv` writing and
//! checkpoint writing, including between the two renames of a checkpoint swap) and by SIGKILL at
//! moments drawn from a seeded generator — and restarted each time. The run must end exactly as an
//! uninterrupted one: every run's `metrics.csv` (the columns that do not measure time) and its final
//! checkpoint's model bytes. A checkpoint damaged on disk afterwards is refused with a message that
//! names the file, and exit status 1.

#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

/// The fig6 smoke command over the tiny corpus at `root`, into `root/out` and `root/store`.
fn fig6(root: &Path, corpus: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fig6"));
    c.args(["--profile", "smoke", "--out"])
        .arg(root.join("out"))
        .arg("--store")
        .arg(root.join("store"))
        .args(["--set", &format!("data_dir=\"{}\"", corpus.display())]);
    for set in [
        "models=[\"flash\", \"transformer_plusplus\"]",
        "one_seed_models=[]",
        "claimed_faster=[\"flash\"]",
        "contexts=[16]",
        "steps=12",
        "eval_every=3",
        "checkpoint_every=2",
        "timing_rounds=0",
    ] {
        c.args(["--set", set]);
    }
    c.env_remove(training::trainer::FAULT_ENV);
    c
}

/// `metrics.csv` without the columns that measure time (device-hours, tokens/s).
fn untimed_metrics(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let keep: Vec<usize> = (0..header.len())
        .filter(|&i| !matches!(header[i], "device_hours" | "tokens_per_s"))
        .collect();
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            keep.iter().map(|&i| f[i]).collect::<Vec<_>>().join(",")
        })
        .collect()
}

/// The logits of a run's final checkpoint on a fixed input (the file's bytes also hold each
/// parameter's random id, which a resumed process draws anew, so the weights are compared through
/// what they compute, bit for bit).
fn final_logits(run: &Path) -> Vec<f32> {
    use burn::module::Module;
    use burn::prelude::*;
    let identity: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("run_config.json")).unwrap()).unwrap();
    let config = experiments::lm_sweep::model_from_identity(&identity["model"]).unwrap();
    let device = burn::tensor::Device::flex();
    let lm = config
        .init(model::Direction::Causal, &device)
        .load_file(run.join("checkpoint/model.bpk"));
    let ids: Vec<i64> = (0..12)
        .map(|i| (i * 7 % config.vocab_size) as i64)
        .collect();
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, 12]), &device);
    lm.forward(tokens, None)
        .into_data()
        .try_to_vec_as::<f32>()
        .unwrap()
}

/// Asserts that stores `a` and `b` hold the same two runs, each trained to the same untimed
/// `metrics.csv` and final weights; gives `b`'s run directories.
fn assert_same_runs(a: &Path, b: &Path) -> Vec<PathBuf> {
    let (a, b) = (common::store_runs(a), common::store_runs(b));
    let names = |d: &[PathBuf]| -> Vec<String> {
        d.iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(names(&a), names(&b));
    assert_eq!(a.len(), 2);
    for (a, b) in a.iter().zip(&b) {
        assert_eq!(
            untimed_metrics(&a.join("metrics.csv")),
            untimed_metrics(&b.join("metrics.csv")),
            "{}",
            b.display()
        );
        assert!(
            final_logits(a) == final_logits(b),
            "{}: the final weights differ",
            b.display()
        );
    }
    b
}

fn killed(out: &Output) -> bool {
    use std::os::unix::process::ExitStatusExt;
    out.status.signal().is_some()
}

#[test]
fn killed_and_restarted_runs_end_as_uninterrupted_ones() {
    let root = std::env::temp_dir().join(format!("faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let corpus = root.join("corpus");
    common::tiny_corpus(&corpus);
    let (clean, faulty) = (root.join("clean"), root.join("faulty"));

    let start = std::time::Instant::now();
    let out = fig6(&clean, &corpus).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let full = start.elapsed();

    // The hook's moments, in the order the restarted process reaches them, with the step each
    // process resumes from (none: from scratch): FLASH's run first (no checkpoint yet at step 1;
    // mid-evaluation; mid-checkpoint, the previous one intact; between the swap's two renames,
    // finished on restart; mid-metrics; a step after a checkpoint; mid the last step's checkpoint,
    // which must not leave the run looking finished), then Transformer++'s.
    let hooks = [
        ("step@1", None),
        ("eval@3", None),
        ("checkpoint@4", Some(2)),
        ("swap@6", Some(2)),
        ("metrics@9", Some(6)),
        ("step@11", Some(8)),
        ("checkpoint@12", Some(10)),
        ("checkpoint@2", Some(10)),
        ("swap@4", None),
        ("eval@6", Some(4)),
        ("metrics@9", Some(4)),
    ];
    for (hook, resumes) in hooks {
        let out = fig6(&faulty, &corpus)
            .env(training::trainer::FAULT_ENV, hook)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            killed(&out),
            "{hook}: the process was not stopped there: {stderr}"
        );
        match resumes {
            Some(step) => assert!(
                stderr.contains(&format!("at step {step}\n")),
                "{hook}: expected to resume at step {step}: {stderr}"
            ),
            None => assert!(!stderr.contains("resuming"), "{hook}: {stderr}"),
        }
    }
    // SIGKILL at moments drawn from a seeded generator, spread over a whole run's duration.
    let mut rng = data::rng::SplitMix64::new(7);
    for _ in 0..4 {
        let at = full.mul_f64(rng.next_f64());
        let mut child = fig6(&faulty, &corpus).spawn().unwrap();
        std::thread::sleep(at);
        let _ = child.kill(); // SIGKILL; the run may have finished already
        child.wait().unwrap();
    }
    let out = fig6(&faulty, &corpus).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    for b in assert_same_runs(&clean.join("store"), &faulty.join("store")) {
        assert!(!b.join("checkpoint.tmp").exists() && !b.join("checkpoint.old").exists());
    }
    assert_eq!(
        untimed_metrics(&clean.join("out/metrics.csv")).len(),
        untimed_metrics(&faulty.join("out/metrics.csv")).len()
    );

    // A damaged checkpoint: a run stopped after its checkpoint at step 2, whose model file is then
    // truncated, is refused on restart with the file named.
    let damaged = root.join("damaged");
    let out = fig6(&damaged, &corpus)
        .env(training::trainer::FAULT_ENV, "step@3")
        .output()
        .unwrap();
    assert!(killed(&out));
    let run = common::store_runs(&damaged.join("store")).remove(0);
    let model = run.join("checkpoint/model.bpk");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
    let out = fig6(&damaged, &corpus).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is damaged") && stderr.contains("model.bpk"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    std::fs::remove_dir_all(&root).unwrap();
}

/// `--jobs 2`: two worker processes train the sweep's runs side by side and end as one process
/// does (every run's untimed `metrics.csv`, its final weights, the sweep's rows); workers killed
/// mid-run fail the command with exit status 1, and the same command resumes them; each run's
/// `env.json` names the command the user typed, not the worker's.
#[test]
fn worker_processes_train_what_one_process_trains() {
    let root = std::env::temp_dir().join(format!("jobs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let corpus = root.join("corpus");
    common::tiny_corpus(&corpus);
    let (one, two) = (root.join("one"), root.join("two"));
    let out = fig6(&one, &corpus).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Both workers abort at their run's 5th step (after the checkpoint of step 4).
    let out = fig6(&two, &corpus)
        .args(["--jobs", "2"])
        .env(training::trainer::FAULT_ENV, "step@5")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("stopped before its runs finished"),
        "{stderr}"
    );
    let out = fig6(&two, &corpus).args(["--jobs", "2"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("[worker 1]"), "{stderr}");
    assert!(
        stderr.contains("at step 4\n"),
        "resumed from the checkpoint: {stderr}"
    );

    for b in assert_same_runs(&one.join("store"), &two.join("store")) {
        let env: serde_json::Value =
            serde_json::from_slice(&std::fs::read(b.join("env.json")).unwrap()).unwrap();
        let command = env["command"].as_str().unwrap();
        assert!(
            command.ends_with("--jobs 2") && !command.contains("--worker"),
            "{command}"
        );
        assert!(
            !b.join("training.lock").exists(),
            "{}: lock left behind",
            b.display()
        );
    }
    assert_eq!(
        untimed_metrics(&one.join("out/metrics.csv")),
        untimed_metrics(&two.join("out/metrics.csv"))
    );
    std::fs::remove_dir_all(&root).unwrap();
}
