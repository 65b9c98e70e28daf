//! GPU decoding's step of a copy (`jpeg_decoder=gpu`/`auto`): the images a host batch left to
//! the device (see [`DeviceDecodes`]) are decoded into the prefetcher's scratch and resized
//! into their slots of the uint8 fields, on the copy stream, after the fields' copies and
//! before the casts of `gpu_normalize`.
//!
//! The scratch is one buffer of [`DEVICE_DECODE_SCRATCH`] bytes, allocated at the first routed
//! image and reused: a batch's images are decoded in groups that fit it, and work on one stream
//! runs in order, so a group never overwrites pixels a queued resize still reads. An image the
//! device refuses is decoded here on the CPU with the plan the worker drew, and copied into its
//! slot; one the CPU cannot decode either (its header reads, its data does not) is replaced under
//! `on_error=skip` by the sample a worker would have put in its place ([`ReplaceRouted`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::CopyStream;
use crate::batch::{DeviceDecodes, ReplaceRouted, RoutedImage, FIELD_ALIGN};
use crate::collate::DEVICE_DECODE_SCRATCH;
use crate::cuda::device::{DeviceBackend, DevicePtr, JpegJob, ResizeJob};
use crate::decode::{decode, read_header, DecodeBuffers, JpegDecoder};
use crate::error::{Error, Result};
use crate::rng::{Rng, Stream as RngStream};
use crate::transform::Scratch;

/// The device memory images are decoded into, freed once the work queued on it is done.
pub(super) struct DecodeScratch {
    backend: Arc<dyn DeviceBackend>,
    stream: Arc<CopyStream>,
    ptr: DevicePtr,
    /// Device memory the prefetcher holds (stats `device_memory_bytes`).
    held_bytes: Arc<AtomicU64>,
    /// The decoder's own device memory last counted in `held_bytes`.
    decoder_bytes: Cell<u64>,
}

impl DecodeScratch {
    pub(super) fn new(
        backend: &Arc<dyn DeviceBackend>,
        stream: &Arc<CopyStream>,
        held_bytes: &Arc<AtomicU64>,
    ) -> Result<DecodeScratch> {
        let ptr = backend.alloc(DEVICE_DECODE_SCRATCH)?;
        held_bytes.fetch_add(DEVICE_DECODE_SCRATCH as u64, Ordering::Relaxed);
        Ok(DecodeScratch {
            backend: Arc::clone(backend),
            stream: Arc::clone(stream),
            ptr,
            held_bytes: Arc::clone(held_bytes),
            decoder_bytes: Cell::new(0),
        })
    }

    /// The decoder's own device memory, as last counted.
    pub(super) fn decoder_bytes(&self) -> u64 {
        self.decoder_bytes.get()
    }

    /// Counts the decoder's own device memory (nvJPEG's buffers, grown to the largest images
    /// decoded) in `held_bytes` as it is now.
    fn count_decoder(&self) {
        let now = self.backend.jpeg_decoder_bytes();
        let before = self.decoder_bytes.replace(now);
        if now >= before {
            self.held_bytes.fetch_add(now - before, Ordering::Relaxed);
        } else {
            self.held_bytes.fetch_sub(before - now, Ordering::Relaxed);
        }
    }
}

impl Drop for DecodeScratch {
    fn drop(&mut self) {
        // Wait for whatever queued work reads or writes the scratch; if no event can be made
        // the context is broken, and the memory is leaked rather than freed under a kernel.
        let Ok(event) = self.backend.create_event() else {
            return;
        };
        let done = self
            .backend
            .record_event(event, self.stream.stream)
            .and_then(|()| self.backend.synchronize_event(event))
            .is_ok();
        // SAFETY: created above, destroyed once.
        unsafe { self.backend.destroy_event(event) };
        if done {
            // SAFETY: allocated in `new`; the event above waited for every use on the copy
            // stream, the only stream that uses it.
            unsafe { self.backend.free(self.ptr) };
            self.held_bytes
                .fetch_sub(DEVICE_DECODE_SCRATCH as u64, Ordering::Relaxed);
        }
        // The decoder's memory goes with the device, not this loader: no longer counted here.
        self.held_bytes
            .fetch_sub(self.decoder_bytes.get(), Ordering::Relaxed);
    }
}

