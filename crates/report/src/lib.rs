//! Charts drawn from the values of result CSVs (never by re-running an experiment).

use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;

pub mod board;
pub mod dots;
pub mod quality;
pub mod readme;
pub mod timing;

/// DejaVu Sans, bundled so charts render the same on a machine without fonts (licence beside it).
const FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The bundled file is a valid TrueType font; failure here would be a packaging bug.
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
            .map_err(|_| "bundled font")
            .expect("the bundled DejaVu Sans font loads");
    });
}

/// One named line of (x, y) points.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// Axis scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Linear axis.
    Linear,
    /// Linear axis that always includes zero, so that a ratio between two values reads as one.
    LinearFromZero,
    /// Base-2 logarithmic axis (context lengths, latencies).
    Log2,
}

/// A line chart: title, axis labels and scales.
#[derive(Clone, Debug)]
pub struct LineChart {
    /// Title above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// X axis scale.
    pub x_scale: Scale,
    /// Y axis scale.
    pub y_scale: Scale,
}

const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// A corner of a chart's plotting area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Corner {
    UpperLeft,
    UpperRight,
    LowerLeft,
    LowerRight,
}

impl Corner {
    fn position(self) -> SeriesLabelPosition {
        match self {
            Corner::UpperLeft => SeriesLabelPosition::UpperLeft,
            Corner::UpperRight => SeriesLabelPosition::UpperRight,
            Corner::LowerLeft => SeriesLabelPosition::LowerLeft,
            Corner::LowerRight => SeriesLabelPosition::LowerRight,
        }
    }
}

/// The corner whose legend box covers the fewest of the drawn points (the first of upper left,
/// upper right, lower left, lower right on a tie), so that the legend hides no data where a
/// corner is free. The box is taken as 40% of the plot's width and 6% of its height per entry
/// (the legend's 14-pixel lines on a 600-pixel chart, with its margins). `points` and `bounds`
/// ((x0, x1), (y0, y1)) are in the axes' drawn (transformed) coordinates.
fn legend_corner(
    points: &[(f64, f64)],
    ((x0, x1), (y0, y1)): ((f64, f64), (f64, f64)),
    entries: usize,
) -> Corner {
    let (w, h) = (0.4, (0.06 * entries as f64 + 0.04).min(1.0));
    let unit = |v: f64, a: f64, b: f64| if b > a { (v - a) / (b - a) } else { 0.5 };
    let covered = |corner: Corner| {
        points
            .iter()
            .filter(|&&(x, y)| {
                let (u, v) = (unit(x, x0, x1), unit(y, y0, y1));
                let left = u <= w;
                let right = u >= 1.0 - w;
                let upper = v >= 1.0 - h;
                let lower = v <= h;
                match corner {
                    Corner::UpperLeft => left && upper,
                    Corner::UpperRight => right && upper,
                    Corner::LowerLeft => left && lower,
                    Corner::LowerRight => right && lower,
                }
            })
            .count()
    };
    [
        Corner::UpperLeft,
        Corner::UpperRight,
        Corner::LowerLeft,
        Corner::LowerRight,
    ]
    .into_iter()
    .min_by_key(|&c| covered(c))
    .expect("four corners")
}

fn transform(scale: Scale, v: f64) -> f64 {
    match scale {
        Scale::Linear | Scale::LinearFromZero => v,
        Scale::Log2 => v.log2(),
    }
}

impl LineChart {
    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
        series: &[Series],
    ) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        let points = series.iter().flat_map(|s| s.points.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in points {
            let (x, y) = (transform(self.x_scale, x), transform(self.y_scale, y));
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        anyhow::ensure!(x0 <= x1, "chart `{}` has no points", self.title);
        if self.x_scale == Scale::LinearFromZero {
            x0 = x0.min(0.0);
        }
        if self.y_scale == Scale::LinearFromZero {
            y0 = y0.min(0.0);
        }
        let pad = |a: f64, b: f64| if b > a { (b - a) * 0.05 } else { 0.5 };
        let (px, py) = (pad(x0, x1), pad(y0, y1));
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(x0 - px..x1 + px, y0 - py..y1 + py)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let (xs, ys) = (self.x_scale, self.y_scale);
        let (x_powers, y_powers) = (
            spans_powers_of_two(x0 - px, x1 + px),
            spans_powers_of_two(y0 - py, y1 + py),
        );
        let fmt = move |scale: Scale, powers: bool, v: f64| axis_label(scale, powers, v);
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_label_formatter(&|v| fmt(xs, x_powers, *v))
            .y_label_formatter(&|v| fmt(ys, y_powers, *v))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        for (i, s) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|&(x, y)| (transform(xs, x), transform(ys, y)))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e:?}"))?
                .label(s.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        }
        let drawn: Vec<(f64, f64)> = series
            .iter()
            .flat_map(|s| s.points.iter())
            .map(|&(x, y)| (transform(xs, x), transform(ys, y)))
            .collect();
        let bounds = ((x0 - px, x1 + px), (y0 - py, y1 + py));
        chart
            .configure_series_labels()
            .position(legend_corner(&drawn, bounds, series.len()).position())
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        Ok(())
    }

    /// Writes `<stem>.png` and `<stem>.svg` (each through a temporary file, then renamed).
    pub fn save(&self, stem: &Path, series: &[Series]) -> Result<()> {
        save_figure(stem, (900, 600), &(self, series))
    }
}

