//! Behaviour of the public loader over in-memory and npy sources.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stoker_core::{
    Batch, DType, Error, FieldSpec, Loader, LoaderOptions, MemorySource, Sample, Source, SourceSpec,
};

use crate::support::{counting_source, options};

/// The sample indices of a batch of `counting_source`.
fn ids(b: &Batch) -> Vec<u8> {
    b.field_by_name("y").unwrap().data.unwrap().to_vec()
}

/// Every batch of one epoch as its sample indices.
fn epoch(loader: &mut Loader) -> Vec<Vec<u8>> {
    loader.epoch_iter().map(|b| ids(&b.unwrap())).collect()
}

#[test]
fn stacks_fields_in_sampler_order() {
    let mut l = Loader::new(&options(
        counting_source(10),
        &[("batch_size", "4"), ("num_workers", "2")],
    ))
    .unwrap();
    assert_eq!(l.batches_per_epoch(), 3);
    let b = l.next().unwrap().unwrap();
    let x = b.field(0).unwrap();
    assert_eq!(
        (x.name, x.dtype, x.shape),
        ("x", DType::I64, &[4usize, 3][..])
    );
    let values: Vec<i64> = x
        .data
        .unwrap()
        .chunks(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(values, vec![0, 1, 2, 1, 2, 3, 2, 3, 4, 3, 4, 5]);
    assert_eq!(b.field(1).unwrap().shape, &[4]);
    assert_eq!(
        b.field(0).unwrap().address % 256,
        0,
        "fields are 256-byte aligned"
    );
    assert_eq!(ids(&l.next().unwrap().unwrap()), vec![4, 5, 6, 7]);
    let last = l.next().unwrap().unwrap();
    assert_eq!(
        (ids(&last), last.len()),
        (vec![8, 9], 2),
        "short last batch"
    );
    assert!(l.next().unwrap().is_none());
    assert_eq!(l.epoch(), 1);
}

#[test]
fn end_of_epoch_then_next_epoch_with_new_order() {
    let mut l = Loader::new(&options(
        counting_source(50),
        &[
            ("batch_size", "8"),
            ("shuffle", "true"),
            ("drop_last", "true"),
            ("seed", "3"),
        ],
    ))
    .unwrap();
    let e0 = epoch(&mut l);
    assert_eq!(e0.len(), 6);
    assert_eq!(l.epoch(), 1);
    let e1 = epoch(&mut l);
    assert_eq!(e1.len(), 6);
    assert_ne!(e0, e1, "a new permutation each epoch");
    let seen: HashSet<u8> = e0.iter().flatten().copied().collect();
    assert_eq!(seen.len(), 48, "no repeats within an epoch");
}

#[test]
fn same_seed_same_batches_for_any_worker_count() {
    let run = |workers: &str, in_order: &str| {
        let mut l = Loader::new(&options(
            counting_source(97),
            &[
                ("batch_size", "5"),
                ("shuffle", "true"),
                ("seed", "42"),
                ("num_workers", workers),
                ("in_order", in_order),
                ("prefetch_factor", "3"),
            ],
        ))
        .unwrap();
        (epoch(&mut l), epoch(&mut l))
    };
    let reference = run("0", "true");
    assert_eq!(run("1", "true"), reference);
    assert_eq!(run("2", "true"), reference);
    // Out of order: the same batches, possibly permuted, never crossing epochs.
    let (a, b) = run("2", "false");
    let sorted = |mut v: Vec<Vec<u8>>| {
        v.sort();
        v
    };
    assert_eq!(sorted(a), sorted(reference.0.clone()));
    assert_eq!(sorted(b), sorted(reference.1.clone()));
}

#[test]
fn resume_mid_epoch_continues_exactly() {
    let kv = [
        ("batch_size", "4"),
        ("shuffle", "true"),
        ("seed", "7"),
        ("num_workers", "2"),
    ];
    let mut full = Loader::new(&options(counting_source(30), &kv)).unwrap();
    let uninterrupted: Vec<Vec<u8>> = [epoch(&mut full), epoch(&mut full)].concat();
    // 8 batches per epoch; stop after k batches, including at the very end of epoch 0.
    for stop_after in [0, 1, 5, 8, 11] {
        let mut first = Loader::new(&options(counting_source(30), &kv)).unwrap();
        let mut got = Vec::new();
        while got.len() < stop_after {
            if let Some(b) = first.next().unwrap() {
                got.push(ids(&b));
            }
        }
        let state = first.save_state();
        drop(first);
        let mut o = options(counting_source(30), &kv);
        o.set("seed", "999").unwrap(); // the state's seed wins
        o.set("resume_state", &state).unwrap();
        let mut resumed = Loader::new(&o).unwrap();
        while got.len() < 16 {
            if let Some(b) = resumed.next().unwrap() {
                got.push(ids(&b));
            }
        }
        assert_eq!(got, uninterrupted, "stopped after {stop_after}: {state}");
    }
}

#[test]
fn resume_after_out_of_order_delivery_skips_what_was_delivered() {
    let kv = [
        ("batch_size", "2"),
        ("num_workers", "2"),
        ("in_order", "false"),
        ("prefetch_factor", "4"),
    ];
    let mut l = Loader::new(&options(counting_source(40), &kv)).unwrap();
    let mut seen: Vec<Vec<u8>> = (0..7).map(|_| ids(&l.next().unwrap().unwrap())).collect();
    let state = l.save_state();
    let mut o = options(counting_source(40), &kv);
    o.set("resume_state", &state).unwrap();
    let mut resumed = Loader::new(&o).unwrap();
    seen.extend(epoch(&mut resumed));
    seen.sort();
    let expect: Vec<Vec<u8>> = (0..20u8).map(|b| vec![2 * b, 2 * b + 1]).collect();
    assert_eq!(seen, expect, "{state}");
}

#[test]
fn resume_state_from_another_configuration_is_rejected() {
    let mut l = Loader::new(&options(counting_source(30), &[("batch_size", "4")])).unwrap();
    l.next().unwrap();
    let state = l.save_state();
    let mut o = options(counting_source(30), &[("batch_size", "3")]);
    o.set("resume_state", &state).unwrap();
    let err = Loader::new(&o).err().unwrap();
    assert!(err.to_string().contains("resume_state"), "{err}");
}

#[test]
fn after_warm_up_no_batch_maps_memory() {
    let mut l = Loader::new(&options(
        counting_source(64),
        &[
            ("batch_size", "4"),
            ("num_workers", "2"),
            ("prefetch_factor", "2"),
            ("shuffle", "true"),
        ],
    ))
    .unwrap();
    for _ in 0..6 {
        epoch(&mut l);
    }
    let c = l.arena().counters();
    // 96 batches, but at most cap (4) in flight plus the one the consumer holds ever coexist,
    // and the arena keeps that many idle: every later batch reuses a slab.
    assert!(
        c.slabs_mapped <= 5,
        "mapped {} slabs for 96 batches",
        c.slabs_mapped
    );
    assert_eq!(c.slabs_unmapped, 0);
}

#[test]
fn slabs_a_burst_needed_are_unmapped_once_it_is_over() {
    let mut l = Loader::new(&options(
        counting_source(64),
        &[
            ("batch_size", "4"),
            ("num_workers", "2"),
            ("prefetch_factor", "2"),
        ],
    ))
    .unwrap();
    let slab = stoker_core::arena::page_size() as u64;
    // The consumer holds 12 batches at once, then lets them go: the arena keeps them idle, as
    // far as its free list's bound (the cap + 2) allows, since the demand was recent. The
    // workers building the next batches (at most the cap of 4) may take some of them back at
    // once, so count the slabs still mapped, idle or leased: without the idle ones at most 4
    // would be.
    let held: Vec<Batch> = (0..12).map(|_| l.next().unwrap().unwrap()).collect();
    drop(held);
    let c = l.arena().counters();
    assert!(c.slabs_idle + c.slabs_leased >= 5, "{c:?}");
    // Then one batch at a time for two demand windows: only what that needs stays mapped
    // (the batches in flight, at most the cap of 4, and the one held).
    let mut taken = 0;
    while taken < 2 * stoker_core::arena::DEMAND_WINDOW + 8 {
        taken += u64::from(l.next().unwrap().is_some());
    }
    let c = l.arena().counters();
    assert!(c.bytes_mapped <= 5 * slab, "{c:?}");
    assert!(c.slabs_unmapped >= 7, "{c:?}");
}

/// `inner`, counting its reads.
struct CountingReads {
    inner: Arc<dyn Source>,
    reads: AtomicUsize,
}

impl CountingReads {
    fn new(inner: Arc<dyn Source>) -> Arc<CountingReads> {
        Arc::new(CountingReads {
            inner,
            reads: AtomicUsize::new(0),
        })
    }

    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

impl Source for CountingReads {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn fields(&self) -> &[FieldSpec] {
        self.inner.fields()
    }
    fn describe(&self, i: usize) -> String {
        self.inner.describe(i)
    }
    fn read<'a>(&'a self, i: usize, s: &'a mut Vec<u8>) -> stoker_core::Result<Sample<'a>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.read(i, s)
    }
}

/// Waits until `cond` holds (the workers run concurrently), failing after 10 s.
fn eventually(what: &str, cond: impl FnMut() -> bool) {
    stoker_core::testing::eventually(what, Duration::from_secs(10), cond);
}

#[test]
fn a_consumer_that_has_not_asked_has_one_batch_more_than_the_workers_built_ahead() {
    let src = CountingReads::new(counting_source(200));
    let l = Loader::new(&options(
        src.clone(),
        &[
            ("batch_size", "2"),
            ("num_workers", "2"),
            ("prefetch_factor", "3"),
        ],
    ))
    .unwrap();
    // The cap is 2 workers × 3 = 6 batches, but the loader builds ahead only as deep as the
    // consumer has shown it needs: at first, workers + 1 = 3 batches of 2 samples.
    eventually("3 batches read", || src.reads() >= 6);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(src.reads(), 6);
    assert_eq!(l.stats().in_flight_cap, 6);
    drop(l);
}

#[test]
fn with_a_consumer_faster_than_the_workers_few_slabs_are_alive() {
    // Batches take 8 reads of 5 ms; the consumer asks at once, holding the previous batch while
    // it does (as `for batch in loader` does). Alive: the batch held, the one handed over, and
    // the workers' own; never the cap's worth (2 workers × 4 = 8 ready batches).
    let mut l = Loader::new(&options(
        stoker_core::testing::slow_counting_source(10_000, Duration::from_millis(5)),
        &[
            ("batch_size", "8"),
            ("num_workers", "2"),
            ("prefetch_factor", "4"),
        ],
    ))
    .unwrap();
    let mut held = None;
    for _ in 0..24 {
        held = Some(l.next().unwrap().unwrap());
    }
    drop(held);
    let s = l.stats();
    let slab = s.batch_bytes;
    let peak = l.arena().counters().bytes_mapped_peak / slab;
    assert_eq!(s.in_flight_cap, 8);
    // The depth starts at workers + 1 = 3 and deepens only when the consumer's waits call for
    // it, which they do not here (the workers are never held back for long). Alive at once: the
    // two batches the consumer holds at the hand-over and the workers' two, i.e. depth + 1.
    assert!(s.in_flight_depth >= 3, "{s:?}");
    assert!(peak <= s.in_flight_depth + 1, "{peak} slabs at once: {s:?}");
}

#[test]
fn a_bursty_consumer_deepens_the_prefetch_within_the_cap() {
    // Batches take 4 reads of 3 ms; the consumer takes 4 batches at once, then pauses 60 ms.
    // At depth 3 the fourth batch of every burst is started only when the first is taken, so
    // the consumer waits for it while the workers sat idle through the pause: the loader deepens
    // its prefetch (to 4, which covers the burst; never beyond the cap of 6).
    let src = CountingReads::new(stoker_core::testing::slow_counting_source(
        100_000,
        Duration::from_millis(3),
    ));
    let mut l = Loader::new(&options(
        src.clone(),
        &[
            ("batch_size", "4"),
            ("num_workers", "2"),
            ("prefetch_factor", "3"),
        ],
    ))
    .unwrap();
    let built_ahead = |l: &Loader| {
        std::thread::sleep(Duration::from_millis(60));
        src.reads() / 4 - l.stats().batches as usize
    };
    assert_eq!(built_ahead(&l), 3, "workers + 1 at first");
    let mut most = 0;
    for _burst in 0..24 {
        for _ in 0..4 {
            l.next().unwrap().unwrap();
        }
        let ahead = built_ahead(&l);
        assert!(ahead <= 6, "{ahead} batches built ahead, more than the cap");
        most = most.max(ahead);
    }
    assert!(
        most >= 4,
        "the prefetch never deepened: {most} batches built ahead"
    );
}

/// Fails on chosen indices, panics on others, sleeps on others.
struct Faulty {
    inner: Arc<dyn Source>,
    fail: Vec<usize>,
    panic: Vec<usize>,
    sleep_ms: u64,
}

impl Source for Faulty {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn fields(&self) -> &[FieldSpec] {
        self.inner.fields()
    }
    fn describe(&self, i: usize) -> String {
        format!("faulty/{i}.bin")
    }
    fn read<'a>(&'a self, i: usize, s: &'a mut Vec<u8>) -> stoker_core::Result<Sample<'a>> {
        std::thread::sleep(Duration::from_millis(self.sleep_ms));
        if self.panic.contains(&i) {
            panic!("boom at {i}");
        }
        if self.fail.contains(&i) {
            return Err(Error::Sample {
                index: i as u64,
                what: self.describe(i),
                reason: "corrupt".into(),
            });
        }
        self.inner.read(i, s)
    }
}

fn faulty(fail: &[usize], panic: &[usize], sleep_ms: u64) -> Arc<dyn Source> {
    Arc::new(Faulty {
        inner: counting_source(12),
        fail: fail.to_vec(),
        panic: panic.to_vec(),
        sleep_ms,
    })
}

#[test]
fn a_failing_sample_names_itself_and_the_loader_goes_on() {
    for workers in ["0", "2"] {
        let mut l = Loader::new(&options(
            faulty(&[5], &[], 0),
            &[("batch_size", "4"), ("num_workers", workers)],
        ))
        .unwrap();
        assert!(l.next().unwrap().is_some());
        let err = l.next().unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("sample 5") && msg.contains("faulty/5.bin"),
            "{msg}"
        );
        assert_eq!(
            ids(&l.next().unwrap().unwrap()),
            vec![8, 9, 10, 11],
            "moves past the error"
        );
        assert!(l.next().unwrap().is_none());
    }
}

