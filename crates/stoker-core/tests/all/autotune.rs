//! `autotune=true`: from one worker the controller reaches more workers and higher readiness on
//! a slow source, sheds workers when the consumer is the bottleneck, stays within the cores and
//! the memory budget, records every decision, and never changes a batch; for streaming loaders
//! (tar shards through a shuffle buffer, iterable sources) as for indexed ones.
//!
//! Ignored by a plain `cargo test`, run by the test command in a process of their own
//! (`--ignored autotune::`), one test at a time ([`alone`]): the controller adds a worker only
//! while the process leaves a core to spare, so tests running beside these would decide for it
//! (it rightly holds back on a busy machine).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use stoker_core::{
    Error, IterableSource, Loader, LoaderOptions, SampleStream, SampleWriter, Source, SourceSpec,
    Stats, StreamInfo,
};

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

/// Held for the whole of each test: these tests measure the process, so they take
/// it one at a time. A test that failed holding it does not stop the others (the poison is
/// ignored: the guarded value is nothing).
fn alone() -> MutexGuard<'static, ()> {
    static ALONE: Mutex<()> = Mutex::new(());
    ALONE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
#[ignore = "the controller reads the process's CPU time, which other tests would take: run alone, `cargo test --test all -- --ignored autotune::`"]
fn from_one_worker_it_reaches_more_workers_and_higher_readiness_without_changing_batches() {
    let _alone = alone();
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
#[ignore = "the controller reads the process's CPU time, which other tests would take: run alone, `cargo test --test all -- --ignored autotune::`"]
fn it_sheds_workers_when_the_consumer_is_the_bottleneck() {
    let _alone = alone();
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
#[ignore = "the controller reads the process's CPU time, which other tests would take: run alone, `cargo test --test all -- --ignored autotune::`"]
fn the_memory_budget_bounds_the_workers() {
    let _alone = alone();
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
#[ignore = "the controller reads the process's CPU time, which other tests would take: run alone, `cargo test --test all -- --ignored autotune::`"]
fn every_decision_is_in_the_trace() {
    let _alone = alone();
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
#[ignore = "the controller reads the process's CPU time, which other tests would take: run alone, `cargo test --test all -- --ignored autotune::`"]
fn autotune_needs_worker_threads() {
    let _alone = alone();
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

/// Rank `r` of `w` streams ids `r, r + w, ...` below `n` (field `x` = `[id, id+1, id+2]` as
/// [`stoker_core::testing::counting_indices`] reads it), each taking `delay` to read.
struct SlowIds {
    n: usize,
    delay: Duration,
}

struct SlowIdStream {
    next: usize,
    step: usize,
    n: usize,
    delay: Duration,
}

impl IterableSource for SlowIds {
    fn open(
        &self,
        info: &StreamInfo,
        _resume: Option<&str>,
    ) -> Result<Box<dyn SampleStream>, String> {
        Ok(Box::new(SlowIdStream {
            next: info.rank,
            step: info.world_size,
            n: self.n,
            delay: self.delay,
        }))
    }
}

impl SampleStream for SlowIdStream {
    fn next(&mut self, out: &mut SampleWriter<'_>) -> Result<bool, String> {
        if self.next >= self.n {
            return Ok(false);
        }
        std::thread::sleep(self.delay);
        let id = self.next as i64;
        self.next += self.step;
        let x: Vec<u8> = [id, id + 1, id + 2]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        out.put_tensor("x", stoker_core::DType::I64, &[3], &x)?;
        Ok(true)
    }
}

fn iterable(source: SlowIds, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new().with_source(SourceSpec::Iterable(Arc::new(source)));
    for (k, v) in kv {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    o
}

fn tar(source: &str, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new();
    o.set("source", source).unwrap();
    for (k, v) in kv {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    o
}

/// Takes `n` batches, holding each for `step`; returns a hash of each one's fields.
fn take_hashed(l: &mut Loader, n: usize, step: Duration) -> Vec<u64> {
    use std::hash::{Hash, Hasher};
    let mut out = Vec::new();
    while out.len() < n {
        if let Some(b) = l.next().unwrap() {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for name in ["image", "label"] {
                b.field_by_name(name).unwrap().data.unwrap().hash(&mut h);
            }
            out.push(h.finish());
            std::thread::sleep(step);
        }
    }
    out
}

#[test]
#[ignore = "the controller reads the process's CPU time, which other tests would take: run alone, `cargo test --test all -- --ignored autotune::`"]
fn a_streaming_loader_adds_workers_when_building_starves_the_consumer() {
    let _alone = alone();
    let dir = crate::support::files::tmp("autotune-stream");
    let source = crate::support::files::photo_shard(&dir, 48);
    let kv = [
        ("batch_size", "4"),
        ("shuffle_buffer", "8"),
        ("seed", "5"),
        (
            "transform",
            "random_resized_crop(48) | hflip | normalize(imagenet)",
        ),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut all = kv.to_vec();
        all.extend_from_slice(extra);
        tar(&source, &all)
    };
    // What one batch costs to build here (a debug or release build, a busy machine or not),
    // measured in the calling thread: the consumer's step is 60% of it, so one worker starves
    // the consumer and two keep up.
    let build = {
        let mut l = Loader::new(&with(&[("num_workers", "0")])).unwrap();
        take_hashed(&mut l, 6, Duration::ZERO);
        let s = l.stats();
        Duration::from_nanos(s.busy_ns / s.batches)
    };
    let step = build.mul_f64(0.6);
    // About four seconds of batches, and enough windows for the controller either way.
    let n = (4_000_000 / step.as_micros().max(1) as usize).clamp(120, 600);
    let mut l = Loader::new(&with(&[("autotune", "true")])).unwrap();
    let start = l.stats();
    assert_eq!((start.num_workers, start.autotune_decisions), (1, 0));
    let mut got = take_hashed(&mut l, n / 10, step);
    let early = l.stats();
    got.extend(take_hashed(&mut l, n * 6 / 10, step));
    let mid = l.stats();
    got.extend(take_hashed(&mut l, n * 3 / 10, step));
    let late = l.stats();
    drop(l);
    eprintln!(
        "streaming autotune: {build:?} a batch, workers {} -> {}, readiness {:.2} -> {:.2}, {} \
         decisions",
        start.num_workers,
        late.num_workers,
        readiness(&start, &early),
        readiness(&mid, &late),
        late.autotune_decisions
    );
    // What the controller guarantees: a starved consumer with workers busy and cores idle gets
    // a worker more, never beyond the cores. (Whether readiness then rises depends on what else
    // the machine runs: the tests beside this one share its cores.)
    if cores() >= 2 {
        let most = mid.num_workers.max(late.num_workers);
        assert!(most >= 2, "{mid:?} then {late:?}");
        assert!(late.autotune_decisions >= 1, "{late:?}");
    } else {
        assert_eq!(late.num_workers, 1, "never beyond the usable cores");
    }
    assert!(mid.num_workers as usize <= cores() && late.num_workers as usize <= cores());
    assert_eq!(
        late.prefetch_factor * late.num_workers.max(1),
        late.in_flight_cap_requested
    );
    // The batches are those of a fixed number of workers.
    let mut fixed = Loader::new(&with(&[("num_workers", "3")])).unwrap();
    assert_eq!(got, take_hashed(&mut fixed, got.len(), Duration::ZERO));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "the controller reads the process's CPU time, which other tests would take: run alone, `cargo test --test all -- --ignored autotune::`"]
fn the_memory_budget_bounds_a_streaming_loaders_workers() {
    let _alone = alone();
    // As on the host: a budget of one page holds one batch in flight, so one worker.
    let page = 4096.to_string();
    let kv = [
        ("batch_size", "4"),
        ("autotune", "true"),
        ("memory_budget", page.as_str()),
    ];
    let source = SlowIds {
        n: 1000,
        delay: Duration::from_millis(3),
    };
    let mut l = Loader::new(&iterable(source, &kv)).unwrap();
    take(&mut l, 60, Duration::ZERO);
    let s = l.stats();
    assert_eq!((s.num_workers, s.in_flight_cap), (1, 1), "{s:?}");
    assert_eq!(s.autotune_decisions, 0);
}

#[test]
#[ignore = "the controller reads the process's CPU time, which other tests would take: run alone, `cargo test --test all -- --ignored autotune::`"]
fn a_streaming_loader_sheds_workers_and_traces_every_decision() {
    let _alone = alone();
    // Reads are free, the consumer takes 4 ms per batch: three workers idle.
    let path = std::env::temp_dir().join(format!(
        "stoker-autotune-stream-{}.json",
        std::process::id()
    ));
    let kv = [
        ("batch_size", "4"),
        ("num_workers", "3"),
        ("autotune", "true"),
        ("trace", path.to_str().unwrap()),
    ];
    let source = SlowIds {
        n: 100_000,
        delay: Duration::ZERO,
    };
    let mut l = Loader::new(&iterable(source, &kv)).unwrap();
    take(&mut l, 400, Duration::from_millis(4));
    let s = l.stats();
    drop(l);
    assert!(s.num_workers < 3, "{s:?}");
    assert!(s.autotune_decisions >= 1, "{s:?}");
    // Retired workers keep their counters.
    assert_eq!(s.worker_busy_ns.len(), 3);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let instants = events
        .iter()
        .filter(|e| e["name"] == "autotune" && e["ph"] == "i")
        .count();
    assert_eq!(instants as u64, s.autotune_decisions, "{s:?}");
}

#[test]
#[ignore = "the controller reads the process's CPU time, which other tests would take: run alone, `cargo test --test all -- --ignored autotune::`"]
fn streaming_autotune_needs_worker_threads() {
    let _alone = alone();
    let source = SlowIds {
        n: 10,
        delay: Duration::ZERO,
    };
    let err = Loader::new(&iterable(
        source,
        &[("autotune", "true"), ("num_workers", "0")],
    ))
    .expect_err("an error");
    assert!(
        matches!(&err, Error::InvalidOption { key, .. } if key == "autotune"),
        "{err}"
    );
}
