//! The validated pipeline: its output size, type and layout, the per-channel lookup tables (and
//! their affine form where it reproduces them), and [`Pipeline::apply`], which plans a decoded
//! image and runs the kernels into the batch slot.

use fast_image_resize::Resizer;

use super::args::check_fill;
use super::augment::{self, Erase};
use super::cast::DeviceCast;
use super::frame::Frame;
use super::geometry::Plan;
use super::kernels::{
    materialise, resample_rgb, write_erase, write_f32, write_lut, write_u8, Affine, SrcView,
};
use super::mix::BatchMix;
use super::spec::{op_fill, parse, EraseValue, Op};
use crate::decode::{Decoded, Dims, Window};
use crate::dtype::{DType, Layout};
use crate::rng::{Rng, Stream};

/// Per-channel lookup tables: the output element for each 8-bit input value.
enum Lut {
    U8,
    /// The table, and its affine form when that reproduces it (see [`Affine`]).
    F32(Box<[[f32; 256]; 3]>, Option<Affine>),
    Half(Box<[[u16; 256]; 3]>),
}

/// Why a pipeline for encoded images (of varying sizes) was refused.
pub const NO_SIZE: &str = "images of a batch must all have one size: the transform must fix the \
     output size with resize(H, W), center_crop(S) or random_resized_crop(S) (e.g. \
     `resize(256) | center_crop(224)`)";

/// Why a pipeline whose size a drawn op (`scale_jitter`, `random_zoom_out`) left varying was
/// refused.
pub(super) fn varying_size(op: &str) -> String {
    format!(
        "images of a batch must all have one size, but {op} draws each sample's size: put {} \
         after it",
        size_fixers(op)
    )
}

/// The ops that may fix the size after `op` (a zoom-out runs after the resample, so no resize
/// may follow it), with an example.
pub(super) fn size_fixers(op: &str) -> &'static str {
    if op == "random_zoom_out" {
        "center_crop(S) or random_crop(S) (e.g. `random_zoom_out | random_crop(300, padding=150)`)"
    } else {
        "resize(H, W), center_crop(S), random_crop(S) or random_resized_crop(S) (e.g. \
         `scale_jitter(1024) | center_crop(1024)`)"
    }
}

/// The leading ops a trial plan can check when every input has one size: those before the
/// first op that draws the size (a crop after it fits some draws and not others, so it is
/// checked per sample).
pub(super) fn fixed_prefix(ops: &[Op]) -> &[Op] {
    let end = ops
        .iter()
        .position(|op| {
            matches!(
                op,
                Op::ScaleJitter { .. } | Op::RandomShortestSize { .. } | Op::RandomIouCrop(_)
            )
        })
        .unwrap_or(ops.len());
    &ops[..end]
}

/// A parsed, validated pipeline with a fixed output size.
pub struct Pipeline {
    ops: Vec<Op>,
    /// How many leading ops the geometry plan folds; the rest run on the materialised image.
    planned: usize,
    /// The batch-level mixing (`mixup`, `cutmix`), run by collate on the whole batch.
    mix: Option<BatchMix>,
    height: usize,
    width: usize,
    dtype: DType,
    layout: Layout,
    lut: Lut,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("ops", &self.ops)
            .field("height", &self.height)
            .field("width", &self.width)
            .field("dtype", &self.dtype)
            .field("layout", &self.layout)
            .finish()
    }
}

/// Reusable memory for [`Pipeline::apply`]: the resampled RGB8 image and the resizer's own
/// buffers. Each worker keeps one; after warm-up a sample allocates only fast_image_resize's
/// small coefficient tables.
#[derive(Default)]
pub struct Scratch {
    resized: Vec<u8>,
    resizer: Resizer,
    /// The crop-sized image the ops after the geometry plan work on, and their buffers.
    frame: Frame,
}

/// Whether the geometry plan can fold `op` (while no later-stage op precedes it).
pub(super) fn foldable(op: &Op) -> bool {
    matches!(
        op,
        Op::ResizeShorter(_)
            | Op::Resize { .. }
            | Op::CenterCrop { .. }
            | Op::RandomResizedCrop { .. }
            | Op::ScaleJitter { .. }
            | Op::RandomShortestSize { .. }
            | Op::RandomIouCrop(_)
            | Op::HFlip { .. }
            | Op::Normalize { .. }
    )
}

