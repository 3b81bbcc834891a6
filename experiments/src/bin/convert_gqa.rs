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

use anyhow::{Result, anyhow, bail};
use burn::tensor::Device;
use clap::Parser;
use model::t5::{KvConversion, convert_kv_heads};
use model::t5_hf;

/// Convert a multi-head T5 checkpoint to grouped-query (G K/V heads) or multi-query (G = 1)
/// attention by pooling the decoder's K/V projections over groups of heads (GQA paper §2.1).
#[derive(Parser)]
#[command(name = "convert_gqa", disable_version_flag = true)]
struct Args {
    /// The multi-head checkpoint: a directory with config.json and model.safetensors (Hugging Face
    /// names), or hub:OWNER/NAME[@REV] (fetched into the Hugging Face cache).
    #[arg(long, value_name = "DIR|hub:OWNER/NAME[@REV]")]
    input: String,
    /// The directory to write the converted checkpoint into (must not hold one already).
    #[arg(long, value_name = "DIR")]
    output: PathBuf,
    /// K/V heads after conversion, G (a divisor of the heads; 1 = multi-query).
    #[arg(long, value_name = "G")]
    groups: usize,
    /// How a group's heads become one: mean (the paper's), first (the group's first head) or
    /// random (a fresh initialisation).
    #[arg(long, value_enum, default_value_t = Method::Mean)]
    method: Method,
    /// Seed of the random method.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// [`KvConversion`] on the command line.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Method {
    Mean,
    First,
    Random,
}

fn run(args: Args) -> Result<()> {
    let Args {
        input,
        output,
        groups,
        method,
        seed,
    } = args;
    let method = match method {
        Method::Mean => KvConversion::Mean,
        Method::First => KvConversion::First,
        Method::Random => KvConversion::Random,
    };
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
    // `--help` exits 0, a usage error (a missing or mistyped option) 2; a failed conversion 1.
    if let Err(e) = run(Args::parse()) {
        let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
        eprintln!("error: {}", chain.join(": "));
        std::process::exit(1);
    }
}
