//! The benchmarks' plots, written by hand as SVG: horizontal bars (a median per row, every
//! sample as a dot) and an x–y chart (series of points, with optional lines, 95 % bars, a
//! logarithmic y axis and dashed reference lines).

use std::fmt::Write;

/// Colours the plots cycle through.
pub const COLOURS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#17becf", "#7f7f7f",
];

/// Escapes text for SVG (and drops Markdown's backquotes).
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('`', "")
}

fn head(w: f64, h: f64, title: &str, subtitle: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n\
         <text x=\"10\" y=\"40\" fill=\"#555\">{}</text>\n",
        escape(title),
        escape(subtitle)
    )
}

/// One row of a bar plot.
#[derive(Clone, Debug)]
pub struct Bar {
    pub label: String,
    /// The bar's length (a median).
    pub value: f64,
    /// Drawn as dots on the bar.
    pub samples: Vec<f64>,
    pub colour: &'static str,
}

/// Horizontal bars in `unit`, one row each, lower is better.
pub fn bars(title: &str, unit: &str, rows: &[Bar]) -> String {
    let (width, label, row, top) = (1000.0, 520.0, 28.0, 52.0);
    let max = rows
        .iter()
        .flat_map(|r| r.samples.iter().copied().chain([r.value]))
        .filter(|v| v.is_finite())
        .fold(1e-3, f64::max);
    let scale = (width - label - 80.0) / max;
    let height = top + row * rows.len() as f64 + 40.0;
    let subtitle = format!("bars: medians; dots: every sample; {unit} (lower is better)");
    let mut svg = head(width, height, title, &subtitle);
    for (i, r) in rows.iter().enumerate() {
        let y = top + row * i as f64;
        let w = (r.value * scale).max(1.0);
        let end = r.samples.iter().fold(w, |m, v| m.max(v * scale));
        let _ = writeln!(
            svg,
            "<text x=\"{x}\" y=\"{ty}\" text-anchor=\"end\">{l}</text><rect x=\"{label}\" y=\"{y}\" width=\"{w:.1}\" height=\"{h}\" fill=\"{c}\"/><text x=\"{vx:.1}\" y=\"{ty}\">{v:.2} {unit}</text>",
            x = label - 8.0,
            ty = y + row * 0.55,
            l = escape(&r.label),
            h = row - 8.0,
            c = r.colour,
            vx = label + end + 8.0,
            v = r.value,
        );
        for v in &r.samples {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"black\" fill-opacity=\"0.6\"/>",
                label + v * scale,
                y + (row - 8.0) / 2.0
            );
        }
    }
    let axis = top + row * rows.len() as f64 + 4.0;
    let _ = writeln!(
        svg,
        "<line x1=\"{label}\" y1=\"{axis}\" x2=\"{x2:.1}\" y2=\"{axis}\" stroke=\"black\"/><text x=\"{label}\" y=\"{t}\">0</text><text x=\"{x2:.1}\" y=\"{t}\" text-anchor=\"end\">{max:.2} {unit}</text>",
        x2 = label + max * scale,
        t = axis + 16.0,
    );
    svg + "</svg>\n"
}

/// A point with optional 95 % half-widths.
#[derive(Clone, Copy, Debug, Default)]
pub struct Point {
    pub x: f64,
    pub y: f64,
    pub x_err: f64,
    pub y_err: f64,
}

/// One named series of an x–y chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<Point>,
    /// Join the points with a line.
    pub line: bool,
}

/// An x–y chart.
#[derive(Clone, Debug, Default)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: Vec<Series>,
    /// Dashed horizontal lines: y, label.
    pub hlines: Vec<(f64, String)>,
}

/// A round axis maximum ≥ `v`.
pub fn nice(v: f64) -> f64 {
    if v.is_nan() || v <= 0.0 {
        return 1.0;
    }
    let e = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * e)
        .find(|&m| m >= v)
        .unwrap_or(10.0 * e)
}

/// Decade exponents spanning [lo, hi], at least one decade apart.
pub fn decades(lo: f64, hi: f64) -> (i32, i32) {
    if !lo.is_finite() || lo <= 0.0 || hi <= 0.0 {
        return (0, 1);
    }
    let a = lo.log10().floor() as i32;
    let b = (hi.log10().ceil() as i32).max(a + 1);
    (a, b)
}

