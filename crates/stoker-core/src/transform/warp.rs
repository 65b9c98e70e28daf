//! Geometric kernels on a materialised RGB8 image: padded random crops, flips, the affine warp
//! (torchvision's inverse matrix and `grid_sample` sampling) and the Gaussian blur. Each writes
//! into a caller's buffer, so a worker reuses the same memory for every sample.

use super::spec::PadMode;

/// torchvision's `_get_inverse_affine_matrix(center, angle, translate, scale, shear)`: the map
/// from output to input coordinates (both centred on the image), row-major 2x3. Angles in
/// degrees.
pub fn inverse_affine(
    center: (f64, f64),
    angle: f64,
    translate: (f64, f64),
    scale: f64,
    shear: (f64, f64),
) -> [f64; 6] {
    let rot = angle.to_radians();
    let (sx, sy) = (shear.0.to_radians(), shear.1.to_radians());
    let (cx, cy) = center;
    let (tx, ty) = translate;
    let a = (rot - sy).cos() / sy.cos();
    let b = -(rot - sy).cos() * sx.tan() / sy.cos() - rot.sin();
    let c = (rot - sy).sin() / sy.cos();
    let d = -(rot - sy).sin() * sx.tan() / sy.cos() + rot.cos();
    let mut m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0];
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
    m[2] += cx;
    m[5] += cy;
    m
}

/// How [`warp`] samples.
#[derive(Clone, Copy, Debug)]
pub(super) enum Sampling {
    /// Bilinear; outside the image reads `fill` (torchvision's mask blend:
    /// `mask * (value - fill) + fill`, with zero padding for value and mask), rounded.
    Bilinear([u8; 3]),
    /// Nearest (round half to even); outside the image reads 0 (no fill, as the AutoAugment family).
    Nearest,
}

/// Warps `src` (`width`x`height` RGB8) by the inverse affine `m` into `dst` (same size). Output
/// pixel `(i, j)` has centred coordinates `(j - w/2 + 0.5, i - h/2 + 0.5)`; its source pixel is
/// `m * (x, y, 1) + (w/2 - 0.5, h/2 - 0.5)` (`affine_grid` then `grid_sample` with
/// `align_corners=False`).
pub(super) fn warp(
    src: &[u8],
    dst: &mut [u8],
    width: usize,
    height: usize,
    m: &[f64; 6],
    sampling: Sampling,
) {
    if matches!(sampling, Sampling::Nearest) && shifted(src, dst, width, height, m) {
        return;
    }
    warp_pixels(src, dst, width, height, m, sampling);
}

/// [`warp`] pixel by pixel, for any matrix.
fn warp_pixels(
    src: &[u8],
    dst: &mut [u8],
    width: usize,
    height: usize,
    m: &[f64; 6],
    sampling: Sampling,
) {
    let (w, h) = (width as f64, height as f64);
    let stride = width * 3;
    for (i, row) in dst.chunks_exact_mut(stride).take(height).enumerate() {
        let y = i as f64 - h * 0.5 + 0.5;
        // Along a row the source point moves by (m[0], m[3]) per pixel; the rest is per row.
        let row_x = m[1] * y + m[2] + w * 0.5 - 0.5;
        let row_y = m[4] * y + m[5] + h * 0.5 - 0.5;
        for (j, px) in row.chunks_exact_mut(3).enumerate() {
            let x = j as f64 - w * 0.5 + 0.5;
            let (sx, sy) = (m[0] * x + row_x, m[3] * x + row_y);
            match sampling {
                Sampling::Nearest => {
                    let (nx, ny) = (round_ties_even(sx), round_ties_even(sy));
                    if nx >= 0.0 && ny >= 0.0 && nx < w && ny < h {
                        let s = ny as usize * stride + nx as usize * 3;
                        px.copy_from_slice(&src[s..s + 3]);
                    } else {
                        px.fill(0);
                    }
                }
                Sampling::Bilinear(fill) => bilinear(src, width, height, sx, sy, fill, px),
            }
        }
    }
}

