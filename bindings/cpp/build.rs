//! Generates the C++ side of the bridge and compiles it, with the custom-source glue, into this
//! crate's archive. The headers land in `$CARGO_TARGET_DIR/cxxbridge/stoker-cxx/src/lib.rs.h`
//! and `$CARGO_TARGET_DIR/cxxbridge/rust/cxx.h`.

fn main() {
    cxx_build::bridge("src/lib.rs")
        .file("src/source_bridge.cc")
        .include("include")
        .std("c++17")
        .compile("stoker-cxx-bridge");
    for path in [
        "src/lib.rs",
        "src/source_bridge.cc",
        "include/stoker/stoker.hpp",
        "include/stoker/source_bridge.hpp",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
}
