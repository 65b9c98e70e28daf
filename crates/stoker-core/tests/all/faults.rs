//! Faults a training job meets in the field: a disk returning EIO, short reads, files deleted or
//! truncated while an epoch runs, a user's read function failing or panicking, a stalled source,
//! `mlock` refused, a consumer that never releases its batches. Each must give the documented
//! error kind and a message naming what failed, and the loader (or a new one) must keep working.
//!
//! Faults that need a process of their own (a lowered RLIMIT_MEMLOCK, a truncated mapping) run in
//! a child: this test binary re-executed on one `#[ignore]`d test with `STOKER_FAULTS_CHILD` set.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use stoker_core::cuda::FakeDevice;
use stoker_core::source::{
    CallbackSource, FieldRules, IterableSource, ReadFn, SampleStream, SampleWriter, StreamInfo,
};
use stoker_core::{
    Batch, DType, Error, ErrorKind, FieldSpec, Loader, LoaderOptions, Sample, Source, SourceSpec,
};

use crate::support::{counting_source, options};

/// The sample indices of a batch of `counting_source` (field `y`).
fn ids(b: &Batch) -> Vec<u8> {
    b.field_by_name("y")
        .expect("field y")
        .data
        .expect("host memory")
        .to_vec()
}

/// A gate a stalled read waits on until the test opens it. The wait is bounded (10 s) so that a
/// broken test fails instead of hanging.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn wait(&self) {
        let open = self.open.lock().unwrap();
        let _unused = self
            .cv
            .wait_timeout_while(open, Duration::from_secs(10), |open| !*open)
            .unwrap();
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

enum Fault {
    /// `EIO` from the storage, as `Error::Io` naming the file.
    Eio,
    /// Fewer bytes than the field holds (a short read the source did not notice).
    Short,
    /// The read blocks until the gate opens.
    Stall(Arc<Gate>),
}

/// `counting_source(12)` (x: int64 [3], y: uint8), misbehaving on sample `at`.
struct Faulty {
    inner: Arc<dyn Source>,
    at: usize,
    fault: Fault,
}

fn faulty(at: usize, fault: Fault) -> Arc<dyn Source> {
    Arc::new(Faulty {
        inner: counting_source(12),
        at,
        fault,
    })
}

impl Source for Faulty {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn fields(&self) -> &[FieldSpec] {
        self.inner.fields()
    }

    fn describe(&self, i: usize) -> String {
        format!("/mnt/shard/{i}.bin")
    }

    fn read<'a>(&'a self, i: usize, scratch: &'a mut Vec<u8>) -> stoker_core::Result<Sample<'a>> {
        if i != self.at {
            return self.inner.read(i, scratch);
        }
        match &self.fault {
            Fault::Eio => Err(Error::Io {
                path: PathBuf::from(self.describe(i)),
                reason: std::io::Error::from_raw_os_error(libc::EIO).to_string(),
            }),
            Fault::Short => {
                let mut sample = self.inner.read(i, scratch)?;
                let x = sample.get(0);
                sample.set(0, &x[..16]);
                Ok(sample)
            }
            Fault::Stall(gate) => {
                gate.wait();
                self.inner.read(i, scratch)
            }
        }
    }
}

#[test]
fn eio_mid_epoch_is_an_io_error_naming_the_file_and_the_loader_goes_on() {
    for workers in ["0", "2"] {
        let mut l = Loader::new(&options(
            faulty(5, Fault::Eio),
            &[("batch_size", "4"), ("num_workers", workers)],
        ))
        .unwrap();
        assert_eq!(ids(&l.next().unwrap().unwrap()), vec![0, 1, 2, 3]);
        let err = l.next().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Io, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("/mnt/shard/5.bin") && msg.contains("Input/output error"),
            "{msg}"
        );
        assert_eq!(ids(&l.next().unwrap().unwrap()), vec![8, 9, 10, 11]);
        assert!(l.next().unwrap().is_none());
        // The next epoch meets the same fault and goes on the same way.
        assert!(l.next().unwrap().is_some());
        assert_eq!(l.next().unwrap_err().kind(), ErrorKind::Io);
        assert!(l.next().unwrap().is_some());
    }
}

