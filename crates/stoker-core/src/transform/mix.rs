//! Batch-level mixing, timm's `Mixup` in batch mode: one draw per batch (keyed by seed, epoch,
//! rank and batch position) decides mixup or cutmix and `lam`; sample `i` is mixed with sample
//! `B - 1 - i` (the batch reversed, `x.flip(0)`), and the labels become float32 soft targets
//! `[B, num_classes]`: `lam * onehot(y_i) + (1 - lam) * onehot(y_{B-1-i})`, with label
//! smoothing `off = s / N`, `on = 1 - s + off`.

use super::spec::Op;
use crate::dtype::{DType, Layout};
use crate::rng::Rng;

/// The batch-level mixing of a pipeline.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchMix {
    /// `alpha` of mixup's Beta(alpha, alpha); `None` without `mixup`.
    pub mixup_alpha: Option<f64>,
    /// `alpha` of cutmix's Beta(alpha, alpha); `None` without `cutmix`.
    pub cutmix_alpha: Option<f64>,
    /// Probability a batch is mixed at all (timm's `prob`).
    pub p: f64,
    /// With both: the chance of cutmix (timm's `switch_prob`).
    pub switch: f64,
    /// Label smoothing of the soft targets, in `[0, 1]` (timm's `label_smoothing`).
    pub label_smoothing: f64,
    /// Number of classes: the soft targets' width.
    pub num_classes: usize,
}

/// One batch's draw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MixDraw {
    /// Weight of the sample itself (1: no mixing).
    pub lam: f64,
    /// Cutmix: the box `(top, bottom, left, right)` pasted from the partner; `lam` is the
    /// corrected one (1 - box area / image area).
    pub cut: Option<(usize, usize, usize, usize)>,
}

impl BatchMix {
    /// Collects the `mixup`/`cutmix` ops of a spec (at most one of each, with one class count).
    pub fn from_ops(ops: &[Op]) -> Result<Option<BatchMix>, String> {
        let mut mix: Option<BatchMix> = None;
        for op in ops {
            let (name, alpha, num_classes, p) = match *op {
                Op::Mixup {
                    alpha,
                    num_classes,
                    p,
                    ..
                } => ("mixup", alpha, num_classes, p),
                Op::Cutmix {
                    alpha,
                    num_classes,
                    p,
                    ..
                } => ("cutmix", alpha, num_classes, p),
                _ => continue,
            };
            let m = mix.get_or_insert(BatchMix {
                mixup_alpha: None,
                cutmix_alpha: None,
                p,
                switch: 0.5,
                label_smoothing: 0.0,
                num_classes,
            });
            if m.num_classes != num_classes {
                return Err(format!(
                    "{name}: num_classes={num_classes} differs from the other op's {}",
                    m.num_classes
                ));
            }
            m.p = m.p.min(p);
            match *op {
                Op::Mixup {
                    label_smoothing, ..
                } => {
                    if m.mixup_alpha.replace(alpha).is_some() {
                        return Err("mixup: appears twice".into());
                    }
                    m.label_smoothing = label_smoothing;
                }
                Op::Cutmix { switch, .. } => {
                    if m.cutmix_alpha.replace(alpha).is_some() {
                        return Err("cutmix: appears twice".into());
                    }
                    m.switch = switch;
                }
                _ => {}
            }
        }
        Ok(mix)
    }

