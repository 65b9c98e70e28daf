//! Sources: the bytes (or views) of sample `i`.
//!
//! A source is read-only and shared by every worker: it is `Sync`, and a memory-mapped source
//! hands out views into one mapping instead of copies. Each sample is a fixed list of fields
//! (`data` and `label`, say) whose kinds the source declares once, up front.

mod callback;
pub mod coco;
mod image_folder;
mod iterable;
pub mod mapped;
mod memory;
mod npy;
pub mod packed;
#[cfg(feature = "parquet")]
pub mod parquet;
#[cfg(feature = "parquet")]
mod per_thread;
pub mod pixels;
pub mod remote;
mod segmentation_folder;
pub mod shards;
pub mod streaming;
pub mod tar;
pub mod tokens;

pub use self::tar::{TarConfig, TarSource, TarStream};
pub use callback::{
    CallbackSource, DeclaredFields, FieldRules, ReadFn, SampleWriter, IMAGE_FIELD, LABEL_FIELD,
};
pub use coco::CocoSource;
pub use image_folder::{ImageFolderSource, IMAGE_EXTENSIONS};
pub(crate) use iterable::IterableStream;
pub use iterable::{IterableSource, SampleStream, StreamInfo};
pub use memory::MemorySource;
pub use npy::{npy_bytes, npy_descr, npy_header, write_npy, NpyArray, NpySource};
pub use packed::PackedSource;
#[cfg(feature = "parquet")]
pub use parquet::ParquetSource;
pub use segmentation_folder::SegmentationFolderSource;
pub use tokens::{TokenConfig, TokenSource, TokenSpec};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The most fields a sample may have.
pub const MAX_FIELDS: usize = 8;

/// What one field of every sample looks like.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldKind {
    /// The same shape for every sample; stacked into `[N, shape...]`.
    Tensor {
        /// Element type.
        dtype: DType,
        /// Shape of one sample's value (`[]` for a scalar such as a label).
        shape: Vec<usize>,
    },
    /// A leading dimension that varies per sample (a sequence); padded to the longest in the
    /// batch, with a `<name>_lengths` field added.
    Ragged {
        /// Element type.
        dtype: DType,
        /// The dimensions after the varying leading one.
        inner_shape: Vec<usize>,
    },
    /// Encoded image bytes (JPEG or PNG), decoded and transformed into the batch slot.
    EncodedImage,
}

/// One named field of every sample.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldSpec {
    /// The field's name in the batch.
    pub name: String,
    /// What the field holds.
    pub kind: FieldKind,
}

/// `data uint8 [3, 32, 32]`, `tokens int32 [*, 4]` (ragged), `image encoded image`.
impl std::fmt::Display for FieldSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            FieldKind::Tensor { dtype, shape } => write!(f, "{} {dtype} {shape:?}", self.name),
            FieldKind::Ragged { dtype, inner_shape } => {
                write!(f, "{} {dtype} [*", self.name)?;
                inner_shape.iter().try_for_each(|d| write!(f, ", {d}"))?;
                f.write_str("]")
            }
            FieldKind::EncodedImage => write!(f, "{} encoded image", self.name),
        }
    }
}

/// `fields` in words, for messages and identities: `data uint8 [3, 32, 32], label int64 []`.
pub fn fields_text(fields: &[FieldSpec]) -> String {
    let words: Vec<String> = fields.iter().map(FieldSpec::to_string).collect();
    words.join(", ")
}

impl FieldSpec {
    /// A [`FieldKind::Tensor`] field of this element type and per-sample shape.
    pub fn tensor(name: &str, dtype: DType, shape: &[usize]) -> FieldSpec {
        FieldSpec {
            name: name.to_owned(),
            kind: FieldKind::Tensor {
                dtype,
                shape: shape.to_vec(),
            },
        }
    }

    /// A [`FieldKind::Ragged`] field of this element type and inner shape.
    pub fn ragged(name: &str, dtype: DType, inner_shape: &[usize]) -> FieldSpec {
        FieldSpec {
            name: name.to_owned(),
            kind: FieldKind::Ragged {
                dtype,
                inner_shape: inner_shape.to_vec(),
            },
        }
    }

