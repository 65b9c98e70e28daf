//! Colour kernels on an RGB8 image (interleaved, in place), with torchvision v2's definitions
//! for uint8 tensors: arithmetic in float32, results clamped to `[0, 255]` and truncated, as
//! `Tensor.to(torch.uint8)` does (rounded where torchvision rounds). Hand-written because no
//! crate reproduces torchvision's exact formulas, which the equivalence tests hold us to.

/// torchvision's grayscale, `0.2989 r + 0.587 g + 0.114 b` in float32 in this order, floored,
/// from tables of the three products: the same float operations without the per-pixel
/// conversions and multiplications. The value is never negative and below 255, so truncation
/// is the floor (and avoids `floor`'s libm call on baseline x86-64).
struct FlooredLuma([[f32; 256]; 3]);

impl FlooredLuma {
    fn new() -> FlooredLuma {
        let table = |k: f32| std::array::from_fn(|x| x as f32 * k);
        FlooredLuma([table(0.2989), table(0.587), table(0.114)])
    }

    #[inline]
    fn of(&self, px: &[u8]) -> u8 {
        let [r, g, b] = &self.0;
        (r[px[0] as usize] + g[px[1] as usize] + b[px[2] as usize]) as u8
    }
}

/// A blend ratio as torchvision passes it: `ratio` and `1 - ratio` each computed in double
/// precision (Python floats), then used in float32.
#[derive(Clone, Copy)]
struct Ratio {
    f: f32,
    rest: f32,
}

impl Ratio {
    fn new(factor: f64) -> Ratio {
        Ratio {
            f: factor as f32,
            rest: (1.0 - factor) as f32,
        }
    }
}

/// `_blend(x, other, ratio)`: `x.mul(ratio).add_(other, alpha=1 - ratio)`, clamped and
/// truncated; the `add_` with `alpha` is a fused multiply-add in PyTorch's vectorized kernel.
#[inline]
fn blend(x: u8, other: f32, r: Ratio) -> u8 {
    fused_mul_add(other, r.rest, x as f32 * r.f).clamp(0.0, 255.0) as u8
}

/// `a * b + c` rounded once, as `f32::mul_add`, which is a software routine on baseline x86-64
/// (no FMA instruction). The product of two floats is exact in double precision, so only the
/// sum rounds there, then to float: the same result but for a sum landing exactly halfway
/// between two floats after the first rounding (double rounding); the torchvision equivalence
/// tests, exact for the colour ops, still pass.
#[inline]
fn fused_mul_add(a: f32, b: f32, c: f32) -> f32 {
    (a as f64 * b as f64 + c as f64) as f32
}

/// Applies a 256-entry table to every channel value.
pub(super) fn apply_lut(img: &mut [u8], lut: &[u8; 256]) {
    for v in img.iter_mut() {
        *v = lut[*v as usize];
    }
}

/// `adjust_brightness`: blend with black.
pub(super) fn brightness(img: &mut [u8], factor: f64) {
    let f = Ratio::new(factor);
    let mut lut = [0u8; 256];
    for (x, v) in lut.iter_mut().enumerate() {
        *v = blend(x as u8, 0.0, f);
    }
    apply_lut(img, &lut);
}

/// `adjust_contrast`: blend with the mean of the floored grayscale image.
pub(super) fn contrast(img: &mut [u8], factor: f64) {
    let pixels = img.len() / 3;
    if pixels == 0 {
        return;
    }
    let luma = FlooredLuma::new();
    let sum: u64 = img.chunks_exact(3).map(|px| luma.of(px) as u64).sum();
    let mean = (sum as f64 / pixels as f64) as f32;
    let f = Ratio::new(factor);
    let mut lut = [0u8; 256];
    for (x, v) in lut.iter_mut().enumerate() {
        *v = blend(x as u8, mean, f);
    }
    apply_lut(img, &lut);
}

/// `adjust_saturation`: blend each pixel with its floored grayscale value. [`blend`] from
/// tables: `x * ratio` per value and `gray * (1 - ratio)` (exact in double precision) per gray
/// level, so a pixel costs three additions.
pub(super) fn saturation(img: &mut [u8], factor: f64) {
    let f = Ratio::new(factor);
    let luma = FlooredLuma::new();
    let mut scaled = [0f64; 256];
    let mut grayed = [0f64; 256];
    for (x, (s, g)) in scaled.iter_mut().zip(&mut grayed).enumerate() {
        *s = (x as f32 * f.f) as f64;
        *g = x as f64 * f.rest as f64;
    }
    for px in img.chunks_exact_mut(3) {
        let gray = grayed[luma.of(px) as usize];
        for v in px.iter_mut() {
            *v = ((gray + scaled[*v as usize]) as f32).clamp(0.0, 255.0) as u8;
        }
    }
}

/// `rgb_to_grayscale(num_output_channels=3)`: the truncated grayscale value in every channel.
pub(super) fn grayscale(img: &mut [u8]) {
    let luma = FlooredLuma::new();
    for px in img.chunks_exact_mut(3) {
        px.fill(luma.of(px));
    }
}

