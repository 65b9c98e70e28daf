//! Streaming mode (`shuffle_buffer=N`): each epoch, this rank's part of the shards, read front
//! to back.
//!
//! The rule, the same on every rank, is a pure function of `(seed, epoch)`:
//!
//! 1. The shards are shuffled (a permutation of `(seed, epoch)`) and laid end to end: one
//!    sequence of all `N` samples.
//! 2. Each rank takes `P = ceil(N / world_size)` samples (`floor` with `shard_drop_last=true`;
//!    [`RankShare::per_rank`]), rank `r` the contiguous run at positions `r·P .. (r+1)·P` of
//!    that sequence; positions past `N` wrap around to its start, as `DistributedSampler` pads
//!    by repeating the head. So every rank delivers exactly the same number of samples (and
//!    batches) whatever the shard sizes, and across the ranks every sample is read once per
//!    epoch, plus the padding.
//! 3. A run is read shard by shard, sequentially: it starts in the middle of at most one shard
//!    (found through the shard's index: a seek, for an uncompressed shard) and ends in the middle
//!    of at most one.
//!
//! Splitting at sample boundaries instead of giving each rank whole shards is what makes the
//! counts equal: with whole shards, ranks holding larger shards would have more batches and a
//! distributed job would hang at the end of every epoch.
//!
//! The per-shard sample counts and sample offsets come from the same index files as indexed
//! mode (see [`super::index`]), scanned once and cached; a gzip-compressed shard, which has no
//! random access, is counted by one decompressing pass when the source opens (not cached) and
//! read from its start, skipping the samples before the run.
//!
//! A shard that breaks off while being read (changed or removed since it was indexed) gives one
//! failed sample naming it, and the rest of its run is made up from the samples after this
//! rank's run, so the count stays equal.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use rayon::prelude::*;

use super::fields::TarFields;
use super::index::{IndexPlaces, ShardIndex, Stamp};
use super::scan::{next_header, scan_members, ScannedSample};
use super::stream::{read_samples, readable_prefix, ReadOptions, ShardReader, StreamSample};
use super::TarConfig;
use crate::error::{Error, Result};
use crate::launch::RankShare;
use crate::rng::{Rng, Stream};
use crate::source::mapped::Mapping;
use crate::source::remote::ShardFeed;
use crate::source::streaming::OwnedSample;
use crate::source::streaming::{EpochStream, FailedSample, StreamSource};
use crate::source::{open_file, FieldSpec, Sample};

/// WebDataset tar shards read as one stream per rank and epoch (see the module docs).
pub struct TarStream {
    shared: Arc<Shared>,
    share: RankShare,
    /// The loader's seed, from which each epoch's shard order derives.
    seed: u64,
    per_rank: usize,
    pattern: String,
}

struct Shared {
    shards: Vec<ShardEntry>,
    total: usize,
    fields: Arc<TarFields>,
    read: ReadOptions,
    damaged: Vec<String>,
    /// Keeps remote shards in the cache while any epoch's stream reads them.
    remote: crate::source::remote::ShardHolder,
    /// Remote shards not downloaded when the source opened (counts from a `wids` index): shard
    /// `i` of the table is shard `i` of the feed.
    feed: Option<ShardFeed>,
}

struct ShardEntry {
    /// The local file, or (read through the feed) the URL as shown.
    path: PathBuf,
    count: usize,
    /// Byte offset where each sample's headers start (uncompressed local shards; empty for
    /// gzip and for shards read through the feed).
    starts: Vec<u64>,
}

impl ShardEntry {
    /// Read from its start, passing over the samples before a run (no offsets to seek to).
    fn sequential(&self) -> bool {
        self.starts.is_empty()
    }
}

/// A run of consecutive samples of one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    shard: usize,
    first: usize,
    count: usize,
    /// Position of the first in the epoch's (padded) sequence.
    position: u64,
}

/// Sample failures per epoch after which a rank stops making up for them (every shard broken).
const MAX_MAKE_UPS: usize = 64;

