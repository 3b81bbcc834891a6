//! The G1–G3 rules on synthetic results: paired differences within the margin or not, the seeds
//! and the floor a claim needs, the order of the conversions on every seed, the paper's α beside the
//! largest, and the gains from uptraining.

use super::*;

/// A score row: (model, K/V heads, conversion, α, seed, task, score).
fn row(
    (model, kv_heads, conversion, alpha): (&str, usize, &str, f64),
    seed: u64,
    task: &str,
    score: f64,
) -> ScoreRow {
    ScoreRow {
        model: model.into(),
        size: "xxl".into(),
        kv_heads,
        conversion: conversion.into(),
        alpha,
        seed,
        task: task.into(),
        metric: "rouge1".into(),
        score,
        eval_loss: 1.0,
        s_per_sample: 0.01 * kv_heads as f64,
        span_loss_converted: None,
        span_loss: None,
        examples: 64,
        finetune_step: None,
        device: "test".into(),
    }
}

fn baselines(best: f64) -> Vec<BaselineRow> {
    ["A", "B"]
        .iter()
        .map(|t| BaselineRow {
            task: (*t).into(),
            metric: "rouge1".into(),
            baseline: crate::gqa::COPY_INPUT.into(),
            score: best,
        })
        .collect()
}

/// Rows of `model` on tasks A and B: per seed, the two scores (their mean is the average).
fn model_rows(spec: (&str, usize, &str, f64), per_seed: &[(u64, [f64; 2])]) -> Vec<ScoreRow> {
    per_seed
        .iter()
        .flat_map(|&(seed, [a, b])| [row(spec, seed, "A", a), row(spec, seed, "B", b)])
        .collect()
}

const MHA: (&str, usize, &str, f64) = ("MHA", 8, "-", 0.0);
const GQA: (&str, usize, &str, f64) = ("GQA", 4, "mean", 0.05);
const MQA: (&str, usize, &str, f64) = ("MQA", 1, "mean", 0.05);

/// MHA's per-seed averages are 35, 37 and 36; `gqa` gives GQA's per-seed task scores.
fn table1(gqa: [[f64; 2]; 3]) -> Results {
    let mut rows = model_rows(
        MHA,
        &[(0, [40.0, 30.0]), (1, [42.0, 32.0]), (2, [41.0, 31.0])],
    );
    rows.extend(model_rows(GQA, &[(0, gqa[0]), (1, gqa[1]), (2, gqa[2])]));
    rows.extend(model_rows(
        MQA,
        &[(0, [30.0, 20.0]), (1, [31.0, 21.0]), (2, [30.0, 21.0])],
    ));
    Results {
        rows,
        baselines: baselines(20.0),
    }
}

/// G1 is an equivalence: the per-seed GQA − MHA differences inside ±1 point reproduce it,
/// wholly outside refute it (on either side), straddling the margin is inconclusive.
#[test]
fn g1_is_decided_by_the_paired_differences_within_the_margin() {
    // Differences −0.5, −0.5, +0.5.
    let inside = g1(&table1([[39.0, 30.0], [41.0, 32.0], [42.0, 31.0]])).unwrap();
    assert_eq!(inside.verdict, Verdict::Reproduced, "{}", inside.ours);
    // Differences −3, −3, −2: wholly below the margin.
    let below = g1(&table1([[36.0, 28.0], [38.0, 30.0], [39.0, 29.0]])).unwrap();
    assert_eq!(below.verdict, Verdict::Refuted, "{}", below.ours);
    // Differences +5, +4, +4: wholly above; "close" is refuted even when GQA is better.
    let above = g1(&table1([[45.0, 35.0], [46.0, 36.0], [45.0, 35.0]])).unwrap();
    assert_eq!(above.verdict, Verdict::Refuted);
    // Differences +0.5, −4.5, 0: straddles the margin.
    let straddles = g1(&table1([[41.0, 30.0], [37.0, 28.0], [41.0, 31.0]])).unwrap();
    assert_eq!(
        straddles.verdict,
        Verdict::Inconclusive,
        "{}",
        straddles.ours
    );
    assert!(
        inside.ours.contains("GQA − MHA -0.2 [-0.5–0.5] per seed"),
        "{}",
        inside.ours
    );
    // T_infer MHA / GQA = 0.08 / 0.04.
    assert!(
        inside.ours.contains("T_infer MHA / GQA 2.00×"),
        "{}",
        inside.ours
    );
}

/// A claim with fewer than three seeds, or whose reference model sits at the trivial
/// baselines, is inconclusive whatever the scores say.
#[test]
fn g1_needs_three_seeds_and_a_reference_above_the_floor() {
    let mut two_seeds = table1([[39.0, 30.0], [41.0, 32.0], [42.0, 31.0]]);
    two_seeds.rows.retain(|r| r.seed < 2);
    let d = g1(&two_seeds).unwrap();
    assert_eq!(d.verdict, Verdict::Inconclusive);
    assert!(d.ours.contains("2 seed(s)"), "{}", d.ours);
    let mut floor = table1([[39.0, 30.0], [41.0, 32.0], [42.0, 31.0]]);
    floor.baselines = baselines(31.0); // MHA's B scores are 30, 32 and 31
    let d = g1(&floor).unwrap();
    assert_eq!(d.verdict, Verdict::Inconclusive);
    assert!(d.ours.contains("B 30.0 ≤ 31.0"), "{}", d.ours);
}

