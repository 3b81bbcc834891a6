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
use std::time::Duration;

use anyhow::{Context, Result, bail};
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

/// The right to train the run in a directory, held by one process at a time: `<dir>/training.lock`
/// holds the holder's process id; dropping the guard removes it.
pub struct TrainingLock {
    path: PathBuf,
}

impl Drop for TrainingLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether process `pid` runs (Linux: `/proc/<pid>` exists; where there is no `/proc`, every
/// holder counts as running, and a lock left behind is deleted by hand).
fn process_runs(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.is_dir() || proc.join(pid.to_string()).exists()
}

/// Takes `dir`'s training lock, waiting (checking every `poll`) while a running process holds it,
/// so that experiments sharing a stage directory can run at once: the second waits for the first
/// to finish the shared stage and then reuses it.
pub fn lock_training(dir: &Path, poll: Duration) -> Result<TrainingLock> {
    let mut announced = false;
    loop {
        match try_lock_training(dir)? {
            Ok(lock) => return Ok(lock),
            Err(other) => {
                if !announced {
                    eprintln!(
                        "{}: process {other} is training this stage; waiting for it (delete {} if no such process runs)",
                        dir.display(),
                        dir.join("training.lock").display()
                    );
                    announced = true;
                }
                std::thread::sleep(poll);
            }
        }
    }
}

/// Takes `dir`'s training lock if no running process holds it, else gives the holder's process
/// id (the `--jobs` workers skip a run another worker trains). A lock whose holder has exited
/// (killed, or the machine restarted) is taken over. The lock file appears with its content at
/// once (written aside, then hard-linked into place, which fails when the name exists).
pub fn try_lock_training(dir: &Path) -> Result<std::result::Result<TrainingLock, u32>> {
    let path = dir.join("training.lock");
    let pid = std::process::id();
    let mine = dir.join(format!("training.lock.{pid}"));
    std::fs::write(&mine, pid.to_string())
        .with_context(|| format!("cannot write {}", mine.display()))?;
    let outcome = loop {
        match std::fs::hard_link(&mine, &path) {
            Ok(()) => break Ok(Ok(TrainingLock { path })),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = std::fs::read_to_string(&path).ok();
                match holder.as_deref().map(str::trim).map(str::parse::<u32>) {
                    Some(Ok(other)) if process_runs(other) => break Ok(Err(other)),
                    // Its holder has exited (or it vanished meanwhile): take it over, unless it
                    // changed hands since it was read.
                    _ => {
                        if std::fs::read_to_string(&path).ok() == holder {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                }
            }
            Err(e) => break Err(e).with_context(|| format!("cannot create {}", path.display())),
        }
    };
    let _ = std::fs::remove_file(&mine);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second taker waits until the holder drops the lock (or, trying, is told the holder); a
    /// lock left by a process that has exited is taken over at once.
    #[test]
    fn training_lock_waits_for_its_holder_and_takes_over_a_dead_ones() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = std::env::temp_dir().join(format!("training-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let released = std::sync::Arc::new(AtomicBool::new(false));
        let first = lock_training(&dir, Duration::from_millis(5)).unwrap();
        assert_eq!(
            try_lock_training(&dir).unwrap().err(),
            Some(std::process::id()),
            "a held lock is refused to a try, naming its holder"
        );
        let holder = {
            let released = released.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                released.store(true, Ordering::SeqCst);
                drop(first);
            })
        };
        let second = lock_training(&dir, Duration::from_millis(5)).unwrap();
        assert!(
            released.load(Ordering::SeqCst),
            "taken while the first held it"
        );
        holder.join().unwrap();
        drop(second);
        assert!(!dir.join("training.lock").exists(), "dropping releases it");
        // A lock naming a process that has exited.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        std::fs::write(dir.join("training.lock"), dead.to_string()).unwrap();
        let tried = try_lock_training(&dir).unwrap();
        assert!(tried.is_ok(), "a dead holder's lock is taken over by a try");
        drop(tried);
        std::fs::write(dir.join("training.lock"), dead.to_string()).unwrap();
        let taken = lock_training(&dir, Duration::from_secs(3600)).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("training.lock")).unwrap(),
            std::process::id().to_string()
        );
        drop(taken);
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
