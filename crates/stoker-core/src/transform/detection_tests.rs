//! Tests of `scale_jitter`: its drawn sizes against torchvision's `ScaleJitter` rule, the
//! `max_size` cap, and the pipelines' refusal of a size left varying.

use super::*;
use crate::dtype::Layout;
use crate::rng::{Rng, Stream};

fn rng(index: u64) -> Rng {
    Rng::for_key(11, Stream::Augment, 2, index)
}

#[test]
fn scale_jitter_sizes_lie_in_the_drawn_range_and_keep_the_aspect_ratio() {
    // 400x300 to a 100x200 (HxW) target: base = min(100/300, 200/400) = 1/3.
    let ops = parse("scale_jitter(100, 200, scale=0.5:1.5)").unwrap();
    let (mut lo, mut hi) = (f64::MAX, 0.0f64);
    for index in 0..200 {
        let plan = geometry::plan(&ops, 400, 300, &mut rng(index)).unwrap();
        let (w, h) = (plan.width, plan.height);
        // int(400 * r) with r in [1/6, 1/2]; the height follows the same r.
        assert!((66..=200).contains(&w), "{index}: {w}x{h}");
        let r = w as f64 / 400.0;
        assert!((h as f64 - 300.0 * r).abs() <= 1.0, "{index}: {w}x{h}");
        // The whole image is resampled: the source rectangle is the image.
        for (got, want) in plan.rect.iter().zip([0.0, 0.0, 400.0, 300.0]) {
            assert!((got - want).abs() < 1e-9, "{:?}", plan.rect);
        }
        (lo, hi) = (lo.min(r), hi.max(r));
    }
    // The draws cover the range.
    assert!(lo < 0.2 && hi > 0.45, "{lo} {hi}");
}

#[test]
fn scale_jitter_floors_each_side_as_torchvision_does_and_max_size_caps_the_longer() {
    let mut r = rng(0);
    // scale=1:1: r = min(64/48, 64/64) = 1, so 64x48 stays.
    assert_eq!(
        geometry::scale_jitter_size(64, 48, (64, 64), (1.0, 1.0), None, &mut r),
        (64, 48)
    );
    // r = 2/3 * 1 on 100x75: int(66.67) = 66, int(50.0) = 50.
    assert_eq!(
        geometry::scale_jitter_size(100, 75, (50, 200), (1.0, 1.0), None, &mut r),
        (66, 50)
    );
    // Resize(max_size=M): the longer side becomes M, the shorter int(M * short / long).
    assert_eq!(
        geometry::scale_jitter_size(640, 480, (1024, 1024), (2.0, 2.0), Some(1333), &mut r),
        (1333, 999)
    );
    assert_eq!(
        geometry::scale_jitter_size(480, 640, (1024, 1024), (2.0, 2.0), Some(1333), &mut r),
        (999, 1333)
    );
    // Under the cap nothing changes.
    assert_eq!(
        geometry::scale_jitter_size(640, 480, (240, 320), (1.0, 1.0), Some(1333), &mut r),
        (320, 240)
    );
    // A tiny factor still leaves a pixel.
    assert_eq!(
        geometry::scale_jitter_size(640, 480, (1, 1), (0.1, 0.1), None, &mut r),
        (1, 1)
    );
}

#[test]
fn scale_jitter_is_deterministic_per_key_and_draws_differ_between_samples() {
    let ops = parse("scale_jitter(256) | hflip").unwrap();
    let a = geometry::plan(&ops, 500, 375, &mut rng(3)).unwrap();
    let b = geometry::plan(&ops, 500, 375, &mut rng(3)).unwrap();
    assert_eq!(a, b);
    let sizes: std::collections::HashSet<usize> = (0..20)
        .map(|i| geometry::plan(&ops, 500, 375, &mut rng(i)).unwrap().width)
        .collect();
    assert!(sizes.len() > 10, "{sizes:?}");
}

