//! Quality-vs-cost charts of the LM sweeps, made to be read at a glance: two panels (perplexity
//! against device-hours, and against training steps), linear axes, the perplexity axis clipped to
//! the band where the curves meet the baseline (earlier points drawn on the top edge as open
//! triangles: off the chart), a dashed line at the baseline's final perplexity, each model's seed
//! mean as a line with its seed range as a band, and the legend outside the data. Each of the
//! paper's models has one colour and name on every chart of the workspace; a chart's variants take
//! a palette's colours in turn and are named by what they change.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::{Figure, save_figure, tick_label};

/// A model's curve over its seeds: at each evaluation, the mean x (device-hours or steps) and the
/// mean, lowest and highest perplexity over the seeds.
#[derive(Clone, Debug)]
pub struct SeedCurve {
    /// The model's name in the results (`flash`, `transformer_plusplus`, a variant's name).
    pub model: String,
    /// Its name on the chart: the paper's name of a model ([`display_name`]), or what a variant
    /// changes (`FLASH-Quad (d_qk = 64)`).
    pub label: String,
    /// Per evaluation: (mean device-hours, step, mean ppl, min ppl, max ppl).
    pub points: Vec<SeedPoint>,
}

/// One evaluation of a [`SeedCurve`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeedPoint {
    /// Training device-hours: the mean over the seeds of the runs' own, or steps × a calibrated step time.
    pub hours: f64,
    /// Training step.
    pub step: f64,
    /// Held-out perplexity: mean, lowest and highest over the seeds.
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

/// The paper's name of a model (the Transformer family, FLASH and its ablations), or the name
/// itself (variants).
pub fn display_name(model: &str) -> &str {
    match model {
        "transformer" => "Transformer",
        "transformer_plus" => "Transformer+",
        "transformer_plusplus" => "Transformer++",
        "transformer_plusplus_relu2" => "Transformer++ (relu²)",
        "performer" => "Performer",
        "combiner" => "Combiner",
        "flash_quad" => "FLASH-Quad",
        "flash" => "FLASH",
        "mc_tfmpp" => "MC-TFM++",
        "flash_local_only" => "LocalOnly",
        "flash_global_only" => "GlobalOnly",
        other => other,
    }
}

/// The colour of each of the paper's models, the same on every chart of the workspace.
fn paper_colour(model: &str) -> Option<RGBColor> {
    Some(match model {
        "transformer" => RGBColor(127, 127, 127),
        "transformer_plus" => RGBColor(148, 103, 189),
        "transformer_plusplus" => RGBColor(31, 119, 180),
        "transformer_plusplus_relu2" => RGBColor(23, 190, 207),
        "performer" => RGBColor(140, 86, 75),
        "combiner" => RGBColor(188, 189, 34),
        "flash_quad" => RGBColor(44, 160, 44),
        "flash" => RGBColor(214, 39, 40),
        "mc_tfmpp" => RGBColor(227, 119, 194),
        "flash_local_only" => RGBColor(255, 127, 14),
        "flash_global_only" => RGBColor(140, 60, 0),
        _ => return None,
    })
}

/// The colours a chart gives its variants, in order (none is a paper model's).
const VARIANT_PALETTE: [RGBColor; 12] = [
    RGBColor(0, 0, 0),
    RGBColor(117, 112, 179),
    RGBColor(231, 41, 138),
    RGBColor(210, 180, 140),
    RGBColor(230, 171, 2),
    RGBColor(0, 0, 128),
    RGBColor(128, 0, 0),
    RGBColor(0, 128, 128),
    RGBColor(166, 118, 29),
    RGBColor(250, 128, 114),
    RGBColor(102, 102, 102),
    RGBColor(217, 95, 2),
];

/// A paper model's colour ([`chart_colours`] gives a chart's variants theirs); black for any other
/// name.
pub fn model_color(model: &str) -> RGBColor {
    paper_colour(model).unwrap_or(BLACK)
}

/// The colours of one chart's lines, in order: each paper model its own, the variants the
/// palette's colours in turn (no two lines of a chart share one while the palette lasts).
pub fn chart_colours<'a>(models: impl IntoIterator<Item = &'a str>) -> Vec<RGBColor> {
    let mut next = VARIANT_PALETTE.iter().cycle();
    models
        .into_iter()
        .map(|m| paper_colour(m).unwrap_or_else(|| *next.next().expect("a cycle never ends")))
        .collect()
}