    /// A [`FieldKind::EncodedImage`] field.
    pub fn encoded_image(name: &str) -> FieldSpec {
        FieldSpec {
            name: name.to_owned(),
            kind: FieldKind::EncodedImage,
        }
    }
}

/// Whether `name` can name a field: letters, digits and `_`, at least one (every face's
/// batches are keyed by it: a Python dict, a C string, a torch keyword).
pub fn is_field_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The raw bytes of one sample's fields, in the order of [`Source::fields`]. They borrow from
/// the source or from the worker's scratch buffer; nothing is allocated per sample.
#[derive(Clone, Copy, Debug)]
pub struct Sample<'a> {
    parts: [&'a [u8]; MAX_FIELDS],
    image_sizes: [Option<(u32, u32)>; MAX_FIELDS],
}

impl Default for Sample<'_> {
    fn default() -> Self {
        Sample {
            parts: [&[]; MAX_FIELDS],
            image_sizes: [None; MAX_FIELDS],
        }
    }
}

impl<'a> Sample<'a> {
    /// Sets field `field`'s bytes (`field < MAX_FIELDS`, else a panic).
    pub fn set(&mut self, field: usize, bytes: &'a [u8]) {
        self.parts[field] = bytes;
    }

    /// Field `field`'s bytes, empty if never set (`field < MAX_FIELDS`, else a panic).
    pub fn get(&self, field: usize) -> &'a [u8] {
        self.parts[field]
    }

    /// Records the width and height of the image in field `field` as the source stored them
    /// (a packed file's metadata table), so that its crop is planned without parsing the
    /// image's header. The decoder checks them against the image.
    pub fn set_image_size(&mut self, field: usize, width: u32, height: u32) {
        self.image_sizes[field] = Some((width, height));
    }

    /// The stored `(width, height)` of the image in field `field`, if the source knows it.
    pub fn image_size(&self, field: usize) -> Option<(u32, u32)> {
        self.image_sizes[field]
    }
}

/// How an epoch reads a source, for read-ahead hints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// In index order.
    Sequential,
    /// Uniformly shuffled: read-ahead would fetch neighbours that are not needed soon.
    Random,
    /// Page windows (`order=quasi_random`): whole pages are read, in a shuffled order.
    PageWindows,
}

/// A map-style dataset (PyTorch's `Dataset.__getitem__`).
pub trait Source: Send + Sync {
    /// Number of samples.
    fn len(&self) -> usize;

    /// Whether the source has no sample.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The fields of every sample (at most [`MAX_FIELDS`]).
    fn fields(&self) -> &[FieldSpec];

    /// Where sample `index` comes from, for error messages: a file path, `data.npy row 7`.
    fn describe(&self, index: usize) -> String;

    /// What the dataset is, for the fingerprint of a resume state: the same for the same data
    /// wherever it is mounted, different for different data. The default is the length and the
    /// fields; sources that can tell more (file names, a listing) say it.
    fn identity(&self) -> String {
        format!("{} samples of {}", self.len(), fields_text(self.fields()))
    }

    /// The data page each sample starts in (non-decreasing), for `order=quasi_random`; `None`
    /// for sources that are not page-organised.
    fn pages(&self) -> Option<Vec<u64>> {
        None
    }

    /// For a source that decompresses pages and keeps some of them for its readers
    /// (`parquet:`'s `parquet_cache`): the decompressed bytes of the pages an epoch reads, and
    /// the bytes of them it keeps. Shuffled over more than it keeps, most rows decompress their
    /// page again (`stoker doctor` then measures `order=quasi_random`). `None` for the others.
    fn page_cache(&self) -> Option<PageCacheFit> {
        None
    }

    /// How the loader will read the source (a hint a memory-mapped source passes to the
    /// kernel); the default ignores it.
    fn advise(&self, _access: Access) {}

    /// Reads sample `index` (`< len()`). Field bytes may borrow from the source (a memory map)
    /// or from `scratch`, a buffer the calling worker reuses for every sample it reads.
    fn read<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>>;

    /// Called after a batch's samples were read and copied: `Err` when the bytes read may not
    /// be the file's, because a mapped file was truncated while in use (see [`mapped`]). The
    /// default is `Ok`: sources that read through system calls see a short read instead.
    fn verify(&self) -> Result<()> {
        Ok(())
    }
}

