//! `stoker_options`: string keys, validated when set.

use crate::error::fail;
use crate::ffi::{free_raw, into_raw};
use crate::types::{stoker_options, stoker_status};
use stoker_core::LoaderOptions;

/// New options with the documented defaults; free with `stoker_options_free`. NULL only if
/// memory ran out.
#[no_mangle]
pub extern "C" fn stoker_options_new() -> *mut stoker_options {
    ffi_boundary!(stoker_options_new => {
        into_raw(stoker_options {
            inner: LoaderOptions::new(),
        })
    })
}

/// Sets option `key` to `value`. An unknown key or a malformed value gives
/// `STOKER_ERR_INVALID_ARGUMENT` with a message naming the key, and leaves the options unchanged.
#[no_mangle]
pub extern "C" fn stoker_options_set(
    o: *mut stoker_options,
    key: *const std::ffi::c_char,
    value: *const std::ffi::c_char,
) -> stoker_status {
    ffi_boundary!(stoker_options_set => {
        let o = try_mut!(o);
        let key = try_str!(key);
        let value = try_str!(value);
        match o.inner.set(key, value) {
            Ok(()) => stoker_status::STOKER_OK,
            Err(e) => fail(&e),
        }
    })
}

/// Makes a `device=cuda[:N]` loader copy its batches on the caller's `cuda_stream` (a `CUstream`
/// / `cudaStream_t` of that device's primary context; NULL is the legacy default stream) instead
/// of a stream of its own. The stream is borrowed, never destroyed: it must outlive the loader and
/// every batch it delivers. The same as the option `cuda_stream` set to the stream's address.
/// Loaders on the CPU ignore it.
#[no_mangle]
pub extern "C" fn stoker_options_set_cuda_stream(
    o: *mut stoker_options,
    cuda_stream: *mut std::ffi::c_void,
) -> stoker_status {
    ffi_boundary!(stoker_options_set_cuda_stream => {
        let o = try_mut!(o);
        o.inner.cuda_stream = Some(cuda_stream as usize);
        stoker_status::STOKER_OK
    })
}

/// Frees options; NULL is a no-op. Loaders made from them are not affected.
#[no_mangle]
pub extern "C" fn stoker_options_free(o: *mut stoker_options) {
    ffi_boundary!(stoker_options_free => {
        // SAFETY: by the C contract `o` is NULL or came from `stoker_options_new` and is freed once.
        unsafe { free_raw(o) }
    })
}
