//! Loader options: the knobs of a loader with the defaults of the C contract, set through a
//! string-keyed setter (`set("batch_size", "64")`) shared by every face, or typed setters from
//! Rust. Fields are private and every setter validates, so a `LoaderOptions` is never invalid;
//! errors name the key. [`OPTIONS`] documents every key once: the header, the options chapter
//! (`docs/options.md`) and the unknown-key message all come from it.

use std::path::PathBuf;
use std::sync::Arc;

use crate::collate::ImageStages;
use crate::decode::JpegDecoder;
use crate::dtype::{DType, Layout};
use crate::error::{Error, Result};
use crate::launch::{usable_cores, Launch, RankShare};
use crate::memory::MemoryBudget;
use crate::sampler::SamplerKind;
use crate::source::pixels::{tensor_image_shape, InputLayout};
use crate::source::streaming::StreamSource;
use crate::source::tar::{TarConfig, TarSource, TarStream};
pub use crate::source::SourceSpec;
use crate::source::{
    Access, FieldKind, FieldRules, FieldSpec, IterableStream, PackedSource, Source,
};
use crate::transform::Pipeline;

/// Where batches are delivered (option `device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    /// Host memory.
    Cpu,
    /// The CUDA device with this ordinal (`cuda:N`).
    Cuda(u32),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// What a bad sample gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnError {
    /// Fail the batch with an error naming the sample.
    #[default]
    Raise,
    /// Replace the sample with a deterministic other one and count it in stats.
    Skip,
}

/// Pages per window of `order=quasi_random`: 64 MiB at the packed format's 2 MiB page, a
/// small part of the page cache of any training machine.
pub const QUASI_RANDOM_WINDOW_PAGES: usize = 32;

/// The order a shuffled epoch reads samples in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Order {
    /// A uniform permutation.
    #[default]
    Random,
    /// A page-window shuffle of page-organised data (packed sources): see
    /// [`SamplerKind::QuasiRandom`].
    QuasiRandom,
}

/// Which sampler, when set explicitly in code; otherwise it follows from the option keys.
pub type SamplerChoice = Option<SamplerKind>;

/// Every knob of a loader. `LoaderOptions::default()` has the documented defaults; set others
/// with [`set`](Self::set) (string keys, as every face does) or the typed setters.
#[derive(Clone, Debug)]
pub struct LoaderOptions {
    pub(crate) source: Option<SourceSpec>,
    /// Labels for an npy source (`labels=npy:PATH`).
    pub(crate) labels: Option<PathBuf>,
    pub(crate) batch_size: usize,
    pub(crate) shuffle: bool,
    pub(crate) seed: u64,
    pub(crate) drop_last: bool,
    /// `None` is `auto`: the cores this process may run on.
    pub(crate) num_workers: Option<usize>,
    pub(crate) prefetch_factor: usize,
    pub(crate) in_order: bool,
    /// `None` is `auto`: from the launcher's variables (see [`crate::launch`]).
    pub(crate) rank: Option<usize>,
    pub(crate) world_size: Option<usize>,
    /// `DistributedSampler(drop_last=...)`: drop the tail instead of padding the shards.
    pub(crate) shard_drop_last: bool,
    /// `RandomSampler(replacement=...)`.
    pub(crate) replacement: bool,
    /// `num_samples` of the random and weighted samplers.
    pub(crate) num_samples: Option<usize>,
    /// Per-sample weights: selects `WeightedRandomSampler`.
    pub(crate) weights: Option<Vec<f64>>,
    /// Indices as ranges (a single index is a range of one): selects `SubsetRandomSampler`.
    /// Kept as ranges so that `0..1000000000000` costs nothing until checked against the dataset.
    pub(crate) subset: Option<Vec<std::ops::Range<usize>>>,
    /// Indices in the order to visit them every epoch (kept as ranges, as `subset`): selects the
    /// explicit-order sampler.
    pub(crate) indices: Option<Vec<std::ops::Range<usize>>>,
    /// Overrides the sampler the keys above select.
    pub(crate) sampler: SamplerChoice,
    /// Image transform pipeline spec, e.g. `random_resized_crop(224) | hflip | normalize(imagenet)`.
    pub(crate) transform: Option<String>,
    pub(crate) dtype: Option<DType>,
    pub(crate) layout: Layout,
    /// How image-shaped uint8 tensor fields are stored (`None`: from their shape).
    pub(crate) input_layout: Option<InputLayout>,
    /// `None`: page-locked when the device is CUDA.
    pub(crate) pin_memory: Option<bool>,
    pub(crate) device: Device,
    /// `device=cuda` without an ordinal: `cuda:LOCAL_RANK` once the launch is known.
    pub(crate) cuda_local: bool,
    /// With `device=cuda`: the caller's `CUstream` (as an address) to queue the copies on,
    /// instead of a stream of the loader's own. Borrowed: it must outlive the loader and every
    /// batch, and is never destroyed. `Some(0)` is the legacy default stream.
    pub(crate) cuda_stream: Option<usize>,
    pub(crate) on_error: OnError,
    pub(crate) order: Order,
    /// Longest wait for one batch; 0 waits forever.
    pub(crate) timeout_ms: u64,
    pub(crate) resume_state: Option<String>,
    /// Pad value for ragged fields.
    pub(crate) pad: Option<f64>,
    /// Largest image (width × height) a decoder will allocate for; larger ones are bad samples.
    pub(crate) max_image_pixels: u64,
    /// Which decoder decodes JPEGs; `None`: `STOKER_JPEG_DECODER`, else auto.
    pub(crate) jpeg_decoder: Option<JpegDecoder>,
    /// Where to write the Chrome trace-event timeline (see [`crate::trace`]).
    pub(crate) trace: Option<PathBuf>,
    /// Bound on the batch memory the loader keeps; `None` is the default (see [`crate::memory`]).
    pub(crate) memory_budget: Option<MemoryBudget>,
    /// Live control of the worker count and prefetch depth (see [`crate::autotune`]).
    pub(crate) autotune: bool,
    /// Streaming mode's shuffle buffer (tar and iterable sources); 0: indexed tar, or an
    /// iterable in stream order.
    pub(crate) shuffle_buffer: usize,
    /// Tar members to deliver, as parsed by `parse_fields`.
    pub(crate) fields: Option<Vec<(String, String)>>,
    /// Remote tar shards: downloads in flight at once, and the local cache.
    pub(crate) shard_prefetch: usize,
    pub(crate) cache_dir: Option<PathBuf>,
    pub(crate) cache_limit: Option<u64>,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            source: None,
            labels: None,
            batch_size: 1,
            shuffle: false,
            seed: 0,
            drop_last: false,
            num_workers: None,
            prefetch_factor: 2,
            in_order: true,
            rank: None,
            world_size: None,
            shard_drop_last: false,
            replacement: false,
            num_samples: None,
            weights: None,
            subset: None,
            indices: None,
            sampler: None,
            transform: None,
            dtype: None,
            layout: Layout::Nchw,
            input_layout: None,
            pin_memory: None,
            device: Device::Cpu,
            cuda_local: false,
            cuda_stream: None,
            on_error: OnError::Raise,
            order: Order::Random,
            timeout_ms: 0,
            resume_state: None,
            pad: None,
            // Pillow's MAX_IMAGE_PIXELS: larger images are decompression bombs until proven otherwise.
            max_image_pixels: 89_478_485,
            jpeg_decoder: None,
            trace: None,
            memory_budget: None,
            autotune: false,
            shuffle_buffer: 0,
            fields: None,
            shard_prefetch: crate::source::remote::RemoteConfig::default().shard_prefetch,
            cache_dir: None,
            cache_limit: None,
        }
    }
}

