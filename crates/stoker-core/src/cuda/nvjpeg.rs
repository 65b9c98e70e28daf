//! JPEG decoding on the device with nvJPEG, loaded with `dlopen` at run time.
//!
//! Like the CUDA driver ([`super::driver`]), nvJPEG is never linked: stoker builds and runs
//! without a CUDA toolkit, and [`NvJpeg::load`] says in words why nvJPEG cannot be used (no
//! library, a library without a symbol stoker calls, no device) instead of panicking. Every
//! symbol is looked up before the first call into the library.
//!
//! # Finding the library (Linux)
//!
//! 1. `STOKER_NVJPEG_LIBRARY`, when set and not empty: the path of the library file. Nothing else
//!    is tried when it is set, so a wrong path is reported rather than silently replaced.
//! 2. `libnvjpeg.so.13` (CUDA 13), `libnvjpeg.so.12` (CUDA 12), then `libnvjpeg.so`, by name:
//!    the dynamic linker's search (`LD_LIBRARY_PATH`, the `ld.so` cache, the standard
//!    directories), which finds a CUDA toolkit installed system-wide.
//!
//! pip's CUDA wheels put the library where the dynamic linker does not look: the wheel
//! `nvidia-nvjpeg-cu12` (CUDA 12) installs `site-packages/nvidia/nvjpeg/lib/libnvjpeg.so.12`, and
//! `nvidia-nvjpeg` (CUDA 13) installs `site-packages/nvidia/cu13/lib/libnvjpeg.so.13`. pip's torch
//! does not necessarily install either. With such a wheel, set `STOKER_NVJPEG_LIBRARY` to the file,
//! or add its directory to `LD_LIBRARY_PATH`. The library carries its own (static) CUDA runtime
//! and needs only the driver (`libcuda.so.1`) besides.
//!
//! The library is never unloaded, even after the decoder is dropped: unloading a library that
//! carries its own CUDA runtime would run that runtime's teardown while the process still uses
//! CUDA. Loading it again only takes another reference to the same mapping.
//!
//! # Backends
//!
//! [`NvJpeg::load`] first asks for the hardware backend (`NVJPEG_BACKEND_HARDWARE`: the JPEG
//! engines of A100, H100 and their kin). Only the batched API decodes with it, and only baseline
//! JPEGs of a single scan in the subsamplings the engines implement, so each image is first
//! checked with `nvjpegDecodeBatchedSupported`; the eligible ones are decoded as one batch, the
//! others one by one with the default backend. When the hardware backend cannot be created (a
//! GPU without JPEG engines), only the default backend is used: CPU Huffman decoding, then the
//! GPU. The two backends have separate handles and states, as nvJPEG requires a state per handle.
//! A batch that the hardware refuses as a whole is decoded again image by image with the default
//! backend, which reports each image's own failure.
//!
//! # Context and memory
//!
//! nvJPEG's handles belong to the CUDA context current on the thread that created them, and may
//! only be used with that context current. The caller makes the device's (primary) context
//! current on the calling thread (`cuCtxSetCurrent`) before [`NvJpeg::load`], before every
//! [`NvJpeg::decode`], and before dropping the decoder (otherwise its device memory is freed in
//! the wrong context, which fails and leaks it). The decoder is dropped only once the work it
//! queued has completed (an event recorded after the last decode), since dropping frees the
//! buffers that work uses.
//!
//! nvJPEG's working memory goes through allocators of stoker's that count it: every handle is
//! created with `nvjpegCreateExV2` and a device and a pinned host allocator
//! (`nvjpegDevAllocatorV2_t`, `nvjpegPinnedAllocatorV2_t`), whose context pointer leads to the
//! decoder's byte counters. Device buffers come from `cuMemAlloc` and pinned host buffers from
//! `cuMemHostAlloc` (portable, not write-combined), in the context current on the calling
//! thread, which is the decoder's (above); they are released with `cuMemFree` and
//! `cuMemFreeHost`. [`NvJpeg::device_bytes`] and [`NvJpeg::pinned_bytes`] say how much nvJPEG
//! holds now. That memory still grows to the largest images decoded so far (nvJPEG reallocates a
//! buffer only when it is too small) and is kept until the decoder is dropped. The allocators
//! call the driver through cudarc, which panics on a missing symbol: [`NvJpeg::load`] is for a
//! caller that has checked the driver and those symbols (`CudaDevice`, which exists only once
//! `driver::probe` passed), which is why it is `unsafe`.
//!
//! nvJPEG hands each allocator call a stream (its documentation says the V2 allocators "support
//! stream ordered allocations"); stoker's allocators ignore it. `cuMemAlloc` and
//! `cuMemHostAlloc` are synchronous, and what they return may be used on any stream at once.
//! `nvjpeg.h` does not say when the free callbacks are called, only that the library
//! "reallocates memory only if needed": a buffer too small for an image is freed and replaced
//! during a decode, possibly while the previous decode's work on the stream still uses it, and
//! everything is freed when a state or handle is destroyed. `cuMemFree` and `cuMemFreeHost` are
//! the synchronous frees under nvJPEG's default allocators (`cudaFree`, `cudaFreeHost`): they do
//! not release memory that work already queued on the device may still use, which is stronger
//! than ordering the free on the stream it was given. The V2 free callbacks receive the size of
//! the buffer, which is what is subtracted from the counter (so the counters return to 0 once
//! the decoder is dropped, which the real-library test checks); a free that fails is not
//! subtracted, the memory not having been released.
//!
//! The counters and the two allocator tables share one allocation (an `Arc`) that the decoder
//! owns, at an address that does not move, since `nvjpeg.h` does not say whether the library
//! copies the tables or keeps the pointer. Dropping the decoder destroys the handles first
//! (nvJPEG then frees everything through the callbacks), and only then its fields, the counters
//! among them, so the counters outlive every call nvJPEG makes into them.
//!
//! # The declarations
//!
//! The few types and functions below are written by hand from `nvjpeg.h` (nvJPEG 12.4, of CUDA
//! 12, and nvJPEG 13.3, of CUDA 13: identical for everything used here): enums are passed as C
//! `int` (4 bytes on every platform CUDA supports), handles as pointers to opaque structs,
//! `nvjpegImage_t` as four channel pointers followed by four `size_t` pitches, and
//! `nvjpegDevAllocatorV2_t`/`nvjpegPinnedAllocatorV2_t` as an allocation callback, a free
//! callback and a `void *` context, in that order (24 bytes, the context at offset 16, on 64-bit
//! Linux). The callbacks are `int (*)(void *ctx, void **ptr, size_t size, cudaStream_t stream)`
//! and `int (*)(void *ctx, void *ptr, size_t size, cudaStream_t stream)`, returning 0 on success
//! and anything else on failure (modelled after `cudaMalloc`, whose `cudaSuccess` is 0). The
//! sizes and offsets of the structs were checked with a C program compiled against both headers,
//! which also assigned C functions of the callbacks' prototypes to the header's callback types,
//! and `nvjpegCreateExV2` to a pointer of the prototype below, with warnings as errors.

use std::ffi::{c_int, c_uint, c_void, OsStr};
use std::mem::ManuallyDrop;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use libloading::Library;

use super::device::JpegJob;

/// `nvjpegStatus_t`.
type Status = c_int;
/// `nvjpegBackend_t`.
type Backend = c_int;
/// `nvjpegOutputFormat_t`.
type OutputFormat = c_int;
/// `nvjpegChromaSubsampling_t` (signed: `NVJPEG_CSS_UNKNOWN` is -1).
type ChromaSubsampling = c_int;
/// `libraryPropertyType` (`library_types.h`).
type LibraryProperty = c_int;

const NVJPEG_STATUS_SUCCESS: Status = 0;
const NVJPEG_STATUS_NOT_INITIALIZED: Status = 1;
const NVJPEG_STATUS_INVALID_PARAMETER: Status = 2;
const NVJPEG_STATUS_BAD_JPEG: Status = 3;
const NVJPEG_STATUS_JPEG_NOT_SUPPORTED: Status = 4;
const NVJPEG_STATUS_ALLOCATOR_FAILURE: Status = 5;
const NVJPEG_STATUS_EXECUTION_FAILED: Status = 6;
const NVJPEG_STATUS_ARCH_MISMATCH: Status = 7;
const NVJPEG_STATUS_INTERNAL_ERROR: Status = 8;
const NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: Status = 9;
const NVJPEG_STATUS_INCOMPLETE_BITSTREAM: Status = 10;

const NVJPEG_BACKEND_DEFAULT: Backend = 0;
const NVJPEG_BACKEND_HARDWARE: Backend = 3;

/// Interleaved RGB, written to the first channel of `nvjpegImage_t`.
const NVJPEG_OUTPUT_RGBI: OutputFormat = 5;

/// `NVJPEG_FLAGS_DEFAULT`.
const NVJPEG_FLAGS_DEFAULT: c_uint = 0;

