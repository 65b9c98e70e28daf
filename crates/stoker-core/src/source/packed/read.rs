//! Reading packed files: one read-only memory map per shard, shared by every worker; a field's
//! bytes are a view into it. Opening checks each shard's magic, version, size and checksum and
//! fails naming the file and what differs; reading a sample checks its entries against the data
//! region and the CRC-32 of its bytes, so a corrupt sample is that sample's error (replaced
//! under `on_error=skip`), never a wrong batch.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Advice;
use rayon::prelude::*;

use super::format::{
    checksum, decode_schema, Entry, Header, ImageMode, PackedField, PackedKind, HEADER_BYTES,
    MAX_SCHEMA_BYTES,
};
use super::index::{resolve_with, ShardListing};
use crate::error::{Error, Result};
use crate::source::mapped::{self, Mapping};
use crate::source::remote::{shown_without_credentials, RemoteConfig, ShardHolder};
use crate::source::{Access, FieldKind, FieldSpec, Sample, Source};

/// What a packed file's header, schema and table say, checked against its bytes: the checks of
/// the reader at open and per field, on any byte slice (a memory map, or a fuzzer's input).
#[derive(Clone, Debug)]
pub struct Layout {
    header: Header,
    fields: Vec<PackedField>,
    /// Where the metadata table starts: `num_samples × num_fields` entries to the end.
    table_at: usize,
}

impl Layout {
    /// Checks the header, size, offsets, checksum and schema of a whole file's `bytes`. Errors
    /// say what differs, without the file name (the caller adds it).
    pub fn parse(bytes: &[u8]) -> std::result::Result<Layout, String> {
        let header = Header::decode(bytes)?;
        let size = bytes.len() as u64;
        let table_len = header
            .table_len()
            .ok_or_else(|| "the header's sample and field counts overflow".to_string())?;
        if header.schema_len > MAX_SCHEMA_BYTES {
            return Err(format!(
                "the header declares a {}-byte schema (at most {MAX_SCHEMA_BYTES})",
                header.schema_len
            ));
        }
        let expected = header.table_offset.checked_add(table_len);
        if expected != Some(size) {
            return Err(match expected {
                Some(e) if e > size => format!(
                    "truncated: the header says the file has {e} bytes ({} samples), it has {size}",
                    header.num_samples
                ),
                Some(e) => format!(
                    "{} bytes after the table: the header says the file has {e} bytes, it has {size}",
                    size - e
                ),
                None => "the header's table offset overflows".into(),
            });
        }
        let schema_end = HEADER_BYTES as u64 + header.schema_len as u64;
        let data_end = header.data_offset.checked_add(header.data_len);
        if schema_end > header.data_offset
            || data_end.is_none_or(|end| end > header.table_offset)
            || header.page_size == 0
        {
            return Err(format!(
                "inconsistent header: schema ends at {schema_end}, data {}+{}, table at {}, page size {}",
                header.data_offset, header.data_len, header.table_offset, header.page_size
            ));
        }
        let schema = &bytes[HEADER_BYTES..schema_end as usize];
        let table_at = header.table_offset as usize;
        let computed = checksum(&header, schema, &bytes[table_at..]);
        if computed != header.checksum {
            return Err(format!(
                "checksum mismatch: the header says {:08x}, the header, schema and table hash to {computed:08x} (the file is corrupt)",
                header.checksum
            ));
        }
        let fields = decode_schema(schema, header.num_fields as usize)?;
        Ok(Layout {
            header,
            fields,
            table_at,
        })
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The fields of the schema, in storage order.
    pub fn fields(&self) -> &[PackedField] {
        &self.fields
    }

    /// Number of samples (`num_samples` of the header).
    pub fn len(&self) -> usize {
        self.header.num_samples as usize
    }

    /// Whether the file holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The table entry of `field` of sample `i` (`i < len()`, `field < fields().len()`) in
    /// the file's `bytes`.
    pub fn entry(&self, bytes: &[u8], i: usize, field: usize) -> Entry {
        Entry::decode(&bytes[self.table_at..], i * self.fields.len() + field)
    }

    /// The bytes of `field` of sample `i`, checked against the data region and their CRC-32,
    /// with their table entry (an image's stored size and mode).
    pub fn field_bytes<'a>(
        &self,
        bytes: &'a [u8],
        i: usize,
        field: usize,
    ) -> std::result::Result<(&'a [u8], Entry), String> {
        let e = self.entry(bytes, i, field);
        let data_end = self.header.data_offset + self.header.data_len;
        let end = e.offset.checked_add(e.len);
        if e.offset < self.header.data_offset || end.is_none_or(|end| end > data_end) {
            return Err(format!(
                "field `{}` at {}+{} lies outside the data region {}..{data_end}",
                self.fields[field].name, e.offset, e.len, self.header.data_offset
            ));
        }
        let stored = &bytes[e.offset as usize..(e.offset + e.len) as usize];
        let crc = crc32fast::hash(stored);
        if crc != e.crc {
            return Err(format!(
                "field `{}` is corrupt: its {} bytes at offset {} hash to {crc:08x}, the table says {:08x}",
                self.fields[field].name, e.len, e.offset, e.crc
            ));
        }
        if self.fields[field].kind == PackedKind::Image && ImageMode::from_code(e.mode).is_none() {
            return Err(format!(
                "field `{}`: unknown image mode {}",
                self.fields[field].name, e.mode
            ));
        }
        Ok((stored, e))
    }
}