/// One option key, documented: the single source of the option tables in `include/stoker.h`
/// and `docs/options.md` (tests check both against this table).
#[derive(Clone, Copy, Debug)]
pub struct OptionDoc {
    /// The option's name, as given to [`LoaderOptions::set`].
    pub key: &'static str,
    /// Accepted values.
    pub values: &'static str,
    /// The value used when the option is not set.
    pub default: &'static str,
    /// What the option does, in one phrase.
    pub meaning: &'static str,
}

/// Every key [`LoaderOptions::set`] accepts.
#[rustfmt::skip]
pub const OPTIONS: &[OptionDoc] = &[
    OptionDoc { key: "source", values: "`npy:PATH`, `image_folder:ROOT`, `tar:PATTERN`, `packed:PATH`", default: "required", meaning: "an npy array (memory-mapped; uint8, int32, int64, float16, float32), one subfolder per class of `.jpg/.jpeg/.png` files (torchvision's ImageFolder rules), or WebDataset tar shards (`train-{000..146}.tar`, globs, comma lists, or a WebDataset `wids` shard index `….json` listing shards with their sample counts; `.tar.gz` when streaming), or stoker's packed format (`stoker pack`: a file, a dataset directory or a pattern of shards; remote: a dataset URL ending in `/` or `index.stkidx`, or shard URLs); custom, callback and iterable sources are set in code" },
    OptionDoc { key: "labels", values: "`npy:PATH`", default: "none", meaning: "integer labels for an npy source (field `label`, int64)" },
    OptionDoc { key: "batch_size", values: "integer 1..=16777216", default: "1", meaning: "samples per batch" },
    OptionDoc { key: "shuffle", values: "bool", default: "false", meaning: "a new permutation every epoch, a function of (seed, epoch) only" },
    OptionDoc { key: "seed", values: "u64", default: "0", meaning: "all randomness (order and augmentation) derives from it; the same on every rank, so ranks agree on the order" },
    OptionDoc { key: "drop_last", values: "bool", default: "false", meaning: "drop the incomplete final batch" },
    OptionDoc { key: "num_workers", values: "integer 0..=1024, `auto`", default: "`auto`", meaning: "worker threads (`auto`: the cores of this process's affinity mask divided by the ranks on this node, at least 1; 0: the calling thread)" },
    OptionDoc { key: "prefetch_factor", values: "integer 1..=1024", default: "2", meaning: "batches in flight = max(1, num_workers) × prefetch_factor" },
    OptionDoc { key: "in_order", values: "bool", default: "true", meaning: "false lets ready batches overtake (never across epochs)" },
    OptionDoc { key: "rank", values: "integer, `auto` (`env` is an alias)", default: "`auto`", meaning: "this process's rank: the epoch's global order is padded by repeating its head and rank r takes `order[r::world_size]`; `auto`: from torchrun, Slurm, Open MPI or PMI variables, else 0" },
    OptionDoc { key: "world_size", values: "integer ≥ 1, `auto` (`env` is an alias)", default: "`auto`", meaning: "number of ranks (`auto`: from the launcher's variables, else 1); every sampler is dealt to ranks, each getting the same number of batches" },
    OptionDoc { key: "shard_drop_last", values: "bool", default: "false", meaning: "distributed: drop the tail instead of padding every rank to the same length" },
    OptionDoc { key: "replacement", values: "bool", default: "false", meaning: "`RandomSampler(replacement=True)`" },
    OptionDoc { key: "num_samples", values: "integer ≥ 1", default: "dataset size", meaning: "samples per epoch of the random and weighted samplers; of an iterable source, the epoch's total over all ranks (each rank delivers `ceil(N / world_size)`, wrapping its stream around if short)" },
    OptionDoc { key: "weights", values: "`w0,w1,...` (finite, ≥ 0)", default: "none", meaning: "`WeightedRandomSampler` (with replacement)" },
    OptionDoc { key: "subset", values: "`3,5,9` or `0..1000`, mixed", default: "none", meaning: "`SubsetRandomSampler`: these indices, shuffled every epoch" },
    OptionDoc { key: "indices", values: "`3,5,9` or `0..1000`, mixed", default: "none", meaning: "these indices in this order every epoch (a torch `sampler=` given as a sequence)" },
    OptionDoc { key: "transform", values: "e.g. `random_resized_crop(224) \\| hflip \\| normalize(imagenet)`", default: "none", meaning: "operations separated by `\\|`, torchvision v2 semantics: `resize`, `center_crop`, `random_resized_crop`, `random_crop`, `hflip`, `vflip`, `color_jitter`, `grayscale`, `gaussian_blur`, `rotate`, `affine`, `rand_augment`, `trivial_augment`, `auto_augment(imagenet)`, `random_erasing`, `normalize`, and batch-level `mixup`, `cutmix` (`label` becomes float32 `[B, N]`) (see docs/transforms.md); run fused, per sample, into the batch slot; a bad spec is an error naming the operation and argument" },
    OptionDoc { key: "dtype", values: "`uint8`, `float32`, `float16`, `bfloat16`", default: "float32 after normalize, else uint8", meaning: "image output element type (other tensors are delivered as stored; image-shaped uint8 tensors are images, see `input_layout`)" },
    OptionDoc { key: "layout", values: "`nchw`, `nhwc`", default: "nchw", meaning: "image batch layout" },
    OptionDoc { key: "input_layout", values: "`hwc`, `chw`", default: "`hwc` if the last dimension is 3, else `chw` if the first is", meaning: "how an image-shaped uint8 tensor field (npy, tar `npy`, packed tensor fields, callbacks) is stored, so that `transform`, `dtype` and `layout` apply to it as to decoded images; its size is known, so `dtype` or `layout` alone converts it and the transform need not fix a size; from callbacks, when the transform fixes the output size, its size may vary from sample to sample" },
    OptionDoc { key: "pin_memory", values: "bool", default: "true with cuda", meaning: "page-locked batch memory: registered with the CUDA driver where one is present (what torch calls pinned: `is_pinned()`, asynchronous `.cuda(non_blocking=True)`), else `mlock`; on cuda, registered with the loader's device" },
    OptionDoc { key: "device", values: "`cpu`, `cuda`, `cuda:N`", default: "cpu", meaning: "where batches are delivered (CUDA prefetch); `cuda` is `cuda:LOCAL_RANK` (the rank on this node)" },
    OptionDoc { key: "cuda_stream", values: "a CUstream, decimal or `0x` hex", default: "the loader's own", meaning: "device=cuda: copy on the caller's stream (borrowed, never destroyed)" },
    OptionDoc { key: "on_error", values: "`raise`, `skip`", default: "raise", meaning: "bad sample: an error naming it, or a deterministic replacement counted in stats" },
    OptionDoc { key: "timeout_ms", values: "integer ≥ 0", default: "0 (none)", meaning: "longest wait for one batch" },
    OptionDoc { key: "resume_state", values: "a string from `save_state`", default: "none", meaning: "continue exactly where a saved job stopped, at any world size (a streaming loader's state: at the same world size only, by replay); an error names what differs if the source, sampler, batch_size, drop_last or transform changed" },
    OptionDoc { key: "pad", values: "a finite number", default: "none", meaning: "pad ragged fields to the batch's longest, with a `<name>_lengths` field" },
    OptionDoc { key: "max_image_pixels", values: "integer ≥ 1", default: "89478485", meaning: "larger images are bad samples (decompression bombs), refused before allocating" },
    OptionDoc { key: "jpeg_decoder", values: "`auto`, `zune`, `turbo`", default: "`auto` (or `STOKER_JPEG_DECODER`)", meaning: "`turbo`: libjpeg-turbo decodes only the rows and columns a crop reads, shrinking in the DCT domain when the crop is at least twice the output; `zune`: zune-jpeg (pure Rust) decodes whole images; `auto`: `turbo` when it was built with SIMD, else `zune`. CMYK/YCCK JPEGs always go to zune-jpeg; stats count each path (`decoded_*`)" },
    OptionDoc { key: "memory_budget", values: "bytes (`8GiB`, `500MB`) or `N%` of physical memory", default: "50% of physical memory (or the cgroup limit) ÷ `LOCAL_WORLD_SIZE`", meaning: "bound on the batch memory the loader keeps (in flight and idle): a batch that cannot fit is an error when the loader is made; the in-flight cap is lowered to fit (stats `in_flight_cap`); with `device=cuda` it also holds the device buffers the ring grows by while the trainer holds every one" },
    OptionDoc { key: "autotune", values: "bool", default: "false", meaning: "live control of the worker count (from 1 with `num_workers=auto`, never beyond the usable cores) and the prefetch depth (up to 8), within the memory budget; every decision is in stats (`autotune_decisions`, `num_workers`, `prefetch_factor`) and the trace" },
    OptionDoc { key: "trace", values: "a file path", default: "none", meaning: "write a Chrome trace-event JSON timeline (Perfetto, chrome://tracing) of every worker's stages, the device copies and the consumer's waits; keeps the last 1024 batches of each thread; written when the loader is dropped" },
    OptionDoc { key: "shuffle_buffer", values: "integer 0..=16777216", default: "0", meaning: "tar: 0 = indexed (random access, every sampler); N ≥ 1 = streaming: shards shuffled per (seed, epoch), split across ranks into equal runs, read sequentially through a seeded buffer of N samples; iterable sources: a buffer of N samples (0: stream order)" },
    OptionDoc { key: "order", values: "`random`, `quasi_random`", default: "`random`", meaning: "with `shuffle=true`: `quasi_random` is a page-aware shuffle for packed data larger than RAM: pages shuffled, then samples shuffled within windows of 32 pages (64 MiB at the default page size); deterministic and resumable like `random`. The packed files are advised (`madvise`) for the order: sequential, random or read-ahead per page" },
    OptionDoc { key: "fields", values: "`EXT:NAME,...` (`jpg;png:image,cls:label,txt:caption`)", default: "image + label", meaning: "tar: members to deliver and their field names; `jpg`/`jpeg`/`png` are decoded images, `cls`/`label`/`index` int64, `npy` tensors, anything else raw bytes (uint8, padded with 0, with `NAME_lengths`)" },
    OptionDoc { key: "shard_prefetch", values: "integer 0..=64", default: "2", meaning: "tar or packed with URLs (`s3://`, `gs://`, `az://`, `https://`): remote shards downloaded at once while the loader opens; streaming from a `wids` index (`tar:URL.json`): shards downloading ahead of the one being read (0 is taken as 1)" },
    OptionDoc { key: "cache_dir", values: "a directory path", default: "none (a private temporary directory, removed when the loader closes)", meaning: "local cache of remote shards, shared safely by the ranks of a node (file locks; each shard downloaded once); a later loader checks each cached shard's size and ETag with one HEAD request and reads it locally" },
    OptionDoc { key: "cache_limit", values: "bytes (`500GB`, `64GiB`)", default: "unlimited", meaning: "cache_dir: least recently used shards not in use by any loader are removed after a download, down to this size" },
];

