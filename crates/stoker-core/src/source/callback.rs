//! A source backed by a user's read function: the trainer's own dataset (PyTorch's
//! `Dataset.__getitem__`), called concurrently from worker threads.
//!
//! The read function fills a [`SampleWriter`] with the sample's fields: encoded image bytes
//! (decoded and transformed like an `image_folder` file), raw tensors, a label. The fields, their
//! types and shapes are fixed by sample 0, which is read once when the source is made. With
//! padding on, tensors of one or more dimensions may vary in their leading dimension (they become
//! ragged fields that collate pads); otherwise every sample must match sample 0 exactly.
//!
//! Image-shaped uint8 tensors (`[H, W, 3]` or `[3, H, W]`, see option `input_layout`) are the
//! exception when the transform fixes the output size: decoded pictures of a real dataset differ
//! in size, and the transform brings each to one. Such a field is then written as a raw-pixel
//! record ([`super::pixels::RAW_MAGIC`]: the size, then packed RGB8) and declared an encoded
//! image, so collate plans and transforms each sample from its own size, as it does a JPEG's; the
//! shape check applies to the transform's output. The `[H, W]` integer mask that
//! `fields(mask=)` moves with such an image varies with it: it is written as a raw-mask record
//! ([`super::pixels::MASK_MAGIC`]) and read as a PNG mask is, its size checked against the
//! image's per sample.

use std::sync::Arc;

use super::pixels::{image_dims, mask_header, raw_header, InputLayout};
use super::{FieldKind, FieldSpec, Sample, Source, MAX_FIELDS};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Reads sample `index` into the writer; an `Err` carries the user's message.
pub type ReadFn =
    dyn Fn(usize, &mut SampleWriter<'_>) -> std::result::Result<(), String> + Send + Sync;

/// The field an encoded image goes to ([`SampleWriter::put_encoded`]).
pub const IMAGE_FIELD: &str = "image";
/// The field a label goes to ([`SampleWriter::put_label`]).
pub const LABEL_FIELD: &str = "label";

/// What the first sample's puts may declare, from the loader's options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldRules {
    /// Tensors of one or more dimensions may vary in their leading dimension (option `pad`).
    pub pad: bool,
    /// How image-shaped uint8 tensors are stored (option `input_layout`).
    pub input_layout: Option<InputLayout>,
    /// The transform fixes the output size, so image-shaped uint8 tensors may vary in size.
    pub images_vary: bool,
    /// Fields the transform's `fields(image=, mask=)` moves with one draw: never ragged, and of
    /// one shape unless images vary (RGB uint8 images, and the mask beside them).
    pub fixed: Vec<String>,
    /// The field `fields(image=)` names (`None`: the source's one image field).
    pub image: Option<String>,
    /// The field `fields(mask=)` names: where images vary and the image came first as one of
    /// varying size, an `[H, W]` integer tensor that varies in size with it.
    pub mask: Option<String>,
}

/// How a field is written into a sample when not as given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Record {
    /// RGB uint8 images of varying size, given in this layout: raw-pixel records.
    Pixels(InputLayout),
    /// The `[H, W]` integer mask of `fields(mask=)`, varying in size with its image: raw-mask
    /// records.
    Mask,
}

/// The integer types a mask's labels may be given in.
fn is_label_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::U8 | DType::U16 | DType::I32 | DType::I64)
}

/// The fields a stream's first sample declared, and how later samples are held to them.
#[derive(Clone, Debug, Default)]
pub struct DeclaredFields {
    rules: FieldRules,
    specs: Vec<FieldSpec>,
    /// Per field: how it is written, for a field of varying-size images or their mask; `None`
    /// for any other field.
    records: Vec<Option<Record>>,
}

impl DeclaredFields {
    /// No field yet; the first sample's puts declare them under `rules`.
    pub fn new(rules: FieldRules) -> DeclaredFields {
        DeclaredFields {
            rules,
            ..DeclaredFields::default()
        }
    }

    /// The fields, in the order they were declared.
    pub fn specs(&self) -> &[FieldSpec] {
        &self.specs
    }

    fn push(&mut self, spec: FieldSpec, record: Option<Record>) {
        self.specs.push(spec);
        self.records.push(record);
    }
}

/// A map-style source whose samples a user's [`ReadFn`] writes, called concurrently from the
/// worker threads; its fields are those sample 0 puts.
pub struct CallbackSource {
    len: usize,
    read: Arc<ReadFn>,
    fields: DeclaredFields,
}

