//! Where a batch's samples come from, and which sample replaces a bad one under
//! `on_error=skip`.
//!
//! A replacement is drawn from the `Replace` stream keyed by `(seed, epoch, index of the bad
//! sample)`: never by the slot, the batch's position, the rank or the worker, so a batch built
//! whole, in parts or on another thread replaces a bad sample with the same one. Candidates are
//! drawn uniformly from everything the pick holds (the whole dataset of a map-style source, the
//! batch itself for streamed samples), with replacement: a candidate that fails too is simply
//! followed by the next draw, up to [`MAX_REPLACEMENTS`].

use crate::error::{Error, Result};
use crate::rng::{Rng, Stream};
use crate::source::streaming::OwnedSample;
use crate::source::{Sample, Source};

use super::BatchKey;

/// How many replacements `on_error=skip` tries for one bad sample before giving up.
pub const MAX_REPLACEMENTS: usize = 16;

/// Where the samples of one batch come from, and what may replace a bad one.
pub(super) trait Pick {
    /// Candidates `0..len()` for a replacement.
    fn len(&self) -> usize;
    fn read<'a>(&'a self, candidate: usize, buf: &'a mut Vec<u8>) -> Result<Sample<'a>>;
    fn describe(&self, candidate: usize) -> String;
    /// The sample's index for randomness and messages.
    fn index(&self, candidate: usize) -> u64;
    /// After the batch is written: whether what was read can be trusted (see
    /// [`Source::verify`]).
    fn verify(&self) -> Result<()> {
        Ok(())
    }
}

/// Indices of a map-style source: any sample of the dataset may replace a bad one.
pub(super) struct FromSource<'s>(pub(super) &'s dyn Source);

impl Pick for FromSource<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read<'a>(&'a self, candidate: usize, buf: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        self.0.read(candidate, buf)
    }
    fn describe(&self, candidate: usize) -> String {
        self.0.describe(candidate)
    }
    fn index(&self, candidate: usize) -> u64 {
        candidate as u64
    }
    fn verify(&self) -> Result<()> {
        self.0.verify()
    }
}

/// Owned samples of one batch: another sample of the same batch replaces a bad one (a stream
/// has no random access to the rest of the dataset).
pub(super) struct FromOwned<'s>(pub(super) &'s [Box<dyn OwnedSample>]);

impl Pick for FromOwned<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read<'a>(&'a self, candidate: usize, buf: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        self.0[candidate].read(buf)
    }
    fn describe(&self, candidate: usize) -> String {
        self.0[candidate].describe()
    }
    fn index(&self, candidate: usize) -> u64 {
        self.0[candidate].ordinal()
    }
}

/// The error of candidate `index` of `pick`, naming the sample as the pick knows it.
pub(super) fn sample_error(pick: &dyn Pick, index: usize, reason: String) -> Error {
    Error::Sample {
        index: pick.index(index),
        what: pick.describe(index),
        reason,
    }
}

/// The [`MAX_REPLACEMENTS`] candidates that may replace candidate `index` of `pick`, in the
/// order they are tried. Drawn lazily: phase 1 and phase 2 both walk this sequence from its
/// start, so a sample that reads but fails to write is replaced by the same candidates a read
/// failure would have tried.
pub(super) fn replacements(
    key: BatchKey,
    pick: &dyn Pick,
    index: usize,
) -> impl Iterator<Item = usize> {
    let mut rng = Rng::for_key(key.seed, Stream::Replace, key.epoch, pick.index(index));
    let len = pick.len() as u64;
    (0..MAX_REPLACEMENTS).map(move |_| rng.below(len) as usize)
}

/// The error a slot fails with when every replacement failed too: the first error, saying so.
pub(super) fn gave_up(first: Error) -> Error {
    with_more_reason(
        first,
        &format!("and {MAX_REPLACEMENTS} replacement samples also failed"),
    )
}