/// The perplexity band drawn: from just below the lowest seed value to the highest mean
/// perplexity any model has at or after a quarter of its steps (the warm-up and the initial drop
/// lie above it), and always above the baseline's final perplexity.
pub fn ppl_band(curves: &[SeedCurve], baseline_final: f64) -> (f64, f64) {
    let low = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.min))
        .fold(baseline_final, f64::min);
    let high = curves
        .iter()
        .flat_map(|c| {
            let last = c.points.last().map_or(0.0, |p| p.step);
            c.points
                .iter()
                .filter(move |p| 4.0 * p.step >= last)
                .map(|p| p.mean)
        })
        .fold(baseline_final * 1.05, f64::max);
    let pad = (high - low) * 0.04;
    (low - pad, high + pad)
}

/// The chart: a title (objective, dataset, context), the baseline's name and final perplexity.
#[derive(Clone, Debug)]
pub struct QualityChart {
    pub title: String,
    /// The baseline model's name and its final perplexity (seed mean).
    pub baseline: (String, f64),
    /// The label of the device-hours axis (how the hours were counted).
    pub hours_label: String,
}

impl QualityChart {
    fn panel<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        curves: &[SeedCurve],
        colours: &[RGBColor],
        x_of: fn(&SeedPoint) -> f64,
        x_label: &str,
    ) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e:?}");
        let (y0, y1) = ppl_band(curves, self.baseline.1);
        let x1 = curves
            .iter()
            .flat_map(|c| c.points.iter().map(x_of))
            .fold(0.0, f64::max)
            * 1.02;
        anyhow::ensure!(x1 > 0.0, "chart `{}` has no points", self.title);
        let mut chart = ChartBuilder::on(area)
            .margin(10)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x1, y0..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc("held-out perplexity")
            .x_label_formatter(&|v| tick_label(*v))
            .y_label_formatter(&|v| tick_label(*v))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        let clip = |y: f64| y.clamp(y0, y1);
        for (c, &color) in curves.iter().zip(colours) {
            let band: Vec<(f64, f64)> = c
                .points
                .iter()
                .map(|p| (x_of(p), clip(p.max)))
                .chain(c.points.iter().rev().map(|p| (x_of(p), clip(p.min))))
                .collect();
            chart
                .draw_series(std::iter::once(Polygon::new(
                    band,
                    color.mix(0.18).filled(),
                )))
                .map_err(err)?;
            let line: Vec<(f64, f64)> = c.points.iter().map(|p| (x_of(p), clip(p.mean))).collect();
            chart
                .draw_series(LineSeries::new(line, color.stroke_width(2)))
                .map_err(err)?;
            // Evaluations inside the band as dots; above it (the initial drop) as open triangles
            // on the top edge.
            let (inside, above): (Vec<&SeedPoint>, Vec<&SeedPoint>) =
                c.points.iter().partition(|p| p.mean <= y1);
            chart
                .draw_series(
                    inside
                        .into_iter()
                        .map(|p| Circle::new((x_of(p), clip(p.mean)), 3, color.filled())),
                )
                .map_err(err)?;
            chart
                .draw_series(
                    above
                        .into_iter()
                        .map(|p| TriangleMarker::new((x_of(p), y1), 6, color.stroke_width(1))),
                )
                .map_err(err)?;
        }
        let target = self.baseline.1;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, target), (x1, target)],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(err)?;
        Ok(())
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, Shift>,
        curves: &[SeedCurve],
    ) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e:?}");
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(&self.title, ("sans-serif", 20)).map_err(err)?;
        // The legend as wide as its longest name needs.
        let longest = curves
            .iter()
            .map(|c| c.label.chars().count())
            .max()
            .unwrap_or(0) as i32;
        let legend_width = (50 + 8 * longest).clamp(210, 420);
        let plots_width = root.dim_in_pixel().0 as i32 - legend_width;
        let (plots, legend) = root.split_horizontally(plots_width);
        let (left, right) = plots.split_horizontally(plots_width / 2);
        let colours = chart_colours(curves.iter().map(|c| c.model.as_str()));
        self.panel(&left, curves, &colours, |p| p.hours, &self.hours_label)?;
        self.panel(&right, curves, &colours, |p| p.step, "training step")?;
        // The legend, outside the data: one entry per model, then the baseline line and the
        // off-chart marker.
        let font = ("sans-serif", 14).into_font();
        let mut y = 60;
        for (c, &color) in curves.iter().zip(&colours) {
            legend
                .draw(&Rectangle::new(
                    [(8, y - 6), (30, y + 6)],
                    color.mix(0.18).filled(),
                ))
                .map_err(err)?;
            legend
                .draw(&PathElement::new(
                    vec![(8, y), (30, y)],
                    color.stroke_width(2),
                ))
                .map_err(err)?;
            legend
                .draw(&Text::new(c.label.clone(), (38, y - 8), font.clone()))
                .map_err(err)?;
            y += 24;
        }
        y += 10;
        let (name, target) = &self.baseline;
        for line in [
            format!("- - {}'s final", display_name(name)),
            format!("    perplexity, {}", tick_label(*target)),
            "line: seed mean".to_string(),
            "band: seed range".to_string(),
            "△ on top: above the".to_string(),
            "    band (initial drop)".to_string(),
        ] {
            legend
                .draw(&Text::new(line, (8, y - 8), font.clone()))
                .map_err(err)?;
            y += 20;
        }
        root.present().map_err(err)?;
        Ok(())
    }

    /// Writes `<stem>.png` and `<stem>.svg` (each through a temporary file, then renamed).
    pub fn save(&self, stem: &Path, curves: &[SeedCurve]) -> Result<()> {
        save_figure(stem, (1300, 560), &(self, curves))
    }
}

