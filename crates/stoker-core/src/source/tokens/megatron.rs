//! `megatron:PREFIX[,PREFIX…]`: Megatron-LM's indexed dataset, a `PREFIX.idx` index over the
//! tokens of `PREFIX.bin`, both memory-mapped and read in place.
//!
//! The index, as Megatron-LM's `megatron/core/datasets/indexed_dataset.py` (`_IndexWriter`)
//! writes it, all little-endian:
//!
//! | bytes | what |
//! |---|---|
//! | 9 | magic `MMIDIDX\x00\x00` |
//! | 8 | version, u64, 1 |
//! | 1 | token type code, u8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16 |
//! | 8 | sequence count `S`, u64 |
//! | 8 | document index entries `D`, u64 (documents + 1: the writer stores the length of the list) |
//! | 4·S | tokens per sequence, int32 |
//! | 8·S | byte offset of each sequence in `.bin`, int64 |
//! | 8·D | the document index: document `d` is sequences `[doc[d], doc[d+1])`, int64 |
//!
//! A document is a run of sequences (one sequence each, unless the data was split into
//! sentences). Float token types are refused, and so is the multimodal variant (a byte of
//! sequence mode per sequence after the document index): the file must be exactly the size the
//! header implies.
//!
//! Every check is done when the dataset is first opened, against the sizes of both files, before
//! anything sized by the header is allocated ([`parse_index`], then [`check_index`], which the
//! fuzz target `megatron_index` drives over arbitrary bytes). The tables kept from a checked
//! index are then cached (module `tokens::cache`); a later open of the same, unchanged files checks
//! the header and maps the cached tables instead of reading the index again.

use std::path::{Path, PathBuf};

use super::cache::{self, CacheKey, CachePlaces, FileStamp, Table};
use super::{Part, TokenType};
use crate::error::{Error, Result};
use crate::hash::Fnv;
use crate::source::mapped::Mapping;
use crate::source::open_file;

/// The magic bytes an index starts with.
pub const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";

/// Bytes of the fixed header: magic, version, type code, two counts.
pub const HEADER_BYTES: usize = 9 + 8 + 1 + 8 + 8;

/// Where the arrays of an index lie, as its header says, checked against its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexLayout {
    /// The element type of the tokens in `.bin`.
    pub token: TokenType,
    /// Sequences (`S`).
    pub sequences: usize,
    /// Entries of the document index (`D`: documents + 1).
    pub doc_entries: usize,
}

impl IndexLayout {
    fn lengths_at(&self) -> usize {
        HEADER_BYTES
    }

    fn pointers_at(&self) -> usize {
        HEADER_BYTES + 4 * self.sequences
    }

    fn docs_at(&self) -> usize {
        self.pointers_at() + 8 * self.sequences
    }

    /// Tokens of sequence `s` (`s < sequences`; checked non-negative by [`check_index`]).
    fn length(&self, idx: &[u8], s: usize) -> i32 {
        i32::from_le_bytes(field(idx, self.lengths_at() + 4 * s))
    }

    fn pointer(&self, idx: &[u8], s: usize) -> i64 {
        i64::from_le_bytes(field(idx, self.pointers_at() + 8 * s))
    }

    fn doc(&self, idx: &[u8], d: usize) -> i64 {
        i64::from_le_bytes(field(idx, self.docs_at() + 8 * d))
    }
}

/// `N` bytes at `at` of an index whose size [`parse_index`] checked.
fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

/// Reads the header of an index of `bytes.len()` bytes and checks that the file is exactly as
/// long as its counts say; says in words what disagrees.
pub fn parse_index(bytes: &[u8]) -> std::result::Result<IndexLayout, String> {
    parse_header(&bytes[..bytes.len().min(HEADER_BYTES)], bytes.len() as u64)
}