impl CallbackSource {
    /// Makes the source, reading sample 0 to learn its fields under `rules`.
    pub fn new(len: usize, read: Arc<ReadFn>, rules: FieldRules) -> Result<CallbackSource> {
        let mut source = CallbackSource {
            len,
            read,
            fields: DeclaredFields::new(rules.clone()),
        };
        if len > 0 {
            let mut fields = DeclaredFields::new(rules);
            let mut scratch = Vec::new();
            let mut writer = SampleWriter::new(
                &mut scratch,
                Mode::Probe {
                    fields: &mut fields,
                },
            );
            source.call(0, &mut writer)?;
            if fields.specs.is_empty() {
                return Err(Error::Callback {
                    index: 0,
                    message: "read() returned success but put no field".into(),
                });
            }
            source.fields = fields;
        }
        Ok(source)
    }

    fn call(&self, index: usize, writer: &mut SampleWriter<'_>) -> Result<()> {
        let outcome = (self.read)(index, writer);
        if let Some(reason) = writer.misuse.take() {
            return Err(Error::Sample {
                index: index as u64,
                what: self.describe(index),
                reason,
            });
        }
        outcome.map_err(|message| Error::Callback {
            index: index as u64,
            message,
        })
    }
}

impl Source for CallbackSource {
    fn len(&self) -> usize {
        self.len
    }

    fn fields(&self) -> &[FieldSpec] {
        self.fields.specs()
    }

    fn describe(&self, index: usize) -> String {
        format!("callback sample {index}")
    }

    fn read<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let ranges = {
            let mut writer = SampleWriter::new(
                scratch,
                Mode::Check {
                    fields: &self.fields,
                },
            );
            self.call(index, &mut writer)?;
            let specs = self.fields.specs();
            if let Some(missing) = (0..specs.len()).find(|&f| writer.ranges[f].is_none()) {
                return Err(Error::Sample {
                    index: index as u64,
                    what: self.describe(index),
                    reason: format!(
                        "field `{}` was not given (sample 0 had it)",
                        specs[missing].name
                    ),
                });
            }
            writer.ranges
        };
        let mut sample = Sample::default();
        for (f, range) in ranges.iter().enumerate().take(self.fields.specs.len()) {
            if let Some((start, len)) = range {
                sample.set(f, &scratch[*start..start + len]);
            }
        }
        Ok(sample)
    }
}

enum Mode<'a> {
    /// Sample 0: each put declares a field.
    Probe { fields: &'a mut DeclaredFields },
    /// Later samples: each put must match a declared field.
    Check { fields: &'a DeclaredFields },
}

/// What a read function fills for one sample. Data is copied into the worker's buffer before
/// `put_*` returns, so the caller's memory may be reused at once.
pub struct SampleWriter<'a> {
    buf: &'a mut Vec<u8>,
    mode: Mode<'a>,
    /// Byte range in `buf` of each field given so far.
    ranges: [Option<(usize, usize)>; MAX_FIELDS],
    /// The first misuse (a field not declared by sample 0, a wrong shape), reported even if the
    /// read function ignores the error `put_*` returned.
    misuse: Option<String>,
}

