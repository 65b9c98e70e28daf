//! CUDA prefetch: host batches copied to device memory on their own stream, ahead of the trainer.
//!
//! - [`device`]: the operations the prefetcher needs ([`DeviceBackend`]), with handle types.
//! - [`driver`] (feature `cuda`): [`CudaDevice`], the real driver loaded at run time through
//!   cudarc, and [`probe`], which says why CUDA cannot be used without ever panicking.
//! - `fake` (tests, and feature `testing`): `FakeDevice`, host memory posing as a device, for
//!   tests on machines without a GPU. It is a test double and is not part of a normal build.
//! - [`prefetch`]: the prefetch thread and the ring of device buffers behind device batches.
//! - [`cast`]: `gpu_normalize`'s kernel (embedded PTX), its launch geometry and its host
//!   reference.
//! - [`resize`]: GPU decoding's resize kernel (embedded PTX), the taps the workers compute for
//!   it, and its host reference.
//!
//! Everything but `driver` builds without the `cuda` feature, so the prefetcher's logic is tested
//! in every configuration.

pub mod cast;
pub mod device;
#[cfg(feature = "cuda")]
pub mod driver;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
#[cfg(feature = "cuda")]
pub mod nvjpeg;
pub mod prefetch;
pub mod resize;

pub use device::{CastJob, DeviceBackend, DevicePtr, Event, JpegJob, ResizeJob, Stream};
#[cfg(feature = "cuda")]
pub use driver::{probe, CudaDevice};
#[cfg(any(test, feature = "testing"))]
pub use fake::{FailAt, FakeCounters, FakeDevice, FAKE_DECODER_BYTES};
pub use prefetch::{HostBatches, PrefetchConfig, Prefetcher, Pulled, COPIES_IN_FLIGHT};

/// What registers host batch memory for `pin_memory=true` on a host loader (`device=cpu`): the
/// driver of the first CUDA device, when a driver and a device are present. Memory registered
/// with `cuMemHostRegister` is what CUDA and torch call pinned (`Tensor.is_pinned()` is true,
/// `.cuda(non_blocking=True)` copies from it asynchronously), while memory merely `mlock`ed is
/// pageable to them and its copies are synchronous. `None` without a driver or a device: the
/// arena then page-locks with `mlock`.
pub fn host_registrar() -> Option<std::sync::Arc<dyn crate::arena::SlabRegistrar>> {
    #[cfg(feature = "cuda")]
    {
        probe().ok().filter(|&devices| devices > 0)?;
        let device: std::sync::Arc<dyn crate::arena::SlabRegistrar> = CudaDevice::open(0).ok()?;
        Some(device)
    }
    #[cfg(not(feature = "cuda"))]
    None
}

/// CUDA devices this machine has, 0 without a driver (or without the `cuda` feature).
pub fn devices() -> usize {
    #[cfg(feature = "cuda")]
    {
        probe().unwrap_or(0)
    }
    #[cfg(not(feature = "cuda"))]
    0
}

/// Opens `cuda:ordinal` with the real driver, or says why it cannot be used.
pub fn open(ordinal: u32) -> crate::Result<std::sync::Arc<dyn DeviceBackend>> {
    #[cfg(feature = "cuda")]
    {
        let device: std::sync::Arc<dyn DeviceBackend> = CudaDevice::open(ordinal)?;
        Ok(device)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(crate::Error::Unsupported(format!(
            "device=cuda:{ordinal}: this build of stoker has no CUDA support (stoker-core was built without its `cuda` feature)"
        )))
    }
}