/// [`parse_index`] from the first [`HEADER_BYTES`] of an index (`head`) and its length.
fn parse_header(head: &[u8], len: u64) -> std::result::Result<IndexLayout, String> {
    if head.len() < HEADER_BYTES || len < HEADER_BYTES as u64 {
        return Err(format!(
            "is {len} bytes, shorter than the {HEADER_BYTES}-byte header of a Megatron index"
        ));
    }
    if &head[..9] != MAGIC {
        return Err(format!(
            "does not start with Megatron's index magic MMIDIDX\\x00\\x00 (found {:?})",
            String::from_utf8_lossy(&head[..9])
        ));
    }
    let version = u64::from_le_bytes(field(head, 9));
    if version != 1 {
        return Err(format!(
            "has index version {version}; only version 1 is read"
        ));
    }
    let token = TokenType::from_megatron_code(head[17])?;
    let sequences = u64::from_le_bytes(field(head, 18));
    let doc_entries = u64::from_le_bytes(field(head, 26));
    // Checked arithmetic in u128: the counts are the file's word, and a product that wraps could
    // pass the size check with counts far beyond the file.
    let need = HEADER_BYTES as u128 + 12 * u128::from(sequences) + 8 * u128::from(doc_entries);
    let have = u128::from(len);
    if need != have {
        return Err(format!(
            "says {sequences} sequences and {doc_entries} document index entries, which take \
             {need} bytes, but the file has {have} ({})",
            if have < need {
                "truncated"
            } else {
                "trailing bytes; a multimodal index is not read"
            }
        ));
    }
    if doc_entries == 0 {
        return Err("has an empty document index (it needs at least the leading 0)".into());
    }
    // Both fit: they are bounded by the file's length, and the index is mapped (or, from the
    // cache, the tables of that length are).
    let fit = |n: u64| {
        usize::try_from(n).map_err(|_| format!("counts {n} entries, more than memory holds"))
    };
    Ok(IndexLayout {
        token,
        sequences: fit(sequences)?,
        doc_entries: fit(doc_entries)?,
    })
}

/// Checks the arrays of an index against each other and against the `.bin` file's length
/// `bin_len`: lengths non-negative, each sequence inside `.bin`, `.bin` exactly the tokens the
/// index counts, the document index rising from 0 to the sequence count. Returns where each
/// sequence starts in the dataset's token stream (`S + 1` entries, the last the total): the one
/// table kept in memory, 8 bytes a sequence. `layout` is what [`parse_index`] said of `idx`.
pub fn check_index(
    idx: &[u8],
    layout: &IndexLayout,
    bin_len: u64,
) -> std::result::Result<Vec<u64>, String> {
    let fits = layout
        .sequences
        .checked_mul(12)
        .zip(layout.doc_entries.checked_mul(8))
        .and_then(|(a, b)| a.checked_add(b))
        .and_then(|n| n.checked_add(HEADER_BYTES));
    if fits != Some(idx.len()) {
        return Err(format!(
            "the layout ({} sequences, {} document entries) is not that of this {}-byte index",
            layout.sequences,
            layout.doc_entries,
            idx.len()
        ));
    }
    let size = layout.token.size() as u64;
    let mut starts = Vec::with_capacity(layout.sequences + 1);
    let mut total: u64 = 0;
    starts.push(0);
    for s in 0..layout.sequences {
        let len = layout.length(idx, s);
        let len = u64::try_from(len).map_err(|_| format!("sequence {s} has length {len} < 0"))?;
        let pointer = layout.pointer(idx, s);
        u64::try_from(pointer)
            .ok()
            .and_then(|p| p.checked_add(len * size))
            .filter(|&end| end <= bin_len)
            .ok_or_else(|| {
                format!(
                    "sequence {s} ({len} tokens of {} at byte {pointer}) lies outside the \
                     {bin_len}-byte .bin file",
                    layout.token.name()
                )
            })?;
        // Each sequence fits in `.bin`, but overlapping ones could still sum past it.
        total = total
            .checked_add(len)
            .filter(|t| u128::from(*t) * u128::from(size) <= u128::from(bin_len))
            .ok_or_else(|| {
                format!(
                    "sequences 0..={s} count more tokens than the {bin_len}-byte .bin file holds"
                )
            })?;
        starts.push(total);
    }
    if total * size != bin_len {
        return Err(format!(
            "counts {total} tokens of {} ({} bytes), but the .bin file has {bin_len} bytes ({})",
            layout.token.name(),
            total * size,
            if bin_len < total * size {
                "truncated"
            } else {
                "trailing bytes"
            }
        ));
    }
    let mut previous = 0usize;
    for d in 0..layout.doc_entries {
        let v = layout.doc(idx, d);
        let ok = usize::try_from(v)
            .ok()
            .filter(|&v| v >= previous && v <= layout.sequences && (d > 0 || v == 0));
        previous = ok.ok_or_else(|| {
            format!(
                "document index entry {d} is {v}: the entries must rise from 0 to the {} sequences",
                layout.sequences
            )
        })?;
    }
    if previous != layout.sequences {
        return Err(format!(
            "the document index ends at sequence {previous}, not at the last ({})",
            layout.sequences
        ));
    }
    Ok(starts)
}

