//! `stoker bench autotune [ROOT]`: `autotune=true` beside the fixed settings it chooses among.
//!
//! For a folder of JPEGs through the ImageNet training transform (and with `--npy` an npy file
//! of uint8 `[N,3,224,224]`), every fixed setting — `num_workers` from 1 to the usable cores,
//! each `--prefetch` factor — is measured in its steady state (pipeline filled first, then
//! `--fixed-batches` measured, as `stoker doctor` measures a pipeline); then a loader with
//! `autotune=true` and `num_workers=auto` (which starts from one worker) runs `--batches`
//! batches from its construction. Reported: the first batch at which a window of its batches
//! ran at 90% of the best fixed setting or more, its samples/s over the last quarter of the run,
//! the ratio of that to the best fixed setting, and the changes it made (`autotune_decisions`,
//! the worker count and prefetch depth after each batch).
//!
//! Rounds interleave the fixed settings and autotune, each keeping its best round (a shared
//! machine only ever makes a loader slower).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stoker_core::{Loader, LoaderOptions};

use super::BenchData;
use crate::doctor::measure::{self, Config};
use crate::doctor::report::fmt_rate;
use crate::photos::{photos_or_drawn, IMAGENET};

/// The share of the best fixed setting autotune is timed to reach.
const REACH: f64 = 0.9;
/// Batches in the sliding window that decides when it reached it.
const WINDOW: usize = 16;
/// npy batches hold this many times the image batch size (its samples cost far less).
const NPY_BATCH_FACTOR: usize = 4;

/// One kind of data and its settings.
struct Workload {
    key: &'static str,
    name: String,
    note: Option<String>,
    source: String,
    sets: Vec<(String, String)>,
    batch_size: usize,
    /// How many times `--batches` and `--fixed-batches` this workload runs (its batches are
    /// built far faster than images).
    runs: usize,
    fixed: Vec<Fixed>,
    tuned: Vec<Tuned>,
}

/// A fixed setting and its best steady rate.
struct Fixed {
    workers: usize,
    prefetch: usize,
    best: f64,
}

/// One autotune run: when each batch arrived, and what the controller had set by then.
struct Tuned {
    /// Seconds from the loader's construction to each batch, and samples delivered by then.
    arrivals: Vec<(f64, usize)>,
    /// (batch, seconds, workers, prefetch) at the start and after each change.
    changes: Vec<(usize, f64, u64, u64)>,
    decisions: u64,
}

impl Tuned {
    /// Batches of the last quarter of the run (at least a window).
    fn tail(&self) -> usize {
        let batches = self.arrivals.len().saturating_sub(1);
        (batches / 4).max(WINDOW).min(batches)
    }

    /// Samples/s over the last [`tail`](Self::tail) batches.
    fn steady(&self) -> f64 {
        let last = self.arrivals.len().saturating_sub(1);
        rate(&self.arrivals, last - self.tail(), last)
    }

    /// The first batch (counted from 1; arrival 0 is the construction) ending a window of [`WINDOW`] batches at `target` samples/s or
    /// more, and its time from construction.
    fn reached(&self, target: f64) -> Option<(usize, f64)> {
        let w = WINDOW.min(self.arrivals.len().saturating_sub(1)).max(1);
        (w..self.arrivals.len())
            .find(|&i| rate(&self.arrivals, i - w, i) >= target)
            .map(|i| (i, self.arrivals[i].0))
    }
}

/// Samples/s between arrivals `from` and `to` (indices).
fn rate(arrivals: &[(f64, usize)], from: usize, to: usize) -> f64 {
    let (Some(a), Some(b)) = (arrivals.get(from), arrivals.get(to)) else {
        return 0.0;
    };
    (b.1 - a.1) as f64 / (b.0 - a.0).max(1e-9)
}

