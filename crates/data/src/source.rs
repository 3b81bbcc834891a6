//! Finding and streaming a split. A dataset's files come from, in this order: its own folder named
//! in the config (`data_dirs`), `DIR/<dataset>/` under `--data-dir DIR` (files placed by hand in the
//! repo's layout), the local corpus directory (offline datasets), or the Hugging Face hub cache —
//! downloading as the stream reads them when allowed (feature `hub`, [`crate::shards`]). The stream
//! of examples has a position (file, row) that can be saved and reopened exactly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::example::Example;
use crate::files::{bytes_on_disk, list_dir};
use crate::read::{JsonGzRows, ParquetRows, Record, TextPairRows};
use crate::registry::{DatasetSpec, ExampleKind, Layout, Origin, Split};

/// Where to look for files, as the command-line flags and configs set it.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// `--data-dir DIR`: a root holding one folder per dataset, `DIR/<dataset>/` in the dataset's
    /// hub layout ([`DatasetSpec::folder`]); a dataset with no folder there is read from its default.
    pub data_dir: Option<PathBuf>,
    /// A dataset's own folder (in its hub layout), by dataset name; before `data_dir`.
    pub dataset_dirs: BTreeMap<String, PathBuf>,
    /// `--offline` (or `HF_HUB_OFFLINE=1`): never touch the network; use the cache or the folders
    /// above only.
    pub offline: bool,
    /// Where `just data` writes the offline corpus (default `data/`, or `$REPRO_DATA`).
    pub local_root: PathBuf,
}

impl SourceOptions {
    /// The defaults with a config's `data_dir` root (empty: none) and per-dataset folders; a
    /// folder for a dataset the registry does not have is refused.
    pub fn from_config(data_dir: &str, dataset_dirs: &BTreeMap<String, String>) -> Result<Self> {
        for name in dataset_dirs.keys() {
            if crate::registry::lookup(name).is_err() {
                bail!(
                    "data_dirs names `{name}`, which is no dataset of the registry; `datasets list` shows them"
                );
            }
        }
        Ok(Self {
            data_dir: (!data_dir.is_empty()).then(|| PathBuf::from(data_dir)),
            dataset_dirs: dataset_dirs
                .iter()
                .map(|(k, v)| (k.clone(), PathBuf::from(v)))
                .collect(),
            ..Self::default()
        })
    }

    /// The defaults with one dataset's own folder.
    pub fn with_dataset_dir(name: &str, dir: impl Into<PathBuf>) -> Self {
        Self {
            dataset_dirs: [(name.to_string(), dir.into())].into(),
            ..Self::default()
        }
    }

    /// The folder placed for `spec` by hand, if any: its own (`dataset_dirs`), else
    /// `data_dir/<folder>/` when that exists.
    pub fn placed_folder(&self, spec: &DatasetSpec) -> Option<PathBuf> {
        if let Some(dir) = self.dataset_dirs.get(spec.name) {
            return Some(dir.clone());
        }
        let dir = self.data_dir.as_ref()?.join(spec.folder());
        dir.is_dir().then_some(dir)
    }
}

impl Default for SourceOptions {
    fn default() -> Self {
        Self {
            data_dir: None,
            dataset_dirs: BTreeMap::new(),
            // The Hugging Face libraries' own switch.
            offline: std::env::var("HF_HUB_OFFLINE")
                .is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")),
            local_root: std::env::var_os("REPRO_DATA")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("data")),
        }
    }
}

/// The files of `split`, in the order they are read.
pub fn split_files(spec: &DatasetSpec, split: Split, opts: &SourceOptions) -> Result<Vec<PathBuf>> {
    if let Some(root) = opts.placed_folder(spec) {
        let found = files_under(spec, split, &root)?;
        if found.is_empty() {
            bail!(
                "dataset `{}` split {split}: no file {} under {}; place the repo's files there in its layout, or move the folder away to read the dataset from the hub cache",
                spec.name,
                spec.expected_files(split),
                root.display()
            );
        }
        return check_pairs(spec, split, found);
    }
    let files = match spec.origin {
        Origin::Local { dir } => {
            let root = opts.local_root.join(dir);
            let found = files_under(spec, split, &root)?;
            if found.is_empty() {
                bail!(
                    "dataset `{}` split {split}: no file {}; build the offline corpus with `just data`{}",
                    spec.name,
                    root.join(spec.expected_files(split)).display(),
                    not_under_data_dir(spec, opts)
                );
            }
            found
        }
        Origin::Hub { .. } => hub_files(spec, split, opts)
            .map_err(|e| anyhow::anyhow!("{e:#}{}", not_under_data_dir(spec, opts)))?,
    };
    check_pairs(spec, split, files)
}

