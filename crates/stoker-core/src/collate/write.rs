//! Phase 2: every sample phase 1 read is written into its slot of the slab.
//!
//! A fixed-shape field is one copy; a ragged field is copied, padded to the batch's length with
//! the pad value, and its length written to `<name>_lengths`; an image goes through the image
//! stage ([`super::image`]); a label to be mixed is written one-hot ([`super::mix`]). A sample
//! whose write fails (an image that does not decode, a label out of range) is replaced under
//! `on_error=skip` by a candidate that fits the layout phase 1 fixed, and keeps its slot's draw.

use std::time::Instant;

use crate::batch::FieldMeta;
use crate::error::{Error, Result};
use crate::rng::{Rng, Stream};
use crate::sampler::Draws;
use crate::source::Sample;
use crate::span::{SpanKind, Stage};
use crate::stats::Spans;

use super::image::{write_image, write_tensor_image, Pixels};
use super::layout::Output;
use super::mix::write_soft_label;
use super::pick::{gave_up, replacements, sample_error, Pick};
use super::{BatchKey, Collator};

/// Where a replacement is written: the padded length of each ragged field (it must fit them)
/// and the slots.
struct Target<'a, 's> {
    max_len: &'a [usize],
    slots: &'a mut Slots<'s>,
}

/// The slots one build writes: for every field of the batch's layout (`<name>_lengths` fields
/// included), the bytes of slots `first..first + count` — the whole batch, or one part's range.
pub(super) struct Slots<'a> {
    first: usize,
    /// Per field: its slots' bytes, and the bytes of one slot.
    fields: Vec<(&'a mut [u8], usize)>,
}

