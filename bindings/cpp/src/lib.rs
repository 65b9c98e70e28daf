//! The Rust half of stoker's C++ API: a `cxx` bridge over stoker-core.
//!
//! The bridge is deliberately low level (namespace `stoker::ffi`); the C++ API that users see is
//! the hand-written `include/stoker/stoker.hpp` on top of it.
//!
//! Errors cross as `rust::Error` exceptions whose message is `"<status>|<message>"`, where
//! `<status>` is the C ABI's `stoker_status` value; `stoker.hpp` parses it back into a
//! `stoker::Error` carrying a `stoker::Status`. No panic crosses: each call that can reach the
//! engine runs under `stoker_core::catch_panic` and a panic becomes `STOKER_ERR_INTERNAL`.
//!
//! One Rust staticlib per link: this crate's archive contains stoker-core and Rust's standard
//! library. Link it (CMake target `stoker::cxx`) or the C ABI's `libstoker.a`, never both.

use std::fmt;
use std::sync::Arc;

use cxx::UniquePtr;
use stoker_core::source::SampleWriter;
use stoker_core::{
    Batch, DType, Error, ErrorKind, IterableSource, Loader, LoaderOptions, SampleStream,
    SourceSpec, StatsHandle, Stream, StreamInfo,
};

// `pack` takes the eight arguments of `stoker pack` (and `stoker_pack`) one by one, as C++
// passes them; the bridge's generated shims would repeat the lint for each.
#[allow(clippy::too_many_arguments)]
#[cxx::bridge(namespace = "stoker::ffi")]
mod ffi {
    /// One field of a batch, as `stoker_tensor` of the C ABI.
    struct FieldInfo {
        name: String,
        /// Address of the first element; valid while the batch lives.
        data: usize,
        /// `stoker_dtype` value.
        dtype: u32,
        /// DLPack device codes: 1 CPU, 2 CUDA (device memory), 3 CUDA host (page-locked).
        device_type: i32,
        /// The CUDA ordinal for device batches; 0 otherwise.
        device_id: i32,
        shape: Vec<i64>,
        /// In elements.
        strides: Vec<i64>,
    }

    /// A snapshot of a loader's counters, as `stoker_stats`.
    struct StatsInfo {
        batches: u64,
        samples: u64,
        samples_skipped: u64,
        wait_ns_total: u64,
        wait_ns_p50: u64,
        wait_ns_p95: u64,
        wait_ns_max: u64,
        elapsed_ns: u64,
        readiness: f64,
        worker_busy: f64,
        slabs_pinned: u64,
        pin_failures: u64,
        rank: u64,
        world_size: u64,
        local_rank: u64,
        local_world_size: u64,
        /// `stoker_launcher` value.
        launcher: u64,
        /// Stage totals over every worker, per-sample (per-batch for h2d) percentiles.
        read_ns: u64,
        decode_ns: u64,
        transform_ns: u64,
        collate_ns: u64,
        h2d_ns: u64,
        num_workers: u64,
        read_ns_p50: u64,
        read_ns_p95: u64,
        decode_ns_p50: u64,
        decode_ns_p95: u64,
        transform_ns_p50: u64,
        transform_ns_p95: u64,
        collate_ns_p50: u64,
        collate_ns_p95: u64,
        h2d_ns_p50: u64,
        h2d_ns_p95: u64,
        busy_ns: u64,
        /// The memory budget, one batch's bytes, the in-flight cap in use and the one asked for.
        memory_budget: u64,
        batch_bytes: u64,
        in_flight_cap: u64,
        in_flight_cap_requested: u64,
        /// Batches in flight per worker now, and the changes autotune made.
        prefetch_factor: u64,
        autotune_decisions: u64,
        /// Images by decode path (option jpeg_decoder).
        decoded_zune: u64,
        decoded_turbo: u64,
        decoded_turbo_region: u64,
        decoded_turbo_scaled: u64,
        /// Batches the loader lets be in flight now (at most `in_flight_cap`).
        in_flight_depth: u64,
        /// Batch memory mapped now, in bytes.
        batch_memory_bytes: u64,
        /// The most batch memory mapped at once so far, in bytes.
        batch_memory_peak_bytes: u64,
        /// Minor page faults taken by batch memory since the loader was created.
        page_faults: u64,
        /// Bytes copied host to device (device=cuda), summed over batches.
        h2d_bytes: u64,
        /// Device memory the loader holds now (device=cuda), in bytes.
        device_memory_bytes: u64,
        /// Images the workers left to the device's JPEG decoder (jpeg_decoder=gpu/auto).
        decoded_device: u64,
        /// The share of samples the device decodes now (gpu_decode_share).
        gpu_decode_share: f64,
        /// Busy time of each worker, by worker number.
        worker_busy_ns: Vec<u64>,
    }

