//! The spec language: `random_resized_crop(224) | hflip | normalize(imagenet)` parsed into
//! [`Op`]s, each validated with an error naming the operation and the argument.

use super::args::{fill, number, probability, split_args, triple, Args};
use super::roles::roles;

/// ImageNet's channel means and standard deviations (torchvision's reference scripts).
pub const IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
/// ImageNet's per-channel standard deviations (torchvision's reference scripts).
pub const IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];

/// One operation of a pipeline spec.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Shorter side to this many pixels, aspect ratio kept.
    ResizeShorter(usize),
    /// Exactly this size.
    Resize {
        /// Output height in pixels.
        height: usize,
        /// Output width in pixels.
        width: usize,
    },
    /// `CenterCrop((height, width))`: the central `height`x`width` window (`center_crop(H, W)`).
    CenterCrop {
        /// Crop height in pixels.
        height: usize,
        /// Crop width in pixels.
        width: usize,
    },
    /// `RandomResizedCrop((height, width), scale, ratio)`: a random area and aspect ratio,
    /// resized to `height`x`width` (`random_resized_crop(H, W, scale=a:b, ratio=a:b)`).
    RandomResizedCrop {
        /// Output height in pixels.
        height: usize,
        /// Output width in pixels.
        width: usize,
        /// Range of the crop's area as a fraction of the image's (default `0.08:1`).
        scale: (f64, f64),
        /// Range of the crop's width/height ratio (default `3/4:4/3`).
        ratio: (f64, f64),
    },
    /// `ScaleJitter`: resized by `min(height / h, width / w) * U(scale)`, the aspect ratio
    /// kept; the output size varies per sample (`scale_jitter(S)`, `scale_jitter(H, W)`).
    ScaleJitter {
        /// Target height the base factor fits the image to.
        height: usize,
        /// Target width the base factor fits the image to.
        width: usize,
        /// Range the factor on the base scale is drawn from (default `0.1:2`).
        scale: (f64, f64),
        /// Longest side after the jitter (`Resize(max_size=)`'s cap), if any.
        max_size: Option<usize>,
    },
    /// `RandomShortestSize`: the shorter side to one of `sizes` (drawn uniformly), the longer
    /// scaled alike, both capped so that the longer is at most `max_size`; the output size
    /// varies per sample (`random_shortest_size(480, 512, 800, max_size=1333)`, DETR's
    /// multi-scale training).
    RandomShortestSize {
        /// The shorter side's candidates.
        sizes: Vec<usize>,
        /// Longest side's cap, if any.
        max_size: Option<usize>,
    },
    /// `RandomIoUCrop`: SSD's crop, drawn from the sample's boxes; the output size varies per
    /// sample (`random_iou_crop(scale=0.3:1, ratio=0.5:2, options=…, trials=40)`).
    RandomIouCrop(super::iou_crop::IouCrop),
    /// `RandomHorizontalFlip(p)` (`hflip(p=0.5)`).
    HFlip {
        /// Probability of flipping, in `[0, 1]`.
        p: f64,
    },
    /// `Normalize(mean, std)` on values scaled to `[0, 1]` (`normalize(imagenet)` or
    /// `normalize(mean=..., std=...)`): one value for every channel, or one per channel (3 for
    /// RGB, C for a C-channel tensor image; the pipeline checks the count).
    Normalize {
        /// Per-channel means subtracted (1 to [`MAX_CHANNELS`] values).
        mean: Vec<f64>,
        /// Per-channel standard deviations divided by; none is 0. As many as `mean`.
        std: Vec<f64>,
    },
    /// `RandomCrop`: pad each side by `padding` (`left, top, right, bottom`), then crop
    /// `height`x`width` at a uniformly drawn position.
    RandomCrop {
        /// Output height in pixels.
        height: usize,
        /// Output width in pixels.
        width: usize,
        /// Pixels added on each side, in `left, top, right, bottom` order.
        padding: [usize; 4],
        /// How the padding is filled.
        pad_mode: PadMode,
        /// Fill of the padding when `pad_mode` is [`PadMode::Constant`], in the image's units.
        fill: [f64; 3],
    },
    /// `RandomZoomOut`: with probability `p`, the image placed at a random offset on a canvas
    /// `r` times its size (`r` uniform in `side_range`), the rest `fill`; the output size varies
    /// per sample (`random_zoom_out(fill=V, side_range=1:4, p=0.5)`).
    RandomZoomOut {
        /// Fill of the canvas around the image.
        fill: [f64; 3],
        /// Range of the canvas side as a multiple of the image's, within `[1, MAX_ZOOM_OUT]`.
        side_range: (f64, f64),
        /// Probability of zooming out, in `[0, 1]`.
        p: f64,
    },
    /// `RandomVerticalFlip(p)` (`vflip(p=0.5)`).
    VFlip {
        /// Probability of flipping, in `[0, 1]`.
        p: f64,
    },
    /// `ColorJitter`: factor ranges (`None`: not applied); hue is an offset in turns.
    ColorJitter {
        /// Brightness factor range, `0 <= a <= b`.
        brightness: Option<(f64, f64)>,
        /// Contrast factor range, `0 <= a <= b`.
        contrast: Option<(f64, f64)>,
        /// Saturation factor range, `0 <= a <= b`.
        saturation: Option<(f64, f64)>,
        /// Hue offset range in turns, within `[-0.5, 0.5]`.
        hue: Option<(f64, f64)>,
    },
    /// `RandomPhotometricDistort`: each part applied with probability `p`, factor ranges
    /// `(min, max)`; contrast before or after saturation and hue; channels permuted with
    /// probability `p` (see `photometric`).
    RandomPhotometricDistort {
        /// Brightness factor range, `0 <= a <= b` (default `0.875:1.125`).
        brightness: (f64, f64),
        /// Contrast factor range, `0 <= a <= b` (default `0.5:1.5`).
        contrast: (f64, f64),
        /// Saturation factor range, `0 <= a <= b` (default `0.5:1.5`).
        saturation: (f64, f64),
        /// Hue offset range in turns, within `[-0.5, 0.5]` (default `-0.05:0.05`).
        hue: (f64, f64),
        /// Probability of each part and of the permutation, in `[0, 1]`.
        p: f64,
    },
    /// `RandomGrayscale`.
    Grayscale {
        /// Probability of converting to grayscale, in `[0, 1]` (default 0.1).
        p: f64,
    },
    /// `GaussianBlur`: odd kernel size, sigma drawn uniformly from the range.
    GaussianBlur {
        /// Kernel side in pixels: odd, in `1..=255`.
        kernel: usize,
        /// Range the standard deviation is drawn from, in pixels (default `0.1:2`).
        sigma: (f64, f64),
    },
    /// `RandomRotation` (bilinear): angle uniform in `degrees`.
    Rotate {
        /// Angle range in degrees (counter-clockwise), within `[-360, 360]`.
        degrees: (f64, f64),
        /// Fill of the area outside the rotated image.
        fill: [f64; 3],
    },
    /// `RandomAffine` (bilinear).
    Affine {
        /// Angle range in degrees, within `[-360, 360]` (default no rotation).
        degrees: (f64, f64),
        /// Largest horizontal and vertical shifts as fractions of width and height, in `[0, 1]`.
        translate: Option<(f64, f64)>,
        /// Range of the scale factor.
        scale: Option<(f64, f64)>,
        /// Range of the x-shear angle in degrees.
        shear: Option<(f64, f64)>,
        /// Fill of the area outside the transformed image.
        fill: [f64; 3],
    },
    /// `RandAugment(num_ops, magnitude)` with [`MAGNITUDE_BINS`] bins
    /// (`rand_augment(num_ops=2, magnitude=9)`).
    RandAugment {
        /// Operations applied per image, in `0..=16`.
        num_ops: usize,
        /// Magnitude bin, in `0..MAGNITUDE_BINS`.
        magnitude: usize,
    },
    /// `TrivialAugmentWide()` with [`MAGNITUDE_BINS`] bins (`trivial_augment`).
    TrivialAugment,
    /// `AutoAugment(AutoAugmentPolicy.IMAGENET)`.
    AutoAugment,
    /// Batch-level `Mixup` (timm): images and one-hot labels blended with the batch reversed.
    Mixup {
        /// `alpha` of the Beta(alpha, alpha) the weight `lam` is drawn from, in `(0, 100]`.
        alpha: f64,
        /// Number of classes of the one-hot labels, in `1..=2^20`.
        num_classes: usize,
        /// Probability of mixing a batch, in `[0, 1]`.
        p: f64,
        /// Label smoothing applied to the one-hot labels, in `[0, 1]`.
        label_smoothing: f64,
    },
    /// Batch-level `CutMix` (timm); `switch`: with mixup also given, the chance of cutmix.
    Cutmix {
        /// `alpha` of the Beta(alpha, alpha) `lam` is drawn from (the box covers about `1 - lam`).
        alpha: f64,
        /// Number of classes of the one-hot labels, in `1..=2^20`.
        num_classes: usize,
        /// Probability of mixing a batch, in `[0, 1]`.
        p: f64,
        /// With `mixup` also in the spec, the probability of cutmix instead of mixup, in `[0, 1]`.
        switch: f64,
    },
    /// `RandomErasing`; `value` is in the output's units (after `normalize`).
    RandomErasing {
        /// Probability of erasing, in `[0, 1]`.
        p: f64,
        /// Range of the erased area as a fraction of the image's, within `(0, 1]`.
        scale: (f64, f64),
        /// Range of the erased box's width/height ratio.
        ratio: (f64, f64),
        /// What is written into the box.
        value: EraseValue,
    },
}

