//! Transform: the fused image pipeline, from encoded bytes to one batch slot.
//!
//! A pipeline is parsed from a spec such as
//! `random_resized_crop(224) | hflip | normalize(imagenet)`. Its operations:
//!
//! | op | meaning (torchvision's) |
//! |---|---|
//! | `resize(S)` | shorter side to `S`, longer to `int(S * long / short)` (`Resize(S)`) |
//! | `resize(H, W)` | to exactly `H`x`W` |
//! | `center_crop(S)`, `center_crop(H, W)` | top = `round((h - H) / 2)`, left = `round((w - W) / 2)` (`CenterCrop`) |
//! | `random_resized_crop(S, scale=a:b, ratio=a:b)` | `RandomResizedCrop`: defaults scale `0.08:1`, ratio `3/4:4/3`; `S` or `H, W` |
//! | `hflip`, `hflip(p=0.5)` | flip left-right with probability `p` (`RandomHorizontalFlip`) |
//! | `normalize(mean=a,b,c, std=a,b,c)`, `normalize(imagenet)` | `(x / 255 - mean) / std` per channel |
//!
//! Resizing is antialiased bilinear (Pillow's `BILINEAR`, torchvision's `antialias=True`) through
//! fast_image_resize. The output type is `uint8`, `float32`, `float16` or `bfloat16` (default
//! `float32` when the pipeline normalizes, else `uint8`); a float output without `normalize` is
//! scaled to `[0, 1]` (`ToDtype(float32, scale=True)`). Layout is `nchw` or `nhwc`.
//!
//! # Fusion
//!
//! No intermediate image is materialised per operation. The geometric operations are folded,
//! per sample, into one affine map from the final output grid to the decoded image
//! (`src = offset + out * scale` on each axis, pixel edges at integers), plus a clip rectangle of
//! source pixels the resampling filter may read and a flip flag:
//!
//! * a resize multiplies the scale by `old_size / new_size`;
//! * a crop `(top, left, h, w)` adds `left * scale` to the offset; while no resize precedes it
//!   (scale 1) it is an integer crop of the decoded image and also narrows the clip rectangle,
//!   so the filter never reads outside it — exactly torchvision's crop-then-resize. A crop after a
//!   resize selects output pixels of that resize, which is also exact: the filter support stays
//!   that of the resize and is clamped at the borders of the image, as in resize-then-crop;
//! * a flip toggles the flag, and a later crop box is mirrored (`left' = w - left - width`) so
//!   that crop-after-flip picks the same pixels torchvision would.
//!
//! Then one resample (or none, when the map is the identity) writes RGB8 pixels of exactly the
//! output size into a per-thread scratch buffer, and ONE pass reads them, mirrored if flipped,
//! and writes `lut[c][value]` — normalisation and type conversion precomputed per channel and
//! value — in the requested layout straight into the batch slot. Two resizes in a row are
//! composed into one (torchvision would resample twice; the result differs slightly).
//! `normalize` is applied last wherever it is written.
//!
//! All randomness comes from the sample's [`Rng`], so the output is a pure function of
//! (seed, epoch, index).

use std::cell::RefCell;

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use crate::collate::ImageWriter;
use crate::decode::{decode_rgb, DecodeBuffers};
use crate::dtype::{DType, Layout};
use crate::rng::Rng;

/// ImageNet's channel means and standard deviations (torchvision's reference scripts).
pub const IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];

/// One operation of a pipeline spec.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Shorter side to this many pixels, aspect ratio kept.
    ResizeShorter(usize),
    /// Exactly this size.
    Resize {
        height: usize,
        width: usize,
    },
    CenterCrop {
        height: usize,
        width: usize,
    },
    RandomResizedCrop {
        height: usize,
        width: usize,
        scale: (f64, f64),
        ratio: (f64, f64),
    },
    HFlip {
        p: f64,
    },
    Normalize {
        mean: [f64; 3],
        std: [f64; 3],
    },
}

/// Parses a pipeline spec: operations separated by `|`, each `name` or `name(args)`, with
/// positional arguments first and then `key=value` ones (a value may hold commas:
/// `mean=0.5,0.5,0.5`). Numbers may be written as fractions (`3/4`), ranges as `a:b`.
pub fn parse(spec: &str) -> Result<Vec<Op>, String> {
    let mut ops = Vec::new();
    for part in spec.split('|').map(str::trim) {
        if part.is_empty() {
            return Err(format!("empty operation in `{spec}`"));
        }
        let (name, args) = match part.find('(') {
            Some(open) => {
                let inner = part[open + 1..]
                    .strip_suffix(')')
                    .ok_or_else(|| format!("`{part}`: missing closing parenthesis"))?;
                (part[..open].trim(), split_args(inner))
            }
            None => (part, Args::default()),
        };
        let op = parse_op(name, &args).map_err(|e| format!("`{part}`: {e}"))?;
        ops.push(op);
    }
    Ok(ops)
}

#[derive(Default, Debug)]
struct Args {
    positional: Vec<String>,
    named: Vec<(String, String)>,
}

