//! The planes a [`DensePipeline`](super::DensePipeline) works on: a worker's reusable buffers
//! per element type, the element types' conversions, and the per-plane kernels (resample,
//! nearest, warps).

use fast_image_resize::{FilterType, Resizer};

use crate::dtype::DType;
use crate::source::pixels::InputLayout;
use crate::transform::geometry::Plan;
use crate::transform::warp::{inverse_warp_point, round_ties_even};
use crate::transform::{resample, Sampled};

/// A worker's reusable buffers for [`DensePipeline::apply`](super::DensePipeline::apply), one set per element type.
#[derive(Default)]
pub struct DenseScratch {
    pub(super) u8s: Planes<u8>,
    pub(super) f32s: Planes<f32>,
    pub(super) i32s: Planes<i32>,
    pub(super) i64s: Planes<i64>,
    pub(super) resizer: Resizer,
}

/// One stored plane, the planes being transformed, and a spare set.
#[derive(Default)]
pub(super) struct Planes<T> {
    pub(super) plane: Vec<T>,
    pub(super) img: Vec<T>,
    pub(super) spare: Vec<T>,
}

impl<T: Px> Planes<T> {
    /// Runs `kernel(channel, src, dst)` for every plane into the spare buffer (planes of
    /// `plane` elements), then makes it the image.
    pub(super) fn replace(
        &mut self,
        channels: usize,
        plane: usize,
        mut kernel: impl FnMut(usize, &[T], &mut [T]),
    ) {
        let src_plane = self.img.len() / channels.max(1);
        self.spare.clear();
        self.spare.resize(plane * channels, T::default());
        for (c, (src, dst)) in self
            .img
            .chunks_exact(src_plane.max(1))
            .zip(self.spare.chunks_exact_mut(plane.max(1)))
            .enumerate()
        {
            kernel(c, src, dst);
        }
        std::mem::swap(&mut self.img, &mut self.spare);
    }
}

/// An element a dense plane holds while it is transformed.
pub(super) trait Px: Copy + Default + PartialEq + 'static {
    /// Every channel of a stored `(width, height, channels)` tensor of `dtype` in `layout`, as
    /// planes one after the other in `out`, in one pass over the tensor.
    fn load_planes(
        src: &[u8],
        dtype: DType,
        layout: InputLayout,
        (width, height, channels): (usize, usize, usize),
        out: &mut Vec<Self>,
    ) {
        let n = dtype.size();
        out.clear();
        match layout {
            InputLayout::Chw => out.extend(src.chunks_exact(n).map(|b| Self::load(dtype, b))),
            InputLayout::Hwc => {
                let plane = width * height;
                out.resize(plane * channels, Self::default());
                for (i, px) in src.chunks_exact(n * channels).enumerate() {
                    for (c, b) in px.chunks_exact(n).enumerate() {
                        out[c * plane + i] = Self::load(dtype, b);
                    }
                }
            }
        }
    }
    /// The stored planes themselves, when they need no conversion (uint8, channels first).
    fn stored_planes(_src: &[u8], _dtype: DType, _layout: InputLayout) -> Option<&[Self]> {
        None
    }
    /// One stored element of `dtype` (its native-endian bytes).
    fn load(dtype: DType, bytes: &[u8]) -> Self;
    /// Writes the element as stored (its native-endian bytes).
    fn store(self, out: &mut [u8]);
    /// A computed value: rounded half to even and saturated for integers.
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// A label as int64 (masks' elements: uint8, int32 (for uint16 too), int64).
    fn to_i64(self) -> i64 {
        self.to_f64() as i64
    }
    /// The antialiased bilinear resample of `plan` for this element type.
    fn resample(
        _plane: &[Self],
        _width: usize,
        _height: usize,
        _plan: &Plan,
        _out: &mut [Self],
        _resizer: &mut Resizer,
    ) -> Result<(), String> {
        Err("internal: labels are never resampled with a filter".into())
    }
}

