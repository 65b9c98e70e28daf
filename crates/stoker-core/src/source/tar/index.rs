//! The index of a shard's samples, and its cache on disk.
//!
//! Scanning a shard reads every tar header, which for a large dataset on a network filesystem
//! takes minutes; the result is saved so later runs (and the other ranks of a job) only read a
//! small file. Where it goes, in order of preference:
//!
//! 1. beside the shard, as the hidden file `.NAME.idx` (`train-000003.tar` →
//!    `.train-000003.tar.idx`): hidden so that a glob like `train-*` never picks it up as a shard;
//! 2. when that directory is not writable, in a cache directory (`TarConfig::index_dir`, default
//!    `$XDG_CACHE_HOME/stoker/tar-index` or `~/.cache/stoker/tar-index`), named by a hash of the
//!    shard's absolute path (`<fnv64 hex>-NAME.idx`); the path is stored inside to rule out
//!    collisions;
//! 3. when neither is writable, nowhere: the index lives in memory for this run only.
//!
//! Files are written to a temporary name and renamed, so a reader never sees a partial file and
//! concurrent writers (ranks on one node) each leave a whole, identical file.
//!
//! An index file is never trusted blindly: it is used only if its magic, version, shard size,
//! shard mtime (and, in the cache directory, shard path) match and its CRC-32 is right, and every
//! count and offset in it is bounded by the shard's size before anything is allocated from it.
//! Anything else (stale, corrupt, another version) is ignored and the shard is scanned again.
//!
//! ## Format, version 1 (all integers little-endian)
//!
//! ```text
//! magic          8  b"STKTARIX"
//! version        u32 = 1
//! shard size     u64   bytes
//! shard mtime    i64 seconds, u32 nanoseconds
//! path           u32 length + UTF-8 bytes (the shard's absolute path)
//! extensions     u32 count, then each: u16 length + UTF-8 bytes
//! samples        u64 count, then each:
//!                  u32 key length + UTF-8 key, u64 header offset of the first member,
//!                  u32 member count, then each member: u32 extension id, u64 data offset,
//!                  u64 size
//! crc32          u32 of every byte before it
//! ```
//!
//! The grouping rule is part of the format: changing it means a new version.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::scan::{ScannedSample, BLOCK, MAX_MEMBERS_PER_SAMPLE};

const MAGIC: &[u8; 8] = b"STKTARIX";
const VERSION: u32 = 1;

/// One member in an index: its extension (an id into the shard's extension table), data offset
/// and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct IndexedMember {
    pub ext: u32,
    pub offset: u64,
    pub size: u64,
}

/// Every sample of one shard, compactly: one string for all keys, one array for all members.
#[derive(Debug, Default, PartialEq)]
pub(super) struct ShardIndex {
    exts: Vec<String>,
    keys: String,
    key_ends: Vec<usize>,
    offsets: Vec<u64>,
    member_ends: Vec<usize>,
    members: Vec<IndexedMember>,
}

impl ShardIndex {
    pub fn from_samples(samples: &[ScannedSample]) -> ShardIndex {
        let mut index = ShardIndex::default();
        for s in samples {
            index.keys.push_str(&s.key);
            index.key_ends.push(index.keys.len());
            index.offsets.push(s.offset);
            for m in &s.members {
                let ext = match index.exts.iter().position(|e| *e == m.ext) {
                    Some(i) => i,
                    None => {
                        index.exts.push(m.ext.clone());
                        index.exts.len() - 1
                    }
                };
                index.members.push(IndexedMember {
                    ext: ext as u32,
                    offset: m.offset,
                    size: m.size,
                });
            }
            index.member_ends.push(index.members.len());
        }
        index
    }

    pub fn len(&self) -> usize {
        self.key_ends.len()
    }

