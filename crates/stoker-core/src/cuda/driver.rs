//! The real device: the CUDA driver API through cudarc, loaded with `dlopen` at run time.
//!
//! This is the only module that calls cudarc. cudarc panics when `libcuda` or one of its symbols
//! is missing, so [`CudaDevice::open`] first asks whether the library is present, then whether
//! every symbol stoker uses is exported, and only then makes its first driver call. Every later
//! call goes through a `CudaDevice`, which exists only once those checks passed.
//!
//! Arena slabs are page-locked with `cuMemHostRegister` (not `cuMemAllocHost`/`alloc_pinned`,
//! whose write-combined memory is slow for the CPU to read back), which is why `CudaDevice` is a
//! [`SlabRegistrar`].
//!
//! stoker's kernels, the cast kernels of `gpu_normalize` ([`super::cast`]) and the resize of GPU
//! decoding ([`super::resize`]), are PTX embedded in the library, loaded into the context the
//! first time they are asked for.

use std::ffi::{c_void, CStr, CString};
use std::mem::MaybeUninit;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

use super::cast::{self, CAST_B16, CAST_B32, CAST_BLOCK, CAST_PTX};
use super::device::{CastJob, DeviceBackend, DevicePtr, Event, JpegJob, ResizeJob, Stream};
use super::nvjpeg::NvJpeg;
use super::resize::{self, RESIZE_BLOCK, RESIZE_PTX, RESIZE_U8};
use crate::arena::SlabRegistrar;
use crate::error::{Error, Result};

/// Every driver entry point stoker calls. Checked before the first call, because cudarc resolves
/// a symbol on first use and panics if it is missing (an old or partial driver install).
const SYMBOLS: &[&str] = &[
    "cuGetErrorName",
    "cuGetErrorString",
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    // nvJPEG's pinned buffers, through its counting allocators (`super::nvjpeg`).
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoH_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
];

/// Why no CUDA device can be used here, or `Ok` with the device count. Never panics and never
/// calls into a driver that is absent.
pub fn probe() -> Result<usize> {
    // SAFETY: only tries to dlopen libcuda under its usual names; no symbol is called.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::Unsupported(
            "no CUDA driver (libcuda.so) found".into(),
        ));
    }
    // SAFETY: the library is present (checked above), so `culib()` opens it instead of
    // panicking; looking a symbol up does not call it.
    let lib = unsafe { sys::culib() };
    for name in SYMBOLS {
        // SAFETY: a lookup only; the pointer type is irrelevant because it is never called here.
        if unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err() {
            return Err(Error::Unsupported(format!(
                "CUDA driver present but too old: it lacks {name}"
            )));
        }
    }
    // SAFETY: every symbol used below was found above.
    match unsafe { sys::cuInit(0) } {
        sys::CUresult::CUDA_SUCCESS => {}
        sys::CUresult::CUDA_ERROR_NO_DEVICE => {
            return Err(Error::Unsupported(
                "CUDA driver present but no device".into(),
            ))
        }
        other => {
            return Err(Error::Unsupported(format!(
                "CUDA driver present but it failed to initialize: {}",
                describe(other)
            )))
        }
    }
    let mut count = 0;
    // SAFETY: the driver is initialized; `count` is a valid out-pointer.
    check(
        unsafe { sys::cuDeviceGetCount(&mut count) },
        "counting devices",
    )?;
    if count <= 0 {
        return Err(Error::Unsupported(
            "CUDA driver present but no device".into(),
        ));
    }
    Ok(count as usize)
}

/// `CUDA_ERROR_NAME: description` for a driver status.
fn describe(status: sys::CUresult) -> String {
    let text = |f: unsafe fn(sys::CUresult, *mut *const std::ffi::c_char) -> sys::CUresult| {
        let mut ptr = std::ptr::null();
        // SAFETY: the driver writes a pointer to a static string, or fails and leaves it NULL.
        let ok = unsafe { f(status, &mut ptr) } == sys::CUresult::CUDA_SUCCESS;
        if ok && !ptr.is_null() {
            // SAFETY: a NUL-terminated string in the driver's static storage.
            Some(
                unsafe { CStr::from_ptr(ptr) }
                    .to_string_lossy()
                    .into_owned(),
            )
        } else {
            None
        }
    };
    match (text(sys::cuGetErrorName), text(sys::cuGetErrorString)) {
        (Some(name), Some(msg)) => format!("{name}: {msg}"),
        _ => format!("CUDA error {}", status as u32),
    }
}

