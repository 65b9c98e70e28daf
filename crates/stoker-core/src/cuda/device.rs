//! The device operations the prefetcher needs, as a trait: the real driver ([`CudaDevice`],
//! feature `cuda`) implements it, and so does a host-memory fake (`FakeDevice`, feature `testing`) that lets the
//! prefetcher's ordering, backpressure, error and shutdown paths be tested on machines without a
//! GPU.
//!
//! Handles are plain integers (a `CUstream`/`CUevent` pointer or a device address for the real
//! driver, an id for the fake): they are `Copy + Send`, which keeps ownership rules in the
//! prefetcher, where the lifetimes are known, rather than in wrapper types.
//!
//! [`CudaDevice`]: super::CudaDevice

use crate::arena::SlabRegistrar;
use crate::error::Result;

/// A device memory address (`CUdeviceptr`).
pub type DevicePtr = u64;

/// A stream handle (`CUstream`). `Stream(0)` is the legacy default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream(pub usize);

impl Stream {
    /// The legacy default ("NULL") stream.
    pub const DEFAULT: Stream = Stream(0);
}

/// An event handle (`CUevent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event(pub usize);

/// One launch of the cast kernel of `gpu_normalize` (see [`super::cast`]): `rows × plane` uint8
/// elements at `src` become elements of `elem_bytes` at `dst`, `table[channel * 256 + value]`
/// each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CastJob {
    /// The uint8 input.
    pub src: DevicePtr,
    /// The output, `elements()` elements of `elem_bytes`.
    pub dst: DevicePtr,
    /// `channels × 256` elements of `elem_bytes`.
    pub table: DevicePtr,
    /// 4 (float32) or 2 (float16, bfloat16).
    pub elem_bytes: usize,
    /// Rows of the field (NCHW: samples × channels; NHWC: samples).
    pub rows: u32,
    /// Elements per row.
    pub plane: u32,
    /// Channels of the image, and tables.
    pub channels: u32,
    /// NHWC: an element's channel is its column modulo `channels`; NCHW: its row's.
    pub channel_by_column: bool,
}

impl CastJob {
    /// Elements of the field (bytes of the uint8 input).
    pub fn elements(&self) -> usize {
        self.rows as usize * self.plane as usize
    }
}

/// What the prefetcher asks of a device. Host registration comes from the [`SlabRegistrar`]
/// supertrait, so the same object can be handed to the arena.
///
/// Errors are [`crate::Error::Cuda`] (or `OutOfMemory` for an allocation); the prefetcher adds
/// which batch and field they concern.
pub trait DeviceBackend: SlabRegistrar {
    /// The device ordinal (`N` of `cuda:N`).
    fn ordinal(&self) -> u32;

    /// `bytes` of device memory (`cuMemAlloc`).
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;

    /// Frees memory from [`alloc`](Self::alloc).
    ///
    /// # Safety
    /// `ptr` came from `alloc` on this device, is freed once, and no queued work uses it.
    unsafe fn free(&self, ptr: DevicePtr);

    /// A stream that does not synchronize with the legacy default stream.
    fn create_stream(&self) -> Result<Stream>;

    /// # Safety
    /// `stream` came from `create_stream` and is destroyed once.
    unsafe fn destroy_stream(&self, stream: Stream);

    /// An event without timing (cheaper to record and query).
    fn create_event(&self) -> Result<Event>;

    /// # Safety
    /// `event` came from `create_event` and is destroyed once.
    unsafe fn destroy_event(&self, event: Event);

    /// Queues a copy of `bytes` bytes from host `src` to device `dst` on `stream`.
    ///
    /// # Safety
    /// `src..src+bytes` stays valid and unmodified, and `dst..dst+bytes` stays allocated, until
    /// an event recorded on `stream` after this call has completed.
    unsafe fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: Stream,
    ) -> Result<()>;

    /// Loads the cast kernels now (they load on first use otherwise), so that a driver that
    /// cannot load them fails when the loader is made rather than at its first batch.
    fn load_kernels(&self) -> Result<()>;

    /// Queues the cast kernel on `stream` (see [`super::cast`]): `job.src`'s uint8 elements
    /// become `job.dst`'s, looked up in `job.table`.
    ///
    /// # Safety
    /// The three ranges `job` names lie in allocated device memory that stays allocated, and
    /// `dst`'s does not overlap the others, until an event recorded on `stream` after this call
    /// has completed.
    unsafe fn cast_async(&self, job: &CastJob, stream: Stream) -> Result<()>;

    /// Copies device memory back to the host, blocking until done (tests and diagnostics; the
    /// loader never copies back).
    ///
    /// # Safety
    /// `src..src+dst.len()` is allocated device memory whose writes have completed.
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()>;

    /// Records `event` on `stream`: it completes when the work queued there so far has.
    fn record_event(&self, event: Event, stream: Stream) -> Result<()>;

    /// Whether `event` has completed (an event never recorded has). An error queued work hit
    /// (an asynchronous copy failure) is returned here.
    fn query_event(&self, event: Event) -> Result<bool>;

    /// Blocks until `event` has completed; returns the error queued work hit, if any.
    fn synchronize_event(&self, event: Event) -> Result<()>;

    /// Makes work queued on `stream` after this call wait for `event` (without blocking the host).
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()>;
}