/// The spec name of `op`, for messages.
pub(super) fn op_name(op: &Op) -> &'static str {
    match op {
        Op::ResizeShorter(_) | Op::Resize { .. } => "resize",
        Op::CenterCrop { .. } => "center_crop",
        Op::RandomResizedCrop { .. } => "random_resized_crop",
        Op::ScaleJitter { .. } => "scale_jitter",
        Op::RandomShortestSize { .. } => "random_shortest_size",
        Op::RandomIouCrop(_) => "random_iou_crop",
        Op::HFlip { .. } => "hflip",
        Op::Normalize { .. } => "normalize",
        Op::RandomCrop { .. } => "random_crop",
        Op::RandomZoomOut { .. } => "random_zoom_out",
        Op::VFlip { .. } => "vflip",
        Op::ColorJitter { .. } => "color_jitter",
        Op::RandomPhotometricDistort { .. } => "random_photometric_distort",
        Op::Grayscale { .. } => "grayscale",
        Op::GaussianBlur { .. } => "gaussian_blur",
        Op::Rotate { .. } => "rotate",
        Op::Affine { .. } => "affine",
        Op::RandAugment { .. } => "rand_augment",
        Op::TrivialAugment => "trivial_augment",
        Op::AutoAugment => "auto_augment",
        Op::RandomErasing { .. } => "random_erasing",
        Op::Mixup { .. } => "mixup",
        Op::Cutmix { .. } => "cutmix",
    }
}

/// `normalize`'s means or standard deviations for an RGB image: one value for every channel,
/// or three.
fn rgb_values(values: &[f64], what: &str) -> Result<[f64; 3], String> {
    match *values {
        [v] => Ok([v; 3]),
        [r, g, b] => Ok([r, g, b]),
        _ => Err(format!(
            "normalize: {} {what} values for a 3-channel (RGB) image; give 1 or 3",
            values.len()
        )),
    }
}

impl Pipeline {
    /// Builds the pipeline of `spec` (None: no transform) for encoded images, whose size varies.
    /// `dtype` None picks `float32` when the pipeline normalizes, else `uint8`. The pipeline must
    /// fix the output size, so that every image of a batch has the same shape.
    pub fn new(
        spec: Option<&str>,
        dtype: Option<DType>,
        layout: Layout,
    ) -> Result<Pipeline, String> {
        Self::build(spec, dtype, layout, None)
    }

    /// Builds the pipeline of `spec` for images that are all `height`x`width` (image-shaped
    /// tensors): the output size is known from the start, so no operation has to fix it.
    pub fn for_input(
        spec: Option<&str>,
        dtype: Option<DType>,
        layout: Layout,
        height: usize,
        width: usize,
    ) -> Result<Pipeline, String> {
        Self::build(spec, dtype, layout, Some((height, width)))
    }