#[test]
fn a_panicking_sample_becomes_an_error() {
    for workers in ["0", "1", "2"] {
        let mut l = Loader::new(&options(
            faulty(&[], &[2], 0),
            &[("batch_size", "4"), ("num_workers", workers)],
        ))
        .unwrap();
        let err = l.next().unwrap_err();
        assert!(matches!(err, Error::Internal(_)), "{err}");
        assert!(err.to_string().contains("boom at 2"), "{err}");
        assert!(l.next().unwrap().is_some(), "the worker survived");
    }
}

#[test]
fn skip_replaces_bad_samples_deterministically_and_counts_them() {
    let run = |workers: &str| {
        let mut o = options(
            faulty(&[1, 6], &[], 0),
            &[("batch_size", "4"), ("num_workers", workers)],
        );
        o.set("on_error", "skip").unwrap();
        let mut l = Loader::new(&o).unwrap();
        let batches = epoch(&mut l);
        (batches, l.stats().samples_skipped)
    };
    let (batches, skipped) = run("0");
    assert_eq!(skipped, 2);
    assert_eq!(batches.len(), 3);
    assert!(batches.iter().all(|b| b.len() == 4));
    let flat: Vec<u8> = batches.concat();
    assert!(!flat.contains(&1) && !flat.contains(&6));
    assert_eq!(run("2"), (batches, 2));
}