    /// Which stream an iterable source opens, as `stoker_stream_info` of the C ABI.
    struct StreamInfoC {
        rank: u64,
        world_size: u64,
        worker: u64,
        num_workers: u64,
        seed: u64,
        epoch: u64,
    }

    /// A stream's saved position, if it gave one.
    struct SavedState {
        has_state: bool,
        state: String,
    }

    extern "Rust" {
        type OptionsHandle;
        type LoaderHandle;
        type BatchHandle;
        type StatsReader;
        type LoaderCloser;

        fn version() -> &'static str;

        /// Packs the source spec `src` into `out` (stoker's packed format; see `stoker_pack`).
        /// Strings as bytes, as `set`; `max_side`, `shard_size` and `num_shards` 0 mean unset.
        fn pack(
            src: &[u8],
            out: &[u8],
            max_side: u32,
            quality: u32,
            mode: &[u8],
            shard_size: u64,
            shard_index: u32,
            num_shards: u32,
        ) -> Result<()>;
        /// Writes the index of the slices packed into the directory `out`.
        fn pack_merge(out: &[u8]) -> Result<()>;

        fn options_new() -> Box<OptionsHandle>;
        fn options_clone(options: &OptionsHandle) -> Box<OptionsHandle>;
        /// Key and value as bytes: invalid UTF-8 is an INVALID_ARGUMENT error, not a C++
        /// `std::invalid_argument` from `rust::Str`.
        fn set(self: &mut OptionsHandle, key: &[u8], value: &[u8]) -> Result<()>;

        fn loader_new(options: &OptionsHandle) -> Result<Box<LoaderHandle>>;
        /// The next batch (a device batch for `device=cuda[:N]`); at the end of an epoch a handle
        /// with `is_end()` true.
        fn next(self: &mut LoaderHandle) -> Result<Box<BatchHandle>>;
        fn epoch(self: &LoaderHandle) -> u64;
        fn batches_per_epoch(self: &LoaderHandle) -> i64;
        fn save_state(self: &LoaderHandle) -> String;
        /// The next batch is the first of `epoch` (in-flight work discarded).
        fn set_epoch(self: &mut LoaderHandle, epoch: u64) -> Result<()>;
        /// A reader of this loader's counters, usable from any thread while another drives it.
        fn stats_reader(self: &LoaderHandle) -> Box<StatsReader>;
        /// Fails with UNSUPPORTED in a child process forked after the loader was made.
        fn snapshot(self: &StatsReader) -> Result<StatsInfo>;
        fn closer(self: &LoaderHandle) -> Box<LoaderCloser>;
        fn close(self: &LoaderCloser);

        fn is_end(self: &BatchHandle) -> bool;
        fn len(self: &BatchHandle) -> usize;
        fn epoch(self: &BatchHandle) -> u64;
        fn position(self: &BatchHandle) -> usize;
        fn fields(self: &BatchHandle) -> Vec<FieldInfo>;
        /// The copy's `CUstream` / `CUevent` as an address; 0 for host batches.
        fn cuda_stream(self: &BatchHandle) -> usize;
        fn cuda_event(self: &BatchHandle) -> usize;
        /// `DeviceBatch::wait` on the `CUstream` at `stream` (0: the legacy default stream);
        /// nothing for host batches.
        fn wait(self: &BatchHandle, stream: usize) -> Result<()>;
        /// `DeviceBatch::synchronize`; nothing for host batches.
        fn synchronize(self: &BatchHandle) -> Result<()>;

        /// The sample a custom source is filling, valid during one `SourceBridge::get` call.
        type SampleHandle<'a, 'b>;
        fn put_encoded(self: &mut SampleHandle, bytes: &[u8]) -> Result<()>;
        fn put_tensor(
            self: &mut SampleHandle,
            field: &[u8],
            dtype: u32,
            shape: &[i64],
            data: &[u8],
        ) -> Result<()>;
        fn put_label(self: &mut SampleHandle, label: i64) -> Result<()>;

        /// Makes `source` (a C++ `stoker::Source`) the options' source.
        fn set_source(self: &mut OptionsHandle, source: UniquePtr<SourceBridge>) -> Result<()>;
        /// Makes `source` (a C++ `stoker::IterableSource`) the options' source.
        fn set_iterable(self: &mut OptionsHandle, source: UniquePtr<IterableBridge>) -> Result<()>;
    }

