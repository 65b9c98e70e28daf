//! The operations that run on the materialised, crop-sized RGB8 image, after the geometry plan:
//! each draws its random parameters from the sample's [`Rng`] in spec order (torchvision's
//! sampling rules), then runs its kernel on the worker's reused buffers. When a trace is asked
//! for, each operation appends its drawn parameters as one JSON object (the equivalence tests
//! replay them through torchvision).

use std::fmt::Write as _;

use super::auto_augment::{apply_aug, magnitude, AugOp, Policy, IMAGENET_POLICY, WIDE_OPS};
use super::color;
use super::frame::Frame;
use super::geometry::Plan;
use super::photometric::{self, Distort};
use super::spec::{EraseValue, Op, PadMode};
use super::warp::{self, inverse_affine, Sampling};
use crate::rng::Rng;

/// A random-erasing box, applied in the output pass: `(top, left, height, width)` and what it is
/// filled with, in output units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Erase {
    pub(super) top: usize,
    pub(super) left: usize,
    pub(super) height: usize,
    pub(super) width: usize,
    pub(super) fill: EraseFill,
}

/// A box's contents: a value per channel, or normal noise drawn from a seed the sample's random
/// stream gave (so the noise, like every draw, depends only on the sample's key).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum EraseFill {
    Value([f64; 3]),
    Noise(u64),
}

/// Appends `{"op": name, ...}` to the trace.
fn record(trace: &mut Option<&mut Vec<String>>, json: impl FnOnce() -> String) {
    if let Some(t) = trace.as_deref_mut() {
        t.push(json());
    }
}

/// Draws one AutoAugment-family op's magnitude (bin `bin`, or drawn when `None`) and sign.
#[allow(clippy::too_many_arguments)]
fn draw_magnitude(
    (width, height): (usize, usize),
    policy: Policy,
    op: AugOp,
    bins: usize,
    bin: Option<usize>,
    rng: &mut Rng,
    trace: &mut Option<&mut Vec<String>>,
    name: &str,
) -> f64 {
    let mut m = 0.0;
    // torchvision draws a bin (and a sign) only for ops with a magnitude table.
    if magnitude(policy, op, bins, 0, width, height).is_some() {
        let i = bin.unwrap_or_else(|| rng.below(bins as u64) as usize);
        if let Some((value, signed)) = magnitude(policy, op, bins, i, width, height) {
            m = value;
            // `torch.rand(()) <= 0.5`.
            if signed && rng.unit_f64() <= 0.5 {
                m = -m;
            }
        }
    }
    record(trace, || {
        format!(r#"{{"op":"{name}","name":"{op:?}","magnitude":{m}}}"#)
    });
    m
}

/// Most AutoAugment-family ops one spec op draws (`rand_augment`'s `num_ops` is at most 16).
const MAX_AUG_OPS: usize = 16;

/// One stage op's drawn parameters: what [`draw`] chose and the kernels then do. Drawing and
/// applying are apart so that fields sharing a sample's draw (an image and its mask) take the
/// same parameters from the same code, each applying them its own way.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Drawn {
    /// Nothing to do (not applied, or `normalize`).
    Nothing,
    /// A window of the image padded by `pad` (left, top): `center_crop`, `random_crop`.
    Crop {
        top: usize,
        left: usize,
        width: usize,
        height: usize,
        pad: (usize, usize),
        mode: PadMode,
        /// In the image's stored units (see [`byte_fill`]).
        fill: [f64; 3],
    },
    /// A mirror: top-bottom when `vertical`, else left-right.
    Flip { vertical: bool },
    /// `grayscale`, applied.
    Grayscale,
    /// `color_jitter`: the order of the four adjustments and their factors.
    Jitter {
        order: [usize; 4],
        factors: [Option<f64>; 4],
    },
    /// `random_photometric_distort`'s parts, their order and the channel permutation.
    Photometric(Distort),
    /// `gaussian_blur` with this kernel size and sigma.
    Blur { kernel: usize, sigma: f64 },
    /// `rotate`, `affine`: the inverse affine map and the fill.
    Warp { m: [f64; 6], fill: [f64; 3] },
    /// AutoAugment-family ops with their signed magnitudes, the first `len` of `ops`.
    Aug {
        ops: [(AugOp, f64); MAX_AUG_OPS],
        len: usize,
    },
    /// `random_erasing`'s box (applied by the output pass).
    Erase(Erase),
}

