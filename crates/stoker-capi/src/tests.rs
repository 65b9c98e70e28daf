//! Rust-side tests of the boundary; the C suite under `ctests/` tests the ABI as C uses it.
