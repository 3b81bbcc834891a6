//! Streaming readers. Each yields [`Record`]s (the requested columns of one row as JSON values) and
//! never holds more than one parquet row group, one decompressed json.gz line or one text line pair
//! in memory, whatever the file's size. Errors name the file, and the column when one is missing.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use serde_json::{Map, Value};

/// One row: the requested dotted column paths and their values (strings, lists, numbers; null when
/// the row has none).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub fields: Vec<(String, Value)>,
}

impl Record {
    pub fn get(&self, path: &str) -> &Value {
        self.fields
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, v)| v)
            .unwrap_or(&Value::Null)
    }

    /// A string column; lists of strings are joined by newlines.
    pub fn text(&self, path: &str) -> String {
        value_text(self.get(path))
    }

    /// A list-of-strings column (a single string gives a one-element list).
    pub fn strings(&self, path: &str) -> Vec<String> {
        let mut out = Vec::new();
        collect_strings(self.get(path), &mut out);
        out
    }
}

fn collect_strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|i| collect_strings(i, out)),
        _ => {}
    }
}

fn value_text(v: &Value) -> String {
    let mut parts = Vec::new();
    collect_strings(v, &mut parts);
    parts.join("\n")
}

/// Rows per decoded batch: small enough that a batch of long documents stays a few MB.
const BATCH_ROWS: usize = 64;

/// Streams the `columns` (dotted paths, e.g. `translation.de`, `answer.normalized_aliases`) of a
/// parquet file, row group by row group, decoding only the leaves those paths name.
pub struct ParquetRows {
    path: PathBuf,
    columns: Vec<String>,
    reader: ParquetRecordBatchReader,
    batch: Option<RecordBatch>,
    row: usize,
}

impl ParquetRows {
    pub fn open(path: &Path, columns: &[&str]) -> Result<Self> {
        Self::open_from_row(path, columns, 0)
    }

    /// Opens positioned at row `start`: whole row groups are skipped by their metadata, only the
    /// rest of the first one is decoded and dropped.
    pub fn open_from_row(path: &Path, columns: &[&str], start: u64) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| {
            anyhow!(
                "{} is not a readable parquet file ({e}); delete it and fetch it again",
                path.display()
            )
        })?;
        let schema = builder.parquet_schema();
        let mut leaves = Vec::new();
        for want in columns {
            let found: Vec<usize> = (0..schema.num_columns())
                .filter(|&i| path_matches(&logical_path(schema.column(i).path().parts()), want))
                .collect();
            if found.is_empty() {
                let have: Vec<String> = (0..schema.num_columns())
                    .map(|i| logical_path(schema.column(i).path().parts()))
                    .collect();
                bail!(
                    "{} has no column `{want}` (it has: {})",
                    path.display(),
                    have.join(", ")
                );
            }
            leaves.extend(found);
        }
        let mask = ProjectionMask::leaves(schema, leaves);
        let mut skip = start;
        let mut groups = Vec::new();
        for (i, rg) in builder.metadata().row_groups().iter().enumerate() {
            let n = rg.num_rows() as u64;
            if skip >= n && groups.is_empty() {
                skip -= n;
            } else {
                groups.push(i);
            }
        }
        let reader = builder
            .with_projection(mask)
            .with_row_groups(groups)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let mut rows = Self {
            path: path.to_path_buf(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            reader,
            batch: None,
            row: 0,
        };
        for _ in 0..skip {
            if rows.next().transpose()?.is_none() {
                break;
            }
        }
        Ok(rows)
    }

    fn record(&self, batch: &RecordBatch, row: usize) -> Result<Record> {
        let mut fields = Vec::with_capacity(self.columns.len());
        for col in &self.columns {
            let mut parts = col.split('.');
            let root = parts.next().unwrap_or_default();
            let array = batch
                .column_by_name(root)
                .ok_or_else(|| anyhow!("{} has no column `{col}`", self.path.display()))?;
            let mut v = to_json(array.as_ref(), row)
                .with_context(|| format!("{}: column `{col}`", self.path.display()))?;
            for key in parts {
                v = select(v, key);
            }
            fields.push((col.clone(), v));
        }
        Ok(Record { fields })
    }
}

