//! Downloads from the Hugging Face hub into its standard cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`,
//! else `~/.cache/huggingface/hub`), with hf-hub 1.0. `HF_ENDPOINT` and `HF_TOKEN` are honoured.
//!
//! hf-hub restarts an interrupted download from byte 0, so files are fetched here in ranged chunks
//! appended to the cache's own `blobs/<etag>.incomplete`; a second run continues from its length.
//! Once the blob is complete, hf-hub's `download_file` finds it and writes the snapshot link and the
//! ref, so the cache is the same one `huggingface_hub` (Python) reads and writes.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use hf_hub::repository::{RepoTreeEntry, RepoType};
use hf_hub::{HFClient, HFClientSync, HFRepositorySync, RepoTypeDataset, RepoTypeModel};

use crate::files::list_dir;
use crate::registry::{DatasetSpec, Origin, Split};

/// Bytes per ranged request; `REPRO_HUB_CHUNK_BYTES` overrides it (the tests use small chunks).
const DEFAULT_CHUNK_BYTES: u64 = 64 << 20;

fn chunk_bytes() -> u64 {
    std::env::var("REPRO_HUB_CHUNK_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_CHUNK_BYTES)
}

fn hub_origin(spec: &DatasetSpec) -> Result<(&'static str, &'static str)> {
    match spec.origin {
        Origin::Hub { repo, revision } => Ok((repo, revision)),
        Origin::Local { .. } => bail!(
            "dataset `{}` is built locally (`just data`), not downloaded",
            spec.name
        ),
    }
}

fn client() -> Result<HFClientSync> {
    HFClient::builder()
        .build_sync()
        .map_err(|e| anyhow!("hub client: {e}"))
}

fn owner_name(repo: &str) -> Result<(&str, &str)> {
    repo.split_once('/')
        .ok_or_else(|| anyhow!("bad repo id `{repo}`: expected OWNER/NAME"))
}

fn repository(repo: &str) -> Result<HFRepositorySync<RepoTypeDataset>> {
    let (owner, name) = owner_name(repo)?;
    Ok(client()?.dataset(owner, name))
}

/// The cache directory of a dataset repo: `<cache>/datasets--owner--name`.
pub fn repo_cache_dir(repo: &str) -> PathBuf {
    cache_dir(RepoTypeDataset, repo)
}

/// The cache directory of a repo of any kind: `<cache>/{models,datasets,..}--owner--name`.
fn cache_dir<T: RepoType>(kind: T, repo: &str) -> PathBuf {
    hf_hub::resolve_cache_dir().join(format!("{}--{}", kind.plural(), repo.replace('/', "--")))
}

/// The snapshot directory the cache's `refs/<revision>` points at, if any.
fn cached_snapshot<T: RepoType>(kind: T, repo: &str, revision: &str) -> Option<PathBuf> {
    let dir = cache_dir(kind, repo);
    let commit = std::fs::read_to_string(dir.join("refs").join(revision)).ok()?;
    let snapshot = dir.join("snapshots").join(commit.trim());
    snapshot.is_dir().then_some(snapshot)
}

/// Files of `split` already in the cache, for `revision` (read from the cache's `refs/`).
pub fn cached_split_files(spec: &DatasetSpec, split: Split) -> Result<Vec<PathBuf>> {
    let (repo, revision) = hub_origin(spec)?;
    let Some(snapshot) = cached_snapshot(RepoTypeDataset, repo, revision) else {
        return Ok(Vec::new());
    };
    Ok(list_dir(&snapshot)?
        .into_iter()
        .filter(|p| spec.matches(p, split))
        .map(|p| snapshot.join(p))
        .collect())
}

/// One file of a split as the hub lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedFile {
    /// Path in the repo.
    pub path: String,
    pub size: u64,
    /// SHA-256 of the content, where the file is LFS-backed (the hub lists it then).
    pub sha256: Option<String>,
}

/// Every file of a repo at a revision, as the hub lists it, or why it could not be listed.
type RepoListing = std::result::Result<Vec<ListedFile>, String>;