impl<'a> SampleWriter<'a> {
    fn new(buf: &'a mut Vec<u8>, mode: Mode<'a>) -> SampleWriter<'a> {
        buf.clear();
        SampleWriter {
            buf,
            mode,
            ranges: [None; MAX_FIELDS],
            misuse: None,
        }
    }

    /// A writer for the first sample of a stream: each put declares a field into `fields`.
    pub(crate) fn probing(
        buf: &'a mut Vec<u8>,
        fields: &'a mut DeclaredFields,
    ) -> SampleWriter<'a> {
        SampleWriter::new(buf, Mode::Probe { fields })
    }

    /// A writer for a later sample of a stream: each put must match a field of `fields`.
    pub(crate) fn checking(buf: &'a mut Vec<u8>, fields: &'a DeclaredFields) -> SampleWriter<'a> {
        SampleWriter::new(buf, Mode::Check { fields })
    }

    /// The byte range in the buffer of each field, once every one was given; otherwise the
    /// first misuse, or which field is missing.
    pub(crate) fn finish(
        mut self,
    ) -> std::result::Result<[Option<(usize, usize)>; MAX_FIELDS], String> {
        if let Some(reason) = self.misuse.take() {
            return Err(reason);
        }
        if let Mode::Check { fields } = &self.mode {
            if let Some(missing) = (0..fields.specs.len()).find(|&f| self.ranges[f].is_none()) {
                return Err(format!(
                    "field `{}` was not given (the first sample had it)",
                    fields.specs[missing].name
                ));
            }
        }
        Ok(self.ranges)
    }

    /// Encoded JPEG or PNG bytes, decoded and transformed into field `image`.
    pub fn put_encoded(&mut self, bytes: &[u8]) -> std::result::Result<(), String> {
        self.put(IMAGE_FIELD, None, &[], bytes)
    }

    /// The sample's label, field `label` (int64).
    pub fn put_label(&mut self, label: i64) -> std::result::Result<(), String> {
        self.put(LABEL_FIELD, Some(DType::I64), &[], &label.to_ne_bytes())
    }

    /// A C-contiguous tensor of `shape` for `field`; `data` must hold exactly its bytes.
    pub fn put_tensor(
        &mut self,
        field: &str,
        dtype: DType,
        shape: &[usize],
        data: &[u8],
    ) -> std::result::Result<(), String> {
        let expected = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d));
        if expected != Some(data.len()) {
            return self.fail(format!(
                "field `{field}`: {} bytes given for {dtype} {shape:?}",
                data.len()
            ));
        }
        self.put(field, Some(dtype), shape, data)
    }

    fn fail(&mut self, reason: String) -> std::result::Result<(), String> {
        self.misuse.get_or_insert_with(|| reason.clone());
        Err(reason)
    }

    /// Declares (sample 0) or checks (later samples) field `name` — an encoded image when
    /// `dtype` is `None`, else a tensor of `shape` — then copies its bytes (an image of a
    /// varying-size image field as a raw-pixel record, its mask as a raw-mask record).
    fn put(
        &mut self,
        name: &str,
        dtype: Option<DType>,
        shape: &[usize],
        data: &[u8],
    ) -> std::result::Result<(), String> {
        let (index, record) = match &mut self.mode {
            Mode::Probe { fields } => {
                if fields.specs.iter().any(|f| f.name == name) {
                    return self.fail(format!("field `{name}` given twice"));
                }
                if fields.specs.len() == MAX_FIELDS {
                    return self.fail(format!("more than {MAX_FIELDS} fields"));
                }
                let rules = &fields.rules;
                let fixed = rules.fixed.iter().any(|f| f == name);
                // The image of `fields(image=, mask=)` and its mask vary in size together or
                // not at all: the mask does if the image came first as images of varying size,
                // the image does unless its mask came first as a tensor of one size.
                let is_image = |f: &str| rules.image.as_deref().is_none_or(|i| i == f);
                let mask_fixed = rules
                    .mask
                    .as_deref()
                    .and_then(|m| fields.specs.iter().position(|f| f.name == m))
                    .is_some_and(|m| fields.records[m].is_none());
                let image_varies = fields
                    .specs
                    .iter()
                    .zip(&fields.records)
                    .any(|(f, r)| matches!(r, Some(Record::Pixels(_))) && is_image(&f.name));
                let record = match dtype {
                    Some(dtype) if rules.mask.as_deref() == Some(name) => {
                        (image_varies && is_label_dtype(dtype) && shape.len() == 2)
                            .then_some(Record::Mask)
                    }
                    Some(DType::U8) if rules.images_vary && !(is_image(name) && mask_fixed) => {
                        image_dims(shape, rules.input_layout)
                            .map(|(_, _, layout)| Record::Pixels(layout))
                    }
                    _ => None,
                };
                let spec = match (dtype, record) {
                    (None, _) | (Some(_), Some(_)) => FieldSpec::encoded_image(name),
                    (Some(dtype), None) if rules.pad && !shape.is_empty() && !fixed => {
                        FieldSpec::ragged(name, dtype, &shape[1..])
                    }
                    (Some(dtype), None) => FieldSpec::tensor(name, dtype, shape),
                };
                fields.push(spec, record);
                (fields.specs.len() - 1, record)
            }
            Mode::Check { fields } => {
                let Some(index) = fields.specs.iter().position(|f| f.name == name) else {
                    return self.fail(format!("field `{name}` was not in sample 0"));
                };
                let record = fields.records[index];
                let reason = match record {
                    Some(Record::Pixels(layout)) => pixel_mismatch(name, layout, dtype, shape),
                    Some(Record::Mask) => mask_mismatch(name, dtype, shape),
                    None => mismatch(name, &fields.specs[index].kind, dtype, shape, &fields.rules),
                };
                if let Some(reason) = reason {
                    return self.fail(reason);
                }
                (index, record)
            }
        };
        if self.ranges[index].is_some() {
            return self.fail(format!("field `{name}` given twice"));
        }
        let start = self.buf.len();
        let pixels = match record {
            Some(Record::Pixels(layout)) => image_dims(shape, Some(layout)),
            _ => None,
        };
        match (record, pixels, dtype) {
            (Some(Record::Mask), _, Some(dtype)) => {
                let &[height, width] = shape else {
                    return self.fail(format!("field `{name}`: a mask is [H, W], not {shape:?}"));
                };
                let (Ok(w), Ok(h)) = (u32::try_from(width), u32::try_from(height)) else {
                    return self.fail(format!(
                        "field `{name}`: a {width}x{height} mask is too large"
                    ));
                };
                // uint8 labels as given; wider ones as int64, the type PNG masks of 16 bits
                // are read into.
                let label = if dtype == DType::U8 {
                    DType::U8
                } else {
                    DType::I64
                };
                self.buf.extend_from_slice(&mask_header(w, h, label));
                match dtype {
                    DType::U8 | DType::I64 => self.buf.extend_from_slice(data),
                    DType::U16 => {
                        self.buf.extend(data.chunks_exact(2).flat_map(|v| {
                            i64::from(u16::from_ne_bytes([v[0], v[1]])).to_ne_bytes()
                        }))
                    }
                    DType::I32 => self.buf.extend(data.chunks_exact(4).flat_map(|v| {
                        i64::from(i32::from_ne_bytes([v[0], v[1], v[2], v[3]])).to_ne_bytes()
                    })),
                    other => {
                        return self
                            .fail(format!("field `{name}`: {other} labels are not integers"))
                    }
                }
            }
            (_, Some((height, width, layout)), _) => {
                let (Ok(w), Ok(h)) = (u32::try_from(width), u32::try_from(height)) else {
                    return self.fail(format!(
                        "field `{name}`: a {width}x{height} image is too large"
                    ));
                };
                self.buf.extend_from_slice(&raw_header(w, h));
                match layout {
                    InputLayout::Hwc => self.buf.extend_from_slice(data),
                    InputLayout::Chw => {
                        // Interleave the planes: a raw-pixel record is packed RGB.
                        let plane = height * width;
                        self.buf
                            .extend((0..plane * 3).map(|i| data[(i % 3) * plane + i / 3]));
                    }
                }
            }
            _ => self.buf.extend_from_slice(data),
        }
        self.ranges[index] = Some((start, self.buf.len() - start));
        Ok(())
    }
}

