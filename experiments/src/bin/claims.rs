//! `just claims`: writes `results/claims.md`, the FLASH paper's claims with the numbers and verdicts
//! computed from the committed results (`experiments/src/claims.rs`). `--results DIR` reads and
//! writes another results directory.

fn main() {
    let mut args = std::env::args().skip(1);
    let mut results = std::path::PathBuf::from("results");
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--results", Some(dir)) => results = dir.into(),
            _ => {
                eprintln!("error: unknown argument `{arg}`; usage: claims [--results DIR]");
                std::process::exit(2);
            }
        }
    }
    match experiments::claims::write(&results) {
        Ok(()) => eprintln!("wrote {}", results.join("claims.md").display()),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}
