//! Tests of the ops that run after the geometry plan (augment, the AutoAugment family, the
//! padded crop, random erasing) and of the batch mixes: errors naming the op, determinism per
//! draw, buffer reuse, pixels against the whole planned image, draws against torchvision.

use fast_image_resize::Resizer;

use super::tests::{diff, pipeline, rng};
use super::*;
use crate::dtype::{DType, Layout};
use crate::rng::Rng;

/// A synthetic 40x30 RGB8 image with distinct, varied pixels.
fn synthetic() -> (Vec<u8>, usize, usize) {
    let (w, h) = (40, 30);
    let mut rgb = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            rgb.extend_from_slice(&[(x * 6) as u8, (y * 8) as u8, ((x * y) % 251) as u8]);
        }
    }
    (rgb, w, h)
}

fn apply_u8(spec: &str, index: u64) -> Vec<u8> {
    let (rgb, w, h) = synthetic();
    let p = pipeline(spec, Some(DType::U8), Layout::Nhwc);
    let mut out = vec![0u8; p.output_bytes()];
    p.apply_rgb(&rgb, w, h, &mut rng(index), &mut out)
        .unwrap_or_else(|e| panic!("{spec}: {e}"));
    out
}

#[test]
fn augmentation_errors_name_the_op_and_the_parameter() {
    let cases = [
        (
            "center_crop(8) | sharpen",
            &["unknown operation `sharpen`"][..],
        ),
        (
            "center_crop(8) | rand_augment(magnitude=31)",
            &["rand_augment", "magnitude=31"],
        ),
        (
            "center_crop(8) | rand_augment(num_ops=x)",
            &["rand_augment", "num_ops"],
        ),
        (
            "center_crop(8) | random_crop(8, pad_mode=wrap)",
            &["random_crop", "pad_mode"],
        ),
        (
            "center_crop(8) | random_crop(8, fill=300)",
            &["random_crop", "fill"],
        ),
        (
            "center_crop(8) | gaussian_blur(4)",
            &["gaussian_blur", "odd"],
        ),
        (
            "center_crop(8) | gaussian_blur(3, sigma=0:1)",
            &["gaussian_blur", "sigma"],
        ),
        (
            "center_crop(8) | color_jitter(hue=0.7)",
            &["color_jitter", "hue"],
        ),
        (
            "center_crop(8) | color_jitter(brightness=-1)",
            &["color_jitter", "brightness"],
        ),
        ("center_crop(8) | grayscale(p=2)", &["grayscale", "p=2"]),
        (
            "center_crop(8) | affine(translate=2:0)",
            &["affine", "translate"],
        ),
        (
            "center_crop(8) | auto_augment(cifar10)",
            &["auto_augment", "cifar10"],
        ),
        (
            "center_crop(8) | random_erasing(scale=0.5:2)",
            &["random_erasing", "scale"],
        ),
        (
            "color_jitter(brightness=0.4) | center_crop(8)",
            &["color_jitter", "fixed size"],
        ),
        (
            "resize(16) | trivial_augment | center_crop(8)",
            &["trivial_augment", "fixed size"],
        ),
        (
            "center_crop(8) | random_erasing | hflip",
            &["hflip", "random_erasing"],
        ),
        (
            "random_crop(8) | resize(4, 4)",
            &["resize", "must come before random_crop"],
        ),
    ];
    for (spec, words) in cases {
        let err = Pipeline::new(Some(spec), None, Layout::Nchw).unwrap_err();
        for w in words {
            assert!(err.contains(w), "{spec}: `{err}` lacks `{w}`");
        }
    }
    // Erasing with a uint8 output must use a uint8 value.
    let err = Pipeline::new(
        Some("center_crop(8) | random_erasing(value=-1)"),
        Some(DType::U8),
        Layout::Nchw,
    )
    .unwrap_err();
    assert!(
        err.contains("random_erasing") && err.contains("value"),
        "{err}"
    );
    // Noise cannot be written into uint8 (torchvision's would truncate it to 0 and 1).
    let err = Pipeline::new(
        Some("center_crop(8) | random_erasing(value=random)"),
        Some(DType::U8),
        Layout::Nchw,
    )
    .unwrap_err();
    assert!(
        err.contains("value=random") && err.contains("uint8"),
        "{err}"
    );
}

