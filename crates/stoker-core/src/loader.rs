//! The loader: the public iterator over batches, epoch after epoch.
//!
//! It plans each epoch from the sampler, keeps up to `cap` batch tasks in flight on the pool
//! (running ahead into the next epoch, so there is no stall at the boundary), delivers finished
//! batches in sampler order (or as they finish, with `in_order=false`), records waits, and can
//! describe where it is as a [`ResumeState`] string from which a new loader continues exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::arena::{Arena, SlabRegistrar};
use crate::batch::Batch;
use crate::collate::{BatchKey, Collator, ImageWriter, Scratch};
use crate::cuda::{DeviceBackend, DeviceBatch, PrefetchConfig, Prefetcher, Pulled, Stream};
use crate::dtype::{DType, Layout};
use crate::error::{Error, Result};
use crate::options::{Device, LoaderOptions, OnError, SourceSpec};
use crate::pool::{Builder, Pool, Task};
use crate::sampler::{batches_for, BatchPlan, Sampler};
use crate::source::{CallbackSource, FieldKind, ImageFolderSource, NpySource, Source};
use crate::stats::{Stats, StatsRecorder};
use crate::transform::Pipeline;

/// A loader's position: everything needed to continue exactly where it stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeState {
    pub seed: u64,
    pub epoch: u64,
    /// Batches of `epoch` delivered in sampler order: every position below this one.
    pub position: usize,
    /// Positions at or after `position` also delivered (only with `in_order=false`).
    pub ahead: Vec<usize>,
    /// Batches per epoch of the loader that saved it, to catch a mismatched resume.
    pub batches_per_epoch: usize,
}

impl ResumeState {
    const PREFIX: &'static str = "stoker-state-v1";

    pub fn parse(s: &str) -> Result<ResumeState> {
        let bad = |why: &str| Error::option("resume_state", format!("`{s}` {why}"));
        let mut parts = s.split(';');
        if parts.next() != Some(Self::PREFIX) {
            return Err(bad(
                "is not a stoker state (expected it to start with stoker-state-v1)",
            ));
        }
        let mut fields = BTreeMap::new();
        for part in parts {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad("has a part without `=`"))?;
            fields.insert(k, v);
        }
        let num = |k: &str| -> Result<u64> {
            fields
                .get(k)
                .ok_or_else(|| bad(&format!("lacks `{k}`")))?
                .parse()
                .map_err(|_| bad(&format!("has a malformed `{k}`")))
        };
        let ahead = match fields.get("ahead") {
            None | Some(&"") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|p| p.parse().map_err(|_| bad("has a malformed `ahead`")))
                .collect::<Result<Vec<usize>>>()?,
        };
        Ok(ResumeState {
            seed: num("seed")?,
            epoch: num("epoch")?,
            position: num("position")? as usize,
            ahead,
            batches_per_epoch: num("batches")? as usize,
        })
    }
}

impl std::fmt::Display for ResumeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ahead: Vec<String> = self.ahead.iter().map(|p| p.to_string()).collect();
        write!(
            f,
            "{};seed={};epoch={};position={};ahead={};batches={}",
            Self::PREFIX,
            self.seed,
            self.epoch,
            self.position,
            ahead.join(","),
            self.batches_per_epoch
        )
    }
}

/// A shareable view of a loader's counters, readable from any thread while another drives it.
#[derive(Clone)]
pub struct StatsHandle {
    recorder: Arc<StatsRecorder>,
    arena: Arena,
}

impl StatsHandle {
    pub fn snapshot(&self) -> Stats {
        let mut s = self.recorder.snapshot();
        let c = self.arena.counters();
        s.slabs_pinned = c.slabs_pinned;
        s.pin_failures = c.pin_failures;
        s
    }
}

/// Epoch plans by epoch number; holds the two the loader is working on (delivering and
/// submitting), so a plan is computed once.
#[derive(Default)]
struct Plans {
    recent: Vec<(u64, Arc<BatchPlan>)>,
}

