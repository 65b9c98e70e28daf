//! Indexed mode: every sample of every shard, by global index, read from memory maps.
//!
//! Each shard is mapped read-only once and shared by every worker; a field's bytes are a view
//! into the map (labels are parsed into the worker's scratch buffer). Samples are numbered shard
//! by shard, in the order the shards were given and, within a shard, in archive order.
//!
//! Opening indexes every shard in parallel (rayon): an up-to-date index file is read, otherwise
//! the shard is scanned and the index saved (see [`super::index`]). The fields are then learnt
//! from the first sample, and each sample's fields are resolved to (offset, length) slots once,
//! so a read is a lookup.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::fields::{Located, SampleRef, TarFields};
use super::index::{IndexOrigin, IndexPlaces, ShardIndex, Stamp};
use super::scan::{scan_members, ScannedMember, ScannedSample};
use super::stream::readable_prefix;
use super::TarConfig;
use crate::error::{Error, Result};
use crate::source::mapped::{self, Mapping};
use crate::source::{open_file, FieldSpec, Sample, Source, MAX_FIELDS};

/// WebDataset tar shards as a map-style source.
pub struct TarSource {
    shards: Vec<Shard>,
    /// Global index of each shard's first sample, then the total.
    starts: Vec<usize>,
    fields: TarFields,
    max_member_bytes: u64,
    /// Why each damaged shard stops early (with `skip_damaged`).
    damaged: Vec<String>,
    /// Keeps remote shards in the cache while mapped.
    remote: crate::source::remote::ShardHolder,
}

struct Shard {
    path: PathBuf,
    map: Mapping,
    keys: String,
    key_ends: Vec<usize>,
    /// Byte offset of each sample's first header.
    offsets: Vec<u64>,
    /// `fields` slots per sample.
    slots: Vec<Slot>,
    origin: IndexOrigin,
}

/// Where one field of one sample is. 16 bytes: a dataset of millions of samples keeps its
/// index in tens of megabytes.
#[derive(Clone, Copy, Debug)]
struct Slot {
    offset: u64,
    /// `TOO_BIG` when the member is over `max_member_bytes`.
    len: u32,
    /// Which of the field's extensions; `MISSING` if the sample has none.
    alt: u8,
}

const MISSING: u8 = u8::MAX;
const TOO_BIG: u32 = u32::MAX;

impl TarSource {
    /// Indexes `shards` (uncompressed tar files) and learns the fields from the first sample.
    pub fn open(shards: &[PathBuf], config: TarConfig) -> Result<TarSource> {
        if shards.is_empty() {
            return Err(Error::InvalidArgument("tar source: no shard given".into()));
        }
        if config.max_member_bytes == 0 || config.max_member_bytes >= TOO_BIG as u64 {
            return Err(Error::option(
                "max_member_bytes",
                format!(
                    "must be between 1 and {} in indexed mode",
                    TOO_BIG as u64 - 1
                ),
            ));
        }
        let places = IndexPlaces {
            beside: config.index_beside,
            dir: config.index_dir.clone().or_else(IndexPlaces::default_dir),
        };
        let opened: Vec<Result<Opened>> = crate::fork::parallel(|| {
            shards
                .par_iter()
                .map(|path| open_shard(path, &places, &config))
                .collect()
        })?;
        let mut maps = Vec::with_capacity(shards.len());
        let mut damaged = Vec::new();
        for result in opened {
            let (map, index, origin, damage) = result?;
            damaged.extend(damage);
            maps.push((map, index, origin));
        }

        let first = maps
            .iter()
            .zip(shards)
            .find(|((_, index, _), _)| index.len() > 0)
            .ok_or_else(|| {
                Error::format(
                    &shards[0],
                    format!("no sample in any of the {} shard(s)", shards.len()),
                )
            })?;
        let ((map, index, _), path) = first;
        let first_sample = ScannedSample {
            key: index.key(0).to_owned(),
            offset: index.offset(0),
            members: index
                .members(0)
                .iter()
                .map(|m| ScannedMember {
                    ext: index.ext(m.ext).to_owned(),
                    offset: m.offset,
                    size: m.size,
                })
                .collect(),
        };
        let fields =
            TarFields::resolve_scanned(&config, &path.to_string_lossy(), map, &first_sample)?;

        let built: Vec<Shard> = crate::fork::parallel(|| {
            maps.into_par_iter()
                .zip(shards.par_iter())
                .map(|((map, index, origin), path)| {
                    build_shard(path, map, &index, origin, &fields, config.max_member_bytes)
                })
                .collect()
        })?;
        let mut starts = Vec::with_capacity(built.len() + 1);
        let mut total = 0usize;
        for shard in &built {
            starts.push(total);
            total += shard.offsets.len();
        }
        starts.push(total);
        Ok(TarSource {
            shards: built,
            starts,
            fields,
            max_member_bytes: config.max_member_bytes,
            damaged,
            remote: crate::source::remote::ShardHolder::default(),
        })
    }

