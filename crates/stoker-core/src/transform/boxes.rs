//! Bounding boxes moved with their image's draw: torchvision v2's `tv_tensors.BoundingBoxes`
//! through the same geometric ops, then `ClampBoundingBoxes` and `SanitizeBoundingBoxes`.
//!
//! A box is four numbers in pixel-edge coordinates of the image (`xyxy`: left, top, right,
//! bottom; `xywh`; `cxcywh`). The folded [`Plan`] maps them by its rectangle and output size
//! (and mirrors them when it flips), crops shift them (and pad: the padding's mode is the
//! pixels' business), flips mirror them, `rotate`/`affine` move the four corners by the forward
//! map and take their enclosing box (torchvision's `expand=False` path); every crop and warp
//! clamps to the image, as torchvision does after each. Colour ops and `random_erasing` leave
//! them. Finally a box narrower or lower than `min_size` pixels, or smaller than `min_area`, is
//! dropped, and with it its label and per-box fields (`SanitizeBoundingBoxes`, see [`Sanitize`]).

use super::augment::{self, aug_is_geometric, Drawn};
use super::geometry::{Plan, Step};
use super::pipeline::foldable;
use super::roles::{BoxFormat, Sanitize};
use super::spec::{parse, Op};
use crate::rng::Rng;

/// How far (in pixels) an annotated box may reach past the image's edge before it is refused:
/// annotations rounded to a pixel or written as pixel centres (COCO's) overshoot by under one.
pub const EDGE_SLACK: f64 = 1.0;

/// The ops of a spec as they move the boxes of a `width`x`height` tensor image.
#[derive(Clone, Debug)]
pub struct BoxPipeline {
    ops: Vec<Op>,
    planned: usize,
    width: usize,
    height: usize,
    format: BoxFormat,
    sanitize: Sanitize,
}

impl BoxPipeline {
    /// The box pipeline of `spec` for images of `width`x`height` (a tensor image's size).
    pub fn new(
        spec: &str,
        width: usize,
        height: usize,
        format: BoxFormat,
    ) -> Result<BoxPipeline, String> {
        let mut ops = parse(spec)?;
        ops.retain(|op| !matches!(op, Op::Mixup { .. } | Op::Cutmix { .. }));
        if ops.iter().any(|op| {
            matches!(
                op,
                Op::RandAugment { .. } | Op::TrivialAugment | Op::AutoAugment
            )
        }) {
            return Err(
                "the AutoAugment family is not supported with boxes yet: its shear, \
                        translate and rotate branches would have to move the boxes too"
                    .into(),
            );
        }
        let planned = ops.iter().position(|op| !foldable(op)).unwrap_or(ops.len());
        Ok(BoxPipeline {
            ops,
            planned,
            width,
            height,
            format,
            sanitize: Sanitize::default(),
        })
    }

    /// This pipeline dropping boxes by `sanitize` instead of the defaults.
    pub fn sanitized(self, sanitize: Sanitize) -> BoxPipeline {
        BoxPipeline { sanitize, ..self }
    }

    /// This pipeline for images of `width`x`height` (an encoded image's size, read per sample).
    pub fn for_size(&self, width: usize, height: usize) -> BoxPipeline {
        BoxPipeline {
            width,
            height,
            ..self.clone()
        }
    }

    /// Checks annotated boxes before they move: every number finite, no negative width or
    /// height, and every box within the image (up to [`EDGE_SLACK`] past an edge). Errors say
    /// which box and what is wrong, in the boxes' own format.
    pub fn check(&self, boxes: &[[f32; 4]]) -> Result<(), String> {
        let (w, h) = (self.width as f64, self.height as f64);
        for (i, b) in boxes.iter().enumerate() {
            if b.iter().any(|v| !v.is_finite()) {
                return Err(format!(
                    "box {i} {b:?} has a coordinate that is not a finite number"
                ));
            }
            let [x0, y0, x1, y1] = to_xyxy(self.format, b.map(f64::from));
            if x1 < x0 || y1 < y0 {
                return Err(format!(
                    "box {i} {b:?} ({:?}) has a negative width or height",
                    self.format
                ));
            }
            let s = EDGE_SLACK;
            if x0 < -s || y0 < -s || x1 > w + s || y1 > h + s {
                return Err(format!(
                    "box {i} {b:?} ({:?}) is outside the {}x{} image",
                    self.format, self.width, self.height
                ));
            }
        }
        Ok(())
    }