    // SAFETY: the signatures below match `include/stoker/source_bridge.hpp` (cxx checks them at
    // compile time of the generated C++); both methods are const and thread-safe by contract.
    unsafe extern "C++" {
        include!("stoker/source_bridge.hpp");

        /// Owns the user's `stoker::Source`.
        type SourceBridge;
        fn size(self: &SourceBridge) -> Result<usize>;
        /// A C++ exception thrown by the user's `get` arrives as `Err`, carrying its `what()`.
        fn get(self: &SourceBridge, index: usize, sample: &mut SampleHandle) -> Result<()>;

        /// Owns the user's `stoker::IterableSource`.
        type IterableBridge;
        /// Opens a stream; `resume` holds a saved state when `has_resume`.
        fn open(
            self: &IterableBridge,
            info: &StreamInfoC,
            resume: &[u8],
            has_resume: bool,
        ) -> Result<UniquePtr<StreamBridge>>;
        fn saves_state(self: &IterableBridge) -> bool;

        /// Owns one open `stoker::SampleStream`; destroying it closes the stream.
        type StreamBridge;
        /// True with a sample given, false at the end of the stream.
        fn next(self: Pin<&mut StreamBridge>, sample: &mut SampleHandle) -> Result<bool>;
        fn save_state(self: Pin<&mut StreamBridge>) -> Result<SavedState>;
    }
}

use ffi::{FieldInfo, IterableBridge, SourceBridge, StatsInfo, StreamBridge};

/// An error on its way to C++: `"<status>|<message>"` (see the module docs).
#[derive(Debug)]
pub struct BridgeError {
    status: i32,
    message: String,
}

impl fmt::Display for BridgeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}|{}", self.status, self.message)
    }
}

impl std::error::Error for BridgeError {}

impl From<Error> for BridgeError {
    fn from(e: Error) -> BridgeError {
        BridgeError {
            status: e.kind().code(),
            message: e.to_string(),
        }
    }
}

fn invalid_argument(message: String) -> BridgeError {
    BridgeError {
        status: ErrorKind::InvalidArgument.code(),
        message,
    }
}

/// Runs `f`, turning a panic into an INTERNAL error instead of an abort at the boundary.
fn guard<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, BridgeError> {
    stoker_core::catch_panic(f)
        .and_then(|result| result)
        .map_err(BridgeError::from)
}

fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// UTF-8 text of a bridge argument, or an INVALID_ARGUMENT error naming it.
fn utf8<'a>(what: &str, bytes: &'a [u8]) -> Result<&'a str, BridgeError> {
    std::str::from_utf8(bytes).map_err(|_| {
        BridgeError::from(Error::InvalidArgument(format!("{what} is not valid UTF-8")))
    })
}

#[allow(clippy::too_many_arguments)]
fn pack(
    src: &[u8],
    out: &[u8],
    max_side: u32,
    quality: u32,
    mode: &[u8],
    shard_size: u64,
    shard_index: u32,
    num_shards: u32,
) -> Result<(), BridgeError> {
    let (src, out, mode) = (utf8("src", src)?, utf8("out", out)?, utf8("mode", mode)?);
    guard(|| {
        let options = stoker_core::pack::PackOptions::from_arguments(
            max_side,
            quality,
            Some(mode),
            shard_size,
            shard_index,
            num_shards,
        )?;
        stoker_core::pack::pack_spec(src, std::path::Path::new(out), &options, &|_, _| {})
            .map(|_| ())
    })
}

fn pack_merge(out: &[u8]) -> Result<(), BridgeError> {
    let out = utf8("out", out)?;
    guard(|| stoker_core::pack::merge(std::path::Path::new(out)).map(|_| ()))
}

pub struct OptionsHandle(LoaderOptions);

fn options_new() -> Box<OptionsHandle> {
    Box::new(OptionsHandle(LoaderOptions::new()))
}

fn options_clone(options: &OptionsHandle) -> Box<OptionsHandle> {
    Box::new(OptionsHandle(options.0.clone()))
}

