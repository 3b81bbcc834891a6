//! The scale at which a committed result was decided, computed from its resolved config and
//! provenance (`config.json`, `env.json`), never typed: the profile, parameters without the
//! token embedding, training tokens per run, seeds and the device. `claims.md` puts it on every
//! row, because a verdict at ~1M parameters and ~1M tokens says what happens at that scale,
//! not at the paper's ~100M parameters and ~30B tokens.

use std::path::Path;

use anyhow::{Context, Result};

/// What one result's runs were.
#[derive(Clone, Debug, PartialEq)]
pub struct Scale {
    /// The profile of the command that made the result (`smoke`, `cpu`, `paper`).
    pub profile: String,
    /// Parameters without the token embedding: the smallest and largest model of the result.
    pub params: (usize, usize),
    /// Training tokens each run saw (for the GQA pipeline: pre-training's).
    pub tokens_per_run: f64,
    /// Seeds per model (the claim's models).
    pub seeds: usize,
    /// The device of the command that made the result.
    pub device: String,
}

impl Scale {
    /// "cpu scale: 0.8–1.0M params, 0.66M tokens/run, 3 seeds, flex (…)".
    pub fn show(&self) -> String {
        let m = |p: usize| p as f64 / 1e6;
        let (lo, hi) = (
            format!("{:.2}", m(self.params.0)),
            format!("{:.2}", m(self.params.1)),
        );
        let params = if lo == hi {
            format!("{lo}M")
        } else {
            format!("{lo}–{hi}M")
        };
        format!(
            "{} scale: {params} params, {} tokens/run, {} seed{}, {}",
            self.profile,
            tokens(self.tokens_per_run),
            self.seeds,
            if self.seeds == 1 { "" } else { "s" },
            self.device
        )
    }
}

/// A token count as "0.66M", "33B".
fn tokens(n: f64) -> String {
    if n >= 1e9 {
        format!("{:.3}B", n / 1e9)
    } else if n >= 1e5 {
        format!("{:.2}M", n / 1e6)
    } else {
        format!("{:.0}K", n / 1e3)
    }
}

/// The device named in `dir`'s `env.json`, if it has one.
pub fn device(dir: &Path) -> Option<String> {
    let text = std::fs::read(dir.join("env.json")).ok()?;
    let env: serde_json::Value = serde_json::from_slice(&text).ok()?;
    env["device"].as_str().map(str::to_string)
}

/// The profile and device of the command that wrote `dir` (its `env.json`).
pub(crate) fn provenance(dir: &Path) -> Result<(String, String)> {
    let path = dir.join("env.json");
    let text = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let env: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("malformed {}", path.display()))?;
    let device = env["device"]
        .as_str()
        .unwrap_or("unknown device")
        .to_string();
    let command = env["command"].as_str().unwrap_or_default();
    let words: Vec<&str> = command.split_whitespace().collect();
    let profile = words
        .iter()
        .position(|w| *w == "--profile")
        .and_then(|i| words.get(i + 1))
        .or_else(|| {
            words
                .iter()
                .find_map(|w| w.strip_prefix("--profile=").map(|_| w))
        })
        .map(|p| p.trim_start_matches("--profile=").to_string())
        .unwrap_or_else(|| "cpu".into());
    Ok((profile, device))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_reads_like_a_sentence() {
        let s = Scale {
            profile: "cpu".into(),
            params: (800_000, 1_000_000),
            tokens_per_run: 655_360.0,
            seeds: 3,
            device: "flex (2 cores)".into(),
        };
        assert_eq!(
            s.show(),
            "cpu scale: 0.80–1.00M params, 0.66M tokens/run, 3 seeds, flex (2 cores)"
        );
    }
}
