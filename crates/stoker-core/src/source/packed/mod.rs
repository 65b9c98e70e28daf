//! stoker's packed format: pre-processed samples in page-aligned files with a per-sample
//! metadata table, read through one memory map per shard (see `docs/packed-format.md`).
//!
//! `format` is the bytes (header, schema, table entries, checksum), `file` one file's checks
//! ([`Layout`]) and its mapping ([`PackedFile`]), `read` the mapped [`PackedSource`], `index`
//! the dataset index that joins shards into one dataset and the resolution of `packed:PATH`.
//! Files are written by [`crate::pack`].

pub mod file;
pub mod format;
pub mod index;
pub mod read;

pub use file::{Layout, PackedFile};
pub use format::{ImageMode, PackedField, PackedKind};
pub use index::{IndexEntry, INDEX_NAME};
pub use read::PackedSource;
