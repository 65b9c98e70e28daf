//! The timeline picture (`stoker doctor --timeline run.svg`): the trace of the pipeline run
//! (Chrome trace-event JSON, see `stoker_core::trace`) drawn as an SVG — one row per thread,
//! each worker's stages as coloured bars inside its batches, the prefetch thread's copies, and
//! the consumer's waits in red. It shows the last [`BATCHES`] batches delivered, so the bars
//! stay wide enough to read.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

/// Batches delivered that the picture spans (the last ones of the run).
const BATCHES: usize = 8;
const LABEL_W: f64 = 190.0;
const PLOT_W: f64 = 1100.0;
const ROW_H: f64 = 30.0;
const TOP: f64 = 54.0;

/// Stage colours (the stages' names in the trace), in legend order.
const COLOURS: [(&str, &str); 7] = [
    ("read", "#4e79a7"),
    ("decode", "#f28e2b"),
    ("transform", "#59a14f"),
    ("collate", "#b07aa1"),
    ("h2d", "#76b7b2"),
    ("wait", "#e15759"),
    ("batch", "#d9d9d9"),
];

struct Span {
    name: String,
    tid: u64,
    start: f64,
    end: f64,
}

/// Reads the trace at `trace` and writes the picture to `svg`.
pub(crate) fn render(trace: &Path, svg: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(trace)
        .map_err(|e| format!("reading the trace {}: {e}", trace.display()))?;
    let json: Value = serde_json::from_str(&text)
        .map_err(|e| format!("the trace {} is not JSON: {e}", trace.display()))?;
    let picture = draw(&json)?;
    std::fs::write(svg, picture).map_err(|e| format!("writing {}: {e}", svg.display()))
}

/// The SVG of a parsed trace.
pub(crate) fn draw(json: &Value) -> Result<String, String> {
    let events = json["traceEvents"]
        .as_array()
        .ok_or("the trace has no traceEvents")?;
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    let mut spans = Vec::new();
    let mut delivered = Vec::new();
    for e in events {
        let tid = e["tid"].as_u64().unwrap_or(0);
        let name = e["name"].as_str().unwrap_or("").to_owned();
        match e["ph"].as_str() {
            Some("M") if name == "thread_name" => {
                names.insert(tid, e["args"]["name"].as_str().unwrap_or("").to_owned());
            }
            Some("X") if name != "sample" => {
                let (Some(ts), Some(dur)) = (e["ts"].as_f64(), e["dur"].as_f64()) else {
                    continue;
                };
                if name == "wait" {
                    delivered.push(ts + dur);
                }
                spans.push(Span {
                    name,
                    tid,
                    start: ts,
                    end: ts + dur,
                });
            }
            _ => {}
        }
    }
    if spans.is_empty() {
        return Err("the trace holds no spans: the run delivered no batch".into());
    }
    // The window: from the wait before the last BATCHES deliveries to the last event.
    delivered.sort_by(f64::total_cmp);
    let end = spans.iter().map(|s| s.end).fold(f64::MIN, f64::max);
    let start = match delivered.len() {
        n if n > BATCHES => {
            let first = delivered[n - BATCHES - 1];
            spans
                .iter()
                .filter(|s| s.name == "wait" && s.end >= first)
                .map(|s| s.start)
                .fold(first, f64::min)
        }
        _ => spans.iter().map(|s| s.start).fold(f64::MAX, f64::min),
    };
    let span_us = (end - start).max(1.0);
    let x = |t: f64| LABEL_W + (t - start) / span_us * PLOT_W;

    // Rows: the consumer, the prefetch thread, then workers in order.
    let mut tids: Vec<u64> = spans.iter().map(|s| s.tid).collect();
    tids.sort_unstable();
    tids.dedup();
    let row: BTreeMap<u64, usize> = tids.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let height = TOP + ROW_H * tids.len() as f64 + 40.0;
    let width = LABEL_W + PLOT_W + 20.0;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="14" font-weight="bold">stoker timeline: the last {} batches, {:.1} ms</text>"#,
        BATCHES.min(delivered.len().max(1)),
        span_us / 1000.0
    );
    // Legend.
    let mut lx = 10.0;
    for (name, colour) in COLOURS {
        let _ = writeln!(
            out,
            r#"<rect x="{lx}" y="30" width="12" height="12" fill="{colour}"/><text x="{}" y="40">{name}</text>"#,
            lx + 16.0
        );
        lx += 24.0 + 8.0 * name.len() as f64;
    }
    for (i, tid) in tids.iter().enumerate() {
        let y = TOP + ROW_H * i as f64;
        let label = names
            .get(tid)
            .cloned()
            .unwrap_or_else(|| format!("thread {tid}"));
        let _ = writeln!(
            out,
            r##"<text x="10" y="{}">{}</text><line x1="{LABEL_W}" x2="{}" y1="{}" y2="{}" stroke="#eeeeee"/>"##,
            y + ROW_H * 0.6,
            escape(&label),
            LABEL_W + PLOT_W,
            y + ROW_H,
            y + ROW_H
        );
    }
    // Batches under their stages: draw in that order.
    let order = |name: &str| usize::from(name != "batch");
    let mut visible: Vec<&Span> = spans
        .iter()
        .filter(|s| s.end >= start && s.start <= end)
        .collect();
    visible.sort_by_key(|s| order(&s.name));
    for s in visible {
        let colour = COLOURS
            .iter()
            .find(|(n, _)| *n == s.name)
            .map_or("#999999", |(_, c)| c);
        let (x0, x1) = (x(s.start.max(start)), x(s.end.min(end)));
        let y = TOP + ROW_H * row[&s.tid] as f64;
        let (dy, h) = if s.name == "batch" {
            (3.0, ROW_H - 6.0)
        } else {
            (7.0, ROW_H - 14.0)
        };
        let _ = writeln!(
            out,
            r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{colour}"><title>{} {:.3} ms</title></rect>"#,
            y + dy,
            (x1 - x0).max(0.5),
            s.name,
            (s.end - s.start) / 1000.0
        );
    }
    // Time axis.
    let axis_y = TOP + ROW_H * tids.len() as f64 + 14.0;
    let step = nice_step(span_us / 1000.0 / 8.0);
    let mut t = 0.0;
    while t <= span_us / 1000.0 + 1e-9 {
        let tx = x(start + t * 1000.0);
        let _ = writeln!(
            out,
            r##"<line x1="{tx:.1}" x2="{tx:.1}" y1="{TOP}" y2="{}" stroke="#cccccc" stroke-dasharray="2,3"/><text x="{tx:.1}" y="{}" text-anchor="middle">{} ms</text>"##,
            axis_y - 10.0,
            axis_y + 4.0,
            trim(t)
        );
        t += step;
    }
    out.push_str("</svg>\n");
    Ok(out)
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1e-3);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

