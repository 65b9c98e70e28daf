//! Where the time goes: the consumer's waits, each stage of each sample, the workers' busy time.
//!
//! Per-batch waits and per-sample stage times go into log-linear histograms (1/16-octave
//! buckets, ≤ 6% relative error) so that percentiles cost fixed memory however long training
//! runs.
//!
//! Recording is cheap and lock-free per sample: a worker notes one `Instant` pair per stage of
//! each sample in its own `Spans` buffer while it builds a batch, then adds the whole batch to
//! its own slot of counters (`WorkerSlot`) under that slot's lock — one uncontended lock per
//! batch, shared only with readers taking a snapshot. The same spans feed the trace
//! ([`crate::trace`]) when `trace=PATH` is set.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::arena::Arena;
use crate::decode::DecodePath;
use crate::fork::Origin;
use crate::launch::Launch;
#[cfg(doc)]
use crate::launch::Launcher;
pub use crate::span::Stage;
use crate::span::{Span, SpanKind, NO_SLOT};
use crate::trace::{Trace, TraceEvent, Track};

const STAGES: usize = Stage::ALL.len();

/// A snapshot of a loader's counters, as `stoker_stats` in the C ABI.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Batches delivered to the consumer.
    pub batches: u64,
    /// Samples delivered, replacements included.
    pub samples: u64,
    /// Bad samples replaced under `on_error=skip`; a replacement that is bad too counts again.
    pub samples_skipped: u64,
    /// Time the consumer spent blocked in `next()`, in nanoseconds.
    pub wait_ns_total: u64,
    /// Median wait of one `next()` that delivered a batch, in nanoseconds (≤ 6% high).
    pub wait_ns_p50: u64,
    /// 95th percentile of the per-batch wait, in nanoseconds (≤ 6% high).
    pub wait_ns_p95: u64,
    /// Longest per-batch wait, in nanoseconds (exact).
    pub wait_ns_max: u64,
    /// Nanoseconds since the loader was created.
    pub elapsed_ns: u64,
    /// `1 - wait_ns_total / elapsed_ns`, in [0, 1]: the fraction of time the consumer was not
    /// starved.
    pub readiness: f64,
    /// Fraction of worker-thread time spent building batches, in [0, 1]: `busy_ns` over the
    /// time each worker was alive, summed.
    pub worker_busy: f64,
    /// Arena slabs page-locked (`pin_memory`).
    pub slabs_pinned: u64,
    /// Slabs `mlock` refused (RLIMIT_MEMLOCK): they are delivered unpinned.
    pub pin_failures: u64,
    /// This process's rank, as resolved (see [`crate::launch`]).
    pub rank: u64,
    /// Processes in the job, as resolved.
    pub world_size: u64,
    /// Rank among this job's processes on this node (`device=cuda` is `cuda:local_rank`).
    pub local_rank: u64,
    /// This job's processes on this node (`num_workers=auto` divides the cores by it).
    pub local_world_size: u64,
    /// Which launcher said so: [`Launcher::code`] (0 none, 1 explicit, 2 torchrun, 3 Slurm,
    /// 4 Open MPI, 5 PMI).
    pub launcher: u64,
    /// Nanoseconds spent reading samples from the source, summed over every worker (and over
    /// every sample built, whether or not it was delivered yet). A sample read again under
    /// `on_error=skip` counts each read.
    pub read_ns: u64,
    /// Nanoseconds spent decoding images, summed like `read_ns`.
    pub decode_ns: u64,
    /// Nanoseconds spent in the image transform pipeline, summed like `read_ns`.
    pub transform_ns: u64,
    /// Nanoseconds spent copying, padding and laying out fields in batch memory, summed like
    /// `read_ns`.
    pub collate_ns: u64,
    /// Host-to-device copies (`device=cuda`), in nanoseconds: from queueing a batch's copies to
    /// their completion, summed over batches.
    pub h2d_ns: u64,
    /// Worker threads building batches now (1 when batches are built in the calling thread).
    pub num_workers: u64,
    /// Median time one sample spent reading, in nanoseconds (≤ 6% high). Like every per-sample
    /// percentile, over the samples that went through the stage.
    pub read_ns_p50: u64,
    /// 95th percentile of one sample's read time, in nanoseconds.
    pub read_ns_p95: u64,
    /// Median decode time of one image sample, in nanoseconds.
    pub decode_ns_p50: u64,
    /// 95th percentile of one image sample's decode time, in nanoseconds.
    pub decode_ns_p95: u64,
    /// Median transform time of one image sample, in nanoseconds.
    pub transform_ns_p50: u64,
    /// 95th percentile of one image sample's transform time, in nanoseconds.
    pub transform_ns_p95: u64,
    /// Median collate time of one sample, in nanoseconds.
    pub collate_ns_p50: u64,
    /// 95th percentile of one sample's collate time, in nanoseconds.
    pub collate_ns_p95: u64,
    /// Median host-to-device copy time of one batch, in nanoseconds.
    pub h2d_ns_p50: u64,
    /// 95th percentile of one batch's host-to-device copy time, in nanoseconds.
    pub h2d_ns_p95: u64,
    /// Nanoseconds spent building batches, summed over every worker.
    pub busy_ns: u64,
    /// `busy_ns` split by worker: index = worker number, in the order workers were started
    /// (workers autotune retired included).
    pub worker_busy_ns: Vec<u64>,
    /// The memory budget in bytes (`memory_budget`, or its default).
    pub memory_budget: u64,
    /// One batch's slab in bytes, page-rounded (ragged fields counted empty).
    pub batch_bytes: u64,
    /// Batches in flight at most now; lower than `in_flight_cap_requested` when the memory
    /// budget (or autotune) lowered it.
    pub in_flight_cap: u64,
    /// The in-flight cap asked for: `max(1, num_workers) × prefetch_factor`.
    pub in_flight_cap_requested: u64,
    /// Batches the loader lets be in flight now, at most `in_flight_cap`: `num_workers + 1` at
    /// first, one more each time the consumer's waits show that building further ahead would
    /// have fed it (each batch in flight holds batch memory once built).
    pub in_flight_depth: u64,
    /// Batch memory mapped now (arena slabs: in flight, held by the consumer, or idle for
    /// reuse), in bytes.
    pub batch_memory_bytes: u64,
    /// The most batch memory mapped at once so far, in bytes.
    pub batch_memory_peak_bytes: u64,
    /// Minor page faults taken by batch memory since the loader was created: those of mapping
    /// and pre-faulting each slab, read from the mapping thread's `getrusage` (see
    /// [`ArenaCounters::page_faults`](crate::arena::ArenaCounters::page_faults)). A slab is
    /// reused, never mapped again, while the batches it serves keep coming, so after the first
    /// epoch this stays put unless more batches are alive at once than ever before.
    pub page_faults: u64,
    /// Batches in flight per worker now (`prefetch_factor`, or autotune's choice).
    pub prefetch_factor: u64,
    /// Changes autotune made to the worker count or the prefetch depth.
    pub autotune_decisions: u64,
    /// Images decoded whole by zune-jpeg or zune-png (see option `jpeg_decoder`).
    pub decoded_zune: u64,
    /// Images decoded whole by libjpeg-turbo (progressive scans, lossless JPEGs, or crops of
    /// nearly all of the image).
    pub decoded_turbo: u64,
    /// Images of which libjpeg-turbo decoded only the rows and columns the crop reads.
    pub decoded_turbo_region: u64,
    /// Of those regions, the ones shrunk in the DCT domain (1/2, 1/4, 1/8).
    pub decoded_turbo_scaled: u64,
    /// Bytes copied from host to device (`device=cuda`), summed over batches: with
    /// `gpu_normalize` an image field crosses as uint8, a quarter of its float32 bytes.
    pub h2d_bytes: u64,
    /// Device memory the loader holds now (`device=cuda`): the prefetch ring's buffers, in
    /// bytes, the uint8 staging of `gpu_normalize` and the decoder's scratch included; counted
    /// in `memory_budget`.
    pub device_memory_bytes: u64,
    /// Images the workers left to the device's JPEG decoder (`jpeg_decoder=gpu`/`auto`).
    pub decoded_device: u64,
    /// The share of samples (by a hash of the index) that go to the device's decoder now
    /// (option `gpu_decode_share`), 0 when none do.
    pub gpu_decode_share: f64,
}

