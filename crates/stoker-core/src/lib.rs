//! The stoker data-loading engine.
//!
//! Data flows one way through these modules:
//!
//! `sampler` (which indices) → `source` (bytes or views of sample i) → `decode` (JPEG/PNG to
//! RGB8) → `transform` (fused crop/resize/flip/normalize) → `collate` (each sample written
//! straight into its slot of the batch buffer) inside the `pool` (worker threads, bounded
//! in-flight, ordering) on memory from the `arena` (recycled, page-aligned, optionally page-locked
//! slabs) → optional `cuda` prefetch (a thread copying finished batches to
//! device memory) → `loader` (the public iterator, epochs, resumable state), with `stats` threaded through.
//!
//! Everything a user can cause returns an [`Error`] that names the key, file or index involved.

#![warn(missing_docs)]

pub mod arena;
pub mod autotune;
pub mod batch;
pub mod close;
pub mod collate;
pub mod cuda;
pub mod decode;
pub mod dtype;
pub mod error;
pub mod fork;
pub mod hash;
pub mod launch;
pub mod loader;
pub mod memory;
pub mod options;
pub mod pack;
pub mod pool;
pub mod resume;
pub mod rng;
pub mod sampler;
pub mod source;
mod span;
pub mod stats;
#[cfg(feature = "testing")]
pub mod testing;
pub mod trace;
pub mod transform;

pub use arena::{Arena, SlabRegistrar};
pub use batch::{Batch, DeviceType, FieldMeta, FieldRef};
pub use close::Closer;
pub use collate::DEVICE_DECODE_SCRATCH;
pub use cuda::{DeviceBackend, Event, Stream};
pub use dtype::{DType, Layout};
pub use error::{catch_panic, panic_message, Error, ErrorKind, Result};
pub use launch::{GlobalBatches, Launch, Launcher, RankShare};
pub use loader::{EpochIter, Loader};
pub use options::{Device, LoaderOptions, OnError, Order};
pub use resume::ResumeState;
pub use sampler::{BatchPlan, Sampler, SamplerKind};
pub use source::{
    FieldKind, FieldSpec, ImageFolderSource, IterableSource, MemorySource, NpySource, Sample,
    SampleStream, SampleWriter, Source, SourceSpec, StreamInfo, TarSource, TarStream,
};
pub use stats::{Stage, Stats, StatsHandle};
pub use transform::Pipeline;
