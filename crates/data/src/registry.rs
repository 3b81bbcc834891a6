//! The datasets both papers use, and the offline corpus. Each entry says where the files live on the
//! Hugging Face hub, how a split's files are found in a listing of the repo (never hard-coded shard
//! names: counts and hashed names change), which columns are read and how an example is built.
//! Sources: each repo's dataset card and file listing on the hub.

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

/// A split as experiments name it; each dataset maps it to its own file names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Validation,
    Test,
}

impl Split {
    pub const ALL: [Split; 3] = [Split::Train, Split::Validation, Split::Test];

    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
            Split::Test => "test",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Split {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "train" => Ok(Split::Train),
            "validation" | "val" | "dev" => Ok(Split::Validation),
            "test" => Ok(Split::Test),
            _ => bail!("unknown split `{s}`; known: train, validation, test"),
        }
    }
}

/// How a split's files are named inside the repo (matched against the repo's file listing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Main-branch parquet: `<dir>/<split>-NNNNN-of-MMMMM[-hash].parquet`.
    ParquetShards { dir: &'static str },
    /// The hub's auto-converted branch: `<dir>/<split>/NNNN.parquet` or `<dir>/partial-<split>/NNNN.parquet`.
    ParquetConverted { dir: &'static str },
    /// JSON lines, gzipped: `<prefix><split>.NNNNN-of-MMMMM.json.gz` (C4).
    JsonGzShards { prefix: &'static str },
    /// One example a line in two aligned files: `<dir>/<split><source_ext>` and `<dir>/<split><target_ext>`.
    TextPairs {
        dir: &'static str,
        source_ext: &'static str,
        target_ext: &'static str,
    },
}

/// How one row becomes an [`crate::Example`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExampleKind {
    /// `{"text"}` from one string column.
    Text {
        column: &'static str,
        markup: TextMarkup,
    },
    /// `{"source", "target"}` from two string columns (dotted paths reach into structs).
    Seq2Seq {
        source: &'static str,
        target: &'static str,
    },
    /// `{"question", "context", "answers"}` from TriviaQA's nested columns.
    TriviaQa,
    /// `{"question", "context", "answers"}` from three flat columns (the offline QA task).
    Qa {
        question: &'static str,
        context: &'static str,
        answers: &'static str,
    },
    /// MediaSum: `document` when the mirror has it, otherwise the transcript from `speaker` + `utt`.
    MediaSum,
    /// Multi-News plain-text pairs: documents split by `|||||`, newlines written as `NEWLINE_CHAR`.
    MultiNews,
}

/// Markup inside a text column that is turned into plain text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextMarkup {
    None,
    /// Wiki-40B's `_START_ARTICLE_`, `_START_SECTION_`, `_START_PARAGRAPH_`, `_NEWLINE_` markers.
    Wiki40b,
}

/// Where the files come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A Hugging Face dataset repo at a revision.
    Hub {
        repo: &'static str,
        revision: &'static str,
    },
    /// Built on this machine by `just data` (the offline corpus), under `<data dir>/<dir>`.
    Local { dir: &'static str },
}

/// One dataset: everything needed to find, read and interpret it.
#[derive(Debug, Clone, Copy)]
pub struct DatasetSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub origin: Origin,
    /// Hub config (the subdirectory of the repo); informational for local datasets.
    pub config: &'static str,
    pub layout: Layout,
    /// The file name each of train/validation/test uses in this repo.
    pub split_names: [&'static str; 3],
    /// Columns read (dotted paths into structs); nothing else is decoded.
    pub columns: &'static [&'static str],
    pub example: ExampleKind,
    /// Input/output lengths of the GQA paper's fine-tuning (seq2seq and QA tasks), else `None`.
    pub lengths: Option<(usize, usize)>,
}