/// `NVJPEG_MAX_COMPONENT`: the length of `nvjpegImage_t`'s arrays and of `nvjpegGetImageInfo`'s
/// width and height arrays.
const NVJPEG_MAX_COMPONENT: usize = 4;

const MAJOR_VERSION: LibraryProperty = 0;
const MINOR_VERSION: LibraryProperty = 1;
const PATCH_LEVEL: LibraryProperty = 2;

/// `struct nvjpegHandle` (opaque).
#[repr(C)]
struct NvjpegHandle {
    _opaque: [u8; 0],
}

/// `struct nvjpegJpegState` (opaque).
#[repr(C)]
struct NvjpegJpegState {
    _opaque: [u8; 0],
}

/// `struct nvjpegJpegStream` (opaque).
#[repr(C)]
struct NvjpegJpegStream {
    _opaque: [u8; 0],
}

type HandleT = *mut NvjpegHandle;
type StateT = *mut NvjpegJpegState;
type JpegStreamT = *mut NvjpegJpegStream;
/// `cudaStream_t`: the same object as a driver `CUstream`.
type CudaStreamT = *mut c_void;

/// `nvjpegImage_t`: the output planes. For `NVJPEG_OUTPUT_RGBI` only `channel[0]` and
/// `pitch[0]` are used.
#[repr(C)]
#[derive(Clone, Copy)]
struct NvjpegImage {
    channel: [*mut u8; NVJPEG_MAX_COMPONENT],
    pitch: [usize; NVJPEG_MAX_COMPONENT],
}

/// `tDevMallocV2` and `tPinnedMallocV2`:
/// `int (*)(void *ctx, void **ptr, size_t size, cudaStream_t stream)`.
type MallocV2 = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, usize, CudaStreamT) -> c_int;
/// `tDevFreeV2` and `tPinnedFreeV2`:
/// `int (*)(void *ctx, void *ptr, size_t size, cudaStream_t stream)`.
type FreeV2 = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, CudaStreamT) -> c_int;

/// `nvjpegDevAllocatorV2_t`: `{ tDevMallocV2 dev_malloc; tDevFreeV2 dev_free; void *dev_ctx; }`.
/// The callbacks are never NULL here (a NULL table, not a NULL field, selects the library's own).
#[repr(C)]
struct DevAllocatorV2 {
    dev_malloc: MallocV2,
    dev_free: FreeV2,
    dev_ctx: *mut c_void,
}

/// `nvjpegPinnedAllocatorV2_t`:
/// `{ tPinnedMallocV2 pinned_malloc; tPinnedFreeV2 pinned_free; void *pinned_ctx; }`.
#[repr(C)]
struct PinnedAllocatorV2 {
    pinned_malloc: MallocV2,
    pinned_free: FreeV2,
    pinned_ctx: *mut c_void,
}

/// Declares the entry points stoker calls, each with its prototype from `nvjpeg.h` (every one
/// returns `nvjpegStatus_t`), and resolves them all from a loaded library.
macro_rules! api {
    ($($name:ident: fn($($arg:ty),* $(,)?);)*) => {
        /// The nvJPEG entry points, resolved before the first call.
        #[allow(non_snake_case)]
        struct Api {
            $($name: unsafe extern "C" fn($($arg),*) -> Status,)*
        }

        /// Every symbol stoker calls.
        #[cfg(test)]
        const SYMBOLS: &[&str] = &[$(stringify!($name)),*];

        impl Api {
            /// Looks every symbol up; the error names the first one missing.
            fn resolve(lib: &Library, origin: &str) -> Result<Api, String> {
                Ok(Api {
                    $($name: {
                        // SAFETY: a lookup only. The pointer type is the function's prototype in
                        // nvjpeg.h, so later calls through it match the callee's ABI.
                        let symbol = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> Status>(stringify!($name))
                        }
                        .map_err(|e| missing_symbol(origin, stringify!($name), &e))?;
                        *symbol
                    },)*
                })
            }
        }
    };
}

api! {
    // nvjpegStatus_t nvjpegGetProperty(libraryPropertyType type, int *value);
    nvjpegGetProperty: fn(LibraryProperty, *mut c_int);
    // nvjpegStatus_t nvjpegCreateExV2(nvjpegBackend_t backend,
    //     nvjpegDevAllocatorV2_t *dev_allocator, nvjpegPinnedAllocatorV2_t *pinned_allocator,
    //     unsigned int flags, nvjpegHandle_t *handle);
    // Both allocators are stoker's counting ones (see the module docs), never NULL.
    nvjpegCreateExV2: fn(
        Backend,
        *mut DevAllocatorV2,
        *mut PinnedAllocatorV2,
        c_uint,
        *mut HandleT,
    );
    // nvjpegStatus_t nvjpegDestroy(nvjpegHandle_t handle);
    nvjpegDestroy: fn(HandleT);
    // nvjpegStatus_t nvjpegJpegStateCreate(nvjpegHandle_t handle, nvjpegJpegState_t *jpeg_handle);
    nvjpegJpegStateCreate: fn(HandleT, *mut StateT);
    // nvjpegStatus_t nvjpegJpegStateDestroy(nvjpegJpegState_t jpeg_handle);
    nvjpegJpegStateDestroy: fn(StateT);
    // nvjpegStatus_t nvjpegGetImageInfo(nvjpegHandle_t handle, const unsigned char *data,
    //     size_t length, int *nComponents, nvjpegChromaSubsampling_t *subsampling, int *widths,
    //     int *heights);   widths and heights: NVJPEG_MAX_COMPONENT ints each.
    nvjpegGetImageInfo: fn(
        HandleT,
        *const u8,
        usize,
        *mut c_int,
        *mut ChromaSubsampling,
        *mut c_int,
        *mut c_int,
    );
    // nvjpegStatus_t nvjpegDecode(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle,
    //     const unsigned char *data, size_t length, nvjpegOutputFormat_t output_format,
    //     nvjpegImage_t *destination, cudaStream_t stream);
    nvjpegDecode: fn(
        HandleT,
        StateT,
        *const u8,
        usize,
        OutputFormat,
        *mut NvjpegImage,
        CudaStreamT,
    );
    // nvjpegStatus_t nvjpegDecodeBatchedInitialize(nvjpegHandle_t handle,
    //     nvjpegJpegState_t jpeg_handle, int batch_size, int max_cpu_threads,
    //     nvjpegOutputFormat_t output_format);
    nvjpegDecodeBatchedInitialize: fn(HandleT, StateT, c_int, c_int, OutputFormat);
    // nvjpegStatus_t nvjpegDecodeBatched(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle,
    //     const unsigned char *const *data, const size_t *lengths, nvjpegImage_t *destinations,
    //     cudaStream_t stream);
    nvjpegDecodeBatched: fn(
        HandleT,
        StateT,
        *const *const u8,
        *const usize,
        *mut NvjpegImage,
        CudaStreamT,
    );
    // nvjpegStatus_t nvjpegJpegStreamCreate(nvjpegHandle_t handle,
    //     nvjpegJpegStream_t *jpeg_stream);
    nvjpegJpegStreamCreate: fn(HandleT, *mut JpegStreamT);
    // nvjpegStatus_t nvjpegJpegStreamDestroy(nvjpegJpegStream_t jpeg_stream);
    nvjpegJpegStreamDestroy: fn(JpegStreamT);
    // nvjpegStatus_t nvjpegJpegStreamParseHeader(nvjpegHandle_t handle,
    //     const unsigned char *data, size_t length, nvjpegJpegStream_t jpeg_stream);
    nvjpegJpegStreamParseHeader: fn(HandleT, *const u8, usize, JpegStreamT);
    // nvjpegStatus_t nvjpegDecodeBatchedSupported(nvjpegHandle_t handle,
    //     nvjpegJpegStream_t jpeg_stream, int *is_supported);   0 means supported.
    nvjpegDecodeBatchedSupported: fn(HandleT, JpegStreamT, *mut c_int);
}

/// The names the library is looked up by when `STOKER_NVJPEG_LIBRARY` is not set, newest first.
const SONAMES: &[&str] = &["libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"];

/// The variable that names the library file.
const LIBRARY_VAR: &str = "STOKER_NVJPEG_LIBRARY";

/// How to make a wheel's library visible, for the messages.
const WHEEL_HINT: &str = "pip's nvidia-nvjpeg-cu12 wheel has it in \
     site-packages/nvidia/nvjpeg/lib/libnvjpeg.so.12 and nvidia-nvjpeg (CUDA 13) in \
     site-packages/nvidia/cu13/lib/libnvjpeg.so.13: set STOKER_NVJPEG_LIBRARY to that file or \
     add its directory to LD_LIBRARY_PATH";

fn missing_symbol(origin: &str, name: &str, error: &libloading::Error) -> String {
    format!(
        "the nvJPEG library {origin} lacks {name} ({}): it is not nvJPEG, or one too old \
         (stoker uses nvJPEG of CUDA 12 or 13)",
        dl_error(error)
    )
}

/// A loader error with the system's reason (libloading's own text is only "dlopen failed").
fn dl_error(error: &libloading::Error) -> String {
    match std::error::Error::source(error) {
        Some(reason) => reason.to_string(),
        None => error.to_string(),
    }
}

