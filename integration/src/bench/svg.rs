//! A horizontal bar plot of the medians, every sample as a dot, written by hand as SVG.

use crate::bench::report::MEASURES;
use crate::bench::stats::Samples;

const WIDTH: f64 = 960.0;
const LABEL: f64 = 470.0;
const ROW: f64 = 30.0;
const TOP: f64 = 50.0;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('`', "")
}

fn colour(key: &str) -> &'static str {
    match key.split('_').next() {
        Some("replay") => "#888888",
        Some("containerd") => "#3b6fb6",
        Some("podman") => "#8e5bb5",
        _ => "#2e9e5b",
    }
}

/// The plot of every measurement that has samples; `title` goes on top.
pub fn plot(s: &Samples, title: &str) -> String {
    let rows: Vec<(&str, &str, f64)> = MEASURES
        .iter()
        .filter_map(|(key, label)| Some((*key, *label, s.median(key)?)))
        .collect();
    let max = rows
        .iter()
        .flat_map(|(key, _, m)| s.get(key).iter().copied().chain([*m]))
        .fold(0.0_f64, f64::max)
        .max(1e-3);
    let scale = (WIDTH - LABEL - 70.0) / max;
    let height = TOP + ROW * rows.len() as f64 + 40.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n\
         <text x=\"10\" y=\"40\" fill=\"#555\">bars: medians; dots: every sample; seconds (lower is better)</text>\n",
        escape(title)
    );
    for (i, (key, label, median)) in rows.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let w = (median * scale).max(1.0);
        svg.push_str(&format!(
            "<text x=\"{x}\" y=\"{ty}\" text-anchor=\"end\">{l}</text>\n\
             <rect x=\"{LABEL}\" y=\"{y}\" width=\"{w:.1}\" height=\"{h}\" fill=\"{c}\"/>\n\
             <text x=\"{vx:.1}\" y=\"{ty}\">{median:.2} s</text>\n",
            x = LABEL - 8.0,
            ty = y + ROW * 0.55,
            l = escape(label),
            h = ROW - 8.0,
            c = colour(key),
            vx = LABEL + s.get(key).iter().fold(w, |m, v| m.max(v * scale)) + 8.0,
        ));
        for v in s.get(key) {
            svg.push_str(&format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"black\" fill-opacity=\"0.6\"/>\n",
                LABEL + v * scale,
                y + (ROW - 8.0) / 2.0
            ));
        }
    }
    let axis = TOP + ROW * rows.len() as f64 + 4.0;
    svg.push_str(&format!(
        "<line x1=\"{LABEL}\" y1=\"{axis}\" x2=\"{x2:.1}\" y2=\"{axis}\" stroke=\"black\"/>\n\
         <text x=\"{LABEL}\" y=\"{t}\">0</text><text x=\"{x2:.1}\" y=\"{t}\" text-anchor=\"end\">{max:.2} s</text>\n</svg>\n",
        x2 = LABEL + max * scale,
        t = axis + 16.0,
    ));
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_what_has_samples() {
        let mut s = Samples::default();
        s.push("replay", 3.0);
        s.push("belayer_restore", 0.25);
        s.push("belayer_restore", 0.35);
        let svg = plot(&s, "a < b");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains("a &lt; b") && !svg.contains("podman"));
    }
}