/// `err` (a sample's), saying why `on_error=skip` did not replace the sample.
pub(super) fn not_replaced(err: Error, why: &str) -> Error {
    with_more_reason(err, &format!("on_error=skip cannot replace it: {why}"))
}

/// A sample's error with `more` after its reason; any other error as it is.
fn with_more_reason(err: Error, more: &str) -> Error {
    match err {
        Error::Sample {
            index,
            what,
            reason,
        } => Error::Sample {
            index,
            what,
            reason: format!("{reason}; {more}"),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collate::tests::{counting, key, Owned};

    #[test]
    fn replacements_depend_only_on_seed_epoch_and_the_bad_samples_index() {
        let source = counting(1000);
        let pick = FromSource(&*source);
        let base = key(7, 2);
        let drawn: Vec<usize> = replacements(base, &pick, 41).collect();
        assert_eq!(drawn.len(), MAX_REPLACEMENTS);
        assert!(drawn.iter().all(|&c| c < 1000), "{drawn:?}");
        // Another batch position or rank (another worker, a split batch) draws the same.
        let elsewhere = BatchKey {
            position: 9,
            rank: 3,
            ..base
        };
        assert_eq!(
            replacements(elsewhere, &pick, 41).collect::<Vec<_>>(),
            drawn
        );
        // Another epoch, seed or bad sample draws apart.
        for (other, index) in [(key(7, 3), 41), (key(8, 2), 41), (base, 42)] {
            assert_ne!(
                replacements(other, &pick, index).collect::<Vec<_>>(),
                drawn,
                "{other:?} index {index}"
            );
        }
    }

    #[test]
    fn streamed_samples_are_replaced_from_their_own_batch_keyed_by_ordinal() {
        // Ordinals far from the batch's slots: the key is the stream position, not the slot.
        let samples: Vec<Box<dyn OwnedSample>> = (0..4)
            .map(|i| Box::new(Owned::good(500 + i)) as Box<dyn OwnedSample>)
            .collect();
        let pick = FromOwned(&samples);
        assert_eq!(pick.index(2), 502);
        let drawn: Vec<usize> = replacements(key(1, 0), &pick, 2).collect();
        assert!(drawn.iter().all(|&c| c < 4), "{drawn:?}");
        // The same sample at another place in the batch draws the same candidates.
        let shifted: Vec<Box<dyn OwnedSample>> = [502, 500, 501, 503]
            .into_iter()
            .map(|i| Box::new(Owned::good(i)) as Box<dyn OwnedSample>)
            .collect();
        assert_eq!(
            replacements(key(1, 0), &FromOwned(&shifted), 0).collect::<Vec<_>>(),
            drawn
        );
    }

    #[test]
    fn a_sample_error_names_the_sample_as_its_pick_does() {
        let samples: Vec<Box<dyn OwnedSample>> = vec![Box::new(Owned::good(77))];
        let e = sample_error(&FromOwned(&samples), 0, "truncated".into());
        match e {
            Error::Sample {
                index,
                what,
                reason,
            } => {
                assert_eq!(index, 77);
                assert_eq!(what, "streamed sample 77");
                assert_eq!(reason, "truncated");
            }
            other => panic!("not a sample error: {other}"),
        }
    }

    #[test]
    fn giving_up_keeps_the_first_error_and_says_how_many_replacements_failed() {
        let first = Error::Sample {
            index: 3,
            what: "file 3".into(),
            reason: "bad JPEG".into(),
        };
        match gave_up(first) {
            Error::Sample { index, reason, .. } => {
                assert_eq!(index, 3);
                assert_eq!(
                    reason,
                    format!("bad JPEG; and {MAX_REPLACEMENTS} replacement samples also failed")
                );
            }
            other => panic!("not a sample error: {other}"),
        }
        // Errors that are not a sample's pass through unchanged.
        let internal = gave_up(Error::Internal("x".into()));
        assert!(matches!(internal, Error::Internal(ref m) if m == "x"));
    }
}