    /// With `skip_damaged`: why each damaged shard stops early (the samples before the damage
    /// are kept; the rest of the shard cannot be reached).
    pub fn damaged(&self) -> &[String] {
        &self.damaged
    }

    /// Expands `pattern` (see [`crate::source::shards`]) and opens the shards; `file://` URLs are
    /// local paths, remote URLs are downloaded into the cache first (see
    /// [`crate::source::remote`]).
    pub fn open_pattern(pattern: &str, config: TarConfig) -> Result<TarSource> {
        let resolved =
            crate::source::shards::resolve_shards(pattern, &config.remote, config.skip_damaged)?;
        if resolved.paths.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "tar source `{pattern}`: no shard could be fetched: {}",
                resolved.skipped.join("; ")
            )));
        }
        let mut source = TarSource::open(&resolved.paths, config)?;
        source.damaged.extend(resolved.skipped);
        source.remote = resolved.holder;
        Ok(source)
    }

    /// The shards, in sample order.
    pub fn shard_paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// Global index of each shard's first sample, then the number of samples: shard `s` holds
    /// samples `starts[s]..starts[s + 1]`.
    pub fn shard_starts(&self) -> &[usize] {
        &self.starts
    }

    /// Where each shard's index came from (read from a file, or scanned and saved where).
    pub fn index_origins(&self) -> impl Iterator<Item = &IndexOrigin> {
        self.shards.iter().map(|s| &s.origin)
    }

    /// The resolved fields (for a streaming reader of the same shards, say).
    pub fn tar_fields(&self) -> &TarFields {
        &self.fields
    }

    /// The shard and the position in it of sample `index`.
    pub fn locate(&self, index: usize) -> (usize, usize) {
        let shard = self.starts.partition_point(|&s| s <= index) - 1;
        (shard, index - self.starts[shard])
    }

    /// The key of sample `index` (`000123`, `dir/000123`).
    pub fn key(&self, index: usize) -> &str {
        let (s, i) = self.locate(index);
        self.shards[s].key(i)
    }
}

impl Shard {
    fn key(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.key_ends[i - 1] };
        &self.keys[start..self.key_ends[i]]
    }
}

/// A mapped shard, its index, where the index came from, and (with `skip_damaged`) why the
/// shard stops early.
type Opened = (Mapping, ShardIndex, IndexOrigin, Option<String>);

/// Maps a shard and gets its index (from a file or by scanning).
fn open_shard(path: &Path, places: &IndexPlaces, config: &TarConfig) -> Result<Opened> {
    let (file, meta) = open_file(path, "a tar shard")?;
    // Guarded against a truncation while mapped (see `mapped`); its size is checked against the
    // index (stamp), and every member range in the index lies inside the size it was stamped
    // with.
    let map = Mapping::map(&file, path)?;
    if map.starts_with(&[0x1f, 0x8b]) {
        return Err(Error::Unsupported(format!(
            "{}: a gzip-compressed shard cannot be read in indexed mode (random access would decompress it from the start for every sample); set shuffle_buffer=N to stream it, or decompress it (gunzip)",
            path.display()
        )));
    }
    let stamp = Stamp::of(path, &meta);
    if map.len() as u64 != stamp.size {
        return Err(Error::io(path, "the file changed size while being opened"));
    }
    let name = path.to_string_lossy();
    let scanned = places.load_or_build(path, &stamp, || {
        let samples = scan_members(&name, &map)?;
        map.check()?;
        Ok(ShardIndex::from_samples(&samples))
    });
    match scanned {
        Ok((index, origin)) => Ok((map, index, origin, None)),
        Err(damage @ Error::Format { .. }) if config.skip_damaged => {
            // Not saved: a later loader without skip must see the damage again.
            let (samples, _) = readable_prefix(&name, &map[..], config.max_member_bytes);
            let index = ShardIndex::from_samples(&samples);
            let origin = IndexOrigin::Scanned { saved: None };
            Ok((map, index, origin, Some(damage.to_string())))
        }
        Err(e) => Err(e),
    }
}

