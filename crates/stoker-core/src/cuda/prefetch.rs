//! The prefetcher: a dedicated thread that copies finished host batches to the device.
//!
//! It pulls host batches in delivery order from a [`HostBatches`] feed (the loader), copies each
//! field on a non-blocking stream into one of a ring of `slots` device buffers, records an event
//! and hands out a device [`Batch`] at once: the consumer orders its own stream after the copy with
//! [`Batch::wait`] instead of blocking the CPU. The thread then pulls the next host batch and
//! queues its copy behind the running one ([`COPIES_IN_FLIGHT`] at most), so the copy engine
//! does not idle while the thread works; it waits for a copy only to drop its host batch, so the
//! arena slab is recycled as soon as the copy is done, however long the trainer keeps the device
//! batch, and before the thread waits for anything else.
//!
//! A device buffer returns to the ring when its batch is dropped. Before the ring reuses
//! it, the copy stream waits (on the device, not the CPU) for an event recorded at release on each
//! stream the consumer passed to `wait`, so new data never overwrites memory a queued kernel still
//! reads. When every buffer is taken by batches waiting for the consumer the thread blocks
//! (backpressure), and the host pool behind it stays within its own bound. When instead the
//! consumer holds every buffer (a trainer keeping a few batches), the ring grows by one buffer
//! as long as [`PrefetchConfig::max_slots`] allows (what `memory_budget` holds), less the
//! buffers the JPEG decoder's own device memory takes under GPU decoding, and shrinks back to
//! `slots` once the consumer holds fewer again. Dropping the prefetcher joins the thread; every
//! buffer is freed by whoever drops it last (the ring, the thread, or a batch the user still
//! holds).
//!
//! A host batch whose image fields are cast on the device (`gpu_normalize`, see [`super::cast`])
//! is laid out anew in its buffer (`batch::DeviceLayout`): its fields at their device sizes,
//! then the uint8 inputs and their tables, which the cast kernel reads on the copy stream before
//! the batch's event. The images a host batch left to the device's JPEG decoder (GPU decoding)
//! are decoded and resized into their slots after the copies and before the casts (`decode`).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::device::{CastJob, DeviceBackend, DevicePtr, Event, Stream};
use crate::batch::{Batch, DeviceLayout, DeviceMemory, FieldMeta, ReplaceRouted, Step};
use crate::close::{Closer, Wait};
use crate::error::{Error, Result};
use crate::fork::Origin;
use crate::stats::StatsHandle;
use decode::{DecodeScratch, DeviceField};

/// How long the thread waits for a host batch before checking for shutdown. The host loader's
/// wait cannot be interrupted otherwise; 20 ms bounds how long dropping a loader takes.
const POLL: Duration = Duration::from_millis(20);

/// How often the thread, waiting for a free buffer, looks whether the ring may grow instead.
const GROW_POLL: Duration = Duration::from_millis(5);

/// Host-to-device copies queued at once. With two, the next batch's copy is queued while the
/// previous one runs, so the copy engine does not idle while this thread pulls the next batch,
/// takes a buffer and queues its fields; more would only keep more host slabs from the arena
/// (the memory budget reserves this many for the prefetcher).
pub const COPIES_IN_FLIGHT: usize = 2;

/// Device buffers are allocated in these steps, so that ragged batches whose size wobbles do not
/// reallocate every time.
const ALLOC_GRANULE: usize = 64 << 10;

/// What one pull from the feed gave.
pub enum Pulled<M> {
    /// A batch, an error, or `Ok(None)` for the end of an epoch, in delivery order, with the
    /// feed's mark after it (the loader's resume position).
    Item(Result<Option<Batch>>, M),
    /// Nothing within the poll interval; the thread checks for shutdown and asks again.
    Idle,
}

/// Where the prefetch thread gets host batches from; it is moved onto that thread.
pub trait HostBatches: Send + 'static {
    /// The feed's position after an item (the loader's resume cursor), handed back with each
    /// device batch.
    type Mark: Send + 'static;
    /// The next item, waiting at most about `poll` before returning [`Pulled::Idle`].
    fn pull(&mut self, poll: Duration) -> Pulled<Self::Mark>;
}

