//! Collate: turning a list of sample indices into one batch, zero-copy.
//!
//! Each sample is written straight into its slot of the batch's arena slab: a fixed-shape field
//! is one `memcpy` from the source's view, a ragged field is copied and padded to the longest
//! sample of the batch (PyTorch's `pad_sequence`) with a `<name>_lengths` int64 field added, or
//! under `ragged=offsets` copied flat, end to end, with a `<name>_offsets` int64 field, an
//! encoded image is decoded ([`crate::decode`]) into the worker's reused buffer and transformed
//! ([`crate::transform`]) directly into its slot. There is no per-sample allocation and no second
//! copy.
//!
//! Building happens in two phases: every sample of the batch is read first (views into a memory
//! map cost nothing; file bytes land in per-worker buffers that are reused), which fixes the
//! ragged fields' shapes; then one slab is taken from the arena and every slot is written. A batch may
//! also be built in parts by several workers at once (`PartedBatch`), each part running both
//! phases on its own slots.
//!
//! A batch is built either from sample indices of a map-style [`Source`] ([`Collator::build`])
//! or from samples a stream handed over, owned ([`Collator::build_owned`]: tar shards read
//! sequentially, iterable sources). Both go through the same two phases; they differ only in
//! where a sample's bytes come from and which samples can replace a bad one under
//! `on_error=skip` (any sample of the dataset, or another sample of the same batch).
//!
//! The stages, one file each, in the order a build meets them:
//!
//! | file | stage |
//! |---|---|
//! | `pick` | where samples come from (a source's indices, a stream's owned samples) and the deterministic replacements of a bad one |
//! | `layout` | what each field becomes (`Output`), the padded or flat shapes of ragged fields, where each field lies in the slab |
//! | `read` | phase 1: read and validate every sample, replacing bad ones |
//! | `write` | phase 2: copy, pad with `<name>_lengths`, lay flat with `<name>_offsets`, or hand to the image or label writer; replace a sample whose write fails |
//! | `image` | [`ImageStages`]: an encoded image's header, plan, window decode and transform into its slot; image-shaped tensors |
//! | `mix` | mixup/cutmix: the `label` field it needs, one-hot soft labels, the written batch mixed once |
//! | `parted` | `PartedBatch`: one batch built in parts by several workers, finished with the error a whole build reports |
//!
//! This file is the facade: [`Collator`] and what a whole build does.

mod gpu_decode;
mod image;
mod layout;
mod mix;
mod parted;
mod pick;
mod read;
mod write;

use std::sync::Arc;
use std::time::Instant;

use crate::arena::{Arena, SlabLease};
use crate::batch::{Batch, DeviceDecodes, DeviceLayout, FieldMeta};
use crate::error::{Error, Result};
use crate::sampler::Draws;
use crate::source::streaming::OwnedSample;
use crate::source::{FieldSpec, Source};
use crate::span::{SpanKind, Stage};
use crate::stats::Spans;
use crate::transform::{DensePipeline, DeviceCast, Pipeline};

pub use gpu_decode::{DecodeShare, DEVICE_DECODE_SCRATCH};
pub use image::ImageStages;
pub use layout::{Ragged, RaggedLayout};
pub(crate) use parted::{PartedBatch, MAX_PARTS};
pub use pick::MAX_REPLACEMENTS;

use image::Pixels;
use layout::Output;
use pick::{FromOwned, FromSource, Pick};
use write::Slots;

/// Per-worker scratch memory, reused for every batch the worker builds.
#[derive(Default)]
pub struct Scratch {
    /// One read buffer per slot of the batch.
    reads: Vec<Vec<u8>>,
    /// For a replacement sample read while writing.
    spare: Vec<u8>,
    /// The decoded image and the transform's buffers.
    pixels: Pixels,
    /// The time of each stage of each sample of the batch being built (for stats and trace).
    pub(crate) spans: Spans,
}

