//! The pixel loops: the antialiased resample (fast_image_resize) and the one output pass that
//! flips, normalizes, converts and lays out straight into the batch slot.

use fast_image_resize::images::{TypedCroppedImage, TypedImage, TypedImageRef};
use fast_image_resize::pixels::{U8x3, F32, U8};
use fast_image_resize::{FilterType, PixelTrait, ResizeAlg, ResizeOptions, Resizer};

use super::augment::{Erase, EraseFill};
use super::geometry::Plan;
use crate::dtype::{DType, Layout};
use crate::rng::splitmix64;

/// The pixels stoker resamples: RGB8 images, and a dense task's 8-bit and float planes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sampled {
    Rgb8,
    Gray8,
    F32,
}

/// Resamples `plan.rect` of the clip region of `src` (`width` x `height` pixels of `kind`,
/// rows packed) into `dst` (`plan.width` x `plan.height` of the same kind) with `filter`,
/// antialiased (Pillow's algorithm: the filter support widens by the downscale factor; taps are
/// clamped at the clip borders). The plan's flip is not applied here.
///
/// Every resample of the crate goes through here, typed, with the same image views: generic
/// code is compiled in the crate that instantiates it, and fast_image_resize's
/// `Resizer::resize` dispatches to all 13 of its pixel types, each with every SIMD variant,
/// again for each pair of image types it is called with. Typed calls for the three kinds used
/// cut stoker-core's LLVM IR from 3.1 to 1.9 million lines (`cargo llvm-lines --release`) and
/// its release build from 349 to 201 CPU-seconds.
pub(crate) fn resample(
    src: &[u8],
    (width, height): (usize, usize),
    kind: Sampled,
    plan: &Plan,
    filter: FilterType,
    dst: &mut [u8],
    resizer: &mut Resizer,
) -> Result<(), String> {
    let dims = (width as u32, height as u32);
    match kind {
        Sampled::Rgb8 => resample_typed::<U8x3>(src, dims, plan, filter, dst, resizer),
        Sampled::Gray8 => resample_typed::<U8>(src, dims, plan, filter, dst, resizer),
        Sampled::F32 => resample_typed::<F32>(src, dims, plan, filter, dst, resizer),
    }
}

fn resample_typed<P: PixelTrait>(
    src: &[u8],
    (width, height): (u32, u32),
    plan: &Plan,
    filter: FilterType,
    dst: &mut [u8],
    resizer: &mut Resizer,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Debug| format!("resize failed: {e:?}");
    let src = TypedImageRef::<P>::from_buffer(width, height, src).map_err(|e| err(&e))?;
    let [cx0, cy0, cx1, cy1] = plan.clip;
    let clip = TypedCroppedImage::from_ref(
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
    let mut dst = TypedImage::<P>::from_buffer(plan.width as u32, plan.height as u32, dst)
        .map_err(|e| err(&e))?;
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(filter))
        .crop(left, top, rw, rh);
    resizer
        .resize_typed(&clip, &mut dst, &options)
        .map_err(|e| err(&e))
}

/// Resamples `plan.rect` of the clip region of `rgb` into `resized` (`plan.width` x
/// `plan.height` RGB8) with antialiased bilinear filtering.
pub(super) fn resample_rgb(
    rgb: &[u8],
    width: usize,
    height: usize,
    plan: &Plan,
    resized: &mut Vec<u8>,
    resizer: &mut Resizer,
) -> Result<(), String> {
    resized.resize(plan.width * plan.height * 3, 0);
    resample(
        rgb,
        (width, height),
        Sampled::Rgb8,
        plan,
        FilterType::Bilinear,
        resized,
        resizer,
    )
}

