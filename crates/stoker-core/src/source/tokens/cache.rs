//! The cache of a token file's per-document tables, so that only the first open of a dataset
//! reads its index: later opens (restarts, the other ranks of a job) map the cached tables and
//! check a fixed-size header, and do no work per document beyond one CRC-32 pass over the
//! tables (hardware-accelerated; it is what keeps a damaged cache from ever being trusted).
//!
//! Where a cache file goes, in order of preference (as the tar index does, `tar::index`):
//!
//! 1. beside the data, as the hidden file `.NAME.stkidx` (`data/part-0.idx` →
//!    `data/.part-0.idx.stkidx`), which no `tokens:` or `megatron:` pattern names;
//! 2. when that directory is not writable, in `$XDG_CACHE_HOME/stoker/token-index` (else
//!    `~/.cache/stoker/token-index`), named `<fnv64 of the absolute path>-NAME.stkidx`;
//! 3. when neither is writable, nowhere: the tables live in memory for this run only.
//!
//! A cache file is written to a temporary name and renamed, so a reader never sees a partial
//! file and ranks opening the same dataset at once each leave a whole, identical file.
//!
//! It is used only if its magic, version and kind match, its key matches — the absolute path's
//! hash, the size, mtime and a hash of the inode and ctime of each file it was built from (an
//! mtime set back with `utime` does not hide a rewrite: ctime is the kernel's), and a hash of
//! the files' headers —
//! and both CRCs are right; the caller then bounds every count by the data's sizes. Anything
//! else (stale, corrupt, another version) is ignored and the tables are built again.
//!
//! ## Format, version 2 (all integers little-endian)
//!
//! ```text
//!   0  magic        8  b"STKTOKIX"
//!   8  version      u32 = 2
//!  12  kind         u32 (1: a Megatron index; 2: a flat file's document lengths)
//!  16  path hash    u64 (FNV-1a of the absolute path of the first file)
//!  24  file 0       u64 size, i64 mtime seconds, u32 mtime nanoseconds, u32 change (the low
//!                   32 bits of FNV-1a of the inode, ctime seconds and nanoseconds)
//!  48  file 1       the same (zeros when there is one file)
//!  72  header hash  u64 (FNV-1a of the files' headers, as the kind defines them)
//!  80  table sizes  3 × u64 (entries of each table; 0 for a table not stored)
//! 104  tables CRC   u32 (CRC-32 of every byte after the header)
//! 108  header CRC   u32 (CRC-32 of bytes 0..108)
//! 112  tables       u64 entries, one table after the other
//! ```

use crate::source::tar::index::write_atomic;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::hash::Fnv;
use crate::source::mapped::Mapping;

const MAGIC: &[u8; 8] = b"STKTOKIX";
const VERSION: u32 = 2;
/// Bytes of the fixed header; the tables start here (a multiple of 8, so they are aligned in a
/// page-aligned mapping).
const HEADER: usize = 112;
/// Tables per cache file.
pub(super) const TABLES: usize = 3;

/// What a cache file was built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(super) struct FileStamp {
    pub size: u64,
    pub mtime_s: i64,
    pub mtime_ns: u32,
    /// A hash of the inode and ctime: a file rewritten in place or replaced, whatever mtime it
    /// was given.
    pub change: u32,
}

impl FileStamp {
    pub fn of(meta: &fs::Metadata) -> FileStamp {
        let mut change = Fnv::new();
        change.bytes(&meta.ino().to_le_bytes());
        change.bytes(&meta.ctime().to_le_bytes());
        change.bytes(&meta.ctime_nsec().to_le_bytes());
        FileStamp {
            size: meta.len(),
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec().clamp(0, 999_999_999) as u32,
            change: change.finish() as u32,
        }
    }
}

/// The key a cache file must match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct CacheKey {
    /// What the tables are (1: Megatron, 2: flat lengths).
    pub kind: u32,
    /// The absolute path of the first file (its hash is stored; the cache file is named by it).
    pub path: PathBuf,
    pub files: [FileStamp; 2],
    /// A hash of the files' headers.
    pub header: u64,
}

impl CacheKey {
    fn path_hash(&self) -> u64 {
        Fnv::of(self.path.as_os_str().as_encoded_bytes())
    }
}

/// The absolute form of `path` (symlinks resolved where possible), for cache keys.
pub(super) fn absolute(path: &Path) -> PathBuf {
    fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_owned())
}

