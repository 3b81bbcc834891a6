//! Converts a multi-head T5 checkpoint to grouped-query or multi-query attention (GQA paper §2.1):
//! the decoder's self- and cross-attention K and V projections are pooled over contiguous groups
//! of heads; Q, O and everything else are copied.
//!
//! `convert_gqa --input DIR|hub:OWNER/NAME[@REV] --output DIR --groups G [--method mean|first|random] [--seed N]`
//!
//! The input holds `config.json` and `model.safetensors` (or its shards) with Hugging Face names: a
//! checkpoint saved by our experiments, a downloaded directory, or a hub repo such as
//! `hub:google/t5-v1_1-small`, fetched into the Hugging Face cache. The output has the same layout,
//! its config recording `num_key_value_heads` = G.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use burn::tensor::Device;
use model::t5::{KvConversion, convert_kv_heads};
use model::t5_hf;

const USAGE: &str = "usage: convert_gqa --input DIR|hub:OWNER/NAME[@REV] --output DIR --groups G [--method mean|first|random] [--seed N]";

fn run(mut args: impl Iterator<Item = String>) -> Result<()> {
    let (mut input, mut output, mut groups) = (None, None, None);
    let mut method = KvConversion::Mean;
    let mut seed = 0u64;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .with_context(|| format!("{name} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--input" => input = Some(value("--input")?),
            "--output" => output = Some(PathBuf::from(value("--output")?)),
            "--groups" => {
                let v = value("--groups")?;
                groups = Some(
                    v.parse::<usize>()
                        .with_context(|| format!("--groups expects a number, got `{v}`"))?,
                );
            }
            "--method" => {
                method = match value("--method")?.as_str() {
                    "mean" => KvConversion::Mean,
                    "first" => KvConversion::First,
                    "random" => KvConversion::Random,
                    other => bail!("unknown --method `{other}`: choose mean, first or random"),
                }
            }
            "--seed" => {
                let v = value("--seed")?;
                seed = v
                    .parse()
                    .with_context(|| format!("--seed expects a number, got `{v}`"))?;
            }
            "-h" | "--help" => bail!("{USAGE}"),
            other => bail!("unknown option `{other}`; {USAGE}"),
        }
    }
    let input = input.with_context(|| format!("--input is required; {USAGE}"))?;
    let output = output.with_context(|| format!("--output is required; {USAGE}"))?;
    let groups = groups.with_context(|| format!("--groups is required; {USAGE}"))?;
    if output.join("model.safetensors").exists() {
        bail!(
            "{} already holds a model.safetensors; choose another --output or delete it",
            output.display()
        );
    }
    let device = Device::flex();
    device.seed(seed);
    let input = data::source::checkpoint_dir(&input, false)?;
    let (config, model) = t5_hf::load(&input, &device).map_err(|e| anyhow!(e))?;
    let converted = convert_kv_heads(model, groups, method).map_err(|e| anyhow!(e))?;
    let config = config.with_n_kv_heads(groups);
    t5_hf::save(&converted, &config, &output).map_err(|e| anyhow!(e))?;
    println!(
        "{}: {} query heads, {} K/V heads ({:?} pooling) → {}",
        input.display(),
        config.n_heads,
        groups,
        method,
        output.display()
    );
    Ok(())
}

fn main() {
    if let Err(e) = run(std::env::args().skip(1)) {
        let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
        eprintln!("error: {}", chain.join(": "));
        std::process::exit(1);
    }
}