#[test]
fn eio_under_on_error_skip_is_replaced_and_counted() {
    let mut l = Loader::new(&options(
        faulty(5, Fault::Eio),
        &[
            ("batch_size", "4"),
            ("num_workers", "2"),
            ("on_error", "skip"),
        ],
    ))
    .unwrap();
    let batches: Vec<Vec<u8>> = l.epoch_iter().map(|b| ids(&b.unwrap())).collect();
    assert_eq!(batches.len(), 3);
    assert!(batches.iter().all(|b| b.len() == 4));
    assert!(!batches.concat().contains(&5));
    assert_eq!(l.stats().samples_skipped, 1);
}

#[test]
fn a_short_read_is_a_sample_error_with_the_sizes_and_the_loader_goes_on() {
    for workers in ["0", "2"] {
        let mut l = Loader::new(&options(
            faulty(6, Fault::Short),
            &[("batch_size", "4"), ("num_workers", workers)],
        ))
        .unwrap();
        assert!(l.next().unwrap().is_some());
        let err = l.next().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Decode, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("sample 6")
                && msg.contains("/mnt/shard/6.bin")
                && msg.contains("has 16 bytes; expected int64 [3] (24 bytes)"),
            "{msg}"
        );
        assert_eq!(ids(&l.next().unwrap().unwrap()), vec![8, 9, 10, 11]);
    }
}

/// A user's read function over 12 samples (x: int64 [3], label), misbehaving on sample 6.
fn callback_source(misbehave: fn(usize) -> Result<(), String>) -> Arc<dyn Source> {
    let read: Arc<ReadFn> = Arc::new(move |i, w| {
        misbehave(i)?;
        let x: Vec<u8> = [i as i64, i as i64 + 1, i as i64 + 2]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        w.put_tensor("x", DType::I64, &[3], &x)?;
        w.put_label(i as i64)
    });
    Arc::new(CallbackSource::new(12, read, FieldRules::default()).unwrap())
}

