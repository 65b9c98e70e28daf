//! `autotune=true`: from one worker the controller reaches more workers and higher readiness on
//! a slow source, sheds workers when the consumer is the bottleneck, stays within the cores and
//! the memory budget, records every decision, and never changes a batch.

use std::sync::Arc;
use std::time::Duration;

use stoker_core::{Error, Loader, LoaderOptions, Source, SourceSpec, Stats};

fn slow(n: usize, delay_ms: u64) -> Arc<dyn Source> {
    stoker_core::testing::slow_counting_source(n, Duration::from_millis(delay_ms))
}

fn options(source: Arc<dyn Source>, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(source));
    for (k, v) in kv {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    o
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Readiness between two snapshots.
fn readiness(a: &Stats, b: &Stats) -> f64 {
    let wait = (b.wait_ns_total - a.wait_ns_total) as f64;
    let elapsed = (b.elapsed_ns - a.elapsed_ns) as f64;
    1.0 - wait / elapsed
}

/// Takes `n` batches, holding each for `step`; returns their sample indices.
fn take(l: &mut Loader, n: usize, step: Duration) -> Vec<Vec<i64>> {
    let mut out = Vec::new();
    while out.len() < n {
        if let Some(b) = l.next().unwrap() {
            out.push(stoker_core::testing::counting_indices(&b));
            std::thread::sleep(step);
        }
    }
    out
}

#[test]
fn from_one_worker_it_reaches_more_workers_and_higher_readiness_without_changing_batches() {
    // A batch takes one worker 4 x 4 ms; the consumer's step is 10 ms: one worker starves it,
    // two keep up.
    let kv = [
        ("batch_size", "4"),
        ("shuffle", "true"),
        ("seed", "5"),
        ("autotune", "true"),
    ];
    let step = Duration::from_millis(10);
    let mut l = Loader::new(&options(slow(4000, 4), &kv)).unwrap();
    let start = l.stats();
    assert_eq!((start.num_workers, start.autotune_decisions), (1, 0));
    let mut got = take(&mut l, 20, step);
    let early = l.stats();
    got.extend(take(&mut l, 130, step));
    let mid = l.stats();
    got.extend(take(&mut l, 60, step));
    let late = l.stats();
    drop(l); // joins the workers it started and stopped
    eprintln!(
        "autotune: workers {} -> {}, readiness {:.2} -> {:.2}, {} decisions",
        start.num_workers,
        late.num_workers,
        readiness(&start, &early),
        readiness(&mid, &late),
        late.autotune_decisions
    );

    if cores() >= 2 {
        assert!(late.num_workers >= 2, "{late:?}");
        assert!(late.autotune_decisions >= 1, "{late:?}");
        assert!(
            readiness(&mid, &late) > readiness(&start, &early),
            "early {:.2}, late {:.2}",
            readiness(&start, &early),
            readiness(&mid, &late)
        );
    } else {
        assert_eq!(late.num_workers, 1, "never beyond the usable cores");
    }
    assert!(late.num_workers as usize <= cores());
    assert_eq!(
        late.prefetch_factor * late.num_workers.max(1),
        late.in_flight_cap_requested
    );

    // The batches are those of a fixed number of workers.
    let mut fixed = Loader::new(&options(
        slow(4000, 0),
        &[
            ("batch_size", "4"),
            ("shuffle", "true"),
            ("seed", "5"),
            ("num_workers", "3"),
        ],
    ))
    .unwrap();
    assert_eq!(got, take(&mut fixed, got.len(), Duration::ZERO));
}

#[test]
fn it_sheds_workers_when_the_consumer_is_the_bottleneck() {
    // Reads are free, the consumer takes 4 ms per batch: four workers idle.
    let kv = [
        ("batch_size", "4"),
        ("num_workers", "4"),
        ("autotune", "true"),
    ];
    let mut l = Loader::new(&options(slow(100_000, 0), &kv)).unwrap();
    take(&mut l, 600, Duration::from_millis(4));
    let s = l.stats();
    assert!(s.num_workers < 4, "{s:?}");
    assert!(s.autotune_decisions >= 1, "{s:?}");
    // Retired workers keep their counters.
    assert_eq!(s.worker_busy_ns.len(), 4);
}

#[test]
fn the_memory_budget_bounds_the_workers() {
    // One batch's slab is one page: a budget of one page holds one batch in flight, so one
    // worker, however starved the consumer is.
    let page = 4096.to_string();
    let kv = [
        ("batch_size", "4"),
        ("autotune", "true"),
        ("memory_budget", page.as_str()),
    ];
    let mut l = Loader::new(&options(slow(1000, 3), &kv)).unwrap();
    take(&mut l, 60, Duration::ZERO);
    let s = l.stats();
    assert_eq!((s.num_workers, s.in_flight_cap), (1, 1), "{s:?}");
    assert_eq!(s.autotune_decisions, 0);
}

#[test]
fn every_decision_is_in_the_trace() {
    let path = std::env::temp_dir().join(format!("stoker-autotune-{}.json", std::process::id()));
    let kv = [
        ("batch_size", "4"),
        ("num_workers", "3"),
        ("autotune", "true"),
        ("trace", path.to_str().unwrap()),
    ];
    let mut l = Loader::new(&options(slow(100_000, 0), &kv)).unwrap();
    take(&mut l, 400, Duration::from_millis(4));
    let decisions = l.stats().autotune_decisions;
    drop(l);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let instants: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["name"] == "autotune" && e["ph"] == "i")
        .collect();
    assert!(decisions >= 1);
    assert_eq!(instants.len() as u64, decisions);
    for e in &instants {
        assert!(e["args"]["reason"].as_str().unwrap().len() > 5, "{e}");
        assert!(e["args"]["num_workers"].as_u64().unwrap() >= 1);
    }
    let counters = events
        .iter()
        .filter(|e| e["name"] == "autotune" && e["ph"] == "C")
        .count();
    assert_eq!(counters as u64, decisions);
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["args"]["name"] == "autotune"));
}

#[test]
fn autotune_needs_worker_threads() {
    let err = Loader::new(&options(
        slow(10, 0),
        &[("autotune", "true"), ("num_workers", "0")],
    ))
    .expect_err("an error");
    assert!(
        matches!(&err, Error::InvalidOption { key, .. } if key == "autotune"),
        "{err}"
    );
}