    fn build(
        spec: Option<&str>,
        dtype: Option<DType>,
        layout: Layout,
        input: Option<(usize, usize)>,
    ) -> Result<Pipeline, String> {
        let mut ops = match spec {
            Some(s) => parse(s)?,
            None => Vec::new(),
        };
        // Batch-level ops leave the per-sample list: collate runs them on the whole batch.
        let mix = BatchMix::from_ops(&ops)?;
        ops.retain(|op| !matches!(op, Op::Mixup { .. } | Op::Cutmix { .. }));
        if mix.is_some() && ops.is_empty() && input.is_none() {
            return Err(
                "mixup/cutmix: need per-sample operations that fix the image size \
                        before them (e.g. `random_resized_crop(224) | mixup(...)`)"
                    .into(),
            );
        }
        let mut size = input;
        let mut normalize = None;
        // The first op the geometry plan cannot fold: it and every later op run on the
        // materialised image.
        let planned = ops.iter().position(|op| !foldable(op)).unwrap_or(ops.len());
        let mut erasing = None;
        // The last op that drew the size, while no later op has fixed it.
        let mut varying = None;
        for (i, op) in ops.iter().enumerate() {
            let name = op_name(op);
            if let Some(fill) = op_fill(op) {
                check_fill(fill, DType::U8).map_err(|e| format!("{name}: {e}"))?;
            }
            if let Some(e) = erasing {
                if !matches!(op, Op::Normalize { .. }) {
                    return Err(format!(
                        "{name}: must come before {e}, which works on the final image (only \
                         normalize may follow it)"
                    ));
                }
            }
            match op {
                Op::ResizeShorter(_)
                | Op::Resize { .. }
                | Op::RandomResizedCrop { .. }
                | Op::ScaleJitter { .. }
                | Op::RandomShortestSize { .. }
                | Op::RandomIouCrop(_)
                    if i > planned =>
                {
                    return Err(format!(
                        "{name}: must come before {} (resampling runs before the operations \
                         on the crop-sized image)",
                        op_name(&ops[planned])
                    ));
                }
                Op::ResizeShorter(s) => {
                    size = size.map(|(h, w)| {
                        let (w, h) = super::geometry::resize_shorter(w, h, *s);
                        (h, w)
                    })
                }
                Op::ScaleJitter { .. }
                | Op::RandomShortestSize { .. }
                | Op::RandomZoomOut { .. }
                | Op::RandomIouCrop(_) => {
                    size = None;
                    varying = Some(name);
                }
                Op::Resize { height, width }
                | Op::CenterCrop { height, width }
                | Op::RandomResizedCrop { height, width, .. }
                | Op::RandomCrop { height, width, .. } => {
                    size = Some((*height, *width));
                    varying = None;
                }
                Op::HFlip { .. } | Op::VFlip { .. } | Op::Mixup { .. } | Op::Cutmix { .. } => {}
                Op::Normalize { mean, std } => {
                    if normalize.is_some() {
                        return Err("normalize appears twice".into());
                    }
                    normalize = Some((rgb_values(mean, "mean")?, rgb_values(std, "std")?));
                }
                Op::ColorJitter { .. }
                | Op::RandomPhotometricDistort { .. }
                | Op::Grayscale { .. }
                | Op::GaussianBlur { .. }
                | Op::Rotate { .. }
                | Op::Affine { .. }
                | Op::RandAugment { .. }
                | Op::TrivialAugment
                | Op::AutoAugment
                | Op::RandomErasing { .. } => {
                    if let (None, Some(v)) = (size, varying) {
                        return Err(format!(
                            "{name}: needs a fixed size before it, but {v} draws each \
                             sample's size: put {} between them",
                            size_fixers(v)
                        ));
                    }
                    if size.is_none() {
                        return Err(format!(
                            "{name}: needs a fixed size before it: put it after resize(H, W), \
                             center_crop, random_crop or random_resized_crop, so that it runs \
                             on the crop-sized image"
                        ));
                    }
                    if let Op::RandomErasing { .. } = op {
                        erasing = Some(name);
                    }
                }
            }
        }
        let (height, width) = match (size, varying) {
            (Some(size), _) => size,
            (None, Some(v)) => return Err(varying_size(v)),
            (None, None) => return Err(NO_SIZE.to_string()),
        };
        if let Some((h, w)) = input {
            // Every input has this size: a crop that cannot fit it is refused now, not at each
            // sample (the plan's random draws cannot make it fit).
            let mut rng = Rng::for_key(0, Stream::Augment, 0, 0);
            super::geometry::plan(fixed_prefix(&ops[..planned]), w, h, &mut rng)?;
        }
        let dtype = dtype.unwrap_or(if normalize.is_some() {
            DType::F32
        } else {
            DType::U8
        });
        // Each output element is lut[c][x] for input value x in channel c:
        //   with normalize:    (x / 255 - mean[c]) / std[c]
        //   float, no normalize: x / 255
        //   uint8, no normalize: x
        // computed in f64 and rounded once to the output type (half: round to nearest even).
        let value = |c: usize, x: usize| -> f64 {
            let x = x as f64 / 255.0;
            match normalize {
                Some((mean, std)) => (x - mean[c]) / std[c],
                None => x,
            }
        };
        let lut = match dtype {
            DType::U8 if normalize.is_some() => {
                return Err(
                    "normalize produces floats; use dtype float32, float16 or bfloat16".into(),
                )
            }
            DType::U8 => Lut::U8,
            DType::F32 => {
                let mut t = Box::new([[0f32; 256]; 3]);
                for (c, row) in t.iter_mut().enumerate() {
                    for (x, v) in row.iter_mut().enumerate() {
                        *v = value(c, x) as f32;
                    }
                }
                let affine = Affine::exact(normalize, &t);
                Lut::F32(t, affine)
            }
            DType::F16 | DType::BF16 => {
                let mut t = Box::new([[0u16; 256]; 3]);
                for (c, row) in t.iter_mut().enumerate() {
                    for (x, v) in row.iter_mut().enumerate() {
                        *v = if dtype == DType::F16 {
                            half::f16::from_f64(value(c, x)).to_bits()
                        } else {
                            half::bf16::from_f64(value(c, x)).to_bits()
                        };
                    }
                }
                Lut::Half(t)
            }
            DType::U16 => {
                return Err(
                    "dtype uint16 is for uint16 tensor images; an 8-bit image can be uint8, \
                     float32, float16 or bfloat16"
                        .into(),
                )
            }
            other => {
                return Err(format!(
                    "images can be uint8, float32, float16 or bfloat16, not {other}"
                ))
            }
        };
        if let Some(Op::RandomErasing { value, .. }) =
            ops.iter().find(|op| matches!(op, Op::RandomErasing { .. }))
        {
            match value {
                EraseValue::Fill(v)
                    if dtype == DType::U8 && v.iter().any(|v| !(0.0..=255.0).contains(v)) =>
                {
                    return Err(format!(
                        "random_erasing: value={v:?} is outside 0..=255 of the uint8 output"
                    ));
                }
                EraseValue::Random if dtype == DType::U8 => {
                    return Err(
                        "random_erasing: value=random (normal noise) needs a float output, not uint8"
                            .into(),
                    );
                }
                _ => {}
            }
        }
        Ok(Pipeline {
            ops,
            planned,
            mix,
            height,
            width,
            dtype,
            layout,
            lut,
        })
    }

