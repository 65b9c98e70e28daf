//! The C-visible types of `stoker.h`: status codes, element types, the tensor view, the stats
//! struct, and the opaque handles.

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use stoker_core::{Batch, Closer, DType, ErrorKind, Loader, LoaderOptions, StatsHandle};

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
    STOKER_DTYPE_U16 = 6,
}

// The numbers of the C enums are the core's (`ErrorKind::code`, `DType::code`): cbindgen needs
// literals, so they are written out above and checked here at compile time.
const _: () = {
    use stoker_status::*;
    let pairs = [
        (STOKER_ERR_INVALID_ARGUMENT, ErrorKind::InvalidArgument),
        (STOKER_ERR_IO, ErrorKind::Io),
        (STOKER_ERR_DECODE, ErrorKind::Decode),
        (STOKER_ERR_UNSUPPORTED, ErrorKind::Unsupported),
        (STOKER_ERR_TIMEOUT, ErrorKind::Timeout),
        (STOKER_ERR_CALLBACK, ErrorKind::Callback),
        (STOKER_ERR_CLOSED, ErrorKind::Closed),
        (STOKER_ERR_INTERNAL, ErrorKind::Internal),
        (STOKER_ERR_OUT_OF_MEMORY, ErrorKind::OutOfMemory),
        (STOKER_ERR_CUDA, ErrorKind::Cuda),
    ];
    let mut i = 0;
    while i < pairs.len() {
        assert!(pairs[i].0 as i32 == pairs[i].1.code());
        i += 1;
    }
    assert!(STOKER_OK as i32 == stoker_core::error::STATUS_OK);
    assert!(STOKER_END_OF_EPOCH as i32 == stoker_core::error::STATUS_END_OF_EPOCH);
    use stoker_dtype::*;
    let dtypes = [
        (STOKER_DTYPE_U8, DType::U8),
        (STOKER_DTYPE_I32, DType::I32),
        (STOKER_DTYPE_I64, DType::I64),
        (STOKER_DTYPE_F16, DType::F16),
        (STOKER_DTYPE_BF16, DType::BF16),
        (STOKER_DTYPE_F32, DType::F32),
        (STOKER_DTYPE_U16, DType::U16),
    ];
    let mut i = 0;
    while i < dtypes.len() {
        assert!(dtypes[i].0 as u32 == dtypes[i].1.code());
        i += 1;
    }
};

impl stoker_status {
    /// The status of a core error kind.
    pub(crate) fn of(kind: ErrorKind) -> stoker_status {
        use stoker_status::*;
        match kind {
            ErrorKind::InvalidArgument => STOKER_ERR_INVALID_ARGUMENT,
            ErrorKind::Io => STOKER_ERR_IO,
            ErrorKind::Decode => STOKER_ERR_DECODE,
            ErrorKind::Unsupported => STOKER_ERR_UNSUPPORTED,
            ErrorKind::Timeout => STOKER_ERR_TIMEOUT,
            ErrorKind::Callback => STOKER_ERR_CALLBACK,
            ErrorKind::Closed => STOKER_ERR_CLOSED,
            ErrorKind::Internal => STOKER_ERR_INTERNAL,
            ErrorKind::OutOfMemory => STOKER_ERR_OUT_OF_MEMORY,
            ErrorKind::Cuda => STOKER_ERR_CUDA,
        }
    }
}

