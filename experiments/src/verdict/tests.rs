//! The verdict rules, each shown to return all three outcomes, and the summaries they read.

use super::*;
use training::trainer::MetricsRow;

fn row(model: &str, seed: u64, step: usize, hours: f64, ppl: f64) -> SweepRow {
    SweepRow {
        model: model.into(),
        context: 512,
        seed,
        run: String::new(),
        peak_lr: None,
        metrics: MetricsRow {
            step,
            tokens: 0,
            device_hours: hours,
            flops: 0.0,
            train_loss: 0.0,
            eval_loss: ppl.ln(),
            eval_ppl: ppl,
            tokens_per_s: 0.0,
            lr: 0.0,
            select_loss: None,
        },
    }
}

#[test]
fn speedup_range_is_over_seed_pairs_and_decomposes() {
    // Baseline seeds end at 10 and 12 after 4 steps of 1 h; the model's step takes 0.5 h and
    // its two seeds reach 10 at step 2 and 12 at step 2 (from 30 at step 1).
    let mut rows = vec![];
    for (seed, end) in [(0, 10.0), (1, 12.0)] {
        rows.extend([1, 2, 3, 4].map(|s| {
            row(
                "base",
                seed,
                s,
                s as f64,
                30.0 - (30.0 - end) * s as f64 / 4.0,
            )
        }));
    }
    for (seed, at2) in [(0, 10.0), (1, 11.0)] {
        rows.extend([1, 2, 3, 4].map(|s| {
            row(
                "m",
                seed,
                s,
                0.5 * s as f64,
                if s == 1 { 30.0 } else { at2 },
            )
        }));
    }
    let s = &summarize(
        &rows,
        &["base".into(), "m".into()],
        "base",
        512,
        StepCost::RunHours,
    )[1];
    assert_eq!(
        s.reached,
        (3, 4),
        "model seed 1 (11) never reaches baseline seed 0's 10"
    );
    // Pairs (b0, m0): target 10 reached at step 2 → 4 / 1 h = 4×; (b0, m1): never (0);
    // (b1, m0): target 12 crossed at step 1 + 18/20 → 4 / 0.95 h; (b1, m1): 1 + 18/19.
    assert_eq!(s.speedup.min, 0.0);
    assert!((s.speedup.max - 4.0 / 0.95).abs() < 1e-9, "{:?}", s.speedup);
    assert!((s.step_time_ratio.mean - 2.0).abs() < 1e-12);
    assert_eq!(Verdict::above(&s.speedup, 1.0), Verdict::Inconclusive);
    // The baseline against its other seeds (never a run against itself): the noise floor.
    // (b0 → b1's 12: crossed at 3 + 3/5 h → 4 / 3.6); (b1 → b0's 10): never.
    let base = &summarize(&rows, &["base".into()], "base", 512, StepCost::RunHours)[0];
    assert_eq!(base.reached, (1, 2));
    assert!(
        (base.speedup.max - 4.0 / 3.6).abs() < 1e-9,
        "{:?}",
        base.speedup
    );
    assert_eq!(base.final_ppl.min, 10.0);
}

#[test]
fn timed_step_costs_replace_the_runs_hours() {
    // The model learns twice as fast per step (reaches the baseline's final 10 at step 2 of
    // 4), and its runs' hours are deliberately wrong (10 h per step, as if trained on a slow
    // day); the calibration times its step at half the baseline's in one round and equal in
    // another.
    let mut rows = vec![];
    rows.extend([1, 2, 3, 4].map(|s| row("base", 0, s, s as f64, 30.0 - 5.0 * s as f64)));
    rows.extend([1, 2, 3, 4].map(|s| {
        row(
            "m",
            0,
            s,
            10.0 * s as f64,
            (30.0 - 10.0 * s as f64).max(8.0),
        )
    }));
    let t = |model: &str, round, seconds| StepTime {
        model: model.into(),
        context: 512,
        round,
        seconds,
        config: String::new(),
    };
    let times = [
        t("base", 0, 2.0),
        t("m", 0, 1.0),
        t("base", 1, 3.0),
        t("m", 1, 3.0),
    ];
    let models = ["base".to_string(), "m".to_string()];
    let s = &summarize(&rows, &models, "base", 512, StepCost::Timed(&times))[1];
    // Round ratios 2 and 1: median 1.5, quartiles 1.25 and 1.75.
    assert_eq!(s.steps_ratio.mean, 2.0);
    let t = s.step_time_ratio;
    assert_eq!((t.min, t.mean, t.max), (1.25, 1.5, 1.75));
    assert_eq!(
        (s.speedup.min, s.speedup.mean, s.speedup.max),
        (2.5, 3.0, 3.5)
    );
    assert_eq!(s.timed_seconds, Some(2.0));
    // From the runs' hours instead: 4 h / 20 h.
    let h = &summarize(&rows, &models, "base", 512, StepCost::RunHours)[1];
    assert!((h.speedup.mean - 0.2).abs() < 1e-12, "{:?}", h.speedup);
    assert_eq!(h.timed_seconds, None);
    // A model without timings falls back to its runs' hours.
    let partial = &summarize(&rows, &models, "base", 512, StepCost::Timed(&times[..1]))[1];
    assert_eq!(partial.timed_seconds, None);
}

