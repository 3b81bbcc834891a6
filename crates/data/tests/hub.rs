//! The download path against a real HTTP server: a small hub on 127.0.0.1 serving fixture files under
//! the hub's URL scheme (`/api/datasets/{repo}/tree/{rev}`, `HEAD`/`GET /datasets/{repo}/resolve/{rev}/{path}`
//! with ETag, X-Repo-Commit, Content-Length and byte ranges). The `datasets` binary is pointed at it
//! through `HF_ENDPOINT`, with its own `HF_HOME`.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use common::hub_server::{COMMIT, Hub};
use common::*;

fn fixture_files() -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<String> = (0..200)
        .map(|i| format!("Sentence number {i} of the validation set."))
        .collect();
    let de: Vec<String> = (0..200)
        .map(|i| format!("Satz Nummer {i} der Validierung."))
        .collect();
    let en: Vec<&str> = rows.iter().map(String::as_str).collect();
    let de: Vec<&str> = de.iter().map(String::as_str).collect();
    let path = dir.path().join("v.parquet");
    write_parquet(
        &path,
        vec![(
            "translation",
            structs(vec![("de", utf8(&de)), ("en", utf8(&en))]),
        )],
        50,
        Strings::Plain,
    );
    let mut files = BTreeMap::new();
    files.insert(
        "de-en/validation-00000-of-00001.parquet".to_string(),
        std::fs::read(&path).unwrap(),
    );
    files.insert(
        "de-en/train-00000-of-00003.parquet".to_string(),
        b"not fetched by this test".to_vec(),
    );
    files.insert("README.md".to_string(), b"# wmt14".to_vec());
    // A model repo's tokenizer.json (a small trained one, with T5's special ids).
    let texts = (0..50).map(|i| format!("Sentence number {i} of the validation set."));
    let (tok, _) = data::tokenize::train(&data::tokenize::TokenizerSpec::Bpe(400), texts).unwrap();
    let tok_path = dir.path().join("tokenizer.json");
    tok.save(&tok_path, false).unwrap();
    files.insert(
        "google-t5/t5-base/tokenizer.json".to_string(),
        std::fs::read(&tok_path).unwrap(),
    );
    files
}