impl Px for u8 {
    fn load(_: DType, bytes: &[u8]) -> u8 {
        bytes[0]
    }
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
    fn stored_planes(src: &[u8], dtype: DType, layout: InputLayout) -> Option<&[u8]> {
        (dtype == DType::U8 && layout == InputLayout::Chw).then_some(src)
    }
    fn store(self, out: &mut [u8]) {
        out[0] = self;
    }
    fn from_f64(v: f64) -> u8 {
        round_ties_even(v).clamp(0.0, 255.0) as u8
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn resample(
        plane: &[u8],
        width: usize,
        height: usize,
        plan: &Plan,
        out: &mut [u8],
        resizer: &mut Resizer,
    ) -> Result<(), String> {
        resample(
            plane,
            (width, height),
            Sampled::Gray8,
            plan,
            FilterType::Bilinear,
            out,
            resizer,
        )
    }
}

impl Px for f32 {
    fn load(dtype: DType, b: &[u8]) -> f32 {
        match dtype {
            DType::F16 => half::f16::from_ne_bytes([b[0], b[1]]).to_f32(),
            DType::BF16 => half::bf16::from_ne_bytes([b[0], b[1]]).to_f32(),
            DType::U16 => u16::from_ne_bytes([b[0], b[1]]) as f32,
            _ => f32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        }
    }
    fn store(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_ne_bytes());
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn resample(
        plane: &[f32],
        width: usize,
        height: usize,
        plan: &Plan,
        out: &mut [f32],
        resizer: &mut Resizer,
    ) -> Result<(), String> {
        // SAFETY: every bit pattern is a valid u8, and u8's alignment (1) divides f32's, so
        // viewing the initialised f32 slice as bytes is sound and leaves no head or tail.
        let (_, bytes, _) = unsafe { plane.align_to::<u8>() };
        // SAFETY: as above; fast_image_resize writes f32 values (`Sampled::F32`) through the
        // bytes, and every bit pattern is a valid f32.
        let (_, out_bytes, _) = unsafe { out.align_to_mut::<u8>() };
        resample(
            bytes,
            (width, height),
            Sampled::F32,
            plan,
            FilterType::Bilinear,
            out_bytes,
            resizer,
        )
    }
}

impl Px for i32 {
    fn load(dtype: DType, b: &[u8]) -> i32 {
        match dtype {
            // A uint16 mask's labels, widened.
            DType::U16 => i32::from(u16::from_ne_bytes([b[0], b[1]])),
            _ => i32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        }
    }
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
    fn store(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_ne_bytes());
    }
    fn from_f64(v: f64) -> i32 {
        v as i32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Px for i64 {
    fn load(dtype: DType, b: &[u8]) -> i64 {
        match dtype {
            // uint8 labels widened (an `ignore_index` no byte holds).
            DType::U8 => i64::from(b[0]),
            _ => {
                let mut a = [0u8; 8];
                a.copy_from_slice(&b[..8]);
                i64::from_ne_bytes(a)
            }
        }
    }
    fn to_i64(self) -> i64 {
        self
    }
    fn store(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_ne_bytes());
    }
    fn from_f64(v: f64) -> i64 {
        v as i64
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

/// The plan's source rectangle copied as it is (the plan is a whole-pixel crop).
pub(super) fn copy_plane<T: Px>(plane: &[T], width: usize, plan: &Plan, out: &mut [T]) {
    let (x0, y0) = (plan.rect[0] as usize, plan.rect[1] as usize);
    for (y, row) in out.chunks_exact_mut(plan.width).enumerate() {
        let start = (y0 + y) * width + x0;
        row.copy_from_slice(&plane[start..start + plan.width]);
    }
}

/// Nearest-neighbour sampling of the plan (torch's `nearest`: output pixel `j` takes source
/// pixel `floor(left + j * rw / width)`), within the plan's clip: labels are never blended.
pub(super) fn nearest_plane<T: Px>(plane: &[T], width: usize, plan: &Plan, out: &mut [T]) {
    let [left, top, rw, rh] = plan.rect;
    let [cx0, cy0, cx1, cy1] = plan.clip;
    // The source column of each output column, computed once for all rows.
    let columns = nearest_indices(left, rw / plan.width as f64, plan.width, (cx0, cx1));
    let rows = nearest_indices(top, rh / plan.height as f64, plan.height, (cy0, cy1));
    for (row, sy) in out.chunks_exact_mut(plan.width).zip(rows) {
        let src = &plane[sy * width..(sy + 1) * width];
        for (px, &sx) in row.iter_mut().zip(&columns) {
            *px = src[sx];
        }
    }
}

/// The source index of each of `count` output pixels sampled nearest from `origin` in steps of
/// `k`, within `[lo, hi)`.
fn nearest_indices(origin: f64, k: f64, count: usize, (lo, hi): (usize, usize)) -> Vec<usize> {
    // torch takes `floor(j * scale)` of the resized image's pixel `j` in float32, and a crop
    // after the resize shifts `j` by whole pixels: the origin is the clip's start (an integer
    // crop before the resize) plus `shift * k`. Where that holds, index as torch does, so that a
    // product landing on a whole source pixel (a resize then a crop) rounds the same way;
    // otherwise the exact product.
    let shift = (origin - lo as f64) / k;
    let whole = shift > -0.5 && (shift - shift.round()).abs() < 1e-6;
    (0..count)
        .map(|i| {
            let src = if whole {
                lo as f64 + ((shift.round() as f32 + i as f32) * k as f32).floor() as f64
            } else {
                (origin + i as f64 * k).floor()
            };
            (src.max(0.0) as usize).clamp(lo, hi.saturating_sub(1).max(lo))
        })
        .collect()
}

/// The inverse-affine warp of one plane, nearest (round half to even) with `fill` outside:
/// [`super::warp`]'s `Nearest` for labels.
pub(super) fn warp_nearest<T: Px>(
    src: &[T],
    dst: &mut [T],
    width: usize,
    height: usize,
    m: &[f64; 6],
    fill: T,
) {
    let (w, h) = (width as f64, height as f64);
    for (i, row) in dst.chunks_exact_mut(width).enumerate() {
        for (j, px) in row.iter_mut().enumerate() {
            let (sx, sy) = inverse_warp_point(m, width, height, i, j);
            let (nx, ny) = (round_ties_even(sx), round_ties_even(sy));
            *px = if nx >= 0.0 && ny >= 0.0 && nx < w && ny < h {
                src[ny as usize * width + nx as usize]
            } else {
                fill
            };
        }
    }
}

/// The inverse-affine warp of one plane, bilinear with torchvision's fill blend
/// (`mask * (value - fill) + fill`): [`super::warp`]'s `Bilinear` for one channel of any type.
pub(super) fn warp_bilinear<T: Px>(
    src: &[T],
    dst: &mut [T],
    width: usize,
    height: usize,
    m: &[f64; 6],
    fill: f64,
) {
    let (w, h) = (width as f64, height as f64);
    for (i, row) in dst.chunks_exact_mut(width).enumerate() {
        for (j, px) in row.iter_mut().enumerate() {
            let (sx, sy) = inverse_warp_point(m, width, height, i, j);
            let (x0, y0) = (sx.floor(), sy.floor());
            let (fx, fy) = (sx - x0, sy - y0);
            let (mut acc, mut mask) = (0f64, 0f64);
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
                    acc += wx * wy * src[yy as usize * width + xx as usize].to_f64();
                    mask += wx * wy;
                }
            }
            *px = T::from_f64(mask * (acc - fill) + fill);
        }
    }
}
