//! The image stage of phase 2: how an image field becomes its slot.
//!
//! An encoded image has its header read (or its size taken from the source, as packed files
//! store it), its crop planned from that size, only the window the crop reads decoded into the
//! worker's buffer ([`crate::decode`]), and is then transformed ([`crate::transform`]) straight
//! into the slot. A uint8 RGB tensor (`[H, W, 3]` or `[3, H, W]`) skips decoding: its size is
//! known when the collator is made, so it gets a pipeline built for that size, and a planar one
//! is interleaved into the worker's buffer first.

use std::sync::Arc;
use std::time::Instant;

use crate::decode::{
    decode as decode_part, raw_pixels, read_header, stored_header, DecodeBuffers, Dims, JpegDecoder,
};
use crate::dtype::{DType, Layout};
use crate::error::{Error, Result};
use crate::rng::Rng;
use crate::source::pixels::InputLayout;
use crate::source::FieldSpec;
use crate::span::{SpanKind, Stage};
use crate::stats::Spans;
use crate::transform::{Pipeline, Scratch as TransformScratch};

/// Decode buffers larger than this are released after use instead of kept for the next image.
const KEEP_DECODE_BYTES: usize = 64 << 20;

/// How image fields become slots: encoded images are decoded (refusing images over
/// `max_pixels` before allocating), then transformed by `pipeline` straight into the slot;
/// image-shaped tensors are transformed by a pipeline built for their size.
pub struct ImageStages {
    /// Largest `width * height` a decoded image may have (option `max_image_pixels`).
    pub max_pixels: u64,
    /// Which decoder decodes JPEGs (option `jpeg_decoder`).
    pub jpeg_decoder: JpegDecoder,
    /// How image-shaped uint8 tensor fields are stored (`None`: from their shape).
    pub input_layout: Option<InputLayout>,
    /// The transforms that write each encoded image into its slot; `None` where the spec leaves
    /// the size as it is, which only a source of image-shaped tensors (all of one size) allows.
    pub pipeline: Option<Arc<Pipeline>>,
    /// Option `transform`, from which each tensor field's pipeline is built.
    pub transform: Option<String>,
    /// Option `dtype` (`None`: from the spec), for the tensor fields' pipelines.
    pub dtype: Option<DType>,
    /// Option `layout`, for the tensor fields' pipelines.
    pub layout: Layout,
}

/// The pipeline for the image-shaped tensors of `field`, all `height`x`width`: their size is
/// known, so the spec need not fix it, and operations such as `color_jitter` may come first.
pub(super) fn tensor_pipeline(
    stages: &ImageStages,
    field: &FieldSpec,
    height: usize,
    width: usize,
) -> Result<Pipeline> {
    Pipeline::for_input(
        stages.transform.as_deref(),
        stages.dtype,
        stages.layout,
        height,
        width,
    )
    .map_err(|reason| {
        Error::option(
            "transform",
            format!("field `{}` ({width}x{height}): {reason}", field.name),
        )
    })
}

/// A worker's image buffers: the decoder's output and the transform's scratch.
#[derive(Default)]
pub(super) struct Pixels {
    decode: DecodeBuffers,
    transform: TransformScratch,
}

/// Decodes one encoded image (with its width and height when the source stored them) into the
/// worker's buffer, then transforms it into `out`; records both stages for the sample at
/// `(slot, index)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_image(
    stages: &ImageStages,
    pipeline: &Pipeline,
    (encoded, stored_size): (&[u8], Option<(u32, u32)>),
    rng: &mut Rng,
    out: &mut [u8],
    pixels: &mut Pixels,
    spans: &mut Spans,
    (slot, index): (usize, usize),
) -> std::result::Result<(), String> {
    let Pixels { decode, transform } = pixels;
    let start = Instant::now();
    // A raw-pixel record (packed `raw` mode) is read in place: no decode, no copy.
    if let Some(raw) = raw_pixels(encoded, stages.max_pixels) {
        let mid = Instant::now();
        spans.push_ended(SpanKind::Stage(Stage::Decode), slot, index, start, mid);
        let (dims, rgb) = raw?;
        let result = pipeline.apply(rgb, dims.width, dims.height, rng, out, transform);
        spans.push(SpanKind::Stage(Stage::Transform), slot, index, mid);
        return result;
    }
    // The crop is planned from the image's size, so the decoder reads only what the
    // transform will (see `decode`); the random draws are the same as after a whole decode.
    // A stored size (packed files) spares parsing the header for it.
    let header = match stored_size {
        Some((width, height)) => {
            let dims = Dims {
                width: width as usize,
                height: height as usize,
            };
            stored_header(encoded, dims, stages.max_pixels, stages.jpeg_decoder)
        }
        None => read_header(encoded, stages.max_pixels, stages.jpeg_decoder, decode),
    };
    let decoded = header.and_then(|header| {
        let plan = pipeline.plan(header.dims.width, header.dims.height, rng)?;
        let window = pipeline.window(&plan);
        Ok((decode_part(encoded, &header, Some(window), decode)?, plan))
    });
    let mid = Instant::now();
    spans.push_ended(SpanKind::Stage(Stage::Decode), slot, index, start, mid);
    let (decoded, plan) = decoded?;
    spans.count_decode(decoded.path);
    let result = pipeline.apply_decoded(&decode.rgb, &decoded, plan, rng, out, transform);
    spans.push(SpanKind::Stage(Stage::Transform), slot, index, mid);
    // Do not keep a rare huge image's buffers for the worker's lifetime.
    if decode.rgb.capacity() > KEEP_DECODE_BYTES {
        *decode = DecodeBuffers::default();
    }
    result
}

/// Transforms one uint8 RGB tensor of `height`x`width`, stored as `layout`, into `out`. The
/// caller records the span: there is no decode stage.
pub(super) fn write_tensor_image(
    pipeline: &Pipeline,
    (height, width, layout): (usize, usize, InputLayout),
    src: &[u8],
    rng: &mut Rng,
    out: &mut [u8],
    pixels: &mut Pixels,
) -> std::result::Result<(), String> {
    let Pixels { decode, transform } = pixels;
    let rgb = match layout {
        InputLayout::Hwc => src,
        InputLayout::Chw => {
            // Interleave the planes into the worker's pixel buffer.
            let plane = height * width;
            decode.rgb.clear();
            decode.rgb.resize(plane * 3, 0);
            for (i, px) in decode.rgb.chunks_exact_mut(3).enumerate() {
                for (c, v) in px.iter_mut().enumerate() {
                    *v = src[c * plane + i];
                }
            }
            &decode.rgb
        }
    };
    pipeline.apply(rgb, width, height, rng, out, transform)
}