/// One Megatron dataset (`PREFIX.idx` + `PREFIX.bin`): the tokens mapped, the index reduced
/// to the tables below (built from the index once, then loaded from the cache, [`cache`]).
pub(super) struct MegatronPart {
    prefix: PathBuf,
    bin: Mapping,
    token: TokenType,
    /// Where each sequence starts in this dataset's tokens (`S + 1` entries, the last the
    /// total; see [`check_index`]).
    starts: Table,
    /// The byte offset of each sequence in `.bin`; empty when the sequences lie end to end, as
    /// Megatron writes them (sequence `s` is then at `starts[s]` tokens).
    pointers: Table,
    /// Where each document starts in this dataset's tokens (`D` entries: documents + 1); empty
    /// when every document is one sequence (document `d` is then sequence `d`).
    docs: Table,
    /// The cache file the tables were read from or written to.
    cached: Option<PathBuf>,
}

/// Whether tables loaded from a cache (starts, pointers, documents) fit the index's header and
/// the `bin_len`-byte `.bin`: their sizes, ends and first entries (O(1); every read is
/// bounds-checked besides).
fn consistent(layout: &IndexLayout, tables: [&Table; 3], bin_len: u64) -> bool {
    let (starts, pointers, docs) = (
        tables[0].as_slice(),
        tables[1].as_slice(),
        tables[2].as_slice(),
    );
    let size = layout.token.size() as u128;
    starts.len() == layout.sequences + 1
        && starts.first() == Some(&0)
        && starts.last().map(|&t| u128::from(t) * size) == Some(u128::from(bin_len))
        && [0, layout.sequences].contains(&pointers.len())
        && if docs.is_empty() {
            layout.doc_entries == layout.sequences + 1
        } else {
            docs.len() == layout.doc_entries
                && docs.first() == Some(&0)
                && docs.last() == starts.last()
        }
}

/// Cache kind of a Megatron dataset's tables.
const CACHE_KIND: u32 = 1;

/// Bytes of the end of an index hashed into the cache key with its header (the last entries of
/// the document index, which any rewrite of the index changes).
const TAIL_BYTES: u64 = 4096;