/// One packed file, mapped and checked.
pub struct PackedFile {
    path: PathBuf,
    map: Mapping,
    layout: Layout,
}

impl PackedFile {
    /// Maps `path` and checks its header, schema, size and checksum ([`Layout::parse`]).
    pub fn open(path: &Path) -> Result<PackedFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        if !meta.is_file() {
            return Err(Error::io(path, "not a regular file"));
        }
        // Guarded against a truncation while mapped (see `mapped`); its size is checked against
        // the header here, and every range read later lies inside that size.
        let map = Mapping::map(&file, path)?;
        let layout = Layout::parse(&map).map_err(|reason| Error::format(path, reason))?;
        Ok(PackedFile {
            path: path.to_owned(),
            map,
            layout,
        })
    }

    /// The file's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's parsed header.
    pub fn header(&self) -> &Header {
        self.layout.header()
    }

    /// The fields of the file's schema, in storage order.
    pub fn fields(&self) -> &[PackedField] {
        self.layout.fields()
    }

    /// Number of samples in the file.
    pub fn len(&self) -> usize {
        self.layout.len()
    }

    /// Whether the file holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The table entry of `field` of sample `i`.
    pub fn entry(&self, i: usize, field: usize) -> Entry {
        self.layout.entry(&self.map, i, field)
    }

    /// The page of the data region sample `i` starts in.
    pub fn page_of(&self, i: usize) -> u64 {
        let header = self.layout.header();
        let offset = self.entry(i, 0).offset;
        offset.saturating_sub(header.data_offset) / header.page_size as u64
    }

    /// The bytes of `field` of sample `i`, checked against the data region and its CRC-32,
    /// with their table entry.
    pub fn field_bytes(
        &self,
        i: usize,
        field: usize,
    ) -> std::result::Result<(&[u8], Entry), String> {
        self.layout.field_bytes(&self.map, i, field)
    }

    /// Tells the kernel how the data will be read (`madvise`): sequential for an in-order pass
    /// (aggressive read-ahead), random for a uniform shuffle (no read-ahead wasted on
    /// neighbours), normal for page windows (the default read-ahead fetches the rest of a page
    /// whose samples are all read soon). Advice is a hint; failure changes nothing else.
    pub fn advise(&self, access: Access) {
        let advice = match access {
            Access::Sequential => Advice::Sequential,
            Access::Random => Advice::Random,
            Access::PageWindows => Advice::Normal,
        };
        let _ = self.map.advise(advice);
    }
}

/// A packed dataset (one file or the shards of an index) as a map-style source.
pub struct PackedSource {
    shards: Vec<PackedFile>,
    /// Global index of each shard's first sample, then the total.
    starts: Vec<usize>,
    specs: Vec<FieldSpec>,
    listing: ShardListing,
    /// Keeps remote shards' cached copies in place while the source maps them.
    _holders: Vec<ShardHolder>,
}

impl PackedSource {
    /// Opens `path`: a packed file, a dataset directory or index file (`index.stkidx`), or a
    /// pattern of shard files (`train-{00000..00009}.stkpack`, globs, comma lists).
    pub fn open(path: &str) -> Result<PackedSource> {
        Self::open_with(path, &RemoteConfig::default())
    }