/// Every key [`LoaderOptions::set`] accepts, in [`OPTIONS`] order.
pub fn keys() -> impl Iterator<Item = &'static str> {
    OPTIONS.iter().map(|o| o.key)
}

/// [`OPTIONS`] as a Markdown table, as `docs/options.md` shows it.
pub fn options_markdown() -> String {
    let mut out = String::from("| key | values | default | meaning |\n|---|---|---|---|\n");
    for o in OPTIONS {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            o.key, o.values, o.default, o.meaning
        ));
    }
    out
}

impl LoaderOptions {
    /// Options at their defaults, with no source.
    pub fn new() -> LoaderOptions {
        LoaderOptions::default()
    }

    /// [`set`](Self::set) for chaining: `LoaderOptions::new().with("batch_size", "64")?`.
    pub fn with(mut self, key: &str, value: &str) -> Result<LoaderOptions> {
        self.set(key, value)?;
        Ok(self)
    }

    /// The source, when it is made in code: a [`Source`] of your own or a callback source.
    pub fn set_source(&mut self, source: SourceSpec) {
        self.source = Some(source);
    }

    /// [`set_source`](Self::set_source) for chaining.
    pub fn with_source(mut self, source: SourceSpec) -> LoaderOptions {
        self.set_source(source);
        self
    }