/// The source point of output pixel `(i, j)` of a `width`x`height` warp by `m`, computed as
/// [`warp`] does (the same operations in the same order, so a per-plane warp of another
/// element type samples exactly the same points).
#[inline]
pub(super) fn inverse_warp_point(
    m: &[f64; 6],
    width: usize,
    height: usize,
    i: usize,
    j: usize,
) -> (f64, f64) {
    let (w, h) = (width as f64, height as f64);
    let y = i as f64 - h * 0.5 + 0.5;
    let row_x = m[1] * y + m[2] + w * 0.5 - 0.5;
    let row_y = m[4] * y + m[5] + h * 0.5 - 0.5;
    let x = j as f64 - w * 0.5 + 0.5;
    (m[0] * x + row_x, m[3] * x + row_y)
}

/// Whether rounding `v + j` for integers `j` could differ from `round(v) + j` by the float
/// error of the per-pixel path: `v` within a hair of half a pixel (or not finite).
fn near_half(v: f64) -> bool {
    !v.is_finite() || (v - floor(v) - 0.5).abs() < 1e-6
}

/// Writes source row `src` shifted by `shift` whole pixels into `dst`: output pixel `j` is
/// source pixel `j + shift`; output pixels with no source pixel are left as they are.
fn copy_shifted(src: &[u8], dst: &mut [u8], width: usize, shift: f64) {
    let w = width as f64;
    if shift <= -w || shift >= w {
        return;
    }
    let k = shift.abs() as usize * 3;
    let stride = width * 3;
    if shift >= 0.0 {
        dst[..stride - k].copy_from_slice(&src[k..stride]);
    } else {
        dst[k..stride].copy_from_slice(&src[..stride - k]);
    }
}

/// [`warp`] with nearest sampling for the matrices that only shift whole rows or whole columns
/// (integer translations and shears along one axis: 4 of TrivialAugment's 14 ops): the same
/// pixels as the per-pixel path, found once per row or column instead of once per pixel.
/// `false`, with nothing written, for any other matrix, or when a shift is so close to half a
/// pixel that the per-pixel path's rounding could vary along the row or column.
fn shifted(src: &[u8], dst: &mut [u8], width: usize, height: usize, m: &[f64; 6]) -> bool {
    let (w, h) = (width as f64, height as f64);
    let stride = width * 3;
    // Centred coordinates of output column j and row i.
    let x_at = |j: usize| j as f64 - w * 0.5 + 0.5;
    let y_at = |i: usize| i as f64 - h * 0.5 + 0.5;
    if m[0] == 1.0 && m[3] == 0.0 {
        // Output row i reads source row round(sy_i), column j + round(m[1] y + m[2]).
        let row = |i: usize| {
            let sy = m[4] * y_at(i) + m[5] + h * 0.5 - 0.5;
            (round_ties_even(sy), m[1] * y_at(i) + m[2])
        };
        if (0..height).any(|i| near_half(row(i).1)) {
            return false;
        }
        for (i, out) in dst.chunks_exact_mut(stride).take(height).enumerate() {
            out.fill(0);
            let (sy, shift) = row(i);
            if (0.0..h).contains(&sy) {
                let source = &src[sy as usize * stride..(sy as usize + 1) * stride];
                copy_shifted(source, out, width, round_ties_even(shift));
            }
        }
        return true;
    }
    if m[4] == 1.0 && m[1] == 0.0 {
        // Output column j reads source column round(sx_j), row i + round(m[3] x + m[5]).
        let column = |j: usize| {
            // As the per-pixel path groups it (its row term, with m[1] = 0, is this constant).
            let sx = m[0] * x_at(j) + (m[2] + w * 0.5 - 0.5);
            (round_ties_even(sx), m[3] * x_at(j) + m[5])
        };
        if (0..width).any(|j| near_half(column(j).1)) {
            return false;
        }
        dst.fill(0);
        for j in 0..width {
            let (sx, shift) = column(j);
            let shift = round_ties_even(shift);
            if !(0.0..w).contains(&sx) || shift <= -h || shift >= h {
                continue;
            }
            // Rows i with 0 <= i + shift < height.
            let first = (-shift).max(0.0) as usize;
            let end = (h - shift).min(h) as usize;
            let s = sx as usize * 3;
            for i in first..end {
                let from = (i as f64 + shift) as usize * stride + s;
                let to = i * stride + j * 3;
                dst[to..to + 3].copy_from_slice(&src[from..from + 3]);
            }
        }
        return true;
    }
    false
}