/// Resolves every sample's fields to slots.
fn build_shard(
    path: &Path,
    map: Mapping,
    index: &ShardIndex,
    origin: IndexOrigin,
    fields: &TarFields,
    max_member_bytes: u64,
) -> Shard {
    let n_fields = fields.specs().len();
    let mut shard = Shard {
        path: path.to_owned(),
        map,
        keys: String::with_capacity(index.len() * 8),
        key_ends: Vec::with_capacity(index.len()),
        offsets: Vec::with_capacity(index.len()),
        slots: Vec::with_capacity(index.len() * n_fields),
        origin,
    };
    for i in 0..index.len() {
        shard.keys.push_str(index.key(i));
        shard.key_ends.push(shard.keys.len());
        shard.offsets.push(index.offset(i));
        let members = index.members(i);
        for f in 0..n_fields {
            let found = fields.locate(f, |ext| members.iter().find(|m| index.ext(m.ext) == ext));
            shard.slots.push(match found {
                // At most MAX_FIELDS alternatives matter; u8 holds any realistic count, and a
                // larger position is treated as missing rather than wrapped.
                Some((alt, m)) if alt < MISSING as usize => Slot {
                    offset: m.offset,
                    len: if m.size > max_member_bytes {
                        TOO_BIG
                    } else {
                        m.size as u32
                    },
                    alt: alt as u8,
                },
                _ => Slot {
                    offset: 0,
                    len: 0,
                    alt: MISSING,
                },
            });
        }
    }
    shard
}

impl Source for TarSource {
    fn verify(&self) -> Result<()> {
        if !mapped::any_truncated() {
            return Ok(());
        }
        self.shards.iter().try_for_each(|shard| shard.map.check())
    }

    fn len(&self) -> usize {
        self.starts[self.starts.len() - 1]
    }

    fn fields(&self) -> &[FieldSpec] {
        self.fields.specs()
    }

    fn describe(&self, index: usize) -> String {
        let (s, i) = self.locate(index);
        let shard = &self.shards[s];
        format!(
            "shard {} sample {} (offset {})",
            shard.path.display(),
            shard.key(i),
            shard.offsets[i]
        )
    }

    fn read<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let (s, i) = self.locate(index);
        let shard = &self.shards[s];
        let n = self.fields.specs().len();
        let mut located: [Option<Located<'a>>; MAX_FIELDS] = [None; MAX_FIELDS];
        for (f, slot) in shard.slots[i * n..(i + 1) * n].iter().enumerate() {
            if slot.alt == MISSING {
                continue;
            }
            let too_big = slot.len == TOO_BIG;
            let bytes: &'a [u8] = if too_big {
                &[]
            } else {
                // In range: every member of the index lies inside the mapped size (checked when
                // scanned or when the index file was read).
                let start = slot.offset as usize;
                &shard.map[start..start + slot.len as usize]
            };
            located[f] = Some(Located {
                alt: slot.alt as usize,
                bytes,
                offset: slot.offset,
                too_big,
            });
        }
        let what = || self.describe(index);
        let sample = SampleRef {
            index: index as u64,
            what: &what,
            key: shard.key(i),
            max_member_bytes: self.max_member_bytes,
        };
        self.fields.assemble(&located[..n], &sample, scratch)
    }
}