#[test]
fn a_row_reads_back_from_its_csv_exactly() {
    let mut r = row("flash", 3, 40, 1.0 / 3.0, 123.456_789_012_345);
    r.run = "flash-512-00ab".into();
    r.metrics.lr = 0.01;
    r.metrics.flops = 0.0;
    let text = format!("{}\n{}\n", SweepRow::header(), r.csv_fields());
    let back: Vec<SweepRow> = csv::Reader::from_reader(text.as_bytes())
        .deserialize()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(back, vec![r]);
}

#[test]
fn quartiles_interpolate_between_order_statistics() {
    // numpy.percentile([4, 1, 3, 2, 5], [25, 50, 75]) = [2, 3, 4];
    // numpy.percentile([1, 2, 3, 10], [25, 50, 75]) = [1.75, 2.5, 4.75].
    let q = Spread::quartiles(&[4.0, 1.0, 3.0, 2.0, 5.0]);
    assert_eq!((q.min, q.mean, q.max), (2.0, 3.0, 4.0));
    let q = Spread::quartiles(&[1.0, 2.0, 3.0, 10.0]);
    assert_eq!((q.min, q.mean, q.max), (1.75, 2.5, 4.75));
    assert_eq!(Spread::quartiles(&[7.0]).min, 7.0);
}

/// F8 ("every change hurts") gives each of its three outcomes: reproduced only when every
/// ablation is clearly worse, inconclusive when one straddles the default, refuted when one is
/// clearly better.
#[test]
fn the_default_layer_loses_f8_only_to_a_clearly_better_ablation() {
    let end = |m: &str, seed, ppl| row(m, seed, 10, 1.0, ppl);
    let mut rows = vec![
        end("gau", 0, 100.0),
        end("gau", 1, 104.0),
        // Clearly worse: 110–115 / 100–104.
        end("softmax", 0, 110.0),
        end("softmax", 1, 115.0),
        // Within the spread: 99–105.
        end("heads2", 0, 99.0),
        end("heads2", 1, 105.0),
    ];
    let table = ablation_rows(&rows, "gau", 512, Pairing::AllPairs);
    assert_eq!(table.len(), 2);
    assert_eq!(table[0].model, "softmax");
    assert!((table[0].ratio.min - 110.0 / 104.0).abs() < 1e-12);
    assert_eq!(table[0].verdict(), Verdict::Reproduced);
    assert_eq!(table[1].verdict(), Verdict::Inconclusive);
    assert_eq!(table[1].seeds, (2, 2));
    assert_eq!(every_change_hurts(&table[..1]), Some(Verdict::Reproduced));
    assert_eq!(every_change_hurts(&table), Some(Verdict::Inconclusive));
    assert_eq!(ablation_counts(&table), (1, 1, 0));
    // Paired by seed, heads2 is 0.99 and 1.0096 of the default: still inconclusive.
    let paired = ablation_rows(&rows, "gau", 512, Pairing::BySeed);
    assert!((paired[1].ratio.min - 0.99).abs() < 1e-12);
    assert!((paired[1].ratio.max - 105.0 / 104.0).abs() < 1e-12);
    // An ablation below the default's whole range refutes it.
    rows.extend([end("no_gate", 0, 90.0), end("no_gate", 1, 95.0)]);
    let table = ablation_rows(&rows, "gau", 512, Pairing::AllPairs);
    assert_eq!(table[2].verdict(), Verdict::Refuted);
    assert_eq!(every_change_hurts(&table), Some(Verdict::Refuted));
    assert_eq!(ablation_counts(&table), (1, 1, 1));
    assert_eq!(every_change_hurts(&[]), None);
}

/// Pairing by seed takes each seed's ratio: here seed 0 and seed 1 each favour `a` by 5%,
/// while across seeds the runs overlap (the unpaired range straddles 1).
#[test]
fn paired_ratios_are_per_seed() {
    let end = |m: &str, seed, ppl| row(m, seed, 10, 1.0, ppl);
    let rows = vec![
        end("a", 0, 95.0),
        end("a", 1, 114.0),
        end("b", 0, 100.0),
        end("b", 1, 120.0),
    ];
    let paired = ppl_ratio(&rows, "a", "b", 512, Pairing::BySeed).unwrap();
    assert!((paired.min - 0.95).abs() < 1e-12 && (paired.max - 0.95).abs() < 1e-12);
    assert_eq!(Verdict::below(&paired, 1.0), Verdict::Reproduced);
    let unpaired = ppl_ratio(&rows, "a", "b", 512, Pairing::AllPairs).unwrap();
    assert_eq!(Verdict::below(&unpaired, 1.0), Verdict::Inconclusive);
    // No seed in common: no paired ratio.
    assert!(ppl_ratio(&rows[1..2], "a", "b", 512, Pairing::BySeed).is_none());
}