    /// `boxes` (stored as the pipeline's format) as `xyxy` pixels: what the other fields of the
    /// sample plan `random_iou_crop` from.
    pub fn source_xyxy(&self, boxes: &[[f32; 4]]) -> Vec<[f64; 4]> {
        boxes
            .iter()
            .map(|b| to_xyxy(self.format, b.map(f64::from)))
            .collect()
    }

    /// Moves `boxes` (stored as the pipeline's format) with the draws `rng` gives, as the
    /// image's pipeline draws them; returns the kept boxes (same format) and their indices.
    /// A box whose centre `random_iou_crop` left outside its crop is dropped.
    pub fn apply(
        &self,
        boxes: &[[f32; 4]],
        rng: &mut Rng,
    ) -> Result<(Vec<[f32; 4]>, Vec<usize>), String> {
        let mut xyxy = self.source_xyxy(boxes);
        let mut dropped = vec![false; xyxy.len()];
        let plan = super::geometry::plan_with(
            &self.ops[..self.planned],
            self.width,
            self.height,
            rng,
            Some(&xyxy),
            &mut |step| {
                if let Step::Within(within) = step {
                    for (d, &inside) in dropped.iter_mut().zip(within) {
                        *d |= !inside;
                    }
                }
            },
        )?;
        for b in &mut xyxy {
            *b = through_plan(&plan, *b);
        }
        let (mut w, mut h) = (plan.width, plan.height);
        for op in &self.ops[self.planned..] {
            match augment::draw(op, w, h, rng, &mut None)? {
                Drawn::Crop {
                    top,
                    left,
                    width,
                    height,
                    pad,
                    ..
                } => {
                    let (dx, dy) = (pad.0 as f64 - left as f64, pad.1 as f64 - top as f64);
                    for b in &mut xyxy {
                        *b = clamp([b[0] + dx, b[1] + dy, b[2] + dx, b[3] + dy], width, height);
                    }
                    (w, h) = (width, height);
                }
                Drawn::Flip { vertical } => {
                    for b in &mut xyxy {
                        *b = if vertical {
                            [b[0], h as f64 - b[3], b[2], h as f64 - b[1]]
                        } else {
                            [w as f64 - b[2], b[1], w as f64 - b[0], b[3]]
                        };
                    }
                }
                Drawn::Warp { m, .. } => {
                    for b in &mut xyxy {
                        *b = clamp(warp_box(&m, *b, w, h), w, h);
                    }
                }
                Drawn::Aug { ops, len } => {
                    if ops[..len].iter().any(|&(op, _)| aug_is_geometric(op)) {
                        return Err("internal: an AutoAugment-family op with boxes".into());
                    }
                }
                Drawn::Nothing
                | Drawn::Grayscale
                | Drawn::Jitter { .. }
                | Drawn::Photometric(_)
                | Drawn::Blur { .. }
                | Drawn::Erase(_) => {}
            }
        }
        let mut kept = Vec::new();
        let mut indices = Vec::new();
        for (i, b) in xyxy.into_iter().enumerate() {
            let b = clamp(b, w, h);
            let (bw, bh) = (b[2] - b[0], b[3] - b[1]);
            // NaN sides (a NaN box from the source) fail these comparisons: dropped too.
            let Sanitize { min_size, min_area } = self.sanitize;
            if bw >= min_size && bh >= min_size && bw * bh >= min_area && !dropped[i] {
                kept.push(from_xyxy(self.format, b).map(|v| v as f32));
                indices.push(i);
            }
        }
        Ok((kept, indices))
    }
}

fn to_xyxy(format: BoxFormat, b: [f64; 4]) -> [f64; 4] {
    match format {
        BoxFormat::Xyxy => b,
        BoxFormat::Xywh => [b[0], b[1], b[0] + b[2], b[1] + b[3]],
        BoxFormat::Cxcywh => [
            b[0] - b[2] / 2.0,
            b[1] - b[3] / 2.0,
            b[0] + b[2] / 2.0,
            b[1] + b[3] / 2.0,
        ],
    }
}

fn from_xyxy(format: BoxFormat, b: [f64; 4]) -> [f64; 4] {
    let (w, h) = (b[2] - b[0], b[3] - b[1]);
    match format {
        BoxFormat::Xyxy => b,
        BoxFormat::Xywh => [b[0], b[1], w, h],
        BoxFormat::Cxcywh => [b[0] + w / 2.0, b[1] + h / 2.0, w, h],
    }
}

/// The box clamped to a `w`x`h` image (`ClampBoundingBoxes`).
fn clamp(b: [f64; 4], w: usize, h: usize) -> [f64; 4] {
    let (w, h) = (w as f64, h as f64);
    [
        b[0].clamp(0.0, w),
        b[1].clamp(0.0, h),
        b[2].clamp(0.0, w),
        b[3].clamp(0.0, h),
    ]
}

