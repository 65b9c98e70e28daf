//! Geometry planning: the geometric ops of a pipeline folded, per sample, into one [`Plan`] —
//! an affine map from the output grid to the decoded image, a clip rectangle and a flip flag
//! (see the module docs of [`crate::transform`]).

use super::spec::Op;
use crate::decode::{Dims, MAX_IMAGE_PIXELS};
use crate::rng::Rng;

/// Where one sample's output pixels come from in its decoded image, after the random choices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    /// Source pixels the filter may read: `[x0, y0, x1, y1)`.
    pub clip: [usize; 4],
    /// Source rectangle (left, top, width, height) mapped onto the output, in pixel-edge
    /// coordinates of the decoded image.
    pub rect: [f64; 4],
    /// Output width.
    pub width: usize,
    /// Output height.
    pub height: usize,
    /// Mirror the output left to right (a folded `hflip`).
    pub flip: bool,
}

impl Plan {
    /// Whether the output is a plain copy of source pixels (no resampling needed).
    pub(super) fn is_copy(&self) -> bool {
        let [left, top, w, h] = self.rect;
        left.fract() == 0.0
            && top.fract() == 0.0
            && w == self.width as f64
            && h == self.height as f64
            && left >= self.clip[0] as f64
            && top >= self.clip[1] as f64
            && left + w <= self.clip[2] as f64
            && top + h <= self.clip[3] as f64
    }
}

impl Plan {
    /// The part of this plan's output that a `width`x`height` window at `(left, top)` of it
    /// keeps (the window may reach past the output: a padded crop fills that), as the plan of
    /// that part alone, and where the part lands in the window; `None` when nothing is kept.
    /// Resampling only the part gives that part of the whole output, as a crop after a resize
    /// does (see the module docs of [`crate::transform`]): each output pixel keeps its place
    /// and filter in the source. Pixels may differ by one level, because fast_image_resize
    /// sizes its fixed-point weights by the largest weight of the output it writes.
    pub(super) fn part(
        &self,
        (left, top): (isize, isize),
        (width, height): (usize, usize),
    ) -> Option<(Plan, (usize, usize))> {
        let span = |origin: isize, len: usize, size: usize| {
            let start = origin.max(0) as usize;
            let end = (origin + len as isize).clamp(0, size as isize) as usize;
            (start < end).then_some((start, end))
        };
        let (x0, x1) = span(left, width, self.width)?;
        let (y0, y1) = span(top, height, self.height)?;
        let (w, h) = (x1 - x0, y1 - y0);
        // A flipped plan's output is mirrored: the part's columns before the mirror.
        let ux = if self.flip { self.width - x1 } else { x0 };
        let [rl, rt, rw, rh] = self.rect;
        let (kx, ky) = (rw / self.width as f64, rh / self.height as f64);
        let plan = Plan {
            rect: [
                rl + ux as f64 * kx,
                rt + y0 as f64 * ky,
                w as f64 * kx,
                h as f64 * ky,
            ],
            width: w,
            height: h,
            ..*self
        };
        let at = ((x0 as isize - left) as usize, (y0 as isize - top) as usize);
        Some((plan, at))
    }

    /// The same plan over a part of the image shrunk by `1/scale`: `dims` pixels whose top-left
    /// is `(x, y)` of the shrunk image (what a region decode produced). The clip is rounded
    /// outwards to whole shrunk pixels and kept inside the part.
    pub fn in_region(&self, x: usize, y: usize, scale: usize, dims: Dims) -> Plan {
        let s = scale as f64;
        let [left, top, w, h] = self.rect;
        let [cx0, cy0, cx1, cy1] = self.clip;
        let inside = |v: usize, origin: usize, len: usize| v.saturating_sub(origin).min(len);
        let clip = [
            inside(cx0 / scale, x, dims.width),
            inside(cy0 / scale, y, dims.height),
            inside(cx1.div_ceil(scale), x, dims.width),
            inside(cy1.div_ceil(scale), y, dims.height),
        ];
        // Float rounding must not push the rectangle out of the decoded pixels.
        let left = (left / s - x as f64).clamp(0.0, dims.width as f64);
        let top = (top / s - y as f64).clamp(0.0, dims.height as f64);
        Plan {
            clip,
            rect: [
                left,
                top,
                (w / s).min(dims.width as f64 - left),
                (h / s).min(dims.height as f64 - top),
            ],
            ..*self
        }
    }
}

