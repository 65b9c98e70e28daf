//! Iterable sources: the caller's stream of samples with no length (PyTorch's
//! `IterableDataset`), from Rust, C callbacks, C++ or Python.
//!
//! The loader opens one stream per rank and epoch, described by a [`StreamInfo`]: the caller
//! reads its part of the data for `(rank, world_size)` and may reshuffle with `(seed, epoch)`.
//! `worker` is always 0 and `num_workers` 1: one stream per rank is read on one thread, in
//! order, so that batches are the same for a seed whatever `num_workers` is (workers still
//! decode, transform and collate in parallel). A stream must therefore give the same samples
//! for the same `StreamInfo` whenever it is opened: a resumed loader replays the epoch from its
//! start unless the stream can save and restore its position ([`SampleStream::save_state`]; used
//! when `shuffle_buffer=0`).
//!
//! Each sample is written through a [`SampleWriter`], as for callback sources: the first sample
//! declares the fields (an encoded image, tensors, a label), later ones must match.
//!
//! An epoch ends when the rank's stream ends. The equal-batches rule: streams of different
//! lengths give ranks different batch counts, which hangs distributed training, so with
//! `num_samples=N` every rank delivers exactly `ceil(N / world_size)` samples
//! (`floor` with `shard_drop_last=true`): a stream that ends sooner is opened again for the same
//! epoch and read from its start (wrapping around), and one that runs longer is closed.

use std::sync::{Arc, Mutex};

use super::callback::{DeclaredFields, FieldRules, SampleWriter};
use super::streaming::{EpochStream, FailedSample, StreamSource};
use super::{FieldSpec, Sample, MAX_FIELDS};
use crate::error::{Error, Result};
use crate::launch::RankShare;
use crate::source::streaming::OwnedSample;

/// Which stream to open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    /// This process's rank, `< world_size`.
    pub rank: usize,
    /// Number of ranks, at least 1.
    pub world_size: usize,
    /// Always 0: one stream per rank (see the module docs).
    pub worker: usize,
    /// Always 1.
    pub num_workers: usize,
    /// The loader's seed (option `seed`).
    pub seed: u64,
    /// The epoch to stream, from 0.
    pub epoch: u64,
}

/// The caller's iterable dataset.
pub trait IterableSource: Send + Sync {
    /// Opens the stream `info` describes. `resume`, when given, is a state one of its streams
    /// returned from [`SampleStream::save_state`]: continue after it. An `Err` carries the
    /// caller's message.
    fn open(
        &self,
        info: &StreamInfo,
        resume: Option<&str>,
    ) -> std::result::Result<Box<dyn SampleStream>, String>;

    /// Whether its streams save their position ([`SampleStream::save_state`]).
    fn saves_state(&self) -> bool {
        false
    }
}

/// One open stream. Dropping it closes it.
pub trait SampleStream: Send {
    /// Writes the next sample into `out` and returns `Ok(true)`, or `Ok(false)` at the end of
    /// the stream. An `Err` fails this sample (or has it replaced under `on_error=skip`); the
    /// stream is then asked for the next one.
    fn next(&mut self, out: &mut SampleWriter<'_>) -> std::result::Result<bool, String>;

    /// The position after the samples given so far, for [`IterableSource::open`] to continue
    /// from; `Ok(None)` if the stream cannot say.
    fn save_state(&mut self) -> std::result::Result<Option<String>, String> {
        Ok(None)
    }
}

/// Consecutive failed samples after which a stream is taken as broken and its epoch ended.
const MAX_CONSECUTIVE_FAILURES: usize = 64;

/// An iterable source read as this rank's stream.
pub(crate) struct IterableStream {
    source: Arc<dyn IterableSource>,
    fields: DeclaredFields,
    rank: usize,
    world_size: usize,
    seed: u64,
    /// Samples per epoch on this rank when `num_samples` is set (the equal-batches rule).
    per_rank: Option<usize>,
    /// The stream the fields were learnt from, with its first sample: the first `open` of
    /// that (epoch, resume) uses it instead of opening again.
    primed: Mutex<Option<Primed>>,
}

struct Primed {
    epoch: u64,
    resume: Option<String>,
    stream: Box<dyn SampleStream>,
    first: Written,
}

impl IterableStream {
    /// Opens the stream of `(rank, epoch)` (continuing from `resume`) and learns the fields
    /// from its first sample, under `rules`.
    /// `given`: the samples of that epoch a resumed loader already delivered (the stream's
    /// numbering continues from there).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        source: Arc<dyn IterableSource>,
        share: RankShare,
        seed: u64,
        epoch: u64,
        resume: Option<&str>,
        given: u64,
        num_samples: Option<usize>,
        rules: FieldRules,
    ) -> Result<IterableStream> {
        let RankShare {
            rank, world_size, ..
        } = share;
        let per_rank = num_samples.map(|n| share.per_rank(n));
        let info = stream_info(rank, world_size, seed, epoch);
        let mut stream = source
            .open(&info, resume)
            .map_err(|message| open_error(&info, message))?;
        let mut fields = DeclaredFields::new(rules);
        let mut buf = Vec::new();
        let outcome = {
            let mut writer = SampleWriter::probing(&mut buf, &mut fields);
            stream
                .next(&mut writer)
                .and_then(|more| writer.finish().map(|ranges| (more, ranges)))
        };
        let (more, ranges) = outcome.map_err(|message| Error::Callback {
            index: rank as u64,
            message: format!("the first sample of {}: {message}", describe_info(&info)),
        })?;
        if !more || fields.specs().is_empty() {
            return Err(Error::Callback {
                index: rank as u64,
                message: format!(
                    "{} gave no sample{}: the fields of an iterable source are learnt from its first sample",
                    describe_info(&info),
                    if more { " field" } else { "" }
                ),
            });
        }
        let first = Written {
            ordinal: ordinal(given, rank, world_size),
            what: describe_sample(&info, given),
            buf,
            ranges,
            n_fields: fields.specs().len(),
        };
        Ok(IterableStream {
            source,
            fields,
            rank,
            world_size,
            seed,
            per_rank,
            primed: Mutex::new(Some(Primed {
                epoch,
                resume: resume.map(str::to_owned),
                stream,
                first,
            })),
        })
    }
}

