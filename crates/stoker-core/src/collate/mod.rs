//! Collate: turning a list of sample indices into one batch, zero-copy.
//!
//! Each sample is written straight into its slot of the batch's arena slab: a fixed-shape field
//! is one `memcpy` from the source's view, a ragged field is copied and padded to the longest
//! sample of the batch (PyTorch's `pad_sequence`) with a `<name>_lengths` int64 field added, an
//! encoded image is decoded ([`crate::decode`]) into the worker's reused buffer and transformed
//! ([`crate::transform`]) directly into its slot. There is no per-sample allocation and no second
//! copy.
//!
//! Building happens in two phases: every sample of the batch is read first (views into a memory
//! map cost nothing; file bytes land in per-worker buffers that are reused), which fixes the
//! padded shapes; then one slab is taken from the arena and every slot is written. A batch may
//! also be built in parts by several workers at once (`PartedBatch`), each part running both
//! phases on its own slots.
//!
//! A batch is built either from sample indices of a map-style [`Source`] ([`Collator::build`])
//! or from samples a stream handed over, owned ([`Collator::build_owned`]: tar shards read
//! sequentially, iterable sources). Both go through the same two phases; they differ only in
//! where a sample's bytes come from and which samples can replace a bad one under
//! `on_error=skip` (any sample of the dataset, or another sample of the same batch).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use crate::arena::{Arena, SlabLease};
use crate::batch::{Batch, FieldMeta};
use crate::decode::{
    decode as decode_part, raw_pixels, read_header, stored_header, DecodeBuffers, Dims, JpegDecoder,
};
use crate::dtype::{DType, Layout};
use crate::error::{Error, Result};
use crate::rng::{Rng, Stream};
use crate::sampler::Draws;
use crate::source::pixels::{tensor_image_shape, InputLayout};
use crate::source::streaming::OwnedSample;
use crate::source::{FieldKind, FieldSpec, Sample, Source};
use crate::span::{SpanKind, Stage};
use crate::stats::Spans;
use crate::transform::{mix, parse, BatchMix, Pipeline, Scratch as TransformScratch, NO_SIZE};

/// Alignment of every field inside a slab (DLPack recommends 256 bytes for device copies).
const FIELD_ALIGN: usize = 256;

/// How many replacements `on_error=skip` tries for one bad sample before giving up.
pub const MAX_REPLACEMENTS: usize = 16;

/// How image fields become slots: encoded images are decoded (refusing images over
/// `max_pixels` before allocating), then transformed by `pipeline` straight into the slot;
/// image-shaped tensors are transformed by a pipeline built for their size.
pub struct ImageStages {
    /// Largest `width * height` a decoded image may have (option `max_image_pixels`).
    pub max_pixels: u64,
    /// Which decoder decodes JPEGs (option `jpeg_decoder`).
    pub jpeg_decoder: JpegDecoder,
    /// How image-shaped uint8 tensor fields are stored (`None`: from their shape).
    pub input_layout: Option<InputLayout>,
    /// The transforms that write each encoded image into its slot; `None` where the spec leaves
    /// the size as it is, which only a source of image-shaped tensors (all of one size) allows.
    pub pipeline: Option<Arc<Pipeline>>,
    /// Option `transform`, from which each tensor field's pipeline is built.
    pub transform: Option<String>,
    /// Option `dtype` (`None`: from the spec), for the tensor fields' pipelines.
    pub dtype: Option<DType>,
    /// Option `layout`, for the tensor fields' pipelines.
    pub layout: Layout,
}

/// The pipeline for the image-shaped tensors of `field`, all `height`x`width`: their size is
/// known, so the spec need not fix it, and operations such as `color_jitter` may come first.
fn tensor_pipeline(
    stages: &ImageStages,
    field: &FieldSpec,
    height: usize,
    width: usize,
) -> Result<Pipeline> {
    Pipeline::for_input(
        stages.transform.as_deref(),
        stages.dtype,
        stages.layout,
        height,
        width,
    )
    .map_err(|reason| {
        Error::option(
            "transform",
            format!("field `{}` ({width}x{height}): {reason}", field.name),
        )
    })
}

/// Decode buffers larger than this are released after use instead of kept for the next image.
const KEEP_DECODE_BYTES: usize = 64 << 20;

