//! The C-visible types of `stoker.h`: status codes, element types, the tensor view, the stats
//! struct, and the opaque handles.

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

use stoker_core::{Batch, DType, DeviceBatch, DeviceType, Loader, LoaderOptions, StatsHandle};

/// Most dimensions a `stoker_tensor` describes. DLPack exports have no such limit.
pub const STOKER_MAX_DIMS: usize = 8;

/// Result of every fallible call. Negative values are errors; `stoker_last_error` has the
/// message.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum stoker_status {
    STOKER_OK = 0,
    /// Not an error: the epoch is over, the next call starts the next one.
    STOKER_END_OF_EPOCH = 1,
    /// NULL pointer, unknown option key, malformed value.
    STOKER_ERR_INVALID_ARGUMENT = -1,
    /// Missing file, unreadable directory, short read.
    STOKER_ERR_IO = -2,
    /// Corrupt or unsupported sample (the message names the file or index).
    STOKER_ERR_DECODE = -3,
    /// E.g. device=cuda where no CUDA driver is present.
    STOKER_ERR_UNSUPPORTED = -4,
    STOKER_ERR_TIMEOUT = -5,
    /// A user callback reported failure.
    STOKER_ERR_CALLBACK = -6,
    STOKER_ERR_CLOSED = -7,
    /// A bug: a caught panic.
    STOKER_ERR_INTERNAL = -8,
    STOKER_ERR_OUT_OF_MEMORY = -9,
    STOKER_ERR_CUDA = -10,
}

/// Element type of a field.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum stoker_dtype {
    STOKER_DTYPE_U8 = 0,
    STOKER_DTYPE_I32 = 1,
    STOKER_DTYPE_I64 = 2,
    STOKER_DTYPE_F16 = 3,
    STOKER_DTYPE_BF16 = 4,
    STOKER_DTYPE_F32 = 5,
}

impl From<DType> for stoker_dtype {
    fn from(d: DType) -> stoker_dtype {
        match d {
            DType::U8 => stoker_dtype::STOKER_DTYPE_U8,
            DType::I32 => stoker_dtype::STOKER_DTYPE_I32,
            DType::I64 => stoker_dtype::STOKER_DTYPE_I64,
            DType::F16 => stoker_dtype::STOKER_DTYPE_F16,
            DType::BF16 => stoker_dtype::STOKER_DTYPE_BF16,
            DType::F32 => stoker_dtype::STOKER_DTYPE_F32,
        }
    }
}

/// One field of a batch, described like a DLPack tensor. `data` and `name` stay valid until the
/// batch is released. With `device_type` 2 (CUDA), `data` is a device address (`CUdeviceptr`)
/// on device `device_id`, readable on a stream once `stoker_batch_wait` ordered it after the copy.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct stoker_tensor {
    pub name: *const c_char,
    pub data: *mut c_void,
    pub dtype: stoker_dtype,
    /// DLPack codes: 1 CPU, 2 CUDA, 3 CUDA host (pinned).
    pub device_type: i32,
    pub device_id: i32,
    pub ndim: i32,
    pub shape: [i64; STOKER_MAX_DIMS],
    /// In elements.
    pub strides: [i64; STOKER_MAX_DIMS],
}

impl stoker_tensor {
    /// What a failed call leaves in `*out`: NULL pointers, no dimensions.
    pub(crate) const EMPTY: stoker_tensor = stoker_tensor {
        name: std::ptr::null(),
        data: std::ptr::null_mut(),
        dtype: stoker_dtype::STOKER_DTYPE_U8,
        device_type: 0,
        device_id: 0,
        ndim: 0,
        shape: [0; STOKER_MAX_DIMS],
        strides: [0; STOKER_MAX_DIMS],
    };
}

/// A loader's counters. Fields may be appended, never reordered or removed: the caller sets
/// `size` to `sizeof(stoker_stats)` and the library fills only the fields that fit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct stoker_stats {
    /// Set by the caller to `sizeof(stoker_stats)`.
    pub size: u64,
    /// Delivered to the consumer.
    pub batches: u64,
    /// Delivered, replacements included.
    pub samples: u64,
    /// Bad samples replaced under on_error=skip.
    pub samples_skipped: u64,
    /// Time the consumer spent blocked in next().
    pub wait_ns_total: u64,
    /// Per-batch wait percentiles.
    pub wait_ns_p50: u64,
    pub wait_ns_p95: u64,
    pub wait_ns_max: u64,
    /// Since the loader was created.
    pub elapsed_ns: u64,
    /// 1 - wait_ns_total / elapsed_ns, in [0, 1].
    pub readiness: f64,
    /// Fraction of worker thread time spent working.
    pub worker_busy: f64,
}

/// Loader options, set one string key at a time (opaque).
pub struct stoker_options {
    pub(crate) inner: LoaderOptions,
}