impl TarStream {
    /// Expands `pattern`, indexes (or counts) every shard and learns the fields from the first
    /// sample. `file://` URLs are local paths; remote URLs are downloaded into the cache first
    /// (see [`crate::source::remote`]), unless a `wids` index gives every remote shard's count:
    /// then the source opens at once and reads each shard while it downloads.
    pub fn open_pattern(
        pattern: &str,
        config: TarConfig,
        share: RankShare,
        seed: u64,
    ) -> Result<TarStream> {
        let (names, counts) = crate::source::shards::shard_names(pattern, &config.remote)?;
        if let Some(counts) = counts {
            if let Some(feed) = crate::source::remote::open_feed(&names, &config.remote)? {
                return TarStream::open_feed(feed, counts, config, share, seed, pattern);
            }
        }
        let resolved = crate::source::remote::resolve(names, &config.remote, config.skip_damaged)?;
        if resolved.paths.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "tar source `{pattern}`: no shard could be fetched: {}",
                resolved.skipped.join("; ")
            )));
        }
        let mut stream = TarStream::open(&resolved.paths, config, share, seed, pattern)?;
        let shared = Arc::get_mut(&mut stream.shared)
            .ok_or_else(|| Error::Internal("a new tar stream's state is shared".into()))?;
        shared.damaged.extend(resolved.skipped);
        shared.remote = resolved.holder;
        Ok(stream)
    }

    /// Opens `shards` (plain or gzip-compressed tar).
    pub fn open(
        shards: &[PathBuf],
        config: TarConfig,
        share: RankShare,
        seed: u64,
        name: &str,
    ) -> Result<TarStream> {
        if shards.is_empty() {
            return Err(Error::InvalidArgument("tar source: no shard given".into()));
        }
        share.check("rank")?;
        let places = IndexPlaces {
            beside: config.index_beside,
            dir: config.index_dir.clone().or_else(IndexPlaces::default_dir),
        };
        let entries: Vec<Result<(ShardEntry, Option<String>)>> = crate::fork::parallel(|| {
            shards
                .par_iter()
                .map(|path| shard_entry(path, &places, &config))
                .collect()
        })?;
        let mut table = Vec::with_capacity(entries.len());
        let mut damaged = Vec::new();
        for entry in entries {
            let (entry, damage) = entry?;
            damaged.extend(damage);
            table.push(entry);
        }
        let total: usize = table.iter().map(|s| s.count).sum();
        let first = table.iter().find(|s| s.count > 0).ok_or_else(|| {
            Error::format(
                &shards[0],
                format!("no sample in any of the {} shard(s)", shards.len()),
            )
        })?;
        let fields = learn_fields(&first.path, &config)?;
        let read = ReadOptions::new(&config, Some(&fields));
        let per_rank = share.per_rank(total);
        Ok(TarStream {
            shared: Arc::new(Shared {
                shards: table,
                total,
                fields: Arc::new(fields),
                read,
                damaged,
                remote: crate::source::remote::ShardHolder::default(),
                feed: None,
            }),
            share,
            seed,
            per_rank,
            pattern: name.to_owned(),
        })
    }

    /// Opens remote shards with known counts without downloading them: the fields come from
    /// the first sample of this rank's first shard of epoch 0, read as it downloads.
    fn open_feed(
        feed: ShardFeed,
        counts: Vec<usize>,
        config: TarConfig,
        share: RankShare,
        seed: u64,
        name: &str,
    ) -> Result<TarStream> {
        share.check("rank")?;
        let table: Vec<ShardEntry> = counts
            .iter()
            .enumerate()
            .map(|(i, &count)| ShardEntry {
                path: PathBuf::from(feed.shown(i)),
                count,
                starts: Vec::new(),
            })
            .collect();
        let total: usize = table.iter().map(|s| s.count).sum();
        if total == 0 {
            return Err(Error::InvalidArgument(format!(
                "tar source `{name}`: its shard index lists no sample"
            )));
        }
        let per_rank = share.per_rank(total);
        let plan = EpochPlan::new(&table, seed, 0);
        let runs = plan.cover(share.run_start(per_rank), per_rank.max(1) as u64);
        let first = runs.first().map_or(0, |s| s.shard);
        feed.upcoming(runs.iter().map(|s| s.shard));
        let stop = Arc::new(AtomicBool::new(false));
        let mut reader = ShardReader::from_waiting_reader(
            feed.shown(first),
            feed.reader(first, Arc::clone(&stop)),
            ReadOptions::new(&config, None),
            stop,
        )?;
        let sample = reader.next_sample()?.ok_or_else(|| {
            Error::format(
                feed.shown(first),
                "the shard index lists samples but the shard has none",
            )
        })?;
        drop(reader);
        let fields = TarFields::resolve_streamed(&config, &sample)?;
        Ok(TarStream {
            shared: Arc::new(Shared {
                shards: table,
                total,
                read: ReadOptions::new(&config, Some(&fields)),
                fields: Arc::new(fields),
                damaged: Vec::new(),
                remote: crate::source::remote::ShardHolder::default(),
                feed: Some(feed),
            }),
            share,
            seed,
            per_rank,
            pattern: name.to_owned(),
        })
    }

    /// Samples in all shards.
    pub fn total_samples(&self) -> usize {
        self.shared.total
    }

    /// Samples in each shard, in the order given.
    pub fn shard_counts(&self) -> Vec<usize> {
        self.shared.shards.iter().map(|s| s.count).collect()
    }

    /// With `skip_damaged`: why each damaged shard stops early.
    pub fn damaged(&self) -> &[String] {
        &self.shared.damaged
    }

    /// The resolved fields.
    pub fn tar_fields(&self) -> &TarFields {
        &self.shared.fields
    }

    /// The runs this rank reads in `epoch`: (shard index, first sample, count), in order.
    pub fn epoch_runs(&self, epoch: u64) -> Vec<(usize, usize, usize)> {
        let plan = EpochPlan::new(&self.shared.shards, self.seed, epoch);
        let from = self.share.run_start(self.per_rank);
        plan.cover(from, self.per_rank as u64)
            .into_iter()
            .map(|s| (s.shard, s.first, s.count))
            .collect()
    }
}

