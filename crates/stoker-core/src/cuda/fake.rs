//! A device made of host memory, for testing the prefetcher without a GPU.
//!
//! It behaves like a stream-ordered device where it matters for bugs: copies run later, on the
//! fake's own thread (after an optional delay), so a prefetcher that reads a device buffer, frees
//! it or recycles the host source before the copy's event completed produces wrong data or an
//! "invalid device pointer" error instead of passing by luck. It counts live buffers (leaks,
//! ring bound), can fail a chosen copy when it is queued or when it runs (an asynchronous error,
//! reported by the next event recorded on that stream), and checks every pointer it is given.
//! Cast kernels run the kernel's host reference ([`super::cast::run_on_host`]) in queue order.
//!
//! All streams share one FIFO queue processed in order: a legal schedule of stream semantics
//! (work on one stream runs in order; an event wait is satisfied because the recorded work was
//! queued, and therefore runs, earlier).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::device::{CastJob, DeviceBackend, DevicePtr, Event, JpegJob, ResizeJob, Stream};
use crate::arena::SlabRegistrar;
use crate::error::{Error, Result};
use crate::transform::Taps;

/// The device memory the fake's JPEG decoder reports holding once it decoded something.
pub const FAKE_DECODER_BYTES: u64 = 3 << 20;

/// When an injected copy failure shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailAt {
    /// `copy_to_device_async` itself returns the error (a bad argument, say).
    Enqueue,
    /// The copy fails while running; the next event recorded on its stream reports it.
    Complete,
}

/// Counters of a [`FakeDevice`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FakeCounters {
    /// Device buffers alive now.
    pub live_buffers: usize,
    /// Bytes of the device buffers alive now.
    pub live_bytes: u64,
    /// Most device buffers alive at once.
    pub max_live_buffers: usize,
    /// Device buffers allocated so far.
    pub allocations: u64,
    /// Streams alive now.
    pub live_streams: usize,
    /// Events alive now.
    pub live_events: usize,
    /// Host ranges registered (page-locked) now.
    pub live_registrations: usize,
    /// Copies run so far, failed ones included.
    pub copies_done: u64,
    /// The most copies queued and not yet run at once: above one batch's fields, copies of
    /// consecutive batches overlapped.
    pub max_copies_pending: u64,
    /// Bytes copied from the host so far.
    pub bytes_copied: u64,
    /// Cast kernels run so far.
    pub casts_done: u64,
    /// JPEGs decoded so far.
    pub jpegs_decoded: u64,
    /// JPEGs refused so far (see [`FakeDevice::refuse_jpegs`]).
    pub jpegs_refused: u64,
    /// Resize kernels run so far.
    pub resizes_done: u64,
}

enum Op {
    Copy {
        dst: DevicePtr,
        src: usize,
        bytes: usize,
        stream: Stream,
        fail: bool,
    },
    Record {
        event: Event,
        stream: Stream,
    },
    Cast {
        job: CastJob,
        stream: Stream,
    },
    /// A JPEG decode: host bytes at `src` (kept valid by the caller until the stream's next
    /// event), decoded into `dst`.
    Decode {
        /// The image, decoded when the decode was asked for (interleaved RGB8).
        pixels: Vec<u8>,
        dst: DevicePtr,
        stream: Stream,
    },
    Resize {
        job: ResizeJob,
        stream: Stream,
    },
}

