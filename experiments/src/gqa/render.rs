//! The pipeline's report: `table.md` (scores per model and task, mean and range over seeds, beside
//! the trivial baselines, with the G1–G3 verdicts) and its charts.

use std::path::Path;

use anyhow::Result;
use report::{LineChart, Scale, Series};
use training::write_atomic;

use super::scores::{
    BASELINE_TRAIN_EXAMPLES, BaselineRow, COPY_INPUT, MOST_FREQUENT, ScoreRow, average_scores,
    read_scores,
};
use crate::verdict::Spread;

/// Writes `table.md` (Table 1's layout: time per sample, average, one column per task),
/// `score_vs_time.png/svg` (Figure 3: average score against time per sample) and
/// `loss_vs_time.png/svg` (the fine-tuned held-out loss against time per sample: the finer measure
/// when the scores are at their floor, as at cpu scale) from `scores.csv`; the tables also fill the
/// `table.md` block of the artifact's README, if it has one.
pub fn render(out: &Path) -> Result<()> {
    let rows = read_scores(out)?;
    let mut tasks: Vec<String> = Vec::new();
    let mut models: Vec<String> = Vec::new();
    for r in &rows {
        if !tasks.contains(&r.task) {
            tasks.push(r.task.clone());
        }
        if !models.contains(&r.model) {
            models.push(r.model.clone());
        }
    }
    let mut md = String::from(
        "# GQA uptraining on this machine\n\nGenerated from `scores.csv`. T_infer: seconds per sample of \
         greedy decoding (encoder included; every sample decodes the task's full output length), \
         mean over the tasks; speedup: the multi-head model of \
         the same size's T_infer over this one's; avg: mean of the task scores; loss: mean over the \
         tasks of the fine-tuned model's held-out token cross-entropy (teacher forced), the finer \
         measure of quality when scores are small; span α=0 / span: held-out span-corruption loss \
         right after conversion / of the model fine-tuning starts from (after uptraining); ft step: \
         the fine-tuning step of the scored model (the evaluation with the lowest held-out loss \
         under `keep = \"best_eval\"`), its range over tasks and seeds. With \
         several seeds (each converts, uptrains and fine-tunes again from the same pre-trained \
         model), a cell is the mean over the seeds with their range in brackets.\n\n",
    );
    // The tables (not the explanation above them) also go into the README's generated block.
    let tables_start = md.len();
    md += &format!(
        "| model | K/V heads | conversion | α | seeds | span α=0 | span | ft step | T_infer (s) | speedup | avg | loss | {} |\n|{}\n",
        tasks.join(" | "),
        "---|".repeat(12 + tasks.len())
    );
    let (mut points, mut loss_points) = (Vec::new(), Vec::new());
    for m in &models {
        let row = model_row(m, &rows, &tasks);
        md += &row.line;
        points.push(Series {
            name: m.clone(),
            points: vec![(row.t_infer, row.avg)],
        });
        loss_points.push(Series {
            name: m.clone(),
            points: vec![(row.t_infer, row.loss)],
        });
    }
    md += &baselines_table(out, &tasks)?;
    let device = rows.first().map(|r| r.device.clone()).unwrap_or_default();
    charts(out, &device, &points, &loss_points)?;
    write_atomic(&out.join("table.md"), md.as_bytes())?;
    report::readme::fill(&out.join("README.md"), "table.md", &md[tables_start..])?;
    Ok(())
}

