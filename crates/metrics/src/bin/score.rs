//! `score rouge|bleu|triviaqa --input FILE.jsonl [--stem] [--summary-prep t5|none] [--tokenize 13a|intl|none]`
//!
//! Prints one JSON object of corpus scores (×100, as the papers report them). Input lines:
//! ROUGE `{"target": .., "prediction": ..}`; BLEU `{"hypothesis": .., "references": [..]}`;
//! TriviaQA `{"prediction": .., "answers": [..]}`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use metrics::bleu::{self, BleuTokenizer};
use metrics::jsonl::{self, BleuLine, RougeLine, TriviaQaLine};
use metrics::rouge::{self, RougeOptions, SummaryPrep};
use metrics::triviaqa;

const USAGE: &str = "usage: score rouge|bleu|triviaqa --input FILE.jsonl [--stem] \
[--summary-prep t5|none] [--tokenize 13a|intl|none]";

/// The parsed command line.
struct Args {
    metric: String,
    input: PathBuf,
    stem: bool,
    prep: SummaryPrep,
    tokenize: BleuTokenizer,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args> {
    let metric = args.next().with_context(|| USAGE.to_string())?;
    let mut input = None;
    let mut stem = false;
    let mut prep = SummaryPrep::default();
    let mut tokenize = BleuTokenizer::default();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .with_context(|| format!("{name} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--input" => input = Some(PathBuf::from(value("--input")?)),
            "--stem" => stem = true,
            "--summary-prep" => {
                prep = match value("--summary-prep")?.as_str() {
                    "t5" => SummaryPrep::T5,
                    "none" => SummaryPrep::None,
                    other => bail!("unknown --summary-prep `{other}`: choose t5 or none"),
                }
            }
            "--tokenize" => tokenize = value("--tokenize")?.parse()?,
            "-h" | "--help" => bail!("{USAGE}"),
            other => bail!("unknown option `{other}`; {USAGE}"),
        }
    }
    let input = input.with_context(|| format!("--input FILE.jsonl is required; {USAGE}"))?;
    Ok(Args {
        metric,
        input,
        stem,
        prep,
        tokenize,
    })
}

fn run(args: Args) -> Result<serde_json::Value> {
    Ok(match args.metric.as_str() {
        "rouge" => {
            let rows: Vec<RougeLine> =
                jsonl::read(&args.input, r#"{"target": "..", "prediction": ".."}"#)?;
            let options = RougeOptions {
                stem: args.stem,
                prep: args.prep,
            };
            let pairs = rows
                .iter()
                .map(|r| (r.target.as_str(), r.prediction.as_str()));
            serde_json::to_value(rouge::corpus(pairs, options))?
        }
        "bleu" => {
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
        "triviaqa" => {
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
        other => bail!("unknown metric `{other}`: choose rouge, bleu or triviaqa"),
    })
}

fn main() {
    match parse(std::env::args().skip(1)).and_then(run) {
        Ok(scores) => println!("{scores}"),
        Err(e) => {
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("error: {}", chain.join(": "));
            std::process::exit(2);
        }
    }
}