#[test]
fn timeout_reports_and_a_later_call_gets_the_batch() {
    let mut l = Loader::new(&options(
        faulty(&[], &[], 150),
        &[
            ("batch_size", "2"),
            ("num_workers", "1"),
            ("timeout_ms", "30"),
        ],
    ))
    .unwrap();
    let err = l.next().unwrap_err();
    assert!(matches!(err, Error::Timeout(30)), "{err}");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(ids(&l.next().unwrap().unwrap()), vec![0, 1]);
}

#[test]
fn dropping_mid_epoch_joins_workers_and_held_batches_stay_valid() {
    let src = counting_source(1000);
    let mut l = Loader::new(&options(
        src.clone(),
        &[
            ("batch_size", "10"),
            ("num_workers", "2"),
            ("prefetch_factor", "4"),
        ],
    ))
    .unwrap();
    let held = l.next().unwrap().unwrap();
    let also = l.next().unwrap().unwrap();
    drop(l);
    // Every worker has exited and released its reference to the source.
    assert_eq!(Arc::strong_count(&src), 1);
    assert_eq!(ids(&held), (0..10).collect::<Vec<u8>>());
    assert_eq!(ids(&also), (10..20).collect::<Vec<u8>>());
}

#[test]
fn ragged_fields_are_padded_with_lengths() {
    let rows: Vec<Vec<u8>> = (0..5u8)
        .map(|i| (0..i).flat_map(|v| (v as f32).to_ne_bytes()).collect())
        .collect();
    let src: Arc<dyn Source> = Arc::new(
        MemorySource::new()
            .with_ragged("seq", DType::F32, &[], rows)
            .unwrap(),
    );
    let err = Loader::new(&options(src.clone(), &[("batch_size", "3")]))
        .err()
        .unwrap();
    assert!(err.to_string().contains("pad"), "{err}");
    let mut l = Loader::new(&options(
        src,
        &[("batch_size", "3"), ("pad", "-1"), ("num_workers", "1")],
    ))
    .unwrap();
    let b = l.next().unwrap().unwrap();
    let seq = b.field_by_name("seq").unwrap();
    assert_eq!(seq.shape, &[3, 2]);
    let v: Vec<f32> = seq
        .data
        .unwrap()
        .chunks(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(v, vec![-1.0, -1.0, 0.0, -1.0, 0.0, 1.0]);
    let lens = b.field_by_name("seq_lengths").unwrap();
    assert_eq!((lens.dtype, lens.shape), (DType::I64, &[3usize][..]));
    let lens: Vec<i64> = lens
        .data
        .unwrap()
        .chunks(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(lens, vec![0, 1, 2]);
    let b = l.next().unwrap().unwrap();
    assert_eq!(
        b.field_by_name("seq").unwrap().shape,
        &[2, 4],
        "padded to this batch's longest"
    );
}

/// A pad value the field's type cannot hold is refused, naming both (-1 was stored as 0 in a
/// uint8 field, 1e10 as 2147483647 in an int32 one); raw bytes keep their own pad, 0.
#[test]
fn a_pad_the_fields_type_cannot_hold_is_refused() {
    let pairs: Vec<Vec<u8>> = (0..4u8).map(|i| vec![7; 2 * i as usize]).collect();
    let ints: Vec<Vec<u8>> = (0..4i32)
        .map(|i| (0..i).flat_map(|v| v.to_ne_bytes()).collect())
        .collect();
    for (dtype, inner, rows, pad) in [
        (DType::U8, vec![2], pairs.clone(), "-1"),
        (DType::I32, vec![], ints.clone(), "1e10"),
        (DType::I32, vec![], ints, "1.5"),
    ] {
        let src: Arc<dyn Source> = Arc::new(
            MemorySource::new()
                .with_ragged("seq", dtype, &inner, rows)
                .unwrap(),
        );
        let e = Loader::new(&options(src, &[("batch_size", "2"), ("pad", pad)]))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!("pad={}", pad.parse::<f64>().unwrap()))
                && e.contains(&format!("field `seq` is {dtype}")),
            "{e}"
        );
    }
    let bytes: Vec<Vec<u8>> = (0..4u8).map(|i| vec![7; i as usize]).collect();
    let src: Arc<dyn Source> = Arc::new(
        MemorySource::new()
            .with_ragged("txt", DType::U8, &[], bytes)
            .unwrap(),
    );
    let mut l = Loader::new(&options(src, &[("batch_size", "4"), ("pad", "-1")])).unwrap();
    let b = l.next().unwrap().unwrap();
    assert_eq!(
        b.field_by_name("txt").unwrap().data.unwrap()[..3],
        [0, 0, 0]
    );
}