/// Indexes (or, for gzip, counts) one shard.
fn shard_entry(
    path: &Path,
    places: &IndexPlaces,
    config: &TarConfig,
) -> Result<(ShardEntry, Option<String>)> {
    let (file, meta) = open_file(path, "a tar shard")?;
    let name = path.to_string_lossy();
    let mut head = [0u8; 2];
    let gzip = {
        let mut probe = &file;
        let n = probe.read(&mut head).map_err(|e| Error::os(path, e))?;
        n == 2 && head == [0x1f, 0x8b]
    };
    if gzip {
        // Counted, not indexed: there is no random access to seek with.
        let reader = File::open(path).map_err(|e| Error::os(path, e))?;
        let options = ReadOptions {
            max_member_bytes: config.max_member_bytes,
            wanted: Some(Vec::new()),
        };
        let mut count = 0usize;
        let outcome = read_samples(&name, BufReader::new(reader), &options, |_| {
            count += 1;
            true
        });
        let damage = match outcome {
            Ok(()) => None,
            Err(e @ Error::Format { .. }) if config.skip_damaged => Some(e.to_string()),
            Err(e) => return Err(e),
        };
        let entry = ShardEntry {
            path: path.to_owned(),
            count,
            starts: Vec::new(),
        };
        return Ok((entry, damage));
    }
    // Guarded against a truncation while mapped (see `mapped`): a scan that read past a
    // truncation fails before its index is kept.
    let map = Mapping::map(&file, path)?;
    let stamp = Stamp::of(path, &meta);
    if map.len() as u64 != stamp.size {
        return Err(Error::io(path, "the file changed size while being opened"));
    }
    let scanned = places.load_or_build(path, &stamp, || {
        let samples = scan_members(&name, &map)?;
        map.check()?;
        Ok(ShardIndex::from_samples(&samples))
    });
    let (starts, damage) = match scanned {
        Ok((index, _)) => (sample_starts_of_index(&index), None),
        Err(e @ Error::Format { .. }) if config.skip_damaged => {
            let (samples, _) = readable_prefix(&name, &map[..], config.max_member_bytes);
            (sample_starts(&samples), Some(e.to_string()))
        }
        Err(e) => return Err(e),
    };
    let entry = ShardEntry {
        path: path.to_owned(),
        count: starts.len(),
        starts,
    };
    Ok((entry, damage))
}