fn check(status: sys::CUresult, what: &str) -> Result<()> {
    match status {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            Err(Error::OutOfMemory(format!("{what}: {}", describe(status))))
        }
        other => Err(Error::Cuda(format!("{what}: {}", describe(other)))),
    }
}

/// One CUDA device through its primary context (the context the CUDA runtime, and so PyTorch and
/// LibTorch, use: pointers and streams are shared with the trainer).
pub struct CudaDevice {
    ordinal: u32,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    /// nvJPEG, loaded on first use (GPU decoding); the error says why it could not be.
    jpeg: OnceLock<std::result::Result<NvJpeg, String>>,
    /// The kernels, loaded on first use; the error says why they could not be.
    kernels: OnceLock<std::result::Result<Kernels, String>>,
}

/// The kernels: the module of the cast kernels and the module of the resize kernel, and their
/// entry points.
struct Kernels {
    cast_module: sys::CUmodule,
    b32: sys::CUfunction,
    b16: sys::CUfunction,
    resize_module: sys::CUmodule,
    resize_u8: sys::CUfunction,
}

// SAFETY: a CUcontext handle may be used from any thread (each thread makes it current before
// use, see `bind`); the driver synchronizes access internally.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; no method mutates the struct.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    /// Opens `cuda:ordinal`, or says why not: `Unsupported` without a driver or a device,
    /// `InvalidOption` for an ordinal past the device count.
    pub fn open(ordinal: u32) -> Result<Arc<CudaDevice>> {
        let count = probe()?;
        if ordinal as usize >= count {
            return Err(Error::option(
                "device",
                format!(
                    "cuda:{ordinal}, but this machine has {count} CUDA device{}",
                    if count == 1 { "" } else { "s" }
                ),
            ));
        }
        let mut device = 0;
        // SAFETY: probe() initialized the driver; the ordinal is below the device count.
        check(
            unsafe { sys::cuDeviceGet(&mut device, ordinal as i32) },
            "getting the device",
        )?;
        let mut ctx = MaybeUninit::uninit();
        // SAFETY: `device` came from cuDeviceGet; `ctx` is a valid out-pointer.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(ctx.as_mut_ptr(), device) },
            "retaining the primary context",
        )?;
        // SAFETY: written by the successful call above.
        let ctx = unsafe { ctx.assume_init() };
        Ok(Arc::new(CudaDevice {
            ordinal,
            device,
            ctx,
            jpeg: OnceLock::new(),
            kernels: OnceLock::new(),
        }))
    }

    /// The kernels, loaded into this device's context the first time.
    /// nvJPEG, loaded into this device's context the first time.
    fn jpeg(&self) -> Result<&NvJpeg> {
        self.jpeg
            .get_or_init(|| {
                self.bind().map_err(|e| e.to_string())?;
                // SAFETY: this device exists, so `probe` found the driver with every symbol in
                // `SYMBOLS`, the allocators' among them; its context is current (above).
                unsafe { NvJpeg::load() }
            })
            .as_ref()
            .map_err(|e| {
                Error::Unsupported(format!(
                    "cuda:{}: no JPEG decoder for the device: {e}",
                    self.ordinal
                ))
            })
    }

    fn kernels(&self) -> Result<&Kernels> {
        self.kernels
            .get_or_init(|| self.load_kernels().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| {
                Error::Cuda(format!(
                    "loading stoker's kernels (PTX ISA 8.0, which needs a CUDA 12.0 driver or \
                     newer) on cuda:{}: {e}; set gpu_normalize=false (and jpeg_decoder other than gpu) \
                     to convert and decode on the CPU",
                    self.ordinal
                ))
            })
    }

    fn load_kernels(&self) -> Result<Kernels> {
        let cast_module = self.load_module(CAST_PTX)?;
        let resize_module = match self.load_module(RESIZE_PTX) {
            Ok(module) => module,
            Err(e) => {
                // SAFETY: loaded above and used by nothing.
                unsafe { sys::cuModuleUnload(cast_module) };
                return Err(e);
            }
        };
        let functions = (
            function(cast_module, CAST_B32),
            function(cast_module, CAST_B16),
            function(resize_module, RESIZE_U8),
        );
        match functions {
            (Ok(b32), Ok(b16), Ok(resize_u8)) => Ok(Kernels {
                cast_module,
                b32,
                b16,
                resize_module,
                resize_u8,
            }),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                // SAFETY: loaded above and used by nothing.
                unsafe {
                    sys::cuModuleUnload(cast_module);
                    sys::cuModuleUnload(resize_module);
                }
                Err(e)
            }
        }
    }

    /// Loads a module of embedded PTX (NUL-terminated) into this device's context.
    fn load_module(&self, ptx: &'static str) -> Result<sys::CUmodule> {
        debug_assert!(ptx.ends_with('\0'));
        let mut module = MaybeUninit::uninit();
        // SAFETY: `ptx` is NUL-terminated PTX text (CAST_PTX, RESIZE_PTX); `module` is a valid
        // out-pointer.
        self.call("cuModuleLoadData", || unsafe {
            sys::cuModuleLoadData(module.as_mut_ptr(), ptx.as_ptr().cast())
        })?;
        // SAFETY: written by the successful call above.
        Ok(unsafe { module.assume_init() })
    }

    /// Makes this device's context current on the calling thread. Cheap (a thread-local store),
    /// and needed because the prefetch thread, pool workers (slab registration) and whichever
    /// thread drops a batch all call the driver.
    fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is retained until `self` drops.
        check(
            unsafe { sys::cuCtxSetCurrent(self.ctx) },
            "making the context current",
        )
    }

    fn call(&self, what: &str, f: impl FnOnce() -> sys::CUresult) -> Result<()> {
        self.bind()?;
        check(f(), what)
    }
}