/// `NVJPEG_STATUS_NAME: what it means` for a status.
fn describe(status: Status) -> String {
    let (name, meaning) = match status {
        NVJPEG_STATUS_SUCCESS => ("NVJPEG_STATUS_SUCCESS", "success"),
        NVJPEG_STATUS_NOT_INITIALIZED => (
            "NVJPEG_STATUS_NOT_INITIALIZED",
            "the library handle was not initialized",
        ),
        NVJPEG_STATUS_INVALID_PARAMETER => {
            ("NVJPEG_STATUS_INVALID_PARAMETER", "a parameter was refused")
        }
        NVJPEG_STATUS_BAD_JPEG => (
            "NVJPEG_STATUS_BAD_JPEG",
            "the data cannot be parsed as a JPEG",
        ),
        NVJPEG_STATUS_JPEG_NOT_SUPPORTED => (
            "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
            "the JPEG uses a feature nvJPEG does not decode",
        ),
        NVJPEG_STATUS_ALLOCATOR_FAILURE => (
            "NVJPEG_STATUS_ALLOCATOR_FAILURE",
            "allocating device or pinned host memory failed",
        ),
        NVJPEG_STATUS_EXECUTION_FAILED => (
            "NVJPEG_STATUS_EXECUTION_FAILED",
            "work on the device failed (or no CUDA device could be used)",
        ),
        NVJPEG_STATUS_ARCH_MISMATCH => (
            "NVJPEG_STATUS_ARCH_MISMATCH",
            "the device does not support this (for the hardware backend: it has no JPEG engine)",
        ),
        NVJPEG_STATUS_INTERNAL_ERROR => (
            "NVJPEG_STATUS_INTERNAL_ERROR",
            "an internal error, such as a failed CUDA call (is a CUDA driver and device present?)",
        ),
        NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED => (
            "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
            "not implemented for this backend and these parameters",
        ),
        NVJPEG_STATUS_INCOMPLETE_BITSTREAM => (
            "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
            "the JPEG is truncated",
        ),
        other => return format!("nvJPEG status {other}"),
    };
    format!("{name}: {meaning}")
}

/// Whether a status from decoding an image says the decoder itself (the library, the device or
/// its context) failed, rather than that image. Everything else, including statuses this code
/// does not know and allocation failures (nvJPEG's buffers grow with the image), is the image's.
fn is_decoder_failure(status: Status) -> bool {
    matches!(
        status,
        NVJPEG_STATUS_NOT_INITIALIZED
            | NVJPEG_STATUS_EXECUTION_FAILED
            | NVJPEG_STATUS_ARCH_MISMATCH
            | NVJPEG_STATUS_INTERNAL_ERROR
    )
}

/// Opens the library: `explicit` (the value of `STOKER_NVJPEG_LIBRARY`) if given, else the
/// sonames. Returns it with words saying where it came from.
fn open_library(explicit: Option<&OsStr>) -> Result<(Library, String), String> {
    if let Some(path) = explicit {
        let shown = Path::new(path).display().to_string();
        // SAFETY: loading runs the library's initialisers. The file is the one the user named in
        // STOKER_NVJPEG_LIBRARY, which is trusted like LD_LIBRARY_PATH.
        return match unsafe { Library::new(path) } {
            Ok(lib) => Ok((lib, format!("{shown} (from {LIBRARY_VAR})"))),
            Err(e) => Err(format!(
                "{LIBRARY_VAR}={shown}: the nvJPEG library cannot be loaded: {}",
                dl_error(&e)
            )),
        };
    }
    let mut problems = Vec::new();
    for name in SONAMES {
        // SAFETY: loading runs the library's initialisers; a library found under nvJPEG's names
        // on the dynamic linker's path is trusted as every other library on it is.
        match unsafe { Library::new(*name) } {
            Ok(lib) => return Ok((lib, (*name).to_string())),
            Err(e) => {
                let text = dl_error(&e);
                // "not found" is the expected answer for the names that are absent; anything else
                // (a file that exists but cannot be loaded) is worth reporting.
                if !text.contains("No such file or directory") {
                    problems.push(text);
                }
            }
        }
    }
    let mut message = format!(
        "no usable nvJPEG library: none of {} could be loaded from the dynamic linker's path, \
         and {LIBRARY_VAR} is not set ({WHEEL_HINT})",
        SONAMES.join(", ")
    );
    if !problems.is_empty() {
        message.push_str("; also: ");
        message.push_str(&problems.join("; "));
    }
    Err(message)
}

/// The bytes nvJPEG holds now through stoker's allocators: allocated, and not yet freed.
#[derive(Default)]
struct Counters {
    device: AtomicU64,
    pinned: AtomicU64,
}

/// Counts an allocation of `size` bytes.
fn record_alloc(counter: &AtomicU64, size: usize) {
    // usize is at most 64 bits on every target, so the conversion is exact; a u64 of bytes
    // does not overflow.
    counter.fetch_add(size as u64, Ordering::Relaxed);
}

/// Counts the release of `size` bytes. Saturates at 0: a free of more than was counted (which
/// nvJPEG does not make) must not wrap the counter around.
fn record_free(counter: &AtomicU64, size: usize) {
    let size = size as u64;
    // The closure always returns Some, so the update cannot fail.
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
        Some(held.saturating_sub(size))
    });
}

/// What an allocator callback returns on success (nvjpeg.h's allocators are modelled after
/// `cudaMalloc`: 0 on success, anything else on failure).
const ALLOCATION_SUCCEEDED: c_int = 0;
/// What an allocator callback returns when it was called with a NULL context or out-pointer.
const ALLOCATION_REFUSED: c_int = 1;

/// A callback's return value for a driver status: 0 for success, else the driver's error code
/// (never 0).
fn callback_status(status: sys::CUresult) -> c_int {
    if status == sys::CUresult::CUDA_SUCCESS {
        ALLOCATION_SUCCEEDED
    } else {
        c_int::try_from(status as u32)
            .ok()
            .filter(|&code| code != ALLOCATION_SUCCEEDED)
            .unwrap_or(ALLOCATION_REFUSED)
    }
}

/// The decoder's counters and the allocator tables handed to `nvjpegCreateExV2`, whose context
/// pointers point at this very struct. Built once per decoder, in an `Arc` that the decoder owns
/// and that outlives its handles, so its address is stable for as long as nvJPEG may call back
/// (see [`NvJpeg`]'s `Drop`).
struct Memory {
    counters: Counters,
    device: DevAllocatorV2,
    pinned: PinnedAllocatorV2,
}

// SAFETY: the tables are written once, before the `Arc` is shared, and only read afterwards (by
// nvJPEG); their context pointer points at this struct, whose only mutable state is atomic. The
// callbacks it leads to are thread-safe (atomics, and driver calls, which may be made from any
// thread), as nvJPEG requires of user allocators.
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

impl Memory {
    fn new() -> Arc<Memory> {
        Arc::new_cyclic(|this: &std::sync::Weak<Memory>| {
            // The address the value is about to be written at, inside the `Arc`'s allocation. It
            // is only stored here; the callbacks dereference it once the `Arc` exists.
            let ctx = this.as_ptr().cast_mut().cast::<c_void>();
            Memory {
                counters: Counters::default(),
                device: DevAllocatorV2 {
                    dev_malloc: device_malloc,
                    dev_free: device_free,
                    dev_ctx: ctx,
                },
                pinned: PinnedAllocatorV2 {
                    pinned_malloc,
                    pinned_free,
                    pinned_ctx: ctx,
                },
            }
        })
    }
}

/// The counters behind an allocator's context pointer, or `None` for a NULL one.
///
/// # Safety
/// `ctx` is NULL or the context pointer of a [`Memory`]'s tables, and that `Memory` is alive.
unsafe fn counters_of<'a>(ctx: *mut c_void) -> Option<&'a Counters> {
    // SAFETY: the caller's contract; a `Memory` is only ever read through shared references.
    unsafe { ctx.cast::<Memory>().cast_const().as_ref() }.map(|memory| &memory.counters)
}

// The four callbacks below are called by nvJPEG, from within the nvJPEG calls stoker makes (so
// on a thread where the decoder's context is current, see the module docs), with the context
// pointer of the tables of a live `Memory` (the handles never outlive it). None of them can
// panic: they only check pointers, call the driver and update atomics. The driver calls cannot
// panic either: cudarc panics only when libcuda or the symbol is missing, and `NvJpeg::load`'s
// caller checked both (the driver's symbol list names cuMemAlloc_v2, cuMemFree_v2,
// cuMemHostAlloc and cuMemFreeHost). A panic would abort the process anyway, not unwind into C,
// since Rust aborts when a panic reaches an `extern "C"` function's boundary.

/// Which of a decoder's counters an allocator counts in.
type Counter = fn(&Counters) -> &AtomicU64;