impl DatasetSpec {
    pub fn split_name(&self, split: Split) -> &'static str {
        self.split_names[split as usize]
    }

    pub fn repo(&self) -> Option<&'static str> {
        match self.origin {
            Origin::Hub { repo, .. } => Some(repo),
            Origin::Local { .. } => None,
        }
    }

    /// Does `path` (relative to the repo root, `/`-separated) belong to `split`?
    pub fn matches(&self, path: &str, split: Split) -> bool {
        let s = self.split_name(split);
        match self.layout {
            Layout::ParquetShards { dir } => path
                .strip_prefix(dir)
                .and_then(|p| p.strip_prefix('/'))
                .and_then(|p| p.strip_prefix(s))
                .is_some_and(|rest| {
                    rest.starts_with('-') && rest.ends_with(".parquet") && !rest.contains('/')
                }),
            Layout::ParquetConverted { dir } => path
                .strip_prefix(dir)
                .and_then(|p| p.strip_prefix('/'))
                .and_then(|p| {
                    p.strip_prefix(s)
                        .or_else(|| p.strip_prefix("partial-").and_then(|p| p.strip_prefix(s)))
                })
                .and_then(|p| p.strip_prefix('/'))
                .is_some_and(|rest| rest.ends_with(".parquet") && !rest.contains('/')),
            Layout::JsonGzShards { prefix } => path
                .strip_prefix(prefix)
                .and_then(|p| p.strip_prefix(s))
                .is_some_and(|rest| {
                    rest.starts_with('.') && rest.ends_with(".json.gz") && !rest.contains('/')
                }),
            Layout::TextPairs {
                dir,
                source_ext,
                target_ext,
            } => {
                path == format!("{dir}/{s}{source_ext}") || path == format!("{dir}/{s}{target_ext}")
            }
        }
    }

    /// A human description of the files a split needs, for error messages.
    /// The dataset's folder under a `--data-dir` root: its name for a hub dataset; for the offline
    /// corpus and its tasks the folder `just data` writes (`gutenberg_shakespeare`, shared by all four).
    pub fn folder(&self) -> &'static str {
        match self.origin {
            Origin::Hub { .. } => self.name,
            Origin::Local { dir } => dir,
        }
    }

    pub fn expected_files(&self, split: Split) -> String {
        let s = self.split_name(split);
        match self.layout {
            Layout::ParquetShards { dir } => format!("{dir}/{s}-NNNNN-of-MMMMM.parquet"),
            Layout::ParquetConverted { dir } => format!("{dir}/{s}/NNNN.parquet"),
            Layout::JsonGzShards { prefix } => format!("{prefix}{s}.NNNNN-of-MMMMM.json.gz"),
            Layout::TextPairs {
                dir,
                source_ext,
                target_ext,
            } => {
                format!("{dir}/{s}{source_ext} and {dir}/{s}{target_ext}")
            }
        }
    }
}

const SPLITS: [&str; 3] = ["train", "validation", "test"];

