//! The loader: the public iterator over batches, epoch after epoch.
//!
//! [`Loader`] is the facade every face drives: one `next()` for host and device batches, the
//! epoch and position, stats, and the resume state. Behind it, `host` is the scheduler that
//! plans each epoch from the sampler, keeps batch tasks in flight on the pool (as many as its
//! `depth` allows within the cap, running ahead into the next epoch, so there is no stall at the
//! boundary) and delivers them in sampler order (or as they finish, with `in_order=false`);
//! `stream` is its counterpart for streams (tar shards with `shuffle_buffer=N`, iterable
//! sources): one sequential reader per rank, a seeded shuffle buffer, batches of owned samples
//! built by the workers. With a device, the scheduler runs on the CUDA prefetch thread instead
//! of the caller's.
//!
//! A loader's threads do not survive `fork`: in a child process forked after the loader was made,
//! every call that would wait on them fails with `Unsupported`, and dropping the loader leaks it
//! instead of joining them (see [`crate::fork`]).

mod assembly;
mod buffer;
mod depth;
mod feed;
mod host;
mod stream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::arena::{Arena, SlabRegistrar};
use crate::batch::{Batch, ReplaceRouted};
use crate::close::Closer;
use crate::cuda::HostBatches;
use crate::cuda::{DeviceBackend, PrefetchConfig, Prefetcher, Stream};
use crate::error::{Error, Result};
use crate::fork::Origin;
use crate::launch::Launch;
use crate::options::{Device, LoaderOptions};
use crate::resume::{Position, ResumeState};
use crate::source::{FieldSpec, Source};
use crate::stats::{Stats, StatsHandle};

use assembly::Mode;
use host::{Cursor, HostLoader, Schedule};
use stream::StreamLoader;

/// A scheduler of host batches: the host one (indexed sources) or the streaming one.
trait Scheduler: HostBatches<Mark = Cursor> + Send {
    fn next(&mut self) -> Result<Option<Batch>>;
    /// Where delivery stands (what `save_state` records).
    fn cursor(&self) -> Cursor;
    /// What the consumer's side keeps (the scheduler may move to the prefetch thread).
    fn facts(&self) -> Facts;
    /// Makes the next batch the first of epoch `epoch` (see [`Loader::set_epoch`]).
    fn set_epoch(&mut self, epoch: u64) -> Result<()>;
    /// Moves delivery back to `cursor` (what the consumer of a prefetch thread, which ran
    /// ahead, last saw). `fresh`: whether that consumer has had nothing from this loader yet.
    fn rewind_to(&mut self, cursor: &Cursor, fresh: bool);
}

impl HostBatches for Box<dyn Scheduler> {
    type Mark = Cursor;

    fn pull(&mut self, poll: Duration) -> crate::cuda::Pulled<Cursor> {
        (**self).pull(poll)
    }
}

/// The facts of a loader's dataset, known when it is made.
struct Facts {
    seed: u64,
    launch: Launch,
    /// The global order's schedule of an indexed source (`None` for a stream).
    schedule: Option<Schedule>,
    /// `None`: unknown (a stream with no length).
    batches_per_epoch: Option<usize>,
    samples_per_epoch: Option<usize>,
    /// The map-style source (`None` for a stream).
    source: Option<Arc<dyn Source>>,
    fields: Vec<FieldSpec>,
    stats: StatsHandle,
    streaming: bool,
    closer: Closer,
    /// Bytes of one device buffer of the ring (see `Builder::device_batch_bytes`).
    device_batch_bytes: usize,
    /// Device memory held beside the ring (GPU decoding's scratch).
    device_scratch_bytes: usize,
    /// Whether image fields are cast on the device (`gpu_normalize`).
    casts_on_device: bool,
    /// Whether images may be decoded on the device (`jpeg_decoder=gpu`, `gpu_decode_share`).
    decodes_on_device: bool,
    /// What replaces an image neither the device nor the CPU could decode (`on_error=skip`).
    replace: Option<Arc<dyn ReplaceRouted>>,
}

/// The public loader: `next()` gives host batches with `device=cpu` and device batches with
/// `device=cuda[:N]` (one [`Batch`] type for both).
///
/// With a device, the host loader below runs on the prefetch thread, which copies each batch to
/// the device; this side keeps what the consumer needs without reaching that thread: the facts of
/// the dataset, the stats handle, and the position of the last batch *delivered to the consumer*
/// (the thread runs ahead), which is what `epoch()`, `position()` and `save_state()` report.
pub struct Loader {
    engine: Engine,
    device: Device,
    seed: u64,
    launch: Launch,
    /// The global order's schedule of an indexed source (`None` for a stream).
    schedule: Option<Schedule>,
    batches_per_epoch: Option<usize>,
    samples_per_epoch: Option<usize>,
    source: Option<Arc<dyn Source>>,
    fields: Vec<FieldSpec>,
    streaming: bool,
    stats: StatsHandle,
    timeout: Option<Duration>,
    closer: Closer,
    /// The process the loader was made in: its threads exist there only.
    origin: Origin,
}

