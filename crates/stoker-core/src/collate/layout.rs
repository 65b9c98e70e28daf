//! The batch's field layout: what collate writes for each source field ([`Output`]), the shape
//! each field takes in the batch and where it lies in the slab.
//!
//! A ragged field is laid out as the option `ragged` says ([`Ragged`]): padded to the batch's
//! longest sample, `[n, longest, *inner]`, with an int64 `<name>_lengths` field of `n`; or flat,
//! the samples' elements end to end, `[total, *inner]`, with an int64 `<name>_offsets` field of
//! `n + 1` (`offsets[i]..offsets[i + 1]` are sample `i`'s rows: the layout of
//! `torch.nested.nested_tensor_from_jagged` and of CSR). A flat field's slab room is the sum of
//! the lengths phase 1 read, never more than the padded layout of the same batch would take; the
//! rows written may be fewer (boxes a draw dropped), and the field's shape is then cut to them.
//!
//! The batch's fields are the source's, in order, followed by one int64 `<name>_lengths` or
//! `<name>_offsets` field per ragged field. Each field starts on a [`FIELD_ALIGN`] boundary,
//! after the end of the one before it.

use std::sync::Arc;

use crate::batch::{FieldMeta, FIELD_ALIGN};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::source::pixels::{tensor_image_dims, InputLayout};
use crate::source::{FieldKind, FieldSpec, Sample};
use crate::transform::{
    BatchMix, BoxPipeline, DensePipeline, KeypointPipeline, Pipeline, Role, Roles, TensorShape,
    NO_SIZE,
};

use super::image::{dense_pipeline, tensor_pipeline, ImageStages};
use super::Collator;

/// How ragged fields are batched (the option `ragged`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RaggedLayout {
    /// Padded to the batch's longest sample, with `<name>_lengths`.
    #[default]
    Pad,
    /// The samples' rows end to end, with `<name>_offsets`.
    Offsets,
}

/// How a collator batches ragged fields. `None` and `Some(v)` convert to `Pad`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ragged {
    /// Padded with this value, with `<name>_lengths` (`None`: raw bytes pad with 0, any other
    /// ragged field is refused).
    Pad(Option<f64>),
    /// Flat, the samples' rows end to end, with `<name>_offsets`; no pad value is needed.
    Offsets,
}

impl From<Option<f64>> for Ragged {
    fn from(pad: Option<f64>) -> Ragged {
        Ragged::Pad(pad)
    }
}