#[derive(Default)]
struct EventState {
    /// Records queued and not yet processed: the event is complete at 0.
    pending: usize,
    error: Option<String>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Op>,
    /// Device memory: address → bytes. Boxed slices never move, so the address is stable.
    buffers: BTreeMap<DevicePtr, Box<[u8]>>,
    max_live: usize,
    allocations: u64,
    streams: HashSet<Stream>,
    events: HashMap<Event, EventState>,
    /// An asynchronous failure waiting for the next event recorded on its stream.
    stream_errors: HashMap<Stream, String>,
    registered: HashMap<usize, usize>,
    next_handle: usize,
    copies_queued: u64,
    copies_done: u64,
    max_copies_pending: u64,
    bytes_copied: u64,
    casts_done: u64,
    jpegs_decoded: u64,
    jpegs_refused: u64,
    /// Decodes asked for so far, refused or not.
    jpegs_asked: u64,
    resizes_done: u64,
    /// Refuse every n-th JPEG (0: none).
    refuse_every: u64,
    /// `load_jpeg_decoder` fails, as without nvJPEG.
    no_jpeg_decoder: bool,
    fail: Option<(u64, FailAt)>,
    delay: Duration,
    /// Misuse seen (double free, free with a copy queued): tests assert there is none.
    violations: Vec<String>,
    shutdown: bool,
}

impl State {
    /// `ptr..ptr+len` within one live buffer.
    fn bytes(&self, ptr: DevicePtr, len: usize) -> Option<&[u8]> {
        let (base, buf) = self.buffers.range(..=ptr).next_back()?;
        let start = usize::try_from(ptr - base).ok()?;
        buf.get(start..start.checked_add(len)?)
    }

    fn bytes_mut(&mut self, ptr: DevicePtr, len: usize) -> Option<&mut [u8]> {
        let (base, buf) = self.buffers.range_mut(..=ptr).next_back()?;
        let start = usize::try_from(ptr - base).ok()?;
        buf.get_mut(start..start.checked_add(len)?)
    }

    /// Runs a cast kernel: the reference on copies of its inputs (which may share a buffer
    /// with the output).
    fn cast(&mut self, job: &CastJob) -> std::result::Result<(), String> {
        let n = job.elements();
        let table_bytes = job.channels as usize * 256 * job.elem_bytes;
        let src = self.bytes(job.src, n).map(<[u8]>::to_vec);
        let table = self.bytes(job.table, table_bytes).map(<[u8]>::to_vec);
        let (Some(src), Some(table)) = (src, table) else {
            return Err(format!(
                "cast kernel reads freed or out-of-range device memory ({:#x} or {:#x})",
                job.src, job.table
            ));
        };
        let dst = self
            .bytes_mut(job.dst, n * job.elem_bytes)
            .ok_or_else(|| format!("cast kernel writes out of range at {:#x}", job.dst))?;
        super::cast::run_on_host(job, &src, &table, dst);
        self.casts_done += 1;
        Ok(())
    }
}

impl State {
    /// Runs a decode: writes the pixels the CPU's decoder, standing in for the device's, made
    /// when it was asked for.
    fn decode(&mut self, pixels: &[u8], dst: DevicePtr) -> std::result::Result<(), String> {
        let out = self
            .bytes_mut(dst, pixels.len())
            .ok_or_else(|| format!("decode writes out of range at {dst:#x}"))?;
        out.copy_from_slice(pixels);
        self.jpegs_decoded += 1;
        Ok(())
    }

