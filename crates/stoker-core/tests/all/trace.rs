//! `trace=PATH`: a Chrome trace-event file that parses, whose spans nest (stages inside their
//! sample, samples inside their batch, on the worker's own track) and add up to the stats.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use stoker_core::testing::FakeDevice;
use stoker_core::trace::TRACE_BATCHES;
use stoker_core::{DType, Error, Loader, LoaderOptions, MemorySource, Source, Stats};

use crate::support::{counting_source, options};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stoker-trace-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("trace.json")
}

/// One event of the file, in integer nanoseconds (the file has µs with three decimals).
#[derive(Clone, Debug)]
struct Ev {
    ph: String,
    name: String,
    tid: u64,
    ts: i64,
    dur: i64,
    args: Value,
}

impl Ev {
    fn end(&self) -> i64 {
        self.ts + self.dur
    }
    fn contains(&self, other: &Ev) -> bool {
        self.tid == other.tid && self.ts <= other.ts && other.end() <= self.end()
    }
    fn arg(&self, key: &str) -> Option<u64> {
        self.args.get(key).and_then(Value::as_u64)
    }
}

fn ns(v: &Value) -> i64 {
    (v.as_f64().unwrap() * 1000.0).round() as i64
}

/// The file's events and its thread names by tid.
fn parse(path: &Path) -> (Vec<Ev>, BTreeMap<u64, String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    assert_eq!(json["displayTimeUnit"], "ms");
    let mut events = Vec::new();
    let mut names = BTreeMap::new();
    for e in json["traceEvents"].as_array().unwrap() {
        let ph = e["ph"].as_str().unwrap().to_owned();
        let tid = e["tid"].as_u64().unwrap();
        assert_eq!(e["pid"].as_u64(), Some(u64::from(std::process::id())));
        if ph == "M" {
            if e["name"] == "thread_name" {
                names.insert(tid, e["args"]["name"].as_str().unwrap().to_owned());
            }
            continue;
        }
        events.push(Ev {
            ph: ph.clone(),
            name: e["name"].as_str().unwrap().to_owned(),
            tid,
            ts: ns(&e["ts"]),
            dur: if ph == "X" { ns(&e["dur"]) } else { 0 },
            args: e.get("args").cloned().unwrap_or(Value::Null),
        });
    }
    (events, names)
}

fn total(events: &[Ev], name: &str) -> u64 {
    events
        .iter()
        .filter(|e| e.name == name && e.ph == "X")
        .map(|e| e.dur as u64)
        .sum()
}

fn photo(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/images")
            .join(name),
    )
    .unwrap()
}

/// Images and labels in memory: every sample is read, decoded, transformed and collated.
fn image_source(n: usize) -> Arc<dyn Source> {
    let rows: Vec<Vec<u8>> = ["photo_444.jpg", "photo_progressive.jpg", "photo_png.png"]
        .iter()
        .cycle()
        .take(n)
        .map(|f| photo(f))
        .collect();
    let labels: Vec<u8> = (0..n as i64).flat_map(|i| i.to_ne_bytes()).collect();
    Arc::new(
        MemorySource::new()
            .with_encoded_images("image", rows)
            .unwrap()
            .with_tensor("label", DType::I64, &[], labels)
            .unwrap(),
    )
}

/// Runs `epochs` epochs, drops the loader (which writes the trace) and returns the stats of
/// everything it did.
fn run(o: &LoaderOptions, epochs: usize, device: Option<Arc<FakeDevice>>) -> Stats {
    let mut l = match device {
        Some(fake) => Loader::with_device_backend(o, fake).unwrap(),
        None => Loader::new(o).unwrap(),
    };
    for _ in 0..epochs {
        while let Some(b) = l.next().unwrap() {
            if b.is_device() {
                b.synchronize().unwrap();
            }
        }
    }
    let stats = l.stats_handle();
    drop(l); // joins every thread, then writes the trace
    stats.snapshot()
}