// One engine per loader, made once: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Engine {
    Host(Box<dyn Scheduler>),
    Device {
        prefetcher: Option<Prefetcher<Cursor>>,
        delivered: Cursor,
        /// Where the prefetch thread hands the host loader back when it stops (`set_epoch`).
        returned: Receiver<Box<dyn Scheduler>>,
        backend: Arc<dyn DeviceBackend>,
        config: PrefetchConfig,
        replace: Option<Arc<dyn ReplaceRouted>>,
        /// Nothing delivered to the consumer yet (see [`Loader::set_epoch`]).
        fresh: bool,
    },
    /// While dropping: every thread is joined; the position is kept for nothing.
    Closed,
}

impl Drop for Loader {
    /// Joins every thread the loader started, then writes the trace (when `trace` is set), so
    /// that it holds every batch finished before the drop.
    ///
    /// In a child process forked after the loader was made, it joins nothing and writes nothing:
    /// the engine is leaked on purpose. Its threads do not exist in the child, so joining them
    /// would wait forever, and its destructors would take locks (the stats, the arena's free
    /// list, the channels' wakers) that one of those threads may have held at the moment of the
    /// fork. What the engine holds stays reachable from it only, so nothing else of the loader
    /// (the source, the stats, the arena) is destroyed either; the memory goes with the child.
    /// The trace is the parent's to write.
    fn drop(&mut self) {
        if self.origin.is_forked() {
            std::mem::forget(std::mem::replace(&mut self.engine, Engine::Closed));
            return;
        }
        drop(std::mem::replace(&mut self.engine, Engine::Closed));
        // Nobody can receive an error from a drop; `write_trace` reports them to callers who
        // want to know.
        let _ = self.write_trace();
    }
}

/// The most device buffers a ring of `slots` may grow to: what `memory_budget` holds beyond the
/// host batches (the in-flight cap, plus those the prefetch thread copies from) and the device
/// `scratch` of GPU decoding, at `device_bytes` each; never fewer than `slots`, which the budget
/// does not count.
fn growth_limit(
    stats: &crate::stats::Stats,
    (device_bytes, scratch): (usize, usize),
    slots: usize,
) -> usize {
    let host = (stats.in_flight_cap + crate::cuda::COPIES_IN_FLIGHT as u64) * stats.batch_bytes
        + scratch as u64;
    let fit = stats.memory_budget.saturating_sub(host) / (device_bytes as u64).max(1);
    usize::try_from(fit).unwrap_or(usize::MAX).max(slots)
}

impl Loader {
    /// A loader for `options`. With `device=cuda[:N]` this opens the CUDA driver (loaded at run
    /// time) and fails with `Unsupported` saying why when there is no driver or no device.
    pub fn new(options: &LoaderOptions) -> Result<Loader> {
        // The one resolution of this process's place in the job; everything below reads it.
        let launch = options.launch()?;
        match options.device_for(&launch) {
            Device::Cpu => {
                Loader::assemble(schedule(options, launch, Mode::Host)?, options, |host| {
                    Ok((Device::Cpu, Engine::Host(host)))
                })
            }
            Device::Cuda(n) => {
                let backend = crate::cuda::open(n).map_err(|e| match e {
                    Error::Unsupported(m) => Error::Unsupported(format!("device=cuda:{n}: {m}")),
                    other => other,
                })?;
                Loader::with_backend(options, launch, backend)
            }
        }
    }

    /// A loader that delivers device batches through `backend`, whatever `options.device` says:
    /// the real driver (`crate::cuda::CudaDevice`), or the fake device of the `testing` feature.
    ///
    /// `pin_memory` (default true here) registers the arena's slabs with the device, so copies
    /// are DMA transfers. `prefetch_factor + 1` device buffers form the ring: that many batches
    /// copied ahead, plus the one the trainer is using. A trainer that holds them all makes the
    /// ring grow, one buffer at a time, while `memory_budget` holds the host batches in flight
    /// and every device buffer (see `growth_limit`); it shrinks back once the trainer holds
    /// fewer. `cuda_stream`, when set, is the
    /// caller's stream to copy on (borrowed, never destroyed).
    pub fn with_device_backend(
        options: &LoaderOptions,
        backend: Arc<dyn DeviceBackend>,
    ) -> Result<Loader> {
        Loader::with_backend(options, options.launch()?, backend)
    }

