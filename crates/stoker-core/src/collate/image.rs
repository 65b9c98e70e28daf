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

use crate::batch::DeviceDecodes;
use crate::decode::mask::{decode_mask, MaskBuffers};
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
use crate::transform::{
    DensePipeline, DenseScratch, Pipeline, Role, Roles, Scratch as TransformScratch, TensorShape,
};

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
    /// The roles a leading `fields(...)` of the transform names (image, mask).
    pub roles: Option<Roles>,
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

/// The dense pipeline of tensor field `field` stored as `input`, in `role`; errors name the
/// field and its stored shape.
pub(super) fn dense_pipeline(
    stages: &ImageStages,
    field: &FieldSpec,
    input: TensorShape,
    role: Role,
) -> Result<DensePipeline> {
    // `dtype` is the image's; a stored mask keeps its labels' type.
    let dtype = match role {
        Role::Image => stages.dtype,
        Role::Mask { .. } => None,
    };
    DensePipeline::new(
        stages.transform.as_deref(),
        input,
        role,
        dtype,
        stages.layout,
    )
    .map_err(|reason| {
        Error::option(
            "transform",
            format!(
                "field `{}` ({} {}x{}, {} channel(s), {:?}): {reason}",
                field.name, input.dtype, input.width, input.height, input.channels, input.layout
            ),
        )
    })
}

/// A worker's image buffers: the decoder's output and the transforms' scratch.
#[derive(Default)]
pub(super) struct Pixels {
    decode: DecodeBuffers,
    transform: TransformScratch,
    dense: DenseScratch,
    mask: MaskBuffers,
    /// The last encoded mask's pipeline, keyed by its stages (their address) and its size.
    mask_pipeline: Option<((usize, usize, usize, DType), DensePipeline)>,
    /// The images of the slots being written that were left to the device's decoder.
    pub(super) routed: DeviceDecodes,
    /// Whether every image is decoded here, whatever GPU decoding's share (the replacement of
    /// an image the device could not decode).
    pub(super) on_cpu: bool,
}

/// Transforms one stored dense tensor (an image of any channel count, or a mask) into `out`.
/// The caller records the span: there is no decode stage.
pub(super) fn write_dense(
    pipeline: &DensePipeline,
    (src, boxes): (&[u8], Option<&[[f64; 4]]>),
    rng: &mut Rng,
    out: &mut [u8],
    pixels: &mut Pixels,
) -> std::result::Result<(), String> {
    pipeline.apply_boxed(src, boxes, rng, out, &mut pixels.dense)
}

/// A sample's boxes as `xyxy` pixels, if it has any, which `random_iou_crop` draws from.
pub(super) type SampleBoxes<'a> = Option<&'a [[f64; 4]]>;

/// An encoded image's bytes, its size if the source stored it, and its field's name.
pub(super) type ImageRef<'a> = (&'a [u8], Option<(u32, u32)>, &'a str);