#[test]
fn every_augmentation_is_deterministic_per_draw() {
    let specs = [
        "random_crop(24, padding=4, pad_mode=reflect)",
        "center_crop(24) | vflip",
        "center_crop(24) | color_jitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)",
        "center_crop(24) | random_photometric_distort",
        "center_crop(24) | grayscale(p=0.5)",
        "center_crop(24) | gaussian_blur(5)",
        "center_crop(24) | rotate(30)",
        "center_crop(24) | affine(degrees=10, translate=0.1:0.1, scale=0.9:1.1, shear=5)",
        "center_crop(24) | rand_augment",
        "center_crop(24) | trivial_augment",
        "center_crop(24) | auto_augment(imagenet)",
        "center_crop(24) | random_erasing(p=1, value=9)",
        "random_resized_crop(24) | hflip | trivial_augment | random_erasing",
    ];
    for spec in specs {
        let outs: Vec<Vec<u8>> = (0..12).map(|i| apply_u8(spec, i)).collect();
        for (i, out) in outs.iter().enumerate() {
            assert_eq!(
                out,
                &apply_u8(spec, i as u64),
                "{spec}: draw {i} not reproducible"
            );
        }
        assert!(
            outs.iter().any(|o| o != &outs[0]),
            "{spec}: every draw gave the same output"
        );
    }
}

#[test]
fn one_scratch_serves_every_sample_like_a_fresh_one() {
    let (rgb, w, h) = synthetic();
    let p = pipeline(
        "random_crop(24, padding=2) | trivial_augment | gaussian_blur(3) | rotate(20) | random_erasing",
        Some(DType::F32),
        Layout::Nchw,
    );
    let mut scratch = Scratch::default();
    for i in 0..20 {
        let mut reused = vec![0u8; p.output_bytes()];
        let mut fresh = vec![0u8; p.output_bytes()];
        p.apply(&rgb, w, h, &mut rng(i), &mut reused, &mut scratch)
            .unwrap();
        p.apply_rgb(&rgb, w, h, &mut rng(i), &mut fresh).unwrap();
        assert_eq!(reused, fresh, "draw {i}");
    }
}

#[test]
fn flips_grayscale_and_identity_warps_behave() {
    let (rgb, w, h) = synthetic();
    let crop = format!("center_crop({h}, {w})");
    assert_eq!(apply_u8(&crop, 0), rgb);
    assert_eq!(
        apply_u8(&format!("{crop} | vflip(p=1) | vflip(p=1)"), 0),
        rgb
    );
    assert_eq!(apply_u8(&format!("{crop} | rotate(0)"), 0), rgb);
    assert_eq!(apply_u8(&format!("{crop} | grayscale(p=0)"), 0), rgb);
    let flipped = apply_u8(&format!("{crop} | vflip(p=1)"), 0);
    assert_eq!(flipped[..w * 3], rgb[(h - 1) * w * 3..]);
    let gray = apply_u8(&format!("{crop} | grayscale(p=1)"), 0);
    assert!(gray
        .chunks_exact(3)
        .all(|px| px[0] == px[1] && px[1] == px[2]));
    assert!(gray.iter().any(|&v| v > 0));
}