    /// With `device=cuda`: the caller's `CUstream` (as an address) to copy on (the option
    /// `cuda_stream`).
    pub fn set_cuda_stream(&mut self, stream: usize) {
        self.cuda_stream = Some(stream);
    }

    /// Chooses the sampler explicitly instead of from the keys; checked against the dataset
    /// when the loader is made.
    pub fn set_sampler(&mut self, kind: SamplerKind) {
        self.sampler = Some(kind);
    }

    /// The source set in code or by the `source` key, if any.
    pub fn source(&self) -> Option<&SourceSpec> {
        self.source.as_ref()
    }

    /// Samples per batch (option `batch_size`).
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The seed all order and augmentation randomness derives from (option `seed`).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Where batches are delivered (option `device`).
    pub fn device(&self) -> Device {
        self.device
    }

    /// The shuffle order (option `order`).
    pub fn order(&self) -> Order {
        self.order
    }

    /// What a bad sample does (option `on_error`).
    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    /// Batches in flight per worker (option `prefetch_factor`).
    pub fn prefetch_factor(&self) -> usize {
        self.prefetch_factor
    }

    /// Longest wait for one batch in milliseconds, 0 for none (option `timeout_ms`).
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    /// The caller's `CUstream` as an address, if one was given (option `cuda_stream`).
    pub fn cuda_stream(&self) -> Option<usize> {
        self.cuda_stream
    }

