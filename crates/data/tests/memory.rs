//! Streaming a parquet file of many row groups keeps memory flat: resident memory while reading
//! the last row groups is no higher than after the first few, whatever the file's size.
//! (Its own test binary, so no other test allocates in the process meanwhile.)

mod common;

use std::sync::Arc;

use arrow_array::{RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use data::registry::{self, Split};
use data::source::{ExampleStream, SourceOptions};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

#[test]
fn memory_stays_flat_over_many_row_groups() {
    if !std::path::Path::new("/proc/self/status").exists() {
        eprintln!("no /proc: skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data/train-00000-of-00001.parquet");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, true)]));
    let props = WriterProperties::builder()
        .set_dictionary_enabled(false)
        .build();
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        schema.clone(),
        Some(props),
    )
    .unwrap();
    let (groups, rows, row_bytes) = (400, 4, 40_000);
    for g in 0..groups {
        let texts: Vec<String> = (0..rows)
            .map(|r| format!("{g}-{r} ").repeat(row_bytes / 8))
            .collect();
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(texts))]).unwrap();
        w.write(&batch).unwrap();
        w.flush().unwrap(); // one row group per batch
    }
    w.close().unwrap();
    let file_mb = std::fs::metadata(&path).unwrap().len() as f64 / 1e6;

    let opts = SourceOptions::with_dataset_dir("pg19", dir.path());
    let stream =
        ExampleStream::open(registry::lookup("pg19").unwrap(), Split::Train, &opts).unwrap();
    let (mut bytes, mut n) = (0usize, 0usize);
    let mut after_warmup = 0;
    let mut peak = 0;
    for example in stream {
        bytes += example.unwrap().all_text().len();
        n += 1;
        if n == 20 * rows {
            after_warmup = rss_bytes();
        }
        if n > 20 * rows && n % rows == 0 {
            peak = peak.max(rss_bytes());
        }
    }
    assert_eq!(n, groups * rows);
    assert!(bytes as f64 > 40e6, "read {bytes} bytes");
    let growth = peak.saturating_sub(after_warmup) as f64 / 1e6;
    eprintln!(
        "file {file_mb:.0} MB, text {:.0} MB, RSS after 20 row groups {:.0} MB, growth to peak {growth:.1} MB",
        bytes as f64 / 1e6,
        after_warmup as f64 / 1e6
    );
    assert!(
        growth < 8.0,
        "resident memory grew by {growth:.1} MB while streaming {:.0} MB",
        bytes as f64 / 1e6
    );
}