/// The planned image, mirrored if the plan flips, into `buf` (`plan.width * plan.height` RGB8
/// pixels): copied when the plan resamples nothing.
pub(super) fn materialise(
    rgb: &[u8],
    width: usize,
    height: usize,
    plan: &Plan,
    buf: &mut Vec<u8>,
    resizer: &mut Resizer,
) -> Result<(), String> {
    if plan.is_copy() {
        let (x0, y0) = (plan.rect[0] as usize, plan.rect[1] as usize);
        buf.clear();
        for y in y0..y0 + plan.height {
            let start = (y * width + x0) * 3;
            buf.extend_from_slice(&rgb[start..start + plan.width * 3]);
        }
    } else {
        resample_rgb(rgb, width, height, plan, buf, resizer)?;
    }
    if plan.flip {
        super::warp::hflip(buf, plan.width);
    }
    Ok(())
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
    /// The pixels of row `y`, left to right as stored (the output loops mirror them).
    #[inline]
    fn row(&self, y: usize) -> &[[u8; 3]] {
        let start = (self.y0 + y) * self.stride + self.x0 * 3;
        self.data[start..start + self.width * 3].as_chunks::<3>().0
    }
}

/// The one output pass for uint8: flip and layout.
pub(super) fn write_u8(img: &SrcView<'_>, layout: Layout, out: &mut [u8]) {
    if layout == Layout::Nhwc && !img.flip {
        for (y, dst) in out
            .chunks_exact_mut(img.width * 3)
            .take(img.height)
            .enumerate()
        {
            dst.copy_from_slice(img.row(y).as_flattened());
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: this CPU has AVX2, checked just above.
        unsafe { write_u8_avx2(img, layout, out) };
        return;
    }
    let (out, _) = out.as_chunks_mut::<1>();
    write_pass(img, layout, out, |_, v| [v]);
}

/// [`write_u8`]'s pass compiled for AVX2, where the compiler turns the three-way split of
/// RGB pixels into planes into byte shuffles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn write_u8_avx2(img: &SrcView<'_>, layout: Layout, out: &mut [u8]) {
    let (out, _) = out.as_chunks_mut::<1>();
    write_pass(img, layout, out, |_, v| [v]);
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
    let (out, _) = out.as_chunks_mut::<N>();
    write_pass(img, layout, out, |c, v| to_bytes(lut[c][v as usize]));
}