    /// This pipeline's uint8 twin and the cast that turns the twin's output into this
    /// pipeline's on a device (`gpu_normalize`): the twin draws the same parameters and writes
    /// the bytes this pipeline's table would be applied to, and the cast applies that table, so
    /// the device output is this pipeline's, bit for bit. `Err` says why the output is not a
    /// table lookup of uint8 pixels.
    pub fn split_for_device(&self) -> Result<(Pipeline, DeviceCast), String> {
        let table: Vec<u8> = match &self.lut {
            Lut::U8 => return Err("the output is uint8 already".into()),
            Lut::F32(t, _) => t.iter().flatten().flat_map(|v| v.to_ne_bytes()).collect(),
            Lut::Half(t) => t.iter().flatten().flat_map(|v| v.to_ne_bytes()).collect(),
        };
        if self.mix.is_some() {
            return Err("mixup and cutmix blend the float output of the whole batch".into());
        }
        if self
            .ops
            .iter()
            .any(|op| matches!(op, Op::RandomErasing { .. }))
        {
            return Err("random_erasing writes its value in output units".into());
        }
        let twin = Pipeline {
            ops: self.ops.clone(),
            planned: self.planned,
            mix: None,
            height: self.height,
            width: self.width,
            dtype: DType::U8,
            layout: self.layout,
            lut: Lut::U8,
        };
        Ok((twin, DeviceCast::new(self.dtype, self.layout, 3, table)))
    }

    /// Why the device cannot write this pipeline's output from a whole decoded image (GPU
    /// decoding), or `None` when it can: its ops fold into the one plan (crops, resizes,
    /// flips), and its output is uint8 (under `gpu_normalize` the twin's, which the cast then
    /// makes floats).
    pub fn device_resize_refusal(&self) -> Option<String> {
        if let Some(op) = self.ops.get(self.planned) {
            return Some(format!(
                "`{}` runs on the CPU after the crop (only crops, resizes and flips run on the \
                 device)",
                op_name(op)
            ));
        }
        if self.mix.is_some() {
            return Some("mixup and cutmix blend the batch's images on the CPU".into());
        }
        if !matches!(self.lut, Lut::U8) {
            return Some(
                "the output is converted to floats on the CPU (gpu_normalize is off)".into(),
            );
        }
        None
    }