fn stream_info(rank: usize, world_size: usize, seed: u64, epoch: u64) -> StreamInfo {
    StreamInfo {
        rank,
        world_size,
        worker: 0,
        num_workers: 1,
        seed,
        epoch,
    }
}

fn describe_info(info: &StreamInfo) -> String {
    format!(
        "the iterable stream of rank {}/{} epoch {}",
        info.rank, info.world_size, info.epoch
    )
}

fn describe_sample(info: &StreamInfo, k: u64) -> String {
    format!(
        "iterable stream of rank {} epoch {}, sample {k}",
        info.rank, info.epoch
    )
}

fn open_error(info: &StreamInfo, message: String) -> Error {
    Error::Callback {
        index: info.rank as u64,
        message: format!("opening {}: {message}", describe_info(info)),
    }
}

/// Sample `k` of rank `rank`'s stream, numbered so that no two ranks share a number (the key
/// of its augmentation randomness).
fn ordinal(k: u64, rank: usize, world_size: usize) -> u64 {
    k.wrapping_mul(world_size as u64).wrapping_add(rank as u64)
}

impl StreamSource for IterableStream {
    fn fields(&self) -> &[FieldSpec] {
        self.fields.specs()
    }

    fn samples_per_epoch(&self) -> Option<usize> {
        self.per_rank
    }

    fn restores_state(&self) -> bool {
        self.source.saves_state()
    }

    fn describe(&self) -> String {
        "iterable source".into()
    }

    fn open(&self, epoch: u64, resume: Option<&str>, given: u64) -> Result<Box<dyn EpochStream>> {
        let info = stream_info(self.rank, self.world_size, self.seed, epoch);
        let primed = {
            let mut slot = self.primed.lock().unwrap_or_else(|p| p.into_inner());
            match slot.take() {
                Some(p) if p.epoch == epoch && p.resume.as_deref() == resume => Some(p),
                _ => None,
            }
        };
        let (stream, pending) = match primed {
            Some(mut p) => {
                p.first.ordinal = ordinal(given, self.rank, self.world_size);
                p.first.what = describe_sample(&info, given);
                (Some(p.stream), Some(p.first))
            }
            None => (
                Some(
                    self.source
                        .open(&info, resume)
                        .map_err(|message| open_error(&info, message))?,
                ),
                None,
            ),
        };
        Ok(Box::new(IterEpoch {
            source: Arc::clone(&self.source),
            fields: self.fields.clone(),
            info,
            stream,
            pending,
            given,
            limit: self.per_rank,
            wraps_without_sample: 0,
            read_since_open: 0,
        }))
    }
}

/// One epoch of an iterable stream.
struct IterEpoch {
    source: Arc<dyn IterableSource>,
    fields: DeclaredFields,
    info: StreamInfo,
    /// `None` once the stream ended (and is not reopened).
    stream: Option<Box<dyn SampleStream>>,
    /// The first sample, read when the fields were learnt.
    pending: Option<Written>,
    /// Samples given this epoch.
    given: u64,
    /// Samples to give (the equal-batches rule), or `None` for as many as the stream has.
    limit: Option<usize>,
    /// Reopenings in a row that gave no sample (a stream that is empty when reopened).
    wraps_without_sample: usize,
    read_since_open: u64,
}