    /// Sets one option from its string form, validating it.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let v = value.trim();
        match key {
            "source" => {
                self.source = Some(if let Some(p) = v.strip_prefix("npy:") {
                    SourceSpec::Npy(non_empty_path(key, p)?)
                } else if let Some(p) = v.strip_prefix("image_folder:") {
                    SourceSpec::ImageFolder(non_empty_path(key, p)?)
                } else if let Some(p) = v.strip_prefix("tar:") {
                    // Expanded (and checked) when the loader opens the shards: a pattern may
                    // name shards that do not exist yet.
                    if p.is_empty() {
                        return Err(Error::option(key, "the shard pattern is empty"));
                    }
                    SourceSpec::Tar(p.to_owned())
                } else if let Some(p) = v.strip_prefix("packed:") {
                    if p.is_empty() {
                        return Err(Error::option(key, "the packed path is empty"));
                    }
                    SourceSpec::Packed(p.to_owned())
                } else {
                    return Err(Error::option(
                        key,
                        format!("`{v}` is not a source; expected npy:PATH, image_folder:ROOT, tar:PATTERN or packed:PATH"),
                    ));
                })
            }
            "labels" => {
                let p = v.strip_prefix("npy:").ok_or_else(|| {
                    Error::option(
                        key,
                        format!("`{v}` is not a labels source; expected npy:PATH"),
                    )
                })?;
                self.labels = Some(non_empty_path(key, p)?);
            }
            "batch_size" => self.batch_size = parse_int(key, v, 1, 1 << 24)? as usize,
            "shuffle" => self.shuffle = parse_bool(key, v)?,
            "seed" => self.seed = parse_int(key, v, 0, u64::MAX)?,
            "drop_last" => self.drop_last = parse_bool(key, v)?,
            "num_workers" => {
                self.num_workers = if v == "auto" {
                    None
                } else {
                    Some(parse_int(key, v, 0, 1024)? as usize)
                }
            }
            "prefetch_factor" => self.prefetch_factor = parse_int(key, v, 1, 1024)? as usize,
            "in_order" => self.in_order = parse_bool(key, v)?,
            "rank" => self.rank = parse_auto(key, v, 0)?,
            "world_size" => self.world_size = parse_auto(key, v, 1)?,
            "shard_drop_last" => self.shard_drop_last = parse_bool(key, v)?,
            "replacement" => self.replacement = parse_bool(key, v)?,
            "num_samples" => self.num_samples = Some(parse_int(key, v, 1, u64::MAX)? as usize),
            "weights" => {
                let weights = v
                    .split(',')
                    .map(|w| {
                        w.trim()
                            .parse::<f64>()
                            .ok()
                            .filter(|w| w.is_finite() && *w >= 0.0)
                            .ok_or_else(|| {
                                Error::option(key, format!("`{w}` is not a finite weight >= 0"))
                            })
                    })
                    .collect::<Result<Vec<_>>>()?;
                self.weights = Some(weights);
            }
            "subset" => self.subset = Some(parse_indices(key, v)?),
            "indices" => self.indices = Some(parse_indices(key, v)?),
            "transform" => {
                self.transform = if v.is_empty() {
                    None
                } else {
                    Some(v.to_owned())
                }
            }
            "dtype" => self.dtype = Some(v.parse().map_err(|e| Error::option(key, e))?),
            "layout" => self.layout = v.parse().map_err(|e| Error::option(key, e))?,
            "input_layout" => {
                self.input_layout = Some(match v {
                    "hwc" => InputLayout::Hwc,
                    "chw" => InputLayout::Chw,
                    _ => return Err(Error::option(key, format!("`{v}` is not hwc or chw"))),
                })
            }
            "pin_memory" => self.pin_memory = Some(parse_bool(key, v)?),
            "device" => {
                self.cuda_local = v == "cuda";
                self.device = match v {
                    "cpu" => Device::Cpu,
                    "cuda" => Device::Cuda(0),
                    _ => match v.strip_prefix("cuda:").map(str::parse::<u32>) {
                        Some(Ok(n)) => Device::Cuda(n),
                        _ => {
                            return Err(Error::option(
                                key,
                                format!("`{v}` is not a device; expected cpu, cuda or cuda:N"),
                            ))
                        }
                    },
                }
            }
            "cuda_stream" => {
                let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
                    Some(hex) => usize::from_str_radix(hex, 16),
                    None => v.parse::<usize>(),
                };
                self.cuda_stream = Some(parsed.map_err(|_| {
                    Error::option(
                        key,
                        format!("`{v}` is not a stream address; expected a CUstream as decimal or 0x-prefixed hex"),
                    )
                })?);
            }
            "order" => {
                self.order = match v {
                    "random" => Order::Random,
                    "quasi_random" => Order::QuasiRandom,
                    _ => {
                        return Err(Error::option(
                            key,
                            format!("`{v}` is not an order; expected random or quasi_random"),
                        ))
                    }
                }
            }
            "on_error" => {
                self.on_error = match v {
                    "raise" => OnError::Raise,
                    "skip" => OnError::Skip,
                    _ => {
                        return Err(Error::option(
                            key,
                            format!("`{v}` is not a policy; expected raise or skip"),
                        ))
                    }
                }
            }
            "timeout_ms" => self.timeout_ms = parse_int(key, v, 0, u64::MAX / 1_000_000)?,
            "resume_state" => {
                crate::resume::ResumeState::parse(v)?;
                self.resume_state = Some(v.to_owned());
            }
            "pad" => {
                let pad = v.parse::<f64>().ok().filter(|p| p.is_finite());
                self.pad =
                    Some(pad.ok_or_else(|| {
                        Error::option(key, format!("`{v}` is not a finite number"))
                    })?);
            }
            "max_image_pixels" => self.max_image_pixels = parse_int(key, v, 1, u64::MAX)?,
            "jpeg_decoder" => {
                self.jpeg_decoder =
                    Some(JpegDecoder::parse(v).map_err(|reason| Error::option(key, reason))?)
            }
            "memory_budget" => self.memory_budget = Some(MemoryBudget::parse(key, v)?),
            "autotune" => self.autotune = parse_bool(key, v)?,
            "trace" => {
                self.trace = if v.is_empty() {
                    None
                } else {
                    Some(PathBuf::from(v))
                }
            }
            "shuffle_buffer" => self.shuffle_buffer = parse_int(key, v, 0, 1 << 24)? as usize,
            "fields" => self.fields = Some(crate::source::tar::parse_fields(v)?),
            "shard_prefetch" => self.shard_prefetch = parse_int(key, v, 0, 64)? as usize,
            "cache_dir" => {
                self.cache_dir = if v.is_empty() {
                    None
                } else {
                    Some(PathBuf::from(v))
                }
            }
            "cache_limit" => {
                let bytes: bytesize::ByteSize = v.parse().map_err(|e| {
                    Error::option(
                        key,
                        format!("`{v}` is not a size such as 500GB or 64GiB: {e}"),
                    )
                })?;
                self.cache_limit = Some(bytes.as_u64());
            }
            _ => {
                return Err(Error::InvalidOption {
                    key: key.to_owned(),
                    reason: format!(
                        "unknown option; known options are {}",
                        keys().collect::<Vec<_>>().join(", ")
                    ),
                })
            }
        }
        Ok(())
    }

    /// This process's place in the job: explicit `rank` / `world_size`, or the launcher's
    /// variables for `auto` (see [`crate::launch`]).
    pub fn launch(&self) -> Result<Launch> {
        crate::launch::resolve(self.rank, self.world_size)
    }

    /// Workers to start: `num_workers`, or for `auto` the cores of this process's affinity
    /// mask divided by the ranks on this node (at least 1). Variables that do not resolve count
    /// as one process here; making the loader reports them.
    pub fn resolved_workers(&self) -> usize {
        self.workers_for(&self.launch().unwrap_or(Launch::SINGLE))
    }

    /// [`resolved_workers`](Self::resolved_workers) for a resolved launch.
    pub fn workers_for(&self, launch: &Launch) -> usize {
        self.num_workers
            .unwrap_or_else(|| (usable_cores() / launch.local_world_size.max(1)).max(1))
    }

    /// The memory budget in bytes: `memory_budget`, or the default (see [`crate::memory`]).
    pub fn resolved_memory_budget(&self) -> u64 {
        self.memory_budget
            .map_or_else(crate::memory::default_budget, MemoryBudget::bytes)
    }

    /// Batches in flight at most: `max(1, num_workers) × prefetch_factor`.
    pub fn in_flight_cap(&self) -> usize {
        self.cap_for(self.resolved_workers())
    }

    /// The in-flight cap for `workers` workers.
    pub fn cap_for(&self, workers: usize) -> usize {
        workers.max(1) * self.prefetch_factor
    }

    /// The device batches go to: `cuda` without an ordinal is `cuda:LOCAL_RANK`.
    pub fn device_for(&self, launch: &Launch) -> Device {
        match self.device {
            Device::Cuda(_) if self.cuda_local => {
                Device::Cuda(u32::try_from(launch.local_rank).unwrap_or(u32::MAX))
            }
            other => other,
        }
    }

    /// How the global order is dealt to the ranks of `launch`.
    pub fn deal(&self, launch: &Launch) -> RankShare {
        RankShare::of(launch, self.shard_drop_last)
    }

    /// The sampler of `source` these options select ([`sampler_kind`](Self::sampler_kind)),
    /// with `order=quasi_random` applied to a shuffle of a paged source; tells the source how
    /// it will be read (`madvise` for packed files).
    pub(crate) fn sampler_kind_for(&self, source: &dyn Source) -> Result<SamplerKind> {
        let mut kind = self.sampler_kind(source.len())?;
        if self.order == Order::QuasiRandom {
            kind = match kind {
                SamplerKind::Random {
                    replacement: false,
                    num_samples: None,
                } => SamplerKind::QuasiRandom {
                    pages: source.pages().ok_or_else(|| {
                        Error::option(
                            "order",
                            "quasi_random applies to page-organised sources (packed:PATH)",
                        )
                    })?,
                    window: QUASI_RANDOM_WINDOW_PAGES,
                },
                _ => {
                    return Err(Error::option(
                        "order",
                        "quasi_random shuffles: it needs shuffle=true, without replacement, num_samples, weights, subset or indices",
                    ))
                }
            };
        }
        source.advise(match &kind {
            SamplerKind::Sequential | SamplerKind::Indices { .. } => Access::Sequential,
            SamplerKind::QuasiRandom { .. } => Access::PageWindows,
            _ => Access::Random,
        });
        Ok(kind)
    }

    /// The sampler of the global order these options select: an explicit one, else weights →
    /// weighted, subset → subset-random, indices → that order, shuffle → random, otherwise
    /// sequential. Under world_size > 1 it is dealt to the ranks ([`deal`](Self::deal)).
    pub fn sampler_kind(&self, dataset_len: usize) -> Result<SamplerKind> {
        if let Some(kind) = &self.sampler {
            return Ok(kind.clone());
        }
        let chosen = [
            self.weights.is_some(),
            self.subset.is_some(),
            self.indices.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if chosen > 1 {
            return Err(Error::option(
                "sampler",
                "weights, subset and indices each select a sampler; set only one",
            ));
        }
        if self.indices.is_some() && (self.shuffle || self.replacement) {
            return Err(Error::option(
                "indices",
                "gives the order itself: it cannot be combined with shuffle or replacement",
            ));
        }
        Ok(if let Some(weights) = &self.weights {
            SamplerKind::WeightedRandom {
                weights: weights.clone(),
                num_samples: self.num_samples.unwrap_or(dataset_len),
                replacement: true,
            }
        } else if let Some(ranges) = &self.subset {
            SamplerKind::SubsetRandom {
                indices: materialize_subset("subset", ranges, dataset_len)?,
            }
        } else if let Some(ranges) = &self.indices {
            SamplerKind::Indices {
                indices: materialize_subset("indices", ranges, dataset_len)?,
            }
        } else if self.shuffle || self.replacement || self.num_samples.is_some() {
            SamplerKind::Random {
                replacement: self.replacement,
                num_samples: self.num_samples,
            }
        } else {
            SamplerKind::Sequential
        })
    }
}

