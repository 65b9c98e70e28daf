//! The AutoAugment family's op set and tables (torchvision's `RandAugment`, `TrivialAugmentWide`
//! and `AutoAugment`): each op's magnitude per bin and policy, and the kernel each op runs on the
//! crop-sized image. [`augment`](super::augment) draws the ops and their magnitudes.

use super::color;
use super::frame::Frame;
use super::warp::{self, inverse_affine, Sampling};

/// The operations of the AutoAugment family (torchvision's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AugOp {
    /// The image unchanged.
    Identity,
    /// Horizontal shear by a factor (`F.affine(shear=[atan(m) in degrees, 0])`).
    ShearX,
    /// Vertical shear by a factor.
    ShearY,
    /// Horizontal shift in pixels.
    TranslateX,
    /// Vertical shift in pixels.
    TranslateY,
    /// Rotation by an angle in degrees.
    Rotate,
    /// `F.adjust_brightness` by `1 + magnitude`.
    Brightness,
    /// `F.adjust_saturation` by `1 + magnitude`.
    Color,
    /// `F.adjust_contrast` by `1 + magnitude`.
    Contrast,
    /// `F.adjust_sharpness` by `1 + magnitude`.
    Sharpness,
    /// `F.posterize`: keep this many high bits per channel.
    Posterize,
    /// `F.solarize`: invert the values at or above a threshold (a fraction of 255).
    Solarize,
    /// `F.autocontrast`: stretch each channel to the full range.
    AutoContrast,
    /// `F.equalize`: equalize each channel's histogram.
    Equalize,
    /// `F.invert`: `255 - x`.
    Invert,
}

/// RandAugment's and TrivialAugmentWide's op set, in torchvision's order.
pub(super) const WIDE_OPS: [AugOp; 14] = [
    AugOp::Identity,
    AugOp::ShearX,
    AugOp::ShearY,
    AugOp::TranslateX,
    AugOp::TranslateY,
    AugOp::Rotate,
    AugOp::Brightness,
    AugOp::Color,
    AugOp::Contrast,
    AugOp::Sharpness,
    AugOp::Posterize,
    AugOp::Solarize,
    AugOp::AutoContrast,
    AugOp::Equalize,
];

/// Which policy's magnitude table to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Policy {
    Auto,
    Rand,
    Trivial,
}

/// `torch.linspace(lo, hi, n)[i]`.
fn linspace(lo: f64, hi: f64, n: usize, i: usize) -> f64 {
    if n <= 1 {
        return lo;
    }
    lo + (hi - lo) * i as f64 / (n - 1) as f64
}

/// The magnitude of bin `i` of `bins` for `op` under `policy` (torchvision's
/// `_AUGMENTATION_SPACE` tables), and whether the op is signed; `None` for ops without a
/// magnitude.
pub(super) fn magnitude(
    policy: Policy,
    op: AugOp,
    bins: usize,
    i: usize,
    width: usize,
    height: usize,
) -> Option<(f64, bool)> {
    let wide = policy == Policy::Trivial;
    let m = match op {
        AugOp::Identity | AugOp::AutoContrast | AugOp::Equalize | AugOp::Invert => return None,
        AugOp::ShearX | AugOp::ShearY => {
            (linspace(0.0, if wide { 0.99 } else { 0.3 }, bins, i), true)
        }
        AugOp::TranslateX | AugOp::TranslateY => {
            let side = if op == AugOp::TranslateX {
                width
            } else {
                height
            };
            let hi = if wide {
                32.0
            } else {
                150.0 / 331.0 * side as f64
            };
            (linspace(0.0, hi, bins, i), true)
        }
        AugOp::Rotate => (
            linspace(0.0, if wide { 135.0 } else { 30.0 }, bins, i),
            true,
        ),
        AugOp::Brightness | AugOp::Color | AugOp::Contrast | AugOp::Sharpness => {
            (linspace(0.0, if wide { 0.99 } else { 0.9 }, bins, i), true)
        }
        AugOp::Posterize => {
            // (8 - arange(bins) / ((bins - 1) / k)).round(), k = 6 for the wide set, else 4.
            let k = if wide { 6.0 } else { 4.0 };
            let bits = (8.0 - i as f64 / ((bins - 1) as f64 / k)).round_ties_even();
            (bits, false)
        }
        AugOp::Solarize => (linspace(1.0, 0.0, bins, i), false),
    };
    Some(m)
}