/// The virtual image while the geometric ops are folded (see the module docs).
pub(super) struct View {
    pub(super) clip: [usize; 4],
    pub(super) ox: f64,
    pub(super) oy: f64,
    pub(super) kx: f64,
    pub(super) ky: f64,
    pub(super) w: usize,
    pub(super) h: usize,
    pub(super) flip: bool,
}

impl View {
    pub(super) fn resize(&mut self, width: usize, height: usize) {
        self.kx *= self.w as f64 / width as f64;
        self.ky *= self.h as f64 / height as f64;
        self.w = width;
        self.h = height;
    }

    /// Crops `(top, left, height, width)` of the current (possibly flipped) view; the box must
    /// lie inside it.
    pub(super) fn crop(&mut self, top: usize, left: usize, height: usize, width: usize) {
        let left = if self.flip {
            self.w - left - width
        } else {
            left
        };
        self.ox += left as f64 * self.kx;
        self.oy += top as f64 * self.ky;
        if self.kx == 1.0 && self.ky == 1.0 && self.ox.fract() == 0.0 && self.oy.fract() == 0.0 {
            // An integer crop of the decoded image: the filter must not read outside it.
            let (x0, y0) = (self.ox as usize, self.oy as usize);
            self.clip = [
                self.clip[0].max(x0),
                self.clip[1].max(y0),
                self.clip[2].min(x0 + width),
                self.clip[3].min(y0 + height),
            ];
        }
        self.w = width;
        self.h = height;
    }
}

/// torchvision's `Resize(S)` output size for a `w`x`h` image: the shorter side becomes `s`, the
/// longer `int(s * long / short)` (floor, as Python's `int()` of the float quotient).
pub fn resize_shorter(w: usize, h: usize, s: usize) -> (usize, usize) {
    if w <= h {
        (s, ((s as f64 * h as f64 / w as f64) as usize).max(1))
    } else {
        (((s as f64 * w as f64 / h as f64) as usize).max(1), s)
    }
}

/// torchvision's `ScaleJitter` output size `(width, height)` for a `w`x`h` image with target
/// `target_h`x`target_w`: `r = min(target_h / h, target_w / w) * U(scale)`, each side
/// `int(side * r)` (at least 1). torchvision draws the factor as a float32 tensor, so `r` and the
/// products are float32 and so are they here: the floors then agree at the boundaries. Then
/// `max_size` caps the longer side as `Resize(size, max_size=M)` does: when it exceeds `M` it
/// becomes `M` and the shorter `int(M * short / long)`.
pub fn scale_jitter_size(
    w: usize,
    h: usize,
    (target_h, target_w): (usize, usize),
    scale: (f64, f64),
    max_size: Option<usize>,
    rng: &mut Rng,
) -> (usize, usize) {
    let u = rng.unit_f64() as f32;
    let factor = scale.0 as f32 + u * (scale.1 - scale.0) as f32;
    let base = (target_h as f64 / h as f64).min(target_w as f64 / w as f64);
    let r = base as f32 * factor;
    let side = |n: usize| ((n as f32 * r) as usize).max(1);
    let (nw, nh) = (side(w), side(h));
    match max_size {
        Some(m) if nw.max(nh) > m => {
            let short = ((m as f64 * nw.min(nh) as f64 / nw.max(nh) as f64) as usize).max(1);
            if nw >= nh {
                (m, short)
            } else {
                (short, m)
            }
        }
        _ => (nw, nh),
    }
}

/// torchvision's `RandomShortestSize` output size `(width, height)` for a `w`x`h` image: a size
/// `s` drawn uniformly from `sizes`, `r = s / short`, lowered to `max_size / long` when that is
/// smaller, each side `int(side * r)` (at least 1), in float64 as torchvision's Python floats.
pub fn shortest_size(
    w: usize,
    h: usize,
    sizes: &[usize],
    max_size: Option<usize>,
    rng: &mut Rng,
) -> (usize, usize) {
    let s = sizes[rng.below(sizes.len() as u64) as usize];
    let mut r = s as f64 / w.min(h) as f64;
    if let Some(m) = max_size {
        r = r.min(m as f64 / w.max(h) as f64);
    }
    let side = |n: usize| ((n as f64 * r) as usize).max(1);
    (side(w), side(h))
}