impl Args {
    fn named(&self, key: &str) -> Option<&str> {
        self.named
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn check(&self, max_positional: usize, keys: &[&str]) -> Result<(), String> {
        if self.positional.len() > max_positional {
            return Err(format!(
                "takes at most {max_positional} positional argument(s), got {}",
                self.positional.len()
            ));
        }
        for (k, _) in &self.named {
            if !keys.contains(&k.as_str()) {
                return Err(if keys.is_empty() {
                    format!("unknown argument `{k}`")
                } else {
                    format!("unknown argument `{k}` (expected {})", keys.join(", "))
                });
            }
        }
        Ok(())
    }
}

/// Splits `a, b, key=1,2,3, other=x` into positional `[a, b]` and named
/// `[(key, "1,2,3"), (other, x)]`: a token without `=` after a named one continues it.
fn split_args(inner: &str) -> Args {
    let mut args = Args::default();
    for token in inner.split(',').map(str::trim) {
        if let Some((k, v)) = token.split_once('=') {
            args.named.push((k.trim().to_owned(), v.trim().to_owned()));
        } else if let Some((_, v)) = args.named.last_mut() {
            v.push(',');
            v.push_str(token);
        } else if !token.is_empty() || !args.positional.is_empty() {
            args.positional.push(token.to_owned());
        }
    }
    args
}

fn number(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let value = match s.split_once('/') {
        Some((a, b)) => {
            let a: f64 = a
                .trim()
                .parse()
                .map_err(|_| format!("`{s}` is not a number"))?;
            let b: f64 = b
                .trim()
                .parse()
                .map_err(|_| format!("`{s}` is not a number"))?;
            a / b
        }
        None => s.parse().map_err(|_| format!("`{s}` is not a number"))?,
    };
    if value.is_finite() {
        Ok(value)
    } else {
        Err(format!("`{s}` is not a finite number"))
    }
}

fn size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=65_535).contains(&n) => Ok(n),
        _ => Err(format!("`{s}` is not a size in 1..=65535")),
    }
}

/// `S` or `H, W` from the positional arguments.
fn sizes(args: &Args) -> Result<(usize, usize), String> {
    match args.positional.as_slice() {
        [s] => size(s).map(|s| (s, s)),
        [h, w] => Ok((size(h)?, size(w)?)),
        _ => Err("expected a size S or H, W".into()),
    }
}

fn range(s: &str, what: &str) -> Result<(f64, f64), String> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| format!("{what} `{s}` is not a range a:b"))?;
    let (a, b) = (number(a)?, number(b)?);
    if !(a > 0.0 && a <= b) {
        return Err(format!("{what} `{s}` needs 0 < a <= b"));
    }
    Ok((a, b))
}

fn triple(s: &str, what: &str) -> Result<[f64; 3], String> {
    let values = s.split(',').map(number).collect::<Result<Vec<_>, _>>()?;
    match values.as_slice() {
        [v] => Ok([*v; 3]),
        [a, b, c] => Ok([*a, *b, *c]),
        _ => Err(format!("{what} needs 1 or 3 values, got {}", values.len())),
    }
}

fn parse_op(name: &str, args: &Args) -> Result<Op, String> {
    match name {
        "resize" => {
            args.check(2, &[])?;
            Ok(match args.positional.as_slice() {
                [s] => Op::ResizeShorter(size(s)?),
                [h, w] => Op::Resize {
                    height: size(h)?,
                    width: size(w)?,
                },
                _ => return Err("expected resize(S) or resize(H, W)".into()),
            })
        }
        "center_crop" => {
            args.check(2, &[])?;
            let (height, width) = sizes(args)?;
            Ok(Op::CenterCrop { height, width })
        }
        "random_resized_crop" => {
            args.check(2, &["scale", "ratio"])?;
            let (height, width) = sizes(args)?;
            let scale = match args.named("scale") {
                Some(s) => range(s, "scale")?,
                None => (0.08, 1.0),
            };
            let ratio = match args.named("ratio") {
                Some(s) => range(s, "ratio")?,
                None => (3.0 / 4.0, 4.0 / 3.0),
            };
            Ok(Op::RandomResizedCrop {
                height,
                width,
                scale,
                ratio,
            })
        }
        "hflip" => {
            args.check(1, &["p"])?;
            let p = match (args.positional.first().map(String::as_str), args.named("p")) {
                (Some(_), Some(_)) => return Err("give p once".into()),
                (Some(p), None) | (None, Some(p)) => number(p)?,
                (None, None) => 0.5,
            };
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("p={p} is not a probability in [0, 1]"));
            }
            Ok(Op::HFlip { p })
        }
        "normalize" => {
            if args.positional.len() == 1 && args.positional[0] == "imagenet" {
                args.check(1, &[])?;
                return Ok(Op::Normalize {
                    mean: IMAGENET_MEAN,
                    std: IMAGENET_STD,
                });
            }
            args.check(0, &["mean", "std"])?;
            let mean = triple(args.named("mean").ok_or("needs mean=... and std=..., or imagenet")?, "mean")?;
            let std = triple(args.named("std").ok_or("needs mean=... and std=..., or imagenet")?, "std")?;
            if std.contains(&0.0) {
                return Err("std must not be 0".into());
            }
            Ok(Op::Normalize { mean, std })
        }
        _ => Err(format!(
            "unknown operation `{name}` (known: resize, center_crop, random_resized_crop, hflip, normalize)"
        )),
    }
}

/// Where one sample's output pixels come from in its decoded image, after the random choices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    /// Source pixels the filter may read: `[x0, y0, x1, y1)`.
    pub clip: [usize; 4],
    /// Source rectangle (left, top, width, height) mapped onto the output, in pixel-edge
    /// coordinates of the decoded image.
    pub rect: [f64; 4],
    /// Output size.
    pub width: usize,
    pub height: usize,
    pub flip: bool,
}

impl Plan {
    /// Whether the output is a plain copy of source pixels (no resampling needed).
    fn is_copy(&self) -> bool {
        let [left, top, w, h] = self.rect;
        left.fract() == 0.0
            && top.fract() == 0.0
            && w == self.width as f64
            && h == self.height as f64
            && left >= self.clip[0] as f64
            && top >= self.clip[1] as f64
            && left + w <= self.clip[2] as f64
            && top + h <= self.clip[3] as f64
    }
}