/// Every dataset, in the order `datasets list` prints them.
pub const DATASETS: &[DatasetSpec] = &[
    DatasetSpec {
        name: "c4",
        description: "C4 English (FLASH masked-LM pre-training)",
        origin: Origin::Hub {
            repo: "allenai/c4",
            revision: "main",
        },
        config: "en",
        layout: Layout::JsonGzShards { prefix: "en/c4-" },
        split_names: SPLITS,
        columns: &["text"],
        example: ExampleKind::Text {
            column: "text",
            markup: TextMarkup::None,
        },
        lengths: None,
    },
    DatasetSpec {
        name: "wiki40b",
        description: "Wiki-40B English (FLASH causal LM)",
        origin: Origin::Hub {
            repo: "google/wiki40b",
            revision: "main",
        },
        config: "en",
        layout: Layout::ParquetShards { dir: "en" },
        split_names: SPLITS,
        columns: &["text"],
        example: ExampleKind::Text {
            column: "text",
            markup: TextMarkup::Wiki40b,
        },
        lengths: None,
    },
    DatasetSpec {
        name: "pg19",
        description: "PG-19 books, parquet mirror of deepmind/pg19 (FLASH causal LM, Table 3)",
        origin: Origin::Hub {
            repo: "emozilla/pg19",
            revision: "main",
        },
        config: "default",
        layout: Layout::ParquetShards { dir: "data" },
        split_names: SPLITS,
        columns: &["text"],
        example: ExampleKind::Text {
            column: "text",
            markup: TextMarkup::None,
        },
        lengths: None,
    },
    DatasetSpec {
        name: "trivia_qa",
        description: "TriviaQA rc (GQA Table 1, F1)",
        origin: Origin::Hub {
            repo: "mandarjoshi/trivia_qa",
            revision: "main",
        },
        config: "rc",
        layout: Layout::ParquetShards { dir: "rc" },
        split_names: SPLITS,
        columns: &[
            "question",
            "entity_pages.wiki_context",
            "search_results.search_context",
            "answer.normalized_aliases",
            "answer.normalized_value",
        ],
        example: ExampleKind::TriviaQa,
        lengths: Some((2048, 32)),
    },
    DatasetSpec {
        name: "cnn_dailymail",
        description: "CNN/DailyMail 3.0.0 (GQA Table 1, ROUGE-1)",
        origin: Origin::Hub {
            repo: "abisee/cnn_dailymail",
            revision: "main",
        },
        config: "3.0.0",
        layout: Layout::ParquetShards { dir: "3.0.0" },
        split_names: SPLITS,
        columns: &["article", "highlights"],
        example: ExampleKind::Seq2Seq {
            source: "article",
            target: "highlights",
        },
        lengths: Some((512, 256)),
    },
    DatasetSpec {
        name: "arxiv",
        description: "arXiv summarization, section config (GQA Table 1, ROUGE-1)",
        origin: Origin::Hub {
            repo: "ccdv/arxiv-summarization",
            revision: "main",
        },
        config: "section",
        layout: Layout::ParquetShards { dir: "section" },
        split_names: SPLITS,
        columns: &["article", "abstract"],
        example: ExampleKind::Seq2Seq {
            source: "article",
            target: "abstract",
        },
        lengths: Some((2048, 512)),
    },
    DatasetSpec {
        name: "pubmed",
        description: "PubMed summarization, section config (GQA Table 1, ROUGE-1)",
        origin: Origin::Hub {
            repo: "ccdv/pubmed-summarization",
            revision: "main",
        },
        config: "section",
        layout: Layout::ParquetShards { dir: "section" },
        split_names: SPLITS,
        columns: &["article", "abstract"],
        example: ExampleKind::Seq2Seq {
            source: "article",
            target: "abstract",
        },
        lengths: Some((2048, 512)),
    },
    DatasetSpec {
        name: "mediasum",
        description: "MediaSum interview summarization, nbroad's parquet conversion (GQA Table 1, ROUGE-1)",
        origin: Origin::Hub {
            repo: "nbroad/mediasum",
            revision: "refs/convert/parquet",
        },
        config: "mediasum",
        layout: Layout::ParquetConverted { dir: "mediasum" },
        split_names: SPLITS,
        columns: &["summary"],
        example: ExampleKind::MediaSum,
        lengths: Some((2048, 512)),
    },
    DatasetSpec {
        name: "multi_news",
        description: "Multi-News multi-document summarization (GQA Table 1, ROUGE-1)",
        origin: Origin::Hub {
            repo: "alexfabbri/multi_news",
            revision: "main",
        },
        config: "default",
        layout: Layout::TextPairs {
            dir: "data",
            source_ext: ".src.cleaned",
            target_ext: ".tgt",
        },
        split_names: ["train", "val", "test"],
        columns: &["document", "summary"],
        example: ExampleKind::MultiNews,
        lengths: Some((2048, 512)),
    },
    DatasetSpec {
        name: "wmt14_de_en",
        description: "WMT14 English→German (GQA Table 1, BLEU); source = en, target = de",
        origin: Origin::Hub {
            repo: "wmt/wmt14",
            revision: "main",
        },
        config: "de-en",
        layout: Layout::ParquetShards { dir: "de-en" },
        split_names: SPLITS,
        columns: &["translation.en", "translation.de"],
        example: ExampleKind::Seq2Seq {
            source: "translation.en",
            target: "translation.de",
        },
        lengths: Some((512, 256)),
    },
    DatasetSpec {
        name: "gutenberg_shakespeare",
        description: "Offline corpus: Project Gutenberg Shakespeare, both editions, PG-19 schema (`just data`)",
        origin: Origin::Local {
            dir: "gutenberg_shakespeare",
        },
        config: "default",
        layout: Layout::ParquetShards { dir: "data" },
        split_names: SPLITS,
        columns: &["text"],
        example: ExampleKind::Text {
            column: "text",
            markup: TextMarkup::None,
        },
        lengths: None,
    },
    DatasetSpec {
        name: "shakespeare_modernize",
        description: "Offline translation-like task: First Folio spelling → modern edition, aligned passages (BLEU)",
        origin: Origin::Local {
            dir: "gutenberg_shakespeare",
        },
        config: "modernize",
        layout: Layout::ParquetShards { dir: "modernize" },
        split_names: SPLITS,
        columns: &["source", "target"],
        example: ExampleKind::Seq2Seq {
            source: "source",
            target: "target",
        },
        lengths: Some((128, 128)),
    },
    DatasetSpec {
        name: "shakespeare_cues",
        description: "Offline summarization-like task: a scene passage → each speaker's opening line (ROUGE)",
        origin: Origin::Local {
            dir: "gutenberg_shakespeare",
        },
        config: "cues",
        layout: Layout::ParquetShards { dir: "cues" },
        split_names: SPLITS,
        columns: &["source", "target"],
        example: ExampleKind::Seq2Seq {
            source: "source",
            target: "target",
        },
        lengths: Some((512, 128)),
    },
    DatasetSpec {
        name: "shakespeare_speaker_qa",
        description: "Offline extractive QA: who speaks a quoted line in a passage (F1/EM)",
        origin: Origin::Local {
            dir: "gutenberg_shakespeare",
        },
        config: "speaker_qa",
        layout: Layout::ParquetShards { dir: "speaker_qa" },
        split_names: SPLITS,
        columns: &["question", "context", "answers"],
        example: ExampleKind::Qa {
            question: "question",
            context: "context",
            answers: "answers",
        },
        lengths: Some((512, 16)),
    },
];

