//! The GPU decode route of phase 2 (`jpeg_decoder=gpu`/`auto` with `device=cuda`): which
//! samples leave their JPEG for the device to decode, and what a worker writes for them
//! instead of pixels (see [`crate::batch::DeviceDecodes`]).
//!
//! Which samples go is a hash of the sample's index against the share (option
//! `gpu_decode_share`), so a run is the same for a given share whatever the workers, ranks or
//! timing. A routed sample's crop is planned from its header with the sample's own draws, as
//! the CPU path plans it, so both paths crop, flip and resize alike; what differs is the
//! decoder's IDCT and the resampler's rounding (a few levels, see `cuda::resize`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::batch::{DeviceDecodes, RoutedImage};
use crate::decode::{check_size, device_jpeg};
use crate::dtype::Layout;
use crate::rng::{splitmix64, Rng};
use crate::transform::{plan_taps, Pipeline};

/// Bytes of the device scratch GPU decoding decodes into (one per prefetch thread, reused):
/// a batch's routed images are decoded in groups that fit, and an image that alone does not
/// (over 89 megapixels) is decoded on the CPU.
pub const DEVICE_DECODE_SCRATCH: usize = 256 << 20;

/// The share of samples routed to the device, changed at run time (autotune) and read by
/// every worker: a threshold on 32 bits of a hash of the index.
#[derive(Debug, Default)]
pub struct DecodeShare {
    /// `share × 2^32`, 0 to 2^32.
    threshold: AtomicU64,
}

impl DecodeShare {
    /// A share of `share` (clamped to 0..=1).
    pub fn new(share: f64) -> DecodeShare {
        let s = DecodeShare::default();
        s.set(share);
        s
    }

    /// Sets the share, clamped to 0..=1.
    pub fn set(&self, share: f64) {
        let t = (share.clamp(0.0, 1.0) * (1u64 << 32) as f64).round() as u64;
        self.threshold.store(t, Ordering::Relaxed);
    }

    /// The share in use.
    pub fn get(&self) -> f64 {
        self.threshold.load(Ordering::Relaxed) as f64 / (1u64 << 32) as f64
    }

    /// Whether sample `index` goes to the device at the current share.
    pub fn routes(&self, index: u64) -> bool {
        let mut state = index;
        (splitmix64(&mut state) >> 32) < self.threshold.load(Ordering::Relaxed)
    }
}

/// What routes a collator's images: the share, and per field whether it may go (its pipeline
/// runs whole on the device).
pub(crate) struct GpuRoute {
    pub share: Arc<DecodeShare>,
    /// Per field of the source.
    pub fields: Vec<bool>,
    /// Option `max_image_pixels`.
    pub max_pixels: u64,
}

/// Where one image of a batch would go, and whose it is.
pub(super) struct Sample<'a> {
    pub field: usize,
    pub slot: usize,
    pub index: u64,
    pub encoded: &'a [u8],
    /// The sample's draw key: `(seed, epoch, draw)`.
    pub key: (u64, u64, u64),
}

/// Leaves `sample`'s JPEG to the device when the device can write its slot: a JPEG its
/// decoder takes ([`device_jpeg`]) that fits the scratch, and a plan the resize kernel can
/// run. Returns whether it did; when not, the CPU writes the slot as usual (with fresh draws:
/// nothing here consumed the caller's).
pub(super) fn route(
    pipeline: &Arc<Pipeline>,
    sample: Sample<'_>,
    what: impl FnOnce() -> String,
    max_pixels: u64,
    out: &mut DeviceDecodes,
) -> bool {
    let Some(dims) = device_jpeg(sample.encoded) else {
        return false;
    };
    let fits = check_size(dims.width, dims.height, max_pixels)
        .is_ok_and(|bytes| bytes <= DEVICE_DECODE_SCRATCH);
    if !fits {
        return false;
    }
    let (seed, epoch, draw) = sample.key;
    let mut rng = Rng::for_key(seed, crate::rng::Stream::Augment, epoch, draw);
    let Ok(plan) = pipeline.plan(dims.width, dims.height, &mut rng) else {
        return false;
    };
    let Some((x, y)) = plan_taps(&plan) else {
        return false;
    };
    let jpeg = out.jpegs.len()..out.jpegs.len() + sample.encoded.len();
    out.jpegs.extend_from_slice(sample.encoded);
    let start = out.taps.len();
    x.write_to(&mut out.taps);
    y.write_to(&mut out.taps);
    let taps = start..out.taps.len();
    if out.pipelines.len() <= sample.field {
        out.pipelines.resize(sample.field + 1, None);
    }
    out.pipelines[sample.field].get_or_insert_with(|| Arc::clone(pipeline));
    out.images.push(RoutedImage {
        field: sample.field,
        slot: sample.slot,
        what: what(),
        index: sample.index,
        draw_key: sample.key,
        jpeg,
        width: dims.width as u32,
        height: dims.height as u32,
        plan,
        planar: pipeline.layout() == Layout::Nchw,
        taps,
        x_taps: x.taps as u32,
        y_taps: y.taps as u32,
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_routes_that_fraction_of_indices_and_a_larger_share_keeps_the_smaller_ones() {
        let quarter = DecodeShare::new(0.25);
        let half = DecodeShare::new(0.5);
        let routed: Vec<u64> = (0..20_000).filter(|&i| quarter.routes(i)).collect();
        let frac = routed.len() as f64 / 20_000.0;
        assert!((frac - 0.25).abs() < 0.02, "{frac}");
        assert!(routed.iter().all(|&i| half.routes(i)));
        assert!((0..1000).all(|i| !DecodeShare::new(0.0).routes(i)));
        assert!((0..1000).all(|i| DecodeShare::new(1.0).routes(i)));
        assert_eq!(DecodeShare::new(2.0).get(), 1.0);
        assert_eq!(half.get(), 0.5);
    }
}