/// `adjust_hue`: to float in `[0, 1]`, to HSV (torchvision's `_rgb_to_hsv`), hue shifted by
/// `shift` turns modulo 1, back to RGB (`_hsv_to_rgb`), to uint8 as `x * (256 - 1e-3)` truncated.
pub(super) fn hue(img: &mut [u8], shift: f64) {
    let shift = shift as f32;
    for px in img.chunks_exact_mut(3) {
        let [r, g, b] = [px[0], px[1], px[2]].map(|x| x as f32 / 255.0);
        let maxc = r.max(g).max(b);
        let minc = r.min(g).min(b);
        let eqc = maxc == minc;
        let range = maxc - minc;
        let s = range / if eqc { 1.0 } else { maxc };
        let divisor = if eqc { 1.0 } else { range };
        let (rc, gc, bc) = (
            (maxc - r) / divisor,
            (maxc - g) / divisor,
            (maxc - b) / divisor,
        );
        let h = if maxc == r {
            bc - gc
        } else if maxc == g {
            2.0 + rc - bc
        } else {
            4.0 + gc - rc
        };
        let h = (h * (1.0 / 6.0) + 1.0) % 1.0;
        let h = (h + shift).rem_euclid(1.0);
        let v = maxc;
        let h6 = h * 6.0;
        let i = h6.floor();
        let f = h6 - i;
        let i = (i as i32).rem_euclid(6);
        let sxf = s * f;
        let q = ((1.0 - sxf) * v).clamp(0.0, 1.0);
        let t = ((sxf + (1.0 - s)) * v).clamp(0.0, 1.0);
        let p = ((1.0 - s) * v).clamp(0.0, 1.0);
        let rgb = match i {
            0 => [v, t, p],
            1 => [q, v, p],
            2 => [p, v, t],
            3 => [p, q, v],
            4 => [t, p, v],
            _ => [v, p, q],
        };
        for (o, x) in px.iter_mut().zip(rgb) {
            *o = (x * (256.0 - 1e-3)) as u8;
        }
    }
}

/// `adjust_sharpness`: blend with the image smoothed by the 3x3 kernel `[1 1 1; 1 5 1; 1 1 1] / 13`
/// (rounded), on interior pixels only; `src` is read, `dst` (same size) written.
pub(super) fn sharpness(src: &[u8], dst: &mut [u8], width: usize, height: usize, factor: f64) {
    dst.copy_from_slice(src);
    if width <= 2 || height <= 2 {
        return;
    }
    let alpha = (1.0 - factor) as f32;
    let stride = width * 3;
    for y in 1..height - 1 {
        let above = &src[(y - 1) * stride..y * stride];
        let here = &src[y * stride..(y + 1) * stride];
        let below = &src[(y + 1) * stride..(y + 2) * stride];
        let out = &mut dst[y * stride..(y + 1) * stride];
        for i in 3..stride - 3 {
            let column = |r: &[u8]| r[i - 3] as u32 + r[i] as u32 + r[i + 3] as u32;
            let center = here[i] as u32;
            // torchvision sums in float32, exact for these integers; `/ 13` rounded half to
            // even never meets a tie (13 is odd), so it is `(2s + 13) / 26` in integers.
            let sum = column(above) + column(here) + column(below) + 4 * center;
            let smooth = ((2 * sum + 13) / 26) as f32;
            let center = center as f32;
            out[i] = (center + alpha * (smooth - center)).clamp(0.0, 255.0) as u8;
        }
    }
}

/// `posterize(bits)`: keep the top `bits` bits.
pub(super) fn posterize(img: &mut [u8], bits: u32) {
    let mask = (0xffu32 << (8 - bits.min(8))) as u8;
    for v in img.iter_mut() {
        *v &= mask;
    }
}

/// `solarize(threshold)`: invert values `>= threshold` (compared in float32, as PyTorch
/// promotes a uint8 tensor compared with a Python float).
pub(super) fn solarize(img: &mut [u8], threshold: f64) {
    let threshold = threshold as f32;
    let mut lut = [0u8; 256];
    for (x, v) in lut.iter_mut().enumerate() {
        *v = if x as f32 >= threshold {
            255 - x as u8
        } else {
            x as u8
        };
    }
    apply_lut(img, &lut);
}

pub(super) fn invert(img: &mut [u8]) {
    for v in img.iter_mut() {
        *v = 255 - *v;
    }
}

/// `autocontrast`: stretch each channel's `[min, max]` to `[0, 255]` (unchanged when flat).
pub(super) fn autocontrast(img: &mut [u8]) {
    for c in 0..3 {
        let (mut lo, mut hi) = (255u8, 0u8);
        for px in img.chunks_exact(3) {
            lo = lo.min(px[c]);
            hi = hi.max(px[c]);
        }
        if lo == hi {
            continue;
        }
        let inv_scale = (hi as f32 - lo as f32) * (1.0 / 255.0);
        let mut lut = [0u8; 256];
        for (x, v) in lut.iter_mut().enumerate() {
            *v = ((x as f32 - lo as f32) / inv_scale).clamp(0.0, 255.0) as u8;
        }
        for px in img.chunks_exact_mut(3) {
            px[c] = lut[px[c] as usize];
        }
    }
}

/// `equalize`: Pillow's histogram equalization per channel (torchvision v2's port): step =
/// (pixels - count of the largest value present) / 255 floored; `lut[0] = 0`,
/// `lut[i] = (cum[i - 1] + step / 2) / step`; unchanged when step is 0.
pub(super) fn equalize(img: &mut [u8]) {
    for c in 0..3 {
        let mut hist = [0u64; 256];
        for px in img.chunks_exact(3) {
            hist[px[c] as usize] += 1;
        }
        let total: u64 = hist.iter().sum();
        let last = hist.iter().rposition(|&n| n > 0).unwrap_or(0);
        let step = (total - hist[last]) / 255;
        if step == 0 {
            continue;
        }
        let mut lut = [0u8; 256];
        let mut cum = 0u64;
        for i in 1..256 {
            cum += hist[i - 1];
            lut[i] = ((cum + step / 2) / step).min(255) as u8;
        }
        for px in img.chunks_exact_mut(3) {
            px[c] = lut[px[c] as usize];
        }
    }
}
