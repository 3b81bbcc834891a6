//! `convert_gqa` on a saved multi-head checkpoint: the output loads as GQA with the logits of the
//! in-process conversion, and bad requests fail with one line naming the problem.

use std::process::Command;

use burn::prelude::*;
use model::t5::{KvConversion, T5Config, T5Model, convert_kv_heads};
use model::t5_hf;

fn logits(model: &T5Model) -> Vec<f32> {
    let dev = Device::flex();
    let ids = |v: Vec<i64>, t: usize| Tensor::<2, Int>::from_data(TensorData::new(v, [1, t]), &dev);
    let inputs = ids(vec![5, 9, 14, 3, 7], 5);
    let keep = inputs.clone().greater_elem(-1);
    let targets = ids(vec![8, 6, 4], 3);
    model
        .forward(inputs, &keep, targets)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

fn convert(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_convert_gqa"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn converts_a_checkpoint_and_rejects_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (mha_dir, gqa_dir) = (dir.path().join("mha"), dir.path().join("gqa"));
    let config = T5Config::tiny();
    let device = Device::flex();
    let model = config.init(&device);
    t5_hf::save(&model, &config, &mha_dir).unwrap();

    let path = |p: &std::path::Path| p.display().to_string();
    let out = convert(&[
        "--input",
        &path(&mha_dir),
        "--output",
        &path(&gqa_dir),
        "--groups",
        "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (gqa_config, gqa) = t5_hf::load(&gqa_dir, &device).unwrap();
    assert_eq!(gqa_config.n_kv_heads, 2);
    let expected = convert_kv_heads(model, 2, KvConversion::Mean).unwrap();
    let (a, b) = (logits(&gqa), logits(&expected));
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-5));

    for (args, needle) in [
        (
            vec![
                "--input",
                &path(&mha_dir),
                "--output",
                &path(&gqa_dir),
                "--groups",
                "2",
            ],
            "already holds",
        ),
        (
            vec![
                "--input",
                &path(&mha_dir),
                "--output",
                "unused",
                "--groups",
                "3",
            ],
            "must divide",
        ),
        (
            vec![
                "--input",
                &path(&gqa_dir),
                "--output",
                "unused2",
                "--groups",
                "1",
            ],
            "multi-head",
        ),
        (
            vec![
                "--input",
                "no/such/dir",
                "--output",
                "unused3",
                "--groups",
                "1",
            ],
            "config.json",
        ),
        (
            vec![
                "--input",
                "hub:t5-v1_1-small",
                "--output",
                "unused4",
                "--groups",
                "1",
            ],
            "expected OWNER/NAME",
        ),
    ] {
        let out = convert(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            err.starts_with("error:") && err.contains(needle),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert_eq!(out.status.code(), Some(1), "{err}");
    }
    // A usage error is clap's: it names the missing option and exits 2.
    let out = convert(&["--input", &path(&mha_dir), "--groups", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error:") && err.contains("--output <DIR>"),
        "{err}"
    );
}
