//! A dot plot of ratios to a default: one row per ablation, its mean as a dot and its range over
//! the seeds as a bar, a dashed line at 1 (no change), each row coloured by its outcome. The
//! ablation artifacts' chart (FLASH Tables 1 and 2: final perplexity / the default layer's).

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::board::Outcome;
use crate::{Figure, save_figure, tick_label};

/// One row of a [`DotPlot`].
#[derive(Clone, Debug)]
pub struct DotRow {
    /// What the row changes (shown at its left).
    pub label: String,
    /// The ratio's mean and range.
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// Whether the whole range lies on the claim's side (reproduced), the other (refuted), or
    /// across 1 (inconclusive).
    pub outcome: Outcome,
}

/// The plot: a title, the x axis label, the rows top to bottom and what each colour means.
#[derive(Clone, Debug)]
pub struct DotPlot {
    /// Title above the plot.
    pub title: String,
    /// The ratio's label (`final perplexity / the default's`).
    pub x_label: String,
    /// The rows, top to bottom.
    pub rows: Vec<DotRow>,
    /// The legend's words for reproduced, inconclusive and refuted rows.
    pub outcome_names: [String; 3],
}

/// Width of the row labels at the left.
const LABELS: i32 = 300;

impl DotPlot {
    /// Writes `<stem>.png` and `<stem>.svg`.
    pub fn save(&self, stem: &Path) -> Result<()> {
        let height = 150 + 34 * self.rows.len().max(1) as u32;
        save_figure(stem, (1000, height), self)
    }
}

impl Figure for DotPlot {
    fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e:?}");
        anyhow::ensure!(
            !self.rows.is_empty(),
            "dot plot `{}` has no rows",
            self.title
        );
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(&self.title, ("sans-serif", 18)).map_err(err)?;
        let (body, legend) = root.split_vertically(root.dim_in_pixel().1 as i32 - 30);
        let (labels, plot) = body.split_horizontally(LABELS);
        let lo = self.rows.iter().map(|r| r.min).fold(1.0, f64::min);
        let hi = self.rows.iter().map(|r| r.max).fold(1.0, f64::max);
        let pad = ((hi - lo) * 0.08).max(0.01);
        let n = self.rows.len() as f64;
        let mut chart = ChartBuilder::on(&plot)
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(0)
            .build_cartesian_2d(lo - pad..hi + pad, -0.5..n - 0.5)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .x_desc(&self.x_label)
            .x_label_formatter(&|v| tick_label(*v))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(1.0, -0.5), (1.0, n - 0.5)],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(err)?;
        let font = ("sans-serif", 14).into_font();
        for (i, r) in self.rows.iter().enumerate() {
            // Top row first.
            let y = n - 1.0 - i as f64;
            let colour = r.outcome.colour();
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(r.min, y), (r.max, y)],
                    colour.stroke_width(3),
                )))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Circle::new(
                    (r.mean, y),
                    6,
                    colour.filled(),
                )))
                .map_err(err)?;
            let (_, py) = chart.backend_coord(&(lo, y));
            let (_, top) = plot.get_base_pixel();
            labels
                .draw(&Text::new(r.label.clone(), (8, py - top - 8), font.clone()))
                .map_err(err)?;
        }
        // The legend: one line under the plot.
        let mut x = 8;
        for (outcome, name) in [Outcome::Reproduced, Outcome::Inconclusive, Outcome::Refuted]
            .into_iter()
            .zip(&self.outcome_names)
        {
            legend
                .draw(&Circle::new((x + 8, 12), 6, outcome.colour().filled()))
                .map_err(err)?;
            legend
                .draw(&Text::new(name.clone(), (x + 20, 4), font.clone()))
                .map_err(err)?;
            x += 40 + 8 * name.chars().count() as i32;
        }
        root.present().map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_png_and_svg_and_refuses_an_empty_plot() {
        let dir = std::env::temp_dir().join(format!("dots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plot = DotPlot {
            title: "t".into(),
            x_label: "x".into(),
            rows: vec![
                DotRow {
                    label: "a".into(),
                    mean: 1.1,
                    min: 1.05,
                    max: 1.2,
                    outcome: Outcome::Reproduced,
                },
                DotRow {
                    label: "b".into(),
                    mean: 0.95,
                    min: 0.9,
                    max: 1.02,
                    outcome: Outcome::Inconclusive,
                },
            ],
            outcome_names: ["hurts".into(), "unsure".into(), "better".into()],
        };
        plot.save(&dir.join("d")).unwrap();
        assert!(dir.join("d.png").exists() && dir.join("d.svg").exists());
        let svg = std::fs::read_to_string(dir.join("d.svg")).unwrap();
        assert!(
            svg.contains("\na\n</text>") && svg.contains("\nb\n</text>"),
            "row labels drawn"
        );
        let empty = DotPlot {
            rows: vec![],
            ..plot
        };
        assert!(empty.save(&dir.join("e")).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