#[test]
fn download_resume_cache_and_offline() {
    let files = fixture_files();
    let size = files["de-en/validation-00000-of-00001.parquet"].len();
    assert!(size > 4000, "fixture too small to cut into chunks: {size}");
    let hub = Hub::start(files.clone());
    let home = tempfile::tempdir().unwrap();
    let endpoint = hub.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.path().to_str().unwrap()),
        ("REPRO_HUB_CHUNK_BYTES", "1000"),
    ];
    let blobs = home.path().join("hub/datasets--wmt--wmt14/blobs");

    // 1. The third ranged request is cut off midway: the run fails, keeping the two whole chunks.
    hub.cut_at.store(3, Ordering::SeqCst);
    let (code, _, err) = datasets(&["fetch", "wmt14_de_en", "--split", "validation"], &env);
    assert_ne!(code, 0, "the cut download should fail");
    // Progress lines, then one error line.
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ")
            && last.contains("byte 2000")
            && last.contains("run again to resume"),
        "{err}"
    );
    let partial: Vec<_> = std::fs::read_dir(&blobs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(partial.len(), 1, "{partial:?}");
    assert!(partial[0].to_string_lossy().ends_with(".incomplete"));
    assert_eq!(std::fs::metadata(&partial[0]).unwrap().len(), 2000);

    // 2. Run again: it continues from byte 2000 and the cached file equals the served one.
    hub.cut_at.store(0, Ordering::SeqCst);
    let mark = hub.log.lock().unwrap().len();
    let (code, out, err) = datasets(&["fetch", "wmt14_de_en", "--split", "validation"], &env);
    assert_eq!(code, 0, "{err}");
    let ranges = hub.ranges_since(mark);
    assert_eq!(
        ranges.first().map(String::as_str),
        Some("bytes=2000-2999"),
        "{ranges:?}"
    );
    assert!(err.contains("resuming at 2000"), "{err}");
    // The listing picked the split's file only (not train, not README.md).
    assert!(
        out.contains("1 files") && out.contains("validation-00000-of-00001.parquet"),
        "{out}"
    );
    let cached = home
        .path()
        .join("hub/datasets--wmt--wmt14/snapshots")
        .join(COMMIT)
        .join("de-en/validation-00000-of-00001.parquet");
    assert_eq!(
        std::fs::read(&cached).unwrap(),
        files["de-en/validation-00000-of-00001.parquet"]
    );
    assert_eq!(
        std::fs::read_to_string(home.path().join("hub/datasets--wmt--wmt14/refs/main"))
            .unwrap()
            .trim(),
        COMMIT
    );

    // 3. A second fetch downloads nothing.
    let mark = hub.log.lock().unwrap().len();
    let (code, _, err) = datasets(&["fetch", "wmt14_de_en", "--split", "validation"], &env);
    assert_eq!(code, 0, "{err}");
    assert!(hub.ranges_since(mark).is_empty());

    // 4. With the server gone, --offline (and a failed listing) read the cache.
    let dead = [
        ("HF_ENDPOINT", "http://127.0.0.1:9"),
        ("HF_HOME", home.path().to_str().unwrap()),
    ];
    for extra in [&["--offline"][..], &[][..]] {
        let mut args = vec!["peek", "wmt14_de_en", "--split", "validation", "--n", "2"];
        args.extend_from_slice(extra);
        let (code, out, err) = datasets(&args, &dead);
        assert_eq!(code, 0, "{err}");
        let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        assert_eq!(
            first,
            serde_json::json!({"source": "Sentence number 0 of the validation set.", "target": "Satz Nummer 0 der Validierung."})
        );
    }

    // 4b. A tokenizer.json from a hub model repo, through the same cache.
    let (code, out, err) = datasets(
        &[
            "stats",
            "wmt14_de_en",
            "--split",
            "validation",
            "--tokenizer",
            "hub:google-t5/t5-base",
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("tokenizer: google-t5/t5-base tokenizer.json"),
        "{out}"
    );
    assert!(
        out.contains("wmt14_de_en validation: 200 documents"),
        "{out}"
    );
    assert!(
        home.path()
            .join("hub/models--google-t5--t5-base/snapshots")
            .join(COMMIT)
            .join("tokenizer.json")
            .exists()
    );

    // 5. Server down and nothing cached: one line naming the dataset, the files and both fixes.
    let empty = tempfile::tempdir().unwrap();
    let (code, _, err) = datasets(
        &["peek", "wmt14_de_en", "--split", "test"],
        &[
            ("HF_ENDPOINT", "http://127.0.0.1:9"),
            ("HF_HOME", empty.path().to_str().unwrap()),
        ],
    );
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    for needle in [
        "wmt14_de_en",
        "de-en/test-NNNNN-of-MMMMM.parquet",
        "datasets fetch",
        "--data-dir",
    ] {
        assert!(err.contains(needle), "missing {needle}: {err}");
    }
}

/// A T5 checkpoint from a model repo: config.json and the sharded safetensors are fetched (nothing
/// else), served again from the cache offline; a repo with only PyTorch weights, and no hub with no
/// cache, are one-line errors naming the fix.
#[test]
fn model_checkpoint_download() {
    let mut files = BTreeMap::new();
    let repo = "google/t5-v1_1-tiny";
    let weights: Vec<(&str, Vec<u8>)> = vec![
        ("config.json", br#"{"model_type": "t5"}"#.to_vec()),
        (
            "model.safetensors.index.json",
            br#"{"weight_map": {}}"#.to_vec(),
        ),
        ("model-00001-of-00002.safetensors", vec![7u8; 3000]),
        ("model-00002-of-00002.safetensors", vec![9u8; 1500]),
    ];
    for (f, bytes) in &weights {
        files.insert(format!("{repo}/{f}"), bytes.clone());
    }
    for f in [
        "pytorch_model.bin",
        "tokenizer_config.json",
        "flax_model.msgpack",
    ] {
        files.insert(format!("{repo}/{f}"), b"not fetched".to_vec());
    }
    files.insert("google/t5-bin-only/config.json".into(), b"{}".to_vec());
    files.insert(
        "google/t5-bin-only/pytorch_model.bin".into(),
        b"torch".to_vec(),
    );
    let hub = Hub::start(files);
    let home = tempfile::tempdir().unwrap();
    let endpoint = hub.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.path().to_str().unwrap()),
        ("REPRO_HUB_CHUNK_BYTES", "1000"),
    ];

    let (code, out, err) = datasets(&["fetch-model", repo], &env);
    assert_eq!(code, 0, "{err}");
    let dir = std::path::PathBuf::from(out.trim());
    assert_eq!(
        dir,
        home.path()
            .join("hub/models--google--t5-v1_1-tiny/snapshots")
            .join(COMMIT)
    );
    for (f, bytes) in &weights {
        assert_eq!(&std::fs::read(dir.join(f)).unwrap(), bytes, "{f}");
    }
    for f in [
        "pytorch_model.bin",
        "tokenizer_config.json",
        "flax_model.msgpack",
    ] {
        assert!(!dir.join(f).exists(), "{f} was downloaded");
    }
    assert!(
        !hub.log
            .lock()
            .unwrap()
            .iter()
            .any(|(_, p, _)| p.contains("pytorch_model")),
        "pytorch_model.bin was requested"
    );

    // Offline (and with the hub gone) the cached snapshot is found.
    let dead = [
        ("HF_ENDPOINT", "http://127.0.0.1:9"),
        ("HF_HOME", home.path().to_str().unwrap()),
    ];
    for extra in [&["--offline"][..], &[][..]] {
        let mut args = vec!["fetch-model", repo];
        args.extend_from_slice(extra);
        let (code, out, err) = datasets(&args, &dead);
        assert_eq!(code, 0, "{err}");
        assert_eq!(std::path::PathBuf::from(out.trim()), dir);
    }

    // Only PyTorch weights: one line naming what is there and how to get safetensors.
    let (code, _, err) = datasets(&["fetch-model", "google/t5-bin-only"], &env);
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    for needle in ["google/t5-bin-only@main", "pytorch_model.bin", "refs/pr/N"] {
        assert!(err.contains(needle), "missing {needle}: {err}");
    }

    // No hub and no cache: one line with both fixes.
    let empty = tempfile::tempdir().unwrap();
    let (code, _, err) = datasets(
        &["fetch-model", "google/t5-v1_1-xxl@main"],
        &[
            ("HF_ENDPOINT", "http://127.0.0.1:9"),
            ("HF_HOME", empty.path().to_str().unwrap()),
        ],
    );
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    for needle in [
        "google/t5-v1_1-xxl@main",
        "datasets fetch-model",
        "config.json and model.safetensors",
    ] {
        assert!(err.contains(needle), "missing {needle}: {err}");
    }
}

