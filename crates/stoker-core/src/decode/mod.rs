//! Decode: encoded JPEG or PNG bytes → packed RGB8 pixels in a caller-provided buffer.
//!
//! The format is chosen by magic bytes, never by file name (ImageNet has PNGs named `.JPEG`).
//! Every decoded image is RGB8, as Pillow's `Image.open(f).convert("RGB")` gives it:
//!
//! * JPEG, by one of two decoders chosen per image ([`JpegDecoder`], option `jpeg_decoder`):
//!   - libjpeg-turbo (`turbo`, feature `turbojpeg`): baseline, progressive, arithmetic-coded and
//!     8-bit lossless JPEGs; given the rectangle the transform will read ([`Window`]) it decodes
//!     only the iMCU rows and columns under it (plus one iMCU of margin, whose pixels would
//!     differ from a whole decode's), and shrinks in the DCT domain (1/2, 1/4, 1/8) when the
//!     rectangle is at least 6, 12 or 24 times the output. Used by default when it was built
//!     with SIMD (nasm at build time); without SIMD it is slower than zune-jpeg on whole images,
//!     so `auto` falls back to zune-jpeg (and the build says so).
//!   - zune-jpeg (`zune`, pure Rust): baseline and progressive, whole images; also every CMYK
//!     and YCCK JPEG, which libjpeg-turbo cannot convert to RGB. Arithmetic-coded, lossless and
//!     12-bit JPEGs are refused with an error.
//!
//!   Grayscale is replicated into three channels; CMYK and YCCK are converted to RGB.
//! * PNG (zune-png): gray, gray+alpha, RGB, RGBA and palette images at any bit depth. Alpha is
//!   dropped (not composited), like `convert("RGB")`; 16-bit samples keep their high byte.
//!
//! * Raw pixels: a record of packed RGB8 behind a 16-byte header ([`RAW_MAGIC`], width,
//!   height, channels), as stoker's packed format stores images in `raw` mode. They need no
//!   decoding: [`raw_pixels`] hands out a view that the transform reads in place.
//!
//! Bad input is an error, never a panic, a hang or an unbounded allocation: the header is read
//! first ([`read_header`]) and an image with more than `max_pixels` pixels is refused before any
//! pixel buffer is allocated, and the decoder call runs under `catch_unwind` in case a decoder
//! bug panics.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::source::pixels::{RAW_HEADER_BYTES, RAW_MAGIC};

/// Pillow's `MAX_IMAGE_PIXELS`, the default of option `max_image_pixels`: a larger image is a
/// decompression bomb until proven otherwise. Packing refuses larger images, and a transform
/// refuses to resample any image to a larger size.
pub const MAX_IMAGE_PIXELS: u64 = 89_478_485;

pub mod mask;
#[cfg(feature = "turbojpeg")]
mod turbo;
mod zune;

/// Largest width or height either format can store (JPEG's 16-bit fields); the real limit is
/// `max_pixels`.
pub(super) const MAX_SIDE: usize = 65_535;

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