fn labels(b: &Batch) -> Vec<i64> {
    b.field_by_name("label")
        .unwrap()
        .data
        .unwrap()
        .chunks_exact(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_callback_failing_mid_epoch_is_a_callback_error_and_the_loader_goes_on() {
    for workers in ["0", "2"] {
        let source = callback_source(|i| match i {
            6 => Err("disk on fire at 6".into()),
            _ => Ok(()),
        });
        let mut l = Loader::new(&options(
            source,
            &[("batch_size", "4"), ("num_workers", workers)],
        ))
        .unwrap();
        assert_eq!(labels(&l.next().unwrap().unwrap()), vec![0, 1, 2, 3]);
        let err = l.next().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Callback, "{err}");
        assert_eq!(
            err.to_string(),
            "sample 6: source callback failed: disk on fire at 6"
        );
        assert_eq!(labels(&l.next().unwrap().unwrap()), vec![8, 9, 10, 11]);
        assert!(l.next().unwrap().is_none());
    }
}

#[test]
fn a_callback_panicking_mid_epoch_is_an_internal_error_and_the_worker_survives() {
    for workers in ["0", "1", "2"] {
        let source = callback_source(|i| {
            if i == 6 {
                panic!("dataset bug at {i}");
            }
            Ok(())
        });
        let mut l = Loader::new(&options(
            source,
            &[("batch_size", "4"), ("num_workers", workers)],
        ))
        .unwrap();
        for _epoch in 0..2 {
            assert!(l.next().unwrap().is_some());
            let err = l.next().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
            let msg = err.to_string();
            assert!(
                msg.contains("panic while building batch 1") && msg.contains("dataset bug at 6"),
                "{msg}"
            );
            // With one worker, this batch proves the worker that caught the panic lives on.
            assert_eq!(labels(&l.next().unwrap().unwrap()), vec![8, 9, 10, 11]);
            assert!(l.next().unwrap().is_none());
        }
    }
    // A new loader over the same source works too.
    let source = callback_source(|_| Ok(()));
    let mut l = Loader::new(&options(source, &[("batch_size", "12")])).unwrap();
    assert_eq!(l.next().unwrap().unwrap().len(), 12);
}

#[test]
fn a_stalled_source_times_out_without_consuming_and_then_delivers_in_order() {
    let gate = Arc::new(Gate::default());
    let mut l = Loader::new(&options(
        faulty(1, Fault::Stall(Arc::clone(&gate))),
        &[
            ("batch_size", "2"),
            ("num_workers", "2"),
            ("timeout_ms", "50"),
        ],
    ))
    .unwrap();
    for _ in 0..2 {
        let err = l.next().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
        assert_eq!(err.to_string(), "no batch arrived within timeout_ms=50");
        assert_eq!(l.position(), 0, "a timeout consumes nothing");
    }
    gate.open();
    // The stalled batch arrives once its read returns; bounded retries of 50 ms each.
    let first = (0..200)
        .find_map(|_| match l.next() {
            Err(e) if e.kind() == ErrorKind::Timeout => None,
            other => Some(other.unwrap().unwrap()),
        })
        .expect("the batch after the stall");
    assert_eq!(ids(&first), vec![0, 1]);
    let rest: Vec<Vec<u8>> = l.epoch_iter().map(|b| ids(&b.unwrap())).collect();
    assert_eq!(rest.len(), 5);
    assert_eq!(rest[0], vec![2, 3]);
}

#[test]
fn timeout_ms_with_num_workers_0_is_refused_not_ignored() {
    // With no workers the batch is built on the calling thread: no timeout could interrupt it,
    // so the combination is an error naming the key instead of a bound that silently fails.
    let err = Loader::new(&options(
        counting_source(8),
        &[("num_workers", "0"), ("timeout_ms", "50")],
    ))
    .expect_err("timeout_ms with num_workers=0");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("timeout_ms") && msg.contains("num_workers"),
        "{msg}"
    );
    // Without the timeout, num_workers=0 works.
    let mut l = Loader::new(&options(counting_source(8), &[("num_workers", "0")])).unwrap();
    assert!(l.next().unwrap().is_some());
}

/// Closes `loader` from another thread after `after` while this one waits in `next`.
fn close_while_waiting(l: &mut Loader, after: Duration) -> stoker_core::Result<Option<Batch>> {
    let closer = l.closer();
    let t = std::thread::spawn(move || {
        std::thread::sleep(after);
        closer.close();
    });
    let outcome = l.next();
    t.join().unwrap();
    outcome
}

#[test]
fn close_from_another_thread_wakes_a_next_stalled_on_the_source() {
    let gate = Arc::new(Gate::default());
    let mut l = Loader::new(&options(
        faulty(1, Fault::Stall(Arc::clone(&gate))),
        &[("batch_size", "2"), ("num_workers", "2")],
    ))
    .unwrap();
    let start = Instant::now();
    let err =
        close_while_waiting(&mut l, Duration::from_millis(100)).expect_err("a next woken by close");
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    // Woken by the close, not by the source (which stays stalled for up to 10 s).
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    // Every later call says closed too, without waiting.
    assert_eq!(l.next().unwrap_err().kind(), ErrorKind::Closed);
    assert_eq!(l.set_epoch(3).unwrap_err().kind(), ErrorKind::Closed);
    // Let the stalled read return so that dropping the loader can join its workers.
    gate.open();
    drop(l);
    // A new loader on the same data works.
    let mut again = Loader::new(&options(counting_source(8), &[("num_workers", "2")])).unwrap();
    assert!(again.next().unwrap().is_some());
}