/// Where each sample's headers start: right after the previous sample's last member (its
/// extension headers, a GNU long name or pax record, come before its first member's header).
fn sample_starts_of_index(index: &ShardIndex) -> Vec<u64> {
    let mut starts = Vec::with_capacity(index.len());
    let mut at = 0u64;
    for i in 0..index.len() {
        starts.push(at);
        let end = index
            .members(i)
            .iter()
            .map(|m| m.offset.saturating_add(m.size))
            .max()
            .unwrap_or(at);
        at = next_header(end).unwrap_or(u64::MAX);
    }
    starts
}

fn sample_starts(samples: &[ScannedSample]) -> Vec<u64> {
    let mut starts = Vec::with_capacity(samples.len());
    let mut at = 0u64;
    for s in samples {
        starts.push(at);
        let end = s
            .members
            .iter()
            .map(|m| m.offset.saturating_add(m.size))
            .max()
            .unwrap_or(at);
        at = next_header(end).unwrap_or(u64::MAX);
    }
    starts
}

/// The fields, from the first sample of `path` with every member kept.
fn learn_fields(path: &Path, config: &TarConfig) -> Result<TarFields> {
    let options = ReadOptions::new(config, None);
    let mut reader = ShardReader::open(path, options)?;
    let first = reader.next_sample()?.ok_or_else(|| {
        Error::format(
            path,
            "the shard's index lists samples but none could be read",
        )
    })?;
    TarFields::resolve_streamed(config, &first)
}

/// One epoch's order of the shards, laid end to end.
struct EpochPlan {
    order: Vec<usize>,
    /// `cum[i]`: samples in the shards before `order[i]`; then the total.
    cum: Vec<u64>,
}

impl EpochPlan {
    fn new(shards: &[ShardEntry], seed: u64, epoch: u64) -> EpochPlan {
        let mut order: Vec<usize> = (0..shards.len()).collect();
        Rng::for_key(seed, Stream::Order, epoch, 0).shuffle(&mut order);
        let mut cum = Vec::with_capacity(order.len() + 1);
        let mut total = 0u64;
        for &s in &order {
            cum.push(total);
            total += shards[s].count as u64;
        }
        cum.push(total);
        EpochPlan { order, cum }
    }

    fn total(&self) -> u64 {
        self.cum[self.cum.len() - 1]
    }

    /// The segments holding positions `from .. from + len` of the padded sequence (position `p`
    /// is sample `p mod N`).
    fn cover(&self, from: u64, len: u64) -> Vec<Segment> {
        let n = self.total();
        let mut out = Vec::new();
        if n == 0 {
            return out;
        }
        let mut p = from;
        let end = from.saturating_add(len);
        while p < end {
            let v = p % n;
            // The shard holding v: the last i with cum[i] <= v, skipping empty shards.
            let i = self.cum.partition_point(|&c| c <= v) - 1;
            let take = (self.cum[i + 1] - v).min(end - p);
            out.push(Segment {
                shard: self.order[i],
                first: (v - self.cum[i]) as usize,
                count: take as usize,
                position: p,
            });
            p += take;
        }
        out
    }
}

impl StreamSource for TarStream {
    fn fields(&self) -> &[FieldSpec] {
        self.shared.fields.specs()
    }

    fn samples_per_epoch(&self) -> Option<usize> {
        Some(self.per_rank)
    }

    fn describe(&self) -> String {
        format!("tar:{} (streaming)", self.pattern)
    }

