//! The boundary. Every export wraps its body in `ffi_boundary!`; every raw pointer it receives
//! becomes a reference, a box or a string through the macros and functions here, after a
//! one-line NULL check. The `unsafe` of the exports lives in this module (plus the DLPack
//! deleter and the byte copies of `stoker_last_error` / `stoker_loader_stats`).
//!
//! Handles are `Box`es owned by C: `*_new` gives C the box ([`into_raw`]), `*_free` takes it back
//! ([`free_raw`]). Shared ownership (a batch and its DLPack exports) is an `Arc` inside the box.

use std::ffi::{c_char, CStr};

use crate::error::set_message;
use crate::types::stoker_status;

/// What an export returns when an argument is invalid, or when it panicked.
pub trait FfiReturn {
    /// For a NULL or otherwise unusable argument.
    fn invalid() -> Self;
    /// For a caught panic.
    fn internal() -> Self;
}

impl FfiReturn for stoker_status {
    fn invalid() -> Self {
        stoker_status::STOKER_ERR_INVALID_ARGUMENT
    }
    fn internal() -> Self {
        stoker_status::STOKER_ERR_INTERNAL
    }
}

impl<T> FfiReturn for *mut T {
    fn invalid() -> Self {
        std::ptr::null_mut()
    }
    fn internal() -> Self {
        std::ptr::null_mut()
    }
}

impl<T> FfiReturn for *const T {
    fn invalid() -> Self {
        std::ptr::null()
    }
    fn internal() -> Self {
        std::ptr::null()
    }
}

/// Counts and sizes: 0.
impl FfiReturn for usize {
    fn invalid() -> Self {
        0
    }
    fn internal() -> Self {
        0
    }
}

impl FfiReturn for u64 {
    fn invalid() -> Self {
        0
    }
    fn internal() -> Self {
        0
    }
}

impl FfiReturn for u32 {
    fn invalid() -> Self {
        0
    }
    fn internal() -> Self {
        0
    }
}

/// `stoker_loader_batches_per_epoch`: -1, "unknown".
impl FfiReturn for i64 {
    fn invalid() -> Self {
        -1
    }
    fn internal() -> Self {
        -1
    }
}

impl FfiReturn for () {
    fn invalid() -> Self {}
    fn internal() -> Self {}
}

/// Runs an export's body; a panic becomes `R::internal()` and the last error names the function
/// and the panic message. Use it through `ffi_boundary!`.
pub fn boundary<R: FfiReturn>(function: &str, body: impl FnOnce() -> R) -> R {
    stoker_core::catch_panic(body).unwrap_or_else(|e| {
        set_message(format!("{function}: {e}"));
        R::internal()
    })
}

/// The failure value for a NULL argument, with its message.
pub fn null_argument<R: FfiReturn>(function: &str, argument: &str) -> R {
    set_message(format!("{function}: argument `{argument}` is NULL"));
    R::invalid()
}

/// The failure value for an argument that is not NULL but unusable, with its message.
pub fn invalid_argument<R: FfiReturn>(function: &str, message: impl std::fmt::Display) -> R {
    set_message(format!("{function}: {message}"));
    R::invalid()
}

/// Wraps an export's body: `ffi_boundary!(stoker_x => { ... })`. Inside, `FFI_FN` names the
/// export for messages (the NULL-check macros use it), and `return` leaves the export.
macro_rules! ffi_boundary {
    ($name:ident => $body:block) => {{
        #[allow(dead_code)]
        const FFI_FN: &str = stringify!($name);
        $crate::ffi::boundary(FFI_FN, move || $body)
    }};
}

/// `non_null!(p)`: returns the invalid-argument value from the export if `p` is NULL.
macro_rules! non_null {
    ($($p:ident),+) => {
        $(if $p.is_null() {
            return $crate::ffi::null_argument(FFI_FN, stringify!($p));
        })+
    };
}

/// `clear_out!(out)`: checks an out-pointer to a pointer and sets `*out = NULL`, so that every
/// failure path leaves NULL there.
macro_rules! clear_out {
    ($out:ident) => {
        non_null!($out);
        // SAFETY: non-NULL (checked above); by the C contract an out-pointer is writable.
        unsafe { $out.write(std::ptr::null_mut()) };
    };
}

/// `let h = try_ref!(h);`: a shared reference to a handle, or the NULL-argument failure.
macro_rules! try_ref {
    ($p:ident) => {{
        non_null!($p);
        // SAFETY: non-NULL (checked above). By the C contract a non-NULL handle came from its
        // `*_new` (or `stoker_loader_next`) and has not been freed.
        unsafe { $crate::ffi::as_ref($p) }
    }};
}

/// `let h = try_mut!(h);`: an exclusive reference to a handle, or the NULL-argument failure.
macro_rules! try_mut {
    ($p:ident) => {{
        non_null!($p);
        // SAFETY: non-NULL (checked above). By the C contract a non-NULL handle came from its
        // `*_new` and has not been freed, and one thread at a time uses it mutably.
        unsafe { $crate::ffi::as_mut($p) }
    }};
}

/// `let s = try_str!(key);`: a C string as UTF-8, or the invalid-argument failure (NULL or not
/// UTF-8).
macro_rules! try_str {
    ($p:ident) => {{
        non_null!($p);
        // SAFETY: non-NULL (checked above); by the C contract it is a NUL-terminated string that
        // outlives this call.
        match unsafe { $crate::ffi::as_str($p) } {
            Ok(s) => s,
            Err(_) => {
                return $crate::ffi::invalid_argument(
                    FFI_FN,
                    format_args!("argument `{}` is not valid UTF-8", stringify!($p)),
                )
            }
        }
    }};
}

/// Gives a value to C as an owned handle.
pub fn into_raw<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Takes back and drops a handle from [`into_raw`]; NULL is a no-op.
///
/// # Safety
/// `p` is NULL or came from [`into_raw`] with the same `T` and has not been freed.
pub unsafe fn free_raw<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: per this function's contract, `p` is a live box from `into_raw`.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// # Safety
/// `p` is non-NULL, aligned and points to a live `T` not mutated for `'a`.
pub unsafe fn as_ref<'a, T>(p: *const T) -> &'a T {
    // SAFETY: per this function's contract.
    unsafe { &*p }
}

/// # Safety
/// `p` is non-NULL, aligned and points to a live `T` not otherwise referenced for `'a`.
pub unsafe fn as_mut<'a, T>(p: *mut T) -> &'a mut T {
    // SAFETY: per this function's contract.
    unsafe { &mut *p }
}

/// # Safety
/// `p` is a non-NULL, NUL-terminated string that lives and is unchanged for `'a`.
pub unsafe fn as_str<'a>(p: *const c_char) -> Result<&'a str, std::str::Utf8Error> {
    // SAFETY: per this function's contract.
    unsafe { CStr::from_ptr(p) }.to_str()
}