/// Decodes one PNG mask and moves it with its sample's draw into `out` (int64 labels of the
/// `height`x`width` output): its size must be the image's, `image` (encoded, with its stored
/// size if the source knows it; named `image_name` in errors). The mask pipeline is built for
/// each sample's size, as the image's plan is: the same spec, so the same draws; `boxes` are
/// the sample's (`xyxy`), which `random_iou_crop` draws from.
pub(super) fn write_mask(
    stages: &ImageStages,
    (encoded, boxes): (&[u8], Option<&[[f64; 4]]>),
    (image, stored, image_name): ImageRef<'_>,
    rng: &mut Rng,
    out: &mut [u8],
    pixels: &mut Pixels,
) -> std::result::Result<(), String> {
    let image_dims = match stored {
        Some((width, height)) => Dims {
            width: width as usize,
            height: height as usize,
        },
        None => match raw_pixels(image, stages.max_pixels) {
            // A callback's image of varying size, beside its raw-mask record.
            Some(raw) => raw.map_err(|e| format!("image `{image_name}`: {e}"))?.0,
            None => {
                read_header(
                    image,
                    stages.max_pixels,
                    stages.jpeg_decoder,
                    &mut pixels.decode,
                )
                .map_err(|e| format!("image `{image_name}`: {e}"))?
                .dims
            }
        },
    };
    let (dims, labels) = decode_mask(encoded, stages.max_pixels, &mut pixels.mask)?;
    if dims != image_dims {
        return Err(format!(
            "the mask is {}x{} (WxH) but the image `{image_name}` is {}x{}; a mask labels the \
             pixels of its image, so it has the image's size",
            dims.width, dims.height, image_dims.width, image_dims.height
        ));
    }
    let input = TensorShape {
        height: dims.height,
        width: dims.width,
        channels: 1,
        dtype: labels,
        layout: InputLayout::Hwc,
    };
    let role = Role::Mask {
        ignore_index: stages.roles.as_ref().map_or(255, |r| r.ignore_index),
    };
    // Masks of one size and label type (most datasets', or a run of them) reuse the last
    // pipeline built.
    let key = (
        std::ptr::from_ref(stages) as usize,
        dims.height,
        dims.width,
        labels,
    );
    let pipeline = match pixels.mask_pipeline.take() {
        Some((k, p)) if k == key => p,
        _ => DensePipeline::new(
            stages.transform.as_deref(),
            input,
            role,
            Some(DType::I64),
            stages.layout,
        )?,
    };
    let done = pipeline.apply_boxed(&pixels.mask.labels, boxes, rng, out, &mut pixels.dense);
    pixels.mask_pipeline = Some((key, pipeline));
    done
}

