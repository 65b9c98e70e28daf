//! The images of a host batch left for the device to decode (`jpeg_decoder=gpu`/`auto`).
//!
//! A worker that routes a sample to the device plans its crop from the JPEG's header as for a
//! CPU decode, computes the resize taps ([`crate::cuda::resize::Taps`]), and leaves the sample's
//! slot unwritten; the batch carries the JPEG's bytes, the plan and the taps here. The
//! prefetcher decodes them into its scratch on the device, resizes each into the slot's place
//! in the uint8 field on the device (the cast's input under `gpu_normalize`), and decodes on the
//! CPU, with the same plan, any image the device refuses. An image neither decoder can read is
//! replaced under `on_error=skip` by what the worker would have written ([`ReplaceRouted`]).

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::FieldMeta;
use crate::error::{Error, Result};
use crate::source::streaming::OwnedSample;
use crate::transform::{Pipeline, Plan};

/// One image routed to the device.
#[derive(Clone, Debug)]
pub(crate) struct RoutedImage {
    /// The field and slot it is written to.
    pub field: usize,
    pub slot: usize,
    /// The sample, in words (its index and where it came from), for errors.
    pub what: String,
    /// The sample's index.
    pub index: u64,
    /// The key of the sample's random draws: `(seed, epoch, draw)`.
    pub draw_key: (u64, u64, u64),
    /// Its JPEG, in [`DeviceDecodes::jpegs`].
    pub jpeg: Range<usize>,
    /// The image's size, from its header.
    pub width: u32,
    pub height: u32,
    /// The crop planned from that size (in whole-image coordinates).
    pub plan: Plan,
    /// Whether the field lays a sample's channels out as planes (NCHW).
    pub planar: bool,
    /// Its taps, in [`DeviceDecodes::taps`]: the x spans and weights, then the y ones.
    pub taps: Range<usize>,
    pub x_taps: u32,
    pub y_taps: u32,
}

impl RoutedImage {
    /// Bytes of the decoded image (interleaved RGB8).
    pub fn decoded_bytes(&self) -> usize {
        self.width as usize * self.height as usize * 3
    }

    /// Offsets in its taps of the x spans, x weights, y spans and y weights.
    pub fn tap_offsets(&self) -> [usize; 4] {
        let (w, h) = (self.plan.width, self.plan.height);
        let x_weights = w * 8;
        let y_spans = x_weights + w * self.x_taps as usize * 4;
        let y_weights = y_spans + h * 8;
        [0, x_weights, y_spans, y_weights]
    }
}

/// Every image of a batch routed to the device, with the bytes they need.
#[derive(Debug, Default)]
pub(crate) struct DeviceDecodes {
    pub images: Vec<RoutedImage>,
    /// The JPEGs, back to back.
    pub jpegs: Vec<u8>,
    /// The taps, back to back, each image's on a 4-byte boundary.
    pub taps: Vec<u8>,
    /// Per field of the batch, the pipeline that writes it (the CPU's fallback for an image
    /// the device refuses); `None` for fields never routed.
    pub pipelines: Vec<Option<Arc<Pipeline>>>,
    /// The prefetcher's CPU decodes of images the device refused, and the replacements of
    /// those the CPU could not decode either, copied from here: kept with the host batch until
    /// its copies complete.
    pub fallback: Vec<u8>,
    /// Samples the prefetcher replaced (`on_error=skip`), counted with the batch's own.
    pub replaced: usize,
    /// A stream's batch under `on_error=skip`: the samples it was built from, which a
    /// replacement is drawn from as the workers draw it (kept until the batch's copy is done).
    pub owned: Option<OwnedSamples>,
}

/// The samples a stream's batch was built from, in slot order. Behind a mutex only so that a
/// batch stays `Sync` (a sample need not be): the prefetch thread alone reads them.
pub(crate) struct OwnedSamples(Mutex<Vec<Box<dyn OwnedSample>>>);

impl OwnedSamples {
    pub fn new(samples: Vec<Box<dyn OwnedSample>>) -> OwnedSamples {
        OwnedSamples(Mutex::new(samples))
    }

    /// The samples (never contended).
    pub fn lock(&self) -> MutexGuard<'_, Vec<Box<dyn OwnedSample>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for OwnedSamples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} owned samples", self.lock().len())
    }
}

/// Writes, on the CPU, the sample that replaces a routed one whose JPEG neither the device nor
/// the CPU could decode (a header that reads, data that does not), under `on_error=skip`: the
/// loader's collator, with the candidates and the draw a worker would have used (a map-style
/// source's samples, or a stream batch's `owned` ones).
pub(crate) trait ReplaceRouted: Send + Sync {
    /// The sample that takes `image`'s slot, which failed with `err`: every field of one slot,
    /// laid out as a batch of one sample. Fails with `err`, saying so, when every candidate
    /// failed too.
    fn replace(
        &self,
        image: &RoutedImage,
        owned: Option<&OwnedSamples>,
        err: Error,
    ) -> Result<OneSample>;
}

/// One sample written as a batch of one: its fields' `metas` into `bytes`.
pub(crate) struct OneSample {
    pub metas: Vec<FieldMeta>,
    pub bytes: Vec<u8>,
}

impl DeviceDecodes {
    /// Whether no image is routed.
    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }

    /// Forgets the images routed for `slot` (its sample was replaced; the bytes stay unused).
    pub fn unroute(&mut self, slot: usize) {
        self.images.retain(|image| image.slot != slot);
    }

    /// Appends `other`'s images (a later part of the same batch).
    pub fn append(&mut self, other: DeviceDecodes) {
        let (jpegs, taps) = (self.jpegs.len(), self.taps.len());
        self.jpegs.extend_from_slice(&other.jpegs);
        self.taps.extend_from_slice(&other.taps);
        self.images
            .extend(other.images.into_iter().map(|mut image| {
                image.jpeg = image.jpeg.start + jpegs..image.jpeg.end + jpegs;
                image.taps = image.taps.start + taps..image.taps.end + taps;
                image
            }));
        if self.pipelines.is_empty() {
            self.pipelines = other.pipelines;
        }
    }
}