/// An iterable source whose stream gives sample 0, then stalls on `gate` before each later one.
struct Stalling(Arc<Gate>);

struct StallingStream {
    gate: Arc<Gate>,
    at: i64,
}

impl IterableSource for Stalling {
    fn open(&self, _: &StreamInfo, _: Option<&str>) -> Result<Box<dyn SampleStream>, String> {
        Ok(Box::new(StallingStream {
            gate: Arc::clone(&self.0),
            at: 0,
        }))
    }
}

impl SampleStream for StallingStream {
    fn next(&mut self, out: &mut SampleWriter<'_>) -> Result<bool, String> {
        if self.at > 0 {
            self.gate.wait();
        }
        self.at += 1;
        out.put_label(self.at)?;
        Ok(self.at < 8)
    }
}

fn stalling_stream(gate: Arc<Gate>) -> Arc<dyn IterableSource> {
    Arc::new(Stalling(gate))
}

#[test]
fn close_from_another_thread_wakes_a_streaming_next() {
    // A stream whose feeder stalls: the consumer waits on the stream's workers.
    let gate = Arc::new(Gate::default());
    let stream = stalling_stream(Arc::clone(&gate));
    let mut o = LoaderOptions::new().with_source(SourceSpec::Iterable(stream));
    o.set("batch_size", "2").unwrap();
    o.set("num_workers", "1").unwrap();
    let mut l = Loader::new(&o).unwrap();
    let err = close_while_waiting(&mut l, Duration::from_millis(100)).expect_err("woken by close");
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    gate.open();
}

#[test]
fn close_from_another_thread_wakes_a_next_waiting_for_the_device() {
    // With a device the consumer waits for the prefetch thread, which waits for the pool.
    let gate = Arc::new(Gate::default());
    let o = options(
        faulty(1, Fault::Stall(Arc::clone(&gate))),
        &[
            ("device", "cuda"),
            ("batch_size", "2"),
            ("num_workers", "1"),
        ],
    );
    let mut l = Loader::with_device_backend(&o, FakeDevice::new(0).unwrap()).unwrap();
    let start = Instant::now();
    let err = close_while_waiting(&mut l, Duration::from_millis(100)).expect_err("woken by close");
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    gate.open();
}

#[test]
fn closing_a_loader_between_batches_ends_it_and_joins_its_threads() {
    let mut l = Loader::new(&options(
        counting_source(64),
        &[("batch_size", "4"), ("num_workers", "2")],
    ))
    .unwrap();
    let held = l.next().unwrap().unwrap();
    l.closer().close();
    assert_eq!(l.next().unwrap_err().kind(), ErrorKind::Closed);
    // A batch handed out before the close stays valid.
    assert_eq!(ids(&held), vec![0, 1, 2, 3]);
    drop(l);
    drop(held);
}

#[test]
fn a_consumer_holding_every_host_batch_gets_them_all_and_memory_returns_on_release() {
    // Host batches are the consumer's memory: holding them does not block the workers (each new
    // batch gets a new slab), so there is nothing to deadlock on; a memory budget is what would
    // bound it. With timeout_ms set, no call times out either.
    let mut l = Loader::new(&options(
        counting_source(64),
        &[
            ("batch_size", "8"),
            ("num_workers", "2"),
            ("prefetch_factor", "2"),
            ("timeout_ms", "5000"),
        ],
    ))
    .unwrap();
    let mut held = Vec::new();
    for _epoch in 0..3 {
        while let Some(b) = l.next().unwrap() {
            held.push(b);
        }
    }
    assert_eq!(held.len(), 24);
    let c = l.arena().counters();
    assert!(c.slabs_leased >= 24, "{c:?}");
    let cap = 2 * 2;
    drop(held);
    let c = l.arena().counters();
    assert!(c.slabs_leased <= cap as u64, "in flight only: {c:?}");
    // The loader goes on, reusing the returned slabs. A batch in flight at the release may
    // have begun mapping a slab while the consumer held them all, so count from after those
    // batches (at most the cap, delivered in order) are delivered.
    let mut delivered = 0;
    while delivered < cap {
        delivered += usize::from(l.next().unwrap().is_some());
    }
    let mapped = l.arena().counters().slabs_mapped;
    for _ in 0..16 {
        l.next().unwrap();
    }
    assert_eq!(
        l.arena().counters().slabs_mapped,
        mapped,
        "no new slab after release"
    );
}