/// One bilinear sample at `(sx, sy)` into `px`: the four taps weighted, taps outside the image
/// read zero and lower the mask, then torchvision's fill blend, rounded half to even.
#[inline]
fn bilinear(
    src: &[u8],
    width: usize,
    height: usize,
    sx: f64,
    sy: f64,
    fill: [u8; 3],
    px: &mut [u8],
) {
    let (w, h) = (width as f64, height as f64);
    let (x0, y0) = (floor(sx), floor(sy));
    let (fx, fy) = (sx - x0, sy - y0);
    let stride = width * 3;
    let mut acc = [0f64; 3];
    let mut mask = 0f64;
    for (dy, wy) in [(0.0, 1.0 - fy), (1.0, fy)] {
        let yy = y0 + dy;
        if yy < 0.0 || yy >= h || wy == 0.0 {
            continue;
        }
        for (dx, wx) in [(0.0, 1.0 - fx), (1.0, fx)] {
            let xx = x0 + dx;
            if xx < 0.0 || xx >= w || wx == 0.0 {
                continue;
            }
            let wgt = wx * wy;
            let s = yy as usize * stride + xx as usize * 3;
            for c in 0..3 {
                acc[c] += wgt * src[s + c] as f64;
            }
            mask += wgt;
        }
    }
    for c in 0..3 {
        let f = fill[c] as f64;
        let v = mask * (acc[c] - f) + f;
        px[c] = round_ties_even(v).clamp(0.0, 255.0) as u8;
    }
}

/// `x.floor()` without the libm call it is on baseline x86-64 (no SSE4.1 `roundsd`); exact
/// for every `|x| < 2^63`, and larger values are far outside any image. Per pixel, the call
/// was most of a warp's time.
#[inline]
fn floor(x: f64) -> f64 {
    let t = x as i64 as f64;
    if t > x {
        t - 1.0
    } else {
        t
    }
}

/// `x.round_ties_even()` without a libm call: adding and removing 1.5 * 2^52 rounds to an
/// integer in the default rounding mode (nearest, ties to even), exactly for `|x| <= 2^51`;
/// larger values (and NaN, infinities) stay outside any image.
#[inline]
pub(super) fn round_ties_even(x: f64) -> f64 {
    const SHIFT: f64 = 6_755_399_441_055_744.0;
    if x.abs() <= 2_251_799_813_685_248.0 {
        (x + SHIFT) - SHIFT
    } else {
        x
    }
}

/// Index `u` of a padded axis of length `n` mapped into `0..n` by `mode`; `None`: the constant
/// fill. The padding is smaller than `n` (reflect) or at most `n` (symmetric), so one mirror
/// suffices.
#[inline]
pub(super) fn pad_index(u: isize, n: usize, mode: PadMode) -> Option<usize> {
    let n = n as isize;
    if (0..n).contains(&u) {
        return Some(u as usize);
    }
    let i = match mode {
        PadMode::Constant => return None,
        PadMode::Edge => u.clamp(0, n - 1),
        PadMode::Reflect => {
            if u < 0 {
                -u
            } else {
                2 * (n - 1) - u
            }
        }
        PadMode::Symmetric => {
            if u < 0 {
                -u - 1
            } else {
                2 * n - 1 - u
            }
        }
    };
    Some(i.clamp(0, n - 1) as usize)
}

/// Checks that `mode` can pad an axis of length `n` by `pad` (torch's limits: reflect needs
/// `pad < n`, symmetric `pad <= n`).
pub(super) fn check_padding(pad: usize, n: usize, mode: PadMode) -> Result<(), String> {
    let ok = match mode {
        PadMode::Constant | PadMode::Edge => true,
        PadMode::Reflect => pad < n,
        PadMode::Symmetric => pad <= n,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "padding {pad} is too large for {mode:?} padding of a side of {n} pixels"
        ))
    }
}

/// Copies `part` (`part_width` pixels a row) into `canvas` (`canvas_width` pixels a row) with
/// its top-left corner at `at`, and `fill` around it: a constant-padded crop whose kept part
/// was materialised alone.
pub(super) fn paste<P: Copy>(
    part: &[P],
    part_width: usize,
    canvas: &mut [P],
    canvas_width: usize,
    (x, y): (usize, usize),
    fill: P,
) {
    let part_height = part.len() / part_width;
    let (above, rest) = canvas.split_at_mut(y * canvas_width);
    let (middle, below) = rest.split_at_mut(part_height * canvas_width);
    fill_doubling(above, fill);
    fill_doubling(below, fill);
    for (row, src) in middle
        .chunks_exact_mut(canvas_width)
        .zip(part.chunks_exact(part_width))
    {
        let (left, rest) = row.split_at_mut(x);
        let (kept, right) = rest.split_at_mut(part_width);
        fill_doubling(left, fill);
        kept.copy_from_slice(src);
        fill_doubling(right, fill);
    }
}