/// Identifies the batch being built, for randomness and messages.
#[derive(Clone, Copy, Debug)]
pub struct BatchKey {
    /// The loader's seed (option `seed`).
    pub seed: u64,
    /// The epoch the batch belongs to.
    pub epoch: u64,
    /// The batch's position in its epoch on this rank, from 0.
    pub position: usize,
    /// This process's rank: batch-level randomness (mixup/cutmix) is keyed by it too, so ranks
    /// at the same position draw apart, as timm's per-rank generators do.
    pub rank: usize,
}

/// Builds batches from samples into pooled buffers: decoding, transforms, stacking, padding.
pub struct Collator {
    /// The map-style source `build` reads; `None` for a collator of streamed samples.
    source: Option<Arc<dyn Source>>,
    /// What each source field becomes, in the source's order.
    outputs: Vec<Output>,
    /// The source fields' names, for the batch's fields and for messages.
    names: Vec<String>,
    /// The boxes (and their labels) that move with the image's draw, if `fields(boxes=)`.
    boxes: Option<layout::BoxRole>,
    /// The keypoints that move with the image's draw, if `fields(keypoints=)`.
    keypoints: Option<layout::KeypointRole>,
    skip_bad: bool,
    /// Under `gpu_normalize`: how each field is cast on the device (see
    /// [`Collator::cast_on_device`]); `None` when no field is.
    casts: Option<Arc<[Option<DeviceCast>]>>,
    /// Under GPU decoding: which samples' images the device decodes (see
    /// [`Collator::decode_on_device`]).
    gpu: Option<gpu_decode::GpuRoute>,
}

/// `Err` if a field the batch adds for a ragged one (`<name>_lengths` padded, `<name>_offsets`
/// flat) is a field of the source too (or an empty name): a batch would hold two fields of
/// one name, and a reader by name would get the other.
fn added_fields_are_free(names: &[String], outputs: &[Output]) -> Result<()> {
    if let Some(at) = names.iter().position(String::is_empty) {
        return Err(Error::InvalidArgument(format!(
            "the source's field {at} has an empty name"
        )));
    }
    for (name, out) in names.iter().zip(outputs) {
        let (added, key) = match out {
            Output::Ragged { pad: Some(_), .. } => (format!("{name}_lengths"), "pad"),
            Output::Ragged { pad: None, .. } => (format!("{name}_offsets"), "ragged"),
            _ => continue,
        };
        if names.contains(&added) {
            return Err(Error::option(
                key,
                format!(
                    "the batch adds field `{added}` for the varying-length field `{name}`, and \
                     the source has a field of that name too: rename it"
                ),
            ));
        }
    }
    Ok(())
}

impl Collator {
    /// `ragged` is how ragged fields are batched: padded with a value (required if the source
    /// has any, except raw-bytes fields, which pad with 0; an `Option<f64>` converts), or flat
    /// with offsets; `image` writes encoded-image fields (required if the source has any).
    pub fn new(
        source: Arc<dyn Source>,
        ragged: impl Into<Ragged>,
        image: Option<Arc<ImageStages>>,
        skip_bad: bool,
    ) -> Result<Collator> {
        let mut collator = Collator::for_fields(source.fields(), ragged, image, skip_bad)?;
        collator.source = Some(source);
        Ok(collator)
    }