/// What `random_erasing` writes into its box (torchvision's `value`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EraseValue {
    /// One value per channel, in the output's units.
    Fill([f64; 3]),
    /// `value=random`: standard normal noise, one draw per element (torchvision's
    /// `value="random"`, timm's `mode="pixel"`); float outputs only.
    Random,
}

/// How `random_crop` fills its padding (torchvision's `padding_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadMode {
    /// Pads with `fill`.
    Constant,
    /// Repeats the edge pixel.
    Edge,
    /// Mirrors without repeating the edge pixel.
    Reflect,
    /// Mirrors repeating the edge pixel.
    Symmetric,
}

/// Most channels a tensor image may have (and values `normalize` takes): a bound on what a
/// spec or a stored shape can make a worker allocate per channel. Multispectral stacks have
/// tens of bands, hyperspectral cubes a few hundred.
pub const MAX_CHANNELS: usize = 1024;

/// Largest canvas side `random_zoom_out` takes, as a multiple of the image's: a bound on what a
/// spec can make a worker allocate per sample (torchvision's detection recipes use up to 4).
pub const MAX_ZOOM_OUT: f64 = 10.0;

/// Most sizes `random_shortest_size` draws from (DETR's recipe lists eleven).
pub const MAX_SHORTEST_SIZES: usize = 64;

