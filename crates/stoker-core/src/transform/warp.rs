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
    let (w, h) = (width as f64, height as f64);
    let stride = width * 3;
    for i in 0..height {
        let y = i as f64 - h * 0.5 + 0.5;
        for j in 0..width {
            let x = j as f64 - w * 0.5 + 0.5;
            let sx = m[0] * x + m[1] * y + m[2] + w * 0.5 - 0.5;
            let sy = m[3] * x + m[4] * y + m[5] + h * 0.5 - 0.5;
            let o = i * stride + j * 3;
            match sampling {
                Sampling::Nearest => {
                    let (nx, ny) = (sx.round_ties_even(), sy.round_ties_even());
                    if nx >= 0.0 && ny >= 0.0 && nx < w && ny < h {
                        let s = ny as usize * stride + nx as usize * 3;
                        dst[o..o + 3].copy_from_slice(&src[s..s + 3]);
                    } else {
                        dst[o..o + 3].fill(0);
                    }
                }
                Sampling::Bilinear(fill) => {
                    let (x0, y0) = (sx.floor(), sy.floor());
                    let (fx, fy) = (sx - x0, sy - y0);
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
                        dst[o + c] = v.round_ties_even().clamp(0.0, 255.0) as u8;
                    }
                }
            }
        }
    }
}

/// Index `u` of a padded axis of length `n` mapped into `0..n` by `mode`; `None`: the constant
/// fill. The padding is smaller than `n` (reflect) or at most `n` (symmetric), so one mirror
/// suffices.
#[inline]
fn pad_index(u: isize, n: usize, mode: PadMode) -> Option<usize> {
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
        for x in 0..width / 2 {
            let (a, b) = (x * 3, (width - 1 - x) * 3);
            for c in 0..3 {
                row.swap(a + c, b + c);
            }
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
