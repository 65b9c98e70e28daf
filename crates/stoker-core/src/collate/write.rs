//! Phase 2: every sample phase 1 read is written into its slot of the slab.
//!
//! A fixed-shape field is one copy; a padded ragged field is copied, padded to the batch's length
//! with the pad value, and its length written to `<name>_lengths`; a flat ragged field is copied
//! right after the rows of the slot before it, and where its rows end written to
//! `<name>_offsets`; an image goes through the image stage ([`super::image`]); a label to be
//! mixed is written one-hot ([`super::mix`]). A sample whose write fails (an image that does not
//! decode, a label out of range) is replaced under `on_error=skip` by a candidate that fits the
//! layout phase 1 fixed, and keeps its slot's draw.
//!
//! What fits: a padded field's padded length; for a flat field, the rows phase 1 read for the
//! slots up to this one, less the rows written before it. Slots are written in order, so every
//! later slot keeps the room its own sample was read with, and the rows never outgrow the slab.

use std::ops::Range;
use std::time::Instant;

use crate::batch::{FieldMeta, OneSample, OwnedSamples, RoutedImage};
use crate::decode::{dimensions, DecodePath};
use crate::error::{Error, Result};
use crate::rng::{Rng, Stream};
use crate::sampler::Draws;
use crate::source::Sample;
use crate::span::{SpanKind, Stage};
use crate::stats::Spans;

use super::gpu_decode;
use super::image::{write_dense, write_image, write_mask, write_tensor_image, Pixels, SampleBoxes};
use super::layout::{BoxRole, KeypointRole, Output};
use super::mix::write_soft_label;
use super::pick::{gave_up, not_replaced, replacements, sample_error, FromOwned, FromSource, Pick};
use super::{BatchKey, Collator};

/// Where a replacement is written: the rows each ragged field has room for in its slot (it
/// must fit them) and the slots.
struct Target<'a, 's> {
    room: &'a [usize],
    slots: &'a mut Slots<'s>,
}

