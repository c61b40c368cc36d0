//! The trade-off plot, written by hand: visible overhead (x) against expected work lost per
//! failure (y), one labelled point per policy.

use crate::report::Row;

const W: f64 = 720.0;
const H: f64 = 480.0;
const L: f64 = 80.0;
const R: f64 = 170.0;
const T: f64 = 50.0;
const B: f64 = 60.0;

/// The SVG document.
pub fn plot(rows: &[Row], title: &str) -> String {
    let xmax = nice(
        rows.iter()
            .map(|r| r.overhead_pct + r.overhead_ci95)
            .fold(0.0, f64::max),
    );
    let ymax = nice(
        rows.iter()
            .map(|r| r.lost_per_failure_s + r.lost_ci95)
            .fold(0.0, f64::max),
    );
    let px = |x: f64| L + x / xmax * (W - L - R);
    let py = |y: f64| H - B - y / ymax * (H - T - B);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"25\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
        W / 2.0,
        esc(title)
    );
    for i in 0..=5 {
        let (x, y) = (xmax * i as f64 / 5.0, ymax * i as f64 / 5.0);
        s += &format!(
            "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#ddd\"/><text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
            px(x),
            T,
            H - B,
            H - B + 18.0,
            fmt(x)
        );
        s += &format!(
            "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{3}\" y=\"{4}\" text-anchor=\"end\">{5}</text>\n",
            L,
            py(y),
            W - R,
            L - 6.0,
            py(y) + 4.0,
            fmt(y)
        );
    }
    s += &format!(
        "<rect x=\"{L}\" y=\"{T}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">visible overhead (% of episode time)</text>\n\
         <text transform=\"translate(22 {}) rotate(-90)\" text-anchor=\"middle\">expected work lost per failure (s)</text>\n",
        W - L - R,
        H - T - B,
        (L + W - R) / 2.0,
        H - 15.0,
        (T + H - B) / 2.0
    );
    const COLORS: [&str; 8] = [
        "#d62728", "#ff7f0e", "#1f77b4", "#17becf", "#2ca02c", "#9467bd", "#8c564b", "#7f7f7f",
    ];
    for (i, r) in rows.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let (x, y) = (px(r.overhead_pct), py(r.lost_per_failure_s));
        s += &format!(
            "<line x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{c}\"/><line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" stroke=\"{c}\"/>\n\
             <circle cx=\"{x}\" cy=\"{y}\" r=\"5\" fill=\"{c}\"/>\n",
            px((r.overhead_pct - r.overhead_ci95).max(0.0)),
            px(r.overhead_pct + r.overhead_ci95),
            py((r.lost_per_failure_s - r.lost_ci95).max(0.0)),
            py(r.lost_per_failure_s + r.lost_ci95),
        );
        let ly = T + 16.0 + 18.0 * i as f64;
        s += &format!(
            "<circle cx=\"{}\" cy=\"{}\" r=\"5\" fill=\"{c}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
            W - R + 18.0,
            ly - 4.0,
            W - R + 28.0,
            ly,
            esc(&r.policy)
        );
    }
    s + "</svg>\n"
}

/// A round axis maximum ≥ `v`.
fn nice(v: f64) -> f64 {
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

fn fmt(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_axes() {
        assert_eq!(nice(0.0), 1.0);
        assert_eq!(nice(7.3), 10.0);
        assert_eq!(nice(0.18), 0.2);
        assert_eq!(nice(230.0), 250.0);
        assert_eq!(fmt(2.50), "2.5");
    }
}