impl Stats {
    /// The total of `stage`.
    pub fn stage_ns(&self, stage: Stage) -> u64 {
        match stage {
            Stage::Read => self.read_ns,
            Stage::Decode => self.decode_ns,
            Stage::Transform => self.transform_ns,
            Stage::Collate => self.collate_ns,
        }
    }
}

/// A shareable view of a loader's counters, readable from any thread while another drives it.
#[derive(Clone)]
pub struct StatsHandle {
    pub(crate) recorder: Arc<StatsRecorder>,
    pub(crate) arena: Arena,
    pub(crate) launch: Launch,
}

impl StatsHandle {
    /// The counters now, launch fields and the arena's counts included.
    ///
    /// # Panics
    ///
    /// In a child process forked after the loader was made, whose worker threads may have held
    /// the counters' locks at the moment of the fork: use [`StatsHandle::try_snapshot`] where
    /// that can happen.
    pub fn snapshot(&self) -> Stats {
        self.try_snapshot().unwrap_or_else(|e| panic!("{e}"))
    }

    /// The counters now, as [`StatsHandle::snapshot`]; `Err(Unsupported)` in a child process
    /// forked after the loader was made (see [`crate::fork`]).
    pub fn try_snapshot(&self) -> crate::Result<Stats> {
        self.recorder.origin.check()?;
        let mut s = self.recorder.snapshot();
        let c = self.arena.counters();
        s.slabs_pinned = c.slabs_pinned;
        s.pin_failures = c.pin_failures;
        s.batch_memory_bytes = c.bytes_mapped;
        s.batch_memory_peak_bytes = c.bytes_mapped_peak;
        s.page_faults = c.page_faults;
        let l = self.launch;
        s.rank = l.rank as u64;
        s.world_size = l.world_size as u64;
        s.local_rank = l.local_rank as u64;
        s.local_world_size = l.local_world_size as u64;
        s.launcher = l.launcher.code();
        Ok(s)
    }