    /// Opens `spec` as [`open`](Self::open) does, or remote files: a dataset URL ending in `/`
    /// or `index.stkidx`, one URL, or a pattern of URLs (`s3://`, `gs://`, `az://`, `http(s)://`),
    /// downloaded into the cache `remote` configures before the source opens.
    pub fn open_with(spec: &str, remote: &RemoteConfig) -> Result<PackedSource> {
        let (listing, holders) = resolve_with(spec, remote)?;
        let path = spec;
        let opened: Vec<Result<PackedFile>> = crate::fork::parallel(|| {
            listing
                .shards
                .par_iter()
                .map(|s| PackedFile::open(&s.path))
                .collect()
        })?;
        let mut shards = Vec::with_capacity(opened.len());
        for (file, listed) in opened.into_iter().zip(&listing.shards) {
            let file = file.map_err(|e| listed.blame(e))?;
            listed.check(&file).map_err(|e| listed.blame(e))?;
            shards.push(file);
        }
        let first = shards.first().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "packed `{}`: no shard",
                shown_without_credentials(path)
            ))
        })?;
        for (shard, listed) in shards.iter().zip(&listing.shards).skip(1) {
            if shard.fields() != first.fields() {
                return Err(Error::format(
                    listed.name(),
                    format!(
                        "its fields {:?} differ from those of {} ({:?})",
                        shard.fields(),
                        listing.shards[0].name(),
                        first.fields()
                    ),
                ));
            }
        }
        let specs = first.fields().iter().map(field_spec).collect();
        let mut starts = Vec::with_capacity(shards.len() + 1);
        let mut total = 0usize;
        for shard in &shards {
            starts.push(total);
            total += shard.len();
        }
        starts.push(total);
        Ok(PackedSource {
            shards,
            starts,
            specs,
            listing,
            _holders: holders,
        })
    }

    /// The shard and the position in it of sample `index`.
    pub fn locate(&self, index: usize) -> (usize, usize) {
        let shard = self.starts.partition_point(|&s| s <= index) - 1;
        (shard, index - self.starts[shard])
    }

    /// The shards' files, in sample order.
    pub fn shards(&self) -> &[PackedFile] {
        &self.shards
    }

    /// Global index of each shard's first sample, then the number of samples.
    pub fn shard_starts(&self) -> &[usize] {
        &self.starts
    }

    /// The global data page of each sample: shard pages are numbered one shard after another.
    /// `order=quasi_random` shuffles within windows of these.
    pub fn global_pages(&self) -> Vec<u64> {
        let mut pages = Vec::with_capacity(self.len());
        let mut base = 0u64;
        for shard in &self.shards {
            let mut last = 0;
            for i in 0..shard.len() {
                last = shard.page_of(i);
                pages.push(base + last);
            }
            base += last + 1;
        }
        pages
    }

    /// The stored size of image `field` of sample `index` (from the metadata table).
    pub fn image_size(&self, index: usize, field: usize) -> (u32, u32) {
        let (s, i) = self.locate(index);
        let e = self.shards[s].entry(i, field);
        (e.width, e.height)
    }
}

fn field_spec(f: &PackedField) -> FieldSpec {
    match f.kind {
        PackedKind::Image => FieldSpec::encoded_image(&f.name),
        PackedKind::Tensor => FieldSpec::tensor(&f.name, f.dtype, &f.dims),
        PackedKind::Ragged | PackedKind::Bytes => FieldSpec::ragged(&f.name, f.dtype, &f.dims),
    }
}

impl Source for PackedSource {
    fn len(&self) -> usize {
        self.starts[self.starts.len() - 1]
    }

    fn fields(&self) -> &[FieldSpec] {
        &self.specs
    }

    fn describe(&self, index: usize) -> String {
        let (s, i) = self.locate(index);
        format!("packed {} sample {i}", self.listing.shards[s].name())
    }

    fn identity(&self) -> String {
        format!(
            "packed {} samples of {:?} in shards {}",
            self.len(),
            self.specs,
            self.listing.identity()
        )
    }

    fn pages(&self) -> Option<Vec<u64>> {
        Some(self.global_pages())
    }

    fn advise(&self, access: Access) {
        for shard in &self.shards {
            shard.advise(access);
        }
    }

    fn verify(&self) -> Result<()> {
        if !mapped::any_truncated() {
            return Ok(());
        }
        self.shards.iter().try_for_each(|shard| shard.map.check())
    }

    fn read<'a>(&'a self, index: usize, _scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let (s, i) = self.locate(index);
        let shard = &self.shards[s];
        let mut sample = Sample::default();
        for f in 0..self.specs.len() {
            let (bytes, e) = shard.field_bytes(i, f).map_err(|reason| Error::Sample {
                index: index as u64,
                what: self.describe(index),
                reason,
            })?;
            sample.set(f, bytes);
            if self.specs[f].kind == FieldKind::EncodedImage && e.width > 0 && e.height > 0 {
                sample.set_image_size(f, e.width, e.height);
            }
        }
        Ok(sample)
    }
}
