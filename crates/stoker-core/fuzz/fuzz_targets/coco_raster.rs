//! COCO segmentations as `coco_masks:` draws them (`source::coco::raster`, hand-written): a
//! compressed RLE string decoded and expanded, plain runs expanded, a polygon filled, on an
//! image of up to 255x255. The first two bytes are the width and height, the third picks the
//! kind, the rest is the segmentation. Must return `Ok` or `Err`, never panic; an RLE that is
//! accepted sets exactly its runs of ones.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_core::source::coco::raster::{fill_polygon, fill_rle, rle_counts};

fuzz_target!(|data: &[u8]| {
    let [w, h, kind, rest @ ..] = data else {
        return;
    };
    let (w, h) = (usize::from(*w), usize::from(*h));
    let mut out = vec![false; w * h];
    match kind % 3 {
        // pycocotools' string form, whose counts can be any size.
        0 => {
            let Ok(s) = std::str::from_utf8(rest) else {
                return;
            };
            if let Ok(counts) = rle_counts(s, 1 << 12) {
                check_rle(&counts, w, h, &mut out);
            }
        }
        // Runs as JSON lists them, little-endian u16 here so that they can add up to the image.
        1 => {
            let counts: Vec<u64> = rest
                .chunks_exact(2)
                .map(|c| u64::from(u16::from_le_bytes([c[0], c[1]])))
                .collect();
            check_rle(&counts, w, h, &mut out);
        }
        // [x0, y0, x1, y1, ...] as little-endian f32.
        _ => {
            let points: Vec<f32> = rest
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let _ = fill_polygon(&points, w, h, &mut out);
        }
    }
});

fn check_rle(counts: &[u64], w: usize, h: usize, out: &mut [bool]) {
    if fill_rle(counts, w, h, out).is_ok() {
        let ones: u64 = counts.iter().skip(1).step_by(2).sum();
        let set = out.iter().filter(|&&p| p).count() as u64;
        assert_eq!(set, ones, "the pixels set are the runs of ones");
    }
}