#[test]
fn random_crop_pads_with_the_fill_or_the_mode() {
    let (rgb, w, h) = synthetic();
    // padding 10 on each side, crop the whole padded image: the border is the fill.
    let spec = format!(
        "random_crop({}, {}, padding=10, fill=1,2,3)",
        h + 20,
        w + 20
    );
    let out = apply_u8(&spec, 0);
    let pw = w + 20;
    assert_eq!(&out[..3], &[1, 2, 3]);
    let at = (10 * pw + 10) * 3;
    assert_eq!(&out[at..at + 3], &rgb[..3]);
    // edge: the corner repeats the first pixel; symmetric: the mirrored neighbour.
    let edge = apply_u8(
        &format!(
            "random_crop({}, {}, padding=2, pad_mode=edge)",
            h + 4,
            w + 4
        ),
        0,
    );
    assert_eq!(&edge[..3], &rgb[..3]);
    let sym = apply_u8(
        &format!(
            "random_crop({}, {}, padding=1, pad_mode=symmetric)",
            h + 2,
            w + 2
        ),
        0,
    );
    assert_eq!(&sym[..3], &rgb[..3]);
    let refl = apply_u8(
        &format!(
            "random_crop({}, {}, padding=1, pad_mode=reflect)",
            h + 2,
            w + 2
        ),
        0,
    );
    let diag = (w + 1) * 3; // reflect mirrors about the edge pixel: (-1, -1) reads (1, 1)
    assert_eq!(&refl[..3], &rgb[diag..diag + 3]);
    // Reflect padding must be smaller than the side: a per-sample error naming the op.
    let p = pipeline(
        "random_crop(8, padding=40, pad_mode=reflect)",
        Some(DType::U8),
        Layout::Nhwc,
    );
    let mut out = vec![0u8; p.output_bytes()];
    let err = p.apply_rgb(&rgb, w, h, &mut rng(0), &mut out).unwrap_err();
    assert!(
        err.contains("random_crop") && err.contains("padding"),
        "{err}"
    );
}

/// The ops after the plan as they ran before `apply_stages` took its shortcuts: the whole
/// planned image materialised, then every op on it in turn; its final RGB8 pixels.
fn whole_planned_image(
    p: &Pipeline,
    rgb: &[u8],
    (width, height): (usize, usize),
    rng: &mut Rng,
) -> Vec<u8> {
    let plan = p.plan(width, height, rng).unwrap();
    let mut frame = super::frame::Frame::default();
    let mut resizer = Resizer::new();
    kernels::materialise(rgb, width, height, &plan, &mut frame.img, &mut resizer).unwrap();
    (frame.width, frame.height) = (plan.width, plan.height);
    let planned = p.ops().iter().position(|op| !pipeline::foldable(op));
    for op in &p.ops()[planned.unwrap_or(p.ops().len())..] {
        augment::run(op, &mut frame, rng, &mut None).unwrap();
    }
    frame.img
}

#[test]
fn a_constant_padded_crop_after_the_plan_resamples_only_its_window_exactly() {
    // The crop is drawn before the planned image is materialised, and only the window it keeps
    // is resampled; a trailing hflip is left to the output pass. Each sample must equal the
    // whole planned image cropped and flipped, whether the window keeps all of the image,
    // part of it or (a crop smaller than the padding) none of it.
    let (rgb, w, h) = synthetic();
    let specs = [
        "scale_jitter(48, scale=0.5:2) | hflip | random_crop(16, padding=40, fill=200)",
        "scale_jitter(64, scale=0.1:2) | random_crop(64, padding=32, fill=7) | hflip",
        "random_resized_crop(40) | random_crop(24) | hflip(p=0.5) | normalize(mean=0, std=1)",
        "resize(40, 30) | random_zoom_out(fill=9) | random_crop(40, padding=8) | hflip",
    ];
    for spec in specs {
        let dtype = if spec.contains("normalize") {
            DType::F32
        } else {
            DType::U8
        };
        let p = pipeline(spec, Some(dtype), Layout::Nhwc);
        let mut filled_rows = [0usize; 3];
        for index in 0..300 {
            let mut out = vec![0u8; p.output_bytes()];
            p.apply_rgb(&rgb, w, h, &mut rng(index), &mut out).unwrap();
            let whole = whole_planned_image(&p, &rgb, (w, h), &mut rng(index));
            let out: Vec<u8> = match dtype {
                DType::U8 => out,
                _ => floats(&out)
                    .iter()
                    .map(|v| (v * 255.0).round() as u8)
                    .collect(),
            };
            let expected = &whole;
            // Within one level: fast_image_resize sizes its fixed-point weights by the largest
            // weight of the whole output, and a window's may be another (up to a sixth of a
            // window's values, in the draws of these specs).
            let (max, mean) = diff(&out, expected);
            assert!(
                max <= 1 && mean < 0.25,
                "{spec}: sample {index}: {max}, {mean}"
            );
            let rows = whole.chunks(16 * 3);
            let fill = rows.clone().filter(|r| r.iter().all(|&v| v == 200)).count();
            filled_rows[if fill == 0 {
                0
            } else if fill < rows.len() {
                1
            } else {
                2
            }] += 1;
        }
        if spec.contains("fill=200") {
            // No row of fill, some, and nothing but fill: all three cases were met.
            assert!(filled_rows.iter().all(|&n| n > 0), "{filled_rows:?}");
        }
    }
}

