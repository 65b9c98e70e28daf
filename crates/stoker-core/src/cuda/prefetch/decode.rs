//! GPU decoding's step of a copy (`jpeg_decoder=gpu`/`auto`): the images a host batch left to
//! the device (see [`DeviceDecodes`]) are decoded into the prefetcher's scratch and resized
//! into their slots of the uint8 fields, on the copy stream, after the fields' copies and
//! before the casts of `gpu_normalize`.
//!
//! The scratch is one buffer of [`DEVICE_DECODE_SCRATCH`] bytes, allocated at the first routed
//! image and reused: a batch's images are decoded in groups that fit it, and work on one stream
//! runs in order, so a group never overwrites pixels a queued resize still reads. An image the
//! device refuses is decoded here on the CPU with the plan the worker drew, and copied into its
//! slot.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::CopyStream;
use crate::batch::{DeviceDecodes, RoutedImage, FIELD_ALIGN};
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

/// Where a field's uint8 samples lie on the device (an address in the batch's buffer): the
/// field itself, or under `gpu_normalize` the cast's input; and the bytes of one sample.
#[derive(Clone, Copy, Debug)]
pub(super) struct Uint8Field {
    pub at: DevicePtr,
    pub sample_bytes: usize,
}

/// Queues the decode and resize of every image of `decodes` into `fields` (by field index),
/// reading the taps copied to `taps`; images the device refuses are decoded
/// on the CPU into `decodes.fallback` and copied. Returns the bytes sent to the device (the
/// JPEGs, the fallbacks' pixels).
pub(super) fn queue(
    backend: &dyn DeviceBackend,
    scratch: &DecodeScratch,
    decodes: &mut DeviceDecodes,
    fields: &[Option<Uint8Field>],
    taps: DevicePtr,
    stream: crate::cuda::Stream,
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
        sent += decode_on_cpu(backend, decodes, &refused, fields, stream)?;
    }
    Ok(sent)
}

/// The resize of `image`, decoded at `src`, into its slot.
fn resize_job(
    image: &RoutedImage,
    src: DevicePtr,
    fields: &[Option<Uint8Field>],
    taps: DevicePtr,
) -> Result<ResizeJob> {
    let field = uint8_field(fields, image)?;
    let at = taps + image.taps.start as DevicePtr;
    let [x_spans, x_weights, y_spans, y_weights] =
        image.tap_offsets().map(|offset| at + offset as DevicePtr);
    let plan = &image.plan;
    Ok(ResizeJob {
        src,
        src_width: image.width,
        src_height: image.height,
        dst: field.at + (image.slot * field.sample_bytes) as DevicePtr,
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

/// Where `image`'s field lies on the device.
fn uint8_field(fields: &[Option<Uint8Field>], image: &RoutedImage) -> Result<Uint8Field> {
    fields.get(image.field).copied().flatten().ok_or_else(|| {
        Error::Internal(format!(
            "field {} has an image for the device but is not uint8 there",
            image.field
        ))
    })
}

/// Decodes the images `refused` (indices into `decodes.images`) on the CPU with the plans their
/// workers drew, into `decodes.fallback`, and queues their copies into their slots. Returns
/// the bytes copied. An image the CPU cannot decode either fails the batch, naming it.
fn decode_on_cpu(
    backend: &dyn DeviceBackend,
    decodes: &mut DeviceDecodes,
    refused: &[usize],
    fields: &[Option<Uint8Field>],
    stream: crate::cuda::Stream,
) -> Result<usize> {
    let mut buffers = DecodeBuffers::default();
    let mut scratch = Scratch::default();
    let mut fallback = std::mem::take(&mut decodes.fallback);
    fallback.clear();
    let mut placed = Vec::with_capacity(refused.len());
    for &i in refused {
        let image = &decodes.images[i];
        let pipeline = decodes
            .pipelines
            .get(image.field)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Internal(format!("no pipeline for field {}", image.field)))?;
        let jpeg = &decodes.jpegs[image.jpeg.clone()];
        let failed = |reason: String| Error::Sample {
            index: image.index,
            what: image.what.clone(),
            reason: format!(
                "the device's JPEG decoder refused it, and the CPU could not decode it either: \
                 {reason} (it was routed to the device after its batch was built, so \
                 on_error=skip cannot replace it; gpu_decode_share=0 decodes every image in \
                 the workers)"
            ),
        };
        // The worker checked the size against `max_image_pixels`.
        let decoded = read_header(jpeg, u64::MAX, JpegDecoder::Auto, &mut buffers)
            .and_then(|header| decode(jpeg, &header, None, &mut buffers))
            .map_err(failed)?;
        let start = fallback.len();
        fallback.resize(start + pipeline.output_bytes(), 0);
        // The plan holds every draw: a pipeline the device runs has no op after it.
        let mut unused = Rng::for_key(0, RngStream::Augment, 0, 0);
        pipeline
            .apply_decoded(
                &buffers.rgb,
                &decoded,
                image.plan,
                &mut unused,
                &mut fallback[start..],
                &mut scratch,
            )
            .map_err(failed)?;
        placed.push((i, start));
    }
    let mut sent = 0;
    for (i, start) in placed {
        let image = &decodes.images[i];
        let field = uint8_field(fields, image)?;
        let bytes = field.sample_bytes;
        let src = fallback
            .get(start..start + bytes)
            .ok_or_else(|| {
                Error::Internal(format!(
                    "field {}: a sample of {bytes} bytes, its pipeline writes fewer",
                    image.field
                ))
            })?
            .as_ptr();
        // SAFETY: `fallback` moves into the host batch below and is not touched again until
        // the batch is dropped, after the slot's event; the destination is the image's slot.
        unsafe {
            backend.copy_to_device_async(
                field.at + (image.slot * bytes) as DevicePtr,
                src,
                bytes,
                stream,
            )
        }?;
        sent += bytes;
    }
    decodes.fallback = fallback;
    Ok(sent)
}