/// Prefetcher settings.
#[derive(Clone)]
pub struct PrefetchConfig {
    /// Device buffers in the ring, its usual size.
    pub slots: usize,
    /// The most device buffers the ring may grow to while the consumer holds every one (at
    /// least `slots`): the most device batches alive at once.
    pub max_slots: usize,
    /// Copy on this caller-owned stream instead of a new non-blocking one. It is borrowed: never
    /// destroyed, and it must outlive the prefetcher and its batches.
    pub stream: Option<Stream>,
    /// Where each copy's time goes (`h2d_ns` and the trace's prefetch track), if anywhere.
    pub stats: Option<StatsHandle>,
}

/// The copy stream, destroyed after the last batch that names it (unless borrowed).
struct CopyStream {
    backend: Arc<dyn DeviceBackend>,
    stream: Stream,
    owned: bool,
}

impl Drop for CopyStream {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: created by this prefetcher, destroyed once, here; pending work still
            // completes (the driver releases the stream afterwards).
            unsafe { self.backend.destroy_stream(self.stream) }
        }
    }
}

/// One device buffer of the ring, with its events. Dropping it (wherever that happens) waits
/// for the work that uses it and frees it.
struct Slot {
    backend: Arc<dyn DeviceBackend>,
    buffer: Option<(DevicePtr, usize)>,
    /// Device memory the prefetcher holds, in bytes (stats `device_memory_bytes`).
    held_bytes: Arc<AtomicU64>,
    /// Recorded after this buffer's copies.
    copied: Event,
    /// Events recorded at release on the consumer's streams, not yet waited for by the ring.
    released: Vec<Event>,
    /// Spare events for `released`, kept to avoid creating one per batch.
    spare: Vec<Event>,
}

impl Slot {
    fn new(backend: &Arc<dyn DeviceBackend>, held_bytes: &Arc<AtomicU64>) -> Result<Slot> {
        Ok(Slot {
            backend: Arc::clone(backend),
            buffer: None,
            held_bytes: Arc::clone(held_bytes),
            copied: backend.create_event()?,
            released: Vec::new(),
            spare: Vec::new(),
        })
    }

    /// Blocks until nothing queued uses the buffer: its copy and the consumer's released work.
    fn quiesce(&mut self) {
        // Errors mean the context is broken; the work is over either way.
        let _ = self.backend.synchronize_event(self.copied);
        for e in self.released.drain(..) {
            let _ = self.backend.synchronize_event(e);
            self.spare.push(e);
        }
    }

