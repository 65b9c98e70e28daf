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

use super::image::{write_dense, write_image, write_tensor_image, Pixels};
use super::layout::{BoxRole, Output};
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

    /// The boxes of `sample` moved by its draw (keyed as its image's): the kept boxes and
    /// their indices among the sample's. The labels must be one per box.
    fn move_boxes(
        &self,
        role: &BoxRole,
        key: BatchKey,
        draw: u64,
        sample: &Sample<'_>,
    ) -> std::result::Result<(Vec<[f32; 4]>, Vec<usize>), String> {
        let boxes: Vec<[f32; 4]> = sample
            .get(role.field)
            .chunks_exact(16)
            .map(|row| {
                let mut b = [0f32; 4];
                for (v, x) in b.iter_mut().zip(row.chunks_exact(4)) {
                    *v = f32::from_ne_bytes([x[0], x[1], x[2], x[3]]);
                }
                b
            })
            .collect();
        if let Some(l) = role.labels {
            let labels = self.ragged_len(l, sample);
            if labels != boxes.len() {
                return Err(format!(
                    "field `{}` has {labels} labels for {} boxes of field `{}`",
                    self.names[l],
                    boxes.len(),
                    self.names[role.field]
                ));
            }
        }
        let mut rng = Rng::for_key(key.seed, Stream::Augment, key.epoch, draw);
        role.pipeline.apply(&boxes, &mut rng)
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
        // Boxes move with the sample's draw before any field is written: the labels field,
        // wherever it lies, keeps the labels of the boxes kept.
        let moved = match &self.boxes {
            Some(role) => Some(
                self.move_boxes(role, key, draw, sample)
                    .map_err(|reason| sample_error(pick, index, reason))?,
            ),
            None => None,
        };
        for (f, out) in self.outputs.iter().enumerate() {
            let start = Instant::now();
            let dst = slots.slot(f, slot);
            let src = sample.get(f);
            match out {
                Output::Copy { .. } => dst.copy_from_slice(src),
                Output::Pad { pad, dtype, .. } => {
                    let role = self.boxes.as_ref().zip(moved.as_ref());
                    let (written, len) = match role {
                        Some((role, (kept, _))) if role.field == f => {
                            for (row, b) in dst.chunks_exact_mut(16).zip(kept) {
                                for (v, x) in row.chunks_exact_mut(4).zip(b) {
                                    v.copy_from_slice(&x.to_ne_bytes());
                                }
                            }
                            (kept.len() * 16, kept.len())
                        }
                        Some((role, (_, indices))) if role.labels == Some(f) => {
                            let n = dtype.size();
                            for (k, &i) in indices.iter().enumerate() {
                                dst[k * n..(k + 1) * n].copy_from_slice(&src[i * n..(i + 1) * n]);
                            }
                            (indices.len() * n, indices.len())
                        }
                        _ => {
                            dst[..src.len()].copy_from_slice(src);
                            (src.len(), self.ragged_len(f, sample))
                        }
                    };
                    for chunk in dst[written..].chunks_exact_mut(pad.len()) {
                        chunk.copy_from_slice(pad);
                    }
                    let len = len as i64;
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
                Output::Dense { pipeline } => {
                    // Keyed as every field of the sample is: an image and its mask draw alike.
                    let mut rng = Rng::for_key(key.seed, Stream::Augment, key.epoch, draw);
                    write_dense(pipeline, src, &mut rng, dst, pixels)
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::collate::pick::FromSource;
    use crate::collate::tests::{counting, image_stages, key};
    use crate::dtype::DType;
    use crate::source::MemorySource;

    /// Reads `indices` of `c`'s source and writes them with phase 2 into a fresh slab laid out
    /// for them: the layout, the slab and how many writes were replaced.
    fn write_all(
        c: &Collator,
        seed: u64,
        indices: &[usize],
    ) -> Result<(Vec<FieldMeta>, Vec<u8>, usize)> {
        let source = c.source().expect("a map-style collator").clone();
        let pick = FromSource(&*source);
        let mut reads = vec![Vec::new(); indices.len()];
        let mut samples = Vec::new();
        for (&index, buf) in indices.iter().zip(reads.iter_mut()) {
            samples.push((index, pick.read(index, buf)?));
        }
        let max_len = c.padded_lengths(&samples);
        let (metas, total) = c.layout(indices.len(), &max_len);
        let mut slab = vec![0xAA; total];
        let mut slots = Slots::whole(&metas, &mut slab);
        let skipped = c.write_slots(
            key(seed, 0),
            &pick,
            indices,
            Some(Draws::ByIndex),
            &samples,
            &max_len,
            &mut slots,
            &mut Vec::new(),
            &mut Pixels::default(),
            &mut Spans::default(),
        )?;
        Ok((metas, slab, skipped))
    }

    fn field<'s>(metas: &[FieldMeta], slab: &'s [u8], name: &str) -> &'s [u8] {
        let m = metas.iter().find(|m| m.name == name).expect("the field");
        &slab[m.offset..m.offset + m.num_bytes()]
    }

    fn i64s(bytes: &[u8]) -> Vec<i64> {
        bytes
            .chunks_exact(8)
            .map(|b| i64::from_ne_bytes(b.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn ragged_fields_are_padded_to_the_longest_with_lengths() {
        let row = |v: &[i32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let rows = vec![row(&[1]), row(&[2, 3, 4]), row(&[5, 6])];
        let source = MemorySource::new()
            .with_ragged("tokens", DType::I32, &[], rows)
            .unwrap();
        let c = Collator::new(Arc::new(source), Some(-1.0), None, false).unwrap();
        let (metas, slab, skipped) = write_all(&c, 0, &[0, 1, 2]).unwrap();
        assert_eq!(skipped, 0);
        let tokens: Vec<i32> = field(&metas, &slab, "tokens")
            .chunks_exact(4)
            .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(tokens, [1, -1, -1, 2, 3, 4, 5, 6, -1]);
        assert_eq!(i64s(field(&metas, &slab, "tokens_lengths")), [1, 3, 2]);
    }

    #[test]
    fn fixed_fields_are_copied_byte_for_byte_into_their_slots() {
        let c = Collator::new(counting(10), None, None, false).unwrap();
        let (metas, slab, _) = write_all(&c, 0, &[5, 2]).unwrap();
        assert_eq!(i64s(field(&metas, &slab, "x")), [5, 6, 7, 2, 3, 4]);
        assert_eq!(field(&metas, &slab, "y"), [5, 2]);
        // The alignment gap between the fields is left as it was.
        assert_eq!(slab[48], 0xAA);
    }

    #[test]
    fn slots_of_a_part_are_addressed_by_the_batchs_slot_numbers() {
        let mut x = [0u8; 6];
        let mut y = [0u8; 2];
        let mut slots = Slots::range(4, vec![(&mut x[..], 3), (&mut y[..], 1)]);
        slots.slot(0, 5).copy_from_slice(&[7, 8, 9]);
        slots.slot(1, 4).copy_from_slice(&[1]);
        assert_eq!(x, [0, 0, 0, 7, 8, 9]);
        assert_eq!(y, [1, 0]);
    }

    /// Fields `tokens` (ragged bytes, sample `i` is `lens[i]` bytes of `i`) and `label`
    /// (int64, mixed into 3 classes).
    fn labelled(lens: &[usize], labels: &[i64], skip_bad: bool) -> Collator {
        let rows = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| vec![i as u8; n])
            .collect();
        let labels = labels.iter().flat_map(|l| l.to_ne_bytes()).collect();
        let source = MemorySource::new()
            .with_ragged("tokens", DType::U8, &[], rows)
            .and_then(|s| s.with_tensor("label", DType::I64, &[], labels))
            .unwrap();
        let stages = Arc::new(image_stages(Some("mixup(alpha=1.0, num_classes=3)")));
        Collator::new(Arc::new(source), None, Some(stages), skip_bad).unwrap()
    }

    #[test]
    fn without_skip_a_failed_write_fails_with_the_samples_error() {
        let c = labelled(&[1, 1], &[0, 9], false);
        match write_all(&c, 0, &[0, 1]) {
            Err(Error::Sample { index, reason, .. }) => {
                assert_eq!(index, 1);
                assert!(reason.contains("label 9 is outside 0..3"), "{reason}");
            }
            other => panic!("expected sample 1's error, got {:?}", other.map(|r| r.2)),
        }
    }

    #[test]
    fn a_failed_write_is_replaced_by_a_candidate_that_fits_the_padded_lengths() {
        // Sample 1's label cannot be written; sample 2 reads and writes but is longer than the
        // batch's padded length (1); sample 0 fits. Find a seed whose replacements for sample 1
        // draw 2 before 0, so the length check is what passes 2 over.
        let c = labelled(&[1, 1, 5], &[0, 9, 2], true);
        let pick = FromSource(c.source().unwrap().as_ref());
        let seed = (0..100)
            .find(|&seed| {
                let drawn: Vec<usize> = replacements(key(seed, 0), &pick, 1).collect();
                let at = |i| drawn.iter().position(|&c| c == i);
                matches!((at(2), at(0)), (Some(two), Some(zero)) if two < zero)
            })
            .expect("a seed drawing 2 before 0");
        let (metas, slab, skipped) = write_all(&c, seed, &[0, 1]).unwrap();
        assert_eq!(skipped, 1);
        assert_eq!(
            field(&metas, &slab, "tokens"),
            [0, 0],
            "slot 1 holds sample 0"
        );
        assert_eq!(i64s(field(&metas, &slab, "tokens_lengths")), [1, 1]);
    }
}
