//! Reader throughput: generates a C4-like parquet file of at least 100 MB (snappy-compressed, row groups of
//! 20k documents; random English-like words so it does not compress away), then
//! streams it through the same `ExampleStream` the experiments use and reports MB/s.
//!
//! `cargo bench -p data --bench read_throughput [-- --mb 200]`

use std::sync::Arc;
use std::time::Instant;

use arrow_array::{RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use data::registry::{self, Split};
use data::rng::SplitMix64;
use data::source::{ExampleStream, SourceOptions};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "time",
    "people",
    "water",
    "government",
    "language",
    "transformer",
    "attention",
    "quality",
    "linear",
    "reproduction",
    "dataset",
    "evening",
    "mountain",
    "history",
    "science",
    "question",
    "answer",
];

fn main() {
    let mut target_mb = 110.0;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--mb") {
        target_mb = args[i + 1].parse().expect("--mb takes a number");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("en/train-00000-of-00001.parquet");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("text", DataType::Utf8, false),
        Field::new("timestamp", DataType::Utf8, false),
        Field::new("url", DataType::Utf8, false),
    ]));
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let mut writer = ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        schema.clone(),
        Some(props),
    )
    .unwrap();
    let mut rng = SplitMix64::new(0);
    let start = Instant::now();
    let mut docs = 0usize;
    while ((writer.bytes_written() + writer.in_progress_size()) as f64) < target_mb * 1e6 {
        let texts: Vec<String> = (0..1000)
            .map(|_| {
                let n = 100 + rng.below(900) as usize;
                (0..n)
                    .map(|_| WORDS[rng.below(WORDS.len() as u64) as usize])
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let stamps = vec!["2019-04-25T12:57:54Z"; texts.len()];
        let urls: Vec<String> = (0..texts.len())
            .map(|i| format!("https://example.com/{}", docs + i))
            .collect();
        docs += texts.len();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(texts)),
                Arc::new(StringArray::from(stamps)),
                Arc::new(StringArray::from(urls)),
            ],
        )
        .unwrap();
        writer.write(&batch).unwrap();
        if docs.is_multiple_of(20_000) {
            writer.flush().unwrap(); // row groups of 20k documents (~55 MB of text)
        }
    }
    writer.close().unwrap();
    let file_bytes = std::fs::metadata(&path).unwrap().len() as f64;
    eprintln!(
        "generated {:.0} MB ({docs} documents) in {:.1} s",
        file_bytes / 1e6,
        start.elapsed().as_secs_f64()
    );

    // Read through the wiki40b entry (parquet shards under `en/`, column `text`) from its own folder.
    let opts = SourceOptions::with_dataset_dir("wiki40b", dir.path());
    for round in 0..2 {
        let start = Instant::now();
        let (mut n, mut text_bytes) = (0usize, 0usize);
        for example in
            ExampleStream::open(registry::lookup("wiki40b").unwrap(), Split::Train, &opts).unwrap()
        {
            text_bytes += example.unwrap().all_text().len();
            n += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(n, docs);
        println!(
            "round {round}: {n} documents, file {:.0} MB, text {:.0} MB in {secs:.2} s: {:.0} MB/s of file, {:.0} MB/s of text",
            file_bytes / 1e6,
            text_bytes as f64 / 1e6,
            file_bytes / 1e6 / secs,
            text_bytes as f64 / 1e6 / secs
        );
    }
}
