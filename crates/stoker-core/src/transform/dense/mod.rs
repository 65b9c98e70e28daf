//! Dense tensors: image-shaped tensor fields of any channel count and element type
//! (multispectral stacks, float images) and the segmentation masks that share an image's draw.
//!
//! The RGB8 [`Pipeline`](super::Pipeline) keeps interleaved 8-bit pixels and per-channel
//! lookup tables; a tensor image of `C` channels of `uint8`, `uint16`, `float16`, `bfloat16` or
//! `float32` goes through a [`DensePipeline`] instead, which works plane by plane with the same
//! design: the geometric ops fold into one [`Plan`] per sample (the same function, so the same draws),
//! one resample writes each output plane, the ops after the plan (`augment::draw`: the same
//! draws again) move the crop-sized planes, and one output pass normalizes, converts and lays
//! out into the slot. Floats stay floats: `float16`/`bfloat16` are widened to `float32` once,
//! resampled as `float32`, and rounded once on output; `uint8` is resampled as `uint8` (the
//! same fixed-point filter as RGB8, so each plane equals the matching channel of an RGB resample).
//! `uint16` (16-bit medical and satellite data) is widened to `float32` (exact: every uint16
//! is a float32) and resampled and warped there, then rounded half to even once on output when
//! the output stays `uint16`: fast_image_resize's 16-bit kernels would round each of the two
//! resample passes and round again after a warp, so the float path is the one that loses
//! nothing but the final rounding. Its values are kept in stored units (a float output is not
//! scaled to `[0, 1]`: 16-bit data rarely fills the range, so `normalize` takes its mean and
//! std in stored units).
//!
//! A mask ([`Role::Mask`]) takes every geometric op of its image's spec with the image's draws
//! (the rng of a sample's fields is keyed alike, and both pipelines draw through the same
//! code in the same order), sampled nearest-neighbour so labels are never blended: a resample
//! takes source pixel `floor(left + j * scale)` (torch's `nearest`, what torchvision v2 does to
//! a `Mask`), a warp rounds to the nearest pixel, and what no source pixel covers (padding,
//! the corners of a rotation) is `ignore_index`. Colour ops and `random_erasing` leave it
//! as it is but still draw, so the image's later draws stay in step.
//!
//! Colour ops (`color_jitter`, `random_photometric_distort`, `grayscale`, `gaussian_blur` and
//! the AutoAugment family) are defined for RGB8 here; a pipeline for any other image refuses
//! them when it is built.

mod planes;

use fast_image_resize::Resizer;

pub use planes::DenseScratch;
use planes::{copy_plane, nearest_plane, warp_bilinear, warp_nearest, Planes, Px};

use super::args::check_fill;
use super::augment::{self, aug_is_geometric, Drawn, Erase};
use super::cast::DeviceCast;
use super::geometry::Plan;
use super::kernels::write_erase;
use super::pipeline::{foldable, op_name};
use super::spec::{op_fill, parse, EraseValue, Op, MAX_CHANNELS};
use super::warp::{pad_index, paste, round_ties_even};
use crate::dtype::{DType, Layout};
use crate::rng::{Rng, Stream};
use crate::source::pixels::InputLayout;

/// The stored shape of an image-shaped tensor field: every sample's is the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorShape {
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// Channels (1 for a mask).
    pub channels: usize,
    /// Element type as stored.
    pub dtype: DType,
    /// Channels last (`[H, W, C]`) or first (`[C, H, W]`); a mask is `[H, W]`, either.
    pub layout: InputLayout,
}

impl TensorShape {
    /// Bytes of one stored sample.
    pub fn bytes(&self) -> usize {
        self.height * self.width * self.channels * self.dtype.size()
    }
}

/// What a field is to its sample's draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An image: resampled with the antialiased bilinear filter, normalized, converted.
    Image,
    /// A segmentation mask: nearest-neighbour, labels kept, `ignore_index` where uncovered.
    Mask {
        /// The label of uncovered pixels.
        ignore_index: i64,
    },
}

