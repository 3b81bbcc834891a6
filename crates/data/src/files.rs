//! Files on disk: a folder's listing and a file list's size, for the local readers, the hub's
//! cache and the dry run's data lines.

use std::path::{Path, PathBuf};

use anyhow::Result;

/// All files under `root`, as `/`-separated paths relative to it, sorted.
pub fn list_dir(root: &Path) -> Result<Vec<String>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out)?;
            } else if let Ok(rel) = path.strip_prefix(root) {
                let rel: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(rel.join("/"));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, root, &mut out)
        .map_err(|e| anyhow::anyhow!("cannot list {}: {e}", root.display()))?;
    out.sort();
    Ok(out)
}

/// The bytes of those of `files` that are on disk.
pub fn bytes_on_disk(files: &[PathBuf]) -> u64 {
    files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum()
}
