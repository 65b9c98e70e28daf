//! Link settings of the C library.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // `cfg(stoker_dlpack_external)` is never set when compiling: it exists so that cbindgen wraps
    // the DLPack definitions in `#if !defined(DLPACK_DLPACK_H_)` (see cbindgen.toml [defines]).
    println!("cargo::rustc-check-cfg=cfg(stoker_dlpack_external)");
    // A versioned SONAME: programs linked against libstoker.so record `libstoker.so.0` and keep
    // loading any compatible release installed under that name.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo::rustc-cdylib-link-arg=-Wl,-soname,libstoker.so.0");
    }
}