/// The virtual image while the geometric ops are folded (see the module docs).
struct View {
    clip: [usize; 4],
    ox: f64,
    oy: f64,
    kx: f64,
    ky: f64,
    w: usize,
    h: usize,
    flip: bool,
}

impl View {
    fn resize(&mut self, width: usize, height: usize) {
        self.kx *= self.w as f64 / width as f64;
        self.ky *= self.h as f64 / height as f64;
        self.w = width;
        self.h = height;
    }

    /// Crops `(top, left, height, width)` of the current (possibly flipped) view; the box must
    /// lie inside it.
    fn crop(&mut self, top: usize, left: usize, height: usize, width: usize) {
        let left = if self.flip {
            self.w - left - width
        } else {
            left
        };
        self.ox += left as f64 * self.kx;
        self.oy += top as f64 * self.ky;
        if self.kx == 1.0 && self.ky == 1.0 && self.ox.fract() == 0.0 && self.oy.fract() == 0.0 {
            // An integer crop of the decoded image: the filter must not read outside it.
            let (x0, y0) = (self.ox as usize, self.oy as usize);
            self.clip = [
                self.clip[0].max(x0),
                self.clip[1].max(y0),
                self.clip[2].min(x0 + width),
                self.clip[3].min(y0 + height),
            ];
        }
        self.w = width;
        self.h = height;
    }
}

/// torchvision's `Resize(S)` output size for a `w`x`h` image: the shorter side becomes `s`, the
/// longer `int(s * long / short)` (floor, as Python's `int()` of the float quotient).
pub fn resize_shorter(w: usize, h: usize, s: usize) -> (usize, usize) {
    if w <= h {
        (s, ((s as f64 * h as f64 / w as f64) as usize).max(1))
    } else {
        (((s as f64 * w as f64 / h as f64) as usize).max(1), s)
    }
}

/// torchvision's `RandomResizedCrop.get_params` for a `width`x`height` image; returns
/// `(top, left, h, w)`. Ten attempts: `target_area = area * U(scale)`,
/// `aspect = exp(U(ln ratio.0, ln ratio.1))`, `w = round(sqrt(target_area * aspect))`,
/// `h = round(sqrt(target_area / aspect))` (round half to even, like Python's `round`); the first
/// box that fits is placed uniformly (`top = randint(0, height - h)`, then `left`). Otherwise the
/// central fallback: the whole image, clamped to the ratio range (`w = width,
/// h = round(w / min(ratio))` if too tall, `h = height, w = round(h * max(ratio))` if too wide),
/// centred with floor division.
pub fn random_resized_crop_params(
    width: usize,
    height: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut Rng,
) -> (usize, usize, usize, usize) {
    let area = width as f64 * height as f64;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale.0, scale.1);
        let aspect = rng.uniform(log_lo, log_hi).exp();
        let w = (target_area * aspect).sqrt().round_ties_even();
        let h = (target_area / aspect).sqrt().round_ties_even();
        if w >= 1.0 && w <= width as f64 && h >= 1.0 && h <= height as f64 {
            let (w, h) = (w as usize, h as usize);
            let top = rng.below((height - h + 1) as u64) as usize;
            let left = rng.below((width - w + 1) as u64) as usize;
            return (top, left, h, w);
        }
    }
    let in_ratio = width as f64 / height as f64;
    let (w, h) = if in_ratio < ratio.0 {
        let h = (width as f64 / ratio.0).round_ties_even() as usize;
        (width, h.clamp(1, height))
    } else if in_ratio > ratio.1 {
        let w = (height as f64 * ratio.1).round_ties_even() as usize;
        (w.clamp(1, width), height)
    } else {
        (width, height)
    };
    ((height - h) / 2, (width - w) / 2, h, w)
}

/// Per-channel lookup tables: the output element for each 8-bit input value.
enum Lut {
    U8,
    F32(Box<[[f32; 256]; 3]>),
    Half(Box<[[u16; 256]; 3]>),
}

