//! Where the memory of the image pipeline goes: bench/compare.py's images workload (shuffled
//! batches of 64, `random_resized_crop(224) | hflip | normalize(imagenet)` to float32 NCHW,
//! 2 workers, prefetch_factor 4) in a Rust-only process, with the process's peak RSS (VmHWM),
//! peak PSS (sampled from /proc/self/smaps_rollup) and the arena's slabs sampled as it runs.
//!
//! `cargo run --release -p stoker-core --example image_memory -- ROOT [EPOCHS] [CONSUMER_MS]`
//!
//! ROOT is an ImageFolder tree; EPOCHS (default 4) are run after one warm-up epoch; CONSUMER_MS
//! (default 0) is how long the consumer works on each batch, holding it, before asking for the
//! next (0: a consumer faster than the workers), or `NxMS`: a bursty consumer that pauses MS
//! every N batches and takes the others at once. As in a Python `for batch in loader` loop, the
//! consumer holds the previous batch while it asks for the next one. WORKERS (2) and PREFETCH
//! (4) in the environment set `num_workers` and `prefetch_factor`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stoker_core::{Loader, LoaderOptions};

/// A `kB` line of a /proc file, in bytes.
fn proc_kb(file: &str, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb << 10)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let root = args
        .next()
        .ok_or("usage: image_memory ROOT [EPOCHS] [CONSUMER_MS]")?;
    let epochs: usize = args
        .next()
        .map_or(Ok(4), |s| s.parse())
        .map_err(|e| format!("EPOCHS: {e}"))?;
    let consumer = args.next().unwrap_or_else(|| "0".into());
    let (every, consumer_ms): (usize, f64) = match consumer.split_once('x') {
        Some((n, ms)) => (
            n.parse()
                .map_err(|e| format!("CONSUMER_MS {consumer}: {e}"))?,
            ms.parse()
                .map_err(|e| format!("CONSUMER_MS {consumer}: {e}"))?,
        ),
        None => (
            1,
            consumer
                .parse()
                .map_err(|e| format!("CONSUMER_MS {consumer}: {e}"))?,
        ),
    };
    let workers = std::env::var("WORKERS").unwrap_or_else(|_| "2".into());
    let prefetch = std::env::var("PREFETCH").unwrap_or_else(|_| "4".into());

    let before = proc_kb("/proc/self/status", "VmRSS:");
    let mut options = LoaderOptions::new();
    for (k, v) in [
        ("source", format!("image_folder:{root}")),
        ("batch_size", "64".into()),
        ("shuffle", "true".into()),
        ("num_workers", workers.clone()),
        ("prefetch_factor", prefetch.clone()),
        (
            "transform",
            "random_resized_crop(224) | hflip | normalize(imagenet)".into(),
        ),
    ] {
        options.set(k, &v).map_err(|e| e.to_string())?;
    }
    let mut loader = Loader::new(&options).map_err(|e| e.to_string())?;
    let arena = loader.arena().clone();
    let batch_bytes = loader.stats().batch_bytes;

    // A sampler thread: peak PSS, and the most slabs mapped / leased seen.
    let stop = Arc::new(AtomicBool::new(false));
    let peak_pss = Arc::new(AtomicU64::new(0));
    let (peak_mapped, peak_leased) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sampler = {
        let (stop, peak_pss) = (Arc::clone(&stop), Arc::clone(&peak_pss));
        let (peak_mapped, peak_leased) = (Arc::clone(&peak_mapped), Arc::clone(&peak_leased));
        let arena = arena.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak_pss.fetch_max(
                    proc_kb("/proc/self/smaps_rollup", "Pss:"),
                    Ordering::Relaxed,
                );
                let c = arena.counters();
                peak_mapped.fetch_max(c.bytes_mapped, Ordering::Relaxed);
                peak_leased.fetch_max(c.slabs_leased, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    let mut measured = 0usize;
    let mut start = Instant::now();
    for epoch in 0..=epochs {
        if epoch == 1 {
            start = Instant::now();
        }
        let mut held = None;
        for i in 1.. {
            let next = loader.next().map_err(|e| e.to_string())?;
            let Some(batch) = next else { break };
            if epoch >= 1 {
                measured += batch.len();
            }
            if consumer_ms > 0.0 && i % every.max(1) == 0 {
                std::thread::sleep(Duration::from_secs_f64(consumer_ms / 1e3));
            }
            // Dropped when the next one arrives, as a Python loop variable is.
            held = Some(batch);
        }
        drop(held);
    }
    let rate = measured as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    sampler.join().map_err(|_| "the sampler thread panicked")?;
    let c = arena.counters();
    let s = loader.stats();
    let hwm = proc_kb("/proc/self/status", "VmHWM:");
    println!(
        "workers={workers} prefetch_factor={prefetch} consumer={consumer} ms: {rate:.0} samples/s over {epochs} epochs"
    );
    println!(
        "RSS before loader {:.0} MiB, peak (VmHWM) {:.0} MiB (+{:.0}), peak PSS {:.0} MiB",
        mib(before),
        mib(hwm),
        mib(hwm.saturating_sub(before)),
        mib(peak_pss.load(Ordering::Relaxed)),
    );
    println!(
        "in flight: depth {} of a cap of {}; consumer waited {:.0} ms in all, readiness {:.3}",
        s.in_flight_depth,
        s.in_flight_cap,
        s.wait_ns_total as f64 / 1e6,
        s.readiness
    );
    println!(
        "arena: batch {:.1} MiB; peak mapped {:.1} MiB ({:.1} slabs), peak leased {} slabs; {} slabs mapped, {} unmapped over the run",
        mib(batch_bytes),
        mib(peak_mapped.load(Ordering::Relaxed)),
        peak_mapped.load(Ordering::Relaxed) as f64 / batch_bytes.max(1) as f64,
        peak_leased.load(Ordering::Relaxed),
        c.slabs_mapped,
        c.slabs_unmapped,
    );
    Ok(())
}