impl<'a> Slots<'a> {
    /// Every slot of the batch laid out as `metas` in `slab`.
    pub(super) fn whole(metas: &[FieldMeta], slab: &'a mut [u8]) -> Slots<'a> {
        let mut fields = Vec::with_capacity(metas.len());
        let mut rest = slab;
        let mut at = 0;
        // Fields are laid out in order, each past the end of the one before.
        for meta in metas {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(meta.offset - at);
            let (bytes, tail) = tail.split_at_mut(meta.num_bytes());
            rest = tail;
            at = meta.offset + meta.num_bytes();
            fields.push((bytes, meta.num_bytes() / meta.shape[0].max(1)));
        }
        Slots { first: 0, fields }
    }

    /// Slots `first..` of every field: per field, those slots' bytes and the bytes of one slot.
    pub(super) fn range(first: usize, fields: Vec<(&'a mut [u8], usize)>) -> Slots<'a> {
        Slots { first, fields }
    }

    /// The bytes of slot `slot` (of the batch) in field `field`.
    fn slot(&mut self, field: usize, slot: usize) -> &mut [u8] {
        let (bytes, size) = &mut self.fields[field];
        &mut bytes[(slot - self.first) * *size..][..*size]
    }
}

impl Collator {
    /// Phase 2 for the slots `slots` holds: writes `samples[i]` (read by phase 1) into slot
    /// `slots.first + i`, replacing a sample whose write fails under on_error=skip. Returns how
    /// many were replaced; stops at the first slot that fails.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_slots(
        &self,
        key: BatchKey,
        pick: &dyn Pick,
        indices: &[usize],
        draws: Option<Draws>,
        samples: &[(usize, Sample<'_>)],
        max_len: &[usize],
        slots: &mut Slots<'_>,
        spare: &mut Vec<u8>,
        pixels: &mut Pixels,
        spans: &mut Spans,
    ) -> Result<usize> {
        let mut skipped = 0;
        for (i, (index, sample)) in samples.iter().enumerate() {
            let slot = slots.first + i;
            // The slot's draw: a replacement keeps the draw of the sample it replaces. Streamed
            // samples are keyed by their position in this rank's stream.
            let draw = match draws {
                Some(draws) => draws.at(slot, indices[slot]),
                None => pick.index(indices[slot]),
            };
            let start = Instant::now();
            let mut used = *index;
            if let Err(err) =
                self.write(key, pick, slot, *index, draw, sample, slots, pixels, spans)
            {
                if !(self.skip_bad && err.is_sample_error()) {
                    return Err(err);
                }
                let target = Target { max_len, slots };
                used = self.write_replacement(
                    key, pick, slot, *index, draw, target, spare, pixels, spans, err,
                )?;
                skipped += 1;
            }
            spans.push(
                SpanKind::SampleWrite,
                slot,
                pick.index(used) as usize,
                start,
            );
        }
        Ok(skipped)
    }

    /// Writes a replacement for the sample in `slot` whose write failed with `err`. The
    /// replacement's ragged fields must fit the lengths the batch was laid out with. Returns the
    /// replacement's index.
    #[allow(clippy::too_many_arguments)]
    fn write_replacement(
        &self,
        key: BatchKey,
        pick: &dyn Pick,
        slot: usize,
        index: usize,
        draw: u64,
        target: Target<'_, '_>,
        spare: &mut Vec<u8>,
        pixels: &mut Pixels,
        spans: &mut Spans,
        err: Error,
    ) -> Result<usize> {
        let Target { max_len, slots } = target;
        for candidate in replacements(key, pick, index) {
            let start = Instant::now();
            let read = pick.read(candidate, spare);
            spans.push(
                SpanKind::Stage(Stage::Read),
                slot,
                pick.index(candidate) as usize,
                start,
            );
            let Ok(sample) = read else {
                continue;
            };
            let fits = self.validate(pick, candidate, &sample).is_ok()
                && self.outputs.iter().enumerate().all(|(f, o)| {
                    !matches!(o, Output::Pad { .. }) || self.ragged_len(f, &sample) <= max_len[f]
                });
            if fits
                && self
                    .write(
                        key, pick, slot, candidate, draw, &sample, slots, pixels, spans,
                    )
                    .is_ok()
            {
                return Ok(candidate);
            }
        }
        Err(gave_up(err))
    }

    /// Writes `sample` (dataset index `index`, augmented as draw `draw`) into slot `slot` of
    /// every field.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        key: BatchKey,
        pick: &dyn Pick,
        slot: usize,
        index: usize,
        draw: u64,
        sample: &Sample<'_>,
        slots: &mut Slots<'_>,
        pixels: &mut Pixels,
        spans: &mut Spans,
    ) -> Result<()> {
        let mut ragged_seen = 0;
        for (f, out) in self.outputs.iter().enumerate() {
            let start = Instant::now();
            let dst = slots.slot(f, slot);
            let src = sample.get(f);
            match out {
                Output::Copy { .. } => dst.copy_from_slice(src),
                Output::Pad { pad, .. } => {
                    dst[..src.len()].copy_from_slice(src);
                    for chunk in dst[src.len()..].chunks_exact_mut(pad.len()) {
                        chunk.copy_from_slice(pad);
                    }
                    let len = self.ragged_len(f, sample) as i64;
                    slots
                        .slot(self.outputs.len() + ragged_seen, slot)
                        .copy_from_slice(&len.to_ne_bytes());
                    ragged_seen += 1;
                }
                Output::SoftLabel {
                    src: label_type,
                    num_classes,
                    smoothing,
                } => {
                    let label = (*label_type, *num_classes, *smoothing);
                    write_soft_label(label, &self.names[f], src, dst)
                        .map_err(|reason| sample_error(pick, index, reason))?;
                }
                Output::TensorImage {
                    pipeline,
                    height,
                    width,
                    layout,
                } => {
                    let mut rng = Rng::for_key(key.seed, Stream::Augment, key.epoch, draw);
                    let size = (*height, *width, *layout);
                    write_tensor_image(pipeline, size, src, &mut rng, dst, pixels)
                        .map_err(|reason| sample_error(pick, index, reason))?;
                    spans.push(
                        SpanKind::Stage(Stage::Transform),
                        slot,
                        pick.index(index) as usize,
                        start,
                    );
                    continue;
                }
                Output::Image { stages, pipeline } => {
                    let mut rng = Rng::for_key(key.seed, Stream::Augment, key.epoch, draw);
                    let at = (slot, pick.index(index) as usize);
                    let image = (src, sample.image_size(f));
                    write_image(stages, pipeline, image, &mut rng, dst, pixels, spans, at)
                        .map_err(|reason| sample_error(pick, index, reason))?;
                    continue; // decode and transform recorded their own spans
                }
            }
            spans.push(
                SpanKind::Stage(Stage::Collate),
                slot,
                pick.index(index) as usize,
                start,
            );
        }
        Ok(())
    }
}

