//! Writing stoker's packed format (`stoker pack`): any map-style source → page-aligned shard
//! files with a per-sample metadata table (`docs/packed-format.md`).
//!
//! Samples are read and encoded in parallel (rayon) in chunks of [`CHUNK`], then appended in
//! index order, so the bytes are the same for the same input and options whatever the thread
//! count. Images are kept as they are, or decoded, shrunk to `max_side` and stored as JPEG or as
//! raw RGB8 pixels (`mode`). Each file is written to a temporary name and renamed when complete.
//!
//! Packing can be split across machines: `slice = (i, n)` packs the `i`-th of `n` contiguous
//! slices of the source into `part-i-of-n-k.stkpack` files, and [`merge`] writes the index that
//! joins them, in slice order, into the same dataset a single pack writes.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fast_image_resize::{FilterType, Resizer};
use rayon::prelude::*;

use crate::decode::{
    decode_rgb, dimensions, jpeg_is_whole, raw_pixels, DecodeBuffers, Dims, Format,
    MAX_IMAGE_PIXELS,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::options::LoaderOptions;
use crate::source::packed::format::{
    align_up, checksum, encode_schema, Entry, Header, ImageMode, PackedField, PackedKind,
    DEFAULT_PAGE_SIZE, HEADER_BYTES, RECORD_ALIGN, VERSION,
};
use crate::source::packed::index::{write_index, IndexEntry};
use crate::source::packed::PackedFile;
use crate::source::pixels::raw_header;
use crate::source::remote::RemoteConfig;
use crate::source::tar::parse_fields;
use crate::source::{open_parquet_table, FieldKind, Source, SourceSpec, TarConfig, TarSource};
use crate::transform::{resample, Plan, Sampled};

/// Samples read and encoded in parallel before they are appended in order: bounds the memory
/// of encoded samples waiting to be written.
pub const CHUNK: usize = 256;
/// `mode=smart` stores an image as raw pixels when it has at most this many pixels (after
/// `max_side`), as JPEG otherwise: small images are cheap to keep raw and cost the most to
/// decode relative to their size.
pub const SMART_RAW_MAX_PIXELS: u64 = 256 * 256;

/// How image fields are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackMode {
    /// Encoded: kept as they are when within `max_side`, else shrunk and re-encoded as JPEG.
    Jpeg,
    /// Raw RGB8 pixels (shrunk to `max_side`): no decoding when read, more bytes.
    Raw,
    /// Per image: raw when it has at most [`SMART_RAW_MAX_PIXELS`] pixels, else as `Jpeg`.
    Smart,
}

impl std::str::FromStr for PackMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<PackMode> {
        match s {
            "jpeg" => Ok(PackMode::Jpeg),
            "raw" => Ok(PackMode::Raw),
            "smart" => Ok(PackMode::Smart),
            _ => Err(Error::option(
                "mode",
                format!("`{s}` is not a pack mode; expected jpeg, raw or smart"),
            )),
        }
    }
}

/// What `pack` writes.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// Images with a longer side are shrunk to it (aspect kept).
    pub max_side: Option<u32>,
    /// JPEG quality (1..=100) of re-encoded images.
    pub quality: u32,
    /// How image fields are stored.
    pub mode: PackMode,
    /// Start a new shard file when the next sample would take the data region past this many
    /// bytes (a sample larger than it gets a shard of its own).
    pub shard_size: Option<u64>,
    /// `(i, n)`: pack only the `i`-th of `n` contiguous slices (for packing on many machines).
    pub slice: Option<(usize, usize)>,
    /// The data region's page size (a power of two ≥ 4096).
    pub page_size: u32,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            max_side: None,
            quality: 90,
            mode: PackMode::Jpeg,
            shard_size: None,
            slice: None,
            page_size: DEFAULT_PAGE_SIZE,
        }
    }
}