    fn with_backend(
        options: &LoaderOptions,
        launch: Launch,
        backend: Arc<dyn DeviceBackend>,
    ) -> Result<Loader> {
        let registrar: Option<Arc<dyn SlabRegistrar>> = if options.pin_memory.unwrap_or(true) {
            Some(backend.clone())
        } else {
            None
        };
        // The JPEG decoder is loaded only when asked for (a library to find and initialize).
        let jpeg = if assembly::gpu_decode_asked(options)?.is_some() {
            backend.load_jpeg_decoder().map_err(|e| e.to_string())
        } else {
            Err("not asked for".into())
        };
        let host = schedule(options, launch, Mode::Feed { registrar, jpeg })?;
        let facts = host.facts();
        if facts.casts_on_device || facts.decodes_on_device {
            backend.load_kernels()?;
        }
        let stats = facts.stats;
        let replace = facts.replace;
        let slots = options.prefetch_factor + 1;
        let config = PrefetchConfig {
            slots,
            max_slots: growth_limit(
                &stats.snapshot(),
                (facts.device_batch_bytes, facts.device_scratch_bytes),
                slots,
            ),
            stream: options.cuda_stream.map(Stream),
            stats: Some(stats),
        };
        Loader::assemble(host, options, |host| {
            let device = Device::Cuda(backend.ordinal());
            let delivered = host.cursor();
            let (give_back, returned) = crossbeam_channel::bounded(1);
            let prefetcher = Prefetcher::start_replacing(
                host,
                Arc::clone(&backend),
                config.clone(),
                Some(give_back),
                replace.clone(),
            )?;
            Ok((
                device,
                Engine::Device {
                    prefetcher: Some(prefetcher),
                    delivered,
                    returned,
                    backend,
                    config,
                    replace,
                    fresh: true,
                },
            ))
        })
    }

    /// Takes the facts the consumer's side needs from `host`, then hands it to `engine`.
    fn assemble(
        host: Box<dyn Scheduler>,
        options: &LoaderOptions,
        engine: impl FnOnce(Box<dyn Scheduler>) -> Result<(Device, Engine)>,
    ) -> Result<Loader> {
        let facts = host.facts();
        let (device, engine) = engine(host)?;
        Ok(Loader {
            engine,
            device,
            seed: facts.seed,
            launch: facts.launch,
            schedule: facts.schedule,
            batches_per_epoch: facts.batches_per_epoch,
            samples_per_epoch: facts.samples_per_epoch,
            source: facts.source,
            fields: facts.fields,
            streaming: facts.streaming,
            timeout: (options.timeout_ms > 0).then(|| Duration::from_millis(options.timeout_ms)),
            closer: facts.closer,
            // Recorded when the stats recorder was made, before the pool or prefetch threads.
            origin: facts.stats.recorder.origin,
            stats: facts.stats,
        })
    }