/// An allocator callback's body: `size` bytes from `alloc` (none for 0: NULL and success, as
/// `cudaMalloc` does), written to `ptr` and counted in `counter`.
///
/// # Safety
/// `ctx` as for [`counters_of`]; `ptr` is NULL or valid for a write.
unsafe fn allocate(
    (ctx, ptr, size): (*mut c_void, *mut *mut c_void, usize),
    counter: Counter,
    alloc: impl FnOnce(usize) -> Result<*mut c_void, sys::CUresult>,
) -> c_int {
    // SAFETY: nvJPEG passes back the context pointer of a live `Memory`'s table.
    let Some(counters) = (unsafe { counters_of(ctx) }) else {
        return ALLOCATION_REFUSED;
    };
    if ptr.is_null() {
        return ALLOCATION_REFUSED;
    }
    let mut address = std::ptr::null_mut();
    if size > 0 {
        match alloc(size) {
            Ok(a) => address = a,
            Err(status) => return callback_status(status),
        }
        record_alloc(counter(counters), size);
    }
    // SAFETY: nvJPEG's out-pointer, checked not NULL.
    unsafe { ptr.write(address) };
    ALLOCATION_SUCCEEDED
}

/// A free callback's body: `ptr` released by `free` (NULL is a no-op, as for `cudaFree`) and
/// `size` subtracted from `counter`.
///
/// # Safety
/// `ctx` as for [`counters_of`].
unsafe fn release(
    (ctx, ptr, size): (*mut c_void, *mut c_void, usize),
    counter: Counter,
    free: impl FnOnce(*mut c_void) -> sys::CUresult,
) -> c_int {
    // SAFETY: nvJPEG passes back the context pointer of a live `Memory`'s table.
    let Some(counters) = (unsafe { counters_of(ctx) }) else {
        return ALLOCATION_REFUSED;
    };
    if ptr.is_null() {
        return ALLOCATION_SUCCEEDED;
    }
    let status = free(ptr);
    if status != sys::CUresult::CUDA_SUCCESS {
        return callback_status(status);
    }
    record_free(counter(counters), size);
    ALLOCATION_SUCCEEDED
}

/// `tDevMallocV2`: `size` bytes of device memory from `cuMemAlloc`, counted. The stream is
/// ignored: the memory may be used on any stream once the call returns.
///
/// # Safety
/// `ctx` as for [`counters_of`]; `ptr` is NULL or valid for a write.
unsafe extern "C" fn device_malloc(
    ctx: *mut c_void,
    ptr: *mut *mut c_void,
    size: usize,
    _stream: CudaStreamT,
) -> c_int {
    let alloc = |size| {
        let mut address: sys::CUdeviceptr = 0;
        // SAFETY: the symbol was checked (see above); the out-pointer is valid; the decoder's
        // context is current on this thread.
        match unsafe { sys::cuMemAlloc_v2(&mut address, size) } {
            sys::CUresult::CUDA_SUCCESS => Ok(address as usize as *mut c_void),
            status => Err(status),
        }
    };
    // SAFETY: the caller's contract, passed on.
    unsafe { allocate((ctx, ptr, size), |c| &c.device, alloc) }
}

/// `tDevFreeV2`: releases device memory from [`device_malloc`] with `cuMemFree`, which does not
/// release it while queued work may still use it (the stream is ignored; see the module docs),
/// and subtracts `size`.
///
/// # Safety
/// `ctx` as for [`counters_of`]; `ptr` is NULL or came from [`device_malloc`] with this `ctx` and
/// `size`, and is not used afterwards.
unsafe extern "C" fn device_free(
    ctx: *mut c_void,
    ptr: *mut c_void,
    size: usize,
    _stream: CudaStreamT,
) -> c_int {
    // SAFETY: the symbol was checked; the address came from `cuMemAlloc` in the decoder's
    // context, which is current on this thread, and nvJPEG no longer uses it.
    let free = |ptr: *mut c_void| unsafe { sys::cuMemFree_v2(ptr as usize as sys::CUdeviceptr) };
    // SAFETY: the caller's contract, passed on.
    unsafe { release((ctx, ptr, size), |c| &c.device, free) }
}

/// `tPinnedMallocV2`: `size` bytes of page-locked host memory from `cuMemHostAlloc`, portable
/// (page-locked for every context, as the arena's slabs are) and cached (not write-combined: the
/// CPU writes and may read these staging buffers), counted. The stream is ignored.
///
/// # Safety
/// As [`device_malloc`].
unsafe extern "C" fn pinned_malloc(
    ctx: *mut c_void,
    ptr: *mut *mut c_void,
    size: usize,
    _stream: CudaStreamT,
) -> c_int {
    let alloc = |size| {
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: the symbol was checked; the out-pointer is valid; the decoder's context is
        // current on this thread.
        match unsafe { sys::cuMemHostAlloc(&mut host, size, sys::CU_MEMHOSTALLOC_PORTABLE) } {
            sys::CUresult::CUDA_SUCCESS => Ok(host),
            status => Err(status),
        }
    };
    // SAFETY: the caller's contract, passed on.
    unsafe { allocate((ctx, ptr, size), |c| &c.pinned, alloc) }
}

/// `tPinnedFreeV2`: releases host memory from [`pinned_malloc`] with `cuMemFreeHost` (synchronous
/// like `cudaFreeHost`; the stream is ignored) and subtracts `size`.
///
/// # Safety
/// `ctx` as for [`counters_of`]; `ptr` is NULL or came from [`pinned_malloc`] with this `ctx` and
/// `size`, and is not used afterwards.
unsafe extern "C" fn pinned_free(
    ctx: *mut c_void,
    ptr: *mut c_void,
    size: usize,
    _stream: CudaStreamT,
) -> c_int {
    // SAFETY: the symbol was checked; the pointer came from `cuMemHostAlloc` and nvJPEG no
    // longer uses it.
    let free = |ptr: *mut c_void| unsafe { sys::cuMemFreeHost(ptr) };
    // SAFETY: the caller's contract, passed on.
    unsafe { release((ctx, ptr, size), |c| &c.pinned, free) }
}

/// One handle with its decoding state.
struct Decoder {
    handle: HandleT,
    state: StateT,
}

/// The hardware backend: its handle and state, the parsed-header object that checks an image's
/// eligibility, and the batch size the state was last initialized for (0: not initialized).
struct Hardware {
    decoder: Decoder,
    jpeg_stream: JpegStreamT,
    batch: usize,
}

/// Everything the library holds for this decoder, behind the mutex.
struct Handles {
    default: Decoder,
    hardware: Option<Hardware>,
}

// SAFETY: nvJPEG handles, states and parsed streams are plain heap objects of the library with no
// tie to the thread that created them (only to the CUDA context, which the caller makes current on
// whichever thread calls). nvJPEG requires that a state or stream is not used by two threads at
// once; `NvJpeg` only touches them with its mutex held.
unsafe impl Send for Handles {}

/// nvJPEG, loaded, with a decoder for one device. See the module docs for how the library is
/// found, the backends, and the CUDA context every call needs.
pub struct NvJpeg {
    api: Api,
    handles: Mutex<Handles>,
    hardware: bool,
    why_not_hardware: Option<String>,
    description: String,
    /// The counters nvJPEG's allocations go through, and the allocator tables the handles were
    /// created with. Dropped after the handles: `Drop::drop` destroys them (nvJPEG then frees
    /// through the callbacks, which use this) before any field is dropped.
    memory: Arc<Memory>,
    /// Kept loaded as long as the decoder (the function pointers in `api` point into it), and
    /// never unloaded (see the module docs).
    _library: ManuallyDrop<Library>,
}

impl std::fmt::Debug for NvJpeg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvJpeg")
            .field("library", &self.description)
            .field("backend", &self.backend())
            .finish()
    }
}

impl NvJpeg {
    /// Loads the library and creates the handle and state. Err(String) says why not, in words.
    ///
    /// Creates the hardware backend when the device has JPEG engines, and the default backend
    /// always. The device's CUDA context must be current on the calling thread (see the module
    /// docs): the handles belong to it.
    ///
    /// # Safety
    /// The CUDA driver was found with every symbol stoker calls (`driver::probe` passed):
    /// nvJPEG calls the allocators, which call `cuMemAlloc_v2`, `cuMemFree_v2`, `cuMemHostAlloc`
    /// and `cuMemFreeHost` through cudarc, which would panic across the FFI boundary on a
    /// missing one.
    pub unsafe fn load() -> Result<NvJpeg, String> {
        let explicit = std::env::var_os(LIBRARY_VAR).filter(|v| !v.is_empty());
        // SAFETY: the caller's promise.
        unsafe { Self::load_from(explicit.as_deref()) }
    }