impl PackOptions {
    /// The options from the flat arguments of `stoker_pack` and `stoker::pack` (0 is unset for
    /// `max_side`, `shard_size` and `num_shards`; no `mode` is `jpeg`), so every face reads
    /// them alike and reports the same errors.
    pub fn from_arguments(
        max_side: u32,
        quality: u32,
        mode: Option<&str>,
        shard_size: u64,
        shard_index: u32,
        num_shards: u32,
    ) -> Result<PackOptions> {
        let options = PackOptions {
            max_side: (max_side > 0).then_some(max_side),
            quality,
            mode: mode.map_or(Ok(PackMode::Jpeg), str::parse)?,
            shard_size: (shard_size > 0).then_some(shard_size),
            slice: (num_shards > 0).then_some((shard_index as usize, num_shards as usize)),
            ..PackOptions::default()
        };
        options.check()?;
        Ok(options)
    }

    fn check(&self) -> Result<()> {
        if !(1..=100).contains(&self.quality) {
            return Err(Error::option(
                "quality",
                format!("{} is not between 1 and 100", self.quality),
            ));
        }
        if self.max_side == Some(0) {
            return Err(Error::option(
                "max_side",
                "0 is not a size: it must be at least 1",
            ));
        }
        if self.shard_size == Some(0) {
            return Err(Error::option(
                "shard_size",
                "0 bytes: it must be at least 1 byte",
            ));
        }
        if !self.page_size.is_power_of_two() || self.page_size < 4096 {
            return Err(Error::option("page_size", "must be a power of two ≥ 4096"));
        }
        if let Some((_, 0)) = self.slice {
            return Err(Error::option(
                "num_shards",
                "0: a pack is cut into at least 1 slice",
            ));
        }
        if let Some((i, n)) = self.slice {
            if i >= n {
                return Err(Error::option(
                    "shard_index",
                    format!("shard index {i} is out of range for {n} shards"),
                ));
            }
        }
        Ok(())
    }

    /// Whether the output is a directory of shards (sharded or sliced) rather than one file.
    pub fn writes_directory(&self) -> bool {
        self.shard_size.is_some() || self.slice.is_some()
    }
}

/// What a pack wrote.
#[derive(Clone, Debug)]
pub struct PackReport {
    /// Samples written.
    pub samples: u64,
    /// Bytes written, over all files.
    pub bytes: u64,
    /// The shard files written, in sample order.
    pub files: Vec<PathBuf>,
    /// The dataset index, when this pack wrote the whole dataset into a directory.
    pub index: Option<PathBuf>,
}