/// A 50-shard split is listed, not downloaded: reading its first examples fetches the shards they
/// are in and at most `READ_AHEAD` more; `fetch --max-shards N` fetches N; a shard whose bytes do
/// not match the hub's SHA-256 is refused by name, and nothing of it is kept.
#[test]
fn shards_are_fetched_as_read() {
    use common::{shard_indices, sharded_split};
    let files = sharded_split(50, 20);
    let hub = Hub::start(files.clone());
    let home = tempfile::tempdir().unwrap();
    let endpoint = hub.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.path().to_str().unwrap()),
    ];
    let ahead = data::shards::READ_AHEAD;

    // 30 examples: shard 0 and 10 rows of shard 1.
    let (code, out, err) = datasets(
        &["peek", "wmt14_de_en", "--split", "train", "--n", "30"],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 30);
    assert_eq!(lines[29]["source"], "Sentence 9 of shard 1");
    let touched = shard_indices(&hub.fetched());
    assert!(touched.contains(&0) && touched.contains(&1), "{touched:?}");
    assert!(
        touched.iter().all(|&s| s <= 1 + ahead),
        "shards beyond the read-ahead were requested: {touched:?}"
    );

    // Fetching ahead: the first 5 shards, no further.
    let (code, out, err) = datasets(
        &[
            "fetch",
            "wmt14_de_en",
            "--split",
            "train",
            "--max-shards",
            "5",
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("the first 5 of 50 files"), "{out}");
    let snapshot = home
        .path()
        .join("hub/datasets--wmt--wmt14/snapshots")
        .join(COMMIT);
    for s in 0..5 {
        let name = format!("de-en/train-{s:05}-of-00050.parquet");
        assert_eq!(std::fs::read(snapshot.join(&name)).unwrap(), files[&name]);
    }
    assert!(
        shard_indices(&hub.fetched())
            .iter()
            .all(|&s| s <= (1 + ahead).max(4))
    );

    // Shard 7 arrives corrupt: refused, with its name, and neither the blob nor a partial kept.
    let bad = "de-en/train-00007-of-00050.parquet";
    *hub.tamper.lock().unwrap() = Some(bad.into());
    let fetch_8 = || {
        datasets(
            &[
                "fetch",
                "wmt14_de_en",
                "--split",
                "train",
                "--max-shards",
                "8",
            ],
            &env,
        )
    };
    let (code, _, err) = fetch_8();
    assert_ne!(code, 0);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains(bad) && last.contains("corrupt"),
        "{err}"
    );
    let blobs = home.path().join("hub/datasets--wmt--wmt14/blobs");
    let sha = common::hub_server::sha256_hex(&files[bad]);
    for entry in std::fs::read_dir(&blobs).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(!name.starts_with(&sha), "kept {name}");
    }
    assert!(!snapshot.join(bad).exists());
    assert_eq!(shard_indices(&hub.fetched()).iter().max(), Some(&7));

    // Served intact again: the same command completes it.
    *hub.tamper.lock().unwrap() = None;
    let (code, _, err) = fetch_8();
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(snapshot.join(bad)).unwrap(), files[bad]);
}