/// What collate writes for one source field.
enum Output {
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

/// A worker's image buffers: the decoder's output and the transform's scratch.
#[derive(Default)]
struct Pixels {
    decode: DecodeBuffers,
    transform: TransformScratch,
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

/// Where the samples of one batch come from, and what may replace a bad one.
trait Pick {
    /// Candidates `0..len()` for a replacement.
    fn len(&self) -> usize;
    fn read<'a>(&'a self, candidate: usize, buf: &'a mut Vec<u8>) -> Result<Sample<'a>>;
    fn describe(&self, candidate: usize) -> String;
    /// The sample's index for randomness and messages.
    fn index(&self, candidate: usize) -> u64;
    /// After the batch is written: whether what was read can be trusted (see
    /// [`Source::verify`]).
    fn verify(&self) -> Result<()> {
        Ok(())
    }
}

/// Indices of a map-style source: any sample of the dataset may replace a bad one.
struct FromSource<'s>(&'s dyn Source);

impl Pick for FromSource<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read<'a>(&'a self, candidate: usize, buf: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        self.0.read(candidate, buf)
    }
    fn describe(&self, candidate: usize) -> String {
        self.0.describe(candidate)
    }
    fn index(&self, candidate: usize) -> u64 {
        candidate as u64
    }
    fn verify(&self) -> Result<()> {
        self.0.verify()
    }
}

/// Owned samples of one batch: another sample of the same batch replaces a bad one (a stream
/// has no random access to the rest of the dataset).
struct FromOwned<'s>(&'s [Box<dyn OwnedSample>]);

impl Pick for FromOwned<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read<'a>(&'a self, candidate: usize, buf: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        self.0[candidate].read(buf)
    }
    fn describe(&self, candidate: usize) -> String {
        self.0[candidate].describe()
    }
    fn index(&self, candidate: usize) -> u64 {
        self.0[candidate].ordinal()
    }
}

/// Builds batches from samples into pooled buffers: decoding, transforms, stacking, padding.
pub struct Collator {
    /// The map-style source `build` reads; `None` for a collator of streamed samples.
    source: Option<Arc<dyn Source>>,
    outputs: Vec<Output>,
    names: Vec<String>,
    skip_bad: bool,
}

impl Collator {
    /// `pad` is the value ragged fields are padded with (required if the source has any, except
    /// raw-bytes fields, which pad with 0); `image` writes encoded-image fields (required if the
    /// source has any).
    pub fn new(
        source: Arc<dyn Source>,
        pad: Option<f64>,
        image: Option<Arc<ImageStages>>,
        skip_bad: bool,
    ) -> Result<Collator> {
        let mut collator = Collator::for_fields(source.fields(), pad, image, skip_bad)?;
        collator.source = Some(source);
        Ok(collator)
    }