/// Packs `source` into `out`: one file, or (with `shard_size` or `slice`) a directory of
/// shard files. `progress(done, total)` is called from worker threads as samples are encoded.
pub fn pack(
    source: &dyn Source,
    out: &Path,
    options: &PackOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<PackReport> {
    options.check()?;
    if out.as_os_str().is_empty() {
        return Err(Error::InvalidArgument(
            "pack: the output path is empty".into(),
        ));
    }
    let fields = packed_fields(source)?;
    keeps_dense_fields(&fields, options)?;
    let schema = encode_schema(&fields);
    let (slice, of) = options.slice.unwrap_or((0, 1));
    let len = source.len();
    // Slice i is [i·len/of, (i+1)·len/of): contiguous, disjoint, covering, in order.
    let bound = |i: usize| (i as u128 * len as u128 / of as u128) as usize;
    let range = bound(slice)..bound(slice + 1);
    let directory = options.writes_directory();
    if directory {
        std::fs::create_dir_all(out).map_err(|e| Error::os(out, e))?;
        // Until this slice finishes, it has no record: a merge refuses it.
        remove_if_present(&out.join(slice_record_name(slice, of)))?;
    }
    let shard_path = |k: usize| {
        if directory {
            out.join(shard_name(slice, of, k))
        } else {
            out.to_owned()
        }
    };
    let written = write_shards(
        source,
        &fields,
        &schema,
        options,
        range,
        &shard_path,
        progress,
    )
    .and_then(|report| {
        if directory {
            remove_stale_shards(out, slice, of, report.files.len())?;
            write_slice_record(out, slice, of, &report)?;
        }
        Ok(report)
    });
    let mut report = match written {
        Ok(report) => report,
        Err(e) => {
            // The shards this slice finished are not a dataset: a merge would index them as
            // if they were the whole slice.
            if directory {
                let _ = remove_stale_shards(out, slice, of, 0);
            }
            return Err(e);
        }
    };
    if directory && of == 1 {
        report.index = Some(merge(out)?);
    }
    Ok(report)
}

/// Writes samples `range` of `source` into shard files at `shard_path(0)`, `shard_path(1)`, …
/// (one file unless `options.shard_size` splits them).
fn write_shards(
    source: &dyn Source,
    fields: &[PackedField],
    schema: &[u8],
    options: &PackOptions,
    range: std::ops::Range<usize>,
    shard_path: &(dyn Fn(usize) -> PathBuf + Sync),
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<PackReport> {
    let total = range.len() as u64;
    let done = AtomicU64::new(0);
    let mut report = PackReport {
        samples: 0,
        bytes: 0,
        files: Vec::new(),
        index: None,
    };
    let mut shard = ShardWriter::create(shard_path(0), schema, fields.len(), options.page_size)?;
    let starts: Vec<usize> = range.clone().step_by(CHUNK).collect();
    crate::fork::parallel(|| -> Result<()> {
        for start in starts {
            let end = (start + CHUNK).min(range.end);
            let records: Vec<Result<Record>> = (start..end)
                .into_par_iter()
                .map_init(Buffers::default, |bufs, index| {
                    let record = encode_sample(source, index, fields, options, bufs);
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
                    record
                })
                .collect();
            for record in records {
                let record = record?;
                if let Some(limit) = options.shard_size {
                    if shard.samples > 0 && shard.data_len() + record.bytes.len() as u64 > limit {
                        let next = shard_path(report.files.len() + 1);
                        let finished = std::mem::replace(
                            &mut shard,
                            ShardWriter::create(next, schema, fields.len(), options.page_size)?,
                        );
                        finish_into(finished, &mut report)?;
                    }
                }
                shard.append(&record)?;
            }
        }
        Ok(())
    })??;
    finish_into(shard, &mut report)?;
    Ok(report)
}

/// The name of the record slice `i` of `n` writes when all its shards are: `part-I-of-N.done`.
fn slice_record_name(i: usize, n: usize) -> String {
    format!("part-{i:05}-of-{n:05}.done")
}

/// Records that slice `i` of `n` wrote `report`'s shards, whole (written beside, renamed).
fn write_slice_record(dir: &Path, i: usize, n: usize, report: &PackReport) -> Result<()> {
    let path = dir.join(slice_record_name(i, n));
    let tmp = dir.join(format!(".{}.tmp", slice_record_name(i, n)));
    let text = format!(
        "shards={}\nsamples={}\n",
        report.files.len(),
        report.samples
    );
    std::fs::write(&tmp, text).map_err(|e| Error::os(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::os(&path, e))
}

/// How many shards slice `i` of `n` finished, from its record; `None` without one.
fn slice_shards(dir: &Path, i: usize, n: usize) -> Result<Option<usize>> {
    let path = dir.join(slice_record_name(i, n));
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::os(&path, e)),
    };
    text.lines()
        .find_map(|line| line.strip_prefix("shards="))
        .and_then(|count| count.parse().ok())
        .map(Some)
        .ok_or_else(|| Error::format(&path, "has no `shards=N` line"))
}

fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::os(path, e)),
        _ => Ok(()),
    }
}

fn finish_into(shard: ShardWriter, report: &mut PackReport) -> Result<()> {
    let (path, samples, bytes) = shard.finish()?;
    report.samples += samples;
    report.bytes += bytes;
    report.files.push(path);
    Ok(())
}

/// Removes the shards `k ≥ written` of slice `slice` of `of` left in `dir` by an earlier pack
/// that wrote more, so that a merge sees only this pack's.
fn remove_stale_shards(dir: &Path, slice: usize, of: usize, written: usize) -> Result<()> {
    let listing = std::fs::read_dir(dir).map_err(|e| Error::os(dir, e))?;
    for entry in listing.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some((i, n, k)) = parse_shard_name(&name) {
            if (i, n) == (slice, of) && k >= written {
                let path = dir.join(&name);
                std::fs::remove_file(&path).map_err(|e| Error::os(&path, e))?;
            }
        }
    }
    Ok(())
}

