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

/// One launch of the resize kernel of GPU decoding (see [`super::resize`]): a decoded RGB8
/// image at `src` (interleaved, `src_width * 3` bytes a row) resampled into the `width` x
/// `height` uint8 sample at `dst`, every output column's source columns and weights in the `x`
/// tables and every output row's in the `y` tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResizeJob {
    /// The decoded image, `src_width` x `src_height` pixels.
    pub src: DevicePtr,
    /// Pixels per row of the decoded image.
    pub src_width: u32,
    /// Rows of the decoded image.
    pub src_height: u32,
    /// The output sample: `height * width * 3` bytes.
    pub dst: DevicePtr,
    /// Pixels per row of the output.
    pub width: u32,
    /// Rows of the output.
    pub height: u32,
    /// Channel planes (NCHW) rather than interleaved pixels (NHWC).
    pub planar: bool,
    /// Mirror the output left to right.
    pub flip: bool,
    /// Per output column: `[first source column, taps used]`, two `u32`.
    pub x_spans: DevicePtr,
    /// Per output column: `x_taps` `f32` weights (zero past the taps used).
    pub x_weights: DevicePtr,
    /// Weights per output column.
    pub x_taps: u32,
    /// Per output row: `[first source row, taps used]`, two `u32`.
    pub y_spans: DevicePtr,
    /// Per output row: `y_taps` `f32` weights (zero past the taps used).
    pub y_weights: DevicePtr,
    /// Weights per output row.
    pub y_taps: u32,
}

/// One JPEG for the device to decode: its bytes (host memory), its size from its header, and
/// where its interleaved RGB8 pixels go (`width * 3` bytes a row).
#[derive(Clone, Copy, Debug)]
pub struct JpegJob<'a> {
    /// The JPEG file's bytes.
    pub data: &'a [u8],
    /// Pixels per row, from the header.
    pub width: u32,
    /// Rows, from the header.
    pub height: u32,
    /// Where the pixels go (device memory).
    pub dst: DevicePtr,
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

    /// Loads stoker's kernels (the cast and the resize) now (they load on first use otherwise), so that a driver that
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

    /// Loads the JPEG decoder (nvJPEG) now, or says why it cannot be used (a loader with
    /// `jpeg_decoder=gpu` fails when made; with `auto` it decodes on the CPU).
    fn load_jpeg_decoder(&self) -> Result<()>;

    /// Queues the decode of `jobs` on `stream`, each into its `dst`. Pushes onto `failed` the
    /// index of every job the device cannot decode (a file its decoder refuses), whose `dst`
    /// is then left as it was; the caller decodes those on the CPU. An `Err` is the device's
    /// failure, not an image's.
    ///
    /// # Safety
    /// Every job's bytes stay valid and unmodified, and its `width * height * 3` bytes at
    /// `dst` stay allocated, until an event recorded on `stream` after this call has completed.
    unsafe fn decode_jpegs_async(
        &self,
        jobs: &[JpegJob<'_>],
        stream: Stream,
        failed: &mut Vec<usize>,
    ) -> Result<()>;

    /// Device memory the JPEG decoder holds for its own work now, in bytes (0 before it decoded
    /// anything).
    fn jpeg_decoder_bytes(&self) -> u64;

    /// Queues the resize kernel on `stream` (see [`super::resize`]).
    ///
    /// # Safety
    /// The ranges `job` names lie in allocated device memory that stays allocated, and `dst`'s
    /// does not overlap the others, until an event recorded on `stream` after this call has
    /// completed.
    unsafe fn resize_async(&self, job: &ResizeJob, stream: Stream) -> Result<()>;

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