/// The files of `split` under a folder in the dataset's layout (none if the folder is absent).
fn files_under(spec: &DatasetSpec, split: Split, root: &Path) -> Result<Vec<PathBuf>> {
    if !root.is_dir() {
        return Ok(Vec::new());
    }
    Ok(list_dir(root)?
        .into_iter()
        .filter(|p| spec.matches(p, split))
        .map(|p| root.join(p))
        .collect())
}

/// With `--data-dir DIR`: where the dataset was looked for there, for the error of one found nowhere.
fn not_under_data_dir(spec: &DatasetSpec, opts: &SourceOptions) -> String {
    match &opts.data_dir {
        Some(root) => format!(
            " (no folder {} under --data-dir either)",
            root.join(spec.folder()).display()
        ),
        None => String::new(),
    }
}

/// What reading `split` needs on disk, in one line: the files placed or built locally, or for a hub
/// dataset the split's size from the hub's listing (and how much of it is cached), or why the size
/// cannot be known (offline, hub unreachable). Downloads nothing.
pub fn data_need(spec: &DatasetSpec, split: Split, opts: &SourceOptions) -> String {
    let local = |root: PathBuf, what: &str| match files_under(spec, split, &root) {
        Ok(f) if !f.is_empty() => format!(
            "{what} {}: {} files, {}",
            root.display(),
            f.len(),
            human_bytes(bytes_on_disk(&f))
        ),
        _ => format!(
            "{what} {}: no file {} there yet",
            root.display(),
            spec.expected_files(split)
        ),
    };
    if let Some(root) = opts.placed_folder(spec) {
        return local(root, "placed in");
    }
    match spec.origin {
        Origin::Local { dir } => local(opts.local_root.join(dir), "built by `just data` in"),
        Origin::Hub { repo, revision } => hub_need(spec, split, opts, repo, revision),
    }
}

#[cfg(feature = "hub")]
fn hub_need(
    spec: &DatasetSpec,
    split: Split,
    opts: &SourceOptions,
    repo: &str,
    revision: &str,
) -> String {
    let cached = bytes_on_disk(&crate::hub::cached_split_files(spec, split).unwrap_or_default());
    let listing = if opts.offline {
        Err("offline".to_string())
    } else {
        crate::hub::list_split(spec, split)
            .map_err(|_| "the hub did not answer its listing".to_string())
    };
    match listing {
        Ok(files) => format!(
            "hub {repo}@{revision}: {} files, {} for the whole split ({} cached); a run downloads only the files it reads",
            files.len(),
            human_bytes(files.iter().map(|f| f.size).sum()),
            human_bytes(cached)
        ),
        Err(why) => format!(
            "hub {repo}@{revision}: size unknown ({why}); {} cached",
            human_bytes(cached)
        ),
    }
}

#[cfg(not(feature = "hub"))]
fn hub_need(
    _spec: &DatasetSpec,
    _split: Split,
    _opts: &SourceOptions,
    repo: &str,
    revision: &str,
) -> String {
    format!("hub {repo}@{revision}: size unknown (this build has no hub support)")
}

/// Bytes as MB or GB (decimal, as the hub shows sizes).
fn human_bytes(b: u64) -> String {
    if b >= 1_000_000_000 {
        format!("{:.1} GB", b as f64 / 1e9)
    } else {
        format!("{:.1} MB", b as f64 / 1e6)
    }
}

fn check_pairs(spec: &DatasetSpec, split: Split, files: Vec<PathBuf>) -> Result<Vec<PathBuf>> {
    if let Layout::TextPairs { .. } = spec.layout
        && files.len() != 2
    {
        bail!(
            "dataset `{}` split {split}: needs both {}",
            spec.name,
            spec.expected_files(split)
        );
    }
    Ok(files)
}

#[cfg(feature = "hub")]
fn hub_files(spec: &DatasetSpec, split: Split, opts: &SourceOptions) -> Result<Vec<PathBuf>> {
    crate::hub::split_files(spec, split, opts.offline)
}

#[cfg(not(feature = "hub"))]
fn hub_files(spec: &DatasetSpec, split: Split, _opts: &SourceOptions) -> Result<Vec<PathBuf>> {
    bail!(
        "dataset `{}`: this build has no hub support (feature `hub`); place {} under a directory and pass --data-dir DIR",
        spec.name,
        spec.expected_files(split)
    )
}

/// Where a model checkpoint in Hugging Face layout (config.json + safetensors) is: `hub:OWNER/NAME`
/// or `hub:OWNER/NAME@REVISION` (e.g. `hub:google/t5-v1_1-xxl`) downloads it into the hub cache, or
/// finds it there when `offline` or unreachable (feature `hub`); anything else is a directory.
pub fn checkpoint_dir(spec: &str, offline: bool) -> Result<PathBuf> {
    match spec.strip_prefix("hub:") {
        Some(repo) => hub_checkpoint(repo, offline),
        None => {
            let dir = PathBuf::from(spec);
            if !dir.join("config.json").is_file() {
                bail!(
                    "checkpoint `{spec}`: no config.json there; pass a directory holding config.json and model.safetensors, or hub:OWNER/NAME[@REVISION]"
                );
            }
            Ok(dir)
        }
    }
}