/// The name of shard `k` of slice `i` of `n`.
pub fn shard_name(i: usize, n: usize, k: usize) -> String {
    format!("part-{i:05}-of-{n:05}-{k:05}.stkpack")
}

/// Parses a name written by [`shard_name`].
fn parse_shard_name(name: &str) -> Option<(usize, usize, usize)> {
    let rest = name.strip_prefix("part-")?.strip_suffix(".stkpack")?;
    let mut parts = rest.split('-');
    let i = parts.next()?.parse().ok()?;
    if parts.next()? != "of" {
        return None;
    }
    let n = parts.next()?.parse().ok()?;
    let k = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((i, n, k))
}

/// Writes the index of the shards packed into `dir` (by one pack or by the `n` slices of
/// independent packs), checking every slice is there, every shard opens and all agree on the
/// fields. Returns the index's path.
pub fn merge(dir: &Path) -> Result<PathBuf> {
    let mut found = Vec::new();
    let listing = std::fs::read_dir(dir).map_err(|e| Error::os(dir, e))?;
    for entry in listing {
        let entry = entry.map_err(|e| Error::os(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(key) = parse_shard_name(&name) {
            found.push((key, name));
        }
    }
    found.sort();
    let Some(&((_, n, _), _)) = found.first() else {
        return Err(Error::io(
            dir,
            "no packed shard (part-I-of-N-K.stkpack) to merge",
        ));
    };
    if let Some((_, name)) = found.iter().find(|((_, m, _), _)| *m != n) {
        return Err(Error::InvalidArgument(format!(
            "{}: `{name}` belongs to a pack in a different number of slices than `{}`",
            dir.display(),
            found[0].1
        )));
    }
    let missing: Vec<usize> = (0..n)
        .filter(|i| !found.iter().any(|((j, _, _), _)| j == i))
        .collect();
    if !missing.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{}: slices {missing:?} of {n} are missing; pack them (--shard-index I --num-shards {n}) before merging",
            dir.display()
        )));
    }
    // Each slice's shards are the ones its record counts: a slice whose pack failed or was
    // killed has shards but no record, and indexing them would drop the rest of it silently.
    for i in 0..n {
        let have = found.iter().filter(|((j, _, _), _)| *j == i).count();
        match slice_shards(dir, i, n)? {
            Some(count) if count == have => {}
            Some(count) => {
                return Err(Error::InvalidArgument(format!(
                    "{}: slice {i} of {n} wrote {count} shards, but {have} are here; pack it \
                     again (--shard-index {i} --num-shards {n}) before merging",
                    dir.display()
                )))
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "{}: slice {i} of {n} did not finish (it has no {}: its pack failed or was \
                     stopped, or an older stoker wrote it); pack it again (--shard-index {i} \
                     --num-shards {n}) before merging",
                    dir.display(),
                    slice_record_name(i, n)
                )))
            }
        }
    }
    let opened: Vec<Result<(IndexEntry, Vec<PackedField>)>> = crate::fork::parallel(|| {
        found
            .par_iter()
            .map(|(_, name)| {
                let path = dir.join(name);
                let file = PackedFile::open(&path)?;
                let bytes = std::fs::metadata(&path)
                    .map_err(|e| Error::os(&path, e))?
                    .len();
                Ok((IndexEntry::of(name, &file, bytes), file.fields().to_vec()))
            })
            .collect()
    })?;
    let mut entries = Vec::with_capacity(opened.len());
    let mut first_fields: Option<Vec<PackedField>> = None;
    for result in opened {
        let (entry, fields) = result?;
        match &first_fields {
            None => first_fields = Some(fields),
            Some(first) if *first != fields => {
                return Err(Error::format(
                    dir.join(&entry.name),
                    format!("its fields {fields:?} differ from the first shard's {first:?}"),
                ))
            }
            Some(_) => {}
        }
        entries.push(entry);
    }
    write_index(dir, &entries)
}