/// One table of u64 entries: built in memory, or read in place from a cache file's mapping.
pub(super) enum Table {
    Owned(Vec<u64>),
    Mapped {
        map: std::sync::Arc<Mapping>,
        at: usize,
        len: usize,
    },
}

impl Table {
    pub fn as_slice(&self) -> &[u64] {
        match self {
            Table::Owned(v) => v,
            Table::Mapped { map, at, len } => {
                let bytes = &map[*at..*at + *len * 8];
                // SAFETY: every bit pattern is a valid u64, and `align_to` only puts whole,
                // aligned u64s in the middle slice; `load` checked that the mapping is aligned
                // here (the prefix is empty) and that the target is little-endian, the byte
                // order the file is written in.
                let (head, words, _) = unsafe { bytes.align_to::<u64>() };
                debug_assert!(head.is_empty());
                words
            }
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }
}

/// Where cache files are looked for and put.
#[derive(Clone, Debug)]
pub(super) struct CachePlaces {
    /// Try beside the data first.
    pub beside: bool,
    /// The cache directory, if any.
    pub dir: Option<PathBuf>,
}

impl Default for CachePlaces {
    fn default() -> Self {
        CachePlaces {
            beside: true,
            dir: default_dir(),
        }
    }
}

/// `$XDG_CACHE_HOME/stoker/token-index`, else `$HOME/.cache/stoker/token-index`.
pub(super) fn default_dir() -> Option<PathBuf> {
    let from = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    from("XDG_CACHE_HOME")
        .or_else(|| from("HOME").map(|h| h.join(".cache")))
        .map(|c| c.join("stoker").join("token-index"))
}

impl CachePlaces {
    /// The candidate cache files of `key`, in order of preference.
    fn paths(&self, key: &CacheKey) -> Vec<PathBuf> {
        let Some(name) = key.path.file_name().map(|n| n.to_string_lossy()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if self.beside {
            out.push(key.path.with_file_name(format!(".{name}.stkidx")));
        }
        if let Some(dir) = &self.dir {
            out.push(dir.join(format!("{:016x}-{name}.stkidx", key.path_hash())));
        }
        out
    }

    /// The tables of a cache file matching `key`, mapped in place, and that file; `None` when
    /// none is found or none can be trusted.
    pub fn load(&self, key: &CacheKey) -> Option<([Table; TABLES], PathBuf)> {
        if cfg!(target_endian = "big") {
            return None;
        }
        self.paths(key)
            .into_iter()
            .find_map(|path| load(&path, key).map(|t| (t, path)))
    }

    /// Writes `tables` to the first place that takes them; the file written, if any.
    pub fn save(&self, key: &CacheKey, tables: [&[u64]; TABLES]) -> Option<PathBuf> {
        let bytes = encode(key, tables);
        self.paths(key).into_iter().find(|path| {
            path.parent().is_some_and(|d| fs::create_dir_all(d).is_ok())
                && write_atomic(path, &bytes).is_ok()
        })
    }
}

fn encode(key: &CacheKey, tables: [&[u64]; TABLES]) -> Vec<u8> {
    let entries: usize = tables.iter().map(|t| t.len()).sum();
    let mut out = Vec::with_capacity(HEADER + 8 * entries);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&key.kind.to_le_bytes());
    out.extend_from_slice(&key.path_hash().to_le_bytes());
    for f in &key.files {
        out.extend_from_slice(&f.size.to_le_bytes());
        out.extend_from_slice(&f.mtime_s.to_le_bytes());
        out.extend_from_slice(&f.mtime_ns.to_le_bytes());
        out.extend_from_slice(&f.change.to_le_bytes());
    }
    out.extend_from_slice(&key.header.to_le_bytes());
    for t in &tables {
        out.extend_from_slice(&(t.len() as u64).to_le_bytes());
    }
    let crc_at = out.len();
    out.extend_from_slice(&[0; 8]);
    for t in &tables {
        for v in t.iter() {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    let tables_crc = crc32fast::hash(&out[HEADER..]);
    out[crc_at..crc_at + 4].copy_from_slice(&tables_crc.to_le_bytes());
    let header_crc = crc32fast::hash(&out[..crc_at + 4]);
    out[crc_at + 4..crc_at + 8].copy_from_slice(&header_crc.to_le_bytes());
    out
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// Checks a cache file's header against `key` and its size; the entries of each table, or why
/// it is not used.
fn check_header(
    b: &[u8],
    key: &CacheKey,
    file_len: u64,
) -> std::result::Result<[usize; TABLES], &'static str> {
    if b.len() < HEADER {
        return Err("shorter than the header");
    }
    if crc32fast::hash(&b[..108]) != u32_at(b, 108) {
        return Err("bad header checksum");
    }
    if &b[..8] != MAGIC {
        return Err("not a stoker token index cache");
    }
    if u32_at(b, 8) != VERSION {
        return Err("another format version");
    }
    if u32_at(b, 12) != key.kind || u64_at(b, 16) != key.path_hash() {
        return Err("written for another file");
    }
    for (i, f) in key.files.iter().enumerate() {
        let at = 24 + 24 * i;
        let stored = FileStamp {
            size: u64_at(b, at),
            mtime_s: u64_at(b, at + 8) as i64,
            mtime_ns: u32_at(b, at + 16),
            change: u32_at(b, at + 20),
        };
        if stored != *f {
            return Err("stale: a file's size, mtime, inode or ctime changed");
        }
    }
    if u64_at(b, 72) != key.header {
        return Err("stale: a file's header changed");
    }
    let mut sizes = [0usize; TABLES];
    let mut bytes = HEADER as u128;
    for (i, size) in sizes.iter_mut().enumerate() {
        let n = u64_at(b, 80 + 8 * i);
        bytes += 8 * u128::from(n);
        // Bounded by the file's length below, which is a usize once mapped.
        *size = usize::try_from(n).map_err(|_| "a table larger than memory")?;
    }
    if bytes != u128::from(file_len) {
        return Err("the tables' sizes disagree with the file's");
    }
    Ok(sizes)
}

/// Maps and checks one cache file; `None` if it is missing, unreadable, stale or corrupt.
fn load(path: &Path, key: &CacheKey) -> Option<[Table; TABLES]> {
    let file = fs::File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() < HEADER as u64 {
        return None;
    }
    let map = Mapping::map(&file, path).ok()?;
    let sizes = check_header(&map, key, map.len() as u64).ok()?;
    if crc32fast::hash(&map[HEADER..]) != u32_at(&map, 104) || map.check().is_err() {
        return None;
    }
    // The tables are read in place as u64s: the mapping is page-aligned and HEADER is a
    // multiple of 8, but say so rather than assume it.
    if map.as_ptr().align_offset(8) != 0 {
        return None;
    }
    let map = std::sync::Arc::new(map);
    let mut at = HEADER;
    Some(sizes.map(|len| {
        let t = Table::Mapped {
            map: map.clone(),
            at,
            len,
        };
        at += 8 * len;
        t
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(path: &Path) -> CacheKey {
        CacheKey {
            kind: 1,
            path: path.to_owned(),
            files: [
                FileStamp {
                    size: 100,
                    mtime_s: 1_700_000_000,
                    mtime_ns: 5,
                    change: 7,
                },
                FileStamp::default(),
            ],
            header: 42,
        }
    }

    #[test]
    fn round_trips_and_refuses_every_damaged_byte_and_every_changed_key() {
        let dir = std::env::temp_dir().join(format!("stoker-token-cache-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let data = dir.join("d.idx");
        let places = CachePlaces {
            beside: true,
            dir: None,
        };
        let k = key(&data);
        let tables: [&[u64]; TABLES] = [&[0, 3, 7], &[], &[9]];
        let saved = places.save(&k, tables).unwrap();
        assert_eq!(saved, dir.join(".d.idx.stkidx"));
        let (loaded, from) = places.load(&k).unwrap();
        assert_eq!(from, saved);
        for (t, want) in loaded.iter().zip(tables) {
            assert_eq!(t.as_slice(), want);
        }
        let good = fs::read(&saved).unwrap();
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x21;
            fs::write(&saved, &b).unwrap();
            assert!(places.load(&k).is_none(), "flip {i}");
            fs::write(&saved, &good[..i]).unwrap();
            assert!(places.load(&k).is_none(), "cut {i}");
        }
        fs::write(&saved, &good).unwrap();
        let mut other = k.clone();
        other.files[0].mtime_ns += 1;
        assert!(places.load(&other).is_none());
        let mut other = k.clone();
        other.files[0].change += 1;
        assert!(places.load(&other).is_none());
        let mut other = k.clone();
        other.header += 1;
        assert!(places.load(&other).is_none());
        let mut other = k.clone();
        other.kind = 2;
        assert!(places.load(&other).is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}
