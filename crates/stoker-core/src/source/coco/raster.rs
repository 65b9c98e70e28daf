//! COCO segmentations to pixels: polygons filled, run-length encodings (RLE) expanded.
//!
//! The polygon fill is written here rather than taken from a crate: what is needed is one
//! even-odd scanline fill of float polygons into an integer label image, a few dozen lines,
//! and the rasterising crates (tiny-skia, imageproc) bring anti-aliasing, colour types and
//! their dependency trees for it. A pixel is inside when its centre `(x + 0.5, y + 0.5)` is
//! inside the polygon (even-odd rule). pycocotools rasterises through an upsampled outline
//! instead, so pixels on a polygon's edge may differ from its masks by one pixel; a polygon
//! whose edges lie on pixel boundaries (integer corners of a rectangle) gives the same pixels.

/// Most points one polygon may have.
pub const MAX_POLYGON_POINTS: usize = 1 << 16;

/// Sets `out[y * width + x] = true` for every pixel whose centre lies inside the polygon
/// `points` (`[x0, y0, x1, y1, ...]`, COCO's order), even-odd.
pub fn fill_polygon(
    points: &[f32],
    width: usize,
    height: usize,
    out: &mut [bool],
) -> Result<(), String> {
    if !points.len().is_multiple_of(2) || points.len() < 6 {
        return Err(format!(
            "a polygon is at least 3 points as [x0, y0, x1, y1, ...]; this one has {} numbers",
            points.len()
        ));
    }
    if points.len() / 2 > MAX_POLYGON_POINTS {
        return Err(format!(
            "a polygon has {} points, more than {MAX_POLYGON_POINTS}",
            points.len() / 2
        ));
    }
    if points.iter().any(|v| !v.is_finite()) {
        return Err("a polygon has a coordinate that is not a finite number".into());
    }
    let pts: Vec<(f64, f64)> = points
        .chunks_exact(2)
        .map(|p| (f64::from(p[0]), f64::from(p[1])))
        .collect();
    let mut crossings: Vec<f64> = Vec::with_capacity(pts.len());
    for y in 0..height {
        let cy = y as f64 + 0.5;
        crossings.clear();
        for i in 0..pts.len() {
            let (x0, y0) = pts[i];
            let (x1, y1) = pts[(i + 1) % pts.len()];
            // Half-open in y, so a vertex on the scanline counts once.
            if (y0 <= cy) != (y1 <= cy) {
                crossings.push(x0 + (cy - y0) / (y1 - y0) * (x1 - x0));
            }
        }
        crossings.sort_by(f64::total_cmp);
        for span in crossings.chunks_exact(2) {
            // Pixels whose centre x + 0.5 lies in [span[0], span[1]).
            let first = (span[0] - 0.5).ceil().max(0.0);
            let end = (span[1] - 0.5).ceil().min(width as f64);
            let (first, end) = (first as usize, end.max(0.0) as usize);
            if first < end {
                out[y * width + first..y * width + end].fill(true);
            }
        }
    }
    Ok(())
}

/// COCO's compressed RLE string (pycocotools' `rleToString`: each count in 5-bit groups as
/// characters from 48, the sign in the last group, counts from the fourth on as differences
/// from the one two before) to counts. At most `max_counts` counts.
pub fn rle_counts(s: &str, max_counts: usize) -> Result<Vec<u64>, String> {
    let bytes = s.as_bytes();
    let mut counts: Vec<u64> = Vec::new();
    let mut p = 0;
    while p < bytes.len() {
        if counts.len() >= max_counts {
            return Err(format!("the RLE string has more than {max_counts} runs"));
        }
        let mut x: i64 = 0;
        let mut k = 0;
        loop {
            let Some(&b) = bytes.get(p) else {
                return Err("the RLE string ends inside a count".into());
            };
            if !(48..48 + 64).contains(&b) || k >= 12 {
                return Err(format!("the RLE string is malformed at character {p}"));
            }
            let c = i64::from(b) - 48;
            x |= (c & 0x1f) << (5 * k);
            p += 1;
            k += 1;
            if c & 0x20 == 0 {
                if c & 0x10 != 0 {
                    x |= -1i64 << (5 * k);
                }
                break;
            }
        }
        if counts.len() > 2 {
            // Each count came from an i64, so it fits one; a sum of differences can overflow.
            x = x
                .checked_add(counts[counts.len() - 2] as i64)
                .ok_or_else(|| format!("the RLE string has a run over {} pixels", i64::MAX))?;
        }
        let count =
            u64::try_from(x).map_err(|_| format!("the RLE string has a negative run ({x})"))?;
        counts.push(count);
    }
    Ok(counts)
}

