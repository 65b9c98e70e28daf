//! Errors as data: core errors become `stoker_status` here (through `stoker_status::of`), and the message of the
//! last failed call on each thread waits in a thread-local for `stoker_last_error`.

use std::cell::RefCell;
use std::ffi::c_char;

use stoker_core::Error;

use crate::types::stoker_status;

thread_local! {
    /// Message of the last failed call on this thread; empty when there has been none.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Records a core error as this thread's last error and returns its status.
pub fn fail(error: &Error) -> stoker_status {
    set_message(error.to_string());
    stoker_status::of(error.kind())
}

/// Records `message` as this thread's last error.
pub fn set_message(message: String) {
    // `try_with`: during thread teardown the slot may be gone; the message is then dropped.
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = message;
        }
    });
}

/// Message of the last failed call on this thread. Copies at most `len - 1` bytes plus a NUL into
/// `buf` (`buf` may be NULL when `len` is 0) and returns the full message length in bytes, 0 if
/// there is none. A NULL `buf` with a non-zero `len` is treated like `len == 0`.
#[no_mangle]
pub extern "C" fn stoker_last_error(buf: *mut c_char, len: usize) -> usize {
    ffi_boundary!(stoker_last_error => {
        LAST_ERROR
            .try_with(|slot| {
                let Ok(message) = slot.try_borrow() else {
                    return 0;
                };
                if !buf.is_null() && len > 0 {
                    let n = message.len().min(len - 1);
                    // SAFETY: `buf` is non-NULL and, by the C contract, writable for `len` bytes;
                    // `n + 1 <= len`, and a Rust string never overlaps a caller's buffer.
                    unsafe {
                        std::ptr::copy_nonoverlapping(message.as_ptr(), buf.cast::<u8>(), n);
                        buf.add(n).write(0);
                    }
                }
                message.len()
            })
            .unwrap_or(0)
    })
}