impl Plans {
    fn get(
        &mut self,
        sampler: &Sampler,
        batch_size: usize,
        drop_last: bool,
        epoch: u64,
    ) -> Arc<BatchPlan> {
        if let Some((_, plan)) = self.recent.iter().find(|(e, _)| *e == epoch) {
            return Arc::clone(plan);
        }
        let plan = Arc::new(BatchPlan::new(
            sampler.epoch_indices(epoch),
            batch_size,
            drop_last,
        ));
        if self.recent.len() == 2 {
            self.recent.remove(0);
        }
        self.recent.push((epoch, Arc::clone(&plan)));
        plan
    }
}

/// The public loader: host batches from `next()` with `device=cpu`, device batches from
/// `next_device()` with `device=cuda[:N]`.
///
/// With a device, the host loader below runs on the prefetch thread, which copies each batch to
/// the device; this side keeps what the consumer needs without reaching that thread: the facts of
/// the dataset, the stats handle, and the position of the last batch *delivered to the consumer*
/// (the thread runs ahead), which is what `epoch()`, `position()` and `save_state()` report.
pub struct Loader {
    engine: Engine,
    device: Device,
    seed: u64,
    batches_per_epoch: usize,
    samples_per_epoch: usize,
    source: Arc<dyn Source>,
    stats: StatsHandle,
    timeout: Option<Duration>,
}

enum Engine {
    Host(Box<HostLoader>),
    Device {
        prefetcher: Prefetcher<Cursor>,
        delivered: Cursor,
    },
}

/// Where delivery stands: the batches of `epoch` below `position`, and those in `ahead`, are
/// delivered.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cursor {
    epoch: u64,
    position: usize,
    ahead: Vec<usize>,
}

/// How the host loader is used.
enum Mode {
    /// Batches go straight to the consumer.
    Host,
    /// Batches go to the prefetch thread; slabs are registered with the device (`pin_memory`).
    Feed {
        registrar: Option<Arc<dyn SlabRegistrar>>,
    },
}

/// The host pipeline: sampler → pool → in-order delivery of host batches.
pub(crate) struct HostLoader {
    /// Whether deliveries count in stats here (off when the prefetcher's consumer counts them).
    record_delivery: bool,
    builder: Arc<Builder>,
    sampler: Sampler,
    seed: u64,
    batch_size: usize,
    drop_last: bool,
    batches_per_epoch: usize,
    plans: Plans,
    /// `None` when `num_workers` is 0: batches are built in `next()` by the calling thread.
    pool: Option<Pool>,
    scratch: Scratch,
    cap: usize,
    in_order: bool,
    timeout: Option<Duration>,
    /// Tasks submitted and not yet delivered (built, being built, or waiting to be).
    in_flight: usize,
    /// Next task to submit.
    submit_epoch: u64,
    submit_position: usize,
    /// The epoch being delivered, and which of its batches have been.
    epoch: u64,
    position: usize,
    ahead: BTreeSet<usize>,
    /// Finished batches not yet delivered, by (epoch, position).
    ready: BTreeMap<(u64, usize), Result<Batch>>,
    stats: Arc<StatsRecorder>,
}

impl Loader {
    /// A loader for `options`. With `device=cuda[:N]` this opens the CUDA driver (loaded at run
    /// time) and fails with `Unsupported` saying why when there is no driver or no device.
    pub fn new(options: &LoaderOptions) -> Result<Loader> {
        match options.device {
            Device::Cpu => {
                Loader::assemble(HostLoader::new(options, Mode::Host)?, options, |host| {
                    Ok((Device::Cpu, Engine::Host(Box::new(host))))
                })
            }
            Device::Cuda(n) => {
                let backend = crate::cuda::open(n).map_err(|e| match e {
                    Error::Unsupported(m) => Error::Unsupported(format!("device=cuda:{n}: {m}")),
                    other => other,
                })?;
                Loader::with_device_backend(options, backend)
            }
        }
    }