/// Looks a dataset up by name; the error lists the known names.
pub fn lookup(name: &str) -> Result<&'static DatasetSpec> {
    match DATASETS.iter().find(|d| d.name == name) {
        Some(d) => Ok(d),
        None => {
            let known: Vec<&str> = DATASETS.iter().map(|d| d.name).collect();
            bail!("unknown dataset `{name}`; known: {}", known.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_matches_hub_layouts() {
        let c4 = lookup("c4").unwrap();
        assert!(c4.matches("en/c4-train.00000-of-01024.json.gz", Split::Train));
        assert!(!c4.matches("en/c4-validation.00000-of-00008.json.gz", Split::Train));
        assert!(!c4.matches(
            "en.noblocklist/c4-train.00000-of-01024.json.gz",
            Split::Train
        ));
        let pg = lookup("pg19").unwrap();
        assert!(pg.matches("data/train-00000-of-00023-a1b2c3.parquet", Split::Train));
        assert!(!pg.matches("data/validation-00000-of-00001.parquet", Split::Train));
        let ms = lookup("mediasum").unwrap();
        assert!(ms.matches("mediasum/train/0003.parquet", Split::Train));
        assert!(ms.matches("mediasum/partial-train/0000.parquet", Split::Train));
        assert!(!ms.matches("mediasum/test/0000.parquet", Split::Train));
        let mn = lookup("multi_news").unwrap();
        assert!(mn.matches("data/val.src.cleaned", Split::Validation));
        assert!(mn.matches("data/val.tgt", Split::Validation));
        assert!(!mn.matches("data/train.tgt", Split::Validation));
        assert!(lookup("c5").unwrap_err().to_string().contains("known: c4"));
    }
}