    /// This process's place in the job, as resolved.
    pub fn launch(&self) -> Launch {
        self.launch
    }
}

const SUB_BUCKETS: usize = 16;
const OCTAVES: usize = 64;
const BUCKETS: usize = OCTAVES * SUB_BUCKETS;

/// A log-linear histogram of nanosecond values.
#[derive(Clone)]
struct Histogram {
    counts: Vec<u64>,
    n: u64,
    max: u64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS],
            n: 0,
            max: 0,
        }
    }

    fn add(&mut self, ns: u64) {
        self.counts[bucket(ns)] += 1;
        self.n += 1;
        self.max = self.max.max(ns);
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.n += other.n;
        self.max = self.max.max(other.max);
    }

    /// The `q` quantile, never above the largest value seen.
    fn quantile(&self, q: f64) -> u64 {
        percentile(&self.counts, self.n, q).min(self.max)
    }
}

/// Decode paths counted per worker.
const DECODE_PATHS: usize = 5;

fn decode_path_index(path: DecodePath) -> usize {
    match path {
        DecodePath::Zune => 0,
        DecodePath::Turbo => 1,
        DecodePath::TurboRegion => 2,
        DecodePath::TurboScaled => 3,
        DecodePath::Device => 4,
    }
}

/// A worker's record of the batch it is building; reused from batch to batch.
#[derive(Default)]
pub(crate) struct Spans {
    spans: Vec<Span>,
    /// Images of this batch by decode path ([`DecodePath`] order).
    decoded: [u64; DECODE_PATHS],
    /// Per-slot stage sums (`None`: the sample did not go through that stage), rebuilt for
    /// each batch.
    per_slot: Vec<[Option<u64>; STAGES]>,
}

impl Spans {
    pub(crate) fn clear(&mut self) {
        self.spans.clear();
        self.decoded = [0; DECODE_PATHS];
    }

    /// Counts one image decoded by `path`.
    pub(crate) fn count_decode(&mut self, path: DecodePath) {
        self.decoded[decode_path_index(path)] += 1;
    }

    pub(crate) fn push(&mut self, kind: SpanKind, slot: usize, index: usize, start: Instant) {
        self.push_ended(kind, slot, index, start, Instant::now());
    }

    pub(crate) fn push_ended(
        &mut self,
        kind: SpanKind,
        slot: usize,
        index: usize,
        start: Instant,
        end: Instant,
    ) {
        self.spans.push(Span {
            kind,
            slot: u32::try_from(slot).unwrap_or(NO_SLOT),
            index: index as u64,
            start,
            end,
        });
    }

