//! Plots for `multirail bench --plot FILE.svg|FILE.png`: the measured value
//! against message size, one line per configuration.
//!
//! * x: message size on a log-2 axis labelled `1`, `1K`, `1M`, ...; size
//!   0 (latency tests) has no place on a log axis and is left out.
//! * y: the test's unit. Bandwidth (MB/s) on a linear axis from 0, so
//!   plateaus and ratios read as they are; latency (µs) on a log-10 axis,
//!   because 1 B and 4 MiB differ by three decades.
//! * Title: the test and the machine (hostname, CPUs); under it the
//!   configuration(s).
//!
//! The file type comes from the extension ([`PlotFormat::from_path`]).
//! Text is drawn with DejaVu Sans, built into this crate (a subset, see
//! `assets/fonts/README.md`) and registered with plotters at first use, so
//! PNGs render on machines without fontconfig or any system font.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::format_size;
use crate::spec::Test;

/// DejaVu Sans (Latin-1 subset), under the Bitstream Vera licence
/// (`assets/fonts/LICENSE-DejaVu.txt`).
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-subset.ttf");
/// The family name plotters' defaults (axis labels, legend) ask for.
const FAMILY: &str = "sans-serif";
/// Canvas size in pixels (SVG user units).
const SIZE: (u32, u32) = (1024, 640);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlotError {
    #[error("'{0}': the plot's file name must end in .svg or .png")]
    UnknownFormat(PathBuf),
    #[error("'{path}': directory '{dir}' does not exist")]
    NoDirectory { path: PathBuf, dir: PathBuf },
    #[error("nothing to plot: no size above 0 with a positive value")]
    NoPoints,
    #[error("drawing the plot: {0}")]
    Draw(String),
    #[error("writing '{path}': {reason}")]
    Write { path: PathBuf, reason: String },
}

/// The file types a plot is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlotFormat {
    Svg,
    Png,
}

impl PlotFormat {
    /// `.svg` or `.png` (any case); anything else is an error.
    pub fn from_path(path: &Path) -> Result<PlotFormat, PlotError> {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("svg") => Ok(PlotFormat::Svg),
            Some("png") => Ok(PlotFormat::Png),
            _ => Err(PlotError::UnknownFormat(path.to_path_buf())),
        }
    }
}

/// Checks a plot's path before anything is measured: a known extension
/// and an existing directory.
pub fn check_path(path: &Path) -> Result<PlotFormat, PlotError> {
    let format = PlotFormat::from_path(path)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(PlotError::NoDirectory { path: path.to_path_buf(), dir: dir.to_path_buf() });
    }
    Ok(format)
}

/// Where the numbers were made, for the title.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    pub hostname: String,
    pub cpus: usize,
}

impl Machine {
    /// This machine: the kernel's hostname and the CPUs this process may use.
    pub fn this() -> Machine {
        let hostname = ["/proc/sys/kernel/hostname", "/etc/hostname"]
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown host".into());
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Machine { hostname, cpus }
    }
}

/// One line of the plot: a configuration's value per message size.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    /// `(size in bytes, value in the test's unit)`.
    pub points: Vec<(u64, f64)>,
}

/// Everything drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub test: Test,
    /// The configuration(s), printed under the title.
    pub config: String,
    pub machine: Machine,
    pub series: Vec<Series>,
    /// A chart of something other than the test's own value (a ratio,
    /// say): its title and y axis. `None` for the test's value.
    pub custom: Option<CustomAxis>,
}

/// The title and y axis of a chart that is not a test's value.
#[derive(Debug, Clone, PartialEq)]
pub struct CustomAxis {
    /// What is drawn, after `multirail `: `bench cbr: Communication Balance Ratios`.
    pub what: String,
    pub y_label: String,
    /// A log-10 y axis (ratios spanning decades), else linear from 0.
    pub log_y: bool,
}

impl Chart {
    /// `multirail bench bw: Bandwidth Test on HOST (N CPUs)`.
    pub fn title(&self) -> String {
        let cpus = if self.machine.cpus == 1 { "1 CPU".to_string() } else { format!("{} CPUs", self.machine.cpus) };
        let what = match &self.custom {
            Some(c) => c.what.clone(),
            None => format!("bench {}: {}", self.test, self.test.title()),
        };
        format!("multirail {what} on {} ({cpus})", self.machine.hostname)
    }