    /// A loader that delivers device batches through `backend`, whatever `options.device` says:
    /// the real driver ([`crate::cuda::CudaDevice`]), or [`crate::cuda::FakeDevice`] in tests.
    ///
    /// `pin_memory` (default true here) registers the arena's slabs with the device, so copies
    /// are DMA transfers. `prefetch_factor + 1` device buffers form the ring: that many batches
    /// copied ahead, plus the one the trainer is using. `cuda_stream`, when set, is the
    /// caller's stream to copy on (borrowed, never destroyed).
    pub fn with_device_backend(
        options: &LoaderOptions,
        backend: Arc<dyn DeviceBackend>,
    ) -> Result<Loader> {
        let registrar: Option<Arc<dyn SlabRegistrar>> = if options.pin_memory.unwrap_or(true) {
            Some(backend.clone())
        } else {
            None
        };
        let host = HostLoader::new(options, Mode::Feed { registrar })?;
        let config = PrefetchConfig {
            slots: options.prefetch_factor + 1,
            stream: options.cuda_stream.map(Stream),
        };
        Loader::assemble(host, options, |host| {
            let device = Device::Cuda(backend.ordinal());
            let delivered = host.cursor();
            let prefetcher = Prefetcher::start(host, backend, config)?;
            Ok((
                device,
                Engine::Device {
                    prefetcher,
                    delivered,
                },
            ))
        })
    }

    /// Takes the facts the consumer's side needs from `host`, then hands it to `engine`.
    fn assemble(
        host: HostLoader,
        options: &LoaderOptions,
        engine: impl FnOnce(HostLoader) -> Result<(Device, Engine)>,
    ) -> Result<Loader> {
        let seed = host.seed;
        let batches_per_epoch = host.batches_per_epoch;
        let samples_per_epoch = host.sampler.len();
        let source = Arc::clone(host.builder.collator.source());
        let stats = StatsHandle {
            recorder: Arc::clone(&host.stats),
            arena: host.builder.arena.clone(),
        };
        let (device, engine) = engine(host)?;
        Ok(Loader {
            engine,
            device,
            seed,
            batches_per_epoch,
            samples_per_epoch,
            source,
            stats,
            timeout: (options.timeout_ms > 0).then(|| Duration::from_millis(options.timeout_ms)),
        })
    }