    pub(crate) fn spans(&self) -> &[Span] {
        &self.spans
    }
}

/// One worker's counters (a worker thread, or the calling thread with `num_workers=0`).
pub(crate) struct WorkerSlot {
    pub(crate) id: usize,
    inner: Mutex<WorkerCounters>,
}

struct WorkerCounters {
    busy_ns: u64,
    decoded: [u64; DECODE_PATHS],
    stage_ns: [u64; STAGES],
    /// Per-sample stage times.
    hist: Vec<Histogram>,
    started: Instant,
    /// When the worker stopped (autotune shed it, or the loader shut down); `None` while alive.
    ended: Option<Instant>,
}

impl WorkerSlot {
    fn lock(&self) -> MutexGuard<'_, WorkerCounters> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds one batch, built in `busy`, whose stage spans are in `spans`.
    pub(crate) fn add_batch(&self, busy: Duration, spans: &mut Spans) {
        let Spans {
            spans,
            per_slot,
            decoded,
        } = spans;
        let slots = spans
            .iter()
            .filter(|s| s.slot != NO_SLOT)
            .map(|s| s.slot as usize + 1)
            .max()
            .unwrap_or(0);
        per_slot.clear();
        per_slot.resize(slots, [None; STAGES]);
        let mut totals = [0u64; STAGES];
        for s in spans.iter() {
            if let SpanKind::Stage(stage) = s.kind {
                let ns = s.end.saturating_duration_since(s.start).as_nanos() as u64;
                totals[stage as usize] += ns;
                if s.slot != NO_SLOT {
                    *per_slot[s.slot as usize][stage as usize].get_or_insert(0) += ns;
                }
            }
        }
        let mut c = self.lock();
        c.busy_ns += busy.as_nanos() as u64;
        for (n, add) in c.decoded.iter_mut().zip(*decoded) {
            *n += add;
        }
        for (t, add) in c.stage_ns.iter_mut().zip(totals) {
            *t += add;
        }
        for sums in per_slot.iter() {
            for (hist, ns) in c.hist.iter_mut().zip(sums) {
                if let Some(ns) = ns {
                    hist.add(*ns);
                }
            }
        }
    }

    pub(crate) fn retire(&self) {
        self.lock().ended.get_or_insert_with(Instant::now);
    }
}

/// Counters shared by the consumer (which records waits), the workers (stage times), the
/// prefetch thread (copies) and any thread reading stats.
pub(crate) struct StatsRecorder {
    created: Instant,
    inner: Mutex<Recorded>,
    workers: Mutex<Vec<Arc<WorkerSlot>>>,
    /// Worker threads now building (1 when the calling thread builds).
    current_workers: AtomicU64,
    memory_budget: AtomicU64,
    batch_bytes: AtomicU64,
    in_flight_cap: AtomicU64,
    in_flight_cap_requested: AtomicU64,
    in_flight_depth: AtomicU64,
    prefetch_factor: AtomicU64,
    autotune_decisions: AtomicU64,
    /// Nanoseconds the builders (host workers, a stream's feeder) spent waiting for work the
    /// scheduler's in-flight depth did not yet allow, summed: what the depth weighs against the
    /// consumer's waits.
    held_back_ns: AtomicU64,
    /// Device memory the prefetch ring holds, in bytes (its buffers keep a handle to it).
    pub(crate) device_memory: Arc<AtomicU64>,
    /// The GPU decode share in use, as `f64` bits.
    gpu_decode_share: AtomicU64,
    trace: Option<Trace>,
    /// The process the loader was made in: the locks above may be held forever in a child
    /// forked after that (a worker thread held one at the moment of the fork).
    pub(crate) origin: Origin,
}

struct Recorded {
    batches: u64,
    samples: u64,
    skipped: u64,
    wait: Histogram,
    wait_total: u64,
    h2d: Histogram,
    h2d_total: u64,
    h2d_bytes: u64,
}

