//! Parameter counts of the paper presets against the paper's stated sizes (±5%): ~110M for the C4
//! and Wiki-40B models, ~500M for PG-19 (FLASH §4.1, §4.3).

use burn::module::Module;
use model::{Architecture, Direction, ModelConfig};

use crate::common::*;

fn check(name: &str, preset: fn(Architecture) -> ModelConfig, target: f64) {
    let device = device();
    for arch in Architecture::ALL {
        let n = preset(arch).init(Direction::Causal, &device).num_params() as f64;
        println!(
            "{name:>11} {arch:<20} {:>8.1}M (paper: ~{:.0}M)",
            n / 1e6,
            target / 1e6
        );
        let rel = (n - target).abs() / target;
        assert!(
            rel <= 0.05,
            "{name} {arch}: {n} parameters, {:.1}% from {target}",
            rel * 100.0
        );
    }
}

#[test]
fn paper_base_presets_are_about_110m() {
    check("paper_base", ModelConfig::paper_base, 110e6);
}

#[test]
fn paper_large_presets_are_about_500m() {
    check("paper_large", ModelConfig::paper_large, 500e6);
}