/// `slice.fill(value)` by copying what is filled already onto the rest, doubling each time:
/// memcpy's speed for a 3-byte pixel, which `fill` stores one at a time.
fn fill_doubling<P: Copy>(slice: &mut [P], value: P) {
    let Some(first) = slice.first_mut() else {
        return;
    };
    *first = value;
    let mut done = 1;
    while done < slice.len() {
        let n = done.min(slice.len() - done);
        slice.copy_within(..n, done);
        done += n;
    }
}

/// Writes the `out_w`x`out_h` window at `(top, left)` of `src` padded by `(pad_left, pad_top)`
/// (window coordinates are in the padded image) into `dst`, without materialising the padding.
#[allow(clippy::too_many_arguments)]
pub(super) fn padded_crop(
    src: &[u8],
    width: usize,
    height: usize,
    dst: &mut [u8],
    (top, left): (usize, usize),
    (out_w, out_h): (usize, usize),
    (pad_left, pad_top): (usize, usize),
    mode: PadMode,
    fill: [u8; 3],
) {
    let stride = width * 3;
    for y in 0..out_h {
        let sy = pad_index((top + y) as isize - pad_top as isize, height, mode);
        let row = &mut dst[y * out_w * 3..(y + 1) * out_w * 3];
        for (x, px) in row.chunks_exact_mut(3).enumerate() {
            let sx = pad_index((left + x) as isize - pad_left as isize, width, mode);
            match (sy, sx) {
                (Some(sy), Some(sx)) => {
                    let s = sy * stride + sx * 3;
                    px.copy_from_slice(&src[s..s + 3]);
                }
                _ => px.copy_from_slice(&fill),
            }
        }
    }
}

/// Mirrors the image left-right in place.
pub(super) fn hflip(img: &mut [u8], width: usize) {
    for row in img.chunks_exact_mut(width * 3) {
        let (left, right) = row.split_at_mut(width / 2 * 3);
        // With an odd width the middle pixel, first in `right`, stays.
        let right = &mut right[width % 2 * 3..];
        for (a, b) in left
            .chunks_exact_mut(3)
            .zip(right.chunks_exact_mut(3).rev())
        {
            a.swap_with_slice(b);
        }
    }
}

/// Mirrors the image top-bottom in place.
pub(super) fn vflip(img: &mut [u8], width: usize, height: usize) {
    let stride = width * 3;
    for y in 0..height / 2 {
        let (top, bottom) = img.split_at_mut((height - 1 - y) * stride);
        top[y * stride..(y + 1) * stride].swap_with_slice(&mut bottom[..stride]);
    }
}

/// torchvision's 1-D Gaussian kernel: `exp(-0.5 (x / sigma)^2)` at `x = -(k-1)/2 ..= (k-1)/2`,
/// normalised to sum 1.
pub fn gaussian_kernel(size: usize, sigma: f64, out: &mut Vec<f32>) {
    out.clear();
    let half = (size as f64 - 1.0) * 0.5;
    for i in 0..size {
        let x = i as f64 - half;
        out.push((-0.5 * (x / sigma).powi(2)).exp() as f32);
    }
    let sum: f32 = out.iter().sum();
    for v in out.iter_mut() {
        *v /= sum;
    }
}