    /// A buffer of at least `bytes`, ordered on `stream` after the consumer's use of the last
    /// contents.
    fn prepare(&mut self, bytes: usize, stream: Stream) -> Result<DevicePtr> {
        match self.buffer {
            Some((ptr, cap)) if cap >= bytes => {
                for e in self.released.drain(..) {
                    self.backend.stream_wait_event(stream, e)?;
                    self.spare.push(e);
                }
                Ok(ptr)
            }
            old => {
                if let Some((ptr, cap)) = old {
                    self.quiesce();
                    self.buffer = None;
                    // SAFETY: allocated by this slot; `quiesce` waited for every use.
                    unsafe { self.backend.free(ptr) };
                    self.held_bytes.fetch_sub(cap as u64, Ordering::Relaxed);
                }
                let cap = bytes.max(1).div_ceil(ALLOC_GRANULE) * ALLOC_GRANULE;
                let ptr = self.backend.alloc(cap)?;
                self.held_bytes.fetch_add(cap as u64, Ordering::Relaxed);
                self.buffer = Some((ptr, cap));
                Ok(ptr)
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.quiesce();
        if let Some((ptr, cap)) = self.buffer.take() {
            // SAFETY: allocated by this slot; `quiesce` waited for the copy and the consumer.
            unsafe { self.backend.free(ptr) };
            self.held_bytes.fetch_sub(cap as u64, Ordering::Relaxed);
        }
        // SAFETY: every event below was created by this slot and is destroyed once, here.
        unsafe {
            self.backend.destroy_event(self.copied);
            for e in self.spare.drain(..) {
                self.backend.destroy_event(e);
            }
        }
    }
}

/// What travels from the thread to the consumer.
struct Delivery<M> {
    item: Result<Option<Batch>>,
    /// `None` for an error of the prefetcher itself, which moves no position.
    mark: Option<M>,
}

/// The device memory of one delivered batch: a buffer of the ring, returned to it when the
/// batch is dropped (after the work queued by [`wait`](DeviceMemory::wait)ed streams).
struct RingBuffer {
    ptr: DevicePtr,
    device_id: u32,
    stream: Arc<CopyStream>,
    slot: Option<Slot>,
    /// Streams passed to `wait`: at release an event is recorded on each.
    waited: Mutex<Vec<Stream>>,
    ring: Sender<Slot>,
    /// Device batches delivered and not yet dropped (see [`Prefetcher::next`]).
    held: Arc<AtomicUsize>,
    /// The process the prefetcher was started in: CUDA does not survive fork.
    origin: Origin,
}

impl RingBuffer {
    fn slot(&self) -> Result<&Slot> {
        // In a forked child the driver cannot be called (nor the lock of `waited` taken, which a
        // parent thread may have held at the moment of the fork).
        self.origin.check()?;
        // The slot is taken only in Drop.
        self.slot
            .as_ref()
            .ok_or_else(|| Error::Internal("a live device batch lost its buffer".into()))
    }
}

impl DeviceMemory for RingBuffer {
    fn address(&self) -> DevicePtr {
        self.ptr
    }

    fn device_id(&self) -> u32 {
        self.device_id
    }

    fn stream(&self) -> Stream {
        self.stream.stream
    }

    fn event(&self) -> Event {
        self.slot().map_or(Event(0), |s| s.copied)
    }

    fn is_ready(&self) -> Result<bool> {
        let slot = self.slot()?;
        slot.backend.query_event(slot.copied)
    }

    fn synchronize(&self) -> Result<()> {
        let slot = self.slot()?;
        slot.backend.synchronize_event(slot.copied)
    }

    fn wait(&self, stream: Stream) -> Result<()> {
        let slot = self.slot()?;
        slot.backend
            .query_event(slot.copied)
            .and_then(|_| slot.backend.stream_wait_event(stream, slot.copied))?;
        let mut waited = self.waited.lock().unwrap_or_else(|p| p.into_inner());
        if !waited.contains(&stream) {
            waited.push(stream);
        }
        Ok(())
    }
}

impl Drop for RingBuffer {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::AcqRel);
        let Some(mut slot) = self.slot.take() else {
            return;
        };
        if self.origin.is_forked() {
            // A forked child cannot call the CUDA driver, and the ring's thread is the
            // parent's: the buffer is leaked (device memory is the parent's context's anyway).
            std::mem::forget(slot);
            return;
        }
        let waited = std::mem::take(self.waited.get_mut().unwrap_or_else(|p| p.into_inner()));
        for stream in waited {
            let event = match slot.spare.pop() {
                Some(e) => e,
                None => match slot.backend.create_event() {
                    Ok(e) => e,
                    // Nothing to order on: the context is broken and no queued work will run.
                    Err(_) => continue,
                },
            };
            match slot.backend.record_event(event, stream) {
                Ok(()) => slot.released.push(event),
                Err(_) => slot.spare.push(event),
            }
        }
        // With the ring gone (loader dropped) the slot comes back here and frees itself.
        let _ = self.ring.send(slot);
    }
}

/// Adds which batch (and field) an error concerns, keeping its kind.
fn in_batch(e: Error, epoch: u64, position: usize, field: Option<&str>) -> Error {
    let at = match field {
        Some(f) => format!("batch {position} of epoch {epoch}, field `{f}`"),
        None => format!("batch {position} of epoch {epoch}"),
    };
    match e {
        Error::Cuda(m) => Error::Cuda(format!("{at}: {m}")),
        Error::OutOfMemory(m) => Error::OutOfMemory(format!("{at}: {m}")),
        other => other,
    }
}

/// The consumer's end. Dropping it stops and joins the thread.
pub struct Prefetcher<M: Send + 'static> {
    out: Receiver<Delivery<M>>,
    /// Dropped to tell the thread to stop (its receivers see the disconnection at once).
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    held: Arc<AtomicUsize>,
    /// Device buffers in the ring now, idle or held.
    total: Arc<AtomicUsize>,
    /// True while the thread waits for a free buffer.
    starved: Arc<AtomicBool>,
    /// The most buffers the ring may grow to now (see [`Worker::limit`]).
    limit: Arc<AtomicUsize>,
    device_id: u32,
}

