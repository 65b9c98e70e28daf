//! A transform spec as a user writes it (`random_resized_crop(224) | hflip | normalize(imagenet)`):
//! parsed, validated into a pipeline, and, when its output is small, run on a tiny image so the
//! planning arithmetic (crop boxes, scales, ratios, flips) meets every parsed value.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stoker_core::decode::{decode_rgb, DecodeBuffers};
use stoker_core::rng::{Rng, Stream};
use stoker_core::transform::parse;
use stoker_core::{DType, Layout, Pipeline};

/// Output sizes reach 65535x65535; only pipelines with an output this small are run.
const MAX_RUN_BYTES: usize = 1 << 20;

const TINY_WIDTH: usize = 7;
const TINY_HEIGHT: usize = 5;

/// A 7x5 RGB PNG, made once with a minimal stored-deflate encoder so no seed file is needed.
fn tiny_png() -> &'static [u8] {
    static PNG: OnceLock<Vec<u8>> = OnceLock::new();
    PNG.get_or_init(|| {
        let (w, h) = (TINY_WIDTH as u32, TINY_HEIGHT as u32);
        let mut raw = Vec::new();
        for y in 0..h {
            raw.push(0); // filter: none
            for x in 0..w {
                raw.extend_from_slice(&[(x * 36) as u8, (y * 60) as u8, ((x + y) * 20) as u8]);
            }
        }
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&w.to_be_bytes());
        ihdr.extend_from_slice(&h.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        chunk(&mut png, b"IHDR", &ihdr);
        // zlib: header, one stored block, Adler-32.
        let mut z = vec![0x78, 0x01, 0x01];
        let n = raw.len() as u16;
        z.extend_from_slice(&n.to_le_bytes());
        z.extend_from_slice(&(!n).to_le_bytes());
        z.extend_from_slice(&raw);
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in &raw {
            a = (a + byte as u32) % 65521;
            b = (b + a) % 65521;
        }
        z.extend_from_slice(&((b << 16) | a).to_be_bytes());
        chunk(&mut png, b"IDAT", &z);
        chunk(&mut png, b"IEND", &[]);
        png
    })
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], body: &[u8]) {
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    let mut crc = !0u32;
    for &byte in kind.iter().chain(body) {
        crc ^= byte as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    out.extend_from_slice(&(!crc).to_be_bytes());
}

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse(spec);
    let (dtype, layout) = match data.len() % 4 {
        0 => (None, Layout::Nchw),
        1 => (Some(DType::U8), Layout::Nhwc),
        2 => (Some(DType::F16), Layout::Nchw),
        _ => (Some(DType::BF16), Layout::Nhwc),
    };
    // Half the inputs build the pipeline of an image-shaped tensor of a known (small) size,
    // where the spec need not fix it; the tiny PNG below is that size.
    let built = if data.len() % 8 < 4 {
        Pipeline::new(Some(spec), dtype, layout)
    } else {
        Pipeline::for_input(Some(spec), dtype, layout, TINY_HEIGHT, TINY_WIDTH)
    };
    let Ok(pipeline) = built else {
        return;
    };
    let bytes = pipeline.output_bytes();
    if bytes > MAX_RUN_BYTES {
        return;
    }
    let mut out = vec![0u8; bytes];
    let mut bufs = DecodeBuffers::default();
    let Ok(dims) = decode_rgb(tiny_png(), 1 << 16, &mut bufs) else {
        return;
    };
    for index in 0..4 {
        let mut rng = Rng::for_key(1, Stream::Augment, 0, index);
        let _ = pipeline.apply_rgb(&bufs.rgb, dims.width, dims.height, &mut rng, &mut out);
    }
});