/// `gaussian_blur`: separable convolution with `kernel` (odd length, half-size smaller than each
/// side) over reflect padding, float32, rounded half to even. `tmp` holds the horizontal pass.
pub(super) fn blur(
    img: &mut [u8],
    width: usize,
    height: usize,
    kernel: &[f32],
    tmp: &mut Vec<f32>,
) {
    let half = kernel.len() / 2;
    tmp.clear();
    tmp.resize(width * height * 3, 0.0);
    for y in 0..height {
        let row = &img[y * width * 3..(y + 1) * width * 3];
        for x in 0..width {
            for c in 0..3 {
                let mut acc = 0f32;
                for (k, wgt) in kernel.iter().enumerate() {
                    let u = x as isize + k as isize - half as isize;
                    let sx = pad_index(u, width, PadMode::Reflect).unwrap_or(0);
                    acc += wgt * row[sx * 3 + c] as f32;
                }
                tmp[(y * width + x) * 3 + c] = acc;
            }
        }
    }
    for y in 0..height {
        for x in 0..width {
            for c in 0..3 {
                let mut acc = 0f32;
                for (k, wgt) in kernel.iter().enumerate() {
                    let u = y as isize + k as isize - half as isize;
                    let sy = pad_index(u, height, PadMode::Reflect).unwrap_or(0);
                    acc += wgt * tmp[(sy * width + x) * 3 + c];
                }
                img[(y * width + x) * 3 + c] = acc.round_ties_even().clamp(0.0, 255.0) as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Rng, Stream};

    /// The row and column shortcuts give the per-pixel path's bytes for every matrix they
    /// take: translations and shears of either sign and size, odd and even sides, shifts
    /// that run past the image.
    #[test]
    fn shifted_rows_and_columns_match_the_per_pixel_warp() {
        let mut rng = Rng::for_key(7, Stream::Augment, 0, 0);
        let mut taken = 0;
        for case in 0..400 {
            let (width, height) = (5 + rng.below(40) as usize, 5 + rng.below(40) as usize);
            let src: Vec<u8> = (0..width * height * 3)
                .map(|_| rng.below(256) as u8)
                .collect();
            let corner = (-(width as f64) * 0.5, -(height as f64) * 0.5);
            let shear = rng.uniform(-45.0, 45.0);
            let shift = (rng.uniform(-60.0, 60.0)).trunc();
            let m = match case % 4 {
                0 => inverse_affine((0.0, 0.0), 0.0, (shift, 0.0), 1.0, (0.0, 0.0)),
                1 => inverse_affine((0.0, 0.0), 0.0, (0.0, shift), 1.0, (0.0, 0.0)),
                2 => inverse_affine(corner, 0.0, (0.0, 0.0), 1.0, (shear, 0.0)),
                _ => inverse_affine(corner, 0.0, (0.0, 0.0), 1.0, (0.0, shear)),
            };
            let mut fast = vec![7u8; src.len()];
            let mut slow = vec![9u8; src.len()];
            if shifted(&src, &mut fast, width, height, &m) {
                taken += 1;
                warp_pixels(&src, &mut slow, width, height, &m, Sampling::Nearest);
                assert_eq!(fast, slow, "case {case}: {width}x{height}, matrix {m:?}");
            }
        }
        assert!(
            taken > 350,
            "the shortcuts took only {taken} of 400 matrices"
        );
        // A rotation is not a shift: the per-pixel path runs.
        let m = inverse_affine((0.0, 0.0), 10.0, (0.0, 0.0), 1.0, (0.0, 0.0));
        assert!(!shifted(&[0; 300], &mut [0; 300], 10, 10, &m));
    }

    #[test]
    fn hflip_mirrors_odd_and_even_widths() {
        for width in 1..6 {
            let img: Vec<u8> = (0..width * 2 * 3).map(|v| v as u8).collect();
            let mut flipped = img.clone();
            hflip(&mut flipped, width);
            for (y, row) in flipped.chunks_exact(width * 3).enumerate() {
                for (x, px) in row.chunks_exact(3).enumerate() {
                    let s = (y * width + width - 1 - x) * 3;
                    assert_eq!(px, &img[s..s + 3], "width {width}, pixel ({x}, {y})");
                }
            }
        }
    }

    #[test]
    fn fast_floor_and_rounding_agree_with_the_std_ones() {
        let mut rng = Rng::for_key(7, Stream::Augment, 0, 1);
        let specials = [
            0.5,
            1.5,
            2.5,
            -0.5,
            -1.5,
            -2.5,
            0.0,
            -0.0,
            1e15 + 0.5,
            -3.0,
            7.999,
        ];
        let draws = (0..10_000).map(|_| rng.uniform(-1000.0, 1000.0));
        for x in specials.into_iter().chain(draws) {
            assert_eq!(floor(x), x.floor(), "floor({x})");
            assert_eq!(round_ties_even(x), x.round_ties_even(), "round({x})");
        }
        assert!(round_ties_even(f64::NAN).is_nan());
        assert_eq!(round_ties_even(f64::INFINITY), f64::INFINITY);
    }
}
