//! How a source holds an image that needs no decoding: an image-shaped uint8 tensor field (its
//! layout, option `input_layout`), and the raw-pixel record (packed RGB8 behind a small header)
//! that the packed format's raw mode and the callback sources write and `decode` reads back.

use super::{FieldKind, FieldSpec};
use crate::dtype::DType;

/// How an image-shaped uint8 tensor field is stored (option `input_layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputLayout {
    /// `[H, W, 3]`, channels last.
    Hwc,
    /// `[3, H, W]`, channels first.
    Chw,
}

/// `(height, width, layout)` of a uint8 tensor field holding RGB images: `[H, W, 3]` (hwc) or
/// `[3, H, W]` (chw), as `input_layout` says or, unset, hwc if the last dimension is 3, else chw
/// if the first is.
pub fn tensor_image_shape(
    field: &FieldSpec,
    input_layout: Option<InputLayout>,
) -> Option<(usize, usize, InputLayout)> {
    let FieldKind::Tensor {
        dtype: DType::U8,
        shape,
    } = &field.kind
    else {
        return None;
    };
    image_dims(shape, input_layout)
}

/// `(height, width, layout)` of a uint8 tensor of `shape` holding an RGB image (see
/// [`tensor_image_shape`]); `None` if the shape is not an image's.
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