    /// The next batch of the current epoch, or `Ok(None)` once the epoch is over; the call after
    /// that starts the next epoch. An error consumes its batch: the next call moves past it.
    ///
    /// With `device=cuda[:N]` the batch is in device memory and its copy may still be running:
    /// order a stream after it with [`Batch::wait`] (or block with [`Batch::synchronize`]).
    ///
    /// Not `Iterator::next`: the end of an epoch is not the end of the loader (see
    /// [`Loader::epoch_iter`] for an iterator over one epoch).
    ///
    /// In a child process forked after the loader was made, fails with `Unsupported`: the
    /// threads that build its batches are the parent's (make a new loader in the child).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Batch>> {
        self.origin.check()?;
        if self.closer.is_closed() {
            return Err(crate::close::closed_error());
        }
        self.next_batch()
    }

    /// A handle that closes this loader from any thread: a `next` waiting for a batch returns
    /// `Error::Closed` at once, and so does every later call (see [`crate::close`]). The
    /// loader's threads are joined when the thread that drives it drops it (a worker stuck in a
    /// stalled read is joined once that read returns).
    pub fn closer(&self) -> Closer {
        self.closer.clone()
    }

    fn next_batch(&mut self) -> Result<Option<Batch>> {
        match &mut self.engine {
            Engine::Closed => Err(crate::close::closed_error()),
            Engine::Host(host) => host.next(),
            Engine::Device {
                prefetcher,
                delivered,
                fresh,
                ..
            } => {
                *fresh = false;
                let start = Instant::now();
                let prefetcher = prefetcher.as_mut().ok_or_else(|| {
                    Error::Closed("an earlier set_epoch failed; make a new loader".into())
                })?;
                let (item, cursor) = prefetcher.next(self.timeout, &self.closer)?;
                if let Some(cursor) = cursor {
                    *delivered = cursor;
                }
                let batch = item?;
                if let Some(b) = &batch {
                    self.stats.recorder.delivered(b, start);
                }
                Ok(batch)
            }
        }
    }

    /// Where batches are delivered.
    pub fn device(&self) -> Device {
        self.device
    }

    fn cursor(&self) -> Cursor {
        match &self.engine {
            Engine::Host(host) => host.cursor(),
            Engine::Device { delivered, .. } => delivered.clone(),
            Engine::Closed => Cursor::default(),
        }
    }

    /// The epoch the next batch belongs to; it advances when `next()` reports the end of one.
    pub fn epoch(&self) -> u64 {
        self.cursor().epoch
    }

    /// Batches of the current epoch delivered so far (in sampler order).
    pub fn position(&self) -> usize {
        self.cursor().position
    }

    /// Writes the trace (option `trace`) now, with the events recorded so far; the loader also
    /// writes it when dropped. Does nothing without `trace`. Fails with `Unsupported` in a child
    /// process forked after the loader was made.
    pub fn write_trace(&self) -> Result<()> {
        self.origin.check()?;
        match self.stats.recorder.trace() {
            Some(trace) => trace.write(),
            None => Ok(()),
        }
    }

    /// Batches per epoch; `usize::MAX` when unknown (an iterable source without
    /// `num_samples`). See [`Loader::known_batches_per_epoch`].
    pub fn batches_per_epoch(&self) -> usize {
        self.batches_per_epoch.unwrap_or(usize::MAX)
    }

    /// Batches per epoch, `None` when unknown (an iterable source without `num_samples`).
    /// Equal on every rank.
    pub fn known_batches_per_epoch(&self) -> Option<usize> {
        self.batches_per_epoch
    }

    /// Batches per epoch as every face reports it (`stoker_loader_batches_per_epoch`): -1 when
    /// unknown (a stream with no length) or beyond `i64`.
    pub fn batches_per_epoch_i64(&self) -> i64 {
        self.batches_per_epoch
            .and_then(|n| i64::try_from(n).ok())
            .unwrap_or(-1)
    }

    /// Samples per epoch on this rank (the sampler's length); `usize::MAX` when unknown.
    pub fn samples_per_epoch(&self) -> usize {
        self.samples_per_epoch.unwrap_or(usize::MAX)
    }

    /// Samples per epoch on this rank, `None` when unknown.
    pub fn known_samples_per_epoch(&self) -> Option<usize> {
        self.samples_per_epoch
    }

    /// Whether this loader streams (tar shards with `shuffle_buffer ≥ 1`, an iterable source).
    pub fn is_streaming(&self) -> bool {
        self.streaming
    }

    /// The map-style source; `None` for a stream.
    pub fn source(&self) -> Option<&Arc<dyn Source>> {
        self.source.as_ref()
    }

    /// The fields of every sample, as the source declares them (before collate adds
    /// `<name>_lengths` fields).
    pub fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }

    /// A snapshot of the counters (`stoker_stats` in C); see [`Stats`] for each field.
    ///
    /// # Panics
    ///
    /// In a child process forked after the loader was made (see [`Loader::try_stats`]).
    pub fn stats(&self) -> Stats {
        self.stats.snapshot()
    }

    /// A snapshot of the counters, as [`Loader::stats`]; `Err(Unsupported)` in a child process
    /// forked after the loader was made, where the counters' locks may be held forever by a
    /// worker thread that held one at the moment of the fork.
    pub fn try_stats(&self) -> Result<Stats> {
        self.stats.try_snapshot()
    }

    /// A handle that reads this loader's stats from any thread, while another drives it.
    pub fn stats_handle(&self) -> StatsHandle {
        self.stats.clone()
    }

    /// The arena host batches are built in (shared with every batch not yet dropped).
    pub fn arena(&self) -> &Arena {
        &self.stats.arena
    }

    /// Where the job is, as a string for `resume_state`: the entries of the epoch's global
    /// order consumed by all ranks, so every rank that delivered the same number of batches
    /// writes the same string, and it resumes at any world size. With a device, the position of
    /// the last batch handed to the consumer (batches copied ahead are not counted).
    pub fn save_state(&self) -> String {
        let cursor = self.cursor();
        match &self.schedule {
            Some(schedule) => schedule.state_at(&cursor).to_string(),
            None => ResumeState {
                seed: self.seed,
                epoch: cursor.epoch,
                at: Position::Stream {
                    position: cursor.position,
                    world_size: self.launch.world_size,
                    batches_per_epoch: self.batches_per_epoch,
                    state: cursor.stream,
                },
                ahead: cursor.ahead,
            }
            .to_string(),
        }
    }

    /// This process's place in the job (rank, world size, local rank, which launcher said so).
    pub fn launch(&self) -> Launch {
        self.launch
    }

    /// Makes the next batch the first of epoch `epoch` (the `DistributedSampler.set_epoch`
    /// habit). Batches being built or copied ahead are discarded, never delivered; batches the
    /// caller holds stay valid. Nothing changes when the loader already stands at the start of
    /// `epoch`, or was just resumed into it and has delivered nothing since (so that a
    /// `set_epoch(e)` before each epoch's loop continues a resumed epoch instead of restarting it).
    pub fn set_epoch(&mut self, epoch: u64) -> Result<()> {
        self.origin.check()?;
        if self.closer.is_closed() {
            return Err(crate::close::closed_error());
        }
        match &mut self.engine {
            Engine::Closed => Err(crate::close::closed_error()),
            Engine::Host(host) => host.set_epoch(epoch),
            Engine::Device {
                prefetcher,
                delivered,
                returned,
                backend,
                config,
                replace,
                fresh,
            } => {
                if self.streaming {
                    // Checked against what the consumer saw; the prefetch thread goes on.
                    return stream::check_set_epoch(delivered, *fresh, epoch);
                }
                // Stop the prefetch thread (dropping what it copied ahead), take the host
                // loader back, move it, and start a new thread on it.
                let Some(old) = prefetcher.take() else {
                    return Err(Error::Closed(
                        "an earlier set_epoch failed; make a new loader".into(),
                    ));
                };
                drop(old);
                let mut host = returned.try_recv().map_err(|_| {
                    Error::Internal("the prefetch thread did not hand the loader back".into())
                })?;
                // The host loader's cursor trails the consumer's (it ran ahead): bring it to
                // what the consumer saw before deciding whether anything changes.
                host.rewind_to(delivered, *fresh);
                *fresh = false;
                host.set_epoch(epoch)?;
                *delivered = host.cursor();
                let (give_back, back) = crossbeam_channel::bounded(1);
                *returned = back;
                *prefetcher = Some(Prefetcher::start_replacing(
                    host,
                    Arc::clone(backend),
                    config.clone(),
                    Some(give_back),
                    replace.clone(),
                )?);
                Ok(())
            }
        }
    }

    /// Iterates the rest of the current epoch.
    pub fn epoch_iter(&mut self) -> EpochIter<'_> {
        EpochIter {
            loader: self,
            done: false,
        }
    }
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("device", &self.device)
            .field("epoch", &self.epoch())
            .field("position", &self.position())
            .field("batches_per_epoch", &self.batches_per_epoch)
            .finish_non_exhaustive()
    }
}