    /// A collator for samples of `fields` handed over owned ([`Collator::build_owned`]), with
    /// no map-style source behind it.
    pub fn for_fields(
        fields: &[FieldSpec],
        pad: Option<f64>,
        image: Option<Arc<ImageStages>>,
        skip_bad: bool,
    ) -> Result<Collator> {
        let mut outputs = Vec::new();
        let mut names = Vec::new();
        // The spec's batch-level mixing, whatever the image fields' sizes.
        let mix = match image
            .as_ref()
            .and_then(|stages| stages.transform.as_deref())
        {
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
        for spec in fields {
            let output = match &spec.kind {
                FieldKind::Tensor { dtype, shape }
                    if spec.name == "label" && shape.is_empty() && mix.is_some() =>
                {
                    let mix = mix.as_ref().ok_or_else(|| Error::Internal("mix".into()))?;
                    Output::SoftLabel {
                        src: *dtype,
                        num_classes: mix.num_classes,
                        smoothing: mix.label_smoothing,
                    }
                }
                FieldKind::Tensor { dtype, shape } => match image.as_ref().and_then(|stages| {
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
                    let stages = image.clone().ok_or_else(|| {
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
            };
            outputs.push(output);
            names.push(spec.name.clone());
        }
        Ok(Collator {
            source: None,
            outputs,
            names,
            skip_bad,
        })
    }

    /// The map-style source (`None` for a collator of streamed samples).
    pub fn source(&self) -> Option<&Arc<dyn Source>> {
        self.source.as_ref()
    }

    /// Bytes of the slab a batch of `n` samples needs (ragged fields counted empty: a lower
    /// bound for them).
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

        // The padded length of each ragged field is the batch's longest.
        let mut max_len = vec![0usize; self.outputs.len()];
        for (_, sample) in &samples {
            for (f, out) in self.outputs.iter().enumerate() {
                if let Output::Pad { .. } = out {
                    max_len[f] = max_len[f].max(self.ragged_len(f, sample));
                }
            }
        }
        let start = Instant::now();
        let (metas, total) = self.layout(n, &max_len);
        let mut lease = arena.acquire(total)?;
        spans.push(SpanKind::Stage(Stage::Collate), usize::MAX, 0, start);

        // Phase 2: write every slot.
        let mut slots = Slots::whole(&metas, lease.as_mut_slice());
        skipped += self.write_slots(
            key, pick, indices, draws, &samples, &max_len, &mut slots, spare, pixels, spans,
        )?;
        self.finish(key, pick, n, metas, lease, skipped)
    }

    /// Phase 1 for slots `range` of the batch of `indices`: reads each sample into its buffer
    /// of `reads` (`reads[0]` for the range's first slot) and validates it, replacing a bad one
    /// under on_error=skip. Returns the samples (with the index each slot uses) and how many
    /// were replaced; stops at the first slot that fails.
    fn read_slots<'a>(
        &self,
        key: BatchKey,
        pick: &'a dyn Pick,
        indices: &[usize],
        range: Range<usize>,
        reads: &'a mut [Vec<u8>],
        spans: &mut Spans,
    ) -> Result<(Vec<(usize, Sample<'a>)>, usize)> {
        let mut samples = Vec::with_capacity(range.len());
        let mut skipped = 0;
        for (slot, buf) in range.zip(reads.iter_mut()) {
            let start = Instant::now();
            let (used, sample, replaced) =
                self.read_valid(key, pick, slot, indices[slot], buf, spans)?;
            spans.push(SpanKind::SampleRead, slot, pick.index(used) as usize, start);
            skipped += usize::from(replaced);
            samples.push((used, sample));
        }
        Ok((samples, skipped))
    }

    /// Phase 2 for the slots `slots` holds: writes `samples[i]` (read by phase 1) into slot
    /// `slots.first + i`, replacing a sample whose write fails under on_error=skip. Returns how
    /// many were replaced; stops at the first slot that fails.
    #[allow(clippy::too_many_arguments)]
    fn write_slots(
        &self,
        key: BatchKey,
        pick: &dyn Pick,
        indices: &[usize],
        draws: Option<Draws>,
        samples: &[(usize, Sample<'_>)],
        max_len: &[usize],
        slots: &mut Slots<'_>,
        spare: &mut Vec<u8>,
        pixels: &mut Pixels,
        spans: &mut Spans,
    ) -> Result<usize> {
        let mut skipped = 0;
        for (i, (index, sample)) in samples.iter().enumerate() {
            let slot = slots.first + i;
            // The slot's draw: a replacement keeps the draw of the sample it replaces. Streamed
            // samples are keyed by their position in this rank's stream.
            let draw = match draws {
                Some(draws) => draws.at(slot, indices[slot]),
                None => pick.index(indices[slot]),
            };
            let start = Instant::now();
            let mut used = *index;
            if let Err(err) =
                self.write(key, pick, slot, *index, draw, sample, slots, pixels, spans)
            {
                if !(self.skip_bad && err.is_sample_error()) {
                    return Err(err);
                }
                let target = Target { max_len, slots };
                used = self.write_replacement(
                    key, pick, slot, *index, draw, target, spare, pixels, spans, err,
                )?;
                skipped += 1;
            }
            spans.push(
                SpanKind::SampleWrite,
                slot,
                pick.index(used) as usize,
                start,
            );
        }
        Ok(skipped)
    }

    /// After every slot is written: checks what was read, mixes the batch (mixup/cutmix) and
    /// hands it over.
    fn finish(
        &self,
        key: BatchKey,
        pick: &dyn Pick,
        n: usize,
        metas: Vec<FieldMeta>,
        mut lease: SlabLease,
        skipped: usize,
    ) -> Result<Batch> {
        // Bytes copied from a file mapped while another process truncated it are zeros, not
        // the file's: the batch fails instead of carrying them.
        pick.verify()?;
        self.mix_batch(key, n, &metas, lease.as_mut_slice());
        Ok(Batch::host(
            metas,
            lease,
            key.epoch,
            key.position,
            n,
            skipped,
        ))
    }

    /// Reads sample `index`, or under on_error=skip the first of its deterministic replacements
    /// that reads and validates. Returns the index used and whether it is a replacement.
    fn read_valid<'a>(
        &self,
        key: BatchKey,
        pick: &'a dyn Pick,
        slot: usize,
        index: usize,
        buf: &'a mut Vec<u8>,
        spans: &mut Spans,
    ) -> Result<(usize, Sample<'a>, bool)> {
        let buf: *mut Vec<u8> = buf;
        let mut candidate = index;
        let mut rng = replacement_rng(key, pick.index(index));
        let mut first_err = None;
        for attempt in 0..=MAX_REPLACEMENTS {
            // SAFETY: `buf` comes from a `&'a mut` we hold exclusively. Each iteration's borrow
            // either is returned (ending the loop) or is dead before the next iteration starts;
            // the raw pointer only works around the borrow checker's rejection of a conditional
            // return of a borrow from inside a loop (NLL problem case #3).
            let attempt_buf = unsafe { &mut *buf };
            let start = Instant::now();
            let read = pick.read(candidate, attempt_buf);
            spans.push(
                SpanKind::Stage(Stage::Read),
                slot,
                pick.index(candidate) as usize,
                start,
            );
            let result = read.and_then(|s| self.validate(pick, candidate, &s).map(|()| s));
            match result {
                Ok(sample) => return Ok((candidate, sample, attempt > 0)),
                Err(err) if self.skip_bad && err.is_sample_error() => {
                    first_err.get_or_insert(err);
                    candidate = rng.below(pick.len() as u64) as usize;
                }
                Err(err) => return Err(err),
            }
        }
        Err(gave_up(first_err.unwrap_or_else(|| {
            Error::Internal("replacement loop ended without an error".into())
        })))
    }

    /// Writes a replacement for the sample in `slot` whose write failed with `err`. The
    /// replacement's ragged fields must fit the lengths the batch was laid out with. Returns the
    /// replacement's index.
    #[allow(clippy::too_many_arguments)]
    fn write_replacement(
        &self,
        key: BatchKey,
        pick: &dyn Pick,
        slot: usize,
        index: usize,
        draw: u64,
        target: Target<'_, '_>,
        spare: &mut Vec<u8>,
        pixels: &mut Pixels,
        spans: &mut Spans,
        err: Error,
    ) -> Result<usize> {
        let Target { max_len, slots } = target;
        let mut rng = replacement_rng(key, pick.index(index));
        for _ in 0..MAX_REPLACEMENTS {
            let candidate = rng.below(pick.len() as u64) as usize;
            let start = Instant::now();
            let read = pick.read(candidate, spare);
            spans.push(
                SpanKind::Stage(Stage::Read),
                slot,
                pick.index(candidate) as usize,
                start,
            );
            let Ok(sample) = read else {
                continue;
            };
            let fits = self.validate(pick, candidate, &sample).is_ok()
                && self.outputs.iter().enumerate().all(|(f, o)| {
                    !matches!(o, Output::Pad { .. }) || self.ragged_len(f, &sample) <= max_len[f]
                });
            if fits
                && self
                    .write(
                        key, pick, slot, candidate, draw, &sample, slots, pixels, spans,
                    )
                    .is_ok()
            {
                return Ok(candidate);
            }
        }
        Err(gave_up(err))
    }

    /// Checks that a sample's bytes match its field specs.
    fn validate(&self, pick: &dyn Pick, index: usize, sample: &Sample<'_>) -> Result<()> {
        for (f, out) in self.outputs.iter().enumerate() {
            let got = sample.get(f).len();
            let ok = match out {
                Output::Copy { dtype, shape } => {
                    got == shape.iter().product::<usize>() * dtype.size()
                }
                Output::Pad { dtype, inner, .. } => {
                    got.is_multiple_of((inner.iter().product::<usize>() * dtype.size()).max(1))
                }
                Output::Image { .. } => got > 0,
                Output::SoftLabel { src, .. } => got == src.size(),
                Output::TensorImage { height, width, .. } => got == height * width * 3,
            };
            if !ok {
                let reason = match out {
                    Output::Copy { dtype, shape } => format!(
                        "field `{}` has {got} bytes; expected {dtype} {shape:?} ({} bytes)",
                        self.names[f],
                        shape.iter().product::<usize>() * dtype.size()
                    ),
                    Output::Pad { dtype, inner, .. } => format!(
                        "field `{}` has {got} bytes, not a whole number of {dtype} {inner:?} rows",
                        self.names[f]
                    ),
                    Output::Image { .. } => format!("field `{}` is empty (0 bytes)", self.names[f]),
                    Output::TensorImage { height, width, .. } => format!(
                        "field `{}` has {got} bytes; expected a uint8 {height}x{width}x3 image",
                        self.names[f]
                    ),
                    Output::SoftLabel { src, .. } => format!(
                        "field `{}` has {got} bytes; expected one {src}",
                        self.names[f]
                    ),
                };
                return Err(sample_error(pick, index, reason));
            }
        }
        Ok(())
    }

    fn ragged_len(&self, field: usize, sample: &Sample<'_>) -> usize {
        match &self.outputs[field] {
            Output::Pad { dtype, inner, .. } => {
                sample.get(field).len() / (inner.iter().product::<usize>() * dtype.size()).max(1)
            }
            _ => 0,
        }
    }

    /// The batch's fields and the slab size they need: the source's fields in order, then one
    /// `<name>_lengths` field per ragged field.
    fn layout(&self, n: usize, max_len: &[usize]) -> (Vec<FieldMeta>, usize) {
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

    /// Writes `sample` (dataset index `index`, augmented as draw `draw`) into slot `slot` of
    /// every field.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        key: BatchKey,
        pick: &dyn Pick,
        slot: usize,
        index: usize,
        draw: u64,
        sample: &Sample<'_>,
        slots: &mut Slots<'_>,
        pixels: &mut Pixels,
        spans: &mut Spans,
    ) -> Result<()> {
        let mut ragged_seen = 0;
        for (f, out) in self.outputs.iter().enumerate() {
            let start = Instant::now();
            let dst = slots.slot(f, slot);
            let src = sample.get(f);
            match out {
                Output::Copy { .. } => dst.copy_from_slice(src),
                Output::Pad { pad, .. } => {
                    dst[..src.len()].copy_from_slice(src);
                    for chunk in dst[src.len()..].chunks_exact_mut(pad.len()) {
                        chunk.copy_from_slice(pad);
                    }
                    let len = self.ragged_len(f, sample) as i64;
                    slots
                        .slot(self.outputs.len() + ragged_seen, slot)
                        .copy_from_slice(&len.to_ne_bytes());
                    ragged_seen += 1;
                }
                Output::SoftLabel {
                    src: label_type,
                    num_classes,
                    smoothing,
                } => {
                    let label = match label_type {
                        DType::I32 => src
                            .try_into()
                            .map(|b: [u8; 4]| i32::from_ne_bytes(b) as i64),
                        _ => src.try_into().map(i64::from_ne_bytes),
                    }
                    .map_err(|_| sample_error(pick, index, "label has the wrong size".into()))?;
                    if !(0..*num_classes as i64).contains(&label) {
                        return Err(sample_error(
                            pick,
                            index,
                            format!(
                                "field `{}`: label {label} is outside 0..{num_classes} \
                                 (mixup/cutmix num_classes)",
                                self.names[f]
                            ),
                        ));
                    }
                    // timm's one-hot with smoothing: off = s / N, on = 1 - s + off.
                    let off = (*smoothing / *num_classes as f64) as f32;
                    let on = (1.0 - *smoothing) as f32 + off;
                    for (c, e) in dst.chunks_exact_mut(4).enumerate() {
                        let v = if c as i64 == label { on } else { off };
                        e.copy_from_slice(&v.to_ne_bytes());
                    }
                }
                Output::TensorImage {
                    pipeline,
                    height,
                    width,
                    layout,
                } => {
                    let mut rng = Rng::for_key(key.seed, Stream::Augment, key.epoch, draw);
                    let Pixels { decode, transform } = pixels;
                    let rgb = match layout {
                        InputLayout::Hwc => src,
                        InputLayout::Chw => {
                            // Interleave the planes into the worker's pixel buffer.
                            let plane = height * width;
                            decode.rgb.clear();
                            decode.rgb.resize(plane * 3, 0);
                            for (i, px) in decode.rgb.chunks_exact_mut(3).enumerate() {
                                for (c, v) in px.iter_mut().enumerate() {
                                    *v = src[c * plane + i];
                                }
                            }
                            &decode.rgb
                        }
                    };
                    pipeline
                        .apply(rgb, *width, *height, &mut rng, dst, transform)
                        .map_err(|reason| sample_error(pick, index, reason))?;
                    spans.push(
                        SpanKind::Stage(Stage::Transform),
                        slot,
                        pick.index(index) as usize,
                        start,
                    );
                    continue;
                }
                Output::Image { stages, pipeline } => {
                    let mut rng = Rng::for_key(key.seed, Stream::Augment, key.epoch, draw);
                    let at = (slot, pick.index(index) as usize);
                    let image = (src, sample.image_size(f));
                    write_image(stages, pipeline, image, &mut rng, dst, pixels, spans, at)
                        .map_err(|reason| sample_error(pick, index, reason))?;
                    continue; // decode and transform recorded their own spans
                }
            }
            spans.push(
                SpanKind::Stage(Stage::Collate),
                slot,
                pick.index(index) as usize,
                start,
            );
        }
        Ok(())
    }
}

impl Collator {
    /// mixup/cutmix over the written batch: one draw keyed by (seed, epoch, rank, batch position),
    /// images and soft labels of sample `i` blended with those of sample `n - 1 - i`.
    fn mix_batch(&self, key: BatchKey, n: usize, metas: &[FieldMeta], slab: &mut [u8]) {
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

/// Most parts one batch is split into (more would leave each part only a few samples).
pub(crate) const MAX_PARTS: usize = 8;

/// One batch built in parts by several workers at once (the first batches of a loader: see
/// `loader::host`). Each part reads and writes its own contiguous range of slots into one shared
/// slab; whoever ends last finishes the batch ([`Collator::finish_parted`]).
///
/// Only a batch whose layout is known before any sample is read is split: one without ragged
/// fields, whose padded length is the batch's longest sample. Each part can then run both
/// phases on its own slots — reading is parallel too, and no sample read by one thread is lent
/// to another — where splitting only phase 2 would first read the whole batch on one thread.
/// The batch is the one [`Collator::build`] makes: every random choice is keyed by the slot's
/// draw and a replacement by the bad sample's index, never by who builds it; and the error
/// reported is the one the whole build would have stopped at (see [`Failure`]).
pub(crate) struct PartedBatch {
    key: BatchKey,
    n: usize,
    /// The parts' slot ranges: disjoint, in order, covering `0..n`.
    ranges: Vec<Range<usize>>,
    /// Whether each part's slots were handed out (each is, once).
    taken: Vec<AtomicBool>,
    metas: Vec<FieldMeta>,
    bytes: usize,
    /// The slab, taken from the arena by the first part to need it; `None` if that failed (the
    /// part that tried reports why).
    slab: OnceLock<Option<SlabLease>>,
    /// What each part did, by part.
    outcomes: Mutex<Vec<Option<PartOutcome>>>,
}

/// What one part of a [`PartedBatch`] did.
enum PartOutcome {
    /// Its slots are written; `skipped` samples were replaced (on_error=skip).
    Written {
        skipped: usize,
    },
    Failed(Failure, Error),
}

/// Where a part failed, in the order a whole build meets these failures: phase 1 reads every
/// slot before the slab is taken, and phase 2 writes every slot after. Among parts failing
/// alike, the first part's error is the batch's (a part stops at its first failing slot, so
/// that is the batch's first failing slot); a part that ended outside the build (a panic, a
/// discarded task) wins over any sample's error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Failure {
    Aborted,
    Read,
    Slab,
    Write,
}

impl PartedBatch {
    /// Parts the batch has.
    pub(crate) fn parts(&self) -> usize {
        self.ranges.len()
    }

    /// Records that part `part` ended without building its slots (a panic, a discarded task),
    /// with the error the batch then fails with.
    pub(crate) fn abort(&self, part: usize, error: Error) {
        self.record(part, PartOutcome::Failed(Failure::Aborted, error));
    }

    fn record(&self, part: usize, outcome: PartOutcome) {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot @ None) = outcomes.get_mut(part) {
            *slot = Some(outcome);
        }
    }

    /// The slab, taken from `arena` by the first part to ask (the others wait for it; taking it
    /// never waits for a part); `Ok(None)` when another part failed to take it.
    fn slab(&self, arena: &Arena, spans: &mut Spans) -> Result<Option<&SlabLease>> {
        let mut failed = None;
        let slab = self.slab.get_or_init(|| {
            let start = Instant::now();
            let lease = arena.acquire(self.bytes);
            spans.push(SpanKind::Stage(Stage::Collate), usize::MAX, 0, start);
            lease.map_err(|e| failed = Some(e)).ok()
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(slab.as_ref()),
        }
    }

    /// Part `part`'s slots of every field in `lease` (this batch's slab); `None` if they were
    /// handed out before.
    fn part_slots<'s>(&'s self, part: usize, lease: &'s SlabLease) -> Option<Slots<'s>> {
        let range = self.ranges.get(part)?;
        if self.taken[part].swap(true, Ordering::AcqRel) {
            return None;
        }
        let base = lease.as_ptr();
        let fields = self
            .metas
            .iter()
            .map(|meta| {
                let size = meta.num_bytes() / meta.shape[0].max(1);
                // SAFETY: in bounds: `layout` placed this field at `offset..offset + num_bytes`
                // (`size` bytes per slot, `n` slots) inside `bytes`, the lease's length, and
                // `range` lies in `0..n`. Valid for writes: the lease maps its slab read-write,
                // and the slices borrow `self`, which holds the lease; only
                // `Collator::finish_parted`, owning `self`, takes it out. Not aliased: fields
                // do not overlap (each starts past the end of the one before), parts' ranges
                // do not overlap (`Collator::parted`), `taken` hands each part's slots out
                // once, and nothing else touches the slab while `self` is shared. Parts write
                // from several threads; the finisher reads after `Arc::into_inner` on the
                // parts' shared handle, whose release/acquire orders every part's writes
                // before it.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(
                        base.add(meta.offset + range.start * size),
                        range.len() * size,
                    )
                };
                (bytes, size)
            })
            .collect();
        Some(Slots {
            first: range.start,
            fields,
        })
    }
}

impl Collator {
    /// Batch `key` of `n` samples split into (at most) `parts` parts to build on as many
    /// workers, or `None` when it cannot be: a layout that depends on the samples (ragged
    /// fields), streamed samples, or fewer than two parts of at least one sample each.
    pub(crate) fn parted(&self, key: BatchKey, n: usize, parts: usize) -> Option<PartedBatch> {
        let parts = parts.min(n).min(MAX_PARTS);
        let ragged = self.outputs.iter().any(|o| matches!(o, Output::Pad { .. }));
        if parts < 2 || ragged || self.source.is_none() {
            return None;
        }
        let (metas, bytes) = self.layout(n, &vec![0; self.outputs.len()]);
        Some(PartedBatch {
            key,
            n,
            ranges: (0..parts)
                .map(|p| p * n / parts..(p + 1) * n / parts)
                .collect(),
            taken: (0..parts).map(|_| AtomicBool::new(false)).collect(),
            metas,
            bytes,
            slab: OnceLock::new(),
            outcomes: Mutex::new((0..parts).map(|_| None).collect()),
        })
    }

    /// Builds part `part` of `batch`, whose samples are `indices` of the source: phase 1 then
    /// phase 2 on the part's slots, into the slab the first part takes from `arena`. The
    /// outcome is recorded in `batch`; the stages in `scratch.spans`.
    pub(crate) fn build_part(
        &self,
        batch: &PartedBatch,
        part: usize,
        indices: &[usize],
        draws: Draws,
        arena: &Arena,
        scratch: &mut Scratch,
    ) {
        scratch.spans.clear();
        let outcome = match self.source.as_deref() {
            Some(source) => self.write_part(
                batch,
                part,
                &FromSource(source),
                indices,
                draws,
                arena,
                scratch,
            ),
            None => PartOutcome::Failed(
                Failure::Aborted,
                Error::Internal("a collator of streamed samples was asked for indices".into()),
            ),
        };
        batch.record(part, outcome);
    }

    #[allow(clippy::too_many_arguments)]
    fn write_part(
        &self,
        batch: &PartedBatch,
        part: usize,
        pick: &dyn Pick,
        indices: &[usize],
        draws: Draws,
        arena: &Arena,
        scratch: &mut Scratch,
    ) -> PartOutcome {
        let Some(range) = batch.ranges.get(part).cloned() else {
            return PartOutcome::Failed(
                Failure::Aborted,
                Error::Internal(format!("batch {} has no part {part}", batch.key.position)),
            );
        };
        let key = batch.key;
        let Scratch {
            reads,
            spare,
            pixels,
            spans,
        } = scratch;
        if reads.len() < range.len() {
            reads.resize_with(range.len(), Vec::new);
        }
        let (samples, read_skipped) = match self.read_slots(key, pick, indices, range, reads, spans)
        {
            Ok(read) => read,
            Err(e) => return PartOutcome::Failed(Failure::Read, e),
        };
        let lease = match batch.slab(arena, spans) {
            Ok(Some(lease)) => lease,
            // Another part failed to take the slab and reports why.
            Ok(None) => return PartOutcome::Written { skipped: 0 },
            Err(e) => return PartOutcome::Failed(Failure::Slab, e),
        };
        let Some(mut slots) = batch.part_slots(part, lease) else {
            return PartOutcome::Failed(
                Failure::Aborted,
                Error::Internal(format!(
                    "part {part} of batch {} was built twice",
                    key.position
                )),
            );
        };
        // No ragged field: nothing is padded.
        let max_len = vec![0; self.outputs.len()];
        match self.write_slots(
            key,
            pick,
            indices,
            Some(draws),
            &samples,
            &max_len,
            &mut slots,
            spare,
            pixels,
            spans,
        ) {
            Ok(skipped) => PartOutcome::Written {
                skipped: read_skipped + skipped,
            },
            Err(e) => PartOutcome::Failed(Failure::Write, e),
        }
    }

    /// The batch of `batch`'s parts once every part has ended: the error the whole build would
    /// have reported first (see [`Failure`]), or the batch, verified and mixed (mixup/cutmix)
    /// here, once.
    pub(crate) fn finish_parted(&self, batch: PartedBatch) -> Result<Batch> {
        let PartedBatch {
            key,
            n,
            metas,
            slab,
            outcomes,
            ..
        } = batch;
        let mut skipped = 0;
        let mut first: Option<(Failure, Error)> = None;
        let outcomes = outcomes
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        for (part, outcome) in outcomes.into_iter().enumerate() {
            let (failure, error) = match outcome {
                Some(PartOutcome::Written { skipped: s }) => {
                    skipped += s;
                    continue;
                }
                Some(PartOutcome::Failed(failure, error)) => (failure, error),
                None => (
                    Failure::Aborted,
                    Error::Internal(format!(
                        "part {part} of batch {} of epoch {} never ran",
                        key.position, key.epoch
                    )),
                ),
            };
            // Parts in order: on a tie the first part's error stays.
            if first.as_ref().is_none_or(|(f, _)| failure < *f) {
                first = Some((failure, error));
            }
        }
        if let Some((_, error)) = first {
            return Err(error);
        }
        let lease = slab.into_inner().flatten().ok_or_else(|| {
            Error::Internal(format!(
                "batch {} of epoch {} was written without a slab",
                key.position, key.epoch
            ))
        })?;
        let source = self.source.as_deref().ok_or_else(|| {
            Error::Internal("a collator of streamed samples finished a split batch".into())
        })?;
        self.finish(key, &FromSource(source), n, metas, lease, skipped)
    }
}

fn sample_error(pick: &dyn Pick, index: usize, reason: String) -> Error {
    Error::Sample {
        index: pick.index(index),
        what: pick.describe(index),
        reason,
    }
}

/// Where a replacement is written: the padded length of each ragged field (it must fit them)
/// and the slots.
struct Target<'a, 's> {
    max_len: &'a [usize],
    slots: &'a mut Slots<'s>,
}

/// The slots one build writes: for every field of the batch's layout (`<name>_lengths` fields
/// included), the bytes of slots `first..first + count` — the whole batch, or one part's range.
struct Slots<'a> {
    first: usize,
    /// Per field: its slots' bytes, and the bytes of one slot.
    fields: Vec<(&'a mut [u8], usize)>,
}

impl<'a> Slots<'a> {
    /// Every slot of the batch laid out as `metas` in `slab`.
    fn whole(metas: &[FieldMeta], slab: &'a mut [u8]) -> Slots<'a> {
        let mut fields = Vec::with_capacity(metas.len());
        let mut rest = slab;
        let mut at = 0;
        // Fields are laid out in order, each past the end of the one before.
        for meta in metas {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(meta.offset - at);
            let (bytes, tail) = tail.split_at_mut(meta.num_bytes());
            rest = tail;
            at = meta.offset + meta.num_bytes();
            fields.push((bytes, meta.num_bytes() / meta.shape[0].max(1)));
        }
        Slots { first: 0, fields }
    }

    /// The bytes of slot `slot` (of the batch) in field `field`.
    fn slot(&mut self, field: usize, slot: usize) -> &mut [u8] {
        let (bytes, size) = &mut self.fields[field];
        &mut bytes[(slot - self.first) * *size..][..*size]
    }
}

/// Decodes one encoded image (with its width and height when the source stored them) into the
/// worker's buffer, then transforms it into `out`; records both stages for the sample at
/// `(slot, index)`.
#[allow(clippy::too_many_arguments)]
fn write_image(
    stages: &ImageStages,
    pipeline: &Pipeline,
    (encoded, stored_size): (&[u8], Option<(u32, u32)>),
    rng: &mut Rng,
    out: &mut [u8],
    pixels: &mut Pixels,
    spans: &mut Spans,
    (slot, index): (usize, usize),
) -> std::result::Result<(), String> {
    let Pixels { decode, transform } = pixels;
    let start = Instant::now();
    // A raw-pixel record (packed `raw` mode) is read in place: no decode, no copy.
    if let Some(raw) = raw_pixels(encoded, stages.max_pixels) {
        let mid = Instant::now();
        spans.push_ended(SpanKind::Stage(Stage::Decode), slot, index, start, mid);
        let (dims, rgb) = raw?;
        let result = pipeline.apply(rgb, dims.width, dims.height, rng, out, transform);
        spans.push(SpanKind::Stage(Stage::Transform), slot, index, mid);
        return result;
    }
    // The crop is planned from the image's size, so the decoder reads only what the
    // transform will (see `decode`); the random draws are the same as after a whole decode.
    // A stored size (packed files) spares parsing the header for it.
    let header = match stored_size {
        Some((width, height)) => {
            let dims = Dims {
                width: width as usize,
                height: height as usize,
            };
            stored_header(encoded, dims, stages.max_pixels, stages.jpeg_decoder)
        }
        None => read_header(encoded, stages.max_pixels, stages.jpeg_decoder, decode),
    };
    let decoded = header.and_then(|header| {
        let plan = pipeline.plan(header.dims.width, header.dims.height, rng)?;
        let window = pipeline.window(&plan);
        Ok((decode_part(encoded, &header, Some(window), decode)?, plan))
    });
    let mid = Instant::now();
    spans.push_ended(SpanKind::Stage(Stage::Decode), slot, index, start, mid);
    let (decoded, plan) = decoded?;
    spans.count_decode(decoded.path);
    let result = pipeline.apply_decoded(&decode.rgb, &decoded, plan, rng, out, transform);
    spans.push(SpanKind::Stage(Stage::Transform), slot, index, mid);
    // Do not keep a rare huge image's buffers for the worker's lifetime.
    if decode.rgb.capacity() > KEEP_DECODE_BYTES {
        *decode = DecodeBuffers::default();
    }
    result
}

fn replacement_rng(key: BatchKey, index: u64) -> Rng {
    Rng::for_key(key.seed, Stream::Replace, key.epoch, index)
}

fn gave_up(first: Error) -> Error {
    match first {
        Error::Sample {
            index,
            what,
            reason,
        } => Error::Sample {
            index,
            what,
            reason: format!("{reason}; and {MAX_REPLACEMENTS} replacement samples also failed"),
        },
        other => other,
    }
}