/// A loader's source once opened: map-style (read by index) or a stream.
pub(crate) enum OpenedSource {
    Indexed(Arc<dyn Source>),
    Stream(Arc<dyn StreamSource>),
}

/// What opening a source found: the source, and the damaged tar shards `on_error=skip` passes
/// over (each counts as one skipped sample).
pub(crate) struct Opened {
    pub source: OpenedSource,
    pub damaged: Vec<String>,
}

impl LoaderOptions {
    /// Whether these options make a streaming loader: tar shards with `shuffle_buffer ≥ 1`, or
    /// an iterable source.
    pub fn is_streaming(&self) -> bool {
        match &self.source {
            Some(SourceSpec::Tar(_)) => self.shuffle_buffer > 0,
            Some(SourceSpec::Iterable(_)) => true,
            _ => false,
        }
    }

    /// How tar shards are read under these options.
    pub(crate) fn tar_config(&self) -> TarConfig {
        TarConfig {
            fields: self.fields.clone(),
            pad: self.pad.is_some(),
            skip_damaged: self.on_error == OnError::Skip,
            remote: crate::source::remote::RemoteConfig {
                shard_prefetch: self.shard_prefetch,
                cache_dir: self.cache_dir.clone(),
                cache_limit: self.cache_limit,
            },
            ..TarConfig::default()
        }
    }

    /// Opens the source. A stream (tar with `shuffle_buffer ≥ 1`, an iterable source) is opened
    /// for this rank; an iterable's stream of `epoch` is opened (continuing from `resume`, a
    /// state it saved after `given` samples) to learn the fields from its first sample.
    pub(crate) fn open_source(
        &self,
        seed: u64,
        epoch: u64,
        resume: Option<&str>,
        given: u64,
    ) -> Result<Opened> {
        let spec = self.source.as_ref().ok_or_else(|| {
            Error::option("source", "required, e.g. npy:PATH or image_folder:ROOT")
        })?;
        let is_tar = matches!(spec, SourceSpec::Tar(_));
        if self.fields.is_some() && !is_tar {
            return Err(Error::option("fields", "applies to tar sources only"));
        }
        let streaming = self.is_streaming();
        if self.shuffle_buffer > 0 && !streaming {
            return Err(Error::option(
                "shuffle_buffer",
                "applies to tar and iterable sources only",
            ));
        }
        if streaming {
            self.check_stream_keys(matches!(spec, SourceSpec::Iterable(_)))?;
        }
        // Streams are split by the resolved launch, as the indexed samplers are dealt.
        let launch = self.launch()?;
        let share = self.deal(&launch);
        Ok(match spec {
            SourceSpec::Tar(pattern) if streaming => {
                let stream = TarStream::open_pattern(pattern, self.tar_config(), share, seed)?;
                let damaged = stream.damaged().to_vec();
                Opened {
                    source: OpenedSource::Stream(Arc::new(stream)),
                    damaged,
                }
            }
            SourceSpec::Tar(pattern) => {
                let source = TarSource::open_pattern(pattern, self.tar_config())?;
                let damaged = source.damaged().to_vec();
                Opened {
                    source: OpenedSource::Indexed(Arc::new(source)),
                    damaged,
                }
            }
            SourceSpec::Iterable(iterable) => {
                share.check("rank")?;
                let stream = IterableStream::new(
                    Arc::clone(iterable),
                    share,
                    seed,
                    epoch,
                    resume,
                    given,
                    self.num_samples,
                    self.field_rules(),
                )?;
                Opened {
                    source: OpenedSource::Stream(Arc::new(stream)),
                    damaged: Vec::new(),
                }
            }
            SourceSpec::Packed(path) if self.labels.is_none() => Opened {
                source: OpenedSource::Indexed(Arc::new(PackedSource::open_with(
                    path,
                    &self.tar_config().remote,
                )?)),
                damaged: Vec::new(),
            },
            other => Opened {
                source: OpenedSource::Indexed(
                    other.open_with(self.labels.as_deref(), self.field_rules())?,
                ),
                damaged: Vec::new(),
            },
        })
    }

    /// Keys that choose a sampler have no meaning for a stream, which is read in order.
    fn check_stream_keys(&self, iterable: bool) -> Result<()> {
        for (key, set) in [
            ("weights", self.weights.is_some()),
            ("subset", self.subset.is_some()),
            ("replacement", self.replacement),
            ("sampler", self.sampler.is_some()),
            ("num_samples", self.num_samples.is_some() && !iterable),
            ("order", self.order != Order::Random),
        ] {
            if set {
                return Err(Error::option(
                    key,
                    if iterable {
                        "does not apply to an iterable source, which is read in order".to_owned()
                    } else {
                        "applies to indexed tar shards (shuffle_buffer=0) only: streaming reads shards in order".to_owned()
                    },
                ));
            }
        }
        Ok(())
    }

