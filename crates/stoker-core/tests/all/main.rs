//! The integration tests of stoker-core, as one test binary: each file is a module (named as
//! its file), `support` holds the shared helpers. One binary links the engine once instead of
//! once per file. Three modules measure or fork the whole process, which tests running beside
//! them would disturb: `soak` (resident memory, threads, file descriptors), `autotune` (the
//! controller adds workers only while the process leaves a core spare) and `fork` (a fork copies
//! whatever the other tests' threads hold). Their tests are ignored by a plain `cargo test`; the
//! test command runs each module in a process of its own with `--ignored MODULE::`.

mod support;

mod autotune;
mod box_format;
mod coco_source;
mod cuda_gpu;
mod cuda_prefetch;
mod dense;
mod dense_sources;
mod distributed;
mod faults;
mod fork;
mod fuzz_regressions;
mod gpu_decode;
mod gpu_normalize;
mod image_loader;
mod iterable;
mod loader;
mod memory_budget;
mod packed;
#[cfg(feature = "parquet")]
mod parquet_table;
mod remote_servers;
mod soak;
mod split_batches;
mod stage_stats;
mod tar_loader;
mod tar_remote;
mod tar_source;
mod tensor_images;
mod token_index;
mod token_lengths;
#[cfg(feature = "tokenizers")]
mod token_parquet;
mod tokens;
mod trace;
