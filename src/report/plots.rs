//! PNG charts for the report: stacked line panels and a heat map, drawn with plotters into an
//! RGB buffer and encoded with `png`.
//!
//! Text needs a font, and plotters' `ab_glyph` backend reads one from memory rather than asking
//! fontconfig. [`font_available`] loads the first readable font of [`FONT_CANDIDATES`] (or the
//! file named by `CORVID_REPORT_FONT`) once per process. On a machine with none of them the
//! charts are drawn without any text (no titles, ticks or legends): the curves and the heat map
//! still carry the data, and the HTML page names each chart in its caption.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

/// Environment variable naming a TrueType/OpenType font file to use first.
pub const FONT_ENV: &str = "CORVID_REPORT_FONT";

/// Font files tried in order (Debian/Ubuntu, Fedora, Arch, macOS, Windows).
pub const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Font family name the charts ask plotters for.
const FAMILY: &str = "sans-serif";

/// Chart width in pixels.
pub const WIDTH: u32 = 960;
/// Height of one line panel in pixels.
pub const PANEL_HEIGHT: u32 = 320;

/// Whether a font was found and registered (first call loads it).
pub fn font_available() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        let from_env = std::env::var_os(FONT_ENV).map(std::path::PathBuf::from);
        let candidates = from_env
            .into_iter()
            .chain(FONT_CANDIDATES.iter().map(std::path::PathBuf::from));
        for path in candidates {
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            // plotters keeps fonts for the life of the process; this runs at most once.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font(FAMILY, FontStyle::Normal, bytes).is_ok() {
                tracing::debug!(font = %path.display(), "report charts use this font");
                return true;
            }
        }
        tracing::warn!(
            "no font found for the report charts (set {FONT_ENV}); drawing them without text"
        );
        false
    })
}

/// One curve: `(x, y)` points; `None` or non-finite `y` values are left out.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points in x order.
    pub points: Vec<(f64, Option<f64>)>,
}

impl Series {
    fn finite(&self) -> Vec<(f64, f64)> {
        self.points
            .iter()
            .filter_map(|&(x, y)| y.map(|y| (x, y)))
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect()
    }
}

/// One chart panel: axes, curves and how to draw them.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Panel title.
    pub title: String,
    /// X axis description.
    pub x_label: String,
    /// Y axis description.
    pub y_label: String,
    /// Curves.
    pub series: Vec<Series>,
    /// Fixed y range (e.g. `[0, 1]` for rates); `None` fits the data.
    pub y_range: Option<(f64, f64)>,
    /// How the curves are drawn.
    pub shape: Shape,
}

/// How a [`Panel`] draws its curves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Lines through the points, with markers where there are few.
    Line,
    /// A staircase (a value holds until the next point), for levels.
    Staircase,
    /// Markers only: the x values are categories, which a line between them would misread
    /// as a scale.
    Points,
}

impl Panel {
    /// Whether any curve has a finite point.
    pub fn has_data(&self) -> bool {
        self.series.iter().any(|s| !s.finite().is_empty())
    }
}

/// `n` distinct, readable line colours (tab10).
fn colour(i: usize) -> RGBColor {
    const TAB10: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    let (r, g, b) = TAB10[i % TAB10.len()];
    RGBColor(r, g, b)
}

/// Viridis, linearly interpolated between 11 anchors; `t` in `[0, 1]`.
#[allow(clippy::approx_constant)] // 0.318 is a green level of the colormap, not 1/π.
pub fn viridis(t: f64) -> RGBColor {
    const V: [(f64, f64, f64); 11] = [
        (0.267, 0.005, 0.329),
        (0.283, 0.141, 0.458),
        (0.254, 0.265, 0.530),
        (0.207, 0.372, 0.553),
        (0.164, 0.471, 0.558),
        (0.128, 0.567, 0.551),
        (0.135, 0.659, 0.518),
        (0.267, 0.749, 0.441),
        (0.478, 0.821, 0.318),
        (0.741, 0.873, 0.150),
        (0.993, 0.906, 0.144),
    ];
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let pos = t * (V.len() - 1) as f64;
    let i = (pos.floor() as usize).min(V.len() - 2);
    let f = pos - i as f64;
    let mix = |a: f64, b: f64| ((a + (b - a) * f) * 255.0).round() as u8;
    RGBColor(
        mix(V[i].0, V[i + 1].0),
        mix(V[i].1, V[i + 1].1),
        mix(V[i].2, V[i + 1].2),
    )
}