/// Decodes one encoded image (with its width and height when the source stored them) into the
/// worker's buffer, then transforms it into `out`; records both stages for the sample at
/// `(slot, index)`. `boxes` are the sample's (`xyxy`), which `random_iou_crop` draws from.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_image(
    stages: &ImageStages,
    pipeline: &Pipeline,
    (encoded, stored_size, boxes): (&[u8], Option<(u32, u32)>, SampleBoxes<'_>),
    rng: &mut Rng,
    out: &mut [u8],
    pixels: &mut Pixels,
    spans: &mut Spans,
    (slot, index): (usize, usize),
) -> std::result::Result<(), String> {
    let Pixels {
        decode, transform, ..
    } = pixels;
    let start = Instant::now();
    // A raw-pixel record (packed `raw` mode) is read in place: no decode, no copy.
    if let Some(raw) = raw_pixels(encoded, stages.max_pixels) {
        let mid = Instant::now();
        spans.push_ended(SpanKind::Stage(Stage::Decode), slot, index, start, mid);
        let (dims, rgb) = raw?;
        let size = (dims.width, dims.height);
        let result = pipeline.apply_boxed(rgb, size, boxes, rng, out, transform, None);
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
        let plan = pipeline.plan_boxed(header.dims.width, header.dims.height, boxes, rng)?;
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
    (src, boxes): (&[u8], Option<&[[f64; 4]]>),
    rng: &mut Rng,
    out: &mut [u8],
    pixels: &mut Pixels,
) -> std::result::Result<(), String> {
    let Pixels {
        decode, transform, ..
    } = pixels;
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
    pipeline.apply_boxed(rgb, (width, height), boxes, rng, out, transform, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::decode_rgb;
    use crate::decode::tests::fixture;
    use crate::rng::Stream;

    fn stages(transform: Option<&str>) -> ImageStages {
        ImageStages {
            max_pixels: crate::decode::MAX_IMAGE_PIXELS,
            jpeg_decoder: JpegDecoder::Auto,
            input_layout: None,
            pipeline: None,
            transform: transform.map(str::to_owned),
            dtype: None,
            layout: Layout::Nhwc,
            roles: None,
        }
    }

    fn rng() -> Rng {
        Rng::for_key(1, Stream::Augment, 0, 5)
    }

    /// A 4x5 uint8 image, every value distinct.
    const H: usize = 4;
    const W: usize = 5;

    fn hwc() -> Vec<u8> {
        (0..H * W * 3).map(|i| (i * 7 % 256) as u8).collect()
    }

    #[test]
    fn a_planar_tensor_image_is_interleaved_then_transformed_like_its_hwc_twin() {
        let field = FieldSpec::tensor("data", DType::U8, &[3, H, W]);
        let pipeline = tensor_pipeline(&stages(Some("hflip(p=1)")), &field, H, W).unwrap();
        assert_eq!(pipeline.shape(), vec![H, W, 3]);
        let hwc = hwc();
        let mut chw = vec![0; hwc.len()];
        for (i, px) in hwc.chunks_exact(3).enumerate() {
            for c in 0..3 {
                chw[c * H * W + i] = px[c];
            }
        }
        let mut pixels = Pixels::default();
        let mut from_hwc = vec![0; H * W * 3];
        let mut from_chw = vec![0; H * W * 3];
        let size = (H, W, InputLayout::Hwc);
        write_tensor_image(
            &pipeline,
            size,
            (&hwc, None),
            &mut rng(),
            &mut from_hwc,
            &mut pixels,
        )
        .unwrap();
        let size = (H, W, InputLayout::Chw);
        write_tensor_image(
            &pipeline,
            size,
            (&chw, None),
            &mut rng(),
            &mut from_chw,
            &mut pixels,
        )
        .unwrap();
        assert_eq!(from_chw, from_hwc);
        // And the pipeline ran: every row mirrored.
        for y in 0..H {
            for x in 0..W {
                let got = &from_hwc[(y * W + x) * 3..][..3];
                let want = &hwc[(y * W + (W - 1 - x)) * 3..][..3];
                assert_eq!(got, want, "pixel ({y}, {x})");
            }
        }
    }

    #[test]
    fn a_tensor_pipeline_that_cannot_fit_the_tensors_names_the_field_and_size() {
        let field = FieldSpec::tensor("data", DType::U8, &[H, W, 3]);
        let e = tensor_pipeline(&stages(Some("center_crop(10)")), &field, H, W)
            .expect_err("a 10x10 crop of a 5x4 image is refused")
            .to_string();
        assert!(
            e.contains("transform") && e.contains("field `data` (5x4)"),
            "{e}"
        );
    }

    #[test]
    fn an_encoded_image_is_written_as_a_whole_decode_then_the_pipeline_would_write_it() {
        // zune-png decodes whole images, so the window decode is exact here.
        let png = fixture("photo_png.png");
        let pipeline =
            Pipeline::new(Some("random_resized_crop(16) | hflip"), None, Layout::Nhwc).unwrap();
        let stages = stages(None);
        let mut out = vec![0; pipeline.output_bytes()];
        let mut pixels = Pixels::default();
        let mut spans = Spans::default();
        let at = (3, 42);
        write_image(
            &stages,
            &pipeline,
            (&png, None, None),
            &mut rng(),
            &mut out,
            &mut pixels,
            &mut spans,
            at,
        )
        .unwrap();

        let mut bufs = DecodeBuffers::default();
        let dims = decode_rgb(&png, stages.max_pixels, &mut bufs).unwrap();
        let mut want = vec![0; pipeline.output_bytes()];
        pipeline
            .apply_rgb(&bufs.rgb, dims.width, dims.height, &mut rng(), &mut want)
            .unwrap();
        assert_eq!(out, want);

        let kinds: Vec<_> = spans
            .spans()
            .iter()
            .map(|s| (s.kind, s.slot, s.index))
            .collect();
        assert_eq!(
            kinds,
            [
                (SpanKind::Stage(Stage::Decode), 3, 42),
                (SpanKind::Stage(Stage::Transform), 3, 42),
            ]
        );
    }

    #[test]
    fn an_image_over_max_pixels_is_refused_before_it_is_decoded() {
        let bomb = fixture("bomb_10000x10000.png");
        let pipeline =
            Pipeline::new(Some("resize(8) | center_crop(8)"), None, Layout::Nhwc).unwrap();
        let mut out = vec![0; pipeline.output_bytes()];
        let mut pixels = Pixels::default();
        let mut spans = Spans::default();
        let e = write_image(
            &stages(None),
            &pipeline,
            (&bomb, None, None),
            &mut rng(),
            &mut out,
            &mut pixels,
            &mut spans,
            (0, 0),
        )
        .expect_err("100 megapixels is over the limit");
        assert!(e.contains("max_image_pixels"), "{e}");
        // Only the decode stage ran, and it allocated no pixel buffer for the image.
        assert_eq!(spans.spans().len(), 1);
        assert!(pixels.decode.rgb.capacity() < 10_000 * 10_000 * 3);
    }
}