    fn open(&self, epoch: u64, _resume: Option<&str>, _given: u64) -> Result<Box<dyn EpochStream>> {
        let plan = EpochPlan::new(&self.shared.shards, self.seed, epoch);
        let from = self.share.run_start(self.per_rank);
        let segments: VecDeque<Segment> = plan.cover(from, self.per_rank as u64).into();
        Ok(Box::new(TarEpoch {
            shared: Arc::clone(&self.shared),
            plan,
            segments,
            current: None,
            prefetched: None,
            make_up_from: from + self.per_rank as u64,
            make_ups: 0,
        }))
    }
}

/// One epoch of one rank: its segments, read in order.
struct TarEpoch {
    shared: Arc<Shared>,
    plan: EpochPlan,
    segments: VecDeque<Segment>,
    current: Option<Current>,
    /// The next segment's reader, opened while the current one is read (shard read-ahead).
    prefetched: Option<(Segment, Result<ShardReader>)>,
    /// Where samples that make up for failed ones come from: the positions after this rank's.
    make_up_from: u64,
    make_ups: usize,
}

struct Current {
    segment: Segment,
    reader: ShardReader,
    /// Samples given from the segment.
    done: usize,
    /// Samples still to pass over before the segment's first (gzip shards have no seek).
    discard: usize,
}

impl TarEpoch {
    fn open_reader(&self, segment: &Segment) -> Result<ShardReader> {
        let shard = &self.shared.shards[segment.shard];
        if let Some(feed) = &self.shared.feed {
            let stop = Arc::new(AtomicBool::new(false));
            let reader = feed.reader(segment.shard, Arc::clone(&stop));
            return ShardReader::from_waiting_reader(
                feed.shown(segment.shard),
                reader,
                self.shared.read.clone(),
                stop,
            );
        }
        if shard.sequential() || segment.first == 0 {
            ShardReader::open(&shard.path, self.shared.read.clone())
        } else {
            ShardReader::open_at(
                &shard.path,
                shard.starts[segment.first],
                self.shared.read.clone(),
            )
        }
    }

    /// A failed sample at `done` of `segment`, and the rest of the segment made up from
    /// later positions.
    fn fail(&mut self, segment: Segment, done: usize, error: Error) -> Box<dyn OwnedSample> {
        self.current = None;
        let shard = &self.shared.shards[segment.shard];
        let what = format!(
            "shard {} sample #{}",
            shard.path.display(),
            segment.first + done
        );
        let rest = (segment.count - done - 1) as u64;
        if rest > 0 && self.make_ups < MAX_MAKE_UPS {
            self.make_ups += 1;
            let extra = self.plan.cover(self.make_up_from, rest);
            self.make_up_from += rest;
            // Made-up segments go first: the samples keep their place in the stream.
            for s in extra.into_iter().rev() {
                self.segments.push_front(s);
            }
            self.prefetched = None;
        }
        Box::new(FailedSample::new(
            segment.position + done as u64,
            what,
            error,
        ))
    }
}

impl EpochStream for TarEpoch {
    fn next_sample(&mut self) -> Option<Box<dyn OwnedSample>> {
        loop {
            if self.current.is_none() {
                let segment = self.segments.pop_front()?;
                if let Some(feed) = &self.shared.feed {
                    let next = self.segments.iter().map(|s| s.shard);
                    feed.upcoming(std::iter::once(segment.shard).chain(next));
                }
                let reader = match self.prefetched.take() {
                    Some((s, reader)) if s == segment => reader,
                    _ => self.open_reader(&segment),
                };
                if let Some(next) = self.segments.front().copied() {
                    self.prefetched = Some((next, self.open_reader(&next)));
                }
                match reader {
                    Ok(reader) => {
                        let sequential = self.shared.shards[segment.shard].sequential();
                        self.current = Some(Current {
                            segment,
                            reader,
                            done: 0,
                            discard: if sequential { segment.first } else { 0 },
                        });
                    }
                    Err(e) => return Some(self.fail(segment, 0, e)),
                }
            }
            let current = self.current.as_mut()?;
            let segment = current.segment;
            if current.done == segment.count {
                self.current = None;
                continue;
            }
            match current.reader.next_sample() {
                Ok(Some(_)) if current.discard > 0 => current.discard -= 1,
                Ok(Some(sample)) => {
                    let ordinal = segment.position + current.done as u64;
                    current.done += 1;
                    return Some(Box::new(TarItem {
                        sample,
                        fields: Arc::clone(&self.shared.fields),
                        ordinal,
                    }));
                }
                Ok(None) => {
                    let done = current.done;
                    let shard = &self.shared.shards[segment.shard];
                    let error = Error::format(
                        &shard.path,
                        format!(
                            "the shard ends after {} samples, but its index lists {}: it changed since it was indexed",
                            segment.first + done,
                            shard.count
                        ),
                    );
                    return Some(self.fail(segment, done, error));
                }
                Err(e) => {
                    let done = current.done;
                    return Some(self.fail(segment, done, e));
                }
            }
        }
    }
}

