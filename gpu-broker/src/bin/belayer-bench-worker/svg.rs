//! A small hand-written SVG plot: rebuild time against in-flight tokens, one series per request
//! count, with cold start and takeover as horizontal reference lines.

use std::fmt::Write;

use crate::report::Rebuild;

pub fn plot(rebuild: &[Rebuild], cold_s: f64, takeover_s: f64) -> String {
    let (w, h, l, r, t, b) = (720.0, 420.0, 70.0, 170.0, 30.0, 50.0);
    let xmax = rebuild
        .iter()
        .map(|p| (p.requests * p.tokens) as f64)
        .fold(1.0, f64::max)
        * 1.05;
    let ymax = rebuild.iter().map(|p| p.seconds).fold(cold_s, f64::max) * 1.1;
    let x = |v: f64| l + v / xmax * (w - l - r);
    let y = |v: f64| h - b - v / ymax * (h - t - b);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="18" text-anchor="middle" font-size="14">Shadow takeover: KV rebuild by prefill vs. cold start</text>
<line x1="{l}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{l}" y1="{t}" x2="{l}" y2="{}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">in-flight tokens rebuilt (requests × tokens)</text>
<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">seconds</text>
"#,
        w / 2.0,
        h - b,
        w - r,
        h - b,
        h - b,
        (l + w - r) / 2.0,
        h - 12.0,
        h / 2.0,
        h / 2.0
    );
    for i in 0..=5 {
        let v = ymax * f64::from(i) / 5.0;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{v:.2}</text>"#,
            l - 6.0,
            y(v) + 4.0
        );
        let xv = xmax * f64::from(i) / 5.0;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{xv:.0}</text>"#,
            x(xv),
            h - b + 16.0
        );
    }
    let colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];
    let mut counts: Vec<usize> = rebuild.iter().map(|p| p.requests).collect();
    counts.sort_unstable();
    counts.dedup();
    for (ci, n) in counts.iter().enumerate() {
        let c = colors[ci % colors.len()];
        let pts: Vec<String> = rebuild
            .iter()
            .filter(|p| p.requests == *n)
            .map(|p| {
                format!(
                    "{:.1},{:.1}",
                    x((p.requests * p.tokens) as f64),
                    y(p.seconds)
                )
            })
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        for p in pts {
            let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(s, r#"<circle cx="{px}" cy="{py}" r="3" fill="{c}"/>"#);
        }
        let ly = t + 20.0 + ci as f64 * 18.0;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="4" fill="{c}"/><text x="{}" y="{}">{n} requests</text>"#,
            w - r + 12.0,
            ly - 4.0,
            w - r + 30.0,
            ly
        );
    }
    for (v, label, c) in [
        (cold_s, "cold start", "#555"),
        (takeover_s, "takeover (no rebuild)", "#9467bd"),
    ] {
        let _ = writeln!(
            s,
            r#"<line x1="{l}" y1="{0}" x2="{1}" y2="{0}" stroke="{c}" stroke-dasharray="6 4"/><text x="{2}" y="{3}" fill="{c}">{label} {v:.3}s</text>"#,
            y(v),
            w - r,
            w - r + 6.0,
            y(v) + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}
