//! Segmentation masks stored as PNG: the labels of each pixel, never its colours.
//!
//! A class mask is a single-channel PNG: 8- or 16-bit grayscale (the value is the label), or a
//! palette image as Pascal VOC and Cityscapes store theirs (the palette *index* is the label;
//! the palette only colours it for a viewer). Grayscale and palette images of 1, 2 or 4 bits
//! are read as their values too. Anything with colour channels (RGB, gray with alpha) is not a
//! mask, and is refused in words rather than guessed at. The png crate reads the file: it hands
//! out palette indices and 16-bit samples as stored, where zune-png (the RGB path's decoder)
//! always expands a palette into colours.
//!
//! A callback source's `[H, W]` integer mask of varying size arrives as a raw-mask record
//! ([`MASK_MAGIC`]): its labels as given, no PNG.

use std::io::Cursor;

use png::{BitDepth, ColorType, Decoder, Limits, Transformations};

use super::{check_size, record_word, Dims};
use crate::dtype::DType;
use crate::source::pixels::{MASK_MAGIC, RAW_HEADER_BYTES};

/// Bytes the png crate may allocate beyond the pixels themselves (ancillary chunks: a palette,
/// text, ICC profiles), whatever the file says.
const CHUNK_BYTES: usize = 16 << 20;

/// A decoded mask's labels, one per pixel, row by row.
#[derive(Default)]
pub struct MaskBuffers {
    /// The PNG's rows as stored (packed for under 8 bits, big-endian for 16).
    raw: Vec<u8>,
    /// One label per pixel: a byte each for a mask of up to 8 bits, native-endian int64 bytes
    /// for a 16-bit one ([`decode_mask`] says which).
    pub labels: Vec<u8>,
}

/// Decodes the PNG mask `encoded` into `bufs.labels`, one label per pixel, row-major: `uint8`
/// for masks of 1 to 8 bits (a quarter of the memory traffic of the int64 the batch holds, which
/// the transform's output pass widens to), native-endian `int64` for 16-bit masks. Refuses a
/// mask of more than `max_pixels` pixels before its pixels are allocated. Returns its size and
/// the labels' type.
pub fn decode_mask(
    encoded: &[u8],
    max_pixels: u64,
    bufs: &mut MaskBuffers,
) -> Result<(Dims, DType), String> {
    if let Some(record) = raw_mask(encoded, max_pixels) {
        let (dims, label, labels) = record?;
        bufs.labels.clear();
        bufs.labels.extend_from_slice(labels);
        return Ok((dims, label));
    }
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
    let labels = &mut bufs.labels;
    labels.clear();
    let dtype = if bits == 16 { DType::I64 } else { DType::U8 };
    labels.reserve(pixels * dtype.size());
    for row in bufs.raw.chunks(line).take(height) {
        match bits {
            16 => {
                for v in row.chunks_exact(2).take(width) {
                    let label = i64::from(u16::from_be_bytes([v[0], v[1]]));
                    labels.extend_from_slice(&label.to_ne_bytes());
                }
            }
            8 => labels.extend_from_slice(&row[..width.min(row.len())]),
            _ => {
                let per_byte = 8 / bits;
                let mask = (1u8 << bits) - 1;
                labels.extend((0..width).map(|x| {
                    let byte = row.get(x / per_byte).copied().unwrap_or(0);
                    (byte >> (8 - bits * (x % per_byte + 1))) & mask
                }));
            }
        }
    }
    if labels.len() != pixels * dtype.size() {
        return Err(format!(
            "mask PNG ({width}x{height}) gave {} labels, expected {pixels}",
            labels.len() / dtype.size()
        ));
    }
    Ok((Dims { width, height }, dtype))
}

/// A raw-mask record's size, label type and labels.
type RawMask<'a> = (Dims, DType, &'a [u8]);

/// The size, label type and labels of a raw-mask record, or `None` if `bytes` is not one. A
/// record whose header disagrees with its length, or that is over `max_pixels`, is an error.
fn raw_mask(bytes: &[u8], max_pixels: u64) -> Option<Result<RawMask<'_>, String>> {
    if !bytes.starts_with(&MASK_MAGIC) {
        return None;
    }
    let word = |at| record_word(bytes, at);
    let (width, height) = (word(4) as usize, word(8) as usize);
    Some((|| {
        let label = match word(12) {
            1 => DType::U8,
            8 => DType::I64,
            other => return Err(format!("corrupt raw-mask record: {other} bytes a label")),
        };
        // check_size counts 3 bytes a pixel.
        let pixels = check_size(width, height, max_pixels)? / 3;
        let labels = bytes.get(RAW_HEADER_BYTES..).unwrap_or(&[]);
        if labels.len() != pixels * label.size() {
            return Err(format!(
                "corrupt raw-mask record: {width}x{height} {label} labels need {} bytes, it has {}",
                pixels * label.size(),
                labels.len()
            ));
        }
        Ok((Dims { width, height }, label, labels))
    })())
}