/// A parsed, validated pipeline with a fixed output size; an [`ImageWriter`].
pub struct Pipeline {
    ops: Vec<Op>,
    height: usize,
    width: usize,
    dtype: DType,
    layout: Layout,
    max_pixels: u64,
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

/// Per-thread reusable memory: decode buffers, the resampled RGB8 image and the resizer's
/// own buffers. After warm-up a sample allocates only fast_image_resize's small coefficient
/// tables.
#[derive(Default)]
struct Scratch {
    decode: DecodeBuffers,
    resized: Vec<u8>,
    resizer: Resizer,
}

/// Decode buffers larger than this are released after use instead of kept for the next image.
const KEEP_SCRATCH_BYTES: usize = 64 << 20;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl Pipeline {
    /// Builds the pipeline of `spec` (None: no transform). `dtype` None picks `float32` when the
    /// pipeline normalizes, else `uint8`. The pipeline must end in an operation that fixes the
    /// output size, so that every image of a batch has the same shape.
    pub fn new(
        spec: Option<&str>,
        dtype: Option<DType>,
        layout: Layout,
        max_pixels: u64,
    ) -> Result<Pipeline, String> {
        let ops = match spec {
            Some(s) => parse(s)?,
            None => Vec::new(),
        };
        let mut size = None;
        let mut normalize = None;
        for op in &ops {
            match op {
                Op::ResizeShorter(_) => size = None,
                Op::Resize { height, width }
                | Op::CenterCrop { height, width }
                | Op::RandomResizedCrop { height, width, .. } => size = Some((*height, *width)),
                Op::HFlip { .. } => {}
                Op::Normalize { mean, std } => {
                    if normalize.is_some() {
                        return Err("normalize appears twice".into());
                    }
                    normalize = Some((*mean, *std));
                }
            }
        }
        let (height, width) = size.ok_or_else(|| {
            "images of a batch must all have one size: the transform must fix the output size \
             with resize(H, W), center_crop(S) or random_resized_crop(S) (e.g. \
             `resize(256) | center_crop(224)`)"
                .to_string()
        })?;
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
                Lut::F32(t)
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
            other => {
                return Err(format!(
                    "images can be uint8, float32, float16 or bfloat16, not {other}"
                ))
            }
        };
        Ok(Pipeline {
            ops,
            height,
            width,
            dtype,
            layout,
            max_pixels,
            lut,
        })
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Output height and width.
    pub fn output_size(&self) -> (usize, usize) {
        (self.height, self.width)
    }

    /// Bytes of one sample's output.
    pub fn output_bytes(&self) -> usize {
        self.height * self.width * 3 * self.dtype.size()
    }

    /// Folds the ops for a `width`x`height` decoded image, drawing the random choices from `rng`
    /// in op order.
    pub fn plan(&self, width: usize, height: usize, rng: &mut Rng) -> Result<Plan, String> {
        let mut v = View {
            clip: [0, 0, width, height],
            ox: 0.0,
            oy: 0.0,
            kx: 1.0,
            ky: 1.0,
            w: width,
            h: height,
            flip: false,
        };
        for op in &self.ops {
            match *op {
                Op::ResizeShorter(s) => {
                    let (w, h) = resize_shorter(v.w, v.h, s);
                    v.resize(w, h);
                }
                Op::Resize { height, width } => v.resize(width, height),
                Op::CenterCrop { height, width } => {
                    if height > v.h || width > v.w {
                        return Err(format!(
                            "image is {}x{} at center_crop({height}, {width}), smaller than the \
                             crop; put a resize before it",
                            v.w, v.h
                        ));
                    }
                    // torchvision: int(round((h - ch) / 2.0)), Python's round (half to even).
                    let top = ((v.h - height) as f64 / 2.0).round_ties_even() as usize;
                    let left = ((v.w - width) as f64 / 2.0).round_ties_even() as usize;
                    v.crop(top, left, height, width);
                }
                Op::RandomResizedCrop {
                    height,
                    width,
                    scale,
                    ratio,
                } => {
                    let (top, left, h, w) = random_resized_crop_params(v.w, v.h, scale, ratio, rng);
                    v.crop(top, left, h, w);
                    v.resize(width, height);
                }
                Op::HFlip { p } => {
                    if rng.unit_f64() < p {
                        v.flip = !v.flip;
                    }
                }
                Op::Normalize { .. } => {}
            }
        }
        // Keep the source rectangle inside the image despite float rounding.
        let left = v.ox.clamp(0.0, width as f64);
        let top = v.oy.clamp(0.0, height as f64);
        let rw = (v.w as f64 * v.kx).min(width as f64 - left);
        let rh = (v.h as f64 * v.ky).min(height as f64 - top);
        Ok(Plan {
            clip: v.clip,
            rect: [left, top, rw, rh],
            width: v.w,
            height: v.h,
            flip: v.flip,
        })
    }

    /// Decodes `encoded` and writes the transformed image into `out` (exactly
    /// [`output_bytes`](Self::output_bytes) bytes).
    pub fn run(&self, encoded: &[u8], rng: &mut Rng, out: &mut [u8]) -> Result<(), String> {
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => self.run_with(encoded, rng, out, &mut scratch),
            // Only reachable by re-entrance; stay correct with fresh buffers.
            Err(_) => self.run_with(encoded, rng, out, &mut Scratch::default()),
        })
    }

    fn run_with(
        &self,
        encoded: &[u8],
        rng: &mut Rng,
        out: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<(), String> {
        let dims = decode_rgb(encoded, self.max_pixels, &mut scratch.decode)?;
        let Scratch {
            decode,
            resized,
            resizer,
        } = scratch;
        let result = self.apply(
            &decode.rgb,
            dims.width,
            dims.height,
            rng,
            out,
            resized,
            resizer,
        );
        // Do not keep a rare huge image's buffers for the thread's lifetime.
        if decode.rgb.capacity() > KEEP_SCRATCH_BYTES {
            *decode = DecodeBuffers::default();
        }
        result
    }

    /// Transforms an already decoded RGB8 image (`width * height * 3` bytes) into `out`.
    pub fn apply_rgb(
        &self,
        rgb: &[u8],
        width: usize,
        height: usize,
        rng: &mut Rng,
        out: &mut [u8],
    ) -> Result<(), String> {
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => {
                let Scratch {
                    resized, resizer, ..
                } = &mut *s;
                self.apply(rgb, width, height, rng, out, resized, resizer)
            }
            Err(_) => self.apply(
                rgb,
                width,
                height,
                rng,
                out,
                &mut Vec::new(),
                &mut Resizer::new(),
            ),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        rgb: &[u8],
        width: usize,
        height: usize,
        rng: &mut Rng,
        out: &mut [u8],
        resized: &mut Vec<u8>,
        resizer: &mut Resizer,
    ) -> Result<(), String> {
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
        let plan = self.plan(width, height, rng)?;
        if (plan.width, plan.height) != (self.width, self.height) {
            return Err(format!(
                "internal: planned {}x{}, pipeline output {}x{}",
                plan.width, plan.height, self.width, self.height
            ));
        }
        let (src, stride, x0, y0) = if plan.is_copy() {
            (rgb, width * 3, plan.rect[0] as usize, plan.rect[1] as usize)
        } else {
            resample(rgb, width, height, &plan, resized, resizer)?;
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
        match &self.lut {
            Lut::U8 => write_u8(&img, self.layout, out),
            Lut::F32(t) => write_lut(&img, self.layout, t, out, f32::to_ne_bytes),
            Lut::Half(t) => write_lut(&img, self.layout, t, out, u16::to_ne_bytes),
        }
        Ok(())
    }
}

impl ImageWriter for Pipeline {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn shape(&self) -> Vec<usize> {
        match self.layout {
            Layout::Nchw => vec![3, self.height, self.width],
            Layout::Nhwc => vec![self.height, self.width, 3],
        }
    }

    fn write(&self, encoded: &[u8], rng: &mut Rng, out: &mut [u8]) -> Result<(), String> {
        self.run(encoded, rng, out)
    }
}

/// Resamples `plan.rect` of the clip region of `rgb` into `resized` (`plan.width` x
/// `plan.height` RGB8) with antialiased bilinear filtering (Pillow's algorithm: the filter
/// support widens by the downscale factor; taps are clamped at the clip borders).
fn resample(
    rgb: &[u8],
    width: usize,
    height: usize,
    plan: &Plan,
    resized: &mut Vec<u8>,
    resizer: &mut Resizer,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Debug| format!("resize failed: {e:?}");
    let src =
        ImageRef::new(width as u32, height as u32, rgb, PixelType::U8x3).map_err(|e| err(&e))?;
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
    resized.resize(plan.width * plan.height * 3, 0);
    let mut dst = Image::from_slice_u8(
        plan.width as u32,
        plan.height as u32,
        resized.as_mut_slice(),
        PixelType::U8x3,
    )
    .map_err(|e| err(&e))?;
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
        .crop(left, top, rw, rh);
    resizer
        .resize(&clip, &mut dst, &options)
        .map_err(|e| err(&e))
}

/// The final RGB8 pixels: `width` x `height` starting at `(x0, y0)` of `data` (row stride
/// `stride` bytes), read mirrored when `flip`.
struct SrcView<'a> {
    data: &'a [u8],
    stride: usize,
    x0: usize,
    y0: usize,
    width: usize,
    height: usize,
    flip: bool,
}

