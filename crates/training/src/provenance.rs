//! Provenance saved beside every result: git commit, device, versions, date, command line.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context, Result};
use serde::Serialize;

/// Where a result came from.
#[derive(Clone, Debug, Serialize)]
pub struct Provenance {
    /// The commit of the code that ran: the one the binary was built from where it says so
    /// ([`set_build_commit`]: the experiment binaries), else the working tree's `git rev-parse
    /// HEAD`; with `-dirty` when tracked files outside `results/` and `runs/` had uncommitted
    /// changes (results being regenerated do not make a run's code uncertain).
    pub git_commit: String,
    /// Backend and machine.
    pub device: String,
    /// The instruction set the fused CPU kernels' loops ran at (`model::fused::simd`: `avx512`,
    /// `avx2` or `scalar`, the widest this CPU has unless `REPRO_SIMD` asked otherwise).
    pub simd_level: &'static str,
    /// burn's version.
    pub burn_version: &'static str,
    /// UTC date and time of the run.
    pub date: String,
    /// The command line.
    pub command: String,
}

/// The commit this process's binary was built from, once set.
static BUILD_COMMIT: OnceLock<String> = OnceLock::new();

/// Names the commit the running binary was built from (`git rev-parse HEAD` at build time, with
/// `-dirty` as [`Provenance::git_commit`] describes), for every later [`Provenance::collect`]: a
/// long run whose working tree moves on (a commit, an edit) still records the code that ran. The
/// first call wins.
pub fn set_build_commit(commit: &str) {
    let _ = BUILD_COMMIT.set(commit.to_string());
}

include!("git_state.rs");

impl Provenance {
    /// Collects the provenance of this run on `device`.
    pub fn collect(device: String) -> Self {
        Self {
            git_commit: BUILD_COMMIT
                .get()
                .cloned()
                .unwrap_or_else(|| tree_commit(None)),
            device,
            simd_level: model::fused::simd::SimdLevel::selected().name(),
            burn_version: "0.22.1",
            date: chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
        }
    }
}

/// Writes `contents` to `path` through a temporary file in the same directory, then renames it, so
/// a reader never sees a half-written file.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, contents).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Writes `value` as pretty JSON, atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    write_atomic(path, serde_json::to_string_pretty(value)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Once the binary names its build's commit, every provenance records that commit, not the
    /// working tree's.
    #[test]
    fn the_build_commit_is_recorded_once_set() {
        set_build_commit("0123abcd-built");
        assert_eq!(
            Provenance::collect("cpu".into()).git_commit,
            "0123abcd-built"
        );
        set_build_commit("another");
        assert_eq!(
            Provenance::collect("cpu".into()).git_commit,
            "0123abcd-built",
            "the first call wins"
        );
    }
}
