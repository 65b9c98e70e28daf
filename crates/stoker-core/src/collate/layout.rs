//! The batch's field layout: what collate writes for each source field ([`Output`]), the shape
//! each field takes in the batch (a ragged field padded to the batch's longest sample) and where
//! it lies in the slab.
//!
//! The batch's fields are the source's, in order, followed by one int64 `<name>_lengths` field
//! per ragged field. Each field starts on a [`FIELD_ALIGN`] boundary, after the end of the one
//! before it.

use std::sync::Arc;

use crate::batch::FieldMeta;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::source::pixels::{tensor_image_shape, InputLayout};
use crate::source::{FieldKind, FieldSpec, Sample};
use crate::transform::{BatchMix, Pipeline, NO_SIZE};

use super::image::{tensor_pipeline, ImageStages};
use super::Collator;

/// Alignment of every field inside a slab (DLPack recommends 256 bytes for device copies).
const FIELD_ALIGN: usize = 256;

/// What collate writes for one source field.
pub(super) enum Output {
    Copy {
        dtype: DType,
        shape: Vec<usize>,
    },
    Pad {
        dtype: DType,
        inner: Vec<usize>,
        pad: Vec<u8>,
    },
    Image {
        stages: Arc<ImageStages>,
        pipeline: Arc<Pipeline>,
    },
    /// A uint8 RGB tensor (`[H, W, 3]` or `[3, H, W]`) transformed like a decoded image.
    TensorImage {
        pipeline: Arc<Pipeline>,
        height: usize,
        width: usize,
        layout: InputLayout,
    },
    /// An integer class label written as a float32 one-hot row of `num_classes` (label smoothing
    /// folded in), later blended by the batch's mixup/cutmix.
    SoftLabel {
        src: DType,
        num_classes: usize,
        smoothing: f64,
    },
}

impl Output {
    /// What collate writes for `spec`: `pad` is the ragged fields' pad value, `image` the image
    /// stages, `mix` the spec's batch-level mixing (which turns an integer scalar `label` into
    /// soft labels).
    pub(super) fn for_field(
        spec: &FieldSpec,
        pad: Option<f64>,
        image: Option<&Arc<ImageStages>>,
        mix: Option<&BatchMix>,
    ) -> Result<Output> {
        Ok(match &spec.kind {
            FieldKind::Tensor { dtype, shape }
                if spec.name == "label" && shape.is_empty() && mix.is_some() =>
            {
                let mix = mix.ok_or_else(|| Error::Internal("mix".into()))?;
                Output::SoftLabel {
                    src: *dtype,
                    num_classes: mix.num_classes,
                    smoothing: mix.label_smoothing,
                }
            }
            FieldKind::Tensor { dtype, shape } => match image.and_then(|stages| {
                tensor_image_shape(spec, stages.input_layout).map(|s| (stages, s))
            }) {
                Some((stages, (height, width, layout))) => Output::TensorImage {
                    pipeline: Arc::new(tensor_pipeline(stages, spec, height, width)?),
                    height,
                    width,
                    layout,
                },
                None => Output::Copy {
                    dtype: *dtype,
                    shape: shape.clone(),
                },
            },
            FieldKind::Ragged { dtype, inner_shape } => {
                // Raw bytes (a tar `txt` or `json` member, say) have an obvious pad, 0;
                // any other ragged tensor needs the caller to choose one.
                let raw_bytes = *dtype == DType::U8 && inner_shape.is_empty();
                let pad = pad.or(raw_bytes.then_some(0.0)).ok_or_else(|| {
                    Error::option(
                        "pad",
                        format!(
                            "field `{}` has a different length in each sample; set pad=VALUE to pad it",
                            spec.name
                        ),
                    )
                })?;
                let mut bytes = vec![0u8; dtype.size()];
                dtype.encode(pad, &mut bytes);
                Output::Pad {
                    dtype: *dtype,
                    inner: inner_shape.clone(),
                    pad: bytes,
                }
            }
            FieldKind::EncodedImage => {
                let stages = image.cloned().ok_or_else(|| {
                    Error::Unsupported(format!(
                        "field `{}` holds encoded images but no image pipeline is configured",
                        spec.name
                    ))
                })?;
                let pipeline = stages.pipeline.clone().ok_or_else(|| {
                    Error::option(
                        "transform",
                        format!("field `{}` holds encoded images: {NO_SIZE}", spec.name),
                    )
                })?;
                Output::Image { stages, pipeline }
            }
        })
    }
}

impl Collator {
    /// Whether any field's shape depends on the samples (a ragged field).
    pub(super) fn has_ragged(&self) -> bool {
        self.outputs.iter().any(|o| matches!(o, Output::Pad { .. }))
    }

    /// Elements (rows of the inner shape) of ragged field `field` in `sample`; 0 for any other
    /// field.
    pub(super) fn ragged_len(&self, field: usize, sample: &Sample<'_>) -> usize {
        match &self.outputs[field] {
            Output::Pad { dtype, inner, .. } => {
                sample.get(field).len() / (inner.iter().product::<usize>() * dtype.size()).max(1)
            }
            _ => 0,
        }
    }

    /// The padded length of each field of a batch of `samples`: the longest sample's, for a
    /// ragged field; 0 for the others.
    pub(super) fn padded_lengths(&self, samples: &[(usize, Sample<'_>)]) -> Vec<usize> {
        let mut max_len = vec![0usize; self.outputs.len()];
        for (_, sample) in samples {
            for (f, out) in self.outputs.iter().enumerate() {
                if let Output::Pad { .. } = out {
                    max_len[f] = max_len[f].max(self.ragged_len(f, sample));
                }
            }
        }
        max_len
    }

    /// The batch's fields and the slab size they need: the source's fields in order, then one
    /// `<name>_lengths` field per ragged field.
    pub(super) fn layout(&self, n: usize, max_len: &[usize]) -> (Vec<FieldMeta>, usize) {
        let mut metas = Vec::with_capacity(self.outputs.len() + 1);
        let mut offset = 0;
        let mut push = |name: String, dtype: DType, shape: Vec<usize>| {
            let meta = FieldMeta {
                name,
                dtype,
                shape,
                offset,
            };
            offset = (offset + meta.num_bytes()).div_ceil(FIELD_ALIGN) * FIELD_ALIGN;
            metas.push(meta);
        };
        for (f, out) in self.outputs.iter().enumerate() {
            let (dtype, per_sample) = match out {
                Output::Copy { dtype, shape } => (*dtype, shape.clone()),
                Output::Pad { dtype, inner, .. } => (
                    *dtype,
                    std::iter::once(max_len[f])
                        .chain(inner.iter().copied())
                        .collect(),
                ),
                Output::Image { pipeline, .. } | Output::TensorImage { pipeline, .. } => {
                    (pipeline.dtype(), pipeline.shape())
                }
                Output::SoftLabel { num_classes, .. } => (DType::F32, vec![*num_classes]),
            };
            push(
                self.names[f].clone(),
                dtype,
                std::iter::once(n).chain(per_sample).collect(),
            );
        }
        for (f, out) in self.outputs.iter().enumerate() {
            if let Output::Pad { .. } = out {
                push(format!("{}_lengths", self.names[f]), DType::I64, vec![n]);
            }
        }
        (metas, offset.max(1))
    }
}