/// A range around `[lo, hi]` with 5 % padding; a single value gets a unit-wide range.
fn padded(lo: f64, hi: f64) -> (f64, f64) {
    if !(lo.is_finite() && hi.is_finite()) {
        return (0.0, 1.0);
    }
    let pad = if (hi - lo).abs() < 1e-12 {
        if lo.abs() > 1e-12 {
            lo.abs() * 0.1
        } else {
            0.5
        }
    } else {
        (hi - lo) * 0.05
    };
    let (a, b) = (lo - pad, hi + pad);
    // Values near f64's limits overflow the span: a chart of them would never finish.
    if a.is_finite() && b.is_finite() && (b - a).is_finite() {
        (a, b)
    } else {
        (0.0, 1.0)
    }
}

fn bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

/// A staircase through `pts`: each value holds until the next x.
fn staircase(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(pts.len() * 2);
    for (i, &(x, y)) in pts.iter().enumerate() {
        if i > 0 {
            out.push((x, pts[i - 1].1));
        }
        out.push((x, y));
    }
    out
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// Draws into an RGB buffer and writes it as PNG. `draw(area, text)` draws with text when a
/// font is loaded; if drawing with text fails it is redrawn without.
fn render(
    path: &Path,
    (w, h): (u32, u32),
    text: bool,
    draw: impl Fn(&Area<'_>, bool) -> Result<()>,
) -> Result<()> {
    let mut buf = vec![255u8; (w as usize) * (h as usize) * 3];
    let attempt = |buf: &mut [u8], text: bool| -> Result<()> {
        let area = BitMapBackend::with_buffer(buf, (w, h)).into_drawing_area();
        area.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        draw(&area, text)?;
        area.present().map_err(|e| anyhow!("{e}"))
    };
    if let Err(e) = attempt(&mut buf, text) {
        if !text {
            return Err(e).with_context(|| format!("drawing {}", path.display()));
        }
        tracing::warn!(chart = %path.display(), "drawing with text failed ({e:#}); drawing without");
        buf.fill(255);
        attempt(&mut buf, false).with_context(|| format!("drawing {}", path.display()))?;
    }
    write_png(path, w, h, &buf)
}

/// Writes an 8-bit RGB image.
pub fn write_png(path: &Path, w: u32, h: u32, rgb: &[u8]) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::new(file);
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc
        .write_header()
        .with_context(|| format!("encoding {}", path.display()))?;
    writer
        .write_image_data(rgb)
        .with_context(|| format!("encoding {}", path.display()))?;
    writer
        .finish()
        .with_context(|| format!("encoding {}", path.display()))?;
    out.flush()
        .with_context(|| format!("writing {}", path.display()))
}

/// Stacked line panels, one above the other, into a PNG at `path`.
pub fn line_panels(path: &Path, panels: &[Panel]) -> Result<()> {
    line_panels_with(path, panels, font_available())
}

fn line_panels_with(path: &Path, panels: &[Panel], text: bool) -> Result<()> {
    anyhow::ensure!(!panels.is_empty(), "no panel to draw in {}", path.display());
    let h = PANEL_HEIGHT * panels.len() as u32;
    render(path, (WIDTH, h), text, |root, text| {
        let areas = root.split_evenly((panels.len(), 1));
        for (area, panel) in areas.iter().zip(panels) {
            draw_panel(area, panel, text)?;
        }
        Ok(())
    })
}

fn draw_panel(area: &Area<'_>, panel: &Panel, text: bool) -> Result<()> {
    // (series index for its colour, series, points to draw)
    struct Curve<'s> {
        index: usize,
        series: &'s Series,
        pts: Vec<(f64, f64)>,
    }
    let curves: Vec<Curve<'_>> = panel
        .series
        .iter()
        .enumerate()
        .map(|(index, series)| {
            let pts = series.finite();
            let pts = match panel.shape {
                Shape::Staircase => staircase(&pts),
                Shape::Line | Shape::Points => pts,
            };
            Curve { index, series, pts }
        })
        .filter(|c| !c.pts.is_empty())
        .collect();
    let all = || curves.iter().flat_map(|c| c.pts.iter().copied());
    let (x0, x1) = bounds(all().map(|p| p.0)).unwrap_or((0.0, 1.0));
    let (x0, x1) = if panel.shape == Shape::Points {
        // Categories: half a step either side, so no marker sits on the frame.
        (x0 - 0.5, x1 + 0.5)
    } else if (x1 - x0).abs() < 1e-12 {
        padded(x0, x1)
    } else {
        (x0, x1)
    };
    let (y0, y1) = match panel.y_range {
        Some(r) => r,
        None => {
            let (lo, hi) = bounds(all().map(|p| p.1)).unwrap_or((0.0, 1.0));
            padded(lo, hi)
        }
    };

    let mut builder = ChartBuilder::on(area);
    builder.margin(10).margin_right(24);
    if text {
        builder
            .caption(&panel.title, (FAMILY, 18))
            .x_label_area_size(40)
            .y_label_area_size(64);
    } else {
        builder.margin_left(24).margin_bottom(24);
    }
    let mut chart = builder
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| anyhow!("{e}"))?;
    let mut mesh = chart.configure_mesh();
    mesh.light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(210, 210, 210));
    if text {
        mesh.x_desc(panel.x_label.as_str())
            .y_desc(panel.y_label.as_str())
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 14))
            .x_label_formatter(&|v| format_tick(*v))
            .y_label_formatter(if panel.shape == Shape::Staircase {
                &integer_tick
            } else {
                &|v| format_tick(*v)
            });
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(|e| anyhow!("{e}"))?;

    let legend = text && curves.len() > 1;
    for Curve { index, series, pts } in &curves {
        let c = colour(*index);
        let style = c.stroke_width(2);
        if panel.shape == Shape::Points {
            let drawn = chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 5, c.filled())))
                .map_err(|e| anyhow!("{e}"))?;
            if legend {
                drawn
                    .label(series.label.as_str())
                    .legend(move |(x, y)| Circle::new((x + 9, y), 5, c.filled()));
            }
            continue;
        }
        let drawn = chart
            .draw_series(LineSeries::new(pts.iter().copied(), style))
            .map_err(|e| anyhow!("{e}"))?;
        if legend {
            drawn
                .label(series.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        }
        // Sparse curves (a few held-out losses, a short run) also get markers.
        if pts.len() <= 40 {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
                .map_err(|e| anyhow!("{e}"))?;
        }
    }
    if legend {
        chart
            .configure_series_labels()
            .position(legend_corner(
                curves.iter().flat_map(|c| c.pts.iter().copied()),
                (x0, x1),
                (y0, y1),
            ))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .label_font((FAMILY, 13))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
    }
    Ok(())
}

