//! One store of training runs shared by every artifact. A run is identified by its resolved
//! configuration (model config, objective, data, tokenizer, context, batch, steps, schedule,
//! optimizer, seed, evaluation) and lives in `<store>/<arch>-<context>-<hash>/`, the hash taken over
//! that configuration; an artifact that needs a run already in the store (fig6 and table3 share
//! most of theirs) reuses it instead of training it again, and an interrupted run resumes there.
//!
//! Each run directory holds `run_config.json` (the identity, also checked against the hash: a
//! collision or a hand-edited directory is refused), the trainer's `metrics.csv`, `env.json` (the
//! provenance of the session that last trained it: commit, device, date, command) and, while it
//! trains, `checkpoint/` (not committed).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use training::write_atomic;

/// FNV-1a, 64 bits: a stable hash of the canonical JSON text (serde_json writes object keys in
/// sorted order), the same on every machine and version of the standard library.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The hash that names a run: 16 hex digits of [`fnv1a`] over `identity`'s canonical JSON.
pub fn run_hash(identity: &serde_json::Value) -> String {
    format!("{:016x}", fnv1a(identity.to_string().as_bytes()))
}

/// The directory of the run with `identity` in `store`: `<arch>-<context>-<hash>`, the prefix only
/// for reading a listing.
pub fn run_dir(store: &Path, arch: &str, context: usize, identity: &serde_json::Value) -> PathBuf {
    store.join(format!("{arch}-{context}-{}", run_hash(identity)))
}

/// Claims `dir` for the run with `identity`: creates it with `run_config.json`, or checks that the
/// one there is the same run.
pub fn claim(dir: &Path, identity: &serde_json::Value) -> Result<()> {
    let path = dir.join("run_config.json");
    if let Ok(saved) = std::fs::read(&path) {
        let saved: serde_json::Value = serde_json::from_slice(&saved).unwrap_or_default();
        if &saved != identity {
            bail!(
                "{} holds a run with another configuration; delete that directory (or pass another --out / --store) to train this one there",
                dir.display()
            );
        }
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    write_atomic(&path, serde_json::to_string_pretty(identity)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_names_the_configuration_not_the_key_order() {
        let a = serde_json::json!({"model": {"d": 256, "arch": "flash"}, "seed": 0});
        let b: serde_json::Value =
            serde_json::from_str(r#"{"seed": 0, "model": {"arch": "flash", "d": 256}}"#).unwrap();
        assert_eq!(run_hash(&a), run_hash(&b));
        let c = serde_json::json!({"model": {"d": 256, "arch": "flash"}, "seed": 1});
        assert_ne!(run_hash(&a), run_hash(&c));
        // The FNV-1a 64 reference value of "a" (from the algorithm's published test vectors).
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn a_directory_holding_another_run_is_refused() {
        let dir = std::env::temp_dir().join(format!("run_store_test_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = serde_json::json!({"seed": 0});
        claim(&dir, &a).unwrap();
        claim(&dir, &a).unwrap();
        let err = claim(&dir, &serde_json::json!({"seed": 1})).unwrap_err();
        assert!(err.to_string().contains("another configuration"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