#[test]
fn a_consumer_holding_the_whole_device_ring_gets_a_clear_error_at_once_not_a_hang() {
    // Device batches are ring buffers the prefetcher reuses; the ring grows while the memory
    // budget allows (here it does not: one-page batches, a budget of 4 pages for the host's 2
    // and the ring's 2). Holding all of them would stall it forever, so asking for one more
    // fails at once (with or without timeout_ms) and consumes nothing; releasing one lets the
    // loader go on.
    let fake = FakeDevice::new(0).unwrap();
    let budget = (4 * stoker_core::arena::page_size()).to_string();
    let o = options(
        counting_source(40),
        &[
            ("device", "cuda"),
            ("batch_size", "2"),
            ("num_workers", "1"),
            ("prefetch_factor", "1"),
            ("timeout_ms", "10000"),
            ("memory_budget", &budget),
        ],
    );
    let mut l = Loader::with_device_backend(&o, fake.clone()).unwrap();
    let first = l.next().unwrap().unwrap();
    let second = l.next().unwrap().unwrap();
    for _ in 0..3 {
        let err = l.next().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(
            err.to_string().contains("held by batches not yet released")
                && err.to_string().contains("memory_budget"),
            "{err}"
        );
    }
    drop(first);
    assert_eq!(l.next().unwrap().unwrap().position(), 2);
    drop(second);
}

#[test]
fn files_deleted_or_truncated_mid_epoch_are_errors_naming_them_and_the_loader_goes_on() {
    let root = std::env::temp_dir().join(format!("stoker-faults-{}-folder", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let photo = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/images/photo_baseline.jpg"),
    )
    .unwrap();
    for name in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        let p = root.join("class").join(format!("{name}.jpg"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, &photo).unwrap();
    }
    let mut o = LoaderOptions::new();
    o.set("source", &format!("image_folder:{}", root.display()))
        .unwrap();
    for (k, v) in [
        ("batch_size", "2"),
        ("num_workers", "0"), // batches are read when asked for, after the damage below
        ("transform", "resize(8, 8)"),
    ] {
        o.set(k, v).unwrap();
    }
    let mut l = Loader::new(&o).unwrap();
    assert!(l.next().unwrap().is_some());
    let deleted = root.join("class/d.jpg");
    std::fs::remove_file(&deleted).unwrap();
    let truncated = root.join("class/e.jpg");
    std::fs::write(&truncated, &photo[..photo.len() / 2]).unwrap();

    let err = l.next().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&deleted.display().to_string()) && msg.contains("not found"),
        "{msg}"
    );
    let err = l.next().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Decode, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&truncated.display().to_string()) && msg.contains("truncated JPEG"),
        "{msg}"
    );
    assert_eq!(l.next().unwrap().unwrap().len(), 2);
    assert!(l.next().unwrap().is_none());
    // A new loader under on_error=skip gets through the damaged folder: it indexes the 7 files
    // left and replaces the truncated one.
    o.set("on_error", "skip").unwrap();
    drop(l);
    let mut l = Loader::new(&o).unwrap();
    assert_eq!(l.epoch_iter().map(|b| b.unwrap().len()).sum::<usize>(), 7);
    assert_eq!(l.stats().samples_skipped, 1);
    let _ = std::fs::remove_dir_all(&root);
}