/// Whether an AutoAugment-family op moves pixels (and so would move a mask) rather than
/// changing their colour.
pub(super) fn aug_is_geometric(op: AugOp) -> bool {
    matches!(
        op,
        AugOp::ShearX | AugOp::ShearY | AugOp::TranslateX | AugOp::TranslateY | AugOp::Rotate
    )
}

/// Runs one stage op on `frame`; `random_erasing` returns its box (applied by the output pass).
pub(super) fn run(
    op: &Op,
    frame: &mut Frame,
    rng: &mut Rng,
    trace: &mut Option<&mut Vec<String>>,
) -> Result<Option<Erase>, String> {
    let drawn = draw(op, frame.width, frame.height, rng, trace)?;
    Ok(apply(drawn, frame))
}

/// A fill as RGB8 bytes: every fill of an RGB pipeline's op was checked to be one
/// ([`Pipeline::new`](super::Pipeline::new)).
pub(super) fn byte_fill(fill: [f64; 3]) -> [u8; 3] {
    fill.map(|v| v as u8)
}

/// Applies drawn parameters to the RGB8 `frame`; `random_erasing` returns its box.
fn apply(drawn: Drawn, frame: &mut Frame) -> Option<Erase> {
    let (w, h) = (frame.width, frame.height);
    match drawn {
        Drawn::Nothing => {}
        Drawn::Crop {
            top,
            left,
            width,
            height,
            pad,
            mode,
            fill,
        } => frame.replace(width, height, |src, dst| {
            warp::padded_crop(
                src,
                w,
                h,
                dst,
                (top, left),
                (width, height),
                pad,
                mode,
                byte_fill(fill),
            )
        }),
        Drawn::Flip { vertical: true } => warp::vflip(&mut frame.img, w, h),
        Drawn::Flip { vertical: false } => warp::hflip(&mut frame.img, w),
        Drawn::Grayscale => color::grayscale(&mut frame.img),
        Drawn::Jitter { order, factors } => {
            for i in order {
                let Some(f) = factors[i] else { continue };
                match i {
                    0 => color::brightness(&mut frame.img, f),
                    1 => color::contrast(&mut frame.img, f),
                    2 => color::saturation(&mut frame.img, f),
                    _ => color::hue(&mut frame.img, f),
                }
            }
        }
        Drawn::Photometric(d) => photometric::apply(&d, &mut frame.img),
        Drawn::Blur { kernel, sigma } => {
            let Frame {
                img,
                floats,
                kernel: k,
                ..
            } = frame;
            warp::gaussian_kernel(kernel, sigma, k);
            warp::blur(img, w, h, k, floats);
        }
        Drawn::Warp { m, fill } => frame.replace(w, h, |src, dst| {
            warp::warp(src, dst, w, h, &m, Sampling::Bilinear(byte_fill(fill)))
        }),
        Drawn::Aug { ops, len } => {
            for &(op, m) in &ops[..len] {
                apply_aug(frame, op, m);
            }
        }
        Drawn::Erase(e) => return Some(e),
    }
    None
}

/// Whether `op`, right after the geometry plan, keeps a window of the planned image with a
/// constant fill around it (`random_crop` with constant or no padding, `random_zoom_out`).
fn cuts_planned_image(op: &Op) -> bool {
    matches!(
        op,
        Op::RandomCrop {
            pad_mode: PadMode::Constant,
            ..
        } | Op::RandomCrop {
            padding: [0, 0, 0, 0],
            ..
        } | Op::RandomZoomOut { .. }
    )
}

/// A constant-fill crop drawn before the planned image is made: its size and fill (in the
/// image's units), and the part of the planned image it keeps — that part's own plan and its
/// top-left corner in the crop — or `None` when it keeps nothing.
pub(super) struct Cut {
    pub(super) width: usize,
    pub(super) height: usize,
    pub(super) fill: [f64; 3],
    pub(super) part: Option<(Plan, (usize, usize))>,
}