/// The field a ragged one adds (`seq_lengths` padded, `seq_offsets` flat) may not be a field of
/// the source too: a batch held both, and a reader by name got the source's.
#[test]
fn a_field_named_like_the_one_the_batch_adds_is_refused() {
    let rows: Vec<Vec<u8>> = (0..4u8).map(|i| vec![7; i as usize]).collect();
    for (added, kv) in [
        ("seq_lengths", ("pad", "0")),
        ("seq_offsets", ("ragged", "offsets")),
    ] {
        let src: Arc<dyn Source> = Arc::new(
            MemorySource::new()
                .with_ragged("seq", DType::U8, &[], rows.clone())
                .unwrap()
                .with_tensor(added, DType::I64, &[], vec![0; 32])
                .unwrap(),
        );
        let e = Loader::new(&options(src, &[("batch_size", "2"), kv]))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!("adds field `{added}`")) && e.contains(kv.0),
            "{e}"
        );
    }
}

#[test]
fn distributed_ranks_split_the_epoch() {
    let mut all = Vec::new();
    for rank in 0..3 {
        let rank = rank.to_string();
        let mut l = Loader::new(&options(
            counting_source(10),
            &[
                ("batch_size", "2"),
                ("world_size", "3"),
                ("rank", &rank),
                ("shuffle", "true"),
            ],
        ))
        .unwrap();
        let got: Vec<u8> = epoch(&mut l).concat();
        assert_eq!(got.len(), 4, "ceil(10 / 3)");
        all.extend(got);
    }
    let distinct: HashSet<u8> = all.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        10,
        "every sample on some rank; 2 repeats pad the shards"
    );
}

