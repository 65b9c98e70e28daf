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
//! Every check is done when the dataset opens, against the sizes of both files, before
//! anything sized by the header is allocated ([`parse_index`], then [`check_index`], which the
//! fuzz target `megatron_index` drives over arbitrary bytes).

use std::path::{Path, PathBuf};

use super::{Part, TokenType};
use crate::error::{Error, Result};
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
    if bytes.len() < HEADER_BYTES {
        return Err(format!(
            "is {} bytes, shorter than the {HEADER_BYTES}-byte header of a Megatron index",
            bytes.len()
        ));
    }
    if &bytes[..9] != MAGIC {
        return Err(format!(
            "does not start with Megatron's index magic MMIDIDX\\x00\\x00 (found {:?})",
            String::from_utf8_lossy(&bytes[..9])
        ));
    }
    let version = u64::from_le_bytes(field(bytes, 9));
    if version != 1 {
        return Err(format!(
            "has index version {version}; only version 1 is read"
        ));
    }
    let token = TokenType::from_megatron_code(bytes[17])?;
    let sequences = u64::from_le_bytes(field(bytes, 18));
    let doc_entries = u64::from_le_bytes(field(bytes, 26));
    // Checked arithmetic in u128: the counts are the file's word, and a product that wraps could
    // pass the size check with counts far beyond the file.
    let need = HEADER_BYTES as u128 + 12 * u128::from(sequences) + 8 * u128::from(doc_entries);
    let have = bytes.len() as u128;
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
    // Both fit: they are bounded by the file's length, which is a usize.
    Ok(IndexLayout {
        token,
        sequences: sequences as usize,
        doc_entries: doc_entries as usize,
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

/// One Megatron dataset (`PREFIX.idx` + `PREFIX.bin`), mapped and checked.
pub(super) struct MegatronPart {
    prefix: PathBuf,
    idx: Mapping,
    bin: Mapping,
    layout: IndexLayout,
    /// Where each sequence starts in this dataset's tokens (see [`check_index`]).
    starts: Vec<u64>,
}

impl MegatronPart {
    /// Maps and checks `prefix.idx` and `prefix.bin`; errors name the file and what disagrees.
    pub(super) fn open(prefix: &Path) -> Result<MegatronPart> {
        let (idx_path, bin_path) = (
            with_extension(prefix, ".idx"),
            with_extension(prefix, ".bin"),
        );
        let (idx_file, _) = open_file(&idx_path, "a Megatron index (.idx)")?;
        let (bin_file, _) = open_file(&bin_path, "a Megatron token file (.bin)")?;
        let idx = Mapping::map(&idx_file, &idx_path)?;
        let bin = Mapping::map(&bin_file, &bin_path)?;
        let layout = parse_index(&idx).map_err(|reason| Error::format(&idx_path, reason))?;
        let starts = check_index(&idx, &layout, bin.len() as u64).map_err(|reason| {
            Error::format(
                &idx_path,
                format!("disagrees with {}: {reason}", bin_path.display()),
            )
        })?;
        Ok(MegatronPart {
            prefix: prefix.to_owned(),
            idx,
            bin,
            layout,
            starts,
        })
    }

    /// The sequence holding token `t` (`t < tokens()`): the last whose start is ≤ `t` (empty
    /// sequences share their start with the next one and are passed over).
    fn sequence_of(&self, t: u64) -> usize {
        self.starts.partition_point(|&s| s <= t) - 1
    }

    /// Where document `d` starts in this dataset's tokens (`d < doc_entries`).
    fn doc_start(&self, d: usize) -> u64 {
        // Checked in range by `check_index`.
        self.starts[self.layout.doc(&self.idx, d) as usize]
    }
}

impl Part for MegatronPart {
    fn tokens(&self) -> u64 {
        self.starts[self.starts.len() - 1]
    }

    fn token_type(&self) -> TokenType {
        self.layout.token
    }

    fn raw(&self, from: u64, to: u64, each: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let size = self.layout.token.size() as u64;
        let mut t = from;
        let mut s = self.sequence_of(from);
        while t < to {
            let (start, end) = (self.starts[s], self.starts[s + 1]);
            let stop = end.min(to);
            if stop > t {
                let byte = self.layout.pointer(&self.idx, s) as u64 + (t - start) * size;
                let bytes = (stop - t) * size;
                each(&self.bin[byte as usize..(byte + bytes) as usize])?;
                t = stop;
            }
            s += 1;
        }
        Ok(())
    }

    fn doc_starts(&self, from: u64, to: u64, each: &mut dyn FnMut(u64)) {
        // Documents `0..D-1` start in rising order; the first starting after `from`.
        let docs = self.layout.doc_entries - 1;
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
        Ok(self.layout.doc_entries as u64 - 1)
    }

    fn document(&self, d: u64) -> (u64, u64) {
        (self.doc_start(d as usize), self.doc_start(d as usize + 1))
    }

    fn describe(&self, t: u64) -> String {
        format!(
            "{}.bin sequence {}",
            self.prefix.display(),
            self.sequence_of(t)
        )
    }

    fn identity(&self) -> String {
        let name = self
            .prefix
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        format!(
            "megatron {name}: {} sequences, {} tokens of {}",
            self.layout.sequences,
            self.tokens(),
            self.layout.token.name()
        )
    }

    fn path(&self) -> PathBuf {
        let mut p = self.prefix.as_os_str().to_owned();
        p.push(".bin");
        PathBuf::from(p)
    }

    fn check(&self) -> Result<()> {
        self.idx.check()?;
        self.bin.check()
    }
}

/// Writes a Megatron indexed dataset (`PREFIX.bin` and `PREFIX.idx`) one document at a time,
/// as megatron-core's `IndexedDatasetBuilder` does with one sequence per document: tokens stream
/// to `.bin` as they come; the index, 12 bytes a document in memory, is written by
/// [`finish`](MegatronWriter::finish). Until then the files are `PREFIX.bin.partial` and
/// `PREFIX.idx.partial`, so a dataset that was not finished is never read as a whole one.
pub struct MegatronWriter {
    prefix: PathBuf,
    token: TokenType,
    bin: std::io::BufWriter<std::fs::File>,
    lengths: Vec<i32>,
    pointers: Vec<i64>,
    written: i64,
    scratch: Vec<u8>,
}

/// `PREFIX` + `ext`: the paths of a dataset's files (`.idx`, `.bin`).
pub fn with_extension(prefix: &Path, ext: &str) -> PathBuf {
    let mut p = prefix.as_os_str().to_owned();
    p.push(ext);
    PathBuf::from(p)
}

impl MegatronWriter {
    /// Starts a dataset of `token`-typed tokens at `prefix` (its folder must exist).
    pub fn create(prefix: &Path, token: TokenType) -> Result<MegatronWriter> {
        if token.megatron_code().is_none() {
            return Err(Error::Unsupported(format!(
                "{}: Megatron datasets have no {} token type",
                prefix.display(),
                token.name()
            )));
        }
        let path = with_extension(prefix, ".bin.partial");
        let file = std::fs::File::create(&path).map_err(|e| Error::os(&path, e))?;
        Ok(MegatronWriter {
            prefix: prefix.to_owned(),
            token,
            bin: std::io::BufWriter::new(file),
            lengths: Vec::new(),
            pointers: Vec::new(),
            written: 0,
            scratch: Vec::new(),
        })
    }

    /// Appends one document (one sequence). A token that does not fit the type is an error
    /// naming the document, and nothing of that document is written.
    pub fn add_document(&mut self, tokens: &[i64]) -> Result<()> {
        let doc = self.lengths.len();
        let path = with_extension(&self.prefix, ".bin.partial");
        let len = i32::try_from(tokens.len()).map_err(|_| {
            Error::format(
                &path,
                format!(
                    "document {doc} has {} tokens; a sequence holds at most {}",
                    tokens.len(),
                    i32::MAX
                ),
            )
        })?;
        self.scratch.clear();
        for (k, &t) in tokens.iter().enumerate() {
            self.token.put(t, &mut self.scratch).map_err(|reason| {
                Error::format(&path, format!("document {doc}, token {k}: {reason}"))
            })?;
        }
        std::io::Write::write_all(&mut self.bin, &self.scratch).map_err(|e| Error::os(&path, e))?;
        self.lengths.push(len);
        self.pointers.push(self.written);
        self.written += self.scratch.len() as i64;
        Ok(())
    }

    /// Documents added so far.
    pub fn documents(&self) -> usize {
        self.lengths.len()
    }

    /// Writes the index and moves both files to their names.
    pub fn finish(self) -> Result<()> {
        let bin_partial = with_extension(&self.prefix, ".bin.partial");
        let idx_partial = with_extension(&self.prefix, ".idx.partial");
        let file = self
            .bin
            .into_inner()
            .map_err(|e| Error::os(&bin_partial, e.into_error()))?;
        file.sync_all().map_err(|e| Error::os(&bin_partial, e))?;
        let documents = self.lengths.len();
        let mut idx = Vec::with_capacity(HEADER_BYTES + documents * 20 + 8);
        idx.extend_from_slice(MAGIC);
        idx.extend_from_slice(&1u64.to_le_bytes());
        // `create` refused the types without a code.
        idx.push(self.token.megatron_code().unwrap_or(0));
        idx.extend_from_slice(&(documents as u64).to_le_bytes());
        idx.extend_from_slice(&(documents as u64 + 1).to_le_bytes());
        for l in &self.lengths {
            idx.extend_from_slice(&l.to_le_bytes());
        }
        for p in &self.pointers {
            idx.extend_from_slice(&p.to_le_bytes());
        }
        // One sequence per document: document `d` is sequence `d`.
        for d in 0..=documents as i64 {
            idx.extend_from_slice(&d.to_le_bytes());
        }
        std::fs::write(&idx_partial, &idx).map_err(|e| Error::os(&idx_partial, e))?;
        for (from, ext) in [(&bin_partial, ".bin"), (&idx_partial, ".idx")] {
            let to = with_extension(&self.prefix, ext);
            std::fs::rename(from, &to).map_err(|e| Error::os(&to, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn the_writer_writes_the_index_megatron_writes_and_refuses_tokens_that_do_not_fit() {
        let dir =
            std::env::temp_dir().join(format!("stoker-megatron-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let prefix = dir.join("part");
        let mut w = MegatronWriter::create(&prefix, TokenType::U16).unwrap();
        w.add_document(&[1, 2, 3]).unwrap();
        let e = w.add_document(&[4, 70_000]).unwrap_err().to_string();
        assert!(
            e.contains("document 1, token 1") && e.contains("uint16"),
            "{e}"
        );
        w.add_document(&[]).unwrap();
        w.add_document(&[65_535, 0]).unwrap();
        assert!(
            !with_extension(&prefix, ".idx").exists(),
            "an unfinished dataset has no index"
        );
        w.finish().unwrap();

        let idx = std::fs::read(with_extension(&prefix, ".idx")).unwrap();
        assert_eq!(idx, index(8, &[3, 0, 2], &[0, 1, 2, 3]));
        let part = MegatronPart::open(&prefix).unwrap();
        let mut tokens = Vec::new();
        part.raw(0, part.tokens(), &mut |b| {
            tokens.extend(b.chunks_exact(2).map(|t| TokenType::U16.get(t)));
            Ok(())
        })
        .unwrap();
        assert_eq!(tokens, [1, 2, 3, 65_535, 0]);
        assert!(MegatronWriter::create(&dir.join("x"), TokenType::U32).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