/// One streamed tar sample, with the fields to read it as.
struct TarItem {
    sample: StreamSample,
    fields: Arc<TarFields>,
    ordinal: u64,
}

impl OwnedSample for TarItem {
    fn read<'a>(&'a self, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let what = || self.sample.describe();
        self.fields
            .stream_sample(&self.sample, self.ordinal, &what, scratch)
    }

    fn describe(&self) -> String {
        self.sample.describe()
    }

    fn ordinal(&self) -> u64 {
        self.ordinal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(counts: &[usize]) -> Shared {
        Shared {
            shards: counts
                .iter()
                .map(|&count| ShardEntry {
                    path: PathBuf::new(),
                    count,
                    starts: Vec::new(),
                })
                .collect(),
            total: counts.iter().sum(),
            fields: Arc::new(
                TarFields::resolve(
                    &TarConfig::default(),
                    "x",
                    "k",
                    &[("jpg", b"x"), ("cls", b"1")],
                )
                .unwrap(),
            ),
            read: ReadOptions {
                max_member_bytes: 1,
                wanted: None,
            },
            damaged: Vec::new(),
            remote: crate::source::remote::ShardHolder::default(),
            feed: None,
        }
    }

    /// Every rank gets the same count, the runs of all ranks cover every sample once (plus the
    /// padding, which repeats the head), for any world size and uneven shards.
    #[test]
    fn runs_cover_every_sample_once_with_equal_counts() {
        let counts = [7, 0, 3, 12, 1, 5];
        let s = shared(&counts);
        let n: usize = counts.iter().sum();
        for world in 1..=7 {
            for drop_tail in [false, true] {
                let per_rank = if drop_tail {
                    n / world
                } else {
                    n.div_ceil(world)
                };
                for epoch in 0..3 {
                    let plan = EpochPlan::new(&s.shards, 11, epoch);
                    let mut seen = vec![0usize; n];
                    for rank in 0..world {
                        let segs = plan.cover((rank * per_rank) as u64, per_rank as u64);
                        let got: usize = segs.iter().map(|g| g.count).sum();
                        assert_eq!(got, per_rank);
                        for g in segs {
                            assert!(g.first + g.count <= counts[g.shard]);
                            let base: usize = counts[..g.shard].iter().sum();
                            for i in g.first..g.first + g.count {
                                seen[base + i] += 1;
                            }
                        }
                    }
                    let total = per_rank * world;
                    if total <= n {
                        assert_eq!(seen.iter().filter(|&&c| c == 1).count(), total);
                    } else {
                        assert!(seen.iter().all(|&c| c >= 1), "{seen:?}");
                        assert_eq!(seen.iter().sum::<usize>(), total);
                    }
                }
            }
        }
    }

    #[test]
    fn shard_order_changes_with_the_epoch_and_not_with_the_rank() {
        let s = shared(&[1; 16]);
        let a = EpochPlan::new(&s.shards, 3, 0).order;
        assert_eq!(a, EpochPlan::new(&s.shards, 3, 0).order);
        assert_ne!(a, EpochPlan::new(&s.shards, 3, 1).order);
        assert_ne!(a, EpochPlan::new(&s.shards, 4, 0).order);
    }
}