/// Draws the first of `stages` now when it cuts the planned image (the output of `plan`), so
/// that only the part it keeps need be resampled (see [`Plan::part`]); the draws stay in op
/// order. Returns the cut (`None` also for a zoom-out that was not applied) and the stages
/// left to run.
pub(super) fn draw_cut<'a>(
    stages: &'a [Op],
    plan: &Plan,
    rng: &mut Rng,
    trace: &mut Option<&mut Vec<String>>,
) -> Result<(Option<Cut>, &'a [Op]), String> {
    let Some(op) = stages.first().filter(|op| cuts_planned_image(op)) else {
        return Ok((None, stages));
    };
    let cut = match draw(op, plan.width, plan.height, rng, trace)? {
        Drawn::Crop {
            top,
            left,
            width,
            height,
            pad,
            fill,
            ..
        } => {
            let origin = (
                left as isize - pad.0 as isize,
                top as isize - pad.1 as isize,
            );
            Some(Cut {
                width,
                height,
                fill,
                part: plan.part(origin, (width, height)),
            })
        }
        _ => None,
    };
    Ok((cut, &stages[1..]))
}

/// Draws one stage op's random parameters for a `w`x`h` image, in torchvision's order,
/// recording them in `trace` when given; checks first that the op fits the image.
pub(super) fn draw(
    op: &Op,
    w: usize,
    h: usize,
    rng: &mut Rng,
    trace: &mut Option<&mut Vec<String>>,
) -> Result<Drawn, String> {
    Ok(match *op {
        Op::CenterCrop { height, width } => {
            if height > h || width > w {
                return Err(format!(
                    "image is {w}x{h} at center_crop({height}, {width}), smaller than the crop"
                ));
            }
            Drawn::Crop {
                top: ((h - height) as f64 / 2.0).round_ties_even() as usize,
                left: ((w - width) as f64 / 2.0).round_ties_even() as usize,
                width,
                height,
                pad: (0, 0),
                mode: PadMode::Constant,
                fill: [0.0; 3],
            }
        }
        Op::RandomCrop {
            height,
            width,
            padding: [pl, pt, pr, pb],
            pad_mode,
            fill,
        } => {
            for (pad, side) in [(pl, w), (pr, w), (pt, h), (pb, h)] {
                warp::check_padding(pad, side, pad_mode)
                    .map_err(|e| format!("random_crop: padding: {e}"))?;
            }
            let (ph, pw) = (h + pt + pb, w + pl + pr);
            if height > ph || width > pw {
                return Err(format!(
                    "image is {w}x{h} ({pw}x{ph} padded) at random_crop({height}, {width}), \
                     smaller than the crop"
                ));
            }
            let top = rng.below((ph - height + 1) as u64) as usize;
            let left = rng.below((pw - width + 1) as u64) as usize;
            record(trace, || {
                format!(r#"{{"op":"random_crop","top":{top},"left":{left}}}"#)
            });
            Drawn::Crop {
                top,
                left,
                width,
                height,
                pad: (pl, pt),
                mode: pad_mode,
                fill,
            }
        }
        Op::RandomZoomOut {
            fill,
            side_range: (a, b),
            p,
        } => {
            // torchvision: the coin first, then r, then the two offsets, all float32 tensors
            // (so the floors here are taken of float32 products too).
            if rng.unit_f64() >= p {
                record(trace, || {
                    r#"{"op":"random_zoom_out","apply":false}"#.to_string()
                });
                return Ok(Drawn::Nothing);
            }
            let r = a as f32 + rng.unit_f64() as f32 * (b - a) as f32;
            let (cw, ch) = ((w as f32 * r) as usize, (h as f32 * r) as usize);
            let (cw, ch) = (cw.max(w), ch.max(h));
            let left = ((cw - w) as f32 * rng.unit_f64() as f32) as usize;
            let top = ((ch - h) as f32 * rng.unit_f64() as f32) as usize;
            record(trace, || {
                format!(
                    r#"{{"op":"random_zoom_out","apply":true,"left":{left},"top":{top},"width":{cw},"height":{ch}}}"#
                )
            });
            // A window the size of the canvas over the image padded by (left, top): what lies
            // past the image on any side is the fill.
            Drawn::Crop {
                top: 0,
                left: 0,
                width: cw,
                height: ch,
                pad: (left, top),
                mode: PadMode::Constant,
                fill,
            }
        }
        Op::HFlip { p } | Op::VFlip { p } => {
            let vertical = matches!(op, Op::VFlip { .. });
            let apply = rng.unit_f64() < p;
            record(trace, || {
                let name = if vertical { "vflip" } else { "hflip" };
                format!(r#"{{"op":"{name}","apply":{apply}}}"#)
            });
            if apply {
                Drawn::Flip { vertical }
            } else {
                Drawn::Nothing
            }
        }
        Op::Grayscale { p } => {
            let apply = rng.unit_f64() < p;
            record(trace, || format!(r#"{{"op":"grayscale","apply":{apply}}}"#));
            if apply {
                Drawn::Grayscale
            } else {
                Drawn::Nothing
            }
        }
        Op::ColorJitter {
            brightness,
            contrast,
            saturation,
            hue,
        } => {
            // torchvision: a random permutation of the four, then every factor drawn.
            let mut order = [0usize, 1, 2, 3];
            rng.shuffle(&mut order);
            let mut draw = |r: Option<(f64, f64)>| r.map(|(a, b)| rng.uniform(a, b));
            let factors = [
                draw(brightness),
                draw(contrast),
                draw(saturation),
                draw(hue),
            ];
            record(trace, || {
                let f = |x: Option<f64>| x.map_or("null".to_string(), |v| v.to_string());
                format!(
                    r#"{{"op":"color_jitter","order":[{},{},{},{}],"brightness":{},"contrast":{},"saturation":{},"hue":{}}}"#,
                    order[0],
                    order[1],
                    order[2],
                    order[3],
                    f(factors[0]),
                    f(factors[1]),
                    f(factors[2]),
                    f(factors[3])
                )
            });
            Drawn::Jitter { order, factors }
        }
        Op::RandomPhotometricDistort {
            brightness,
            contrast,
            saturation,
            hue,
            p,
        } => Drawn::Photometric(photometric::draw(
            [brightness, contrast, saturation, hue],
            p,
            rng,
            trace,
        )),
        Op::GaussianBlur { kernel, sigma } => {
            if kernel / 2 >= w || kernel / 2 >= h {
                return Err(format!(
                    "gaussian_blur: kernel {kernel} is too large for a {w}x{h} image (reflect \
                     padding needs kernel / 2 < each side)"
                ));
            }
            let s = rng.uniform(sigma.0, sigma.1);
            record(trace, || format!(r#"{{"op":"gaussian_blur","sigma":{s}}}"#));
            Drawn::Blur { kernel, sigma: s }
        }
        Op::Rotate { degrees, fill } => {
            let angle = rng.uniform(degrees.0, degrees.1);
            record(trace, || format!(r#"{{"op":"rotate","angle":{angle}}}"#));
            let m = inverse_affine((0.0, 0.0), -angle, (0.0, 0.0), 1.0, (0.0, 0.0));
            Drawn::Warp { m, fill }
        }
        Op::Affine {
            degrees,
            translate,
            scale,
            shear,
            fill,
        } => {
            // RandomAffine.get_params: angle, translations (rounded), scale, shear x (then y).
            let angle = rng.uniform(degrees.0, degrees.1);
            let (tx, ty) = match translate {
                Some((a, b)) => {
                    let (mx, my) = (a * w as f64, b * h as f64);
                    (
                        rng.uniform(-mx, mx).round_ties_even(),
                        rng.uniform(-my, my).round_ties_even(),
                    )
                }
                None => (0.0, 0.0),
            };
            let s = scale.map_or(1.0, |(a, b)| rng.uniform(a, b));
            let sx = shear.map_or(0.0, |(a, b)| rng.uniform(a, b));
            record(trace, || {
                format!(
                    r#"{{"op":"affine","angle":{angle},"translate":[{tx},{ty}],"scale":{s},"shear":[{sx},0.0]}}"#
                )
            });
            let m = inverse_affine((0.0, 0.0), angle, (tx, ty), s, (sx, 0.0));
            Drawn::Warp { m, fill }
        }
        Op::TrivialAugment => {
            let op = WIDE_OPS[rng.below(WIDE_OPS.len() as u64) as usize];
            let m = draw_magnitude(
                (w, h),
                Policy::Trivial,
                op,
                super::spec::MAGNITUDE_BINS,
                None,
                rng,
                trace,
                "trivial_augment",
            );
            let mut ops = [(AugOp::Identity, 0.0); MAX_AUG_OPS];
            ops[0] = (op, m);
            Drawn::Aug { ops, len: 1 }
        }
        Op::RandAugment { num_ops, magnitude } => {
            let mut ops = [(AugOp::Identity, 0.0); MAX_AUG_OPS];
            let len = num_ops.min(MAX_AUG_OPS);
            for slot in &mut ops[..len] {
                let op = WIDE_OPS[rng.below(WIDE_OPS.len() as u64) as usize];
                let m = draw_magnitude(
                    (w, h),
                    Policy::Rand,
                    op,
                    super::spec::MAGNITUDE_BINS,
                    Some(magnitude),
                    rng,
                    trace,
                    "rand_augment",
                );
                *slot = (op, m);
            }
            Drawn::Aug { ops, len }
        }
        Op::AutoAugment => {
            let sub = &IMAGENET_POLICY[rng.below(IMAGENET_POLICY.len() as u64) as usize];
            let mut ops = [(AugOp::Identity, 0.0); MAX_AUG_OPS];
            let mut len = 0;
            for &(op, p, bin) in sub {
                // `if not torch.rand(()) <= p: continue`
                if rng.unit_f64() > p {
                    record(trace, || {
                        format!(r#"{{"op":"auto_augment","name":"{op:?}","skipped":true}}"#)
                    });
                    continue;
                }
                let m = draw_magnitude(
                    (w, h),
                    Policy::Auto,
                    op,
                    10,
                    Some(bin),
                    rng,
                    trace,
                    "auto_augment",
                );
                ops[len] = (op, m);
                len += 1;
            }
            Drawn::Aug { ops, len }
        }
        Op::RandomErasing {
            p,
            scale,
            ratio,
            value,
        } => {
            if rng.unit_f64() >= p {
                record(trace, || {
                    r#"{"op":"random_erasing","apply":false}"#.to_string()
                });
                return Ok(Drawn::Nothing);
            }
            let area = (w * h) as f64;
            let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
            for _ in 0..10 {
                let erase_area = area * rng.uniform(scale.0, scale.1);
                let aspect = rng.uniform(log_lo, log_hi).exp();
                let eh = (erase_area * aspect).sqrt().round_ties_even() as usize;
                let ew = (erase_area / aspect).sqrt().round_ties_even() as usize;
                if !(eh < h && ew < w) {
                    continue;
                }
                let top = rng.below((h - eh + 1) as u64) as usize;
                let left = rng.below((w - ew + 1) as u64) as usize;
                record(trace, || {
                    let mut s = String::new();
                    let _ = write!(
                        s,
                        r#"{{"op":"random_erasing","apply":true,"top":{top},"left":{left},"height":{eh},"width":{ew}}}"#
                    );
                    s
                });
                let fill = match value {
                    EraseValue::Fill(v) => EraseFill::Value(v),
                    EraseValue::Random => EraseFill::Noise(rng.next_u64()),
                };
                return Ok(Drawn::Erase(Erase {
                    top,
                    left,
                    height: eh,
                    width: ew,
                    fill,
                }));
            }
            record(trace, || {
                r#"{"op":"random_erasing","apply":false}"#.to_string()
            });
            Drawn::Nothing
        }
        Op::Normalize { .. } => Drawn::Nothing,
        Op::ResizeShorter(_)
        | Op::Resize { .. }
        | Op::RandomResizedCrop { .. }
        | Op::ScaleJitter { .. }
        | Op::RandomShortestSize { .. }
        | Op::RandomIouCrop(_)
        | Op::Mixup { .. }
        | Op::Cutmix { .. } => {
            return Err(format!("internal: {op:?} after the geometry plan"));
        }
    })
}