    /// The next batch of the current epoch, or `Ok(None)` once the epoch is over; the call after
    /// that starts the next epoch. An error consumes its batch: the next call moves past it.
    ///
    /// Not `Iterator::next`: the end of an epoch is not the end of the loader (see
    /// [`Loader::epoch_iter`] for an iterator over one epoch). A loader with `device=cuda`
    /// delivers through [`Loader::next_device`] instead.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Batch>> {
        match &mut self.engine {
            Engine::Host(host) => host.next(),
            Engine::Device { .. } => Err(Error::InvalidArgument(format!(
                "device={}: this loader delivers device batches; call next_device()",
                self.device
            ))),
        }
    }

    /// The next device batch of the current epoch, or `Ok(None)` once the epoch is over, with the
    /// same epoch and error semantics as [`Loader::next`]. Its copy may still be running: order
    /// a stream after it with [`DeviceBatch::wait`] (or block with `synchronize`).
    pub fn next_device(&mut self) -> Result<Option<DeviceBatch>> {
        let start = Instant::now();
        let Engine::Device {
            prefetcher,
            delivered,
        } = &mut self.engine
        else {
            return Err(Error::InvalidArgument(
                "device=cpu: this loader delivers host batches; call next() (or set device=cuda)"
                    .into(),
            ));
        };
        let (item, cursor) = prefetcher.next(self.timeout)?;
        if let Some(cursor) = cursor {
            *delivered = cursor;
        }
        let batch = item?;
        if let Some(b) = &batch {
            self.stats
                .recorder
                .delivered(b.len(), b.skipped(), start.elapsed());
        }
        Ok(batch)
    }

    /// Where batches are delivered.
    pub fn device(&self) -> Device {
        self.device
    }

    fn cursor(&self) -> Cursor {
        match &self.engine {
            Engine::Host(host) => host.cursor(),
            Engine::Device { delivered, .. } => delivered.clone(),
        }
    }

    /// The epoch the next batch belongs to; it advances when `next()` reports the end of one.
    pub fn epoch(&self) -> u64 {
        match &self.engine {
            Engine::Host(host) => host.epoch,
            Engine::Device { delivered, .. } => delivered.epoch,
        }
    }

    /// Batches of the current epoch delivered so far (in sampler order).
    pub fn position(&self) -> usize {
        match &self.engine {
            Engine::Host(host) => host.position,
            Engine::Device { delivered, .. } => delivered.position,
        }
    }

    pub fn batches_per_epoch(&self) -> usize {
        self.batches_per_epoch
    }

    /// Samples per epoch (the sampler's length).
    pub fn samples_per_epoch(&self) -> usize {
        self.samples_per_epoch
    }

    pub fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }

    pub fn stats(&self) -> Stats {
        self.stats.snapshot()
    }

    pub fn stats_handle(&self) -> StatsHandle {
        self.stats.clone()
    }

    pub fn arena(&self) -> &Arena {
        &self.stats.arena
    }

    /// Where this loader is, as a string for `resume_state`. With a device, the position of the
    /// last batch handed to the consumer (batches copied ahead are not counted).
    pub fn save_state(&self) -> String {
        let cursor = self.cursor();
        ResumeState {
            seed: self.seed,
            epoch: cursor.epoch,
            position: cursor.position,
            ahead: cursor.ahead,
            batches_per_epoch: self.batches_per_epoch,
        }
        .to_string()
    }

    /// Iterates the rest of the current epoch.
    pub fn epoch_iter(&mut self) -> EpochIter<'_> {
        EpochIter {
            loader: self,
            done: false,
        }
    }
}

impl crate::cuda::HostBatches for HostLoader {
    type Mark = Cursor;

    fn pull(&mut self, poll: Duration) -> Pulled<Cursor> {
        match self.next_within(Some(poll)) {
            // The poll interval passed; nothing was consumed.
            Err(Error::Timeout(_)) => Pulled::Idle,
            item => Pulled::Item(item, self.cursor()),
        }
    }
}

