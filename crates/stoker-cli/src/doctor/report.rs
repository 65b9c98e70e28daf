//! The renderings of the doctor's [`Report`]: a table of the stages with a bar chart for the
//! terminal, and JSON (`--json`).

use serde_json::{json, Value};

use super::model::Report;

fn per_s(us: f64) -> f64 {
    if us > 0.0 {
        1e6 / us
    } else {
        f64::INFINITY
    }
}

/// A number for JSON: infinity (a stage that costs nothing) becomes null.
fn num(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 100.0).round() / 100.0)
    } else {
        Value::Null
    }
}

impl Report {
    pub(crate) fn json(&self) -> Value {
        let stages: serde_json::Map<String, Value> = self
            .stages
            .iter()
            .map(|s| {
                (
                    s.name.to_owned(),
                    json!({"us_per_sample": num(s.us_per_sample), "samples_per_s": num(per_s(s.us_per_sample))}),
                )
            })
            .collect();
        json!({
            "bottleneck": self.bottleneck,
            "stages": stages,
            "io_wait_us_per_sample": num(self.costs.io_wait_us),
            "pipeline_samples_per_s": num(self.pipeline.samples_per_s),
            "model_samples_per_s": num(self.model_samples_per_s),
            "predicted_samples_per_s": num(self.predicted_samples_per_s),
            "prediction_measured_on": self.prediction_measured_on,
            "readiness": num(self.pipeline.readiness),
            "cpu_cores_used": num(self.pipeline.cpu_cores),
            "cores_available": num(self.load.cores_for(self.cores as f64, self.cores)),
            "others_cores_used": num(self.load.others_cores),
            "num_workers": self.pipeline.workers,
            "cores": self.cores,
            "batch_size": self.pipeline.batch_size,
            "step_ms": num(self.step.as_secs_f64() * 1e3),
            "samples_measured": self.costs.samples,
            "advice": self.advice.iter().map(|a| json!({"set": a.set, "why": a.why})).collect::<Vec<_>>(),
        })
    }

    /// The terminal report: a table of stages with a bar chart, then the verdict.
    pub(crate) fn table(&self, source: &str) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "stoker doctor: {source}\n  batch_size {}, {} workers on {} cores, step {} ms, {} samples per stage measured\n",
            self.pipeline.batch_size,
            self.pipeline.workers,
            self.cores,
            self.step.as_millis(),
            self.costs.samples
        );
        let widest = self
            .stages
            .iter()
            .map(|s| s.us_per_sample)
            .fold(0.0f64, f64::max)
            .max(1e-9);
        let _ = writeln!(
            out,
            "  {:<10} {:>12} {:>16}   one core's time per sample",
            "stage", "us/sample", "samples/s/core"
        );
        for s in &self.stages {
            let bar = bar(s.us_per_sample / widest, 30);
            let mark = if s.name == self.bottleneck { " <" } else { "" };
            let _ = writeln!(
                out,
                "  {:<10} {:>12.1} {:>16}   {bar}{mark}",
                s.name,
                s.us_per_sample,
                fmt_rate(per_s(s.us_per_sample))
            );
        }
        if self.costs.io_wait_us > 0.0 {
            let _ = writeln!(
                out,
                "  (of io: {:.1} us waiting on I/O, not using a core)",
                self.costs.io_wait_us
            );
        }
        let _ = writeln!(
            out,
            "\n  pipeline   {} samples/s measured (readiness {:.0}%, workers {:.0}% busy, {:.1} of {} cores used)",
            fmt_rate(self.pipeline.samples_per_s),
            self.pipeline.readiness * 100.0,
            self.pipeline.worker_busy * 100.0,
            self.pipeline.cpu_cores,
            self.cores,
        );
        let available = self.load.cores_for(self.cores as f64, self.cores);
        if available < self.cores as f64 - 0.05 {
            let _ = writeln!(
                out,
                "  model      {} samples/s from the stage costs on the {available:.1} of {} cores this process gets (other work used {:.1})",
                fmt_rate(self.model_samples_per_s),
                self.cores,
                self.load.others_cores
            );
        } else {
            let _ = writeln!(
                out,
                "  model      {} samples/s from the stage costs on {} free cores",
                fmt_rate(self.model_samples_per_s),
                self.cores
            );
        }
        // Busy workers that got little CPU: other processes hold the cores.
        let wanted = self.pipeline.worker_busy * self.pipeline.workers.min(self.cores) as f64;
        if self.pipeline.cpu_cores > 0.0 && self.pipeline.cpu_cores < 0.7 * wanted {
            let _ = writeln!(
                out,
                "  note       the workers were busy on {wanted:.1} cores but the process got {:.1}: other work shares this machine's cores, so rates here are below what free cores give",
                self.pipeline.cpu_cores
            );
        }
        let _ = writeln!(out, "  bottleneck {}", describe(self.bottleneck));
        if self.advice.is_empty() {
            let _ = writeln!(out, "  advice     none: the settings fit this machine");
        } else {
            let _ = writeln!(out, "  advice");
            for a in &self.advice {
                let _ = writeln!(out, "    {:<26} {}", a.set, a.why);
            }
        }
        let _ = writeln!(
            out,
            "  predicted  {} samples/s with the advice{}",
            fmt_rate(self.predicted_samples_per_s),
            match &self.prediction_measured_on {
                Some(on) => format!(" (measured: the advised pipeline on {on})"),
                None => String::new(),
            }
        );
        out
    }
}

fn describe(bottleneck: &str) -> &'static str {
    match bottleneck {
        "io" => "io (reading the data)",
        "decode" => "decode (image decoding)",
        "transform" => "transform (augmentation and conversion)",
        "collate" => "collate (copying into batch memory)",
        "transfer" => "transfer (host-to-device copies)",
        "workers" => "workers (too few for the cores)",
        _ => "consumer (the training step itself; the loader keeps up)",
    }
}

fn bar(fraction: f64, width: usize) -> String {
    const EIGHTHS: [char; 8] = ['▏', '▎', '▍', '▌', '▋', '▊', '▉', '█'];
    let eighths = (fraction.clamp(0.0, 1.0) * width as f64 * 8.0).round() as usize;
    let mut s = "█".repeat(eighths / 8);
    if !eighths.is_multiple_of(8) {
        s.push(EIGHTHS[eighths % 8 - 1]);
    }
    s
}

/// A rate with thousands separators; `-` for infinity.
pub(crate) fn fmt_rate(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let n = x.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_and_rates_read_well() {
        assert_eq!(bar(1.0, 4), "████");
        assert_eq!(bar(0.0, 4), "");
        assert_eq!(bar(0.5 + 1.0 / 64.0, 4), "██▏");
        assert_eq!(fmt_rate(1234567.4), "1,234,567");
        assert_eq!(fmt_rate(999.0), "999");
        assert_eq!(fmt_rate(f64::INFINITY), "-");
    }
}