    /// A collator for samples of `fields` handed over owned ([`Collator::build_owned`]), with
    /// no map-style source behind it.
    pub fn for_fields(
        fields: &[FieldSpec],
        ragged: impl Into<Ragged>,
        image: Option<Arc<ImageStages>>,
        skip_bad: bool,
    ) -> Result<Collator> {
        let ragged = ragged.into();
        // The spec's batch-level mixing, whatever the image fields' sizes.
        let mix = mix::batch_mix(image.as_deref(), fields)?;
        let mut outputs = fields
            .iter()
            .map(|spec| Output::for_field(spec, ragged, image.as_ref(), mix.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        let names: Vec<String> = fields.iter().map(|spec| spec.name.clone()).collect();
        added_fields_are_free(&names, &outputs)?;
        let moving = match image.as_deref() {
            Some(ImageStages {
                roles: Some(roles),
                transform: Some(spec),
                ..
            }) => layout::check_roles(roles, spec, &names, &mut outputs)?,
            _ => layout::Moving::default(),
        };
        let iou_crop = image
            .as_deref()
            .and_then(|stages| stages.transform.as_deref())
            .and_then(|spec| crate::transform::parse(spec).ok())
            .is_some_and(|ops| {
                ops.iter()
                    .any(|op| matches!(op, crate::transform::Op::RandomIouCrop(_)))
            });
        if iou_crop && moving.boxes.is_none() {
            return Err(Error::option(
                "transform",
                "random_iou_crop draws its crop from each sample's boxes and drops the boxes \
                 it cuts away: name them first in the spec, \
                 fields(image=NAME, boxes=NAME, labels=NAME) | random_iou_crop | resize(H, W)",
            ));
        }
        Ok(Collator {
            source: None,
            outputs,
            names,
            boxes: moving.boxes,
            keypoints: moving.keypoints,
            skip_bad,
            casts: None,
            gpu: None,
        })
    }

    /// Makes image fields cross to the device as uint8, to be cast there (`gpu_normalize`, see
    /// [`DeviceCast`]): every image field whose pipeline's output is a table lookup of uint8
    /// pixels (RGB, or uint8 of any channel count) is written as uint8 and its batches carry the
    /// table. Other fields stay as they are, unless `required` (an explicit
    /// `gpu_normalize=true`): then a field that cannot be cast, or a source without image
    /// fields, is an error saying why.
    pub(crate) fn cast_on_device(&mut self, required: bool) -> Result<()> {
        let refused = |name: &str, why: &str| {
            Error::option(
                "gpu_normalize",
                format!(
                    "image field `{name}` cannot be cast on the device: {why}; leave \
                     gpu_normalize unset to convert it on the CPU"
                ),
            )
        };
        let mut casts = Vec::with_capacity(self.outputs.len());
        for (output, name) in self.outputs.iter_mut().zip(&self.names) {
            let split = match output {
                Output::Image { pipeline, .. } | Output::TensorImage { pipeline, .. } => {
                    into_twin(pipeline, Pipeline::split_for_device)
                }
                Output::Dense { pipeline } if pipeline.is_image() => {
                    into_twin(pipeline, DensePipeline::split_for_device)
                }
                _ => {
                    casts.push(None);
                    continue;
                }
            };
            match split {
                Ok(cast) => casts.push(Some(cast)),
                Err(why) if required => return Err(refused(name, &why)),
                Err(_) => casts.push(None),
            }
        }
        if casts.iter().all(Option::is_none) {
            if required {
                return Err(Error::option(
                    "gpu_normalize",
                    "this source has no image field to cast on the device",
                ));
            }
            return Ok(());
        }
        self.casts = Some(casts.into());
        Ok(())
    }

    /// Leaves the JPEGs of a `share` of samples (by a hash of the index) to the device's
    /// decoder (`jpeg_decoder=gpu`/`auto`), in every encoded image field whose pipeline the
    /// device can run whole: ops that fold into one crop plan (crops, resizes, flips) and a
    /// uint8 output (under `gpu_normalize`, the twin's). Other fields, and images the device
    /// cannot take (see [`gpu_decode::route`]), are decoded by the workers. When `required`
    /// (`jpeg_decoder=gpu`), a source with no such field is an error saying why.
    pub(crate) fn decode_on_device(
        &mut self,
        share: Arc<DecodeShare>,
        required: bool,
        max_pixels: u64,
    ) -> Result<()> {
        let mut why = Vec::new();
        let moving = self.boxes.is_some() || self.keypoints.is_some();
        let fields: Vec<bool> = self
            .outputs
            .iter()
            .zip(&self.names)
            .map(|(output, name)| {
                let Output::Image { pipeline, .. } = output else {
                    return false;
                };
                let refusal = if moving {
                    Some("boxes or keypoints move with its draw on the CPU".to_owned())
                } else {
                    pipeline.device_resize_refusal()
                };
                match refusal {
                    Some(reason) => {
                        why.push(format!("image field `{name}`: {reason}"));
                        false
                    }
                    None => true,
                }
            })
            .collect();
        if !fields.contains(&true) {
            if required {
                let why = if why.is_empty() {
                    "this source has no encoded image field".to_owned()
                } else {
                    why.join("; ")
                };
                return Err(Error::option(
                    "jpeg_decoder",
                    format!("gpu: no image field can be decoded on the device: {why}"),
                ));
            }
            return Ok(());
        }
        self.gpu = Some(gpu_decode::GpuRoute {
            share,
            fields,
            max_pixels,
        });
        Ok(())
    }

    /// Whether some image fields may be decoded on the device.
    pub fn decodes_on_device(&self) -> bool {
        self.gpu.is_some()
    }

    /// Whether an image the device and the CPU both fail to decode is to be replaced, as a
    /// sample the workers fail on is (`on_error=skip`; see [`Self::replace_routed`]).
    pub(crate) fn replaces_routed(&self) -> bool {
        self.gpu.is_some() && self.skip_bad
    }

    /// Whether image fields cross to the device as uint8 (`gpu_normalize`).
    pub fn casts_on_device(&self) -> bool {
        self.casts.is_some()
    }

    /// Bytes of the device buffer a batch of `n` samples needs: its fields at their device
    /// types, and under `gpu_normalize` the uint8 inputs and tables the casts read (ragged
    /// fields counted empty, as [`Collator::batch_bytes`] counts them).
    pub fn device_batch_bytes(&self, n: usize) -> Result<usize> {
        let (metas, _) = self.layout(n, &vec![0; self.outputs.len()]);
        DeviceLayout::new(&metas, self.casts.as_deref(), self.taps_bound(n)).map(|l| l.bytes)
    }

    /// The most bytes of resize taps a batch of `n` samples carries under GPU decoding: every
    /// routable image with the most taps each way.
    fn taps_bound(&self, n: usize) -> usize {
        let Some(gpu) = &self.gpu else {
            return 0;
        };
        let per_sample: usize = self
            .outputs
            .iter()
            .zip(&gpu.fields)
            .filter_map(|(output, routed)| match output {
                Output::Image { pipeline, .. } if *routed => Some(pipeline.output_size()),
                _ => None,
            })
            .map(|(w, h)| (w + h) * (8 + 4 * crate::transform::MAX_TAPS) + 4)
            .sum();
        n * per_sample
    }

    /// Device memory a loader holds beside its ring: GPU decoding's scratch.
    pub fn device_scratch_bytes(&self) -> usize {
        if self.gpu.is_some() {
            DEVICE_DECODE_SCRATCH
        } else {
            0
        }
    }

    /// The map-style source (`None` for a collator of streamed samples).
    pub fn source(&self) -> Option<&Arc<dyn Source>> {
        self.source.as_ref()
    }

    /// Bytes of the slab a batch of `n` samples needs (ragged fields counted empty: a lower
    /// bound for them; a batch's ragged rows are bounded by what its samples hold, padded or
    /// flat, and the flat layout never needs more than the padded one).
    pub fn batch_bytes(&self, n: usize) -> usize {
        self.layout(n, &vec![0; self.outputs.len()]).1
    }

    /// Builds the batch of `indices` of the source in a slab from `arena`; `draws` keys each
    /// slot's augmentation (see [`crate::sampler::BatchPlan`]).
    pub fn build(
        &self,
        key: BatchKey,
        indices: &[usize],
        draws: Draws,
        arena: &Arena,
        scratch: &mut Scratch,
    ) -> Result<Batch> {
        let source = self.source.as_deref().ok_or_else(|| {
            Error::Internal("a collator of streamed samples was asked for indices".into())
        })?;
        self.build_from(
            key,
            &FromSource(source),
            indices,
            Some(draws),
            arena,
            scratch,
        )
    }

    /// Builds the batch of `samples`, in that order, in a slab from `arena`; each slot's
    /// augmentation is keyed by its sample's position in this rank's stream. Under
    /// `on_error=skip` a bad sample is replaced by another of the same batch, keeping the key
    /// of the slot.
    pub fn build_owned(
        &self,
        key: BatchKey,
        samples: &[Box<dyn OwnedSample>],
        arena: &Arena,
        scratch: &mut Scratch,
    ) -> Result<Batch> {
        let slots: Vec<usize> = (0..samples.len()).collect();
        self.build_from(key, &FromOwned(samples), &slots, None, arena, scratch)
    }

    fn build_from(
        &self,
        key: BatchKey,
        pick: &dyn Pick,
        indices: &[usize],
        draws: Option<Draws>,
        arena: &Arena,
        scratch: &mut Scratch,
    ) -> Result<Batch> {
        let n = indices.len();
        let Scratch {
            reads,
            spare,
            pixels,
            spans,
        } = scratch;
        spans.clear();
        if reads.len() < n {
            reads.resize_with(n, Vec::new);
        }

        // Phase 1: read and validate every sample, replacing bad ones under on_error=skip.
        let (samples, mut skipped) = self.read_slots(key, pick, indices, 0..n, reads, spans)?;

        // A padded ragged field takes the batch's longest length, a flat one the sum of them.
        let extents = self.extents(&samples);
        let start = Instant::now();
        let (mut metas, total) = self.layout(n, &extents);
        let mut lease = arena.acquire(total)?;
        spans.push(SpanKind::Stage(Stage::Collate), usize::MAX, 0, start);

        // Phase 2: write every slot.
        let mut slots = Slots::whole(&metas, lease.as_mut_slice());
        skipped += self.write_slots(
            key, pick, indices, draws, &samples, &extents, &mut slots, spare, pixels, spans,
        )?;
        self.cut_flat(&mut metas, lease.as_mut_slice())?;
        let routed = std::mem::take(&mut pixels.routed);
        self.finish(key, pick, n, (metas, lease), skipped, routed)
    }

    /// After every slot is written: checks what was read, mixes the batch (mixup/cutmix) and
    /// hands it over.
    fn finish(
        &self,
        key: BatchKey,
        pick: &dyn Pick,
        n: usize,
        (metas, mut lease): (Vec<FieldMeta>, SlabLease),
        skipped: usize,
        routed: DeviceDecodes,
    ) -> Result<Batch> {
        // Bytes copied from a file mapped while another process truncated it are zeros, not
        // the file's: the batch fails instead of carrying them.
        pick.verify()?;
        self.mix_batch(key, n, &metas, lease.as_mut_slice());
        Ok(
            Batch::host(metas, lease, key.epoch, key.position, n, skipped)
                .with_casts(self.casts.clone())
                .with_decodes(routed),
        )
    }
}

/// Swaps `pipeline` for its uint8 twin and returns the cast that makes the twin's output the
/// original's on a device; leaves it as it is when `split` refuses, saying why.
fn into_twin<P>(
    pipeline: &mut Arc<P>,
    split: fn(&P) -> std::result::Result<(P, DeviceCast), String>,
) -> std::result::Result<DeviceCast, String> {
    let (twin, cast) = split(pipeline)?;
    *pipeline = Arc::new(twin);
    Ok(cast)
}

#[cfg(test)]
pub(super) mod tests {
    //! Sources, samples and builds shared by the tests of every stage.

    use super::*;
    use crate::decode::JpegDecoder;
    use crate::dtype::{DType, Layout};
    use crate::source::{MemorySource, Sample};

    /// Batch key of `seed` and `epoch`, at position 0 of rank 0.
    pub(crate) fn key(seed: u64, epoch: u64) -> BatchKey {
        BatchKey {
            seed,
            epoch,
            position: 0,
            rank: 0,
        }
    }

    /// `n` samples: field `x` = `[i, i+1, i+2]` as int64, field `y` = `i` as uint8 (wrapping).
    pub(crate) fn counting(n: usize) -> Arc<dyn Source> {
        let x = (0..n as i64)
            .flat_map(|i| [i, i + 1, i + 2])
            .flat_map(i64::to_ne_bytes)
            .collect();
        let y = (0..n).map(|i| i as u8).collect();
        Arc::new(
            MemorySource::new()
                .with_tensor("x", DType::I64, &[3], x)
                .and_then(|s| s.with_tensor("y", DType::U8, &[], y))
                .expect("n rows of x and y"),
        )
    }

    /// Image stages with no pipeline for encoded images and `transform` for image-shaped
    /// tensors (and mixup/cutmix).
    pub(crate) fn image_stages(transform: Option<&str>) -> ImageStages {
        ImageStages {
            max_pixels: 1 << 24,
            jpeg_decoder: JpegDecoder::Auto,
            input_layout: None,
            pipeline: None,
            transform: transform.map(str::to_owned),
            dtype: None,
            layout: Layout::Nchw,
            roles: None,
        }
    }

    /// `inner`, whose samples `bad` fail to read with a sample error, and whose `verify` fails
    /// when `truncated`.
    pub(crate) struct Flaky {
        inner: Arc<dyn Source>,
        bad: Vec<usize>,
        pub(crate) truncated: bool,
    }

    impl Flaky {
        pub(crate) fn new(inner: Arc<dyn Source>, bad: &[usize]) -> Flaky {
            Flaky {
                inner,
                bad: bad.to_vec(),
                truncated: false,
            }
        }
    }

    impl Source for Flaky {
        fn len(&self) -> usize {
            self.inner.len()
        }
        fn fields(&self) -> &[FieldSpec] {
            self.inner.fields()
        }
        fn describe(&self, index: usize) -> String {
            self.inner.describe(index)
        }
        fn read<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
            if self.bad.contains(&index) {
                return Err(Error::Sample {
                    index: index as u64,
                    what: self.describe(index),
                    reason: "unreadable".into(),
                });
            }
            self.inner.read(index, scratch)
        }
        fn verify(&self) -> Result<()> {
            if self.truncated {
                return Err(Error::Internal("the file shrank under its map".into()));
            }
            Ok(())
        }
    }

    /// A streamed sample of one uint8 field `v` (its ordinal, wrapping), or one that fails to
    /// read.
    pub(crate) struct Owned {
        ordinal: u64,
        v: [u8; 1],
        bad: bool,
    }

    impl Owned {
        pub(crate) fn good(ordinal: u64) -> Owned {
            Owned {
                ordinal,
                v: [ordinal as u8],
                bad: false,
            }
        }
        pub(crate) fn bad(ordinal: u64) -> Owned {
            Owned {
                bad: true,
                ..Owned::good(ordinal)
            }
        }
        pub(crate) fn fields() -> [FieldSpec; 1] {
            [FieldSpec::tensor("v", DType::U8, &[])]
        }
    }

    impl OwnedSample for Owned {
        fn read<'a>(&'a self, _scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
            if self.bad {
                return Err(Error::Sample {
                    index: self.ordinal,
                    what: self.describe(),
                    reason: "cut off".into(),
                });
            }
            let mut sample = Sample::default();
            sample.set(0, &self.v);
            Ok(sample)
        }
        fn describe(&self) -> String {
            format!("streamed sample {}", self.ordinal)
        }
        fn ordinal(&self) -> u64 {
            self.ordinal
        }
    }