impl MegatronPart {
    /// Opens `prefix.idx` and `prefix.bin`: the tables from the cache when it holds them for
    /// these very files, else from the index, checked against `.bin` and cached. Errors name
    /// the file and what disagrees.
    ///
    /// `idx` and `bin` are where the files are (for a remote dataset, their copies in the
    /// cache); messages name `prefix.idx` and `prefix.bin`.
    pub(super) fn open(
        prefix: &Path,
        idx: &Path,
        bin: &Path,
        places: &CachePlaces,
    ) -> Result<MegatronPart> {
        use std::os::unix::fs::FileExt;
        let (idx_path, bin_path) = (
            with_extension(prefix, ".idx"),
            with_extension(prefix, ".bin"),
        );
        let (idx_file, idx_meta) = open_file(idx, "a Megatron index (.idx)")?;
        let (bin_file, bin_meta) = open_file(bin, "a Megatron token file (.bin)")?;
        let bin = Mapping::map(&bin_file, bin)?;
        // The key: both files' size and mtime, and a hash of the index's header and tail.
        let idx_len = idx_meta.len();
        let mut head = vec![0u8; HEADER_BYTES.min(idx_len as usize)];
        idx_file
            .read_exact_at(&mut head, 0)
            .map_err(|e| Error::os(idx, e))?;
        let layout = parse_header(&head, idx_len).map_err(|r| Error::format(&idx_path, r))?;
        let tail_len = TAIL_BYTES.min(idx_len - HEADER_BYTES as u64);
        let mut tail = vec![0u8; tail_len as usize];
        idx_file
            .read_exact_at(&mut tail, idx_len - tail_len)
            .map_err(|e| Error::os(idx, e))?;
        let mut hash = Fnv::new();
        hash.bytes(&head);
        hash.bytes(&tail);
        let key = CacheKey {
            kind: CACHE_KIND,
            path: cache::absolute(idx),
            files: [FileStamp::of(&idx_meta), FileStamp::of(&bin_meta)],
            header: hash.finish(),
        };
        if let Some(([starts, pointers, docs], from)) = places.load(&key) {
            if consistent(&layout, [&starts, &pointers, &docs], bin.len() as u64) {
                return Ok(MegatronPart {
                    prefix: prefix.to_owned(),
                    bin,
                    token: layout.token,
                    starts,
                    pointers,
                    docs,
                    cached: Some(from),
                });
            }
            // A cache that agrees with its key and checksums but not with the index is not
            // trusted either: rebuilt below, and overwritten.
        }
        let idx = Mapping::map(&idx_file, idx)?;
        let layout = parse_index(&idx).map_err(|reason| Error::format(&idx_path, reason))?;
        let starts = check_index(&idx, &layout, bin.len() as u64).map_err(|reason| {
            Error::format(
                &idx_path,
                format!("disagrees with {}: {reason}", bin_path.display()),
            )
        })?;
        let size = layout.token.size() as u64;
        let end_to_end =
            (0..layout.sequences).all(|s| layout.pointer(&idx, s) as u64 == starts[s] * size);
        let pointers: Vec<u64> = if end_to_end {
            Vec::new()
        } else {
            // Checked non-negative by `check_index`.
            (0..layout.sequences)
                .map(|s| layout.pointer(&idx, s) as u64)
                .collect()
        };
        let one_each = layout.doc_entries == layout.sequences + 1
            && (0..layout.doc_entries).all(|d| layout.doc(&idx, d) == d as i64);
        let docs: Vec<u64> = if one_each {
            Vec::new()
        } else {
            // Checked in range by `check_index`.
            (0..layout.doc_entries)
                .map(|d| starts[layout.doc(&idx, d) as usize])
                .collect()
        };
        let cached = places.save(&key, [&starts, &pointers, &docs]);
        idx.check()?;
        Ok(MegatronPart {
            prefix: prefix.to_owned(),
            bin,
            token: layout.token,
            starts: Table::Owned(starts),
            pointers: Table::Owned(pointers),
            docs: Table::Owned(docs),
            cached,
        })
    }

    /// The sequence holding token `t` (`t < tokens()`): the last whose start is ≤ `t` (empty
    /// sequences share their start with the next one and are passed over).
    fn sequence_of(&self, t: u64) -> usize {
        self.starts
            .as_slice()
            .partition_point(|&s| s <= t)
            .saturating_sub(1)
    }

    /// Documents in the dataset.
    fn doc_count(&self) -> usize {
        match self.docs.len() {
            0 => self.starts.len() - 1,
            n => n - 1,
        }
    }

    /// Where document `d` starts in this dataset's tokens (`d <= doc_count()`), clamped to the
    /// dataset.
    fn doc_start(&self, d: usize) -> u64 {
        let table = if self.docs.len() == 0 {
            &self.starts
        } else {
            &self.docs
        };
        table
            .as_slice()
            .get(d)
            .map_or(self.tokens(), |&t| t.min(self.tokens()))
    }