impl From<DType> for stoker_dtype {
    fn from(d: DType) -> stoker_dtype {
        use stoker_dtype::*;
        match d {
            DType::U8 => STOKER_DTYPE_U8,
            DType::I32 => STOKER_DTYPE_I32,
            DType::I64 => STOKER_DTYPE_I64,
            DType::F16 => STOKER_DTYPE_F16,
            DType::BF16 => STOKER_DTYPE_BF16,
            DType::F32 => STOKER_DTYPE_F32,
            DType::U16 => STOKER_DTYPE_U16,
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
    /// DLPack codes: 1 CPU (pinned or not), 2 CUDA.
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
    /// Bad samples replaced under on_error=skip; a replacement that is bad too counts again.
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
    /// Arena slabs page-locked (`pin_memory`).
    pub slabs_pinned: u64,
    /// Slabs `mlock` refused (RLIMIT_MEMLOCK): they are delivered unpinned.
    pub pin_failures: u64,
    /// This process's rank and the job's world size, as resolved (explicit options, or the
    /// launcher's variables for `auto`).
    pub rank: u64,
    pub world_size: u64,
    /// Rank among this job's processes on this node, and their number (`device=cuda` is
    /// `cuda:local_rank`; `num_workers=auto` divides the cores by `local_world_size`).
    pub local_rank: u64,
    pub local_world_size: u64,
    /// Which launcher said so: a `stoker_launcher` value.
    pub launcher: u64,
    /// Time spent reading samples from the source, summed over every worker.
    pub read_ns: u64,
    /// Time spent decoding images, summed over every worker.
    pub decode_ns: u64,
    /// Time spent in the image transform pipeline, summed over every worker.
    pub transform_ns: u64,
    /// Time spent copying, padding and laying out fields in batch memory, summed over workers.
    pub collate_ns: u64,
    /// Host-to-device copies (device=cuda), from queueing to completion, summed over batches.
    pub h2d_ns: u64,
    /// Worker threads building batches now (1 when the calling thread builds them).
    pub num_workers: u64,
    /// Per-sample percentiles of each stage (decode and transform: image samples only).
    pub read_ns_p50: u64,
    pub read_ns_p95: u64,
    pub decode_ns_p50: u64,
    pub decode_ns_p95: u64,
    pub transform_ns_p50: u64,
    pub transform_ns_p95: u64,
    pub collate_ns_p50: u64,
    pub collate_ns_p95: u64,
    /// Per-batch percentiles of the host-to-device copy.
    pub h2d_ns_p50: u64,
    pub h2d_ns_p95: u64,
    /// Time spent building batches, summed over every worker (per worker:
    /// stoker_loader_worker_busy_ns).
    pub busy_ns: u64,
    /// The memory budget in bytes (option memory_budget, or its default).
    pub memory_budget: u64,
    /// One batch's memory, page-rounded (ragged fields counted empty).
    pub batch_bytes: u64,
    /// Batches in flight at most now; lower than in_flight_cap_requested when the memory budget
    /// (or autotune) lowered it.
    pub in_flight_cap: u64,
    /// max(1, num_workers) x prefetch_factor.
    pub in_flight_cap_requested: u64,
    /// Batches in flight per worker now (the option, or autotune's choice).
    pub prefetch_factor: u64,
    /// Changes autotune made to the worker count or the prefetch depth.
    pub autotune_decisions: u64,
    /// Images decoded whole by zune-jpeg or zune-png (option jpeg_decoder).
    pub decoded_zune: u64,
    /// Images decoded whole by libjpeg-turbo.
    pub decoded_turbo: u64,
    /// Images of which libjpeg-turbo decoded only the region the crop reads.
    pub decoded_turbo_region: u64,
    /// Of those, the regions shrunk in the DCT domain (1/2, 1/4, 1/8).
    pub decoded_turbo_scaled: u64,
    /// Batches the loader lets be in flight now, at most `in_flight_cap`: `num_workers + 1` at
    /// first, deeper only when the consumer's waits show it would have been fed.
    pub in_flight_depth: u64,
    /// Batch memory mapped now (in flight, held by the caller, or idle for reuse), in bytes.
    pub batch_memory_bytes: u64,
    /// The most batch memory mapped at once so far, in bytes.
    pub batch_memory_peak_bytes: u64,
    /// Minor page faults taken by batch memory since the loader was created (mapping and
    /// pre-faulting its slabs; a reused slab takes none).
    pub page_faults: u64,
    /// Bytes copied host to device (device=cuda), summed over batches; with gpu_normalize image
    /// fields cross as uint8.
    pub h2d_bytes: u64,
    /// Device memory the loader holds now (device=cuda): the prefetch ring and GPU decoding's
    /// scratch, in bytes.
    pub device_memory_bytes: u64,
    /// Images the workers left to the device's JPEG decoder (jpeg_decoder=gpu/auto).
    pub decoded_device: u64,
    /// The share of samples (by a hash of the index) the device decodes now
    /// (gpu_decode_share), 0 when none.
    pub gpu_decode_share: f64,
}

/// This process's place in a distributed job, as `stoker_options_launch` resolves it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct stoker_launch {
    pub rank: u64,
    pub world_size: u64,
    pub local_rank: u64,
    pub local_world_size: u64,
    /// A `stoker_launcher` value.
    pub launcher: u64,
}

/// Who resolved a loader's rank and world size (`stoker_stats::launcher`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum stoker_launcher {
    /// No launcher variables, nothing explicit: one process.
    STOKER_LAUNCHER_NONE = 0,
    /// `rank` and `world_size` both set explicitly.
    STOKER_LAUNCHER_EXPLICIT = 1,
    /// torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE.
    STOKER_LAUNCHER_TORCHRUN = 2,
    /// Slurm's srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS / SLURM_NTASKS, SLURM_LOCALID, tasks per
    /// node.
    STOKER_LAUNCHER_SLURM = 3,
    /// Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
    STOKER_LAUNCHER_OPENMPI = 4,
    /// A PMI launcher (MPICH / Intel MPI hydra, srun --mpi=pmi2): PMI_RANK, PMI_SIZE.
    STOKER_LAUNCHER_PMI = 5,
}