#[test]
fn stats_count_deliveries_and_waits() {
    let mut l = Loader::new(&options(
        counting_source(20),
        &[("batch_size", "4"), ("num_workers", "2")],
    ))
    .unwrap();
    let handle = l.stats_handle();
    epoch(&mut l);
    let s = handle.snapshot();
    assert_eq!((s.batches, s.samples, s.samples_skipped), (5, 20, 0));
    assert!(s.wait_ns_p50 <= s.wait_ns_p95 && s.wait_ns_p95 <= s.wait_ns_max);
    assert!(s.wait_ns_max <= s.wait_ns_total);
    assert!((0.0..=1.0).contains(&s.readiness) && (0.0..=1.0).contains(&s.worker_busy));
    assert!(s.elapsed_ns >= s.wait_ns_total);
}

/// The largest mlock this process may do: unlimited with CAP_IPC_LOCK (root), else the soft
/// RLIMIT_MEMLOCK.
fn memlock_allowance() -> u64 {
    // SAFETY: geteuid has no preconditions; getrlimit writes into the struct we pass.
    unsafe {
        if libc::geteuid() == 0 {
            return u64::MAX;
        }
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) != 0 {
            return 0;
        }
        r.rlim_cur
    }
}

fn pinned_loader() -> Loader {
    Loader::new(&options(
        counting_source(8),
        &[
            ("batch_size", "4"),
            ("pin_memory", "true"),
            ("num_workers", "0"),
        ],
    ))
    .unwrap()
}

