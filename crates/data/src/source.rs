//! Finding and streaming a split. Files come from, in this order: `--data-dir DIR` (files placed by
//! hand in the repo's layout), the local corpus directory (offline datasets), or the Hugging Face
//! hub cache — downloading when allowed (feature `hub`). The stream of examples has a position
//! (file, row) that can be saved and reopened exactly.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::example::Example;
use crate::read::{JsonGzRows, ParquetRows, Record, TextPairRows};
use crate::registry::{DatasetSpec, ExampleKind, Layout, Origin, Split};

/// Where to look for files, as the command-line flags set it.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// `--data-dir`: a directory laid out like the hub repo (or, for local datasets, like the corpus).
    pub data_dir: Option<PathBuf>,
    /// `--offline`: never touch the network; use the cache or `data_dir` only.
    pub offline: bool,
    /// Where `just data` writes the offline corpus (default `data/`, or `$REPRO_DATA`).
    pub local_root: PathBuf,
}

impl SourceOptions {
    /// The defaults with a config's `data_dir` (empty: none).
    pub fn with_data_dir(data_dir: &str) -> Self {
        Self {
            data_dir: (!data_dir.is_empty()).then(|| PathBuf::from(data_dir)),
            ..Self::default()
        }
    }
}

impl Default for SourceOptions {
    fn default() -> Self {
        Self {
            data_dir: None,
            offline: false,
            local_root: std::env::var_os("REPRO_DATA")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("data")),
        }
    }
}

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

/// The files of `split`, in the order they are read.
pub fn split_files(spec: &DatasetSpec, split: Split, opts: &SourceOptions) -> Result<Vec<PathBuf>> {
    let local = match (&opts.data_dir, spec.origin) {
        (Some(dir), _) => Some(dir.clone()),
        (None, Origin::Local { dir }) => Some(opts.local_root.join(dir)),
        (None, Origin::Hub { .. }) => None,
    };
    if let Some(root) = local {
        let found: Vec<PathBuf> = if root.is_dir() {
            list_dir(&root)?
                .into_iter()
                .filter(|p| spec.matches(p, split))
                .map(|p| root.join(p))
                .collect()
        } else {
            Vec::new()
        };
        if found.is_empty() {
            let expected = root.join(spec.expected_files(split));
            match spec.origin {
                Origin::Local { .. } if opts.data_dir.is_none() => bail!(
                    "dataset `{}` split {split}: no file {}; build the offline corpus with `just data`",
                    spec.name,
                    expected.display()
                ),
                _ => bail!(
                    "dataset `{}` split {split}: no file {} under --data-dir {}; place the repo's files there in its layout",
                    spec.name,
                    spec.expected_files(split),
                    root.display()
                ),
            }
        }
        return check_pairs(spec, split, found);
    }
    hub_files(spec, split, opts).and_then(|f| check_pairs(spec, split, f))
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
