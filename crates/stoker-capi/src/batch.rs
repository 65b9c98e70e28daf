//! `stoker_batch`: fields as `stoker_tensor` views or DLPack exports, the CUDA copy's stream and
//! event of a device batch, and release.

use std::ffi::{c_char, c_void};

use stoker_core::{Error, Stream};

use crate::dlpack::{device, export, DLManagedTensorVersioned};
use crate::error::fail;
use crate::ffi::free_raw;
use crate::types::{stoker_batch, stoker_status, stoker_tensor, SharedBatch, STOKER_MAX_DIMS};

fn no_field(batch: &SharedBatch, i: usize) -> Error {
    Error::InvalidArgument(format!(
        "field index {i} is out of range: the batch has {} fields",
        batch.batch.num_fields()
    ))
}

/// Describes field `i` as a `stoker_tensor`.
fn tensor(batch: &SharedBatch, i: usize) -> Result<stoker_tensor, Error> {
    let (Some(field), Some(name)) = (batch.batch.field(i), batch.names.get(i)) else {
        return Err(no_field(batch, i));
    };
    let ndim = field.shape.len();
    if ndim > STOKER_MAX_DIMS {
        return Err(Error::Unsupported(format!(
            "field `{}` has {ndim} dimensions; stoker_tensor holds at most {STOKER_MAX_DIMS}: use stoker_batch_to_dlpack",
            field.name
        )));
    }
    let device = device(batch);
    let mut t = stoker_tensor {
        name: name.as_ptr(),
        // A device address as C holds it (`CUdeviceptr` in a `void *`): CUDA's unified virtual
        // addressing shares the host's pointer width.
        data: field.address as usize as *mut c_void,
        dtype: field.dtype.into(),
        device_type: device.device_type as i32,
        device_id: device.device_id,
        ndim: ndim as i32,
        ..stoker_tensor::EMPTY
    };
    for (k, (&d, s)) in field.shape.iter().zip(field.strides()).enumerate() {
        t.shape[k] = d as i64;
        t.strides[k] = s;
    }
    Ok(t)
}

/// Writes field `i` (or the error) to `out`.
fn write_field(b: &stoker_batch, i: usize, out: *mut stoker_tensor) -> stoker_status {
    match tensor(&b.shared, i) {
        Ok(t) => {
            // SAFETY: the callers checked `out` non-NULL; it is writable by the C contract.
            unsafe { out.write(t) };
            stoker_status::STOKER_OK
        }
        Err(e) => fail(&e),
    }
}

/// Number of fields (0 for NULL).
#[no_mangle]
pub extern "C" fn stoker_batch_num_fields(b: *const stoker_batch) -> usize {
    ffi_boundary!(stoker_batch_num_fields => {
        try_ref!(b).shared.batch.num_fields()
    })
}

/// Describes field `i`. Valid until the batch is released. An index out of range gives
/// `STOKER_ERR_INVALID_ARGUMENT`; on failure `*out` is zeroed (NULL pointers).
///
/// `device_type` is 1 (CPU) for a host batch, pinned or not (with `pin_memory` and a CUDA driver
/// its memory is registered with the driver, which CUDA and torch see as pinned; DLPack's 3,
/// CUDA host, is not used because torch's `from_dlpack` refuses it), and 2 (CUDA) for a batch of
/// a `device=cuda[:N]` loader, whose `data` is then a device address on device `device_id`.
#[no_mangle]
pub extern "C" fn stoker_batch_field(
    b: *const stoker_batch,
    i: usize,
    out: *mut stoker_tensor,
) -> stoker_status {
    ffi_boundary!(stoker_batch_field => {
        non_null!(out);
        // SAFETY: non-NULL (checked above) and writable by the C contract.
        unsafe { out.write(stoker_tensor::EMPTY) };
        let b = try_ref!(b);
        write_field(b, i, out)
    })
}

/// Describes the field called `name`; an unknown name gives `STOKER_ERR_INVALID_ARGUMENT`.
#[no_mangle]
pub extern "C" fn stoker_batch_field_by_name(
    b: *const stoker_batch,
    name: *const c_char,
    out: *mut stoker_tensor,
) -> stoker_status {
    ffi_boundary!(stoker_batch_field_by_name => {
        non_null!(out);
        // SAFETY: non-NULL (checked above) and writable by the C contract.
        unsafe { out.write(stoker_tensor::EMPTY) };
        let b = try_ref!(b);
        let name = try_str!(name);
        match b.shared.batch.field_index(name) {
            Some(i) => write_field(b, i, out),
            None => {
                let known = b.shared.batch.field_names();
                fail(&Error::InvalidArgument(format!(
                    "the batch has no field `{name}` (its fields: {})",
                    known.join(", ")
                )))
            }
        }
    })
}