/// torchvision's `RandomResizedCrop.get_params` for a `width`x`height` image; returns
/// `(top, left, h, w)`. Ten attempts: `target_area = area * U(scale)`,
/// `aspect = exp(U(ln ratio.0, ln ratio.1))`, `w = round(sqrt(target_area * aspect))`,
/// `h = round(sqrt(target_area / aspect))` (round half to even, like Python's `round`); the first
/// box that fits is placed uniformly (`top = randint(0, height - h)`, then `left`). Otherwise the
/// central fallback: the whole image, clamped to the ratio range (`w = width,
/// h = round(w / min(ratio))` if too tall, `h = height, w = round(h * max(ratio))` if too wide),
/// centred with floor division.
pub fn random_resized_crop_params(
    width: usize,
    height: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut Rng,
) -> (usize, usize, usize, usize) {
    let area = width as f64 * height as f64;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale.0, scale.1);
        let aspect = rng.uniform(log_lo, log_hi).exp();
        let w = (target_area * aspect).sqrt().round_ties_even();
        let h = (target_area / aspect).sqrt().round_ties_even();
        if w >= 1.0 && w <= width as f64 && h >= 1.0 && h <= height as f64 {
            let (w, h) = (w as usize, h as usize);
            let top = rng.below((height - h + 1) as u64) as usize;
            let left = rng.below((width - w + 1) as u64) as usize;
            return (top, left, h, w);
        }
    }
    let in_ratio = width as f64 / height as f64;
    let (w, h) = if in_ratio < ratio.0 {
        let h = (width as f64 / ratio.0).round_ties_even() as usize;
        (width, h.clamp(1, height))
    } else if in_ratio > ratio.1 {
        let w = (height as f64 * ratio.1).round_ties_even() as usize;
        (w.clamp(1, width), height)
    } else {
        (width, height)
    };
    ((height - h) / 2, (width - w) / 2, h, w)
}

/// One geometric step of a plan, in the coordinates of the image as it is before the step
/// (a crop of a flipped view is where torchvision's crop of the flipped image would be): what
/// [`plan_with`] reports, op by op, for what must follow each op exactly (keypoints).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step<'a> {
    /// A resize from `from` to `to` (both `(width, height)`).
    Resize {
        /// Size before.
        from: (usize, usize),
        /// Size after.
        to: (usize, usize),
    },
    /// A crop whose top-left corner is `(left, top)`, `width`x`height`.
    Crop {
        /// Left edge.
        left: usize,
        /// Top edge.
        top: usize,
        /// Width of the crop.
        width: usize,
        /// Height of the crop.
        height: usize,
    },
    /// A left-right mirror of an image `width` wide.
    HFlip {
        /// Width of the image mirrored.
        width: usize,
    },
    /// `random_iou_crop` chose the crop that follows: per box of the sample, whether its
    /// centre lies inside (the boxes kept).
    Within(&'a [bool]),
}

/// Folds `ops` for a `width`x`height` decoded image, drawing the random choices from `rng` in op
/// order.
pub fn plan(ops: &[Op], width: usize, height: usize, rng: &mut Rng) -> Result<Plan, String> {
    plan_with(ops, width, height, rng, None, &mut |_| {})
}

