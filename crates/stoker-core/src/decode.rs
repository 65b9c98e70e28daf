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
//! * Raw pixels: a record of packed RGB8 behind a 16-byte header ([`RAW_MAGIC`], width,
//!   height, channels), as stoker's packed format stores images in `raw` mode. They need no
//!   decoding: [`raw_pixels`] hands out a view that the transform reads in place.
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
    /// JPEG: baseline or progressive, decoded by zune-jpeg.
    Jpeg,
    /// PNG: any color type and bit depth, decoded by zune-png.
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

/// The size and pixels of a raw-pixel record, or `None` if `bytes` is not one. A record whose
/// header disagrees with its length, or that is over `max_pixels`, is an error.
pub fn raw_pixels(bytes: &[u8], max_pixels: u64) -> Option<Result<(Dims, &[u8]), String>> {
    if !bytes.starts_with(&RAW_MAGIC) {
        return None;
    }
    let word = |at: usize| -> u32 {
        bytes
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_le_bytes)
    };
    let (width, height, channels) = (word(4) as usize, word(8) as usize, word(12));
    Some((|| {
        if bytes.len() < RAW_HEADER_BYTES || channels != 3 {
            return Err(format!(
                "corrupt raw-pixel record ({} bytes, {channels} channels; expected a 16-byte header and 3 channels)",
                bytes.len()
            ));
        }
        let len = check_size(width, height, max_pixels)?;
        let pixels = &bytes[RAW_HEADER_BYTES..];
        if pixels.len() != len {
            return Err(format!(
                "corrupt raw-pixel record: {width}x{height}x3 needs {len} bytes, it has {}",
                pixels.len()
            ));
        }
        Ok((Dims { width, height }, pixels))
    })())
}

/// Width and height of a decoded image, in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Pixels per row.
    pub width: usize,
    /// Rows.
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
            let msg = crate::error::panic_message(&*panic);
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
    // Refuse the coding processes zune-jpeg does not implement with a clear reason.
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
    // zune-jpeg fills the missing part of a truncated stream with grey; libjpeg-turbo (Pillow)
    // reports it. A complete JPEG has an EOI marker after its first scan.
    if !jpeg_has_eoi(encoded) {
        return Err("truncated JPEG: no end-of-image marker after the image data".into());
    }
    bufs.rgb.resize(len, 0);
    d.decode_into(&mut bufs.rgb).map_err(|e| jpeg_error(&e))?;
    Ok(Dims { width, height })
}

/// Walks the marker segments of a JPEG header, calling `f(marker, offset of its 0xFF)` for each,
/// up to and including the first start-of-scan; returns the offset just past that SOS segment.
pub(crate) fn walk_jpeg_header(data: &[u8], mut f: impl FnMut(u8, usize)) -> Option<usize> {
    let mut i = 2; // past SOI
    loop {
        // Skip to the next marker (tolerating garbage), then over fill bytes (0xFF 0xFF ...).
        while *data.get(i)? != 0xFF {
            i += 1;
        }
        let at = i;
        while *data.get(i)? == 0xFF {
            i += 1;
        }
        let marker = data[i];
        i += 1;
        f(marker, at);
        match marker {
            // Standalone markers: TEM, RSTn, SOI.
            0x01 | 0xD0..=0xD8 => continue,
            0xD9 => return None,
            _ => {}
        }
        let len = u16::from_be_bytes([*data.get(i)?, *data.get(i + 1)?]) as usize;
        i += len;
        if marker == 0xDA {
            return (i <= data.len()).then_some(i);
        }
    }
}