/// A (4096, 64) uint8 `.npy` file whose row `i` is `i % 251` repeated.
fn write_npy(path: &Path) {
    let mut header = "{'descr': '|u1', 'fortran_order': False, 'shape': (4096, 64), }".to_owned();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for i in 0..4096 {
        bytes.extend_from_slice(&[(i % 251) as u8; 64]);
    }
    std::fs::write(path, &bytes).unwrap();
}

fn npy_loader(path: &Path) -> Loader {
    let mut o = LoaderOptions::new();
    o.set("source", &format!("npy:{}", path.display())).unwrap();
    for (k, v) in [("batch_size", "512"), ("num_workers", "0")] {
        o.set(k, v).unwrap();
    }
    Loader::new(&o).unwrap()
}

#[test]
fn an_npy_file_deleted_mid_epoch_keeps_serving_the_mapped_rows() {
    // Unlinking a file keeps its data while it is mapped: the epoch goes on unharmed.
    let dir = std::env::temp_dir().join(format!("stoker-faults-{}-npydel", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x.npy");
    write_npy(&path);
    let mut l = npy_loader(&path);
    assert!(l.next().unwrap().is_some());
    std::fs::remove_file(&path).unwrap();
    let batches: Vec<Batch> = l.epoch_iter().map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 7);
    let last = batches[6].field_by_name("data").unwrap().data.unwrap();
    assert_eq!(last[last.len() - 1], (4095 % 251) as u8);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the `#[ignore]`d test `name` of this module in a child process with
/// `STOKER_FAULTS_CHILD` set.
fn run_child(name: &str) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args([
            &format!("faults::{name}"),
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("STOKER_FAULTS_CHILD", "1")
        .output()
        .expect("re-executing the test binary")
}

fn in_child() -> bool {
    std::env::var_os("STOKER_FAULTS_CHILD").is_some()
}

#[test]
fn mlock_refused_falls_back_to_pageable_memory_and_is_counted() {
    let out = run_child("child_mlock_refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed: {}\n{stdout}\n{stderr}",
        out.status
    );
}

/// Lowers RLIMIT_MEMLOCK to 0 (and, as root, drops CAP_IPC_LOCK, which overrides the limit),
/// checks that mlock really is refused, then runs pinned loaders.
#[test]
#[ignore = "run in a child process by mlock_refused_falls_back_to_pageable_memory_and_is_counted"]
fn child_mlock_refused() {
    if !in_child() {
        return;
    }
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads the struct; lowering a limit is always allowed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &zero) }, 0);
    drop_ipc_lock_capability();
    let page = 4096;
    let probe = vec![0u8; 2 * page];
    // SAFETY: mlock of memory we own; unlocked at once if it succeeds.
    let locked = unsafe { libc::mlock(probe.as_ptr().cast(), page) } == 0;
    if locked {
        // SAFETY: the range was just locked.
        unsafe { libc::munlock(probe.as_ptr().cast(), page) };
    }
    assert!(!locked, "mlock still succeeds; the test cannot refuse it");

    for workers in ["0", "2"] {
        let mut l = Loader::new(&options(
            counting_source(32),
            &[
                ("batch_size", "8"),
                ("num_workers", workers),
                ("pin_memory", "true"),
            ],
        ))
        .unwrap();
        let batches: Vec<Batch> = l.epoch_iter().map(|b| b.unwrap()).collect();
        assert_eq!(batches.len(), 4);
        assert!(batches.iter().all(|b| !b.is_pinned()));
        assert_eq!(ids(&batches[3]), (24..32).collect::<Vec<u8>>());
        let s = l.stats();
        assert_eq!(s.slabs_pinned, 0);
        assert!(s.pin_failures >= 1, "{s:?}");
    }
}

/// Clears CAP_IPC_LOCK from this thread's effective set (threads spawned later inherit it).
/// Hand-written because no crate in the tree wraps capset(2); a no-op without the capability.
fn drop_ipc_lock_capability() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes two `Data` (version 3) for the calling thread.
    let got = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    assert_eq!(got, 0, "capget: {}", std::io::Error::last_os_error());
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    // SAFETY: capset reads the header and two `Data`; clearing an effective bit is allowed.
    let set = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    assert_eq!(set, 0, "capset: {}", std::io::Error::last_os_error());
}

