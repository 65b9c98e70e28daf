//! Versions: the ABI version (bumped only on an incompatible change) and the release version.

use std::ffi::c_char;

/// `STOKER_ABI_VERSION` of this build; the header's macro (cbindgen.toml `after_includes`) must
/// match it, which a test checks.
pub(crate) const ABI_VERSION: u32 = 1;

/// The release version, NUL-terminated, from Cargo.toml.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// The ABI version of the loaded library: equals `STOKER_ABI_VERSION` of the header it was
/// built with. Compare the two when loading the library at run time.
#[no_mangle]
pub extern "C" fn stoker_abi_version() -> u32 {
    ffi_boundary!(stoker_abi_version => { ABI_VERSION })
}

/// The library's version, "MAJOR.MINOR.PATCH", in static storage.
#[no_mangle]
pub extern "C" fn stoker_version() -> *const c_char {
    ffi_boundary!(stoker_version => { VERSION.as_ptr().cast::<c_char>() })
}