impl OptionsHandle {
    fn set(&mut self, key: &[u8], value: &[u8]) -> Result<(), BridgeError> {
        let key = std::str::from_utf8(key).map_err(|_| {
            invalid_argument(format!(
                "option key {} is not UTF-8",
                String::from_utf8_lossy(key)
            ))
        })?;
        let value = std::str::from_utf8(value)
            .map_err(|_| invalid_argument(format!("option `{key}`: value is not UTF-8")))?;
        guard(|| self.0.set(key, value))
    }

    fn set_source(&mut self, source: UniquePtr<SourceBridge>) -> Result<(), BridgeError> {
        let source = Arc::new(CxxSource(source));
        let len = match source.0.as_ref() {
            Some(bridge) => bridge.size().map_err(|e| BridgeError {
                status: ErrorKind::Callback.code(),
                message: format!("source: stoker::Source::size() failed: {}", e.what()),
            })?,
            None => return Err(invalid_argument("source: null stoker::Source".into())),
        };
        let read = move |index: usize, writer: &mut SampleWriter<'_>| {
            let Some(bridge) = source.0.as_ref() else {
                return Err("null stoker::Source".to_string());
            };
            let mut sample = SampleHandle { writer };
            bridge
                .get(index, &mut sample)
                .map_err(|e| e.what().to_string())
        };
        self.0.set_source(SourceSpec::Callback {
            len,
            read: Arc::new(read),
        });
        Ok(())
    }
}

impl OptionsHandle {
    fn set_iterable(&mut self, source: UniquePtr<IterableBridge>) -> Result<(), BridgeError> {
        if source.is_null() {
            return Err(invalid_argument(
                "source: null stoker::IterableSource".into(),
            ));
        }
        self.0
            .set_source(SourceSpec::Iterable(Arc::new(CxxIterable(source))));
        Ok(())
    }
}

/// The user's C++ iterable source.
struct CxxIterable(UniquePtr<IterableBridge>);

// SAFETY: `stoker::IterableSource` documents that `open()` and `saves_state()` are const and may
// be called from any thread, and that the object may be destroyed on any thread; the bridge only
// calls those const methods.
unsafe impl Send for CxxIterable {}
// SAFETY: as above: shared access only calls thread-safe const methods.
unsafe impl Sync for CxxIterable {}

impl IterableSource for CxxIterable {
    fn open(
        &self,
        info: &StreamInfo,
        resume: Option<&str>,
    ) -> Result<Box<dyn SampleStream>, String> {
        let Some(bridge) = self.0.as_ref() else {
            return Err("null stoker::IterableSource".into());
        };
        let info = ffi::StreamInfoC {
            rank: info.rank as u64,
            world_size: info.world_size as u64,
            worker: info.worker as u64,
            num_workers: info.num_workers as u64,
            seed: info.seed,
            epoch: info.epoch,
        };
        let stream = bridge
            .open(&info, resume.unwrap_or("").as_bytes(), resume.is_some())
            .map_err(|e| e.what().to_string())?;
        if stream.is_null() {
            return Err("stoker::IterableSource::open returned a null stream".into());
        }
        Ok(Box::new(CxxStream(stream)))
    }

    fn saves_state(&self) -> bool {
        self.0.as_ref().is_some_and(|b| b.saves_state())
    }
}

/// One open C++ stream.
struct CxxStream(UniquePtr<StreamBridge>);

// SAFETY: `stoker::SampleStream` documents that its methods may be called from different threads
// one at a time (never concurrently) and that it may be destroyed on any thread; `&mut self`
// makes the calls exclusive.
unsafe impl Send for CxxStream {}

impl SampleStream for CxxStream {
    fn next(&mut self, out: &mut SampleWriter<'_>) -> Result<bool, String> {
        let mut sample = SampleHandle { writer: out };
        self.0
            .pin_mut()
            .next(&mut sample)
            .map_err(|e| e.what().to_string())
    }

    fn save_state(&mut self) -> Result<Option<String>, String> {
        let saved = self
            .0
            .pin_mut()
            .save_state()
            .map_err(|e| e.what().to_string())?;
        Ok(saved.has_state.then_some(saved.state))
    }
}

/// The user's C++ source, shared by the worker threads.
struct CxxSource(UniquePtr<SourceBridge>);

