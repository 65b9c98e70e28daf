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
                Output::Pad { dtype, inner, .. } => {
                    got.is_multiple_of((inner.iter().product::<usize>() * dtype.size()).max(1))
                }
                Output::Image { .. } => got > 0,
                Output::SoftLabel { src, .. } => got == src.size(),
                Output::TensorImage { height, width, .. } => got == height * width * 3,
            };
            if !ok {
                let reason = match out {
                    Output::Copy { dtype, shape } => format!(
                        "field `{}` has {got} bytes; expected {dtype} {shape:?} ({} bytes)",
                        self.names[f],
                        shape.iter().product::<usize>() * dtype.size()
                    ),
                    Output::Pad { dtype, inner, .. } => format!(
                        "field `{}` has {got} bytes, not a whole number of {dtype} {inner:?} rows",
                        self.names[f]
                    ),
                    Output::Image { .. } => format!("field `{}` is empty (0 bytes)", self.names[f]),
                    Output::TensorImage { height, width, .. } => format!(
                        "field `{}` has {got} bytes; expected a uint8 {height}x{width}x3 image",
                        self.names[f]
                    ),
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