    pub fn key(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.key_ends[i - 1] };
        &self.keys[start..self.key_ends[i]]
    }

    /// Byte offset of sample `i`'s first header.
    pub fn offset(&self, i: usize) -> u64 {
        self.offsets[i]
    }

    pub fn members(&self, i: usize) -> &[IndexedMember] {
        let start = if i == 0 { 0 } else { self.member_ends[i - 1] };
        &self.members[start..self.member_ends[i]]
    }

    pub fn ext(&self, id: u32) -> &str {
        &self.exts[id as usize]
    }

    fn encode(&self, stamp: &Stamp) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.keys.len() + 20 * self.members.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&stamp.size.to_le_bytes());
        out.extend_from_slice(&stamp.mtime_s.to_le_bytes());
        out.extend_from_slice(&stamp.mtime_ns.to_le_bytes());
        put_str32(&mut out, &stamp.path);
        out.extend_from_slice(&(self.exts.len() as u32).to_le_bytes());
        for e in &self.exts {
            out.extend_from_slice(&(e.len() as u16).to_le_bytes());
            out.extend_from_slice(e.as_bytes());
        }
        out.extend_from_slice(&(self.len() as u64).to_le_bytes());
        for i in 0..self.len() {
            put_str32(&mut out, self.key(i));
            out.extend_from_slice(&self.offsets[i].to_le_bytes());
            let members = self.members(i);
            out.extend_from_slice(&(members.len() as u32).to_le_bytes());
            for m in members {
                out.extend_from_slice(&m.ext.to_le_bytes());
                out.extend_from_slice(&m.offset.to_le_bytes());
                out.extend_from_slice(&m.size.to_le_bytes());
            }
        }
        let mut crc = flate2::Crc::new();
        crc.update(&out);
        out.extend_from_slice(&crc.sum().to_le_bytes());
        out
    }

    /// Decodes an index file, checking it against the shard. `Err` says why it is not used.
    fn decode(
        bytes: &[u8],
        stamp: &Stamp,
        check_path: bool,
    ) -> std::result::Result<ShardIndex, &'static str> {
        let (body, crc_bytes) = bytes
            .split_last_chunk::<4>()
            .ok_or("shorter than a header")?;
        let mut crc = flate2::Crc::new();
        crc.update(body);
        if crc.sum() != u32::from_le_bytes(*crc_bytes) {
            return Err("bad checksum");
        }
        let mut d = Decoder { b: body, at: 0 };
        if d.take(8) != Some(MAGIC.as_slice()) {
            return Err("not a stoker tar index");
        }
        if d.u32() != Some(VERSION) {
            return Err("another format version");
        }
        let size = d.u64().ok_or("short")?;
        let mtime_s = d.u64().ok_or("short")? as i64;
        let mtime_ns = d.u32().ok_or("short")?;
        if size != stamp.size || mtime_s != stamp.mtime_s || mtime_ns != stamp.mtime_ns {
            return Err("stale: the shard's size or mtime changed");
        }
        let path = d.str32().ok_or("bad path")?;
        if check_path && path != stamp.path {
            return Err("written for another shard");
        }
        // Every member takes at least one 512-byte header in the shard.
        let max_members = size / BLOCK;
        let n_exts = d.u32().ok_or("short")? as u64;
        if n_exts > max_members || n_exts > d.remaining() as u64 / 2 {
            return Err("too many extensions");
        }
        let mut exts = Vec::with_capacity(n_exts as usize);
        for _ in 0..n_exts {
            let len = d.u16().ok_or("short")? as usize;
            let e = d.take(len).ok_or("short")?;
            exts.push(
                std::str::from_utf8(e)
                    .map_err(|_| "bad extension")?
                    .to_owned(),
            );
        }
        let n = d.u64().ok_or("short")?;
        // A sample is at least 16 bytes here (key length, offset, member count).
        if n > max_members || n > d.remaining() as u64 / 16 {
            return Err("too many samples");
        }
        let n = n as usize;
        let mut index = ShardIndex {
            exts,
            keys: String::new(),
            key_ends: Vec::with_capacity(n),
            offsets: Vec::with_capacity(n),
            member_ends: Vec::with_capacity(n),
            members: Vec::new(),
        };
        for _ in 0..n {
            let key = d.str32().ok_or("bad key")?;
            index.keys.push_str(key);
            index.key_ends.push(index.keys.len());
            let offset = d.u64().ok_or("short")?;
            if offset >= size {
                return Err("offset past the shard");
            }
            index.offsets.push(offset);
            let count = d.u32().ok_or("short")? as usize;
            if count == 0 || count > MAX_MEMBERS_PER_SAMPLE || count > d.remaining() / 20 {
                return Err("bad member count");
            }
            for _ in 0..count {
                let ext = d.u32().ok_or("short")?;
                let offset = d.u64().ok_or("short")?;
                let len = d.u64().ok_or("short")?;
                if ext as u64 >= n_exts || offset.checked_add(len).is_none_or(|end| end > size) {
                    return Err("member outside the shard");
                }
                index.members.push(IndexedMember {
                    ext,
                    offset,
                    size: len,
                });
            }
            if index.members.len() as u64 > max_members {
                return Err("too many members");
            }
            index.member_ends.push(index.members.len());
        }
        if d.remaining() != 0 {
            return Err("trailing bytes");
        }
        Ok(index)
    }
}

