//! zune-jpeg and zune-png: the pure-Rust decoders. Every JPEG when libjpeg-turbo is not built
//! (feature `turbojpeg` off, or built without SIMD), CMYK/YCCK JPEGs always, and every PNG.

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;
use zune_png::PngDecoder;

use super::{
    check_size, jpeg_is_whole, size_mismatch, walk_jpeg_header, DecodeBuffers, Dims, MAX_SIDE,
};

fn options() -> DecoderOptions {
    DecoderOptions::default()
        .set_max_width(MAX_SIDE)
        .set_max_height(MAX_SIDE)
        .set_strict_mode(false)
}

fn jpeg_error(e: &zune_jpeg::errors::DecodeErrors) -> String {
    let text = format!("{e:?}");
    let lower = text.to_ascii_lowercase();
    if lower.contains("arithmetic") || lower.contains("unsupported") || lower.contains("lossless") {
        format!("unsupported JPEG: {text}")
    } else if lower.contains("eof")
        || lower.contains("exhausted")
        || lower.contains("no more bytes")
    {
        format!("truncated JPEG: {text}")
    } else {
        format!("corrupt JPEG: {text}")
    }
}

/// Refuses the coding processes zune-jpeg does not implement, with a clear reason.
fn refuse_unsupported(encoded: &[u8]) -> Result<(), String> {
    let mut unsupported = None;
    walk_jpeg_header(encoded, |marker, _| {
        let process = match marker {
            0xC3 => "lossless",
            0xC5..=0xC7 => "hierarchical",
            0xC9 | 0xCA => "arithmetic-coded",
            0xCB | 0xCD..=0xCF => "arithmetic-coded lossless or hierarchical",
            _ => return,
        };
        unsupported.get_or_insert((process, marker));
    });
    if let Some((process, marker)) = unsupported {
        return Err(format!(
            "unsupported JPEG: {process} (SOF marker 0x{marker:02X}); only baseline, extended \
             and progressive Huffman-coded JPEGs are supported"
        ));
    }
    Ok(())
}

/// The size in a JPEG header.
pub(super) fn jpeg_dimensions(encoded: &[u8]) -> Result<Dims, String> {
    refuse_unsupported(encoded)?;
    let mut d = JpegDecoder::new_with_options(ZCursor::new(encoded), options());
    d.decode_headers().map_err(|e| jpeg_error(&e))?;
    d.dimensions()
        .map(|(width, height)| Dims { width, height })
        .ok_or_else(|| "JPEG header has no frame size".to_string())
}

/// The size in a PNG header.
pub(super) fn png_dimensions(encoded: &[u8]) -> Result<Dims, String> {
    let mut d = PngDecoder::new_with_options(ZCursor::new(encoded), options());
    d.decode_headers()
        .map_err(|e| format!("corrupt PNG: {e:?}"))?;
    d.dimensions()
        .map(|(width, height)| Dims { width, height })
        .ok_or_else(|| "PNG has no IHDR".to_string())
}

pub(super) fn decode_jpeg(
    encoded: &[u8],
    expected: Dims,
    bufs: &mut DecodeBuffers,
) -> Result<(), String> {
    refuse_unsupported(encoded)?;
    let opts = options().jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut d = JpegDecoder::new_with_options(ZCursor::new(encoded), opts);
    d.decode_headers().map_err(|e| jpeg_error(&e))?;
    let (width, height) = d
        .dimensions()
        .ok_or_else(|| "JPEG header has no frame size".to_string())?;
    if (Dims { width, height }) != expected {
        return Err(size_mismatch(Dims { width, height }, expected));
    }
    let len = check_size(width, height, u64::MAX)?;
    if d.output_colorspace() != Some(ColorSpace::RGB) {
        return Err(format!(
            "unsupported JPEG colour space {:?} (cannot convert to RGB)",
            d.input_colorspace()
        ));
    }
    if d.output_buffer_size() != Some(len) {
        return Err("unsupported JPEG: unexpected output size".into());
    }
    // zune-jpeg fills the missing part of a truncated stream with grey; libjpeg-turbo (Pillow)
    // reports it. A complete JPEG has an EOI marker after its first scan.
    jpeg_is_whole(encoded)?;
    bufs.rgb.resize(len, 0);
    d.decode_into(&mut bufs.rgb).map_err(|e| jpeg_error(&e))?;
    Ok(())
}

pub(super) fn decode_png(
    encoded: &[u8],
    expected: Dims,
    bufs: &mut DecodeBuffers,
) -> Result<(), String> {
    // 16-bit samples come big-endian so that the high byte is the first of each pair.
    let opts = options().set_byte_endian(zune_core::bit_depth::ByteEndian::BE);
    let mut d = PngDecoder::new_with_options(ZCursor::new(encoded), opts);
    d.decode_headers()
        .map_err(|e| format!("corrupt PNG: {e:?}"))?;
    let (width, height) = d
        .dimensions()
        .ok_or_else(|| "PNG has no IHDR".to_string())?;
    if (Dims { width, height }) != expected {
        return Err(size_mismatch(Dims { width, height }, expected));
    }
    let len = check_size(width, height, u64::MAX)?;
    let colorspace = d.colorspace().ok_or("PNG has no colour type")?;
    let sixteen = d.depth() == Some(zune_core::bit_depth::BitDepth::Sixteen);
    let channels = colorspace.num_components();
    if !(1..=4).contains(&channels) {
        return Err(format!("unsupported PNG colour space {colorspace:?}"));
    }
    let bytes = if sixteen { 2 } else { 1 };
    let native_len = len / 3 * channels * bytes;
    if d.output_buffer_size() != Some(native_len) {
        return Err("unsupported PNG: unexpected output size".into());
    }
    if channels == 3 && !sixteen {
        bufs.rgb.resize(len, 0);
        d.decode_into(&mut bufs.rgb).map_err(|e| png_error(&e))?;
        return Ok(());
    }
    bufs.native.resize(native_len, 0);
    d.decode_into(&mut bufs.native).map_err(|e| png_error(&e))?;
    bufs.rgb.resize(len, 0);
    let stride = channels * bytes;
    // Gray (with or without alpha) is replicated into R, G and B; alpha is dropped. For 16-bit
    // samples (big-endian) the first byte of each sample is the high byte.
    for (px, out) in bufs
        .native
        .chunks_exact(stride)
        .zip(bufs.rgb.chunks_exact_mut(3))
    {
        if channels <= 2 {
            out.fill(px[0]);
        } else {
            out[0] = px[0];
            out[1] = px[bytes];
            out[2] = px[2 * bytes];
        }
    }
    Ok(())
}

fn png_error(e: &zune_png::error::PngDecodeErrors) -> String {
    let text = format!("{e:?}");
    if text.to_ascii_lowercase().contains("eof") || text.contains("No more bytes") {
        format!("truncated PNG: {text}")
    } else {
        format!("corrupt PNG: {text}")
    }
}
