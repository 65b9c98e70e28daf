//! Per-stage time in stats: each stage's total and per-sample percentiles land where the work
//! happened, and the stages of a batch add up to at most the time the workers were busy.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use stoker_core::testing::FakeDevice;
use stoker_core::{Loader, MemorySource, Stage, Stats};

use crate::support::{counting_source, options};

use stoker_core::testing::SlowRead;

fn drain_epoch(l: &mut Loader) -> usize {
    let mut n = 0;
    while let Some(b) = l.next().unwrap() {
        n += b.len();
    }
    n
}

/// Stage totals never exceed the busy time they are part of, and the per-worker split sums to
/// the total.
fn check_consistent(s: &Stats) {
    let stages: u64 = Stage::ALL.iter().map(|st| s.stage_ns(*st)).sum();
    assert!(
        stages <= s.busy_ns,
        "stages {stages} > busy {}: {s:?}",
        s.busy_ns
    );
    assert_eq!(s.worker_busy_ns.iter().sum::<u64>(), s.busy_ns, "{s:?}");
    for (p50, p95) in [
        (s.read_ns_p50, s.read_ns_p95),
        (s.decode_ns_p50, s.decode_ns_p95),
        (s.transform_ns_p50, s.transform_ns_p95),
        (s.collate_ns_p50, s.collate_ns_p95),
        (s.h2d_ns_p50, s.h2d_ns_p95),
    ] {
        assert!(p50 <= p95, "{s:?}");
    }
}

#[test]
fn a_slow_read_shows_in_read_time() {
    let delay = Duration::from_millis(3);
    let source = Arc::new(SlowRead {
        inner: counting_source(12),
        delay,
    });
    let mut l = Loader::new(&options(
        source,
        &[("batch_size", "4"), ("num_workers", "2")],
    ))
    .unwrap();
    assert_eq!(drain_epoch(&mut l), 12);
    let s = l.stats();
    check_consistent(&s);
    let d = delay.as_nanos() as u64;
    assert!(s.read_ns >= 12 * d, "{s:?}");
    assert!(s.read_ns_p50 >= d && s.read_ns_p95 >= d, "{s:?}");
    // Tensor fields are copied, never decoded or transformed.
    assert_eq!((s.decode_ns, s.transform_ns, s.h2d_ns), (0, 0, 0));
    assert_eq!((s.decode_ns_p50, s.transform_ns_p95), (0, 0));
    assert!(s.collate_ns > 0 && s.collate_ns_p50 > 0, "{s:?}");
    assert_eq!(s.num_workers, 2);
    assert_eq!(s.worker_busy_ns.len(), 2);
    // Reads dominate the busy time of these workers.
    assert!(s.busy_ns >= s.read_ns && s.read_ns > s.collate_ns, "{s:?}");
}

#[test]
fn building_in_the_calling_thread_is_one_worker() {
    let mut l = Loader::new(&options(
        counting_source(10),
        &[("batch_size", "3"), ("num_workers", "0")],
    ))
    .unwrap();
    drain_epoch(&mut l);
    let s = l.stats();
    check_consistent(&s);
    assert_eq!(s.num_workers, 1);
    assert_eq!(s.worker_busy_ns.len(), 1);
    assert!(s.read_ns > 0 && s.collate_ns > 0, "{s:?}");
}

fn photo(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/images")
            .join(name),
    )
    .unwrap()
}

#[test]
fn images_are_decoded_and_transformed_per_sample() {
    let rows: Vec<Vec<u8>> = ["photo_444.jpg", "photo_baseline.jpg", "photo_png.png"]
        .iter()
        .cycle()
        .take(9)
        .map(|n| photo(n))
        .collect();
    let labels: Vec<u8> = (0..9i64).flat_map(|i| i.to_ne_bytes()).collect();
    let source = MemorySource::new()
        .with_encoded_images("image", rows)
        .unwrap()
        .with_tensor("label", stoker_core::DType::I64, &[], labels)
        .unwrap();
    let mut l = Loader::new(&options(
        Arc::new(source),
        &[
            ("batch_size", "4"),
            ("num_workers", "2"),
            (
                "transform",
                "resize(32) | center_crop(32) | normalize(imagenet)",
            ),
        ],
    ))
    .unwrap();
    assert_eq!(drain_epoch(&mut l), 9);
    let s = l.stats();
    check_consistent(&s);
    assert!(s.decode_ns > 0 && s.decode_ns_p50 > 0, "{s:?}");
    assert!(s.transform_ns > 0 && s.transform_ns_p50 > 0, "{s:?}");
    // The label is copied: collate work of its own.
    assert!(s.collate_ns > 0 && s.collate_ns_p50 > 0, "{s:?}");
    assert!(s.read_ns > 0, "{s:?}");
}

#[test]
fn a_slow_copy_to_the_device_shows_in_h2d_time() {
    let fake = FakeDevice::new(0).unwrap();
    let delay = Duration::from_millis(4);
    fake.set_copy_delay(delay);
    let o = options(
        counting_source(12),
        &[
            ("device", "cuda"),
            ("batch_size", "4"),
            ("num_workers", "1"),
        ],
    );
    let mut l = Loader::with_device_backend(&o, fake.clone()).unwrap();
    let mut batches = 0;
    while let Some(b) = l.next().unwrap() {
        b.synchronize().unwrap();
        batches += 1;
    }
    // The prefetch thread records a copy once it completed, after handing the batch out and
    // before passing on the end of the epoch: every copy is counted by now.
    assert_eq!(batches, 3);
    let s = l.stats();
    check_consistent(&s);
    let d = delay.as_nanos() as u64;
    assert!(s.h2d_ns >= 3 * d, "{s:?}");
    assert!(s.h2d_ns_p50 >= d, "{s:?}");
    assert!(s.read_ns > 0 && s.collate_ns > 0, "{s:?}");
}

#[test]
fn a_streaming_loader_records_every_stage_per_worker() {
    let dir = crate::support::files::tmp("stages-stream");
    let source = crate::support::files::photo_shard(&dir, 9);
    for workers in ["0", "2"] {
        let mut o = stoker_core::LoaderOptions::new();
        for (k, v) in [
            ("source", source.as_str()),
            ("batch_size", "4"),
            ("shuffle_buffer", "4"),
            ("num_workers", workers),
            (
                "transform",
                "resize(32) | center_crop(32) | normalize(imagenet)",
            ),
        ] {
            o.set(k, v).unwrap();
        }
        let mut l = Loader::new(&o).unwrap();
        assert!(l.is_streaming());
        assert_eq!(drain_epoch(&mut l), 9);
        let s = l.stats();
        check_consistent(&s);
        assert!(
            s.read_ns > 0 && s.read_ns_p50 > 0,
            "num_workers={workers}: {s:?}"
        );
        assert!(
            s.decode_ns > 0 && s.decode_ns_p50 > 0,
            "num_workers={workers}: {s:?}"
        );
        assert!(
            s.transform_ns > 0 && s.transform_ns_p50 > 0,
            "num_workers={workers}: {s:?}"
        );
        assert!(
            s.collate_ns > 0 && s.collate_ns_p50 > 0,
            "num_workers={workers}: {s:?}"
        );
        // The calling thread counts as one worker, as on the host.
        let threads = if workers == "0" { 1 } else { 2 };
        assert_eq!(s.num_workers, threads, "{s:?}");
        assert_eq!(s.worker_busy_ns.len(), threads as usize, "{s:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
