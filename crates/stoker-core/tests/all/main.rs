//! The integration tests of stoker-core, as one test binary: each file is a module (named as
//! its file), `support` holds the shared helpers. One binary links the engine once instead of
//! once per file. `tests/soak.rs` stays a binary of its own: it measures the whole process
//! (resident memory, threads, file descriptors), which tests running beside it would disturb;
//! so do `tests/autotune.rs` (the controller adds workers only while a core is spare) and
//! `tests/fork.rs` (a fork copies whatever the other tests' threads hold).

mod support;

mod box_format;
mod cuda_gpu;
mod cuda_prefetch;
mod dense;
mod distributed;
mod faults;
mod fuzz_regressions;
mod image_loader;
mod iterable;
mod loader;
mod memory_budget;
mod packed;
mod remote_servers;
mod split_batches;
mod stage_stats;
mod tar_loader;
mod tar_remote;
mod tar_source;
mod tensor_images;
mod token_index;
mod token_lengths;
mod tokens;
mod trace;