/// A validated pipeline for one dense tensor field (see the module docs).
#[derive(Debug)]
pub struct DensePipeline {
    ops: Vec<Op>,
    planned: usize,
    input: TensorShape,
    role: Role,
    height: usize,
    width: usize,
    dtype: DType,
    layout: Layout,
    /// Per channel: `(mean, std)` of `normalize`, or `(0, 1)`.
    norm: Vec<(f64, f64)>,
    /// Stored units per output unit before normalizing: 255 for uint8 scaled to `[0, 1]` by a
    /// float output, 1 otherwise.
    unit: f64,
}

/// Whether `op` changes colours only (defined on RGB8 here).
fn colour_only(op: &Op) -> bool {
    matches!(
        op,
        Op::ColorJitter { .. }
            | Op::RandomPhotometricDistort { .. }
            | Op::Grayscale { .. }
            | Op::GaussianBlur { .. }
            | Op::RandAugment { .. }
            | Op::TrivialAugment
            | Op::AutoAugment
    )
}

/// Checks that an RGB-style `[v; 3]` fill gives one value for each of `channels` of an image:
/// the value itself when all three agree, the three when there are three channels. A mask
/// fills with `ignore_index` instead, so any fill suits it.
fn channel_fill(fill: [f64; 3], channels: usize, role: Role, what: &str) -> Result<(), String> {
    if role == Role::Image && channels != 3 && (fill[1] != fill[0] || fill[2] != fill[0]) {
        return Err(format!(
            "{what}: three fill values are for RGB; a {channels}-channel image takes one value \
             for every channel"
        ));
    }
    Ok(())
}

