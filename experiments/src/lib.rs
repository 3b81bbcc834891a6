//! Shared code of the experiment binaries: command line, layered configs (a TOML file per scale,
//! `--config FILE` to replace it, `--set key=value` to override fields), output directories and
//! provenance. Each binary is a thin `main` over [`registry::main`]: every experiment implements
//! [`experiment::Experiment`], and [`registry`] names each one's family.

/// The experiment binaries allocate through mimalloc ([`model::runtime::Allocator`]); a library
/// crate sets no global allocator, so this is the binaries' crate's default feature.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: model::runtime::Allocator = model::runtime::Allocator;

mod claim;
pub mod claims;
mod cli;
pub mod configs;
pub mod dry_run;
pub mod experiment;
mod front_page;
pub mod gqa;
pub mod latency;
pub mod lm_sweep;
pub mod qa_finetune;
pub mod registry;
pub mod run_store;
pub mod scale;
pub mod verdict;

use anyhow::Result;
use serde::Serialize;

pub use cli::{Cli, ConfigPrinted, Machine, read_machine};
pub use configs::Profile;

/// The median of `xs` (sorted in place); the mean of the middle two for an even count.
pub fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// Writes `rows` as CSV with a header, atomically (rewritten after every row of a sweep, so an
/// interrupted sweep leaves a valid file of what it measured).
pub fn write_csv<T: Serialize>(path: &std::path::Path, rows: &[T]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)?;
    }
    training::write_atomic(path, &w.into_inner()?)
}

/// The rows of a CSV file written by [`write_csv`] (or any serde-shaped CSV).
pub fn read_csv<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<Vec<T>> {
    use anyhow::Context;
    csv::Reader::from_path(path)
        .with_context(|| format!("cannot read {}: run the experiment first", path.display()))?
        .deserialize()
        .collect::<Result<_, _>>()
        .with_context(|| format!("malformed {}", path.display()))
}

/// Progress of a sweep: a bar with rate and ETA on a terminal, plain lines otherwise.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: usize,
    done: usize,
    start: std::time::Instant,
}

impl Progress {
    /// A sweep of `total` items.
    pub fn new(total: usize) -> Self {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} [{elapsed} < {eta}] {msg}",
                )
                .expect("static template"),
            );
            bar
        });
        Self {
            bar,
            total,
            done: 0,
            start: std::time::Instant::now(),
        }
    }

    /// Marks one item done with a message.
    pub fn item(&mut self, msg: String) {
        self.done += 1;
        match &self.bar {
            Some(bar) => {
                bar.println(&msg);
                bar.inc(1);
            }
            None => {
                let elapsed = self.start.elapsed().as_secs_f64();
                let eta = elapsed / self.done as f64 * (self.total - self.done) as f64;
                eprintln!(
                    "[{}/{}] {msg} (elapsed {elapsed:.0} s, eta {eta:.0} s)",
                    self.done, self.total
                );
            }
        }
    }

    /// Shows what is running now (terminal only).
    pub fn running(&self, msg: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(msg);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