/// A tick label: at most two decimals, no trailing zeros.
pub fn tick(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

impl Chart {
    /// The SVG document.
    pub fn svg(&self) -> String {
        let (w, h, l, r, t, b) = (760.0, 480.0, 80.0, 200.0, 56.0, 60.0);
        let points = || self.series.iter().flat_map(|s| s.points.iter());
        let xmax = nice(points().map(|p| p.x + p.x_err).fold(0.0, f64::max));
        let ys = || {
            points()
                .map(|p| p.y + p.y_err)
                .chain(self.hlines.iter().map(|h| h.0))
        };
        let ymax = nice(ys().fold(0.0, f64::max));
        let lo = points()
            .map(|p| p.y)
            .chain(self.hlines.iter().map(|h| h.0))
            .filter(|&y| y > 0.0)
            .fold(f64::INFINITY, f64::min);
        let (dmin, dmax) = decades(lo, ys().fold(0.0, f64::max));
        let px = |x: f64| l + x / xmax * (w - l - r);
        let py = |y: f64| {
            let f = if self.log_y {
                (y.max(10f64.powi(dmin)).log10() - f64::from(dmin)) / f64::from(dmax - dmin)
            } else {
                y / ymax
            };
            h - b - f * (h - t - b)
        };
        let mut s = head(w, h, &self.title, "");
        for i in 0..=5 {
            let x = xmax * f64::from(i) / 5.0;
            let _ = writeln!(
                s,
                "<line x1=\"{0}\" y1=\"{t}\" x2=\"{0}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{0}\" y=\"{2}\" text-anchor=\"middle\">{3}</text>",
                px(x),
                h - b,
                h - b + 18.0,
                tick(x)
            );
        }
        let yticks: Vec<f64> = if self.log_y {
            (dmin..=dmax)
                .flat_map(|d| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(d)))
                .filter(|&y| y <= 10f64.powi(dmax) * 1.001)
                .collect()
        } else {
            (0..=5).map(|i| ymax * f64::from(i) / 5.0).collect()
        };
        for y in yticks {
            let _ = writeln!(
                s,
                "<line x1=\"{l}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#ddd\"/><text x=\"{2}\" y=\"{3}\" text-anchor=\"end\">{4}</text>",
                py(y),
                w - r,
                l - 6.0,
                py(y) + 4.0,
                tick(y)
            );
        }
        let _ = writeln!(
            s,
            "<rect x=\"{l}\" y=\"{t}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n\
             <text transform=\"translate(22 {}) rotate(-90)\" text-anchor=\"middle\">{}{}</text>",
            w - l - r,
            h - t - b,
            (l + w - r) / 2.0,
            h - 15.0,
            escape(&self.x_label),
            (t + h - b) / 2.0,
            escape(&self.y_label),
            if self.log_y { " (log)" } else { "" },
        );
        for (i, series) in self.series.iter().enumerate() {
            let c = COLOURS[i % COLOURS.len()];
            if series.line && series.points.len() > 1 {
                let pts: Vec<String> = series
                    .points
                    .iter()
                    .map(|p| format!("{:.1},{:.1}", px(p.x), py(p.y)))
                    .collect();
                let _ = writeln!(
                    s,
                    "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
                    pts.join(" ")
                );
            }
            for p in &series.points {
                let (x, y) = (px(p.x), py(p.y));
                if p.x_err > 0.0 || p.y_err > 0.0 {
                    let _ = writeln!(
                        s,
                        "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{c}\"/><line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{c}\"/>",
                        px((p.x - p.x_err).max(0.0)),
                        px(p.x + p.x_err),
                        py((p.y - p.y_err).max(0.0)),
                        py(p.y + p.y_err),
                    );
                }
                let _ = writeln!(
                    s,
                    "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\" fill=\"{c}\" fill-opacity=\"0.8\"/>"
                );
            }
            let ly = t + 16.0 + 18.0 * i as f64;
            let _ = writeln!(
                s,
                "<circle cx=\"{}\" cy=\"{}\" r=\"5\" fill=\"{c}\"/><text x=\"{}\" y=\"{ly}\">{}</text>",
                w - r + 18.0,
                ly - 4.0,
                w - r + 28.0,
                escape(&series.name)
            );
        }
        for (y, label) in &self.hlines {
            let _ = writeln!(
                s,
                "<line x1=\"{l}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#555\" stroke-dasharray=\"6 4\"/><text x=\"{2}\" y=\"{3:.1}\" fill=\"#555\">{4}</text>",
                py(*y),
                w - r,
                w - r + 6.0,
                py(*y) + 4.0,
                escape(label)
            );
        }
        s + "</svg>\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes() {
        assert_eq!(nice(0.0), 1.0);
        assert_eq!(nice(7.3), 10.0);
        assert_eq!(nice(0.18), 0.2);
        assert_eq!(nice(230.0), 250.0);
        assert_eq!(tick(2.50), "2.5");
        assert_eq!(decades(9.6, 334.0), (0, 3));
        assert_eq!(decades(10.0, 10.0), (1, 2));
        assert_eq!(decades(f64::INFINITY, 0.0), (0, 1));
    }

    #[test]
    fn bars_and_chart() {
        let svg = bars(
            "a < b",
            "s",
            &[Bar {
                label: "x".into(),
                value: 1.0,
                samples: vec![0.5, 1.5],
                colour: "#888",
            }],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("a &lt; b"));
        let chart = Chart {
            title: "t".into(),
            log_y: true,
            series: vec![Series {
                name: "s".into(),
                points: vec![
                    Point {
                        x: 1.0,
                        y: 10.0,
                        y_err: 1.0,
                        ..Point::default()
                    },
                    Point {
                        x: 2.0,
                        y: 100.0,
                        ..Point::default()
                    },
                ],
                line: true,
            }],
            hlines: vec![(50.0, "ref".into())],
            ..Chart::default()
        }
        .svg();
        assert!(chart.contains("<polyline") && chart.contains("stroke-dasharray"));
        assert_eq!(chart.matches("<circle").count(), 3);
    }
}