impl<M: Send + 'static> Prefetcher<M> {
    /// Starts the thread. The ring's events are created here, so a broken device fails now;
    /// buffers are allocated on first use, at the size the batches need.
    pub fn start<F: HostBatches<Mark = M>>(
        feed: F,
        backend: Arc<dyn DeviceBackend>,
        config: PrefetchConfig,
    ) -> Result<Prefetcher<M>> {
        Prefetcher::start_returning(feed, backend, config, None)
    }

    /// [`start`](Self::start), and when the thread stops it sends the feed to `give_back`
    /// (instead of dropping it), so that the feed can be changed and a new prefetcher started on
    /// it. Device batches not yet received are dropped with the old prefetcher.
    pub fn start_returning<F: HostBatches<Mark = M>>(
        feed: F,
        backend: Arc<dyn DeviceBackend>,
        config: PrefetchConfig,
        give_back: Option<Sender<F>>,
    ) -> Result<Prefetcher<M>> {
        Prefetcher::start_replacing(feed, backend, config, give_back, None)
    }

    /// [`start_returning`](Self::start_returning), with what replaces an image neither the
    /// device nor the CPU can decode (the loader's collator under `on_error=skip`); without
    /// it, such an image fails its batch.
    pub(crate) fn start_replacing<F: HostBatches<Mark = M>>(
        feed: F,
        backend: Arc<dyn DeviceBackend>,
        config: PrefetchConfig,
        give_back: Option<Sender<F>>,
        replace: Option<Arc<dyn ReplaceRouted>>,
    ) -> Result<Prefetcher<M>> {
        let slots = config.slots.max(1);
        let max_slots = config.max_slots.max(slots);
        let held_bytes = config
            .stats
            .as_ref()
            .map(|s| Arc::clone(&s.recorder.device_memory))
            .unwrap_or_default();
        // Unbounded: the ring holds at most `max_slots`, which the thread's count enforces.
        let (ring_tx, ring_rx) = crossbeam_channel::unbounded::<Slot>();
        for _ in 0..slots {
            // Cannot fail: the receiver is alive.
            let _ = ring_tx.send(Slot::new(&backend, &held_bytes)?);
        }
        let total = Arc::new(AtomicUsize::new(slots));
        let stream = Arc::new(match config.stream {
            Some(stream) => CopyStream {
                backend: Arc::clone(&backend),
                stream,
                owned: false,
            },
            None => CopyStream {
                backend: Arc::clone(&backend),
                stream: backend.create_stream()?,
                owned: true,
            },
        });
        let (out_tx, out_rx) = crossbeam_channel::bounded(slots);
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let held = Arc::new(AtomicUsize::new(0));
        let starved = Arc::new(AtomicBool::new(false));
        let limit = Arc::new(AtomicUsize::new(max_slots));
        let device_id = backend.ordinal();
        if let Some(trace) = config.stats.as_ref().and_then(|s| s.recorder.trace()) {
            trace.name_track(
                crate::trace::Track::Prefetch,
                format!("stoker-prefetch-cuda{device_id}"),
            );
        }
        let worker = Worker {
            stats: config.stats,
            slots,
            max_slots,
            total: Arc::clone(&total),
            held: Arc::clone(&held),
            starved: Arc::clone(&starved),
            backend,
            held_bytes,
            stream,
            ring_tx,
            ring_rx,
            out: out_tx,
            stop: stop_rx,
            origin: Origin::here(),
            decode_scratch: std::cell::OnceCell::new(),
            replace,
            limit: Arc::clone(&limit),
            largest: std::cell::Cell::new(0),
        };
        let thread = std::thread::Builder::new()
            .name(format!("stoker-prefetch-cuda{device_id}"))
            .spawn(move || worker.run(feed, give_back))
            .map_err(|e| Error::Internal(format!("starting the prefetch thread: {e}")))?;
        Ok(Prefetcher {
            out: out_rx,
            stop: Some(stop_tx),
            thread: Some(thread),
            held,
            total,
            starved,
            limit,
            device_id,
        })
    }

    /// The next device batch (`Ok(None)` at an epoch's end) with the feed's mark after it (none
    /// for a failure of the prefetcher itself). Waits at most `timeout`. Fails instead of waiting
    /// forever when the caller holds every buffer of the ring, the ring cannot grow within the
    /// memory budget and the thread waits for one, since then nothing could arrive.
    #[allow(clippy::type_complexity)]
    pub fn next(
        &mut self,
        timeout: Option<Duration>,
        closer: &Closer,
    ) -> Result<(Result<Option<Batch>>, Option<M>)> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let delivery = loop {
            // While the caller holds the whole ring, wake up now and then to see whether the
            // thread got stuck waiting for a buffer; otherwise just wait.
            let limit = self.limit.load(Ordering::Acquire);
            let ring_held = self.held.load(Ordering::Acquire) >= limit;
            let wait = match (deadline, ring_held) {
                (None, false) => None,
                (None, true) => Some(Duration::from_millis(5)),
                (Some(d), false) => Some(d.saturating_duration_since(Instant::now())),
                (Some(d), true) => Some(
                    d.saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(5)),
                ),
            };
            match closer.recv(&self.out, wait) {
                Wait::Got(d) => break d,
                Wait::Disconnected => return Err(self.exited()),
                Wait::Closed => return Err(crate::close::closed_error()),
                Wait::TimedOut => {
                    // Order matters: the thread sets `starved` only after sending everything
                    // that came before the batch it needs a buffer for.
                    let total = self.total.load(Ordering::Acquire);
                    if self.starved.load(Ordering::Acquire)
                        && self.out.is_empty()
                        && total >= self.limit.load(Ordering::Acquire)
                        && self.held.load(Ordering::Acquire) >= total
                    {
                        return Err(Error::InvalidArgument(format!(
                            "all {total} device buffers of cuda:{} are held by batches not yet \
                             released, and memory_budget holds no more; release one before \
                             asking for the next, or raise memory_budget",
                            self.device_id
                        )));
                    }
                    if let Some(d) = deadline {
                        if Instant::now() >= d {
                            let t = timeout.unwrap_or_default();
                            return Err(Error::Timeout(t.as_millis() as u64));
                        }
                    }
                }
            }
        };
        Ok((delivery.item, delivery.mark))
    }

    fn exited(&self) -> Error {
        Error::Internal(format!(
            "the prefetch thread of cuda:{} has exited",
            self.device_id
        ))
    }

    /// Device batches delivered (to the consumer, or queued for it) and not yet dropped. A batch
    /// counts from its creation: when the thread waits for a buffer it has sent every batch it
    /// made, so with nothing queued this is exactly what the consumer holds.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