    /// Runs a resize kernel: the reference, on copies of its inputs.
    fn resize(&mut self, job: &ResizeJob) -> std::result::Result<(), String> {
        let read = |s: &State, ptr: DevicePtr, len: usize| {
            s.bytes(ptr, len)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| format!("resize kernel reads out of range at {ptr:#x}"))
        };
        let taps = |s: &State, spans: DevicePtr, weights: DevicePtr, n: u32, taps: u32| {
            let (n, taps) = (n as usize, taps as usize);
            let spans = read(s, spans, n * 8)?;
            let weights = read(s, weights, n * taps * 4)?;
            let word = |b: &[u8]| [b[0], b[1], b[2], b[3]];
            Ok::<_, String>(Taps {
                spans: spans
                    .chunks_exact(8)
                    .map(|b| {
                        [
                            u32::from_ne_bytes(word(b)),
                            u32::from_ne_bytes(word(&b[4..])),
                        ]
                    })
                    .collect(),
                weights: weights
                    .chunks_exact(4)
                    .map(|b| f32::from_ne_bytes(word(b)))
                    .collect(),
                taps,
            })
        };
        let x = taps(self, job.x_spans, job.x_weights, job.width, job.x_taps)?;
        let y = taps(self, job.y_spans, job.y_weights, job.height, job.y_taps)?;
        // Every tap must read inside the image.
        let inside = |t: &Taps, size: u32| t.spans.iter().all(|[f, n]| *n >= 1 && f + n <= size);
        if !inside(&x, job.src_width) || !inside(&y, job.src_height) {
            return Err("resize taps read outside the decoded image".into());
        }
        let src = read(
            self,
            job.src,
            job.src_width as usize * job.src_height as usize * 3,
        )?;
        let n = job.width as usize * job.height as usize * 3;
        let dst = self
            .bytes_mut(job.dst, n)
            .ok_or_else(|| format!("resize kernel writes out of range at {:#x}", job.dst))?;
        super::resize::run_on_host(job, &src, (&x, &y), dst);
        self.resizes_done += 1;
        Ok(())
    }
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when work is queued and when work completes.
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock leaves consistent maps; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// See the module documentation. Dropping it finishes the queued work and joins its thread.
pub struct FakeDevice {
    ordinal: u32,
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl FakeDevice {
    /// A fake device with this ordinal, its copy thread started.
    pub fn new(ordinal: u32) -> Result<Arc<FakeDevice>> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                next_handle: 1,
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let worker = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("stoker-fake-device".into())
                .spawn(move || run(&shared))
                .map_err(|e| Error::Internal(format!("starting the fake device's thread: {e}")))?
        };
        Ok(Arc::new(FakeDevice {
            ordinal,
            shared,
            worker: Mutex::new(Some(worker)),
        }))
    }

    /// Each copy takes at least this long (0 by default); makes asynchrony observable.
    pub fn set_copy_delay(&self, delay: Duration) {
        self.shared.lock().delay = delay;
    }

    /// Fails the copy with 0-based sequence number `copy` (counting every copy queued so far).
    pub fn fail_copy(&self, copy: u64, at: FailAt) {
        self.shared.lock().fail = Some((copy, at));
    }

    /// Refuses every `every`-th JPEG asked to decode from now (0: none), as nvJPEG refuses a
    /// file it cannot decode: the caller must decode those on the CPU.
    pub fn refuse_jpegs(&self, every: u64) {
        self.shared.lock().refuse_every = every;
    }

    /// Makes `load_jpeg_decoder` fail, as on a machine without nvJPEG.
    pub fn remove_jpeg_decoder(&self) {
        self.shared.lock().no_jpeg_decoder = true;
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> FakeCounters {
        let s = self.shared.lock();
        FakeCounters {
            live_buffers: s.buffers.len(),
            live_bytes: s.buffers.values().map(|b| b.len() as u64).sum(),
            max_live_buffers: s.max_live,
            allocations: s.allocations,
            live_streams: s.streams.len(),
            live_events: s.events.len(),
            live_registrations: s.registered.len(),
            copies_done: s.copies_done,
            max_copies_pending: s.max_copies_pending,
            bytes_copied: s.bytes_copied,
            casts_done: s.casts_done,
            jpegs_decoded: s.jpegs_decoded,
            jpegs_refused: s.jpegs_refused,
            resizes_done: s.resizes_done,
        }
    }

    /// Misuse of the device seen so far (double free, free while a copy is queued).
    pub fn violations(&self) -> Vec<String> {
        self.shared.lock().violations.clone()
    }

    /// The bytes at `ptr..ptr+len`, if they lie within one live buffer. Call after the copy's
    /// event completed.
    pub fn read(&self, ptr: DevicePtr, len: usize) -> Option<Vec<u8>> {
        self.shared.lock().bytes(ptr, len).map(<[u8]>::to_vec)
    }

    fn handle(s: &mut State) -> usize {
        s.next_handle += 1;
        s.next_handle
    }
}

