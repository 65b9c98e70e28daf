//! Soak: hundreds of epochs with loaders created and dropped mid-epoch, at seeded random points,
//! from several threads at once. After a warm-up (epoch 10) the process's resident memory, open
//! file descriptors and memory mappings must stay flat to the end, and no loader thread may be
//! left behind. Figures are printed (`cargo test --test all -- --ignored soak:: --nocapture`).
//!
//! One test, ignored by a plain `cargo test`: the figures are the whole process's, so nothing else
//! may run beside it. The test command runs it in a process of its own (`--ignored soak::`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use stoker_core::rng::{Rng, Stream};
use stoker_core::{DType, Loader, LoaderOptions, MemorySource, Source};

use crate::support::options;

const SAMPLES: usize = 64;
const BATCH: usize = 8;
const BATCHES_PER_EPOCH: u64 = (SAMPLES / BATCH) as u64;
const EPOCHS: u64 = 300;
const WARM_UP_EPOCHS: u64 = 10;
const THREADS: u64 = 4;
/// int64 elements a sample: 16 KiB, so a batch is 128 KiB and a leaked one shows.
const ROW: usize = 2048;
/// Resident memory may grow this much after warm-up (allocator arenas and thread-stack caches
/// settling; measured: +0.2 MiB). Leaking one batch in eight grows it by ~130 MiB, and the
/// ~2 MB per epoch once reported would exceed it twenty times over.
const RSS_SLACK_BYTES: u64 = 16 << 20;
/// A few descriptors of slack for the test harness itself.
const FD_SLACK: usize = 4;
/// Memory mappings may grow by what glibc keeps after threads exit, which is bounded by the
/// most threads alive at once (here 4 + 4 × 3 workers), not by how many loaders come and go:
/// one malloc arena (up to 2 mappings) per concurrent thread, and cached thread stacks (2
/// mappings each). Measured: +8 to +16 by epoch 300, +18 by epoch 3000. Leaking every loader
/// (~220) adds ~1400.
const MAPS_SLACK: usize = 64;

#[derive(Clone, Copy, Debug)]
struct Figures {
    epoch: u64,
    rss_bytes: u64,
    fds: usize,
    maps: usize,
}

fn figures(epoch: u64) -> Figures {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("/proc/self/status has VmRSS in kB");
    Figures {
        epoch,
        rss_bytes: rss_kib * 1024,
        fds: std::fs::read_dir("/proc/self/fd")
            .expect("listing /proc/self/fd")
            .count(),
        maps: std::fs::read_to_string("/proc/self/maps")
            .expect("reading /proc/self/maps")
            .lines()
            .count(),
    }
}

/// Names of this process's threads that stoker started (`stoker-worker-N`, `stoker-prefetch-*`).
fn stoker_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("listing /proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name.starts_with("stoker-"))
        .collect()
}

/// Sample `i` is `ROW` int64 values equal to `i`.
fn sample_bytes() -> Vec<u8> {
    (0..SAMPLES as i64)
        .flat_map(|i| std::iter::repeat_n(i, ROW))
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

fn memory_source() -> Arc<dyn Source> {
    Arc::new(
        MemorySource::new()
            .with_tensor("data", DType::I64, &[ROW], sample_bytes())
            .expect("the soak source"),
    )
}

/// The same samples as an int64 `.npy` file of shape (SAMPLES, ROW), so that some loaders map
/// a file (and would leak its mapping or descriptor if they leaked anything).
fn write_npy() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stoker-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the soak directory");
    let path = dir.join("data.npy");
    let mut header =
        format!("{{'descr': '<i8', 'fortran_order': False, 'shape': ({SAMPLES}, {ROW}), }}");
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&sample_bytes());
    std::fs::write(&path, bytes).expect("writing the soak npy file");
    path
}

/// One loader's life: random options over the in-memory source or the npy file, a random
/// number of batches (past epoch ends, up to three epochs), sometimes a batch kept past the
/// loader, then dropped wherever it stands.
fn one_loader(rng: &mut Rng, source: &Arc<dyn Source>, npy: &Path, batches_seen: &AtomicU64) {
    let workers = rng.below(4).to_string();
    let prefetch = [1, 2, 4][rng.below(3) as usize].to_string();
    let shuffle = if rng.below(2) == 0 { "false" } else { "true" };
    let in_order = if rng.below(4) == 0 { "false" } else { "true" };
    let seed = rng.next_u64().to_string();
    let kv = [
        ("batch_size", BATCH.to_string()),
        ("num_workers", workers),
        ("prefetch_factor", prefetch),
        ("shuffle", shuffle.to_owned()),
        ("in_order", in_order.to_owned()),
        ("seed", seed),
    ];
    let kv: Vec<(&str, &str)> = kv.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let o = if rng.below(4) == 0 {
        let mut o = LoaderOptions::new();
        o.set("source", &format!("npy:{}", npy.display()))
            .expect("source=npy:");
        for (k, v) in &kv {
            o.set(k, v).expect("a soak option");
        }
        o
    } else {
        options(Arc::clone(source), &kv)
    };
    let mut loader = Loader::new(&o).expect("creating a soak loader");
    let stop_after = rng.below(3 * BATCHES_PER_EPOCH + 1);
    let mut kept = None;
    for n in 0..stop_after {
        match loader.next().expect("a soak batch") {
            Some(batch) => {
                // Every sample is one of the dataset's: ROW copies of its index.
                let x = batch
                    .field_by_name("data")
                    .expect("the data field")
                    .data
                    .expect("host memory");
                assert_eq!(x.len(), BATCH * ROW * 8);
                assert!(x.chunks_exact(ROW * 8).all(|row| {
                    let first = i64::from_ne_bytes(row[..8].try_into().unwrap());
                    (first as usize) < SAMPLES && row[ROW * 8 - 8..] == row[..8]
                }));
                batches_seen.fetch_add(1, Ordering::Relaxed);
                if n == stop_after / 2 && rng.below(3) == 0 {
                    kept = Some(batch);
                }
            }
            None => continue, // end of an epoch; the next call starts the next one
        }
    }
    drop(loader);
    // A batch may outlive its loader; its memory is released when it goes.
    if let Some(batch) = kept {
        assert_eq!(batch.len(), BATCH);
    }
}