impl<M: Send + 'static> Drop for Prefetcher<M> {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // The thread catches panics itself; a join error adds nothing.
            let _ = thread.join();
        }
        // Batches delivered but not received drop with `out`: their slots find the ring gone and
        // free themselves.
    }
}

/// The thread's side.
struct Worker<M> {
    /// The ring's usual size, and the most it may grow to.
    slots: usize,
    max_slots: usize,
    /// Device buffers in the ring now, idle or held.
    total: Arc<AtomicUsize>,
    backend: Arc<dyn DeviceBackend>,
    /// Device memory the ring holds (see [`Slot::held_bytes`]).
    held_bytes: Arc<AtomicU64>,
    stream: Arc<CopyStream>,
    ring_tx: Sender<Slot>,
    ring_rx: Receiver<Slot>,
    out: Sender<Delivery<M>>,
    stop: Receiver<()>,
    held: Arc<AtomicUsize>,
    starved: Arc<AtomicBool>,
    stats: Option<StatsHandle>,
    origin: Origin,
    /// GPU decoding's scratch, allocated at the first image a batch leaves to the device.
    decode_scratch: std::cell::OnceCell<DecodeScratch>,
    /// What replaces an image neither the device nor the CPU can decode, if anything.
    replace: Option<Arc<dyn ReplaceRouted>>,
    /// The most buffers the ring may grow to now: `max_slots`, less those the JPEG decoder's
    /// own device memory takes (the budget counts it, as it counts the scratch), never below
    /// `slots`. The consumer reads it to tell a full ring from a slow one.
    limit: Arc<AtomicUsize>,
    /// The largest device buffer a batch has needed: what one more buffer of the ring costs.
    largest: std::cell::Cell<usize>,
}

impl<M> Drop for Worker<M> {
    fn drop(&mut self) {
        // Free the idle buffers now. A channel's messages are otherwise dropped only when its
        // last sender goes, and every batch the user still holds keeps a sender to the ring.
        while let Ok(slot) = self.ring_rx.try_recv() {
            drop(slot);
        }
    }
}

/// The copies queued and not yet known complete, oldest first, with their host batches.
struct Copying<'a> {
    backend: &'a Arc<dyn DeviceBackend>,
    stats: Option<&'a StatsHandle>,
    /// Each copy's host batch, its event, when it was queued and the bytes it moves.
    copies: VecDeque<(Batch, Event, Instant, usize)>,
}