    /// [`load`](Self::load) with the library file given (`None`: the sonames).
    ///
    /// # Safety
    /// As [`load`](Self::load)'s.
    unsafe fn load_from(explicit: Option<&OsStr>) -> Result<NvJpeg, String> {
        let (library, origin) = open_library(explicit)?;
        let api = Api::resolve(&library, &origin)?;
        // From the first call on, the library stays loaded, even if this load fails (see the
        // module docs); before it, nothing of it has run but its initialisers.
        let library = ManuallyDrop::new(library);
        let version = version(&api)
            .map(|(major, minor, patch)| format!("nvJPEG {major}.{minor}.{patch}"))
            .unwrap_or_else(|status| format!("nvJPEG of unknown version ({})", describe(status)));
        let description = format!("{version} from {origin}");
        // Declared before the handles, so that it outlives them on every path out of here.
        let memory = Memory::new();
        // SAFETY: every symbol was resolved above, and the driver's the allocators call were
        // checked by the caller; the caller made the device's context current.
        let default =
            unsafe { create_decoder(&api, NVJPEG_BACKEND_DEFAULT, &memory) }.map_err(|e| {
                format!(
                "{description} cannot create its decoder (default backend): {e} (nvJPEG needs a \
                 CUDA driver and device, with the device's context current on this thread)"
            )
            })?;
        // SAFETY: as above.
        let (hardware, why_not_hardware) = match unsafe { create_hardware(&api, &memory) } {
            Ok(hardware) => (Some(hardware), None),
            Err(e) => (None, Some(e)),
        };
        Ok(NvJpeg {
            hardware: hardware.is_some(),
            handles: Mutex::new(Handles { default, hardware }),
            api,
            why_not_hardware,
            description,
            memory,
            _library: library,
        })
    }

    /// The device memory nvJPEG holds now, in bytes: allocated through stoker's allocator and
    /// not yet freed. It grows to what the largest images decoded so far need and is released
    /// when the decoder is dropped.
    pub fn device_bytes(&self) -> u64 {
        self.memory.counters.device.load(Ordering::Relaxed)
    }

    /// The pinned (page-locked) host memory nvJPEG holds now, in bytes, as
    /// [`device_bytes`](Self::device_bytes).
    pub fn pinned_bytes(&self) -> u64 {
        self.memory.counters.pinned.load(Ordering::Relaxed)
    }