/// Refuses options that would change an image without the fields drawn on it: a second image
/// field (a segmentation mask, whose PNG labels a resize would blend and raw RGB would turn into
/// colours) or float32 rows of 4 (bounding boxes, in the stored image's pixels). Such samples
/// are packed whole with `--mode jpeg` and no `--max-side`: every image byte for byte.
fn keeps_dense_fields(fields: &[PackedField], options: &PackOptions) -> Result<()> {
    let images: Vec<&str> = fields
        .iter()
        .filter(|f| f.kind == PackedKind::Image)
        .map(|f| f.name.as_str())
        .collect();
    if images.is_empty() && options.max_side.is_some() {
        return Err(Error::option(
            "max_side",
            "shrinks images, and this source has none (its tensors are packed as they are)",
        ));
    }
    let boxes = fields
        .iter()
        .find(|f| f.kind == PackedKind::Ragged && f.dtype == DType::F32 && f.dims == [4]);
    let held = match (images.get(1), boxes) {
        (Some(mask), _) => format!(
            "image fields `{}` and `{mask}` (an image and its mask?)",
            images[0]
        ),
        (None, Some(b)) => format!("float32 rows of 4 in field `{}` (boxes?)", b.name),
        (None, None) => return Ok(()),
    };
    let change = match (options.max_side, options.mode) {
        (Some(side), _) => format!("--max-side {side} would shrink the image"),
        (None, PackMode::Raw | PackMode::Smart) if images.len() > 1 => {
            "--mode raw/smart would store a mask's labels as RGB colours".to_owned()
        }
        _ => return Ok(()),
    };
    Err(Error::InvalidArgument(format!(
        "the source has {held}: {change} without the fields drawn on it; pack it with \
         --mode jpeg and no --max-side to keep every field as it is"
    )))
}

/// The packed schema of a source's fields.
fn packed_fields(source: &dyn Source) -> Result<Vec<PackedField>> {
    let mut fields = Vec::new();
    for spec in source.fields() {
        if spec.name.len() > u8::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "field name `{}` is longer than 255 bytes",
                spec.name
            )));
        }
        let (kind, dtype, dims) = match &spec.kind {
            FieldKind::EncodedImage => (PackedKind::Image, DType::U8, Vec::new()),
            FieldKind::Tensor { dtype, shape } => (PackedKind::Tensor, *dtype, shape.clone()),
            FieldKind::Ragged { dtype, inner_shape }
                if *dtype == DType::U8 && inner_shape.is_empty() =>
            {
                (PackedKind::Bytes, DType::U8, Vec::new())
            }
            FieldKind::Ragged { dtype, inner_shape } => {
                (PackedKind::Ragged, *dtype, inner_shape.clone())
            }
        };
        fields.push(PackedField {
            name: spec.name.clone(),
            kind,
            dtype,
            dims,
        });
    }
    Ok(fields)
}

/// A worker's reused buffers.
#[derive(Default)]
struct Buffers {
    read: Vec<u8>,
    decode: DecodeBuffers,
    resizer: Option<Resizer>,
}

/// One encoded sample: its fields' bytes back to back, and each field's place and metadata.
struct Record {
    bytes: Vec<u8>,
    /// Per field: start within `bytes`, length, width, height, image mode.
    fields: Vec<(usize, usize, u32, u32, ImageMode)>,
}

fn encode_sample(
    source: &dyn Source,
    index: usize,
    fields: &[PackedField],
    options: &PackOptions,
    bufs: &mut Buffers,
) -> Result<Record> {
    let Buffers {
        read,
        decode,
        resizer,
    } = bufs;
    let sample = source.read(index, read)?;
    let mut record = Record {
        bytes: Vec::new(),
        fields: Vec::with_capacity(fields.len()),
    };
    for (f, field) in fields.iter().enumerate() {
        let src = sample.get(f);
        let start = record.bytes.len();
        let (width, height, mode) = if field.kind == PackedKind::Image {
            let resizer = resizer.get_or_insert_with(Resizer::new);
            encode_image(src, options, decode, resizer, &mut record.bytes).map_err(|reason| {
                Error::Sample {
                    index: index as u64,
                    what: source.describe(index),
                    reason: format!("field `{}`: {reason}", field.name),
                }
            })?
        } else {
            record.bytes.extend_from_slice(src);
            (0, 0, ImageMode::None)
        };
        record
            .fields
            .push((start, record.bytes.len() - start, width, height, mode));
    }
    Ok(record)
}