    fn y_label(&self) -> &str {
        match &self.custom {
            Some(c) => &c.y_label,
            None if self.test.is_latency() => "Latency (µs, one way)",
            None => "Bandwidth (MB/s, MB = 10^6 bytes)",
        }
    }

    /// Latency (and custom charts that ask for it) on a log-10 axis.
    fn log_y(&self) -> bool {
        self.custom.as_ref().map_or(self.test.is_latency(), |c| c.log_y)
    }

    /// The points that have a place on the axes, as `(log2 size, value)`.
    fn drawable(&self, s: &Series) -> Vec<(f64, f64)> {
        s.points
            .iter()
            .filter(|(size, v)| *size > 0 && v.is_finite() && (*v > 0.0 || !self.log_y() && *v == 0.0))
            .map(|&(size, v)| ((size as f64).log2(), if self.log_y() { v.log10() } else { v }))
            .collect()
    }
}

/// Writes `chart` to `path` as SVG or PNG (from the extension).
pub fn write(path: &Path, chart: &Chart) -> Result<(), PlotError> {
    match check_path(path)? {
        PlotFormat::Svg => {
            let svg = svg(chart)?;
            std::fs::write(path, svg).map_err(|e| PlotError::Write { path: path.to_path_buf(), reason: e.to_string() })
        }
        PlotFormat::Png => {
            register_font()?;
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw(&root, chart)?;
            root.present().map_err(|e| PlotError::Write { path: path.to_path_buf(), reason: e.to_string() })
        }
    }
}

/// The chart as an SVG document.
pub fn svg(chart: &Chart) -> Result<String, PlotError> {
    register_font()?;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        draw(&root, chart)?;
        root.present().map_err(draw_err)?;
    }
    Ok(out)
}

/// Registers the built-in font once per process.
fn register_font() -> Result<(), PlotError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok { Ok(()) } else { Err(PlotError::Draw("the built-in font does not load".into())) }
}

fn draw_err(e: impl std::fmt::Display) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// Colours for the lines, distinct on white: first Okabe and Ito's palette
/// (distinct for most colour-blind eyes), then darker and greyer tones for
/// charts with many lines (a report's figure with its peers); more series
/// reuse them.
const COLOURS: [RGBColor; 12] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(117, 112, 179),
    RGBColor(140, 140, 140),
    RGBColor(140, 81, 10),
    RGBColor(178, 24, 43),
    RGBColor(77, 146, 33),
];

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let lines: Vec<(&Series, Vec<(f64, f64)>)> = chart.series.iter().map(|s| (s, chart.drawable(s))).collect();
    let all: Vec<(f64, f64)> = lines.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    if all.is_empty() {
        return Err(PlotError::NoPoints);
    }
    let (x, x_keys) = x_axis(all.iter().map(|p| p.0));
    let log_y = chart.log_y();
    let (y, y_keys) = if log_y { log_axis(all.iter().map(|p| p.1)) } else { linear_axis(all.iter().map(|p| p.1)) };

    root.fill(&WHITE).map_err(draw_err)?;
    let root = root.titled(&chart.title(), (FAMILY, 22)).map_err(draw_err)?;
    let root = root.titled(&chart.config, (FAMILY, 14)).map_err(draw_err)?;
    let mut ctx = ChartBuilder::on(&root)
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(84)
        .build_cartesian_2d(Axis::new(x, x_keys), Axis::new(y, y_keys))
        .map_err(draw_err)?;
    ctx.configure_mesh()
        .x_desc("Message size (bytes)")
        .y_desc(chart.y_label())
        .x_label_formatter(&|e| format_size(2f64.powf(*e).round() as u64))
        .y_label_formatter(&|v| if log_y { decade(*v) } else { plain(*v) })
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .bold_line_style(BLACK.mix(0.12))
        .draw()
        .map_err(draw_err)?;
    for (k, (series, points)) in lines.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        ctx.draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2)))
            .map_err(draw_err)?
            .label(series.label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 18, y + 4)], colour.filled()));
        ctx.draw_series(points.iter().map(|p| Circle::new(*p, 3, colour.filled()))).map_err(draw_err)?;
    }
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// A linear f64 axis with ticks exactly where we say (plotters'
/// `with_key_points` over its f64 axis loses the label formatter).
struct Axis {
    range: Range<f64>,
    keys: Vec<f64>,
}

