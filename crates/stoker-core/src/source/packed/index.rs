//! The dataset index: a small text file (`index.stkidx`) listing the shards of a packed dataset
//! in sample order, with each shard's sample count, size and checksum, so a swapped, replaced or
//! missing shard is an error at open. And the resolution of `packed:PATH` to shard files.
//!
//! ```text
//! stoker-packed-index 1
//! part-00000-of-00002-00000.stkpack<TAB>1200<TAB>52428800<TAB>1c2b3a4d
//! ```

use std::path::{Path, PathBuf};

use super::file::PackedFile;
use crate::error::{Error, Result};
use crate::source::remote::{self, is_url, shown_without_credentials, RemoteConfig, ShardHolder};
use crate::source::shards::{expand_shards, local_shards};

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
    std::fs::write(&tmp, text).map_err(|e| Error::os(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::os(&path, e))?;
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
    /// The shard file's path (for a remote shard, its copy in the cache).
    pub path: PathBuf,
    /// Its index entry; `None` when no index lists it.
    pub expect: Option<IndexEntry>,
    /// The URL of a remote shard, without credentials: what messages name.
    pub url: Option<String>,
}

impl ListedShard {
    fn local(path: PathBuf, expect: Option<IndexEntry>) -> ListedShard {
        ListedShard {
            path,
            expect,
            url: None,
        }
    }

    /// The shard as messages name it: its URL, or its path.
    pub fn name(&self) -> String {
        match &self.url {
            Some(url) => url.clone(),
            None => self.path.display().to_string(),
        }
    }

    /// `err` about the shard's file, naming the URL for a remote shard (and the cached copy).
    pub fn blame(&self, err: Error) -> Error {
        let Some(url) = &self.url else {
            return err;
        };
        let cached =
            |path: &Path, reason: String| format!("{reason} (its cached copy: {})", path.display());
        match err {
            Error::Io { path, reason } if path == self.path => Error::Io {
                reason: cached(&path, reason),
                path: PathBuf::from(url),
            },
            Error::Format { path, reason } if path == self.path => Error::Format {
                reason: cached(&path, reason),
                path: PathBuf::from(url),
            },
            other => other,
        }
    }

    /// Checks an opened shard against its index entry.
    pub fn check(&self, file: &PackedFile) -> Result<()> {
        let Some(e) = &self.expect else {
            return Ok(());
        };
        let size = std::fs::metadata(&self.path)
            .map_err(|err| Error::os(&self.path, err))?
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
            let name = shard.name();
            s.push_str(name.rsplit('/').next().unwrap_or_default());
            if let Some(e) = &shard.expect {
                s.push_str(&format!(":{:08x}", e.checksum));
            }
            s.push(' ');
        }
        s
    }
}

/// Resolves `packed:PATH`: a dataset directory (its `index.stkidx`), an index file, one packed
/// file, or a pattern of packed files (see [`crate::source::shards`]).
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
            shards: vec![ListedShard::local(path.to_owned(), None)],
        });
    }
    let paths = local_shards(spec)?;
    Ok(ShardListing {
        shards: paths
            .into_iter()
            .map(|path| ListedShard::local(path, None))
            .collect(),
    })
}

/// Resolves `packed:SPEC` where SPEC may name remote files: a dataset URL (ending in `/` or in
/// `index.stkidx`), whose index is fetched first and then every shard it lists, or one URL or a
/// pattern of shard URLs. Remote files are downloaded whole into the cache, as tar shards are
/// (see [`crate::source::remote`]): the packed reader maps them like local files. The holders
/// keep the cached files in place while the source lives. Local specs resolve as [`resolve`].
pub fn resolve_with(spec: &str, remote: &RemoteConfig) -> Result<(ShardListing, Vec<ShardHolder>)> {
    let names = expand_shards(spec)?;
    if !names.iter().any(|n| is_url(n)) {
        return Ok((resolve(spec)?, Vec::new()));
    }
    match names.as_slice() {
        [dataset] if dataset.ends_with('/') || dataset.ends_with(INDEX_NAME) => {
            let index_url = if dataset.ends_with('/') {
                format!("{dataset}{INDEX_NAME}")
            } else {
                dataset.clone()
            };
            let fetched = remote::resolve(vec![index_url.clone()], remote, false)?;
            let shown = shown_without_credentials(&index_url);
            let index = ListedShard {
                path: fetched.paths.first().cloned().unwrap_or_default(),
                expect: None,
                url: Some(shown),
            };
            let entries = read_index(&index.path).map_err(|e| index.blame(e))?;
            let base = &index_url[..index_url.rfind('/').map_or(0, |i| i + 1)];
            let urls: Vec<String> = entries
                .iter()
                .map(|e| format!("{base}{}", e.name))
                .collect();
            let shards = remote::resolve(urls.clone(), remote, false)?;
            let listing = ShardListing {
                shards: shards
                    .paths
                    .iter()
                    .zip(entries)
                    .zip(&urls)
                    .map(|((path, e), url)| ListedShard {
                        path: path.clone(),
                        expect: Some(e),
                        url: Some(shown_without_credentials(url)),
                    })
                    .collect(),
            };
            Ok((listing, vec![fetched.holder, shards.holder]))
        }
        _ => {
            let shards = remote::resolve(names.clone(), remote, false)?;
            let listing = ShardListing {
                shards: shards
                    .paths
                    .iter()
                    .zip(&names)
                    .map(|(path, name)| ListedShard {
                        path: path.clone(),
                        expect: None,
                        url: is_url(name).then(|| shown_without_credentials(name)),
                    })
                    .collect(),
            };
            Ok((listing, vec![shards.holder]))
        }
    }
}

/// The entries of the index file at `index`, its size bounded before it is read.
fn read_index(index: &Path) -> Result<Vec<IndexEntry>> {
    let size = std::fs::metadata(index)
        .map_err(|e| Error::os(index, e))?
        .len();
    if size > MAX_INDEX_BYTES {
        return Err(Error::format(
            index,
            format!("{size} bytes: too large for an index"),
        ));
    }
    let text = std::fs::read_to_string(index).map_err(|e| Error::os(index, e))?;
    parse_index(index, &text)
}

fn from_index(index: &Path) -> Result<ShardListing> {
    let dir = index.parent().unwrap_or(Path::new("."));
    Ok(ShardListing {
        shards: read_index(index)?
            .into_iter()
            .map(|e| ListedShard::local(dir.join(&e.name), Some(e)))
            .collect(),
    })
}