/// A loader (opaque). Driven by one thread at a time; `stoker_loader_stats` may be called from
/// any thread.
// The fields `stoker_loader_stats` reads sit outside the `UnsafeCell` that the driving thread
// borrows mutably, so reading stats never creates a reference to the `Loader`.
pub struct stoker_loader {
    pub(crate) stats: StatsHandle,
    pub(crate) batches_per_epoch: i64,
    pub(crate) loader: UnsafeCell<Loader>,
}

impl stoker_loader {
    /// The handle around a started loader (host or device).
    pub(crate) fn from_loader(loader: Loader) -> stoker_loader {
        stoker_loader {
            stats: loader.stats_handle(),
            batches_per_epoch: i64::try_from(loader.batches_per_epoch()).unwrap_or(-1),
            loader: UnsafeCell::new(loader),
        }
    }
}

/// A batch (opaque): a lease on arena memory (a host batch) or on a device buffer of the
/// prefetch ring (a CUDA batch), shared with its DLPack exports.
pub struct stoker_batch {
    pub(crate) shared: Arc<SharedBatch>,
}

/// What a batch handle holds: host memory from the arena, or device memory from the ring.
pub enum AnyBatch {
    Host(Batch),
    Device(DeviceBatch),
}

/// One field of either kind of batch, as the C views need it.
pub(crate) struct FieldView<'a> {
    pub(crate) name: &'a str,
    pub(crate) dtype: DType,
    pub(crate) shape: &'a [usize],
    /// Host address, or device address for a device batch.
    pub(crate) data: *mut c_void,
}

impl AnyBatch {
    pub(crate) fn num_fields(&self) -> usize {
        match self {
            AnyBatch::Host(b) => b.num_fields(),
            AnyBatch::Device(b) => b.num_fields(),
        }
    }

    pub(crate) fn field(&self, i: usize) -> Option<FieldView<'_>> {
        match self {
            AnyBatch::Host(b) => {
                let f = b.field(i)?;
                Some(FieldView {
                    name: f.name,
                    dtype: f.dtype,
                    shape: f.shape,
                    data: b.field_ptr(i)?.cast::<c_void>(),
                })
            }
            AnyBatch::Device(b) => {
                let f = b.field(i)?;
                Some(FieldView {
                    name: f.name,
                    dtype: f.dtype,
                    shape: f.shape,
                    // A device address as C holds it (`CUdeviceptr` in a `void *`).
                    data: f.ptr as usize as *mut c_void,
                })
            }
        }
    }

    pub(crate) fn field_index(&self, name: &str) -> Option<usize> {
        match self {
            AnyBatch::Host(b) => b.field_index(name),
            AnyBatch::Device(b) => b.field_index(name),
        }
    }

    pub(crate) fn field_names(&self) -> Vec<&str> {
        (0..self.num_fields())
            .filter_map(|i| self.field(i).map(|f| f.name))
            .collect()
    }

    /// Where the memory lives: CPU or CUDA host (registered) for a host batch, CUDA for a device
    /// batch.
    pub(crate) fn device_type(&self) -> DeviceType {
        match self {
            AnyBatch::Host(b) => b.device_type(),
            AnyBatch::Device(b) => b.device_type(),
        }
    }

    /// The DLPack `device_id`: the CUDA ordinal of a device batch, 0 for host memory.
    pub(crate) fn device_id(&self) -> i32 {
        match self {
            AnyBatch::Host(_) => 0,
            AnyBatch::Device(b) => i32::try_from(b.device_id()).unwrap_or(i32::MAX),
        }
    }

    pub(crate) fn device_batch(&self) -> Option<&DeviceBatch> {
        match self {
            AnyBatch::Host(_) => None,
            AnyBatch::Device(b) => Some(b),
        }
    }
}

/// What a batch handle and its DLPack exports hold: the memory returns to the arena (or the
/// device buffer to the ring) when the last of them lets go.
pub struct SharedBatch {
    pub(crate) batch: AnyBatch,
    /// NUL-terminated field names for `stoker_tensor::name`.
    pub(crate) names: Vec<CString>,
}

impl SharedBatch {
    pub(crate) fn new(batch: AnyBatch) -> SharedBatch {
        let names = batch
            .field_names()
            .into_iter()
            .map(|name| {
                // Field names come from sources; one with a NUL byte loses it rather than failing.
                CString::new(name.replace('\0', "")).unwrap_or_default()
            })
            .collect();
        SharedBatch { batch, names }
    }
}

// What the C contract relies on: a loader may be freed, and a batch released, on a thread other
// than the one that made it; a batch's shared part is dropped by whichever thread lets go last.
const _: () = {
    const fn send<T: Send>() {}
    const fn send_sync<T: Send + Sync>() {}
    send::<Loader>();
    send::<LoaderOptions>();
    send_sync::<DeviceBatch>();
    send_sync::<SharedBatch>();
    send_sync::<StatsHandle>();
};