impl Axis {
    fn new(range: Range<f64>, keys: Vec<f64>) -> Axis {
        Axis { range, keys }
    }
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let frac = if span > 0.0 { (value - self.range.start) / span } else { 0.5 };
        limit.0 + (frac * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Bold lines and labels at our ticks; no light lines in between.
        if hint.weight().allow_light_points() { Vec::new() } else { self.keys.clone() }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

/// The x range in log2(size) and a label at each power of two (every
/// second or fourth one when there are many).
fn x_axis(xs: impl Iterator<Item = f64> + Clone) -> (Range<f64>, Vec<f64>) {
    let (lo, hi) = bounds(xs);
    let (lo, hi) = if hi - lo < 1.0 { (lo - 1.0, hi + 1.0) } else { (lo - 0.3, hi + 0.3) };
    let first = lo.ceil() as i64;
    let last = hi.floor() as i64;
    let step = ((last - first) / 24 + 1).max(1);
    let keys = (first..=last).step_by(step as usize).map(|e| e as f64).collect();
    (lo..hi, keys)
}

/// A linear range from 0 to a little above the largest value, with round
/// ticks.
fn linear_axis(ys: impl Iterator<Item = f64> + Clone) -> (Range<f64>, Vec<f64>) {
    let (_, max) = bounds(ys);
    let max = if max > 0.0 { max } else { 1.0 };
    let raw = max / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].into_iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let top = max * 1.08;
    let keys = (0..).map(|k| k as f64 * step).take_while(|t| *t <= top).collect();
    (0.0..top, keys)
}

/// A range in log10(value), whole decades, a tick at each.
fn log_axis(ys: impl Iterator<Item = f64> + Clone) -> (Range<f64>, Vec<f64>) {
    let (lo, hi) = bounds(ys);
    let (lo, hi) = (lo.floor(), hi.ceil().max(lo.floor() + 1.0));
    let keys = (lo as i64..=hi as i64).map(|e| e as f64).collect();
    (lo..hi, keys)
}

fn bounds(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)))
}

/// `10^e` written out: `0.01`, `1`, `1000`, `1e+06`.
fn decade(e: f64) -> String {
    let e = e.round() as i32;
    match e {
        -3..0 => format!("{:.*}", (-e) as usize, 10f64.powi(e)),
        0..=5 => format!("{}", 10u64.pow(e as u32)),
        _ => format!("1e{e}"),
    }
}

/// A tick value without trailing zeros: `2500`, `0.5`.
fn plain(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_from_extension() {
        assert_eq!(PlotFormat::from_path(Path::new("a/b.svg")), Ok(PlotFormat::Svg));
        assert_eq!(PlotFormat::from_path(Path::new("b.PNG")), Ok(PlotFormat::Png));
        for bad in ["b.jpg", "b", "svg", "b.svg.txt"] {
            assert_eq!(PlotFormat::from_path(Path::new(bad)), Err(PlotError::UnknownFormat(bad.into())));
        }
    }

    #[test]
    fn missing_directory_is_named() {
        let e = check_path(Path::new("/nonexistent-multirail-dir/x.svg")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "'/nonexistent-multirail-dir/x.svg': directory '/nonexistent-multirail-dir' does not exist"
        );
        assert_eq!(check_path(Path::new("here.png")), Ok(PlotFormat::Png));
    }

    #[test]
    fn axes() {
        let (r, keys) = x_axis([0.0, 22.0].into_iter());
        assert_eq!(r, -0.3..22.3);
        assert_eq!(keys.len(), 23);
        let (r, keys) = x_axis([20.0].into_iter());
        assert_eq!((r, keys), (19.0..21.0, vec![19.0, 20.0, 21.0]));
        let (r, keys) = linear_axis([3.0, 1000.0].into_iter());
        assert_eq!(r, 0.0..1080.0);
        assert_eq!(keys, vec![0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]);
        let (r, keys) = log_axis([0.3f64.log10(), 1500f64.log10()].into_iter());
        assert_eq!(r, -1.0..4.0);
        assert_eq!(keys, vec![-1.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
        assert_eq!([decade(-2.0), decade(0.0), decade(3.0), decade(7.0)], ["0.01", "1", "1000", "1e7"]);
        assert_eq!([plain(2500.0), plain(0.5), plain(12.25)], ["2500", "0.5", "12.25"]);
    }
}
