//! The report's plot: latency against concurrency, one panel per operation, as
//! hand-written SVG.

use std::fmt::Write as _;

use super::{ORDER, Report, key};
use crate::CONCURRENCIES;
use crate::load::{Op, Stats};

/// Latency (p50, solid; p99, dashed) against concurrency, one panel per operation.
pub fn plot(report: &Report) -> String {
    let (pw, ph, ml, mt, mb) = (300.0, 230.0, 55.0, 40.0, 40.0);
    let panels: Vec<&String> = report.operations.keys().collect();
    let ordered: Vec<&str> = Op::ALL
        .iter()
        .map(|o| o.name())
        .filter(|n| panels.iter().any(|p| p.as_str() == *n))
        .collect();
    let width = ordered.len() as f64 * (pw + ml) + 20.0;
    let height = ph + mt + mb + 30.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="16" font-size="13">Latency against concurrency (p50 solid, p99 dashed; median of {} rounds, {} cores)</text>"#,
        report.setup.rounds, report.setup.cores
    );
    let xs = |c: usize| (c as f64).log2() / 64f64.log2();
    for (i, op) in ordered.iter().enumerate() {
        let per_impl = &report.operations[*op];
        let x0 = 10.0 + ml + i as f64 * (pw + ml);
        let y0 = mt;
        let max = per_impl
            .values()
            .flat_map(|f| f.at.values().map(|s| s.p99_us))
            .fold(1.0f64, f64::max);
        let ymax = nice(max);
        let px = |c: usize| x0 + xs(c) * pw;
        let py = |us: f64| y0 + ph - (us / ymax) * ph;
        let _ = writeln!(
            svg,
            r##"<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#999"/><text x="{}" y="{}" text-anchor="middle" font-size="12">{op}</text>"##,
            x0 + pw / 2.0,
            y0 - 6.0
        );
        for t in 0..=4 {
            let v = ymax * t as f64 / 4.0;
            let _ = writeln!(
                svg,
                "<line x1=\"{x0}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{v:.0}</text>",
                x0 + pw,
                x0 - 4.0,
                py(v) + 4.0,
                y = py(v)
            );
        }
        for c in CONCURRENCIES {
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="middle">{c}</text>"#,
                px(c),
                y0 + ph + 14.0
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">in flight</text><text x="{}" y="{}" transform="rotate(-90 {} {})" text-anchor="middle">us</text>"#,
            x0 + pw / 2.0,
            y0 + ph + 28.0,
            x0 - 42.0,
            y0 + ph / 2.0,
            x0 - 42.0,
            y0 + ph / 2.0
        );
        for imp in ORDER {
            let Some(f) = per_impl.get(imp) else { continue };
            for (dash, pick) in [
                ("", (|s: &Stats| s.p50_us) as fn(&Stats) -> f64),
                (" stroke-dasharray=\"4 3\"", |s: &Stats| s.p99_us),
            ] {
                let points: Vec<String> = CONCURRENCIES
                    .iter()
                    .filter_map(|c| f.at.get(&key(*c)).map(|s| (*c, pick(s))))
                    .map(|(c, v)| format!("{:.1},{:.1}", px(c), py(v)))
                    .collect();
                let _ = writeln!(
                    svg,
                    r#"<polyline fill="none" stroke="{}" stroke-width="1.8"{dash} points="{}"/>"#,
                    color(imp),
                    points.join(" ")
                );
            }
        }
    }
    let mut lx = 10.0 + ml;
    for imp in ORDER {
        if !report.operations.values().any(|m| m.contains_key(imp)) {
            continue;
        }
        let ly = height - 10.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" x2="{}" y1="{}" y2="{}" stroke="{}" stroke-width="2"/><text x="{}" y="{ly}">{imp}</text>"#,
            lx + 20.0,
            ly - 4.0,
            ly - 4.0,
            color(imp),
            lx + 24.0
        );
        lx += 20.0 + 7.0 * imp.len() as f64 + 16.0;
    }
    svg.push_str("</svg>\n");
    svg
}

/// A round axis maximum at or above `v`.
fn nice(v: f64) -> f64 {
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= v {
            return m * mag;
        }
    }
    10.0 * mag
}

fn color(imp: &str) -> &'static str {
    match imp {
        "baseline" => "#444444",
        "tokio" => "#1f77b4",
        "smol" => "#2ca02c",
        "baseline-fsync" => "#8c564b",
        "tokio-fsync" => "#9467bd",
        "smol-fsync" => "#bcbd22",
        "tokio-prev" => "#17becf",
        "tokio-prev-fsync" => "#7f7f7f",
        "tokio-r3" => "#ff7f0e",
        "tokio-unconfirmed-r3" => "#e377c2",
        "etcd-r3" => "#8b0000",
        _ => "#d62728",
    }
}