fn run(shared: &Shared) {
    loop {
        let (op, delay) = {
            let mut s = shared.lock();
            loop {
                if let Some(op) = s.queue.pop_front() {
                    break (op, s.delay);
                }
                if s.shutdown {
                    return;
                }
                s = shared.changed.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        };
        if let Op::Copy { .. } = op {
            if !delay.is_zero() {
                std::thread::sleep(delay);
            }
        }
        let mut s = shared.lock();
        match op {
            Op::Copy {
                dst,
                src,
                bytes,
                stream,
                fail,
            } => {
                s.copies_done += 1;
                s.bytes_copied += bytes as u64;
                if fail {
                    s.stream_errors
                        .insert(stream, "injected asynchronous copy failure".into());
                } else {
                    match s.bytes_mut(dst, bytes) {
                        // SAFETY: the contract of `copy_to_device_async` keeps the host range
                        // valid and unmodified until an event recorded after the copy completes,
                        // which cannot happen before this copy is done.
                        Some(t) => t.copy_from_slice(unsafe {
                            std::slice::from_raw_parts(src as *const u8, bytes)
                        }),
                        None => {
                            s.stream_errors.insert(
                                stream,
                                format!("copy to freed or out-of-range device address {dst:#x}"),
                            );
                        }
                    }
                }
            }
            Op::Cast { job, stream } => {
                if let Err(e) = s.cast(&job) {
                    s.stream_errors.insert(stream, e);
                }
            }
            Op::Decode {
                pixels,
                dst,
                stream,
            } => {
                if let Err(e) = s.decode(&pixels, dst) {
                    s.stream_errors.insert(stream, e);
                }
            }
            Op::Resize { job, stream } => {
                if let Err(e) = s.resize(&job) {
                    s.stream_errors.insert(stream, e);
                }
            }
            Op::Record { event, stream } => {
                let error = s.stream_errors.remove(&stream);
                if let Some(e) = s.events.get_mut(&event) {
                    e.pending = e.pending.saturating_sub(1);
                    if error.is_some() {
                        e.error = error;
                    }
                }
            }
        }
        drop(s);
        shared.changed.notify_all();
    }
}

impl Drop for FakeDevice {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.changed.notify_all();
        let worker = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(worker) = worker {
            let _ = worker.join();
        }
    }
}

impl SlabRegistrar for FakeDevice {
    fn register(&self, ptr: *mut u8, len: usize) -> Result<()> {
        let mut s = self.shared.lock();
        if s.registered.insert(ptr as usize, len).is_some() {
            return Err(Error::Cuda(format!("host memory {ptr:p} registered twice")));
        }
        Ok(())
    }

    fn unregister(&self, ptr: *mut u8, _len: usize) {
        self.shared.lock().registered.remove(&(ptr as usize));
    }
}

impl DeviceBackend for FakeDevice {
    fn ordinal(&self) -> u32 {
        self.ordinal
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let buf = vec![0u8; bytes.max(1)].into_boxed_slice();
        let ptr = buf.as_ptr() as DevicePtr;
        let mut s = self.shared.lock();
        s.buffers.insert(ptr, buf);
        s.allocations += 1;
        s.max_live = s.max_live.max(s.buffers.len());
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: DevicePtr) {
        let mut s = self.shared.lock();
        let Some(buf) = s.buffers.remove(&ptr) else {
            s.violations
                .push(format!("freed {ptr:#x}, which is not a live allocation"));
            return;
        };
        let end = ptr + buf.len() as u64;
        // Freeing memory that queued work still writes is a bug this fake exists to catch.
        let busy = s.queue.iter().any(|op| match op {
            Op::Copy { dst, .. } => (ptr..end).contains(dst),
            Op::Cast { job, .. } => [job.src, job.dst, job.table]
                .iter()
                .any(|p| (ptr..end).contains(p)),
            Op::Decode { dst, .. } => (ptr..end).contains(dst),
            Op::Resize { job, .. } => [job.src, job.dst, job.x_spans, job.y_weights]
                .iter()
                .any(|p| (ptr..end).contains(p)),
            Op::Record { .. } => false,
        });
        if busy {
            s.violations
                .push(format!("freed {ptr:#x} while a copy to it is queued"));
        }
    }