#[test]
fn spans_nest_inside_their_sample_and_batch_and_add_up_to_the_stats() {
    let path = temp("nest");
    let o = options(
        image_source(10),
        &[
            ("batch_size", "4"),
            ("num_workers", "2"),
            (
                "transform",
                "random_resized_crop(24) | hflip | normalize(imagenet)",
            ),
            ("trace", path.to_str().unwrap()),
        ],
    );
    let stats = run(&o, 2, None);
    let (events, names) = parse(&path);

    let workers: Vec<u64> = names
        .iter()
        .filter(|(_, n)| n.starts_with("stoker-worker-"))
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(workers.len(), 2, "{names:?}");
    assert!(
        names.values().any(|n| n.starts_with("consumer")),
        "{names:?}"
    );

    let batches: Vec<&Ev> = events.iter().filter(|e| e.name == "batch").collect();
    let samples: Vec<&Ev> = events.iter().filter(|e| e.name == "sample").collect();
    // Every batch built (2 epochs of 3, and any built ahead before the drop) is on a worker track.
    assert!(batches.len() >= 6, "{}", batches.len());
    assert!(batches.iter().all(|b| workers.contains(&b.tid)));
    // Each batch holds each of its slots twice: phase 1 reads, phase 2 writes. The first two
    // batches are split across the two workers: one `batch` span per part, each holding its
    // part's slots.
    let mut slots_of: BTreeMap<(u64, u64), Vec<(u64, String)>> = BTreeMap::new();
    for b in &batches {
        let inside: Vec<&&Ev> = samples.iter().filter(|s| b.contains(s)).collect();
        let children: i64 = inside.iter().map(|s| s.dur).sum();
        assert!(children <= b.dur, "{b:?}: samples last {children} ns");
        let key = (b.arg("epoch").unwrap(), b.arg("position").unwrap());
        slots_of.entry(key).or_default().extend(
            inside
                .iter()
                .map(|s| (s.arg("slot").unwrap(), s.args["phase"].to_string())),
        );
        let split = key.0 == 0 && key.1 < 2;
        assert_eq!(b.arg("parts"), split.then_some(2), "{b:?}");
    }
    for ((epoch, position), mut slots) in slots_of {
        let size = if position == 2 { 2 } else { 4 };
        slots.sort();
        let want: Vec<(u64, String)> = (0..size)
            .flat_map(|slot| {
                [
                    (slot, "\"read\"".to_owned()),
                    (slot, "\"write\"".to_owned()),
                ]
            })
            .collect();
        assert_eq!(slots, want, "batch {position} of epoch {epoch}");
    }
    // Every stage span lies inside a sample of the same index (reads in phase 1, the others in
    // phase 2); the batch-level collate (taking the slab) lies inside a batch.
    for e in events
        .iter()
        .filter(|e| ["read", "decode", "transform", "collate"].contains(&e.name.as_str()))
    {
        match e.arg("index") {
            Some(index) => {
                let phase = if e.name == "read" { "read" } else { "write" };
                let parent = samples.iter().find(|s| {
                    s.contains(e) && s.arg("index") == Some(index) && s.args["phase"] == phase
                });
                assert!(parent.is_some(), "{e:?} has no sample around it");
            }
            None => {
                assert_eq!(e.name, "collate");
                assert!(batches.iter().any(|b| b.contains(e)), "{e:?}");
            }
        }
    }
    // Within one sample, its stages add up to at most the sample.
    for s in &samples {
        let stages: i64 = events
            .iter()
            .filter(|e| e.name != "sample" && e.name != "batch" && s.contains(e))
            .filter(|e| e.arg("index") == s.arg("index"))
            .map(|e| e.dur)
            .sum();
        assert!(stages <= s.dur, "{s:?}: stages last {stages} ns");
    }
    // The trace holds every batch here, so its stage spans sum to the stats' totals exactly.
    assert_eq!(total(&events, "read"), stats.read_ns);
    assert_eq!(total(&events, "decode"), stats.decode_ns);
    assert_eq!(total(&events, "transform"), stats.transform_ns);
    assert_eq!(total(&events, "collate"), stats.collate_ns);
    assert!(stats.decode_ns > 0 && stats.transform_ns > 0);
    // The consumer waited once per batch delivered and was handed each batch.
    let waits = events.iter().filter(|e| e.name == "wait").count();
    let delivers = events.iter().filter(|e| e.name == "deliver").count();
    assert_eq!((waits, delivers), (6, 6));
    assert_eq!(total(&events, "wait"), stats.wait_ns_total);
}

#[test]
fn device_copies_are_on_the_prefetch_track() {
    let path = temp("device");
    let fake = FakeDevice::new(0).unwrap();
    fake.set_copy_delay(Duration::from_millis(2));
    let o = options(
        counting_source(12),
        &[
            ("device", "cuda"),
            ("batch_size", "4"),
            ("num_workers", "1"),
            ("trace", path.to_str().unwrap()),
        ],
    );
    let stats = run(&o, 1, Some(fake));
    let (events, names) = parse(&path);
    let h2d: Vec<&Ev> = events.iter().filter(|e| e.name == "h2d").collect();
    // The prefetch thread may have copied batches of the next epoch before the drop.
    assert!(h2d.len() >= 3, "{h2d:?}");
    let tid = h2d[0].tid;
    assert!(h2d.iter().all(|e| e.tid == tid));
    assert_eq!(
        names.get(&tid).map(String::as_str),
        Some("stoker-prefetch-cuda0")
    );
    assert_eq!(total(&events, "h2d"), stats.h2d_ns);
    assert!(stats.h2d_ns >= h2d.len() as u64 * 2_000_000, "{stats:?}");
}