/// The entry point `name` of a loaded module.
fn function(module: sys::CUmodule, name: &str) -> Result<sys::CUfunction> {
    let name = CString::new(name).map_err(|e| Error::Internal(e.to_string()))?;
    let mut f = MaybeUninit::uninit();
    // SAFETY: `module` is loaded; `name` is NUL-terminated; `f` is a valid out-pointer.
    check(
        unsafe { sys::cuModuleGetFunction(f.as_mut_ptr(), module, name.as_ptr()) },
        "cuModuleGetFunction",
    )?;
    // SAFETY: written by the successful call above.
    Ok(unsafe { f.assume_init() })
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // nvJPEG frees its buffers in the context it was loaded in; its work has completed
        // (every stream that used it was synchronized before the last Arc to this device went).
        if self.bind().is_ok() {
            drop(self.jpeg.take());
        }
        if let Some(Ok(kernels)) = self.kernels.get() {
            for module in [kernels.cast_module, kernels.resize_module] {
                // SAFETY: nothing launches them any more (every user holds an Arc to this
                // device); a failure leaves the module to the context's release.
                let _ = self.call("unloading stoker's kernels", || unsafe {
                    sys::cuModuleUnload(module)
                });
            }
        }
        // SAFETY: balances the retain in `open`; nothing of this device is used afterwards (every
        // buffer, stream and event holds an Arc to it).
        unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.device);
        }
    }
}

impl SlabRegistrar for CudaDevice {
    fn register(&self, ptr: *mut u8, len: usize) -> Result<()> {
        self.call("registering a batch slab (cuMemHostRegister)", || {
            // SAFETY: the arena passes a live mapping of `len` bytes that it unregisters before
            // unmapping. PORTABLE: the memory counts as pinned in every context.
            unsafe {
                sys::cuMemHostRegister_v2(
                    ptr.cast::<c_void>(),
                    len,
                    sys::CU_MEMHOSTREGISTER_PORTABLE,
                )
            }
        })
    }