/// A source's decompressed pages against the bytes of them it keeps ([`Source::page_cache`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCacheFit {
    /// The decompressed bytes of the compressed pages the source's fields are read from.
    pub pages: u64,
    /// The bytes of decompressed pages the source keeps.
    pub kept: u64,
}

/// Where samples come from.
#[derive(Clone)]
pub enum SourceSpec {
    /// `npy:PATH`.
    Npy(PathBuf),
    /// `image_folder:ROOT`: one subfolder per class (torchvision's ImageFolder layout).
    ImageFolder(PathBuf),
    /// `segmentation_folder:ROOT`: `ROOT/images/**/NAME.jpg` with its mask
    /// `ROOT/masks/**/NAME.png` (fields `image` and `mask`).
    SegmentationFolder(PathBuf),
    /// `coco:ANNOTATIONS` (`masks` false) or `coco_masks:ANNOTATIONS`: a COCO
    /// `instances_*.json` and its images (see [`coco`]).
    Coco {
        /// The annotation file.
        annotations: PathBuf,
        /// Whether samples have the semantic `mask` field.
        masks: bool,
    },
    /// A source built in code (the in-memory source, say).
    Custom(Arc<dyn Source>),
    /// The user's dataset through a read function (see [`crate::source::CallbackSource`]); the
    /// fields are learnt from sample 0 when the loader is made.
    Callback {
        /// Number of samples.
        len: usize,
        /// Reads one sample into a writer.
        read: Arc<ReadFn>,
    },
    /// `tar:PATTERN`: WebDataset shards, indexed (`shuffle_buffer=0`) or streamed.
    Tar(String),
    /// `packed:PATH`: stoker's packed format (a file, a dataset directory or index, or a
    /// pattern of shard files).
    Packed(String),
    /// The user's stream of samples with no length (see [`IterableSource`]); the fields are
    /// learnt from the first sample when the loader is made.
    Iterable(Arc<dyn IterableSource>),
    /// `megatron:PREFIX[,PREFIX…]` or `tokens:PATTERN`: a token stream cut into windows of
    /// `seq_len + 1` tokens (see [`tokens`]); opened with the loader's token options.
    Tokens(TokenSpec),
    /// `parquet:PATTERN`: a table of images and numbers, a row a sample (`ParquetSource`, cargo
    /// feature `parquet`), or with the option `tokenizer` a token source of its text column
    /// ([`TokenSpec::Parquet`]).
    Parquet(String),
}

impl std::fmt::Debug for SourceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceSpec::Npy(p) => write!(f, "npy:{}", p.display()),
            SourceSpec::ImageFolder(p) => write!(f, "image_folder:{}", p.display()),
            SourceSpec::SegmentationFolder(p) => {
                write!(f, "segmentation_folder:{}", p.display())
            }
            SourceSpec::Coco { annotations, masks } => {
                let kind = if *masks { "coco_masks" } else { "coco" };
                write!(f, "{kind}:{}", annotations.display())
            }
            SourceSpec::Custom(s) => write!(f, "custom source of {} samples", s.len()),
            SourceSpec::Callback { len, .. } => write!(f, "callback source of {len} samples"),
            SourceSpec::Tar(pattern) => write!(f, "tar:{pattern}"),
            SourceSpec::Packed(path) => write!(f, "packed:{path}"),
            SourceSpec::Iterable(_) => f.write_str("iterable source"),
            SourceSpec::Tokens(spec) => write!(f, "{spec}"),
            SourceSpec::Parquet(pattern) => write!(f, "parquet:{pattern}"),
        }
    }
}

impl SourceSpec {
    /// Opens a map-style source: maps the npy file, scans the image folder, or learns a
    /// callback source's fields from sample 0. `labels` is an npy of per-sample labels (npy
    /// sources only); `pad` says whether ragged callback and tar fields may be padded. Tar
    /// shards and iterable sources need the loader's options (fields, ranks): `LoaderOptions`
    /// opens them.
    pub fn open(&self, labels: Option<&Path>, pad: bool) -> Result<Arc<dyn Source>> {
        let rules = FieldRules {
            pad,
            ..FieldRules::default()
        };
        self.open_with(labels, rules)
    }