/// Takes a finished batch of the epoch being delivered out of `ready` (keyed by
/// `(epoch, position)`) if one may be delivered now: the one at `position` in order, or with
/// `in_order=false` any of `epoch`. Both schedulers deliver by this rule.
fn take_ready<T>(
    ready: &mut std::collections::BTreeMap<(u64, usize), T>,
    in_order: bool,
    epoch: u64,
    position: usize,
) -> Option<(usize, T)> {
    let key = if in_order {
        (epoch, position)
    } else {
        *ready.range((epoch, 0)..(epoch + 1, 0)).next()?.0
    };
    ready.remove(&key).map(|item| (key.1, item))
}

/// The scheduler `options` call for: streaming (tar with `shuffle_buffer ≥ 1`, an iterable
/// source) or host.
fn schedule(options: &LoaderOptions, launch: Launch, mode: Mode) -> Result<Box<dyn Scheduler>> {
    Ok(if options.is_streaming() {
        Box::new(StreamLoader::new(options, launch, mode)?)
    } else {
        Box::new(HostLoader::new(options, launch, mode)?)
    })
}

/// The batches of one epoch; ends at the epoch's end (after which the loader is on the next).
pub struct EpochIter<'a> {
    loader: &'a mut Loader,
    done: bool,
}

impl Iterator for EpochIter<'_> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.done {
            return None;
        }
        let item = self.loader.next().transpose();
        self.done = item.is_none();
        item
    }
}