/// Whether an EOI marker (`FF D9`) follows the first scan. Entropy-coded data cannot contain it
/// (a data 0xFF is stuffed as `FF 00`), and an embedded EXIF thumbnail's EOI sits in an APP
/// segment before the first scan, which the header walk skips.
fn jpeg_has_eoi(data: &[u8]) -> bool {
    walk_jpeg_header(data, |_, _| {})
        // Searched from the end: the EOI is normally the last two bytes.
        .is_some_and(|scan| data[scan..].windows(2).rev().any(|w| w == [0xFF, 0xD9]))
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::rng::{Rng, Stream};

    pub(crate) fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/data/images/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn decode(bytes: &[u8]) -> Result<(Dims, Vec<u8>), String> {
        let mut bufs = DecodeBuffers::default();
        let dims = decode_rgb(bytes, 89_478_485, &mut bufs)?;
        Ok((dims, bufs.rgb))
    }

    /// Mean absolute difference per channel between the 160x120 centre of `rgb` and `reference`.
    fn centre_mad(rgb: &[u8], dims: Dims, reference: &[u8]) -> [f64; 3] {
        let (rw, rh) = (160, 120);
        let (top, left) = ((dims.height - rh) / 2, (dims.width - rw) / 2);
        let mut sum = [0f64; 3];
        for y in 0..rh {
            for x in 0..rw {
                for c in 0..3 {
                    let a = rgb[((top + y) * dims.width + left + x) * 3 + c] as f64;
                    let b = reference[(y * rw + x) * 3 + c] as f64;
                    sum[c] += (a - b).abs();
                }
            }
        }
        sum.map(|s| s / (rw * rh) as f64)
    }

    /// Requirement: on real photos, mean absolute difference ≤ 1 level per channel against
    /// libjpeg-turbo as Pillow uses it (`Image.open(f).convert("RGB")`).
    #[test]
    fn real_photos_match_pillow_within_one_level() {
        for name in [
            "photo_baseline.jpg",
            "photo_progressive.jpg",
            "photo_gray.jpg",
            "photo_cmyk.jpg",
            "photo_444.jpg",
            "photo_png.png",
            "photo_png_named.JPEG",
        ] {
            let (dims, rgb) = decode(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            let expected = if name.ends_with(".jpg") {
                (500, 375)
            } else {
                (250, 188)
            };
            assert_eq!((dims.width, dims.height), expected, "{name}");
            let reference = fixture(&format!("{name}.ref.rgb"));
            let mad = centre_mad(&rgb, dims, &reference);
            eprintln!("{name}: mean abs diff vs Pillow per channel {mad:.3?}");
            for m in mad {
                assert!(m <= 1.0, "{name}: mean abs diff {mad:?} > 1 level");
            }
            if name.ends_with("png") || name.ends_with("JPEG") {
                assert_eq!(mad, [0.0; 3], "{name}: PNG decode must be exact");
            }
        }
    }

    #[test]
    fn png_colour_types_match_pillow_exactly() {
        for name in [
            "png_gray.png",
            "png_gray_alpha.png",
            "png_palette.png",
            "png_rgba.png",
            "png_rgb16.png",
            "png_gray16.png",
            "tiny_1x1.png",
        ] {
            let (dims, rgb) = decode(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            let reference = fixture(&format!("{name}.ref.rgb"));
            assert_eq!(rgb.len(), dims.width * dims.height * 3);
            assert!(rgb == reference, "{name}: pixels differ from Pillow");
        }
    }

    #[test]
    fn grayscale_jpeg_is_replicated_to_rgb() {
        let (_, rgb) = decode(&fixture("photo_gray.jpg")).unwrap();
        assert!(rgb.chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    }

    #[test]
    fn tiny_jpeg_decodes() {
        let (dims, rgb) = decode(&fixture("tiny_1x1.jpg")).unwrap();
        assert_eq!((dims.width, dims.height), (1, 1));
        let reference = fixture("tiny_1x1.jpg.ref.rgb");
        for c in 0..3 {
            assert!(
                rgb[c].abs_diff(reference[c]) <= 2,
                "{rgb:?} vs {reference:?}"
            );
        }
    }

    #[test]
    fn oversized_headers_are_refused_before_allocating() {
        for name in ["bomb_10000x10000.jpg", "bomb_10000x10000.png"] {
            let bytes = fixture(name);
            assert!(bytes.len() < 1000);
            assert_eq!(
                dimensions(&bytes).unwrap(),
                Dims {
                    width: 10000,
                    height: 10000
                }
            );
            let mut bufs = DecodeBuffers::default();
            let err = decode_rgb(&bytes, 89_478_485, &mut bufs).unwrap_err();
            assert!(
                err.contains("10000x10000") && err.contains("max_image_pixels"),
                "{name}: {err}"
            );
            assert_eq!(bufs.rgb.capacity(), 0, "{name}: allocated before refusing");
            assert_eq!(
                bufs.native.capacity(),
                0,
                "{name}: allocated before refusing"
            );
        }
        // The cap applies to real images too.
        let mut bufs = DecodeBuffers::default();
        let err = decode_rgb(&fixture("photo_baseline.jpg"), 500 * 375 - 1, &mut bufs).unwrap_err();
        assert!(err.contains("500x375"), "{err}");
        assert_eq!(bufs.rgb.capacity(), 0);
        decode_rgb(&fixture("photo_baseline.jpg"), 500 * 375, &mut bufs).unwrap();
    }

    #[test]
    fn empty_and_random_bytes_are_errors() {
        let err = decode(&[]).unwrap_err();
        assert!(err.contains("empty"), "{err}");
        let mut rng = Rng::for_key(1, Stream::Augment, 0, 0);
        for len in [1usize, 2, 3, 17, 1000, 65536] {
            let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let err = decode(&bytes).unwrap_err();
            assert!(err.contains("not a JPEG or PNG"), "{err}");
        }
        // Random bytes behind a valid signature.
        for magic in [&[0xFFu8, 0xD8, 0xFF][..], b"\x89PNG\r\n\x1a\n"] {
            for len in [0usize, 1, 10, 100, 5000] {
                let mut bytes = magic.to_vec();
                bytes.extend((0..len).map(|_| rng.next_u64() as u8));
                assert!(
                    decode(&bytes).is_err(),
                    "random body of {len} bytes decoded"
                );
            }
        }
    }

    #[test]
    fn truncated_files_are_errors() {
        for name in [
            "photo_baseline.jpg",
            "photo_progressive.jpg",
            "photo_png.png",
            "photo_cmyk.jpg",
        ] {
            let bytes = fixture(name);
            for keep in [bytes.len() / 2, bytes.len() - 2, 400, 20, 4] {
                let err = decode(&bytes[..keep]).err();
                assert!(
                    err.is_some(),
                    "{name} cut to {keep} of {} bytes decoded without error",
                    bytes.len()
                );
                let err = err.unwrap_or_default();
                assert!(
                    err.contains("truncated") || err.contains("corrupt") || keep < 8,
                    "{name} cut to {keep}: {err}"
                );
            }
        }
    }

    #[test]
    fn arithmetic_coded_jpeg_is_unsupported() {
        let mut bytes = fixture("photo_baseline.jpg");
        let mut sof = None;
        walk_jpeg_header(&bytes, |marker, at| {
            if marker == 0xC0 {
                sof = Some(at);
            }
        });
        let sof = sof.expect("baseline SOF0");
        bytes[sof + 1] = 0xC9; // SOF9: extended sequential, arithmetic coding
        let err = decode(&bytes).unwrap_err();
        assert!(err.contains("unsupported JPEG"), "{err}");
        bytes[sof + 1] = 0xCA; // SOF10: progressive, arithmetic coding
        assert!(decode(&bytes).is_err());
        bytes[sof + 1] = 0xC3; // SOF3: lossless
        assert!(decode(&bytes).is_err());
    }

    /// Corrupted real files (random byte flips and cuts) give Ok or Err, never a panic that
    /// escapes, and never a wrong-sized output.
    #[test]
    fn mutated_files_never_escape() {
        let mut rng = Rng::for_key(9, Stream::Augment, 0, 0);
        for name in [
            "photo_baseline.jpg",
            "photo_progressive.jpg",
            "png_palette.png",
        ] {
            let original = fixture(name);
            for _ in 0..40 {
                let mut bytes = original.clone();
                for _ in 0..1 + rng.below(8) {
                    let at = rng.below(bytes.len() as u64) as usize;
                    bytes[at] = rng.next_u64() as u8;
                }
                if rng.below(3) == 0 {
                    bytes.truncate(rng.below(bytes.len() as u64) as usize);
                }
                let mut bufs = DecodeBuffers::default();
                if let Ok(d) = decode_rgb(&bytes, 89_478_485, &mut bufs) {
                    assert_eq!(bufs.rgb.len(), d.width * d.height * 3);
                }
            }
        }
    }

    #[test]
    fn format_is_sniffed_not_named() {
        assert_eq!(
            Format::sniff(&fixture("photo_png_named.JPEG")),
            Some(Format::Png)
        );
        assert_eq!(
            Format::sniff(&fixture("photo_baseline.jpg")),
            Some(Format::Jpeg)
        );
        assert_eq!(Format::sniff(b"GIF89a"), None);
    }
}