    /// The batch-level mixing, if the spec has `mixup` or `cutmix`.
    pub fn batch_mix(&self) -> Option<&BatchMix> {
        self.mix.as_ref()
    }

    /// Output layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The parsed operations, in spec order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Output height and width.
    pub fn output_size(&self) -> (usize, usize) {
        (self.height, self.width)
    }

    /// Element type of the output.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape of one sample's output: `[3, H, W]` or `[H, W, 3]`.
    pub fn shape(&self) -> Vec<usize> {
        match self.layout {
            Layout::Nchw => vec![3, self.height, self.width],
            Layout::Nhwc => vec![self.height, self.width, 3],
        }
    }

    /// Bytes of one sample's output.
    pub fn output_bytes(&self) -> usize {
        self.height * self.width * 3 * self.dtype.size()
    }

    /// Folds the ops for a `width`x`height` decoded image, drawing the random choices from `rng`
    /// in op order.
    /// Only the leading ops the plan can fold take part; the rest run after it.
    pub fn plan(&self, width: usize, height: usize, rng: &mut Rng) -> Result<Plan, String> {
        self.plan_boxed(width, height, None, rng)
    }

    /// [`plan`](Self::plan) for a sample with `boxes` (`xyxy` pixels), which `random_iou_crop`
    /// draws its crop from.
    pub fn plan_boxed(
        &self,
        width: usize,
        height: usize,
        boxes: Option<&[[f64; 4]]>,
        rng: &mut Rng,
    ) -> Result<Plan, String> {
        let ops = &self.ops[..self.planned];
        super::geometry::plan_with(ops, width, height, rng, boxes, &mut |_| {})
    }

    /// Transforms a decoded RGB8 image (`width * height * 3` bytes) into `out`, with fresh
    /// scratch memory: for one-off use (a loader's workers call [`apply`](Self::apply)).
    pub fn apply_rgb(
        &self,
        rgb: &[u8],
        width: usize,
        height: usize,
        rng: &mut Rng,
        out: &mut [u8],
    ) -> Result<(), String> {
        self.apply(rgb, width, height, rng, out, &mut Scratch::default())
    }