/// The corner whose quarter-width, third-height box holds the fewest points (ties: upper left).
fn legend_corner(
    pts: impl Iterator<Item = (f64, f64)>,
    (x0, x1): (f64, f64),
    (y0, y1): (f64, f64),
) -> SeriesLabelPosition {
    // [upper left, upper right, lower left, lower right]
    let mut counts = [0usize; 4];
    for (x, y) in pts {
        let fx = (x - x0) / (x1 - x0);
        let fy = (y - y0) / (y1 - y0);
        let (left, right) = (fx <= 0.3, fx >= 0.7);
        let (top, bottom) = (fy >= 0.62, fy <= 0.38);
        counts[0] += (left && top) as usize;
        counts[1] += (right && top) as usize;
        counts[2] += (left && bottom) as usize;
        counts[3] += (right && bottom) as usize;
    }
    let best = (0..4).min_by_key(|&i| counts[i]).unwrap_or(0);
    [
        SeriesLabelPosition::UpperLeft,
        SeriesLabelPosition::UpperRight,
        SeriesLabelPosition::LowerLeft,
        SeriesLabelPosition::LowerRight,
    ][best]
        .clone()
}

/// Tick labels for integer-valued axes (levels): blank between integers.
fn integer_tick(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-6 {
        format!("{}", v.round() as i64)
    } else {
        String::new()
    }
}

fn format_tick(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e4).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s == "-0" {
            "0".into()
        } else {
            s.into()
        }
    }
}

/// A heat map: `rows[r][c]` coloured on `[0, scale_max]` with viridis, row `r` drawn from the
/// top, and a colour bar. Rows may differ in length; absent cells stay white.
#[derive(Debug, Clone)]
pub struct HeatMap {
    /// Title.
    pub title: String,
    /// X axis description (columns).
    pub x_label: String,
    /// Y axis description (rows).
    pub y_label: String,
    /// Values `[R][C]`.
    pub rows: Vec<Vec<f64>>,
    /// Value drawn in the brightest colour.
    pub scale_max: f64,
}