/// The slots one build writes: for every field of the batch's layout (`<name>_lengths` and
/// `<name>_offsets` fields included), the bytes of slots `first..first + count` — the whole
/// batch, or one part's range (never a batch with ragged fields, see [`super::PartedBatch`]).
/// A flat ragged field has no slots of its own: it is addressed by bytes ([`Slots::bytes`]).
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

    /// Bytes `range` of field `field`; `None` past its end.
    fn bytes(&mut self, field: usize, range: Range<usize>) -> Option<&mut [u8]> {
        self.fields[field].0.get_mut(range)
    }

    /// Int64 element `slot` of field `field` (an `<name>_offsets` field) as a row count.
    fn offset(&mut self, field: usize, slot: usize) -> Result<usize> {
        let mut v = [0u8; 8];
        v.copy_from_slice(self.slot(field, slot));
        usize::try_from(i64::from_ne_bytes(v))
            .map_err(|_| Error::Internal(format!("offset {slot} is negative")))
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
        extents: &[usize],
        slots: &mut Slots<'_>,
        spare: &mut Vec<u8>,
        pixels: &mut Pixels,
        spans: &mut Spans,
    ) -> Result<usize> {
        let mut skipped = 0;
        pixels.routed = Default::default();
        // Per ragged field, the rows a slot may write: a padded field's padded length; for a
        // flat one the rows read for the slots so far (`read`) less those written before it.
        let mut room = extents.to_vec();
        let mut read = vec![0usize; self.outputs.len()];
        if slots.first == 0 {
            for f in (0..self.outputs.len()).filter(|&f| self.is_flat(f)) {
                let extra = self.extra_field(f);
                slots.slot(extra, 0).copy_from_slice(&0i64.to_ne_bytes());
            }
        }
        for (i, (index, sample)) in samples.iter().enumerate() {
            let slot = slots.first + i;
            for f in (0..self.outputs.len()).filter(|&f| self.is_flat(f)) {
                read[f] += self.ragged_len(f, sample);
                let written = slots.offset(self.extra_field(f), slot)?;
                room[f] = read[f].checked_sub(written).ok_or_else(|| {
                    Error::Internal(format!(
                        "field `{}`: slots before {slot} wrote {written} rows, more than the \
                         {} they were read with",
                        self.names[f], read[f]
                    ))
                })?;
            }
            // The slot's draw: a replacement keeps the draw of the sample it replaces. Streamed
            // samples are keyed by their position in this rank's stream.
            let draw = match draws {
                Some(draws) => draws.at(slot, indices[slot]),
                None => pick.index(indices[slot]),
            };
            let start = Instant::now();
            let mut used = *index;
            if let Err(err) = self.write(
                key, pick, slot, *index, draw, sample, &room, slots, pixels, spans,
            ) {
                // An image of the sample may have been left to the device before another field
                // failed.
                pixels.routed.unroute(slot);
                if !(self.skip_bad && err.is_sample_error()) {
                    return Err(err);
                }
                let target = Target { room: &room, slots };
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
    /// replacement's ragged fields must fit the room the batch's layout leaves the slot.
    /// Returns the replacement's index.
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
        let Target { room, slots } = target;
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
                    !matches!(o, Output::Ragged { .. }) || self.ragged_len(f, &sample) <= room[f]
                });
            if fits
                && self
                    .write(
                        key, pick, slot, candidate, draw, &sample, room, slots, pixels, spans,
                    )
                    .is_ok()
            {
                return Ok(candidate);
            }
            pixels.routed.unroute(slot);
        }
        Err(gave_up(err))
    }

    /// The sample that replaces routed image `image` when neither the device nor the CPU could
    /// decode it (`err` says why), under `on_error=skip`: the first of the candidates a worker
    /// would have tried ([`replacements`]: from the source, or from a stream batch's `owned`
    /// samples) that reads and writes, written on the CPU with the replaced sample's draw as a
    /// batch of one. A batch with ragged fields has a layout its own samples fixed: it keeps
    /// `err`, saying why it was not replaced.
    pub(crate) fn replace_routed(
        &self,
        image: &RoutedImage,
        owned: Option<&OwnedSamples>,
        err: Error,
    ) -> Result<OneSample> {
        if !self.skip_bad {
            return Err(err);
        }
        if let Some(f) =
            (0..self.outputs.len()).find(|&f| matches!(self.outputs[f], Output::Ragged { .. }))
        {
            let why = format!(
                "field `{}` is ragged, so the batch's layout may not fit another sample",
                self.names[f]
            );
            return Err(not_replaced(err, &why));
        }
        let (from_source, owned_samples, from_owned);
        // The bad sample as its pick knows it: a source's index, or a stream batch's slot.
        let (pick, index): (&dyn Pick, usize) = match (self.source.as_deref(), owned) {
            (Some(source), _) => {
                from_source = FromSource(source);
                (&from_source, image.index as usize)
            }
            (None, Some(owned)) => {
                owned_samples = owned.lock();
                from_owned = FromOwned(&owned_samples);
                (&from_owned, image.slot)
            }
            (None, None) => {
                return Err(Error::Internal(
                    "a stream's batch was built without its samples for replacements".into(),
                ))
            }
        };
        let (seed, epoch, draw) = image.draw_key;
        // A sample's replacements and augmentation depend on neither the batch's position nor
        // the rank (only mixup/cutmix do, which GPU decoding refuses).
        let key = BatchKey {
            seed,
            epoch,
            position: 0,
            rank: 0,
        };
        let none = vec![0; self.outputs.len()];
        let (metas, total) = self.layout(1, &none);
        let mut bytes = vec![0; total];
        let mut slots = Slots::whole(&metas, &mut bytes);
        let target = Target {
            room: &none,
            slots: &mut slots,
        };
        let mut pixels = Pixels::default();
        pixels.on_cpu = true;
        let (mut spare, mut spans) = (Vec::new(), Spans::default());
        self.write_replacement(
            key,
            pick,
            0,
            index,
            draw,
            target,
            &mut spare,
            &mut pixels,
            &mut spans,
            err,
        )?;
        pick.verify()?;
        Ok(OneSample { metas, bytes })
    }

    /// Leaves encoded image field `field` of the sample at `(slot, index)` (draw `draw`) to
    /// the device's decoder, when GPU decoding is on, the share takes the sample and the device
    /// can write it (see [`gpu_decode::route`]); records the planning as its decode.
    #[allow(clippy::too_many_arguments)]
    fn route_to_device(
        &self,
        field: usize,
        (slot, index, draw): (usize, usize, u64),
        (key, pick): (BatchKey, &dyn Pick),
        encoded: &[u8],
        pixels: &mut Pixels,
        spans: &mut Spans,
    ) -> bool {
        let Some(gpu) = self.gpu.as_ref().filter(|_| !pixels.on_cpu) else {
            return false;
        };
        let (Some(true), Output::Image { pipeline, .. }) =
            (gpu.fields.get(field).copied(), &self.outputs[field])
        else {
            return false;
        };
        let sample_index = pick.index(index);
        if !gpu.share.routes(sample_index) {
            return false;
        }
        let start = Instant::now();
        let sample = gpu_decode::Sample {
            field,
            slot,
            index: sample_index,
            encoded,
            key: (key.seed, key.epoch, draw),
        };
        let what = || pick.describe(index);
        if !gpu_decode::route(pipeline, sample, what, gpu.max_pixels, &mut pixels.routed) {
            return false;
        }
        spans.count_decode(DecodePath::Device);
        spans.push(
            SpanKind::Stage(Stage::Decode),
            slot,
            sample_index as usize,
            start,
        );
        true
    }

    /// The `(width, height)` of encoded image field `image` of `sample`: as the source stored
    /// it, or read from its header.
    fn encoded_size(
        &self,
        sample: &Sample<'_>,
        image: usize,
    ) -> std::result::Result<(usize, usize), String> {
        match sample.image_size(image) {
            Some((w, h)) => Ok((w as usize, h as usize)),
            None => dimensions(sample.get(image))
                .map(|d| (d.width, d.height))
                .map_err(|e| format!("image `{}`: {e}", self.names[image])),
        }
    }

    /// `boxes` (the sample's, as stored) moved by its draw (keyed as its image's): the kept
    /// boxes and their indices among the sample's. The labels and per-box fields must have one
    /// row per box. `size` is
    /// an encoded image's `(width, height)` (read per sample), which the boxes are in.
    fn move_boxes(
        &self,
        role: &BoxRole,
        (key, draw): (BatchKey, u64),
        sample: &Sample<'_>,
        (boxes, size): (&[[f32; 4]], Option<(usize, usize)>),
    ) -> std::result::Result<Moved, String> {
        for f in role.labels.iter().chain(&role.per_box) {
            let rows = self.ragged_len(*f, sample);
            if rows != boxes.len() {
                let what = if role.labels == Some(*f) {
                    "labels"
                } else {
                    "rows"
                };
                return Err(format!(
                    "field `{}` has {rows} {what} for {} boxes of field `{}`",
                    self.names[*f],
                    boxes.len(),
                    self.names[role.field]
                ));
            }
        }
        // An encoded image's boxes are in its size, read from its header (or as stored). They
        // are annotations read from files (a tar `json` member, COCO, a packed field): checked
        // before they move. A tensor image's boxes move as torchvision moves them, clamped,
        // and a degenerate one dropped.
        let sized;
        let pipeline = match size {
            None => &role.pipeline,
            Some((width, height)) => {
                sized = role.pipeline.for_size(width, height);
                sized
                    .check(boxes)
                    .map_err(|e| format!("field `{}`: {e}", self.names[role.field]))?;
                &sized
            }
        };
        let mut rng = Rng::for_key(key.seed, Stream::Augment, key.epoch, draw);
        pipeline.apply(boxes, &mut rng)
    }

    /// The keypoints of `sample` moved by its draw (keyed as its image's), rows as stored;
    /// `boxes` are the sample's (`xyxy`), which `random_iou_crop` draws from, and `size` an
    /// encoded image's `(width, height)` (read per sample), which the keypoints are in.
    fn move_keypoints(
        &self,
        role: &KeypointRole,
        (key, draw): (BatchKey, u64),
        sample: &Sample<'_>,
        (boxes, size): (SampleBoxes<'_>, Option<(usize, usize)>),
    ) -> std::result::Result<Vec<f32>, String> {
        let mut points: Vec<f32> = sample
            .get(role.field)
            .chunks_exact(4)
            .map(|x| f32::from_ne_bytes([x[0], x[1], x[2], x[3]]))
            .collect();
        let sized;
        let pipeline = match size {
            None => &role.pipeline,
            Some((width, height)) => {
                sized = role.pipeline.for_size(width, height);
                &sized
            }
        };
        let mut rng = Rng::for_key(key.seed, Stream::Augment, key.epoch, draw);
        pipeline
            .apply(&mut points, role.columns, boxes, &mut rng)
            .map_err(|reason| format!("field `{}`: {reason}", self.names[role.field]))?;
        Ok(points)
    }

    /// Writes `sample` (dataset index `index`, augmented as draw `draw`) into slot `slot` of
    /// every field; ragged field `f` may write `room[f]` rows. A flat field's offset of the
    /// next slot is written only once every field is: a slot whose write fails and is written
    /// again starts its rows where it did the first time.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        key: BatchKey,
        pick: &dyn Pick,
        slot: usize,
        index: usize,
        draw: u64,
        sample: &Sample<'_>,
        room: &[usize],
        slots: &mut Slots<'_>,
        pixels: &mut Pixels,
        spans: &mut Spans,
    ) -> Result<()> {
        // Boxes move with the sample's draw before any field is written: the labels and per-box
        // fields, wherever they lie, keep the rows of the boxes kept.
        // Every field plans `random_iou_crop` from the same boxes (xyxy pixels). Boxes and
        // keypoints of an encoded image are in its size, read once per sample.
        let encoded = self
            .boxes
            .as_ref()
            .and_then(|role| role.encoded)
            .or_else(|| self.keypoints.as_ref().and_then(|role| role.encoded));
        let size = encoded
            .map(|image| self.encoded_size(sample, image))
            .transpose()
            .map_err(|reason| sample_error(pick, index, reason))?;
        let stored = self
            .boxes
            .as_ref()
            .map(|role| read_boxes(sample.get(role.field)));
        let source = self
            .boxes
            .as_ref()
            .zip(stored.as_ref())
            .map(|(role, stored)| role.pipeline.source_xyxy(stored));
        let boxes = source.as_deref();
        let moved = match self.boxes.as_ref().zip(stored.as_ref()) {
            Some((role, stored)) => Some(
                self.move_boxes(role, (key, draw), sample, (stored, size))
                    .map_err(|reason| sample_error(pick, index, reason))?,
            ),
            None => None,
        };
        let points = match &self.keypoints {
            Some(role) => Some(
                self.move_keypoints(role, (key, draw), sample, (boxes, size))
                    .map_err(|reason| sample_error(pick, index, reason))?,
            ),
            None => None,
        };
        for (f, out) in self.outputs.iter().enumerate() {
            let start = Instant::now();
            let src = sample.get(f);
            match out {
                Output::Copy { .. } => slots.slot(f, slot).copy_from_slice(src),
                Output::Ragged { .. } => {
                    let moved = self.boxes.as_ref().zip(moved.as_ref());
                    let points = match &self.keypoints {
                        Some(role) if role.field == f => points.as_deref(),
                        _ => None,
                    };
                    self.write_ragged(f, slot, sample, (moved, points), room[f], slots)?;
                }
                Output::SoftLabel {
                    src: label_type,
                    num_classes,
                    smoothing,
                } => {
                    let label = (*label_type, *num_classes, *smoothing);
                    write_soft_label(label, &self.names[f], src, slots.slot(f, slot))
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
                    let dst = slots.slot(f, slot);
                    write_tensor_image(pipeline, size, (src, boxes), &mut rng, dst, pixels)
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
                    write_dense(
                        pipeline,
                        (src, boxes),
                        &mut rng,
                        slots.slot(f, slot),
                        pixels,
                    )
                    .map_err(|reason| sample_error(pick, index, reason))?;
                    spans.push(
                        SpanKind::Stage(Stage::Transform),
                        slot,
                        pick.index(index) as usize,
                        start,
                    );
                    continue;
                }
                Output::EncodedMask { stages, image, .. } => {
                    // Keyed as its image: the same draws, planned on the same size.
                    let mut rng = Rng::for_key(key.seed, Stream::Augment, key.epoch, draw);
                    let image = (
                        sample.get(*image),
                        sample.image_size(*image),
                        &*self.names[*image],
                    );
                    let dst = slots.slot(f, slot);
                    write_mask(stages, (src, boxes), image, &mut rng, dst, pixels).map_err(
                        |reason| {
                            sample_error(pick, index, format!("mask `{}`: {reason}", self.names[f]))
                        },
                    )?;
                    spans.push(
                        SpanKind::Stage(Stage::Transform),
                        slot,
                        pick.index(index) as usize,
                        start,
                    );
                    continue;
                }
                Output::Image { stages, pipeline } => {
                    if self.route_to_device(f, (slot, index, draw), (key, pick), src, pixels, spans)
                    {
                        continue; // the prefetcher decodes it on the device
                    }
                    let mut rng = Rng::for_key(key.seed, Stream::Augment, key.epoch, draw);
                    let at = (slot, pick.index(index) as usize);
                    let image = (src, sample.image_size(f), boxes);
                    let dst = slots.slot(f, slot);
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
        // Every field is written: the flat fields' rows of this slot are kept.
        for f in (0..self.outputs.len()).filter(|&f| self.is_flat(f)) {
            let extra = self.extra_field(f);
            let end = slots.offset(extra, slot)? + self.written_len(f, sample, moved.as_ref());
            let end = i64::try_from(end)
                .map_err(|_| Error::Internal(format!("offset {end} does not fit int64")))?;
            slots
                .slot(extra, slot + 1)
                .copy_from_slice(&end.to_ne_bytes());
        }
        Ok(())
    }

    /// The batch field after the source's that belongs to ragged field `field`: its
    /// `<name>_lengths` or `<name>_offsets`.
    pub(super) fn extra_field(&self, field: usize) -> usize {
        let before = self.outputs[..field]
            .iter()
            .filter(|o| matches!(o, Output::Ragged { .. }))
            .count();
        self.outputs.len() + before
    }

    /// Rows ragged field `field` of `sample` writes: the boxes a draw kept (and their labels),
    /// or every row read.
    fn written_len(&self, field: usize, sample: &Sample<'_>, moved: Option<&Moved>) -> usize {
        match self.boxes.as_ref().zip(moved) {
            Some((role, (kept, _))) if role.field == field => kept.len(),
            Some((role, (_, indices))) if role.follows(field) => indices.len(),
            _ => self.ragged_len(field, sample),
        }
    }

    /// Writes ragged field `field` of `sample` (its boxes and labels as `moved` by the draw, or
    /// its keypoints as moved, `points`) into slot `slot`: padded, with its length in
    /// `<name>_lengths`; or flat, starting where the slot's offset says (the next offset is
    /// written by [`Collator::write`]). At most `room` rows.
    fn write_ragged(
        &self,
        field: usize,
        slot: usize,
        sample: &Sample<'_>,
        (moved, points): (Option<(&BoxRole, &Moved)>, Option<&[f32]>),
        room: usize,
        slots: &mut Slots<'_>,
    ) -> Result<()> {
        let Output::Ragged { dtype, inner, pad } = &self.outputs[field] else {
            return Err(Error::Internal(format!(
                "field `{}` is not ragged",
                self.names[field]
            )));
        };
        let row = inner.iter().product::<usize>() * dtype.size();
        let extra = self.extra_field(field);
        let len = self.written_len(field, sample, moved.map(|(_, m)| m));
        if len > room {
            return Err(Error::Internal(format!(
                "field `{}`: {len} rows for slot {slot}, which has room for {room}",
                self.names[field]
            )));
        }
        let dst = match pad {
            Some(_) => slots.slot(field, slot),
            None => {
                let start = slots.offset(extra, slot)? * row;
                slots
                    .bytes(field, start..start + room * row)
                    .ok_or_else(|| {
                        Error::Internal(format!(
                            "field `{}`: slot {slot}'s rows lie past the field's end",
                            self.names[field]
                        ))
                    })?
            }
        };
        let src = sample.get(field);
        let written = match (moved, points) {
            (_, Some(points)) => {
                for (v, x) in dst.chunks_exact_mut(4).zip(points) {
                    v.copy_from_slice(&x.to_ne_bytes());
                }
                points.len() * 4
            }
            (Some((role, (kept, _))), None) if role.field == field => {
                for (row, b) in dst.chunks_exact_mut(16).zip(kept) {
                    for (v, x) in row.chunks_exact_mut(4).zip(b) {
                        v.copy_from_slice(&x.to_ne_bytes());
                    }
                }
                kept.len() * 16
            }
            (Some((role, (_, indices))), None) if role.follows(field) => {
                for (k, &i) in indices.iter().enumerate() {
                    dst[k * row..(k + 1) * row].copy_from_slice(&src[i * row..(i + 1) * row]);
                }
                indices.len() * row
            }
            _ => {
                dst[..src.len()].copy_from_slice(src);
                src.len()
            }
        };
        if let Some(pad) = pad {
            for chunk in dst[written..].chunks_exact_mut(pad.len()) {
                chunk.copy_from_slice(pad);
            }
            slots
                .slot(extra, slot)
                .copy_from_slice(&(len as i64).to_ne_bytes());
        }
        Ok(())
    }

    /// Cuts each flat field of a written batch (`metas`, in `slab`) to the rows its samples
    /// wrote, its last offset: fewer than the layout's room when a draw dropped boxes or a
    /// replacement was shorter than the sample it replaced.
    pub(super) fn cut_flat(&self, metas: &mut [FieldMeta], slab: &[u8]) -> Result<()> {
        for f in (0..self.outputs.len()).filter(|&f| self.is_flat(f)) {
            let offsets = &metas[self.extra_field(f)];
            let at = offsets.offset + offsets.num_bytes() - 8;
            let last = slab
                .get(at..at + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(i64::from_ne_bytes)
                .and_then(|v| usize::try_from(v).ok())
                .filter(|&rows| rows <= metas[f].shape[0])
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "field `{}`: its last offset is outside its {} rows",
                        self.names[f], metas[f].shape[0]
                    ))
                })?;
            metas[f].shape[0] = last;
        }
        Ok(())
    }
}

/// A ragged boxes field's rows: float32 rows of 4 (a partial row, which reading refuses, is
/// left out).
fn read_boxes(bytes: &[u8]) -> Vec<[f32; 4]> {
    bytes
        .chunks_exact(16)
        .map(|row| {
            let mut b = [0f32; 4];
            for (v, x) in b.iter_mut().zip(row.chunks_exact(4)) {
                *v = f32::from_ne_bytes([x[0], x[1], x[2], x[3]]);
            }
            b
        })
        .collect()
}

/// Boxes a draw kept and their indices among the sample's.
type Moved = (Vec<[f32; 4]>, Vec<usize>);

#[cfg(test)]
mod tests;
