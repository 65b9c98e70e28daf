//! `parquet:PATTERN`: Parquet shards of text (as Hugging Face datasets, RedPajama, FineWeb and
//! Dolma ship them), one document a row of the column `text_column`, tokenized by a Hugging Face
//! `tokenizer.json` (`tokenizer`) with its special tokens (a BOS, say), then `eos_token`
//! appended when set, as Megatron's `preprocess_data.py --append-eod` does. A null value is an
//! empty document.
//!
//! Tokenization runs where the tokens are read: in the workers, for the documents a sample
//! overlaps. Only the token count of every document is kept, so that the stream can be cut into
//! windows without holding its tokens: it is counted the first time a file is opened with a
//! tokenizer — every document tokenized once, on every core — and cached as the other token
//! tables are ([`super::cache`], kind 3, keyed by the file's size, mtime and footer, and the
//! tokenizer's size, mtime and content hash, the column and `eos_token`); later opens map it
//! (8 bytes a document). Reads check that a document still has the tokens the table counted.
//!
//! A row is read from its row group: each thread keeps, per file, the text column of the last row
//! group it decoded (bounded by [`GROUP_LIMIT`]) and the tokens of the last document it
//! tokenized, so samples read in order decode and tokenize each row once. They are freed with
//! the source. For many epochs of the same text, `stoker pack` writes the tokens once as a `tokens:`
//! file with its sidecar of document lengths.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::Type as PhysicalType;
use parquet::column::reader::ColumnReader;
use parquet::data_type::ByteArray;
use parquet::file::reader::{FileReader, SerializedFileReader};
use tokenizers::Tokenizer;

use super::cache::{self, CacheKey, CachePlaces, FileStamp, Table};
use super::{Part, TokenType};
use crate::error::{Error, Result};
use crate::hash::Fnv;
use crate::source::mapped::Mapping;
use crate::source::open_file;
use crate::source::parquet::{add_rows, check_pages, footer, guarded, open_mapped};
use crate::source::per_thread::PerThread;

/// Cache kind of a Parquet file's document starts.
const CACHE_KIND: u32 = 3;

/// The most text one row group's column may hold decoded (its uncompressed size in the footer):
/// a thread holds one such group while it reads from it.
pub const GROUP_LIMIT: u64 = 1 << 30;

/// A Hugging Face tokenizer, loaded once for every file of a source.
pub(super) struct TextTokenizer {
    tokenizer: Tokenizer,
    path: PathBuf,
    /// FNV-1a of the `tokenizer.json` bytes: part of every cache key and of the source's identity.
    hash: u64,
    stamp: FileStamp,
    eos: Option<u32>,
    /// Its vocabulary size, added tokens included: every id it makes is below it.
    vocab: u64,
}

impl TextTokenizer {
    /// Loads `path` (a `tokenizer.json`); `eos` is appended to every document.
    pub(super) fn load(path: &Path, eos: Option<u64>, vocab: Option<u64>) -> Result<TextTokenizer> {
        let (_, meta) = open_file(path, "a tokenizer (tokenizer.json)")?;
        let bytes = std::fs::read(path).map_err(|e| Error::os(path, e))?;
        let tokenizer = Tokenizer::from_bytes(&bytes).map_err(|e| {
            Error::format(
                path,
                format!("is not a Hugging Face tokenizer.json the tokenizers library reads: {e}"),
            )
        })?;
        let size = tokenizer.get_vocab_size(true) as u64;
        let eos = eos
            .map(|e| {
                u32::try_from(e)
                    .ok()
                    .filter(|&e| u64::from(e) < size)
                    .ok_or_else(|| {
                        Error::option(
                            "eos_token",
                            format!("{e} is not a token of {} (ids 0..{size})", path.display()),
                        )
                    })
            })
            .transpose()?;
        if let Some(vocab) = vocab {
            if size > vocab {
                return Err(Error::option(
                    "vocab_size",
                    format!(
                        "{vocab}, but {} has {size} tokens (added tokens included): its ids \
                         would not all be below vocab_size",
                        path.display()
                    ),
                ));
            }
        }
        Ok(TextTokenizer {
            tokenizer,
            path: path.to_owned(),
            hash: Fnv::of(&bytes),
            stamp: FileStamp::of(&meta),
            eos,
            vocab: size,
        })
    }

    /// The tokens of one document (`eos_token` appended), into `out` (cleared first).
    fn encode(&self, text: &str, out: &mut Vec<u32>) -> std::result::Result<(), String> {
        out.clear();
        let encoding = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| format!("tokenizer {}: {e}", self.path.display()))?;
        out.extend_from_slice(encoding.get_ids());
        out.extend(self.eos);
        Ok(())
    }
}

