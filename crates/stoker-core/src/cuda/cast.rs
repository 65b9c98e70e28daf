//! `gpu_normalize` on the device: an image field crosses as uint8 and becomes the loader's float
//! output there, a quarter (float32) or half (float16, bfloat16) of the bytes over the link.
//!
//! The workers write the uint8 image the CPU path's table would be applied to, and the batch
//! carries that table ([`DeviceCast`]). The prefetcher lays the batch out in its device buffer
//! (`batch::DeviceLayout`: the fields at their device types, then the uint8 inputs and the tables),
//! copies the inputs and tables, and queues the cast kernel on the copy stream before the
//! batch's event. The kernel looks each element up in the same table, so the device batch is
//! bit-identical to the host one.
//!
//! The kernel is `kernels/cast.cu`, compiled to PTX ahead of time and embedded ([`CAST_PTX`]);
//! [`run_on_host`] is its reference, which the fake device runs.
//!
//! [`DeviceCast`]: crate::transform::DeviceCast

use super::device::CastJob;

/// The cast kernels as PTX, made from `kernels/cast.cu` by `kernels/make_ptx.py` (NVRTC 12.0,
/// `compute_52`), NUL-terminated for `cuModuleLoadData`.
///
/// PTX rather than NVRTC at run time: NVRTC is a toolkit library that most machines with a
/// driver lack (pip's copy sits in a torch wheel, off the library path), and PTX of ISA 8.0 is
/// compiled by every CUDA 12 or later driver for whatever GPU it has, once per machine (the
/// driver caches it). The kernels compute nothing that a newer architecture would do better.
pub const CAST_PTX: &str = concat!(include_str!("../../kernels/cast.ptx"), "\0");

/// Entry point of the cast into 4-byte elements (float32).
pub const CAST_B32: &str = "stoker_cast_u8_b32";
/// Entry point of the cast into 2-byte elements (float16, bfloat16).
pub const CAST_B16: &str = "stoker_cast_u8_b16";

/// Threads per block of a cast launch.
pub const CAST_BLOCK: u32 = 256;

/// The largest grid dimension a launch uses (y's limit; the kernel strides over the rest).
pub const MAX_GRID: u32 = 65_535;

/// `job`'s grid (x: blocks along a row, y: rows), at most [`MAX_GRID`] each; the kernel strides
/// over whatever exceeds it.
pub fn grid(job: &CastJob) -> (u32, u32) {
    let x = job.plane.div_ceil(CAST_BLOCK).clamp(1, MAX_GRID);
    let y = job.rows.clamp(1, MAX_GRID);
    (x, y)
}

/// What the kernel computes, on host memory: the reference the fake device runs, and the
/// statement of the kernel's contract. `src` holds `job.elements()` bytes, `table`
/// `channels × 256` elements and `dst` `job.elements()` elements.
pub fn run_on_host(job: &CastJob, src: &[u8], table: &[u8], dst: &mut [u8]) {
    let (n, plane, channels) = (job.elem_bytes, job.plane as usize, job.channels as usize);
    if plane == 0 || channels == 0 {
        return;
    }
    let rows = src.chunks_exact(plane).zip(dst.chunks_exact_mut(plane * n));
    for (row, (s, d)) in rows.enumerate().take(job.rows as usize) {
        for (col, (&v, out)) in s.iter().zip(d.chunks_exact_mut(n)).enumerate() {
            let c = if job.channel_by_column { col } else { row } % channels;
            let at = (c * 256 + v as usize) * n;
            out.copy_from_slice(&table[at..at + n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(rows: u32, plane: u32, channel_by_column: bool) -> CastJob {
        CastJob {
            src: 0,
            dst: 0,
            table: 0,
            elem_bytes: 4,
            rows,
            plane,
            channels: 3,
            channel_by_column,
        }
    }

    fn decode(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    #[test]
    fn the_reference_finds_the_channel_by_row_in_nchw_and_by_column_in_nhwc() {
        // A float32 table whose entry is `channel * 1000 + value`.
        let table: Vec<u8> = (0..3)
            .flat_map(|c| (0..256).map(move |v| (c * 1000 + v) as f32))
            .flat_map(f32::to_ne_bytes)
            .collect();
        // Two samples of 3 channels of 2 pixels: values 0..12.
        let src: Vec<u8> = (0..12).collect();
        let mut dst = vec![0u8; 12 * 4];
        run_on_host(&job(6, 2, false), &src, &table, &mut dst);
        let want: Vec<f32> = (0..12).map(|i| ((i / 2) % 3 * 1000 + i) as f32).collect();
        assert_eq!(decode(&dst), want);
        run_on_host(&job(2, 6, true), &src, &table, &mut dst);
        let want: Vec<f32> = (0..12).map(|i| (i % 3 * 1000 + i) as f32).collect();
        assert_eq!(decode(&dst), want);
    }

    #[test]
    fn grids_stay_within_the_limits_and_cover_small_fields() {
        assert_eq!(grid(&job(768, 224 * 224, false)), (196, 768));
        assert_eq!(grid(&job(1, 1, true)), (1, 1));
        assert_eq!(grid(&job(u32::MAX, u32::MAX, true)), (MAX_GRID, MAX_GRID));
    }

    #[test]
    fn the_embedded_ptx_was_made_from_the_kernel_source_beside_it() {
        let source = include_bytes!("../../kernels/cast.cu");
        let first = CAST_PTX.lines().next().unwrap_or("");
        assert_eq!(
            first,
            format!("// cast.cu crc32 {:08x}", crc32fast::hash(source)),
            "kernels/cast.ptx is stale: run kernels/make_ptx.py (its docstring says how)"
        );
        for entry in [CAST_B32, CAST_B16] {
            assert!(CAST_PTX.contains(&format!(".entry {entry}(")), "{entry}");
        }
    }
}