/// A box of the source image mapped onto the plan's output grid: its rectangle's origin to 0,
/// its size to the output size, mirrored when the plan flips; clamped, as the crop clamps.
fn through_plan(plan: &Plan, b: [f64; 4]) -> [f64; 4] {
    let [left, top, rw, rh] = plan.rect;
    let (kx, ky) = (plan.width as f64 / rw, plan.height as f64 / rh);
    let mut out = clamp(
        [
            (b[0] - left) * kx,
            (b[1] - top) * ky,
            (b[2] - left) * kx,
            (b[3] - top) * ky,
        ],
        plan.width,
        plan.height,
    );
    if plan.flip {
        let w = plan.width as f64;
        out = [w - out[2], out[1], w - out[0], out[3]];
    }
    out
}

/// The forward map of the inverse affine `m` (output-to-input, centred coordinates; see
/// [`super::warp::inverse_affine`]) for a `w`x`h` image: where input point `(x, y)` lands.
/// `None` when `m` cannot be inverted.
pub(super) fn forward_map(
    m: &[f64; 6],
    w: usize,
    h: usize,
) -> Option<impl Fn(f64, f64) -> (f64, f64)> {
    let (cx, cy) = (w as f64 / 2.0, h as f64 / 2.0);
    // in = M * out + t, so out = M^-1 * (in - t).
    let det = m[0] * m[4] - m[1] * m[3];
    if det == 0.0 || !det.is_finite() {
        return None;
    }
    let inv = [m[4] / det, -m[1] / det, -m[3] / det, m[0] / det];
    let (tx, ty) = (m[2], m[5]);
    Some(move |x: f64, y: f64| {
        let (ix, iy) = (x - cx - tx, y - cy - ty);
        (
            inv[0] * ix + inv[1] * iy + cx,
            inv[2] * ix + inv[3] * iy + cy,
        )
    })
}