/// Exports field `i` as a DLPack 1.0 tensor sharing the batch's memory. The consumer calls its
/// deleter once; the memory returns to the arena (a device batch's buffer to the ring) when the
/// batch is released and every export's deleter has run, in any order. On failure `*out` is NULL.
///
/// A device batch's export has device `{kDLCUDA, N}`. Order the streams that read it after the
/// copy with `stoker_batch_wait` before releasing the batch: that also keeps the ring from reusing
/// the buffer before the work queued on those streams so far has run.
#[no_mangle]
pub extern "C" fn stoker_batch_to_dlpack(
    b: *mut stoker_batch,
    i: usize,
    out: *mut *mut DLManagedTensorVersioned,
) -> stoker_status {
    ffi_boundary!(stoker_batch_to_dlpack => {
        clear_out!(out);
        let b = try_ref!(b);
        match export(&b.shared, i) {
            Some(t) => {
                // SAFETY: `out` was checked non-NULL and writable by `clear_out!`.
                unsafe { out.write(t) };
                stoker_status::STOKER_OK
            }
            None => fail(&no_field(&b.shared, i)),
        }
    })
}

/// The CUDA event (`CUevent`) of a device batch: it completes when every field is on the device.
/// Owned by the batch and valid until the batch is released (and its DLPack exports deleted):
/// do not destroy it. `*event_out` is NULL for a host batch, and on failure.
#[no_mangle]
pub extern "C" fn stoker_batch_cuda_event(
    b: *const stoker_batch,
    event_out: *mut *mut c_void,
) -> stoker_status {
    ffi_boundary!(stoker_batch_cuda_event => {
        clear_out!(event_out);
        let b = try_ref!(b);
        if let Some(event) = b.shared.batch.cuda_event() {
            // SAFETY: `event_out` was checked non-NULL and writable by `clear_out!`.
            unsafe { event_out.write(event.0 as *mut c_void) };
        }
        stoker_status::STOKER_OK
    })
}

/// The CUDA stream (`CUstream`) a device batch was copied on: the loader's own stream, or the one
/// given with `stoker_options_set_cuda_stream`. Valid while the batch lives; do not destroy it.
/// `*stream_out` is NULL for a host batch, and on failure.
#[no_mangle]
pub extern "C" fn stoker_batch_cuda_stream(
    b: *const stoker_batch,
    stream_out: *mut *mut c_void,
) -> stoker_status {
    ffi_boundary!(stoker_batch_cuda_stream => {
        clear_out!(stream_out);
        let b = try_ref!(b);
        if let Some(stream) = b.shared.batch.cuda_stream() {
            // SAFETY: `stream_out` was checked non-NULL and writable by `clear_out!`.
            unsafe { stream_out.write(stream.0 as *mut c_void) };
        }
        stoker_status::STOKER_OK
    })
}

/// Makes the caller's `cuda_stream` (a `CUstream` / `cudaStream_t`; NULL is the legacy default
/// stream) wait for the batch's copy, on the GPU, without blocking the calling thread: kernels
/// queued on it afterwards see the batch's data.
///
/// It also orders the reuse of the batch's device buffer after the work queued on `cuda_stream`
/// until the batch is released. **Call it for every stream that reads the batch (or one of its
/// DLPack exports) before releasing the batch**; otherwise the ring may overwrite the buffer while
/// a kernel on that stream still reads it. Calling it again for the same stream is harmless.
///
/// A no-op returning `STOKER_OK` for a host batch. `STOKER_ERR_CUDA` if the copy failed (the
/// message names the batch) or the driver rejected the wait.
#[no_mangle]
pub extern "C" fn stoker_batch_wait(
    b: *mut stoker_batch,
    cuda_stream: *mut c_void,
) -> stoker_status {
    ffi_boundary!(stoker_batch_wait => {
        let b = try_ref!(b);
        match b.shared.batch.wait(Stream(cuda_stream as usize)) {
            Ok(()) => stoker_status::STOKER_OK,
            Err(e) => fail(&e),
        }
    })
}

/// Blocks the calling thread until the batch's copy to the device has completed (for callers
/// that read it outside CUDA streams). A no-op for a host batch; `STOKER_ERR_CUDA` if the copy
/// failed. It does not replace `stoker_batch_wait` for streams that read the batch.
#[no_mangle]
pub extern "C" fn stoker_batch_synchronize(b: *mut stoker_batch) -> stoker_status {
    ffi_boundary!(stoker_batch_synchronize => {
        let b = try_ref!(b);
        match b.shared.batch.synchronize() {
            Ok(()) => stoker_status::STOKER_OK,
            Err(e) => fail(&e),
        }
    })
}

/// Releases a batch, from any thread. Its memory returns to the arena once every DLPack export's
/// deleter has also run. NULL is a no-op.
///
/// A device batch's buffer returns to the ring of the loader that made it; the ring reuses it
/// only after the work queued so far on every stream passed to `stoker_batch_wait`. Call
/// `stoker_batch_wait` for every stream that reads the batch before releasing it.
#[no_mangle]
pub extern "C" fn stoker_batch_release(b: *mut stoker_batch) {
    ffi_boundary!(stoker_batch_release => {
        // SAFETY: by the C contract `b` is NULL or came from `stoker_loader_next` and is released
        // once.
        unsafe { free_raw(b) }
    })
}