/// The float32 output pass: by [`Affine`] with AVX2 where that reproduces the table, else by the
/// table. The table's loop is scalar loads and stores, about a fifth of a small image's time; the
/// affine form vectorizes (5% more images/s for 256-pixel images, 2% for ImageNet-sized ones).
pub(super) fn write_f32(
    img: &SrcView<'_>,
    layout: Layout,
    lut: &[[f32; 256]; 3],
    affine: Option<&Affine>,
    out: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(affine) = affine {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: this CPU has AVX2, checked just above.
            unsafe { write_affine_avx2(img, layout, affine, out) };
            return;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = affine;
    write_lut(img, layout, lut, out, f32::to_ne_bytes);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn write_affine_avx2(img: &SrcView<'_>, layout: Layout, affine: &Affine, out: &mut [u8]) {
    let (out, _) = out.as_chunks_mut::<4>();
    write_pass(img, layout, out, |c, v| affine.value(c, v).to_ne_bytes());
}

/// A float32 output table as `x * scale[c] + offset[c]`, computed in f64 and rounded once to
/// f32; kept only when that reproduces every entry of the table bit for bit (for ImageNet's and
/// CLIP's constants it does), so the output does not depend on which pass ran. In f32 the same
/// form misses 455 of ImageNet's 768 entries by an ulp; f64's error almost never reaches an f32
/// rounding boundary, and the check covers the cases where it does.
#[derive(Clone, Copy, Debug)]
pub(super) struct Affine {
    scale: [f64; 3],
    offset: [f64; 3],
}

impl Affine {
    /// `(x / 255 - mean) / std` (or `x / 255` without `mean_std`) as an affine map, if it
    /// reproduces `lut`.
    pub(super) fn exact(
        mean_std: Option<([f64; 3], [f64; 3])>,
        lut: &[[f32; 256]; 3],
    ) -> Option<Affine> {
        let (mean, std) = mean_std.unwrap_or(([0.0; 3], [1.0; 3]));
        let affine = Affine {
            scale: std::array::from_fn(|c| 1.0 / (255.0 * std[c])),
            offset: std::array::from_fn(|c| -mean[c] / std[c]),
        };
        let reproduces = (0..3).all(|c| {
            (0..=255u8).all(|x| affine.value(c, x).to_bits() == lut[c][x as usize].to_bits())
        });
        reproduces.then_some(affine)
    }

    #[inline(always)]
    fn value(&self, c: usize, x: u8) -> f32 {
        (f64::from(x) * self.scale[c] + self.offset[c]) as f32
    }
}

/// Writes `value(channel, byte)` for every element of the image into `out` (elements of `N`
/// bytes) in `layout`, mirrored when `img.flip`. The flip is decided once per row, so the inner
/// loops are plain iterators over whole pixels with no per-element bounds checks.
#[inline(always)]
fn write_pass<const N: usize>(
    img: &SrcView<'_>,
    layout: Layout,
    out: &mut [[u8; N]],
    value: impl Fn(usize, u8) -> [u8; N] + Copy,
) {
    let (w, h) = (img.width, img.height);
    match layout {
        Layout::Nhwc => {
            let (out, _) = out.as_chunks_mut::<3>();
            for (y, dst) in out.chunks_exact_mut(w).take(h).enumerate() {
                let row = img.row(y);
                if img.flip {
                    interleaved_row(row.iter().rev(), dst, value);
                } else {
                    interleaved_row(row.iter(), dst, value);
                }
            }
        }
        Layout::Nchw => {
            // One pass: each source pixel read once, its three values written to the three
            // planes' rows.
            let (red, rest) = out.split_at_mut(w * h);
            let (green, blue) = rest.split_at_mut(w * h);
            let rows = red
                .chunks_exact_mut(w)
                .zip(green.chunks_exact_mut(w))
                .zip(blue.chunks_exact_mut(w));
            for (y, ((r, g), b)) in rows.take(h).enumerate() {
                let row = img.row(y);
                if img.flip {
                    planar_row(row.iter().rev(), [r, g, b], value);
                } else {
                    planar_row(row.iter(), [r, g, b], value);
                }
            }
        }
    }
}

#[inline(always)]
fn interleaved_row<'a, const N: usize>(
    pixels: impl Iterator<Item = &'a [u8; 3]>,
    dst: &mut [[[u8; N]; 3]],
    value: impl Fn(usize, u8) -> [u8; N],
) {
    for (d, p) in dst.iter_mut().zip(pixels) {
        *d = [value(0, p[0]), value(1, p[1]), value(2, p[2])];
    }
}

#[inline(always)]
fn planar_row<'a, const N: usize>(
    pixels: impl Iterator<Item = &'a [u8; 3]>,
    [r, g, b]: [&mut [[u8; N]]; 3],
    value: impl Fn(usize, u8) -> [u8; N],
) {
    for (((p, r), g), b) in pixels.zip(r).zip(g).zip(b) {
        (*r, *g, *b) = (value(0, p[0]), value(1, p[1]), value(2, p[2]));
    }
}

/// Overwrites the erased box of the written output with its fill (in output units: uint8
/// rounded, uint16 rounded, float16 and bfloat16 rounded to nearest even), as torchvision's `RandomErasing` on
/// the final tensor. Noise is drawn channel by channel, row by row (torchvision's `[C, h, w]`
/// order), whatever the layout, so it does not depend on it.
pub(super) fn write_erase(
    e: &Erase,
    width: usize,
    height: usize,
    channels: usize,
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
            DType::U16 => {
                v[..2].copy_from_slice(&(x.round().clamp(0.0, 65535.0) as u16).to_ne_bytes())
            }
            _ => v[0] = x.round().clamp(0.0, 255.0) as u8,
        }
        v
    };
    let mut noise = match e.fill {
        EraseFill::Noise(seed) => Some(Normal::new(seed)),
        EraseFill::Value(_) => None,
    };
    for c in 0..channels {
        // One value per RGB channel; an image of another channel count takes one value for
        // every channel (the pipeline checked that the three agree).
        let value = match e.fill {
            EraseFill::Value(v) => encode(v[c.min(2)]),
            EraseFill::Noise(_) => [0; 4],
        };
        for y in e.top..(e.top + e.height).min(height) {
            for x in e.left..(e.left + e.width).min(width) {
                let v = match noise.as_mut() {
                    Some(normal) => encode(normal.next()),
                    None => value,
                };
                let at = match layout {
                    Layout::Nhwc => ((y * width + x) * channels + c) * n,
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
