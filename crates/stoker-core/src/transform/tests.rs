//! Tests of the transform: spec parsing, geometry against torchvision's rules, pixels against
//! Pillow references.

use fast_image_resize::Resizer;

use super::kernels::resample_rgb;
use super::*;
use crate::decode::tests::fixture;
use crate::decode::{decode_rgb, DecodeBuffers};
use crate::dtype::{DType, Layout};
use crate::rng::Rng;
use crate::rng::Stream;

/// Decodes `encoded` (at most `max_pixels`) and transforms it into `out`, as collate does.
fn decode_and_apply(
    p: &Pipeline,
    encoded: &[u8],
    max_pixels: u64,
    rng: &mut Rng,
    out: &mut [u8],
) -> Result<(), String> {
    let mut bufs = DecodeBuffers::default();
    let dims = decode_rgb(encoded, max_pixels, &mut bufs)?;
    p.apply_rgb(&bufs.rgb, dims.width, dims.height, rng, out)
}

/// `decode_and_apply` with Pillow's default pixel limit.
trait Run {
    fn run(&self, encoded: &[u8], rng: &mut Rng, out: &mut [u8]) -> Result<(), String>;
}

impl Run for Pipeline {
    fn run(&self, encoded: &[u8], rng: &mut Rng, out: &mut [u8]) -> Result<(), String> {
        decode_and_apply(self, encoded, 89_478_485, rng, out)
    }
}

pub(super) fn rng(index: u64) -> Rng {
    Rng::for_key(42, Stream::Augment, 3, index)
}

fn decoded(name: &str) -> (Vec<u8>, usize, usize) {
    let mut bufs = DecodeBuffers::default();
    let d = decode_rgb(&fixture(name), u64::MAX, &mut bufs).unwrap();
    (bufs.rgb, d.width, d.height)
}

