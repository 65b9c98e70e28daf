//! The pixel loops: the antialiased resample (fast_image_resize) and the one output pass that
//! flips, normalizes, converts and lays out straight into the batch slot.

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::augment::{Erase, EraseFill};
use super::geometry::Plan;
use crate::dtype::{DType, Layout};
use crate::rng::splitmix64;

/// Resamples `plan.rect` of the clip region of `rgb` into `resized` (`plan.width` x
/// `plan.height` RGB8) with antialiased bilinear filtering (Pillow's algorithm: the filter
/// support widens by the downscale factor; taps are clamped at the clip borders).
pub(super) fn resample(
    rgb: &[u8],
    width: usize,
    height: usize,
    plan: &Plan,
    resized: &mut Vec<u8>,
    resizer: &mut Resizer,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Debug| format!("resize failed: {e:?}");
    let src =
        ImageRef::new(width as u32, height as u32, rgb, PixelType::U8x3).map_err(|e| err(&e))?;
    let [cx0, cy0, cx1, cy1] = plan.clip;
    let clip = CroppedImage::new(
        &src,
        cx0 as u32,
        cy0 as u32,
        (cx1 - cx0) as u32,
        (cy1 - cy0) as u32,
    )
    .map_err(|e| err(&e))?;
    let [left, top, rw, rh] = plan.rect;
    let left = (left - cx0 as f64).max(0.0);
    let top = (top - cy0 as f64).max(0.0);
    let rw = rw.min((cx1 - cx0) as f64 - left);
    let rh = rh.min((cy1 - cy0) as f64 - top);
    resized.resize(plan.width * plan.height * 3, 0);
    let mut dst = Image::from_slice_u8(
        plan.width as u32,
        plan.height as u32,
        resized.as_mut_slice(),
        PixelType::U8x3,
    )
    .map_err(|e| err(&e))?;
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
        .crop(left, top, rw, rh);
    resizer
        .resize(&clip, &mut dst, &options)
        .map_err(|e| err(&e))
}

/// The final RGB8 pixels: `width` x `height` starting at `(x0, y0)` of `data` (row stride
/// `stride` bytes), read mirrored when `flip`.
pub(super) struct SrcView<'a> {
    pub(super) data: &'a [u8],
    pub(super) stride: usize,
    pub(super) x0: usize,
    pub(super) y0: usize,
    pub(super) width: usize,
    pub(super) height: usize,
    pub(super) flip: bool,
}

impl SrcView<'_> {
    /// The `width * 3` bytes of output row `y`.
    #[inline]
    fn row(&self, y: usize) -> &[u8] {
        let start = (self.y0 + y) * self.stride + self.x0 * 3;
        &self.data[start..start + self.width * 3]
    }

    /// Source pixel of output column `x`.
    #[inline]
    fn col(&self, x: usize) -> usize {
        if self.flip {
            self.width - 1 - x
        } else {
            x
        }
    }
}

/// The one output pass for uint8: flip and layout.
pub(super) fn write_u8(img: &SrcView<'_>, layout: Layout, out: &mut [u8]) {
    let (w, h) = (img.width, img.height);
    match layout {
        Layout::Nhwc => {
            for (y, dst) in out.chunks_exact_mut(w * 3).enumerate().take(h) {
                let row = img.row(y);
                if img.flip {
                    for (x, px) in dst.chunks_exact_mut(3).enumerate() {
                        let s = img.col(x) * 3;
                        px.copy_from_slice(&row[s..s + 3]);
                    }
                } else {
                    dst.copy_from_slice(row);
                }
            }
        }
        Layout::Nchw => {
            // One pass, as in `write_lut`.
            let (red, rest) = out.split_at_mut(w * h);
            let (green, blue) = rest.split_at_mut(w * h);
            let rows = red
                .chunks_exact_mut(w)
                .zip(green.chunks_exact_mut(w))
                .zip(blue.chunks_exact_mut(w));
            for (y, ((r, g), b)) in rows.enumerate().take(h) {
                let row = img.row(y);
                for (x, ((r, g), b)) in r.iter_mut().zip(g.iter_mut()).zip(b.iter_mut()).enumerate()
                {
                    let px = &row[img.col(x) * 3..][..3];
                    (*r, *g, *b) = (px[0], px[1], px[2]);
                }
            }
        }
    }
}