/// Why a put of `dtype`/`shape` does not fit a field of varying-size images given in `layout`,
/// if it does not.
fn pixel_mismatch(
    name: &str,
    layout: InputLayout,
    dtype: Option<DType>,
    shape: &[usize],
) -> Option<String> {
    let want = match layout {
        InputLayout::Hwc => "[H, W, 3]",
        InputLayout::Chw => "[3, H, W]",
    };
    match dtype {
        Some(DType::U8) if image_dims(shape, Some(layout)).is_some() => None,
        Some(dtype) => Some(format!(
            "field `{name}` is {dtype} {shape:?} but sample 0 had a uint8 {want} image"
        )),
        None => Some(format!("field `{name}` changed kind since sample 0")),
    }
}

/// Why a put of `dtype`/`shape` does not fit a varying-size mask, if it does not.
fn mask_mismatch(name: &str, dtype: Option<DType>, shape: &[usize]) -> Option<String> {
    match dtype {
        Some(dtype) if is_label_dtype(dtype) && shape.len() == 2 => None,
        Some(dtype) => Some(format!(
            "field `{name}` is {dtype} {shape:?} but the mask is an [H, W] tensor of integer \
             labels (uint8, uint16, int32 or int64)"
        )),
        None => Some(format!("field `{name}` changed kind since sample 0")),
    }
}

