//! Fixture files in each dataset's hub layout and schema (paths, column names and nested types as in
//! the datasets' hub repos), and a runner for the `datasets` binary.
#![allow(dead_code)]

pub mod hub_server;
pub mod walkthrough;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use arrow_array::builder::{Int32Builder, ListBuilder, StringBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, DictionaryArray, Int32Array, LargeStringArray, RecordBatch, StringArray,
    StringViewArray, StructArray,
};
use arrow_schema::{DataType, Field, Fields, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Encoding;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

pub fn utf8(v: &[&str]) -> ArrayRef {
    Arc::new(StringArray::from(v.to_vec()))
}

pub fn large_utf8(v: &[&str]) -> ArrayRef {
    Arc::new(LargeStringArray::from(v.to_vec()))
}

pub fn utf8_view(v: &[&str]) -> ArrayRef {
    Arc::new(StringViewArray::from(v.to_vec()))
}

pub fn dictionary(v: &[&str]) -> ArrayRef {
    Arc::new(v.iter().copied().collect::<DictionaryArray<Int32Type>>())
}

pub fn string_lists(rows: &[Vec<&str>]) -> ArrayRef {
    let mut b = ListBuilder::new(StringBuilder::new());
    for row in rows {
        for s in row {
            b.values().append_value(s);
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

pub fn int_lists(rows: &[Vec<i32>]) -> ArrayRef {
    let mut b = ListBuilder::new(Int32Builder::new());
    for row in rows {
        for v in row {
            b.values().append_value(*v);
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

pub fn structs(fields: Vec<(&str, ArrayRef)>) -> ArrayRef {
    let (f, a): (Vec<Field>, Vec<ArrayRef>) = fields
        .into_iter()
        .map(|(n, a)| (Field::new(n, a.data_type().clone(), true), a))
        .unzip();
    Arc::new(StructArray::new(Fields::from(f), a, None))
}

/// Which string encoding the writer uses (the reader must handle all of them).
#[derive(Clone, Copy)]
pub enum Strings {
    Dictionary,
    Plain,
    DeltaLength,
    Delta,
}

pub fn write_parquet(
    path: &Path,
    columns: Vec<(&str, ArrayRef)>,
    rows_per_group: usize,
    strings: Strings,
) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap();
    let mut props = WriterProperties::builder().set_max_row_group_row_count(Some(rows_per_group));
    let encoding = match strings {
        Strings::Dictionary => None,
        Strings::Plain => Some(Encoding::PLAIN),
        Strings::DeltaLength => Some(Encoding::DELTA_LENGTH_BYTE_ARRAY),
        Strings::Delta => Some(Encoding::DELTA_BYTE_ARRAY),
    };
    if let Some(encoding) = encoding {
        props = props.set_dictionary_enabled(false);
        // Byte-array encodings only apply to string columns.
        for f in schema.fields() {
            if matches!(
                f.data_type(),
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            ) {
                props = props.set_column_encoding(ColumnPath::from(f.name().as_str()), encoding);
            }
        }
    }
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(path).unwrap(),
        schema,
        Some(props.build()),
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

pub fn write_json_gz(path: &Path, lines: &[serde_json::Value]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(path).unwrap(),
        flate2::Compression::default(),
    );
    for l in lines {
        writeln!(gz, "{l}").unwrap();
    }
    gz.finish().unwrap();
}

pub fn write_text(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Writes, under `root`, the files of every hub dataset in its repo layout. Returns nothing: the
/// tests know what they wrote.
pub fn write_all_fixtures(root: &Path) {
    // C4: json.gz shards, two train shards and one validation shard.
    for shard in 0..2 {
        let lines: Vec<serde_json::Value> = (0..3)
            .map(|i| serde_json::json!({"text": format!("c4 doc {shard}-{i}"), "timestamp": "2019-04-25T12:57:54Z", "url": format!("https://example.com/{shard}/{i}")}))
            .collect();
        write_json_gz(
            &root.join(format!("c4/en/c4-train.{shard:05}-of-01024.json.gz")),
            &lines,
        );
    }
    write_json_gz(
        &root.join("c4/en/c4-validation.00000-of-00008.json.gz"),
        &[
            serde_json::json!({"text": "c4 validation doc", "timestamp": "2019-04-25T12:57:54Z", "url": "https://example.com/v"}),
        ],
    );

    // Wiki-40B: markers in the text; delta-length encoded strings.
    write_parquet(
        &root.join("wiki40b/en/train-00000-of-00019.parquet"),
        vec![
            ("wikidata_id", utf8(&["Q1", "Q2"])),
            (
                "text",
                utf8(&[
                    "\n_START_ARTICLE_\nAda Lovelace\n_START_SECTION_\nLife\n_START_PARAGRAPH_\nBorn 1815._NEWLINE_Died 1852.\n",
                    "\n_START_ARTICLE_\nCharles Babbage\n_START_PARAGRAPH_\nMathematician.\n",
                ]),
            ),
            ("version_id", utf8(&["1", "2"])),
        ],
        1,
        Strings::DeltaLength,
    );

    // PG-19 mirror: hashed shard names, int32 publication_date, large strings, delta encoding.
    write_parquet(
        &root.join("pg19/data/train-00000-of-00023-3f2a1b.parquet"),
        vec![
            (
                "short_book_title",
                large_utf8(&["The Book A", "The Book B"]),
            ),
            (
                "publication_date",
                Arc::new(Int32Array::from(vec![1899, 1901])),
            ),
            (
                "url",
                large_utf8(&[
                    "http://www.gutenberg.org/ebooks/1",
                    "http://www.gutenberg.org/ebooks/2",
                ]),
            ),
            (
                "text",
                large_utf8(&[
                    "Chapter I. It was a dark night.",
                    "Chapter I. Morning came.",
                ]),
            ),
        ],
        1,
        Strings::Delta,
    );

    // TriviaQA rc: nested structs of lists.
    write_parquet(
        &root.join("trivia_qa/rc/validation-00000-of-00001.parquet"),
        vec![
            ("question", utf8(&["Which city hosted the 1900 Olympics?"])),
            ("question_id", utf8(&["tc_1"])),
            ("question_source", utf8(&["http://www.quiz.com/"])),
            (
                "entity_pages",
                structs(vec![
                    ("doc_source", string_lists(&[vec!["TagMe"]])),
                    ("filename", string_lists(&[vec!["Paris.txt"]])),
                    ("title", string_lists(&[vec!["Paris"]])),
                    (
                        "wiki_context",
                        string_lists(&[vec!["Paris hosted the 1900 Summer Olympics."]]),
                    ),
                ]),
            ),
            (
                "search_results",
                structs(vec![
                    ("description", string_lists(&[vec!["Olympics history"]])),
                    ("filename", string_lists(&[vec!["web/1.txt"]])),
                    ("rank", int_lists(&[vec![0]])),
                    ("title", string_lists(&[vec!["1900 Games"]])),
                    ("url", string_lists(&[vec!["http://olympics.example/1900"]])),
                    (
                        "search_context",
                        string_lists(&[vec!["The 1900 Games were held in Paris, France."]]),
                    ),
                ]),
            ),
            (
                "answer",
                structs(vec![
                    // The value is not the first alias: the target must come from the value.
                    ("aliases", string_lists(&[vec!["Paree", "Paris"]])),
                    (
                        "normalized_aliases",
                        string_lists(&[vec!["paree", "paris"]]),
                    ),
                    ("matched_wiki_entity_name", utf8(&["Paris"])),
                    ("normalized_matched_wiki_entity_name", utf8(&["paris"])),
                    ("normalized_value", utf8(&["paris"])),
                    ("type", utf8(&["WikipediaEntity"])),
                    ("value", utf8(&["Paris"])),
                ]),
            ),
        ],
        16,
        Strings::Dictionary,
    );

    // CNN/DailyMail: string views.
    write_parquet(
        &root.join("cnn_dailymail/3.0.0/test-00000-of-00001.parquet"),
        vec![
            (
                "article",
                utf8_view(&["(CNN) A long article about a storm."]),
            ),
            ("highlights", utf8_view(&["A storm came."])),
            (
                "id",
                utf8_view(&["0001d1afc246a7964130f43ae940af6bc6c57f01"]),
            ),
        ],
        16,
        Strings::Plain,
    );

    // arXiv and PubMed: dictionary-typed abstract column.
    for name in ["arxiv", "pubmed"] {
        write_parquet(
            &root.join(format!("{name}/section/validation-00000-of-00001.parquet")),
            vec![
                (
                    "article",
                    utf8(&[
                        &format!("{name} article one"),
                        &format!("{name} article two"),
                    ]),
                ),
                (
                    "abstract",
                    dictionary(&[
                        &format!("{name} abstract one"),
                        &format!("{name} abstract two"),
                    ]),
                ),
            ],
            16,
            Strings::Dictionary,
        );
    }

    // MediaSum (nbroad, refs/convert/parquet): transcript as speaker/utt lists.
    write_parquet(
        &root.join("mediasum/mediasum/test/0000.parquet"),
        vec![
            ("id", utf8(&["NPR-1"])),
            ("program", utf8(&["Morning Edition"])),
            ("date", utf8(&["2005-01-01"])),
            ("url", utf8(&["https://www.npr.org/1"])),
            ("title", utf8(&["Interview"])),
            ("summary", utf8(&["A host interviews a guest."])),
            (
                "utt",
                string_lists(&[vec!["Welcome to the show.", "Thank you."]]),
            ),
            ("speaker", string_lists(&[vec!["HOST", "GUEST"]])),
        ],
        16,
        Strings::Dictionary,
    );

    // Multi-News: plain-text pairs.
    write_text(
        &root.join("multi_news/data/val.src.cleaned"),
        "First story NEWLINE_CHAR second line ||||| Second story |||||\nOnly story\n",
    );
    write_text(
        &root.join("multi_news/data/val.tgt"),
        "– Two stories.\n– One story.\n",
    );

    // WMT14 de-en: struct{de, en}.
    write_parquet(
        &root.join("wmt14_de_en/de-en/validation-00000-of-00001.parquet"),
        vec![(
            "translation",
            structs(vec![
                ("de", utf8(&["Guten Morgen.", "Danke."])),
                ("en", utf8(&["Good morning.", "Thank you."])),
            ]),
        )],
        16,
        Strings::Dictionary,
    );
}

/// Runs the `datasets` binary; returns (exit code, stdout, stderr).
pub fn datasets(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_datasets"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run datasets");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `datasets peek` as parsed JSON lines; panics with stderr on failure.
pub fn peek(name: &str, split: &str, data_dir: &Path) -> Vec<serde_json::Value> {
    let (code, out, err) = datasets(
        &[
            "peek",
            name,
            "--split",
            split,
            "--n",
            "10",
            "--data-dir",
            data_dir.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "peek {name} failed: {err}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `shards` train files of wmt14's `de-en` in the hub's naming, `rows` sentence pairs each
/// ("Satz R von Teil S" / "Sentence R of shard S"), and one validation file.
pub fn sharded_split(shards: usize, rows: usize) -> std::collections::BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let mut files = std::collections::BTreeMap::new();
    let mut put = |name: String, shard: usize| {
        let en: Vec<String> = (0..rows)
            .map(|r| format!("Sentence {r} of shard {shard}"))
            .collect();
        let de: Vec<String> = (0..rows)
            .map(|r| format!("Satz {r} von Teil {shard}"))
            .collect();
        let en: Vec<&str> = en.iter().map(String::as_str).collect();
        let de: Vec<&str> = de.iter().map(String::as_str).collect();
        let path = dir.path().join("f.parquet");
        write_parquet(
            &path,
            vec![(
                "translation",
                structs(vec![("de", utf8(&de)), ("en", utf8(&en))]),
            )],
            rows,
            Strings::Plain,
        );
        files.insert(name, std::fs::read(&path).unwrap());
    };
    for s in 0..shards {
        put(format!("de-en/train-{s:05}-of-{shards:05}.parquet"), s);
    }
    put("de-en/validation-00000-of-00001.parquet".into(), 999);
    files
}

/// The train shards' indices among `fetched`'s files.
pub fn shard_indices(fetched: &std::collections::BTreeMap<String, usize>) -> Vec<usize> {
    fetched
        .keys()
        .filter_map(|f| f.strip_prefix("de-en/train-"))
        .map(|f| f[..5].parse().unwrap())
        .collect()
}

/// PG-19's repo as the walkthrough fetches it: two train files and a validation file in its
/// layout (`data/{split}-NNNNN-of-MMMMM-<hash>.parquet`), one book each, its text naming the file.
pub fn pg19_repo() -> std::collections::BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    [
        "data/train-00000-of-00002-aa11.parquet",
        "data/train-00001-of-00002-bb22.parquet",
        "data/validation-00000-of-00001-cc33.parquet",
    ]
    .into_iter()
    .map(|name| {
        let path = dir.path().join("f.parquet");
        write_pg19_book(&path, &format!("A book from {name}."));
        (name.to_string(), std::fs::read(&path).unwrap())
    })
    .collect()
}

/// One PG-19 row (its mirror's columns and types) with `text`.
pub fn write_pg19_book(path: &Path, text: &str) {
    write_parquet(
        path,
        vec![
            ("short_book_title", large_utf8(&["A Book"])),
            ("publication_date", Arc::new(Int32Array::from(vec![1900]))),
            ("url", large_utf8(&["http://www.gutenberg.org/ebooks/0"])),
            ("text", large_utf8(&[text])),
        ],
        1,
        Strings::Plain,
    );
}