/// The little-endian u32 at byte `at` of a raw record's header (raw-pixel or raw-mask); 0 where
/// the record is too short to hold it, which the record's checks then refuse.
pub(crate) fn record_word(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// The size and pixels of a raw-pixel record, or `None` if `bytes` is not one. A record whose
/// header disagrees with its length, or that is over `max_pixels`, is an error.
pub fn raw_pixels(bytes: &[u8], max_pixels: u64) -> Option<Result<(Dims, &[u8]), String>> {
    if !bytes.starts_with(&RAW_MAGIC) {
        return None;
    }
    let word = |at| record_word(bytes, at);
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

/// Which decoder decodes JPEGs (option `jpeg_decoder`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JpegDecoder {
    /// libjpeg-turbo with region decoding where it was built with SIMD, else zune-jpeg.
    #[default]
    Auto,
    /// zune-jpeg (pure Rust), whole images.
    Zune,
    /// libjpeg-turbo with region decoding, even when built without SIMD.
    Turbo,
    /// The device's decoder (nvJPEG, `device=cuda`) for the samples the prefetcher takes;
    /// the workers decode the rest as [`JpegDecoder::Auto`] does.
    Gpu,
}

impl JpegDecoder {
    /// The option's words: `auto`, `zune`, `turbo`, `gpu`.
    pub fn parse(text: &str) -> Result<JpegDecoder, String> {
        match text {
            "auto" => Ok(JpegDecoder::Auto),
            "zune" => Ok(JpegDecoder::Zune),
            "gpu" => Ok(JpegDecoder::Gpu),
            "turbo" if cfg!(feature = "turbojpeg") => Ok(JpegDecoder::Turbo),
            "turbo" => Err(
                "jpeg_decoder=turbo: this build has no libjpeg-turbo (cargo \
                            feature `turbojpeg` is off)"
                    .into(),
            ),
            other => Err(format!(
                "jpeg_decoder={other}: expected auto, zune, turbo or gpu"
            )),
        }
    }

    /// Whether JPEGs go to libjpeg-turbo.
    #[cfg_attr(not(feature = "turbojpeg"), allow(dead_code))]
    fn turbo(self) -> bool {
        match self {
            JpegDecoder::Auto | JpegDecoder::Gpu => {
                cfg!(all(feature = "turbojpeg", turbojpeg_simd))
            }
            JpegDecoder::Zune => false,
            JpegDecoder::Turbo => cfg!(feature = "turbojpeg"),
        }
    }
}

/// Whether this build has libjpeg-turbo (feature `turbojpeg`), with or without SIMD.
pub fn turbo_available() -> bool {
    cfg!(feature = "turbojpeg")
}

/// What `jpeg_decoder=auto` does in this build, in words (for `stoker --version`, doctor and
/// benchmarks).
pub fn jpeg_decoder_summary() -> &'static str {
    if cfg!(all(feature = "turbojpeg", turbojpeg_simd)) {
        "libjpeg-turbo 3.1 with SIMD, crop-aware (zune-jpeg for CMYK/YCCK)"
    } else if cfg!(feature = "turbojpeg") {
        "zune-jpeg: libjpeg-turbo was built without SIMD (no nasm at build time), which would \
         be slower"
    } else {
        "zune-jpeg: built without the `turbojpeg` feature"
    }
}

/// How one image was decoded: the per-image choice, counted in stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodePath {
    /// The whole image by zune-jpeg or zune-png.
    Zune,
    /// The whole image by libjpeg-turbo.
    Turbo,
    /// Only the rows and columns under the crop, by libjpeg-turbo.
    TurboRegion,
    /// The crop's region shrunk in the DCT domain, by libjpeg-turbo.
    TurboScaled,
    /// Left to the device's decoder (`jpeg_decoder=gpu`/`auto`), by the prefetch thread.
    Device,
}

/// What of an image the transform will read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// `[x0, y0, x1, y1)` in pixels of the full-size image.
    pub rect: [usize; 4],
    /// Largest DCT scaling denominator (1, 2, 4 or 8) the transform accepts: one that leaves
    /// its resample shrinking by 3 or more (see `Pipeline::window`).
    pub max_scale: usize,
}

/// The header of an encoded image: its size, and which decoder will decode it.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    /// Size of the full image.
    pub dims: Dims,
    kind: Kind,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Png,
    ZuneJpeg,
    /// libjpeg-turbo, which reads the JPEG's header again when decoding (its handle must hold
    /// the header of the image it decompresses); `decode` checks it against `Header::dims`.
    #[cfg(feature = "turbojpeg")]
    Turbo,
}

