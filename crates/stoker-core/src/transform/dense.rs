//! Dense tensors: image-shaped tensor fields of any channel count and element type
//! (multispectral stacks, float images) and the segmentation masks that share an image's draw.
//!
//! The RGB8 [`Pipeline`](super::Pipeline) keeps interleaved 8-bit pixels and per-channel
//! lookup tables; a tensor image of `C` channels of `uint8`, `float16`, `bfloat16` or `float32`
//! goes through a [`DensePipeline`] instead, which works plane by plane with the same design:
//! the geometric ops fold into one [`Plan`] per sample (the same function, so the same draws),
//! one resample writes each output plane, the ops after the plan (`augment::draw`: the same
//! draws again) move the crop-sized planes, and one output pass normalizes, converts and lays
//! out into the slot. Floats stay floats: `float16`/`bfloat16` are widened to `float32` once,
//! resampled as `float32`, and rounded once on output; `uint8` is resampled as `uint8` (the
//! same fixed-point filter as RGB8, so each plane equals the matching channel of an RGB resample).
//!
//! A mask ([`Role::Mask`]) takes every geometric op of its image's spec with the image's draws
//! (the rng of a sample's fields is keyed alike, and both pipelines draw through the same
//! code in the same order), sampled nearest-neighbour so labels are never blended: a resample
//! takes source pixel `floor(left + j * scale)` (torch's `nearest`, what torchvision v2 does to
//! a `Mask`), a warp rounds to the nearest pixel, and what no source pixel covers (padding,
//! the corners of a rotation) is `ignore_index`. Colour ops and `random_erasing` leave it
//! as it is but still draw, so the image's later draws stay in step.
//!
//! Colour ops (`color_jitter`, `grayscale`, `gaussian_blur` and the AutoAugment family) are
//! defined for RGB8 here; a pipeline for any other image refuses them when it is built.

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::augment::{self, aug_is_geometric, Drawn, Erase};
use super::geometry::Plan;
use super::kernels::write_erase;
use super::pipeline::{foldable, op_name};
use super::spec::{parse, EraseValue, Op, MAX_CHANNELS};
use super::warp::{inverse_warp_point, pad_index, round_ties_even};
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
                DType::U8 | DType::F16 | DType::BF16 | DType::F32
            ),
            Role::Mask { .. } => {
                matches!(input.dtype, DType::U8 | DType::I32 | DType::I64) && input.channels == 1
            }
        };
        if !elements_ok {
            return Err(match role {
                Role::Image => format!(
                    "tensor images can be uint8, float16, bfloat16 or float32, not {}",
                    input.dtype
                ),
                Role::Mask { .. } => format!(
                    "a mask is an [H, W] tensor of uint8, int32 or int64 labels, not {} with {} \
                     channels",
                    input.dtype, input.channels
                ),
            });
        }
        if let Role::Mask { ignore_index } = role {
            let fits = match input.dtype {
                DType::U8 => u8::try_from(ignore_index).is_ok(),
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
        let mut size = (input.height, input.width);
        let mut normalize = None;
        let mut erasing: Option<&str> = None;
        for (i, op) in ops.iter().enumerate() {
            let name = op_name(op);
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
                Op::ResizeShorter(_) | Op::Resize { .. } | Op::RandomResizedCrop { .. }
                    if i > planned =>
                {
                    return Err(format!(
                        "{name}: must come before {} (resampling runs before the operations \
                         on the crop-sized image)",
                        op_name(&ops[planned])
                    ));
                }
                Op::ResizeShorter(s) => {
                    let (w, h) = super::geometry::resize_shorter(size.1, size.0, *s);
                    size = (h, w);
                }
                Op::Resize { height, width }
                | Op::CenterCrop { height, width }
                | Op::RandomResizedCrop { height, width, .. } => size = (*height, *width),
                Op::RandomCrop {
                    height,
                    width,
                    fill,
                    ..
                } => {
                    channel_fill(fill.map(f64::from), input.channels, role, name)?;
                    size = (*height, *width);
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
                    channel_fill(fill.map(f64::from), input.channels, role, name)?;
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
        // Every input has this size: a crop that cannot fit it is refused now.
        let mut rng = Rng::for_key(0, Stream::Augment, 0, 0);
        super::geometry::plan(&ops[..planned], input.width, input.height, &mut rng)?;
        let float_input = matches!(input.dtype, DType::F16 | DType::BF16 | DType::F32);
        let dtype = match role {
            // A mask keeps its labels' type; `normalize` and `dtype` are the image's.
            Role::Mask { .. } => input.dtype,
            Role::Image => match dtype {
                Some(DType::U8) if normalize.is_some() => {
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
                Some(d @ (DType::U8 | DType::F16 | DType::BF16 | DType::F32)) => d,
                Some(other) => {
                    return Err(format!(
                        "images can be uint8, float32, float16 or bfloat16, not {other}"
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
            if dtype == DType::U8 && role == Role::Image {
                return Err(
                    "random_erasing: value=random (normal noise) needs a float output, not uint8"
                        .into(),
                );
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
            (_, DType::U8) => self.run(src, rng, out, u8s, resizer),
            (Role::Image, _) => self.run(src, rng, out, f32s, resizer),
            (Role::Mask { .. }, DType::I32) => self.run(src, rng, out, i32s, resizer),
            (Role::Mask { .. }, _) => self.run(src, rng, out, i64s, resizer),
        }
    }

    fn run<T: Px>(
        &self,
        src: &[u8],
        rng: &mut Rng,
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
        let plan = super::geometry::plan(&self.ops[..self.planned], iw, ih, rng)?;
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
        img.clear();
        img.resize(pw * ph * channels, T::default());
        for (stored, dst) in stored
            .chunks_exact(iw * ih)
            .zip(img.chunks_exact_mut(pw * ph))
        {
            match fill_mask {
                Some(_) => nearest_plane(stored, iw, &plan, dst),
                None if plan.is_copy() => copy_plane(stored, iw, &plan, dst),
                None => T::resample(stored, iw, ih, &plan, dst, resizer)?,
            }
        }
        let (mut w, mut h) = (pw, ph);
        if plan.flip {
            for plane in bufs.img.chunks_exact_mut(w * h) {
                plane.chunks_exact_mut(w).for_each(|row| row.reverse());
            }
        }
        let mut erase = None;
        for op in &self.ops[self.planned..] {
            let drawn = augment::draw(op, w, h, rng, &mut None)?;
            match drawn {
                Drawn::Nothing | Drawn::Grayscale | Drawn::Jitter { .. } | Drawn::Blur { .. } => {
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
                        let fill = fill_mask.unwrap_or(T::from_f64(fill[c.min(2)] as f64));
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
                        None => warp_bilinear(src, dst, ww, wh, &m, fill[c.min(2)] as f64),
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
            let (mean, std) = self.norm[c];
            let at = |i: usize| match self.layout {
                Layout::Nchw => (c * plane + i) * n,
                Layout::Nhwc => (i * channels + c) * n,
            };
            match self.dtype {
                DType::U8 | DType::I32 | DType::I64 => {
                    // Unnormalized integers: the stored values, unchanged.
                    for (i, v) in src.iter().enumerate() {
                        v.store(&mut out[at(i)..at(i) + n]);
                    }
                }
                dtype => {
                    // The RGB table's formula, in f64, rounded once to the output type.
                    for (i, v) in src.iter().enumerate() {
                        let x = (v.to_f64() / self.unit - mean) / std;
                        let o = &mut out[at(i)..at(i) + n];
                        match dtype {
                            DType::F16 => o.copy_from_slice(&half::f16::from_f64(x).to_ne_bytes()),
                            DType::BF16 => {
                                o.copy_from_slice(&half::bf16::from_f64(x).to_ne_bytes())
                            }
                            _ => o.copy_from_slice(&(x as f32).to_ne_bytes()),
                        }
                    }
                }
            }
        }
        if let Some(e) = erase {
            write_erase(e, w, h, channels, self.layout, self.dtype, out);
        }
    }
}

/// A worker's reusable buffers for [`DensePipeline::apply`], one set per element type.
#[derive(Default)]
pub struct DenseScratch {
    u8s: Planes<u8>,
    f32s: Planes<f32>,
    i32s: Planes<i32>,
    i64s: Planes<i64>,
    resizer: Resizer,
}

/// One stored plane, the planes being transformed, and a spare set.
#[derive(Default)]
struct Planes<T> {
    plane: Vec<T>,
    img: Vec<T>,
    spare: Vec<T>,
}

impl<T: Px> Planes<T> {
    /// Runs `kernel(channel, src, dst)` for every plane into the spare buffer (planes of
    /// `plane` elements), then makes it the image.
    fn replace(
        &mut self,
        channels: usize,
        plane: usize,
        mut kernel: impl FnMut(usize, &[T], &mut [T]),
    ) {
        let src_plane = self.img.len() / channels.max(1);
        self.spare.clear();
        self.spare.resize(plane * channels, T::default());
        for (c, (src, dst)) in self
            .img
            .chunks_exact(src_plane.max(1))
            .zip(self.spare.chunks_exact_mut(plane.max(1)))
            .enumerate()
        {
            kernel(c, src, dst);
        }
        std::mem::swap(&mut self.img, &mut self.spare);
    }
}

/// An element a dense plane holds while it is transformed.
trait Px: Copy + Default + PartialEq + 'static {
    /// Every channel of a stored `(width, height, channels)` tensor of `dtype` in `layout`, as
    /// planes one after the other in `out`, in one pass over the tensor.
    fn load_planes(
        src: &[u8],
        dtype: DType,
        layout: InputLayout,
        (width, height, channels): (usize, usize, usize),
        out: &mut Vec<Self>,
    ) {
        let n = dtype.size();
        out.clear();
        match layout {
            InputLayout::Chw => out.extend(src.chunks_exact(n).map(|b| Self::load(dtype, b))),
            InputLayout::Hwc => {
                let plane = width * height;
                out.resize(plane * channels, Self::default());
                for (i, px) in src.chunks_exact(n * channels).enumerate() {
                    for (c, b) in px.chunks_exact(n).enumerate() {
                        out[c * plane + i] = Self::load(dtype, b);
                    }
                }
            }
        }
    }
    /// The stored planes themselves, when they need no conversion (uint8, channels first).
    fn stored_planes(_src: &[u8], _dtype: DType, _layout: InputLayout) -> Option<&[Self]> {
        None
    }
    /// One stored element of `dtype` (its native-endian bytes).
    fn load(dtype: DType, bytes: &[u8]) -> Self;
    /// Writes the element as stored (its native-endian bytes).
    fn store(self, out: &mut [u8]);
    /// A computed value: rounded half to even and saturated for integers.
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// The antialiased bilinear resample of `plan` for this element type.
    fn resample(
        _plane: &[Self],
        _width: usize,
        _height: usize,
        _plan: &Plan,
        _out: &mut [Self],
        _resizer: &mut Resizer,
    ) -> Result<(), String> {
        Err("internal: labels are never resampled with a filter".into())
    }
}

impl Px for u8 {
    fn load(_: DType, bytes: &[u8]) -> u8 {
        bytes[0]
    }
    fn stored_planes(src: &[u8], dtype: DType, layout: InputLayout) -> Option<&[u8]> {
        (dtype == DType::U8 && layout == InputLayout::Chw).then_some(src)
    }
    fn store(self, out: &mut [u8]) {
        out[0] = self;
    }
    fn from_f64(v: f64) -> u8 {
        round_ties_even(v).clamp(0.0, 255.0) as u8
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn resample(
        plane: &[u8],
        width: usize,
        height: usize,
        plan: &Plan,
        out: &mut [u8],
        resizer: &mut Resizer,
    ) -> Result<(), String> {
        resample_bytes(plane, width, height, plan, out, resizer, PixelType::U8)
    }
}

impl Px for f32 {
    fn load(dtype: DType, b: &[u8]) -> f32 {
        match dtype {
            DType::F16 => half::f16::from_ne_bytes([b[0], b[1]]).to_f32(),
            DType::BF16 => half::bf16::from_ne_bytes([b[0], b[1]]).to_f32(),
            _ => f32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        }
    }
    fn store(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_ne_bytes());
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn resample(
        plane: &[f32],
        width: usize,
        height: usize,
        plan: &Plan,
        out: &mut [f32],
        resizer: &mut Resizer,
    ) -> Result<(), String> {
        // SAFETY: every bit pattern is a valid u8, and u8's alignment (1) divides f32's, so
        // viewing the initialised f32 slice as bytes is sound and leaves no head or tail.
        let (_, bytes, _) = unsafe { plane.align_to::<u8>() };
        // SAFETY: as above; fast_image_resize writes f32 values (PixelType::F32) through the
        // bytes, and every bit pattern is a valid f32.
        let (_, out_bytes, _) = unsafe { out.align_to_mut::<u8>() };
        resample_bytes(
            bytes,
            width,
            height,
            plan,
            out_bytes,
            resizer,
            PixelType::F32,
        )
    }
}

impl Px for i32 {
    fn load(_: DType, b: &[u8]) -> i32 {
        i32::from_ne_bytes([b[0], b[1], b[2], b[3]])
    }
    fn store(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_ne_bytes());
    }
    fn from_f64(v: f64) -> i32 {
        v as i32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Px for i64 {
    fn load(_: DType, b: &[u8]) -> i64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        i64::from_ne_bytes(a)
    }
    fn store(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_ne_bytes());
    }
    fn from_f64(v: f64) -> i64 {
        v as i64
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

/// [`super::kernels::resample`] for one plane of `pixel` elements (`U8` or `F32`).
fn resample_bytes(
    plane: &[u8],
    width: usize,
    height: usize,
    plan: &Plan,
    out: &mut [u8],
    resizer: &mut Resizer,
    pixel: PixelType,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Debug| format!("resize failed: {e:?}");
    let src = ImageRef::new(width as u32, height as u32, plane, pixel).map_err(|e| err(&e))?;
    let [cx0, cy0, cx1, cy1] = plan.clip;
    let clip = CroppedImage::new(
        &src,
        cx0 as u32,
        cy0 as u32,
        (cx1 - cx0) as u32,
        (cy1 - cy0) as u32,
    )
    .map_err(|e| err(&e))?;
    let [left, top, rw, rh] = plan.rect;
    let left = (left - cx0 as f64).max(0.0);
    let top = (top - cy0 as f64).max(0.0);
    let rw = rw.min((cx1 - cx0) as f64 - left);
    let rh = rh.min((cy1 - cy0) as f64 - top);
    let mut dst = Image::from_slice_u8(plan.width as u32, plan.height as u32, out, pixel)
        .map_err(|e| err(&e))?;
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
        .crop(left, top, rw, rh);
    resizer
        .resize(&clip, &mut dst, &options)
        .map_err(|e| err(&e))
}

/// The plan's source rectangle copied as it is (the plan is a whole-pixel crop).
fn copy_plane<T: Px>(plane: &[T], width: usize, plan: &Plan, out: &mut [T]) {
    let (x0, y0) = (plan.rect[0] as usize, plan.rect[1] as usize);
    for (y, row) in out.chunks_exact_mut(plan.width).enumerate() {
        let start = (y0 + y) * width + x0;
        row.copy_from_slice(&plane[start..start + plan.width]);
    }
}

/// Nearest-neighbour sampling of the plan (torch's `nearest`: output pixel `j` takes source
/// pixel `floor(left + j * rw / width)`), within the plan's clip: labels are never blended.
fn nearest_plane<T: Px>(plane: &[T], width: usize, plan: &Plan, out: &mut [T]) {
    let [left, top, rw, rh] = plan.rect;
    let [cx0, cy0, cx1, cy1] = plan.clip;
    let (kx, ky) = (rw / plan.width as f64, rh / plan.height as f64);
    let index = |origin: f64, i: usize, k: f64, lo: usize, hi: usize| -> usize {
        ((origin + i as f64 * k).floor().max(0.0) as usize).clamp(lo, hi.saturating_sub(1).max(lo))
    };
    for (y, row) in out.chunks_exact_mut(plan.width).enumerate() {
        let sy = index(top, y, ky, cy0, cy1);
        for (x, px) in row.iter_mut().enumerate() {
            *px = plane[sy * width + index(left, x, kx, cx0, cx1)];
        }
    }
}

/// The inverse-affine warp of one plane, nearest (round half to even) with `fill` outside:
/// [`super::warp`]'s `Nearest` for labels.
fn warp_nearest<T: Px>(
    src: &[T],
    dst: &mut [T],
    width: usize,
    height: usize,
    m: &[f64; 6],
    fill: T,
) {
    let (w, h) = (width as f64, height as f64);
    for (i, row) in dst.chunks_exact_mut(width).enumerate() {
        for (j, px) in row.iter_mut().enumerate() {
            let (sx, sy) = inverse_warp_point(m, width, height, i, j);
            let (nx, ny) = (round_ties_even(sx), round_ties_even(sy));
            *px = if nx >= 0.0 && ny >= 0.0 && nx < w && ny < h {
                src[ny as usize * width + nx as usize]
            } else {
                fill
            };
        }
    }
}

/// The inverse-affine warp of one plane, bilinear with torchvision's fill blend
/// (`mask * (value - fill) + fill`): [`super::warp`]'s `Bilinear` for one channel of any type.
fn warp_bilinear<T: Px>(
    src: &[T],
    dst: &mut [T],
    width: usize,
    height: usize,
    m: &[f64; 6],
    fill: f64,
) {
    let (w, h) = (width as f64, height as f64);
    for (i, row) in dst.chunks_exact_mut(width).enumerate() {
        for (j, px) in row.iter_mut().enumerate() {
            let (sx, sy) = inverse_warp_point(m, width, height, i, j);
            let (x0, y0) = (sx.floor(), sy.floor());
            let (fx, fy) = (sx - x0, sy - y0);
            let (mut acc, mut mask) = (0f64, 0f64);
            for (dy, wy) in [(0.0, 1.0 - fy), (1.0, fy)] {
                let yy = y0 + dy;
                if yy < 0.0 || yy >= h || wy == 0.0 {
                    continue;
                }
                for (dx, wx) in [(0.0, 1.0 - fx), (1.0, fx)] {
                    let xx = x0 + dx;
                    if xx < 0.0 || xx >= w || wx == 0.0 {
                        continue;
                    }
                    acc += wx * wy * src[yy as usize * width + xx as usize].to_f64();
                    mask += wx * wy;
                }
            }
            *px = T::from_f64(mask * (acc - fill) + fill);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::Pipeline;

    const H: usize = 40;
    const W: usize = 48;
    const C: usize = 13;

    fn rng(index: u64) -> Rng {
        Rng::for_key(7, Stream::Augment, 0, index)
    }

    /// A `[H, W, C]` uint8 tensor with varied, structured values.
    fn hwc_u8() -> Vec<u8> {
        (0..H * W * C)
            .map(|i| {
                let (px, c) = (i / C, i % C);
                let (y, x) = (px / W, px % W);
                ((x * 5 + y * 3 + c * 19 + (x * y) % 7) % 256) as u8
            })
            .collect()
    }

    fn shape(channels: usize, dtype: DType, layout: InputLayout) -> TensorShape {
        TensorShape {
            height: H,
            width: W,
            channels,
            dtype,
            layout,
        }
    }

    fn image(spec: &str, input: TensorShape, dtype: Option<DType>) -> DensePipeline {
        DensePipeline::new(Some(spec), input, Role::Image, dtype, Layout::Nchw).unwrap()
    }

    fn run(p: &DensePipeline, src: &[u8], index: u64) -> Vec<u8> {
        let mut out = vec![0; p.output_bytes()];
        p.apply(src, &mut rng(index), &mut out, &mut DenseScratch::default())
            .unwrap();
        out
    }

    /// Channels `3g..3g+3` (the last repeated past `C`) run through the RGB pipeline: the
    /// reference for each plane of a dense uint8 image.
    fn by_rgb_groups(spec: &str, hwc: &[u8], index: u64) -> Vec<u8> {
        let rgb = Pipeline::for_input(Some(spec), None, Layout::Nchw, H, W).unwrap();
        let (oh, ow) = rgb.output_size();
        let mut planes = vec![0u8; C * oh * ow];
        for g in 0..C.div_ceil(3) {
            let ch = |k: usize| (3 * g + k).min(C - 1);
            let px: Vec<u8> = hwc
                .chunks_exact(C)
                .flat_map(|p| [p[ch(0)], p[ch(1)], p[ch(2)]])
                .collect();
            let mut out = vec![0; rgb.output_bytes()];
            rgb.apply_rgb(&px, W, H, &mut rng(index), &mut out).unwrap();
            for k in 0..3 {
                if 3 * g + k < C {
                    planes[(3 * g + k) * oh * ow..][..oh * ow]
                        .copy_from_slice(&out[k * oh * ow..][..oh * ow]);
                }
            }
        }
        planes
    }

    #[test]
    fn every_plane_of_a_13_channel_uint8_image_equals_the_rgb_path_on_its_channels() {
        let hwc = hwc_u8();
        for spec in [
            "random_resized_crop(32) | hflip",
            "resize(20) | center_crop(16, 18) | vflip(p=1)",
            "random_resized_crop(24, 20) | random_crop(20, padding=3, pad_mode=reflect) | vflip",
            "center_crop(32) | rotate(40, fill=9) | affine(degrees=10, translate=0.1:0.2, scale=0.8:1.2, shear=5)",
            "random_crop(30, padding=2, fill=4) | hflip | random_erasing(p=1, value=7)",
        ] {
            let p = image(spec, shape(C, DType::U8, InputLayout::Hwc), None);
            assert_eq!(p.dtype(), DType::U8);
            for index in 0..6 {
                assert_eq!(
                    run(&p, &hwc, index),
                    by_rgb_groups(spec, &hwc, index),
                    "`{spec}`, sample {index}"
                );
            }
        }
    }

    #[test]
    fn the_output_pass_writes_what_the_rgb_tables_write_for_every_type_and_layout() {
        // Three uint8 channels through the dense pipeline and through the RGB one: the f64
        // formula rounded once is the RGB path's per-channel table, bit for bit.
        let rgb: Vec<u8> = hwc_u8()
            .chunks_exact(C)
            .flat_map(|p| [p[0], p[5], p[11]])
            .collect();
        let spec = "random_resized_crop(20, 24) | hflip | normalize(imagenet) | random_erasing(p=1, value=random)";
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                let input = shape(3, DType::U8, InputLayout::Hwc);
                let dense = DensePipeline::new(Some(spec), input, Role::Image, Some(dtype), layout)
                    .unwrap();
                let reference = Pipeline::for_input(Some(spec), Some(dtype), layout, H, W).unwrap();
                assert_eq!(dense.shape(), reference.shape());
                for index in 0..4 {
                    let mut want = vec![0; reference.output_bytes()];
                    reference
                        .apply_rgb(&rgb, W, H, &mut rng(index), &mut want)
                        .unwrap();
                    assert_eq!(run(&dense, &rgb, index), want, "{dtype} {layout:?} {index}");
                }
            }
        }
    }

    #[test]
    fn channels_first_and_last_give_the_same_planes() {
        let hwc = hwc_u8();
        let mut chw = vec![0u8; hwc.len()];
        for (i, px) in hwc.chunks_exact(C).enumerate() {
            for c in 0..C {
                chw[c * H * W + i] = px[c];
            }
        }
        let spec = "random_resized_crop(16) | hflip | normalize(mean=0.5, std=0.25)";
        let a = image(spec, shape(C, DType::U8, InputLayout::Hwc), None);
        let b = image(spec, shape(C, DType::U8, InputLayout::Chw), None);
        assert_eq!(a.shape(), vec![C, 16, 16]);
        assert_eq!(run(&a, &hwc, 3), run(&b, &chw, 3));
    }

    fn f32s(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    #[test]
    fn float_images_are_resampled_in_float_and_half_types_through_float32() {
        // The uint8 values as float32 plus a fraction that a uint8 round trip would lose.
        let hwc = hwc_u8();
        let as_f32: Vec<f32> = hwc.iter().map(|&v| v as f32 + 0.25).collect();
        let f32_bytes: Vec<u8> = as_f32.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let spec = "random_resized_crop(20) | hflip";
        let fp = image(spec, shape(C, DType::F32, InputLayout::Hwc), None);
        assert_eq!(fp.dtype(), DType::F32, "a float image stays float");
        let up = image(
            spec,
            shape(C, DType::U8, InputLayout::Hwc),
            Some(DType::F32),
        );
        for index in 0..4 {
            let float = f32s(&run(&fp, &f32_bytes, index));
            // The uint8 path scales to [0, 1]; its resample rounded to whole levels.
            let bytes = f32s(&run(&up, &hwc, index));
            let mut fractional = 0;
            for (f, u) in float.iter().zip(&bytes) {
                let u = u * 255.0;
                // uint8's fixed-point filter rounds once more than the float one.
                assert!((f - 0.25 - u).abs() <= 1.0, "{f} vs {u}");
                fractional += usize::from((f - f.round()).abs() > 0.01);
            }
            assert!(
                fractional > float.len() / 2,
                "float values kept their fractions"
            );
        }
        // float16 and bfloat16 holding the same (exactly representable) values: widened to
        // float32, resampled alike, rounded once to their own type.
        for dtype in [DType::F16, DType::BF16] {
            let exact: Vec<f32> = hwc.iter().map(|&v| (v / 2) as f32).collect();
            let halves: Vec<u8> = exact
                .iter()
                .flat_map(|&v| match dtype {
                    DType::F16 => half::f16::from_f32(v).to_ne_bytes(),
                    _ => half::bf16::from_f32(v).to_ne_bytes(),
                })
                .collect();
            let exact_bytes: Vec<u8> = exact.iter().flat_map(|v| v.to_ne_bytes()).collect();
            let hp = image(spec, shape(C, dtype, InputLayout::Hwc), None);
            assert_eq!(hp.dtype(), dtype);
            let got = run(&hp, &halves, 1);
            let want = f32s(&run(&fp, &exact_bytes, 1));
            for (g, w) in got.chunks_exact(2).zip(want) {
                let g = match dtype {
                    DType::F16 => half::f16::from_ne_bytes([g[0], g[1]]).to_f32(),
                    _ => half::bf16::from_ne_bytes([g[0], g[1]]).to_f32(),
                };
                let rounded = match dtype {
                    DType::F16 => half::f16::from_f32(w).to_f32(),
                    _ => half::bf16::from_f32(w).to_f32(),
                };
                assert_eq!(g, rounded, "{dtype}");
            }
        }
    }

    #[test]
    fn normalize_takes_one_mean_and_std_per_channel_and_layouts_interleave() {
        let hwc = hwc_u8();
        let mean: Vec<String> = (0..C).map(|c| format!("{}", c as f64 / 20.0)).collect();
        let std: Vec<String> = (0..C)
            .map(|c| format!("{}", 0.1 + c as f64 / 50.0))
            .collect();
        let spec = format!(
            "center_crop(8) | normalize(mean={}, std={})",
            mean.join(","),
            std.join(",")
        );
        let input = shape(C, DType::U8, InputLayout::Hwc);
        let p = DensePipeline::new(Some(&spec), input, Role::Image, None, Layout::Nhwc).unwrap();
        assert_eq!((p.dtype(), p.shape()), (DType::F32, vec![8, 8, C]));
        let out = f32s(&run(&p, &hwc, 0));
        let (top, left) = ((H - 8) / 2, (W - 8) / 2);
        for y in 0..8 {
            for x in 0..8 {
                for c in 0..C {
                    let v = hwc[((top + y) * W + left + x) * C + c] as f64;
                    let m = c as f64 / 20.0;
                    let s = 0.1 + c as f64 / 50.0;
                    let want = ((v / 255.0 - m) / s) as f32;
                    assert_eq!(out[(y * 8 + x) * C + c], want, "({y}, {x}, {c})");
                }
            }
        }
        let e = DensePipeline::new(
            Some("normalize(imagenet)"),
            input,
            Role::Image,
            None,
            Layout::Nchw,
        )
        .unwrap_err();
        assert!(e.contains("3 mean") && e.contains("give 1 or 13"), "{e}");
    }

    #[test]
    fn colour_ops_are_refused_for_images_other_than_rgb8_with_what_the_image_is() {
        for op in [
            "color_jitter(brightness=0.4)",
            "grayscale",
            "gaussian_blur(3)",
            "rand_augment",
            "trivial_augment",
            "auto_augment(imagenet)",
        ] {
            for (channels, dtype) in [(C, DType::U8), (3, DType::F32), (1, DType::U8)] {
                let e = DensePipeline::new(
                    Some(&format!("center_crop(16) | {op}")),
                    shape(channels, dtype, InputLayout::Chw),
                    Role::Image,
                    None,
                    Layout::Nchw,
                )
                .unwrap_err();
                let what = format!("a {channels}-channel {} image", dtype.name());
                assert!(
                    e.contains("needs an RGB image (3 channels of uint8)") && e.contains(&what),
                    "{op}: {e}"
                );
            }
        }
        let e = DensePipeline::new(
            Some("rotate(10, fill=1,2,3)"),
            shape(C, DType::U8, InputLayout::Hwc),
            Role::Image,
            None,
            Layout::Nchw,
        )
        .unwrap_err();
        assert!(e.contains("13-channel image takes one value"), "{e}");
    }

    #[test]
    fn a_float_image_is_not_rounded_to_uint8() {
        let e = DensePipeline::new(
            Some("center_crop(8)"),
            shape(C, DType::F32, InputLayout::Chw),
            Role::Image,
            Some(DType::U8),
            Layout::Nchw,
        )
        .unwrap_err();
        assert!(
            e.contains("dtype uint8") && e.contains("13-channel float32"),
            "{e}"
        );
    }

    /// An int32 mask whose label is the pixel's own coordinate, `y * W + x`.
    fn coordinate_mask() -> Vec<u8> {
        (0..(H * W) as i32).flat_map(|v| v.to_ne_bytes()).collect()
    }

    fn mask_pipeline(spec: &str, dtype: DType, ignore_index: i64) -> DensePipeline {
        let input = TensorShape {
            channels: 1,
            dtype,
            ..shape(1, dtype, InputLayout::Hwc)
        };
        DensePipeline::new(
            Some(spec),
            input,
            Role::Mask { ignore_index },
            None,
            Layout::Nchw,
        )
        .unwrap()
    }

    fn i32s(bytes: &[u8]) -> Vec<i32> {
        bytes
            .chunks_exact(4)
            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    #[test]
    fn a_mask_moves_with_its_image_under_one_draw() {
        // Two float planes holding x and y: the bilinear resample of a linear ramp is the
        // sample point itself, so each image pixel says where it came from, and the mask
        // (labels y * W + x) says which source pixel its label is.
        let coords: Vec<u8> = (0..2 * H * W)
            .map(|i| {
                let (c, px) = (i / (H * W), i % (H * W));
                if c == 0 {
                    (px % W) as f32
                } else {
                    (px / W) as f32
                }
            })
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let mask = coordinate_mask();
        for spec in [
            "random_resized_crop(24, 28) | hflip | vflip",
            "resize(30) | center_crop(24) | hflip(p=1)",
            "random_crop(32, padding=4) | vflip | hflip | normalize(mean=0, std=1)",
        ] {
            let ip = image(spec, shape(2, DType::F32, InputLayout::Chw), None);
            let mp = mask_pipeline(spec, DType::I32, -1);
            assert_eq!(mp.shape(), vec![ip.shape()[1], ip.shape()[2]]);
            let (oh, ow) = ip.output_size();
            for index in 0..8 {
                let img = f32s(&run(&ip, &coords, index));
                let labels = i32s(&run(&mp, &mask, index));
                let mut seen = 0;
                for (i, &label) in labels.iter().enumerate() {
                    let (fx, fy) = (img[i], img[oh * ow + i]);
                    if label == -1 {
                        // Padding: the image holds the fill there too (0 in both planes).
                        assert_eq!((fx, fy), (0.0, 0.0), "`{spec}` {index}: pixel {i}");
                        continue;
                    }
                    assert!((0..(H * W) as i32).contains(&label));
                    let (mx, my) = ((label as usize % W) as f32, (label as usize / W) as f32);
                    // Nearest takes floor(left + j * scale); the filter's centre is
                    // left + (j + 0.5) * scale - 0.5: at most half a source pixel apart
                    // beyond the half scale (and the border clamps the filter inwards).
                    let (y, x) = (i / ow, i % ow);
                    let border = y < 2 || x < 2 || y + 2 >= oh || x + 2 >= ow;
                    let near = |image: f32, label: f32, scale: f32| {
                        let d = image - label;
                        d >= -0.55 && d <= scale * 0.5 + 0.55
                    };
                    let flips_agree = (fx - mx).abs() < W as f32 / 2.0;
                    assert!(flips_agree, "`{spec}` {index}: pixel {i} x {fx} vs {mx}");
                    if !border {
                        let (sx, sy) = (W as f32 / ow as f32, H as f32 / oh as f32);
                        assert!(near(fx, mx, sx.max(1.0) + 1.0), "`{spec}` x {fx} vs {mx}");
                        assert!(near(fy, my, sy.max(1.0) + 1.0), "`{spec}` y {fy} vs {my}");
                    }
                    seen += 1;
                }
                assert!(seen > 0);
            }
        }
    }

    #[test]
    fn mask_labels_stay_exact_and_uncovered_pixels_take_ignore_index() {
        // uint8 labels 0..5 in blocks; any blending would make values between them.
        let labels: Vec<u8> = (0..H * W)
            .map(|i| [0u8, 1, 7, 30, 200][(i / W / 9 + i % W / 11) % 5])
            .collect();
        for spec in [
            "random_resized_crop(33) | hflip | rotate(35) | color_jitter(brightness=0.5)",
            "affine(degrees=20, translate=0.2:0.2, scale=0.7:1.3, shear=10) | grayscale(p=0.5)",
            "random_crop(44, padding=5, fill=3) | gaussian_blur(3) | random_erasing(p=1)",
        ] {
            let mp = mask_pipeline(spec, DType::U8, 255);
            let mut fills = 0;
            for index in 0..10 {
                let out = run(&mp, &labels, index);
                for &v in &out {
                    assert!([0, 1, 7, 30, 200, 255].contains(&v), "`{spec}`: {v}");
                }
                fills += out.iter().filter(|&&v| v == 255).count();
            }
            assert!(fills > 0, "`{spec}` uncovered some pixels");
        }
        // An int64 mask keeps its type and its labels.
        let big: Vec<u8> = (0..(H * W) as i64)
            .flat_map(|v| (v * 1_000_000_007).to_ne_bytes())
            .collect();
        let mp = mask_pipeline("random_resized_crop(16) | hflip", DType::I64, 255);
        assert_eq!(mp.dtype(), DType::I64);
        for b in run(&mp, &big, 2).chunks_exact(8) {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            assert_eq!(i64::from_ne_bytes(a) % 1_000_000_007, 0);
        }
    }

    #[test]
    fn a_mask_refuses_what_would_move_the_image_without_it() {
        for (spec, needle) in [
            (
                "center_crop(16) | rand_augment",
                "not supported with a mask",
            ),
            (
                "center_crop(16) | mixup(alpha=1, num_classes=2)",
                "batch mixing",
            ),
        ] {
            let e = DensePipeline::new(
                Some(spec),
                TensorShape {
                    channels: 1,
                    ..shape(1, DType::U8, InputLayout::Hwc)
                },
                Role::Mask { ignore_index: 255 },
                None,
                Layout::Nchw,
            )
            .unwrap_err();
            assert!(e.contains(needle), "{spec}: {e}");
        }
        let e = DensePipeline::new(
            None,
            shape(1, DType::F32, InputLayout::Hwc),
            Role::Mask { ignore_index: 255 },
            None,
            Layout::Nchw,
        )
        .unwrap_err();
        assert!(e.contains("uint8, int32 or int64 labels"), "{e}");
        let e = DensePipeline::new(
            None,
            shape(1, DType::U8, InputLayout::Hwc),
            Role::Mask { ignore_index: -1 },
            None,
            Layout::Nchw,
        )
        .unwrap_err();
        assert!(e.contains("ignore_index=-1"), "{e}");
    }
}
