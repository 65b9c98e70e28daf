//! The resize of GPU decoding (`jpeg_decoder=gpu`/`auto`): a JPEG decoded on the device becomes
//! its sample's uint8 slot there, as the CPU path's plan says (source rectangle, clip, flip).
//!
//! The worker plans the crop from the header, as for a CPU decode, and computes the resampling
//! taps ([`Taps::for_axis`], in `transform`): the bilinear filter fast_image_resize applies on the CPU
//! (Pillow's, widened by the scale when shrinking), each output pixel's source span and
//! weights. The taps cross with the batch, so the kernel only multiplies and adds, and its
//! output is the reference's ([`run_on_host`]) bit for bit: the horizontal pass is rounded to
//! uint8 before the vertical one (as the CPU's two passes are), sums are fused multiply-adds
//! in `f32` in tap order, and a value `v` is stored as `floor(v + 0.5)` clamped to 0..=255. What
//! remains from the CPU path is the decoder's IDCT and the CPU's fixed-point weights: a few
//! levels.
//!
//! The kernel is `kernels/resize.cu`, compiled to PTX as the cast kernels are
//! ([`super::cast::CAST_PTX`] says why PTX) and embedded ([`RESIZE_PTX`]).

use super::device::ResizeJob;
use crate::transform::Taps;

/// The resize kernel as PTX, made from `kernels/resize.cu` by `kernels/make_ptx.py`,
/// NUL-terminated for `cuModuleLoadData`.
pub const RESIZE_PTX: &str = concat!(include_str!("../../kernels/resize.ptx"), "\0");

/// Entry point of the resize kernel.
pub const RESIZE_U8: &str = "stoker_resize_u8";

/// Threads per block of a resize launch: x along a row, y down the columns.
pub const RESIZE_BLOCK: (u32, u32) = (32, 8);

/// `job`'s grid: blocks covering the output, at most [`super::cast::MAX_GRID`] each way; the
/// kernel strides over whatever exceeds it.
pub fn grid(job: &ResizeJob) -> (u32, u32) {
    let max = super::cast::MAX_GRID;
    let x = job.width.div_ceil(RESIZE_BLOCK.0).clamp(1, max);
    let y = job.height.div_ceil(RESIZE_BLOCK.1).clamp(1, max);
    (x, y)
}

/// `floor(v + 0.5)` clamped to a byte: the kernel's rounding.
fn to_u8(v: f32) -> u8 {
    (v + 0.5).floor().clamp(0.0, 255.0) as u8
}

/// What the kernel computes, on host memory: the reference the fake device runs, and the
/// statement of the kernel's contract. `src` holds the decoded image (`src_height` rows of
/// `src_width * 3` bytes), `dst` the output sample; the taps are [`Taps`].
///
/// Output pixel `(x, y)` is resampled pixel `(flip ? width - 1 - x : x, y)`; channel `c` of a
/// resampled pixel `(u, y)` is `round(Σ_j wy[y][j] · h(fy[y] + j))` where
/// `h(r) = round(Σ_k wx[u][k] · src[r][fx[u] + k][c])`, each sum a chain of fused multiply-adds
/// from zero in tap order, and `round(v)` is `floor(v + 0.5)` clamped to 0..=255.
pub fn run_on_host(job: &ResizeJob, src: &[u8], (x, y): (&Taps, &Taps), dst: &mut [u8]) {
    let (w, h) = (job.width as usize, job.height as usize);
    let pitch = job.src_width as usize * 3;
    for oy in 0..h {
        let [fy, ny] = y.spans[oy];
        for ox in 0..w {
            let u = if job.flip { w - 1 - ox } else { ox };
            let [fx, nx] = x.spans[u];
            for c in 0..3 {
                let mut acc = 0f32;
                for j in 0..ny as usize {
                    let row = &src[(fy as usize + j) * pitch..];
                    let mut hacc = 0f32;
                    for k in 0..nx as usize {
                        let v = row[(fx as usize + k) * 3 + c] as f32;
                        hacc = x.weights[u * x.taps + k].mul_add(v, hacc);
                    }
                    acc = y.weights[oy * y.taps + j].mul_add(to_u8(hacc) as f32, acc);
                }
                let at = if job.planar {
                    c * w * h + oy * w + ox
                } else {
                    (oy * w + ox) * 3 + c
                };
                dst[at] = to_u8(acc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_flips_and_lays_out_planes() {
        // A 2x1 image: red-ish then blue-ish; copied 1:1.
        let src = [10u8, 20, 30, 40, 50, 60];
        let x = Taps::for_axis(0.0, 2.0, 2, (0, 2)).unwrap();
        let y = Taps::for_axis(0.0, 1.0, 1, (0, 1)).unwrap();
        let mut job = ResizeJob {
            src: 0,
            src_width: 2,
            src_height: 1,
            dst: 0,
            width: 2,
            height: 1,
            planar: false,
            flip: false,
            x_spans: 0,
            x_weights: 0,
            x_taps: x.taps as u32,
            y_spans: 0,
            y_weights: 0,
            y_taps: y.taps as u32,
        };
        let mut out = [0u8; 6];
        run_on_host(&job, &src, (&x, &y), &mut out);
        assert_eq!(out, src);
        job.flip = true;
        run_on_host(&job, &src, (&x, &y), &mut out);
        assert_eq!(out, [40, 50, 60, 10, 20, 30]);
        job.planar = true;
        run_on_host(&job, &src, (&x, &y), &mut out);
        assert_eq!(out, [40, 10, 50, 20, 60, 30]);
    }

    #[test]
    fn the_embedded_ptx_was_made_from_the_kernel_source_beside_it() {
        let source = include_bytes!("../../kernels/resize.cu");
        let first = RESIZE_PTX.lines().next().unwrap_or("");
        assert_eq!(
            first,
            format!("// resize.cu crc32 {:08x}", crc32fast::hash(source)),
            "kernels/resize.ptx is stale: run kernels/make_ptx.py (its docstring says how)"
        );
        assert!(RESIZE_PTX.contains(&format!(".entry {RESIZE_U8}(")));
    }
}