/// Number of magnitude bins of RandAugment and TrivialAugmentWide (torchvision's default).
pub const MAGNITUDE_BINS: usize = 31;

/// Every operation name, for messages.
const KNOWN: &str = "resize, center_crop, random_resized_crop, scale_jitter, \
                     random_shortest_size, random_crop, random_zoom_out, random_iou_crop, hflip, vflip, color_jitter, \
                     random_photometric_distort, grayscale, gaussian_blur, \
                     rotate, affine, rand_augment, trivial_augment, auto_augment, \
                     random_erasing, normalize, mixup, cutmix";

/// Parses a pipeline spec: operations separated by `|`, each `name` or `name(args)`, with
/// positional arguments first and then `key=value` ones (a value may hold commas:
/// `mean=0.5,0.5,0.5`). Numbers may be written as fractions (`3/4`), ranges as `a:b`.
///
/// A leading `fields(...)` term names roles, not an operation: it is skipped here and read by
/// [`roles`]; anywhere else it is an error.
pub fn parse(spec: &str) -> Result<Vec<Op>, String> {
    let mut ops = Vec::new();
    let skip = usize::from(roles(spec)?.is_some());
    for (i, part) in spec.split('|').map(str::trim).enumerate().skip(skip) {
        if part.is_empty() {
            return Err(format!("empty operation in `{spec}`"));
        }
        if part.starts_with("fields") && part[6..].trim_start().starts_with('(') {
            return Err(format!(
                "`{part}`: fields(...) names the roles of fields and must come first, not as \
                 operation {}",
                i + 1
            ));
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
        let op = parse_op(name, &args).map_err(|e| format!("`{part}`: {name}: {e}"))?;
        ops.push(op);
    }
    Ok(ops)
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
        "scale_jitter" => {
            args.check(2, &["scale", "max_size"])?;
            let (height, width) = sizes(args)?;
            let scale = match args.named("scale") {
                Some(s) => range(s, "scale")?,
                None => (0.1, 2.0),
            };
            let max_size = args
                .named("max_size")
                .map(|m| size(m).map_err(|e| format!("max_size: {e}")))
                .transpose()?;
            Ok(Op::ScaleJitter {
                height,
                width,
                scale,
                max_size,
            })
        }
        "random_shortest_size" => {
            args.check(MAX_SHORTEST_SIZES, &["max_size"])?;
            if args.positional.is_empty() {
                return Err(
                    "needs the shorter side's sizes, e.g. `random_shortest_size(480, \
                            512, 544, max_size=1333)`"
                        .into(),
                );
            }
            let sizes = args
                .positional
                .iter()
                .map(|s| size(s))
                .collect::<Result<Vec<_>, _>>()?;
            let max_size = args
                .named("max_size")
                .map(|m| size(m).map_err(|e| format!("max_size: {e}")))
                .transpose()?;
            Ok(Op::RandomShortestSize { sizes, max_size })
        }
        "random_iou_crop" => super::iou_crop::parse(args).map(Op::RandomIouCrop),
        "hflip" => {
            args.check(1, &["p"])?;
            Ok(Op::HFlip {
                p: probability(args, 0.5)?,
            })
        }
        "normalize" => {
            if args.positional.len() == 1 && args.positional[0] == "imagenet" {
                args.check(1, &[])?;
                return Ok(Op::Normalize {
                    mean: IMAGENET_MEAN.to_vec(),
                    std: IMAGENET_STD.to_vec(),
                });
            }
            args.check(0, &["mean", "std"])?;
            let values = |key: &str| -> Result<Vec<f64>, String> {
                let v = args
                    .named(key)
                    .ok_or("needs mean=... and std=..., or imagenet")?;
                let values = v.split(',').map(number).collect::<Result<Vec<_>, _>>()?;
                if values.len() > MAX_CHANNELS {
                    return Err(format!(
                        "{key} has {} values, more than {MAX_CHANNELS} channels",
                        values.len()
                    ));
                }
                Ok(values)
            };
            let (mean, std) = (values("mean")?, values("std")?);
            if mean.len() != std.len() && mean.len() != 1 && std.len() != 1 {
                return Err(format!(
                    "mean has {} values and std {}: give as many of each (or one)",
                    mean.len(),
                    std.len()
                ));
            }
            if std.contains(&0.0) {
                return Err("std must not be 0".into());
            }
            // One value stands for every channel: broadcast it to the other list's length.
            let n = mean.len().max(std.len());
            let widen = |v: Vec<f64>| if v.len() == 1 { vec![v[0]; n] } else { v };
            Ok(Op::Normalize {
                mean: widen(mean),
                std: widen(std),
            })
        }
        "random_crop" => {
            args.check(2, &["padding", "pad_mode", "fill"])?;
            let (height, width) = sizes(args)?;
            let padding = match args.named("padding") {
                None => [0; 4],
                Some(p) => padding(p)?,
            };
            let pad_mode = match args.named("pad_mode") {
                None | Some("constant") => PadMode::Constant,
                Some("edge") => PadMode::Edge,
                Some("reflect") => PadMode::Reflect,
                Some("symmetric") => PadMode::Symmetric,
                Some(other) => {
                    return Err(format!(
                        "pad_mode `{other}` is not one of constant, edge, reflect, symmetric"
                    ))
                }
            };
            Ok(Op::RandomCrop {
                height,
                width,
                padding,
                pad_mode,
                fill: fill(args)?,
            })
        }
        "random_zoom_out" => {
            args.check(0, &["fill", "side_range", "p"])?;
            let side_range = match args.named("side_range") {
                Some(s) => range(s, "side_range")?,
                None => (1.0, 4.0),
            };
            if side_range.0 < 1.0 || side_range.1 > MAX_ZOOM_OUT {
                return Err(format!(
                    "side_range={}:{} must lie within 1:{MAX_ZOOM_OUT} (the canvas is never \
                     smaller than the image)",
                    side_range.0, side_range.1
                ));
            }
            Ok(Op::RandomZoomOut {
                fill: fill(args)?,
                side_range,
                p: probability(args, 0.5)?,
            })
        }
        "vflip" => {
            args.check(1, &["p"])?;
            Ok(Op::VFlip {
                p: probability(args, 0.5)?,
            })
        }
        "grayscale" => {
            args.check(1, &["p"])?;
            Ok(Op::Grayscale {
                p: probability(args, 0.1)?,
            })
        }
        "color_jitter" => {
            let keys = ["brightness", "contrast", "saturation", "hue"];
            let args = &args.bound(0, &keys)?;
            args.check(0, &keys)?;
            let factor = |key: &str| -> Result<Option<(f64, f64)>, String> {
                let Some(v) = args.named(key) else {
                    return Ok(None);
                };
                let (a, b) = match v.split_once(':') {
                    Some((a, b)) => (number(a)?, number(b)?),
                    None => {
                        let x = number(v)?;
                        if x < 0.0 {
                            return Err(format!("{key}={v} must be >= 0"));
                        }
                        ((1.0 - x).max(0.0), 1.0 + x)
                    }
                };
                if !(0.0 <= a && a <= b) {
                    return Err(format!("{key}={v} needs 0 <= a <= b"));
                }
                // torchvision skips a factor whose range is exactly (1, 1).
                Ok((a, b).ne(&(1.0, 1.0)).then_some((a, b)))
            };
            let hue = match args.named("hue") {
                None => None,
                Some(v) => {
                    let (a, b) = match v.split_once(':') {
                        Some((a, b)) => (number(a)?, number(b)?),
                        None => {
                            let x = number(v)?;
                            (-x, x)
                        }
                    };
                    if !(-0.5 <= a && a <= b && b <= 0.5) {
                        return Err(format!("hue={v} needs -0.5 <= a <= b <= 0.5"));
                    }
                    (a, b).ne(&(0.0, 0.0)).then_some((a, b))
                }
            };
            Ok(Op::ColorJitter {
                brightness: factor("brightness")?,
                contrast: factor("contrast")?,
                saturation: factor("saturation")?,
                hue,
            })
        }
        "random_photometric_distort" => {
            let ([brightness, contrast, saturation, hue], p) = super::photometric::parse(args)?;
            Ok(Op::RandomPhotometricDistort {
                brightness,
                contrast,
                saturation,
                hue,
                p,
            })
        }
        "gaussian_blur" => {
            let args = &args.bound(1, &["sigma"])?;
            args.check(1, &["sigma"])?;
            let kernel = match args.positional.as_slice() {
                [k] => match k.parse::<usize>() {
                    Ok(k) if k % 2 == 1 && k <= 255 => k,
                    _ => return Err(format!("kernel size `{k}` must be odd, in 1..=255")),
                },
                _ => return Err("expected gaussian_blur(K, sigma=a:b)".into()),
            };
            let sigma = match args.named("sigma") {
                None => (0.1, 2.0),
                Some(s) if s.contains(':') => range(s, "sigma")?,
                Some(s) => {
                    let x = number(s)?;
                    if x <= 0.0 {
                        return Err(format!("sigma={s} must be > 0"));
                    }
                    (x, x)
                }
            };
            Ok(Op::GaussianBlur { kernel, sigma })
        }
        "rotate" => {
            args.check(1, &["degrees", "fill"])?;
            let degrees = match (
                args.positional.first().map(String::as_str),
                args.named("degrees"),
            ) {
                (Some(d), None) | (None, Some(d)) => angle_range(d, "degrees")?,
                _ => return Err("expected rotate(D) or rotate(degrees=a:b)".into()),
            };
            Ok(Op::Rotate {
                degrees,
                fill: fill(args)?,
            })
        }
        "affine" => {
            let args = &args.bound(0, &["degrees", "translate", "scale", "shear"])?;
            args.check(0, &["degrees", "translate", "scale", "shear", "fill"])?;
            let degrees = match args.named("degrees") {
                Some(d) => angle_range(d, "degrees")?,
                None => (0.0, 0.0),
            };
            let translate = match args.named("translate") {
                None => None,
                Some(t) => {
                    let (a, b) = pair(t, "translate")?;
                    if !((0.0..=1.0).contains(&a) && (0.0..=1.0).contains(&b)) {
                        return Err(format!("translate={t} needs fractions in [0, 1]"));
                    }
                    Some((a, b))
                }
            };
            let scale = args.named("scale").map(|s| range(s, "scale")).transpose()?;
            let shear = args
                .named("shear")
                .map(|s| angle_range(s, "shear"))
                .transpose()?;
            Ok(Op::Affine {
                degrees,
                translate,
                scale,
                shear,
                fill: fill(args)?,
            })
        }
        "rand_augment" => {
            let args = &args.bound(0, &["num_ops", "magnitude"])?;
            args.check(0, &["num_ops", "magnitude"])?;
            let num_ops = match args.named("num_ops") {
                None => 2,
                Some(n) => match n.parse::<usize>() {
                    Ok(n) if n <= 16 => n,
                    _ => return Err(format!("num_ops={n} is not an integer in 0..=16")),
                },
            };
            let magnitude = match args.named("magnitude") {
                None => 9,
                Some(m) => match m.parse::<usize>() {
                    Ok(m) if m < MAGNITUDE_BINS => m,
                    _ => {
                        return Err(format!(
                            "magnitude={m} is not an integer in 0..={}",
                            MAGNITUDE_BINS - 1
                        ))
                    }
                },
            };
            Ok(Op::RandAugment { num_ops, magnitude })
        }
        "trivial_augment" => {
            args.check(0, &[])?;
            Ok(Op::TrivialAugment)
        }
        "auto_augment" => {
            args.check(1, &[])?;
            match args.positional.first().map(String::as_str) {
                None | Some("imagenet") => Ok(Op::AutoAugment),
                Some(other) => Err(format!("policy `{other}` is not known (expected imagenet)")),
            }
        }
        "random_erasing" => {
            let args = &args.bound(1, &["scale", "ratio", "value"])?;
            args.check(1, &["p", "scale", "ratio", "value"])?;
            let p = probability(args, 0.5)?;
            let scale = match args.named("scale") {
                Some(s) => range(s, "scale")?,
                None => (0.02, 0.33),
            };
            if scale.1 > 1.0 {
                return Err(format!("scale={}:{} must lie in (0, 1]", scale.0, scale.1));
            }
            let ratio = match args.named("ratio") {
                Some(s) => range(s, "ratio")?,
                None => (0.3, 3.3),
            };
            let value = match args.named("value") {
                Some("random") => EraseValue::Random,
                Some(v) => EraseValue::Fill(triple(v, "value")?),
                None => EraseValue::Fill([0.0; 3]),
            };
            Ok(Op::RandomErasing {
                p,
                scale,
                ratio,
                value,
            })
        }
        "mixup" | "cutmix" => {
            let extra = if name == "mixup" {
                "label_smoothing"
            } else {
                "switch"
            };
            args.check(0, &["alpha", "num_classes", "p", extra])?;
            let alpha = match args.named("alpha") {
                Some(a) => number(a)?,
                None => 1.0,
            };
            if !(alpha > 0.0 && alpha <= 100.0) {
                return Err(format!("alpha={alpha} must be in (0, 100]"));
            }
            let num_classes = match args.named("num_classes").map(|n| n.parse::<usize>()) {
                Some(Ok(n)) if (1..=1 << 20).contains(&n) => n,
                Some(_) => return Err("num_classes must be an integer in 1..=1048576".into()),
                None => return Err("num_classes=N is required".into()),
            };
            let p = probability(args, 1.0)?;
            let extra_value = match args.named(extra) {
                Some(v) => number(v)?,
                None if name == "mixup" => 0.0,
                None => 0.5,
            };
            if !(0.0..=1.0).contains(&extra_value) {
                return Err(format!("{extra}={extra_value} must be in [0, 1]"));
            }
            Ok(if name == "mixup" {
                Op::Mixup {
                    alpha,
                    num_classes,
                    p,
                    label_smoothing: extra_value,
                }
            } else {
                Op::Cutmix {
                    alpha,
                    num_classes,
                    p,
                    switch: extra_value,
                }
            })
        }
        _ => Err(format!("unknown operation `{name}` (known: {KNOWN})")),
    }
}

