//! The resampling taps of a plan, for a resize that runs elsewhere (GPU decoding's kernel,
//! `cuda::resize`): fast_image_resize's bilinear coefficients as the CPU resample applies them
//! (Pillow's triangle filter, widened by the scale when shrinking), each output pixel's source
//! span and weights, computed by the worker that plans the crop.

use super::geometry::Plan;

/// The most taps an output pixel may read along one axis: a shrink of up to 31x. A plan that
/// shrinks more is decoded on the CPU, whose decoder shrinks in the DCT domain first.
pub const MAX_TAPS: usize = 64;

/// One axis of a resize: per output pixel, the first source pixel it reads and how many, and
/// `taps` weights (zero past those used).
#[derive(Clone, Debug, PartialEq)]
pub struct Taps {
    /// `[first, count]` per output pixel.
    pub spans: Vec<[u32; 2]>,
    /// `taps` per output pixel.
    pub weights: Vec<f32>,
    /// Weights per output pixel: the most any pixel uses.
    pub taps: usize,
}

/// The bilinear (triangle) filter.
fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

impl Taps {
    /// The taps that map source interval `[start, start + len)` (pixel edges) onto `out`
    /// pixels, reading only source pixels `clip.0..clip.1`: fast_image_resize's bilinear
    /// coefficients (`precompute_coefficients`), normalized in f64 and stored as f32. `None`
    /// when a pixel would need more than [`MAX_TAPS`], or the clip is empty.
    pub fn for_axis(start: f64, len: f64, out: usize, clip: (usize, usize)) -> Option<Taps> {
        let (c0, c1) = clip;
        if out == 0 || c1 <= c0 || len <= 0.0 {
            return None;
        }
        let scale = len / out as f64;
        let filter_scale = scale.max(1.0);
        let radius = filter_scale; // the triangle's support is 1
        let taps = radius.ceil() as usize * 2 + 1;
        if taps > MAX_TAPS {
            return None;
        }
        let mut spans = Vec::with_capacity(out);
        let mut weights = vec![0f32; out * taps];
        let mut row = Vec::with_capacity(taps);
        for o in 0..out {
            let in_center = start + (o as f64 + 0.5) * scale;
            let lo = ((in_center - radius).floor().max(c0 as f64) as usize).min(c1 - 1);
            let hi = ((in_center + radius).ceil().min(c1 as f64) as usize).max(lo + 1);
            let center = in_center - 0.5;
            row.clear();
            let mut first = lo;
            for x in lo..hi {
                let w = triangle((x as f64 - center) / filter_scale);
                // Zero weights at either end are not taps (as fast_image_resize trims them).
                if row.is_empty() && w == 0.0 && x + 1 < hi {
                    first = x + 1;
                    continue;
                }
                row.push(w);
            }
            while row.len() > 1 && row.last() == Some(&0.0) {
                row.pop();
            }
            let sum: f64 = row.iter().sum();
            if row.len() > taps {
                return None;
            }
            for (k, w) in row.iter().enumerate() {
                // An interval falling between pixel centres outside the clip weighs its nearest
                // pixel wholly.
                weights[o * taps + k] = if sum > 0.0 { (w / sum) as f32 } else { 1.0 };
            }
            spans.push([first as u32, row.len() as u32]);
        }
        Some(Taps {
            spans,
            weights,
            taps,
        })
    }

    /// The bytes the kernel reads: the spans (`u32` pairs), then the weights (`f32`), native
    /// endian.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        for span in &self.spans {
            out.extend(span.iter().flat_map(|v| v.to_ne_bytes()));
        }
        out.extend(self.weights.iter().flat_map(|w| w.to_ne_bytes()));
    }

    /// Bytes [`write_to`](Self::write_to) appends.
    pub fn bytes(&self) -> usize {
        self.spans.len() * 8 + self.weights.len() * 4
    }
}

/// A plan's taps along both axes, for an image decoded whole (`None`: the plan cannot be
/// resampled on the device, see [`Taps::for_axis`]).
pub fn plan_taps(plan: &Plan) -> Option<(Taps, Taps)> {
    let [left, top, w, h] = plan.rect;
    let [x0, y0, x1, y1] = plan.clip;
    let x = Taps::for_axis(left, w, plan.width, (x0, x1))?;
    let y = Taps::for_axis(top, h, plan.height, (y0, y1))?;
    Some((x, y))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taps_of_an_identity_copy_are_one_pixel_each_weighing_one() {
        let t = Taps::for_axis(3.0, 4.0, 4, (0, 10)).unwrap();
        let firsts: Vec<u32> = t.spans.iter().map(|s| s[0]).collect();
        assert_eq!(firsts, [3, 4, 5, 6]);
        for (o, s) in t.spans.iter().enumerate() {
            assert_eq!(s[1], 1, "{s:?}");
            assert_eq!(t.weights[o * t.taps], 1.0);
        }
    }

    #[test]
    fn shrinking_by_two_averages_pixel_pairs_and_weights_sum_to_one() {
        let t = Taps::for_axis(0.0, 8.0, 4, (0, 8)).unwrap();
        for (o, s) in t.spans.iter().enumerate() {
            let w = &t.weights[o * t.taps..][..t.taps];
            let sum: f32 = w.iter().sum();
            assert!((sum - 1.0).abs() < 1e-6, "{sum}");
            assert!(s[0] as usize + s[1] as usize <= 8);
        }
        // The clip is honoured at both ends.
        assert_eq!(t.spans[0][0], 0);
        let clipped = Taps::for_axis(2.0, 4.0, 2, (2, 6)).unwrap();
        for s in &clipped.spans {
            assert!(s[0] >= 2 && s[0] + s[1] <= 6, "{s:?}");
        }
    }

    #[test]
    fn a_shrink_past_the_tap_limit_is_refused() {
        assert!(Taps::for_axis(0.0, 4000.0, 10, (0, 4000)).is_none());
        assert!(Taps::for_axis(0.0, 300.0, 10, (0, 300)).is_some());
    }
}