#[test]
fn an_npy_file_truncated_while_mapped_is_an_error_not_a_crash() {
    // In a child: if the SIGBUS guard (source/mapped.rs) ever breaks, the child dies, not this
    // test binary.
    let out = run_child("child_npy_truncated");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child died: {} (SIGBUS is signal 7)\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "run in a child process by an_npy_file_truncated_while_mapped_is_an_error_not_a_crash"]
fn child_npy_truncated() {
    if !in_child() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("stoker-faults-{}-npy", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x.npy");
    write_npy(&path); // 256 KiB of rows, well past the first page
    let mut l = npy_loader(&path);
    assert!(l.next().unwrap().is_some());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let outcome = l.next();
    let err = outcome.expect_err("rows past the truncation cannot be read");
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("x.npy") && msg.contains("truncated"), "{msg}");
    // The loader goes on answering (every batch now fails: the file is not what was opened),
    // and a loader on the rewritten file reads it.
    assert_eq!(l.next().unwrap_err().kind(), ErrorKind::Io);
    drop(l);
    write_npy(&path);
    let mut again = npy_loader(&path);
    assert!(again.next().unwrap().is_some());
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A path given to a source that is missing or of the wrong kind is an I/O error naming the
/// path and saying in words what is wrong with it, never a bare operating-system message ("No
/// such device (os error 19)" is what mapping a directory gives).
#[test]
fn a_wrong_path_is_named_and_said_in_words() {
    let dir = std::env::temp_dir().join(format!("stoker-paths-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let folder = dir.join("a_directory.npy");
    std::fs::create_dir_all(&folder).unwrap();
    let file = dir.join("a_file");
    std::fs::write(&file, b"not a directory").unwrap();
    let missing = dir.join("missing.npy");
    let good = dir.join("good.npy");
    stoker_core::source::write_npy(&good, stoker_core::DType::U8, &[4], &[1, 2, 3, 4]).unwrap();
    let show = |p: &Path| p.display().to_string();
    // (options, the path the error names, what it says of it)
    type Case<'a> = (Vec<(&'a str, String)>, PathBuf, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![("source", format!("npy:{}", show(&folder)))],
            folder.clone(),
            "is a directory, not an .npy file",
        ),
        (
            vec![("source", format!("npy:{}", show(&missing)))],
            missing.clone(),
            "not found",
        ),
        (
            vec![
                ("source", format!("npy:{}", show(&good))),
                ("labels", format!("npy:{}", show(&folder))),
            ],
            folder.clone(),
            "is a directory, not an .npy file",
        ),
        (
            vec![("source", format!("image_folder:{}", show(&file)))],
            file.clone(),
            "is a file, not a directory",
        ),
        (
            vec![("source", format!("image_folder:{}", show(&missing)))],
            missing.clone(),
            "not found",
        ),
        (
            vec![("source", format!("tar:{}", show(&folder)))],
            folder.clone(),
            "is a directory, not a tar shard",
        ),
        (
            vec![
                ("source", format!("tar:{}", show(&folder))),
                ("shuffle_buffer", "4".to_owned()),
            ],
            folder.clone(),
            "is a directory, not a tar shard",
        ),
        (
            vec![("source", format!("packed:{}", show(&file)))],
            file.clone(),
            "",
        ),
    ];
    for (opts, path, says) in cases {
        let mut o = LoaderOptions::new();
        for (k, v) in &opts {
            o.set(k, v).unwrap();
        }
        let err = Loader::new(&o)
            .err()
            .unwrap_or_else(|| panic!("{opts:?} opened"));
        let msg = err.to_string();
        assert!(
            msg.contains(&show(&path)) && msg.contains(says) && !msg.contains("os error"),
            "{opts:?}: {msg}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