    /// The batch of `indices` of `c`'s source, built whole in a fresh arena.
    pub(crate) fn build(c: &Collator, key: BatchKey, indices: &[usize]) -> Result<Batch> {
        let arena = Arena::new(false, None);
        c.build(
            key,
            indices,
            Draws::ByIndex,
            &arena,
            &mut Scratch::default(),
        )
    }

    /// Field `name` of `batch` as float32 values.
    pub(crate) fn floats(batch: &Batch, name: &str) -> Vec<f32> {
        let data = batch.field_by_name(name).and_then(|f| f.data);
        data.expect("a host field")
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// Field `name` of `batch` as bytes.
    fn bytes(batch: &Batch, name: &str) -> Vec<u8> {
        let data = batch.field_by_name(name).and_then(|f| f.data);
        data.expect("a host field").to_vec()
    }

    #[test]
    fn a_whole_build_writes_every_slot_in_order_under_the_batchs_key() {
        let c = Collator::new(counting(20), None, None, false).unwrap();
        let at = BatchKey {
            position: 3,
            ..key(0, 2)
        };
        let batch = build(&c, at, &[11, 4, 19]).unwrap();
        assert_eq!(
            (
                batch.len(),
                batch.epoch(),
                batch.position(),
                batch.skipped()
            ),
            (3, 2, 3, 0)
        );
        assert_eq!(batch.field_names(), ["x", "y"]);
        assert_eq!(bytes(&batch, "y"), [11, 4, 19]);
        assert!(c.batch_bytes(3) <= batch.byte_len());
    }

    #[test]
    fn a_batch_whose_source_fails_verification_is_not_handed_over() {
        let mut source = Flaky::new(counting(4), &[]);
        source.truncated = true;
        let c = Collator::new(Arc::new(source), None, None, false).unwrap();
        let e = build(&c, key(0, 0), &[0, 1]).unwrap_err();
        assert!(e.to_string().contains("shrank"), "{e}");
    }

    #[test]
    fn streamed_samples_are_built_in_order_and_a_bad_one_is_replaced_from_its_batch() {
        let c = Collator::for_fields(&Owned::fields(), None, None, true).unwrap();
        let samples: Vec<Box<dyn OwnedSample>> = vec![
            Box::new(Owned::good(10)),
            Box::new(Owned::bad(11)),
            Box::new(Owned::good(12)),
        ];
        let arena = Arena::new(false, None);
        let mut scratch = Scratch::default();
        let batch = c
            .build_owned(key(1, 0), &samples, &arena, &mut scratch)
            .unwrap();
        assert_eq!(batch.skipped(), 1);
        let v = bytes(&batch, "v");
        assert_eq!((v[0], v[2]), (10, 12));
        assert!(
            [10, 12].contains(&v[1]),
            "replaced by a good sample of the batch: {v:?}"
        );
        // Without skip, the bad sample fails the batch, named by its ordinal.
        let strict = Collator::for_fields(&Owned::fields(), None, None, false).unwrap();
        match strict.build_owned(key(1, 0), &samples, &arena, &mut scratch) {
            Err(Error::Sample { index, what, .. }) => {
                assert_eq!((index, what.as_str()), (11, "streamed sample 11"));
            }
            other => panic!(
                "expected sample 11's error, got {:?}",
                other.map(|b| b.len())
            ),
        }
    }

    #[test]
    fn a_collator_of_streamed_samples_refuses_indices() {
        let c = Collator::for_fields(&Owned::fields(), None, None, false).unwrap();
        assert!(c.source().is_none());
        let e = build(&c, key(0, 0), &[0]).unwrap_err();
        assert!(matches!(e, Error::Internal(_)), "{e}");
    }
}