/// The size of `dims` with its longer side shrunk to `max_side` (never enlarged).
fn fit(dims: Dims, max_side: Option<u32>) -> Dims {
    let Some(max) = max_side.map(|m| m as usize) else {
        return dims;
    };
    let long = dims.width.max(dims.height);
    if long <= max {
        return dims;
    }
    let scale = |side: usize| ((side * max + long / 2) / long).max(1);
    Dims {
        width: scale(dims.width),
        height: scale(dims.height),
    }
}

/// Appends one image, stored as `options` say, to `out`; returns its stored size and mode.
fn encode_image(
    src: &[u8],
    options: &PackOptions,
    decode: &mut DecodeBuffers,
    resizer: &mut Resizer,
    out: &mut Vec<u8>,
) -> std::result::Result<(u32, u32, ImageMode), String> {
    // An image already stored raw (packing a packed dataset) is its own pixels.
    let raw = raw_pixels(src, MAX_IMAGE_PIXELS).transpose()?;
    let dims = match raw {
        Some((dims, _)) => dims,
        None => dimensions(src)?,
    };
    let target = fit(dims, options.max_side);
    let small = (target.width as u64) * (target.height as u64) <= SMART_RAW_MAX_PIXELS;
    let store_raw = match options.mode {
        PackMode::Raw => true,
        PackMode::Smart => small,
        PackMode::Jpeg => false,
    };
    let keep = raw.is_none() && !store_raw && target == dims;
    if keep {
        let mode = match Format::sniff(src) {
            Some(Format::Png) => ImageMode::Png,
            _ => ImageMode::Jpeg,
        };
        // Kept without a decode, so the reader's check of a whole stream runs here: a
        // truncated file is named now, not as a packed sample mid-training.
        if mode == ImageMode::Jpeg {
            jpeg_is_whole(src)?;
        }
        out.extend_from_slice(src);
        return Ok((dims.width as u32, dims.height as u32, mode));
    }
    let pixels: &[u8] = match raw {
        Some((_, pixels)) => pixels,
        None => {
            let decoded = decode_rgb(src, MAX_IMAGE_PIXELS, decode)?;
            if decoded != dims {
                return Err(format!(
                    "the header says {}x{}, the decoded image is {}x{}",
                    dims.width, dims.height, decoded.width, decoded.height
                ));
            }
            &decode.rgb
        }
    };
    let resized;
    let pixels: &[u8] = if target == dims {
        pixels
    } else {
        resized = resize(pixels, dims, target, resizer)?;
        &resized
    };
    let (w, h) = (target.width as u32, target.height as u32);
    if store_raw {
        out.extend_from_slice(&raw_header(w, h));
        out.extend_from_slice(pixels);
        return Ok((w, h, ImageMode::Raw));
    }
    let (w16, h16) = match (u16::try_from(w), u16::try_from(h)) {
        (Ok(a), Ok(b)) => (a, b),
        _ => return Err(format!("{w}x{h} is too large for JPEG (65535 at most)")),
    };
    // 4:2:0 chroma, box-averaged: what libjpeg's cjpeg, Pillow, OpenCV and so FFCV's writer
    // store at every quality. jpeg-encoder alone switches to 4:4:4 from quality 90, which
    // doubles the chroma samples every read has to entropy-decode: at --max-side 256 the
    // benchmark's file is 23% smaller in 4:2:0 and a sample's decode about 30% cheaper.
    let mut encoder =
        jpeg_encoder::Encoder::new(&mut *out, u8::try_from(options.quality).unwrap_or(100));
    encoder.set_sampling_factor(jpeg_encoder::SamplingFactor::R_4_2_0);
    encoder.set_chroma_subsampling_method(jpeg_encoder::ChromaSubsamplingMethod::Average);
    encoder
        .encode(pixels, w16, h16, jpeg_encoder::ColorType::Rgb)
        .map_err(|e| format!("JPEG encoding failed: {e}"))?;
    Ok((w, h, ImageMode::Jpeg))
}