    /// timm's `_params_per_batch` then `cutmix_bbox_and_lam(correct_lam=True)` for an image of
    /// `height`x`width`.
    pub fn draw(&self, rng: &mut Rng, height: usize, width: usize) -> MixDraw {
        let none = MixDraw {
            lam: 1.0,
            cut: None,
        };
        if rng.unit_f64() >= self.p {
            return none;
        }
        let (use_cutmix, alpha) = match (self.mixup_alpha, self.cutmix_alpha) {
            (Some(m), Some(c)) => {
                if rng.unit_f64() < self.switch {
                    (true, c)
                } else {
                    (false, m)
                }
            }
            (Some(m), None) => (false, m),
            (None, Some(c)) => (true, c),
            (None, None) => return none,
        };
        let lam = beta(rng, alpha);
        if !use_cutmix {
            return MixDraw { lam, cut: None };
        }
        // rand_bbox: cut = int(side * sqrt(1 - lam)), centre uniform, clipped.
        let ratio = (1.0 - lam).max(0.0).sqrt();
        let (cut_h, cut_w) = (
            (height as f64 * ratio) as usize,
            (width as f64 * ratio) as usize,
        );
        let cy = rng.below(height as u64) as usize;
        let cx = rng.below(width as u64) as usize;
        let top = cy.saturating_sub(cut_h / 2);
        let bottom = (cy + cut_h / 2).min(height);
        let left = cx.saturating_sub(cut_w / 2);
        let right = (cx + cut_w / 2).min(width);
        let area = (bottom - top) * (right - left);
        MixDraw {
            lam: 1.0 - area as f64 / (height * width) as f64,
            cut: Some((top, bottom, left, right)),
        }
    }
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut Rng) -> f64 {
    let u1 = 1.0 - rng.unit_f64(); // (0, 1]
    let u2 = rng.unit_f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Gamma(shape, 1) by Marsaglia and Tsang (shape < 1 boosted by `U^(1/shape)`). Hand-written
/// because the draw must come from the loader's keyed generator, which `rand_distr` would need
/// an adapter and a new dependency for.
fn gamma(rng: &mut Rng, shape: f64) -> f64 {
    if shape < 1.0 {
        let u = 1.0 - rng.unit_f64();
        return gamma(rng, shape + 1.0) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    // Accepts with probability > 0.95 per try; bounded for safety.
    for _ in 0..1000 {
        let x = normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = 1.0 - rng.unit_f64();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
    d
}

/// Beta(alpha, alpha) as `X / (X + Y)` of two Gamma(alpha) draws.
pub fn beta(rng: &mut Rng, alpha: f64) -> f64 {
    let x = gamma(rng, alpha);
    let y = gamma(rng, alpha);
    if x + y > 0.0 {
        x / (x + y)
    } else {
        0.5
    }
}

/// Reads and writes one element of an output type as f32.
fn load(dtype: DType, b: &[u8]) -> f32 {
    match dtype {
        DType::F32 => f32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => half::f16::from_bits(u16::from_ne_bytes([b[0], b[1]])).to_f32(),
        DType::BF16 => half::bf16::from_bits(u16::from_ne_bytes([b[0], b[1]])).to_f32(),
        _ => b[0] as f32,
    }
}

fn store(dtype: DType, v: f32, b: &mut [u8]) {
    match dtype {
        DType::F32 => b[..4].copy_from_slice(&v.to_ne_bytes()),
        DType::F16 => b[..2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_ne_bytes()),
        DType::BF16 => b[..2].copy_from_slice(&half::bf16::from_f32(v).to_bits().to_ne_bytes()),
        _ => b[0] = v.round().clamp(0.0, 255.0) as u8,
    }
}

/// Blends every pair of rows `(i, n - 1 - i)` of `rows` (each `row_bytes` long, elements of
/// `dtype`): `a' = lam a + (1 - lam) b`, `b' = lam b + (1 - lam) a`.
pub fn blend_pairs(rows: &mut [u8], n: usize, row_bytes: usize, dtype: DType, lam: f64) {
    let size = dtype.size();
    let (lam, rest) = (lam as f32, (1.0 - lam) as f32);
    for i in 0..n / 2 {
        let j = n - 1 - i;
        let (head, tail) = rows.split_at_mut(j * row_bytes);
        let a = &mut head[i * row_bytes..(i + 1) * row_bytes];
        let b = &mut tail[..row_bytes];
        for (ea, eb) in a.chunks_exact_mut(size).zip(b.chunks_exact_mut(size)) {
            let (x, y) = (load(dtype, ea), load(dtype, eb));
            store(dtype, lam * x + rest * y, ea);
            store(dtype, lam * y + rest * x, eb);
        }
    }
}

/// Swaps the box `(top, bottom, left, right)` between every pair of images `(i, n - 1 - i)` of
/// `images` (`[n, 3, h, w]` or `[n, h, w, 3]` of `dtype`).
#[allow(clippy::too_many_arguments)]
pub fn swap_boxes(
    images: &mut [u8],
    n: usize,
    (height, width): (usize, usize),
    layout: Layout,
    dtype: DType,
    (top, bottom, left, right): (usize, usize, usize, usize),
) {
    let size = dtype.size();
    let image_bytes = height * width * 3 * size;
    for i in 0..n / 2 {
        let j = n - 1 - i;
        let (head, tail) = images.split_at_mut(j * image_bytes);
        let a = &mut head[i * image_bytes..(i + 1) * image_bytes];
        let b = &mut tail[..image_bytes];
        let mut swap = |start: usize, len: usize| {
            a[start..start + len].swap_with_slice(&mut b[start..start + len]);
        };
        for y in top..bottom {
            match layout {
                Layout::Nhwc => swap((y * width + left) * 3 * size, (right - left) * 3 * size),
                Layout::Nchw => {
                    for c in 0..3 {
                        swap(
                            ((c * height + y) * width + left) * size,
                            (right - left) * size,
                        );
                    }
                }
            }
        }
    }
}
