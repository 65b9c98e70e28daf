//! `random_photometric_distort`: torchvision v2's `RandomPhotometricDistort` (SSD's photometric
//! distortions) on the RGB8 image, with [`color`]'s `color_jitter` kernels.
//!
//! torchvision's `make_params` draws, in this order: for brightness, contrast, saturation and
//! hue a coin against `p` and, when it falls, the factor uniform in its range; whether contrast
//! comes before saturation and hue (probability 0.5); a coin against `p` and, when it falls, a
//! random permutation of the channels. Its `transform` then applies brightness, contrast (if
//! before), saturation, hue, contrast (if after), and the permutation.

use std::fmt::Write as _;

use super::args::{number, probability, Args};
use super::color;
use crate::rng::Rng;

/// The parameters of one draw: the four factors (brightness, contrast, saturation, hue; `None`
/// when its coin skipped it), the place of contrast, and the channel permutation (output
/// channel `c` is input channel `permutation[c]`, as `F.permute_channels`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Distort {
    pub(super) factors: [Option<f64>; 4],
    pub(super) contrast_before: bool,
    pub(super) permutation: Option<[usize; 3]>,
}

/// Parses `random_photometric_distort(brightness=a:b, contrast=a:b, saturation=a:b, hue=a:b,
/// p=0.5)`, torchvision's defaults for what is left out: the four ranges (brightness, contrast,
/// saturation, hue) and `p`.
pub(super) fn parse(args: &Args) -> Result<([(f64, f64); 4], f64), String> {
    args.check(0, &["brightness", "contrast", "saturation", "hue", "p"])?;
    // torchvision takes only (min, max) pairs here (no single `x` meaning `1-x:1+x`).
    let range = |key: &str, default: (f64, f64)| -> Result<(f64, f64), String> {
        let Some(v) = args.named(key) else {
            return Ok(default);
        };
        let (a, b) = v
            .split_once(':')
            .ok_or_else(|| format!("{key}={v} is not a range a:b"))?;
        Ok((number(a)?, number(b)?))
    };
    let factor = |key: &str, default: (f64, f64)| -> Result<(f64, f64), String> {
        let (a, b) = range(key, default)?;
        // The adjust kernels refuse a negative factor.
        if !(0.0 <= a && a <= b) {
            return Err(format!("{key}={a}:{b} needs 0 <= a <= b"));
        }
        Ok((a, b))
    };
    let hue = range("hue", (-0.05, 0.05))?;
    if !(-0.5 <= hue.0 && hue.0 <= hue.1 && hue.1 <= 0.5) {
        return Err(format!(
            "hue={}:{} needs -0.5 <= a <= b <= 0.5",
            hue.0, hue.1
        ));
    }
    Ok((
        [
            factor("brightness", (0.875, 1.125))?,
            factor("contrast", (0.5, 1.5))?,
            factor("saturation", (0.5, 1.5))?,
            hue,
        ],
        probability(args, 0.5)?,
    ))
}

/// Draws one sample's parameters in torchvision's order (`ranges`: brightness, contrast,
/// saturation, hue), appending them to `trace` when given.
pub(super) fn draw(
    ranges: [(f64, f64); 4],
    p: f64,
    rng: &mut Rng,
    trace: &mut Option<&mut Vec<String>>,
) -> Distort {
    // `torch.rand(1) < p`, then the factor only when the coin fell.
    let factors = ranges.map(|(a, b)| (rng.unit_f64() < p).then(|| rng.uniform(a, b)));
    let contrast_before = rng.unit_f64() < 0.5;
    let permutation = (rng.unit_f64() < p).then(|| {
        let mut order = [0, 1, 2];
        rng.shuffle(&mut order);
        order
    });
    if let Some(t) = trace.as_deref_mut() {
        let f = |x: Option<f64>| x.map_or("null".to_string(), |v| v.to_string());
        let mut s = format!(
            r#"{{"op":"random_photometric_distort","brightness":{},"contrast":{},"saturation":{},"hue":{},"contrast_before":{contrast_before},"permutation":"#,
            f(factors[0]),
            f(factors[1]),
            f(factors[2]),
            f(factors[3]),
        );
        match permutation {
            Some([a, b, c]) => {
                let _ = write!(s, "[{a},{b},{c}]}}");
            }
            None => s.push_str("null}"),
        }
        t.push(s);
    }
    Distort {
        factors,
        contrast_before,
        permutation,
    }
}