    fn create_stream(&self) -> Result<Stream> {
        let mut s = self.shared.lock();
        let stream = Stream(Self::handle(&mut s));
        s.streams.insert(stream);
        Ok(stream)
    }

    unsafe fn destroy_stream(&self, stream: Stream) {
        self.shared.lock().streams.remove(&stream);
    }

    fn create_event(&self) -> Result<Event> {
        let mut s = self.shared.lock();
        let event = Event(Self::handle(&mut s));
        s.events.insert(event, EventState::default());
        Ok(event)
    }

    unsafe fn destroy_event(&self, event: Event) {
        self.shared.lock().events.remove(&event);
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: Stream,
    ) -> Result<()> {
        let mut s = self.shared.lock();
        let seq = s.copies_queued;
        s.copies_queued += 1;
        let fail = match s.fail {
            Some((n, FailAt::Enqueue)) if n == seq => {
                return Err(Error::Cuda("injected copy failure".into()));
            }
            Some((n, FailAt::Complete)) => n == seq,
            _ => false,
        };
        if stream != Stream::DEFAULT && !s.streams.contains(&stream) {
            return Err(Error::Cuda(format!("copy on unknown stream {stream:?}")));
        }
        s.queue.push_back(Op::Copy {
            dst,
            src: src as usize,
            bytes,
            stream,
            fail,
        });
        s.max_copies_pending = s.max_copies_pending.max(s.copies_queued - s.copies_done);
        drop(s);
        self.shared.changed.notify_all();
        Ok(())
    }

    fn load_kernels(&self) -> Result<()> {
        Ok(())
    }

    unsafe fn cast_async(&self, job: &CastJob, stream: Stream) -> Result<()> {
        let mut s = self.shared.lock();
        if stream != Stream::DEFAULT && !s.streams.contains(&stream) {
            return Err(Error::Cuda(format!("cast on unknown stream {stream:?}")));
        }
        if !matches!(job.elem_bytes, 2 | 4) {
            return Err(Error::Cuda(format!(
                "cast to {}-byte elements: no such kernel",
                job.elem_bytes
            )));
        }
        s.queue.push_back(Op::Cast { job: *job, stream });
        drop(s);
        self.shared.changed.notify_all();
        Ok(())
    }

    fn load_jpeg_decoder(&self) -> Result<()> {
        if self.shared.lock().no_jpeg_decoder {
            return Err(Error::Unsupported(
                "the fake device has no JPEG decoder (set so by the test)".into(),
            ));
        }
        Ok(())
    }