/// The enclosing box of `b`'s corners moved by the forward map of the inverse affine `m`.
fn warp_box(m: &[f64; 6], b: [f64; 4], w: usize, h: usize) -> [f64; 4] {
    let Some(forward) = forward_map(m, w, h) else {
        return [0.0; 4];
    };
    let mut lo = [f64::INFINITY; 2];
    let mut hi = [f64::NEG_INFINITY; 2];
    for (x, y) in [(b[0], b[1]), (b[2], b[1]), (b[0], b[3]), (b[2], b[3])] {
        let (ox, oy) = forward(x, y);
        lo = [lo[0].min(ox), lo[1].min(oy)];
        hi = [hi[0].max(ox), hi[1].max(oy)];
    }
    [lo[0], lo[1], hi[0], hi[1]]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, Layout};
    use crate::rng::Stream;
    use crate::source::pixels::InputLayout;
    use crate::transform::dense::{DensePipeline, DenseScratch, Role, TensorShape};

    const H: usize = 48;
    const W: usize = 64;

    fn rng(i: u64) -> Rng {
        Rng::for_key(3, Stream::Augment, 1, i)
    }

    /// The boxes a mask of one box says it became: the bounding rectangle of the label's
    /// pixels after the mask's nearest resample and moves, as edges.
    fn mask_box(spec: &str, b: [usize; 4], index: u64) -> Option<[f64; 4]> {
        let input = TensorShape {
            height: H,
            width: W,
            channels: 1,
            dtype: DType::U8,
            layout: InputLayout::Hwc,
        };
        let p = DensePipeline::new(
            Some(spec),
            input,
            Role::Mask { ignore_index: 255 },
            None,
            Layout::Nchw,
        )
        .unwrap();
        let mut mask = vec![0u8; H * W];
        for y in b[1]..b[3] {
            for x in b[0]..b[2] {
                mask[y * W + x] = 1;
            }
        }
        let mut out = vec![0u8; p.output_bytes()];
        p.apply(
            &mask,
            &mut rng(index),
            &mut out,
            &mut DenseScratch::default(),
        )
        .unwrap();
        let (oh, ow) = p.output_size();
        let mut r = [f64::INFINITY, f64::INFINITY, 0.0f64, 0.0f64];
        for y in 0..oh {
            for x in 0..ow {
                if out[y * ow + x] == 1 {
                    r = [
                        r[0].min(x as f64),
                        r[1].min(y as f64),
                        r[2].max(x as f64 + 1.0),
                        r[3].max(y as f64 + 1.0),
                    ];
                }
            }
        }
        r[0].is_finite().then_some(r)
    }

    #[test]
    fn boxes_land_where_the_mask_of_the_same_box_lands_under_one_draw() {
        let boxes = [[10usize, 8, 30, 30], [40, 20, 60, 44], [2, 2, 12, 9]];
        let as_f32: Vec<[f32; 4]> = boxes.iter().map(|b| b.map(|v| v as f32)).collect();
        for spec in [
            "random_resized_crop(40, 50, scale=0.5:1) | hflip",
            "resize(30) | center_crop(28, 36) | vflip(p=1)",
            "center_crop(44, 60) | random_crop(40, padding=4) | hflip | vflip",
            // The resize's factor is drawn per sample; the boxes move by the same one.
            "scale_jitter(48, 64, scale=0.9:1.5) | random_crop(40) | hflip",
            "scale_jitter(40, scale=1:2, max_size=72) | center_crop(30, 40)",
            // The image lands at a drawn offset of a larger canvas; the boxes shift with it.
            "random_zoom_out(side_range=1:2, p=0.8) | center_crop(48, 64) | hflip",
            "random_zoom_out(side_range=1.2:1.6, p=1) | random_crop(40, 50) | vflip",
        ] {
            let p = BoxPipeline::new(spec, W, H, BoxFormat::Xyxy).unwrap();
            for index in 0..12 {
                let (kept, idx) = p.apply(&as_f32, &mut rng(index)).unwrap();
                for (b, &i) in kept.iter().zip(&idx) {
                    // The nearest resample rounds a box's edges to whole output pixels: each
                    // edge within the scale (at most 2 px here) of the exact one.
                    if let Some(m) = mask_box(spec, boxes[i], index) {
                        for k in 0..4 {
                            assert!(
                                (b[k] as f64 - m[k]).abs() <= 2.0,
                                "`{spec}` {index}: box {i} {b:?} vs mask {m:?}"
                            );
                        }
                    }
                }
                // A box the mask lost entirely is dropped (or under a pixel wide) too.
                for (i, &b) in boxes.iter().enumerate() {
                    if mask_box(spec, b, index).is_none() {
                        assert!(!idx.contains(&i), "`{spec}` {index}: box {i} kept");
                    }
                }
            }
        }
    }

    #[test]
    fn formats_round_trip_and_small_or_outside_boxes_are_dropped() {
        let p = BoxPipeline::new("center_crop(20)", W, H, BoxFormat::Cxcywh).unwrap();
        // Centre crop of 20 at (22, 14): a box inside, one half outside, one outside.
        let boxes = [
            [32.0, 24.0, 10.0, 6.0],
            [22.0, 24.0, 4.0, 4.0],
            [2.0, 2.0, 2.0, 2.0],
            [30.0, 20.0, 0.5, 8.0],
        ];
        let (kept, idx) = p.apply(&boxes, &mut rng(0)).unwrap();
        assert_eq!(idx, vec![0, 1]);
        assert_eq!(kept[0], [10.0, 10.0, 10.0, 6.0]);
        // Clamped at the crop's left edge: x from 0 to 2.
        assert_eq!(kept[1], [1.0, 10.0, 2.0, 4.0]);
        let xywh = BoxPipeline::new("hflip(p=1)", W, H, BoxFormat::Xywh).unwrap();
        let (kept, _) = xywh.apply(&[[4.0, 5.0, 10.0, 20.0]], &mut rng(0)).unwrap();
        assert_eq!(kept, vec![[50.0, 5.0, 10.0, 20.0]]);
        let e = BoxPipeline::new(
            "center_crop(20) | auto_augment(imagenet)",
            W,
            H,
            BoxFormat::Xyxy,
        )
        .unwrap_err();
        assert!(e.contains("not supported with boxes"), "{e}");
    }

    #[test]
    fn a_rotation_moves_the_corners_and_takes_their_enclosing_box() {
        // rotate(90:90): a quarter turn about the image's centre.
        let p = BoxPipeline::new("center_crop(40) | rotate(90:90)", W, H, BoxFormat::Xyxy).unwrap();
        let (kept, _) = p.apply(&[[12.0, 4.0, 22.0, 10.0]], &mut rng(0)).unwrap();
        // After the crop (left 12, top 4): [0, 0, 10, 6] in a 40x40 image; the quarter turn
        // sends (x, y) to (y, 40 - x).
        let want = [0.0, 30.0, 6.0, 40.0];
        for k in 0..4 {
            assert!((kept[0][k] - want[k]).abs() < 1e-4, "{:?}", kept[0]);
        }
    }
}
