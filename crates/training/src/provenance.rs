//! Provenance saved beside every result: git commit, device, versions, date, command line.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use serde::Serialize;

/// Where a result came from.
#[derive(Clone, Debug, Serialize)]
pub struct Provenance {
    /// `git rev-parse HEAD`, with `-dirty` when tracked files outside `results/` and `runs/` had
    /// uncommitted changes (results being regenerated do not make a run's code uncertain).
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

impl Provenance {
    /// Collects the provenance of this run on `device`.
    pub fn collect(device: String) -> Self {
        let git = |args: &[&str]| {
            Command::new("git")
                .args(args)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
        let dirty = git(&[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ":/",
            ":(top,exclude)results",
            ":(top,exclude)runs",
        ])
        .is_some_and(|s| !s.is_empty());
        Self {
            git_commit: if dirty {
                format!("{commit}-dirty")
            } else {
                commit
            },
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