/// Why a put of `dtype`/`shape` does not fit the field sample 0 declared, if it does not.
fn mismatch(
    name: &str,
    declared: &FieldKind,
    dtype: Option<DType>,
    shape: &[usize],
    rules: &FieldRules,
) -> Option<String> {
    match (declared, dtype) {
        (FieldKind::EncodedImage, None) => None,
        (
            FieldKind::Tensor {
                dtype: d0,
                shape: s0,
            },
            Some(dtype),
        ) => {
            if *d0 == dtype && s0.as_slice() == shape {
                return None;
            }
            let images = dtype == DType::U8
                && image_dims(s0, rules.input_layout)
                    .is_some_and(|(_, _, layout)| image_dims(shape, Some(layout)).is_some());
            Some(if images {
                // The images were taken as tensors of one size: no transform fixes one.
                format!(
                    "field `{name}` is {dtype} {shape:?} but sample 0 had {d0} {s0:?}; images \
                     of varying size need a transform that fixes the output size: add \
                     random_resized_crop(S), center_crop(S) or resize(H, W) to transform"
                )
            } else {
                format!(
                    "field `{name}` is {dtype} {shape:?} but sample 0 had {d0} {s0:?}; set pad=VALUE to pad a varying leading dimension, or ragged=offsets to batch it flat"
                )
            })
        }
        (
            FieldKind::Ragged {
                dtype: d0,
                inner_shape,
            },
            Some(dtype),
        ) => {
            let fits = *d0 == dtype
                && shape.len() == inner_shape.len() + 1
                && shape[1..] == inner_shape[..];
            (!fits).then(|| format!("field `{name}` is {dtype} {shape:?} but sample 0 had {d0} [n, ...{inner_shape:?}]"))
        }
        _ => Some(format!("field `{name}` changed kind since sample 0")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn fields_come_from_sample_zero_and_values_round_trip() {
        let read: Arc<ReadFn> = Arc::new(|i, w| {
            w.put_tensor("x", DType::F32, &[2], &bytes_f32(&[i as f32, -(i as f32)]))?;
            w.put_label(i as i64 * 3)
        });
        let src = CallbackSource::new(5, read, FieldRules::default()).unwrap();
        assert_eq!(
            src.fields(),
            &[
                FieldSpec::tensor("x", DType::F32, &[2]),
                FieldSpec::tensor("label", DType::I64, &[])
            ]
        );
        let mut scratch = Vec::new();
        let s = src.read(4, &mut scratch).unwrap();
        assert_eq!(s.get(0), &bytes_f32(&[4.0, -4.0])[..]);
        assert_eq!(s.get(1), &12i64.to_ne_bytes());
    }

    #[test]
    fn mismatches_name_the_index_and_field() {
        let read: Arc<ReadFn> = Arc::new(|i, w| {
            let n = if i == 3 { 3 } else { 2 };
            w.put_tensor("x", DType::F32, &[n], &vec![0u8; 4 * n])?;
            if i != 4 {
                w.put_label(0)?;
            }
            Ok(())
        });
        let src = CallbackSource::new(5, read.clone(), FieldRules::default()).unwrap();
        let mut scratch = Vec::new();
        let e = src.read(3, &mut scratch).unwrap_err().to_string();
        assert!(
            e.contains("sample 3") && e.contains("field `x`") && e.contains("pad"),
            "{e}"
        );
        let e = src.read(4, &mut scratch).unwrap_err().to_string();
        assert!(
            e.contains("sample 4") && e.contains("`label` was not given"),
            "{e}"
        );

        let padded = CallbackSource::new(
            5,
            read,
            FieldRules {
                pad: true,
                ..FieldRules::default()
            },
        )
        .unwrap();
        assert_eq!(padded.fields()[0], FieldSpec::ragged("x", DType::F32, &[]));
        assert_eq!(padded.read(3, &mut scratch).unwrap().get(0).len(), 12);
    }

    #[test]
    fn user_failures_and_misuse_are_errors() {
        let read: Arc<ReadFn> = Arc::new(|i, w| {
            if i == 1 {
                return Err("disk on fire".into());
            }
            if i == 2 {
                // Ignores the error put_tensor returns; the misuse is still reported.
                let _ = w.put_tensor("x", DType::U8, &[4], &[1, 2]);
                return Ok(());
            }
            w.put_tensor("x", DType::U8, &[4], &[1, 2, 3, 4])
        });
        let src = CallbackSource::new(3, read, FieldRules::default()).unwrap();
        let mut scratch = Vec::new();
        let e = src.read(1, &mut scratch).unwrap_err();
        assert!(
            matches!(e, Error::Callback { index: 1, .. }) && e.to_string().contains("disk on fire")
        );
        let e = src.read(2, &mut scratch).unwrap_err().to_string();
        assert!(e.contains("2 bytes given for uint8 [4]"), "{e}");

        let nothing: Arc<ReadFn> = Arc::new(|_, _| Ok(()));
        assert!(CallbackSource::new(1, nothing, FieldRules::default()).is_err());
    }
}