/// What collate writes for one source field.
pub(super) enum Output {
    Copy {
        dtype: DType,
        shape: Vec<usize>,
    },
    /// A field whose first dimension varies by sample: padded with `pad` (one element's bytes)
    /// when it is `Some`, flat (rows end to end, with offsets) when it is `None`.
    Ragged {
        dtype: DType,
        inner: Vec<usize>,
        pad: Option<Vec<u8>>,
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
    /// Any other image-shaped tensor (a channel count other than RGB's, a float type), or a
    /// mask: transformed plane by plane with its sample's draw.
    Dense {
        pipeline: Arc<DensePipeline>,
    },
    /// The PNG mask of `fields(mask=)` beside an encoded image: decoded to int64 labels, then
    /// moved with the image's draw by a mask pipeline built for each sample's size (which is the
    /// image's, checked per sample). `image` is the image field (set by [`check_roles`]);
    /// `height`x`width` the output size, the image pipeline's.
    EncodedMask {
        stages: Arc<ImageStages>,
        image: usize,
        height: usize,
        width: usize,
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
    /// What collate writes for `spec`: `ragged` is how ragged fields are batched, `image` the
    /// image stages, `mix` the spec's batch-level mixing (which turns an integer scalar `label`
    /// into soft labels).
    pub(super) fn for_field(
        spec: &FieldSpec,
        ragged: Ragged,
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
            FieldKind::Tensor { dtype, shape } => match image {
                Some(stages) => tensor_output(stages, spec, *dtype, shape)?,
                None => Output::Copy {
                    dtype: *dtype,
                    shape: shape.clone(),
                },
            },
            FieldKind::Ragged { dtype, inner_shape } => {
                let pad = match ragged {
                    Ragged::Pad(pad) => pad,
                    // Nothing is padded: no pad value is needed.
                    Ragged::Offsets => {
                        return Ok(Output::Ragged {
                            dtype: *dtype,
                            inner: inner_shape.clone(),
                            pad: None,
                        })
                    }
                };
                // Raw bytes (a tar `txt` or `json` member, say) have an obvious pad, 0;
                // any other ragged tensor needs the caller to choose one.
                let raw_bytes = *dtype == DType::U8 && inner_shape.is_empty();
                // A pad chosen for other fields (-1 for token ids, say) that raw bytes cannot
                // hold leaves them their own, 0.
                let pad = pad.filter(|&v| !raw_bytes || dtype.holds(v));
                let pad = pad.or(raw_bytes.then_some(0.0)).ok_or_else(|| {
                    Error::option(
                        "pad",
                        format!(
                            "field `{}` has a different length in each sample; set pad=VALUE to \
                             pad it, or ragged=offsets to batch it flat with offsets",
                            spec.name
                        ),
                    )
                })?;
                if !dtype.holds(pad) {
                    return Err(Error::option(
                        "pad",
                        format!(
                            "pad={pad} is not a {dtype} value, and field `{}` is {dtype}: it \
                             would be padded with another value (a sentinel such as -1 with \
                             0); choose a pad the field's type holds",
                            spec.name
                        ),
                    ));
                }
                let mut bytes = vec![0u8; dtype.size()];
                dtype.encode(pad, &mut bytes);
                Output::Ragged {
                    dtype: *dtype,
                    inner: inner_shape.clone(),
                    pad: Some(bytes),
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
                let is_mask = stages
                    .roles
                    .as_ref()
                    .is_some_and(|r| r.mask.as_deref() == Some(spec.name.as_str()));
                if is_mask {
                    let (height, width) = pipeline.output_size();
                    return Ok(Output::EncodedMask {
                        stages,
                        image: usize::MAX,
                        height,
                        width,
                    });
                }
                Output::Image { stages, pipeline }
            }
        })
    }
}

/// What collate writes for tensor field `spec` when there are image stages: the mask of
/// `fields(...)`, an image (RGB8 or dense), or a copy.
fn tensor_output(
    stages: &ImageStages,
    spec: &FieldSpec,
    dtype: DType,
    shape: &[usize],
) -> Result<Output> {
    let name = spec.name.as_str();
    if let Some(roles) = &stages.roles {
        if roles.mask.as_deref() == Some(name) {
            let &[height, width] = shape else {
                return Err(Error::option(
                    "transform",
                    format!(
                        "fields(mask={name}): a mask is an [H, W] tensor of integer labels; \
                         field `{name}` is {dtype} {shape:?}"
                    ),
                ));
            };
            let input = TensorShape {
                height,
                width,
                channels: 1,
                dtype,
                layout: InputLayout::Hwc,
            };
            let role = Role::Mask {
                ignore_index: roles.ignore_index,
            };
            let pipeline = dense_pipeline(stages, spec, input, role)?;
            return Ok(Output::Dense {
                pipeline: Arc::new(pipeline),
            });
        }
        if roles.image.as_deref().is_some_and(|image| image != name) {
            // Not a role of the draw: delivered as stored.
            return Ok(Output::Copy {
                dtype,
                shape: shape.to_vec(),
            });
        }
    }
    Ok(match tensor_image_dims(spec, stages.input_layout) {
        Some((height, width, 3, layout, DType::U8)) => Output::TensorImage {
            pipeline: Arc::new(tensor_pipeline(stages, spec, height, width)?),
            height,
            width,
            layout,
        },
        Some((height, width, channels, layout, dtype)) => {
            let input = TensorShape {
                height,
                width,
                channels,
                dtype,
                layout,
            };
            let pipeline = dense_pipeline(stages, spec, input, Role::Image)?;
            Output::Dense {
                pipeline: Arc::new(pipeline),
            }
        }
        None if stages.roles.as_ref().and_then(|r| r.image.as_deref()) == Some(name) => {
            return Err(Error::option(
                "transform",
                format!(
                    "fields(image={name}): field `{name}` ({dtype} {shape:?}) is not an image: \
                     a 3-dimensional uint8, uint16, float16, bfloat16 or float32 tensor whose channels \
                     input_layout (hwc or chw) says, or the shape shows (1, 3 or 4 channels)"
                ),
            ))
        }
        None => Output::Copy {
            dtype,
            shape: shape.to_vec(),
        },
    })
}

/// The boxes of `fields(boxes=...)`: their field, their labels' field and other per-box fields,
/// and how a draw moves them.
pub(super) struct BoxRole {
    pub(super) field: usize,
    pub(super) labels: Option<usize>,
    /// Fields of one row per box besides the labels (`fields(per_box=...)`).
    pub(super) per_box: Vec<usize>,
    pub(super) pipeline: BoxPipeline,
    /// The encoded image field whose size (read per sample) the boxes are in; `None` for a
    /// tensor image, whose size `pipeline` was built for.
    pub(super) encoded: Option<usize>,
}

impl BoxRole {
    /// Whether `field` has one row per box (the labels or a per-box field), kept and dropped
    /// with its box.
    pub(super) fn follows(&self, field: usize) -> bool {
        self.labels == Some(field) || self.per_box.contains(&field)
    }
}

/// The keypoints of `fields(keypoints=...)`: their field, its columns (2 or 3), and how a draw
/// moves them.
pub(super) struct KeypointRole {
    pub(super) field: usize,
    pub(super) columns: usize,
    pub(super) pipeline: KeypointPipeline,
    /// The encoded image field whose size (read per sample) the keypoints are in; `None` for a
    /// tensor image, whose size `pipeline` was built for.
    pub(super) encoded: Option<usize>,
}

/// The coordinate fields a sample's draw moves.
#[derive(Default)]
pub(super) struct Moving {
    pub(super) boxes: Option<BoxRole>,
    pub(super) keypoints: Option<KeypointRole>,
}

/// Checks the roles of `fields(...)` (of transform `spec`) against the source's fields and what
/// collate made of them: the named fields exist, there is one image, and it is a tensor (the
/// draw is planned on its size for every role) or an encoded image (sized per sample, with a
/// PNG mask if any); a mask has the image's size; boxes are ragged float32 rows of 4, labels
/// ragged integers, keypoints ragged float32 rows of 2 or 3. Returns how the boxes and the
/// keypoints move, if any.
pub(super) fn check_roles(
    roles: &Roles,
    spec: &str,
    names: &[String],
    outputs: &mut [Output],
) -> Result<Moving> {
    let err = |m: String| Error::option("transform", m);
    let list = names.join(", ");
    let find = |role: &str, name: &str| {
        names.iter().position(|n| n == name).ok_or_else(|| {
            err(format!(
                "fields({role}={name}): the source has no field `{name}` (its fields: {list})"
            ))
        })
    };
    let mask = roles.mask.as_deref().map(|m| find("mask", m)).transpose()?;
    let boxes = match &roles.boxes {
        Some((b, _)) => Some(find("boxes", b)?),
        None => None,
    };
    let labels = roles
        .labels
        .as_deref()
        .map(|l| find("labels", l))
        .transpose()?;
    let keypoints = roles
        .keypoints
        .as_deref()
        .map(|k| find("keypoints", k))
        .transpose()?;
    let per_box = roles
        .per_box
        .iter()
        .map(|name| find("per_box", name))
        .collect::<Result<Vec<_>>>()?;
    let roled: Vec<Option<usize>> = [mask, boxes, labels, keypoints]
        .into_iter()
        .chain(per_box.iter().map(|&f| Some(f)))
        .collect();
    let images: Vec<usize> = match roles.image.as_deref() {
        Some(name) => vec![find("image", name)?],
        None => (0..outputs.len())
            .filter(|&f| !roled.contains(&Some(f)))
            .filter(|&f| {
                matches!(
                    outputs[f],
                    Output::Image { .. } | Output::TensorImage { .. } | Output::Dense { .. }
                )
            })
            .collect(),
    };
    let &[image] = images.as_slice() else {
        return Err(err(format!(
            "fields(...): {} image fields; name the one the other roles belong to with \
             fields(image=NAME, ...)",
            images.len()
        )));
    };
    if let Some(mask) = mask.filter(|&m| matches!(outputs[m], Output::EncodedMask { .. })) {
        // An encoded mask goes with an encoded image: their sizes are checked per sample.
        if !matches!(outputs[image], Output::Image { .. }) {
            return Err(err(format!(
                "fields(mask={}): an encoded (PNG) mask goes with an encoded image; the image \
                 `{}` is a tensor: store the mask as an [H, W] integer tensor too",
                names[mask], names[image]
            )));
        }
        if let Output::EncodedMask { image: of, .. } = &mut outputs[mask] {
            *of = image;
        }
    }
    // An encoded image's size is read from each sample's header: its boxes' pipeline is sized
    // per sample (`BoxRole::encoded`), and an encoded mask is checked against it per sample.
    let (height, width, encoded) = match &outputs[image] {
        Output::TensorImage { height, width, .. } => (*height, *width, None),
        Output::Dense { pipeline } => (pipeline.input().height, pipeline.input().width, None),
        Output::Image { .. }
            if mask.is_none_or(|m| matches!(outputs[m], Output::EncodedMask { .. })) =>
        {
            (0, 0, Some(image))
        }
        Output::Image { .. } => {
            return Err(err(format!(
                "fields(...): the image `{}` is encoded (JPEG or PNG) but its mask is a tensor: \
                 store the mask as a PNG too, or the image as a tensor",
                names[image]
            )))
        }
        _ => {
            return Err(err(format!(
                "fields(...): the image `{}` is neither an image tensor of a known size (npy, \
                 packed or callback tensors) nor an encoded image (JPEG or PNG), so masks, boxes \
                 and keypoints cannot move with it",
                names[image]
            )))
        }
    };
    if let Some(mask) = mask.filter(|_| encoded.is_none()) {
        let Output::Dense { pipeline } = &outputs[mask] else {
            return Err(err(format!(
                "internal: mask `{}` has no mask pipeline",
                names[mask]
            )));
        };
        let mask_size = (pipeline.input().height, pipeline.input().width);
        if mask_size != (height, width) {
            return Err(err(format!(
                "fields(mask={}): the mask is {}x{} (HxW) but the image `{}` is {height}x{width}; \
                 one draw needs them the same size",
                names[mask], mask_size.0, mask_size.1, names[image]
            )));
        }
    }
    let keypoints = match keypoints {
        None => None,
        Some(field) => {
            let columns = match &outputs[field] {
                Output::Ragged {
                    dtype: DType::F32,
                    inner,
                    ..
                } if matches!(inner.as_slice(), [2] | [3]) => inner[0],
                _ => {
                    return Err(err(format!(
                        "fields(keypoints={}): keypoints are float32 rows of 2 (x, y) or 3 (x, y, \
                         visibility), one row per point, as many as each sample has (a ragged \
                         field: set pad=VALUE to pad them, or ragged=offsets)",
                        names[field]
                    )))
                }
            };
            let pipeline = KeypointPipeline::new(spec, width, height)
                .map_err(|reason| err(format!("field `{}`: {reason}", names[field])))?;
            Some(KeypointRole {
                field,
                columns,
                pipeline,
                encoded,
            })
        }
    };
    let (Some(field), Some((_, format))) = (boxes, &roles.boxes) else {
        return Ok(Moving {
            boxes: None,
            keypoints,
        });
    };
    match &outputs[field] {
        Output::Ragged {
            dtype: DType::F32,
            inner,
            ..
        } if inner.as_slice() == [4] => {}
        _ => {
            return Err(err(format!(
                "fields(boxes={}): boxes are float32 rows of 4, one row per box, as many as \
                 each sample has (a ragged field: set pad=VALUE to pad them, or ragged=offsets)",
                names[field]
            )))
        }
    }
    if let Some(l) = labels {
        match &outputs[l] {
            Output::Ragged {
                dtype: DType::I64 | DType::I32,
                inner,
                ..
            } if inner.is_empty() => {}
            _ => {
                return Err(err(format!(
                    "fields(labels={}): box labels are int64 or int32, one per box (a ragged \
                     field: set pad=VALUE to pad them, or ragged=offsets)",
                    names[l]
                )))
            }
        }
    }
    for &f in &per_box {
        if !matches!(outputs[f], Output::Ragged { .. }) {
            return Err(err(format!(
                "fields(per_box={}): a per-box field has one row per box, as many as each \
                 sample has (a ragged field: set pad=VALUE to pad it, or ragged=offsets)",
                names[f]
            )));
        }
    }
    let pipeline = BoxPipeline::new(spec, width, height, *format)
        .map_err(|reason| err(format!("field `{}`: {reason}", names[field])))?
        .sanitized(roles.sanitize);
    Ok(Moving {
        boxes: Some(BoxRole {
            field,
            labels,
            per_box,
            pipeline,
            encoded,
        }),
        keypoints,
    })
}

impl Collator {
    /// Whether any field's shape depends on the samples (a ragged field).
    pub(super) fn has_ragged(&self) -> bool {
        self.outputs
            .iter()
            .any(|o| matches!(o, Output::Ragged { .. }))
    }