/// Shrinks RGB8 `pixels` from `from` to `to` (antialiased bicubic, as Pillow's default).
fn resize(
    pixels: &[u8],
    from: Dims,
    to: Dims,
    resizer: &mut Resizer,
) -> std::result::Result<Vec<u8>, String> {
    let whole = Plan {
        clip: [0, 0, from.width, from.height],
        rect: [0.0, 0.0, from.width as f64, from.height as f64],
        width: to.width,
        height: to.height,
        flip: false,
    };
    let mut out = vec![0; to.width * to.height * 3];
    resample(
        pixels,
        (from.width, from.height),
        Sampled::Rgb8,
        &whole,
        FilterType::CatmullRom,
        &mut out,
        resizer,
    )?;
    Ok(out)
}

/// One shard file being written: to a temporary name beside it, renamed when finished.
struct ShardWriter {
    path: PathBuf,
    tmp: PathBuf,
    /// `None` once finished; a writer dropped unfinished (an error) removes its temporary file.
    file: Option<BufWriter<File>>,
    schema_len: u32,
    schema: Vec<u8>,
    fields: usize,
    page_size: u32,
    data_offset: u64,
    /// The write position (absolute).
    pos: u64,
    table: Vec<u8>,
    samples: u64,
}

impl ShardWriter {
    fn create(path: PathBuf, schema: &[u8], fields: usize, page_size: u32) -> Result<ShardWriter> {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = path.with_file_name(format!(".{name}.tmp"));
        // Named by the file asked for: the temporary one is ours.
        let file = File::create(&tmp).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                Error::io(&path, "cannot be created: its directory does not exist")
            }
            _ => Error::os(&path, e),
        })?;
        let mut file = BufWriter::with_capacity(1 << 20, file);
        let data_offset = align_up((HEADER_BYTES + schema.len()) as u64, page_size as u64);
        // The header is written last, when the table is known; the gap up to the data region
        // is left as a hole (reads as zeros).
        file.seek(SeekFrom::Start(HEADER_BYTES as u64))
            .and_then(|_| file.write_all(schema))
            .and_then(|_| file.seek(SeekFrom::Start(data_offset)))
            .map_err(|e| Error::os(&tmp, e))?;
        Ok(ShardWriter {
            path,
            tmp,
            file: Some(file),
            schema_len: schema.len() as u32,
            schema: schema.to_vec(),
            fields,
            page_size,
            data_offset,
            pos: data_offset,
            table: Vec::new(),
            samples: 0,
        })
    }

    fn data_len(&self) -> u64 {
        self.pos - self.data_offset
    }

    fn append(&mut self, record: &Record) -> Result<()> {
        let start = align_up(self.pos, RECORD_ALIGN);
        let pad = [0u8; RECORD_ALIGN as usize];
        let file = self.file.as_mut().ok_or_else(|| finished(&self.tmp))?;
        file.write_all(&pad[..(start - self.pos) as usize])
            .and_then(|_| file.write_all(&record.bytes))
            .map_err(|e| Error::os(&self.tmp, e))?;
        debug_assert_eq!(record.fields.len(), self.fields);
        for &(at, len, width, height, mode) in &record.fields {
            let bytes = &record.bytes[at..at + len];
            Entry {
                offset: start + at as u64,
                len: len as u64,
                width,
                height,
                mode: mode as u8,
                crc: crc32fast::hash(bytes),
            }
            .encode(&mut self.table);
        }
        self.pos = start + record.bytes.len() as u64;
        self.samples += 1;
        Ok(())
    }

    /// Writes the table and the header, syncs and renames; returns the path, samples and size.
    fn finish(mut self) -> Result<(PathBuf, u64, u64)> {
        let mut writer = self.file.take().ok_or_else(|| finished(&self.tmp))?;
        let table_offset = align_up(self.pos, 8);
        let mut header = Header {
            version: VERSION,
            page_size: self.page_size,
            num_samples: self.samples,
            num_fields: self.fields as u32,
            schema_len: self.schema_len,
            data_offset: self.data_offset,
            data_len: self.data_len(),
            table_offset,
            checksum: 0,
        };
        header.checksum = checksum(&header, &self.schema, &self.table);
        let pad = [0u8; 8];
        let tmp = self.tmp.clone();
        let io = |e: std::io::Error| Error::os(&tmp, e);
        let removing = |e: Error| {
            let _ = std::fs::remove_file(&tmp);
            e
        };
        writer
            .write_all(&pad[..(table_offset - self.pos) as usize])
            .and_then(|_| writer.write_all(&self.table))
            .and_then(|_| writer.seek(SeekFrom::Start(0)))
            .and_then(|_| writer.write_all(&header.encode()))
            .map_err(|e| removing(io(e)))?;
        let file = writer
            .into_inner()
            .map_err(|e| removing(Error::io(&tmp, e.error())))?;
        let size = table_offset + self.table.len() as u64;
        // An empty shard's data region is a hole the writes never reached.
        file.set_len(size)
            .and_then(|_| file.sync_all())
            .map_err(|e| removing(io(e)))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| removing(Error::os(&self.path, e)))?;
        Ok((self.path.clone(), self.samples, size))
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        // Unfinished: packing failed part-way; leave no temporary file behind.
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn finished(tmp: &Path) -> Error {
    Error::Internal(format!("{}: the shard was already finished", tmp.display()))
}

