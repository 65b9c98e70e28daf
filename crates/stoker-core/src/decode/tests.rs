//! The decoders' tests, and the image fixtures other modules' tests read.

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

#[test]
fn the_device_takes_complete_baseline_jpegs_of_one_or_three_components_only() {
    for (name, takes) in [
        ("photo_baseline.jpg", true),
        ("photo_444.jpg", true),
        ("photo_gray.jpg", true),
        ("photo_progressive.jpg", false),
        ("photo_cmyk.jpg", false),
        ("photo_png.png", false),
    ] {
        let bytes = fixture(name);
        let dims = device_jpeg(&bytes);
        assert_eq!(dims.is_some(), takes, "{name}");
        if let Some(dims) = dims {
            assert_eq!(dims, dimensions(&bytes).unwrap(), "{name}");
        }
    }
    // Truncated: no EOI after the scan.
    let whole = fixture("photo_baseline.jpg");
    assert!(device_jpeg(&whole[..whole.len() / 2]).is_none());
    assert!(device_jpeg(&whole[..100]).is_none());
    assert!(device_jpeg(b"").is_none());
}