/// One model's line of the table, with the time, average score and loss its chart points use.
struct ModelLine {
    line: String,
    t_infer: f64,
    avg: f64,
    loss: f64,
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Seconds per sample of `rows`, mean over tasks and seeds.
fn t_infer(rows: &[&ScoreRow]) -> f64 {
    mean(&rows.iter().map(|r| r.s_per_sample).collect::<Vec<_>>())
}

/// Model `m`'s line: its K/V heads, conversion, α, seeds, span losses, fine-tuning steps, time,
/// speedup over the multi-head model of its size, average score, loss and per-task scores.
fn model_row(m: &str, rows: &[ScoreRow], tasks: &[String]) -> ModelLine {
    let mine: Vec<&ScoreRow> = rows.iter().filter(|r| r.model == m).collect();
    let first = mine[0];
    let t = t_infer(&mine);
    // The unconverted row of this size (conversion "-") is the baseline of the speedup.
    let mha: Vec<&ScoreRow> = rows
        .iter()
        .filter(|r| r.size == first.size && r.conversion == "-")
        .collect();
    let speedup = if mha.is_empty() {
        "—".to_string()
    } else {
        format!("{:.2}×", t_infer(&mha) / t)
    };
    let per_seed = average_scores(&mine);
    let avg = Spread::of(&per_seed.values().copied().collect::<Vec<_>>());
    let loss = mean(&mine.iter().map(|r| r.eval_loss).collect::<Vec<_>>());
    let cells: Vec<String> = tasks
        .iter()
        .map(|task| {
            let scores: Vec<f64> = mine
                .iter()
                .filter(|r| &r.task == task)
                .map(|r| r.score)
                .collect();
            if scores.is_empty() {
                "—".into()
            } else {
                Spread::of(&scores).show(1)
            }
        })
        .collect();
    let span = |x: fn(&ScoreRow) -> Option<f64>| {
        let xs: Vec<f64> = mine.iter().filter_map(|r| x(r)).collect();
        if xs.is_empty() {
            "—".into()
        } else {
            Spread::of(&xs).show(3)
        }
    };
    let steps: Vec<usize> = mine.iter().filter_map(|r| r.finetune_step).collect();
    let ft_step = match (steps.iter().min(), steps.iter().max()) {
        (Some(lo), Some(hi)) if lo == hi => lo.to_string(),
        (Some(lo), Some(hi)) => format!("{lo}–{hi}"),
        _ => "—".into(),
    };
    let line = format!(
        "| {m} | {} | {} | {} | {} | {} | {} | {ft_step} | {t:.4} | {speedup} | {} | {loss:.3} | {} |\n",
        first.kv_heads,
        first.conversion,
        first.alpha,
        per_seed.len(),
        span(|r| r.span_loss_converted),
        span(|r| r.span_loss),
        avg.show(1),
        cells.join(" | ")
    );
    ModelLine {
        line,
        t_infer: t,
        avg: avg.mean,
        loss,
    }
}

/// The trivial baselines' table (`baselines.csv`, when the run wrote one).
fn baselines_table(out: &Path, tasks: &[String]) -> Result<String> {
    let baselines = out.join("baselines.csv");
    if !baselines.exists() {
        return Ok(String::new());
    }
    let baselines: Vec<BaselineRow> = crate::read_csv(&baselines)?;
    let mut md = format!(
        "\nTrivial baselines on the same examples (`baselines.csv`): *{COPY_INPUT}* writes each example's \
         input (a QA example's context) cut to the output length; *{MOST_FREQUENT}* writes the most \
         frequent target of the first {BASELINE_TRAIN_EXAMPLES} training examples for every example.\n\n\
         | baseline | {} |\n|{}\n",
        tasks.join(" | "),
        "---|".repeat(1 + tasks.len())
    );
    for name in [COPY_INPUT, MOST_FREQUENT] {
        let cells: Vec<String> = tasks
            .iter()
            .map(|task| {
                baselines
                    .iter()
                    .find(|b| &b.task == task && b.baseline == name)
                    .map_or("—".into(), |b| format!("{:.1}", b.score))
            })
            .collect();
        md += &format!("| {name} | {} |\n", cells.join(" | "));
    }
    Ok(md)
}

/// `score_vs_time.png/svg` and `loss_vs_time.png/svg`: each model's point.
fn charts(out: &Path, device: &str, points: &[Series], loss_points: &[Series]) -> Result<()> {
    for (file, what, y_label, series) in [
        ("score_vs_time", "Average score", "average score", points),
        (
            "loss_vs_time",
            "Fine-tuned held-out loss",
            "held-out token cross-entropy (mean over tasks)",
            loss_points,
        ),
    ] {
        LineChart {
            title: format!("{what} vs time per sample — {device}"),
            x_label: "seconds per sample".into(),
            y_label: y_label.into(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
        }
        .save(&out.join(file), series)?;
    }
    Ok(())
}
