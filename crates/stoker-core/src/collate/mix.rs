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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::collate::tests::{build, floats, image_stages, key};
    use crate::collate::BatchKey;
    use crate::source::MemorySource;

    const N: usize = 4;

    /// `N` 2x2 uint8 images (image `i` all `i * 60`) labelled `i % 3`.
    fn labelled_images() -> Arc<MemorySource> {
        let images = (0..N).flat_map(|i| [(i * 60) as u8; 12]).collect();
        let labels = (0..N as i64).flat_map(|i| (i % 3).to_ne_bytes()).collect();
        Arc::new(
            MemorySource::new()
                .with_tensor("image", DType::U8, &[2, 2, 3], images)
                .and_then(|s| s.with_tensor("label", DType::I64, &[], labels))
                .unwrap(),
        )
    }

    #[test]
    fn soft_labels_are_one_hot_rows_with_smoothing_folded_in() {
        let mut row = [0u8; 16];
        write_soft_label((DType::I32, 4, 0.2), "label", &2i32.to_ne_bytes(), &mut row).unwrap();
        let got: Vec<f32> = row
            .chunks_exact(4)
            .map(|e| f32::from_ne_bytes(e.try_into().unwrap()))
            .collect();
        assert_eq!(got, [0.05, 0.05, 0.85, 0.05]);
    }

    #[test]
    fn a_label_outside_num_classes_or_of_the_wrong_size_is_refused() {
        let mut row = [0u8; 12];
        let e =
            write_soft_label((DType::I64, 3, 0.0), "y", &3i64.to_ne_bytes(), &mut row).unwrap_err();
        assert!(e.contains("field `y`: label 3 is outside 0..3"), "{e}");
        let e = write_soft_label((DType::I64, 3, 0.0), "y", &[0; 4], &mut row).unwrap_err();
        assert_eq!(e, "label has the wrong size");
    }

    #[test]
    fn mixup_needs_an_integer_scalar_label_field() {
        let stages = image_stages(Some("mixup(alpha=1.0, num_classes=3)"));
        let floats = [FieldSpec::tensor("label", DType::F32, &[])];
        let e = batch_mix(Some(&stages), &floats).unwrap_err().to_string();
        assert!(e.contains("integer scalar field `label`"), "{e}");
        let ints = [FieldSpec::tensor("label", DType::I32, &[])];
        let mix = batch_mix(Some(&stages), &ints).unwrap().expect("a mix");
        assert_eq!(mix.num_classes, 3);
        // A spec without mixing needs no label.
        assert_eq!(
            batch_mix(Some(&image_stages(Some("hflip"))), &[]).unwrap(),
            None
        );
        assert_eq!(batch_mix(None, &[]).unwrap(), None);
    }

    #[test]
    fn a_mixed_batch_blends_each_sample_with_its_mirror_by_one_draw_per_batch() {
        let stages = Arc::new(image_stages(Some("mixup(alpha=1.0, num_classes=3)")));
        let c = Collator::new(labelled_images(), None, Some(stages), false).unwrap();
        let at = |position| BatchKey {
            position,
            ..key(5, 0)
        };
        let indices: Vec<usize> = (0..N).collect();
        let batch = build(&c, at(0), &indices).unwrap();
        let labels = floats(&batch, "label");
        let image = batch.field_by_name("image").unwrap();
        assert_eq!(image.shape, [N, 3, 2, 2]);
        let pixels = image.data.unwrap();
        // Sample i is lam * itself + (1 - lam) * sample N - 1 - i, labels and pixels alike.
        // Samples 0 and 3 are both class 0: their blend is still one-hot.
        assert!((labels[0] - 1.0).abs() < 1e-6, "{labels:?}");
        // Sample 1 is class 1, its mirror (sample 2) class 2.
        let lam = labels[3 + 1];
        assert!(
            lam > 0.0 && lam < 1.0,
            "mixup with alpha 1 mixes: {labels:?}"
        );
        assert!((labels[3 + 2] - (1.0 - lam)).abs() < 1e-6, "{labels:?}");
        assert!(
            (labels[2 * 3 + 2] - lam).abs() < 1e-6,
            "the mirror's weights: {labels:?}"
        );
        // The pixels of 1 and 2 are blended with the same weight, once.
        let mixed = pixels[12] as f32; // sample 1's first value, from 60 and 120
        let want = lam * 60.0 + (1.0 - lam) * 120.0;
        assert!((mixed - want).abs() <= 1.0, "{mixed} vs {want}");
        // One draw per batch: the same key mixes the same; another position draws anew.
        assert_eq!(
            floats(&build(&c, at(0), &indices).unwrap(), "label"),
            labels
        );
        assert_ne!(
            floats(&build(&c, at(1), &indices).unwrap(), "label"),
            labels
        );
    }
}
