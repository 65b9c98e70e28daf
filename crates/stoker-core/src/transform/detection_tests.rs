//! Tests of the detection ops: `scale_jitter`'s drawn sizes against torchvision's `ScaleJitter`
//! rule and the `max_size` cap, `random_shortest_size`'s (`RandomShortestSize`), `random_zoom_out`'s canvas and offset (`RandomZoomOut`), and the
//! pipelines' refusal of a size either leaves varying.

use super::*;
use crate::dtype::Layout;
use crate::rng::{Rng, Stream};

fn rng(index: u64) -> Rng {
    Rng::for_key(11, Stream::Augment, 2, index)
}

/// Why `Pipeline::new` refuses `spec`.
fn refused(spec: &str) -> String {
    Pipeline::new(Some(spec), None, Layout::Nchw).unwrap_err()
}

/// Each spec of `cases` is refused by the parser, naming `op` and saying what the case wants.
fn parse_refuses(op: &str, cases: &[(&str, &str)]) {
    for (spec, want) in cases {
        let e = parse(spec).unwrap_err();
        assert!(e.contains(op) && e.contains(want), "{spec}: {e}");
    }
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
fn random_shortest_size_follows_torchvision_and_draws_every_size() {
    let mut r = rng(0);
    // 640x480 to a shorter side of 800: r = 800/480, under 1333/640; int(1066.67) = 1066.
    assert_eq!(
        geometry::shortest_size(640, 480, &[800], Some(1333), &mut r),
        (1066, 800)
    );
    // The cap wins: r = min(800/480, 1000/640) = 1.5625, either orientation.
    assert_eq!(
        geometry::shortest_size(640, 480, &[800], Some(1000), &mut r),
        (1000, 750)
    );
    assert_eq!(
        geometry::shortest_size(480, 640, &[800], Some(1000), &mut r),
        (750, 1000)
    );
    // Each candidate is drawn, about equally often, the same for the same key.
    let ops = parse("random_shortest_size(480, 512, 544) | center_crop(400)").unwrap();
    let mut counts = std::collections::HashMap::new();
    for index in 0..300 {
        let plan = geometry::plan(&ops[..1], 640, 480, &mut rng(index)).unwrap();
        assert_eq!(
            plan,
            geometry::plan(&ops[..1], 640, 480, &mut rng(index)).unwrap()
        );
        *counts.entry(plan.height).or_insert(0) += 1;
    }
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(counts.values().all(|&n| n > 70), "{counts:?}");
    assert_eq!(
        parse("random_shortest_size(480, 800, max_size=1333)").unwrap(),
        vec![Op::RandomShortestSize {
            sizes: vec![480, 800],
            max_size: Some(1333),
        }]
    );
    parse_refuses(
        "random_shortest_size",
        &[
            ("random_shortest_size", "needs the shorter side's sizes"),
            ("random_shortest_size(480, 0)", "`0` is not a size"),
            (
                "random_shortest_size(480, max_size=x)",
                "max_size: `x` is not a size",
            ),
        ],
    );
    let e = refused("random_shortest_size(480) | hflip");
    assert!(
        e.contains("random_shortest_size draws each sample's size"),
        "{e}"
    );
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
    parse_refuses(
        "scale_jitter",
        &[
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
        ],
    );
}

#[test]
fn a_size_scale_jitter_leaves_varying_is_refused_until_a_later_op_fixes_it() {
    for spec in [
        "scale_jitter(224)",
        "resize(256, 256) | scale_jitter(224) | hflip",
    ] {
        let e = refused(spec);
        assert!(
            e.contains("scale_jitter draws each sample's size") && e.contains("after it"),
            "{spec}: {e}"
        );
        let e = Pipeline::for_input(Some(spec), None, Layout::Nchw, 64, 64).unwrap_err();
        assert!(e.contains("scale_jitter draws"), "{spec}: {e}");
    }
    let e = refused("scale_jitter(224) | grayscale");
    assert!(
        e.contains("grayscale: needs a fixed size") && e.contains("scale_jitter"),
        "{e}"
    );
    let e = refused("random_crop(32) | scale_jitter(224) | center_crop(32)");
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

#[test]
fn random_zoom_out_draws_a_canvas_in_side_range_and_an_offset_inside_it() {
    let op = parse("random_zoom_out(side_range=1.5:3, fill=9)")
        .unwrap()
        .remove(0);
    let (mut applied, mut lo, mut hi) = (0, usize::MAX, 0);
    for index in 0..300 {
        match augment::draw(&op, 30, 20, &mut rng(index), &mut None).unwrap() {
            augment::Drawn::Crop {
                top,
                left,
                width,
                height,
                pad,
                mode,
                fill,
            } => {
                applied += 1;
                // The whole canvas is the window; the image sits at the padding's offset.
                assert_eq!((top, left, mode, fill), (0, 0, PadMode::Constant, [9.0; 3]));
                assert!((45..=90).contains(&width), "{index}: {width}x{height}");
                let r = width as f64 / 30.0;
                assert!((height as f64 - 20.0 * r).abs() <= 1.0, "{width}x{height}");
                assert!(
                    pad.0 <= width - 30 && pad.1 <= height - 20,
                    "{pad:?} {width}x{height}"
                );
                (lo, hi) = (lo.min(width), hi.max(width));
            }
            augment::Drawn::Nothing => {}
            other => panic!("{other:?}"),
        }
    }
    // p = 0.5 by default, and the canvases cover the range.
    assert!((100..=200).contains(&applied), "{applied}");
    assert!(lo < 50 && hi > 85, "{lo} {hi}");
}

#[test]
fn random_zoom_out_places_the_image_on_a_filled_canvas() {
    // A 20x10 image of value 200 zoomed out onto fill 9 at twice its size, then the canvas
    // kept whole by a centre crop of its own size.
    let p = Pipeline::for_input(
        Some("random_zoom_out(fill=9, side_range=2:2, p=1) | center_crop(20, 40)"),
        None,
        Layout::Nhwc,
        10,
        20,
    )
    .unwrap();
    let rgb = vec![200u8; 20 * 10 * 3];
    let mut out = vec![0u8; p.output_bytes()];
    for index in 0..10 {
        let mut trace = Vec::new();
        p.apply_traced(
            &rgb,
            20,
            10,
            &mut rng(index),
            &mut out,
            &mut Scratch::default(),
            Some(&mut trace),
        )
        .unwrap();
        let drawn = &trace[1];
        let field = |k: &str| -> usize {
            let at = drawn.find(&format!("\"{k}\":")).unwrap() + k.len() + 3;
            drawn[at..]
                .split([',', '}'])
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let (left, top) = (field("left"), field("top"));
        assert_eq!((field("width"), field("height")), (40, 20), "{drawn}");
        for y in 0..20 {
            for x in 0..40 {
                let inside = (left..left + 20).contains(&x) && (top..top + 10).contains(&y);
                let want = if inside { 200 } else { 9 };
                assert_eq!(out[(y * 40 + x) * 3], want, "{drawn}: ({x}, {y})");
            }
        }
    }
}

#[test]
fn random_zoom_out_arguments_and_placement_are_checked() {
    assert_eq!(
        parse("random_zoom_out").unwrap(),
        vec![Op::RandomZoomOut {
            fill: [0.0; 3],
            side_range: (1.0, 4.0),
            p: 0.5,
        }]
    );
    parse_refuses(
        "random_zoom_out",
        &[
            (
                "random_zoom_out(side_range=0.5:2)",
                "side_range=0.5:2 must lie within 1:10",
            ),
            ("random_zoom_out(side_range=1:11)", "must lie within 1:10"),
            ("random_zoom_out(p=2)", "p=2 is not a probability"),
            ("random_zoom_out(fill=inf)", "`inf` is not a finite number"),
            ("random_zoom_out(2)", "positional"),
        ],
    );
    let e = refused("random_zoom_out(fill=300) | center_crop(8)");
    assert!(
        e.contains("random_zoom_out: fill 300 is not a uint8 value"),
        "{e}"
    );
    let e =
        Pipeline::for_input(Some("random_zoom_out | hflip"), None, Layout::Nchw, 8, 8).unwrap_err();
    // Only crops can follow a zoom-out (it runs after the resample), and the message says so.
    assert!(
        e.contains("random_zoom_out draws each sample's size")
            && e.contains("center_crop(S) or random_crop(S)")
            && !e.contains("resize"),
        "{e}"
    );
    let e = refused("random_zoom_out | resize(64, 64)");
    assert!(
        e.contains("resize: must come before random_zoom_out"),
        "{e}"
    );
}
