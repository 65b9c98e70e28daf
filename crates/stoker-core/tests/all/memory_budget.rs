//! `memory_budget`: a batch that cannot fit is an error naming the numbers when the loader is
//! made; otherwise the in-flight cap is lowered to fit, stats say so, and the batch memory the
//! loader keeps stays within the budget.

use std::sync::Arc;

use stoker_core::testing::FakeDevice;
use stoker_core::{DType, Error, Loader, LoaderOptions, MemorySource, Source, SourceSpec};

fn options(source: Arc<dyn Source>, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(source));
    for (k, v) in kv {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    o
}

/// `n` samples of 1 KiB each (field `x`, uint8 [1024]).
fn kib_rows(n: usize) -> Arc<dyn Source> {
    let x: Vec<u8> = (0..n * 1024).map(|i| (i / 1024) as u8).collect();
    Arc::new(
        MemorySource::new()
            .with_tensor("x", DType::U8, &[1024], x)
            .unwrap(),
    )
}

#[test]
fn a_batch_larger_than_the_budget_is_an_error_naming_both_numbers() {
    // One batch of 1024 rows of 1 KiB is 1 MiB.
    let o = options(
        kib_rows(2048),
        &[("batch_size", "1024"), ("memory_budget", "512KiB")],
    );
    let err = Loader::new(&o).expect_err("an error");
    assert!(matches!(&err, Error::InvalidOption { key, .. } if key == "memory_budget"));
    let msg = err.to_string();
    assert!(msg.contains("1024 samples"), "{msg}");
    assert!(
        msg.contains("1048576 bytes") && msg.contains("524288 bytes"),
        "{msg}"
    );
    // The same batch fits a budget of one batch.
    let o = options(
        kib_rows(2048),
        &[("batch_size", "1024"), ("memory_budget", "1MiB")],
    );
    let mut l = Loader::new(&o).unwrap();
    assert_eq!(l.next().unwrap().unwrap().len(), 1024);
    let s = l.stats();
    assert_eq!(
        (s.in_flight_cap, s.batch_bytes, s.memory_budget),
        (1, 1 << 20, 1 << 20)
    );
}

#[test]
fn with_a_device_the_prefetchers_slab_must_fit_too() {
    let kv = [
        ("device", "cuda"),
        ("batch_size", "1024"),
        ("memory_budget", "1MiB"),
    ];
    let fake = FakeDevice::new(0).unwrap();
    let err = Loader::with_device_backend(&options(kib_rows(2048), &kv), fake.clone())
        .expect_err("an error");
    assert!(err.to_string().contains("needs 2 of them"), "{err}");
    let kv = [
        ("device", "cuda"),
        ("batch_size", "1024"),
        ("memory_budget", "2MiB"),
    ];
    let l = Loader::with_device_backend(&options(kib_rows(2048), &kv), fake).unwrap();
    assert_eq!(l.stats().in_flight_cap, 1);
}

#[test]
fn the_in_flight_cap_is_lowered_to_fit_and_memory_stays_within_the_budget() {
    // Batches of 256 KiB; 2 workers × prefetch 8 ask for 16 in flight (4 MiB), the budget holds 4.
    let budget = 1u64 << 20;
    let o = options(
        kib_rows(4096),
        &[
            ("batch_size", "256"),
            ("num_workers", "2"),
            ("prefetch_factor", "8"),
            ("shuffle", "true"),
            ("memory_budget", "1MiB"),
        ],
    );
    let mut l = Loader::new(&o).unwrap();
    let s = l.stats();
    assert_eq!(s.memory_budget, budget);
    assert_eq!(s.batch_bytes, 256 << 10);
    assert_eq!((s.in_flight_cap, s.in_flight_cap_requested), (4, 16));
    let mut seen = 0;
    for epoch in 0..2 {
        while let Some(b) = l.next().unwrap() {
            seen += b.len();
            drop(b);
            // With nothing held by the consumer, in-flight and idle slabs fit the budget.
            let mapped = l.arena().counters().bytes_mapped;
            assert!(mapped <= budget, "epoch {epoch}: {mapped} bytes mapped");
        }
    }
    assert_eq!(seen, 2 * 4096);
}

#[test]
fn without_the_option_the_default_budget_applies() {
    let l = Loader::new(&options(
        kib_rows(16),
        &[("batch_size", "4"), ("num_workers", "2")],
    ))
    .unwrap();
    let s = l.stats();
    assert_eq!(s.memory_budget, stoker_core::memory::default_budget());
    assert_eq!(
        s.in_flight_cap, s.in_flight_cap_requested,
        "small batches fit"
    );
    assert_eq!(s.in_flight_cap, 4);
}