impl DensePipeline {
    /// Builds the pipeline of `spec` for `input` in `role`; `dtype` None picks `float32` when
    /// the pipeline normalizes, else the stored type. Errors name the op and the input, not the
    /// field (the caller adds it).
    pub fn new(
        spec: Option<&str>,
        input: TensorShape,
        role: Role,
        dtype: Option<DType>,
        layout: Layout,
    ) -> Result<DensePipeline, String> {
        let what = match role {
            Role::Image => format!("a {}-channel {} image", input.channels, input.dtype.name()),
            Role::Mask { .. } => format!("a {} mask", input.dtype.name()),
        };
        if input.height == 0 || input.width == 0 || input.channels == 0 {
            return Err(format!("{what} of {}x{}: empty", input.width, input.height));
        }
        if input.channels > MAX_CHANNELS {
            return Err(format!(
                "{what}: more than {MAX_CHANNELS} channels; is input_layout right?"
            ));
        }
        let elements_ok = match role {
            Role::Image => matches!(
                input.dtype,
                DType::U8 | DType::U16 | DType::F16 | DType::BF16 | DType::F32
            ),
            Role::Mask { .. } => {
                matches!(
                    input.dtype,
                    DType::U8 | DType::U16 | DType::I32 | DType::I64
                ) && input.channels == 1
            }
        };
        if !elements_ok {
            return Err(match role {
                Role::Image => format!(
                    "tensor images can be uint8, uint16, float16, bfloat16 or float32, not {}",
                    input.dtype
                ),
                Role::Mask { .. } => format!(
                    "a mask is an [H, W] tensor of uint8, uint16, int32 or int64 labels, not {} \
                     with {} channels",
                    input.dtype, input.channels
                ),
            });
        }
        // A mask keeps its labels' type, or widens uint8 labels to int64 (a PNG mask's labels
        // are decoded as bytes, and batched as int64 as torchvision's are).
        let mask_dtype = match (role, dtype) {
            (Role::Image, _) => None,
            (Role::Mask { .. }, None) => Some(input.dtype),
            (Role::Mask { .. }, Some(d))
                if d == input.dtype
                    || (matches!(input.dtype, DType::U8 | DType::U16) && d == DType::I64) =>
            {
                Some(d)
            }
            (Role::Mask { .. }, Some(d)) => {
                return Err(format!(
                    "{what}: labels keep their type (or widen from uint8 or uint16 to int64), \
                     not {d}"
                ))
            }
        };
        if let (Role::Mask { ignore_index }, Some(labels)) = (role, mask_dtype) {
            let fits = match labels {
                DType::U8 => u8::try_from(ignore_index).is_ok(),
                DType::U16 => u16::try_from(ignore_index).is_ok(),
                DType::I32 => i32::try_from(ignore_index).is_ok(),
                _ => true,
            };
            if !fits {
                return Err(format!(
                    "ignore_index={ignore_index} does not fit {what}'s labels"
                ));
            }
        }
        let ops = match spec {
            Some(s) => parse(s)?,
            None => Vec::new(),
        };
        let planned = ops.iter().position(|op| !foldable(op)).unwrap_or(ops.len());
        // None while a drawn size (`scale_jitter`, named by `varying`) is not yet fixed again.
        let mut size = Some((input.height, input.width));
        let mut varying = None;
        let mut normalize = None;
        let mut erasing: Option<&str> = None;
        for (i, op) in ops.iter().enumerate() {
            let name = op_name(op);
            // A mask's uncovered pixels take `ignore_index`, whatever the op's fill.
            if let (Some(fill), Role::Image) = (op_fill(op), role) {
                check_fill(fill, input.dtype).map_err(|e| format!("{name}: {e}"))?;
            }
            if let Some(e) = erasing {
                if !matches!(op, Op::Normalize { .. }) {
                    return Err(format!(
                        "{name}: must come before {e}, which works on the final image (only \
                         normalize may follow it)"
                    ));
                }
            }
            if colour_only(op) {
                let auto_family = matches!(
                    op,
                    Op::RandAugment { .. } | Op::TrivialAugment | Op::AutoAugment
                );
                match role {
                    Role::Image => {
                        return Err(format!(
                            "{name}: a colour op, which needs an RGB image (3 channels of \
                             uint8); this is {what}. Geometric ops (resize, crops, flips, \
                             rotate, affine, random_erasing) and normalize work on any image"
                        ))
                    }
                    Role::Mask { .. } if auto_family => {
                        return Err(format!(
                            "{name}: not supported with a mask yet: its shear, translate and \
                             rotate branches would have to move the mask too"
                        ))
                    }
                    Role::Mask { .. } => {}
                }
            }
            match op {
                Op::Mixup { .. } | Op::Cutmix { .. } => {
                    return Err(format!(
                        "{name}: batch mixing works on RGB images with class labels, not on {what}"
                    ))
                }
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
                    });
                }
                Op::ScaleJitter { .. } | Op::RandomShortestSize { .. } | Op::RandomIouCrop(_) => {
                    size = None;
                    varying = Some(name);
                }
                Op::RandomZoomOut { fill, .. } => {
                    channel_fill(*fill, input.channels, role, name)?;
                    size = None;
                    varying = Some(name);
                }
                Op::Resize { height, width }
                | Op::CenterCrop { height, width }
                | Op::RandomResizedCrop { height, width, .. } => size = Some((*height, *width)),
                Op::RandomCrop {
                    height,
                    width,
                    fill,
                    ..
                } => {
                    channel_fill(*fill, input.channels, role, name)?;
                    size = Some((*height, *width));
                }
                Op::Normalize { mean, std } => {
                    if normalize.is_some() {
                        return Err("normalize appears twice".into());
                    }
                    // The image's: a mask is never normalized, whatever the count.
                    let fits = |v: &[f64]| v.len() == 1 || v.len() == input.channels;
                    if role == Role::Image && (!fits(mean) || !fits(std)) {
                        return Err(format!(
                            "normalize: {} mean and {} std values for {what}; give 1 or {}",
                            mean.len(),
                            std.len(),
                            input.channels
                        ));
                    }
                    normalize = Some((mean.clone(), std.clone()));
                }
                Op::Rotate { fill, .. } | Op::Affine { fill, .. } => {
                    channel_fill(*fill, input.channels, role, name)?;
                }
                Op::RandomErasing { value, .. } => {
                    if let EraseValue::Fill(v) = value {
                        channel_fill(*v, input.channels, role, name)?;
                    }
                    erasing = Some("random_erasing");
                }
                _ => {}
            }
        }
        let size = match (size, varying) {
            (Some(size), _) => size,
            (None, Some(v)) => return Err(super::pipeline::varying_size(v)),
            (None, None) => return Err("internal: no output size".into()),
        };
        // Every input has this size: a crop that cannot fit it is refused now.
        let mut rng = Rng::for_key(0, Stream::Augment, 0, 0);
        let checked = super::pipeline::fixed_prefix(&ops[..planned]);
        super::geometry::plan(checked, input.width, input.height, &mut rng)?;
        let float_input = matches!(input.dtype, DType::F16 | DType::BF16 | DType::F32);
        let dtype = match (role, mask_dtype) {
            // `normalize` and `dtype` are the image's.
            (Role::Mask { .. }, Some(labels)) => labels,
            (Role::Mask { .. }, None) => return Err("internal: a mask without labels".into()),
            (Role::Image, _) => match dtype {
                Some(DType::U8) if normalize.is_some() => {
                    return Err(
                        "normalize produces floats; use dtype float32, float16 or bfloat16".into(),
                    )
                }
                Some(DType::U16) if normalize.is_some() => {
                    return Err(
                        "normalize produces floats; use dtype float32, float16 or bfloat16".into(),
                    )
                }
                Some(DType::U8) if float_input => {
                    return Err(format!(
                        "dtype uint8 from {what}: floats are not rounded to bytes; use a float \
                         dtype"
                    ))
                }
                Some(DType::U8) if input.dtype == DType::U16 => {
                    return Err(format!(
                        "dtype uint8 from {what}: 16-bit values are not narrowed to bytes; use \
                         uint16 or a float dtype"
                    ))
                }
                Some(DType::U16) if input.dtype != DType::U16 => {
                    return Err(format!(
                        "dtype uint16 is for uint16 images, not {what}; use {}",
                        if float_input {
                            "a float dtype"
                        } else {
                            "uint8 or a float dtype"
                        }
                    ))
                }
                Some(d @ (DType::U8 | DType::U16 | DType::F16 | DType::BF16 | DType::F32)) => d,
                Some(other) => {
                    return Err(format!(
                        "images can be uint8, uint16, float32, float16 or bfloat16, not {other}"
                    ))
                }
                None if normalize.is_some() => DType::F32,
                None => input.dtype,
            },
        };
        if let Some(Op::RandomErasing {
            value: EraseValue::Random,
            ..
        }) = ops.iter().find(|op| matches!(op, Op::RandomErasing { .. }))
        {
            if matches!(dtype, DType::U8 | DType::U16) && role == Role::Image {
                return Err(format!(
                    "random_erasing: value=random (normal noise) needs a float output, not {dtype}"
                ));
            }
        }
        let channels = input.channels;
        let norm = match (&normalize, role) {
            (Some((mean, std)), Role::Image) => (0..channels)
                .map(|c| (mean[c.min(mean.len() - 1)], std[c.min(std.len() - 1)]))
                .collect(),
            _ => vec![(0.0, 1.0); channels],
        };
        // uint8 scaled to [0, 1] whenever the output is float (ToDtype(scale=True)), as RGB.
        let unit = if input.dtype == DType::U8 && dtype != DType::U8 && role == Role::Image {
            255.0
        } else {
            1.0
        };
        Ok(DensePipeline {
            ops,
            planned,
            input,
            role,
            height: size.0,
            width: size.1,
            dtype,
            layout,
            norm,
            unit,
        })
    }

    /// Whether this pipeline moves an image (not a mask).
    pub fn is_image(&self) -> bool {
        matches!(self.role, Role::Image)
    }

    /// This pipeline's uint8 twin and the cast that turns the twin's output into this
    /// pipeline's on a device (`gpu_normalize`), as
    /// [`Pipeline::split_for_device`](super::Pipeline::split_for_device) does for RGB: a uint8
    /// image is resampled and moved as uint8 planes and only the output pass makes floats, each
    /// a function of its channel and byte, so a table of `channels × 256` entries computed by
    /// the same formula and rounding gives the very bits. `Err` says why not.
    pub fn split_for_device(&self) -> Result<(DensePipeline, DeviceCast), String> {
        if self.role != Role::Image {
            return Err("a mask keeps its labels".into());
        }
        if self.input.dtype != DType::U8 {
            return Err(format!(
                "a {} image is resampled in float32, so its output is no table of bytes",
                self.input.dtype.name()
            ));
        }
        if !matches!(self.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(format!("the output is {} already", self.dtype.name()));
        }
        if self
            .ops
            .iter()
            .any(|op| matches!(op, Op::RandomErasing { .. }))
        {
            return Err("random_erasing writes its value in output units".into());
        }
        if self
            .ops
            .iter()
            .any(|op| matches!(op, Op::Mixup { .. } | Op::Cutmix { .. }))
        {
            return Err("mixup and cutmix blend the float output of the whole batch".into());
        }
        let n = self.dtype.size();
        let mut table = vec![0u8; self.input.channels * 256 * n];
        for (c, row) in table.chunks_exact_mut(256 * n).enumerate() {
            for (v, out) in row.chunks_exact_mut(n).enumerate() {
                write_float(self.float_value(c, v as f64), self.dtype, out);
            }
        }
        let cast = DeviceCast::new(self.dtype, self.layout, self.input.channels, table);
        let twin = DensePipeline {
            ops: self.ops.clone(),
            planned: self.planned,
            input: self.input,
            role: self.role,
            height: self.height,
            width: self.width,
            dtype: DType::U8,
            layout: self.layout,
            norm: vec![(0.0, 1.0); self.input.channels],
            unit: 1.0,
        };
        Ok((twin, cast))
    }

    /// The float output of stored value `v` in channel `c`: the RGB table's formula, in f64.
    fn float_value(&self, c: usize, v: f64) -> f64 {
        let (mean, std) = self.norm[c];
        (v / self.unit - mean) / std
    }

    /// Element type of the output.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The stored shape this pipeline reads.
    pub fn input(&self) -> TensorShape {
        self.input
    }

    /// Output height and width.
    pub fn output_size(&self) -> (usize, usize) {
        (self.height, self.width)
    }

    /// Shape of one sample's output: `[C, H, W]` or `[H, W, C]` for an image, `[H, W]` for a
    /// mask.
    pub fn shape(&self) -> Vec<usize> {
        let c = self.input.channels;
        match (self.role, self.layout) {
            (Role::Mask { .. }, _) => vec![self.height, self.width],
            (Role::Image, Layout::Nchw) => vec![c, self.height, self.width],
            (Role::Image, Layout::Nhwc) => vec![self.height, self.width, c],
        }
    }

    /// Bytes of one sample's output.
    pub fn output_bytes(&self) -> usize {
        self.height * self.width * self.input.channels * self.dtype.size()
    }

    /// Transforms one stored sample (`src`, exactly [`TensorShape::bytes`]) into `out`
    /// (exactly [`output_bytes`](Self::output_bytes)), drawing from `rng` as the RGB pipeline
    /// of the same spec would.
    pub fn apply(
        &self,
        src: &[u8],
        rng: &mut Rng,
        out: &mut [u8],
        scratch: &mut DenseScratch,
    ) -> Result<(), String> {
        self.apply_boxed(src, None, rng, out, scratch)
    }

    /// [`apply`](Self::apply) for a sample with `boxes` (`xyxy` pixels), which
    /// `random_iou_crop` draws its crop from.
    pub fn apply_boxed(
        &self,
        src: &[u8],
        boxes: Option<&[[f64; 4]]>,
        rng: &mut Rng,
        out: &mut [u8],
        scratch: &mut DenseScratch,
    ) -> Result<(), String> {
        if src.len() != self.input.bytes() {
            return Err(format!(
                "tensor has {} bytes, expected {} {}x{}x{} ({} bytes)",
                src.len(),
                self.input.dtype,
                self.input.height,
                self.input.width,
                self.input.channels,
                self.input.bytes()
            ));
        }
        if out.len() != self.output_bytes() {
            return Err(format!(
                "output slot has {} bytes, the pipeline writes {}",
                out.len(),
                self.output_bytes()
            ));
        }
        let DenseScratch {
            u8s,
            f32s,
            i32s,
            i64s,
            resizer,
        } = scratch;
        match (self.role, self.input.dtype) {
            // uint8 labels widened to int64 with an `ignore_index` no byte holds are moved as
            // int64.
            (Role::Mask { ignore_index }, DType::U8) if u8::try_from(ignore_index).is_err() => {
                self.run(src, (boxes, rng), out, i64s, resizer)
            }
            (_, DType::U8) => self.run(src, (boxes, rng), out, u8s, resizer),
            (Role::Image, _) => self.run(src, (boxes, rng), out, f32s, resizer),
            // uint16 labels move as int32, which holds each exactly.
            (Role::Mask { .. }, DType::I32 | DType::U16) => {
                self.run(src, (boxes, rng), out, i32s, resizer)
            }
            (Role::Mask { .. }, _) => self.run(src, (boxes, rng), out, i64s, resizer),
        }
    }

    fn run<T: Px>(
        &self,
        src: &[u8],
        (boxes, rng): (Option<&[[f64; 4]]>, &mut Rng),
        out: &mut [u8],
        bufs: &mut Planes<T>,
        resizer: &mut Resizer,
    ) -> Result<(), String> {
        let TensorShape {
            height: ih,
            width: iw,
            channels,
            dtype,
            layout,
        } = self.input;
        // One channel is laid out alike either way; read as planes, uint8 is used in place.
        let layout = if channels == 1 {
            InputLayout::Chw
        } else {
            layout
        };
        let ops = &self.ops[..self.planned];
        let plan = super::geometry::plan_with(ops, iw, ih, rng, boxes, &mut |_| {})?;
        let (pw, ph) = (plan.width, plan.height);
        let fill_mask = match self.role {
            Role::Mask { ignore_index } => Some(T::from_f64(ignore_index as f64)),
            Role::Image => None,
        };
        // Plane by plane: fast_image_resize's pixel types hold one to four channels, and C is
        // any count up to MAX_CHANNELS; one plane at a time is one code path for every C
        // (a chw tensor is planes already) and keeps each plane's resample equal to the
        // matching channel of an interleaved one.
        let Planes { plane, img, .. } = bufs;
        // uint8 planes are read where they are stored; anything else is split into planes
        // (channels last) or widened (float16, bfloat16) in one pass, and float32 is copied
        // because a mapped file need not be aligned for f32.
        let stored: &[T] = match T::stored_planes(src, dtype, layout) {
            Some(planes) => planes,
            None => {
                T::load_planes(src, dtype, layout, (iw, ih, channels), plane);
                plane
            }
        };
        // A constant-fill crop right after the plan: drawn first, so that only the part it
        // keeps is materialised, as the RGB pipeline does (the same part, so the same pixels).
        let (cut, stages) = augment::draw_cut(&self.ops[self.planned..], &plan, rng, &mut None)?;
        let (mut w, mut h) = match cut {
            Some(augment::Cut {
                width,
                height,
                fill,
                part,
            }) => {
                let fill = |c: usize| fill_mask.unwrap_or(T::from_f64(fill[c.min(2)]));
                match part {
                    Some((part, _)) if (part.width, part.height) == (width, height) => {
                        materialise(stored, (iw, ih), &part, fill_mask, img, resizer)?;
                    }
                    Some((part, at)) => {
                        materialise(stored, (iw, ih), &part, fill_mask, img, resizer)?;
                        bufs.replace(channels, width * height, |c, src, dst| {
                            paste(src, part.width, dst, width, at, fill(c))
                        });
                    }
                    None => {
                        img.clear();
                        for c in 0..channels {
                            img.extend(std::iter::repeat_n(fill(c), width * height));
                        }
                    }
                }
                (width, height)
            }
            None => {
                materialise(stored, (iw, ih), &plan, fill_mask, img, resizer)?;
                (pw, ph)
            }
        };
        let mut erase = None;
        for op in stages {
            let drawn = augment::draw(op, w, h, rng, &mut None)?;
            match drawn {
                Drawn::Nothing
                | Drawn::Grayscale
                | Drawn::Jitter { .. }
                | Drawn::Photometric(_)
                | Drawn::Blur { .. } => {
                    // Colour: a mask's labels stay (an image never gets here: refused when
                    // built), but the draw above kept the rng in step with the image's.
                }
                Drawn::Crop {
                    top,
                    left,
                    width,
                    height,
                    pad,
                    mode,
                    fill,
                } => {
                    let (sw, sh) = (w, h);
                    bufs.replace(channels, width * height, |c, src, dst| {
                        let fill = fill_mask.unwrap_or(T::from_f64(fill[c.min(2)]));
                        for (y, row) in dst.chunks_exact_mut(width).enumerate() {
                            let sy = pad_index((top + y) as isize - pad.1 as isize, sh, mode);
                            for (x, px) in row.iter_mut().enumerate() {
                                let sx = pad_index((left + x) as isize - pad.0 as isize, sw, mode);
                                *px = match (sy, sx) {
                                    (Some(sy), Some(sx)) => src[sy * sw + sx],
                                    _ => fill,
                                };
                            }
                        }
                    });
                    (w, h) = (width, height);
                }
                Drawn::Flip { vertical } => {
                    for plane in bufs.img.chunks_exact_mut(w * h) {
                        if vertical {
                            for y in 0..h / 2 {
                                let (top, bottom) = plane.split_at_mut((h - 1 - y) * w);
                                top[y * w..(y + 1) * w].swap_with_slice(&mut bottom[..w]);
                            }
                        } else {
                            plane.chunks_exact_mut(w).for_each(|row| row.reverse());
                        }
                    }
                }
                Drawn::Warp { m, fill } => {
                    let (ww, wh) = (w, h);
                    bufs.replace(channels, w * h, |c, src, dst| match fill_mask {
                        Some(f) => warp_nearest(src, dst, ww, wh, &m, f),
                        None => warp_bilinear(src, dst, ww, wh, &m, fill[c.min(2)]),
                    });
                }
                Drawn::Aug { ops, len } => {
                    if ops[..len].iter().any(|&(op, _)| aug_is_geometric(op)) {
                        return Err("internal: an AutoAugment-family op on a dense tensor".into());
                    }
                }
                Drawn::Erase(e) => {
                    if fill_mask.is_none() {
                        erase = Some(e);
                    }
                }
            }
        }
        if (w, h) != (self.width, self.height) {
            return Err(format!(
                "internal: transformed to {w}x{h}, pipeline output {}x{}",
                self.width, self.height
            ));
        }
        self.write_out(&bufs.img, out, erase.as_ref());
        Ok(())
    }

    /// The one output pass: normalize, convert and lay out every plane into the slot.
    fn write_out<T: Px>(&self, planes: &[T], out: &mut [u8], erase: Option<&Erase>) {
        let (w, h, channels) = (self.width, self.height, self.input.channels);
        let n = self.dtype.size();
        let plane = w * h;
        for (c, src) in planes.chunks_exact(plane).enumerate() {
            let at = |i: usize| match self.layout {
                Layout::Nchw => (c * plane + i) * n,
                Layout::Nhwc => (i * channels + c) * n,
            };
            match self.dtype {
                DType::U8 | DType::I32 | DType::I64 if n == std::mem::size_of::<T>() => {
                    // Unnormalized integers: the stored values, unchanged.
                    match (self.layout, channels) {
                        (Layout::Nchw, _) | (_, 1) => {
                            let plane_out = &mut out[c * plane * n..(c + 1) * plane * n];
                            for (o, v) in plane_out.chunks_exact_mut(n).zip(src) {
                                v.store(o);
                            }
                        }
                        _ => {
                            for (i, v) in src.iter().enumerate() {
                                v.store(&mut out[at(i)..at(i) + n]);
                            }
                        }
                    }
                }
                DType::I64 => {
                    // A mask's uint8 labels, widened.
                    let plane_out = &mut out[c * plane * n..(c + 1) * plane * n];
                    for (o, v) in plane_out.chunks_exact_mut(8).zip(src) {
                        o.copy_from_slice(&v.to_i64().to_ne_bytes());
                    }
                }
                DType::U16 => {
                    // uint16 planes were widened to float32 and kept unrounded: rounded once
                    // here, half to even, and saturated (a bilinear blend stays in range, so
                    // this only guards). A uint16 mask's labels are int32 planes: exact.
                    for (i, v) in src.iter().enumerate() {
                        let x = round_ties_even(v.to_f64()).clamp(0.0, 65535.0) as u16;
                        out[at(i)..at(i) + n].copy_from_slice(&x.to_ne_bytes());
                    }
                }
                dtype => {
                    for (i, v) in src.iter().enumerate() {
                        let x = self.float_value(c, v.to_f64());
                        write_float(x, dtype, &mut out[at(i)..at(i) + n]);
                    }
                }
            }
        }
        if let Some(e) = erase {
            write_erase(e, w, h, channels, self.layout, self.dtype, out);
        }
    }
}

