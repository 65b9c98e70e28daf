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
}

impl JpegDecoder {
    /// The option's words: `auto`, `zune`, `turbo`.
    pub fn parse(text: &str) -> Result<JpegDecoder, String> {
        match text {
            "auto" => Ok(JpegDecoder::Auto),
            "zune" => Ok(JpegDecoder::Zune),
            "turbo" if cfg!(feature = "turbojpeg") => Ok(JpegDecoder::Turbo),
            "turbo" => Err(
                "jpeg_decoder=turbo: this build has no libjpeg-turbo (cargo \
                            feature `turbojpeg` is off)"
                    .into(),
            ),
            other => Err(format!(
                "jpeg_decoder={other}: expected auto, zune or turbo"
            )),
        }
    }

    /// Whether JPEGs go to libjpeg-turbo.
    #[cfg_attr(not(feature = "turbojpeg"), allow(dead_code))]
    fn turbo(self) -> bool {
        match self {
            JpegDecoder::Auto => cfg!(all(feature = "turbojpeg", turbojpeg_simd)),
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
            if !jpeg_has_eoi(encoded) {
                return Err("truncated JPEG: no end-of-image marker after the image data".into());
            }
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

/// Reads only the header: the image's size, without decoding pixels.
pub fn dimensions(encoded: &[u8]) -> Result<Dims, String> {
    let format = Format::sniff(encoded).ok_or("not a JPEG or PNG image")?;
    guarded(format, || match format {
        Format::Jpeg => zune::jpeg_dimensions(encoded),
        Format::Png => zune::png_dimensions(encoded),
    })
}

pub(super) fn check_size(width: usize, height: usize, max_pixels: u64) -> Result<usize, String> {
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

/// Whether an EOI marker (`FF D9`) follows the first scan. Entropy-coded data cannot contain it
/// (a data 0xFF is stuffed as `FF 00`), and an embedded EXIF thumbnail's EOI sits in an APP
/// segment before the first scan, which the header walk skips.
pub(super) fn jpeg_has_eoi(data: &[u8]) -> bool {
    walk_jpeg_header(data, |_, _| {})
        // Searched from the end: the EOI is normally the last two bytes.
        .is_some_and(|scan| data[scan..].windows(2).rev().any(|w| w == [0xFF, 0xD9]))
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

    /// A region decoded by libjpeg-turbo holds exactly the pixels of the whole decode at that
    /// place (its left edge moved to the iMCU grid), for every subsampling and for
    /// progressive files.
    #[cfg(feature = "turbojpeg")]
    #[test]
    fn turbo_region_equals_the_whole_image_there() {
        let mut rng = Rng::for_key(3, Stream::Augment, 0, 0);
        for name in [
            "photo_baseline.jpg",
            "photo_progressive.jpg",
            "photo_gray.jpg",
            "photo_444.jpg",
        ] {
            let bytes = fixture(name);
            let mut bufs = DecodeBuffers::default();
            let header = read_header(&bytes, u64::MAX, JpegDecoder::Turbo, &mut bufs).unwrap();
            let whole = super::decode(&bytes, &header, None, &mut bufs).unwrap();
            assert_eq!(whole.path, DecodePath::Turbo, "{name}");
            let full = bufs.rgb.clone();
            let Dims { width, height } = header.dims;
            for _ in 0..20 {
                let x0 = rng.below(width as u64 - 1) as usize;
                let y0 = rng.below(height as u64 - 1) as usize;
                let x1 = x0 + 1 + rng.below((width - x0 - 1) as u64) as usize;
                let y1 = y0 + 1 + rng.below((height - y0 - 1) as u64) as usize;
                let window = Window {
                    rect: [x0, y0, x1, y1],
                    max_scale: 1,
                };
                let part = super::decode(&bytes, &header, Some(window), &mut bufs).unwrap();
                assert!(
                    part.x <= x0 && part.y <= y0,
                    "{name}: {part:?} for {window:?}"
                );
                assert!(part.x + part.dims.width >= x1 && part.y + part.dims.height >= y1);
                for y in y0..y1 {
                    let got = &bufs.rgb[((y - part.y) * part.dims.width + x0 - part.x) * 3..]
                        [..(x1 - x0) * 3];
                    let at = (y * width + x0) * 3;
                    assert!(
                        got == &full[at..at + (x1 - x0) * 3],
                        "{name}: row {y} of {window:?} ({part:?}) differs from the whole decode"
                    );
                }
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

    /// An image whose size is stored beside it (packed files) decodes exactly as when its
    /// header is read first, with every decoder: CMYK JPEGs still go to zune-jpeg. A stored
    /// size that is wrong is an error, and one over `max_pixels` is refused without decoding.
    #[test]
    fn a_stored_size_stands_in_for_the_header_and_is_checked() {
        let decoders: &[JpegDecoder] = if turbo_available() {
            &[JpegDecoder::Turbo, JpegDecoder::Zune]
        } else {
            &[JpegDecoder::Zune]
        };
        for &decoder in decoders {
            for name in [
                "photo_baseline.jpg",
                "photo_cmyk.jpg",
                "photo_gray.jpg",
                "png_rgba.png",
            ] {
                let bytes = fixture(name);
                let mut bufs = DecodeBuffers::default();
                let read = read_header(&bytes, u64::MAX, decoder, &mut bufs).unwrap();
                let whole = super::decode(&bytes, &read, None, &mut bufs).unwrap();
                let expected = std::mem::take(&mut bufs.rgb);
                let stored = stored_header(&bytes, read.dims, u64::MAX, decoder).unwrap();
                let got = super::decode(&bytes, &stored, None, &mut bufs).unwrap();
                assert_eq!((got, &bufs.rgb), (whole, &expected), "{name} {decoder:?}");

                let Dims { width, height } = read.dims;
                let pixels = (width * height) as u64;
                let err = stored_header(&bytes, read.dims, pixels - 1, decoder).unwrap_err();
                assert!(err.contains("max_image_pixels"), "{name}: {err}");
                for lie in [
                    Dims {
                        width: width - 1,
                        height,
                    },
                    Dims {
                        width,
                        height: height + 1,
                    },
                ] {
                    let stored = stored_header(&bytes, lie, u64::MAX, decoder).unwrap();
                    let err = super::decode(&bytes, &stored, None, &mut bufs).unwrap_err();
                    let says = format!(
                        "the image is {width}x{height}, not the {}x{}",
                        lie.width, lie.height
                    );
                    assert!(err.contains(&says), "{name} {decoder:?}: {err}");
                }
            }
        }
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
        // zune-jpeg's refusal; libjpeg-turbo decodes arithmetic-coded and lossless JPEGs.
        let decode = |bytes: &[u8]| {
            let mut bufs = DecodeBuffers::default();
            decode_rgb_with(bytes, u64::MAX, JpegDecoder::Zune, &mut bufs)
        };
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