impl StatsRecorder {
    pub(crate) fn new(trace: Option<Trace>) -> StatsRecorder {
        StatsRecorder {
            created: Instant::now(),
            inner: Mutex::new(Recorded {
                batches: 0,
                samples: 0,
                skipped: 0,
                wait: Histogram::new(),
                wait_total: 0,
                h2d: Histogram::new(),
                h2d_total: 0,
                h2d_bytes: 0,
            }),
            workers: Mutex::new(Vec::new()),
            current_workers: AtomicU64::new(0),
            memory_budget: AtomicU64::new(0),
            batch_bytes: AtomicU64::new(0),
            in_flight_cap: AtomicU64::new(0),
            in_flight_cap_requested: AtomicU64::new(0),
            in_flight_depth: AtomicU64::new(0),
            prefetch_factor: AtomicU64::new(0),
            autotune_decisions: AtomicU64::new(0),
            held_back_ns: AtomicU64::new(0),
            device_memory: Arc::default(),
            gpu_decode_share: AtomicU64::new(0),
            trace,
            origin: Origin::here(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Recorded> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn trace(&self) -> Option<&Trace> {
        self.trace.as_ref()
    }

    /// A new worker's counters; its number is the count of workers started before it.
    pub(crate) fn register_worker(&self) -> Arc<WorkerSlot> {
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        let slot = Arc::new(WorkerSlot {
            id: workers.len(),
            inner: Mutex::new(WorkerCounters {
                busy_ns: 0,
                decoded: [0; DECODE_PATHS],
                stage_ns: [0; STAGES],
                hist: vec![Histogram::new(); STAGES],
                started: Instant::now(),
                ended: None,
            }),
        });
        workers.push(Arc::clone(&slot));
        slot
    }

    /// The memory budget's numbers.
    pub(crate) fn set_budget(&self, plan: &crate::memory::BudgetPlan) {
        self.memory_budget.store(plan.budget, Ordering::Relaxed);
        self.batch_bytes.store(plan.batch_bytes, Ordering::Relaxed);
        self.set_cap(plan.cap, plan.requested_cap);
    }

    /// The in-flight cap in use, and the one asked for.
    pub(crate) fn set_cap(&self, cap: usize, requested: usize) {
        self.in_flight_cap.store(cap as u64, Ordering::Relaxed);
        self.in_flight_cap_requested
            .store(requested as u64, Ordering::Relaxed);
    }

    /// The in-flight depth in use.
    pub(crate) fn set_depth(&self, depth: usize) {
        self.in_flight_depth.store(depth as u64, Ordering::Relaxed);
    }

    /// Records the GPU decode share in use (`gpu_decode_share`).
    pub(crate) fn set_gpu_decode_share(&self, share: f64) {
        self.gpu_decode_share
            .store(share.to_bits(), Ordering::Relaxed);
        if let Some(trace) = &self.trace {
            trace.share(Instant::now(), share);
        }
    }

    pub(crate) fn set_prefetch(&self, prefetch: usize) {
        self.prefetch_factor
            .store(prefetch as u64, Ordering::Relaxed);
    }

    /// An autotune decision, applied at `at`.
    pub(crate) fn decided(&self, at: Instant, d: &crate::autotune::Decision) {
        self.autotune_decisions.fetch_add(1, Ordering::Relaxed);
        self.set_prefetch(d.prefetch);
        if let Some(share) = d.gpu_decode_share {
            self.set_gpu_decode_share(share);
        }
        if let Some(trace) = &self.trace {
            trace.decision(
                at,
                crate::trace::Args::Decision {
                    workers: d.workers as u64,
                    prefetch_factor: d.prefetch as u64,
                    gpu_decode_share: d.gpu_decode_share,
                    readiness: d.readiness,
                    reason: d.reason,
                },
            );
        }
    }

    /// Batches delivered, the consumer's total wait and the workers' total busy time: what
    /// autotune watches, without the percentiles of a full snapshot.
    pub(crate) fn totals(&self) -> (u64, u64, u64) {
        let busy = self
            .workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|w| w.lock().busy_ns)
            .sum();
        let r = self.lock();
        (r.batches, r.wait_total, busy)
    }

    /// A builder waited `d` for work (a task, or a stream's token).
    pub(crate) fn held_back(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.held_back_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The builders' waits for work so far, summed, in nanoseconds.
    pub(crate) fn held_back_ns(&self) -> u64 {
        self.held_back_ns.load(Ordering::Relaxed)
    }

    /// How many threads build batches now.
    pub(crate) fn set_current_workers(&self, n: usize) {
        self.current_workers.store(n as u64, Ordering::Relaxed);
    }

    /// One batch handed to the consumer, which asked for it at `asked`.
    pub(crate) fn delivered(&self, batch: &crate::batch::Batch, asked: Instant) {
        let now = Instant::now();
        let ns = now.saturating_duration_since(asked).as_nanos() as u64;
        {
            let mut r = self.lock();
            r.batches += 1;
            r.samples += batch.len() as u64;
            r.skipped += batch.skipped() as u64;
            r.wait_total += ns;
            r.wait.add(ns);
        }
        if let Some(trace) = &self.trace {
            trace.delivered(batch.epoch(), batch.position(), asked, now);
        }
    }

    /// One batch copied to the device: queued at `start`, complete at `end`.
    /// One batch's copies to the device, queued at `start` and complete at `end`, moving
    /// `bytes`.
    pub(crate) fn copied(
        &self,
        epoch: u64,
        position: usize,
        start: Instant,
        end: Instant,
        bytes: usize,
    ) {
        let ns = end.saturating_duration_since(start).as_nanos() as u64;
        {
            let mut r = self.lock();
            r.h2d_total += ns;
            r.h2d_bytes += bytes as u64;
            r.h2d.add(ns);
        }
        if let Some(trace) = &self.trace {
            trace.push(
                Track::Prefetch,
                vec![TraceEvent::batch("h2d", epoch, position, start, end)],
            );
        }
    }

    /// Samples passed over before any batch: the damaged tail of a tar shard under
    /// `on_error=skip` counts as one.
    pub(crate) fn add_skipped(&self, n: u64) {
        self.lock().skipped += n;
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.created).as_nanos() as u64;
        let mut busy = 0u64;
        let mut alive = 0u64;
        let mut stage_ns = [0u64; STAGES];
        let mut decoded = [0u64; DECODE_PATHS];
        let mut hist = vec![Histogram::new(); STAGES];
        let mut worker_busy_ns = Vec::new();
        for w in self
            .workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let c = w.lock();
            busy += c.busy_ns;
            worker_busy_ns.push(c.busy_ns);
            alive += c
                .ended
                .unwrap_or(now)
                .saturating_duration_since(c.started)
                .as_nanos() as u64;
            for (n, add) in decoded.iter_mut().zip(c.decoded) {
                *n += add;
            }
            for s in 0..STAGES {
                stage_ns[s] += c.stage_ns[s];
                hist[s].merge(&c.hist[s]);
            }
        }
        let r = self.lock();
        let q = |h: &Histogram| (h.quantile(0.50), h.quantile(0.95));
        let (read_ns_p50, read_ns_p95) = q(&hist[Stage::Read as usize]);
        let (decode_ns_p50, decode_ns_p95) = q(&hist[Stage::Decode as usize]);
        let (transform_ns_p50, transform_ns_p95) = q(&hist[Stage::Transform as usize]);
        let (collate_ns_p50, collate_ns_p95) = q(&hist[Stage::Collate as usize]);
        let (h2d_ns_p50, h2d_ns_p95) = q(&r.h2d);
        Stats {
            batches: r.batches,
            samples: r.samples,
            samples_skipped: r.skipped,
            wait_ns_total: r.wait_total,
            wait_ns_p50: r.wait.quantile(0.50),
            wait_ns_p95: r.wait.quantile(0.95),
            wait_ns_max: r.wait.max,
            elapsed_ns: elapsed,
            readiness: if elapsed == 0 {
                1.0
            } else {
                (1.0 - r.wait_total as f64 / elapsed as f64).clamp(0.0, 1.0)
            },
            worker_busy: if alive == 0 {
                0.0
            } else {
                (busy as f64 / alive as f64).clamp(0.0, 1.0)
            },
            read_ns: stage_ns[Stage::Read as usize],
            decode_ns: stage_ns[Stage::Decode as usize],
            transform_ns: stage_ns[Stage::Transform as usize],
            collate_ns: stage_ns[Stage::Collate as usize],
            h2d_ns: r.h2d_total,
            num_workers: self.current_workers.load(Ordering::Relaxed),
            read_ns_p50,
            read_ns_p95,
            decode_ns_p50,
            decode_ns_p95,
            transform_ns_p50,
            transform_ns_p95,
            collate_ns_p50,
            collate_ns_p95,
            h2d_ns_p50,
            h2d_ns_p95,
            busy_ns: busy,
            worker_busy_ns,
            memory_budget: self.memory_budget.load(Ordering::Relaxed),
            batch_bytes: self.batch_bytes.load(Ordering::Relaxed),
            in_flight_cap: self.in_flight_cap.load(Ordering::Relaxed),
            in_flight_cap_requested: self.in_flight_cap_requested.load(Ordering::Relaxed),
            in_flight_depth: self.in_flight_depth.load(Ordering::Relaxed),
            prefetch_factor: self.prefetch_factor.load(Ordering::Relaxed),
            autotune_decisions: self.autotune_decisions.load(Ordering::Relaxed),
            decoded_zune: decoded[decode_path_index(DecodePath::Zune)],
            decoded_turbo: decoded[decode_path_index(DecodePath::Turbo)],
            h2d_bytes: r.h2d_bytes,
            device_memory_bytes: self.device_memory.load(Ordering::Relaxed),
            decoded_turbo_region: decoded[decode_path_index(DecodePath::TurboRegion)]
                + decoded[decode_path_index(DecodePath::TurboScaled)],
            decoded_turbo_scaled: decoded[decode_path_index(DecodePath::TurboScaled)],
            decoded_device: decoded[decode_path_index(DecodePath::Device)],
            gpu_decode_share: f64::from_bits(self.gpu_decode_share.load(Ordering::Relaxed)),
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
    fn percentiles_of_known_values() {
        let mut h = Histogram::new();
        for ms in 1..=100u64 {
            h.add(ms * 1_000_000);
        }
        let within = |got: u64, want_ms: u64| {
            let want = want_ms * 1_000_000;
            got >= want && got <= want + want / 16
        };
        assert!(within(h.quantile(0.5), 50), "{}", h.quantile(0.5));
        assert!(within(h.quantile(0.95), 95), "{}", h.quantile(0.95));
        assert_eq!(h.quantile(1.0), 100_000_000);
        assert_eq!(Histogram::new().quantile(0.5), 0);
    }

    #[test]
    fn per_sample_stage_times_sum_each_slots_spans() {
        let rec = StatsRecorder::new(None);
        let w = rec.register_worker();
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mut spans = Spans::default();
        // Slot 0 read twice (a replacement) for 10 + 30 us; slot 1 read for 20 us and
        // collated for 5 us; 7 us of batch-level collate work (the slab).
        spans.push_ended(SpanKind::Stage(Stage::Read), 0, 3, at(0), at(10));
        spans.push_ended(SpanKind::Stage(Stage::Read), 0, 4, at(10), at(40));
        spans.push_ended(SpanKind::Stage(Stage::Read), 1, 5, at(40), at(60));
        spans.push_ended(
            SpanKind::Stage(Stage::Collate),
            usize::MAX,
            0,
            at(60),
            at(67),
        );
        spans.push_ended(SpanKind::Stage(Stage::Collate), 1, 5, at(67), at(72));
        w.add_batch(Duration::from_micros(80), &mut spans);
        let s = rec.snapshot();
        assert_eq!(s.read_ns, 60_000);
        assert_eq!(s.collate_ns, 12_000);
        assert_eq!((s.decode_ns, s.transform_ns, s.h2d_ns), (0, 0, 0));
        assert_eq!(s.busy_ns, 80_000);
        assert_eq!(s.worker_busy_ns, vec![80_000]);
        // Per sample: reads of 40 and 20 us; one sample collated, for 5 us.
        let close = |got: u64, us: u64| got >= us * 1000 && got <= us * 1000 + us * 1000 / 16;
        assert!(close(s.read_ns_p95, 40), "{}", s.read_ns_p95);
        assert!(close(s.read_ns_p50, 20), "{}", s.read_ns_p50);
        assert!(close(s.collate_ns_p50, 5), "{}", s.collate_ns_p50);
        assert_eq!(s.decode_ns_p50, 0);
    }

    #[test]
    fn worker_busy_is_busy_time_over_alive_time() {
        let rec = StatsRecorder::new(None);
        let a = rec.register_worker();
        let b = rec.register_worker();
        std::thread::sleep(Duration::from_millis(20));
        a.add_batch(Duration::from_millis(5), &mut Spans::default());
        b.retire();
        let s = rec.snapshot();
        assert_eq!(s.worker_busy_ns, vec![5_000_000, 0]);
        assert!(
            s.worker_busy > 0.0 && s.worker_busy < 5.0 / 40.0,
            "{}",
            s.worker_busy
        );
    }
}