impl Iterator for ParquetRows {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(batch) = &self.batch
                && self.row < batch.num_rows()
            {
                let r = self.record(batch, self.row);
                self.row += 1;
                return Some(r);
            }
            match self.reader.next()? {
                Ok(batch) => {
                    self.batch = Some(batch);
                    self.row = 0;
                }
                Err(e) => {
                    return Some(Err(anyhow!(
                        "{} is corrupt or truncated ({e}); delete it and fetch it again",
                        self.path.display()
                    )));
                }
            }
        }
    }
}

/// A parquet leaf path without the list wrappers (`answer.aliases.list.element` → `answer.aliases`).
fn logical_path(parts: &[String]) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < parts.len() {
        let p = parts[i].as_str();
        if (p == "list" || p == "bag")
            && matches!(
                parts.get(i + 1).map(String::as_str),
                Some("element" | "item" | "array")
            )
        {
            i += 2;
            continue;
        }
        out.push(p);
        i += 1;
    }
    out.join(".")
}

fn path_matches(leaf: &str, want: &str) -> bool {
    leaf == want
        || leaf
            .strip_prefix(want)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// Struct field access that maps over lists (a list of structs gives a list of the field).
fn select(v: Value, key: &str) -> Value {
    match v {
        Value::Object(mut m) => m.remove(key).unwrap_or(Value::Null),
        Value::Array(items) => Value::Array(items.into_iter().map(|i| select(i, key)).collect()),
        _ => Value::Null,
    }
}

/// [`select`] by reference: clones only the value found, not the whole object.
fn lookup(v: &Value, path: &[&str]) -> Value {
    match (v, path.split_first()) {
        (_, None) => v.clone(),
        (Value::Object(m), Some((key, rest))) => {
            m.get(*key).map_or(Value::Null, |x| lookup(x, rest))
        }
        (Value::Array(items), Some(_)) => {
            Value::Array(items.iter().map(|i| lookup(i, path)).collect())
        }
        _ => Value::Null,
    }
}

/// One cell of an arrow array as JSON: every string encoding (Utf8, LargeUtf8, Utf8View and
/// dictionary-encoded strings), integers, floats, booleans, lists and structs.
fn to_json(array: &dyn Array, i: usize) -> Result<Value> {
    if array.is_null(i) {
        return Ok(Value::Null);
    }
    Ok(match array.data_type() {
        DataType::Utf8 => Value::String(array.as_string::<i32>().value(i).to_owned()),
        DataType::LargeUtf8 => Value::String(array.as_string::<i64>().value(i).to_owned()),
        DataType::Utf8View => Value::String(array.as_string_view().value(i).to_owned()),
        DataType::Binary => {
            Value::String(String::from_utf8_lossy(array.as_binary::<i32>().value(i)).into_owned())
        }
        DataType::LargeBinary => {
            Value::String(String::from_utf8_lossy(array.as_binary::<i64>().value(i)).into_owned())
        }
        DataType::Boolean => Value::Bool(array.as_boolean().value(i)),
        DataType::Int8 => array.as_primitive::<Int8Type>().value(i).into(),
        DataType::Int16 => array.as_primitive::<Int16Type>().value(i).into(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(i).into(),
        DataType::Int64 => array.as_primitive::<Int64Type>().value(i).into(),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().value(i).into(),
        DataType::UInt16 => array.as_primitive::<UInt16Type>().value(i).into(),
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(i).into(),
        DataType::UInt64 => array.as_primitive::<UInt64Type>().value(i).into(),
        DataType::Float32 => array
            .as_primitive::<arrow_array::types::Float32Type>()
            .value(i)
            .into(),
        DataType::Float64 => array
            .as_primitive::<arrow_array::types::Float64Type>()
            .value(i)
            .into(),
        DataType::List(_) => list_json(array.as_list::<i32>().value(i).as_ref())?,
        DataType::LargeList(_) => list_json(array.as_list::<i64>().value(i).as_ref())?,
        DataType::Struct(_) => {
            let s = array.as_struct();
            let mut m = Map::new();
            for (name, col) in s.column_names().iter().zip(s.columns()) {
                m.insert(name.to_string(), to_json(col.as_ref(), i)?);
            }
            Value::Object(m)
        }
        DataType::Dictionary(_, _) => {
            let d = array.as_any_dictionary();
            let key = d.normalized_keys()[i];
            to_json(d.values().as_ref(), key)?
        }
        other => bail!("unsupported column type {other}"),
    })
}

fn list_json(values: &dyn Array) -> Result<Value> {
    (0..values.len())
        .map(|j| to_json(values, j))
        .collect::<Result<Vec<_>>>()
        .map(Value::Array)
}

/// Streams JSON lines from a gzip file (C4's layout), keeping the `columns` of each object.
pub struct JsonGzRows {
    path: PathBuf,
    columns: Vec<String>,
    lines: std::io::Lines<BufReader<flate2::read::MultiGzDecoder<File>>>,
    line: usize,
}

impl JsonGzRows {
    pub fn open(path: &Path, columns: &[&str]) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            lines: BufReader::with_capacity(1 << 16, flate2::read::MultiGzDecoder::new(file))
                .lines(),
            line: 0,
        })
    }
}