#[test]
fn scale_jitter_arguments_are_checked_with_the_op_and_the_value_named() {
    assert_eq!(
        parse("scale_jitter(1024)").unwrap(),
        vec![Op::ScaleJitter {
            height: 1024,
            width: 1024,
            scale: (0.1, 2.0),
            max_size: None,
        }]
    );
    assert_eq!(
        parse("scale_jitter(512, 640, scale=0.5:1.5, max_size=1333)").unwrap(),
        vec![Op::ScaleJitter {
            height: 512,
            width: 640,
            scale: (0.5, 1.5),
            max_size: Some(1333),
        }]
    );
    for (spec, want) in [
        ("scale_jitter", "expected a size"),
        ("scale_jitter(0)", "`0` is not a size"),
        (
            "scale_jitter(64, scale=2:1)",
            "scale `2:1` needs 0 < a <= b",
        ),
        (
            "scale_jitter(64, max_size=big)",
            "max_size: `big` is not a size",
        ),
        ("scale_jitter(64, ratio=1:2)", "unknown argument `ratio`"),
    ] {
        let e = parse(spec).unwrap_err();
        assert!(
            e.contains("scale_jitter") && e.contains(want),
            "{spec}: {e}"
        );
    }
}

#[test]
fn a_size_scale_jitter_leaves_varying_is_refused_until_a_later_op_fixes_it() {
    for spec in [
        "scale_jitter(224)",
        "resize(256, 256) | scale_jitter(224) | hflip",
    ] {
        let e = Pipeline::new(Some(spec), None, Layout::Nchw).unwrap_err();
        assert!(
            e.contains("scale_jitter draws each sample's size") && e.contains("after it"),
            "{spec}: {e}"
        );
        let e = Pipeline::for_input(Some(spec), None, Layout::Nchw, 64, 64).unwrap_err();
        assert!(e.contains("scale_jitter draws"), "{spec}: {e}");
    }
    let e = Pipeline::new(Some("scale_jitter(224) | grayscale"), None, Layout::Nchw).unwrap_err();
    assert!(
        e.contains("grayscale: needs a fixed size") && e.contains("scale_jitter"),
        "{e}"
    );
    let e = Pipeline::new(
        Some("random_crop(32) | scale_jitter(224) | center_crop(32)"),
        None,
        Layout::Nchw,
    )
    .unwrap_err();
    assert!(
        e.contains("scale_jitter: must come before random_crop"),
        "{e}"
    );
    for (spec, size) in [
        ("scale_jitter(224) | center_crop(200)", (200, 200)),
        (
            "scale_jitter(224, 300) | random_crop(200, padding=100) | hflip",
            (200, 200),
        ),
        ("scale_jitter(224) | resize(224, 300)", (224, 300)),
        ("scale_jitter(224) | random_resized_crop(96)", (96, 96)),
    ] {
        let p = Pipeline::new(Some(spec), None, Layout::Nchw).unwrap();
        assert_eq!(p.output_size(), size, "{spec}");
    }
}

#[test]
fn an_image_scale_jitter_left_too_small_for_the_crop_fails_that_sample_only() {
    // An input that jitters to 16..64 pixels: a 32-pixel centre crop fits some draws, not all,
    // so the pipeline is built and each sample that comes out too small says so.
    let p = Pipeline::for_input(
        Some("scale_jitter(32, scale=0.5:2) | center_crop(32)"),
        None,
        Layout::Nchw,
        48,
        48,
    )
    .unwrap();
    let rgb = vec![7u8; 48 * 48 * 3];
    let mut out = vec![0u8; p.output_bytes()];
    let (mut ok, mut small) = (0, 0);
    for index in 0..40 {
        match p.apply_rgb(&rgb, 48, 48, &mut rng(index), &mut out) {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(e.contains("smaller than the crop"), "{e}");
                small += 1;
            }
        }
    }
    assert!(ok > 0 && small > 0, "{ok} {small}");
}