/// Opens the map-style source `spec` names (`image_folder:ROOT`, `tar:PATTERN` of local
/// shards, `npy:PATH`, `packed:PATH`) for packing.
pub fn open_source(spec: &str) -> Result<Arc<dyn Source>> {
    let mut options = LoaderOptions::new();
    options.set("source", spec)?;
    let spec = options
        .source()
        .ok_or_else(|| Error::option("source", "required"))?;
    // Ragged fields (tar `txt` members, say) are packed as they are; padding is the loader's.
    spec.open(None, true)
}

/// [`open_source`] with a tar source's `fields` (`EXT:NAME,...`, the loader's option): a shard's
/// other members (`json#boxes`, `seg.png`, say) are packed only when named; for a `parquet:`
/// table, its `columns` (`COLUMN[:NAME],...`). `None` is the default fields; any other source
/// refuses `fields`.
pub fn open_source_with_fields(spec: &str, fields: Option<&str>) -> Result<Arc<dyn Source>> {
    let Some(fields) = fields else {
        return open_source(spec);
    };
    let mut options = LoaderOptions::new();
    options.set("source", spec)?;
    if matches!(options.source(), Some(SourceSpec::Parquet(_))) {
        options.set("columns", fields)?;
    }
    match options.source() {
        Some(SourceSpec::Tar(pattern)) => Ok(Arc::new(TarSource::open_pattern(
            pattern,
            TarConfig {
                fields: Some(parse_fields(fields)?),
                pad: true,
                ..TarConfig::default()
            },
        )?)),
        Some(SourceSpec::Parquet(pattern)) => open_parquet_table(
            pattern,
            options.columns.as_deref(),
            options.parquet_cache,
            &RemoteConfig::default(),
        ),
        _ => Err(Error::option(
            "fields",
            format!(
                "chooses the members of tar shards or the columns of a parquet: table \
                 (COLUMN[:NAME],…); `{spec}` is neither"
            ),
        )),
    }
}

/// Packs the source `spec` names into `out` (see [`pack`]).
pub fn pack_spec(
    spec: &str,
    out: &Path,
    options: &PackOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<PackReport> {
    let source = open_source(spec)?;
    pack(&*source, out, options, progress)
}

/// A byte size as people write it (`512MiB`, `2GB`, `1000000`), for `shard_size`.
pub fn parse_size(key: &str, v: &str) -> Result<u64> {
    let bytes: bytesize::ByteSize = v.trim().parse().map_err(|_| {
        Error::option(
            key,
            format!(
                "`{v}` is not a size such as 512MiB ({})",
                crate::memory::SIZE_WORDS
            ),
        )
    })?;
    if bytes.as_u64() == 0 {
        return Err(Error::option(key, "must be more than 0 bytes"));
    }
    Ok(bytes.as_u64())
}
