//! Generates the C++ side of the bridge and compiles it into this crate's archive. The headers
//! land in `$CARGO_TARGET_DIR/cxxbridge/stoker-cxx/src/lib.rs.h` and `.../cxxbridge/rust/cxx.h`.

fn main() {
    cxx_build::bridge("src/lib.rs")
        .std("c++17")
        .compile("stoker-cxx-bridge");
    println!("cargo:rerun-if-changed=src/lib.rs");
}