    unsafe fn decode_jpegs_async(
        &self,
        jobs: &[JpegJob<'_>],
        stream: Stream,
        failed: &mut Vec<usize>,
    ) -> Result<()> {
        self.load_jpeg_decoder()?;
        // Decoded now, as nvJPEG parses the header and decodes the Huffman data on the host
        // when it is called (the default backend; a batch the hardware fails is decoded again
        // so): a file it refuses, or whose scan is corrupt, is known now. `None`: not decoded,
        // or not of the size the job says.
        let decoded: Vec<Option<Vec<u8>>> = jobs
            .iter()
            .map(|job| {
                let mut bufs = crate::decode::DecodeBuffers::default();
                let dims = crate::decode::decode_rgb(job.data, u64::MAX, &mut bufs).ok()?;
                let fits = (dims.width, dims.height) == (job.width as usize, job.height as usize);
                fits.then_some(bufs.rgb)
            })
            .collect();
        let mut s = self.shared.lock();
        if stream != Stream::DEFAULT && !s.streams.contains(&stream) {
            return Err(Error::Cuda(format!("decode on unknown stream {stream:?}")));
        }
        for (i, (job, pixels)) in jobs.iter().zip(decoded).enumerate() {
            s.jpegs_asked += 1;
            let refused = s.refuse_every > 0 && s.jpegs_asked.is_multiple_of(s.refuse_every);
            let taken = crate::decode::device_jpeg(job.data).is_some();
            let (Some(pixels), true, false) = (pixels, taken, refused) else {
                s.jpegs_refused += 1;
                failed.push(i);
                continue;
            };
            s.queue.push_back(Op::Decode {
                pixels,
                dst: job.dst,
                stream,
            });
        }
        drop(s);
        self.shared.changed.notify_all();
        Ok(())
    }

    fn jpeg_decoder_bytes(&self) -> u64 {
        // As nvJPEG's own buffers: kept once something was decoded.
        if self.shared.lock().jpegs_asked > 0 {
            FAKE_DECODER_BYTES
        } else {
            0
        }
    }

    unsafe fn resize_async(&self, job: &ResizeJob, stream: Stream) -> Result<()> {
        let mut s = self.shared.lock();
        if stream != Stream::DEFAULT && !s.streams.contains(&stream) {
            return Err(Error::Cuda(format!("resize on unknown stream {stream:?}")));
        }
        s.queue.push_back(Op::Resize { job: *job, stream });
        drop(s);
        self.shared.changed.notify_all();
        Ok(())
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let bytes = self
            .read(src, dst.len())
            .ok_or_else(|| Error::Cuda(format!("copy from invalid device address {src:#x}")))?;
        dst.copy_from_slice(&bytes);
        Ok(())
    }

    fn record_event(&self, event: Event, stream: Stream) -> Result<()> {
        let mut s = self.shared.lock();
        let Some(e) = s.events.get_mut(&event) else {
            return Err(Error::Cuda(format!("record of unknown event {event:?}")));
        };
        e.pending += 1;
        // Re-recording resets what the event reports, as in CUDA.
        e.error = None;
        s.queue.push_back(Op::Record { event, stream });
        drop(s);
        self.shared.changed.notify_all();
        Ok(())
    }

    fn query_event(&self, event: Event) -> Result<bool> {
        let s = self.shared.lock();
        match s.events.get(&event) {
            None => Err(Error::Cuda(format!("query of unknown event {event:?}"))),
            Some(e) if e.pending > 0 => Ok(false),
            Some(EventState {
                error: Some(err), ..
            }) => Err(Error::Cuda(err.clone())),
            Some(_) => Ok(true),
        }
    }

    fn synchronize_event(&self, event: Event) -> Result<()> {
        let mut s = self.shared.lock();
        loop {
            match s.events.get(&event) {
                None => return Err(Error::Cuda(format!("wait on unknown event {event:?}"))),
                Some(e) if e.pending == 0 => {
                    return match &e.error {
                        Some(err) => Err(Error::Cuda(err.clone())),
                        None => Ok(()),
                    }
                }
                Some(_) => {
                    s = self
                        .shared
                        .changed
                        .wait(s)
                        .unwrap_or_else(|p| p.into_inner())
                }
            }
        }
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        let s = self.shared.lock();
        if !s.events.contains_key(&event) {
            return Err(Error::Cuda(format!("wait on unknown event {event:?}")));
        }
        if stream != Stream::DEFAULT && !s.streams.contains(&stream) {
            return Err(Error::Cuda(format!("wait on unknown stream {stream:?}")));
        }
        // One FIFO queue: everything the event covers was queued earlier and so runs first.
        Ok(())
    }
}