/// The repo's whole listing, asked of the hub once per process for each endpoint, repo and revision:
/// every split of a repo is read from the same listing, so a dry run over a pipeline's datasets
/// sends one request per repo (and, with no network, waits for one timeout per repo, not per split).
fn repo_listing(repo: &str, revision: &str) -> RepoListing {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    /// (endpoint, repo, revision) → listing.
    type Listings = HashMap<(String, String, String), RepoListing>;
    static LISTINGS: OnceLock<Mutex<Listings>> = OnceLock::new();
    let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_default();
    let key = (endpoint, repo.to_string(), revision.to_string());
    let listings = LISTINGS.get_or_init(Default::default);
    if let Some(hit) = listings.lock().unwrap().get(&key) {
        return hit.clone();
    }
    let listing = repository(repo)
        .map_err(|e| format!("{e:#}"))
        .and_then(|r| {
            r.list_tree()
                .revision(revision.to_string())
                .recursive(true)
                .send()
                .map_err(|e| format!("listing {repo}@{revision}: {e}"))
        })
        .map(|entries| {
            entries
                .into_iter()
                .filter_map(|e| match e {
                    RepoTreeEntry::File {
                        path, size, lfs, ..
                    } => Some(ListedFile {
                        path,
                        size,
                        sha256: lfs.and_then(|l| l.sha256),
                    }),
                    _ => None,
                })
                .collect()
        });
    listings.lock().unwrap().insert(key, listing.clone());
    listing
}

