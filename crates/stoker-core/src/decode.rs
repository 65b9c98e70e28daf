//! Decode: encoded JPEG or PNG bytes → packed RGB8 pixels in a caller-provided buffer.
//!
//! The format is chosen by magic bytes, never by file name (ImageNet has PNGs named `.JPEG`).
//! Every decoded image is RGB8, as Pillow's `Image.open(f).convert("RGB")` gives it:
//!
//! * JPEG (zune-jpeg): baseline and progressive; grayscale is replicated into three channels;
//!   CMYK and YCCK are converted to RGB by the decoder. Arithmetic-coded, lossless and
//!   12-bit JPEGs are refused with an error.
//! * PNG (zune-png): gray, gray+alpha, RGB, RGBA and palette images at any bit depth. Alpha is
//!   dropped (not composited), like `convert("RGB")`; 16-bit samples keep their high byte.
//!
//! Bad input is an error, never a panic, a hang or an unbounded allocation: the header is read
//! first and an image with more than `max_pixels` pixels is refused before any pixel buffer is
//! allocated, and the decoder call runs under `catch_unwind` in case a decoder bug panics.

use std::panic::{catch_unwind, AssertUnwindSafe};

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;
use zune_png::PngDecoder;

/// Largest width or height either format can store (JPEG's 16-bit fields); the real limit is
/// `max_pixels`.
const MAX_SIDE: usize = 65_535;

/// An encoded image format, told by its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Jpeg,
    Png,
}

impl Format {
    /// The format of `bytes` by magic number: JPEG starts `FF D8 FF`, PNG with its 8-byte
    /// signature.
    pub fn sniff(bytes: &[u8]) -> Option<Format> {
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(Format::Jpeg)
        } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Format::Png)
        } else {
            None
        }
    }
}

/// Width and height of a decoded image, in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub width: usize,
    pub height: usize,
}

/// Reusable memory for decoding: the RGB8 output and, for PNGs that are not 8-bit RGB, the
/// decoder's native samples before conversion. Keep one per thread; after the largest image
/// has been seen, decoding allocates nothing here.
#[derive(Default)]
pub struct DecodeBuffers {
    /// Packed RGB8 pixels of the last decoded image, `width * height * 3` bytes.
    pub rgb: Vec<u8>,
    native: Vec<u8>,
}

/// Decodes `encoded` into `bufs.rgb` as packed RGB8 and returns its size. Images with more
/// than `max_pixels` pixels are refused before their pixels are allocated. Errors are
/// human-readable reasons ("truncated JPEG: ..."), without the file name.
pub fn decode_rgb(
    encoded: &[u8],
    max_pixels: u64,
    bufs: &mut DecodeBuffers,
) -> Result<Dims, String> {
    if encoded.is_empty() {
        return Err("empty file (0 bytes)".into());
    }
    let format = Format::sniff(encoded).ok_or_else(|| {
        let head: Vec<String> = encoded.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!(
            "not a JPEG or PNG image (first bytes {}); formats are detected by content, not name",
            head.join(" ")
        )
    })?;
    let result = catch_unwind(AssertUnwindSafe(|| match format {
        Format::Jpeg => decode_jpeg(encoded, max_pixels, bufs),
        Format::Png => decode_png(encoded, max_pixels, bufs),
    }));
    match result {
        Ok(r) => r,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(format!(
                "corrupt {} (the decoder failed: {msg})",
                match format {
                    Format::Jpeg => "JPEG",
                    Format::Png => "PNG",
                }
            ))
        }
    }
}

/// Reads only the header: the image's size, without decoding pixels.
pub fn dimensions(encoded: &[u8]) -> Result<Dims, String> {
    let result = catch_unwind(AssertUnwindSafe(|| match Format::sniff(encoded) {
        Some(Format::Jpeg) => {
            let mut d = JpegDecoder::new_with_options(ZCursor::new(encoded), options());
            d.decode_headers().map_err(|e| jpeg_error(&e))?;
            d.dimensions()
                .map(|(width, height)| Dims { width, height })
                .ok_or_else(|| "JPEG header has no frame size".to_string())
        }
        Some(Format::Png) => {
            let mut d = PngDecoder::new_with_options(ZCursor::new(encoded), options());
            d.decode_headers()
                .map_err(|e| format!("corrupt PNG: {e:?}"))?;
            d.dimensions()
                .map(|(width, height)| Dims { width, height })
                .ok_or_else(|| "PNG has no IHDR".to_string())
        }
        None => Err("not a JPEG or PNG image".to_string()),
    }));
    result.unwrap_or_else(|_| Err("corrupt image header (the decoder failed)".into()))
}

fn options() -> DecoderOptions {
    DecoderOptions::default()
        .set_max_width(MAX_SIDE)
        .set_max_height(MAX_SIDE)
        .set_strict_mode(false)
}

fn check_size(width: usize, height: usize, max_pixels: u64) -> Result<usize, String> {
    if width == 0 || height == 0 {
        return Err(format!("image has zero size ({width}x{height})"));
    }
    let pixels = (width as u64).saturating_mul(height as u64);
    if pixels > max_pixels {
        return Err(format!(
            "image is {width}x{height} = {pixels} pixels, more than max_image_pixels={max_pixels} \
             (a decompression bomb?); raise max_image_pixels to allow it"
        ));
    }
    usize::try_from(pixels)
        .ok()
        .and_then(|p| p.checked_mul(3))
        .ok_or_else(|| format!("image {width}x{height} does not fit in memory"))
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

fn decode_jpeg(encoded: &[u8], max_pixels: u64, bufs: &mut DecodeBuffers) -> Result<Dims, String> {
    let opts = options().jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut d = JpegDecoder::new_with_options(ZCursor::new(encoded), opts);
    d.decode_headers().map_err(|e| jpeg_error(&e))?;
    let (width, height) = d
        .dimensions()
        .ok_or_else(|| "JPEG header has no frame size".to_string())?;
    let len = check_size(width, height, max_pixels)?;
    if d.output_colorspace() != Some(ColorSpace::RGB) {
        return Err(format!(
            "unsupported JPEG colour space {:?} (cannot convert to RGB)",
            d.input_colorspace()
        ));
    }
    if d.output_buffer_size() != Some(len) {
        return Err("unsupported JPEG: unexpected output size".into());
    }
    bufs.rgb.resize(len, 0);
    d.decode_into(&mut bufs.rgb).map_err(|e| jpeg_error(&e))?;
    Ok(Dims { width, height })
}

fn decode_png(encoded: &[u8], max_pixels: u64, bufs: &mut DecodeBuffers) -> Result<Dims, String> {
    // 16-bit samples come big-endian so that the high byte is the first of each pair.
    let opts = options().set_byte_endian(zune_core::bit_depth::ByteEndian::BE);
    let mut d = PngDecoder::new_with_options(ZCursor::new(encoded), opts);
    d.decode_headers()
        .map_err(|e| format!("corrupt PNG: {e:?}"))?;
    let (width, height) = d
        .dimensions()
        .ok_or_else(|| "PNG has no IHDR".to_string())?;
    let len = check_size(width, height, max_pixels)?;
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
        return Ok(Dims { width, height });
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
    Ok(Dims { width, height })
}

fn png_error(e: &zune_png::error::PngDecodeErrors) -> String {
    let text = format!("{e:?}");
    if text.to_ascii_lowercase().contains("eof") || text.contains("No more bytes") {
        format!("truncated PNG: {text}")
    } else {
        format!("corrupt PNG: {text}")
    }
}