#[test]
#[ignore = "measures the whole process (memory, descriptors, threads): run alone, `cargo test --test all -- --ignored soak::`"]
fn hundreds_of_epochs_with_loaders_dropped_mid_epoch_keep_memory_fds_and_threads_flat() {
    let npy = Arc::new(write_npy());
    let source = memory_source();
    let batches_seen = Arc::new(AtomicU64::new(0));
    let warm: Arc<Mutex<Option<Figures>>> = Arc::new(Mutex::new(None));
    let barrier = Arc::new(Barrier::new(THREADS as usize));
    let loaders = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let failure: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (source, npy, batches_seen, warm, barrier, loaders, stop, failure) = (
                Arc::clone(&source),
                Arc::clone(&npy),
                Arc::clone(&batches_seen),
                Arc::clone(&warm),
                Arc::clone(&barrier),
                Arc::clone(&loaders),
                Arc::clone(&stop),
                Arc::clone(&failure),
            );
            std::thread::spawn(move || {
                let mut rng = Rng::for_key(17, Stream::Order, t, 0);
                // Rounds end at a barrier, where every loader of the round has been dropped: the
                // leader takes the figures there and decides, for every thread alike, whether to
                // go on. A failing loader is recorded rather than unwinding past the barrier,
                // which would leave the other threads waiting forever. Bounded: a round averages
                // ~6 epochs, so ~50 rounds; 1000 is a safety stop.
                for _round in 0..1000 {
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        one_loader(&mut rng, &source, &npy, &batches_seen)
                    }));
                    if let Err(panic) = outcome {
                        let msg = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        failure.lock().unwrap().get_or_insert(msg);
                    }
                    loaders.fetch_add(1, Ordering::Relaxed);
                    if barrier.wait().is_leader() {
                        let epoch = batches_seen.load(Ordering::SeqCst) / BATCHES_PER_EPOCH;
                        let mut warm = warm.lock().unwrap();
                        if warm.is_none() && epoch >= WARM_UP_EPOCHS {
                            *warm = Some(figures(epoch));
                        }
                        let failed = failure.lock().unwrap().is_some();
                        stop.store(epoch >= EPOCHS || failed, Ordering::SeqCst);
                    }
                    barrier.wait();
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a soak thread panicked");
    }
    let end = figures(batches_seen.load(Ordering::SeqCst) / BATCHES_PER_EPOCH);
    if let Some(msg) = failure.lock().unwrap().take() {
        panic!("a soak loader failed: {msg}");
    }
    let warm = warm.lock().unwrap().expect("warm-up figures were taken");
    let loaders = loaders.load(Ordering::Relaxed);
    eprintln!(
        "soak: {loaders} loaders on {THREADS} threads, {} epochs of {SAMPLES} samples in batches of {BATCH}",
        end.epoch
    );
    for f in [warm, end] {
        eprintln!(
            "soak: at epoch {:>3}: RSS {:.1} MiB, {} open fds, {} memory mappings",
            f.epoch,
            f.rss_bytes as f64 / (1 << 20) as f64,
            f.fds,
            f.maps
        );
    }
    assert!(end.epoch >= EPOCHS, "ran {} epochs", end.epoch);
    assert!(
        end.rss_bytes <= warm.rss_bytes + RSS_SLACK_BYTES,
        "RSS grew from {} to {} bytes between epoch {} and {}",
        warm.rss_bytes,
        end.rss_bytes,
        warm.epoch,
        end.epoch
    );
    assert!(
        end.fds <= warm.fds + FD_SLACK,
        "open fds grew from {} to {}",
        warm.fds,
        end.fds
    );
    assert!(
        end.maps <= warm.maps + MAPS_SLACK,
        "memory mappings grew from {} to {}",
        warm.maps,
        end.maps
    );
    let left = stoker_threads();
    assert!(left.is_empty(), "threads left behind: {left:?}");
    let _ = std::fs::remove_dir_all(npy.parent().expect("the soak directory"));
}
