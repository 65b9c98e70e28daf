//! `tar:PATTERN`: WebDataset tar shards.
//!
//! A WebDataset dataset is a list of plain tar files (shards). Each sample is a run of
//! consecutive members sharing a key, one member per field: `000123.jpg` + `000123.cls`. The rules
//! followed here are WebDataset's own (`webdataset.tariterators`), so shards written by
//! `webdataset.TarWriter`, by GNU `tar` or by any other tar writer read the same:
//!
//! - shard patterns (`train-{000000..000146}.tar`, globs, comma lists, URLs, WebDataset `wids`
//!   shard indexes) are every source's, in [`crate::source::shards`]; remote URLs are downloaded
//!   into a local cache ([`crate::source::remote`]) and read from there like local shards;
//! - [`scan`]: members and the grouping rule, over a memory-mapped shard, without copying data;
//! - [`fields`]: which members become which fields (`fields=EXT:NAME,...`), and their kinds;
//! - [`index`]: the per-shard index, cached on disk beside the shard or in a cache directory;
//! - [`TarSource`]: indexed mode, a map-style [`Source`](crate::source::Source) over every
//!   sample of every shard, each shard mapped once and read without copies;
//! - [`ShardReader`]: streaming mode's sequential reader of one shard (also `.tar.gz`);
//! - [`TarStream`]: streaming mode, each rank's share of each epoch's shuffled shards, with the
//!   equal-batches rule (see `epoch`).
//!
//! Tar parsing is the `tar` crate's (ustar, GNU long names, pax headers, header checksums);
//! gzip is `flate2`'s; globs are the `glob` crate's. What is written here is WebDataset's
//! grouping rule, the index format, and the checks that turn a bad shard into an error naming
//! the shard, the member and the byte offset.
//!
//! `.tar.gz` shards are only read in streaming mode: random access into a gzip stream would mean
//! decompressing from the start for every sample, so indexed mode refuses them with an error
//! saying to stream them (`shuffle_buffer=N`) or to decompress them.

mod epoch;
pub mod fields;
pub mod index;
mod indexed;
pub mod scan;
pub mod stream;

use std::path::PathBuf;

pub use epoch::TarStream;
pub use fields::{parse_fields, TarFields, INT_EXTENSIONS};
pub use index::IndexOrigin;
pub use indexed::TarSource;
pub use scan::{scan_members, split_key, ScannedMember, ScannedSample, MAX_MEMBERS_PER_SAMPLE};
pub use stream::{read_samples, ReadOptions, ShardReader, StreamMember, StreamSample};

/// Default bound on one member's size (1 GiB).
pub const DEFAULT_MAX_MEMBER_BYTES: u64 = 1 << 30;

/// How tar shards are read.
#[derive(Clone, Debug, PartialEq)]
pub struct TarConfig {
    /// `fields=EXT:NAME,...` as parsed by [`parse_fields`]: (extensions separated by `;`, field
    /// name). `None`: `image` (jpg/jpeg/png) and `label` (cls/label).
    pub fields: Option<Vec<(String, String)>>,
    /// Allow `npy` fields whose leading dimension varies (they become ragged fields); like the
    /// loader's `pad` (or `ragged=offsets`) for callback sources.
    pub pad: bool,
    /// The cache directory for index files when a shard's directory is not writable. `None`:
    /// `$XDG_CACHE_HOME/stoker/tar-index`, else `~/.cache/stoker/tar-index`.
    pub index_dir: Option<PathBuf>,
    /// Keep index files beside the shards (as `.NAME.idx`) when the directory is writable.
    pub index_beside: bool,
    /// The largest member accepted (indexed mode: larger is a per-sample error; streaming: an
    /// error before anything is allocated). At most `u32::MAX - 1` in indexed mode.
    pub max_member_bytes: u64,
    /// A damaged shard (truncated, a bad header, a member cut short, a name that is not UTF-8)
    /// keeps the samples before the damage instead of failing the source (`on_error=skip`);
    /// [`TarSource::damaged`] says which and why.
    pub skip_damaged: bool,
    /// Remote shards (URLs): prefetch depth and cache (see [`crate::source::remote`]).
    pub remote: crate::source::remote::RemoteConfig,
}

impl Default for TarConfig {
    fn default() -> Self {
        TarConfig {
            fields: None,
            pad: false,
            index_dir: None,
            index_beside: true,
            max_member_bytes: DEFAULT_MAX_MEMBER_BYTES,
            skip_damaged: false,
            remote: crate::source::remote::RemoteConfig::default(),
        }
    }
}