/// The split's files in the repo, from the hub's file listing, in reading order.
pub fn list_split(spec: &DatasetSpec, split: Split) -> Result<Vec<ListedFile>> {
    let (repo, revision) = hub_origin(spec)?;
    let mut files: Vec<ListedFile> = repo_listing(repo, revision)
        .map_err(|e| anyhow!(e))?
        .into_iter()
        .filter(|f| spec.matches(&f.path, split))
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// The split's files, as paths in the cache's snapshot. Unless `offline`, the split is listed on the
/// hub and each file not yet cached is registered with [`crate::shards`], which downloads it when
/// a stream first reads it (and a few ahead): nothing is downloaded here. With no network (or
/// `--offline`) the cached files are used; with neither, the error says both ways to provide them.
pub fn split_files(spec: &DatasetSpec, split: Split, offline: bool) -> Result<Vec<PathBuf>> {
    let (repo, revision) = hub_origin(spec)?;
    let no_files = |why: String| {
        anyhow!(
            "dataset `{}` split {split}: {why}, and no {} is in the cache {}; fetch it where the hub is reachable (`datasets fetch {} --split {split}`, then copy {}), or place the files in the repo's layout under DIR/{} and pass --data-dir DIR",
            spec.name,
            spec.expected_files(split),
            hf_hub::resolve_cache_dir().display(),
            spec.name,
            repo_cache_dir(repo).display(),
            spec.name,
        )
    };
    if offline {
        let cached = cached_split_files(spec, split)?;
        return if cached.is_empty() {
            Err(no_files("--offline was given".into()))
        } else {
            Ok(cached)
        };
    }
    let listing = match list_split(spec, split) {
        Ok(l) => l,
        Err(e) => {
            let cached = cached_split_files(spec, split)?;
            if cached.is_empty() {
                return Err(no_files(format!("the hub is unreachable ({e:#})")));
            }
            eprintln!("warning: {e:#}; using the {} cached files", cached.len());
            return Ok(cached);
        }
    };
    let Some(first) = listing.first() else {
        bail!(
            "dataset `{}`: {repo}@{revision} has no file {}",
            spec.name,
            spec.expected_files(split)
        );
    };
    // The snapshot directory is named by the commit the revision resolves to.
    let commit = repository(repo)?
        .get_file_metadata()
        .filepath(first.path.clone())
        .revision(revision)
        .send()
        .map_err(|e| anyhow!("{repo}/{}: {e}", first.path))?
        .commit_hash;
    let snapshot = repo_cache_dir(repo).join("snapshots").join(&commit);
    Ok(listing
        .into_iter()
        .map(|file| {
            let path = snapshot.join(&file.path);
            let expected = path.clone();
            crate::shards::register(path.clone(), file.size, move || {
                let got = download(&repository(repo)?, repo, revision, &file.path, file.sha256.as_deref())?;
                if got != expected {
                    bail!(
                        "{repo}@{revision} moved to another commit while it was read ({} instead of {}); run again",
                        got.display(),
                        expected.display()
                    );
                }
                Ok(())
            });
            path
        })
        .collect())
}

/// Downloads one file into the cache, resuming a partial download, and checks it against `sha256`
/// (the hub's listing) or, for an LFS file, its ETag (the content's SHA-256): a file that does not
/// match is removed and refused by name.
/// Returns its snapshot path.
pub fn download<T: RepoType>(
    r: &HFRepositorySync<T>,
    repo: &str,
    revision: &str,
    filename: &str,
    sha256: Option<&str>,
) -> Result<PathBuf> {
    let meta = r
        .get_file_metadata()
        .filepath(filename.to_string())
        .revision(revision)
        .send()
        .map_err(|e| anyhow!("{repo}/{filename}: {e}"))?;
    let blob = cache_dir(*r.repo_type(), repo)
        .join("blobs")
        .join(&meta.etag);
    if meta.xet_hash.is_none() && !blob.exists() {
        let partial = PathBuf::from(format!("{}.incomplete", blob.display()));
        std::fs::create_dir_all(partial.parent().unwrap_or(Path::new(".")))?;
        let mut have = std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
        if have > meta.file_size {
            have = 0;
            std::fs::remove_file(&partial)?;
        }
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&partial)
            .with_context(|| format!("cannot write {}", partial.display()))?;
        let mut progress = ByteProgress::new(filename, meta.file_size, have);
        let step = chunk_bytes();
        while have < meta.file_size {
            let end = (have + step).min(meta.file_size);
            let bytes = r
                .download_file_to_bytes()
                .filename(filename.to_string())
                .revision(revision.to_string())
                .range(have..end)
                .send()
                .map_err(|e| anyhow!("{repo}/{filename}: download stopped at byte {have} ({e}); run again to resume"))?;
            if bytes.len() as u64 != end - have {
                bail!(
                    "{repo}/{filename}: the server sent {} bytes for range {have}..{end}; run again to resume",
                    bytes.len()
                );
            }
            out.write_all(&bytes)?;
            out.flush()?;
            have = end;
            progress.set(have);
        }
        progress.finish();
        drop(out);
        // The hub's ETag of an LFS file is its content's SHA-256.
        let etag_sha = (meta.etag.len() == 64 && meta.etag.bytes().all(|b| b.is_ascii_hexdigit()))
            .then_some(meta.etag.as_str());
        if let Some(want) = sha256.or(etag_sha) {
            let got = sha256_hex(&partial)?;
            if !got.eq_ignore_ascii_case(want) {
                std::fs::remove_file(&partial)?;
                bail!(
                    "{repo}/{filename}: corrupt download (sha256 {got}, the hub lists {want}); the bad copy is removed, run again to download it anew"
                );
            }
        }
        std::fs::rename(&partial, &blob)?;
    }
    // Xet-backed files go through hf-hub's own xet path; plain files are already in `blobs/`, and
    // this call only writes the snapshot link and the ref.
    r.download_file()
        .filename(filename.to_string())
        .revision(revision.to_string())
        .send()
        .map_err(|e| anyhow!("{repo}/{filename}: {e}"))
}