/// Where the decoded pixels sit in the image: `bufs.rgb` holds `dims` pixels whose top-left is
/// `(x, y)` of the image shrunk by `1/scale`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// Size of the pixels in `bufs.rgb`.
    pub dims: Dims,
    /// Left of the decoded pixels, in pixels of the scaled image.
    pub x: usize,
    /// Top of the decoded pixels, in pixels of the scaled image.
    pub y: usize,
    /// DCT scaling denominator: 1 (full size), 2, 4 or 8.
    pub scale: usize,
    /// Which decoder, and how much of the image.
    pub path: DecodePath,
}

/// Reusable memory for decoding: the RGB8 output and, for PNGs that are not 8-bit RGB, the
/// decoder's native samples before conversion; the worker's libjpeg-turbo decompressor. Keep
/// one per thread; after the largest image has been seen, decoding allocates nothing here.
#[derive(Default)]
pub struct DecodeBuffers {
    /// Packed RGB8 pixels of the last decoded image (or region).
    pub rgb: Vec<u8>,
    native: Vec<u8>,
    #[cfg(feature = "turbojpeg")]
    turbo: Option<turbo::Turbo>,
}

/// Runs `f` on the worker's libjpeg-turbo decompressor, made on first use. After an error the
/// decompressor is thrown away and the next image gets a fresh one: libjpeg-turbo does not
/// always clean up after a failed call (see [`turbo::Turbo`]), and an error must affect exactly
/// the image that caused it. Errors are rare, a new decompressor costs microseconds.
#[cfg(feature = "turbojpeg")]
fn with_turbo<T>(
    slot: &mut Option<turbo::Turbo>,
    f: impl FnOnce(&mut turbo::Turbo) -> Result<T, String>,
) -> Result<T, String> {
    let decompressor = match slot {
        Some(d) => d,
        None => slot.insert(turbo::Turbo::new()?),
    };
    let result = f(decompressor);
    if result.is_err() {
        *slot = None;
    }
    result
}

fn sniff(encoded: &[u8]) -> Result<Format, String> {
    if encoded.is_empty() {
        return Err("empty file (0 bytes)".into());
    }
    Format::sniff(encoded).ok_or_else(|| {
        let head: Vec<String> = encoded.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!(
            "not a JPEG or PNG image (first bytes {}); formats are detected by content, not name",
            head.join(" ")
        )
    })
}

/// Runs a decoder call, turning a panic inside it into a "corrupt" error.
fn guarded<T>(format: Format, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let msg = crate::error::panic_message(&*panic);
        let name = match format {
            Format::Jpeg => "JPEG",
            Format::Png => "PNG",
        };
        Err(format!("corrupt {name} (the decoder failed: {msg})"))
    })
}

/// Reads the header of `encoded` and checks its size against `max_pixels`, without decoding
/// pixels: the first step of [`decode`].
pub fn read_header(
    encoded: &[u8],
    max_pixels: u64,
    decoder: JpegDecoder,
    bufs: &mut DecodeBuffers,
) -> Result<Header, String> {
    let format = sniff(encoded)?;
    let header = guarded(format, || {
        let _ = &bufs; // used only with feature `turbojpeg`
        match format {
            Format::Png => Ok(Header {
                dims: zune::png_dimensions(encoded)?,
                kind: Kind::Png,
            }),
            #[cfg(feature = "turbojpeg")]
            Format::Jpeg if decoder.turbo() => {
                let h = with_turbo(&mut bufs.turbo, |t| t.header(encoded))?;
                let kind = if h.decodable() {
                    Kind::Turbo
                } else {
                    Kind::ZuneJpeg
                };
                Ok(Header { dims: h.dims, kind })
            }
            Format::Jpeg => {
                let _ = decoder;
                Ok(Header {
                    dims: zune::jpeg_dimensions(encoded)?,
                    kind: Kind::ZuneJpeg,
                })
            }
        }
    })?;
    check_size(header.dims.width, header.dims.height, max_pixels)?;
    Ok(header)
}