    /// The shuffle buffer of a streaming loader.
    pub fn shuffle_buffer(&self) -> usize {
        self.shuffle_buffer
    }
}

impl LoaderOptions {
    /// What the fields of a callback or iterable source may be: ragged under `pad`, and
    /// image-shaped uint8 tensors of varying size when the transform fixes the output size
    /// (a pipeline for encoded images, whose size varies too, can be built).
    fn field_rules(&self) -> FieldRules {
        FieldRules {
            pad: self.pad.is_some(),
            input_layout: self.input_layout,
            images_vary: self.transform.is_some()
                && Pipeline::new(self.transform.as_deref(), self.dtype, self.layout).is_ok(),
        }
    }

    /// The image stages (decode limits and transform) for a source of `fields`: `None` for a
    /// source with no encoded-image field, where `transform`, `dtype` and `layout` are errors.
    pub fn image_stages(&self, fields: &[FieldSpec]) -> Result<Option<ImageStages>> {
        let options = self;
        let has_images = fields.iter().any(|f| f.kind == FieldKind::EncodedImage);
        let tensor_images = fields
            .iter()
            .filter(|f| tensor_image_shape(f, options.input_layout).is_some())
            .count();
        let wants_pixels = options.transform.is_some()
            || options.dtype.is_some()
            || options.layout != Layout::Nchw;
        if !has_images && (tensor_images == 0 || !wants_pixels) {
            // Tensors are delivered as stored unless an image-shaped uint8 field is asked to be
            // transformed: a conversion here would be a second copy a caller should see.
            for (key, set) in [
                ("transform", options.transform.is_some()),
                ("dtype", options.dtype.is_some()),
                ("layout", options.layout != Layout::Nchw),
            ] {
                if set {
                    return Err(Error::option(
                        key,
                        "applies to images: encoded image fields, or uint8 tensor fields of \
                         shape [H, W, 3] or [3, H, W] (see input_layout); this source has none",
                    ));
                }
            }
            return Ok(None);
        }
        if let Some(dtype @ (DType::I32 | DType::I64)) = options.dtype {
            return Err(Error::option(
                "dtype",
                format!("images can be uint8, float32, float16 or bfloat16, not {dtype}"),
            ));
        }
        // Encoded images vary in size, so their pipeline must fix it; image-shaped tensors get a
        // pipeline each, built by collate for their known size (which checks the spec too).
        let pipeline = if has_images {
            let p = Pipeline::new(options.transform.as_deref(), options.dtype, options.layout)
                .map_err(|reason| Error::option("transform", reason))?;
            Some(Arc::new(p))
        } else {
            None
        };
        let jpeg_decoder = match options.jpeg_decoder {
            Some(d) => d,
            // The environment picks the decoder of every loader that does not say, so a test
            // suite or a job can run on the other decoder unchanged.
            None => match std::env::var("STOKER_JPEG_DECODER") {
                Ok(v) => JpegDecoder::parse(&v).map_err(|reason| {
                    Error::option(
                        "jpeg_decoder",
                        format!("from STOKER_JPEG_DECODER: {reason}"),
                    )
                })?,
                Err(_) => JpegDecoder::Auto,
            },
        };
        Ok(Some(ImageStages {
            max_pixels: options.max_image_pixels,
            jpeg_decoder,
            input_layout: options.input_layout,
            pipeline,
            transform: options.transform.clone(),
            dtype: options.dtype,
            layout: options.layout,
        }))
    }
}

fn non_empty_path(key: &str, p: &str) -> Result<PathBuf> {
    if p.is_empty() {
        return Err(Error::option(key, "the path is empty"));
    }
    Ok(PathBuf::from(p))
}

fn parse_bool(key: &str, v: &str) -> Result<bool> {
    match v {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(Error::option(
            key,
            format!("`{v}` is not a boolean; expected true or false"),
        )),
    }
}

fn parse_int(key: &str, v: &str, min: u64, max: u64) -> Result<u64> {
    let n: u64 = v
        .parse()
        .map_err(|_| Error::option(key, format!("`{v}` is not a non-negative integer")))?;
    if n < min || n > max {
        return Err(Error::option(
            key,
            format!("{n} is out of range [{min}, {max}]"),
        ));
    }
    Ok(n)
}

/// `auto` (or its alias `env`): `None`, resolved from the launcher when the loader is made.
fn parse_auto(key: &str, v: &str, min: u64) -> Result<Option<usize>> {
    if v == "auto" || v == "env" {
        return Ok(None);
    }
    Ok(Some(parse_int(key, v, min, 1 << 20)? as usize))
}

/// `3,5,9` or ranges `0..100` (end exclusive), mixed; kept as ranges (see `subset`).
fn parse_indices(key: &str, v: &str) -> Result<Vec<std::ops::Range<usize>>> {
    let mut out = Vec::new();
    for part in v.split(',').map(str::trim) {
        let bad = || Error::option(key, format!("`{part}` is not an index or a range a..b"));
        if let Some((a, b)) = part.split_once("..") {
            let a: usize = a.trim().parse().map_err(|_| bad())?;
            let b: usize = b.trim().parse().map_err(|_| bad())?;
            if b < a {
                return Err(Error::option(
                    key,
                    format!("`{part}` is an empty range (end < start)"),
                ));
            }
            out.push(a..b);
        } else {
            let i: usize = part.parse().map_err(|_| bad())?;
            out.push(i..i.saturating_add(1));
        }
    }
    Ok(out)
}