impl Copying<'_> {
    /// Waits for the oldest copy, records its time, and drops its host batch (its slab goes
    /// back to the arena).
    fn finish_oldest(&mut self) {
        let Some((host, copied, queued, bytes)) = self.copies.pop_front() else {
            return;
        };
        // An error is the batch's, reported through its own event; the host memory is free
        // to go either way once the device is done with it.
        let _ = self.backend.synchronize_event(copied);
        if let Some(stats) = self.stats {
            let done = Instant::now();
            stats
                .recorder
                .copied(host.epoch(), host.position(), queued, done, bytes);
        }
        drop(host);
    }

    fn finish_all(&mut self) {
        while !self.copies.is_empty() {
            self.finish_oldest();
        }
    }
}

impl Drop for Copying<'_> {
    fn drop(&mut self) {
        self.finish_all();
    }
}

impl<M: Send + 'static> Worker<M> {
    fn run<F: HostBatches<Mark = M>>(self, mut feed: F, give_back: Option<Sender<F>>) {
        let outcome = catch_unwind(AssertUnwindSafe(|| self.pump(&mut feed)));
        if let Err(panic) = outcome {
            // The consumer's next call reports it; the calls after that find the thread gone.
            self.send(Delivery {
                item: Err(Error::Internal(format!(
                    "panic in the prefetch thread: {}",
                    crate::error::panic_message(&*panic)
                ))),
                mark: None,
            });
        }
        // The feed (the host loader and its pool) goes back to whoever asked for it, or drops
        // here, on this thread, joining its workers.
        match give_back {
            Some(tx) => drop(tx.send(feed)),
            None => drop(feed),
        }
    }

    fn stopped(&self) -> bool {
        matches!(self.stop.try_recv(), Err(TryRecvError::Disconnected))
    }

    /// Sends unless stopped; false when the consumer is gone.
    fn send(&self, d: Delivery<M>) -> bool {
        crossbeam_channel::select! {
            send(self.out, d) -> r => r.is_ok(),
            recv(self.stop) -> _ => false,
        }
    }

    fn pump<F: HostBatches<Mark = M>>(&self, feed: &mut F) {
        // Dropped on every way out (a panic included): the copies still running finish before
        // their host batches, whose memory the DMA engine reads, go back to the arena.
        let mut copying = Copying {
            backend: &self.backend,
            stats: self.stats.as_ref(),
            copies: VecDeque::with_capacity(COPIES_IN_FLIGHT),
        };
        loop {
            let (item, mark) = loop {
                if self.stopped() {
                    return;
                }
                // With copies running, only a batch that is ready now is taken (its copy then
                // queues behind theirs); otherwise they finish first, so their slabs are back
                // in the arena (where the workers may wait for them) before this thread waits.
                let poll = if copying.copies.is_empty() {
                    POLL
                } else {
                    Duration::ZERO
                };
                match feed.pull(poll) {
                    Pulled::Item(item, mark) => break (item, mark),
                    Pulled::Idle => copying.finish_all(),
                }
            };
            let host = match item {
                Ok(Some(batch)) => batch,
                // An epoch's end or a host-side error passes through in its place.
                other => {
                    let item = other.map(|_| None);
                    if !self.send(Delivery {
                        item,
                        mark: Some(mark),
                    }) {
                        return;
                    }
                    continue;
                }
            };
            if self.ring_rx.is_empty() {
                // The wait for a buffer may be long (the consumer holds them): the host slabs
                // of the copies running go back first.
                copying.finish_all();
            }
            let slot = match self.take_slot() {
                Some(Ok(slot)) => slot,
                Some(Err(e)) => {
                    let item = Err(in_batch(e, host.epoch(), host.position(), None));
                    drop(host);
                    if !self.send(Delivery {
                        item,
                        mark: Some(mark),
                    }) {
                        return;
                    }
                    continue;
                }
                None => return,
            };
            let queued = Instant::now();
            let (item, host) = self.copy(host, slot);
            // Hand the batch out before the copy completes: the consumer's stream waits on the
            // event, not the CPU.
            let delivered = self.send(Delivery {
                item,
                mark: Some(mark),
            });
            // The host batch stays alive until its copy completes (a worker would otherwise
            // overwrite memory the DMA engine still reads), but this thread does not wait for
            // it now: the next batch's copy is queued behind it first. Beyond
            // `COPIES_IN_FLIGHT`, the oldest completes before the next is pulled. A failure is
            // reported to the consumer by the batch's own event (`wait`, `synchronize`,
            // `is_ready`).
            if let Some((host, copied, bytes)) = host {
                copying.copies.push_back((host, copied, queued, bytes));
            }
            while copying.copies.len() >= COPIES_IN_FLIGHT {
                copying.finish_oldest();
            }
            if !delivered {
                return;
            }
        }
    }

    /// A free buffer of the ring, or a new one when the consumer holds them all and the ring
    /// may grow; otherwise waits (backpressure), looking again every [`GROW_POLL`] for the
    /// consumer to take what is queued and hold every buffer. `None` when stopped.
    fn take_slot(&self) -> Option<Result<Slot>> {
        self.shrink();
        if let Ok(slot) = self.ring_rx.try_recv() {
            return Some(Ok(slot));
        }
        self.starved.store(true, Ordering::Release);
        let slot = loop {
            if self.may_grow() {
                self.total.fetch_add(1, Ordering::AcqRel);
                let slot = Slot::new(&self.backend, &self.held_bytes);
                if slot.is_err() {
                    self.total.fetch_sub(1, Ordering::AcqRel);
                }
                break Some(slot);
            }
            crossbeam_channel::select! {
                recv(self.ring_rx) -> slot => break slot.ok().map(Ok),
                recv(self.stop) -> _ => break None,
                default(GROW_POLL) => {}
            }
        };
        self.starved.store(false, Ordering::Release);
        slot
    }

    /// Whether the ring may grow by one buffer: every buffer is held by the consumer (none
    /// waits in the delivery queue, which is backpressure) and the budget allows one more.
    fn may_grow(&self) -> bool {
        let total = self.total.load(Ordering::Acquire);
        total < self.limit.load(Ordering::Acquire)
            && self.out.is_empty()
            && self.held.load(Ordering::Acquire) >= total
    }

    /// Frees idle buffers the ring grew by once the consumer holds fewer batches again: the
    /// ring keeps `slots`, or one more than the consumer holds if that is more.
    fn shrink(&self) {
        loop {
            let total = self.total.load(Ordering::Acquire);
            let keep = self.slots.max(self.held.load(Ordering::Acquire) + 1);
            if total <= keep {
                return;
            }
            let Ok(slot) = self.ring_rx.try_recv() else {
                return;
            };
            self.total.fetch_sub(1, Ordering::AcqRel);
            drop(slot);
        }
    }

    /// Lowers the ring's growth [`limit`](Self::limit) by the buffers of `largest` bytes that the
    /// JPEG decoder's device memory takes now.
    fn count_decoder_in_limit(&self) {
        let decoder = self
            .decode_scratch
            .get()
            .map_or(0, DecodeScratch::decoder_bytes);
        let taken = usize::try_from(decoder)
            .unwrap_or(usize::MAX)
            .div_ceil(self.largest.get().max(1));
        let limit = self.max_slots.saturating_sub(taken).max(self.slots);
        self.limit.store(limit, Ordering::Release);
    }

    /// GPU decoding's scratch, allocated the first time.
    fn decode_scratch(&self) -> Result<&DecodeScratch> {
        if let Some(scratch) = self.decode_scratch.get() {
            return Ok(scratch);
        }
        let scratch = DecodeScratch::new(&self.backend, &self.stream, &self.held_bytes)?;
        Ok(self.decode_scratch.get_or_init(|| scratch))
    }

    /// Queues the copies of `host` into `slot` (then the device decodes of the images it left
    /// to the device, then the casts of `gpu_normalize`) and records the slot's event. Returns
    /// the item to deliver, and the host batch with the event to wait for before dropping it and
    /// the bytes sent.
    #[allow(clippy::type_complexity)]
    fn copy(
        &self,
        mut host: Batch,
        mut slot: Slot,
    ) -> (Result<Option<Batch>>, Option<(Batch, Event, usize)>) {
        let (epoch, position) = (host.epoch(), host.position());
        let stream = self.stream.stream;
        let queued = (|| -> Result<(DevicePtr, Vec<FieldMeta>, usize)> {
            let at = |e, field: Option<&str>| in_batch(e, epoch, position, field);
            let taps = host.decodes().map_or(0, |d| d.taps.len());
            let layout = DeviceLayout::new(host.field_metas(), host.casts(), taps)
                .map_err(|e| at(e, None))?;
            let dst = slot
                .prepare(layout.bytes, stream)
                .map_err(|e| at(e, None))?;
            self.largest.set(self.largest.get().max(layout.bytes));
            let mut copied = 0;
            let mut casts = Vec::new();
            // Where each field's samples lie, for the images decoded on the device.
            let mut placed = vec![None; host.num_fields()];
            for step in &layout.steps {
                // A cast field's uint8 bytes go to its staging area, the kernel's input.
                let (field, to, cast) = match *step {
                    Step::Copy { field, offset } => (field, offset as u64, None),
                    Step::Cast { field, job } => (field, job.src, Some(job)),
                };
                let (Some(meta), Some(src)) = (host.field_meta(field), host.host_ptr(field)) else {
                    continue;
                };
                // SAFETY: `src` is valid for `num_bytes` while `host` lives, and `host` is dropped
                // only after an event recorded below has completed; `dst + to` lies within the
                // buffer `prepare` sized to the whole device layout.
                unsafe {
                    self.backend
                        .copy_to_device_async(dst + to, src, meta.num_bytes(), stream)
                }
                .map_err(|e| at(e, Some(&meta.name)))?;
                copied += meta.num_bytes();
                placed[field] = Some(DeviceField {
                    at: dst + to,
                    sample_bytes: meta.num_bytes()
                        / meta.shape.first().copied().unwrap_or(1).max(1),
                    uint8: meta.dtype == crate::dtype::DType::U8,
                });
                let Some(job) = cast else {
                    continue;
                };
                let table = host
                    .casts()
                    .and_then(|c| c.get(field)?.as_ref())
                    .ok_or_else(|| Error::Internal("a cast step without its cast".into()))?
                    .table();
                let job = CastJob {
                    src: dst + job.src,
                    dst: dst + job.dst,
                    table: dst + job.table,
                    ..job
                };
                // SAFETY: the table is owned by `host` (kept alive as the field's bytes are)
                // and lies within the buffer (the layout put it there).
                unsafe {
                    self.backend.copy_to_device_async(
                        job.table,
                        table.as_ptr(),
                        table.len(),
                        stream,
                    )
                }
                .map_err(|e| at(e, Some(&meta.name)))?;
                copied += table.len();
                casts.push((field, job));
            }
            if let Some(decodes) = host.decodes_mut() {
                let taps = dst + layout.taps as DevicePtr;
                // SAFETY: the taps are the host batch's, kept as its fields are; they fit the
                // room the layout left for them.
                unsafe {
                    self.backend.copy_to_device_async(
                        taps,
                        decodes.taps.as_ptr(),
                        decodes.taps.len(),
                        stream,
                    )
                }
                .map_err(|e| at(e, None))?;
                copied += decodes.taps.len();
                let scratch = self.decode_scratch().map_err(|e| at(e, None))?;
                let replace = self.replace.as_deref();
                copied += decode::queue(
                    &*self.backend,
                    scratch,
                    decodes,
                    &placed,
                    taps,
                    stream,
                    replace,
                )
                .map_err(|e| at(e, None))?;
                self.count_decoder_in_limit();
            }
            for (field, job) in casts {
                // SAFETY: the three ranges lie within the buffer, apart (the layout put them
                // there), their inputs were queued above on this stream, and the buffer is freed
                // only after the slot's event, recorded below, completes.
                unsafe { self.backend.cast_async(&job, stream) }
                    .map_err(|e| at(e, host.field_meta(field).map(|m| m.name.as_str())))?;
            }
            self.backend
                .record_event(slot.copied, stream)
                .map_err(|e| at(e, None))?;
            Ok((dst, layout.fields, copied))
        })();
        match queued {
            Ok((ptr, fields, copied)) => {
                let event = slot.copied;
                self.held.fetch_add(1, Ordering::AcqRel);
                let batch = host.on_device(
                    fields,
                    Box::new(RingBuffer {
                        ptr,
                        device_id: self.backend.ordinal(),
                        stream: Arc::clone(&self.stream),
                        slot: Some(slot),
                        waited: Mutex::new(Vec::new()),
                        ring: self.ring_tx.clone(),
                        held: Arc::clone(&self.held),
                        origin: self.origin,
                    }),
                );
                (Ok(Some(batch)), Some((host, event, copied)))
            }
            Err(e) => {
                // Some fields may have been queued before the failure: wait for them before the
                // host memory or the slot can be reused.
                if self.backend.record_event(slot.copied, stream).is_ok() {
                    let _ = self.backend.synchronize_event(slot.copied);
                }
                let _ = self.ring_tx.send(slot);
                drop(host);
                (Err(e), None)
            }
        }
    }
}

mod decode;
#[cfg(test)]
mod tests;