impl SrcView<'_> {
    /// The `width * 3` bytes of output row `y`.
    #[inline]
    fn row(&self, y: usize) -> &[u8] {
        let start = (self.y0 + y) * self.stride + self.x0 * 3;
        &self.data[start..start + self.width * 3]
    }

    /// Source pixel of output column `x`.
    #[inline]
    fn col(&self, x: usize) -> usize {
        if self.flip {
            self.width - 1 - x
        } else {
            x
        }
    }
}

/// The one output pass for uint8: flip and layout.
fn write_u8(img: &SrcView<'_>, layout: Layout, out: &mut [u8]) {
    let (w, h) = (img.width, img.height);
    match layout {
        Layout::Nhwc => {
            for (y, dst) in out.chunks_exact_mut(w * 3).enumerate().take(h) {
                let row = img.row(y);
                if img.flip {
                    for (x, px) in dst.chunks_exact_mut(3).enumerate() {
                        let s = img.col(x) * 3;
                        px.copy_from_slice(&row[s..s + 3]);
                    }
                } else {
                    dst.copy_from_slice(row);
                }
            }
        }
        Layout::Nchw => {
            for (c, plane) in out.chunks_exact_mut(w * h).enumerate().take(3) {
                for (y, dst) in plane.chunks_exact_mut(w).enumerate() {
                    let row = img.row(y);
                    for (x, v) in dst.iter_mut().enumerate() {
                        *v = row[img.col(x) * 3 + c];
                    }
                }
            }
        }
    }
}

