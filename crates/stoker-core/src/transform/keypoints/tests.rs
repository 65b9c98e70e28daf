use super::*;
use crate::rng::Stream;
use crate::transform::boxes::BoxPipeline;
use crate::transform::roles::BoxFormat;

const H: usize = 48;
const W: usize = 64;

fn rng(i: u64) -> Rng {
    Rng::for_key(3, Stream::Augment, 1, i)
}

/// `points` (rows of `columns`) through `spec` with draw `index`.
fn moved(spec: &str, points: &[f32], columns: usize, index: u64) -> Vec<f32> {
    let p = KeypointPipeline::new(spec, W, H).unwrap();
    let mut out = points.to_vec();
    p.apply(&mut out, columns, None, &mut rng(index)).unwrap();
    out
}

fn close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((f64::from(*g) - w).abs() < 1e-4, "{got:?} vs {want:?}");
    }
}

#[test]
fn each_op_moves_points_as_torchvisions_keypoint_kernels() {
    let pts = [10.0, 5.0, 63.0, 47.0, 0.0, 0.0];
    // Mirror about the last pixel: w - 1 - x (h - 1 - y).
    close(
        &moved("hflip(p=1)", &pts, 2, 0),
        &[53.0, 5.0, 0.0, 47.0, 63.0, 0.0],
    );
    close(
        &moved("vflip(p=1)", &pts, 2, 0),
        &[10.0, 42.0, 63.0, 0.0, 0.0, 47.0],
    );
    // A resize multiplies by the ratio of the sizes.
    close(
        &moved("resize(24, 16)", &pts, 2, 0),
        &[2.5, 2.5, 15.75, 23.5, 0.0, 0.0],
    );
    // A centre crop of 20x40 at (left 22, top 4) subtracts its corner; nothing is clamped.
    close(
        &moved("center_crop(40, 20)", &pts, 2, 0),
        &[-12.0, 1.0, 41.0, 43.0, -22.0, -4.0],
    );
    // The order of a flip and a resize is kept (folded, the image's pixels cannot tell).
    close(
        &moved("hflip(p=1) | resize(24, 32)", &pts[..2], 2, 0),
        &[26.5, 2.5],
    );
    close(
        &moved("resize(24, 32) | hflip(p=1)", &pts[..2], 2, 0),
        &[26.0, 2.5],
    );
    // A quarter turn of a 40x40 image about its centre (20, 20): (x, y) to (y, 40 - x).
    close(
        &moved("center_crop(40) | rotate(90:90)", &[22.0, 14.0], 2, 0),
        &[10.0, 30.0],
    );
}

#[test]
fn a_point_that_leaves_the_image_gets_visibility_zero_and_no_point_is_dropped() {
    // center_crop(20) of 64x48 is at (left 22, top 14).
    let pts = [
        30.0, 20.0, 2.0, // inside: keeps its visibility
        10.0, 20.0, 1.0, // left of the crop
        30.0, 20.0, 0.0, // inside but invisible: stays invisible
        41.9, 33.9, 2.0, // inside, near the far edge
        42.0, 20.0, 2.0, // x = 20 after the crop: outside [0, 20)
    ];
    let got = moved("center_crop(20)", &pts, 3, 0);
    close(
        &got,
        &[
            8.0, 6.0, 2.0, -12.0, 6.0, 0.0, 8.0, 6.0, 0.0, 19.9, 19.9, 2.0, 20.0, 6.0, 0.0,
        ],
    );
    // Out of the canvas once is out for good: cropped away, then brought back by a rotation
    // (a half turn sends the far corner's neighbourhood back in).
    let got = moved("center_crop(40) | rotate(180:180)", &[11.0, 4.0, 2.0], 3, 0);
    close(&got, &[41.0, 40.0, 0.0]);
    let got = moved("center_crop(40) | rotate(180:180)", &[13.0, 5.0, 2.0], 3, 0);
    close(&got, &[39.0, 39.0, 2.0]);
    // Rows of 2 carry no visibility: the point simply leaves.
    assert_eq!(
        moved("center_crop(20)", &[10.0, 20.0], 2, 0),
        vec![-12.0, 6.0]
    );
}

#[test]
fn keypoints_take_the_draws_the_boxes_take() {
    // Ops that only shift: a box's top-left corner and a point there move alike while the box
    // stays inside (boxes are clamped, points are not), under every random draw.
    let spec = "scale_jitter(48, 64, scale=1:1) | random_zoom_out(side_range=1:2, p=0.8) \
                | random_crop(40, 50, padding=4) | center_crop(36, 44)";
    let boxes = BoxPipeline::new(spec, W, H, BoxFormat::Xyxy).unwrap();
    let corners = [[20.0f32, 16.0, 24.0, 20.0], [30.0, 22.0, 33.0, 25.0]];
    let mut compared = 0;
    for index in 0..80 {
        let (kept, idx) = boxes.apply(&corners, &mut rng(index)).unwrap();
        let pts = moved(spec, &[20.0, 16.0, 30.0, 22.0], 2, index);
        for (b, &i) in kept.iter().zip(&idx) {
            let size = (b[2] - b[0], b[3] - b[1]);
            let whole = (corners[i][2] - corners[i][0], corners[i][3] - corners[i][1]);
            if size == whole {
                assert_eq!((pts[2 * i], pts[2 * i + 1]), (b[0], b[1]), "draw {index}");
                compared += 1;
            }
        }
    }
    assert!(compared > 80, "{compared}");
}

#[test]
fn refusals_say_what_is_wrong() {
    let e = KeypointPipeline::new("rand_augment", W, H).unwrap_err();
    assert!(e.contains("not supported with keypoints"), "{e}");
    let p = KeypointPipeline::new("hflip", W, H).unwrap();
    let e = p.apply(&mut [1.0; 4], 4, None, &mut rng(0)).unwrap_err();
    assert!(e.contains("rows of 2"), "{e}");
    let e = p.apply(&mut [1.0; 5], 2, None, &mut rng(0)).unwrap_err();
    assert!(e.contains("5 values"), "{e}");
}