pub(super) fn pipeline(spec: &str, dtype: Option<DType>, layout: Layout) -> Pipeline {
    Pipeline::new(Some(spec), dtype, layout).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

pub(super) use crate::testing::levels as diff;

#[test]
fn every_op_of_the_spec_language_parses() {
    assert_eq!(
        parse("random_resized_crop(224) | hflip | normalize(imagenet)").unwrap(),
        vec![
            Op::RandomResizedCrop {
                height: 224,
                width: 224,
                scale: (0.08, 1.0),
                ratio: (0.75, 4.0 / 3.0)
            },
            Op::HFlip { p: 0.5 },
            Op::Normalize {
                mean: IMAGENET_MEAN.to_vec(),
                std: IMAGENET_STD.to_vec()
            },
        ]
    );
    assert_eq!(
        parse("resize(256)|center_crop(224, 200)|resize(10,20)|hflip(p=0.25)|hflip(1)").unwrap(),
        vec![
            Op::ResizeShorter(256),
            Op::CenterCrop {
                height: 224,
                width: 200
            },
            Op::Resize {
                height: 10,
                width: 20
            },
            Op::HFlip { p: 0.25 },
            Op::HFlip { p: 1.0 },
        ]
    );
    assert_eq!(
        parse("random_resized_crop(160, 128, scale=0.35:1, ratio=3/4:4/3)").unwrap(),
        vec![Op::RandomResizedCrop {
            height: 160,
            width: 128,
            scale: (0.35, 1.0),
            ratio: (0.75, 4.0 / 3.0)
        }]
    );
    assert_eq!(
        parse("normalize(mean=0.5,0.25,0.125, std=0.5)").unwrap(),
        vec![Op::Normalize {
            mean: vec![0.5, 0.25, 0.125],
            std: vec![0.5; 3]
        }]
    );
    for (bad, needle) in [
        ("", "empty operation"),
        ("resize(256) |", "empty operation"),
        ("blur(3)", "unknown operation `blur`"),
        ("resize(0)", "not a size"),
        ("resize(a)", "not a size"),
        ("resize(1,2,3)", "at most 2"),
        ("center_crop(224", "missing closing parenthesis"),
        ("hflip(p=2)", "not a probability"),
        ("random_resized_crop(224, scale=1:0.5)", "0 < a <= b"),
        (
            "random_resized_crop(224, scael=0.5:1)",
            "unknown argument `scael`",
        ),
        ("normalize(mean=1,2, std=1,2,3)", "give as many of each"),
        ("normalize(mean=1, std=0)", "must not be 0"),
        ("normalize()", "needs mean"),
    ] {
        let err = parse(bad).unwrap_err();
        assert!(err.contains(needle), "{bad}: {err}");
    }
}

/// Arguments torchvision's classes take by position may be given by position, in its order.
#[test]
fn arguments_bind_by_position_in_torchvisions_order() {
    for (positional, named) in [
        (
            "color_jitter(0.4, 0.3, 0.2, 0.1)",
            "color_jitter(brightness=0.4, contrast=0.3, saturation=0.2, hue=0.1)",
        ),
        (
            "color_jitter(0.4, hue=0.1)",
            "color_jitter(brightness=0.4, hue=0.1)",
        ),
        (
            "gaussian_blur(5, 0.5:1.5)",
            "gaussian_blur(5, sigma=0.5:1.5)",
        ),
        (
            "affine(10, 0.1:0.2, 0.9:1.1, 5)",
            "affine(degrees=10, translate=0.1:0.2, scale=0.9:1.1, shear=5)",
        ),
        ("rand_augment(3, 7)", "rand_augment(num_ops=3, magnitude=7)"),
        (
            "random_erasing(0.3, 0.1:0.2)",
            "random_erasing(p=0.3, scale=0.1:0.2)",
        ),
    ] {
        assert_eq!(parse(positional), parse(named), "{positional}");
        assert!(parse(named).is_ok(), "{named}");
    }
    for (bad, needle) in [
        (
            "color_jitter(0.4, brightness=0.2)",
            "`brightness` is given both",
        ),
        ("color_jitter(1, 1, 1, 0.1, 1)", "at most 4 positional"),
        ("gaussian_blur(3, 0.5, sigma=1)", "`sigma` is given both"),
    ] {
        let err = parse(bad).unwrap_err();
        assert!(err.contains(needle), "{bad}: {err}");
    }
}

/// Random specs built from the grammar's characters never panic the parser.
#[test]
fn parser_survives_random_specs() {
    let alphabet: Vec<char> = "resizcntop_dmlhfgwa(),|=:/.0123456789 -e".chars().collect();
    let words = [
        "resize(",
        "center_crop(",
        "random_resized_crop(",
        "hflip",
        "normalize(",
        "imagenet",
        "scale=",
        "ratio=",
        "p=",
        "mean=",
        "std=",
        ")",
        "|",
        ",",
        "1e308",
        "0",
    ];
    let mut r = rng(7);
    for _ in 0..20_000 {
        let mut spec = String::new();
        for _ in 0..r.below(12) {
            if r.below(2) == 0 {
                spec.push_str(words[r.below(words.len() as u64) as usize]);
            } else {
                spec.push(alphabet[r.below(alphabet.len() as u64) as usize]);
            }
        }
        if let Ok(ops) = parse(&spec) {
            let _ = Pipeline::new(Some(&spec), None, Layout::Nchw);
            assert!(!ops.is_empty());
        }
    }
}

#[test]
fn pipeline_needs_a_fixed_size_and_a_sensible_dtype() {
    for spec in [
        None,
        Some("resize(256)"),
        Some("hflip"),
        Some("resize(7) | hflip"),
    ] {
        let err = Pipeline::new(spec, None, Layout::Nchw).unwrap_err();
        assert!(err.contains("fix the output size"), "{spec:?}: {err}");
    }
    // A resize of the shorter side after a fixed size keeps it fixed.
    let p = Pipeline::new(Some("center_crop(9, 12) | resize(6)"), None, Layout::Nchw).unwrap();
    assert_eq!(p.output_size(), (6, 8));
    // Image-shaped tensors have a known size: none of these is refused for them.
    for spec in [
        None,
        Some("resize(256)"),
        Some("hflip"),
        Some("color_jitter(brightness=0.4)"),
    ] {
        let p = Pipeline::for_input(spec, None, Layout::Nchw, 32, 48).unwrap();
        let expected = if spec == Some("resize(256)") {
            (256, 384)
        } else {
            (32, 48)
        };
        assert_eq!(p.output_size(), expected, "{spec:?}");
    }
    let err = Pipeline::for_input(Some("center_crop(40)"), None, Layout::Nchw, 32, 48).unwrap_err();
    assert!(err.contains("smaller than the crop"), "{err}");
    let err = Pipeline::new(
        Some("resize(8,8) | normalize(imagenet)"),
        Some(DType::U8),
        Layout::Nchw,
    )
    .unwrap_err();
    assert!(err.contains("normalize produces floats"), "{err}");
    let err = Pipeline::new(Some("resize(8,8)"), Some(DType::I64), Layout::Nchw).unwrap_err();
    assert!(err.contains("not int64"), "{err}");
    let p = pipeline(
        "resize(256) | center_crop(224) | normalize(imagenet)",
        None,
        Layout::Nchw,
    );
    assert_eq!((p.dtype(), p.shape()), (DType::F32, vec![3, 224, 224]));
    let p = pipeline("random_resized_crop(224, 200)", None, Layout::Nhwc);
    assert_eq!((p.dtype(), p.shape()), (DType::U8, vec![224, 200, 3]));
    assert_eq!(p.output_bytes(), 224 * 200 * 3);
}

#[test]
fn resize_shorter_follows_torchvision() {
    // torchvision: new_long = int(size * long / short)
    assert_eq!(resize_shorter(500, 375, 256), (341, 256));
    assert_eq!(resize_shorter(375, 500, 256), (256, 341));
    assert_eq!(resize_shorter(640, 480, 224), (298, 224));
    assert_eq!(resize_shorter(300, 300, 224), (224, 224));
    assert_eq!(resize_shorter(1, 1000, 224), (224, 224000));
}

#[test]
fn random_resized_crop_params_are_valid_and_follow_the_fallback() {
    let mut r = rng(0);
    for (w, h) in [
        (500, 375),
        (375, 500),
        (1, 1),
        (2, 1000),
        (1000, 2),
        (224, 224),
    ] {
        for _ in 0..500 {
            let (top, left, ch, cw) =
                random_resized_crop_params(w, h, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut r);
            assert!(
                ch >= 1 && cw >= 1 && top + ch <= h && left + cw <= w,
                "{w}x{h}"
            );
        }
    }
    // scale > 1 never fits: the central fallback, clamped to the ratio range.
    let big = (5.0, 6.0);
    let ratio = (0.75, 4.0 / 3.0);
    assert_eq!(
        random_resized_crop_params(1000, 100, big, ratio, &mut r),
        (0, 433, 100, 133)
    );
    assert_eq!(
        random_resized_crop_params(100, 1000, big, ratio, &mut r),
        (433, 0, 133, 100)
    );
    assert_eq!(
        random_resized_crop_params(120, 100, big, ratio, &mut r),
        (0, 0, 100, 120)
    );
    // Crop areas: a Monte Carlo run of torchvision's algorithm in Python (200k draws,
    // 1000x1000 image) gives a mean area of 0.478 of the image (boxes that do not fit are
    // redrawn, which favours smaller ones).
    let mut r = rng(1);
    let n = 4000;
    let mean: f64 = (0..n)
        .map(|_| {
            let (_, _, h, w) = random_resized_crop_params(1000, 1000, (0.08, 1.0), ratio, &mut r);
            (h * w) as f64 / 1e6
        })
        .sum::<f64>()
        / n as f64;
    assert!((0.465..0.49).contains(&mean), "mean crop area {mean}");
}

/// torchvision's `resized_crop` on a PIL image is `img.crop(box).resize(size, BILINEAR)`;
/// the reference was computed so by Pillow (`bench/make_fixtures.py`). Tolerance: every
/// byte within 1 level (fast_image_resize and Pillow round their fixed-point sums
/// differently), mean difference below 0.15 level. (torch is not installed for the tests;
/// torchvision's tensor path with antialias=True follows the same filter.)
#[test]
fn crop_then_resize_matches_pillow() {
    let (rgb, w, h) = decoded("photo_png.png");
    let (left, top, cw, ch) = (37, 21, 150, 125);
    let plan = Plan {
        clip: [left, top, left + cw, top + ch],
        rect: [left as f64, top as f64, cw as f64, ch as f64],
        width: 112,
        height: 96,
        flip: false,
    };
    let mut out = Vec::new();
    resample_rgb(&rgb, w, h, &plan, &mut out, &mut Resizer::new()).unwrap();
    let (max, mean) = diff(&out, &fixture("resize_crop_box.rgb"));
    assert!(max <= 1 && mean < 0.15, "max {max}, mean {mean}");
}

/// `resize(128) | center_crop(112)` fused into one resample equals resizing the whole
/// image and then cropping (Pillow reference).
#[test]
fn resize_then_center_crop_matches_pillow() {
    let (rgb, w, h) = decoded("photo_png.png");
    let p = pipeline("resize(128) | center_crop(112)", None, Layout::Nhwc);
    let mut out = vec![0u8; p.output_bytes()];
    p.apply_rgb(&rgb, w, h, &mut rng(0), &mut out).unwrap();
    let (max, mean) = diff(&out, &fixture("resize_center.rgb"));
    assert!(max <= 1 && mean < 0.15, "max {max}, mean {mean}");
}

#[test]
fn output_depends_only_on_the_key() {
    let encoded = fixture("photo_baseline.jpg");
    let p = pipeline(
        "random_resized_crop(64) | hflip | normalize(imagenet)",
        None,
        Layout::Nchw,
    );
    let run = |index| {
        let mut out = vec![0u8; p.output_bytes()];
        p.run(&encoded, &mut rng(index), &mut out).unwrap();
        out
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
    // From another thread (fresh scratch) too.
    let again = std::thread::scope(|s| s.spawn(|| run(5)).join().unwrap());
    assert_eq!(run(5), again);
}

#[test]
fn hflip_mirrors_and_layouts_agree() {
    let (rgb, w, h) = decoded("photo_progressive.jpg");
    let plain = pipeline("resize(40, 60)", None, Layout::Nhwc);
    let flipped = pipeline("resize(40, 60) | hflip(p=1)", None, Layout::Nhwc);
    let chw = pipeline("resize(40, 60) | hflip(p=1)", None, Layout::Nchw);
    let mut a = vec![0u8; plain.output_bytes()];
    let mut b = a.clone();
    let mut c = a.clone();
    plain.apply_rgb(&rgb, w, h, &mut rng(0), &mut a).unwrap();
    flipped.apply_rgb(&rgb, w, h, &mut rng(0), &mut b).unwrap();
    chw.apply_rgb(&rgb, w, h, &mut rng(0), &mut c).unwrap();
    for y in 0..40 {
        for x in 0..60 {
            for ch in 0..3 {
                let va = a[(y * 60 + x) * 3 + ch];
                assert_eq!(va, b[(y * 60 + 59 - x) * 3 + ch]);
                assert_eq!(b[(y * 60 + x) * 3 + ch], c[ch * 40 * 60 + y * 60 + x]);
            }
        }
    }
    // Crop after flip picks the mirrored box: flip | center_crop on an odd margin.
    let left_first = pipeline("center_crop(30, 55) | hflip(p=1)", None, Layout::Nhwc);
    let flip_first = pipeline("hflip(p=1) | center_crop(30, 55)", None, Layout::Nhwc);
    let small: Vec<u8> = a.clone(); // a 60x40 image
    let mut d = vec![0u8; left_first.output_bytes()];
    let mut e = d.clone();
    left_first
        .apply_rgb(&small, 60, 40, &mut rng(0), &mut d)
        .unwrap();
    flip_first
        .apply_rgb(&small, 60, 40, &mut rng(0), &mut e)
        .unwrap();
    // torchvision: center_crop rounds (60-55)/2 = 2.5 to 2; on the flipped image the box
    // starts 2 from the flipped left, i.e. 3 from the original left.
    for y in 0..30 {
        for x in 0..55 {
            let src_x = 60 - 1 - (2 + x); // flip, then crop at left 2
            let sy = 5 + y;
            for ch in 0..3 {
                assert_eq!(e[(y * 55 + x) * 3 + ch], small[(sy * 60 + src_x) * 3 + ch]);
            }
        }
    }
    assert_ne!(d, e);
}

#[test]
fn normalize_and_float_types() {
    let (rgb, w, h) = decoded("photo_444.jpg");
    let u8p = pipeline("resize(32, 48)", None, Layout::Nchw);
    let mut raw = vec![0u8; u8p.output_bytes()];
    u8p.apply_rgb(&rgb, w, h, &mut rng(0), &mut raw).unwrap();
    let n = 32 * 48;
    let spec = "resize(32, 48) | normalize(imagenet)";
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let p = pipeline(spec, Some(dtype), Layout::Nchw);
        let mut out = vec![0u8; p.output_bytes()];
        p.apply_rgb(&rgb, w, h, &mut rng(0), &mut out).unwrap();
        for (i, &x) in raw.iter().enumerate() {
            let c = i / n;
            let expected = (x as f64 / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
            let got = match dtype {
                DType::F32 => f32::from_ne_bytes(out[i * 4..i * 4 + 4].try_into().unwrap()) as f64,
                DType::F16 => half::f16::from_bits(u16::from_ne_bytes(
                    out[i * 2..i * 2 + 2].try_into().unwrap(),
                ))
                .to_f64(),
                _ => half::bf16::from_bits(u16::from_ne_bytes(
                    out[i * 2..i * 2 + 2].try_into().unwrap(),
                ))
                .to_f64(),
            };
            let tol = match dtype {
                DType::F32 => 1e-6,
                DType::F16 => 2e-3,
                _ => 2e-2,
            };
            assert!(
                (got - expected).abs() <= tol * expected.abs().max(1.0),
                "{dtype} {i}: {got} vs {expected}"
            );
        }
    }
    // float32 without normalize is scaled to [0, 1].
    let p = pipeline("resize(32, 48)", Some(DType::F32), Layout::Nchw);
    let mut out = vec![0u8; p.output_bytes()];
    p.apply_rgb(&rgb, w, h, &mut rng(0), &mut out).unwrap();
    for (i, &x) in raw.iter().enumerate() {
        let got = f32::from_ne_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(got, (x as f64 / 255.0) as f32);
    }
}

/// Float32 output is `((x / 255 - mean) / std) as f32` computed in f64, bit for bit, whichever
/// pass writes it: the affine pass (taken where it reproduces that, as for the usual constants)
/// or the table.
#[test]
fn float32_output_is_the_same_from_the_table_or_the_affine_pass() {
    // Every byte value in every channel: 16x16 pixels, resized to their own size (a copy).
    let rgb: Vec<u8> = (0..=255u8)
        .flat_map(|x| [x, x.wrapping_mul(7), 255 - x])
        .collect();
    let cases: [(&str, [f64; 3], [f64; 3], bool); 4] = [
        (
            "resize(16, 16) | normalize(imagenet)",
            IMAGENET_MEAN,
            IMAGENET_STD,
            true,
        ),
        // CLIP's constants.
        (
            "resize(16, 16) | normalize(mean=0.48145466,0.4578275,0.40821073, \
             std=0.26862954,0.26130258,0.27577711)",
            [0.48145466, 0.4578275, 0.40821073],
            [0.26862954, 0.26130258, 0.27577711],
            true,
        ),
        ("resize(16, 16)", [0.0; 3], [1.0; 3], true),
        // mean = 33/255: the table's value for 33 is exactly 0, while 33 * (1/255) - mean is
        // -2.8e-17, so the affine form does not reproduce the table and is not used.
        (
            "resize(16, 16) | normalize(mean=0.12941176470588237, std=1)",
            [33.0 / 255.0; 3],
            [1.0; 3],
            false,
        ),
    ];
    for (spec, mean, std, affine) in cases {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let p = pipeline(spec, Some(DType::F32), layout);
            assert_eq!(p.float32_affine(), affine, "{spec}");
            let mut out = vec![0u8; p.output_bytes()];
            p.apply_rgb(&rgb, 16, 16, &mut rng(0), &mut out).unwrap();
            let got: Vec<f32> = out
                .as_chunks::<4>()
                .0
                .iter()
                .map(|b| f32::from_ne_bytes(*b))
                .collect();
            for (i, px) in rgb.as_chunks::<3>().0.iter().enumerate() {
                for c in 0..3 {
                    let at = match layout {
                        Layout::Nchw => c * 256 + i,
                        Layout::Nhwc => i * 3 + c,
                    };
                    let expected = ((px[c] as f64 / 255.0 - mean[c]) / std[c]) as f32;
                    assert_eq!(
                        got[at].to_bits(),
                        expected.to_bits(),
                        "{spec} {layout:?}: pixel {i} channel {c} ({}): {} vs {expected}",
                        px[c],
                        got[at]
                    );
                }
            }
        }
    }
}

#[test]
fn identity_geometry_copies_pixels() {
    let (rgb, w, h) = decoded("photo_png.png");
    let p = pipeline("resize(188, 250)", None, Layout::Nhwc);
    let mut out = vec![0u8; p.output_bytes()];
    p.apply_rgb(&rgb, w, h, &mut rng(0), &mut out).unwrap();
    assert_eq!(out, rgb);
    // A crop without resize is a plain copy of the box.
    let p = pipeline("center_crop(100, 200)", None, Layout::Nhwc);
    let mut out = vec![0u8; p.output_bytes()];
    p.apply_rgb(&rgb, w, h, &mut rng(0), &mut out).unwrap();
    let (top, left) = (44, 25);
    for y in 0..100 {
        assert_eq!(
            &out[y * 600..(y + 1) * 600],
            &rgb[((top + y) * w + left) * 3..][..600]
        );
    }
}

#[test]
fn bad_samples_are_errors_not_panics() {
    let p = pipeline("resize(256) | center_crop(224)", None, Layout::Nchw);
    let mut out = vec![0u8; p.output_bytes()];
    for bytes in [&b""[..], b"junk", &fixture("bomb_10000x10000.png")] {
        assert!(p.run(bytes, &mut rng(0), &mut out).is_err());
    }
    let mut short = vec![0u8; 10];
    let err = p
        .run(&fixture("tiny_1x1.png"), &mut rng(0), &mut short)
        .unwrap_err();
    assert!(err.contains("output slot"), "{err}");
    // Tiny images are upscaled, never rejected.
    for name in ["tiny_1x1.png", "tiny_1x1.jpg"] {
        p.run(&fixture(name), &mut rng(0), &mut out).unwrap();
        let rrc = pipeline("random_resized_crop(224) | hflip", None, Layout::Nchw);
        rrc.run(&fixture(name), &mut rng(0), &mut out).unwrap();
    }
    // center_crop larger than the image is a clear error.
    let p = pipeline("center_crop(224)", None, Layout::Nchw);
    let err = p
        .run(&fixture("png_gray.png"), &mut rng(0), &mut out)
        .unwrap_err();
    assert!(err.contains("smaller than the crop"), "{err}");
    // max_image_pixels is honoured.
    let p = Pipeline::new(Some("resize(8,8)"), None, Layout::Nchw).unwrap();
    let mut out = vec![0u8; p.output_bytes()];
    let err =
        decode_and_apply(&p, &fixture("png_gray.png"), 100, &mut rng(0), &mut out).unwrap_err();
    assert!(err.contains("max_image_pixels=100"), "{err}");
    // The image planned before the ops after the plan is bounded as a decoded one is: the
    // transform_spec fuzz target's oom-8d13c810b2e0e4bbe280e98c0956731ec3c5b128 asked for 13 GB.
    // Refused when the pipeline is built for a known size, and per sample otherwise.
    let spec = Some("resize(56565) | random_crop(1)");
    let err = Pipeline::for_input(spec, None, Layout::Nchw, 5, 7).unwrap_err();
    assert!(
        err.contains("79191x56565") && err.contains("89478485 pixels"),
        "{err}"
    );
    let p = Pipeline::new(spec, None, Layout::Nchw).unwrap();
    let mut out = vec![0u8; p.output_bytes()];
    let err = p
        .apply_rgb(&[0; 5 * 7 * 3], 7, 5, &mut rng(0), &mut out)
        .unwrap_err();
    assert!(
        err.contains("79191x56565") && err.contains("89478485 pixels"),
        "{err}"
    );
}
