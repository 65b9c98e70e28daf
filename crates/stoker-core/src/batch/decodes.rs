//! The images of a host batch left for the device to decode (`jpeg_decoder=gpu`/`auto`).
//!
//! A worker that routes a sample to the device plans its crop from the JPEG's header as for a
//! CPU decode, computes the resize taps ([`crate::cuda::resize::Taps`]), and leaves the sample's
//! slot unwritten; the batch carries the JPEG's bytes, the plan and the taps here. The
//! prefetcher decodes them into its scratch on the device, resizes each into the slot's place
//! in the uint8 field on the device (the cast's input under `gpu_normalize`), and decodes on the
//! CPU, with the same plan, any image the device refuses.

use std::ops::Range;
use std::sync::Arc;

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
#[derive(Clone, Debug, Default)]
pub(crate) struct DeviceDecodes {
    pub images: Vec<RoutedImage>,
    /// The JPEGs, back to back.
    pub jpegs: Vec<u8>,
    /// The taps, back to back, each image's on a 4-byte boundary.
    pub taps: Vec<u8>,
    /// Per field of the batch, the pipeline that writes it (the CPU's fallback for an image
    /// the device refuses); `None` for fields never routed.
    pub pipelines: Vec<Option<Arc<Pipeline>>>,
    /// The prefetcher's CPU decodes of images the device refused, copied from here: kept with
    /// the host batch until its copies complete.
    pub fallback: Vec<u8>,
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
