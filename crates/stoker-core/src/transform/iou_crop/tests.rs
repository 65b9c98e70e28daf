use super::*;
use crate::rng::Stream;
use crate::transform::boxes::BoxPipeline;
use crate::transform::geometry::{plan_with, Step};
use crate::transform::roles::BoxFormat;
use crate::transform::spec::{parse as parse_spec, Op};

const W: usize = 64;
const H: usize = 48;

fn rng(i: u64) -> Rng {
    Rng::for_key(7, Stream::Augment, 0, i)
}

fn defaults() -> IouCrop {
    match parse_spec("random_iou_crop").unwrap().remove(0) {
        Op::RandomIouCrop(c) => c,
        other => panic!("{other:?}"),
    }
}

/// A few boxes per sample, some large, some small, anywhere in the image.
fn boxes(i: u64) -> Vec<[f64; 4]> {
    let mut r = Rng::for_key(1, Stream::Augment, 9, i);
    (0..1 + i % 4)
        .map(|_| {
            let (x, y) = (r.uniform(0.0, 50.0), r.uniform(0.0, 36.0));
            let (w, h) = (r.uniform(2.0, 40.0), r.uniform(2.0, 30.0));
            [x, y, (x + w).min(W as f64), (y + h).min(H as f64)]
        })
        .collect()
}

#[test]
fn a_drawn_crop_holds_a_box_centre_with_the_rounds_minimum_iou() {
    let crop = defaults();
    assert_eq!(crop.scale, (0.3, 1.0));
    assert_eq!(crop.ratio, (0.5, 2.0));
    assert_eq!(crop.options, DEFAULT_OPTIONS.to_vec());
    assert_eq!(crop.trials, 40);
    let (mut cropped, mut left_as_is) = (0, 0);
    let mut strict = 0;
    for i in 0..300 {
        let b = boxes(i);
        let Some(d) = draw(&crop, W, H, &b, &mut rng(i)) else {
            left_as_is += 1;
            continue;
        };
        cropped += 1;
        let (left, top, w, h) = d.rect;
        assert!(left + w <= W && top + h <= H, "{d:?}");
        assert!(w >= (W as f64 * 0.3) as usize && h >= (H as f64 * 0.3) as usize);
        let aspect = w as f64 / h as f64;
        assert!((0.5..=2.0).contains(&aspect), "{d:?}");
        assert!(d.min_iou < 1.0 && crop.options.contains(&d.min_iou));
        let rect = [left as f64, top as f64, (left + w) as f64, (top + h) as f64];
        let mut best: f64 = -1.0;
        for (bx, &inside) in b.iter().zip(&d.within) {
            let (cx, cy) = ((bx[0] + bx[2]) / 2.0, (bx[1] + bx[3]) / 2.0);
            assert_eq!(
                inside,
                rect[0] < cx && cx < rect[2] && rect[1] < cy && cy < rect[3]
            );
            if inside {
                best = best.max(iou(*bx, rect));
            }
        }
        assert!(best >= d.min_iou, "{d:?}: best IoU {best}");
        strict += usize::from(d.min_iou >= 0.5);
        // The same key draws the same crop.
        assert_eq!(draw(&crop, W, H, &b, &mut rng(i)), Some(d));
    }
    // About one round in seven draws the leave-as-is option; the rest crop.
    assert!(cropped > 150 && left_as_is > 10, "{cropped} {left_as_is}");
    assert!(strict > 10, "{strict}");
    assert_eq!(
        draw(&crop, W, H, &[], &mut rng(0)),
        None,
        "no boxes, no crop"
    );
}

#[test]
fn iou_is_intersection_over_union() {
    assert_eq!(iou([0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0]), 2.0 / 6.0);
    assert_eq!(iou([0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 2.0, 2.0]), 1.0);
    assert_eq!(iou([0.0, 0.0, 1.0, 1.0], [2.0, 2.0, 3.0, 3.0]), 0.0);
    assert_eq!(iou([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]), 0.0);
}

#[test]
fn boxes_whose_centre_the_crop_leaves_out_are_dropped_the_rest_moved() {
    let spec = "random_iou_crop | resize(32, 32)";
    let p = BoxPipeline::new(spec, W, H, BoxFormat::Xyxy).unwrap();
    let ops = parse_spec(spec).unwrap();
    let (mut dropped, mut kept_some) = (0, 0);
    for i in 0..60 {
        let b = boxes(i);
        let mut within = None;
        let mut crop = None;
        plan_with(&ops, W, H, &mut rng(i), Some(&b), &mut |s| match s {
            Step::Within(w) => within = Some(w.to_vec()),
            Step::Crop {
                left,
                top,
                width,
                height,
            } => crop = Some((left, top, width, height)),
            _ => {}
        })
        .unwrap();
        let stored: Vec<[f32; 4]> = b.iter().map(|x| x.map(|v| v as f32)).collect();
        let (kept, idx) = p.apply(&stored, &mut rng(i)).unwrap();
        let Some(((left, top, w, h), within)) = crop.zip(within) else {
            // Left as is: only the resize; every box of a pixel or more at 32x32 is kept.
            assert_eq!(idx.len(), b.len(), "{i}");
            continue;
        };
        for (k, &j) in idx.iter().enumerate() {
            assert!(
                within[j],
                "{i}: box {j} kept with its centre outside the crop"
            );
            // Moved by the crop and the resize, clamped: torchvision's crop + resize.
            let (kx, ky) = (32.0 / w as f64, 32.0 / h as f64);
            let want = [
                ((b[j][0] - left as f64) * kx).clamp(0.0, 32.0),
                ((b[j][1] - top as f64) * ky).clamp(0.0, 32.0),
                ((b[j][2] - left as f64) * kx).clamp(0.0, 32.0),
                ((b[j][3] - top as f64) * ky).clamp(0.0, 32.0),
            ];
            for c in 0..4 {
                assert!(
                    (f64::from(kept[k][c]) - want[c]).abs() < 1e-3,
                    "{i}: {kept:?} {want:?}"
                );
            }
        }
        dropped += within.iter().filter(|&&w| !w).count();
        kept_some += usize::from(!idx.is_empty());
    }
    assert!(dropped > 0 && kept_some > 40, "{dropped} {kept_some}");
}

#[test]
fn arguments_are_checked_in_words() {
    let crop =
        match parse_spec("random_iou_crop(scale=0.5:0.9, ratio=1/2:1, options=0.3,1, trials=5)")
            .unwrap()
            .remove(0)
        {
            Op::RandomIouCrop(c) => c,
            other => panic!("{other:?}"),
        };
    assert_eq!(
        crop,
        IouCrop {
            scale: (0.5, 0.9),
            ratio: (0.5, 1.0),
            options: vec![0.3, 1.0],
            trials: 5
        }
    );
    for (spec, needle) in [
        ("random_iou_crop(scale=0.3:1.5)", "at most the image's"),
        ("random_iou_crop(options=0.5,-1)", "not an IoU"),
        ("random_iou_crop(trials=0)", "not a count"),
        ("random_iou_crop(ratio=2:1)", "0 < a <= b"),
        (
            "random_iou_crop(min_scale=0.3)",
            "unknown argument `min_scale`",
        ),
    ] {
        let e = parse_spec(spec).unwrap_err();
        assert!(e.contains(needle), "{spec}: {e}");
    }
    // Without the sample's boxes there is nothing to draw the crop from.
    let e = plan_with(
        &parse_spec("random_iou_crop").unwrap(),
        W,
        H,
        &mut rng(0),
        None,
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.contains("fields(image=NAME, boxes=NAME"), "{e}");
}