/// `stoker bench autotune`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct AutotuneBenchArgs {
    /// A folder of class subfolders of JPEGs (default: an ImageNet-like folder of 500x375
    /// photographs in the data directory).
    #[arg(value_name = "ROOT")]
    pub(crate) root: Option<PathBuf>,
    /// A shorter run: a smaller folder, fewer batches, one round.
    #[arg(long)]
    pub(crate) quick: bool,
    // The doc comment is the flag's --help text, where the shape in brackets is plain text, not
    // a link to an item.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// Also an npy file of uint8 [N,3,224,224] in batches four times larger.
    #[arg(long)]
    pub(crate) npy: bool,
    /// Rounds, each measuring every fixed setting and then autotune; each keeps its best
    /// [default: 3, --quick 1].
    #[arg(long, value_name = "N")]
    pub(crate) rounds: Option<usize>,
    /// Images in the default folder [default: 1200, --quick 480].
    #[arg(long, value_name = "N")]
    pub(crate) images: Option<usize>,
    /// Samples in the npy file [default: 2048, --quick 1024].
    #[arg(long, value_name = "N")]
    pub(crate) npy_samples: Option<usize>,
    /// Batches autotune runs for, from the loader's start; npy runs four times as many
    /// [default: 300, --quick 120].
    #[arg(long, value_name = "N")]
    pub(crate) batches: Option<usize>,
    /// Batches each fixed setting is measured for, after filling its pipeline; npy four times
    /// as many [default: 40, --quick 16].
    #[arg(long, value_name = "N")]
    pub(crate) fixed_batches: Option<usize>,
    /// The prefetch_factor values of the fixed settings, comma-separated.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "2,4"
    )]
    pub(crate) prefetch: Vec<usize>,
    /// Samples per image batch; npy batches are four times larger.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    /// The training step to simulate, in milliseconds per batch.
    #[arg(long, value_name = "MS", default_value_t = 0.0)]
    pub(crate) step_ms: f64,
    #[command(flatten)]
    pub(crate) data: BenchData,
    /// Print the results as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn run(args: &AutotuneBenchArgs) -> Result<(), String> {
    if !args.step_ms.is_finite() || args.step_ms < 0.0 {
        return Err(format!(
            "--step-ms: {} is not a duration in milliseconds",
            args.step_ms
        ));
    }
    let quick = args.quick;
    let rounds = args.rounds.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let batches = args.batches.unwrap_or(if quick { 120 } else { 300 }).max(2);
    let fixed_batches = args
        .fixed_batches
        .unwrap_or(if quick { 16 } else { 40 })
        .max(1);
    let batch_size = args.batch_size.max(1);
    let step = Duration::from_secs_f64(args.step_ms / 1000.0);
    let dir = args
        .data
        .data_dir
        .clone()
        .unwrap_or_else(crate::photos::cache_dir);
    let mut prefetch: Vec<usize> = args.prefetch.iter().map(|&p| p.max(1)).collect();
    prefetch.sort_unstable();
    prefetch.dedup();
    let cores = {
        let mut o = LoaderOptions::new();
        o.set("num_workers", "auto").map_err(|e| e.to_string())?;
        o.resolved_workers().max(1)
    };
    let fixed = || -> Vec<Fixed> {
        (1..=cores)
            .flat_map(|workers| {
                prefetch.iter().map(move |&prefetch| Fixed {
                    workers,
                    prefetch,
                    best: 0.0,
                })
            })
            .collect()
    };

    let (root, note) = match &args.root {
        Some(root) => (root.clone(), None),
        None => photos_or_drawn(
            &dir,
            args.images.unwrap_or(if quick { 480 } else { 1200 }),
            IMAGENET,
            args.data.synthetic,
        )?,
    };
    let mut workloads = vec![Workload {
        key: "jpeg",
        name: "JPEG folder".into(),
        note,
        source: format!("image_folder:{}", root.display()),
        sets: pairs(&[
            ("transform", crate::demo::STANDARD_TRANSFORM),
            ("shuffle", "true"),
            ("batch_size", &batch_size.to_string()),
        ]),
        batch_size,
        runs: 1,
        fixed: fixed(),
        tuned: Vec::new(),
    }];
    if args.npy {
        let n = args.npy_samples.unwrap_or(if quick { 1024 } else { 2048 });
        let path = super::npy::generated_npy_in(&dir.join("npy"), n)?;
        let batch = batch_size * NPY_BATCH_FACTOR;
        workloads.push(Workload {
            key: "npy",
            name: "npy uint8 [N,3,224,224]".into(),
            note: None,
            source: format!("npy:{}", path.display()),
            sets: pairs(&[("shuffle", "true"), ("batch_size", &batch.to_string())]),
            batch_size: batch,
            runs: NPY_BATCH_FACTOR,
            fixed: fixed(),
            tuned: Vec::new(),
        });
    }

    for round in 0..rounds {
        for w in &mut workloads {
            eprintln!(
                "bench autotune: round {}/{rounds}, {}: {} fixed settings, then autotune",
                round + 1,
                w.name,
                w.fixed.len()
            );
            let mut base = LoaderOptions::new();
            base.set("source", &w.source).map_err(|e| e.to_string())?;
            let base = measure::with(&base, &w.sets)?;
            let config = Config {
                step,
                samples: fixed_batches * w.runs * w.batch_size,
                timeline: None,
                progress: false,
                phase_limit: Duration::from_secs(30),
                min_phase: Duration::ZERO,
                remote: false,
            };
            for f in &mut w.fixed {
                let options = measure::with(
                    &base,
                    &pairs(&[
                        ("num_workers", &f.workers.to_string()),
                        ("prefetch_factor", &f.prefetch.to_string()),
                    ]),
                )?;
                let p = measure::pipeline_run(&options, &config, None)?;
                f.best = f.best.max(p.samples_per_s);
            }
            w.tuned.push(autotune_run(&base, batches * w.runs, step)?);
        }
    }

    if args.json {
        let v = json!({
            "rounds": rounds,
            "cores": cores,
            "step_ms": args.step_ms,
            "batches": batches,
            "reach": REACH,
            "window_batches": WINDOW,
            "workloads": workloads.iter().map(workload_json).collect::<Vec<_>>(),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", table(&workloads, cores, rounds, args.step_ms));
    }
    Ok(())
}

fn pairs(kv: &[(&str, &str)]) -> Vec<(String, String)> {
    kv.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A loader with `autotune=true` from one worker, `batches` batches from its construction.
fn autotune_run(base: &LoaderOptions, batches: usize, step: Duration) -> Result<Tuned, String> {
    let options = measure::with(
        base,
        &pairs(&[("autotune", "true"), ("num_workers", "auto")]),
    )?;
    let start = Instant::now();
    let mut loader = Loader::new(&options).map_err(|e| e.to_string())?;
    let s = loader.stats();
    let mut changes = vec![(0, 0.0, s.num_workers, s.prefetch_factor)];
    let mut arrivals = vec![(0.0, 0)];
    let (mut samples, mut empty_epochs) = (0usize, 0);
    while arrivals.len() <= batches {
        match loader.next().map_err(|e| e.to_string())? {
            Some(b) => {
                samples += b.len();
                let at = start.elapsed().as_secs_f64();
                arrivals.push((at, samples));
                empty_epochs = 0;
                drop(b);
                let s = loader.stats();
                let now = (s.num_workers, s.prefetch_factor);
                if changes.last().is_some_and(|c| (c.2, c.3) != now) {
                    changes.push((arrivals.len() - 1, at, now.0, now.1));
                }
                std::thread::sleep(step);
            }
            None => {
                empty_epochs += 1;
                if empty_epochs > 1 {
                    return Err("the source has no batches to measure".into());
                }
            }
        }
    }
    Ok(Tuned {
        arrivals,
        changes,
        decisions: loader.stats().autotune_decisions,
    })
}

/// The best fixed setting of `w`.
fn best_fixed(w: &Workload) -> Option<&Fixed> {
    w.fixed.iter().max_by(|a, b| a.best.total_cmp(&b.best))
}

/// The autotune round shown: the one with the best steady rate.
fn best_tuned(w: &Workload) -> Option<&Tuned> {
    w.tuned
        .iter()
        .max_by(|a, b| a.steady().total_cmp(&b.steady()))
}

fn table(workloads: &[Workload], cores: usize, rounds: usize, step_ms: f64) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "autotune=true (from 1 worker) against fixed settings: {cores} usable cores, step {step_ms} \
         ms, best of {rounds} round{} (fixed settings and autotune interleaved)",
        if rounds == 1 { "" } else { "s" }
    );
    for w in workloads {
        let (Some(best), Some(tuned)) = (best_fixed(w), best_tuned(w)) else {
            continue;
        };
        let _ = writeln!(out, "\n{}: {}, batch {}", w.name, w.source, w.batch_size);
        if let Some(note) = &w.note {
            let _ = writeln!(out, "  data: {note}");
        }
        let _ = writeln!(
            out,
            "  {:<34} {:>10} {:>8}",
            "setting", "samples/s", "vs best"
        );
        for f in &w.fixed {
            let _ = writeln!(
                out,
                "  {:<34} {:>10} {:>7.2}x",
                format!("num_workers={} prefetch_factor={}", f.workers, f.prefetch),
                fmt_rate(f.best),
                f.best / best.best.max(1e-9)
            );
        }
        let steady = tuned.steady();
        let _ = writeln!(
            out,
            "  {:<34} {:>10} {:>7.2}x   over the last {} of {} batches",
            "autotune=true num_workers=auto",
            fmt_rate(steady),
            steady / best.best.max(1e-9),
            tuned.tail(),
            tuned.arrivals.len() - 1
        );
        match tuned.reached(REACH * best.best) {
            Some((batch, secs)) => {
                let _ = writeln!(
                    out,
                    "  reached {:.0}% of the best fixed setting at batch {batch} ({secs:.2} s \
                     after construction; windows of {WINDOW} batches)",
                    REACH * 100.0
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  never reached {:.0}% of the best fixed setting in {} batches",
                    REACH * 100.0,
                    tuned.arrivals.len() - 1
                );
            }
        }
        let _ = writeln!(
            out,
            "  decisions: {} (autotune_decisions); {}",
            tuned.decisions,
            tuned
                .changes
                .iter()
                .map(|&(batch, secs, workers, prefetch)| format!(
                    "batch {batch} ({secs:.2} s): {workers} worker{}, prefetch {prefetch}",
                    if workers == 1 { "" } else { "s" }
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    out
}

fn num(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 100.0).round() / 100.0)
    } else {
        Value::Null
    }
}

fn workload_json(w: &Workload) -> Value {
    let best = best_fixed(w);
    let best_rate = best.map_or(0.0, |f| f.best);
    let tuned = best_tuned(w).map(|t| {
        let reached = t.reached(REACH * best_rate);
        let last = t.changes.last().copied().unwrap_or_default();
        json!({
            "steady_samples_per_s": num(t.steady()),
            "steady_batches": t.tail(),
            "ratio_to_best_fixed": num(t.steady() / best_rate.max(1e-9)),
            "reached_batch": reached.map(|r| r.0),
            "reached_s": reached.map(|r| num(r.1)),
            "autotune_decisions": t.decisions,
            "num_workers": last.2,
            "prefetch_factor": last.3,
            "changes": t.changes.iter().map(|&(batch, secs, workers, prefetch)| json!({
                "batch": batch, "s": num(secs), "num_workers": workers, "prefetch_factor": prefetch,
            })).collect::<Vec<_>>(),
        })
    });
    json!({
        "workload": w.key,
        "name": w.name,
        "source": w.source,
        "data_note": w.note,
        "batch_size": w.batch_size,
        "batches": w.tuned.first().map_or(0, |t| t.arrivals.len() - 1),
        "fixed": w.fixed.iter().map(|f| json!({
            "num_workers": f.workers,
            "prefetch_factor": f.prefetch,
            "samples_per_s": num(f.best),
        })).collect::<Vec<_>>(),
        "best_fixed": best.map(|f| json!({
            "num_workers": f.workers,
            "prefetch_factor": f.prefetch,
            "samples_per_s": num(f.best),
        })),
        "autotune": tuned,
        "autotune_rounds_steady_samples_per_s": w.tuned.iter().map(|t| num(t.steady())).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run delivering `rates[i]` samples/s during batch i, batches of 10 samples.
    fn run(rates: &[f64]) -> Tuned {
        let mut arrivals = vec![(0.0, 0)];
        for r in rates {
            let (t, n) = arrivals[arrivals.len() - 1];
            arrivals.push((t + 10.0 / r, n + 10));
        }
        Tuned {
            arrivals,
            changes: vec![(0, 0.0, 1, 2)],
            decisions: 0,
        }
    }

    #[test]
    fn reaching_the_target_takes_a_whole_window_at_it() {
        // 20 slow batches, then fast ones.
        let mut rates = vec![100.0; 20];
        rates.extend([200.0; 60]);
        let t = run(&rates);
        let (batch, secs) = t.reached(180.0).unwrap();
        // The window of WINDOW batches ending at `batch` runs at >= 180/s: mostly fast ones.
        assert!(batch > 20 && batch <= 20 + WINDOW, "{batch}");
        assert!(secs > 20.0 * 0.1, "{secs}");
        assert_eq!(t.reached(250.0), None);
        // Steady: the last quarter (20 batches) ran at 200/s.
        assert_eq!(t.tail(), 20);
        assert!((t.steady() - 200.0).abs() < 1e-6, "{}", t.steady());
    }

    #[test]
    fn short_runs_measure_what_they_have() {
        let t = run(&[50.0, 50.0, 50.0]);
        assert_eq!(t.tail(), 3);
        assert!((t.steady() - 50.0).abs() < 1e-6);
        assert_eq!(t.reached(40.0).map(|r| r.0), Some(3));
    }
}
