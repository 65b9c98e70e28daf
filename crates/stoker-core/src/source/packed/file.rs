//! One packed file: `Layout`, the checks of a file's header, schema, table and checksum on any
//! bytes (a memory map, or a fuzzer's input), and `PackedFile`, a shard mapped read-only and
//! checked at open. The dataset index and the source both build on it.

use std::path::{Path, PathBuf};

use memmap2::Advice;

use super::format::{
    checksum, decode_schema, Entry, Header, ImageMode, PackedField, PackedKind, HEADER_BYTES,
    MAX_SCHEMA_BYTES,
};
use crate::error::{Error, Result};
use crate::source::mapped::Mapping;
use crate::source::{open_file, Access};

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
                // The checksum that would tell a corrupt header from a short file covers the
                // table, which a wrong size puts elsewhere: both are said.
                Some(e) if e > size => format!(
                    "truncated, or its header corrupt: the header says the file has {e} bytes \
                     ({} samples), it has {size}",
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
        let (file, _) = open_file(path, "a packed file")?;
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

    /// `Err(Io)` naming the file once a read of its mapping has hit a page past the file's end
    /// (the file was truncated while mapped; see `mapped`).
    pub(crate) fn check_mapping(&self) -> Result<()> {
        self.map.check()
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