/// Applies a draw to an interleaved RGB8 image, in torchvision's `transform` order.
pub(super) fn apply(d: &Distort, img: &mut [u8]) {
    let [brightness, contrast, saturation, hue] = d.factors;
    if let Some(f) = brightness {
        color::brightness(img, f);
    }
    if let (Some(f), true) = (contrast, d.contrast_before) {
        color::contrast(img, f);
    }
    if let Some(f) = saturation {
        color::saturation(img, f);
    }
    if let Some(f) = hue {
        color::hue(img, f);
    }
    if let (Some(f), false) = (contrast, d.contrast_before) {
        color::contrast(img, f);
    }
    if let Some(perm) = d.permutation {
        for px in img.chunks_exact_mut(3) {
            let src = [px[0], px[1], px[2]];
            for (o, &c) in px.iter_mut().zip(&perm) {
                *o = src[c];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, Layout};
    use crate::rng::Stream;
    use crate::source::pixels::InputLayout;
    use crate::transform::{parse as parse_spec, DensePipeline, Op, Pipeline, Role, TensorShape};

    const W: usize = 20;
    const H: usize = 12;

    fn rng(index: u64) -> Rng {
        Rng::for_key(3, Stream::Augment, 0, index)
    }

    fn image() -> Vec<u8> {
        (0..W * H)
            .flat_map(|i| {
                let (y, x) = (i / W, i % W);
                [(x * 12) as u8, (y * 20) as u8, ((x * y * 7) % 251) as u8]
            })
            .collect()
    }

    fn apply_spec(spec: &str, index: u64) -> Vec<u8> {
        let p = Pipeline::for_input(Some(spec), Some(DType::U8), Layout::Nhwc, H, W).unwrap();
        let mut out = vec![0; p.output_bytes()];
        p.apply_rgb(&image(), W, H, &mut rng(index), &mut out)
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        out
    }

    fn ranges(spec: &str) -> ([(f64, f64); 4], f64) {
        match parse_spec(spec).unwrap().as_slice() {
            [Op::RandomPhotometricDistort {
                brightness,
                contrast,
                saturation,
                hue,
                p,
            }] => ([*brightness, *contrast, *saturation, *hue], *p),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_are_torchvisions_and_bad_ranges_name_the_op_and_value() {
        assert_eq!(
            ranges("random_photometric_distort"),
            ([(0.875, 1.125), (0.5, 1.5), (0.5, 1.5), (-0.05, 0.05)], 0.5)
        );
        assert_eq!(
            ranges("random_photometric_distort(brightness=0.5:1.5, hue=-1/10:0, p=1)"),
            ([(0.5, 1.5), (0.5, 1.5), (0.5, 1.5), (-0.1, 0.0)], 1.0)
        );
        for (spec, want) in [
            ("random_photometric_distort(contrast=-1:2)", "contrast=-1:2"),
            ("random_photometric_distort(hue=0:0.7)", "hue=0:0.7"),
            (
                "random_photometric_distort(saturation=1.2)",
                "saturation=1.2",
            ),
            ("random_photometric_distort(p=2)", "p=2"),
            ("random_photometric_distort(gamma=1:2)", "gamma"),
        ] {
            let e = parse_spec(spec).unwrap_err();
            assert!(
                e.contains("random_photometric_distort") && e.contains(want),
                "{spec}: {e}"
            );
        }
    }

    #[test]
    fn drawn_factors_fall_in_their_ranges_and_every_part_is_sometimes_skipped() {
        let (r, p) = ranges("random_photometric_distort");
        let (mut skipped, mut applied) = ([0; 4], [0; 4]);
        let (mut before, mut permuted) = (0, 0);
        for i in 0..2000 {
            let d = draw(r, p, &mut rng(i), &mut None);
            for (k, f) in d.factors.iter().enumerate() {
                match f {
                    Some(f) => {
                        assert!(r[k].0 <= *f && *f <= r[k].1, "part {k}: {f}");
                        applied[k] += 1;
                    }
                    None => skipped[k] += 1,
                }
            }
            before += usize::from(d.contrast_before);
            if let Some(mut perm) = d.permutation {
                permuted += 1;
                perm.sort_unstable();
                assert_eq!(perm, [0, 1, 2]);
            }
        }
        for k in 0..4 {
            assert!(skipped[k] > 850 && applied[k] > 850, "part {k}");
        }
        assert!((850..1150).contains(&before) && (850..1150).contains(&permuted));
    }

    #[test]
    fn p_zero_leaves_the_image_unchanged() {
        let crop = format!("center_crop({H}, {W})");
        for i in 0..8 {
            assert_eq!(
                apply_spec(&format!("{crop} | random_photometric_distort(p=0)"), i),
                image()
            );
        }
    }

    #[test]
    fn p_one_with_identity_factors_only_permutes_the_channels() {
        // Factors of 1 and a hue shift of 0 leave every value; what remains is the permutation.
        let spec = format!(
            "center_crop({H}, {W}) | random_photometric_distort(brightness=1:1, contrast=1:1, \
             saturation=1:1, hue=0:0, p=1)"
        );
        let (r, p) = ranges(&spec[spec.find("random").unwrap()..]);
        let src = image();
        let mut seen = std::collections::HashSet::new();
        for i in 0..24 {
            let perm = draw(r, p, &mut rng(i), &mut None).permutation.unwrap();
            let mut want = src.clone();
            apply(
                &Distort {
                    factors: [None; 4],
                    contrast_before: false,
                    permutation: Some(perm),
                },
                &mut want,
            );
            for (o, s) in want.chunks_exact(3).zip(src.chunks_exact(3)) {
                assert_eq!(o, [s[perm[0]], s[perm[1]], s[perm[2]]]);
            }
            assert_eq!(apply_spec(&spec, i), want, "draw {i}: {perm:?}");
            seen.insert(perm);
        }
        assert!(seen.len() > 1, "{seen:?}");
    }

    #[test]
    fn a_mask_is_left_as_it_is_but_its_later_draws_stay_in_step_with_the_image() {
        // Gray pixels whose value is their position: identity factors and any permutation keep
        // them, so the image's crop and the mask's must pick the same pixels.
        let spec = "center_crop(12, 20) | random_photometric_distort(brightness=1:1, \
                    contrast=1:1, saturation=1:1, hue=0:0, p=1) | random_crop(6)";
        let labels: Vec<u8> = (0..(W * H) as u8).collect();
        let gray: Vec<u8> = labels.iter().flat_map(|&v| [v; 3]).collect();
        let rgb = Pipeline::for_input(Some(spec), Some(DType::U8), Layout::Nchw, H, W).unwrap();
        let input = TensorShape {
            height: H,
            width: W,
            channels: 1,
            dtype: DType::U8,
            layout: InputLayout::Hwc,
        };
        let mask = DensePipeline::new(
            Some(spec),
            input,
            Role::Mask { ignore_index: 255 },
            None,
            Layout::Nchw,
        )
        .unwrap();
        let mut crops = std::collections::HashSet::new();
        for i in 0..8 {
            let mut img = vec![0; rgb.output_bytes()];
            rgb.apply_rgb(&gray, W, H, &mut rng(i), &mut img).unwrap();
            let mut out = vec![0; mask.output_bytes()];
            mask.apply(&labels, &mut rng(i), &mut out, &mut Default::default())
                .unwrap();
            assert_eq!(out, img[..36], "draw {i}");
            crops.insert(out[0]);
        }
        assert!(crops.len() > 1, "{crops:?}");
    }

    #[test]
    fn a_tensor_image_other_than_rgb8_is_refused_naming_the_op() {
        for (channels, dtype) in [(4, DType::U8), (3, DType::F32), (1, DType::U8)] {
            let input = TensorShape {
                height: H,
                width: W,
                channels,
                dtype,
                layout: InputLayout::Chw,
            };
            let e = DensePipeline::new(
                Some("center_crop(8) | random_photometric_distort"),
                input,
                Role::Image,
                None,
                Layout::Nchw,
            )
            .unwrap_err();
            assert!(
                e.contains("random_photometric_distort") && e.contains("needs an RGB image"),
                "{e}"
            );
        }
    }
}