impl HostLoader {
    fn new(options: &LoaderOptions, mode: Mode) -> Result<HostLoader> {
        let source: Arc<dyn Source> = match &options.source {
            None => {
                return Err(Error::option(
                    "source",
                    "required, e.g. npy:PATH or image_folder:ROOT",
                ))
            }
            Some(SourceSpec::Npy(path)) => {
                Arc::new(NpySource::open(path, options.labels.as_deref())?)
            }
            Some(SourceSpec::ImageFolder(root)) => Arc::new(ImageFolderSource::open(root)?),
            Some(SourceSpec::Custom(source)) => Arc::clone(source),
            Some(SourceSpec::Callback { len, read }) => Arc::new(CallbackSource::new(
                *len,
                Arc::clone(read),
                options.pad.is_some(),
            )?),
        };
        if options.labels.is_some() && !matches!(options.source, Some(SourceSpec::Npy(_))) {
            return Err(Error::option(
                "labels",
                "labels=npy:PATH applies only to an npy source",
            ));
        }
        let image = image_writer(options, source.as_ref())?;
        let collator = Collator::new(
            Arc::clone(&source),
            options.pad,
            image,
            options.on_error == OnError::Skip,
        )?;

        let mut seed = options.seed;
        let resume = options
            .resume_state
            .as_deref()
            .map(ResumeState::parse)
            .transpose()?;
        if let Some(state) = &resume {
            seed = state.seed;
        }
        let sampler = Sampler::new(options.sampler_kind(source.len())?, source.len(), seed)?;
        let batches_per_epoch = batches_for(sampler.len(), options.batch_size, options.drop_last);

        let workers = options.resolved_workers();
        let cap = options.in_flight_cap();
        // For a device, `pin_memory` means registration with its driver (which page-locks the
        // slab itself), not mlock.
        let (pin, registrar, feed) = match mode {
            Mode::Host => (options.pin_memory.unwrap_or(false), None, false),
            Mode::Feed { registrar } => (false, registrar, true),
        };
        // Idle slabs kept: the in-flight cap plus a few the consumer is holding.
        let arena = Arena::new(pin, cap + 2, registrar);
        let stats = Arc::new(StatsRecorder::new(workers));
        let builder = Arc::new(Builder {
            collator,
            arena,
            stats: Arc::clone(&stats),
            stop: AtomicBool::new(false),
        });
        let pool = if workers > 0 {
            Some(Pool::start(Arc::clone(&builder), workers, cap)?)
        } else {
            None
        };

        let mut loader = HostLoader {
            record_delivery: !feed,
            builder,
            sampler,
            seed,
            batch_size: options.batch_size,
            drop_last: options.drop_last,
            batches_per_epoch,
            plans: Plans::default(),
            pool,
            scratch: Scratch::default(),
            cap,
            in_order: options.in_order,
            // Fed to a prefetch thread, the consumer's timeout applies on the consumer's side.
            timeout: (options.timeout_ms > 0 && !feed)
                .then(|| Duration::from_millis(options.timeout_ms)),
            in_flight: 0,
            submit_epoch: 0,
            submit_position: 0,
            epoch: 0,
            position: 0,
            ahead: BTreeSet::new(),
            ready: BTreeMap::new(),
            stats,
        };
        if let Some(state) = resume {
            loader.restore(state)?;
        }
        loader.top_up()?;
        Ok(loader)
    }

    fn restore(&mut self, state: ResumeState) -> Result<()> {
        if state.batches_per_epoch != self.batches_per_epoch
            || state.position > self.batches_per_epoch
            || state
                .ahead
                .iter()
                .any(|&p| p <= state.position || p >= self.batches_per_epoch)
        {
            return Err(Error::option(
                "resume_state",
                format!(
                    "saved by a loader with {} batches per epoch at position {}, but this loader has {} batches per epoch: the source, sampler, batch_size or drop_last differ",
                    state.batches_per_epoch, state.position, self.batches_per_epoch
                ),
            ));
        }
        self.epoch = state.epoch;
        self.position = state.position;
        self.ahead = state.ahead.into_iter().collect();
        self.submit_epoch = self.epoch;
        self.submit_position = self.position;
        Ok(())
    }

    fn cursor(&self) -> Cursor {
        Cursor {
            epoch: self.epoch,
            position: self.position,
            ahead: self.ahead.iter().copied().collect(),
        }
    }

    fn next(&mut self) -> Result<Option<Batch>> {
        self.next_within(self.timeout)
    }

    /// The next batch, waiting at most `timeout` for the pool (`Err(Timeout)` consumes nothing).
    fn next_within(&mut self, timeout: Option<Duration>) -> Result<Option<Batch>> {
        let start = Instant::now();
        if self.position == self.batches_per_epoch {
            self.epoch += 1;
            self.position = 0;
            self.ahead.clear();
            self.top_up()?;
            return Ok(None);
        }
        loop {
            if let Some((key, outcome)) = self.take_ready() {
                self.mark_delivered(key.1);
                self.top_up()?;
                let batch = outcome?;
                if self.record_delivery {
                    self.stats
                        .delivered(batch.len(), batch.skipped(), start.elapsed());
                }
                return Ok(Some(batch));
            }
            match &self.pool {
                Some(pool) => {
                    let remaining = match timeout {
                        None => None,
                        Some(t) => Some(
                            t.checked_sub(start.elapsed())
                                .ok_or(Error::Timeout(t.as_millis() as u64))?,
                        ),
                    };
                    let done = pool.recv(remaining).map_err(|e| match (e, timeout) {
                        (Error::Timeout(_), Some(t)) => Error::Timeout(t.as_millis() as u64),
                        (e, _) => e,
                    })?;
                    self.ready
                        .insert((done.key.epoch, done.key.position), done.outcome);
                }
                None => {
                    // num_workers = 0: build the next batch here, in order.
                    let plan =
                        self.plans
                            .get(&self.sampler, self.batch_size, self.drop_last, self.epoch);
                    let key = self.key(self.epoch, self.position);
                    let outcome = self.builder.build(&Task { key, plan }, &mut self.scratch);
                    self.ready.insert((key.epoch, key.position), outcome);
                }
            }
        }
    }