    /// An error naming the cache file (or the index) when a table points outside `.bin`.
    fn corrupt(&self, what: String) -> Error {
        let from = self
            .cached
            .clone()
            .unwrap_or_else(|| with_extension(&self.prefix, ".idx"));
        Error::format(
            &from,
            format!("{what}; delete this file and open the dataset again"),
        )
    }
}

impl Part for MegatronPart {
    fn tokens(&self) -> u64 {
        let starts = self.starts.as_slice();
        starts[starts.len() - 1]
    }

    fn token_type(&self) -> TokenType {
        self.token
    }

    fn raw(&self, from: u64, to: u64, each: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let size = self.token.size() as u64;
        let (starts, pointers) = (self.starts.as_slice(), self.pointers.as_slice());
        let mut t = from;
        let mut s = self.sequence_of(from);
        while t < to {
            let (Some(&start), Some(&end)) = (starts.get(s), starts.get(s + 1)) else {
                return Err(self.corrupt(format!("no sequence holds token {t}")));
            };
            let stop = end.min(to);
            if stop > t {
                let at = match pointers.get(s) {
                    Some(&p) => p,
                    None => start.saturating_mul(size),
                };
                let bytes = at
                    .checked_add(t.saturating_sub(start).saturating_mul(size))
                    .and_then(|a| Some((a, a.checked_add((stop - t).saturating_mul(size))?)))
                    .and_then(|(a, b)| {
                        self.bin
                            .get(usize::try_from(a).ok()?..usize::try_from(b).ok()?)
                    });
                let Some(bytes) = bytes else {
                    return Err(self.corrupt(format!(
                        "sequence {s} lies outside the {}-byte .bin file",
                        self.bin.len()
                    )));
                };
                each(bytes)?;
                t = stop;
            }
            s += 1;
        }
        Ok(())
    }

