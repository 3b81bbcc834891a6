//! Typed examples, built from a [`Record`] as each dataset's [`ExampleKind`] says, and printed by
//! `datasets peek` as the JSON the experiments read.

use serde::{Deserialize, Serialize};

use crate::read::Record;
use crate::registry::{ExampleKind, TextMarkup};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Example {
    /// Language modelling.
    Text { text: String },
    /// Summarization and translation.
    Seq2Seq { source: String, target: String },
    /// Question answering; `answers` keeps every alias for scoring.
    Qa {
        question: String,
        context: String,
        answers: Vec<String>,
    },
}

impl Example {
    pub fn from_record(kind: ExampleKind, r: &Record) -> Example {
        match kind {
            ExampleKind::Text { column, markup } => {
                let raw = r.text(column);
                Example::Text {
                    text: match markup {
                        TextMarkup::None => raw,
                        TextMarkup::Wiki40b => wiki40b_plain_text(&raw),
                    },
                }
            }
            ExampleKind::Seq2Seq { source, target } => Example::Seq2Seq {
                source: r.text(source),
                target: r.text(target),
            },
            ExampleKind::TriviaQa => {
                // The rc config's evidence: the Wikipedia pages, then the web search results.
                let mut context = r.strings("entity_pages.wiki_context");
                context.extend(r.strings("search_results.search_context"));
                // The target first, as T5 builds it (the normalized value), then every other
                // normalized alias, all kept for scoring.
                let value = r.text("answer.normalized_value");
                let mut answers: Vec<String> = Vec::new();
                if !value.is_empty() {
                    answers.push(value);
                }
                for alias in r.strings("answer.normalized_aliases") {
                    if !answers.contains(&alias) {
                        answers.push(alias);
                    }
                }
                Example::Qa {
                    question: r.text("question"),
                    context: context.join("\n"),
                    answers,
                }
            }
            ExampleKind::Qa {
                question,
                context,
                answers,
            } => Example::Qa {
                question: r.text(question),
                context: r.text(context),
                answers: r.strings(answers),
            },
            ExampleKind::MediaSum => {
                let document = r.text("document");
                let source = if !document.is_empty() {
                    document
                } else {
                    let speakers = r.strings("speaker");
                    let utts = r.strings("utt");
                    speakers
                        .iter()
                        .zip(&utts)
                        .map(|(s, u)| format!("{s}: {u}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                Example::Seq2Seq {
                    source,
                    target: r.text("summary"),
                }
            }
            ExampleKind::MultiNews => Example::Seq2Seq {
                source: multi_news_documents(&r.text("document")),
                target: multi_news_summary(&r.text("summary")),
            },
        }
    }

    /// The text a tokenizer or LM task consumes (source and target joined for seq2seq, etc.).
    pub fn all_text(&self) -> String {
        match self {
            Example::Text { text } => text.clone(),
            Example::Seq2Seq { source, target } => format!("{source}\n{target}"),
            Example::Qa {
                question, context, ..
            } => format!("{question}\n{context}"),
        }
    }
}

/// Wiki-40B markup to plain text: articles, sections and paragraphs become blank-line separated
/// blocks; `_NEWLINE_` inside a paragraph becomes a newline.
pub fn wiki40b_plain_text(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for block in raw.split('\n') {
        let block = block.trim();
        if block.is_empty() {
            continue;
        }
        let text = match block {
            "_START_ARTICLE_" | "_START_SECTION_" | "_START_PARAGRAPH_" => continue,
            b => b.replace("_NEWLINE_", "\n"),
        };
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(&text);
    }
    out
}

/// Multi-News source: documents separated by `|||||`, newlines escaped as `NEWLINE_CHAR`.
pub fn multi_news_documents(raw: &str) -> String {
    raw.split("|||||")
        .map(|d| d.replace("NEWLINE_CHAR", "\n").trim().to_string())
        .filter(|d| !d.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Multi-News target: the leading "– " of every summary is dropped.
pub fn multi_news_summary(raw: &str) -> String {
    raw.trim()
        .trim_start_matches('–')
        .trim()
        .replace("NEWLINE_CHAR", "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wiki40b_markup() {
        let raw = "\n_START_ARTICLE_\nHanna\n_START_SECTION_\nLife\n_START_PARAGRAPH_\nBorn in 1900._NEWLINE_Died in 1990.\n";
        assert_eq!(
            wiki40b_plain_text(raw),
            "Hanna\n\nLife\n\nBorn in 1900.\nDied in 1990."
        );
    }

    #[test]
    fn multi_news_format() {
        assert_eq!(
            multi_news_documents("a NEWLINE_CHAR b ||||| c |||||"),
            "a \n b\n\nc"
        );
        assert_eq!(multi_news_summary("– The summary."), "The summary.");
    }
}
