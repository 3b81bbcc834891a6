//! `just claims`: writes `results/claims.md`, the FLASH and GQA papers' claims with the numbers and verdicts
//! computed from the committed results (`experiments/src/claims/`), draws `results/claims.png` and
//! fills the top README's generated blocks (the claims at a glance, each experiment's cpu cost).

use clap::Parser;

/// Writes <results>/claims.md: the papers' claims (FLASH F1-F10, GQA G1) with our numbers and verdicts,
/// computed from the committed CSVs, with results/claims.png and the README's glance and cost blocks.
#[derive(Parser)]
#[command(name = "claims", disable_version_flag = true)]
struct Args {
    /// The results directory to read and write.
    #[arg(long, value_name = "DIR", default_value = "results")]
    results: std::path::PathBuf,
}

fn main() {
    let args = Args::parse();
    match experiments::claims::write(&args.results) {
        Ok(()) => eprintln!("wrote {}", args.results.join("claims.md").display()),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}