#[test]
fn pin_memory_locks_the_batch_where_the_limit_allows() {
    if std::env::var_os("STOKER_TEST_MEMLOCK_REFUSED").is_some() {
        return; // the child run of the fallback test below
    }
    // A batch of 4 samples of this source fits in one 64 KiB slab.
    if memlock_allowance() < (1 << 20) {
        eprintln!("RLIMIT_MEMLOCK below 1 MiB without CAP_IPC_LOCK: covered by the fallback test");
        return;
    }
    let mut l = pinned_loader();
    let b = l.next().unwrap().unwrap();
    let s = l.stats();
    assert!(b.is_pinned(), "{s:?}");
    assert!(s.slabs_pinned >= 1 && s.pin_failures == 0, "{s:?}");
}

/// With mlock refused (RLIMIT_MEMLOCK 0, and no CAP_IPC_LOCK: a root run drops to `nobody`),
/// batches come unpinned and stats count the refusals. Runs in a child process, since limits
/// and identity are per process.
#[test]
fn pin_memory_falls_back_and_counts_when_mlock_refused() {
    if std::env::var_os("STOKER_TEST_MEMLOCK_REFUSED").is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "loader::pin_memory_falls_back_and_counts_when_mlock_refused",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("STOKER_TEST_MEMLOCK_REFUSED", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "{text}");
        return;
    }
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on this (child) process; `zero` outlives the call.
    unsafe {
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &zero), 0);
        if libc::geteuid() == 0 {
            assert_eq!(libc::setgid(65534), 0);
            assert_eq!(libc::setuid(65534), 0);
        }
    }
    let mut l = pinned_loader();
    let b = l.next().unwrap().unwrap();
    let s = l.stats();
    assert!(!b.is_pinned(), "{s:?}");
    assert!(s.pin_failures >= 1 && s.slabs_pinned == 0, "{s:?}");
    assert_eq!(ids(&b), vec![0, 1, 2, 3], "the data is there all the same");
}

fn npy_file(name: &str, dtype: DType, shape: &[usize], data: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stoker-loader-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    stoker_core::source::write_npy(&path, dtype, shape, data).unwrap();
    path
}

#[test]
fn npy_source_with_labels_end_to_end() {
    let data: Vec<u8> = (0..60).map(|i| i as u8).collect();
    let x = npy_file("x.npy", DType::U8, &[10, 2, 3], &data);
    let labels: Vec<u8> = (0..10i32).flat_map(|v| (v * 10).to_le_bytes()).collect();
    let y = npy_file("y.npy", DType::I32, &[10], &labels);
    let mut o = LoaderOptions::default();
    for (k, v) in [
        ("source", format!("npy:{}", x.display())),
        ("labels", format!("npy:{}", y.display())),
        ("batch_size", "4".into()),
        ("shuffle", "true".into()),
    ] {
        o.set(k, &v).unwrap();
    }
    let mut l = Loader::new(&o).unwrap();
    for b in l.epoch_iter() {
        let b = b.unwrap();
        assert_eq!(b.num_fields(), 2);
        let d = b.field(0).unwrap();
        let lab = b.field(1).unwrap();
        assert_eq!(d.name, "data");
        assert_eq!(&d.shape[1..], &[2, 3]);
        assert_eq!((lab.name, lab.dtype), ("label", DType::I64));
        for (row, label) in d.data.unwrap().chunks(6).zip(lab.data.unwrap().chunks(8)) {
            let i = row[0] as usize / 6;
            assert_eq!(row, &data[i * 6..i * 6 + 6]);
            assert_eq!(i64::from_ne_bytes(label.try_into().unwrap()), i as i64 * 10);
        }
    }
    let mut missing = LoaderOptions::default();
    missing.set("source", "npy:/nonexistent/x.npy").unwrap();
    let err = Loader::new(&missing).err().unwrap();
    assert!(
        matches!(err, Error::Io { .. }) && err.to_string().contains("/nonexistent/x.npy"),
        "{err}"
    );
}

