//! How a source holds an image that needs no decoding: an image-shaped tensor field (its
//! layout, option `input_layout`: RGB uint8 as the RGB8 pipeline takes it, or any channel count
//! of uint8/uint16/float16/bfloat16/float32 as the dense pipeline does), and the raw-pixel record (packed RGB8 behind a small header)
//! that the packed format's raw mode and the callback sources write and `decode` reads back, and
//! the raw-mask record a callback's mask of varying size is written as.

use super::{FieldKind, FieldSpec};
use crate::dtype::DType;

/// How an image-shaped tensor field is stored (option `input_layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputLayout {
    /// `[H, W, C]`, channels last.
    Hwc,
    /// `[C, H, W]`, channels first.
    Chw,
}

/// Channel counts the shape alone says are channels (gray, RGB, RGBA): a last dimension of
/// one of these is read as channels last, else a first dimension of one as channels first.
/// Any other count (13 bands, say) is ambiguous (`[64, 64, 13]` could be 64 images of
/// 64x13), so it needs `input_layout`.
pub const OBVIOUS_CHANNELS: [usize; 3] = [1, 3, 4];

/// The element types a tensor image may have.
pub fn is_image_dtype(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::U8 | DType::U16 | DType::F16 | DType::BF16 | DType::F32
    )
}

/// `(height, width, channels, layout)` of a 3-dimensional tensor of `shape` read as an image:
/// as `input_layout` says, or unset, channels last if the last dimension is 1, 3 or 4, else
/// channels first if the first is ([`OBVIOUS_CHANNELS`]); `None` if neither, or a dimension
/// is 0. A layout that contradicts what the shape shows is refused too (`None`): `hwc` on
/// `[3, H, W]` would read planes as `W`-channel pixels, so it must give a channel count the
/// shape cannot show to win over it.
pub fn tensor_dims(
    shape: &[usize],
    input_layout: Option<InputLayout>,
) -> Option<(usize, usize, usize, InputLayout)> {
    let &[a, b, c] = shape else {
        return None;
    };
    let shown = if OBVIOUS_CHANNELS.contains(&c) {
        Some(InputLayout::Hwc)
    } else if OBVIOUS_CHANNELS.contains(&a) {
        Some(InputLayout::Chw)
    } else {
        None
    };
    let layout = input_layout.or(shown)?;
    let dims = match layout {
        InputLayout::Hwc => (a, b, c, layout),
        InputLayout::Chw => (b, c, a, layout),
    };
    let contradicts = shown.is_some_and(|s| s != layout) && !OBVIOUS_CHANNELS.contains(&dims.2);
    (a > 0 && b > 0 && c > 0 && !contradicts).then_some(dims)
}

/// [`tensor_dims`] of a fixed-shape tensor field of an image element type
/// ([`is_image_dtype`]), with its element type.
pub fn tensor_image_dims(
    field: &FieldSpec,
    input_layout: Option<InputLayout>,
) -> Option<(usize, usize, usize, InputLayout, DType)> {
    let FieldKind::Tensor { dtype, shape } = &field.kind else {
        return None;
    };
    if !is_image_dtype(*dtype) {
        return None;
    }
    let (h, w, c, layout) = tensor_dims(shape, input_layout)?;
    Some((h, w, c, layout, *dtype))
}

/// `(height, width, layout)` of a uint8 tensor of `shape` holding an RGB image: `[H, W, 3]`
/// (hwc) or `[3, H, W]` (chw), as `input_layout` says or, unset, hwc if the last dimension is
/// 3, else chw if the first is; `None` if the shape is not an RGB image's. Callback sources
/// take RGB uint8 images of varying size by it (any other image has one shape, see
/// [`tensor_dims`]).
pub fn image_dims(
    shape: &[usize],
    input_layout: Option<InputLayout>,
) -> Option<(usize, usize, InputLayout)> {
    let &[a, b, c] = shape else {
        return None;
    };
    let layout = input_layout.or(if c == 3 {
        Some(InputLayout::Hwc)
    } else if a == 3 {
        Some(InputLayout::Chw)
    } else {
        None
    })?;
    match layout {
        InputLayout::Hwc if c == 3 && a > 0 && b > 0 => Some((a, b, layout)),
        InputLayout::Chw if a == 3 && b > 0 && c > 0 => Some((b, c, layout)),
        _ => None,
    }
}