impl IterEpoch {
    fn failed(&mut self, message: String) -> Box<dyn OwnedSample> {
        let k = self.given;
        self.given += 1;
        let ordinal = ordinal(k, self.info.rank, self.info.world_size);
        let what = describe_sample(&self.info, k);
        Box::new(FailedSample::new(
            ordinal,
            what.clone(),
            Error::Callback {
                index: ordinal,
                message: format!("{what}: {message}"),
            },
        ))
    }
}

impl EpochStream for IterEpoch {
    fn next_sample(&mut self) -> Option<Box<dyn OwnedSample>> {
        if self.limit.is_some_and(|l| self.given >= l as u64) {
            // Closes the stream now rather than at the end of the epoch.
            self.stream = None;
            return None;
        }
        if let Some(first) = self.pending.take() {
            self.given += 1;
            self.read_since_open += 1;
            return Some(Box::new(first));
        }
        let mut failures = 0;
        loop {
            let stream = self.stream.as_mut()?;
            let mut buf = Vec::new();
            let outcome = {
                let mut writer = SampleWriter::checking(&mut buf, &self.fields);
                stream.next(&mut writer).map(|more| (more, writer.finish()))
            };
            match outcome {
                Ok((true, Ok(ranges))) => {
                    let k = self.given;
                    self.given += 1;
                    self.read_since_open += 1;
                    self.wraps_without_sample = 0;
                    return Some(Box::new(Written {
                        ordinal: ordinal(k, self.info.rank, self.info.world_size),
                        what: describe_sample(&self.info, k),
                        buf,
                        ranges,
                        n_fields: self.fields.specs().len(),
                    }));
                }
                Ok((true, Err(misuse))) => {
                    self.read_since_open += 1;
                    return Some(self.failed(misuse));
                }
                Ok((false, _)) => {
                    self.stream = None;
                    let short = self.limit.is_some_and(|l| self.given < l as u64);
                    if !short {
                        return None;
                    }
                    // The equal-batches rule: read the stream again from its start.
                    if self.read_since_open == 0 {
                        self.wraps_without_sample += 1;
                    }
                    if self.wraps_without_sample > 1 {
                        let message = format!(
                            "{} gave no sample when opened again to fill the epoch to num_samples",
                            describe_info(&self.info)
                        );
                        self.limit = Some(self.given as usize + 1);
                        return Some(self.failed(message));
                    }
                    self.read_since_open = 0;
                    match self.source.open(&self.info, None) {
                        Ok(s) => self.stream = Some(s),
                        Err(message) => {
                            let message =
                                format!("opening {} again: {message}", describe_info(&self.info));
                            // Ends the epoch after this failed sample.
                            self.limit = Some(self.given as usize + 1);
                            return Some(self.failed(message));
                        }
                    }
                }
                Err(message) => {
                    failures += 1;
                    if failures >= MAX_CONSECUTIVE_FAILURES {
                        self.stream = None;
                        self.limit = Some(self.given as usize + 1);
                        let message = format!(
                            "{message}; {MAX_CONSECUTIVE_FAILURES} samples in a row failed, so the stream's epoch ends here"
                        );
                        return Some(self.failed(message));
                    }
                    return Some(self.failed(message));
                }
            }
        }
    }

    fn state(&mut self) -> Result<Option<String>> {
        if self.pending.is_some() {
            // The first sample is read but not yet given: the stream is one ahead.
            return Ok(None);
        }
        match self.stream.as_mut() {
            Some(stream) => stream.save_state().map_err(|message| Error::Callback {
                index: self.given,
                message: format!(
                    "saving the state of {}: {message}",
                    describe_info(&self.info)
                ),
            }),
            None => Ok(None),
        }
    }
}

/// A sample written by an iterable stream: its fields' bytes, back to back.
struct Written {
    ordinal: u64,
    what: String,
    buf: Vec<u8>,
    ranges: [Option<(usize, usize)>; MAX_FIELDS],
    n_fields: usize,
}

impl OwnedSample for Written {
    fn read<'a>(&'a self, _scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let mut sample = Sample::default();
        for (f, range) in self.ranges.iter().enumerate().take(self.n_fields) {
            if let Some((start, len)) = range {
                sample.set(f, &self.buf[*start..start + len]);
            }
        }
        Ok(sample)
    }

    fn describe(&self) -> String {
        self.what.clone()
    }

    fn ordinal(&self) -> u64 {
        self.ordinal
    }
}