impl Figure for (&LineChart, &[Series]) {
    fn draw_on<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
    ) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        self.0.draw(root, self.1)
    }
}

/// A chart with its data, drawable on any plotters backend (so one [`save_figure`] writes both
/// formats of every chart kind).
trait Figure {
    fn draw_on<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
    ) -> Result<()>
    where
        DB::ErrorType: 'static;
}

/// Writes `<stem>.png` and `<stem>.svg` of `figure` at `size` pixels, each through a temporary file
/// that is then renamed (a reader never sees half a chart).
fn save_figure(stem: &Path, size: (u32, u32), figure: &impl Figure) -> Result<()> {
    register_font();
    for ext in ["png", "svg"] {
        let path = stem.with_extension(ext);
        let tmp = stem.with_extension(format!("tmp.{ext}"));
        match ext {
            "png" => figure.draw_on(BitMapBackend::new(&tmp, size).into_drawing_area())?,
            _ => figure.draw_on(SVGBackend::new(&tmp, size).into_drawing_area())?,
        }
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// An axis tick: three significant digits (0.00123, 0.0421, 1.5, 512), trailing zeros dropped,
/// so that ticks over a small range (device-hours of short runs) stay distinct.
/// Whether a log2 axis over `[a, b]` (in log2 units) holds two or more powers of two.
fn spans_powers_of_two(a: f64, b: f64) -> bool {
    b.floor() - a.ceil() >= 1.0
}

/// The label of the mesh tick at `v` (in the axis' own units: log2 of the value on a log axis). A log
/// axis holding two or more powers of two (`powers_only`) is labelled at the powers alone (512,
/// 1024, 2048), not at the mesh's in-between ticks, which would read 724, 1448.
fn axis_label(scale: Scale, powers_only: bool, v: f64) -> String {
    match scale {
        Scale::Linear | Scale::LinearFromZero => tick_label(v),
        Scale::Log2 if powers_only && (v - v.round()).abs() > 1e-9 => String::new(),
        Scale::Log2 if powers_only => tick_label(2f64.powf(v.round())),
        Scale::Log2 => tick_label(2f64.powf(v)),
    }
}

pub fn tick_label(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let decimals = (2 - v.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The legend goes to the first corner free of points: upper left when it is free, else the
    /// next free one, and the corner covering fewest points when none is free.
    #[test]
    fn legend_takes_a_corner_free_of_points() {
        let bounds = ((0.0, 10.0), (0.0, 10.0));
        let middle = [(5.0, 5.0)];
        assert_eq!(legend_corner(&middle, bounds, 3), Corner::UpperLeft);
        let upper_left = [(1.0, 9.5), (5.0, 5.0)];
        assert_eq!(legend_corner(&upper_left, bounds, 3), Corner::UpperRight);
        let upper = [(1.0, 9.5), (9.0, 9.5)];
        assert_eq!(legend_corner(&upper, bounds, 3), Corner::LowerLeft);
        let crowded = [
            (1.0, 9.5),
            (1.0, 9.0),
            (9.0, 9.5),
            (1.0, 0.5),
            (9.0, 0.5),
            (9.0, 1.0),
            (9.5, 1.0),
        ];
        // Upper left covers 2, upper right 1, lower left 1, lower right 3.
        assert_eq!(legend_corner(&crowded, bounds, 3), Corner::UpperRight);
        // A taller legend (more entries) reaches points lower down.
        let mid_left = [(1.0, 7.0)];
        assert_eq!(legend_corner(&mid_left, bounds, 2), Corner::UpperLeft);
        assert_eq!(legend_corner(&mid_left, bounds, 8), Corner::UpperRight);
    }

    #[test]
    fn tick_labels_keep_three_significant_digits() {
        let labels: Vec<String> = [0.00123, 0.0125, 0.0421, 0.5, 1.5, 42.0, 512.0, 8192.0, 0.0]
            .iter()
            .map(|&v| tick_label(v))
            .collect();
        assert_eq!(
            labels,
            [
                "0.00123", "0.0125", "0.0421", "0.5", "1.5", "42", "512", "8192", "0"
            ]
        );
    }

    #[test]
    fn log_axes_over_several_powers_are_labelled_at_the_powers_only() {
        // 512 .. 8192 on a log2 axis: the mesh's half-way ticks (724, 1448, ...) carry no label.
        assert!(spans_powers_of_two(8.8, 13.2));
        let labels: Vec<String> = [9.0, 9.5, 10.0, 10.5, 13.0]
            .iter()
            .map(|&v| axis_label(Scale::Log2, true, v))
            .collect();
        assert_eq!(labels, ["512", "", "1024", "", "8192"]);
        // Within one power (600 .. 900) every tick is labelled with its value.
        assert!(!spans_powers_of_two(9.2, 9.8));
        assert_eq!(axis_label(Scale::Log2, false, 9.5), "724");
        assert_eq!(axis_label(Scale::Linear, true, 9.5), "9.5");
    }

    #[test]
    fn a_from_zero_axis_reaches_zero() {
        let dir = std::env::temp_dir().join(format!("report-zero-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chart = LineChart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_scale: Scale::Linear,
            y_scale: Scale::LinearFromZero,
        };
        let series = [Series {
            name: "s".into(),
            points: vec![(1.0, 10.0), (2.0, 12.0)],
        }];
        chart.save(&dir.join("c"), &series).unwrap();
        // The y axis of 10..12 carries a zero tick only when drawn from zero.
        let svg = std::fs::read_to_string(dir.join("c.svg")).unwrap();
        let zero_tick = |svg: &str| svg.lines().any(|l| l.trim() == "0");
        assert!(zero_tick(&svg), "no zero tick");
        // The same points on a plain linear axis stay near their values.
        LineChart {
            y_scale: Scale::Linear,
            ..chart
        }
        .save(&dir.join("d"), &series)
        .unwrap();
        assert!(!zero_tick(
            &std::fs::read_to_string(dir.join("d.svg")).unwrap()
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writes_png_and_svg() {
        let dir = std::env::temp_dir().join(format!("report-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chart = LineChart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_scale: Scale::Log2,
            y_scale: Scale::Log2,
        };
        let s = Series {
            name: "a".into(),
            points: vec![(512.0, 1.0), (1024.0, 2.0)],
        };
        chart.save(&dir.join("chart"), &[s]).unwrap();
        let png = std::fs::read(dir.join("chart.png")).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let svg = std::fs::read_to_string(dir.join("chart.svg")).unwrap();
        assert!(
            svg.replace('\n', "").contains(">a</text>"),
            "legend label missing from the SVG"
        );
        assert!(chart.save(&dir.join("empty"), &[]).is_err());
    }
}

/// Device-hours at which a quality curve first reaches `target` perplexity (or lower), by linear
/// interpolation between evaluations; `None` if it never does. `curve`: (device_hours, ppl) in
/// training order.
pub fn time_to_reach(curve: &[(f64, f64)], target: f64) -> Option<f64> {
    let mut prev: Option<(f64, f64)> = None;
    for &(h, p) in curve {
        if p <= target {
            return Some(match prev {
                Some((h0, p0)) if p0 > p => h0 + (h - h0) * (p0 - target) / (p0 - p),
                _ => h,
            });
        }
        prev = Some((h, p));
    }
    None
}

/// The FLASH paper's speedup: the baseline's training time divided by the time `model` takes to
/// reach the baseline's final perplexity; `None` when the model never reaches it. Both times are
/// first crossings of that perplexity, so a baseline whose noisy curve dips below its final value
/// before the end is timed like the model (and is 1× against itself); on a falling curve the
/// baseline's crossing is its training time.
pub fn speedup_to_baseline(baseline: &[(f64, f64)], model: &[(f64, f64)]) -> Option<f64> {
    let &(_, final_ppl) = baseline.last()?;
    let hours = time_to_reach(baseline, final_ppl)?;
    time_to_reach(model, final_ppl)
        .filter(|&t| t > 0.0)
        .map(|t| hours / t)
}

#[cfg(test)]
mod speedup_tests {
    use super::*;

    #[test]
    fn speedup_interpolates_the_crossing() {
        let baseline = [(1.0, 30.0), (2.0, 20.0), (4.0, 10.0)];
        // Reaches 10 halfway between 1.5 h (12) and 2.5 h (8): at 2.0 h → 4 / 2 = 2×.
        let model = [(0.5, 25.0), (1.5, 12.0), (2.5, 8.0)];
        assert!((speedup_to_baseline(&baseline, &model).unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(time_to_reach(&model, 5.0), None);
        assert_eq!(speedup_to_baseline(&baseline, &[(1.0, 11.0)]), None);
        // The baseline against itself: 1×.
        assert_eq!(speedup_to_baseline(&baseline, &baseline), Some(1.0));
        // A baseline that dips below its final 12 before its end (4 h) is timed at its first
        // crossing, 1.75 h; the model reaches 12 at 1.5 h: 1.75 / 1.5, not 4 / 1.5.
        let noisy = [(1.0, 30.0), (2.0, 6.0), (4.0, 12.0)];
        let crossing = 1.0 + (30.0 - 12.0) / (30.0 - 6.0);
        assert_eq!(speedup_to_baseline(&noisy, &noisy), Some(1.0));
        let s = speedup_to_baseline(&noisy, &model).unwrap();
        assert!((s - crossing / 1.5).abs() < 1e-12, "{s}");
    }
}
