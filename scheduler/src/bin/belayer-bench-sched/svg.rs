//! The trade-off plot, written by hand: visible overhead (x, linear) against expected work lost
//! per failure (y, logarithmic), one point per policy with 95 % confidence bars.

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
    let lo = rows
        .iter()
        .map(|r| r.lost_per_failure_s)
        .filter(|&y| y > 0.0)
        .fold(f64::INFINITY, f64::min);
    let hi = rows
        .iter()
        .map(|r| r.lost_per_failure_s + r.lost_ci95)
        .fold(0.0, f64::max);
    let (dmin, dmax) = decades(lo, hi);
    let px = |x: f64| L + x / xmax * (W - L - R);
    let py = |y: f64| {
        let f = (y.max(10f64.powi(dmin)).log10() - f64::from(dmin)) / f64::from(dmax - dmin);
        H - B - f * (H - T - B)
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"25\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
        W / 2.0,
        esc(title)
    );
    for i in 0..=5 {
        let x = xmax * f64::from(i) / 5.0;
        s += &format!(
            "<line x1=\"{0}\" y1=\"{T}\" x2=\"{0}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{0}\" y=\"{2}\" text-anchor=\"middle\">{3}</text>\n",
            px(x),
            H - B,
            H - B + 18.0,
            fmt(x)
        );
    }
    let ticks = (dmin..=dmax).flat_map(|d| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(d)));
    for y in ticks.filter(|&y| y <= 10f64.powi(dmax) * 1.001) {
        s += &format!(
            "<line x1=\"{L}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#ddd\"/><text x=\"{2}\" y=\"{3}\" text-anchor=\"end\">{4}</text>\n",
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
         <text transform=\"translate(22 {}) rotate(-90)\" text-anchor=\"middle\">expected work lost per failure (s, log)</text>\n",
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
             <circle cx=\"{x}\" cy=\"{y}\" r=\"5\" fill=\"{c}\" fill-opacity=\"0.8\"/>\n",
            px((r.overhead_pct - r.overhead_ci95).max(0.0)),
            px(r.overhead_pct + r.overhead_ci95),
            py((r.lost_per_failure_s - r.lost_ci95).max(0.0)),
            py(r.lost_per_failure_s + r.lost_ci95),
        );
        let ly = T + 16.0 + 18.0 * i as f64;
        s += &format!(
            "<circle cx=\"{}\" cy=\"{}\" r=\"5\" fill=\"{c}\"/><text x=\"{}\" y=\"{ly}\">{}</text>\n",
            W - R + 18.0,
            ly - 4.0,
            W - R + 28.0,
            esc(&r.policy)
        );
    }
    s + "</svg>\n"
}

/// Decade exponents spanning [lo, hi], at least one decade apart.
fn decades(lo: f64, hi: f64) -> (i32, i32) {
    if !lo.is_finite() || lo <= 0.0 || hi <= 0.0 {
        return (0, 1);
    }
    let a = lo.log10().floor() as i32;
    let b = (hi.log10().ceil() as i32).max(a + 1);
    (a, b)
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
        assert_eq!(decades(9.6, 334.0), (0, 3));
        assert_eq!(decades(10.0, 10.0), (1, 2));
        assert_eq!(decades(f64::INFINITY, 0.0), (0, 1));
    }
}
