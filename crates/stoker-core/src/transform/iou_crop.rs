//! `random_iou_crop`: SSD's crop as torchvision v2's `RandomIoUCrop` draws it. The crop depends
//! on the sample's boxes, so every field of the sample plans it from the same boxes with the
//! same draws (see [`super::geometry::plan_with`]); the boxes whose centre falls outside it are
//! dropped with their labels.

use super::args::{number, Args};
use crate::rng::Rng;

/// torchvision's `sampler_options`: the minimum IoU of one box with the crop, drawn per round;
/// 1.0 (or more) leaves the image as it is.
pub const DEFAULT_OPTIONS: [f64; 7] = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0];

/// Rounds of (option, `trials` crops) drawn before the image is left as it is. torchvision
/// draws until it succeeds or draws the leave-as-is option (whose chance is one in
/// `options.len()` per round); a bound keeps a sample whose boxes no crop can satisfy, and
/// options without 1.0, from looping.
pub const MAX_ROUNDS: usize = 1000;

/// The parameters of `random_iou_crop(scale=0.3:1, ratio=0.5:2, options=0,0.1,…,1, trials=40)`.
#[derive(Clone, Debug, PartialEq)]
pub struct IouCrop {
    /// Range of each side of the crop as a fraction of the image's (`min_scale:max_scale`).
    pub scale: (f64, f64),
    /// Range of the crop's width/height (`min_aspect_ratio:max_aspect_ratio`).
    pub ratio: (f64, f64),
    /// Minimum IoUs, one drawn per round (`sampler_options`).
    pub options: Vec<f64>,
    /// Crops tried per round.
    pub trials: usize,
}

/// Parses `random_iou_crop`'s arguments (spelled as the other ops': ranges `a:b`, lists `a,b`).
pub(super) fn parse(args: &Args) -> Result<IouCrop, String> {
    args.check(0, &["scale", "ratio", "options", "trials"])?;
    let range = |key: &str, default: (f64, f64)| -> Result<(f64, f64), String> {
        let Some(s) = args.named(key) else {
            return Ok(default);
        };
        let (a, b) = s
            .split_once(':')
            .ok_or_else(|| format!("{key} `{s}` is not a range a:b"))?;
        let (a, b) = (number(a)?, number(b)?);
        if !(a > 0.0 && a <= b) {
            return Err(format!("{key} `{s}` needs 0 < a <= b"));
        }
        Ok((a, b))
    };
    let scale = range("scale", (0.3, 1.0))?;
    if scale.1 > 1.0 {
        return Err(format!(
            "scale `{}:{}`: a crop's side is at most the image's (scale up to 1)",
            scale.0, scale.1
        ));
    }
    let ratio = range("ratio", (0.5, 2.0))?;
    let options = match args.named("options") {
        None => DEFAULT_OPTIONS.to_vec(),
        Some(s) => s
            .split(',')
            .map(|v| match number(v) {
                Ok(x) if x >= 0.0 => Ok(x),
                Ok(x) => Err(format!(
                    "options: `{x}` is not an IoU (0 to 1; 1 leaves the image)"
                )),
                Err(e) => Err(format!("options: {e}")),
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let trials = match args.named("trials") {
        None => 40,
        Some(t) => match t.trim().parse::<usize>() {
            Ok(n) if (1..=10_000).contains(&n) => n,
            _ => return Err(format!("trials `{t}` is not a count in 1..=10000")),
        },
    };
    Ok(IouCrop {
        scale,
        ratio,
        options,
        trials,
    })
}

/// One drawn crop: `(left, top, width, height)` and, per box, whether its centre lies inside.
#[derive(Clone, Debug, PartialEq)]
pub struct Drawn {
    /// Left, top, width, height of the crop.
    pub rect: (usize, usize, usize, usize),
    /// The minimum IoU of the round that found it.
    pub min_iou: f64,
    /// Whether each box's centre is strictly inside the crop (the boxes kept).
    pub within: Vec<bool>,
}

/// The intersection over union of two `xyxy` boxes (0 when either is empty).
pub fn iou(a: [f64; 4], b: [f64; 4]) -> f64 {
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = iw * ih;
    let area = |r: [f64; 4]| (r[2] - r[0]).max(0.0) * (r[3] - r[1]).max(0.0);
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// torchvision's `RandomIoUCrop.make_params` for a `width`x`height` image and its `boxes`
/// (`xyxy`, pixels): per round an option; 1.0 or more leaves the image (`None`); else up to
/// `trials` crops of sides `int(side * U(scale))` (each its own draw) within the ratio range,
/// placed at `int((side - crop) * U(0, 1))`, the first with a box whose centre is strictly
/// inside and whose IoU with the crop is at least the option. No boxes: `None`, without a draw
/// (no crop can hold a centre).
pub fn draw(
    crop: &IouCrop,
    width: usize,
    height: usize,
    boxes: &[[f64; 4]],
    rng: &mut Rng,
) -> Option<Drawn> {
    if boxes.is_empty() || crop.options.is_empty() {
        return None;
    }
    let (w, h) = (width as f64, height as f64);
    for _ in 0..MAX_ROUNDS {
        let min_iou = crop.options[rng.below(crop.options.len() as u64) as usize];
        if min_iou >= 1.0 {
            return None;
        }
        for _ in 0..crop.trials {
            let new_w = (w * rng.uniform(crop.scale.0, crop.scale.1)) as usize;
            let new_h = (h * rng.uniform(crop.scale.0, crop.scale.1)) as usize;
            if new_w == 0 || new_h == 0 {
                continue;
            }
            let aspect = new_w as f64 / new_h as f64;
            if !(crop.ratio.0..=crop.ratio.1).contains(&aspect) {
                continue;
            }
            let left = ((width - new_w) as f64 * rng.unit_f64()) as usize;
            let top = ((height - new_h) as f64 * rng.unit_f64()) as usize;
            let (right, bottom) = ((left + new_w) as f64, (top + new_h) as f64);
            let rect = [left as f64, top as f64, right, bottom];
            let within: Vec<bool> = boxes
                .iter()
                .map(|b| {
                    let (cx, cy) = (0.5 * (b[0] + b[2]), 0.5 * (b[1] + b[3]));
                    rect[0] < cx && cx < right && rect[1] < cy && cy < bottom
                })
                .collect();
            let best = boxes
                .iter()
                .zip(&within)
                .filter(|(_, &inside)| inside)
                .map(|(b, _)| iou(*b, rect))
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
            match best {
                Some(best) if best >= min_iou => {
                    return Some(Drawn {
                        rect: (left, top, new_w, new_h),
                        min_iou,
                        within,
                    })
                }
                _ => continue,
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;