/// Applies one AutoAugment-family op with its signed `magnitude` (torchvision's
/// `_apply_image_or_video_transform`, nearest sampling, no fill).
pub(super) fn apply_aug(frame: &mut Frame, op: AugOp, magnitude: f64) {
    let (w, h) = (frame.width, frame.height);
    let affine = |frame: &mut Frame, m: [f64; 6]| {
        frame.replace(w, h, |src, dst| {
            warp::warp(src, dst, w, h, &m, Sampling::Nearest)
        });
    };
    // center=[0, 0] in pixels is the top-left corner: (-w/2, -h/2) in centred coordinates.
    let corner = (-(w as f64) * 0.5, -(h as f64) * 0.5);
    match op {
        AugOp::Identity => {}
        AugOp::ShearX => affine(
            frame,
            inverse_affine(
                corner,
                0.0,
                (0.0, 0.0),
                1.0,
                (magnitude.atan().to_degrees(), 0.0),
            ),
        ),
        AugOp::ShearY => affine(
            frame,
            inverse_affine(
                corner,
                0.0,
                (0.0, 0.0),
                1.0,
                (0.0, magnitude.atan().to_degrees()),
            ),
        ),
        AugOp::TranslateX => affine(
            frame,
            inverse_affine((0.0, 0.0), 0.0, (magnitude.trunc(), 0.0), 1.0, (0.0, 0.0)),
        ),
        AugOp::TranslateY => affine(
            frame,
            inverse_affine((0.0, 0.0), 0.0, (0.0, magnitude.trunc()), 1.0, (0.0, 0.0)),
        ),
        AugOp::Rotate => affine(
            frame,
            inverse_affine((0.0, 0.0), -magnitude, (0.0, 0.0), 1.0, (0.0, 0.0)),
        ),
        AugOp::Brightness => color::brightness(&mut frame.img, 1.0 + magnitude),
        AugOp::Color => color::saturation(&mut frame.img, 1.0 + magnitude),
        AugOp::Contrast => color::contrast(&mut frame.img, 1.0 + magnitude),
        AugOp::Sharpness => frame.replace(w, h, |src, dst| {
            color::sharpness(src, dst, w, h, 1.0 + magnitude)
        }),
        AugOp::Posterize => color::posterize(&mut frame.img, magnitude.clamp(0.0, 8.0) as u32),
        AugOp::Solarize => color::solarize(&mut frame.img, 255.0 * magnitude),
        AugOp::AutoContrast => color::autocontrast(&mut frame.img),
        AugOp::Equalize => color::equalize(&mut frame.img),
        AugOp::Invert => color::invert(&mut frame.img),
    }
}

/// AutoAugment's ImageNet policy: 25 sub-policies of two `(op, probability, magnitude bin)`.
pub(super) const IMAGENET_POLICY: [[(AugOp, f64, usize); 2]; 25] = {
    use AugOp::*;
    [
        [(Posterize, 0.4, 8), (Rotate, 0.6, 9)],
        [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
        [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
        [(Posterize, 0.6, 7), (Posterize, 0.6, 6)],
        [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
        [(Equalize, 0.4, 0), (Rotate, 0.8, 8)],
        [(Solarize, 0.6, 3), (Equalize, 0.6, 0)],
        [(Posterize, 0.8, 5), (Equalize, 1.0, 0)],
        [(Rotate, 0.2, 3), (Solarize, 0.6, 8)],
        [(Equalize, 0.6, 0), (Posterize, 0.4, 6)],
        [(Rotate, 0.8, 8), (Color, 0.4, 0)],
        [(Rotate, 0.4, 9), (Equalize, 0.6, 0)],
        [(Equalize, 0.0, 0), (Equalize, 0.8, 0)],
        [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
        [(Color, 0.6, 4), (Contrast, 1.0, 8)],
        [(Rotate, 0.8, 8), (Color, 1.0, 2)],
        [(Color, 0.8, 8), (Solarize, 0.8, 7)],
        [(Sharpness, 0.4, 7), (Invert, 0.6, 0)],
        [(ShearX, 0.6, 5), (Equalize, 1.0, 0)],
        [(Color, 0.4, 0), (Equalize, 0.6, 0)],
        [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
        [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
        [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
        [(Color, 0.6, 4), (Contrast, 1.0, 8)],
        [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
    ]
};
