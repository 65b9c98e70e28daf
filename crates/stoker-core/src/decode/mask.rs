//! Segmentation masks stored as PNG: the labels of each pixel, never its colours.
//!
//! A class mask is a single-channel PNG: 8- or 16-bit grayscale (the value is the label), or a
//! palette image as Pascal VOC and Cityscapes store theirs (the palette *index* is the label;
//! the palette only colours it for a viewer). Grayscale and palette images of 1, 2 or 4 bits
//! are read as their values too. Anything with colour channels (RGB, gray with alpha) is not a
//! mask, and is refused in words rather than guessed at. The png crate reads the file: it hands
//! out palette indices and 16-bit samples as stored, where zune-png (the RGB path's decoder)
//! always expands a palette into colours.

use std::io::Cursor;

use png::{BitDepth, ColorType, Decoder, Limits, Transformations};

use super::{check_size, Dims};

/// Bytes the png crate may allocate beyond the pixels themselves (ancillary chunks: a palette,
/// text, ICC profiles), whatever the file says.
const CHUNK_BYTES: usize = 16 << 20;

/// A decoded mask's labels, one per pixel, row by row.
#[derive(Default)]
pub struct MaskBuffers {
    /// The PNG's rows as stored (packed for under 8 bits, big-endian for 16).
    raw: Vec<u8>,
    /// One label per pixel, as native-endian int64 bytes (what a stored int64 mask holds).
    pub labels: Vec<u8>,
}

/// Decodes the PNG mask `encoded` into `bufs.labels` (one int64 label per pixel, row-major, as
/// native-endian bytes),
/// refusing a mask of more than `max_pixels` pixels before its pixels are allocated. Returns
/// its size.
pub fn decode_mask(
    encoded: &[u8],
    max_pixels: u64,
    bufs: &mut MaskBuffers,
) -> Result<Dims, String> {
    if !encoded.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Err(
            "a mask must be a PNG (8- or 16-bit grayscale, or palette); this is not a PNG \
                    file"
                .into(),
        );
    }
    let mut header = Decoder::new(Cursor::new(encoded));
    header.set_transformations(Transformations::IDENTITY);
    let info = header
        .read_header_info()
        .map_err(|e| format!("mask PNG header: {e}"))?;
    let (width, height) = (info.width as usize, info.height as usize);
    let (color, depth) = (info.color_type, info.bit_depth);
    // Checked before any pixel buffer exists: a few header bytes cannot ask for gigabytes.
    let pixels = check_size(width, height, max_pixels)? / 3;
    match color {
        ColorType::Grayscale | ColorType::Indexed => {}
        other => {
            return Err(format!(
                "a mask is a single-channel PNG of labels (grayscale or palette); this one is \
                 {other:?} ({width}x{height}): its colours are not labels"
            ))
        }
    }
    let bits = match depth {
        BitDepth::One => 1,
        BitDepth::Two => 2,
        BitDepth::Four => 4,
        BitDepth::Eight => 8,
        BitDepth::Sixteen => 16,
    };
    // One row as stored, rounded up to whole bytes; the png crate allocates no more than this
    // plus its chunks.
    let row_bytes = (width * bits).div_ceil(8);
    let stored = row_bytes
        .checked_mul(height)
        .ok_or_else(|| format!("mask {width}x{height} does not fit in memory"))?;
    let limits = Limits {
        bytes: stored.saturating_mul(2).saturating_add(CHUNK_BYTES),
    };
    let mut decoder = Decoder::new_with_limits(Cursor::new(encoded), limits);
    decoder.set_transformations(Transformations::IDENTITY);
    let mut reader = decoder
        .read_info()
        .map_err(|e| format!("mask PNG ({width}x{height}): {e}"))?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| format!("mask {width}x{height} does not fit in memory"))?;
    if size < stored {
        return Err(format!(
            "internal: mask PNG buffer of {size} bytes for {stored} stored bytes"
        ));
    }
    bufs.raw.clear();
    bufs.raw.resize(size, 0);
    let frame = reader
        .next_frame(&mut bufs.raw)
        .map_err(|e| format!("mask PNG ({width}x{height}): {e}"))?;
    let line = frame.line_size;
    bufs.labels.clear();
    bufs.labels.reserve(pixels * 8);
    for row in bufs.raw.chunks(line).take(height) {
        match bits {
            16 => {
                for v in row.chunks_exact(2).take(width) {
                    let label = i64::from(u16::from_be_bytes([v[0], v[1]]));
                    bufs.labels.extend_from_slice(&label.to_ne_bytes());
                }
            }
            8 => {
                for &v in row.iter().take(width) {
                    bufs.labels.extend_from_slice(&i64::from(v).to_ne_bytes());
                }
            }
            _ => {
                let per_byte = 8 / bits;
                let mask = (1u8 << bits) - 1;
                for x in 0..width {
                    let byte = row.get(x / per_byte).copied().unwrap_or(0);
                    let shift = 8 - bits * (x % per_byte + 1);
                    let label = i64::from((byte >> shift) & mask);
                    bufs.labels.extend_from_slice(&label.to_ne_bytes());
                }
            }
        }
    }
    if bufs.labels.len() != pixels * 8 {
        return Err(format!(
            "mask PNG ({width}x{height}) gave {} labels, expected {pixels}",
            bufs.labels.len() / 8
        ));
    }
    Ok(Dims { width, height })
}