impl Figure for (&QualityChart, &[SeedCurve]) {
    fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        self.0.draw(root, self.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(model: &str, means: &[f64]) -> SeedCurve {
        SeedCurve {
            model: model.into(),
            label: display_name(model).into(),
            points: means
                .iter()
                .enumerate()
                .map(|(i, &m)| SeedPoint {
                    hours: 0.1 * (i + 1) as f64,
                    step: 10.0 * (i + 1) as f64,
                    mean: m,
                    min: m - 1.0,
                    max: m + 1.0,
                })
                .collect(),
        }
    }

    #[test]
    fn band_leaves_the_initial_drop_off_the_chart() {
        // Steps 10..80: a quarter of 80 is 20, so 900 (step 10) is above the band, 60 (step 20) in.
        let c = [curve(
            "flash",
            &[900.0, 60.0, 50.0, 45.0, 42.0, 41.0, 40.5, 40.0],
        )];
        let (low, high) = ppl_band(&c, 40.0);
        assert!(low < 39.0 && low > 37.0, "{low}");
        assert!(high > 60.0 && high < 70.0, "{high}");
    }

    #[test]
    fn every_paper_model_has_its_own_colour_and_name() {
        let models = [
            "transformer",
            "transformer_plus",
            "transformer_plusplus",
            "transformer_plusplus_relu2",
            "performer",
            "combiner",
            "flash_quad",
            "flash",
            "mc_tfmpp",
            "flash_local_only",
            "flash_global_only",
        ];
        for (i, a) in models.iter().enumerate() {
            assert_ne!(display_name(a), *a, "{a} has a display name");
            for b in &models[..i] {
                assert_ne!(model_color(a), model_color(b), "{a} and {b} share a colour");
            }
        }
        // A chart's variants take the palette in turn, none a paper model's colour.
        let colours = chart_colours(["flash_quad", "v1", "v2", "flash", "v3"]);
        assert_eq!(colours[0], model_color("flash_quad"));
        assert_eq!(colours[3], model_color("flash"));
        for v in [colours[1], colours[2], colours[4]] {
            assert!(models.iter().all(|m| model_color(m) != v), "{v:?}");
        }
        assert!(colours[1] != colours[2] && colours[2] != colours[4] && colours[1] != colours[4]);
    }

    #[test]
    fn writes_png_and_svg_with_display_names() {
        let dir = std::env::temp_dir().join(format!("quality-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chart = QualityChart {
            title: "Causal LM, gutenberg_shakespeare, context 512".into(),
            baseline: ("transformer_plusplus".into(), 41.0),
            hours_label: "device-hours".into(),
        };
        let curves = [
            curve("transformer_plusplus", &[900.0, 60.0, 50.0, 41.0]),
            curve("flash", &[800.0, 55.0, 45.0, 40.0]),
        ];
        chart.save(&dir.join("q"), &curves).unwrap();
        let svg = std::fs::read_to_string(dir.join("q.svg")).unwrap();
        assert!(
            svg.contains("Transformer++") && svg.contains("FLASH"),
            "legend names"
        );
        assert!(chart.save(&dir.join("empty"), &[]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