#[test]
fn bad_configurations_are_errors_not_panics() {
    assert!(Loader::new(&LoaderOptions::default())
        .err()
        .unwrap()
        .to_string()
        .contains("source"));
    let mut cuda = options(counting_source(4), &[("device", "cuda")]);
    let err = Loader::new(&cuda).err().unwrap();
    assert_eq!(err.kind(), stoker_core::ErrorKind::Unsupported);
    cuda.set("device", "cpu").unwrap();
    cuda.set("transform", "hflip").unwrap();
    assert!(Loader::new(&cuda)
        .err()
        .unwrap()
        .to_string()
        .contains("transform"));
    let empty = Loader::new(&options(
        counting_source(3),
        &[("batch_size", "4"), ("drop_last", "true")],
    ));
    let mut empty = empty.unwrap();
    assert_eq!(empty.batches_per_epoch(), 0);
    assert!(
        empty.next().unwrap().is_none(),
        "an empty epoch ends at once"
    );
}

#[test]
fn callback_source_feeds_a_loader_and_pads() {
    use stoker_core::source::ReadFn;
    let read: Arc<ReadFn> = Arc::new(|i, w| {
        if i == 7 {
            return Err(format!("no sample {i} today"));
        }
        let seq: Vec<u8> = (0..i as i32 % 4).flat_map(|v| v.to_ne_bytes()).collect();
        w.put_tensor("tokens", DType::I32, &[i % 4], &seq)?;
        w.put_label(i as i64)
    });
    let mut o = LoaderOptions::new().with_source(SourceSpec::Callback { len: 10, read });
    o.set("batch_size", "4").unwrap();
    // Sample 0 has an empty sequence; others differ: without pad the shapes mismatch.
    let mut l = Loader::new(&o).unwrap();
    let e = l.next().unwrap_err().to_string();
    assert!(
        e.contains("sample 1") && e.contains("`tokens`") && e.contains("pad"),
        "{e}"
    );

    o.set("pad", "0").unwrap();
    o.set("num_workers", "2").unwrap();
    let mut l = Loader::new(&o).unwrap();
    let b = l.next().unwrap().unwrap();
    let names: Vec<&str> = b.fields().map(|f| f.name).collect();
    assert_eq!(names, ["tokens", "label", "tokens_lengths"]);
    assert_eq!(b.field(0).unwrap().shape, &[4, 3]);
    let lens = b.field(2).unwrap().data.unwrap();
    assert_eq!(
        lens,
        [0i64, 1, 2, 3]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect::<Vec<u8>>()
    );
    let e = l.next().unwrap_err();
    assert!(
        matches!(e, Error::Callback { index: 7, .. })
            && e.to_string().contains("no sample 7 today"),
        "{e}"
    );
}

#[test]
fn batches_can_be_shared_and_sent_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Batch>();
    send_sync::<stoker_core::StatsHandle>();
    fn send<T: Send>() {}
    send::<Loader>();
}

