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
//! | `scale_jitter(S, scale=a:b, max_size=M)`, `scale_jitter(H, W, …)` | `ScaleJitter`: `r = min(H / h, W / w) * U(scale)` (default `0.1:2`), sides `int(side * r)`; `max_size` caps the longer side as `Resize(max_size=)` does. The size varies per sample: a sizing op must follow |
//! | `random_shortest_size(S1, S2, …, max_size=M)` | `RandomShortestSize`: the shorter side to one of the `S` drawn uniformly, `r = S / short`, lowered to `M / long`, sides `int(side * r)`. The size varies per sample: a sizing op must follow |
//! | `hflip`, `hflip(p=0.5)` | flip left-right with probability `p` (`RandomHorizontalFlip`) |
//! | `normalize(mean=a,b,c, std=a,b,c)`, `normalize(imagenet)` | `(x / 255 - mean) / std` per channel |
//! | `random_crop(S, padding=P, pad_mode=M, fill=V)` | `RandomCrop` (constant, edge, reflect, symmetric) |
//! | `random_zoom_out(fill=V, side_range=1:4, p=0.5)` | `RandomZoomOut`: the image at a random offset of a canvas `r` times its size, the rest `fill` (a mask's: `ignore_index`). The size varies per sample: a crop must follow |
//! | `vflip(p=0.5)` | `RandomVerticalFlip` |
//! | `color_jitter(brightness=, contrast=, saturation=, hue=)` | `ColorJitter`, random order |
//! | `random_photometric_distort(brightness=a:b, contrast=a:b, saturation=a:b, hue=a:b, p=0.5)` | `RandomPhotometricDistort`: each part with probability `p` (defaults `0.875:1.125`, `0.5:1.5`, `0.5:1.5`, `-0.05:0.05`), contrast before or after saturation and hue, channels permuted with probability `p` |
//! | `grayscale(p=0.1)` | `RandomGrayscale` |
//! | `gaussian_blur(K, sigma=a:b)` | `GaussianBlur` |
//! | `rotate(D, fill=V)`, `affine(degrees=, translate=, scale=, shear=, fill=)` | `RandomRotation`, `RandomAffine`, bilinear |
//! | `rand_augment(num_ops=2, magnitude=9)`, `trivial_augment`, `auto_augment(imagenet)` | `RandAugment`, `TrivialAugmentWide`, `AutoAugment` |
//! | `random_erasing(p=0.5, scale=a:b, ratio=a:b, value=V\|random)` | `RandomErasing` on the final tensor (value in output units; `random`: normal noise) |
//! | `fields(image=NAME, mask=NAME, boxes=NAME:FORMAT, labels=NAME, per_box=NAME,NAME, keypoints=NAME, ignore_index=255, min_size=1, min_area=1)` | first in a spec: the fields one draw moves (`tv_tensors.Mask`, `tv_tensors.BoundingBoxes`), see [`dense`] and [`boxes`] |
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
//! * a resize multiplies the scale by `old_size / new_size` (`scale_jitter` is a resize whose
//!   size is drawn per sample);
//! * a crop `(top, left, h, w)` adds `left * scale` to the offset; while no resize precedes it
//!   (scale 1) it is an integer crop of the decoded image and also narrows the clip rectangle,
//!   so the filter never reads outside it — exactly torchvision's crop-then-resize. A crop after a
//!   resize selects output pixels of that resize: the filter support stays that of the resize
//!   and is clamped at the borders of the image, as in resize-then-crop (pixels may differ by
//!   one level, as fast_image_resize sizes its fixed-point weights by the output's largest);
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
//! All randomness comes from the sample's [`Rng`](crate::rng::Rng), so the output is a pure function of
//! (seed, epoch, index).
//!
//! Decoding is not done here: [`crate::decode`] turns bytes into RGB8 and [`crate::collate`]
//! hands the decoded image to [`Pipeline::apply`].
//!
//! # After the plan
//!
//! The ops the plan cannot fold (and every op after the first of them) run on the
//! materialised, crop-sized RGB8 image (a constant-padded `random_crop` or `random_zoom_out`
//! right after the plan is drawn first, so that only the window it keeps is materialised) in the worker's reused buffers ([`Scratch`]): colour ops
//! in place, warps and crops through one spare buffer swapped in. `random_zoom_out` is such a
//! crop: a window the canvas's size over the image padded at the drawn offset (the plan does not
//! pad, and a zoom-out resamples nothing). They need the size fixed
//! before them. `random_erasing` is kept as a box and written by the output pass, in output
//! units, as torchvision erases the final (normalized) tensor.
//!
//! Layout: [`spec`] parses the spec language, [`geometry`] folds the geometric ops into one
//! [`Plan`] per sample, [`pipeline`] is the validated [`Pipeline`] that runs a plan, and
//! `kernels` holds the pixel loops (the resample and the one output pass); `augment` draws and
//! runs the ops after the plan, with `color`, `photometric` and [`warp`] their kernels. Tensor images of other
//! channel counts and types, and masks, go through [`dense`] (the same plan and draws, plane by
//! plane); bounding boxes through [`boxes`] and keypoints through [`keypoints`] (the same draws, moving
//! coordinates).

mod args;
mod augment;
mod auto_augment;
pub mod boxes;
pub mod cast;
mod color;
pub mod dense;
mod frame;
pub mod geometry;
pub mod iou_crop;
mod kernels;
pub mod keypoints;
pub mod mix;
mod photometric;
pub mod pipeline;
pub mod roles;
pub mod spec;
pub mod taps;
pub mod warp;

pub use auto_augment::AugOp;
pub use boxes::BoxPipeline;
pub use cast::{CastGeometry, DeviceCast};
pub use dense::{DensePipeline, DenseScratch, Role, TensorShape};
pub use geometry::{random_resized_crop_params, resize_shorter, Plan};
pub(crate) use kernels::{resample, Sampled};
pub use keypoints::KeypointPipeline;
pub use mix::{BatchMix, MixDraw};
pub use pipeline::{Pipeline, Scratch, NO_SIZE};
pub use roles::{roles, roles_with, BoxFormat, Roles, Sanitize, DEFAULT_IGNORE_INDEX};
pub use spec::{parse, EraseValue, Op, PadMode, IMAGENET_MEAN, IMAGENET_STD, MAX_CHANNELS};
pub use taps::{plan_taps, Taps, MAX_TAPS};

#[cfg(test)]
mod augment_tests;
#[cfg(test)]
mod detection_tests;
#[cfg(test)]
mod tests;