    /// Which backend is in use ("hardware" / "default"), for messages and stats.
    pub fn backend(&self) -> &'static str {
        if self.hardware {
            "hardware"
        } else {
            "default"
        }
    }

    /// Why the hardware backend is not in use (`None` when it is), for messages.
    pub fn why_not_hardware(&self) -> Option<&str> {
        self.why_not_hardware.as_deref()
    }

    /// The library's version and where it was loaded from, for messages
    /// (`nvJPEG 12.4.0 from libnvjpeg.so.12`).
    pub fn library(&self) -> &str {
        &self.description
    }

    /// Decodes each image to interleaved RGB (NVJPEG_OUTPUT_RGBI) at its device address
    /// (pitch width*3) on `stream` (a CUstream as usize). Pushes the index of every image the
    /// library refuses or fails onto `failed` (those are decoded on the CPU by the caller) and
    /// leaves its destination alone. Err only when the decoder itself is unusable.
    ///
    /// Before decoding, each image's header is read with `nvjpegGetImageInfo`: an image whose
    /// size differs from its job's `width` x `height`, or that has neither 1 nor 3 components, is
    /// refused without being decoded (as is an empty one, or a job without a destination).
    /// Indices are pushed in increasing order. Grayscale images come out as R = G = B.
    ///
    /// "Leaves its destination alone" means that no decode of that image is left queued; nvJPEG
    /// does not promise that work it queued before noticing a failure wrote nothing, so the
    /// caller should overwrite a refused image's destination rather than rely on its contents.
    ///
    /// An `Err` is a failure of nvJPEG, the device or its context
    /// (`NVJPEG_STATUS_EXECUTION_FAILED`, `INTERNAL_ERROR`, `NOT_INITIALIZED` or `ARCH_MISMATCH`
    /// from the default backend). Some images may have been queued by then and `failed` is
    /// incomplete: the whole call has failed.
    ///
    /// nvJPEG's host phase (header parsing, and Huffman decoding for the default backend) runs
    /// during this call; the device phase (copies to the device, the decode, the colour
    /// conversion and the writes to each destination) is queued on `stream`.
    ///
    /// # Safety
    /// - The CUDA context that was current when this decoder was loaded is current on the
    ///   calling thread, and `stream` is a live stream of that context (0: the legacy default
    ///   stream).
    /// - Every job's `data` stays valid and unmodified until the work queued on `stream` by this
    ///   call has completed (nvJPEG may copy from it asynchronously, from its own staging
    ///   buffers or directly).
    /// - Every job's `dst` is device memory of at least `width * height * 3` bytes, the
    ///   destinations do not overlap, and they stay allocated until that work has completed.
    /// - The work queued by the previous call is ordered before this call's: both are on the
    ///   same stream, or the previous call's work has completed (the decoder's buffers are
    ///   reused from call to call, and nvJPEG orders that reuse within one stream only).
    pub unsafe fn decode(
        &self,
        jobs: &[JpegJob<'_>],
        stream: usize,
        failed: &mut Vec<usize>,
    ) -> Result<(), String> {
        if jobs.is_empty() {
            return Ok(());
        }
        let mut handles = self.handles.lock().map_err(|_| {
            format!(
                "{}: the decoder is unusable: an earlier call panicked while using it",
                self.description
            )
        })?;
        let handles = &mut *handles;
        let stream = stream as CudaStreamT;
        let mut refused = Vec::new();

        // Each image's header against its job.
        let mut valid = Vec::with_capacity(jobs.len());
        for (index, job) in jobs.iter().enumerate() {
            if self.matches_header(&handles.default, job) {
                valid.push(index);
            } else {
                refused.push(index);
            }
        }

        // The hardware backend's share, then everything else one by one.
        let one_by_one = match handles.hardware.as_mut() {
            Some(hardware) => {
                let (batch, mut rest) = self.split_eligible(hardware, jobs, &valid);
                if !batch.is_empty() {
                    // SAFETY: forwarded from the caller's contract.
                    if unsafe { self.decode_batch(hardware, jobs, &batch, stream) }.is_err() {
                        // Refused as a whole: the default backend says which image it was.
                        rest.extend_from_slice(&batch);
                        rest.sort_unstable();
                    }
                }
                rest
            }
            None => valid,
        };
        for index in one_by_one {
            let job = &jobs[index];
            let mut image = destination(job);
            // SAFETY: the default handle and state are live and used under the mutex; the data
            // pointer and length describe `job.data`, which the caller keeps valid until the
            // stream's work completes; `image` names the caller's destination of
            // `width * height * 3` bytes with pitch `width * 3`, which the header check above
            // matched to the image's size; the context is current (the caller's contract).
            let status = unsafe {
                (self.api.nvjpegDecode)(
                    handles.default.handle,
                    handles.default.state,
                    job.data.as_ptr(),
                    job.data.len(),
                    NVJPEG_OUTPUT_RGBI,
                    &mut image,
                    stream,
                )
            };
            if status == NVJPEG_STATUS_SUCCESS {
                continue;
            }
            if is_decoder_failure(status) {
                return Err(format!(
                    "{} failed decoding image {index} of the batch: {}",
                    self.description,
                    describe(status)
                ));
            }
            refused.push(index);
        }
        refused.sort_unstable();
        failed.extend(refused);
        Ok(())
    }

    /// Whether `job` can be handed to nvJPEG: a destination, data whose header parses, with 1 or
    /// 3 components and the job's size.
    fn matches_header(&self, default: &Decoder, job: &JpegJob<'_>) -> bool {
        if job.data.is_empty() || job.dst == 0 || job.width == 0 || job.height == 0 {
            return false;
        }
        let mut components: c_int = 0;
        let mut subsampling: ChromaSubsampling = 0;
        let mut widths = [0 as c_int; NVJPEG_MAX_COMPONENT];
        let mut heights = [0 as c_int; NVJPEG_MAX_COMPONENT];
        // SAFETY: the handle is live; data and length describe `job.data`; every out-pointer is
        // valid, and the two arrays have the NVJPEG_MAX_COMPONENT elements the function writes.
        // Host-only and thread-safe per nvjpeg.h.
        let status = unsafe {
            (self.api.nvjpegGetImageInfo)(
                default.handle,
                job.data.as_ptr(),
                job.data.len(),
                &mut components,
                &mut subsampling,
                widths.as_mut_ptr(),
                heights.as_mut_ptr(),
            )
        };
        status == NVJPEG_STATUS_SUCCESS
            && (components == 1 || components == 3)
            && u32::try_from(widths[0]) == Ok(job.width)
            && u32::try_from(heights[0]) == Ok(job.height)
    }

    /// Splits `valid` into the images the hardware backend can decode in a batch and the others.
    fn split_eligible(
        &self,
        hardware: &Hardware,
        jobs: &[JpegJob<'_>],
        valid: &[usize],
    ) -> (Vec<usize>, Vec<usize>) {
        let mut batch = Vec::with_capacity(valid.len());
        let mut rest = Vec::new();
        for &index in valid {
            let data = jobs[index].data;
            // SAFETY: the hardware handle and its parsed-stream object are live and used under
            // the mutex; data and length describe `data`, which outlives the call (host only).
            let parsed = unsafe {
                (self.api.nvjpegJpegStreamParseHeader)(
                    hardware.decoder.handle,
                    data.as_ptr(),
                    data.len(),
                    hardware.jpeg_stream,
                )
            };
            let mut unsupported: c_int = -1;
            let eligible = parsed == NVJPEG_STATUS_SUCCESS && {
                // SAFETY: the stream object holds the header parsed just above; the out-pointer
                // is valid.
                let status = unsafe {
                    (self.api.nvjpegDecodeBatchedSupported)(
                        hardware.decoder.handle,
                        hardware.jpeg_stream,
                        &mut unsupported,
                    )
                };
                // 0 means supported (nvjpeg.h, and NVIDIA's own samples).
                status == NVJPEG_STATUS_SUCCESS && unsupported == 0
            };
            if eligible {
                batch.push(index);
            } else {
                rest.push(index);
            }
        }
        (batch, rest)
    }

    /// Decodes `batch` (indices into `jobs`) with the hardware backend, as one call. On an error
    /// the state is marked for re-initialization, and the images are the caller's to redo.
    ///
    /// # Safety
    /// As [`decode`](Self::decode), for the jobs in `batch`.
    unsafe fn decode_batch(
        &self,
        hardware: &mut Hardware,
        jobs: &[JpegJob<'_>],
        batch: &[usize],
        stream: CudaStreamT,
    ) -> Result<(), Status> {
        let Ok(size) = c_int::try_from(batch.len()) else {
            return Err(NVJPEG_STATUS_INVALID_PARAMETER);
        };
        if hardware.batch != batch.len() {
            // SAFETY: the handle and state are live and used under the mutex. One CPU thread
            // works on the batch (this one).
            let status = unsafe {
                (self.api.nvjpegDecodeBatchedInitialize)(
                    hardware.decoder.handle,
                    hardware.decoder.state,
                    size,
                    1,
                    NVJPEG_OUTPUT_RGBI,
                )
            };
            if status != NVJPEG_STATUS_SUCCESS {
                hardware.batch = 0;
                return Err(status);
            }
            hardware.batch = batch.len();
        }
        let data: Vec<*const u8> = batch.iter().map(|&i| jobs[i].data.as_ptr()).collect();
        let lengths: Vec<usize> = batch.iter().map(|&i| jobs[i].data.len()).collect();
        let mut images: Vec<NvjpegImage> = batch.iter().map(|&i| destination(&jobs[i])).collect();
        // SAFETY: the state was initialized for exactly `batch.len()` images with RGBI output;
        // the three arrays have that many elements and outlive the call; each data pointer and
        // length describes a job's bytes, which the caller keeps valid until the stream's work
        // completes; each image names the caller's destination of `width * height * 3` bytes,
        // matched to the image's size by the header check; the context is current.
        let status = unsafe {
            (self.api.nvjpegDecodeBatched)(
                hardware.decoder.handle,
                hardware.decoder.state,
                data.as_ptr(),
                lengths.as_ptr(),
                images.as_mut_ptr(),
                stream,
            )
        };
        if status != NVJPEG_STATUS_SUCCESS {
            // nvjpeg.h: initialization is also how a failed batch is reset.
            hardware.batch = 0;
            return Err(status);
        }
        Ok(())
    }
}

impl Drop for NvJpeg {
    fn drop(&mut self) {
        let handles = self
            .handles
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Failures are ignored: there is nothing left to release them to.
        if let Some(hardware) = handles.hardware.take() {
            // SAFETY: created by `create_hardware`, destroyed once, the parsed-stream object and
            // the state before their handle; no call is running (`&mut self`). The owner drops
            // the decoder only once the work it queued has completed (module docs).
            unsafe {
                (self.api.nvjpegJpegStreamDestroy)(hardware.jpeg_stream);
                destroy_decoder(&self.api, &hardware.decoder);
            }
        }
        // SAFETY: created by `create_decoder`, destroyed once.
        unsafe { destroy_decoder(&self.api, &handles.default) };
        // Only now, after this body, are the fields dropped, `memory` among them: every free
        // nvJPEG made above found its counters alive.
    }
}

/// The library's version (`nvjpegGetProperty`; needs no device).
fn version(api: &Api) -> Result<(c_int, c_int, c_int), Status> {
    let get = |property| {
        let mut value: c_int = 0;
        // SAFETY: resolved symbol; the out-pointer is valid.
        match unsafe { (api.nvjpegGetProperty)(property, &mut value) } {
            NVJPEG_STATUS_SUCCESS => Ok(value),
            status => Err(status),
        }
    };
    Ok((get(MAJOR_VERSION)?, get(MINOR_VERSION)?, get(PATCH_LEVEL)?))
}

/// A handle for `backend` (stoker's counting allocators, default flags) and a state for it.
///
/// # Safety
/// Every symbol of `api` is resolved from a loaded library, and the driver's symbols were checked
/// (`probe`); the device's context is current; `memory` outlives the handle (it is freed through
/// `memory`'s callbacks until it is destroyed).
unsafe fn create_decoder(api: &Api, backend: Backend, memory: &Memory) -> Result<Decoder, String> {
    let mut handle: HandleT = std::ptr::null_mut();
    // SAFETY: the tables are complete (both callbacks and the context pointer of `memory`, which
    // outlives the handle), at a stable address for as long as the handle lives; nvJPEG only
    // reads them (its prototype lacks `const`, hence the cast). The out-pointer is valid.
    let status = unsafe {
        (api.nvjpegCreateExV2)(
            backend,
            std::ptr::from_ref(&memory.device).cast_mut(),
            std::ptr::from_ref(&memory.pinned).cast_mut(),
            NVJPEG_FLAGS_DEFAULT,
            &mut handle,
        )
    };
    if status != NVJPEG_STATUS_SUCCESS || handle.is_null() {
        return Err(format!("nvjpegCreateExV2: {}", describe(status)));
    }
    let mut state: StateT = std::ptr::null_mut();
    // SAFETY: `handle` was just created; the out-pointer is valid.
    let status = unsafe { (api.nvjpegJpegStateCreate)(handle, &mut state) };
    if status != NVJPEG_STATUS_SUCCESS || state.is_null() {
        // SAFETY: created above, used by nothing.
        unsafe { (api.nvjpegDestroy)(handle) };
        return Err(format!("nvjpegJpegStateCreate: {}", describe(status)));
    }
    Ok(Decoder { handle, state })
}

/// Destroys a decoder's state, then its handle.
///
/// # Safety
/// `decoder` came from `create_decoder` with this `api` and is not used afterwards.
unsafe fn destroy_decoder(api: &Api, decoder: &Decoder) {
    // SAFETY: the caller's contract; the state goes before the handle it was created with.
    unsafe {
        (api.nvjpegJpegStateDestroy)(decoder.state);
        (api.nvjpegDestroy)(decoder.handle);
    }
}

/// The hardware backend, or why the device has none.
///
/// # Safety
/// As [`create_decoder`].
unsafe fn create_hardware(api: &Api, memory: &Memory) -> Result<Hardware, String> {
    // SAFETY: forwarded.
    let decoder = unsafe { create_decoder(api, NVJPEG_BACKEND_HARDWARE, memory) }?;
    let mut jpeg_stream: JpegStreamT = std::ptr::null_mut();
    // SAFETY: the handle was just created; the out-pointer is valid.
    let status = unsafe { (api.nvjpegJpegStreamCreate)(decoder.handle, &mut jpeg_stream) };
    if status != NVJPEG_STATUS_SUCCESS || jpeg_stream.is_null() {
        // SAFETY: created above, used by nothing.
        unsafe { destroy_decoder(api, &decoder) };
        return Err(format!("nvjpegJpegStreamCreate: {}", describe(status)));
    }
    Ok(Hardware {
        decoder,
        jpeg_stream,
        batch: 0,
    })
}

/// The output description of a job: interleaved RGB at `dst`, `width * 3` bytes a row.
fn destination(job: &JpegJob<'_>) -> NvjpegImage {
    let mut image = NvjpegImage {
        channel: [std::ptr::null_mut(); NVJPEG_MAX_COMPONENT],
        pitch: [0; NVJPEG_MAX_COMPONENT],
    };
    image.channel[0] = job.dst as usize as *mut u8;
    image.pitch[0] = job.width as usize * 3;
    image
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_descriptor_has_the_c_layout() {
        // nvjpeg.h: unsigned char *channel[4]; size_t pitch[4];
        // (x86_64 and aarch64 Linux: 64 bytes, pitch at 32, 8-byte aligned).
        let pointer = std::mem::size_of::<*mut u8>();
        let size_t = std::mem::size_of::<usize>();
        assert_eq!(
            std::mem::size_of::<NvjpegImage>(),
            NVJPEG_MAX_COMPONENT * (pointer + size_t)
        );
        assert_eq!(std::mem::offset_of!(NvjpegImage, channel), 0);
        assert_eq!(
            std::mem::offset_of!(NvjpegImage, pitch),
            NVJPEG_MAX_COMPONENT * pointer
        );
        assert_eq!(std::mem::align_of::<NvjpegImage>(), pointer.max(size_t));
        #[cfg(target_pointer_width = "64")]
        {
            assert_eq!(std::mem::size_of::<NvjpegImage>(), 64);
            assert_eq!(std::mem::offset_of!(NvjpegImage, pitch), 32);
        }
        // Enums cross the boundary as C int.
        assert_eq!(std::mem::size_of::<Status>(), 4);
        assert_eq!(std::mem::size_of::<HandleT>(), pointer);
        assert_eq!(std::mem::size_of::<CudaStreamT>(), pointer);
    }

    #[test]
    fn allocator_tables_have_the_c_layout() {
        // nvjpeg.h (12.4 and 13.3): two callback pointers, then void *ctx. A C program compiled
        // against both headers printed 24 bytes, 8-byte aligned, with the fields at 0, 8 and 16
        // (x86_64 Linux), for both tables.
        use std::mem::{align_of, offset_of, size_of};
        let pointer = size_of::<*mut c_void>();
        assert_eq!(size_of::<MallocV2>(), pointer);
        assert_eq!(size_of::<FreeV2>(), pointer);
        assert_eq!(size_of::<DevAllocatorV2>(), 3 * pointer);
        assert_eq!(align_of::<DevAllocatorV2>(), pointer);
        assert_eq!(offset_of!(DevAllocatorV2, dev_malloc), 0);
        assert_eq!(offset_of!(DevAllocatorV2, dev_free), pointer);
        assert_eq!(offset_of!(DevAllocatorV2, dev_ctx), 2 * pointer);
        assert_eq!(size_of::<PinnedAllocatorV2>(), 3 * pointer);
        assert_eq!(align_of::<PinnedAllocatorV2>(), pointer);
        assert_eq!(offset_of!(PinnedAllocatorV2, pinned_malloc), 0);
        assert_eq!(offset_of!(PinnedAllocatorV2, pinned_free), pointer);
        assert_eq!(offset_of!(PinnedAllocatorV2, pinned_ctx), 2 * pointer);
        #[cfg(target_pointer_width = "64")]
        {
            assert_eq!(size_of::<DevAllocatorV2>(), 24);
            assert_eq!(offset_of!(DevAllocatorV2, dev_ctx), 16);
            assert_eq!(size_of::<PinnedAllocatorV2>(), 24);
            assert_eq!(offset_of!(PinnedAllocatorV2, pinned_ctx), 16);
        }
        // The callbacks' int, and size_t.
        assert_eq!(size_of::<c_int>(), 4);
        assert_eq!(size_of::<usize>(), pointer);
    }

    #[test]
    fn counters_add_allocations_and_subtract_frees_without_wrapping() {
        let counters = Counters::default();
        record_alloc(&counters.device, 1 << 20);
        record_alloc(&counters.device, 4096);
        record_alloc(&counters.pinned, 300);
        assert_eq!(counters.device.load(Ordering::Relaxed), (1 << 20) + 4096);
        assert_eq!(counters.pinned.load(Ordering::Relaxed), 300);
        record_free(&counters.device, 4096);
        assert_eq!(counters.device.load(Ordering::Relaxed), 1 << 20);
        record_free(&counters.device, 1 << 20);
        assert_eq!(counters.device.load(Ordering::Relaxed), 0);
        // A free of more than is counted stops at 0.
        record_free(&counters.pinned, 1000);
        assert_eq!(counters.pinned.load(Ordering::Relaxed), 0);
        record_alloc(&counters.pinned, 0);
        assert_eq!(counters.pinned.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn callbacks_report_driver_failures_as_non_zero() {
        assert_eq!(callback_status(sys::CUresult::CUDA_SUCCESS), 0);
        assert_eq!(
            callback_status(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY as c_int
        );
        assert_ne!(
            callback_status(sys::CUresult::CUDA_ERROR_INVALID_CONTEXT),
            0
        );
        assert_ne!(callback_status(sys::CUresult::CUDA_ERROR_UNKNOWN), 0);
    }

    #[test]
    fn allocator_tables_point_at_their_own_counters() {
        let memory = Memory::new();
        let this = Arc::as_ptr(&memory).cast_mut().cast::<c_void>();
        assert_eq!(memory.device.dev_ctx, this);
        assert_eq!(memory.pinned.pinned_ctx, this);
        assert!(std::ptr::fn_addr_eq(
            memory.device.dev_malloc,
            device_malloc as MallocV2
        ));
        assert!(std::ptr::fn_addr_eq(
            memory.device.dev_free,
            device_free as FreeV2
        ));
        assert!(std::ptr::fn_addr_eq(
            memory.pinned.pinned_malloc,
            pinned_malloc as MallocV2
        ));
        assert!(std::ptr::fn_addr_eq(
            memory.pinned.pinned_free,
            pinned_free as FreeV2
        ));
        // SAFETY: the context pointer of a live `Memory`.
        let counters = unsafe { counters_of(this) }.expect("counters");
        assert!(std::ptr::eq(counters, &memory.counters));
        // SAFETY: NULL is allowed.
        assert!(unsafe { counters_of(std::ptr::null_mut()) }.is_none());
    }

    /// What the callbacks do without calling the driver: refuse a NULL context or out-pointer,
    /// give NULL for 0 bytes, and accept freeing NULL, counting nothing.
    #[test]
    fn callbacks_handle_null_and_empty_requests_without_the_driver() {
        let memory = Memory::new();
        let ctx = memory.device.dev_ctx;
        let null = std::ptr::null_mut();
        for (malloc, free) in [
            (memory.device.dev_malloc, memory.device.dev_free),
            (memory.pinned.pinned_malloc, memory.pinned.pinned_free),
        ] {
            let mut out: *mut c_void = 8 as *mut c_void;
            // SAFETY: a live `Memory`'s context (or NULL) and a valid out-pointer (or NULL); none
            // of these requests reaches the driver.
            unsafe {
                assert_ne!(malloc(null, &mut out, 64, null), 0);
                assert_ne!(malloc(ctx, std::ptr::null_mut(), 64, null), 0);
                assert_eq!(out, 8 as *mut c_void);
                assert_eq!(malloc(ctx, &mut out, 0, null), 0);
                assert!(out.is_null());
                assert_eq!(free(ctx, null, 0, null), 0);
                assert_eq!(free(ctx, null, 64, null), 0);
                assert_ne!(free(null, null, 0, null), 0);
            }
        }
        assert_eq!(memory.counters.device.load(Ordering::Relaxed), 0);
        assert_eq!(memory.counters.pinned.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn destination_is_interleaved_rgb_in_the_first_plane() {
        let data = [0u8; 4];
        let job = JpegJob {
            data: &data,
            width: 7,
            height: 5,
            dst: 0x7f00_0000_1000,
        };
        let image = destination(&job);
        assert_eq!(image.channel[0] as usize, 0x7f00_0000_1000);
        assert_eq!(image.pitch[0], 21);
        assert!(image.channel[1..].iter().all(|p| p.is_null()));
        assert!(image.pitch[1..].iter().all(|&p| p == 0));
    }

    #[test]
    fn statuses_are_described_and_split_between_image_and_decoder() {
        assert!(describe(NVJPEG_STATUS_BAD_JPEG).starts_with("NVJPEG_STATUS_BAD_JPEG: "));
        assert_eq!(describe(42), "nvJPEG status 42");
        for image in [
            NVJPEG_STATUS_INVALID_PARAMETER,
            NVJPEG_STATUS_BAD_JPEG,
            NVJPEG_STATUS_JPEG_NOT_SUPPORTED,
            NVJPEG_STATUS_ALLOCATOR_FAILURE,
            NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED,
            NVJPEG_STATUS_INCOMPLETE_BITSTREAM,
            42,
        ] {
            assert!(!is_decoder_failure(image), "{}", describe(image));
        }
        for decoder in [
            NVJPEG_STATUS_NOT_INITIALIZED,
            NVJPEG_STATUS_EXECUTION_FAILED,
            NVJPEG_STATUS_ARCH_MISMATCH,
            NVJPEG_STATUS_INTERNAL_ERROR,
        ] {
            assert!(is_decoder_failure(decoder), "{}", describe(decoder));
        }
    }

    #[test]
    fn a_named_library_that_is_absent_is_reported_with_its_path() {
        // SAFETY: the library is not found, so nothing of it (or the driver) is called.
        let err = unsafe { NvJpeg::load_from(Some(OsStr::new("/nonexistent/libnvjpeg.so.12"))) }
            .unwrap_err();
        assert!(
            err.contains("STOKER_NVJPEG_LIBRARY=/nonexistent/libnvjpeg.so.12"),
            "{err}"
        );
        assert!(err.contains("cannot be loaded"), "{err}");
    }

    #[test]
    fn a_library_without_the_symbols_is_refused_before_any_call() {
        // The C library is present on every Linux machine and exports none of nvJPEG's symbols.
        // SAFETY: refused when its symbols are looked up, before any call.
        let err = unsafe { NvJpeg::load_from(Some(OsStr::new("libc.so.6"))) }.unwrap_err();
        assert!(err.contains("lacks nvjpegGetProperty"), "{err}");
    }

    #[test]
    fn symbols_are_listed_once_each() {
        let mut names = SYMBOLS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SYMBOLS.len());
        assert_eq!(SYMBOLS.len(), 13);
        // Handles are created with stoker's allocators only.
        assert!(SYMBOLS.contains(&"nvjpegCreateExV2"));
        assert!(!SYMBOLS.contains(&"nvjpegCreateEx"));
    }

    #[test]
    fn decoder_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<NvJpeg>();
    }

    /// The library under `STOKER_TEST_NVJPEG` (a path to `libnvjpeg.so.*`, or `1` for the usual
    /// search): every symbol resolves and the version is readable. Without a CUDA device,
    /// loading must fail in words; with one, a batch of images is decoded and compared with the
    /// CPU decoder.
    #[test]
    fn real_library_when_asked() {
        let Some(value) = std::env::var_os("STOKER_TEST_NVJPEG") else {
            eprintln!(
                "skipped: set STOKER_TEST_NVJPEG to a libnvjpeg.so.* path (or 1 for the usual \
                 search) to check the real library"
            );
            return;
        };
        let explicit = (value != "1").then_some(value.as_os_str());
        let (library, origin) = open_library(explicit).expect("opening the library");
        let api = Api::resolve(&library, &origin).expect("resolving every symbol");
        let (major, minor, patch) = version(&api).expect("reading the version");
        eprintln!(
            "{origin}: nvJPEG {major}.{minor}.{patch}, all {} symbols resolve",
            SYMBOLS.len()
        );
        assert!(major >= 12, "nvJPEG {major}.{minor}.{patch}");

        // Creating a decoder needs the driver (its allocators call it): only with a device.
        match crate::cuda::probe() {
            Ok(_) => gpu::decode_batch(explicit),
            Err(why) => eprintln!("SKIPPED decoding: no CUDA device ({why})"),
        }
    }

    /// The end-to-end check on a machine with a CUDA device.
    mod gpu {
        use super::*;
        use crate::cuda::{CudaDevice, DeviceBackend};

        fn encode(
            pixels: &[u8],
            w: u16,
            h: u16,
            gray: bool,
            sampling: jpeg_encoder::SamplingFactor,
            progressive: bool,
        ) -> Vec<u8> {
            let mut out = Vec::new();
            let mut encoder = jpeg_encoder::Encoder::new(&mut out, 95);
            encoder.set_sampling_factor(sampling);
            encoder.set_progressive(progressive);
            let color = if gray {
                jpeg_encoder::ColorType::Luma
            } else {
                jpeg_encoder::ColorType::Rgb
            };
            encoder.encode(pixels, w, h, color).expect("encoding");
            out
        }

        /// RGB8 reference decode on the CPU (grayscale expanded to R = G = B).
        fn reference(jpeg: &[u8]) -> Vec<u8> {
            use zune_core::bytestream::ZCursor;
            use zune_core::colorspace::ColorSpace;
            use zune_core::options::DecoderOptions;
            let options = DecoderOptions::default().jpeg_set_out_colorspace(ColorSpace::RGB);
            let pixels = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(jpeg), options)
                .decode()
                .expect("CPU decode");
            let (w, h) = (WIDTH as usize, HEIGHT as usize);
            if pixels.len() == w * h {
                pixels.iter().flat_map(|&y| [y, y, y]).collect()
            } else {
                pixels
            }
        }

        const WIDTH: u32 = 96;
        const HEIGHT: u32 = 64;

        pub(super) fn decode_batch(explicit: Option<&OsStr>) {
            let device = CudaDevice::open(0).expect("opening cuda:0");
            let (w, h) = (WIDTH, HEIGHT);
            let rgb: Vec<u8> = (0..h)
                .flat_map(|y| {
                    (0..w).flat_map(move |x| [(x * 2) as u8, (y * 3) as u8, (x + y) as u8])
                })
                .collect();
            let gray: Vec<u8> = (0..h)
                .flat_map(|y| (0..w).map(move |x| (x + 2 * y) as u8))
                .collect();
            use jpeg_encoder::SamplingFactor as S;
            let images = [
                encode(&rgb, w as u16, h as u16, false, S::R_4_4_4, false),
                encode(&rgb, w as u16, h as u16, false, S::R_4_2_0, false),
                encode(&rgb, w as u16, h as u16, false, S::R_4_2_0, true),
                encode(&gray, w as u16, h as u16, true, S::R_4_4_4, false),
            ];
            let bytes = (w * h * 3) as usize;
            // Allocating binds the device's context on this thread, as the decoder needs.
            let dsts: Vec<u64> = (0..6)
                .map(|_| device.alloc(bytes).expect("alloc"))
                .collect();
            // SAFETY: `probe` passed (the caller) and the device's context is current.
            let decoder = unsafe { NvJpeg::load_from(explicit) }.expect("loading nvJPEG");
            eprintln!(
                "{}: backend {} ({})",
                decoder.library(),
                decoder.backend(),
                decoder.why_not_hardware().unwrap_or("in use")
            );
            let garbage = b"not a jpeg at all".to_vec();
            let mut jobs: Vec<JpegJob<'_>> = images
                .iter()
                .zip(&dsts)
                .map(|(data, &dst)| JpegJob {
                    data,
                    width: w,
                    height: h,
                    dst,
                })
                .collect();
            jobs.push(JpegJob {
                data: &garbage,
                width: w,
                height: h,
                dst: dsts[4],
            });
            jobs.push(JpegJob {
                data: &images[0],
                width: w + 1,
                height: h,
                dst: dsts[5],
            });
            let stream = device.create_stream().expect("stream");
            let event = device.create_event().expect("event");
            let mut failed = Vec::new();
            let zeros = vec![0u8; bytes];
            let mut first_device_bytes = 0;
            // Run twice: the second call reuses the initialized batch state, and nvJPEG's
            // buffers, which already fit these images.
            for round in 0..2 {
                failed.clear();
                for &dst in &dsts {
                    // SAFETY: `zeros` and every destination outlive the event waited on below.
                    unsafe { device.copy_to_device_async(dst, zeros.as_ptr(), bytes, stream) }
                        .expect("clearing a destination");
                }
                // SAFETY: the context is current (bound by `alloc`); the data and destinations
                // live until the event below has completed; both calls use one stream.
                unsafe { decoder.decode(&jobs, stream.0, &mut failed) }.expect("decode");
                device.record_event(event, stream).expect("record");
                device.synchronize_event(event).expect("synchronize");
                assert_eq!(failed, vec![4, 5]);
                for (i, jpeg) in images.iter().enumerate() {
                    let mut out = vec![0u8; bytes];
                    // SAFETY: written by the completed decode.
                    unsafe { device.copy_to_host(&mut out, dsts[i]) }.expect("copy back");
                    let expected = reference(jpeg);
                    assert_eq!(expected.len(), bytes);
                    let diffs: Vec<i32> = out
                        .iter()
                        .zip(&expected)
                        .map(|(&a, &b)| (a as i32 - b as i32).abs())
                        .collect();
                    let max = diffs.iter().copied().max().unwrap_or(0);
                    let mean = diffs.iter().map(|&d| d as f64).sum::<f64>() / bytes as f64;
                    eprintln!("image {i}: mean |diff| {mean:.3}, max {max}");
                    assert!(mean < 2.0 && max <= 24, "image {i}: mean {mean}, max {max}");
                }
                // The refused images' destinations were not written.
                for &dst in &dsts[4..] {
                    let mut out = vec![1u8; bytes];
                    // SAFETY: allocated, and every write to it completed.
                    unsafe { device.copy_to_host(&mut out, dst) }.expect("copy back");
                    assert!(out.iter().all(|&b| b == 0));
                }
                let (held, pinned) = (decoder.device_bytes(), decoder.pinned_bytes());
                eprintln!("round {round}: nvJPEG holds {held} device bytes, {pinned} pinned");
                assert!(
                    held > 0,
                    "nvJPEG's device memory goes through the allocator"
                );
                if round == 0 {
                    first_device_bytes = held;
                } else {
                    assert!(
                        held <= first_device_bytes,
                        "the same images again: {held} > {first_device_bytes} bytes"
                    );
                }
            }
            // Everything nvJPEG allocated is freed through the callbacks, with the sizes it was
            // allocated with.
            let memory = Arc::clone(&decoder.memory);
            drop(decoder);
            assert_eq!(memory.counters.device.load(Ordering::Relaxed), 0);
            assert_eq!(memory.counters.pinned.load(Ordering::Relaxed), 0);
            // SAFETY: every queued use completed (the event above).
            unsafe {
                for dst in dsts {
                    device.free(dst);
                }
                device.destroy_event(event);
                device.destroy_stream(stream);
            }
        }
    }
}