impl Iterator for JsonGzRows {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Self::Item> {
        let line = match self.lines.next()? {
            Ok(l) => l,
            Err(e) => {
                return Some(Err(anyhow!(
                    "{} is corrupt or truncated after line {} ({e}); delete it and fetch it again",
                    self.path.display(),
                    self.line
                )));
            }
        };
        self.line += 1;
        let obj: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                return Some(Err(anyhow!(
                    "{} line {}: not JSON ({e})",
                    self.path.display(),
                    self.line
                )));
            }
        };
        let mut fields = Vec::new();
        for col in &self.columns {
            let path: Vec<&str> = col.split('.').collect();
            let v = lookup(&obj, &path);
            if v.is_null() && obj.get(col.split('.').next().unwrap_or_default()).is_none() {
                return Some(Err(anyhow!(
                    "{} line {}: no field `{col}`",
                    self.path.display(),
                    self.line
                )));
            }
            fields.push((col.clone(), v));
        }
        Some(Ok(Record { fields }))
    }
}

/// Streams aligned line pairs from two text files (Multi-News): fields `document` and `summary`.
pub struct TextPairRows {
    source_path: PathBuf,
    target_path: PathBuf,
    source: std::io::Lines<BufReader<File>>,
    target: std::io::Lines<BufReader<File>>,
    line: usize,
}

impl TextPairRows {
    pub fn open(source: &Path, target: &Path) -> Result<Self> {
        let open = |p: &Path| -> Result<_> {
            Ok(BufReader::with_capacity(
                1 << 16,
                File::open(p).with_context(|| format!("cannot open {}", p.display()))?,
            )
            .lines())
        };
        Ok(Self {
            source_path: source.to_path_buf(),
            target_path: target.to_path_buf(),
            source: open(source)?,
            target: open(target)?,
            line: 0,
        })
    }
}

impl Iterator for TextPairRows {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Self::Item> {
        self.line += 1;
        match (self.source.next(), self.target.next()) {
            (None, None) => None,
            (Some(Ok(s)), Some(Ok(t))) => Some(Ok(Record {
                fields: vec![
                    ("document".into(), Value::String(s)),
                    ("summary".into(), Value::String(t)),
                ],
            })),
            (Some(Err(e)), _) => Some(Err(anyhow!(
                "{} line {}: {e}",
                self.source_path.display(),
                self.line
            ))),
            (_, Some(Err(e))) => Some(Err(anyhow!(
                "{} line {}: {e}",
                self.target_path.display(),
                self.line
            ))),
            _ => Some(Err(anyhow!(
                "{} and {} have different line counts (they differ at line {}); the pair is incomplete",
                self.source_path.display(),
                self.target_path.display(),
                self.line
            ))),
        }
    }
}