/// The SHA-256 of a file, as lowercase hex.
fn sha256_hex(path: &Path) -> Result<String> {
    use sha2::Digest;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The files of a T5 checkpoint in Hugging Face layout that `model::t5_hf::load` reads: `config.json`
/// and either `model.safetensors` or `model.safetensors.index.json` with its shards. Anything else
/// in the repo (PyTorch `.bin`, TF, Flax, tokenizer files) is not downloaded.
pub fn checkpoint_files(listing: &[String]) -> std::result::Result<Vec<String>, String> {
    let has = |f: &str| listing.iter().any(|p| p == f);
    if !has("config.json") {
        return Err("has no config.json".into());
    }
    let weights: Vec<String> = if has("model.safetensors") {
        vec!["model.safetensors".into()]
    } else if has("model.safetensors.index.json") {
        std::iter::once("model.safetensors.index.json".to_string())
            .chain(
                listing
                    .iter()
                    .filter(|p| {
                        !p.contains('/') && p.starts_with("model-") && p.ends_with(".safetensors")
                    })
                    .cloned(),
            )
            .collect()
    } else {
        let others: Vec<&str> = listing
            .iter()
            .map(String::as_str)
            .filter(|p| p.ends_with(".bin") || p.ends_with(".h5") || p.ends_with(".msgpack"))
            .collect();
        return Err(format!(
            "has no model.safetensors (only {}); pick a revision that has one (the hub's safetensors conversion pull requests are `refs/pr/N`: REPO@refs/pr/N) or convert the weights to safetensors and pass the directory",
            if others.is_empty() {
                "non-weight files".to_string()
            } else {
                others.join(", ")
            }
        ));
    };
    Ok(std::iter::once("config.json".to_string())
        .chain(weights)
        .collect())
}

/// A model checkpoint `OWNER/NAME[@REVISION]` from the hub (default revision `main`): its
/// [`checkpoint_files`] downloaded into the cache (resuming partial files), or, when the hub is
/// unreachable or `offline`, found there. Returns the snapshot directory holding them.
pub fn fetch_checkpoint(spec: &str, offline: bool) -> Result<PathBuf> {
    let (repo, revision) = spec.split_once('@').unwrap_or((spec, "main"));
    let (owner, name) = owner_name(repo)?;
    let cached = || {
        cached_snapshot(RepoTypeModel, repo, revision)
            .filter(|dir| dir.join("config.json").is_file())
    };
    let no_files = |why: String| {
        anyhow!(
            "checkpoint {repo}@{revision}: {why}, and it is not in the cache {}; fetch it where the hub is reachable (`datasets fetch-model {spec}`, then copy {}), or pass a directory holding config.json and model.safetensors",
            hf_hub::resolve_cache_dir().display(),
            cache_dir(RepoTypeModel, repo).display(),
        )
    };
    if offline {
        return cached().ok_or_else(|| no_files("--offline was given".into()));
    }
    let handle = client()?.model(owner, name);
    let listing = match handle
        .list_tree()
        .revision(revision.to_string())
        .recursive(true)
        .send()
    {
        Ok(entries) => entries
            .into_iter()
            .filter_map(|e| match e {
                RepoTreeEntry::File { path, .. } => Some(path),
                _ => None,
            })
            .collect::<Vec<_>>(),
        Err(e) => {
            let Some(dir) = cached() else {
                return Err(no_files(format!("the hub is unreachable ({e})")));
            };
            eprintln!("warning: {e}; using the cached {}", dir.display());
            return Ok(dir);
        }
    };
    let files = checkpoint_files(&listing).map_err(|why| anyhow!("{repo}@{revision} {why}"))?;
    let mut dir = None;
    for f in &files {
        let path = download(&handle, repo, revision, f, None)?;
        dir = path.parent().map(Path::to_path_buf);
    }
    dir.ok_or_else(|| anyhow!("{repo}@{revision}: nothing downloaded"))
}

/// Bytes, rate and ETA: a bar on a terminal, a line per 10% otherwise.
struct ByteProgress {
    bar: Option<indicatif::ProgressBar>,
    name: String,
    total: u64,
    start: Instant,
    start_bytes: u64,
    last_decile: u64,
}

impl ByteProgress {
    fn new(name: &str, total: u64, have: u64) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
                )
                .expect("static template")
                .progress_chars("=> "),
            );
            bar.set_message(name.to_string());
            bar.set_position(have);
            bar
        });
        if have > 0 {
            eprintln!("{name}: resuming at {have} of {total} bytes");
        }
        Self {
            bar,
            name: name.into(),
            total,
            start: Instant::now(),
            start_bytes: have,
            last_decile: have * 10 / total.max(1),
        }
    }

    fn set(&mut self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(bytes);
            return;
        }
        let decile = bytes * 10 / self.total.max(1);
        if decile > self.last_decile {
            self.last_decile = decile;
            let secs = self.start.elapsed().as_secs_f64().max(1e-9);
            let rate = (bytes - self.start_bytes) as f64 / secs;
            let eta = (self.total - bytes) as f64 / rate.max(1.0);
            eprintln!(
                "{}: {} / {} MB ({:.1} MB/s, ETA {:.0} s)",
                self.name,
                bytes / 1_000_000,
                self.total / 1_000_000,
                rate / 1e6,
                eta
            );
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}
