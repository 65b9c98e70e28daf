//! The bytes of a packed file, version 1 (documented in `docs/packed-format.md`): the header,
//! the field schema, the per-sample metadata table and the raw-pixel record. Pure encoding and
//! decoding; the writer and the reader build on it.
//!
//! ```text
//! [header 64 B][schema][zero pad to page_size][data region][table]   (file ends with the table)
//! ```
//! Integers are little-endian. The checksum (CRC-32, crc32fast) covers the header (its checksum
//! field read as zero), the schema and the table; each field of each sample carries the CRC-32 of
//! its own bytes, checked when it is read.

use crate::dtype::DType;

/// The first 8 bytes of every packed file.
pub const MAGIC: [u8; 8] = *b"STKPACK\0";
/// The version this code writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the fixed header at the start of the file.
pub const HEADER_BYTES: usize = 64;
/// Bytes of one (sample, field) entry of the metadata table.
pub const ENTRY_BYTES: usize = 32;
/// The data region's page: 2 MiB, one x86-64 huge page and a read-ahead unit that amortizes a
/// disk seek. `order=quasi_random` shuffles within windows of pages.
pub const DEFAULT_PAGE_SIZE: u32 = 2 << 20;
/// Every sample's record starts on this boundary (a cache line).
pub const RECORD_ALIGN: u64 = 64;
/// The most fields a packed file may declare (the loader's limit).
pub const MAX_FIELDS: usize = crate::source::MAX_FIELDS;
/// Bounds on what a header may declare before anything sized by it is allocated.
pub const MAX_SCHEMA_BYTES: u32 = 1 << 16;
/// The most dims a schema field may declare.
pub const MAX_DIMS: usize = 8;

/// What one field of a packed file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedKind {
    /// An image per sample, each stored as JPEG/PNG or as a raw-pixel record (its entry's mode).
    Image = 1,
    /// A tensor of the same dtype and shape in every sample (int64 labels are `[]` of int64).
    Tensor = 2,
    /// A tensor whose leading dimension varies per sample.
    Ragged = 3,
    /// Bytes of any length (text, JSON, anything else).
    Bytes = 4,
}

impl PackedKind {
    fn from_code(code: u8) -> Option<PackedKind> {
        Some(match code {
            1 => PackedKind::Image,
            2 => PackedKind::Tensor,
            3 => PackedKind::Ragged,
            4 => PackedKind::Bytes,
            _ => return None,
        })
    }
}

/// One field of the schema. `dims` is the shape of a `Tensor`, the inner shape of a `Ragged`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedField {
    /// The field's name, UTF-8 (the schema stores its length in one byte).
    pub name: String,
    /// What the field holds.
    pub kind: PackedKind,
    /// Element type of a `Tensor` or `Ragged` field; `U8` for images and bytes.
    pub dtype: DType,
    /// A `Tensor`'s shape or a `Ragged`'s inner shape, at most [`MAX_DIMS`] dims.
    pub dims: Vec<usize>,
}

/// How an image entry is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageMode {
    /// Not an image field.
    None = 0,
    /// Encoded JPEG bytes.
    Jpeg = 1,
    /// Encoded PNG bytes.
    Png = 2,
    /// A raw-pixel record (see [`crate::source::pixels::RAW_MAGIC`]).
    Raw = 3,
}

impl ImageMode {
    /// The mode of a table entry's mode byte; `None` for an unknown code.
    pub fn from_code(code: u8) -> Option<ImageMode> {
        Some(match code {
            0 => ImageMode::None,
            1 => ImageMode::Jpeg,
            2 => ImageMode::Png,
            3 => ImageMode::Raw,
            _ => return None,
        })
    }
}

/// The fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Header offset 8: the format version, [`VERSION`].
    pub version: u32,
    /// Header offset 12: the data region's page in bytes, a power of two >= 4096.
    pub page_size: u32,
    /// Header offset 16: number of samples.
    pub num_samples: u64,
    /// Header offset 24: fields per sample, as many as the schema declares.
    pub num_fields: u32,
    /// Header offset 28: bytes of the schema, at most [`MAX_SCHEMA_BYTES`].
    pub schema_len: u32,
    /// Header offset 32: absolute offset of the data region, a multiple of `page_size`.
    pub data_offset: u64,
    /// Header offset 40: bytes of the data region.
    pub data_len: u64,
    /// Header offset 48: absolute offset of the metadata table, a multiple of 8.
    pub table_offset: u64,
    /// Header offset 56: CRC-32 of the header (this field read as 0), the schema and the table.
    pub checksum: u32,
}