/// The one output pass for float types: `lut[c][value]` per element (normalisation and type
/// conversion folded in), flip and layout; elements written native-endian.
pub(super) fn write_lut<T: Copy, const N: usize>(
    img: &SrcView<'_>,
    layout: Layout,
    lut: &[[T; 256]; 3],
    out: &mut [u8],
    to_bytes: fn(T) -> [u8; N],
) {
    let (w, h) = (img.width, img.height);
    match layout {
        Layout::Nhwc => {
            for (y, dst) in out.chunks_exact_mut(w * 3 * N).enumerate().take(h) {
                let row = img.row(y);
                for (x, px) in dst.chunks_exact_mut(3 * N).enumerate() {
                    let s = img.col(x) * 3;
                    for c in 0..3 {
                        px[c * N..(c + 1) * N]
                            .copy_from_slice(&to_bytes(lut[c][row[s + c] as usize]));
                    }
                }
            }
        }
        Layout::Nchw => {
            // One pass: each source pixel read once, its three values written to the three
            // planes' rows.
            let (red, rest) = out.split_at_mut(w * h * N);
            let (green, blue) = rest.split_at_mut(w * h * N);
            let rows = red
                .chunks_exact_mut(w * N)
                .zip(green.chunks_exact_mut(w * N))
                .zip(blue.chunks_exact_mut(w * N));
            for (y, ((r, g), b)) in rows.enumerate().take(h) {
                let row = img.row(y);
                let elements = r
                    .chunks_exact_mut(N)
                    .zip(g.chunks_exact_mut(N))
                    .zip(b.chunks_exact_mut(N));
                for (x, ((r, g), b)) in elements.enumerate() {
                    let px = &row[img.col(x) * 3..][..3];
                    r.copy_from_slice(&to_bytes(lut[0][px[0] as usize]));
                    g.copy_from_slice(&to_bytes(lut[1][px[1] as usize]));
                    b.copy_from_slice(&to_bytes(lut[2][px[2] as usize]));
                }
            }
        }
    }
}

/// Overwrites the erased box of the written output with its fill (in output units: uint8
/// rounded, float16 and bfloat16 rounded to nearest even), as torchvision's `RandomErasing` on
/// the final tensor. Noise is drawn channel by channel, row by row (torchvision's `[C, h, w]`
/// order), whatever the layout, so it does not depend on it.
pub(super) fn write_erase(
    e: &Erase,
    width: usize,
    height: usize,
    layout: Layout,
    dtype: DType,
    out: &mut [u8],
) {
    let n = dtype.size();
    let encode = |x: f64| -> [u8; 4] {
        let mut v = [0u8; 4];
        match dtype {
            DType::F32 => v.copy_from_slice(&(x as f32).to_ne_bytes()),
            DType::F16 => v[..2].copy_from_slice(&half::f16::from_f64(x).to_bits().to_ne_bytes()),
            DType::BF16 => v[..2].copy_from_slice(&half::bf16::from_f64(x).to_bits().to_ne_bytes()),
            _ => v[0] = x.round().clamp(0.0, 255.0) as u8,
        }
        v
    };
    let mut noise = match e.fill {
        EraseFill::Noise(seed) => Some(Normal::new(seed)),
        EraseFill::Value(_) => None,
    };
    for c in 0..3 {
        let value = match e.fill {
            EraseFill::Value(v) => encode(v[c]),
            EraseFill::Noise(_) => [0; 4],
        };
        for y in e.top..(e.top + e.height).min(height) {
            for x in e.left..(e.left + e.width).min(width) {
                let v = match noise.as_mut() {
                    Some(normal) => encode(normal.next()),
                    None => value,
                };
                let at = match layout {
                    Layout::Nhwc => ((y * width + x) * 3 + c) * n,
                    Layout::Nchw => ((c * height + y) * width + x) * n,
                };
                out[at..at + n].copy_from_slice(&v[..n]);
            }
        }
    }
}

/// Standard normal draws from a seed: Box–Muller over SplitMix64, two draws per pair of
/// uniforms. Simple and exact in distribution; the erased box is the only user, so its speed
/// (a few ns a draw) does not matter beside the rest of a sample's work.
struct Normal {
    state: u64,
    spare: Option<f64>,
}

impl Normal {
    fn new(seed: u64) -> Normal {
        Normal {
            state: seed,
            spare: None,
        }
    }

    fn next(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        // u1 in (0, 1]: ln(u1) is finite.
        let u1 = ((splitmix64(&mut self.state) >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
        let u2 = (splitmix64(&mut self.state) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        let r = (-2.0 * u1.ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
        self.spare = Some(r * sin);
        r * cos
    }
}
