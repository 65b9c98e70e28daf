//! Starvation metrics: how long the consumer waited for each batch, and how busy the workers were.
//!
//! Per-batch waits go into a log-linear histogram (1/16-octave buckets, ≤ 6% relative error) so
//! that percentiles cost fixed memory however long training runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::arena::Arena;
use crate::launch::Launch;
#[cfg(doc)]
use crate::launch::Launcher;

/// A snapshot of a loader's counters, as `stoker_stats` in the C ABI.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    /// Batches delivered to the consumer.
    pub batches: u64,
    /// Samples delivered, replacements included.
    pub samples: u64,
    /// Bad samples replaced under `on_error=skip`.
    pub samples_skipped: u64,
    /// Time the consumer spent blocked in `next()`.
    pub wait_ns_total: u64,
    pub wait_ns_p50: u64,
    pub wait_ns_p95: u64,
    pub wait_ns_max: u64,
    /// Since the loader was created.
    pub elapsed_ns: u64,
    /// `1 - wait_ns_total / elapsed_ns`: the fraction of time the consumer was not starved.
    pub readiness: f64,
    /// Fraction of worker-thread time spent building batches.
    pub worker_busy: f64,
    /// Arena slabs page-locked, and those `mlock` refused (RLIMIT_MEMLOCK).
    pub slabs_pinned: u64,
    pub pin_failures: u64,
    /// This process's place in the job, as resolved (see [`crate::launch`]).
    pub rank: u64,
    pub world_size: u64,
    pub local_rank: u64,
    pub local_world_size: u64,
    /// Which launcher said so: [`Launcher::code`] (0 none, 1 explicit, 2 torchrun, 3 Slurm,
    /// 4 Open MPI, 5 PMI).
    pub launcher: u64,
}

/// A shareable view of a loader's counters, readable from any thread while another drives it.
#[derive(Clone)]
pub struct StatsHandle {
    pub(crate) recorder: Arc<StatsRecorder>,
    pub(crate) arena: Arena,
    pub(crate) launch: Launch,
}

impl StatsHandle {
    pub fn snapshot(&self) -> Stats {
        let mut s = self.recorder.snapshot();
        let c = self.arena.counters();
        s.slabs_pinned = c.slabs_pinned;
        s.pin_failures = c.pin_failures;
        let l = self.launch;
        s.rank = l.rank as u64;
        s.world_size = l.world_size as u64;
        s.local_rank = l.local_rank as u64;
        s.local_world_size = l.local_world_size as u64;
        s.launcher = l.launcher.code();
        s
    }

    /// This process's place in the job, as resolved.
    pub fn launch(&self) -> Launch {
        self.launch
    }
}

const SUB_BUCKETS: usize = 16;
const OCTAVES: usize = 64;

/// Counters shared by the consumer (which records waits) and any thread reading stats.
pub(crate) struct StatsRecorder {
    created: Instant,
    inner: Mutex<Recorded>,
    /// Nanoseconds the workers (or the calling thread with num_workers=0) spent building.
    pub(crate) busy_ns: AtomicU64,
    /// Threads that build batches (1 for num_workers=0).
    builders: u64,
}

struct Recorded {
    batches: u64,
    samples: u64,
    skipped: u64,
    wait_total: u64,
    wait_max: u64,
    histogram: Vec<u64>,
}