/// Loader options, set one string key at a time (opaque).
pub struct stoker_options {
    pub(crate) inner: LoaderOptions,
}

/// A loader (opaque). Driven by one call at a time: a call made while another is under way (on
/// another thread, or from a source callback into its own loader) fails with
/// `STOKER_ERR_INVALID_ARGUMENT`; `stoker_loader_stats` and `stoker_loader_close` may be called
/// from any thread at any time.
// The fields `stoker_loader_stats` and `stoker_loader_close` use sit outside the `UnsafeCell`
// that the driving thread borrows mutably, so they never create a reference to the `Loader`.
pub struct stoker_loader {
    pub(crate) stats: StatsHandle,
    pub(crate) closer: Closer,
    pub(crate) batches_per_epoch: i64,
    /// Set while a call holds the `Loader` ([`stoker_loader::drive`]).
    driven: AtomicBool,
    /// The process that made the loader: in a child forked from it, a call the parent had
    /// under way at the fork holds nothing (its thread was not copied).
    made_by: u32,
    loader: UnsafeCell<Loader>,
}

impl stoker_loader {
    /// The handle around a started loader (host or device).
    pub(crate) fn from_loader(loader: Loader) -> stoker_loader {
        stoker_loader {
            stats: loader.stats_handle(),
            closer: loader.closer(),
            batches_per_epoch: loader.batches_per_epoch_i64(),
            driven: AtomicBool::new(false),
            made_by: std::process::id(),
            loader: UnsafeCell::new(loader),
        }
    }

    /// The `Loader`, for the length of one call, or `None` when another call holds it: the C
    /// contract's "one thread at a time" checked, since a second thread (or a source callback
    /// calling into its own loader) would otherwise race on it, or recurse without end.
    pub(crate) fn drive(&self) -> Option<Driven<'_>> {
        let taken = self
            .driven
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        // In a forked child the holder is a parent's thread, which does not exist here: the
        // call goes on, to the loader's own answer there (`STOKER_ERR_UNSUPPORTED`).
        (taken || std::process::id() != self.made_by).then_some(Driven(self))
    }
}

/// A call's hold on a loader ([`stoker_loader::drive`]); released when dropped.
pub(crate) struct Driven<'a>(&'a stoker_loader);

impl Driven<'_> {
    pub(crate) fn loader(&mut self) -> &mut Loader {
        // SAFETY: `driven` was swapped from false to true for this value and is cleared only
        // when it drops, so no other reference to the `Loader` exists while it lives; the
        // fields other threads read (`stats`, `closer`) are outside the cell.
        unsafe { &mut *self.0.loader.get() }
    }
}

impl Drop for Driven<'_> {
    fn drop(&mut self) {
        self.0.driven.store(false, Ordering::Release);
    }
}

/// A batch (opaque): a lease on arena memory (a host batch) or on a device buffer of the
/// prefetch ring (a CUDA batch), shared with its DLPack exports.
pub struct stoker_batch {
    pub(crate) shared: Arc<SharedBatch>,
}

/// What a batch handle and its DLPack exports hold: the memory returns to the arena (or the
/// device buffer to the ring) when the last of them lets go.
pub struct SharedBatch {
    pub(crate) batch: Batch,
    /// NUL-terminated field names for `stoker_tensor::name`.
    pub(crate) names: Vec<CString>,
}

impl SharedBatch {
    pub(crate) fn new(batch: Batch) -> SharedBatch {
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
    send_sync::<Batch>();
    send_sync::<SharedBatch>();
    send_sync::<StatsHandle>();
};
