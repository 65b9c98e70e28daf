//! Every option key, declared once: its field, type, default, parser and documentation. The
//! [`declare_options!`] table below generates the fields of [`LoaderOptions`], its `Default`,
//! the key dispatch of [`LoaderOptions::set`] and [`OPTIONS`], from which the header's and the
//! manual's option tables are rendered (a test of `stoker-capi` checks both). A key cannot be
//! documented without being settable, or settable without being documented.
//!
//! Declaring the table with a macro follows DataFusion's `config_namespace!`: one entry per key,
//! so adding one is a single edit that cannot leave a second list behind.

use std::ops::Range;
use std::path::PathBuf;

use super::parse::*;
use super::{Device, DeviceChoice, OnError, Order, SamplerChoice};
use crate::collate::RaggedLayout;
use crate::decode::JpegDecoder;
use crate::dtype::{DType, Layout};
use crate::error::{Error, Result};
use crate::memory::MemoryBudget;
use crate::source::pixels::InputLayout;
use crate::source::tokens::{Boundaries, Packing, TokenType};
use crate::source::{SourceSpec, TokenSpec};
use crate::transform::BoxFormat;

/// One option key, documented: the single source of the option tables in `include/stoker.h`
/// and `docs/options.md`.
#[derive(Clone, Copy, Debug)]
pub struct OptionDoc {
    /// The option's name, as given to [`LoaderOptions::set`].
    pub key: &'static str,
    /// Accepted values.
    pub values: &'static str,
    /// The value used when the option is not set.
    pub default: &'static str,
    /// A value the key accepts (the faces' tests set every key to it).
    pub example: &'static str,
    /// What the option does, in one phrase.
    pub meaning: &'static str,
}

