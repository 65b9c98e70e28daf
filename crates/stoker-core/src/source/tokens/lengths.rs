//! The sidecar of document lengths of a flat token file: `NAME.lengths.npy` beside `NAME.bin`
//! (or `NAME.npy`), a 1-D integer `.npy` array of every document's length in tokens, in order.
//! Its lengths must sum to the file's token count. It gives a flat file its documents without an
//! end-of-document token (so `token_packing=pad` and `document_boundaries=reset` read them from
//! it), as a Megatron index does.
//!
//! The document starts (the lengths' running sums, 8 bytes a document) are built from the
//! sidecar the first time and cached ([`super::cache`], kind 2, keyed by both files' size and
//! mtime and a hash of their `.npy` headers and the sidecar's last 4 KiB); later opens map them.

use std::fs::Metadata;
use std::path::{Path, PathBuf};

use super::cache::{self, CacheKey, CachePlaces, FileStamp, Table};
use crate::error::{Error, Result};
use crate::hash::Fnv;
use crate::source::mapped::Mapping;
use crate::source::npy::parse_raw_header;
use crate::source::open_file;

/// What a sidecar's name ends with.
pub(super) const SUFFIX: &str = ".lengths.npy";

/// Cache kind of a flat file's document starts.
const CACHE_KIND: u32 = 2;

/// Bytes of the end of a sidecar hashed into the cache key with the headers.
const TAIL_BYTES: usize = 4096;

/// The sidecar of the token file `path`: its extension (if any) replaced by `.lengths.npy`.
pub(super) fn sidecar_of(path: &Path) -> PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!("{stem}{SUFFIX}"))
}

/// The sidecar's name of the token file named `name` (a path, `file://` or a URL); `None` for a
/// URL with a query or fragment (a signed URL names one object: its sidecar has another).
pub(super) fn sidecar_name(name: &str) -> Option<String> {
    if crate::source::remote::is_url(name) && name.contains(['?', '#']) {
        return None;
    }
    Some(sidecar_of(Path::new(name)).to_string_lossy().into_owned())
}

/// Whether a file named by a pattern is a sidecar rather than a token file.
pub(super) fn is_sidecar(name: &str) -> bool {
    name.ends_with(SUFFIX)
}

/// Reads one little-endian value of a sidecar's element type.
type Read = fn(&[u8]) -> i128;

/// The element types a sidecar may hold: the size and reader of an element of type `descr`.
fn reader(descr: &str) -> Option<(usize, Read)> {
    fn word<const N: usize>(b: &[u8]) -> [u8; N] {
        let mut w = [0u8; N];
        w.copy_from_slice(&b[..N]);
        w
    }
    Some(match descr {
        "<i2" => (2, |b| i128::from(i16::from_le_bytes(word(b)))),
        "<u2" => (2, |b| i128::from(u16::from_le_bytes(word(b)))),
        "<i4" => (4, |b| i128::from(i32::from_le_bytes(word(b)))),
        "<u4" => (4, |b| i128::from(u32::from_le_bytes(word(b)))),
        "<i8" => (8, |b| i128::from(i64::from_le_bytes(word(b)))),
        "<u8" => (8, |b| i128::from(u64::from_le_bytes(word(b)))),
        _ => return None,
    })
}

/// The document starts of the flat token file `data` (`tokens` tokens; `data_header` its `.npy`
/// header, empty for a raw file) from its sidecar `sidecar` (a remote one's cached copy; errors
/// name it `shown`): `documents + 1` entries from 0 to `tokens`. Errors name the sidecar and,
/// where the two disagree, both files and both numbers.
pub(super) fn document_starts(
    sidecar: &Path,
    shown: &Path,
    data: &Path,
    data_meta: &Metadata,
    data_header: &[u8],
    tokens: u64,
    places: &CachePlaces,
) -> Result<Table> {
    let (file, meta) = open_file(sidecar, "a sidecar of document lengths (.lengths.npy)")?;
    let map = Mapping::map(&file, sidecar)?;
    let header = parse_raw_header(&map).map_err(|r| Error::format(shown, r))?;
    let Some((size, get)) = reader(&header.descr) else {
        return Err(Error::format(
            shown,
            format!(
                "holds '{}'; document lengths are integers (<i2, <u2, <i4, <u4, <i8 or <u8)",
                header.descr
            ),
        ));
    };
    let [n] = header.shape[..] else {
        return Err(Error::format(
            shown,
            format!(
                "has shape {:?}; document lengths are a 1-D array",
                header.shape
            ),
        ));
    };
    let need = n as u128 * size as u128 + header.data_offset as u128;
    if need != map.len() as u128 {
        return Err(Error::format(
            shown,
            format!(
                "says {n} lengths of {} after a {}-byte header ({need} bytes), but the file has {}",
                header.descr,
                header.data_offset,
                map.len()
            ),
        ));
    }
    let mut hash = Fnv::new();
    hash.bytes(&map[..header.data_offset]);
    hash.bytes(&map[map.len() - TAIL_BYTES.min(map.len() - header.data_offset)..]);
    hash.bytes(data_header);
    let key = CacheKey {
        kind: CACHE_KIND,
        path: cache::absolute(sidecar),
        files: [FileStamp::of(&meta), FileStamp::of(data_meta)],
        header: hash.finish(),
    };
    if let Some(([starts, _, _], _)) = places.load(&key) {
        let s = starts.as_slice();
        if s.len() == n + 1 && s.first() == Some(&0) && s.last() == Some(&tokens) {
            return Ok(starts);
        }
    }
    // Bounded by the sidecar's size, checked above: 8 bytes a document for lengths of ≥ 2.
    let mut starts = Vec::with_capacity(n + 1);
    starts.push(0u64);
    let mut total: u128 = 0;
    for (d, b) in map[header.data_offset..].chunks_exact(size).enumerate() {
        let len = get(b);
        if len < 0 {
            return Err(Error::format(
                shown,
                format!("document {d} has length {len} < 0"),
            ));
        }
        total += len as u128;
        // Past the file's tokens already: the mismatch below names the full sum.
        starts.push(u64::try_from(total).unwrap_or(u64::MAX).min(tokens));
    }
    map.check()?;
    if total != u128::from(tokens) {
        return Err(Error::format(
            shown,
            format!(
                "its {n} document lengths sum to {total} tokens, but {} holds {tokens} tokens",
                data.display()
            ),
        ));
    }
    places.save(&key, [&starts, &[], &[]]);
    Ok(Table::Owned(starts))
}