// SAFETY: `stoker::Source` documents that `size()` and `get()` are const and may be called
// concurrently from several threads, and that the object may be destroyed on any thread; the
// bridge only ever calls those const methods and never mutates the pointer.
unsafe impl Send for CxxSource {}
// SAFETY: as above: shared access only calls thread-safe const methods.
unsafe impl Sync for CxxSource {}

/// The sample being filled, handed to C++ for the duration of one `get` call.
pub struct SampleHandle<'a, 'b> {
    writer: &'a mut SampleWriter<'b>,
}

impl SampleHandle<'_, '_> {
    fn put_encoded(&mut self, bytes: &[u8]) -> Result<(), BridgeError> {
        self.writer.put_encoded(bytes).map_err(invalid_argument)
    }

    fn put_tensor(
        &mut self,
        field: &[u8],
        dtype: u32,
        shape: &[i64],
        data: &[u8],
    ) -> Result<(), BridgeError> {
        let field = std::str::from_utf8(field)
            .map_err(|_| invalid_argument("put_tensor: field name is not UTF-8".into()))?;
        let dtype = DType::from_code(dtype).ok_or_else(|| {
            invalid_argument(format!("put_tensor `{field}`: unknown dtype code {dtype}"))
        })?;
        let shape = shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| {
                invalid_argument(format!(
                    "put_tensor `{field}`: negative dimension in {shape:?}"
                ))
            })?;
        self.writer
            .put_tensor(field, dtype, &shape, data)
            .map_err(invalid_argument)
    }

    fn put_label(&mut self, label: i64) -> Result<(), BridgeError> {
        self.writer.put_label(label).map_err(invalid_argument)
    }
}

pub struct LoaderHandle(Loader);

fn loader_new(options: &OptionsHandle) -> Result<Box<LoaderHandle>, BridgeError> {
    guard(|| Loader::new(&options.0)).map(|l| Box::new(LoaderHandle(l)))
}

impl LoaderHandle {
    fn next(&mut self) -> Result<Box<BatchHandle>, BridgeError> {
        let loader = &mut self.0;
        guard(|| loader.next()).map(|b| Box::new(BatchHandle(b)))
    }

    fn epoch(&self) -> u64 {
        self.0.epoch()
    }

    fn batches_per_epoch(&self) -> i64 {
        self.0.batches_per_epoch_i64()
    }

    fn save_state(&self) -> String {
        self.0.save_state()
    }

    fn set_epoch(&mut self, epoch: u64) -> Result<(), BridgeError> {
        let loader = &mut self.0;
        guard(|| loader.set_epoch(epoch))
    }

    fn stats_reader(&self) -> Box<StatsReader> {
        Box::new(StatsReader(self.0.stats_handle()))
    }

    fn closer(&self) -> Box<LoaderCloser> {
        Box::new(LoaderCloser(self.0.closer()))
    }
}

/// Closes a loader from any thread: like [`StatsReader`], a separate object so that closing
/// never aliases the loader another thread is driving.
pub struct LoaderCloser(stoker_core::Closer);

impl LoaderCloser {
    fn close(&self) {
        self.0.close();
    }
}

/// A loader's counters, shared with the loader: a separate object so that reading them from one
/// thread never aliases the loader another thread is driving.
pub struct StatsReader(StatsHandle);

