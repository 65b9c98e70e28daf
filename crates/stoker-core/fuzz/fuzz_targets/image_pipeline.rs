//! Encoded bytes → header → crop plan → decode of the crop's region → fused transform into a
//! batch slot, as a worker does for every image sample, with libjpeg-turbo or zune-jpeg. Must
//! return `Ok` or `Err`, never panic, hang or allocate beyond `max_image_pixels`.
//!
//! Then, on the same decode buffers (one worker's), a fixed good JPEG is decoded whole and by
//! region, and must give exactly the pixels a fresh decode gives: whatever the input did, an
//! error never outlives its sample.
//!
//! The input is the whole file (seeds are real JPEGs and PNGs), so the pipeline cannot be chosen
//! by a prefix byte without spoiling them: its length picks one, which still varies the
//! operations, output type and layout across inputs.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stoker_core::decode::{
    decode, decode_rgb_with, read_header, DecodeBuffers, Decoded, JpegDecoder, Window,
};
use stoker_core::rng::{Rng, Stream};
use stoker_core::{DType, Layout, Pipeline};

/// 1 Mpx: the test photos (500x375) fit, a forged header asking for more is refused before any
/// pixel is allocated, so one input costs at most a few MB.
const MAX_PIXELS: u64 = 1 << 20;

/// The good image decoded after every input: a small baseline JPEG of the seeds.
const GOOD: &[u8] = include_bytes!("../seeds/image_pipeline/small_baseline.jpg");

/// A window inside [`GOOD`], so that libjpeg-turbo decodes a region of it.
const GOOD_WINDOW: Window = Window {
    rect: [9, 5, 30, 20],
    max_scale: 1,
};

/// [`GOOD`] decoded whole and by [`GOOD_WINDOW`] with `decoder`, on `bufs`.
fn decode_good(decoder: JpegDecoder, bufs: &mut DecodeBuffers) -> [(Decoded, Vec<u8>); 2] {
    let header = read_header(GOOD, MAX_PIXELS, decoder, bufs).expect("the good JPEG's header");
    [None, Some(GOOD_WINDOW)].map(|window| {
        let decoded = decode(GOOD, &header, window, bufs).expect("the good JPEG decodes");
        (decoded, bufs.rgb.clone())
    })
}

/// What fresh buffers give for [`GOOD`], per decoder (libjpeg-turbo, zune-jpeg).
fn good_reference(decoder: JpegDecoder) -> &'static [(Decoded, Vec<u8>); 2] {
    static REFERENCE: OnceLock<[[(Decoded, Vec<u8>); 2]; 2]> = OnceLock::new();
    let reference = REFERENCE.get_or_init(|| {
        [JpegDecoder::Turbo, JpegDecoder::Zune]
            .map(|d| decode_good(d, &mut DecodeBuffers::default()))
    });
    &reference[usize::from(decoder == JpegDecoder::Zune)]
}

fn pipelines() -> &'static [Pipeline] {
    static PIPELINES: OnceLock<Vec<Pipeline>> = OnceLock::new();
    PIPELINES.get_or_init(|| {
        [
            (
                "random_resized_crop(32) | hflip | normalize(imagenet)",
                None,
                Layout::Nchw,
            ),
            ("resize(40) | center_crop(32)", Some(DType::U8), Layout::Nhwc),
            (
                "hflip(p=1) | center_crop(16, 24) | resize(7, 13)",
                Some(DType::BF16),
                Layout::Nchw,
            ),
            (
                "random_resized_crop(9, 31, scale=0.5:1, ratio=1/3:3) | normalize(mean=0.5, std=0.25,0.5,1)",
                Some(DType::F16),
                Layout::Nhwc,
            ),
            ("resize(3, 2)", Some(DType::F32), Layout::Nchw),
        ]
        .into_iter()
        .map(|(spec, dtype, layout)| {
            Pipeline::new(Some(spec), dtype, layout)
                .unwrap_or_else(|e| panic!("fuzz pipeline `{spec}`: {e}"))
        })
        .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    // Both JPEG decoders, alternating with the length (see `pipeline_input`).
    let decoder = if (data.len() / (pipelines().len() + 1)) % 2 == 0 {
        JpegDecoder::Turbo
    } else {
        JpegDecoder::Zune
    };
    let mut bufs = DecodeBuffers::default();
    pipeline_input(data, decoder, &mut bufs);
    assert!(
        decode_good(decoder, &mut bufs) == *good_reference(decoder),
        "{decoder:?}: the good JPEG decoded after this input differs from a fresh decode"
    );
});

/// The input through the decoder and one pipeline, on `bufs`.
fn pipeline_input(data: &[u8], decoder: JpegDecoder, bufs: &mut DecodeBuffers) {
    let pipes = pipelines();
    // One input in (pipelines + 1) is decoded alone, to check what the decoder promises; the
    // others are decoded and go through a pipeline.
    let pick = data.len() % (pipes.len() + 1);
    let Some(pipeline) = pipes.get(pick) else {
        if let Ok(dims) = decode_rgb_with(data, MAX_PIXELS, decoder, bufs) {
            let pixels = dims.width as u64 * dims.height as u64;
            assert!(
                (1..=MAX_PIXELS).contains(&pixels),
                "decoded {}x{}",
                dims.width,
                dims.height
            );
            assert_eq!(bufs.rgb.len(), dims.width * dims.height * 3);
        }
        return;
    };
    // Plan the crop from the header, decode what it reads, transform, as collate does for an
    // image field.
    let Ok(header) = read_header(data, MAX_PIXELS, decoder, bufs) else {
        return;
    };
    let mut rng = Rng::for_key(7, Stream::Augment, 0, data.len() as u64);
    let Ok(plan) = pipeline.plan(header.dims.width, header.dims.height, &mut rng) else {
        return;
    };
    let Ok(decoded) = decode(data, &header, Some(pipeline.window(&plan)), bufs) else {
        return;
    };
    assert_eq!(bufs.rgb.len(), decoded.dims.width * decoded.dims.height * 3);
    let mut out = vec![0u8; pipeline.output_bytes()];
    let mut scratch = stoker_core::transform::Scratch::default();
    let _ = pipeline.apply_decoded(&bufs.rgb, &decoded, plan, &mut rng, &mut out, &mut scratch);
}