#[cfg(test)]
mod tests;

/// The planned planes, each mirrored if the plan flips, into `img` (`plan.width * plan.height`
/// elements a plane): masks by nearest neighbour, images copied or resampled.
fn materialise<T: Px>(
    stored: &[T],
    (iw, ih): (usize, usize),
    plan: &Plan,
    fill_mask: Option<T>,
    img: &mut Vec<T>,
    resizer: &mut Resizer,
) -> Result<(), String> {
    let (pw, ph) = (plan.width, plan.height);
    img.clear();
    img.resize(stored.len() / (iw * ih) * pw * ph, T::default());
    for (stored, dst) in stored
        .chunks_exact(iw * ih)
        .zip(img.chunks_exact_mut(pw * ph))
    {
        match fill_mask {
            Some(_) => nearest_plane(stored, iw, plan, dst),
            None if plan.is_copy() => copy_plane(stored, iw, plan, dst),
            None => T::resample(stored, iw, ih, plan, dst, resizer)?,
        }
        if plan.flip {
            dst.chunks_exact_mut(pw).for_each(|row| row.reverse());
        }
    }
    Ok(())
}

/// Writes `x` as one element of float `dtype` (float16, bfloat16, else float32), rounded once:
/// the RGB table's rounding, shared by the output pass and the device cast's table.
fn write_float(x: f64, dtype: DType, out: &mut [u8]) {
    match dtype {
        DType::F16 => out.copy_from_slice(&half::f16::from_f64(x).to_ne_bytes()),
        DType::BF16 => out.copy_from_slice(&half::bf16::from_f64(x).to_ne_bytes()),
        _ => out.copy_from_slice(&(x as f32).to_ne_bytes()),
    }
}