/// The subset's indices, once every one is known to be inside the dataset and the list fits
/// in memory.
fn materialize_subset(
    key: &str,
    ranges: &[std::ops::Range<usize>],
    dataset_len: usize,
) -> Result<Vec<usize>> {
    if let Some(r) = ranges.iter().find(|r| r.end > dataset_len) {
        let i = if r.end - r.start == 1 {
            r.start
        } else {
            r.end - 1
        };
        return Err(Error::option(
            key,
            format!("index {i} is out of range for a dataset of {dataset_len} samples"),
        ));
    }
    let count = ranges
        .iter()
        .try_fold(0usize, |n, r| n.checked_add(r.len()))
        .unwrap_or(usize::MAX);
    crate::sampler::check_order_size(key, count)?;
    Ok(ranges.iter().flat_map(|r| r.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_contract() {
        let o = LoaderOptions::default();
        assert_eq!(o.batch_size, 1);
        assert!(!o.shuffle && !o.drop_last && o.in_order);
        assert_eq!(o.prefetch_factor, 2);
        assert_eq!(o.num_workers, None);
        assert_eq!((o.rank, o.world_size), (None, None), "auto");
        assert_eq!(o.device, Device::Cpu);
        assert_eq!(o.on_error, OnError::Raise);
        assert_eq!(o.timeout_ms, 0);
    }

    #[test]
    fn cuda_stream_takes_a_decimal_or_hex_address() {
        let mut o = LoaderOptions::new();
        o.set("cuda_stream", "0x7f00aa").unwrap();
        assert_eq!(o.cuda_stream, Some(0x7f00aa));
        o.set("cuda_stream", "0").unwrap();
        assert_eq!(o.cuda_stream, Some(0));
        let err = o.set("cuda_stream", "stream").unwrap_err();
        assert!(err.to_string().starts_with("option `cuda_stream`"), "{err}");
        assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn sets_every_documented_key() {
        let mut o = LoaderOptions::default();
        for (k, v) in [
            ("source", "npy:/data/x.npy"),
            ("labels", "npy:/data/y.npy"),
            ("batch_size", "64"),
            ("shuffle", "true"),
            ("seed", "18446744073709551615"),
            ("drop_last", "1"),
            ("num_workers", "3"),
            ("prefetch_factor", "4"),
            ("in_order", "false"),
            ("rank", "1"),
            ("world_size", "4"),
            ("transform", "hflip"),
            ("dtype", "bfloat16"),
            ("layout", "nhwc"),
            ("pin_memory", "true"),
            ("device", "cuda:1"),
            ("on_error", "skip"),
            ("timeout_ms", "1500"),
            ("pad", "-1"),
        ] {
            o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
        }
        assert_eq!(o.batch_size, 64);
        assert_eq!(o.seed, u64::MAX);
        assert_eq!(o.num_workers, Some(3));
        assert_eq!(o.in_flight_cap(), 12);
        assert_eq!(o.dtype, Some(DType::BF16));
        assert_eq!(o.layout, Layout::Nhwc);
        assert_eq!(o.device, Device::Cuda(1));
        assert_eq!(o.pad, Some(-1.0));
        assert!(matches!(
            o.sampler_kind(10).unwrap(),
            SamplerKind::Random {
                replacement: false,
                num_samples: None
            }
        ));
        let launch = o.launch().unwrap();
        assert_eq!((launch.rank, launch.world_size), (1, 4));
        assert_eq!(
            o.deal(&launch),
            RankShare {
                rank: 1,
                world_size: 4,
                drop_last: false
            }
        );
        o.set("num_workers", "auto").unwrap();
        assert!(o.resolved_workers() >= 1);
    }

    #[test]
    fn bad_keys_and_values_name_the_key() {
        let mut o = LoaderOptions::default();
        for (k, v, needle) in [
            ("batch_sise", "4", "unknown option"),
            ("batch_size", "0", "out of range"),
            ("batch_size", "-3", "not a non-negative integer"),
            ("shuffle", "maybe", "not a boolean"),
            ("source", "csv:/x", "not a source"),
            ("source", "npy:", "path is empty"),
            ("dtype", "float64", "unknown dtype"),
            ("device", "tpu", "not a device"),
            ("on_error", "ignore", "not a policy"),
            ("prefetch_factor", "0", "out of range"),
            ("weights", "1,-2", "not a finite weight"),
            ("subset", "1,x", "not an index"),
            ("pad", "nan", "not a finite number"),
            ("resume_state", "garbage", "resume_state"),
        ] {
            let e = o.set(k, v).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("`{k}`")), "{k}={v}: {msg}");
            assert!(msg.contains(needle), "{k}={v}: {msg}");
        }
        assert_eq!(o.batch_size, 1, "a failed set leaves the old value");
    }

    #[test]
    fn sampler_selection() {
        let mut o = LoaderOptions::default();
        assert_eq!(o.sampler_kind(5).unwrap(), SamplerKind::Sequential);
        o.set("subset", "0..3,7").unwrap();
        assert_eq!(
            o.sampler_kind(10).unwrap(),
            SamplerKind::SubsetRandom {
                indices: vec![0, 1, 2, 7]
            }
        );
        o.set("weights", "1,2").unwrap();
        assert!(o.sampler_kind(2).is_err(), "two samplers selected");
        o.subset = None;
        o.set("num_samples", "5").unwrap();
        assert!(matches!(
            o.sampler_kind(2).unwrap(),
            SamplerKind::WeightedRandom {
                num_samples: 5,
                replacement: true,
                ..
            }
        ));
    }

    #[test]
    fn cuda_is_the_local_rank_and_auto_workers_share_the_node() {
        let launch = Launch {
            rank: 5,
            world_size: 8,
            local_rank: 1,
            local_world_size: 4,
            launcher: crate::launch::Launcher::Torchrun,
        };
        let mut o = LoaderOptions::default();
        o.set("device", "cuda").unwrap();
        assert_eq!(o.device_for(&launch), Device::Cuda(1));
        o.set("device", "cuda:3").unwrap();
        assert_eq!(
            o.device_for(&launch),
            Device::Cuda(3),
            "an explicit ordinal wins"
        );
        o.set("device", "cpu").unwrap();
        assert_eq!(o.device_for(&launch), Device::Cpu);
        let cores = usable_cores();
        assert_eq!(o.workers_for(&launch), (cores / 4).max(1));
        assert_eq!(o.workers_for(&Launch::SINGLE), cores);
        o.set("num_workers", "3").unwrap();
        assert_eq!(o.workers_for(&launch), 3, "an explicit count wins");
        for v in ["auto", "env"] {
            o.set("rank", v).unwrap();
            o.set("world_size", v).unwrap();
            assert_eq!((o.rank, o.world_size), (None, None));
        }
        assert!(o.set("world_size", "0").is_err());
        o.set("indices", "3,1,2").unwrap();
        o.set("shuffle", "true").unwrap();
        let e = o.sampler_kind(5).unwrap_err().to_string();
        assert!(e.contains("`indices`") && e.contains("shuffle"), "{e}");
        o.set("shuffle", "false").unwrap();
        assert_eq!(
            o.sampler_kind(5).unwrap(),
            SamplerKind::Indices {
                indices: vec![3, 1, 2]
            }
        );
    }
}
