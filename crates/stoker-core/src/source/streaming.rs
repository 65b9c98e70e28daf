//! Sources read as streams: each epoch, this rank's samples in order, handed over owned.
//!
//! Two kinds exist: tar shards in streaming mode (`tar:PATTERN` with `shuffle_buffer=N`, see
//! [`super::tar::TarStream`]) and the caller's iterable sources ([`super::IterableSource`]).
//! The streaming scheduler (`loader::stream`) reads one [`EpochStream`] per epoch on one thread,
//! passes it through the seeded shuffle buffer and cuts batches that workers build with
//! [`crate::collate::Collator::build_owned`]. Reading is sequential and single-threaded per rank
//! on purpose: the order of a stream is then a function of `(seed, epoch, rank, world_size)`
//! alone, never of how many workers build batches.

use crate::error::{Error, Result};
use crate::source::{FieldSpec, Sample};

/// A sample a stream handed over: its bytes are owned (moved out of a shard reader or written by
/// an iterable source), so a worker can build a batch from it without reaching back to the
/// stream.
pub trait OwnedSample: Send {
    /// The sample's field bytes, in the order of the fields the collator was made for; they may
    /// borrow from the sample or from `scratch`. A sample that could not be read carries its
    /// error here.
    fn read<'a>(&'a self, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>>;
    /// Names the sample in errors (`shard PATH sample KEY (offset N)`).
    fn describe(&self) -> String;
    /// A number unique to the sample within its epoch (its position in the epoch's stream): the
    /// key of its augmentation randomness and the index errors report.
    fn ordinal(&self) -> u64;
}

/// A source read front to back, one stream per (rank, epoch).
pub trait StreamSource: Send + Sync {
    /// The fields of every sample.
    fn fields(&self) -> &[FieldSpec];

    /// Samples this rank's stream yields per epoch, when known; it is then the same on every
    /// rank (the equal-batches rule).
    fn samples_per_epoch(&self) -> Option<usize>;

    /// Opens this rank's stream of `epoch`. `resume` is a state an earlier stream of the same
    /// epoch gave through [`EpochStream::state`] after its first `given` samples: the new stream
    /// continues after them.
    fn open(&self, epoch: u64, resume: Option<&str>, given: u64) -> Result<Box<dyn EpochStream>>;

    /// Whether [`EpochStream::state`] gives states that [`StreamSource::open`] restores; if not,
    /// a resumed loader replays the epoch from its start (reading, not decoding).
    fn restores_state(&self) -> bool {
        false
    }

    /// Says what the source is, for messages (`tar:PATTERN (streaming)`).
    fn describe(&self) -> String;
}

/// One epoch of one rank's samples.
pub trait EpochStream: Send {
    /// The next sample, `None` once the epoch is over for this rank. A sample that could not be
    /// read is still given: it carries its error, which fails its batch (or has it replaced
    /// under `on_error=skip`).
    fn next_sample(&mut self) -> Option<Box<dyn OwnedSample>>;

    /// The stream's position after every sample given so far, when the source can say (see
    /// [`StreamSource::restores_state`]).
    fn state(&mut self) -> Result<Option<String>> {
        Ok(None)
    }
}

/// A sample that could not be read: it fails (or is replaced in) the batch it lands in.
pub(crate) struct FailedSample {
    pub ordinal: u64,
    pub what: String,
    pub error: Error,
}

impl FailedSample {
    /// `error` as a per-sample error, so that `on_error=skip` may replace the sample: a shard
    /// that breaks off in the middle of an epoch loses its rest, not the epoch.
    pub fn new(ordinal: u64, what: String, error: Error) -> FailedSample {
        let error = if error.is_sample_error() {
            error
        } else {
            Error::Sample {
                index: ordinal,
                what: what.clone(),
                reason: error.to_string(),
            }
        };
        FailedSample {
            ordinal,
            what,
            error,
        }
    }
}

impl OwnedSample for FailedSample {
    fn read<'a>(&'a self, _scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        Err(self.error.clone_for_sample())
    }

    fn describe(&self) -> String {
        self.what.clone()
    }

    fn ordinal(&self) -> u64 {
        self.ordinal
    }
}

impl Error {
    /// A copy of a per-sample error (`Error` is not `Clone`: it may hold anything); other kinds
    /// keep their kind and message.
    pub(crate) fn clone_for_sample(&self) -> Error {
        match self {
            Error::Sample {
                index,
                what,
                reason,
            } => Error::Sample {
                index: *index,
                what: what.clone(),
                reason: reason.clone(),
            },
            Error::Callback { index, message } => Error::Callback {
                index: *index,
                message: message.clone(),
            },
            Error::Io { path, reason } => Error::Io {
                path: path.clone(),
                reason: reason.clone(),
            },
            other => Error::Sample {
                index: 0,
                what: String::new(),
                reason: other.to_string(),
            },
        }
    }
}