    /// Transforms a decoded RGB8 image (`width * height * 3` bytes) into `out` (exactly
    /// [`output_bytes`](Self::output_bytes) bytes), drawing the random choices from `rng`.
    pub fn apply(
        &self,
        rgb: &[u8],
        width: usize,
        height: usize,
        rng: &mut Rng,
        out: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<(), String> {
        self.apply_traced(rgb, width, height, rng, out, scratch, None)
    }

    /// [`apply`](Self::apply), appending each randomized op's drawn parameters to `trace` as
    /// one JSON object (`{"op": "rotate", "angle": 12.5}`) when given: the hook the
    /// equivalence tests replay through torchvision.
    #[allow(clippy::too_many_arguments)]
    pub fn apply_traced(
        &self,
        rgb: &[u8],
        width: usize,
        height: usize,
        rng: &mut Rng,
        out: &mut [u8],
        scratch: &mut Scratch,
        trace: Option<&mut Vec<String>>,
    ) -> Result<(), String> {
        self.apply_boxed(rgb, (width, height), None, rng, out, scratch, trace)
    }

    /// [`apply_traced`](Self::apply_traced) for a `(width, height)` image with `boxes` (`xyxy`
    /// pixels), which `random_iou_crop` draws its crop from.
    #[allow(clippy::too_many_arguments)]
    pub fn apply_boxed(
        &self,
        rgb: &[u8],
        (width, height): (usize, usize),
        boxes: Option<&[[f64; 4]]>,
        rng: &mut Rng,
        out: &mut [u8],
        scratch: &mut Scratch,
        mut trace: Option<&mut Vec<String>>,
    ) -> Result<(), String> {
        let plan = self.plan_boxed(width, height, boxes, rng)?;
        if let Some(t) = trace.as_deref_mut() {
            let [left, top, w, h] = plan.rect;
            t.push(format!(
                r#"{{"op":"plan","left":{left},"top":{top},"width":{w},"height":{h},"flip":{}}}"#,
                plan.flip
            ));
        }
        self.apply_plan(rgb, width, height, plan, rng, out, scratch, trace)
    }

    /// What of a `width`x`height` image `plan` reads: its source rectangle widened by the
    /// resampling filter's reach (and a margin), within the clip; and how far the image may be
    /// shrunk before resampling while the rectangle stays at least the output size (DCT
    /// scaling when decoding, see [`crate::decode::Window`]).
    pub fn window(&self, plan: &Plan) -> Window {
        let [left, top, w, h] = plan.rect;
        // The bilinear filter reaches one output pixel's width into the source on each side
        // when shrinking (the scale factor), one source pixel when enlarging.
        let reach_x = (w / plan.width as f64).max(1.0) + 2.0;
        let reach_y = (h / plan.height as f64).max(1.0) + 2.0;
        let [cx0, cy0, cx1, cy1] = plan.clip;
        let x0 = ((left - reach_x).floor().max(0.0) as usize).clamp(cx0, cx1);
        let y0 = ((top - reach_y).floor().max(0.0) as usize).clamp(cy0, cy1);
        let x1 = ((left + w + reach_x).ceil() as usize).clamp(x0, cx1);
        let y1 = ((top + h + reach_y).ceil() as usize).clamp(y0, cy1);
        // Shrink in the DCT domain only while the resample after it still shrinks by 3 or
        // more: its antialiasing filter then hides the difference between the DCT's box-like
        // reduction and a bilinear one (within 1 level on average and 8 at most of Pillow's
        // resize of the whole image, as a whole decode is). Measured on real photos, a
        // resample of about 2x after the DCT's 1/2 left pixels up to 13 levels off, and one of
        // 1-1.1x up to 30.
        let mut max_scale = 1;
        while max_scale < 8
            && !plan.is_copy()
            && w >= (6 * max_scale * plan.width) as f64
            && h >= (6 * max_scale * plan.height) as f64
        {
            max_scale *= 2;
        }
        Window {
            rect: [x0, y0, x1, y1],
            max_scale,
        }
    }

    /// Transforms the part of an image that [`decode`](crate::decode::decode) decoded for
    /// `plan` (made by [`plan`](Self::plan) from the full image's size): the plan is moved
    /// into the decoded pixels' coordinates and run as by [`apply`](Self::apply).
    #[allow(clippy::too_many_arguments)]
    pub fn apply_decoded(
        &self,
        rgb: &[u8],
        decoded: &Decoded,
        plan: Plan,
        rng: &mut Rng,
        out: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<(), String> {
        let plan = plan.in_region(decoded.x, decoded.y, decoded.scale, decoded.dims);
        let Dims { width, height } = decoded.dims;
        self.apply_plan(rgb, width, height, plan, rng, out, scratch, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_plan(
        &self,
        rgb: &[u8],
        width: usize,
        height: usize,
        plan: Plan,
        rng: &mut Rng,
        out: &mut [u8],
        scratch: &mut Scratch,
        trace: Option<&mut Vec<String>>,
    ) -> Result<(), String> {
        let Scratch {
            resized,
            resizer,
            frame,
        } = scratch;
        if out.len() != self.output_bytes() {
            return Err(format!(
                "output slot has {} bytes, the pipeline writes {}",
                out.len(),
                self.output_bytes()
            ));
        }
        if rgb.len() != width * height * 3 || width == 0 || height == 0 {
            return Err(format!(
                "decoded image has {} bytes, expected {width}x{height}x3",
                rgb.len()
            ));
        }
        if self.planned < self.ops.len() {
            return self.apply_stages(rgb, width, height, &plan, rng, out, trace, resizer, frame);
        }
        if (plan.width, plan.height) != (self.width, self.height) {
            return Err(format!(
                "internal: planned {}x{}, pipeline output {}x{}",
                plan.width, plan.height, self.width, self.height
            ));
        }
        let (src, stride, x0, y0) = if plan.is_copy() {
            (rgb, width * 3, plan.rect[0] as usize, plan.rect[1] as usize)
        } else {
            resample_rgb(rgb, width, height, &plan, resized, resizer)?;
            (resized.as_slice(), plan.width * 3, 0, 0)
        };
        let img = SrcView {
            data: src,
            stride,
            x0,
            y0,
            width: plan.width,
            height: plan.height,
            flip: plan.flip,
        };
        self.write_out(&img, out, None);
        Ok(())
    }

    /// The ops after the geometry plan: materialise the planned image (flipped if the plan
    /// flips) in the frame, run each op on it in place or through the frame's spare buffer,
    /// then the one output pass.
    ///
    /// Two shortcuts. A constant-fill crop right after the plan is drawn first, so only the
    /// window it keeps is resampled (see [`Plan::part`]): after `scale_jitter` the planned image
    /// can be four times the crop's area. And a trailing `hflip` is left to the output pass,
    /// which can read rows mirrored.
    #[allow(clippy::too_many_arguments)]
    fn apply_stages(
        &self,
        rgb: &[u8],
        width: usize,
        height: usize,
        plan: &Plan,
        rng: &mut Rng,
        out: &mut [u8],
        mut trace: Option<&mut Vec<String>>,
        resizer: &mut Resizer,
        frame: &mut Frame,
    ) -> Result<(), String> {
        let (cut, stages) = augment::draw_cut(&self.ops[self.planned..], plan, rng, &mut trace)?;
        match cut {
            Some(augment::Cut {
                width: cw,
                height: ch,
                part: Some((ref part, _)),
                ..
            }) if (part.width, part.height) == (cw, ch) => {
                // The kept part is the whole crop: nothing to fill.
                materialise(rgb, width, height, part, &mut frame.img, resizer)?;
                (frame.width, frame.height) = (cw, ch);
            }
            Some(cut) => {
                let fill = augment::byte_fill(cut.fill);
                frame.img.clear();
                frame.img.resize(cut.width * cut.height * 3, 0);
                let canvas = frame.img.as_chunks_mut::<3>().0;
                match &cut.part {
                    Some((part, at)) => {
                        materialise(rgb, width, height, part, &mut frame.spare, resizer)?;
                        let part_px = frame.spare.as_chunks::<3>().0;
                        super::warp::paste(part_px, part.width, canvas, cut.width, *at, fill);
                    }
                    None => canvas.fill(fill),
                }
                (frame.width, frame.height) = (cut.width, cut.height);
            }
            None => {
                materialise(rgb, width, height, plan, &mut frame.img, resizer)?;
                (frame.width, frame.height) = (plan.width, plan.height);
            }
        }
        // Only normalize (drawing nothing) may follow a trailing hflip.
        let last = stages
            .iter()
            .rposition(|op| !matches!(op, Op::Normalize { .. }));
        let trailing_flip = last.filter(|&i| matches!(stages[i], Op::HFlip { .. }));
        let mut erase = None;
        for op in &stages[..trailing_flip.unwrap_or(stages.len())] {
            if let Some(e) = augment::run(op, frame, rng, &mut trace)? {
                erase = Some(e);
            }
        }
        let flip = match trailing_flip {
            Some(i) => {
                let drawn = augment::draw(&stages[i], frame.width, frame.height, rng, &mut trace)?;
                matches!(drawn, augment::Drawn::Flip { vertical: false })
            }
            None => false,
        };
        if (frame.width, frame.height) != (self.width, self.height) {
            return Err(format!(
                "internal: transformed to {}x{}, pipeline output {}x{}",
                frame.width, frame.height, self.width, self.height
            ));
        }
        let img = SrcView {
            data: &frame.img,
            stride: frame.width * 3,
            x0: 0,
            y0: 0,
            width: frame.width,
            height: frame.height,
            flip,
        };
        self.write_out(&img, out, erase.as_ref());
        Ok(())
    }

    /// Whether float32 output is computed by the affine pass rather than looked up (tests).
    #[cfg(test)]
    pub(super) fn float32_affine(&self) -> bool {
        matches!(self.lut, Lut::F32(_, Some(_)))
    }

    /// The one output pass (type, normalisation, layout), then the erased box if any.
    fn write_out(&self, img: &SrcView<'_>, out: &mut [u8], erase: Option<&Erase>) {
        match &self.lut {
            Lut::U8 => write_u8(img, self.layout, out),
            Lut::F32(t, affine) => write_f32(img, self.layout, t, affine.as_ref(), out),
            Lut::Half(t) => write_lut(img, self.layout, t, out, u16::to_ne_bytes),
        }
        if let Some(e) = erase {
            write_erase(e, img.width, img.height, 3, self.layout, self.dtype, out);
        }
    }
}