#[test]
fn the_trace_keeps_the_last_batches_of_each_track() {
    let path = temp("ring");
    let n = TRACE_BATCHES + 100;
    let o = options(
        counting_source(n),
        &[
            ("batch_size", "1"),
            ("num_workers", "1"),
            ("trace", path.to_str().unwrap()),
        ],
    );
    let stats = run(&o, 1, None);
    assert_eq!(stats.batches, n as u64);
    let (events, _) = parse(&path);
    let count = |name: &str| events.iter().filter(|e| e.name == name).count();
    assert_eq!(count("batch"), TRACE_BATCHES);
    assert_eq!(count("wait"), TRACE_BATCHES);
    // The last ones are kept: the final batch of the epoch is there, the first is not.
    let positions: Vec<u64> = events
        .iter()
        .filter(|e| e.name == "wait")
        .filter_map(|e| e.arg("position"))
        .collect();
    assert!(positions.contains(&(n as u64 - 1)));
    assert!(!positions.contains(&0));
}

#[test]
fn an_unwritable_trace_path_fails_when_the_loader_is_made() {
    let o = options(
        counting_source(4),
        &[("trace", "/nonexistent-stoker-dir/sub/trace.json")],
    );
    let err = Loader::new(&o).expect_err("an error");
    assert!(
        matches!(err, Error::InvalidOption { ref key, .. } if key == "trace"),
        "{err}"
    );
    assert!(
        err.to_string().contains("/nonexistent-stoker-dir/sub"),
        "{err}"
    );
}

#[test]
fn write_trace_writes_what_was_recorded_so_far() {
    let path = temp("early");
    let mut l = Loader::new(&options(
        counting_source(8),
        &[
            ("batch_size", "4"),
            ("num_workers", "0"),
            ("trace", path.to_str().unwrap()),
        ],
    ))
    .unwrap();
    // Created empty when the loader is made.
    assert_eq!(std::fs::read(&path).unwrap().len(), 0);
    l.next().unwrap().unwrap();
    l.write_trace().unwrap();
    let (events, names) = parse(&path);
    assert_eq!(events.iter().filter(|e| e.name == "batch").count(), 1);
    assert!(
        names.values().any(|n| n.contains("calling thread")),
        "{names:?}"
    );
}

#[test]
fn a_streaming_loaders_spans_are_on_its_worker_tracks_and_add_up_to_the_stats() {
    let dir = crate::support::files::tmp("trace-stream");
    let source = crate::support::files::photo_shard(&dir, 10);
    for workers in ["0", "2"] {
        let path = temp(&format!("stream-{workers}"));
        let mut o = LoaderOptions::new();
        for (k, v) in [
            ("source", source.as_str()),
            ("batch_size", "4"),
            ("shuffle_buffer", "3"),
            ("num_workers", workers),
            (
                "transform",
                "random_resized_crop(24) | hflip | normalize(imagenet)",
            ),
            ("trace", path.to_str().unwrap()),
        ] {
            o.set(k, v).unwrap();
        }
        let stats = run(&o, 2, None);
        let (events, names) = parse(&path);
        // The threads that build batches are named as the host scheduler names them.
        let builders: Vec<u64> = names
            .iter()
            .filter(|(_, n)| {
                if workers == "0" {
                    n.contains("calling thread")
                } else {
                    n.starts_with("stoker-worker-")
                }
            })
            .map(|(t, _)| *t)
            .collect();
        let threads = if workers == "0" { 1 } else { 2 };
        assert_eq!(builders.len(), threads, "num_workers={workers}: {names:?}");
        let batches: Vec<&Ev> = events.iter().filter(|e| e.name == "batch").collect();
        // Two epochs of 3 batches, and any built ahead before the drop; never split.
        assert!(batches.len() >= 6, "{}", batches.len());
        assert!(batches.iter().all(|b| builders.contains(&b.tid)));
        assert!(
            batches.iter().all(|b| b.arg("parts").is_none()),
            "{batches:?}"
        );
        // Each batch holds its samples' read and write phases.
        let samples: Vec<&Ev> = events.iter().filter(|e| e.name == "sample").collect();
        for b in &batches {
            let inside = samples.iter().filter(|s| b.contains(s)).count();
            let size = if b.arg("position") == Some(2) { 2 } else { 4 };
            assert_eq!(inside, 2 * size, "{b:?}");
        }
        assert_eq!(total(&events, "read"), stats.read_ns);
        assert_eq!(total(&events, "decode"), stats.decode_ns);
        assert_eq!(total(&events, "transform"), stats.transform_ns);
        assert_eq!(total(&events, "collate"), stats.collate_ns);
        assert!(stats.decode_ns > 0 && stats.transform_ns > 0);
        let waits = events.iter().filter(|e| e.name == "wait").count();
        let delivers = events.iter().filter(|e| e.name == "deliver").count();
        assert_eq!((waits, delivers), (6, 6));
        assert_eq!(total(&events, "wait"), stats.wait_ns_total);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