    fn unregister(&self, ptr: *mut u8, _len: usize) {
        // Nothing to do on failure: the arena unmaps the slab next, which also ends the pinning.
        // SAFETY: `ptr` was registered by `register`; no copy from it is pending (the prefetcher
        // drops a host batch only after its copy completed).
        let _ = self.call("unregistering a batch slab", || unsafe {
            sys::cuMemHostUnregister(ptr.cast::<c_void>())
        });
    }
}

impl DeviceBackend for CudaDevice {
    fn ordinal(&self) -> u32 {
        self.ordinal
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        self.call(
            &format!("allocating {bytes} bytes on cuda:{}", self.ordinal),
            || unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) },
        )?;
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: DevicePtr) {
        // A failure here means the context is already broken; there is nothing left to release.
        // SAFETY: the caller guarantees `ptr` is a live allocation with no queued work.
        let _ = self.call("freeing device memory", || unsafe {
            sys::cuMemFree_v2(ptr)
        });
    }

    fn create_stream(&self) -> Result<Stream> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: `stream` is a valid out-pointer.
        self.call("creating a stream", || unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        })?;
        Ok(Stream(stream as usize))
    }

    unsafe fn destroy_stream(&self, stream: Stream) {
        // SAFETY: the caller owns the stream; pending work finishes before it is released.
        let _ = self.call("destroying a stream", || unsafe {
            sys::cuStreamDestroy_v2(stream.0 as sys::CUstream)
        });
    }

    fn create_event(&self) -> Result<Event> {
        let mut event = std::ptr::null_mut();
        // SAFETY: `event` is a valid out-pointer.
        self.call("creating an event", || unsafe {
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
        })?;
        Ok(Event(event as usize))
    }

    unsafe fn destroy_event(&self, event: Event) {
        // SAFETY: the caller owns the event.
        let _ = self.call("destroying an event", || unsafe {
            sys::cuEventDestroy_v2(event.0 as sys::CUevent)
        });
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: Stream,
    ) -> Result<()> {
        // SAFETY: the caller keeps both ranges valid until the copy completes.
        self.call("copying to the device", || unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, stream.0 as sys::CUstream)
        })
    }

    fn load_kernels(&self) -> Result<()> {
        self.kernels().map(|_| ())
    }

    unsafe fn cast_async(&self, job: &CastJob, stream: Stream) -> Result<()> {
        let kernels = self.kernels()?;
        let function = match job.elem_bytes {
            4 => kernels.b32,
            2 => kernels.b16,
            n => {
                return Err(Error::Internal(format!(
                    "a cast to {n}-byte elements: no such kernel"
                )))
            }
        };
        let (grid_x, grid_y) = cast::grid(job);
        // The kernel's parameters, in cast.cu's order, each passed by address.
        let (mut src, mut dst, mut table) = (job.src, job.dst, job.table);
        let (mut rows, mut plane, mut channels) = (job.rows, job.plane, job.channels);
        let mut by_column = u32::from(job.channel_by_column);
        let mut params: [*mut c_void; 7] = [
            (&raw mut src).cast(),
            (&raw mut dst).cast(),
            (&raw mut table).cast(),
            (&raw mut rows).cast(),
            (&raw mut plane).cast(),
            (&raw mut channels).cast(),
            (&raw mut by_column).cast(),
        ];
        // SAFETY: `function` takes exactly these seven parameters (u64 x3, u32 x4, cast.cu);
        // the driver copies them before returning; the caller keeps the memory alive.
        self.call("launching the cast kernel", || unsafe {
            sys::cuLaunchKernel(
                function,
                grid_x,
                grid_y,
                1,
                CAST_BLOCK,
                1,
                1,
                0,
                stream.0 as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn load_jpeg_decoder(&self) -> Result<()> {
        self.jpeg().map(|_| ())
    }

    fn jpeg_decoder_bytes(&self) -> u64 {
        match self.jpeg.get() {
            Some(Ok(decoder)) => decoder.device_bytes(),
            _ => 0,
        }
    }

    unsafe fn decode_jpegs_async(
        &self,
        jobs: &[JpegJob<'_>],
        stream: Stream,
        failed: &mut Vec<usize>,
    ) -> Result<()> {
        let decoder = self.jpeg()?;
        self.bind()?;
        // SAFETY: the context the decoder was loaded in is current (above); the caller keeps the
        // bytes and destinations alive until the stream's work completes, and every call uses
        // the loader's one copy stream, so each call's work is ordered after the last's.
        unsafe { decoder.decode(jobs, stream.0, failed) }
            .map_err(|e| Error::Cuda(format!("decoding JPEGs on cuda:{}: {e}", self.ordinal)))
    }

    unsafe fn resize_async(&self, job: &ResizeJob, stream: Stream) -> Result<()> {
        let function = self.kernels()?.resize_u8;
        let (grid_x, grid_y) = resize::grid(job);
        // The kernel's parameters, in resize.cu's order, each passed by address.
        let (mut src, mut src_width, mut src_height) = (job.src, job.src_width, job.src_height);
        let (mut dst, mut width, mut height) = (job.dst, job.width, job.height);
        let (mut planar, mut flip) = (u32::from(job.planar), u32::from(job.flip));
        let (mut x_spans, mut x_weights, mut x_taps) = (job.x_spans, job.x_weights, job.x_taps);
        let (mut y_spans, mut y_weights, mut y_taps) = (job.y_spans, job.y_weights, job.y_taps);
        let mut params: [*mut c_void; 14] = [
            (&raw mut src).cast(),
            (&raw mut src_width).cast(),
            (&raw mut src_height).cast(),
            (&raw mut dst).cast(),
            (&raw mut width).cast(),
            (&raw mut height).cast(),
            (&raw mut planar).cast(),
            (&raw mut flip).cast(),
            (&raw mut x_spans).cast(),
            (&raw mut x_weights).cast(),
            (&raw mut x_taps).cast(),
            (&raw mut y_spans).cast(),
            (&raw mut y_weights).cast(),
            (&raw mut y_taps).cast(),
        ];
        // SAFETY: `function` takes exactly these fourteen parameters (u64 src, u32 x2, u64 dst,
        // u32 x4, u64 x2, u32, u64 x2, u32: resize.cu); the driver copies them before returning;
        // the caller keeps the memory alive and `dst` apart from the rest.
        self.call("launching the resize kernel", || unsafe {
            sys::cuLaunchKernel(
                function,
                grid_x,
                grid_y,
                1,
                RESIZE_BLOCK.0,
                RESIZE_BLOCK.1,
                1,
                0,
                stream.0 as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        // SAFETY: `dst` is a live host buffer of `dst.len()` bytes; the caller vouches for `src`.
        self.call("copying to the host", || unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }

    fn record_event(&self, event: Event, stream: Stream) -> Result<()> {
        // SAFETY: handles come from this device (or a caller-owned stream in its context).
        self.call("recording an event", || unsafe {
            sys::cuEventRecord(event.0 as sys::CUevent, stream.0 as sys::CUstream)
        })
    }

    fn query_event(&self, event: Event) -> Result<bool> {
        self.bind()?;
        // SAFETY: `event` was created on this device and is live.
        match unsafe { sys::cuEventQuery(event.0 as sys::CUevent) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check(other, "querying an event").map(|_| false),
        }
    }

    fn synchronize_event(&self, event: Event) -> Result<()> {
        // SAFETY: `event` was created on this device and is live.
        self.call("waiting for an event", || unsafe {
            sys::cuEventSynchronize(event.0 as sys::CUevent)
        })
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        // SAFETY: both handles are live; flags must be 0 (CU_EVENT_WAIT_DEFAULT).
        self.call("making a stream wait for an event", || unsafe {
            sys::cuStreamWaitEvent(stream.0 as sys::CUstream, event.0 as sys::CUevent, 0)
        })
    }
}