fn trim(t: f64) -> String {
    let s = format!("{t:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn draws_one_row_per_thread_with_stages_inside_batches() {
        let trace = json!({"traceEvents": [
            {"ph": "M", "name": "thread_name", "tid": 1, "pid": 1, "args": {"name": "consumer (next)"}},
            {"ph": "M", "name": "thread_name", "tid": 10, "pid": 1, "args": {"name": "stoker-worker-0"}},
            {"ph": "X", "name": "batch", "tid": 10, "pid": 1, "ts": 0.0, "dur": 100.0},
            {"ph": "X", "name": "sample", "tid": 10, "pid": 1, "ts": 0.0, "dur": 40.0},
            {"ph": "X", "name": "read", "tid": 10, "pid": 1, "ts": 0.0, "dur": 40.0},
            {"ph": "X", "name": "decode", "tid": 10, "pid": 1, "ts": 40.0, "dur": 60.0},
            {"ph": "X", "name": "wait", "tid": 1, "pid": 1, "ts": 0.0, "dur": 100.0},
        ]});
        let svg = draw(&trace).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains(">consumer (next)<") && svg.contains(">stoker-worker-0<"));
        // Three bars on the worker's row (the sample span is not drawn), one wait.
        assert_eq!(svg.matches("<title>").count(), 4, "{svg}");
        assert!(svg.contains("<title>decode 0.060 ms</title>"));
        // The batch is drawn before (under) its stages.
        assert!(svg.find("<title>batch").unwrap() < svg.find("<title>read").unwrap());
        assert!(draw(&json!({"traceEvents": []})).is_err());
        assert!(draw(&json!({})).is_err());
    }

    #[test]
    fn steps_and_names() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(12.0), 20.0);
        assert_eq!(trim(2.5), "2.5");
        assert_eq!(trim(10.0), "10");
        assert_eq!(escape("a<b>&\""), "a&lt;b&gt;&amp;&quot;");
    }
}