#[test]
fn g2_needs_mean_above_first_above_random_for_every_seed() {
    let fig4 = |first: [[f64; 2]; 2]| {
        let mut rows = model_rows(
            ("mean", 1, "mean", 0.05),
            &[(0, [40.0, 30.0]), (1, [41.0, 31.0])],
        );
        rows.extend(model_rows(
            ("first", 1, "first", 0.05),
            &[(0, first[0]), (1, first[1])],
        ));
        rows.extend(model_rows(
            ("random", 1, "random", 0.05),
            &[(0, [30.0, 21.0]), (1, [31.0, 21.0])],
        ));
        g2(&Results {
            rows,
            baselines: baselines(20.0),
        })
        .unwrap()
    };
    // Per seed: mean 35, 36; random 25.5, 26.
    assert_eq!(
        fig4([[38.0, 28.0], [39.0, 29.0]]).verdict,
        Verdict::Reproduced
    );
    // first above mean on seed 1 only: the difference straddles 0.
    assert_eq!(
        fig4([[38.0, 28.0], [42.0, 32.0]]).verdict,
        Verdict::Inconclusive
    );
    // first below random on both seeds.
    assert_eq!(fig4([[20.0, 21.0], [20.0, 21.0]]).verdict, Verdict::Refuted);
}

/// G2 is decided at the paper's α = 0.05; the largest α is reported beside it with its own
/// verdict.
#[test]
fn g2_is_decided_at_the_papers_alpha_with_the_largest_beside_it() {
    // At α = 0.05 first beats mean and every model is at the floor (baselines 20): undecided.
    // At α = 0.4 mean > first > random, all above it: reproduced there, beside the verdict.
    let mut rows = Vec::new();
    for (conversion, short, long) in [
        ("mean", [5.0, 6.0], [40.0, 30.0]),
        ("first", [9.0, 10.0], [35.0, 28.0]),
        ("random", [2.0, 3.0], [30.0, 22.0]),
    ] {
        rows.extend(model_rows(
            (&format!("{conversion}-a0.05"), 1, conversion, 0.05),
            &[(0, short), (1, short)],
        ));
        rows.extend(model_rows(
            (&format!("{conversion}-a0.4"), 1, conversion, 0.4),
            &[(0, long), (1, [long[0] + 2.0, long[1]])],
        ));
    }
    let d = g2(&Results {
        rows,
        baselines: baselines(20.0),
    })
    .unwrap();
    assert_eq!(d.verdict, Verdict::Inconclusive, "{}", d.ours);
    assert!(
        d.ours.starts_with("average score at α = 0.05: mean 5.5"),
        "{}",
        d.ours
    );
    assert!(
        d.ours
            .contains("beside it, average score at α = 0.4: mean 35.5")
            && d.ours.contains("(reproduced there)")
            && d.ours.ends_with("so the scores decide nothing"),
        "{}",
        d.ours
    );
}

#[test]
fn g2_loss_needs_lower_span_loss_for_mean_than_first_than_random_on_every_seed() {
    let fig4 = |first: [f64; 2]| {
        let mut rows = Vec::new();
        for (conversion, losses) in [
            ("mean", [1.6, 1.7]),
            ("first", first),
            ("random", [5.6, 5.5]),
        ] {
            for (seed, loss) in [0, 1].into_iter().zip(losses) {
                for mut r in model_rows((conversion, 1, conversion, 0.05), &[(seed, [1.0, 1.0])]) {
                    r.span_loss = Some(loss);
                    rows.push(r);
                }
            }
        }
        g2_loss(&Results {
            rows,
            baselines: baselines(20.0),
        })
        .unwrap()
    };
    let d = fig4([1.65, 1.8]);
    assert_eq!(d.verdict, Verdict::Reproduced, "{}", d.ours);
    assert!(
        d.ours.contains("first − mean 0.075 [0.050–0.100]"),
        "{}",
        d.ours
    );
    // first below mean on seed 1: the difference straddles 0.
    assert_eq!(fig4([1.65, 1.6]).verdict, Verdict::Inconclusive);
    // first below mean on both seeds.
    assert_eq!(fig4([1.5, 1.6]).verdict, Verdict::Refuted);
    // A row without its span loss is an error, not a zero.
    let mut rows = model_rows(("mean", 1, "mean", 0.05), &[(0, [1.0, 1.0])]);
    rows.extend(model_rows(("first", 1, "first", 0.05), &[(0, [1.0, 1.0])]));
    rows.extend(model_rows(
        ("random", 1, "random", 0.05),
        &[(0, [1.0, 1.0])],
    ));
    assert!(
        g2_loss(&Results {
            rows,
            baselines: baselines(20.0)
        })
        .is_err()
    );
}

#[test]
fn g3_compares_the_gains_from_uptraining() {
    let fig5 = |gqa0: [f64; 2]| {
        let mut rows = model_rows(
            ("MQA-0", 1, "mean", 0.0),
            &[(0, [20.0, 22.0]), (1, [21.0, 23.0])],
        );
        rows.extend(model_rows(
            ("MQA-1", 1, "mean", 0.1),
            &[(0, [40.0, 30.0]), (1, [41.0, 31.0])],
        ));
        rows.extend(model_rows(
            ("GQA-0", 4, "mean", 0.0),
            &[(0, gqa0), (1, gqa0)],
        ));
        rows.extend(model_rows(
            ("GQA-1", 4, "mean", 0.1),
            &[(0, [41.0, 31.0]), (1, [41.0, 31.0])],
        ));
        g3(&Results {
            rows,
            baselines: baselines(20.0),
        })
        .unwrap()
    };
    // MQA gains 14 on both seeds; GQA from 34 to 36 gains 2.
    let d = fig5([40.0, 28.0]);
    assert_eq!(d.verdict, Verdict::Reproduced, "{}", d.ours);
    assert!(d.ours.contains("MQA's gain − GQA's 12.0"), "{}", d.ours);
    // GQA from 20 gains 16: more than MQA.
    assert_eq!(fig5([20.0, 20.0]).verdict, Verdict::Refuted);
}