fn put_str32(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A bounds-checked little-endian reader over an index file.
struct Decoder<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Decoder<'a> {
    fn remaining(&self) -> usize {
        self.b.len() - self.at
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn str32(&mut self) -> Option<&'a str> {
        let len = self.u32()? as usize;
        std::str::from_utf8(self.take(len)?).ok()
    }
}

/// What identifies the shard an index was made from.
#[derive(Clone, Debug)]
pub(super) struct Stamp {
    pub path: String,
    pub size: u64,
    pub mtime_s: i64,
    pub mtime_ns: u32,
}

impl Stamp {
    pub fn of(path: &Path, meta: &fs::Metadata) -> Stamp {
        let absolute = fs::canonicalize(path)
            .or_else(|_| std::path::absolute(path))
            .unwrap_or_else(|_| path.to_owned());
        Stamp {
            path: absolute.to_string_lossy().into_owned(),
            size: meta.len(),
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec().clamp(0, 999_999_999) as u32,
        }
    }
}

/// Where a shard's index came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexOrigin {
    /// Read from this index file.
    Loaded(PathBuf),
    /// Built by scanning the shard, then saved to this file (`None`: kept in memory only).
    Scanned {
        /// The index file written, if any.
        saved: Option<PathBuf>,
    },
}

/// Where to look for and put index files.
#[derive(Clone, Debug)]
pub(super) struct IndexPlaces {
    /// Try beside the shard first.
    pub beside: bool,
    /// The cache directory, if any.
    pub dir: Option<PathBuf>,
}

impl IndexPlaces {
    /// `$XDG_CACHE_HOME/stoker/tar-index`, else `$HOME/.cache/stoker/tar-index`.
    pub fn default_dir() -> Option<PathBuf> {
        let from = |var: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
        };
        from("XDG_CACHE_HOME")
            .or_else(|| from("HOME").map(|h| h.join(".cache")))
            .map(|c| c.join("stoker").join("tar-index"))
    }

    fn beside_path(shard: &Path) -> Option<PathBuf> {
        let name = shard.file_name()?.to_string_lossy();
        Some(shard.with_file_name(format!(".{name}.idx")))
    }

    fn cache_path(&self, stamp: &Stamp, shard: &Path) -> Option<PathBuf> {
        let name = shard.file_name()?.to_string_lossy();
        let dir = self.dir.as_ref()?;
        Some(dir.join(format!(
            "{:016x}-{name}.idx",
            crate::hash::Fnv::of(stamp.path.as_bytes())
        )))
    }

    /// The index of `shard` from an index file, or by scanning `scan()` and saving the result.
    pub fn load_or_build(
        &self,
        shard: &Path,
        stamp: &Stamp,
        scan: impl FnOnce() -> crate::error::Result<ShardIndex>,
    ) -> crate::error::Result<(ShardIndex, IndexOrigin)> {
        let beside = self.beside.then(|| Self::beside_path(shard)).flatten();
        let cached = self.cache_path(stamp, shard);
        for (path, check_path) in [(&beside, false), (&cached, true)] {
            if let Some(path) = path {
                if let Some(index) = read_index(path, stamp, check_path) {
                    return Ok((index, IndexOrigin::Loaded(path.clone())));
                }
            }
        }
        let index = scan()?;
        let bytes = index.encode(stamp);
        let mut saved = None;
        if let Some(path) = &beside {
            if write_atomic(path, &bytes).is_ok() {
                saved = Some(path.clone());
            }
        }
        if saved.is_none() {
            if let Some(path) = &cached {
                let ok = path
                    .parent()
                    .is_some_and(|dir| fs::create_dir_all(dir).is_ok())
                    && write_atomic(path, &bytes).is_ok();
                if ok {
                    saved = Some(path.clone());
                }
            }
        }
        Ok((index, IndexOrigin::Scanned { saved }))
    }
}