/// The one output pass for float types: `lut[c][value]` per element (normalisation and type
/// conversion folded in), flip and layout; elements written native-endian.
fn write_lut<T: Copy, const N: usize>(
    img: &SrcView<'_>,
    layout: Layout,
    lut: &[[T; 256]; 3],
    out: &mut [u8],
    to_bytes: fn(T) -> [u8; N],
) {
    let (w, h) = (img.width, img.height);
    match layout {
        Layout::Nhwc => {
            for (y, dst) in out.chunks_exact_mut(w * 3 * N).enumerate().take(h) {
                let row = img.row(y);
                for (x, px) in dst.chunks_exact_mut(3 * N).enumerate() {
                    let s = img.col(x) * 3;
                    for c in 0..3 {
                        px[c * N..(c + 1) * N]
                            .copy_from_slice(&to_bytes(lut[c][row[s + c] as usize]));
                    }
                }
            }
        }
        Layout::Nchw => {
            for (c, plane) in out.chunks_exact_mut(w * h * N).enumerate().take(3) {
                let table = &lut[c];
                for (y, dst) in plane.chunks_exact_mut(w * N).enumerate() {
                    let row = img.row(y);
                    if img.flip {
                        for (x, e) in dst.chunks_exact_mut(N).enumerate() {
                            e.copy_from_slice(&to_bytes(table[row[(w - 1 - x) * 3 + c] as usize]));
                        }
                    } else {
                        for (e, px) in dst.chunks_exact_mut(N).zip(row.chunks_exact(3)) {
                            e.copy_from_slice(&to_bytes(table[px[c] as usize]));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::tests::fixture;
    use crate::rng::Stream;

    fn rng(index: u64) -> Rng {
        Rng::for_key(42, Stream::Augment, 3, index)
    }

    fn decoded(name: &str) -> (Vec<u8>, usize, usize) {
        let mut bufs = DecodeBuffers::default();
        let d = decode_rgb(&fixture(name), u64::MAX, &mut bufs).unwrap();
        (bufs.rgb, d.width, d.height)
    }

    fn pipeline(spec: &str, dtype: Option<DType>, layout: Layout) -> Pipeline {
        Pipeline::new(Some(spec), dtype, layout, 89_478_485)
            .unwrap_or_else(|e| panic!("{spec}: {e}"))
    }

    /// (max abs diff, mean abs diff) between two byte images.
    fn diff(a: &[u8], b: &[u8]) -> (u8, f64) {
        assert_eq!(a.len(), b.len());
        let max = a
            .iter()
            .zip(b)
            .map(|(x, y)| x.abs_diff(*y))
            .max()
            .unwrap_or(0);
        let sum: u64 = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y) as u64).sum();
        (max, sum as f64 / a.len() as f64)
    }

    #[test]
    fn parses_specs() {
        assert_eq!(
            parse("random_resized_crop(224) | hflip | normalize(imagenet)").unwrap(),
            vec![
                Op::RandomResizedCrop {
                    height: 224,
                    width: 224,
                    scale: (0.08, 1.0),
                    ratio: (0.75, 4.0 / 3.0)
                },
                Op::HFlip { p: 0.5 },
                Op::Normalize {
                    mean: IMAGENET_MEAN,
                    std: IMAGENET_STD
                },
            ]
        );
        assert_eq!(
            parse("resize(256)|center_crop(224, 200)|resize(10,20)|hflip(p=0.25)|hflip(1)")
                .unwrap(),
            vec![
                Op::ResizeShorter(256),
                Op::CenterCrop {
                    height: 224,
                    width: 200
                },
                Op::Resize {
                    height: 10,
                    width: 20
                },
                Op::HFlip { p: 0.25 },
                Op::HFlip { p: 1.0 },
            ]
        );
        assert_eq!(
            parse("random_resized_crop(160, 128, scale=0.35:1, ratio=3/4:4/3)").unwrap(),
            vec![Op::RandomResizedCrop {
                height: 160,
                width: 128,
                scale: (0.35, 1.0),
                ratio: (0.75, 4.0 / 3.0)
            }]
        );
        assert_eq!(
            parse("normalize(mean=0.5,0.25,0.125, std=0.5)").unwrap(),
            vec![Op::Normalize {
                mean: [0.5, 0.25, 0.125],
                std: [0.5; 3]
            }]
        );
        for (bad, needle) in [
            ("", "empty operation"),
            ("resize(256) |", "empty operation"),
            ("blur(3)", "unknown operation `blur`"),
            ("resize(0)", "not a size"),
            ("resize(a)", "not a size"),
            ("resize(1,2,3)", "at most 2"),
            ("center_crop(224", "missing closing parenthesis"),
            ("hflip(p=2)", "not a probability"),
            ("random_resized_crop(224, scale=1:0.5)", "0 < a <= b"),
            (
                "random_resized_crop(224, scael=0.5:1)",
                "unknown argument `scael`",
            ),
            ("normalize(mean=1,2)", "1 or 3 values"),
            ("normalize(mean=1, std=0)", "must not be 0"),
            ("normalize()", "needs mean"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    /// Random specs built from the grammar's characters never panic the parser.
    #[test]
    fn parser_survives_random_specs() {
        let alphabet: Vec<char> = "resizcntop_dmlhfgwa(),|=:/.0123456789 -e".chars().collect();
        let words = [
            "resize(",
            "center_crop(",
            "random_resized_crop(",
            "hflip",
            "normalize(",
            "imagenet",
            "scale=",
            "ratio=",
            "p=",
            "mean=",
            "std=",
            ")",
            "|",
            ",",
            "1e308",
            "0",
        ];
        let mut r = rng(7);
        for _ in 0..20_000 {
            let mut spec = String::new();
            for _ in 0..r.below(12) {
                if r.below(2) == 0 {
                    spec.push_str(words[r.below(words.len() as u64) as usize]);
                } else {
                    spec.push(alphabet[r.below(alphabet.len() as u64) as usize]);
                }
            }
            if let Ok(ops) = parse(&spec) {
                let _ = Pipeline::new(Some(&spec), None, Layout::Nchw, 1 << 20);
                assert!(!ops.is_empty());
            }
        }
    }

    #[test]
    fn pipeline_needs_a_fixed_size_and_a_sensible_dtype() {
        for spec in [
            None,
            Some("resize(256)"),
            Some("hflip"),
            Some("center_crop(9) | resize(7)"),
        ] {
            let err = Pipeline::new(spec, None, Layout::Nchw, 1 << 30).unwrap_err();
            assert!(err.contains("fix the output size"), "{spec:?}: {err}");
        }
        let err = Pipeline::new(
            Some("resize(8,8) | normalize(imagenet)"),
            Some(DType::U8),
            Layout::Nchw,
            1 << 30,
        )
        .unwrap_err();
        assert!(err.contains("normalize produces floats"), "{err}");
        let err = Pipeline::new(Some("resize(8,8)"), Some(DType::I64), Layout::Nchw, 1 << 30)
            .unwrap_err();
        assert!(err.contains("not int64"), "{err}");
        let p = pipeline(
            "resize(256) | center_crop(224) | normalize(imagenet)",
            None,
            Layout::Nchw,
        );
        assert_eq!((p.dtype(), p.shape()), (DType::F32, vec![3, 224, 224]));
        let p = pipeline("random_resized_crop(224, 200)", None, Layout::Nhwc);
        assert_eq!((p.dtype(), p.shape()), (DType::U8, vec![224, 200, 3]));
        assert_eq!(p.output_bytes(), 224 * 200 * 3);
    }

    #[test]
    fn resize_shorter_follows_torchvision() {
        // torchvision: new_long = int(size * long / short)
        assert_eq!(resize_shorter(500, 375, 256), (341, 256));
        assert_eq!(resize_shorter(375, 500, 256), (256, 341));
        assert_eq!(resize_shorter(640, 480, 224), (298, 224));
        assert_eq!(resize_shorter(300, 300, 224), (224, 224));
        assert_eq!(resize_shorter(1, 1000, 224), (224, 224000));
    }

    #[test]
    fn random_resized_crop_params_are_valid_and_follow_the_fallback() {
        let mut r = rng(0);
        for (w, h) in [
            (500, 375),
            (375, 500),
            (1, 1),
            (2, 1000),
            (1000, 2),
            (224, 224),
        ] {
            for _ in 0..500 {
                let (top, left, ch, cw) =
                    random_resized_crop_params(w, h, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut r);
                assert!(
                    ch >= 1 && cw >= 1 && top + ch <= h && left + cw <= w,
                    "{w}x{h}"
                );
            }
        }
        // scale > 1 never fits: the central fallback, clamped to the ratio range.
        let big = (5.0, 6.0);
        let ratio = (0.75, 4.0 / 3.0);
        assert_eq!(
            random_resized_crop_params(1000, 100, big, ratio, &mut r),
            (0, 433, 100, 133)
        );
        assert_eq!(
            random_resized_crop_params(100, 1000, big, ratio, &mut r),
            (433, 0, 133, 100)
        );
        assert_eq!(
            random_resized_crop_params(120, 100, big, ratio, &mut r),
            (0, 0, 100, 120)
        );
        // Crop areas: a Monte Carlo run of torchvision's algorithm in Python (200k draws,
        // 1000x1000 image) gives a mean area of 0.478 of the image (boxes that do not fit are
        // redrawn, which favours smaller ones).
        let mut r = rng(1);
        let n = 4000;
        let mean: f64 = (0..n)
            .map(|_| {
                let (_, _, h, w) =
                    random_resized_crop_params(1000, 1000, (0.08, 1.0), ratio, &mut r);
                (h * w) as f64 / 1e6
            })
            .sum::<f64>()
            / n as f64;
        assert!((0.465..0.49).contains(&mean), "mean crop area {mean}");
    }

    /// torchvision's `resized_crop` on a PIL image is `img.crop(box).resize(size, BILINEAR)`;
    /// the reference was computed so by Pillow (`bench/make_fixtures.py`). Tolerance: every
    /// byte within 1 level (fast_image_resize and Pillow round their fixed-point sums
    /// differently), mean difference below 0.15 level. (torch is not installed for the tests;
    /// torchvision's tensor path with antialias=True follows the same filter.)
    #[test]
    fn crop_then_resize_matches_pillow() {
        let (rgb, w, h) = decoded("photo_png.png");
        let (left, top, cw, ch) = (37, 21, 150, 125);
        let plan = Plan {
            clip: [left, top, left + cw, top + ch],
            rect: [left as f64, top as f64, cw as f64, ch as f64],
            width: 112,
            height: 96,
            flip: false,
        };
        let mut out = Vec::new();
        resample(&rgb, w, h, &plan, &mut out, &mut Resizer::new()).unwrap();
        let (max, mean) = diff(&out, &fixture("resize_crop_box.rgb"));
        assert!(max <= 1 && mean < 0.15, "max {max}, mean {mean}");
    }

    /// `resize(128) | center_crop(112)` fused into one resample equals resizing the whole
    /// image and then cropping (Pillow reference).
    #[test]
    fn resize_then_center_crop_matches_pillow() {
        let (rgb, w, h) = decoded("photo_png.png");
        let p = pipeline("resize(128) | center_crop(112)", None, Layout::Nhwc);
        let mut out = vec![0u8; p.output_bytes()];
        p.apply_rgb(&rgb, w, h, &mut rng(0), &mut out).unwrap();
        let (max, mean) = diff(&out, &fixture("resize_center.rgb"));
        assert!(max <= 1 && mean < 0.15, "max {max}, mean {mean}");
    }

    #[test]
    fn output_depends_only_on_the_key() {
        let encoded = fixture("photo_baseline.jpg");
        let p = pipeline(
            "random_resized_crop(64) | hflip | normalize(imagenet)",
            None,
            Layout::Nchw,
        );
        let run = |index| {
            let mut out = vec![0u8; p.output_bytes()];
            p.run(&encoded, &mut rng(index), &mut out).unwrap();
            out
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
        // From another thread (fresh scratch) too.
        let again = std::thread::scope(|s| s.spawn(|| run(5)).join().unwrap());
        assert_eq!(run(5), again);
    }

    #[test]
    fn hflip_mirrors_and_layouts_agree() {
        let (rgb, w, h) = decoded("photo_progressive.jpg");
        let plain = pipeline("resize(40, 60)", None, Layout::Nhwc);
        let flipped = pipeline("resize(40, 60) | hflip(p=1)", None, Layout::Nhwc);
        let chw = pipeline("resize(40, 60) | hflip(p=1)", None, Layout::Nchw);
        let mut a = vec![0u8; plain.output_bytes()];
        let mut b = a.clone();
        let mut c = a.clone();
        plain.apply_rgb(&rgb, w, h, &mut rng(0), &mut a).unwrap();
        flipped.apply_rgb(&rgb, w, h, &mut rng(0), &mut b).unwrap();
        chw.apply_rgb(&rgb, w, h, &mut rng(0), &mut c).unwrap();
        for y in 0..40 {
            for x in 0..60 {
                for ch in 0..3 {
                    let va = a[(y * 60 + x) * 3 + ch];
                    assert_eq!(va, b[(y * 60 + 59 - x) * 3 + ch]);
                    assert_eq!(b[(y * 60 + x) * 3 + ch], c[ch * 40 * 60 + y * 60 + x]);
                }
            }
        }
        // Crop after flip picks the mirrored box: flip | center_crop on an odd margin.
        let left_first = pipeline("center_crop(30, 55) | hflip(p=1)", None, Layout::Nhwc);
        let flip_first = pipeline("hflip(p=1) | center_crop(30, 55)", None, Layout::Nhwc);
        let small: Vec<u8> = a.clone(); // a 60x40 image
        let mut d = vec![0u8; left_first.output_bytes()];
        let mut e = d.clone();
        left_first
            .apply_rgb(&small, 60, 40, &mut rng(0), &mut d)
            .unwrap();
        flip_first
            .apply_rgb(&small, 60, 40, &mut rng(0), &mut e)
            .unwrap();
        // torchvision: center_crop rounds (60-55)/2 = 2.5 to 2; on the flipped image the box
        // starts 2 from the flipped left, i.e. 3 from the original left.
        for y in 0..30 {
            for x in 0..55 {
                let src_x = 60 - 1 - (2 + x); // flip, then crop at left 2
                let sy = 5 + y;
                for ch in 0..3 {
                    assert_eq!(e[(y * 55 + x) * 3 + ch], small[(sy * 60 + src_x) * 3 + ch]);
                }
            }
        }
        assert_ne!(d, e);
    }

    #[test]
    fn normalize_and_float_types() {
        let (rgb, w, h) = decoded("photo_444.jpg");
        let u8p = pipeline("resize(32, 48)", None, Layout::Nchw);
        let mut raw = vec![0u8; u8p.output_bytes()];
        u8p.apply_rgb(&rgb, w, h, &mut rng(0), &mut raw).unwrap();
        let n = 32 * 48;
        let spec = "resize(32, 48) | normalize(imagenet)";
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let p = pipeline(spec, Some(dtype), Layout::Nchw);
            let mut out = vec![0u8; p.output_bytes()];
            p.apply_rgb(&rgb, w, h, &mut rng(0), &mut out).unwrap();
            for (i, &x) in raw.iter().enumerate() {
                let c = i / n;
                let expected = (x as f64 / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
                let got = match dtype {
                    DType::F32 => {
                        f32::from_ne_bytes(out[i * 4..i * 4 + 4].try_into().unwrap()) as f64
                    }
                    DType::F16 => half::f16::from_bits(u16::from_ne_bytes(
                        out[i * 2..i * 2 + 2].try_into().unwrap(),
                    ))
                    .to_f64(),
                    _ => half::bf16::from_bits(u16::from_ne_bytes(
                        out[i * 2..i * 2 + 2].try_into().unwrap(),
                    ))
                    .to_f64(),
                };
                let tol = match dtype {
                    DType::F32 => 1e-6,
                    DType::F16 => 2e-3,
                    _ => 2e-2,
                };
                assert!(
                    (got - expected).abs() <= tol * expected.abs().max(1.0),
                    "{dtype} {i}: {got} vs {expected}"
                );
            }
        }
        // float32 without normalize is scaled to [0, 1].
        let p = pipeline("resize(32, 48)", Some(DType::F32), Layout::Nchw);
        let mut out = vec![0u8; p.output_bytes()];
        p.apply_rgb(&rgb, w, h, &mut rng(0), &mut out).unwrap();
        for (i, &x) in raw.iter().enumerate() {
            let got = f32::from_ne_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
            assert_eq!(got, (x as f64 / 255.0) as f32);
        }
    }

    #[test]
    fn identity_geometry_copies_pixels() {
        let (rgb, w, h) = decoded("photo_png.png");
        let p = pipeline("resize(188, 250)", None, Layout::Nhwc);
        let mut out = vec![0u8; p.output_bytes()];
        p.apply_rgb(&rgb, w, h, &mut rng(0), &mut out).unwrap();
        assert_eq!(out, rgb);
        // A crop without resize is a plain copy of the box.
        let p = pipeline("center_crop(100, 200)", None, Layout::Nhwc);
        let mut out = vec![0u8; p.output_bytes()];
        p.apply_rgb(&rgb, w, h, &mut rng(0), &mut out).unwrap();
        let (top, left) = (44, 25);
        for y in 0..100 {
            assert_eq!(
                &out[y * 600..(y + 1) * 600],
                &rgb[((top + y) * w + left) * 3..][..600]
            );
        }
    }

    #[test]
    fn bad_samples_are_errors_not_panics() {
        let p = pipeline("resize(256) | center_crop(224)", None, Layout::Nchw);
        let mut out = vec![0u8; p.output_bytes()];
        for bytes in [&b""[..], b"junk", &fixture("bomb_10000x10000.png")] {
            assert!(p.run(bytes, &mut rng(0), &mut out).is_err());
        }
        let mut short = vec![0u8; 10];
        let err = p
            .run(&fixture("tiny_1x1.png"), &mut rng(0), &mut short)
            .unwrap_err();
        assert!(err.contains("output slot"), "{err}");
        // Tiny images are upscaled, never rejected.
        for name in ["tiny_1x1.png", "tiny_1x1.jpg"] {
            p.run(&fixture(name), &mut rng(0), &mut out).unwrap();
            let rrc = pipeline("random_resized_crop(224) | hflip", None, Layout::Nchw);
            rrc.run(&fixture(name), &mut rng(0), &mut out).unwrap();
        }
        // center_crop larger than the image is a clear error.
        let p = pipeline("center_crop(224)", None, Layout::Nchw);
        let err = p
            .run(&fixture("png_gray.png"), &mut rng(0), &mut out)
            .unwrap_err();
        assert!(err.contains("smaller than the crop"), "{err}");
        // max_image_pixels is honoured.
        let p = Pipeline::new(Some("resize(8,8)"), None, Layout::Nchw, 100).unwrap();
        let mut out = vec![0u8; p.output_bytes()];
        let err = p
            .run(&fixture("png_gray.png"), &mut rng(0), &mut out)
            .unwrap_err();
        assert!(err.contains("max_image_pixels=100"), "{err}");
    }
}