#[test]
fn chunking_loss_compares_the_two_ratios_over_every_seed() {
    let mut rows = vec![];
    // Final perplexities: FLASH-Quad 100 / 110, FLASH 105 / 105 (GAU loses 0.95–1.05×),
    // Transformer++ 100 / 100, MC-TFM++ 120 / 132 (the Transformer loses 1.2–1.32×).
    for (model, finals) in [
        ("flash_quad", [100.0, 110.0]),
        ("flash", [105.0, 105.0]),
        ("transformer_plusplus", [100.0, 100.0]),
        ("mc_tfmpp", [120.0, 132.0]),
    ] {
        for (seed, end) in finals.into_iter().enumerate() {
            rows.push(row(model, seed as u64, 1, 1.0, 500.0));
            rows.push(row(model, seed as u64, 2, 2.0, end));
        }
    }
    let c = chunking_loss(&rows, 512, Pairing::AllPairs).unwrap();
    assert!((c.gau.min - 105.0 / 110.0).abs() < 1e-12 && c.gau.max == 1.05);
    assert!((c.transformer.mean - 1.26).abs() < 1e-12);
    assert!(c.transformer_relu2.is_none());
    // Worst case for the claim: 1.2 / 1.05; best: 1.32 / (105 / 110).
    assert!((c.ratio.min - 1.2 / 1.05).abs() < 1e-12, "{:?}", c.ratio);
    assert!((c.ratio.max - 1.32 * 110.0 / 105.0).abs() < 1e-12);
    assert_eq!(Verdict::above(&c.ratio, 1.0), Verdict::Reproduced);
    assert!(chunking_loss(&rows, 1024, Pairing::AllPairs).is_none());
    // Paired by seed: seed 0 (1.2 / 1.05), seed 1 (1.32 / (105 / 110)).
    let p = chunking_loss(&rows, 512, Pairing::BySeed).unwrap();
    assert!((p.ratio.min - 1.2 / 1.05).abs() < 1e-12);
    assert!((p.ratio.max - 1.32 * 110.0 / 105.0).abs() < 1e-12);
}

#[test]
fn verdicts_need_the_whole_range() {
    let r = |min, max| Spread {
        mean: 0.0,
        min,
        max,
    };
    assert_eq!(Verdict::above(&r(1.1, 3.0), 1.0), Verdict::Reproduced);
    assert_eq!(Verdict::above(&r(0.0, 0.9), 1.0), Verdict::Refuted);
    assert_eq!(Verdict::above(&r(0.8, 1.2), 1.0), Verdict::Inconclusive);
    assert_eq!(Verdict::below(&r(0.5, 0.9), 1.0), Verdict::Reproduced);
    assert_eq!(Verdict::below(&r(1.1, 1.5), 1.0), Verdict::Refuted);
    assert_eq!(Verdict::below(&r(0.9, 1.1), 1.0), Verdict::Inconclusive);
}

/// The equivalence rule's three outcomes: inside the margin, wholly outside it (on either
/// side), and straddling its edge.
#[test]
fn equivalence_needs_the_whole_range_inside_the_margin() {
    let r = |min, max| Spread {
        mean: 0.0,
        min,
        max,
    };
    assert_eq!(
        Verdict::within(&r(-0.5, 0.8), -1.0, 1.0),
        Verdict::Reproduced
    );
    assert_eq!(Verdict::within(&r(-4.9, -1.2), -1.0, 1.0), Verdict::Refuted);
    assert_eq!(Verdict::within(&r(1.5, 2.0), -1.0, 1.0), Verdict::Refuted);
    // G1's committed 2-seed differences: +0.45 and −4.92.
    assert_eq!(
        Verdict::within(&r(-4.92, 0.45), -1.0, 1.0),
        Verdict::Inconclusive
    );
}

#[test]
fn last_quarter_improvement_is_relative_to_the_three_quarter_loss() {
    let rows: Vec<SweepRow> = (1..=8)
        .map(|s| row("m", 0, s * 10, 0.0, (10.0 - s as f64 * 0.5).exp()))
        .collect();
    let run = &runs(&rows, "m", 512)[0];
    // Step 60 of 80 is the first at 3/4: loss 7.0, final 6.0.
    assert!((run.last_quarter_improvement() - 1.0 / 7.0).abs() < 1e-12);
}