/// Generates [`LoaderOptions`], its `Default`, `set_key` and [`OPTIONS`] from one entry per key
/// (`field: Type = default; parse |key, value| expr; values …, default …, example …, meaning …;`),
/// plus the fields set in code only (no key).
macro_rules! declare_options {
    (
        keys {
            $(
                $(#[doc = $doc:literal])*
                $field:ident: $ty:ty = $default:expr;
                parse |$key:pat_param, $value:pat_param| $parse:expr;
                values $values:literal,
                default $default_doc:literal,
                example $example:literal,
                meaning $meaning:literal;
            )*
        }
        in_code {
            $( $(#[doc = $cdoc:literal])* $cfield:ident: $cty:ty = $cdefault:expr; )*
        }
    ) => {
        /// Every knob of a loader. `LoaderOptions::default()` has the documented defaults; set
        /// others with [`set`](Self::set) (string keys, as every face does) or the typed setters.
        #[derive(Clone, Debug)]
        pub struct LoaderOptions {
            $( $(#[doc = $doc])* pub(crate) $field: $ty, )*
            $( $(#[doc = $cdoc])* pub(crate) $cfield: $cty, )*
        }

        impl Default for LoaderOptions {
            fn default() -> Self {
                LoaderOptions {
                    $( $field: $default, )*
                    $( $cfield: $cdefault, )*
                }
            }
        }

        /// Every key [`LoaderOptions::set`] accepts.
        pub const OPTIONS: &[OptionDoc] = &[
            $( OptionDoc {
                key: stringify!($field),
                values: $values,
                default: $default_doc,
                example: $example,
                meaning: $meaning,
            }, )*
        ];

        impl LoaderOptions {
            /// Parses `value` for `key` and stores it; `None` for a key that is not an option.
            /// On an error nothing changes.
            pub(super) fn set_key(&mut self, key: &str, value: &str) -> Option<Result<()>> {
                match key {
                    $( stringify!($field) => {
                        let parse = |$key: &str, $value: &str| -> Result<$ty> { $parse };
                        Some(parse(key, value).map(|parsed| self.$field = parsed))
                    } )*
                    _ => None,
                }
            }
        }
    };
}

declare_options! {
keys {
    source: Option<SourceSpec> = None;
        parse |key, v| parse_source(key, v).map(Some);
        values "`npy:PATH`, `image_folder:ROOT`, `segmentation_folder:ROOT`, `coco:ANNOTATIONS`, `coco_masks:ANNOTATIONS`, `tar:PATTERN`, `packed:PATH`, `megatron:PREFIX[,PREFIX…]`, `tokens:PATTERN`, `parquet:PATTERN`",
        default "required",
        example "npy:/data/x.npy",
        meaning "an npy array (memory-mapped; uint8, uint16, int32, int64, float16, float32), one subfolder per class of `.jpg/.jpeg/.png` files (torchvision's ImageFolder rules), or images and their PNG masks in twin trees (`ROOT/images/DIRS/NAME.jpg` with `ROOT/masks/DIRS/NAME.png`, at any depth: fields `image` and `mask`), or a COCO `instances_*.json` with its images (`ROOT/annotations/instances_NAME.json` reads `ROOT/NAME/`: fields `image`, `boxes` (xywh), `labels`, and with `coco_masks:` a semantic `mask`), or WebDataset tar shards (`train-{000..146}.tar`, globs, comma lists, or a WebDataset `wids` shard index `….json` listing shards with their sample counts; `.tar.gz` when streaming), or stoker's packed format (`stoker pack`: a file, a dataset directory or a pattern of shards; remote: a dataset URL ending in `/` or `index.stkidx`, or shard URLs), or a token stream for language models (see docs/llm.md): Megatron-LM indexed datasets (`PREFIX.idx` + `PREFIX.bin`, several prefixes or a brace range) or flat token files (raw `.bin` of `token_dtype`, or 1-D `.npy` of uint16, uint32 or int32), memory-mapped and checked at open, or Parquet files: a table of images and numbers, a row a sample (`columns`; Hugging Face image datasets), or with `tokenizer` text, a row a document (`text_column` tokenized in the workers); custom, callback and iterable sources are set in code";
    /// Labels for an npy source.
    labels: Option<PathBuf> = None;
        parse |key, v| parse_labels(key, v).map(Some);
        values "`npy:PATH`",
        default "none",
        example "npy:/data/y.npy",
        meaning "integer labels for an npy source (field `label`, int64)";
    batch_size: usize = 1;
        parse |key, v| parse_int(key, v, 1, 1 << 24).map(|n| n as usize);
        values "integer 1..=16777216",
        default "1",
        example "64",
        meaning "samples per batch";
    shuffle: bool = false;
        parse |key, v| parse_bool(key, v);
        values "bool",
        default "false",
        example "true",
        meaning "a new permutation every epoch, a function of (seed, epoch) only";
    seed: u64 = 0;
        parse |key, v| parse_int(key, v, 0, u64::MAX);
        values "u64",
        default "0",
        example "18446744073709551615",
        meaning "all randomness (order and augmentation) derives from it; the same on every rank, so ranks agree on the order";
    drop_last: bool = false;
        parse |key, v| parse_bool(key, v);
        values "bool",
        default "false",
        example "true",
        meaning "drop the incomplete final batch";
    /// `None` is `auto`: the cores this process may run on.
    num_workers: Option<usize> = None;
        parse |key, v| parse_auto(key, v, 0, 1024);
        values "integer 0..=1024, `auto`",
        default "`auto`",
        example "3",
        meaning "worker threads (`auto`: the cores of this process's affinity mask divided by the ranks on this node, at least 1; 0: the calling thread)";
    prefetch_factor: usize = 2;
        parse |key, v| parse_int(key, v, 1, 1024).map(|n| n as usize);
        values "integer 1..=1024",
        default "2",
        example "4",
        meaning "batches in flight = max(1, num_workers) × prefetch_factor";
    in_order: bool = true;
        parse |key, v| parse_bool(key, v);
        values "bool",
        default "true",
        example "false",
        meaning "false lets ready batches overtake (never across epochs); each rank's saved state is then its own (it names the rank) and resumes that rank only";
    /// `None` is `auto`: from the launcher's variables (see [`crate::launch`]).
    rank: Option<usize> = None;
        parse |key, v| parse_auto(key, v, 0, 1 << 20);
        values "integer, `auto` (`env` is an alias)",
        default "`auto`",
        example "1",
        meaning "this process's rank: the epoch's global order is padded by repeating its head and rank r takes `order[r::world_size]`; `auto`: from torchrun, Slurm, Open MPI or PMI variables, else 0";
    world_size: Option<usize> = None;
        parse |key, v| parse_auto(key, v, 1, 1 << 20);
        values "integer ≥ 1, `auto` (`env` is an alias)",
        default "`auto`",
        example "4",
        meaning "number of ranks (`auto`: from the launcher's variables, else 1); every sampler is dealt to ranks, each getting the same number of batches";
    /// `DistributedSampler(drop_last=...)`: drop the tail instead of padding the shards.
    shard_drop_last: bool = false;
        parse |key, v| parse_bool(key, v);
        values "bool",
        default "false",
        example "true",
        meaning "distributed: drop the tail instead of padding every rank to the same length";
    /// `RandomSampler(replacement=...)`.
    replacement: bool = false;
        parse |key, v| parse_bool(key, v);
        values "bool",
        default "false",
        example "true",
        meaning "`RandomSampler(replacement=True)`";
    /// `num_samples` of the random and weighted samplers.
    num_samples: Option<usize> = None;
        parse |key, v| parse_int(key, v, 1, u64::MAX).map(|n| Some(n as usize));
        values "integer ≥ 1",
        default "dataset size",
        example "1000",
        meaning "samples per epoch of the random and weighted samplers; of an iterable source, the epoch's total over all ranks (each rank delivers `ceil(N / world_size)`, wrapping its stream around if short)";
    /// Per-sample weights: selects `WeightedRandomSampler`.
    weights: Option<Vec<f64>> = None;
        parse |key, v| parse_weights(key, v).map(Some);
        values "`w0,w1,...` (finite, ≥ 0)",
        default "none",
        example "0.5,1,2",
        meaning "`WeightedRandomSampler` (with replacement)";
    /// Indices as ranges (a single index is a range of one): selects `SubsetRandomSampler`.
    /// Kept as ranges so that `0..1000000000000` costs nothing until checked against the dataset.
    subset: Option<Vec<Range<usize>>> = None;
        parse |key, v| parse_indices(key, v).map(Some);
        values "`3,5,9` or `0..1000`, mixed",
        default "none",
        example "3,5,10..20",
        meaning "`SubsetRandomSampler`: these indices, shuffled every epoch";
    /// Indices in the order to visit them every epoch (kept as ranges, as `subset`): selects the
    /// explicit-order sampler.
    indices: Option<Vec<Range<usize>>> = None;
        parse |key, v| parse_indices(key, v).map(Some);
        values "`3,5,9` or `0..1000`, mixed",
        default "none",
        example "9,3,0..4",
        meaning "these indices in this order every epoch (a torch `sampler=` given as a sequence)";
    /// Image transform pipeline spec, e.g. `random_resized_crop(224) | hflip | normalize(imagenet)`.
    transform: Option<String> = None;
        parse |key, v| parse_transform(key, v);
        values "e.g. `random_resized_crop(224) \\| hflip \\| normalize(imagenet)`",
        default "none",
        example "random_resized_crop(224) | hflip",
        meaning "operations separated by `\\|`, torchvision v2 semantics: `resize`, `center_crop`, `random_resized_crop`, `scale_jitter`, `random_shortest_size`, `random_crop`, `random_zoom_out`, `random_iou_crop`, `hflip`, `vflip`, `color_jitter`, `random_photometric_distort`, `grayscale`, `gaussian_blur`, `rotate`, `affine`, `rand_augment`, `trivial_augment`, `auto_augment(imagenet)`, `random_erasing`, `normalize`, and batch-level `mixup`, `cutmix` (`label` becomes float32 `[B, N]`) (see docs/transforms.md); a leading `fields(image=NAME, mask=NAME, boxes=NAME:xyxy, labels=NAME, per_box=NAME,NAME, keypoints=NAME, ignore_index=255, min_size=1, min_area=1)` moves a segmentation mask (nearest, labels kept), bounding boxes (clamped, dropped under `min_size` pixels a side or `min_area` with their labels and per-box fields) and keypoints (`x, y[, visibility]` rows, never dropped; visibility 0 once outside) with their image under one draw; run fused, per sample, into the batch slot; a bad spec is an error naming the operation and argument";
    dtype: Option<DType> = None;
        parse |key, v| v.parse().map(Some).map_err(|e| Error::option(key, e));
        values "`uint8`, `uint16`, `float32`, `float16`, `bfloat16`",
        default "float32 after normalize, else uint8",
        example "bfloat16",
        meaning "image output element type (other tensors are delivered as stored; image-shaped uint8, uint16, float16, bfloat16 and float32 tensors are images, see `input_layout`; `uint16` only for uint16 tensor images)";
    /// `None`: not set (NCHW, but an image-shaped tensor field is then delivered as stored).
    layout: Option<Layout> = None;
        parse |key, v| v.parse().map(Some).map_err(|e| Error::option(key, e));
        values "`nchw`, `nhwc`",
        default "nchw",
        example "nhwc",
        meaning "image batch layout (an image-shaped tensor field that no `transform`, `dtype` or `layout` is given for is delivered as stored)";
    /// How image-shaped tensor fields are stored (`None`: from their shape).
    input_layout: Option<InputLayout> = None;
        parse |key, v| parse_input_layout(key, v).map(Some);
        values "`hwc`, `chw`",
        default "`hwc` if the last dimension is 1, 3 or 4, else `chw` if the first is",
        example "chw",
        meaning "how an image-shaped tensor field (3 dimensions of uint8, uint16, float16, bfloat16 or float32: npy, tar `npy`, packed tensor fields, callbacks) is stored, so that `transform`, `dtype` and `layout` apply to it as to decoded images; any other channel count (13 bands: `[H, W, 13]`) needs it set, and a layout the shape contradicts (`hwc` on `[3, H, W]`) is refused; RGB uint8 goes through the RGB pipeline, any other channel count or a float type plane by plane (colour ops need RGB uint8); its size is known, so `dtype` or `layout` alone converts it and the transform need not fix a size; from callbacks, RGB uint8 images may vary in size from sample to sample when the transform fixes the output size, and with them the `[H, W]` integer mask `fields(mask=)` names (given after its image)";
    /// `None`: page-locked when the device is CUDA.
    pin_memory: Option<bool> = None;
        parse |key, v| parse_bool(key, v).map(Some);
        values "bool",
        default "true with cuda",
        example "true",
        meaning "page-locked batch memory: registered with the CUDA driver where one is present (what torch calls pinned: `is_pinned()`, asynchronous `.cuda(non_blocking=True)`), else `mlock`; on cuda, registered with the loader's device";
    /// As given: `cuda` without an ordinal becomes `cuda:LOCAL_RANK` once the launch is known.
    device: DeviceChoice = DeviceChoice::Given(Device::Cpu);
        parse |key, v| parse_device(key, v);
        values "`cpu`, `cuda`, `cuda:N`",
        default "cpu",
        example "cuda:1",
        meaning "where batches are delivered (CUDA prefetch); `cuda` is `cuda:LOCAL_RANK` (the rank on this node)";
    /// With `device=cuda`: the caller's `CUstream` (as an address) to queue the copies on,
    /// instead of a stream of the loader's own. Borrowed: it must outlive the loader and every
    /// batch, and is never destroyed. `Some(0)` is the legacy default stream.
    cuda_stream: Option<usize> = None;
        parse |key, v| parse_stream(key, v).map(Some);
        values "a CUstream, decimal or `0x` hex",
        default "the loader's own",
        example "0x7f00aa",
        meaning "device=cuda: copy on the caller's stream (borrowed, never destroyed)";
    /// `None`: on with `device=cuda` wherever the transform allows; `Some(true)` insists.
    gpu_normalize: Option<bool> = None;
        parse |key, v| parse_bool(key, v).map(Some);
        values "bool",
        default "true with cuda where the transform allows",
        example "false",
        meaning "device=cuda: uint8 image fields (RGB, or any channel count) cross to the device as uint8 and a kernel on the copy stream makes them the float output (`dtype`, `layout`, `normalize`), bit-identical to the CPU path (the same per-channel table), 1/4 of float32's bytes over PCIe; not with `random_erasing`, `mixup`/`cutmix` or images stored as uint16 or floats, which convert on the CPU (`true` insists: an error names the field that cannot); no effect on uint8 output; `true` with device=cpu is refused";
    on_error: OnError = OnError::Raise;
        parse |key, v| parse_on_error(key, v);
        values "`raise`, `skip`",
        default "raise",
        example "skip",
        meaning "bad sample: an error naming it, or a deterministic replacement counted in stats";
    /// Longest wait for one batch; 0 waits forever.
    timeout_ms: u64 = 0;
        parse |key, v| parse_int(key, v, 0, u64::MAX / 1_000_000);
        values "integer ≥ 0",
        default "0 (none)",
        example "1500",
        meaning "longest wait for one batch";
    resume_state: Option<String> = None;
        parse |_, v| crate::resume::ResumeState::parse(v).map(|_| Some(v.to_owned()));
        values "a string from `save_state`",
        default "none",
        example "stoker-state-v1;seed=3;epoch=1;position=2;ahead=4;batches=6",
        meaning "continue exactly where a saved job stopped, at any world size (a streaming loader's state: at the same world size only, by replay), with the seed it was saved with (whatever `seed` says); an error names what differs if the source, sampler, batch_size, drop_last or transform changed";
    /// Pad value for ragged fields.
    pad: Option<f64> = None;
        parse |key, v| parse_finite(key, v).map(Some);
        values "a finite number",
        default "none",
        example "-1",
        meaning "pad ragged fields to the batch's longest, with a `<name>_lengths` field";
    /// How ragged fields are batched.
    ragged: RaggedLayout = RaggedLayout::Pad;
        parse |key, v| parse_ragged(key, v);
        values "`pad`, `offsets`",
        default "pad",
        example "offsets",
        meaning "ragged per-sample fields (boxes, tar raw members, `cu_seqlens`, varying callback tensors): `pad` pads them to the batch's longest, `[batch, longest, …]`, with an int64 `<name>_lengths` of `batch` (needs `pad` unless raw bytes); `offsets` lays the samples' rows end to end, `[total, …]`, with an int64 `<name>_offsets` of `batch + 1` (sample `i` is rows `offsets[i]..offsets[i+1]`: `torch.nested.nested_tensor_from_jagged(values, offsets)`)";
    /// How box fields are stored and delivered.
    box_format: BoxFormat = BoxFormat::Xyxy;
        parse |key, v| parse_box_format(key, v);
        values "`xyxy`, `xywh`, `cxcywh`",
        default "xyxy",
        example "cxcywh",
        meaning "how the boxes a `fields(boxes=NAME)` transform role names are stored and delivered (pixels: left, top, right, bottom; left, top, width, height; centre x, centre y, width, height); a `boxes=NAME:FORMAT` suffix in the spec wins over it";
    /// Largest image (width × height) a decoder will allocate for; larger ones are bad samples.
    /// Pillow's `MAX_IMAGE_PIXELS`: larger images are decompression bombs until proven otherwise.
    max_image_pixels: u64 = crate::decode::MAX_IMAGE_PIXELS;
        parse |key, v| parse_int(key, v, 1, u64::MAX);
        values "integer ≥ 1",
        default "89478485",
        example "1000000",
        meaning "larger images are bad samples (decompression bombs), refused before allocating";
    /// Which decoder decodes JPEGs; `None`: `STOKER_JPEG_DECODER`, else auto.
    jpeg_decoder: Option<JpegDecoder> = None;
        parse |key, v| JpegDecoder::parse(v).map(Some).map_err(|reason| Error::option(key, reason));
        values "`auto`, `zune`, `turbo`, `gpu`",
        default "`auto` (or `STOKER_JPEG_DECODER`)",
        example "zune",
        meaning "`turbo`: libjpeg-turbo decodes only the rows and columns a crop reads, shrinking in the DCT domain (by 1/2, 1/4 or 1/8) while the crop stays at least 6 times the output, so that the resample after it still shrinks by 3 or more; `zune`: zune-jpeg (pure Rust) decodes whole images; `auto`: `turbo` when it was built with SIMD, else `zune`; `gpu` (device=cuda): the device decodes the JPEGs with nvJPEG, loaded at run time (`gpu_decode_share` of them, all by default), the rest as `auto`. CMYK/YCCK JPEGs always go to zune-jpeg; stats count each path (`decoded_*`)";
    /// The share of samples whose JPEGs the device decodes; `None`: `auto`.
    gpu_decode_share: Option<f64> = None;
        parse |key, v| parse_share(key, v);
        values "`0`..`1`, `auto`",
        default "`auto`: all with `jpeg_decoder=gpu`; with `jpeg_decoder=auto`, none unless `autotune` moves it",
        example "0.25",
        meaning "device=cuda: the share of samples, chosen by a hash of the index (a run is the same for a given share), whose JPEGs the prefetch thread decodes on the device (nvJPEG) and crops, resizes and flips there with the draws the CPU path would use, into the same slots; needs a transform of `resize`, `center_crop`, `random_resized_crop` and `hflip` only (then `normalize`/`dtype` under `gpu_normalize`); progressive, CMYK and other files the device cannot take are decoded by the workers; stats `gpu_decode_share`, `decoded_device`";
    /// Bound on the batch memory the loader keeps; `None` is the default (see [`crate::memory`]).
    memory_budget: Option<MemoryBudget> = None;
        parse |key, v| MemoryBudget::parse(key, v).map(Some);
        values "bytes (`8GiB`, `500MB`) or `N%` of physical memory",
        default "50% of physical memory (or the cgroup limit) ÷ `LOCAL_WORLD_SIZE`",
        example "8GiB",
        meaning "bound on the batch memory the loader keeps (in flight and idle): a batch that cannot fit is an error when the loader is made; the in-flight cap is lowered to fit (stats `in_flight_cap`); with `device=cuda` it also holds the device buffers the ring grows by while the trainer holds every one";
    /// Live control of the worker count and prefetch depth (see [`crate::autotune`]).
    autotune: bool = false;
        parse |key, v| parse_bool(key, v);
        values "bool",
        default "false",
        example "true",
        meaning "live control of the worker count (from 1 with `num_workers=auto`, never beyond the usable cores) and the prefetch depth (up to 8), within the memory budget, and with device=cuda and `jpeg_decoder=auto` of `gpu_decode_share` (up a tenth while every core is busy and the consumer starves, down once it keeps up); every decision is in stats (`autotune_decisions`, `num_workers`, `prefetch_factor`, `gpu_decode_share`) and the trace";
    /// Where to write the Chrome trace-event timeline (see [`crate::trace`]).
    trace: Option<PathBuf> = None;
        parse |_, v| Ok(non_empty(v).map(PathBuf::from));
        values "a file path",
        default "none",
        example "trace.json",
        meaning "write a Chrome trace-event JSON timeline (Perfetto, chrome://tracing) of every worker's stages, the device copies and the consumer's waits; keeps the last 1024 batches of each thread; written when the loader is dropped";
    /// Streaming mode's shuffle buffer (tar and iterable sources); 0: indexed tar, or an
    /// iterable in stream order.
    shuffle_buffer: usize = 0;
        parse |key, v| parse_int(key, v, 0, 1 << 24).map(|n| n as usize);
        values "integer 0..=16777216",
        default "0",
        example "1000",
        meaning "tar: 0 = indexed (random access, every sampler); N ≥ 1 = streaming: shards shuffled per (seed, epoch), split across ranks into equal runs, read sequentially through a seeded buffer of N samples; iterable sources: a buffer of N samples (0: stream order)";
    order: Order = Order::Random;
        parse |key, v| parse_order(key, v);
        values "`random`, `quasi_random`",
        default "`random`",
        example "quasi_random",
        meaning "with `shuffle=true`: `quasi_random` is a page-aware shuffle for data larger than RAM or than `parquet_cache`: pages shuffled, then samples shuffled within windows of 32 pages (64 MiB at the packed format's default page size); deterministic and resumable like `random`. Packed files: the files are advised (`madvise`) for the order, sequential, random or read-ahead per page. `parquet:` tables: a page is a row group, or a run of data pages of at least 2 MiB where the file's page index says where they begin";
    /// Tar members to deliver, as parsed by `parse_fields`.
    fields: Option<Vec<(String, String)>> = None;
        parse |_, v| crate::source::tar::parse_fields(v).map(Some);
        values "`EXT:NAME,...` (`jpg;png:image,cls:label,txt:caption`)",
        default "image + label",
        example "jpg;png:image,cls:label",
        meaning "tar: members to deliver and their field names; `jpg`/`jpeg`/`png` are decoded images, `cls`/`label`/`index` int64, `npy` tensors, `json#boxes` and `json#labels` a JSON member's `boxes` (float32 rows of 4) and `labels` (int64), anything else raw bytes (uint8, padded with 0, with `NAME_lengths`)";
    /// The columns of a `parquet:` table, as parsed by `parse_columns`.
    columns: Option<Vec<(String, String)>> = None;
        parse |_, v| parse_columns(v).map(Some);
        values "`COLUMN[:NAME],...` (`img:image,label`)",
        default "every image and number column, under its name",
        example "img:image,label",
        meaning "`parquet:` tables (without `tokenizer`): the columns to deliver, a row a sample, and their field names; a binary column or a Hugging Face image (`struct<bytes, path>`) is a decoded image (JPEG or PNG, as tar's `jpg`), an integer column int32 or int64 as stored (uint32 as int64), float and double float32, boolean uint8; text and list columns are not delivered";
    /// The decompressed pages a `parquet:` table keeps (see [`crate::source::parquet`]).
    parquet_cache: u64 = crate::source::PARQUET_CACHE_BYTES;
        parse |key, v| parse_size(key, v);
        values "bytes (`1GiB`, `0`)",
        default "1GiB",
        example "4GiB",
        meaning "`parquet:` tables: decompressed data pages kept for the reading threads to share, least recently used dropped first (`0`: none). A shuffled row is read from its page, and a page may hold a whole row group (row groups of 100 images written by pyarrow, as earlier releases of Hugging Face `datasets` wrote image datasets, are a page each); a page is kept on its second decompression within the last `parquet_cache` bytes of them, then read from memory. Holds `order=quasi_random`'s window of pages, or a whole table that fits";
    /// Remote shards downloaded at once (see [`crate::source::remote`]).
    shard_prefetch: usize = crate::source::remote::RemoteConfig::default().shard_prefetch;
        parse |key, v| parse_int(key, v, 0, 64).map(|n| n as usize);
        values "integer 0..=64",
        default "2",
        example "4",
        meaning "tar or packed with URLs (`s3://`, `gs://`, `az://`, `https://`): remote shards downloaded at once while the loader opens; streaming from a `wids` index (`tar:URL.json`): shards downloading ahead of the one being read (0 is taken as 1)";
    /// The local cache of remote shards.
    cache_dir: Option<PathBuf> = None;
        parse |_, v| Ok(non_empty(v).map(PathBuf::from));
        values "a directory path",
        default "none (a private temporary directory, removed when the loader closes)",
        example "cache",
        meaning "local cache of remote shards, shared safely by the ranks of a node (file locks; each shard downloaded once); a later loader checks each cached shard's size and ETag with one HEAD request and reads it locally";
    cache_limit: Option<u64> = None;
        parse |key, v| parse_size(key, v).map(Some);
        values "bytes (`500GB`, `64GiB`)",
        default "unlimited",
        example "500GB",
        meaning "cache_dir: least recently used shards not in use by any loader are removed after a download, down to this size";
    /// A weighted mixture of token sources, in place of `source`.
    blend: Option<Vec<(f64, TokenSpec)>> = None;
        parse |key, v| parse_blend(key, v).map(Some);
        values "`W:SPEC,W:SPEC,…`, each SPEC `megatron:…` or `tokens:…`",
        default "none",
        example "0.7:megatron:/data/web,0.3:tokens:/data/code-*.bin",
        meaning "in place of `source`: a weighted mixture of token sources with Megatron's greedy apportioning (after k samples each dataset's count is within 1 of its weight × k); the blend has as many samples as its datasets together, and a dataset shorter than its share wraps around, each later pass in a permutation of its own (by `seed`)";
    /// Tokens per sample of a token source, the label's extra one not counted.
    seq_len: Option<usize> = None;
        parse |key, v| parse_int(key, v, 1, 1 << 30).map(|n| Some(n as usize));
        values "integer 1..=1073741824",
        default "required for token sources",
        example "2048",
        meaning "token sources: sample `i` is the `seq_len + 1` tokens from token `i × seq_len` of the files laid end to end (`input_ids` the first `seq_len`, `labels` the last `seq_len`)";
    /// Samples per global batch of a token source; `None`: `batch_size × world_size`.
    global_batch_size: Option<usize> = None;
        parse |key, v| parse_int(key, v, 1, 1 << 30).map(|n| Some(n as usize));
        values "integer ≥ 1",
        default "`batch_size × world_size`",
        example "512",
        meaning "token sources: samples in one global step. Global batch `b` is entries `b·G..(b+1)·G` of the epoch's order whatever the world size, worker count or `batch_size`; rank `r` of `W` takes its contiguous slice `[r·G/W, (r+1)·G/W)` in micro-batches of `batch_size` (G must divide by `world_size × batch_size`); an epoch's tail shorter than `G` is not delivered; `save_state` counts whole global batches, so it resumes at any world size that divides `G`";
    /// Whether token samples restart positions at document boundaries.
    document_boundaries: Boundaries = Boundaries::Ignore;
        parse |key, v| parse_boundaries(key, v);
        values "`ignore`, `reset`",
        default "ignore",
        example "reset",
        meaning "token sources: `reset` adds `position_ids` (0 at each document's first token in the window) and `cu_seqlens` (int32 offsets of the documents in the window, from 0 to `seq_len`; ragged: padded with `seq_len` unless `pad` says otherwise, with `cu_seqlens_lengths`)";
    /// The element type of `input_ids`, `labels` and `position_ids`.
    token_output_dtype: DType = DType::I64;
        parse |key, v| parse_token_output(key, v);
        values "`int64`, `int32`",
        default "int64",
        example "int32",
        meaning "token sources: the type of `input_ids`, `labels` and `position_ids` (a token that does not fit int32 is an error naming its file)";
    /// The element type of raw flat token files.
    token_dtype: Option<TokenType> = None;
        parse |key, v| parse_token_type(key, v).map(Some);
        values "`uint16`, `uint32`, `int32`",
        default "required for raw `tokens:` files",
        example "uint16",
        meaning "`tokens:` sources: the element type of raw `.bin` token files (`.npy` files say theirs)";
    /// The token that ends a document in flat token files.
    eos_token: Option<u64> = None;
        parse |key, v| parse_int(key, v, 0, i64::MAX as u64).map(Some);
        values "integer ≥ 0",
        default "none",
        example "50256",
        meaning "`tokens:` sources: the end-of-document token (it ends the document it closes); without it a file is one document, unless a sidecar of document lengths `NAME.lengths.npy` lies beside it (not with `eos_token`). `parquet:` sources: appended to every document's tokens (Megatron's `--append-eod`)";
    /// How a token source's documents become samples.
    token_packing: Packing = Packing::Concat;
        parse |key, v| parse_packing(key, v);
        values "`concat`, `pad`",
        default "concat",
        example "pad",
        meaning "token sources: `concat` cuts the files' stream into windows (see `seq_len`); `pad` makes sample `i` document `i` (the documents of every file in order: Megatron's document index; a flat file's sidecar of lengths `NAME.lengths.npy`; a flat file without either is one document, with `eos_token` `pad` is refused, since counting them would read every token), truncated to its first `seq_len + 1` tokens or padded with `pad_token` to them, and adds `loss_mask` (uint8, `[seq_len]`: 1 where the label is a real next token of the document, 0 on padding); with `document_boundaries=reset`, `cu_seqlens` is `[0, n, seq_len]` (n the document's tokens among the inputs) and `position_ids` restart at 0 on the padding";
    /// The token a short document is padded with under `token_packing=pad`.
    pad_token: Option<u64> = None;
        parse |key, v| parse_int(key, v, 0, i64::MAX as u64).map(Some);
        values "integer ≥ 0",
        default "0",
        example "50256",
        meaning "token sources with `token_packing=pad`: the token id after a document's end in `input_ids` and `labels` (`loss_mask` is 0 there), checked at open to fit `token_output_dtype` and to lie below `vocab_size` when set";
    /// Resume a token stream whose configuration changed, carrying the position over.
    allow_config_change: bool = false;
        parse |key, v| parse_bool(key, v);
        values "bool",
        default "false",
        example "true",
        meaning "token sources: resume although the source, blend, `seq_len`, `global_batch_size` or token settings changed since the state was saved (otherwise an error naming what changed): the job continues in the saved epoch after as many of its samples as the state counts, rounded down to whole global batches and at most the epoch";
    /// Every token id must be below it, checked at open.
    vocab_size: Option<u64> = None;
        parse |key, v| parse_int(key, v, 1, i64::MAX as u64).map(Some);
        values "integer ≥ 1",
        default "none (not checked)",
        example "50304",
        meaning "token sources: every token id must be in `0..vocab_size`, else opening fails naming the file and the token's place; the check reads every token once (O(tokens)), so it runs only when set (for `parquet:`, the tokenizer's vocabulary, added tokens included, must fit)";
    /// The tokenizer of a `parquet:` source.
    tokenizer: Option<PathBuf> = None;
        parse |_, v| Ok(non_empty(v).map(PathBuf::from));
        values "a `tokenizer.json` path",
        default "required for `parquet:` sources",
        example "tokenizer.json",
        meaning "`parquet:` sources: the Hugging Face tokenizer (`tokenizer.json`, as every Hub model ships it) that turns each row's text into tokens, with its special tokens (`add_special_tokens=True`); the tokenizer's bytes are part of the resume fingerprint";
    /// The text column of a `parquet:` source.
    text_column: String = "text".to_owned();
        parse |key, v| non_empty(v).map(str::to_owned).ok_or_else(|| Error::option(key, "the column name is empty"));
        values "a column name",
        default "text",
        example "content",
        meaning "`parquet:` sources: the string (or binary UTF-8) column holding each row's document; a null is an empty document";
}
in_code {
    /// Overrides the sampler the keys select (see [`LoaderOptions::set_sampler`]).
    sampler: SamplerChoice = None;
}
}