impl Header {
    /// The header's 64 bytes (with `checksum` as stored).
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.page_size.to_le_bytes());
        b[16..24].copy_from_slice(&self.num_samples.to_le_bytes());
        b[24..28].copy_from_slice(&self.num_fields.to_le_bytes());
        b[28..32].copy_from_slice(&self.schema_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.data_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_len.to_le_bytes());
        b[48..56].copy_from_slice(&self.table_offset.to_le_bytes());
        b[56..60].copy_from_slice(&self.checksum.to_le_bytes());
        b
    }

    /// Parses a header, checking the magic and the version (the caller names the file).
    pub fn decode(b: &[u8]) -> Result<Header, String> {
        if b.len() < HEADER_BYTES {
            return Err(format!(
                "truncated: {} bytes, shorter than the {HEADER_BYTES}-byte header",
                b.len()
            ));
        }
        if b[0..8] != MAGIC {
            return Err(format!(
                "not a stoker packed file: magic is {:02x?}, expected {:02x?} (\"STKPACK\\0\")",
                &b[0..8],
                MAGIC
            ));
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(format!(
                "format version {version}, this stoker reads version {VERSION} (repack with this stoker)"
            ));
        }
        Ok(Header {
            version,
            page_size: u32_at(b, 12),
            num_samples: u64_at(b, 16),
            num_fields: u32_at(b, 24),
            schema_len: u32_at(b, 28),
            data_offset: u64_at(b, 32),
            data_len: u64_at(b, 40),
            table_offset: u64_at(b, 48),
            checksum: u32_at(b, 56),
        })
    }

    /// Bytes of the metadata table, or `None` if the header's counts overflow.
    pub fn table_len(&self) -> Option<u64> {
        self.num_samples
            .checked_mul(self.num_fields as u64)?
            .checked_mul(ENTRY_BYTES as u64)
    }
}

/// The checksum of a file: CRC-32 over the header (checksum field zeroed), schema and table.
pub fn checksum(header: &Header, schema: &[u8], table: &[u8]) -> u32 {
    let mut zeroed = *header;
    zeroed.checksum = 0;
    let mut h = crc32fast::Hasher::new();
    h.update(&zeroed.encode());
    h.update(schema);
    h.update(table);
    h.finalize()
}

/// Encodes the schema: per field, kind, dtype code, number of dims and name length (one byte
/// each), the UTF-8 name, then each dim as u64.
pub fn encode_schema(fields: &[PackedField]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fields {
        out.push(f.kind as u8);
        out.push(f.dtype.code() as u8);
        out.push(f.dims.len() as u8);
        out.push(f.name.len() as u8);
        out.extend_from_slice(f.name.as_bytes());
        for &d in &f.dims {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
    }
    out
}

/// Decodes `count` fields from `bytes` (which must be consumed exactly).
pub fn decode_schema(bytes: &[u8], count: usize) -> Result<Vec<PackedField>, String> {
    if count == 0 || count > MAX_FIELDS {
        return Err(format!(
            "the header declares {count} fields (1 to {MAX_FIELDS} allowed)"
        ));
    }
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let part = bytes
            .get(at..at.saturating_add(n))
            .ok_or_else(|| "the schema is truncated".to_string())?;
        at += n;
        Ok(part)
    };
    let mut fields = Vec::with_capacity(count);
    for i in 0..count {
        let head = take(4)?;
        let (kind, dtype, ndim, name_len) = (head[0], head[1], head[2] as usize, head[3] as usize);
        let kind = PackedKind::from_code(kind)
            .ok_or_else(|| format!("field {i}: unknown field kind {kind}"))?;
        let dtype = DType::from_code(dtype as u32)
            .ok_or_else(|| format!("field {i}: unknown dtype code {dtype}"))?;
        if ndim > MAX_DIMS {
            return Err(format!("field {i}: {ndim} dims (at most {MAX_DIMS})"));
        }
        let name = std::str::from_utf8(take(name_len)?)
            .map_err(|_| format!("field {i}: the name is not UTF-8"))?
            .to_owned();
        let mut dims = Vec::with_capacity(ndim);
        for _ in 0..ndim {
            let d = u64::from_le_bytes(take(8)?.try_into().unwrap_or([0; 8]));
            dims.push(
                usize::try_from(d)
                    .map_err(|_| format!("field `{name}`: dimension {d} too large"))?,
            );
        }
        fields.push(PackedField {
            name,
            kind,
            dtype,
            dims,
        });
    }
    if at != bytes.len() {
        return Err(format!(
            "the schema has {} bytes after its {count} fields",
            bytes.len() - at
        ));
    }
    Ok(fields)
}

/// One (sample, field) entry of the metadata table: where the bytes are (absolute file offset),
/// how many, the image's stored size and mode (so crops are planned without parsing a header),
/// and the CRC-32 of the bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Absolute file offset of the field's bytes (inside the data region).
    pub offset: u64,
    /// Length of the field's bytes.
    pub len: u64,
    /// Image width as stored, in pixels (0 for other kinds).
    pub width: u32,
    /// Image height as stored, in pixels (0 for other kinds).
    pub height: u32,
    /// The [`ImageMode`] code of an image; 0 for other kinds.
    pub mode: u8,
    /// CRC-32 of the field's bytes.
    pub crc: u32,
}

impl Entry {
    /// Appends the entry's [`ENTRY_BYTES`] bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.width.to_le_bytes());
        out.extend_from_slice(&self.height.to_le_bytes());
        out.extend_from_slice(&[self.mode, 0, 0, 0]);
        out.extend_from_slice(&self.crc.to_le_bytes());
    }

    /// Decodes entry `i` of a table (the caller checked the table's length).
    pub fn decode(table: &[u8], i: usize) -> Entry {
        let b = &table[i * ENTRY_BYTES..(i + 1) * ENTRY_BYTES];
        Entry {
            offset: u64_at(b, 0),
            len: u64_at(b, 8),
            width: u32_at(b, 16),
            height: u32_at(b, 20),
            mode: b[24],
            crc: u32_at(b, 28),
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Rounds `x` up to a multiple of `align` (a power of two).
pub fn align_up(x: u64, align: u64) -> u64 {
    x.div_ceil(align) * align
}
