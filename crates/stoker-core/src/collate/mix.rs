//! Collate's side of batch-level mixup/cutmix ([`crate::transform::mix`]): which spec mixes (and
//! the integer `label` field it needs), each label written as a one-hot float32 row in phase 2,
//! and the written batch mixed once, after every slot is written.

use crate::batch::FieldMeta;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::rng::{Rng, Stream};
use crate::source::{FieldKind, FieldSpec};
use crate::transform::{mix, parse, BatchMix};

use super::image::ImageStages;
use super::layout::Output;
use super::{BatchKey, Collator};

/// The batch-level mixing of the transform spec of `image`, whatever the image fields' sizes;
/// refused when `fields` has no integer scalar `label` to turn into soft targets.
pub(super) fn batch_mix(
    image: Option<&ImageStages>,
    fields: &[FieldSpec],
) -> Result<Option<BatchMix>> {
    let mix = match image.and_then(|stages| stages.transform.as_deref()) {
        Some(spec) => parse(spec)
            .and_then(|ops| BatchMix::from_ops(&ops))
            .map_err(|reason| Error::option("transform", reason))?,
        None => None,
    };
    if let Some(mix) = &mix {
        let labelled = fields.iter().any(|f| {
            f.name == "label"
                && matches!(&f.kind, FieldKind::Tensor { dtype: DType::I64 | DType::I32, shape } if shape.is_empty())
        });
        if !labelled {
            return Err(Error::option(
                "transform",
                format!(
                    "mixup/cutmix (num_classes={}) need an integer scalar field `label` to \
                     turn into soft targets; this source has none",
                    mix.num_classes
                ),
            ));
        }
    }
    Ok(mix)
}

/// Writes the integer label `src` (one `label_type`) of field `name` into `dst` as a float32
/// one-hot row of `num_classes`, with label smoothing `smoothing` folded in.
pub(super) fn write_soft_label(
    (label_type, num_classes, smoothing): (DType, usize, f64),
    name: &str,
    src: &[u8],
    dst: &mut [u8],
) -> std::result::Result<(), String> {
    let label = match label_type {
        DType::I32 => src
            .try_into()
            .map(|b: [u8; 4]| i32::from_ne_bytes(b) as i64),
        _ => src.try_into().map(i64::from_ne_bytes),
    }
    .map_err(|_| "label has the wrong size".to_string())?;
    if !(0..num_classes as i64).contains(&label) {
        return Err(format!(
            "field `{name}`: label {label} is outside 0..{num_classes} (mixup/cutmix num_classes)"
        ));
    }
    // timm's one-hot with smoothing: off = s / N, on = 1 - s + off.
    let off = (smoothing / num_classes as f64) as f32;
    let on = (1.0 - smoothing) as f32 + off;
    for (c, e) in dst.chunks_exact_mut(4).enumerate() {
        let v = if c as i64 == label { on } else { off };
        e.copy_from_slice(&v.to_ne_bytes());
    }
    Ok(())
}

impl Collator {
    /// mixup/cutmix over the written batch: one draw keyed by (seed, epoch, rank, batch position),
    /// images and soft labels of sample `i` blended with those of sample `n - 1 - i`.
    pub(super) fn mix_batch(&self, key: BatchKey, n: usize, metas: &[FieldMeta], slab: &mut [u8]) {
        let Some((f_img, pipeline)) = self.outputs.iter().enumerate().find_map(|(f, o)| match o {
            Output::Image { pipeline, .. } | Output::TensorImage { pipeline, .. } => {
                Some((f, pipeline))
            }
            _ => None,
        }) else {
            return;
        };
        let Some(mix) = pipeline.batch_mix() else {
            return;
        };
        let Some(f_label) = self
            .outputs
            .iter()
            .position(|o| matches!(o, Output::SoftLabel { .. }))
        else {
            return;
        };
        let (height, width) = pipeline.output_size();
        // Rank in the high half: a rank delivers far fewer than 2^32 batches an epoch.
        let batch = ((key.rank as u64) << 32) | key.position as u64;
        let mut rng = Rng::for_key(key.seed, Stream::Mix, key.epoch, batch);
        let draw = mix.draw(&mut rng, height, width);
        if draw.lam >= 1.0 || n < 2 {
            return;
        }
        let img = &metas[f_img];
        let images = &mut slab[img.offset..img.offset + img.num_bytes()];
        let dtype = pipeline.dtype();
        match draw.cut {
            Some(cut) => mix::swap_boxes(images, n, (height, width), pipeline.layout(), dtype, cut),
            None => mix::blend_pairs(images, n, img.num_bytes() / n, dtype, draw.lam),
        }
        let lab = &metas[f_label];
        let labels = &mut slab[lab.offset..lab.offset + lab.num_bytes()];
        mix::blend_pairs(labels, n, lab.num_bytes() / n, DType::F32, draw.lam);
    }
}

