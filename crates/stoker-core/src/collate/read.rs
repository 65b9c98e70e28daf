//! Phase 1: every sample of the batch (or of one part's slots) is read and validated against
//! the fields' layout before anything is written, replacing a bad one under `on_error=skip`.
//!
//! Reading first fixes the padded length of every ragged field, so the slab can be sized; views
//! into a memory map cost nothing to hold, and bytes read from files land in the worker's
//! per-slot buffers, which are reused for its next batch.

use std::ops::Range;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::source::Sample;
use crate::span::{SpanKind, Stage};
use crate::stats::Spans;

use super::layout::Output;
use super::pick::{gave_up, replacements, sample_error, Pick};
use super::{BatchKey, Collator};

impl Collator {
    /// Phase 1 for slots `range` of the batch of `indices`: reads each sample into its buffer
    /// of `reads` (`reads[0]` for the range's first slot) and validates it, replacing a bad one
    /// under on_error=skip. Returns the samples (with the index each slot uses) and how many
    /// were replaced; stops at the first slot that fails.
    pub(super) fn read_slots<'a>(
        &self,
        key: BatchKey,
        pick: &'a dyn Pick,
        indices: &[usize],
        range: Range<usize>,
        reads: &'a mut [Vec<u8>],
        spans: &mut Spans,
    ) -> Result<(Vec<(usize, Sample<'a>)>, usize)> {
        let mut samples = Vec::with_capacity(range.len());
        let mut skipped = 0;
        for (slot, buf) in range.zip(reads.iter_mut()) {
            let start = Instant::now();
            let (used, sample, replaced) =
                self.read_valid(key, pick, slot, indices[slot], buf, spans)?;
            spans.push(SpanKind::SampleRead, slot, pick.index(used) as usize, start);
            skipped += usize::from(replaced);
            samples.push((used, sample));
        }
        Ok((samples, skipped))
    }

    /// Reads sample `index`, or under on_error=skip the first of its deterministic replacements
    /// that reads and validates. Returns the index used and whether it is a replacement.
    fn read_valid<'a>(
        &self,
        key: BatchKey,
        pick: &'a dyn Pick,
        slot: usize,
        index: usize,
        buf: &'a mut Vec<u8>,
        spans: &mut Spans,
    ) -> Result<(usize, Sample<'a>, bool)> {
        let buf: *mut Vec<u8> = buf;
        let mut first_err = None;
        let candidates = std::iter::once(index).chain(replacements(key, pick, index));
        for (attempt, candidate) in candidates.enumerate() {
            // SAFETY: `buf` comes from a `&'a mut` we hold exclusively. Each iteration's borrow
            // either is returned (ending the loop) or is dead before the next iteration starts;
            // the raw pointer only works around the borrow checker's rejection of a conditional
            // return of a borrow from inside a loop (NLL problem case #3).
            let attempt_buf = unsafe { &mut *buf };
            let start = Instant::now();
            let read = pick.read(candidate, attempt_buf);
            spans.push(
                SpanKind::Stage(Stage::Read),
                slot,
                pick.index(candidate) as usize,
                start,
            );
            let result = read.and_then(|s| self.validate(pick, candidate, &s).map(|()| s));
            match result {
                Ok(sample) => return Ok((candidate, sample, attempt > 0)),
                Err(err) if self.skip_bad && err.is_sample_error() => {
                    first_err.get_or_insert(err);
                }
                Err(err) => return Err(err),
            }
        }
        Err(gave_up(first_err.unwrap_or_else(|| {
            Error::Internal("replacement loop ended without an error".into())
        })))
    }

    /// Checks that a sample's bytes match its field specs.
    pub(super) fn validate(
        &self,
        pick: &dyn Pick,
        index: usize,
        sample: &Sample<'_>,
    ) -> Result<()> {
        for (f, out) in self.outputs.iter().enumerate() {
            let got = sample.get(f).len();
            let ok = match out {
                Output::Copy { dtype, shape } => {
                    got == shape.iter().product::<usize>() * dtype.size()
                }
                Output::Ragged { dtype, inner, .. } => {
                    got.is_multiple_of((inner.iter().product::<usize>() * dtype.size()).max(1))
                }
                Output::Image { .. } | Output::EncodedMask { .. } => got > 0,
                Output::SoftLabel { src, .. } => got == src.size(),
                Output::TensorImage { height, width, .. } => got == height * width * 3,
                Output::Dense { pipeline } => got == pipeline.input().bytes(),
            };
            if !ok {
                let reason = match out {
                    Output::Copy { dtype, shape } => format!(
                        "field `{}` has {got} bytes; expected {dtype} {shape:?} ({} bytes)",
                        self.names[f],
                        shape.iter().product::<usize>() * dtype.size()
                    ),
                    Output::Ragged { dtype, inner, .. } => format!(
                        "field `{}` has {got} bytes, not a whole number of {dtype} {inner:?} rows",
                        self.names[f]
                    ),
                    Output::Image { .. } | Output::EncodedMask { .. } => {
                        format!("field `{}` is empty (0 bytes)", self.names[f])
                    }
                    Output::TensorImage { height, width, .. } => format!(
                        "field `{}` has {got} bytes; expected a uint8 {height}x{width}x3 image",
                        self.names[f]
                    ),
                    Output::Dense { pipeline } => {
                        let i = pipeline.input();
                        format!(
                            "field `{}` has {got} bytes; expected {} {}x{}x{} ({} bytes)",
                            self.names[f],
                            i.dtype,
                            i.height,
                            i.width,
                            i.channels,
                            i.bytes()
                        )
                    }
                    Output::SoftLabel { src, .. } => format!(
                        "field `{}` has {got} bytes; expected one {src}",
                        self.names[f]
                    ),
                };
                return Err(sample_error(pick, index, reason));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::collate::pick::{FromSource, MAX_REPLACEMENTS};
    use crate::collate::tests::{counting, key, Flaky};
    use crate::dtype::DType;
    use crate::source::MemorySource;

    /// Phase 1 over every slot of `indices`: the indices each slot uses and how many were
    /// replaced.
    fn read_all(c: &Collator, indices: &[usize]) -> Result<(Vec<usize>, usize)> {
        let source = c.source().expect("a map-style collator").clone();
        let pick = FromSource(&*source);
        let mut reads = vec![Vec::new(); indices.len()];
        let mut spans = Spans::default();
        let range = 0..indices.len();
        let (samples, skipped) =
            c.read_slots(key(3, 1), &pick, indices, range, &mut reads, &mut spans)?;
        Ok((samples.into_iter().map(|(i, _)| i).collect(), skipped))
    }

    #[test]
    fn good_samples_are_read_as_they_are_with_nothing_replaced() {
        let c = Collator::new(counting(10), None, None, true).unwrap();
        assert_eq!(read_all(&c, &[4, 0, 9]).unwrap(), (vec![4, 0, 9], 0));
    }

    #[test]
    fn a_bad_sample_is_replaced_by_its_first_good_replacement_under_skip() {
        let source = Flaky::new(counting(50), &[7]);
        let candidates: Vec<usize> = replacements(key(3, 1), &FromSource(&source), 7).collect();
        let c = Collator::new(Arc::new(source), None, None, true).unwrap();
        let (used, skipped) = read_all(&c, &[1, 7, 2]).unwrap();
        assert_eq!(skipped, 1);
        assert_eq!(used[0], 1);
        assert_eq!(used[2], 2);
        let want = candidates.into_iter().find(|&i| i != 7).unwrap();
        assert_eq!(used[1], want, "the first replacement drawn that reads");
        // Deterministic: the same batch replaces the same way.
        assert_eq!(read_all(&c, &[1, 7, 2]).unwrap().0, used);
    }

    #[test]
    fn without_skip_the_first_bad_slot_fails_the_read_with_its_own_error() {
        let c = Collator::new(
            Arc::new(Flaky::new(counting(10), &[3, 5])),
            None,
            None,
            false,
        )
        .unwrap();
        match read_all(&c, &[0, 5, 3]) {
            Err(Error::Sample { index, reason, .. }) => {
                assert_eq!(index, 5, "slot 1 is read before slot 2");
                assert!(!reason.contains("replacement"), "{reason}");
            }
            other => panic!("expected sample 5's error, got {other:?}"),
        }
    }

    #[test]
    fn when_every_replacement_fails_too_the_first_error_says_so() {
        let bad: Vec<usize> = (0..4).collect();
        let c = Collator::new(Arc::new(Flaky::new(counting(4), &bad)), None, None, true).unwrap();
        match read_all(&c, &[2]) {
            Err(Error::Sample { index, reason, .. }) => {
                assert_eq!(index, 2);
                assert!(
                    reason.ends_with(&format!(
                        "; and {MAX_REPLACEMENTS} replacement samples also failed"
                    )),
                    "{reason}"
                );
            }
            other => panic!("expected sample 2's error, got {other:?}"),
        }
    }

    #[test]
    fn samples_whose_bytes_do_not_fit_their_fields_are_refused_naming_the_field() {
        // `tokens` declares int32 rows of 2 (8 bytes a row); `id` one int64.
        let source = MemorySource::new()
            .with_ragged("tokens", DType::I32, &[2], vec![vec![0; 8]])
            .and_then(|s| s.with_tensor("id", DType::I64, &[], vec![0; 8]))
            .unwrap();
        let c = Collator::new(Arc::new(source), Some(0.0), None, false).unwrap();
        let pick = FromSource(c.source().unwrap().as_ref());
        let check = |tokens: &[u8], id: &[u8]| {
            let mut s = Sample::default();
            s.set(0, tokens);
            s.set(1, id);
            c.validate(&pick, 0, &s).map_err(|e| e.to_string())
        };
        assert!(check(&[0; 16], &[0; 8]).is_ok());
        assert!(
            check(&[], &[0; 8]).is_ok(),
            "an empty ragged field is whole"
        );
        let e = check(&[0; 12], &[0; 8]).unwrap_err();
        assert!(e.contains("field `tokens` has 12 bytes"), "{e}");
        let e = check(&[0; 8], &[0; 4]).unwrap_err();
        assert!(e.contains("field `id` has 4 bytes; expected int64"), "{e}");
        assert!(e.contains("in-memory sample 0"), "{e}");
    }
}
