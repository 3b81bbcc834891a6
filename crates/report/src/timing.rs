//! Timing charts: step time against context on native logarithmic axes, each point the median
//! with a bar from the fastest to the slowest timed step (table11), and stacked bars of where a
//! sample's time goes (gqa_fig6: encoder, then decoding). Models keep the colours and names of the
//! quality charts ([`crate::quality`]).

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::quality::{display_name, model_color};
use crate::{Figure, save_figure, tick_label};

/// One timed point: x (a context length), and the median, fastest and slowest seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timed {
    pub x: f64,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// A model's timed points, in x order.
#[derive(Clone, Debug)]
pub struct TimedSeries {
    /// The model's name in the results (its colour and display name follow).
    pub model: String,
    pub points: Vec<Timed>,
}

/// Step time against context, both axes logarithmic (base 2 on x: the contexts double).
#[derive(Clone, Debug)]
pub struct TimingChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
}

impl TimingChart {
    /// Writes `<stem>.png` and `<stem>.svg`.
    pub fn save(&self, stem: &Path, series: &[TimedSeries]) -> Result<()> {
        save_figure(stem, (900, 600), &(self, series))
    }
}

impl Figure for (&TimingChart, &[TimedSeries]) {
    fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let (chart_spec, series) = *self;
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e:?}");
        let points = || series.iter().flat_map(|s| s.points.iter());
        anyhow::ensure!(
            points().next().is_some(),
            "chart `{}` has no points",
            chart_spec.title
        );
        let (x0, x1) = points().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.x), b.max(p.x)));
        let (y0, y1) = points().fold((f64::MAX, f64::MIN), |(a, b), p| {
            (a.min(p.min), b.max(p.max))
        });
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&chart_spec.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (x0 / 1.25..x1 * 1.25).log_scale().base(2.0),
                (y0 / 1.15..y1 * 1.15).log_scale().base(2.0),
            )
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(&chart_spec.x_label)
            .y_desc(&chart_spec.y_label)
            .x_label_formatter(&|v| tick_label(*v))
            .y_labels(12)
            .y_label_formatter(&|v| tick_label(*v))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        for s in series {
            let colour = model_color(&s.model);
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().map(|p| (p.x, p.median)),
                    colour.stroke_width(2),
                ))
                .map_err(err)?
                .label(display_name(&s.model).to_string())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                });
            chart
                .draw_series(s.points.iter().map(|p| {
                    ErrorBar::new_vertical(p.x, p.min, p.median, p.max, colour.stroke_width(1), 8)
                }))
                .map_err(err)?;
            chart
                .draw_series(
                    s.points
                        .iter()
                        .map(|p| Circle::new((p.x, p.median), 3, colour.filled())),
                )
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
        Ok(())
    }
}

/// Stacked bars from zero: per category (a K/V group count), the parts of one total (encoder,
/// decoding), each part with its own colour and legend entry.
#[derive(Clone, Debug)]
pub struct StackedBars {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// The categories, left to right.
    pub categories: Vec<String>,
    /// Each part's name and its value per category, bottom to top.
    pub parts: Vec<(String, Vec<f64>)>,
}

const PART_COLOURS: [RGBColor; 4] = [
    RGBColor(160, 160, 160),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
];

impl StackedBars {
    /// Writes `<stem>.png` and `<stem>.svg`.
    pub fn save(&self, stem: &Path) -> Result<()> {
        save_figure(stem, (900, 560), self)
    }
}

impl Figure for StackedBars {
    fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e:?}");
        let n = self.categories.len();
        anyhow::ensure!(
            n > 0 && self.parts.iter().all(|(_, v)| v.len() == n),
            "stacked bars `{}`: every part needs one value per category",
            self.title
        );
        let total = |i: usize| self.parts.iter().map(|(_, v)| v[i]).sum::<f64>();
        // Head room above the tallest bar for its total and the legend.
        let top = (0..n).map(total).fold(0.0, f64::max) * 1.45;
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..top)
            .map_err(err)?;
        let categories = self.categories.clone();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_labels(n)
            .x_label_formatter(&move |v| {
                let i = v.round();
                if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < categories.len() {
                    categories[i as usize].clone()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| tick_label(*v))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        let mut base = vec![0.0; n];
        for (k, (name, values)) in self.parts.iter().enumerate() {
            let colour = PART_COLOURS[k % PART_COLOURS.len()];
            let bars: Vec<Rectangle<(f64, f64)>> = (0..n)
                .map(|i| {
                    let x = i as f64;
                    Rectangle::new(
                        [(x - 0.35, base[i]), (x + 0.35, base[i] + values[i])],
                        colour.filled(),
                    )
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(name.clone())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], colour.filled())
                });
            for (b, v) in base.iter_mut().zip(values) {
                *b += v;
            }
        }
        chart
            .draw_series((0..n).map(|i| {
                Text::new(
                    tick_label(total(i)),
                    (i as f64 - 0.2, total(i) + top * 0.05),
                    ("sans-serif", 13).into_font(),
                )
            }))
            .map_err(err)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_and_stacked_charts_write_both_formats_and_refuse_bad_input() {
        let dir = std::env::temp_dir().join(format!("timing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let series = [TimedSeries {
            model: "flash".into(),
            points: vec![
                Timed {
                    x: 512.0,
                    median: 2.0,
                    min: 1.9,
                    max: 2.2,
                },
                Timed {
                    x: 8192.0,
                    median: 2.1,
                    min: 2.0,
                    max: 2.3,
                },
            ],
        }];
        let chart = TimingChart {
            title: "t".into(),
            x_label: "context".into(),
            y_label: "s".into(),
        };
        chart.save(&dir.join("l"), &series).unwrap();
        let svg = std::fs::read_to_string(dir.join("l.svg")).unwrap();
        assert!(svg.contains("FLASH"), "the display name in the legend");
        assert!(chart.save(&dir.join("e"), &[]).is_err());
        let bars = StackedBars {
            title: "b".into(),
            x_label: "groups".into(),
            y_label: "s".into(),
            categories: vec!["1".into(), "64".into()],
            parts: vec![
                ("encoder".into(), vec![1.0, 1.0]),
                ("decoding".into(), vec![0.5, 2.0]),
            ],
        };
        bars.save(&dir.join("b")).unwrap();
        assert!(dir.join("b.png").exists() && dir.join("b.svg").exists());
        let ragged = StackedBars {
            parts: vec![("encoder".into(), vec![1.0])],
            ..bars
        };
        assert!(ragged.save(&dir.join("r")).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
