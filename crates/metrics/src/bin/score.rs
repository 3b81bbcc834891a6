//! `score rouge|bleu|triviaqa --input FILE.jsonl [--stem] [--summary-prep t5|none] [--tokenize 13a|intl|none]`
//!
//! Prints one JSON object of corpus scores (×100, as the papers report them). Input lines:
//! ROUGE `{"target": .., "prediction": ..}`; BLEU `{"hypothesis": .., "references": [..]}`;
//! TriviaQA `{"prediction": .., "answers": [..]}`.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Parser;
use metrics::bleu::{self, BleuTokenizer};
use metrics::jsonl::{self, BleuLine, RougeLine, TriviaQaLine};
use metrics::rouge::{self, RougeOptions, SummaryPrep};
use metrics::triviaqa;

/// Score predictions as the GQA paper does; prints one JSON object of corpus scores (×100).
#[derive(Parser)]
#[command(name = "score", disable_version_flag = true)]
struct Args {
    /// rouge (`{"target", "prediction"}` lines), bleu (`{"hypothesis", "references": [..]}`) or
    /// triviaqa (`{"prediction", "answers": [..]}`).
    #[arg(value_enum)]
    metric: Metric,
    /// The predictions, one JSON object per line.
    #[arg(long, value_name = "FILE.jsonl")]
    input: PathBuf,
    /// ROUGE: Porter-stem tokens (rouge_score's `use_stemmer`).
    #[arg(long)]
    stem: bool,
    /// ROUGE: how summaries are split into sentences for ROUGE-Lsum (t5: T5's evaluation; none).
    #[arg(long, value_name = "PREP", default_value = "t5", value_parser = parse_prep)]
    summary_prep: SummaryPrep,
    /// BLEU: sacrebleu's tokenizer (13a, intl, none).
    #[arg(long, value_name = "TOKENIZER", default_value = "13a", value_parser = parse_tokenize)]
    tokenize: BleuTokenizer,
}

/// The metric to compute.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Metric {
    Rouge,
    Bleu,
    Triviaqa,
}

fn parse_prep(s: &str) -> Result<SummaryPrep> {
    match s {
        "t5" => Ok(SummaryPrep::T5),
        "none" => Ok(SummaryPrep::None),
        other => bail!("unknown summary prep `{other}`: choose t5 or none"),
    }
}

fn parse_tokenize(s: &str) -> Result<BleuTokenizer> {
    s.parse()
}

fn run(args: Args) -> Result<serde_json::Value> {
    Ok(match args.metric {
        Metric::Rouge => {
            let rows: Vec<RougeLine> =
                jsonl::read(&args.input, r#"{"target": "..", "prediction": ".."}"#)?;
            let options = RougeOptions {
                stem: args.stem,
                prep: args.summary_prep,
            };
            let pairs = rows
                .iter()
                .map(|r| (r.target.as_str(), r.prediction.as_str()));
            serde_json::to_value(rouge::corpus(pairs, options))?
        }
        Metric::Bleu => {
            let rows: Vec<BleuLine> =
                jsonl::read(&args.input, r#"{"hypothesis": "..", "references": [".."]}"#)?;
            if let Some(i) = rows.iter().position(|r| r.references.is_empty()) {
                bail!("{}: row {} has no references", args.input.display(), i + 1);
            }
            let segments = rows.iter().map(|r| {
                (
                    r.hypothesis.as_str(),
                    r.references.iter().map(String::as_str).collect::<Vec<_>>(),
                )
            });
            serde_json::to_value(bleu::corpus(segments, args.tokenize))?
        }
        Metric::Triviaqa => {
            let rows: Vec<TriviaQaLine> =
                jsonl::read(&args.input, r#"{"prediction": "..", "answers": [".."]}"#)?;
            let questions = rows.iter().map(|r| {
                (
                    r.prediction.as_deref(),
                    r.answers.iter().map(String::as_str).collect::<Vec<_>>(),
                )
            });
            serde_json::to_value(triviaqa::corpus(questions))?
        }
    })
}

fn main() {
    // `--help` exits 0, a usage error 2 (clap); unreadable or malformed input 1.
    match run(Args::parse()) {
        Ok(scores) => println!("{scores}"),
        Err(e) => {
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("error: {}", chain.join(": "));
            std::process::exit(1);
        }
    }
}