#[test]
fn random_erasing_writes_its_value_in_output_units_after_normalize() {
    let (rgb, w, h) = synthetic();
    let p = pipeline(
        &format!("center_crop({h}, {w}) | random_erasing(p=1, value=0) | normalize(imagenet)"),
        None,
        Layout::Nchw,
    );
    let mut out = vec![0u8; p.output_bytes()];
    p.apply_rgb(&rgb, w, h, &mut rng(1), &mut out).unwrap();
    let values: Vec<f32> = out
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let zeros = values.iter().filter(|&&v| v == 0.0).count();
    // scale 0.02..0.33 of the area, on all three channels.
    let area = (w * h * 3) as f64;
    assert!(
        zeros as f64 >= 0.015 * area && zeros as f64 <= 0.34 * area,
        "{zeros}"
    );
}

/// f32 elements of an output.
fn floats(out: &[u8]) -> Vec<f32> {
    out.chunks_exact(4)
        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn random_erasing_with_value_random_fills_its_box_with_standard_normal_noise() {
    let (rgb, w, h) = synthetic();
    let run = |value: &str, layout: Layout, index: u64| {
        let p = pipeline(
            &format!("center_crop({h}, {w}) | random_erasing(p=1, scale=0.3:0.33, value={value}) | normalize(imagenet)"),
            None,
            layout,
        );
        let mut out = vec![0u8; p.output_bytes()];
        p.apply_rgb(&rgb, w, h, &mut rng(index), &mut out).unwrap();
        floats(&out)
    };
    let (mut noise, mut total) = (Vec::new(), 0);
    for index in 0..40 {
        // The box is drawn before the noise's seed: a constant fill marks where it is.
        let marked = run("1000", Layout::Nchw, index);
        let random = run("random", Layout::Nchw, index);
        let mut here = Vec::new();
        for (m, r) in marked.iter().zip(&random) {
            if *m == 1000.0 {
                here.push(*r as f64);
            } else {
                assert!(
                    (-3.0..=3.0).contains(r),
                    "outside the box, normalized pixels"
                );
            }
        }
        total += marked.len();
        assert!(!here.is_empty(), "p=1 erases");
        // Deterministic per draw, and drawn in [C, h, w] order whatever the layout.
        assert_eq!(random, run("random", Layout::Nchw, index));
        let nhwc = run("random", Layout::Nhwc, index);
        for c in 0..3 {
            for y in 0..h {
                for x in 0..w {
                    assert_eq!(random[(c * h + y) * w + x], nhwc[(y * w + x) * 3 + c]);
                }
            }
        }
        noise.extend(here);
    }
    // 40 boxes of 30-33% of the image: ~14,000 draws; mean 0 and variance 1 within a few
    // standard errors, and values different from draw to draw.
    let n = noise.len() as f64;
    assert!(n >= 0.29 * total as f64, "{n} of {total}");
    let mean = noise.iter().sum::<f64>() / n;
    let var = noise.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    assert!(mean.abs() < 0.05, "mean {mean}");
    assert!((var - 1.0).abs() < 0.06, "variance {var}");
    let beyond_2 = noise.iter().filter(|v| v.abs() > 2.0).count() as f64 / n;
    assert!(
        (0.035..0.056).contains(&beyond_2),
        "P(|z| > 2) = {beyond_2}, normal: 0.0455"
    );
    assert_ne!(
        run("random", Layout::Nchw, 0),
        run("random", Layout::Nchw, 1)
    );
}

#[test]
fn inverse_affine_matches_torchvision() {
    // torchvision: _get_inverse_affine_matrix([0, 0], 30, [2, -3], 1.2, [10, 5]).
    let m = warp::inverse_affine((0.0, 0.0), 30.0, (2.0, -3.0), 1.2, (10.0, 5.0));
    let expected = [
        0.659351459347987,
        0.5503474588408431,
        0.3323394578265555,
        -0.3535271623695006,
        0.7581414462895005,
        2.981478663607503,
    ];
    for (a, b) in m.iter().zip(expected) {
        assert!((a - b).abs() < 1e-6, "{m:?}");
    }
}

#[test]
fn beta_draws_have_the_beta_moments() {
    for alpha in [0.2, 0.8, 1.0, 4.0] {
        let mut r = rng(9);
        let n = 20_000;
        let draws: Vec<f64> = (0..n).map(|_| mix::beta(&mut r, alpha)).collect();
        assert!(draws.iter().all(|x| (0.0..=1.0).contains(x)));
        let mean = draws.iter().sum::<f64>() / n as f64;
        let var = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        // Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
        let expected = 1.0 / (4.0 * (2.0 * alpha + 1.0));
        assert!((mean - 0.5).abs() < 0.01, "alpha {alpha}: mean {mean}");
        assert!(
            (var - expected).abs() < 0.1 * expected,
            "alpha {alpha}: var {var}"
        );
    }
}

#[test]
fn mix_specs_parse_and_cutmix_corrects_lam() {
    let p = pipeline(
        "center_crop(8) | mixup(alpha=0.8, num_classes=10, label_smoothing=0.1) | cutmix(alpha=1.0, num_classes=10, switch=0.25)",
        Some(DType::F32),
        Layout::Nchw,
    );
    let m = p.batch_mix().unwrap().clone();
    assert_eq!(
        (
            m.mixup_alpha,
            m.cutmix_alpha,
            m.switch,
            m.label_smoothing,
            m.num_classes
        ),
        (Some(0.8), Some(1.0), 0.25, 0.1, 10)
    );
    assert_eq!(p.ops().len(), 1, "batch ops leave the per-sample list");
    let mut cuts = 0;
    for i in 0..400 {
        let d = m.draw(&mut rng(i), 32, 48);
        assert!((0.0..=1.0).contains(&d.lam));
        assert_eq!(d, m.draw(&mut rng(i), 32, 48), "deterministic per key");
        if let Some((t, b, l, r)) = d.cut {
            cuts += 1;
            let area = ((b - t) * (r - l)) as f64 / (32.0 * 48.0);
            assert!((d.lam - (1.0 - area)).abs() < 1e-12);
        }
    }
    // switch=0.25: about a quarter of the batches cut.
    assert!((60..140).contains(&cuts), "{cuts}");
    for (spec, words) in [
        (
            "center_crop(8) | mixup(alpha=1)",
            &["mixup", "num_classes"][..],
        ),
        (
            "center_crop(8) | cutmix(alpha=0, num_classes=3)",
            &["cutmix", "alpha"],
        ),
        (
            "center_crop(8) | mixup(num_classes=3) | cutmix(num_classes=4)",
            &["cutmix", "num_classes"],
        ),
        (
            "center_crop(8) | mixup(num_classes=3, switch=1)",
            &["mixup", "switch"],
        ),
    ] {
        let err = Pipeline::new(Some(spec), None, Layout::Nchw).unwrap_err();
        for w in words {
            assert!(err.contains(w), "{spec}: `{err}` lacks `{w}`");
        }
    }
}

#[test]
fn blend_pairs_and_swap_boxes_mix_with_the_reversed_batch() {
    // 3 rows of 2 f32: row 1 (the middle) is its own partner.
    let rows: Vec<f32> = vec![1.0, 2.0, 5.0, 6.0, 3.0, 4.0];
    let mut bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_ne_bytes()).collect();
    mix::blend_pairs(&mut bytes, 3, 8, DType::F32, 0.25);
    let out: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(out, vec![2.5, 3.5, 5.0, 6.0, 1.5, 2.5]);
    // Two 2x2 uint8 NHWC images: swapping the top-left pixel box.
    let mut imgs: Vec<u8> = (0..24).collect();
    mix::swap_boxes(&mut imgs, 2, (2, 2), Layout::Nhwc, DType::U8, (0, 1, 0, 1));
    assert_eq!(&imgs[..3], &[12, 13, 14]);
    assert_eq!(&imgs[12..15], &[0, 1, 2]);
    assert_eq!(&imgs[3..12], &(3..12).collect::<Vec<u8>>()[..]);
}