/// The header of an image whose size the source stored beside it (a packed file's metadata
/// table): [`read_header`] without parsing the image, so a crop is planned from the table.
/// [`decode`] fails if the image is not `dims` after all.
pub fn stored_header(
    encoded: &[u8],
    dims: Dims,
    max_pixels: u64,
    decoder: JpegDecoder,
) -> Result<Header, String> {
    check_size(dims.width, dims.height, max_pixels)?;
    let kind = match sniff(encoded)? {
        Format::Png => Kind::Png,
        // libjpeg-turbo's verdict (CMYK and 12-bit JPEGs go to zune-jpeg) waits for the
        // header `decode` parses anyway.
        #[cfg(feature = "turbojpeg")]
        Format::Jpeg if decoder.turbo() => Kind::Turbo,
        Format::Jpeg => {
            let _ = decoder;
            Kind::ZuneJpeg
        }
    };
    Ok(Header { dims, kind })
}

/// Decodes the image whose header is `header` into `bufs.rgb`: only `window` of it where the
/// decoder can (libjpeg-turbo, lossy JPEGs), else the whole image. Errors are human-readable
/// reasons ("truncated JPEG: ..."), without the file name; an image whose size is not
/// `header.dims` is one.
pub fn decode(
    encoded: &[u8],
    header: &Header,
    window: Option<Window>,
    bufs: &mut DecodeBuffers,
) -> Result<Decoded, String> {
    // The size was checked against max_pixels by read_header or stored_header; the decoders
    // refuse an image of any other size before allocating its pixels.
    let dims = header.dims;
    let whole = |()| Decoded {
        dims,
        x: 0,
        y: 0,
        scale: 1,
        path: DecodePath::Zune,
    };
    #[cfg(not(feature = "turbojpeg"))]
    let _ = window; // only libjpeg-turbo decodes part of an image
    match header.kind {
        Kind::Png => guarded(Format::Png, || zune::decode_png(encoded, dims, bufs)).map(whole),
        Kind::ZuneJpeg => {
            guarded(Format::Jpeg, || zune::decode_jpeg(encoded, dims, bufs)).map(whole)
        }
        #[cfg(feature = "turbojpeg")]
        Kind::Turbo => guarded(Format::Jpeg, || {
            // libjpeg-turbo warns about a truncated stream and fills the rest with grey;
            // Pillow (and the zune path) report it.
            jpeg_is_whole(encoded)?;
            let rgb = &mut bufs.rgb;
            let region = with_turbo(&mut bufs.turbo, |t| {
                t.decompress(
                    encoded,
                    |h| {
                        if h.dims != dims {
                            return Err(size_mismatch(h.dims, dims));
                        }
                        Ok(h.decodable().then(|| match window {
                            Some(w) if h.croppable() => {
                                turbo::Turbo::region(h, w.rect, w.max_scale)
                            }
                            _ => turbo::Turbo::whole(h),
                        }))
                    },
                    rgb,
                )
            })?;
            // Not for libjpeg-turbo after all (CMYK, 12-bit): known only now for an image
            // whose header was not read before (stored_header).
            let Some(region) = region else {
                return zune::decode_jpeg(encoded, dims, bufs).map(whole);
            };
            let path = if region.scale > 1 {
                DecodePath::TurboScaled
            } else if region.dims != dims {
                DecodePath::TurboRegion
            } else {
                DecodePath::Turbo
            };
            Ok(Decoded {
                dims: region.dims,
                x: region.x,
                y: region.y,
                scale: region.scale,
                path,
            })
        }),
    }
}

/// The error for an image that is not the size its header (read before) or the dataset's
/// metadata said.
pub(super) fn size_mismatch(found: Dims, expected: Dims) -> String {
    format!(
        "the image is {}x{}, not the {}x{} its header or the dataset's metadata gave",
        found.width, found.height, expected.width, expected.height
    )
}

/// Decodes the whole of `encoded` into `bufs.rgb` as packed RGB8 and returns its size, with
/// the decoder `jpeg_decoder=auto` picks. Images with more than `max_pixels` pixels are
/// refused before their pixels are allocated.
pub fn decode_rgb(
    encoded: &[u8],
    max_pixels: u64,
    bufs: &mut DecodeBuffers,
) -> Result<Dims, String> {
    decode_rgb_with(encoded, max_pixels, JpegDecoder::Auto, bufs)
}