    fn doc_starts(&self, from: u64, to: u64, each: &mut dyn FnMut(u64)) {
        // Documents `0..D-1` start in rising order; the first starting after `from`.
        let docs = self.doc_count();
        let (mut lo, mut hi) = (0, docs);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.doc_start(mid) <= from {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        for d in lo..docs {
            let start = self.doc_start(d);
            if start >= to {
                break;
            }
            each(start);
        }
    }

    fn documents(&self) -> std::result::Result<u64, String> {
        Ok(self.doc_count() as u64)
    }

    fn document(&self, d: u64) -> (u64, u64) {
        let start = self.doc_start(d as usize);
        (start, self.doc_start(d as usize + 1).max(start))
    }

    fn place(&self, t: u64) -> String {
        format!("sequence {}", self.sequence_of(t))
    }

    fn identity(&self) -> String {
        let name = self
            .prefix
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        format!(
            "megatron {name}: {} sequences, {} tokens of {}",
            self.starts.len() - 1,
            self.tokens(),
            self.token.name()
        )
    }

    fn path(&self) -> PathBuf {
        let mut p = self.prefix.as_os_str().to_owned();
        p.push(".bin");
        PathBuf::from(p)
    }

    fn index_bytes(&self) -> usize {
        8 * (self.starts.len() + self.pointers.len() + self.docs.len())
    }

    fn check(&self) -> Result<()> {
        if let Table::Mapped { map, .. } = &self.starts {
            map.check()?;
        }
        self.bin.check()
    }
}

/// `PREFIX` + `ext`: the paths of a dataset's files (`.idx`, `.bin`).
pub fn with_extension(prefix: &Path, ext: &str) -> PathBuf {
    let mut p = prefix.as_os_str().to_owned();
    p.push(ext);
    PathBuf::from(p)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// An index as Megatron's `_IndexWriter` writes it (megatron-core is not installed here:
    /// this follows the layout in the module docs).
    pub(crate) fn index(code: u8, lengths: &[i32], docs: &[i64]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&1u64.to_le_bytes());
        out.push(code);
        out.extend_from_slice(&(lengths.len() as u64).to_le_bytes());
        out.extend_from_slice(&(docs.len() as u64).to_le_bytes());
        let size = TokenType::from_megatron_code(code).map_or(2, |t| t.size()) as i64;
        let mut pointer = 0i64;
        for l in lengths {
            out.extend_from_slice(&l.to_le_bytes());
        }
        for l in lengths {
            out.extend_from_slice(&pointer.to_le_bytes());
            pointer += i64::from(*l) * size;
        }
        for d in docs {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out
    }

    #[test]
    fn a_well_formed_index_gives_the_sequence_starts() {
        let idx = index(8, &[3, 0, 5], &[0, 1, 3]);
        let layout = parse_index(&idx).unwrap();
        assert_eq!(layout.token, TokenType::U16);
        assert_eq!((layout.sequences, layout.doc_entries), (3, 3));
        assert_eq!(check_index(&idx, &layout, 16).unwrap(), vec![0, 3, 3, 8]);
    }

    #[test]
    fn bad_headers_say_what_disagrees() {
        let good = index(4, &[2, 2], &[0, 2]);
        let mut magic = good.clone();
        magic[0] = b'X';
        let mut version = good.clone();
        version[9] = 2;
        let mut float = good.clone();
        float[17] = 6;
        let mut huge = good.clone();
        huge[18..26].copy_from_slice(&(1u64 << 60).to_le_bytes());
        for (bytes, needle) in [
            (&good[..20], "shorter than"),
            (&magic[..], "magic"),
            (&version[..], "version 2"),
            (&float[..], "float64"),
            (&huge[..], "truncated"),
            (&good[..good.len() - 1], "truncated"),
        ] {
            let e = parse_index(bytes).unwrap_err();
            assert!(e.contains(needle), "{needle}: {e}");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(parse_index(&trailing).unwrap_err().contains("trailing"));
    }

    /// What the fuzz target `megatron_index` checks, over mutations of a good index: the
    /// parser's entry points return, and what they accept is consistent with the file sizes.
    #[test]
    fn mutated_indexes_are_refused_or_consistent() {
        use crate::rng::{Rng, Stream};
        let good = index(8, &[3, 0, 5, 2], &[0, 1, 3, 4]);
        let mut accepted = 0;
        for case in 0..20_000u64 {
            let mut rng = Rng::for_key(case, Stream::Order, 0, 0);
            let mut bytes = good.clone();
            for _ in 0..=rng.below(4) {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] = rng.next_u64() as u8;
            }
            if rng.below(8) == 0 {
                bytes.truncate(rng.below(bytes.len() as u64) as usize);
            }
            let bin_len = [20, rng.below(64)][rng.below(2) as usize];
            let Ok(layout) = parse_index(&bytes) else {
                continue;
            };
            assert_eq!(
                bytes.len(),
                HEADER_BYTES + 12 * layout.sequences + 8 * layout.doc_entries
            );
            if let Ok(starts) = check_index(&bytes, &layout, bin_len) {
                accepted += 1;
                assert_eq!(starts.len(), layout.sequences + 1);
                assert!(starts.windows(2).all(|w| w[0] <= w[1]));
                assert_eq!(
                    starts[layout.sequences] * layout.token.size() as u64,
                    bin_len
                );
            }
        }
        assert!(accepted > 0, "some mutations keep the index valid");
    }

    #[test]
    fn arrays_are_checked_against_each_other_and_the_bin() {
        let idx = index(4, &[2, 2], &[0, 2]);
        let layout = parse_index(&idx).unwrap();
        assert!(check_index(&idx, &layout, 16).is_ok());
        let e = check_index(&idx, &layout, 12).unwrap_err();
        assert!(e.contains("sequence 1") && e.contains("outside"), "{e}");
        let e = check_index(&idx, &layout, 20).unwrap_err();
        assert!(e.contains("trailing bytes"), "{e}");
        let negative = index(4, &[2, -1], &[0, 2]);
        let e = check_index(&negative, &parse_index(&negative).unwrap(), 16).unwrap_err();
        assert!(e.contains("length -1"), "{e}");
        for docs in [[1i64, 2], [0, 1], [0, 3]] {
            let idx = index(4, &[2, 2], &docs);
            assert!(
                check_index(&idx, &parse_index(&idx).unwrap(), 16).is_err(),
                "{docs:?}"
            );
        }
    }
}