/// `D` (meaning `-D:D`, `D >= 0`) or `a:b` with `a <= b`, in degrees.
fn angle_range(s: &str, what: &str) -> Result<(f64, f64), String> {
    let (a, b) = match s.split_once(':') {
        Some((a, b)) => (number(a)?, number(b)?),
        None => {
            let d = number(s)?;
            if d < 0.0 {
                return Err(format!("{what}={s} must be >= 0 (or a range a:b)"));
            }
            (-d, d)
        }
    };
    if a > b || a.abs() > 360.0 || b.abs() > 360.0 {
        return Err(format!("{what}={s} needs a <= b within [-360, 360]"));
    }
    Ok((a, b))
}

/// `a:b` of any two numbers.
fn pair(s: &str, what: &str) -> Result<(f64, f64), String> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| format!("{what} `{s}` is not a pair a:b"))?;
    Ok((number(a)?, number(b)?))
}

/// `P` (every side), `LR,TB` or `L,T,R,B` pixels.
fn padding(s: &str) -> Result<[usize; 4], String> {
    let values = s
        .split(',')
        .map(|v| match v.trim().parse::<usize>() {
            Ok(n) if n <= 4096 => Ok(n),
            _ => Err(format!("padding `{v}` is not an integer in 0..=4096")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    match values.as_slice() {
        [p] => Ok([*p; 4]),
        [lr, tb] => Ok([*lr, *tb, *lr, *tb]),
        [l, t, r, b] => Ok([*l, *t, *r, *b]),
        _ => Err(format!(
            "padding needs 1, 2 or 4 values, got {}",
            values.len()
        )),
    }
}

/// The fill of `op`, if it has one.
pub(super) fn op_fill(op: &Op) -> Option<[f64; 3]> {
    match *op {
        Op::RandomCrop { fill, .. }
        | Op::RandomZoomOut { fill, .. }
        | Op::Rotate { fill, .. }
        | Op::Affine { fill, .. } => Some(fill),
        _ => None,
    }
}