/// The first bytes of a raw-pixel record: `b"STKR"`, then width, height and channels as
/// little-endian u32, then `width * height * channels` bytes of packed RGB8 (channels is 3).
pub const RAW_MAGIC: [u8; 4] = *b"STKR";
/// Bytes of a raw-pixel record's header.
pub const RAW_HEADER_BYTES: usize = 16;

/// The header of a raw-pixel record of a `width × height` RGB8 image.
pub fn raw_header(width: u32, height: u32) -> [u8; RAW_HEADER_BYTES] {
    let mut b = [0u8; RAW_HEADER_BYTES];
    b[0..4].copy_from_slice(&RAW_MAGIC);
    b[4..8].copy_from_slice(&width.to_le_bytes());
    b[8..12].copy_from_slice(&height.to_le_bytes());
    b[12..16].copy_from_slice(&3u32.to_le_bytes());
    b
}

/// The first bytes of a raw-mask record, a callback's `[H, W]` integer mask of varying size
/// (read by `decode::mask`): `b"STKM"`, then width, height and the bytes per label (1: uint8 labels;
/// 8: native-endian int64) as little-endian u32, then the labels row by row.
pub const MASK_MAGIC: [u8; 4] = *b"STKM";

/// The header of a raw-mask record of a `width × height` mask of `label` (uint8 or int64)
/// labels.
pub fn mask_header(width: u32, height: u32, label: DType) -> [u8; RAW_HEADER_BYTES] {
    let mut b = [0u8; RAW_HEADER_BYTES];
    b[0..4].copy_from_slice(&MASK_MAGIC);
    b[4..8].copy_from_slice(&width.to_le_bytes());
    b[8..12].copy_from_slice(&height.to_le_bytes());
    b[12..16].copy_from_slice(&(label.size() as u32).to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_says_where_1_3_or_4_channels_are_and_input_layout_says_the_rest() {
        use InputLayout::{Chw, Hwc};
        for (shape, layout, want) in [
            (&[64, 48, 3][..], None, Some((64, 48, 3, Hwc))),
            (&[4, 64, 48], None, Some((64, 48, 4, Chw))),
            (&[64, 48, 1], None, Some((64, 48, 1, Hwc))),
            // 13 bands: the shape cannot say, input_layout must.
            (&[64, 64, 13], None, None),
            (&[64, 64, 13], Some(Hwc), Some((64, 64, 13, Hwc))),
            (&[13, 64, 64], Some(Chw), Some((64, 64, 13, Chw))),
            // A layout the shape contradicts is refused: planes would be read as pixels.
            (&[3, 4, 5], Some(Hwc), None),
            (&[64, 64, 3], Some(Chw), None),
            // Unless it names a channel count the shape could show too (8x3, 4 channels).
            (&[4, 8, 3], Some(Chw), Some((8, 3, 4, Chw))),
            (&[0, 4, 3], None, None),
            (&[4, 3], None, None),
        ] {
            assert_eq!(tensor_dims(shape, layout), want, "{shape:?} {layout:?}");
        }
        let f = FieldSpec::tensor("x", DType::I32, &[8, 8, 3]);
        assert_eq!(
            tensor_image_dims(&f, None),
            None,
            "int32 is not an image type"
        );
        let f = FieldSpec::tensor("x", DType::BF16, &[2, 8, 8]);
        assert_eq!(
            tensor_image_dims(&f, Some(Chw)),
            Some((8, 8, 2, Chw, DType::BF16))
        );
    }
}