/// Sets the pixels an RLE covers (`counts` alternate runs of 0 and 1, column-major, from 0) in
/// `out` (row-major `height` x `width`); the runs must cover exactly the image.
pub fn fill_rle(
    counts: &[u64],
    width: usize,
    height: usize,
    out: &mut [bool],
) -> Result<(), String> {
    let total: u64 = counts
        .iter()
        .try_fold(0u64, |a, &c| a.checked_add(c))
        .unwrap_or(u64::MAX);
    if total != (width * height) as u64 {
        return Err(format!(
            "the RLE's runs cover {total} pixels, not the {width}x{height} image's {}",
            width * height
        ));
    }
    let mut at = 0usize;
    for (i, &run) in counts.iter().enumerate() {
        let run = run as usize;
        if i % 2 == 1 {
            for p in at..at + run {
                // Column-major: p = x * height + y.
                let (x, y) = (p / height, p % height);
                out[y * width + x] = true;
            }
        }
        at += run;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rectangle_fills_the_pixels_between_its_corners() {
        let (w, h) = (8, 6);
        let mut out = vec![false; w * h];
        fill_polygon(&[2.0, 1.0, 6.0, 1.0, 6.0, 4.0, 2.0, 4.0], w, h, &mut out).unwrap();
        for y in 0..h {
            for x in 0..w {
                let inside = (2..6).contains(&x) && (1..4).contains(&y);
                assert_eq!(out[y * w + x], inside, "({x}, {y})");
            }
        }
    }

    #[test]
    fn compressed_rle_matches_pycocotools() {
        // pycocotools' rleToString: counts from the fourth on are differences from the one two
        // before, so [5, 2, 5] is "525" and [5, 2, 3, 2] is "5230" (2 - 2 = 0); a negative
        // difference sets bit 0x10 of its last group: [1, 1, 9, 0] is "119" + (0 - 1 = -1: 'O').
        assert_eq!(rle_counts("525", 100).unwrap(), [5, 2, 5]);
        assert_eq!(rle_counts("5230", 100).unwrap(), [5, 2, 3, 2]);
        assert_eq!(rle_counts("119O", 100).unwrap(), [1, 1, 9, 0]);
        let mut out = vec![false; 12];
        fill_rle(&[5, 2, 5], 3, 4, &mut out).unwrap();
        let set: Vec<usize> = (0..12).filter(|&i| out[i]).collect();
        // Column 1 (x = 1), rows 1 and 2: row-major 1 * 3 + 1 = 4 and 2 * 3 + 1 = 7.
        assert_eq!(set, [4, 7]);
        assert!(rle_counts("5", 100).is_ok());
        assert!(rle_counts("\u{7f}", 100).is_err());
        assert!(fill_rle(&[5, 2], 3, 4, &mut out).is_err());
    }

    #[test]
    fn an_rle_whose_differences_add_up_past_64_bits_is_an_error() {
        // "ooooooooooo?" is 2^59 - 1, the largest difference one count can carry: counts 0, 2,
        // 4, ... grow by it, and the seventeenth of them is past i64::MAX.
        let s = "ooooooooooo?".repeat(40);
        let e = rle_counts(&s, 100).unwrap_err();
        assert!(e.contains("a run over"), "{e}");
        // Sixteen of them still fit.
        assert!(rle_counts(&"ooooooooooo?".repeat(32), 100).is_ok());
    }
}