/// Reads and checks an index file; `None` if it is missing, unreadable, stale or corrupt.
fn read_index(path: &Path, stamp: &Stamp, check_path: bool) -> Option<ShardIndex> {
    use std::io::Read;
    // Generous: an index is well under the shard's size plus its path and header.
    let limit = stamp
        .size
        .saturating_mul(2)
        .saturating_add(stamp.path.len() as u64 + (1 << 20));
    let file = fs::File::open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > limit {
        return None;
    }
    ShardIndex::decode(&bytes, stamp, check_path).ok()
}

/// Writes `bytes` to a temporary file beside `target`, then renames it over `target`.
pub(crate) fn write_atomic(target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = target
        .file_name()
        .ok_or_else(|| std::io::Error::other("no file name"))?
        .to_string_lossy();
    let tmp = target.with_file_name(format!(
        "{name}.tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = fs::write(&tmp, bytes).and_then(|_| fs::rename(&tmp, target));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::super::scan::ScannedMember;
    use super::*;

    fn stamp() -> Stamp {
        Stamp {
            path: "/data/a.tar".into(),
            size: 1 << 20,
            mtime_s: 1_700_000_000,
            mtime_ns: 123,
        }
    }

    fn samples() -> Vec<ScannedSample> {
        (0..5u64)
            .map(|i| ScannedSample {
                key: format!("k{i:03}"),
                offset: i * 2048,
                members: vec![
                    ScannedMember {
                        ext: "jpg".into(),
                        offset: i * 2048 + 512,
                        size: 700,
                    },
                    ScannedMember {
                        ext: if i % 2 == 0 { "cls" } else { "label" }.into(),
                        offset: i * 2048 + 1536,
                        size: 1,
                    },
                ],
            })
            .collect()
    }

    #[test]
    fn round_trips_and_checks_the_stamp() {
        let index = ShardIndex::from_samples(&samples());
        assert_eq!(index.len(), 5);
        assert_eq!(index.key(3), "k003");
        assert_eq!(index.ext(index.members(1)[1].ext), "label");
        let bytes = index.encode(&stamp());
        assert_eq!(ShardIndex::decode(&bytes, &stamp(), true).unwrap(), index);

        let mut other = stamp();
        other.mtime_ns += 1;
        assert!(ShardIndex::decode(&bytes, &other, false).is_err());
        let mut other = stamp();
        other.size += 1;
        assert!(ShardIndex::decode(&bytes, &other, false).is_err());
        let mut other = stamp();
        other.path = "/data/b.tar".into();
        assert!(ShardIndex::decode(&bytes, &other, true).is_err());
        assert!(ShardIndex::decode(&bytes, &other, false).is_ok());
    }

    #[test]
    fn corrupt_or_lying_files_are_rejected() {
        let index = ShardIndex::from_samples(&samples());
        let bytes = index.encode(&stamp());
        // Every single-byte change and every truncation is caught (by the CRC, at least).
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x5a;
            assert!(ShardIndex::decode(&b, &stamp(), true).is_err(), "flip {i}");
            assert!(
                ShardIndex::decode(&bytes[..i], &stamp(), true).is_err(),
                "cut {i}"
            );
        }
        // A well-formed file (right CRC) that lies about counts or offsets is rejected too.
        let mut lying = samples();
        lying[2].members[0].size = 1 << 21;
        let b = ShardIndex::from_samples(&lying).encode(&stamp());
        assert_eq!(
            ShardIndex::decode(&b, &stamp(), true),
            Err("member outside the shard")
        );
        let mut small = stamp();
        small.size = 2048; // room for 4 headers, yet the file claims 5 samples
        let b = index.encode(&small);
        assert_eq!(
            ShardIndex::decode(&b, &small, true),
            Err("too many samples")
        );
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(crate::hash::Fnv::of(b""), 0xcbf29ce484222325);
        assert_eq!(crate::hash::Fnv::of(b"a"), 0xaf63dc4c8601ec8c);
    }
}