impl StatsRecorder {
    pub(crate) fn new(builders: usize) -> StatsRecorder {
        StatsRecorder {
            created: Instant::now(),
            inner: Mutex::new(Recorded {
                batches: 0,
                samples: 0,
                skipped: 0,
                wait_total: 0,
                wait_max: 0,
                histogram: vec![0; OCTAVES * SUB_BUCKETS],
            }),
            busy_ns: AtomicU64::new(0),
            builders: builders.max(1) as u64,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn add_busy(&self, d: Duration) {
        self.busy_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Samples passed over before any batch: the damaged tail of a tar shard under
    /// `on_error=skip` counts as one.
    pub(crate) fn add_skipped(&self, n: u64) {
        self.lock().skipped += n;
    }

    /// One batch handed to the consumer after it waited `wait`.
    pub(crate) fn delivered(&self, samples: usize, skipped: usize, wait: Duration) {
        let ns = wait.as_nanos() as u64;
        let mut r = self.lock();
        r.batches += 1;
        r.samples += samples as u64;
        r.skipped += skipped as u64;
        r.wait_total += ns;
        r.wait_max = r.wait_max.max(ns);
        r.histogram[bucket(ns)] += 1;
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let elapsed = self.created.elapsed().as_nanos() as u64;
        let r = self.lock();
        let busy = self.busy_ns.load(Ordering::Relaxed) as f64;
        Stats {
            batches: r.batches,
            samples: r.samples,
            samples_skipped: r.skipped,
            wait_ns_total: r.wait_total,
            wait_ns_p50: percentile(&r.histogram, r.batches, 0.50).min(r.wait_max),
            wait_ns_p95: percentile(&r.histogram, r.batches, 0.95).min(r.wait_max),
            wait_ns_max: r.wait_max,
            elapsed_ns: elapsed,
            readiness: if elapsed == 0 {
                1.0
            } else {
                (1.0 - r.wait_total as f64 / elapsed as f64).clamp(0.0, 1.0)
            },
            worker_busy: if elapsed == 0 {
                0.0
            } else {
                (busy / (elapsed as f64 * self.builders as f64)).clamp(0.0, 1.0)
            },
            // Filled by `StatsHandle::snapshot`.
            ..Stats::default()
        }
    }
}

/// Bucket of `ns`: values below 16 have their own bucket; above, each octave `[2^k, 2^(k+1))` is
/// split into 16 equal sub-buckets.
fn bucket(ns: u64) -> usize {
    if ns < SUB_BUCKETS as u64 {
        return ns as usize;
    }
    let octave = 63 - ns.leading_zeros() as usize; // >= 4
    let sub = ((ns >> (octave - 4)) & (SUB_BUCKETS as u64 - 1)) as usize;
    (octave - 3) * SUB_BUCKETS + sub
}

/// Upper bound of bucket `b`'s range.
fn bucket_upper(b: usize) -> u64 {
    if b < SUB_BUCKETS {
        return b as u64;
    }
    let octave = b / SUB_BUCKETS + 3;
    let sub = (b % SUB_BUCKETS) as u64;
    let width = 1u64 << (octave - 4);
    (1u64 << octave) + (sub + 1) * width - 1
}

fn percentile(histogram: &[u64], count: u64, q: f64) -> u64 {
    if count == 0 {
        return 0;
    }
    let rank = ((q * count as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (b, &c) in histogram.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return bucket_upper(b);
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_bound_values_within_6_percent() {
        for ns in [
            0u64,
            1,
            15,
            16,
            17,
            100,
            1_000,
            123_456,
            10_000_000_000,
            u64::MAX / 2,
        ] {
            let upper = bucket_upper(bucket(ns));
            assert!(upper >= ns, "{ns} -> {upper}");
            assert!(upper - ns <= ns / 16 + 1, "{ns} -> {upper}");
        }
    }

    #[test]
    fn percentiles_of_known_waits() {
        let rec = StatsRecorder::new(2);
        for ms in 1..=100u64 {
            rec.delivered(4, 0, Duration::from_millis(ms));
        }
        let s = rec.snapshot();
        assert_eq!(s.batches, 100);
        assert_eq!(s.samples, 400);
        let within = |got: u64, want_ms: u64| {
            let want = want_ms * 1_000_000;
            got >= want && got <= want + want / 16
        };
        assert!(within(s.wait_ns_p50, 50), "{}", s.wait_ns_p50);
        assert!(within(s.wait_ns_p95, 95), "{}", s.wait_ns_p95);
        assert_eq!(s.wait_ns_max, 100_000_000);
        assert_eq!(s.wait_ns_total, (1..=100u64).sum::<u64>() * 1_000_000);
        assert!((0.0..=1.0).contains(&s.readiness));
    }
}
