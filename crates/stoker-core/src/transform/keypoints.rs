//! Keypoints moved with their image's draw: torchvision v2's `tv_tensors.KeyPoints` through the
//! same geometric ops.
//!
//! A keypoint is a row of float32 `(x, y)` or `(x, y, visibility)` in the image's pixel
//! coordinates, as torchvision's kernels take them: a resize multiplies by the ratio of the
//! sizes (`x * new_w / old_w`), a crop subtracts its corner, padding adds its own, a flip
//! mirrors about the last pixel (`w - 1 - x`), `rotate`/`affine` apply the forward map about the
//! image's centre (`expand=False`). Unlike the plan the image's pixels take, every op of the
//! spec is applied one by one, in order, so that the arithmetic is torchvision's exactly (a
//! folded flip-then-resize would mirror about a different pixel).
//!
//! No keypoint is dropped, clamped or reordered (torchvision's geometric ops do neither; a
//! point can leave the canvas, with coordinates below 0 or past the size). With a third
//! column, a point outside the image after any op (`SanitizeKeyPoints`'s test: not
//! `0 <= x < w` and `0 <= y < h`) gets visibility 0, and keeps it even if a later op would bring
//! it back (its pixel is gone); a point inside keeps its visibility, whatever its value.

use super::augment::{self, aug_is_geometric, Drawn};
use super::boxes::forward_map;
use super::geometry::{plan_with, Step};
use super::pipeline::foldable;
use super::spec::{parse, Op};
use crate::rng::Rng;

/// The ops of a spec as they move the keypoints of a `width`x`height` image.
#[derive(Clone, Debug)]
pub struct KeypointPipeline {
    ops: Vec<Op>,
    planned: usize,
    width: usize,
    height: usize,
}

/// Points being moved: `(x, y)` in f64, and whether each is still inside the image.
struct Points {
    xy: Vec<(f64, f64)>,
    inside: Vec<bool>,
}

impl Points {
    /// Moves every point by `f` onto an image of `w`x`h`, noting the points that left it.
    fn to(&mut self, f: &dyn Fn(f64, f64) -> (f64, f64), w: usize, h: usize) {
        for (p, inside) in self.xy.iter_mut().zip(&mut self.inside) {
            *p = f(p.0, p.1);
            let (x, y) = *p;
            *inside &= x >= 0.0 && x < w as f64 && y >= 0.0 && y < h as f64;
        }
    }
}

impl KeypointPipeline {
    /// The keypoint pipeline of `spec` for images of `width`x`height` (a tensor image's size).
    pub fn new(spec: &str, width: usize, height: usize) -> Result<KeypointPipeline, String> {
        let mut ops = parse(spec)?;
        ops.retain(|op| !matches!(op, Op::Mixup { .. } | Op::Cutmix { .. }));
        if ops.iter().any(|op| {
            matches!(
                op,
                Op::RandAugment { .. } | Op::TrivialAugment | Op::AutoAugment
            )
        }) {
            return Err(
                "the AutoAugment family is not supported with keypoints yet: its shear, \
                 translate and rotate branches would have to move the keypoints too"
                    .into(),
            );
        }
        let planned = ops.iter().position(|op| !foldable(op)).unwrap_or(ops.len());
        Ok(KeypointPipeline {
            ops,
            planned,
            width,
            height,
        })
    }

    /// This pipeline for images of `width`x`height` (an encoded image's size, read per sample).
    pub fn for_size(&self, width: usize, height: usize) -> KeypointPipeline {
        KeypointPipeline {
            width,
            height,
            ..self.clone()
        }
    }

    /// Moves `points` in place, rows of `columns` (2: `x, y`; 3: `x, y, visibility`) float32
    /// values, with the draws `rng` gives, as the image's pipeline draws them; `boxes` are the
    /// sample's (`xyxy`), which `random_iou_crop` draws from.
    pub fn apply(
        &self,
        points: &mut [f32],
        columns: usize,
        boxes: Option<&[[f64; 4]]>,
        rng: &mut Rng,
    ) -> Result<(), String> {
        if !(columns == 2 || columns == 3) || !points.len().is_multiple_of(columns) {
            return Err(format!(
                "keypoints are rows of 2 (x, y) or 3 (x, y, visibility) values, not {} values \
                 in rows of {columns}",
                points.len()
            ));
        }
        let mut p = Points {
            xy: points
                .chunks_exact(columns)
                .map(|r| (f64::from(r[0]), f64::from(r[1])))
                .collect(),
            inside: vec![true; points.len() / columns],
        };
        let plan = plan_with(
            &self.ops[..self.planned],
            self.width,
            self.height,
            rng,
            boxes,
            &mut |step| match step {
                Step::Within(_) => {}
                Step::Resize { from, to } => {
                    let kx = to.0 as f64 / from.0 as f64;
                    let ky = to.1 as f64 / from.1 as f64;
                    p.to(&|x, y| (x * kx, y * ky), to.0, to.1);
                }
                Step::Crop {
                    left,
                    top,
                    width,
                    height,
                } => {
                    let (l, t) = (left as f64, top as f64);
                    p.to(&|x, y| (x - l, y - t), width, height);
                }
                Step::HFlip { width } => {
                    let last = width as f64 - 1.0;
                    // The height is not known here and a mirror moves no point out: any will do.
                    p.to(&|x, y| (last - x, y), width, usize::MAX);
                }
            },
        )?;
        let (mut w, mut h) = (plan.width, plan.height);
        // A flip of the plan was checked against an unbounded height: check the plan's size.
        p.to(&|x, y| (x, y), w, h);
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
                    let dx = pad.0 as f64 - left as f64;
                    let dy = pad.1 as f64 - top as f64;
                    p.to(&|x, y| (x + dx, y + dy), width, height);
                    (w, h) = (width, height);
                }
                Drawn::Flip { vertical } => {
                    let (lx, ly) = (w as f64 - 1.0, h as f64 - 1.0);
                    if vertical {
                        p.to(&|x, y| (x, ly - y), w, h);
                    } else {
                        p.to(&|x, y| (lx - x, y), w, h);
                    }
                }
                Drawn::Warp { m, .. } => match forward_map(&m, w, h) {
                    Some(f) => p.to(&f, w, h),
                    None => p.to(&|_, _| (f64::NAN, f64::NAN), w, h),
                },
                Drawn::Aug { ops, len } => {
                    if ops[..len].iter().any(|&(op, _)| aug_is_geometric(op)) {
                        return Err("internal: an AutoAugment-family op with keypoints".into());
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
        for ((row, &(x, y)), &inside) in points.chunks_exact_mut(columns).zip(&p.xy).zip(&p.inside)
        {
            row[0] = x as f32;
            row[1] = y as f32;
            if columns == 3 && !inside {
                row[2] = 0.0;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