/// The text column of one row group, decoded.
struct Group {
    group: usize,
    /// Every row's text, one after the other.
    text: Vec<u8>,
    /// Where each row's text starts; one more entry, the end.
    ends: Vec<usize>,
}

/// One document's tokens.
struct Tokens {
    row: u64,
    ids: Vec<u32>,
}

/// What one thread read last from a file: the row group it decoded and the document it
/// tokenized.
#[derive(Default)]
struct Recent {
    group: Option<Group>,
    tokens: Option<Tokens>,
}

/// One Parquet file, mapped, with the token count of every row.
pub(super) struct ParquetPart {
    path: PathBuf,
    reader: SerializedFileReader<Bytes>,
    map: Arc<Mapping>,
    tokenizer: Arc<TextTokenizer>,
    column: usize,
    /// The first row of each row group; one more entry, the rows.
    groups: Vec<u64>,
    /// Where each document starts in the part's tokens; one more entry, the tokens.
    starts: Table,
    /// Each reading thread's last row group and document.
    recent: PerThread<Recent>,
}

impl ParquetPart {
    /// Maps `path` (for a remote file, its cached copy; `shown` is what messages name) and
    /// finds `column`, a text column; counts its documents' tokens (or maps the cached counts).
    pub(super) fn open(
        path: &Path,
        shown: &Path,
        column: &str,
        tokenizer: &Arc<TextTokenizer>,
        places: &CachePlaces,
    ) -> Result<ParquetPart> {
        let (reader, map, meta) = open_mapped(path, shown, false)?;
        let metadata = reader.metadata();
        let schema = metadata.file_metadata().schema_descr();
        let named: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
        let index = named.iter().position(|n| n == column).ok_or_else(|| {
            Error::format(
                shown,
                format!(
                    "has no column `{column}` (text_column); its columns: {}",
                    named.join(", ")
                ),
            )
        })?;
        let desc = schema.column(index);
        if desc.physical_type() != PhysicalType::BYTE_ARRAY || desc.max_rep_level() > 0 {
            return Err(Error::format(
                shown,
                format!(
                    "column `{column}` holds {}{}, not text (a string or binary column)",
                    desc.physical_type(),
                    if desc.max_rep_level() > 0 {
                        " lists"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let mut groups = Vec::with_capacity(metadata.num_row_groups().min(1 << 16) + 1);
        let mut rows = 0u64;
        groups.push(0);
        for (g, group) in metadata.row_groups().iter().enumerate() {
            let size = group.column(index).uncompressed_size();
            if u64::try_from(size).map_or(true, |s| s > GROUP_LIMIT) {
                return Err(Error::format(
                    shown,
                    format!(
                        "row group {g}'s column `{column}` is {size} bytes decoded, over the \
                         {GROUP_LIMIT} a reader holds; write smaller row groups"
                    ),
                ));
            }
            rows = add_rows(rows, g, group, shown)?;
            groups.push(rows);
        }
        let mut part = ParquetPart {
            path: shown.to_owned(),
            reader,
            map,
            tokenizer: Arc::clone(tokenizer),
            column: index,
            groups,
            starts: Table::Owned(Vec::new()),
            recent: PerThread::new(),
        };
        part.starts = part.document_starts(path, &meta, column, places)?;
        Ok(part)
    }

    /// The cached document starts of the file at `path` (a remote file's cached copy), or every
    /// row tokenized and counted (then cached).
    fn document_starts(
        &self,
        path: &Path,
        meta: &std::fs::Metadata,
        column: &str,
        places: &CachePlaces,
    ) -> Result<Table> {
        let footer = footer(&self.map);
        let mut hash = Fnv::new();
        hash.bytes(footer);
        hash.bytes(&self.tokenizer.hash.to_le_bytes());
        hash.bytes(column.as_bytes());
        hash.bytes(&self.tokenizer.eos.map_or(u64::MAX, u64::from).to_le_bytes());
        let key = CacheKey {
            kind: CACHE_KIND,
            path: cache::absolute(path),
            files: [FileStamp::of(meta), self.tokenizer.stamp],
            header: hash.finish(),
        };
        let rows = self.rows();
        if let Some(([starts, _, _], _)) = places.load(&key) {
            let s = starts.as_slice();
            if s.len() as u64 == rows + 1 && s.first() == Some(&0) && s.is_sorted() {
                return Ok(starts);
            }
        }
        let counts: Vec<Vec<u64>> = crate::fork::parallel(|| {
            use rayon::prelude::*;
            (0..self.groups.len() - 1)
                .into_par_iter()
                .map(|g| self.count_group(g))
                .collect::<Result<Vec<_>>>()
        })??;
        // Sized by what was counted, not by the footer's claim.
        let mut starts = Vec::with_capacity(counts.iter().map(Vec::len).sum::<usize>() + 1);
        let mut total = 0u64;
        starts.push(0);
        for n in counts.iter().flatten() {
            total += n;
            starts.push(total);
        }
        places.save(&key, [&starts, &[], &[]]);
        Ok(Table::Owned(starts))
    }

    /// The token count of every row of row group `g`, tokenized in parallel.
    fn count_group(&self, g: usize) -> Result<Vec<u64>> {
        use rayon::prelude::*;
        let group = self.decode_group(g)?;
        (0..group.ends.len() - 1)
            .into_par_iter()
            .map_init(Vec::new, |ids, r| {
                let row = self.groups[g] + r as u64;
                self.tokenizer
                    .encode(self.text(&group, r, row)?, ids)
                    .map_err(|why| self.row_error(row, why))?;
                Ok(ids.len() as u64)
            })
            .collect()
    }

    fn rows(&self) -> u64 {
        self.groups[self.groups.len() - 1]
    }

    /// An error about row `row`, naming the file, row group and column.
    fn row_error(&self, row: u64, why: impl std::fmt::Display) -> Error {
        let g = self.groups.partition_point(|&s| s <= row) - 1;
        Error::format(
            &self.path,
            format!(
                "row {row} (row group {g}, column `{}`): {why}",
                self.reader
                    .metadata()
                    .file_metadata()
                    .schema_descr()
                    .column(self.column)
                    .path()
            ),
        )
    }

    /// Row `r` of a decoded group (the file's row `row`) as text.
    fn text<'g>(&self, group: &'g Group, r: usize, row: u64) -> Result<&'g str> {
        std::str::from_utf8(&group.text[group.ends[r]..group.ends[r + 1]])
            .map_err(|e| self.row_error(row, format!("is not UTF-8 text ({e})")))
    }

    /// Decodes the text column of row group `g`.
    fn decode_group(&self, g: usize) -> Result<Group> {
        let fail = |e: &dyn std::fmt::Display| {
            Error::format(
                &self.path,
                format!("row group {g}, column {}: {e}", self.column),
            )
        };
        let rows = (self.groups[g + 1] - self.groups[g]) as usize;
        // Walked on every decode: a table of 4,000 rows stored a page a row (every column) had
        // all its headers walked in 7.5-9.7 ms, against decoding and tokenizing the whole group.
        check_pages(
            &self.map,
            self.reader.metadata().row_group(g).column(self.column),
        )
        .map_err(|e| fail(&e))?;
        let reader = guarded(|| {
            self.reader
                .get_row_group(g)
                .and_then(|group| group.get_column_reader(self.column))
        });
        let ColumnReader::ByteArrayColumnReader(mut column) = reader.map_err(|e| fail(&e))? else {
            return Err(Error::Internal(
                "a byte-array column has another reader".into(),
            ));
        };
        let max_def = self
            .reader
            .metadata()
            .file_metadata()
            .schema_descr()
            .column(self.column)
            .max_def_level();
        let (mut values, mut defs) = (Vec::<ByteArray>::new(), Vec::<i16>::new());
        let mut text = Vec::new();
        // Grown as rows are read: the footer's row count is not trusted with an allocation.
        let mut ends = Vec::with_capacity(rows.min(1 << 16) + 1);
        ends.push(0);
        while ends.len() <= rows {
            values.clear();
            defs.clear();
            let want = 4096.min(rows + 1 - ends.len());
            let (records, _, _) =
                guarded(|| column.read_records(want, Some(&mut defs), None, &mut values))
                    .map_err(|e| fail(&e))?;
            if records == 0 {
                break;
            }
            let mut next = values.iter();
            for r in 0..records {
                // A null (defined below the column's maximum level) has no value: an empty
                // document.
                let present = max_def == 0 || defs.get(r).is_some_and(|&d| d == max_def);
                if present {
                    if let Some(v) = next.next() {
                        text.extend_from_slice(v.data());
                    }
                }
                ends.push(text.len());
            }
        }
        self.map.check()?;
        if ends.len() != rows + 1 {
            return Err(Error::format(
                &self.path,
                format!(
                    "row group {g} says {rows} rows, but its column `{}` holds {}",
                    self.column,
                    ends.len() - 1
                ),
            ));
        }
        Ok(Group {
            group: g,
            text,
            ends,
        })
    }

    /// Calls `each` with the tokens of document `row`, tokenized on this thread (or the ones it
    /// tokenized last), after checking them against the count of the table.
    fn with_document<T>(&self, row: u64, each: impl FnOnce(&[u32]) -> Result<T>) -> Result<T> {
        let mut recent = self.recent.take();
        let out = self.read_document(&mut recent, row, each);
        self.recent.put(recent);
        out
    }

    /// [`with_document`](Self::with_document) with this thread's `recent` reads.
    fn read_document<T>(
        &self,
        recent: &mut Recent,
        row: u64,
        each: impl FnOnce(&[u32]) -> Result<T>,
    ) -> Result<T> {
        if let Some(t) = recent.tokens.as_ref().filter(|t| t.row == row) {
            return each(&t.ids);
        }
        let g = self.groups.partition_point(|&s| s <= row) - 1;
        if recent.group.as_ref().is_none_or(|c| c.group != g) {
            // Drop the old group before decoding the next: one at a time per thread.
            recent.group = None;
            recent.group = Some(self.decode_group(g)?);
        }
        let Some(decoded) = recent.group.as_ref() else {
            return Err(Error::Internal("a decoded row group went missing".into()));
        };
        let mut ids = recent.tokens.take().map(|t| t.ids).unwrap_or_default();
        let text = self.text(decoded, (row - self.groups[g]) as usize, row)?;
        self.tokenizer
            .encode(text, &mut ids)
            .map_err(|why| self.row_error(row, why))?;
        let (start, end) = self.document(row);
        if ids.len() as u64 != end - start {
            return Err(self.row_error(
                row,
                format!(
                    "tokenizes to {} tokens, but the index counted {} (the file or the \
                     tokenizer changed while the source was open?)",
                    ids.len(),
                    end - start
                ),
            ));
        }
        let out = each(&ids);
        recent.tokens = Some(Tokens { row, ids });
        out
    }
}

impl Part for ParquetPart {
    fn tokens(&self) -> u64 {
        let s = self.starts.as_slice();
        s[s.len() - 1]
    }

    fn token_type(&self) -> TokenType {
        TokenType::U32
    }

    fn raw(&self, from: u64, to: u64, each: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let starts = self.starts.as_slice();
        let mut row = (starts.partition_point(|&s| s <= from) - 1) as u64;
        let mut bytes = Vec::new();
        while row < self.rows() && starts[row as usize] < to {
            let start = starts[row as usize];
            let (a, b) = (
                from.max(start) - start,
                to.min(starts[row as usize + 1]) - start,
            );
            if b > a {
                self.with_document(row, |ids| {
                    bytes.clear();
                    bytes.extend(
                        ids[a as usize..b as usize]
                            .iter()
                            .flat_map(|t| t.to_le_bytes()),
                    );
                    each(&bytes)
                })?;
            }
            row += 1;
        }
        Ok(())
    }

    fn doc_starts(&self, from: u64, to: u64, each: &mut dyn FnMut(u64)) {
        let starts = self.starts.as_slice();
        let first = starts.partition_point(|&s| s <= from);
        let inner = starts
            .get(first..starts.len().saturating_sub(1))
            .unwrap_or(&[]);
        for &start in inner {
            if start >= to {
                break;
            }
            each(start);
        }
    }

    fn documents(&self) -> std::result::Result<u64, String> {
        Ok(self.rows())
    }

    fn document(&self, d: u64) -> (u64, u64) {
        let s = self.starts.as_slice();
        let at = |d: u64| usize::try_from(d).ok().and_then(|d| s.get(d)).copied();
        let end = self.tokens();
        let start = at(d).unwrap_or(end);
        (start, at(d + 1).unwrap_or(end).max(start))
    }

    fn place(&self, t: u64) -> String {
        let row = self.starts.as_slice().partition_point(|&s| s <= t) - 1;
        format!("row {row} token {t}")
    }

    fn identity(&self) -> String {
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        format!(
            "parquet {name}: {} rows, {} tokens, tokenizer {:016x}",
            self.rows(),
            self.tokens(),
            self.tokenizer.hash
        )
    }

    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn check(&self) -> Result<()> {
        if let Table::Mapped { map, .. } = &self.starts {
            map.check()?;
        }
        self.map.check()
    }

    fn index_bytes(&self) -> usize {
        8 * (self.starts.len() + self.groups.len())
    }

    fn id_bound(&self) -> u64 {
        self.tokenizer.vocab
    }

    fn check_vocab(&self, _vocab: u64) -> Result<()> {
        // Checked once for the tokenizer when it was loaded: every id it makes is below its
        // vocabulary size.
        Ok(())
    }
}