#[cfg(feature = "hub")]
fn hub_checkpoint(repo: &str, offline: bool) -> Result<PathBuf> {
    crate::hub::fetch_checkpoint(repo, offline)
}

#[cfg(not(feature = "hub"))]
fn hub_checkpoint(repo: &str, _offline: bool) -> Result<PathBuf> {
    bail!(
        "checkpoint hub:{repo}: this build has no hub support (feature `hub`); download config.json and model.safetensors and pass their directory"
    )
}

/// A saved place in a split: the file and the row within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StreamPosition {
    pub file: usize,
    pub row: u64,
}

/// The examples of one split, file after file, resumable from a [`StreamPosition`].
pub struct ExampleStream {
    spec: &'static DatasetSpec,
    files: Vec<PathBuf>,
    rows: Option<Box<dyn Iterator<Item = Result<Record>> + Send>>,
    position: StreamPosition,
}

impl ExampleStream {
    pub fn open(spec: &'static DatasetSpec, split: Split, opts: &SourceOptions) -> Result<Self> {
        Self::open_at(
            spec,
            split_files(spec, split, opts)?,
            StreamPosition::default(),
        )
    }

    /// Opens `files` (already resolved) at `position`.
    pub fn open_at(
        spec: &'static DatasetSpec,
        files: Vec<PathBuf>,
        position: StreamPosition,
    ) -> Result<Self> {
        let mut s = Self {
            spec,
            files,
            rows: None,
            position,
        };
        s.open_current()?;
        Ok(s)
    }

    pub fn position(&self) -> StreamPosition {
        self.position
    }

    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    fn open_current(&mut self) -> Result<()> {
        self.rows = None;
        let files_per_unit = if matches!(self.spec.layout, Layout::TextPairs { .. }) {
            2
        } else {
            1
        };
        let i = self.position.file * files_per_unit;
        let Some(path) = self.files.get(i) else {
            return Ok(());
        };
        // Hub files are downloaded here, as the stream reaches them, and a few fetched ahead.
        let n = self.files.len();
        for f in &self.files[i..(i + files_per_unit).min(n)] {
            crate::shards::ensure(f)?;
        }
        let ahead_end = i + files_per_unit * (1 + crate::shards::READ_AHEAD);
        crate::shards::read_ahead(&self.files[(i + files_per_unit).min(n)..ahead_end.min(n)]);
        let row = self.position.row;
        let rows: Box<dyn Iterator<Item = Result<Record>> + Send> = match self.spec.layout {
            Layout::ParquetShards { .. } | Layout::ParquetConverted { .. } => Box::new(
                ParquetRows::open_from_row(path, &parquet_columns(self.spec, path)?, row)?,
            ),
            Layout::JsonGzShards { .. } => {
                Box::new(JsonGzRows::open(path, self.spec.columns)?.skip(row as usize))
            }
            Layout::TextPairs { source_ext, .. } => {
                // `list_dir` sorts, so `.src.cleaned` and `.tgt` are found by suffix, not order.
                let (src, tgt) = if self.files[i].to_string_lossy().ends_with(source_ext) {
                    (&self.files[i], &self.files[i + 1])
                } else {
                    (&self.files[i + 1], &self.files[i])
                };
                Box::new(TextPairRows::open(src, tgt)?.skip(row as usize))
            }
        };
        self.rows = Some(rows);
        Ok(())
    }
}

/// The columns to decode: MediaSum mirrors differ (a `document` column, or `speaker` + `utt` lists).
fn parquet_columns(spec: &DatasetSpec, path: &Path) -> Result<Vec<&'static str>> {
    let mut cols: Vec<&'static str> = spec.columns.to_vec();
    if spec.example == ExampleKind::MediaSum {
        let file = std::fs::File::open(path)?;
        let has_document = parquet::file::reader::FileReader::metadata(
            &parquet::file::serialized_reader::SerializedFileReader::new(file).map_err(|e| {
                anyhow::anyhow!("{} is not a readable parquet file ({e})", path.display())
            })?,
        )
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .any(|c| c.path().parts()[0] == "document");
        cols.extend(if has_document {
            &["document"][..]
        } else {
            &["speaker", "utt"][..]
        });
    }
    Ok(cols)
}

impl Iterator for ExampleStream {
    type Item = Result<Example>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let rows = self.rows.as_mut()?;
            match rows.next() {
                Some(Ok(record)) => {
                    self.position.row += 1;
                    return Some(Ok(Example::from_record(self.spec.example, &record)));
                }
                Some(Err(e)) => return Some(Err(e)),
                None => {
                    self.position = StreamPosition {
                        file: self.position.file + 1,
                        row: 0,
                    };
                    if let Err(e) = self.open_current() {
                        return Some(Err(e));
                    }
                }
            }
        }
    }
}