/// Where a field's samples lie on the device (an address in the batch's buffer): the field
/// itself, or under `gpu_normalize` the cast's uint8 input; the bytes of one sample; and whether
/// they are uint8 (the only fields an image decoded on the device is resized into).
#[derive(Clone, Copy, Debug)]
pub(super) struct DeviceField {
    pub at: DevicePtr,
    pub sample_bytes: usize,
    pub uint8: bool,
}

impl DeviceField {
    /// Where slot `slot`'s sample lies.
    fn slot(&self, slot: usize) -> DevicePtr {
        self.at + (slot * self.sample_bytes) as DevicePtr
    }
}

/// Queues the decode and resize of every image of `decodes` into `fields` (by field index),
/// reading the taps copied to `taps`; images the device refuses are decoded on the CPU into
/// `decodes.fallback` and copied, and those the CPU cannot decode either are replaced through
/// `replace` (counted in `decodes.replaced`), or fail the batch without it. Returns the bytes
/// sent to the device (the JPEGs, the fallbacks' pixels, the replacements' fields).
pub(super) fn queue(
    backend: &dyn DeviceBackend,
    scratch: &DecodeScratch,
    decodes: &mut DeviceDecodes,
    fields: &[Option<DeviceField>],
    taps: DevicePtr,
    stream: crate::cuda::Stream,
    replace: Option<&dyn ReplaceRouted>,
) -> Result<usize> {
    let mut sent = 0;
    let mut refused = Vec::new();
    let mut failed = Vec::new();
    let mut first = 0;
    let images = &decodes.images;
    while first < images.len() {
        // The next group: as many images as fit the scratch (one at least: a worker routes
        // only images that fit alone).
        let mut jobs = Vec::new();
        let mut used = 0usize;
        for image in &images[first..] {
            let bytes = image.decoded_bytes().next_multiple_of(FIELD_ALIGN);
            if !jobs.is_empty() && used + bytes > DEVICE_DECODE_SCRATCH {
                break;
            }
            jobs.push(JpegJob {
                data: &decodes.jpegs[image.jpeg.clone()],
                width: image.width,
                height: image.height,
                dst: scratch.ptr + used as DevicePtr,
            });
            used += bytes;
        }
        failed.clear();
        // SAFETY: the JPEGs are the host batch's, which the prefetcher keeps until the slot's
        // event (recorded after this) completes; every job's pixels fit the scratch, which
        // lives until the stream's work is done (`DecodeScratch::drop`).
        unsafe { backend.decode_jpegs_async(&jobs, stream, &mut failed) }?;
        scratch.count_decoder();
        for (k, (image, job)) in images[first..].iter().zip(&jobs).enumerate() {
            if failed.contains(&k) {
                refused.push(first + k);
                continue;
            }
            let job = resize_job(image, job.dst, fields, taps)?;
            // SAFETY: the source is the group's pixels in the scratch, the destination the
            // image's slot in the buffer (apart from the scratch and the taps), the taps the
            // ones copied to `taps`; all stay allocated until the slot's event completes.
            unsafe { backend.resize_async(&job, stream) }?;
        }
        sent += jobs.iter().map(|j| j.data.len()).sum::<usize>();
        first += jobs.len();
    }
    if !refused.is_empty() {
        sent += decode_on_cpu(backend, decodes, &refused, fields, stream, replace)?;
    }
    Ok(sent)
}

/// The resize of `image`, decoded at `src`, into its slot.
fn resize_job(
    image: &RoutedImage,
    src: DevicePtr,
    fields: &[Option<DeviceField>],
    taps: DevicePtr,
) -> Result<ResizeJob> {
    let field = device_field(fields, image.field)?;
    if !field.uint8 {
        return Err(Error::Internal(format!(
            "field {} has an image for the device but is not uint8 there",
            image.field
        )));
    }
    let at = taps + image.taps.start as DevicePtr;
    let [x_spans, x_weights, y_spans, y_weights] =
        image.tap_offsets().map(|offset| at + offset as DevicePtr);
    let plan = &image.plan;
    Ok(ResizeJob {
        src,
        src_width: image.width,
        src_height: image.height,
        dst: field.slot(image.slot),
        width: plan.width as u32,
        height: plan.height as u32,
        planar: image.planar,
        flip: plan.flip,
        x_spans,
        x_weights,
        x_taps: image.x_taps,
        y_spans,
        y_weights,
        y_taps: image.y_taps,
    })
}