    /// A finished batch that may be delivered now: the next in sampler order, or with
    /// `in_order=false` any of the current epoch.
    fn take_ready(&mut self) -> Option<((u64, usize), Result<Batch>)> {
        let key = if self.in_order {
            (self.epoch, self.position)
        } else {
            *self
                .ready
                .range((self.epoch, 0)..(self.epoch + 1, 0))
                .next()?
                .0
        };
        let outcome = self.ready.remove(&key)?;
        Some((key, outcome))
    }

    fn mark_delivered(&mut self, position: usize) {
        if self.pool.is_some() {
            self.in_flight -= 1;
        }
        if position == self.position {
            self.position += 1;
            while self.ahead.remove(&self.position) {
                self.position += 1;
            }
        } else {
            self.ahead.insert(position);
        }
    }

    fn key(&self, epoch: u64, position: usize) -> BatchKey {
        BatchKey {
            seed: self.seed,
            epoch,
            position,
        }
    }

    /// Submits tasks until `cap` are in flight, running ahead into later epochs.
    fn top_up(&mut self) -> Result<()> {
        let Some(pool) = &self.pool else {
            return Ok(());
        };
        if self.batches_per_epoch == 0 {
            return Ok(());
        }
        while self.in_flight < self.cap {
            if self.submit_position == self.batches_per_epoch {
                self.submit_epoch += 1;
                self.submit_position = 0;
            }
            let (epoch, position) = (self.submit_epoch, self.submit_position);
            self.submit_position += 1;
            if epoch == self.epoch && self.ahead.contains(&position) {
                continue; // delivered before a resume
            }
            let plan = self
                .plans
                .get(&self.sampler, self.batch_size, self.drop_last, epoch);
            pool.submit(Task {
                key: BatchKey {
                    seed: self.seed,
                    epoch,
                    position,
                },
                plan,
            })?;
            self.in_flight += 1;
        }
        Ok(())
    }
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

/// The image pipeline for a source with encoded-image fields.
fn image_writer(
    options: &LoaderOptions,
    source: &dyn Source,
) -> Result<Option<Arc<dyn ImageWriter>>> {
    let has_images = source
        .fields()
        .iter()
        .any(|f| f.kind == FieldKind::EncodedImage);
    if !has_images {
        // Tensors are delivered as stored: a conversion here would be a second copy that a
        // caller asking for one should see, not get silently.
        for (key, set) in [
            ("transform", options.transform.is_some()),
            ("dtype", options.dtype.is_some()),
            ("layout", options.layout != Layout::Nchw),
        ] {
            if set {
                return Err(Error::option(
                    key,
                    "applies to image sources only; tensor fields are delivered as stored",
                ));
            }
        }
        return Ok(None);
    }
    if let Some(dtype @ (DType::I32 | DType::I64)) = options.dtype {
        return Err(Error::option(
            "dtype",
            format!("images can be uint8, float32, float16 or bfloat16, not {dtype}"),
        ));
    }
    let pipeline = Pipeline::new(
        options.transform.as_deref(),
        options.dtype,
        options.layout,
        options.max_image_pixels,
    )
    .map_err(|reason| Error::option("transform", reason))?;
    Ok(Some(Arc::new(pipeline)))
}