    /// [`SourceSpec::open`] with the rules of a callback source's fields in full.
    pub fn open_with(&self, labels: Option<&Path>, rules: FieldRules) -> Result<Arc<dyn Source>> {
        if labels.is_some() && !matches!(self, SourceSpec::Npy(_)) {
            return Err(Error::option(
                "labels",
                "labels=npy:PATH applies only to an npy source",
            ));
        }
        Ok(match self {
            SourceSpec::Npy(path) => Arc::new(NpySource::open(path, labels)?),
            SourceSpec::ImageFolder(root) => Arc::new(ImageFolderSource::open(root)?),
            SourceSpec::SegmentationFolder(root) => Arc::new(SegmentationFolderSource::open(root)?),
            SourceSpec::Coco { annotations, masks } => {
                Arc::new(CocoSource::open(annotations, *masks)?)
            }
            SourceSpec::Custom(source) => Arc::clone(source),
            SourceSpec::Callback { len, read } => {
                Arc::new(CallbackSource::new(*len, Arc::clone(read), rules)?)
            }
            SourceSpec::Tar(pattern) => Arc::new(TarSource::open_pattern(
                pattern,
                TarConfig {
                    pad: rules.pad,
                    ..TarConfig::default()
                },
            )?),
            SourceSpec::Packed(path) => Arc::new(PackedSource::open(path)?),
            SourceSpec::Parquet(pattern) => open_parquet_table(
                pattern,
                None,
                PARQUET_CACHE_BYTES,
                &remote::RemoteConfig::default(),
            )?,
            SourceSpec::Iterable(_) => {
                return Err(Error::InvalidArgument(
                    "an iterable source is a stream, not a map-style source".into(),
                ))
            }
            SourceSpec::Tokens(spec) => {
                return Err(Error::InvalidArgument(format!(
                    "{spec} is cut into samples by the loader's token options (seq_len): open it \
                     with TokenSource::open or through a loader"
                )))
            }
        })
    }
}

/// The bytes of decompressed pages a `parquet:` table keeps by default (`parquet_cache`): a
/// window of 32 row groups of 100 ImageNet-sized images (about 110 KB each, so 350 MB) under
/// `order=quasi_random`, or all of a CIFAR-10-sized table under any order.
pub const PARQUET_CACHE_BYTES: u64 = 1 << 30;

/// `parquet:PATTERN` as a table: `columns` (or every image and number column) a row a sample,
/// keeping `cache` bytes of decompressed pages.
#[cfg(feature = "parquet")]
pub(crate) fn open_parquet_table(
    pattern: &str,
    columns: Option<&[(String, String)]>,
    cache: u64,
    remote: &remote::RemoteConfig,
) -> Result<Arc<dyn Source>> {
    Ok(Arc::new(
        ParquetSource::open(pattern, columns, remote)?.with_cache(cache),
    ))
}

/// Without the cargo feature `parquet`, a `parquet:` source is refused.
#[cfg(not(feature = "parquet"))]
pub(crate) fn open_parquet_table(
    _pattern: &str,
    _columns: Option<&[(String, String)]>,
    _cache: u64,
    _remote: &remote::RemoteConfig,
) -> Result<Arc<dyn Source>> {
    Err(no_parquet())
}

/// Why a build without the cargo feature `parquet` refuses a `parquet:` table.
#[cfg(not(feature = "parquet"))]
fn no_parquet() -> Error {
    Error::Unsupported(
        "parquet: sources need stoker built with its `parquet` feature (on by default)".into(),
    )
}

/// Opens `path` for reading as `what` ("an .npy file", "a tar shard"), which must be a regular
/// file: a directory opens fine on Linux and only fails later, when mapped, with "No such
/// device". Every error names the path and says what is wrong with it.
pub(crate) fn open_file(path: &Path, what: &str) -> Result<(std::fs::File, std::fs::Metadata)> {
    let file = std::fs::File::open(path).map_err(|e| Error::os(path, e))?;
    let meta = file.metadata().map_err(|e| Error::os(path, e))?;
    if meta.is_dir() {
        return Err(Error::io(path, format!("is a directory, not {what}")));
    }
    if !meta.is_file() {
        return Err(Error::io(
            path,
            format!("is not a regular file (a device, socket or pipe), not {what}"),
        ));
    }
    Ok((file, meta))
}