/// Where field `field` lies on the device.
fn device_field(fields: &[Option<DeviceField>], field: usize) -> Result<DeviceField> {
    fields.get(field).copied().flatten().ok_or_else(|| {
        Error::Internal(format!(
            "field {field} is written on the device but was not copied there"
        ))
    })
}

/// Bytes of `decodes.fallback` to copy into one slot of one field.
struct Placement {
    field: usize,
    slot: usize,
    start: usize,
    len: usize,
}

/// Decodes the images `refused` (indices into `decodes.images`) on the CPU with the plans their
/// workers drew, into `decodes.fallback`, and queues their copies into their slots. A slot
/// whose image the CPU cannot decode either gets its replacement from `replace`, every field of
/// it, copied after the images (so that it overwrites what other images of the sample left);
/// without `replace` the batch fails, naming the sample. Returns the bytes copied.
fn decode_on_cpu(
    backend: &dyn DeviceBackend,
    decodes: &mut DeviceDecodes,
    refused: &[usize],
    fields: &[Option<DeviceField>],
    stream: crate::cuda::Stream,
    replace: Option<&dyn ReplaceRouted>,
) -> Result<usize> {
    let mut buffers = DecodeBuffers::default();
    let mut scratch = Scratch::default();
    let mut fallback = std::mem::take(&mut decodes.fallback);
    fallback.clear();
    let mut images = Vec::with_capacity(refused.len());
    let mut replacements = Vec::new();
    let mut replaced_slots = Vec::new();
    for &i in refused {
        let image = &decodes.images[i];
        if replaced_slots.contains(&image.slot) {
            continue;
        }
        let pipeline = decodes
            .pipelines
            .get(image.field)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Internal(format!("no pipeline for field {}", image.field)))?;
        let jpeg = &decodes.jpegs[image.jpeg.clone()];
        let start = fallback.len();
        fallback.resize(start + pipeline.output_bytes(), 0);
        // The worker checked the size against `max_image_pixels`. The plan holds every draw: a
        // pipeline the device runs has no op after it.
        let mut unused = Rng::for_key(0, RngStream::Augment, 0, 0);
        let decoded = read_header(jpeg, u64::MAX, JpegDecoder::Auto, &mut buffers)
            .and_then(|header| decode(jpeg, &header, None, &mut buffers))
            .and_then(|decoded| {
                pipeline.apply_decoded(
                    &buffers.rgb,
                    &decoded,
                    image.plan,
                    &mut unused,
                    &mut fallback[start..],
                    &mut scratch,
                )
            });
        let reason = match decoded {
            Ok(()) => {
                images.push(Placement {
                    field: image.field,
                    slot: image.slot,
                    start,
                    len: fallback.len() - start,
                });
                continue;
            }
            Err(reason) => reason,
        };
        fallback.truncate(start);
        let err = Error::Sample {
            index: image.index,
            what: image.what.clone(),
            reason: format!(
                "the device's JPEG decoder refused it, and the CPU could not decode it either: \
                 {reason}"
            ),
        };
        let Some(replace) = replace else {
            return Err(err);
        };
        let one = replace.replace(image, decodes.owned.as_ref(), err)?;
        for (field, meta) in one.metas.iter().enumerate() {
            let start = fallback.len();
            let bytes = one
                .bytes
                .get(meta.offset..meta.offset + meta.num_bytes())
                .ok_or_else(|| Error::Internal(format!("field {field} lies past its sample")))?;
            fallback.extend_from_slice(bytes);
            replacements.push(Placement {
                field,
                slot: image.slot,
                start,
                len: bytes.len(),
            });
        }
        replaced_slots.push(image.slot);
    }
    let mut sent = 0;
    for Placement {
        field,
        slot,
        start,
        len,
    } in images.into_iter().chain(replacements)
    {
        let place = device_field(fields, field)?;
        if len != place.sample_bytes {
            return Err(Error::Internal(format!(
                "field {field}: a sample of {} bytes on the device, {len} written",
                place.sample_bytes
            )));
        }
        // SAFETY: `fallback` is not resized again: it moves into the host batch below and is
        // not touched until the batch is dropped, after the slot's event; the destination is
        // the slot's bytes in the buffer.
        unsafe {
            backend.copy_to_device_async(place.slot(slot), fallback[start..].as_ptr(), len, stream)
        }?;
        sent += len;
    }
    decodes.fallback = fallback;
    decodes.replaced = replaced_slots.len();
    Ok(sent)
}