/// [`decode_rgb`] with a chosen JPEG decoder.
pub fn decode_rgb_with(
    encoded: &[u8],
    max_pixels: u64,
    decoder: JpegDecoder,
    bufs: &mut DecodeBuffers,
) -> Result<Dims, String> {
    let header = read_header(encoded, max_pixels, decoder, bufs)?;
    decode(encoded, &header, None, bufs).map(|d| d.dims)
}

/// Reads only the header: the image's size, without decoding pixels (a raw-pixel record's too).
pub fn dimensions(encoded: &[u8]) -> Result<Dims, String> {
    if let Some(raw) = raw_pixels(encoded, u64::MAX) {
        return raw.map(|(dims, _)| dims);
    }
    let format = Format::sniff(encoded).ok_or("not a JPEG or PNG image")?;
    guarded(format, || match format {
        Format::Jpeg => zune::jpeg_dimensions(encoded),
        Format::Png => zune::png_dimensions(encoded),
    })
}

pub(crate) fn check_size(width: usize, height: usize, max_pixels: u64) -> Result<usize, String> {
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

/// The size of a JPEG that a device's decoder (nvJPEG) takes as the CPU decoders do: baseline
/// or extended Huffman (SOF0/SOF1), 8-bit, 1 or 3 components, no Adobe colour-transform marker
/// (CMYK, YCCK and RGB-coded files, which decoders tell apart differently), and complete (its
/// EOI after the scan). `None` for anything else (progressive, arithmetic, lossless, 12-bit,
/// truncated), which the CPU decodes.
pub(crate) fn device_jpeg(data: &[u8]) -> Option<Dims> {
    if Format::sniff(data) != Some(Format::Jpeg) {
        return None;
    }
    let mut frame = None;
    let mut plain = true;
    walk_jpeg_header(data, |marker, at| match marker {
        0xC0 | 0xC1 => frame = data.get(at + 4..at + 10).map(<[u8]>::to_vec),
        // Any other start of frame: progressive, lossless, arithmetic, hierarchical.
        0xC2 | 0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => plain = false,
        0xEE if data.get(at + 4..at + 9) == Some(b"Adobe") => plain = false,
        _ => {}
    })?;
    let frame = frame.filter(|_| plain)?;
    let (precision, components) = (frame[0], frame[5]);
    let height = u16::from_be_bytes([frame[1], frame[2]]) as usize;
    let width = u16::from_be_bytes([frame[3], frame[4]]) as usize;
    (precision == 8 && matches!(components, 1 | 3) && width > 0 && height > 0 && jpeg_has_eoi(data))
        .then_some(Dims { width, height })
}

/// `Err` saying the stream is truncated unless it is whole ([`jpeg_has_eoi`]): decoders fill
/// a truncated stream's missing part with grey, where Pillow reports it.
pub(crate) fn jpeg_is_whole(data: &[u8]) -> Result<(), String> {
    if jpeg_has_eoi(data) {
        Ok(())
    } else {
        Err("truncated JPEG: no end-of-image marker after the image data".into())
    }
}

/// Whether an EOI marker (`FF D9`) follows the first scan. Entropy-coded data cannot contain it
/// (a data 0xFF is stuffed as `FF 00`), and an embedded EXIF thumbnail's EOI sits in an APP
/// segment before the first scan, which the header walk skips.
pub(crate) fn jpeg_has_eoi(data: &[u8]) -> bool {
    walk_jpeg_header(data, |_, _| {})
        // Searched from the end: the EOI is normally the last two bytes.
        .is_some_and(|scan| data[scan..].windows(2).rev().any(|w| w == [0xFF, 0xD9]))
}

#[cfg(test)]
pub(crate) mod tests;