/// Sample 0 blocks until the test opens its gate; the others are instant.
struct Gated {
    inner: Arc<dyn Source>,
    open: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

impl Source for Gated {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn fields(&self) -> &[FieldSpec] {
        self.inner.fields()
    }
    fn describe(&self, i: usize) -> String {
        self.inner.describe(i)
    }
    fn read<'a>(&'a self, i: usize, s: &'a mut Vec<u8>) -> stoker_core::Result<Sample<'a>> {
        if i == 0 {
            let (lock, cv) = &*self.open;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
        }
        self.inner.read(i, s)
    }
}

/// Opens the gate when dropped, so that a failing assertion cannot leave a worker blocked
/// (dropping the loader joins its workers).
struct Gate(Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>);

impl Gate {
    fn open(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

fn gated(in_order: &str) -> (Loader, Gate) {
    let open = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let src = Arc::new(Gated {
        inner: counting_source(6),
        open: Arc::clone(&open),
    });
    let l = Loader::new(&options(
        src,
        &[
            ("batch_size", "1"),
            ("num_workers", "2"),
            ("in_order", in_order),
            ("timeout_ms", "300"),
        ],
    ))
    .unwrap();
    (l, Gate(open))
}

#[test]
fn in_order_false_lets_ready_batches_overtake_a_slow_one() {
    // `gate` is declared after the loader, so it opens before the loader joins its workers.
    let (mut l, gate) = gated("false");
    // Batch 0 cannot finish while the gate is shut; the others overtake it.
    let first: Vec<Vec<u8>> = (0..4).map(|_| ids(&l.next().unwrap().unwrap())).collect();
    assert!(!first.contains(&vec![0]), "{first:?}");
    gate.open();
    let mut all: Vec<Vec<u8>> = first;
    all.extend(epoch(&mut l));
    all.sort();
    assert_eq!(all, (0..6u8).map(|i| vec![i]).collect::<Vec<_>>());

    // in_order=true: nothing overtakes; the consumer waits (here: times out) for batch 0.
    let (mut l, gate) = gated("true");
    let err = l.next().unwrap_err();
    assert_eq!(err.kind(), stoker_core::ErrorKind::Timeout, "{err}");
    gate.open();
    let order: Vec<Vec<u8>> = epoch(&mut l);
    assert_eq!(order, (0..6u8).map(|i| vec![i]).collect::<Vec<_>>());
}

#[test]
fn a_slow_source_reads_as_starved_and_a_slow_consumer_as_ready() {
    // Every sample takes 20 ms and the consumer takes nothing: it waits nearly all the time.
    let mut starved = Loader::new(&options(
        faulty(&[], &[], 20),
        &[
            ("batch_size", "2"),
            ("num_workers", "1"),
            ("prefetch_factor", "1"),
        ],
    ))
    .unwrap();
    epoch(&mut starved);
    let s = starved.stats();
    assert!(
        s.readiness < 0.5,
        "a 20 ms/sample source must read starved: {s:?}"
    );
    assert!(s.wait_ns_total > 100_000_000, "{s:?}");

    // An instant source and a consumer that takes 10 ms per batch: batches wait for it.
    let mut ready = Loader::new(&options(
        counting_source(40),
        &[("batch_size", "2"), ("num_workers", "1")],
    ))
    .unwrap();
    while let Some(b) = ready.next().unwrap() {
        drop(b);
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = ready.stats();
    assert!(s.readiness > 0.5, "a busy consumer must read ready: {s:?}");
}

#[test]
fn the_rust_api_cannot_build_an_invalid_configuration() {
    // Every setter validates: a bad value is an error naming the key, and changes nothing.
    let err = LoaderOptions::new().with("batch_size", "0").unwrap_err();
    assert!(err.to_string().contains("`batch_size`"), "{err}");
    let mut o = options(counting_source(10), &[("batch_size", "4")]);
    assert!(o.set("prefetch_factor", "0").is_err());
    assert_eq!((o.batch_size(), o.prefetch_factor()), (4, 2));

    // What needs the dataset is checked when the loader is made, with the numbers.
    let mut o = options(counting_source(10), &[]);
    o.set_sampler(stoker_core::SamplerKind::SubsetRandom {
        indices: vec![3, 99],
    });
    let err = Loader::new(&o).unwrap_err();
    assert!(
        err.to_string().contains("99") && err.to_string().contains("10 samples"),
        "{err}"
    );

    // Sizes that input can reach fail cleanly instead of aborting on allocation.
    let o = options(counting_source(10), &[("subset", "0..1000000000000")]);
    let err = Loader::new(&o).unwrap_err();
    assert!(err.to_string().contains("`subset`"), "{err}");
    let o = options(
        counting_source(10),
        &[("replacement", "true"), ("num_samples", "1000000000000000")],
    );
    let err = Loader::new(&o).unwrap_err();
    assert_eq!(err.kind(), stoker_core::ErrorKind::OutOfMemory, "{err}");
    assert!(err.to_string().contains("`num_samples`"), "{err}");
    let o = options(counting_source(10), &[("subset", "1..100,2")]);
    let err = Loader::new(&o).unwrap_err();
    assert!(err.to_string().contains("index 99"), "{err}");
}
