//! Reading packed files: one read-only memory map per shard, shared by every worker; a field's
//! bytes are a view into it. Opening checks each shard's magic, version, size and checksum and
//! fails naming the file and what differs; reading a sample checks its entries against the data
//! region and the CRC-32 of its bytes, so a corrupt sample is that sample's error (replaced
//! under `on_error=skip`), never a wrong batch.

use rayon::prelude::*;

use super::file::PackedFile;
use super::format::{PackedField, PackedKind};
use super::index::{resolve_with, ShardListing};
use crate::error::{Error, Result};
use crate::source::mapped;
use crate::source::remote::{shown_without_credentials, RemoteConfig, ShardHolder};
use crate::source::{Access, FieldKind, FieldSpec, Sample, Source};

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
        self.shards
            .iter()
            .try_for_each(|shard| shard.check_mapping())
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