/// Draws a heat map into a PNG at `path`.
pub fn heat_map(path: &Path, map: &HeatMap) -> Result<()> {
    heat_map_with(path, map, font_available())
}

fn heat_map_with(path: &Path, map: &HeatMap, text: bool) -> Result<()> {
    let n_rows = map.rows.len();
    let n_cols = map.rows.iter().map(Vec::len).max().unwrap_or(0);
    anyhow::ensure!(
        n_rows > 0 && n_cols > 0,
        "no cell to draw in {}",
        path.display()
    );
    anyhow::ensure!(
        map.scale_max.is_finite() && map.scale_max > 0.0,
        "heat-map scale must be a positive number, got {}",
        map.scale_max
    );
    let h = (120 + 36 * n_rows as u32).clamp(260, 1400);
    render(path, (WIDTH, h), text, |root, text| {
        let (main, bar) = root.split_horizontally(WIDTH - 130);

        let mut builder = ChartBuilder::on(&main);
        builder.margin(10);
        if text {
            builder
                .caption(&map.title, (FAMILY, 18))
                .x_label_area_size(40)
                .y_label_area_size(56);
        }
        let mut chart = builder
            .build_cartesian_2d(-0.5..(n_cols as f64 - 0.5), (n_rows as f64 - 0.5)..-0.5)
            .map_err(|e| anyhow!("{e}"))?;
        let mut mesh = chart.configure_mesh();
        mesh.disable_mesh();
        if text {
            mesh.x_desc(map.x_label.as_str())
                .y_desc(map.y_label.as_str())
                .x_labels(n_cols.min(32))
                .y_labels(n_rows.min(32))
                .x_label_formatter(&integer_tick)
                .y_label_formatter(&integer_tick)
                .label_style((FAMILY, 13))
                .axis_desc_style((FAMILY, 14));
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw().map_err(|e| anyhow!("{e}"))?;
        let cells = map.rows.iter().enumerate().flat_map(|(r, row)| {
            row.iter().enumerate().map(move |(c, &v)| {
                let (x, y) = (c as f64, r as f64);
                Rectangle::new(
                    [(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)],
                    viridis(v / map.scale_max).filled(),
                )
            })
        });
        chart.draw_series(cells).map_err(|e| anyhow!("{e}"))?;

        // Colour bar: value on the y axis.
        let mut builder = ChartBuilder::on(&bar);
        builder.margin(10).margin_top(if text { 40 } else { 10 });
        if text {
            builder.y_label_area_size(56).x_label_area_size(40);
        }
        let mut cb = builder
            .build_cartesian_2d(0.0..1.0, 0.0..map.scale_max)
            .map_err(|e| anyhow!("{e}"))?;
        let mut mesh = cb.configure_mesh();
        mesh.disable_mesh().x_labels(0);
        if text {
            mesh.y_labels(6)
                .label_style((FAMILY, 12))
                .y_label_formatter(&|v| format_tick(*v));
        } else {
            mesh.y_labels(0);
        }
        mesh.draw().map_err(|e| anyhow!("{e}"))?;
        let steps = 64;
        let bar_cells = (0..steps).map(|i| {
            let lo = map.scale_max * i as f64 / steps as f64;
            let hi = map.scale_max * (i + 1) as f64 / steps as f64;
            Rectangle::new(
                [(0.0, lo), (1.0, hi)],
                viridis((i as f64 + 0.5) / steps as f64).filled(),
            )
        });
        cb.draw_series(bar_cells).map_err(|e| anyhow!("{e}"))?;
        Ok(())
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Decodes a PNG completely (header, every chunk's CRC, the zlib stream) and returns its size.
    pub(crate) fn decode_png(path: &Path) -> (u32, u32) {
        let file =
            std::fs::File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        let decoder = png::Decoder::new(std::io::BufReader::new(file));
        let mut reader = decoder
            .read_info()
            .unwrap_or_else(|e| panic!("{} has no PNG header: {e}", path.display()));
        let mut buf = vec![0; reader.output_buffer_size().expect("image size fits memory")];
        let info = reader
            .next_frame(&mut buf)
            .unwrap_or_else(|e| panic!("{} does not decode: {e}", path.display()));
        (info.width, info.height)
    }

    #[test]
    fn ranges_are_finite_whatever_the_values() {
        assert_eq!(padded(0.0, 10.0), (-0.5, 10.5));
        assert_eq!(padded(2.0, 2.0), (1.8, 2.2));
        for (lo, hi) in [(-1e308, 1e308), (f64::MAX, f64::MAX), (f64::NAN, 1.0)] {
            let (a, b) = padded(lo, hi);
            assert!(a.is_finite() && b.is_finite() && (b - a).is_finite() && a < b);
        }
    }

    fn panel(shape: Shape) -> Panel {
        Panel {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![
                Series {
                    label: "a".into(),
                    points: vec![
                        (0.0, Some(1.0)),
                        (1.0, None),
                        (2.0, Some(f64::NAN)),
                        (3.0, Some(3.0)),
                    ],
                },
                Series {
                    label: "b".into(),
                    points: vec![(1.0, Some(2.0))],
                },
            ],
            y_range: None,
            shape,
        }
    }

    #[test]
    fn charts_draw_without_any_font() {
        // `text = false` must not touch plotters' font table: with no font registered any
        // text call fails. Run alone (no other test has registered a font in the process),
        // this shows the charts need no font at all.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lines.png");
        line_panels_with(
            &p,
            &[
                panel(Shape::Line),
                panel(Shape::Staircase),
                panel(Shape::Points),
            ],
            false,
        )
        .unwrap();
        assert_eq!(decode_png(&p), (WIDTH, 3 * PANEL_HEIGHT));
        let h = dir.path().join("heat.png");
        let map = HeatMap {
            title: "h".into(),
            x_label: "expert".into(),
            y_label: "layer".into(),
            rows: vec![vec![0.5, 0.25, 0.25], vec![1.0]],
            scale_max: 1.0,
        };
        heat_map_with(&h, &map, false).unwrap();
        assert_eq!(decode_png(&h).0, WIDTH);
    }

    #[test]
    fn charts_draw_with_text_when_a_font_exists() {
        let dir = tempfile::tempdir().unwrap();
        let with = dir.path().join("with.png");
        let without = dir.path().join("without.png");
        line_panels_with(&with, &[panel(Shape::Line)], font_available()).unwrap();
        line_panels_with(&without, &[panel(Shape::Line)], false).unwrap();
        assert_eq!(decode_png(&with), (WIDTH, PANEL_HEIGHT));
        if font_available() {
            // Titles and ticks change pixels: the two images differ.
            assert_ne!(
                std::fs::read(&with).unwrap(),
                std::fs::read(&without).unwrap()
            );
        }
    }

    #[test]
    fn empty_inputs_are_errors_not_blank_images() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.png");
        assert!(line_panels_with(&p, &[], false).is_err());
        let map = HeatMap {
            title: "h".into(),
            x_label: "e".into(),
            y_label: "l".into(),
            rows: vec![],
            scale_max: 1.0,
        };
        assert!(heat_map_with(&p, &map, false).is_err());
    }

    #[test]
    fn staircase_holds_each_value_until_the_next_x() {
        assert_eq!(
            staircase(&[(0.0, 1.0), (2.0, 2.0), (5.0, 4.0)]),
            vec![(0.0, 1.0), (2.0, 1.0), (2.0, 2.0), (5.0, 2.0), (5.0, 4.0)]
        );
    }

    #[test]
    fn viridis_ends_and_clamps() {
        assert_eq!(viridis(0.0), RGBColor(68, 1, 84));
        assert_eq!(viridis(1.0), RGBColor(253, 231, 37));
        assert_eq!(viridis(7.0), viridis(1.0));
        assert_eq!(viridis(f64::NAN), viridis(0.0));
    }

    #[test]
    fn the_legend_goes_to_the_emptiest_corner() {
        // A rising line fills lower left and upper right.
        let rising = (0..=10).map(|i| (i as f64, i as f64));
        assert!(matches!(
            legend_corner(rising, (0.0, 10.0), (0.0, 10.0)),
            SeriesLabelPosition::UpperLeft
        ));
        // A falling line fills upper left and lower right.
        let falling = (0..=10).map(|i| (i as f64, 10.0 - i as f64));
        assert!(matches!(
            legend_corner(falling, (0.0, 10.0), (0.0, 10.0)),
            SeriesLabelPosition::UpperRight
        ));
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(format_tick(0.5), "0.5");
        assert_eq!(format_tick(0.0), "0");
        assert_eq!(format_tick(250.0), "250");
        assert_eq!(format_tick(0.0001), "1.0e-4");
        assert_eq!(integer_tick(&3.0), "3");
        assert_eq!(integer_tick(&3.5), "");
    }
}
