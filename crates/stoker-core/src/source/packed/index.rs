//! The dataset index: a small text file (`index.stkidx`) listing the shards of a packed dataset
//! in sample order, with each shard's sample count, size and checksum, so a swapped, replaced or
//! missing shard is an error at open. And the resolution of `packed:PATH` to shard files.
//!
//! ```text
//! stoker-packed-index 1
//! part-00000-of-00002-00000.stkpack<TAB>1200<TAB>52428800<TAB>1c2b3a4d
//! ```

use std::path::{Path, PathBuf};

use super::read::PackedFile;
use crate::error::{Error, Result};

/// The index file's name inside a dataset directory.
pub const INDEX_NAME: &str = "index.stkidx";
/// The first line of an index file.
pub const INDEX_MAGIC: &str = "stoker-packed-index 1";
/// An index larger than this is refused before it is read (a million shards fit).
const MAX_INDEX_BYTES: u64 = 256 << 20;

/// What the index says about one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// The file name, relative to the index's directory.
    pub name: String,
    /// Samples in the shard (its header's `num_samples`).
    pub samples: u64,
    /// The shard file's size in bytes.
    pub bytes: u64,
    /// The shard's header checksum.
    pub checksum: u32,
}

impl IndexEntry {
    /// The entry describing an opened shard.
    pub fn of(name: &str, file: &PackedFile, bytes: u64) -> IndexEntry {
        IndexEntry {
            name: name.to_owned(),
            samples: file.header().num_samples,
            bytes,
            checksum: file.header().checksum,
        }
    }
}

/// Writes `entries` as the index of `dir`, atomically (a temporary file, then a rename).
pub fn write_index(dir: &Path, entries: &[IndexEntry]) -> Result<PathBuf> {
    let mut text = format!("{INDEX_MAGIC}\n");
    for e in entries {
        text.push_str(&format!(
            "{}\t{}\t{}\t{:08x}\n",
            e.name, e.samples, e.bytes, e.checksum
        ));
    }
    let path = dir.join(INDEX_NAME);
    let tmp = dir.join(format!(".{INDEX_NAME}.tmp"));
    std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    Ok(path)
}

/// Parses an index file's text.
pub fn parse_index(path: &Path, text: &str) -> Result<Vec<IndexEntry>> {
    let bad = |line: usize, reason: String| Error::format(path, format!("line {line}: {reason}"));
    let mut lines = text.lines();
    match lines.next() {
        Some(INDEX_MAGIC) => {}
        Some(first) if first.starts_with("stoker-packed-index ") => {
            return Err(bad(
                1,
                format!("index version `{first}`, this stoker reads `{INDEX_MAGIC}`"),
            ))
        }
        _ => {
            return Err(bad(
                1,
                format!("not a packed dataset index (expected `{INDEX_MAGIC}`)"),
            ))
        }
    }
    let mut entries = Vec::new();
    for (n, line) in lines.enumerate() {
        let line_no = n + 2;
        if line.is_empty() {
            continue;
        }
        let parts: Vec<&str> = line.split('\t').collect();
        let [name, samples, bytes, checksum] = parts[..] else {
            return Err(bad(
                line_no,
                "expected NAME, SAMPLES, BYTES and CHECKSUM separated by tabs".into(),
            ));
        };
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(bad(
                line_no,
                format!("shard name `{name}` must be a file in the index's directory"),
            ));
        }
        let num = |what: &str, v: &str| {
            v.parse::<u64>()
                .map_err(|_| bad(line_no, format!("{what} `{v}` is not a number")))
        };
        entries.push(IndexEntry {
            name: name.to_owned(),
            samples: num("samples", samples)?,
            bytes: num("bytes", bytes)?,
            checksum: u32::from_str_radix(checksum, 16)
                .map_err(|_| bad(line_no, format!("checksum `{checksum}` is not hex")))?,
        });
    }
    if entries.is_empty() {
        return Err(Error::format(path, "the index lists no shard"));
    }
    Ok(entries)
}

/// One shard to open, with what the index (if any) says it must be.
#[derive(Clone, Debug)]
pub struct ListedShard {
    /// The shard file's path.
    pub path: PathBuf,
    /// Its index entry; `None` when no index lists it.
    pub expect: Option<IndexEntry>,
}

impl ListedShard {
    /// Checks an opened shard against its index entry.
    pub fn check(&self, file: &PackedFile) -> Result<()> {
        let Some(e) = &self.expect else {
            return Ok(());
        };
        let size = std::fs::metadata(&self.path)
            .map_err(|err| Error::io(&self.path, err))?
            .len();
        let h = file.header();
        if (h.num_samples, size, h.checksum) != (e.samples, e.bytes, e.checksum) {
            return Err(Error::format(
                &self.path,
                format!(
                    "does not match the dataset index: the index says {} samples, {} bytes, checksum {:08x}; the file has {} samples, {size} bytes, checksum {:08x} (repack it or rerun `stoker pack --merge`)",
                    e.samples, e.bytes, e.checksum, h.num_samples, h.checksum
                ),
            ));
        }
        Ok(())
    }
}

/// The shards `packed:PATH` names, in sample order.
#[derive(Clone, Debug)]
pub struct ShardListing {
    /// The shards, in sample order.
    pub shards: Vec<ListedShard>,
}

impl ShardListing {
    /// The shards' names and checksums (not their directory: a moved dataset resumes).
    pub fn identity(&self) -> String {
        let mut s = String::new();
        for shard in &self.shards {
            let name = shard.path.file_name().unwrap_or_default().to_string_lossy();
            s.push_str(&name);
            if let Some(e) = &shard.expect {
                s.push_str(&format!(":{:08x}", e.checksum));
            }
            s.push(' ');
        }
        s
    }
}

/// Resolves `packed:PATH`: a dataset directory (its `index.stkidx`), an index file, one packed
/// file, or a pattern of packed files (see [`crate::source::tar::pattern`]).
pub fn resolve(spec: &str) -> Result<ShardListing> {
    let path = Path::new(spec);
    if path.is_dir() {
        let index = path.join(INDEX_NAME);
        if !index.is_file() {
            return Err(Error::io(
                path,
                format!("a packed dataset directory needs its {INDEX_NAME}; write it with `stoker pack --merge {spec}`"),
            ));
        }
        return from_index(&index);
    }
    if path.is_file() {
        let mut head = [0u8; INDEX_MAGIC.len()];
        let is_index = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
            .is_ok()
            && head == INDEX_MAGIC.as_bytes()[..];
        if is_index {
            return from_index(path);
        }
        return Ok(ShardListing {
            shards: vec![ListedShard {
                path: path.to_owned(),
                expect: None,
            }],
        });
    }
    let paths = crate::source::tar::pattern::local_shards(spec)?;
    Ok(ShardListing {
        shards: paths
            .into_iter()
            .map(|path| ListedShard { path, expect: None })
            .collect(),
    })
}

fn from_index(index: &Path) -> Result<ShardListing> {
    let size = std::fs::metadata(index)
        .map_err(|e| Error::io(index, e))?
        .len();
    if size > MAX_INDEX_BYTES {
        return Err(Error::format(
            index,
            format!("{size} bytes: too large for an index"),
        ));
    }
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let dir = index.parent().unwrap_or(Path::new("."));
    Ok(ShardListing {
        shards: parse_index(index, &text)?
            .into_iter()
            .map(|e| ListedShard {
                path: dir.join(&e.name),
                expect: Some(e),
            })
            .collect(),
    })
}
