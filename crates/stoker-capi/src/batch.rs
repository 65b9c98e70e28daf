//! `stoker_batch`: fields as `stoker_tensor` views or DLPack exports, and release.

use std::ffi::{c_char, c_void};

use stoker_core::Error;

use crate::dlpack::{contiguous_strides, device_type, export, DLManagedTensorVersioned};
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
    let (Some(field), Some(data), Some(name)) = (
        batch.batch.field(i),
        batch.batch.field_ptr(i),
        batch.names.get(i),
    ) else {
        return Err(no_field(batch, i));
    };
    let ndim = field.shape.len();
    if ndim > STOKER_MAX_DIMS {
        return Err(Error::Unsupported(format!(
            "field `{}` has {ndim} dimensions; stoker_tensor holds at most {STOKER_MAX_DIMS}: use stoker_batch_to_dlpack",
            field.name
        )));
    }
    let mut t = stoker_tensor {
        name: name.as_ptr(),
        data: data.cast::<c_void>(),
        dtype: field.dtype.into(),
        device_type: device_type(batch) as i32,
        device_id: 0,
        ndim: ndim as i32,
        ..stoker_tensor::EMPTY
    };
    for (k, (&d, s)) in field
        .shape
        .iter()
        .zip(contiguous_strides(field.shape))
        .enumerate()
    {
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
                let known: Vec<_> = b.shared.batch.fields().map(|f| f.name).collect();
                fail(&Error::InvalidArgument(format!(
                    "the batch has no field `{name}` (its fields: {})",
                    known.join(", ")
                )))
            }
        }
    })
}

/// Exports field `i` as a DLPack 1.0 tensor sharing the batch's memory. The consumer calls its
/// deleter once; the memory returns to the arena when the batch is released and every export's
/// deleter has run, in any order. On failure `*out` is NULL.
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

/// Releases a batch, from any thread. Its memory returns to the arena once every DLPack export's
/// deleter has also run. NULL is a no-op.
#[no_mangle]
pub extern "C" fn stoker_batch_release(b: *mut stoker_batch) {
    ffi_boundary!(stoker_batch_release => {
        // SAFETY: by the C contract `b` is NULL or came from `stoker_loader_next` and is released
        // once.
        unsafe { free_raw(b) }
    })
}
