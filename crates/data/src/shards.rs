//! Shards fetched when the reader reaches them.
//!
//! A hub split is listed up front (names, sizes, hashes) but its files are downloaded only as an
//! [`ExampleStream`](crate::source::ExampleStream) opens them: [`hub::split_files`](crate::hub)
//! registers each file's cache path with the function that fetches it, the stream calls [`ensure`]
//! on the file it opens and [`read_ahead`] on the next [`READ_AHEAD`] ones. A run of N steps thus
//! downloads the shards its N steps read (plus at most [`READ_AHEAD`]), and a resumed run fetches
//! from where its stream stands. Paths nobody registered (local files, `--data-dir`) pass through.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use anyhow::{Result, anyhow};

/// Files fetched ahead of the one being read: enough to hide one download behind the reading of
/// a shard, few enough that a short run touches only the first shards of a split.
pub const READ_AHEAD: usize = 2;

type Fetch = dyn Fn() -> Result<()> + Send + Sync;

/// A registered file: its bytes as the listing gives them and how to fetch them. The mutex is held
/// while the file is fetched, so the reader waits for a read-ahead already fetching it.
struct Pending {
    size: u64,
    fetch: Box<Fetch>,
    busy: Mutex<()>,
}

static PENDING: LazyLock<Mutex<HashMap<PathBuf, Arc<Pending>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Registers `path` as a file that `fetch` writes, of `size` bytes.
pub fn register(path: PathBuf, size: u64, fetch: impl Fn() -> Result<()> + Send + Sync + 'static) {
    let pending = Arc::new(Pending {
        size,
        fetch: Box::new(fetch),
        busy: Mutex::new(()),
    });
    lock_table().insert(path, pending);
}

fn lock_table() -> std::sync::MutexGuard<'static, HashMap<PathBuf, Arc<Pending>>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `path` is registered and not yet on disk.
pub fn is_missing(path: &Path) -> bool {
    lock_table().contains_key(path) && !path.exists()
}

/// Makes sure `path` is on disk: fetches a registered file that is not (waiting for a read-ahead
/// fetching it), and refuses one whose size differs from the listing's. Unregistered paths pass.
pub fn ensure(path: &Path) -> Result<()> {
    let Some(pending) = lock_table().get(path).cloned() else {
        return Ok(());
    };
    let _busy = pending.busy.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        (pending.fetch)()?;
    }
    let have = std::fs::metadata(path)
        .map_err(|e| {
            anyhow!(
                "shard {}: not there after its download ({e})",
                path.display()
            )
        })?
        .len();
    if have != pending.size {
        return Err(anyhow!(
            "shard {} has {have} bytes, the hub's listing {}: delete it and run again to download it anew",
            path.display(),
            pending.size
        ));
    }
    Ok(())
}

/// Fetches the registered files among `paths` that are missing, in order, on a background thread.
/// Errors are left to the reader's own [`ensure`], which tries again and reports them.
pub fn read_ahead(paths: &[PathBuf]) {
    let missing: Vec<PathBuf> = paths.iter().filter(|p| is_missing(p)).cloned().collect();
    if missing.is_empty() {
        return;
    }
    std::thread::spawn(move || {
        for p in missing {
            if ensure(&p).is_err() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn fetches_once_on_first_use_and_checks_the_size() {
        let dir = tempfile::tempdir().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let path = dir.path().join("a.parquet");
        let (p, c) = (path.clone(), calls.clone());
        register(path.clone(), 3, move || {
            c.fetch_add(1, Ordering::SeqCst);
            std::fs::write(&p, b"abc")?;
            Ok(())
        });
        assert!(is_missing(&path));
        ensure(&path).unwrap();
        ensure(&path).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(!is_missing(&path));

        // A file on disk whose size differs from the listing is refused, by name.
        let short = dir.path().join("b.parquet");
        std::fs::write(&short, b"ab").unwrap();
        register(short.clone(), 3, || Ok(()));
        let err = ensure(&short).unwrap_err().to_string();
        assert!(
            err.contains("b.parquet") && err.contains("2 bytes"),
            "{err}"
        );

        // Unregistered paths pass untouched.
        ensure(&dir.path().join("local.parquet")).unwrap();
    }

    #[test]
    fn read_ahead_and_the_reader_share_one_fetch() {
        let dir = tempfile::tempdir().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let path = dir.path().join("c.parquet");
        let (p, c) = (path.clone(), calls.clone());
        register(path.clone(), 1, move || {
            c.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(50));
            std::fs::write(&p, b"x")?;
            Ok(())
        });
        read_ahead(std::slice::from_ref(&path));
        ensure(&path).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
