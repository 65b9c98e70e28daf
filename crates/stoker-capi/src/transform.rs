//! One image through a transform spec, outside a loader: the hook the equivalence tests use to
//! replay stoker's drawn parameters through torchvision, and a way to see what a spec does.

use std::ffi::c_char;

use stoker_core::dtype::{DType, Layout};
use stoker_core::rng::{Rng, Stream};
use stoker_core::transform::{Pipeline, Scratch};

use crate::error::set_message;
use crate::types::stoker_status;

/// Transforms one decoded RGB8 image (`width * height * 3` bytes at `rgb`, row-major, HWC) by
/// the transform spec `spec` exactly as a loader's worker does for draw `index` of `epoch` under
/// `seed`, writing the uint8 HWC output (`out_len` must equal the pipeline's output bytes, see
/// `stoker_options_set`'s `transform`) to `out`. When `params` is not NULL, the parameters each
/// randomized operation drew are written there as JSON objects, one per line (at most
/// `params_len - 1` bytes plus a NUL); `*params_needed` (if not NULL) receives the full length.
/// For tests and debugging: a loader never needs it.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn stoker_transform_apply(
    spec: *const c_char,
    rgb: *const u8,
    width: usize,
    height: usize,
    seed: u64,
    epoch: u64,
    index: u64,
    out: *mut u8,
    out_len: usize,
    params: *mut c_char,
    params_len: usize,
    params_needed: *mut usize,
) -> stoker_status {
    ffi_boundary!(stoker_transform_apply => {
        let spec = try_str!(spec);
        non_null!(rgb, out);
        let Some(in_len) = width.checked_mul(height).and_then(|n| n.checked_mul(3)) else {
            return crate::ffi::invalid_argument(FFI_FN, format_args!("{width}x{height} overflows"));
        };
        let pipeline = match Pipeline::new(Some(spec), Some(DType::U8), Layout::Nhwc) {
            Ok(p) => p,
            Err(reason) => {
                set_message(format!("{FFI_FN}: option `transform`: {reason}"));
                return stoker_status::STOKER_ERR_INVALID_ARGUMENT;
            }
        };
        if out_len != pipeline.output_bytes() {
            return crate::ffi::invalid_argument(
                FFI_FN,
                format_args!("out_len is {out_len}; the transform writes {} bytes", pipeline.output_bytes()),
            );
        }
        // SAFETY: non-NULL (checked above); by the C contract `rgb` holds `width * height * 3`
        // bytes and `out` is writable for `out_len` bytes, and they do not overlap.
        let (rgb, out) = unsafe {
            (std::slice::from_raw_parts(rgb, in_len), std::slice::from_raw_parts_mut(out, out_len))
        };
        let mut rng = Rng::for_key(seed, Stream::Augment, epoch, index);
        let mut trace = Vec::new();
        let mut scratch = Scratch::default();
        if let Err(reason) =
            pipeline.apply_traced(rgb, width, height, &mut rng, out, &mut scratch, Some(&mut trace))
        {
            set_message(format!("{FFI_FN}: {reason}"));
            return stoker_status::STOKER_ERR_INVALID_ARGUMENT;
        }
        let text = trace.join("\n");
        if !params_needed.is_null() {
            // SAFETY: non-NULL; by the C contract an out-pointer is writable.
            unsafe { params_needed.write(text.len()) };
        }
        if !params.is_null() && params_len > 0 {
            let n = text.len().min(params_len - 1);
            // SAFETY: non-NULL and, by the C contract, writable for `params_len` bytes;
            // `n + 1 <= params_len`.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), params.cast::<u8>(), n);
                params.add(n).write(0);
            }
        }
        stoker_status::STOKER_OK
    })
}