    /// Whether field `field` is a flat ragged field (rows end to end, with offsets).
    pub(super) fn is_flat(&self, field: usize) -> bool {
        matches!(self.outputs[field], Output::Ragged { pad: None, .. })
    }

    /// Elements (rows of the inner shape) of ragged field `field` in `sample`; 0 for any other
    /// field.
    pub(super) fn ragged_len(&self, field: usize, sample: &Sample<'_>) -> usize {
        match &self.outputs[field] {
            Output::Ragged { dtype, inner, .. } => {
                sample.get(field).len() / (inner.iter().product::<usize>() * dtype.size()).max(1)
            }
            _ => 0,
        }
    }

    /// The rows each field of a batch of `samples` is laid out with: for a padded ragged field
    /// the longest sample's length, for a flat one the sum of the samples' lengths (never more
    /// rows than the padded layout has in all); 0 for the others.
    pub(super) fn extents(&self, samples: &[(usize, Sample<'_>)]) -> Vec<usize> {
        let mut extents = vec![0usize; self.outputs.len()];
        for (_, sample) in samples {
            for (f, out) in self.outputs.iter().enumerate() {
                match out {
                    Output::Ragged { pad: Some(_), .. } => {
                        extents[f] = extents[f].max(self.ragged_len(f, sample));
                    }
                    Output::Ragged { pad: None, .. } => extents[f] += self.ragged_len(f, sample),
                    _ => {}
                }
            }
        }
        extents
    }

    /// The batch's fields and the slab size they need, for the rows of each ragged field that
    /// [`Collator::extents`] gives: the source's fields in order, then one `<name>_lengths`
    /// (padded) or `<name>_offsets` (flat) field per ragged field.
    pub(super) fn layout(&self, n: usize, extents: &[usize]) -> (Vec<FieldMeta>, usize) {
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
            let (dtype, shape) = match out {
                // Flat: no sample dimension, the rows of every sample end to end.
                Output::Ragged {
                    dtype,
                    inner,
                    pad: None,
                } => (*dtype, leading(extents[f], inner)),
                Output::Ragged { dtype, inner, .. } => {
                    (*dtype, leading(n, &leading(extents[f], inner)))
                }
                Output::Copy { dtype, shape } => (*dtype, leading(n, shape)),
                Output::Image { pipeline, .. } | Output::TensorImage { pipeline, .. } => {
                    (pipeline.dtype(), leading(n, &pipeline.shape()))
                }
                Output::Dense { pipeline } => (pipeline.dtype(), leading(n, &pipeline.shape())),
                Output::EncodedMask { height, width, .. } => {
                    (DType::I64, leading(n, &[*height, *width]))
                }
                Output::SoftLabel { num_classes, .. } => (DType::F32, leading(n, &[*num_classes])),
            };
            push(self.names[f].clone(), dtype, shape);
        }
        for (f, out) in self.outputs.iter().enumerate() {
            match out {
                Output::Ragged { pad: Some(_), .. } => {
                    push(format!("{}_lengths", self.names[f]), DType::I64, vec![n]);
                }
                Output::Ragged { pad: None, .. } => {
                    push(
                        format!("{}_offsets", self.names[f]),
                        DType::I64,
                        vec![n + 1],
                    );
                }
                _ => {}
            }
        }
        (metas, offset.max(1))
    }
}

/// The shape `[first, *rest]`.
fn leading(first: usize, rest: &[usize]) -> Vec<usize> {
    std::iter::once(first).chain(rest.iter().copied()).collect()
}

#[cfg(test)]
mod tests;