impl StatsReader {
    fn snapshot(&self) -> Result<StatsInfo, BridgeError> {
        let s = guard(|| self.0.try_snapshot())?;
        Ok(StatsInfo {
            batches: s.batches,
            samples: s.samples,
            samples_skipped: s.samples_skipped,
            wait_ns_total: s.wait_ns_total,
            wait_ns_p50: s.wait_ns_p50,
            wait_ns_p95: s.wait_ns_p95,
            wait_ns_max: s.wait_ns_max,
            elapsed_ns: s.elapsed_ns,
            readiness: s.readiness,
            worker_busy: s.worker_busy,
            slabs_pinned: s.slabs_pinned,
            pin_failures: s.pin_failures,
            rank: s.rank,
            world_size: s.world_size,
            local_rank: s.local_rank,
            local_world_size: s.local_world_size,
            launcher: s.launcher,
            read_ns: s.read_ns,
            decode_ns: s.decode_ns,
            transform_ns: s.transform_ns,
            collate_ns: s.collate_ns,
            h2d_ns: s.h2d_ns,
            num_workers: s.num_workers,
            read_ns_p50: s.read_ns_p50,
            read_ns_p95: s.read_ns_p95,
            decode_ns_p50: s.decode_ns_p50,
            decode_ns_p95: s.decode_ns_p95,
            transform_ns_p50: s.transform_ns_p50,
            transform_ns_p95: s.transform_ns_p95,
            collate_ns_p50: s.collate_ns_p50,
            collate_ns_p95: s.collate_ns_p95,
            h2d_ns_p50: s.h2d_ns_p50,
            h2d_ns_p95: s.h2d_ns_p95,
            busy_ns: s.busy_ns,
            memory_budget: s.memory_budget,
            batch_bytes: s.batch_bytes,
            in_flight_cap: s.in_flight_cap,
            in_flight_cap_requested: s.in_flight_cap_requested,
            prefetch_factor: s.prefetch_factor,
            autotune_decisions: s.autotune_decisions,
            decoded_zune: s.decoded_zune,
            decoded_turbo: s.decoded_turbo,
            decoded_turbo_region: s.decoded_turbo_region,
            decoded_turbo_scaled: s.decoded_turbo_scaled,
            in_flight_depth: s.in_flight_depth,
            batch_memory_bytes: s.batch_memory_bytes,
            batch_memory_peak_bytes: s.batch_memory_peak_bytes,
            page_faults: s.page_faults,
            h2d_bytes: s.h2d_bytes,
            device_memory_bytes: s.device_memory_bytes,
            decoded_device: s.decoded_device,
            gpu_decode_share: s.gpu_decode_share,
            worker_busy_ns: s.worker_busy_ns,
        })
    }
}

/// A delivered batch, or (`None`) the end of an epoch. Dropping it returns its memory to the
/// arena (a device batch: its buffer to the ring); it may outlive the loader.
pub struct BatchHandle(Option<Batch>);

impl BatchHandle {
    fn is_end(&self) -> bool {
        self.0.is_none()
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, Batch::len)
    }

    fn epoch(&self) -> u64 {
        self.0.as_ref().map_or(0, Batch::epoch)
    }

    fn position(&self) -> usize {
        self.0.as_ref().map_or(0, Batch::position)
    }

    fn fields(&self) -> Vec<FieldInfo> {
        let Some(batch) = &self.0 else {
            return Vec::new();
        };
        let device_type = batch.device_type().dlpack_code();
        let device_id = i32::try_from(batch.device_id()).unwrap_or(i32::MAX);
        batch
            .fields()
            .map(|f| {
                // A device address fits the host's pointer width: CUDA's unified virtual
                // addressing shares it with host pointers.
                let data = usize::try_from(f.address).unwrap_or(usize::MAX);
                field_info(f.name, data, f.dtype, f.shape, device_type, device_id)
            })
            .collect()
    }

    fn cuda_stream(&self) -> usize {
        self.0
            .as_ref()
            .and_then(Batch::cuda_stream)
            .map_or(0, |s| s.0)
    }

    fn cuda_event(&self) -> usize {
        self.0
            .as_ref()
            .and_then(Batch::cuda_event)
            .map_or(0, |e| e.0)
    }

    fn wait(&self, stream: usize) -> Result<(), BridgeError> {
        match &self.0 {
            Some(b) => guard(|| b.wait(Stream(stream))),
            None => Ok(()),
        }
    }

    fn synchronize(&self) -> Result<(), BridgeError> {
        match &self.0 {
            Some(b) => guard(|| b.synchronize()),
            None => Ok(()),
        }
    }
}

fn field_info(
    name: &str,
    data: usize,
    dtype: DType,
    shape: &[usize],
    device_type: i32,
    device_id: i32,
) -> FieldInfo {
    FieldInfo {
        name: name.to_owned(),
        data,
        dtype: dtype.code(),
        device_type,
        device_id,
        strides: stoker_core::batch::contiguous_strides(shape),
        shape: shape.iter().map(|&d| d as i64).collect(),
    }
}

#[cfg(test)]
mod cuda_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_the_c_status() {
        let mut o = options_new();
        let e = o.set(b"no_such_key", b"1").unwrap_err();
        assert!(e.to_string().starts_with("-1|option `no_such_key`"), "{e}");
        let e = o.set(b"\xff", b"1").unwrap_err();
        assert!(e.to_string().starts_with("-1|"), "{e}");
    }
}
