//! The output table of a pipeline as a device cast (`gpu_normalize`): how a uint8 image field
//! becomes the loader's float output by the CPU path's own per-channel table.
//!
//! The CPU path writes a float image as `table[channel][value]` per element: the normalisation
//! and the type conversion precomputed in f64 and rounded once per table entry
//! ([`Pipeline`](super::Pipeline)). Under `gpu_normalize` the workers write the uint8 image
//! instead (the pipeline's uint8 twin, [`Pipeline::split_for_device`](super::Pipeline::split_for_device)),
//! the batch carries this table, and the device looks every element up in it
//! ([`crate::cuda::cast`]): the device output is the CPU's, bit for bit.

use std::sync::Arc;

use crate::dtype::{DType, Layout};
use crate::error::{Error, Result};

/// How a uint8 image field becomes its float output on the device: the output type, the layout
/// (which says where the channel is) and the CPU path's per-channel table.
#[derive(Clone, Debug)]
pub struct DeviceCast {
    dtype: DType,
    layout: Layout,
    channels: usize,
    /// `channels × 256` elements of `dtype`, native-endian: the output for each input value.
    table: Arc<[u8]>,
}

/// The cast kernel's view of a field: `rows` rows of `plane` elements each, and whether an
/// element's channel is its column's (NHWC) or its row's (NCHW).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CastGeometry {
    /// Rows of the field (NCHW: samples × channels; NHWC: samples).
    pub rows: u32,
    /// Elements per row.
    pub plane: u32,
    /// NHWC: an element's channel is its column modulo the channels; NCHW: its row's.
    pub channel_by_column: bool,
}

impl DeviceCast {
    /// A cast to `dtype` (float32, float16 or bfloat16) of a `channels`-channel image in
    /// `layout`, by `table` (`channels × 256` elements of `dtype`, native-endian).
    pub(crate) fn new(dtype: DType, layout: Layout, channels: usize, table: Vec<u8>) -> DeviceCast {
        debug_assert_eq!(table.len(), channels * 256 * dtype.size());
        DeviceCast {
            dtype,
            layout,
            channels,
            table: table.into(),
        }
    }

    /// The output element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The image's channels (one table each).
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// The table's bytes.
    pub fn table(&self) -> &[u8] {
        &self.table
    }

    /// The kernel's view of a field of `shape` (the batch dimension first). Errors when a count
    /// reaches 2^31, so that the kernel's strided 32-bit indices never wrap (see `cast.cu`).
    pub fn geometry(&self, shape: &[usize]) -> Result<CastGeometry> {
        let elements: usize = shape.iter().product();
        let (rows, channel_by_column) = match self.layout {
            // [B, C, H, W]: a row per channel plane.
            Layout::Nchw => (shape.iter().take(2).product::<usize>(), false),
            // [B, H, W, C]: a row per sample, channels interleaved.
            Layout::Nhwc => (shape.first().copied().unwrap_or(0), true),
        };
        let plane = elements.checked_div(rows).unwrap_or(0);
        let fits = |n: usize| i32::try_from(n).ok().map(|n| n as u32);
        match (fits(rows), fits(plane)) {
            (Some(rows), Some(plane)) => Ok(CastGeometry {
                rows,
                plane,
                channel_by_column,
            }),
            _ => Err(Error::InvalidArgument(format!(
                "gpu_normalize: an image field of shape {shape:?} is too large for the device \
                 cast (2^31 rows or elements per row or more); set gpu_normalize=false"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A float32 table whose entry is `channel * 1000 + value`.
    pub(crate) fn marked_table(layout: Layout) -> DeviceCast {
        let table = (0..3)
            .flat_map(|c| (0..256).map(move |v| (c * 1000 + v) as f32))
            .flat_map(f32::to_ne_bytes)
            .collect();
        DeviceCast::new(DType::F32, layout, 3, table)
    }

    #[test]
    fn the_channel_is_the_rows_in_nchw_and_the_columns_in_nhwc() {
        let g = marked_table(Layout::Nchw).geometry(&[2, 3, 1, 2]).unwrap();
        assert_eq!((g.rows, g.plane, g.channel_by_column), (6, 2, false));
        let g = marked_table(Layout::Nhwc).geometry(&[2, 1, 2, 3]).unwrap();
        assert_eq!((g.rows, g.plane, g.channel_by_column), (2, 6, true));
    }

    #[test]
    fn a_field_too_large_for_the_kernels_32_bit_indices_is_refused_in_words() {
        let cast = marked_table(Layout::Nchw);
        assert!(cast.geometry(&[2, 3, 1 << 15, (1 << 16) - 1]).is_ok());
        let e = cast
            .geometry(&[2, 3, 1 << 15, 1 << 16])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("too large") && e.contains("gpu_normalize=false"),
            "{e}"
        );
    }
}