/// [`plan`] for a sample with `boxes` (`xyxy` pixels of the decoded image; what
/// `random_iou_crop` draws its crop from, `None` when the sample has no boxes role), telling
/// `step` each geometric step as it folds it (same draws, same order). Every field of a sample
/// plans with the same boxes, so draws the same crop.
pub fn plan_with(
    ops: &[Op],
    width: usize,
    height: usize,
    rng: &mut Rng,
    boxes: Option<&[[f64; 4]]>,
    step: &mut dyn FnMut(Step<'_>),
) -> Result<Plan, String> {
    let mut v = View {
        clip: [0, 0, width, height],
        ox: 0.0,
        oy: 0.0,
        kx: 1.0,
        ky: 1.0,
        w: width,
        h: height,
        flip: false,
    };
    for op in ops {
        match *op {
            Op::ResizeShorter(s) => {
                let (w, h) = resize_shorter(v.w, v.h, s);
                step(Step::Resize {
                    from: (v.w, v.h),
                    to: (w, h),
                });
                v.resize(w, h);
            }
            Op::Resize { height, width } => {
                step(Step::Resize {
                    from: (v.w, v.h),
                    to: (width, height),
                });
                v.resize(width, height)
            }
            Op::CenterCrop { height, width } => {
                if height > v.h || width > v.w {
                    return Err(format!(
                        "image is {}x{} at center_crop({height}, {width}), smaller than the \
                         crop; put a resize before it",
                        v.w, v.h
                    ));
                }
                // torchvision: int(round((h - ch) / 2.0)), Python's round (half to even).
                let top = ((v.h - height) as f64 / 2.0).round_ties_even() as usize;
                let left = ((v.w - width) as f64 / 2.0).round_ties_even() as usize;
                step(Step::Crop {
                    left,
                    top,
                    width,
                    height,
                });
                v.crop(top, left, height, width);
            }
            Op::RandomResizedCrop {
                height,
                width,
                scale,
                ratio,
            } => {
                let (top, left, h, w) = random_resized_crop_params(v.w, v.h, scale, ratio, rng);
                step(Step::Crop {
                    left,
                    top,
                    width: w,
                    height: h,
                });
                step(Step::Resize {
                    from: (w, h),
                    to: (width, height),
                });
                v.crop(top, left, h, w);
                v.resize(width, height);
            }
            Op::ScaleJitter {
                height,
                width,
                scale,
                max_size,
            } => {
                let (w, h) = scale_jitter_size(v.w, v.h, (height, width), scale, max_size, rng);
                step(Step::Resize {
                    from: (v.w, v.h),
                    to: (w, h),
                });
                v.resize(w, h);
            }
            Op::RandomShortestSize {
                ref sizes,
                max_size,
            } => {
                let (w, h) = shortest_size(v.w, v.h, sizes, max_size, rng);
                step(Step::Resize {
                    from: (v.w, v.h),
                    to: (w, h),
                });
                v.resize(w, h);
            }
            Op::RandomIouCrop(ref crop) => {
                let Some(boxes) = boxes else {
                    return Err(
                        "random_iou_crop draws its crop from the sample's boxes: name \
                                them with fields(image=NAME, boxes=NAME, labels=NAME) first \
                                in the spec"
                            .into(),
                    );
                };
                // The boxes in the view's pixels: shifted and scaled by the crops and resizes
                // folded so far, mirrored by a flip, clamped as after each crop.
                let (w, h) = (v.w as f64, v.h as f64);
                let seen: Vec<[f64; 4]> = boxes
                    .iter()
                    .map(|b| {
                        let (x0, x1) = ((b[0] - v.ox) / v.kx, (b[2] - v.ox) / v.kx);
                        let (y0, y1) = ((b[1] - v.oy) / v.ky, (b[3] - v.oy) / v.ky);
                        let (x0, x1) = if v.flip { (w - x1, w - x0) } else { (x0, x1) };
                        [
                            x0.clamp(0.0, w),
                            y0.clamp(0.0, h),
                            x1.clamp(0.0, w),
                            y1.clamp(0.0, h),
                        ]
                    })
                    .collect();
                if let Some(drawn) = super::iou_crop::draw(crop, v.w, v.h, &seen, rng) {
                    let (left, top, width, height) = drawn.rect;
                    step(Step::Within(&drawn.within));
                    step(Step::Crop {
                        left,
                        top,
                        width,
                        height,
                    });
                    v.crop(top, left, height, width);
                }
            }
            Op::HFlip { p } => {
                if rng.unit_f64() < p {
                    step(Step::HFlip { width: v.w });
                    v.flip = !v.flip;
                }
            }
            Op::Normalize { .. } => {}
            ref other => {
                return Err(format!(
                    "internal: {other:?} is not folded into the geometry plan"
                ))
            }
        }
    }
    // The planned image is materialised when ops follow the plan: a spec such as
    // `resize(56565) | random_crop(224)` would ask for 13 GB per sample (found by the
    // transform_spec fuzz target). It is held to what a decoded image may be by default.
    if (v.w as u64).saturating_mul(v.h as u64) > MAX_IMAGE_PIXELS {
        return Err(format!(
            "the geometric ops make this {width}x{height} image {}x{}: more than \
             {MAX_IMAGE_PIXELS} pixels, the most a decoded image has by default \
             (max_image_pixels); resize it smaller",
            v.w, v.h
        ));
    }
    // Keep the source rectangle inside the image despite float rounding.
    let left = v.ox.clamp(0.0, width as f64);
    let top = v.oy.clamp(0.0, height as f64);
    let rw = (v.w as f64 * v.kx).min(width as f64 - left);
    let rh = (v.h as f64 * v.ky).min(height as f64 - top);
    Ok(Plan {
        clip: v.clip,
        rect: [left, top, rw, rh],
        width: v.w,
        height: v.h,
        flip: v.flip,
    })
}
