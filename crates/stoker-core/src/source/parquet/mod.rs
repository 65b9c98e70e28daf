//! `parquet:PATTERN` read as a table (cargo feature `parquet`): one sample a row, one field a
//! column, as the Hugging Face Hub ships image datasets (`cifar10`, `imagenet-1k`, `mnist`:
//! an `image` column of `struct<bytes, path>` and an integer `label`). A binary column, or the
//! `bytes` of such an image struct, holds encoded images (JPEG or PNG) and decodes like a tar
//! shard's `jpg`; integer, floating-point and boolean columns are scalar tensors (int32 or int64
//! as stored, float32, uint8; float64 is delivered as float32). Text and list columns are not
//! delivered (text is read by the token source, `tokenizer=`). By default every image and
//! number column is a field under its column's name; `columns=COLUMN[:NAME],…` picks and names
//! them. With `tokenizer` set, `parquet:` is a token source instead ([`super::tokens`]).
//!
//! Files are mapped and read by the `parquet` crate's column readers. A sample is read from the
//! data page holding its row: pages before it in its row group are skipped by their headers,
//! without decompression. Each reading thread keeps a reader per field positioned after the row
//! it read last, so rows read in order (`shuffle=false`) decompress each page once. Shuffled rows
//! take their pages from a cache of decompressed pages the threads share (`pages`, up to
//! `parquet_cache` bytes), so a page is decompressed once or twice while its rows are read, not
//! once a row. `order=quasi_random` reads a window of row groups at a time, or of runs of data
//! pages of 2 MiB where the page index says where they begin: their pages stay in the cache, and
//! their bytes in the page cache instead of the whole file's. Readers are kept per part and freed
//! with it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parquet::basic::{Compression, ConvertedType, LogicalType, Type as PhysicalType};
use parquet::column::reader::{get_column_reader, ColumnReader, ColumnReaderImpl};
use parquet::data_type::DataType;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, RowGroupMetaData};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::serialized_reader::ReadOptionsBuilder;
use parquet::schema::types::ColumnDescriptor;

use super::mapped::Mapping;
use super::packed::format::DEFAULT_PAGE_SIZE;
use super::per_thread::PerThread;
use super::remote::{RemoteConfig, ShardHolder};
use super::shards::expand_shards;
use super::{
    is_field_name, open_file, FieldSpec, PageCacheFit, Sample, Source, MAX_FIELDS,
    PARQUET_CACHE_BYTES,
};
use crate::dtype::DType;
use crate::error::{panic_message, Error, Result};
use crate::hash::Fnv;

mod pages;
mod thrift;

use pages::{PageCache, PageKey};

/// Hands a mapping to the Parquet reader as `Bytes` without copying it.
struct Mapped(Arc<Mapping>);

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Runs a call into the `parquet` crate, a panic inside it becoming an error: a damaged file must
/// be an error naming it, and the crate's readers panic on some malformed input. The parquet_table
/// fuzz target found two, now tests: 57.3.2 unwrapped a compact-Thrift bool field of another type
/// in the footer (apache/arrow-rs#9839, fixed by 60), and 60.1.0 subtracts with overflow when an
/// offset index puts a column's first page before its chunk (a panic where overflow is checked).
pub(crate) fn guarded<T, E: From<ParquetError>>(
    f: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        Err(E::from(ParquetError::General(format!(
            "the Parquet reader failed: {}",
            panic_message(&*panic)
        ))))
    })
}

/// A Parquet file mapped and its footer read: `path` is the local file (a remote file's cached
/// copy), `shown` what messages name. With `page_index`, the page index is read too when the
/// file has one (pages are then skipped without reading their headers). The footer and the page
/// index are walked first ([`thrift`]): the reader's own parse of some damaged ones takes hours.
pub(crate) fn open_mapped(
    path: &Path,
    shown: &Path,
    page_index: bool,
) -> Result<(SerializedFileReader<Bytes>, Arc<Mapping>, std::fs::Metadata)> {
    let (file, meta) = open_file(path, "a Parquet file")?;
    let map = Arc::new(Mapping::map(&file, path)?);
    let not_parquet =
        |e: &dyn std::fmt::Display| Error::format(shown, format!("is not a Parquet file: {e}"));
    check_footer(&map).map_err(|e| not_parquet(&e))?;
    map.check()?;
    let bytes = Bytes::from_owner(Mapped(Arc::clone(&map)));
    let mut options = ReadOptionsBuilder::new();
    // The reader hands each row group's metadata to a predicate before it reads the page index:
    // a damaged index leaves its row group out, unread, and fails the open below.
    let damaged_index = Arc::new(OnceLock::<String>::new());
    if page_index {
        let (map, damaged) = (Arc::clone(&map), Arc::clone(&damaged_index));
        options = options
            .with_predicate(Box::new(move |group, g| {
                match check_page_index(&map, group) {
                    Ok(()) => true,
                    Err(e) => {
                        // The first damaged row group is the one named.
                        let _ = damaged.set(format!("row group {g}: {e}"));
                        false
                    }
                }
            }))
            .with_page_index();
    }
    let reader = guarded(|| SerializedFileReader::new_with_options(bytes, options.build()))
        .map_err(|e| not_parquet(&e))?;
    map.check()?;
    if let Some(e) = damaged_index.get() {
        return Err(not_parquet(e));
    }
    Ok((reader, map, meta))
}

/// The footer of the file `map` walked, or what is wrong with it. A file without Parquet's
/// trailer, or too short for the footer length it states, is the reader's to refuse.
fn check_footer(map: &[u8]) -> std::result::Result<(), String> {
    let Some(start) = metadata_start(map).filter(|_| map.ends_with(b"PAR1")) else {
        return Ok(());
    };
    thrift::check_struct(&map[start..map.len() - 8], start as u64)
        .map(drop)
        .map_err(|e| format!("its footer is damaged: {e}"))
}

/// The column and offset indexes of `group`'s column chunks walked, or what is wrong with one.
/// An index outside the file is the reader's to refuse.
fn check_page_index(map: &[u8], group: &RowGroupMetaData) -> std::result::Result<(), String> {
    for column in group.columns() {
        let indexes = [
            (
                "column index",
                column.column_index_offset(),
                column.column_index_length(),
            ),
            (
                "offset index",
                column.offset_index_offset(),
                column.offset_index_length(),
            ),
        ];
        for (what, offset, length) in indexes {
            let Some((at, bytes)) = offset.zip(length).and_then(|(offset, length)| {
                let at = usize::try_from(offset).ok()?;
                let end = at.checked_add(usize::try_from(length).ok()?)?;
                Some((at, map.get(at..end)?))
            }) else {
                continue;
            };
            thrift::check_struct(bytes, at as u64).map_err(|e| {
                format!(
                    "the {what} of column `{}` is damaged: {e}",
                    column.column_path().string()
                )
            })?;
        }
    }
    Ok(())
}

/// The page headers of `column`'s chunk in the file `map` walked, or what is wrong with one:
/// before a column reader reads them, since its parse of some damaged headers takes hours. A
/// chunk outside the file, or a page without a size, is the reader's to refuse.
pub(crate) fn check_pages(
    map: &[u8],
    column: &ColumnChunkMetaData,
) -> std::result::Result<(), String> {
    let start = column
        .dictionary_page_offset()
        .unwrap_or_else(|| column.data_page_offset());
    let Some((start, chunk)) = usize::try_from(start).ok().and_then(|start| {
        let end = start.checked_add(usize::try_from(column.compressed_size()).ok()?)?;
        Some((start, map.get(start..end)?))
    }) else {
        return Ok(());
    };
    let mut pos = 0;
    while pos < chunk.len() {
        let (header, size) = thrift::check_page_header(&chunk[pos..], (start + pos) as u64)
            .map_err(|e| format!("a page header is damaged: {e}"))?;
        let Some(size) = size.and_then(|s| usize::try_from(s).ok()) else {
            return Ok(());
        };
        pos = pos.saturating_add(header).saturating_add(size);
    }
    Ok(())
}

/// `rows` plus the row count of row group `g` of the file `shown`, or why the footer's count
/// cannot be right (negative, or the sum overflows).
pub(crate) fn add_rows(rows: u64, g: usize, group: &RowGroupMetaData, shown: &Path) -> Result<u64> {
    u64::try_from(group.num_rows())
        .map_err(|_| {
            Error::format(
                shown,
                format!("row group {g} says {} rows", group.num_rows()),
            )
        })?
        .checked_add(rows)
        .ok_or_else(|| Error::format(shown, "its row groups' row counts overflow".to_owned()))
}

/// The footer of a Parquet file: its metadata and the 8 bytes after it (all of the file when it
/// is too short to have one; the reader refused such a file already).
pub(crate) fn footer(map: &[u8]) -> &[u8] {
    &map[metadata_start(map).unwrap_or(0)..]
}

/// Where a Parquet file's metadata starts: it ends at the file's last 8 bytes, whose first 4 give
/// its length; `None` when the file is too short for the length they give.
fn metadata_start(map: &[u8]) -> Option<usize> {
    let n = map.len();
    let len = map.get(n.checked_sub(8)?..n - 4)?;
    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    n.checked_sub(len.checked_add(8)?)
}

/// How a column's values become a field's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Encoded image bytes.
    Image,
    /// INT32 stored (int8/16/32, uint8/16): int32.
    Int32,
    /// INT32 holding uint32: int64.
    UInt32,
    /// INT64: int64.
    Int64,
    /// INT64 holding uint64: int64, a value over `i64::MAX` an error.
    UInt64,
    /// FLOAT: float32.
    Float,
    /// DOUBLE: float32.
    Double,
    /// BOOLEAN: uint8 0 or 1.
    Bool,
}

impl Kind {
    /// The kind of a leaf column, or why it cannot be a field.
    fn of(desc: &ColumnDescriptor) -> std::result::Result<Kind, String> {
        if desc.max_rep_level() > 0 {
            return Err("lists (a varying number of values a row)".into());
        }
        let logical = desc.logical_type_ref();
        let converted = desc.converted_type();
        let text = matches!(
            logical,
            Some(LogicalType::String | LogicalType::Json | LogicalType::Enum)
        ) || matches!(
            converted,
            ConvertedType::UTF8 | ConvertedType::JSON | ConvertedType::ENUM
        );
        let unsigned = |bits: i8| {
            matches!(logical, Some(LogicalType::Integer(t)) if !t.is_signed && t.bit_width == bits)
                || converted
                    == match bits {
                        32 => ConvertedType::UINT_32,
                        _ => ConvertedType::UINT_64,
                    }
        };
        Ok(match desc.physical_type() {
            PhysicalType::BYTE_ARRAY if text => return Err("text".into()),
            PhysicalType::BYTE_ARRAY => Kind::Image,
            PhysicalType::INT32 if unsigned(32) => Kind::UInt32,
            PhysicalType::INT32 => Kind::Int32,
            PhysicalType::INT64 if unsigned(64) => Kind::UInt64,
            PhysicalType::INT64 => Kind::Int64,
            PhysicalType::FLOAT => Kind::Float,
            PhysicalType::DOUBLE => Kind::Double,
            PhysicalType::BOOLEAN => Kind::Bool,
            other => return Err(format!("{other} values")),
        })
    }

    fn field(self, name: &str) -> FieldSpec {
        match self {
            Kind::Image => FieldSpec::encoded_image(name),
            Kind::Int32 => FieldSpec::tensor(name, DType::I32, &[]),
            Kind::UInt32 | Kind::Int64 | Kind::UInt64 => FieldSpec::tensor(name, DType::I64, &[]),
            Kind::Float | Kind::Double => FieldSpec::tensor(name, DType::F32, &[]),
            Kind::Bool => FieldSpec::tensor(name, DType::U8, &[]),
        }
    }
}

/// The leaf column a top-level column's values are read from: the column itself, or the
/// `bytes` of a Hugging Face image (`struct<bytes: binary, path: string>`).
fn leaf_of(named: &[String], column: &str) -> Option<usize> {
    named
        .iter()
        .position(|n| n == column)
        .or_else(|| named.iter().position(|n| *n == format!("{column}.bytes")))
}

/// One field: its kind and where every file holds it.
struct Column {
    /// The top-level column's name.
    column: String,
    kind: Kind,
}

/// One Parquet file of the table.
struct TableFile {
    shown: PathBuf,
    reader: SerializedFileReader<Bytes>,
    map: Arc<Mapping>,
    /// The first row of each row group; one more entry, the rows.
    groups: Vec<u64>,
    /// Each field's leaf column in this file, and the column's maximum definition level.
    leaves: Vec<(usize, i16)>,
    /// Whether the page headers of field `k`'s chunk in row group `g` were walked
    /// ([`check_pages`]), at `g * leaves.len() + k`: once, not on every reader made.
    pages_checked: Vec<AtomicBool>,
}

/// A reader of one field's column, positioned at row `next` of row group `group` of file
/// `file`.
struct Cursor {
    file: usize,
    group: usize,
    next: u64,
    reader: ColumnReader,
}

/// `parquet:PATTERN` as a map-style table (see the module docs).
pub struct ParquetSource {
    files: Vec<TableFile>,
    /// The first sample of each file; one more entry, the samples.
    starts: Vec<usize>,
    fields: Vec<FieldSpec>,
    columns: Vec<Column>,
    /// The footers' hash: the data's identity.
    footers: u64,
    /// Each reading thread's cursors, one per field.
    cursors: PerThread<Vec<Option<Cursor>>>,
    /// Decompressed pages the threads share.
    pages: Arc<PageCache>,
    _holder: ShardHolder,
}

impl std::fmt::Debug for ParquetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ParquetSource({} files, {} rows)",
            self.files.len(),
            self.len()
        )
    }
}

impl ParquetSource {
    /// Opens the Parquet files `pattern` names (local or remote; remote files are downloaded
    /// whole into the cache `remote` says) as one table; `columns` picks the fields and names
    /// them (`(column, field name)`, the option `columns`), else every image and number column
    /// is one, under the column's name.
    pub fn open(
        pattern: &str,
        columns: Option<&[(String, String)]>,
        remote: &RemoteConfig,
    ) -> Result<ParquetSource> {
        let names = expand_shards(pattern)?;
        let resolved = super::remote::resolve(names, remote, false)?;
        let mut files = Vec::with_capacity(resolved.paths.len());
        for (path, name) in resolved.paths.iter().zip(&resolved.names) {
            let shown = PathBuf::from(name.strip_prefix("file://").unwrap_or(name));
            let (reader, map, _) = open_mapped(path, &shown, true)?;
            files.push((shown, reader, map));
        }
        let Some((first, reader, _)) = files.first() else {
            return Err(Error::option(
                "source",
                format!("parquet:{pattern} names no file"),
            ));
        };
        let chosen = choose_columns(first, reader, columns)?;
        let mut hash = Fnv::new();
        let mut table = Vec::with_capacity(files.len());
        let mut starts = Vec::with_capacity(files.len() + 1);
        let mut total = 0usize;
        starts.push(0);
        for (shown, reader, map) in files {
            hash.bytes(footer(&map));
            let file = table_file(shown, reader, map, &chosen)?;
            total = total
                .checked_add(usize::try_from(file.rows()).unwrap_or(usize::MAX))
                .ok_or_else(|| Error::Internal("the row count overflows".into()))?;
            starts.push(total);
            table.push(file);
        }
        Ok(ParquetSource {
            files: table,
            starts,
            fields: chosen.iter().map(|(c, name)| c.kind.field(name)).collect(),
            columns: chosen.into_iter().map(|(c, _)| c).collect(),
            footers: hash.finish(),
            cursors: PerThread::new(),
            pages: Arc::new(PageCache::new(PARQUET_CACHE_BYTES)),
            _holder: resolved.holder,
        })
    }

    /// The source keeping `bytes` of decompressed pages for its reading threads (the option
    /// `parquet_cache`; [`PARQUET_CACHE_BYTES`] when opened), none with 0.
    pub fn with_cache(mut self, bytes: u64) -> ParquetSource {
        self.pages = Arc::new(PageCache::new(bytes));
        self
    }

    /// The file and its row of sample `index` (`< len()`).
    fn locate(&self, index: usize) -> (usize, u64) {
        let f = self.starts.partition_point(|&s| s <= index) - 1;
        (f, (index - self.starts[f]) as u64)
    }

    /// Reads field `k` of sample `index` (row `row` of file `f`) into `out` (appended) with
    /// this thread's `cursor` for the field.
    fn read_field(
        &self,
        cursor: &mut Option<Cursor>,
        k: usize,
        index: usize,
        (f, row): (usize, u64),
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let file = &self.files[f];
        let g = file.groups.partition_point(|&s| s <= row) - 1;
        let in_group = row - file.groups[g];
        let (leaf, max_def) = file.leaves[k];
        // The row's own error: `on_error=skip` replaces the sample.
        let fail = |why: String| Error::Sample {
            index: index as u64,
            what: format!(
                "{} row {row} (row group {g}), column `{}`",
                file.shown.display(),
                self.columns[k].column
            ),
            reason: why,
        };
        let parquet = |e: ParquetError| fail(e.to_string());
        let reusable = cursor
            .as_ref()
            .is_some_and(|c| c.file == f && c.group == g && c.next <= in_group);
        if !reusable {
            *cursor = None;
            let checked = &file.pages_checked[g * file.leaves.len() + k];
            if !checked.load(Ordering::Relaxed) {
                let column = file.reader.metadata().row_group(g).column(leaf);
                check_pages(&file.map, column).map_err(&fail)?;
                checked.store(true, Ordering::Relaxed);
            }
            let reader = guarded(|| {
                let group = file.reader.get_row_group(g)?;
                let mut pages = group.get_column_page_reader(leaf)?;
                if is_cached(group.metadata().column(leaf)) {
                    let first = PageKey {
                        file: f,
                        group: g,
                        leaf,
                        page: 0,
                    };
                    pages = self.pages.reader(pages, first);
                }
                let schema = file.reader.metadata().file_metadata().schema_descr();
                Ok(get_column_reader(schema.column(leaf), pages))
            })
            .map_err(parquet)?;
            *cursor = Some(Cursor {
                file: f,
                group: g,
                next: 0,
                reader,
            });
        }
        let Some(c) = cursor.as_mut() else {
            return Err(Error::Internal("a column cursor went missing".into()));
        };
        // Left unusable until the read succeeds: a failed read leaves the reader's place unknown.
        let skip = (in_group - c.next) as usize;
        c.next = u64::MAX;
        let kind = self.columns[k].kind;
        let present =
            guarded(|| read_one(&mut c.reader, kind, skip, max_def, out)).map_err(|e| match e {
                Read::Parquet(e) => parquet(e),
                Read::Short => fail("the row group ends before this row".into()),
                Read::Range(v) => fail(format!("uint64 {v} does not fit int64")),
            })?;
        c.next = in_group + 1;
        if !present {
            return Err(fail(match self.columns[k].kind {
                Kind::Image => "the value is null (no image bytes)".into(),
                _ => "the value is null".into(),
            }));
        }
        file.map.check()
    }
}

/// The columns to deliver, from the first file: `columns` as named, or every image and number
/// column.
fn choose_columns(
    shown: &Path,
    reader: &SerializedFileReader<Bytes>,
    columns: Option<&[(String, String)]>,
) -> Result<Vec<(Column, String)>> {
    let schema = reader.metadata().file_metadata().schema_descr();
    let named: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
    let top: Vec<&str> = schema
        .root_schema()
        .get_fields()
        .iter()
        .map(|f| f.name())
        .collect();
    let kind_of = |column: &str| -> std::result::Result<Kind, String> {
        let leaf = leaf_of(&named, column).ok_or_else(|| {
            format!(
                "has no column `{column}` (a top-level column, or an image struct with `bytes`)"
            )
        })?;
        Kind::of(&schema.column(leaf))
    };
    let chosen: Vec<(Column, String)> = match columns {
        Some(columns) => columns
            .iter()
            .map(|(column, name)| {
                let kind = kind_of(column).map_err(|why| {
                    Error::format(
                        shown,
                        if why.starts_with("has no") {
                            format!("{why}; its columns: {}", top.join(", "))
                        } else {
                            format!(
                                "column `{column}` holds {why}: a parquet: table delivers images \
                                 and numbers (text is read as tokens with tokenizer=)"
                            )
                        },
                    )
                })?;
                Ok((
                    Column {
                        column: column.clone(),
                        kind,
                    },
                    name.clone(),
                ))
            })
            .collect::<Result<_>>()?,
        None => top
            .iter()
            .filter_map(|&column| {
                let kind = kind_of(column).ok()?;
                Some((
                    Column {
                        column: column.to_owned(),
                        kind,
                    },
                    column.to_owned(),
                ))
            })
            .collect(),
    };
    if chosen.is_empty() {
        return Err(Error::format(
            shown,
            format!(
                "has no image or number column to deliver (its columns: {}); a text column is \
                 read as tokens with tokenizer=",
                top.join(", ")
            ),
        ));
    }
    if chosen.len() > MAX_FIELDS {
        return Err(Error::format(
            shown,
            format!(
                "has {} image and number columns, more than the {MAX_FIELDS} fields a sample may \
                 have: pick some with columns=COLUMN,…",
                chosen.len()
            ),
        ));
    }
    for (c, name) in &chosen {
        if !is_field_name(name) {
            return Err(Error::option(
                "columns",
                format!(
                    "column `{}` needs a field name: write `{}:NAME`",
                    c.column, c.column
                ),
            ));
        }
    }
    Ok(chosen)
}

/// One file of the table: its row groups and where it holds each chosen column, which must be
/// of the first file's kind.
fn table_file(
    shown: PathBuf,
    reader: SerializedFileReader<Bytes>,
    map: Arc<Mapping>,
    chosen: &[(Column, String)],
) -> Result<TableFile> {
    let metadata = reader.metadata();
    let schema = metadata.file_metadata().schema_descr();
    let named: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
    let mut leaves = Vec::with_capacity(chosen.len());
    for (c, _) in chosen {
        let leaf = leaf_of(&named, &c.column).ok_or_else(|| {
            Error::format(
                &shown,
                format!("has no column `{}` (the first file has it)", c.column),
            )
        })?;
        let desc = schema.column(leaf);
        let kind = Kind::of(&desc)
            .map_err(|why| Error::format(&shown, format!("column `{}` holds {why}", c.column)))?;
        if kind != c.kind {
            return Err(Error::format(
                &shown,
                format!(
                    "column `{}` holds {kind:?} values, the first file's {:?}",
                    c.column, c.kind
                ),
            ));
        }
        leaves.push((leaf, desc.max_def_level()));
    }
    // Grown as row groups are counted: the footer's group count is not trusted with an
    // allocation.
    let mut groups = Vec::with_capacity(metadata.num_row_groups().min(1 << 16) + 1);
    let mut rows = 0u64;
    groups.push(0);
    for (g, group) in metadata.row_groups().iter().enumerate() {
        // Every chosen column is flat (one value or null a row), so its chunk holds as many
        // values as the group has rows: a footer that disagrees is damaged.
        for ((leaf, _), (c, _)) in leaves.iter().zip(chosen) {
            let values = group.column(*leaf).num_values();
            if values != group.num_rows() {
                return Err(Error::format(
                    &shown,
                    format!(
                        "row group {g} says {} rows, but its column `{}` holds {values} values",
                        group.num_rows(),
                        c.column
                    ),
                ));
            }
        }
        rows = add_rows(rows, g, group, &shown)?;
        groups.push(rows);
    }
    let chunks = (groups.len() - 1).saturating_mul(leaves.len());
    Ok(TableFile {
        shown,
        reader,
        map,
        pages_checked: (0..chunks).map(|_| AtomicBool::new(false)).collect(),
        groups,
        leaves,
    })
}

impl TableFile {
    fn rows(&self) -> u64 {
        self.groups[self.groups.len() - 1]
    }

    /// The first row of each page `order=quasi_random` reads as one, ascending from 0: a row
    /// group, or, where the page index says where the data pages of the group's largest chosen
    /// column begin, runs of them of at least [`DEFAULT_PAGE_SIZE`] bytes. So a window of
    /// pages is about as many bytes as on packed data when `datasets` writes 100 MB row groups
    /// of small pages, and a row group that is one page (100 images, pyarrow's defaults) stays
    /// a page.
    fn quasi_random_pages(&self) -> Vec<u64> {
        let metadata = self.reader.metadata();
        let mut starts = Vec::with_capacity(self.groups.len());
        for (g, group) in metadata.row_groups().iter().enumerate() {
            let (first, end) = (self.groups[g], self.groups[g + 1]);
            starts.push(first);
            let largest = self
                .leaves
                .iter()
                .map(|&(leaf, _)| leaf)
                .max_by_key(|&leaf| group.column(leaf).uncompressed_size());
            let index = metadata.page_index_for_row_group(g);
            let Some(index) = largest.and_then(|leaf| index.offset_index(leaf)) else {
                continue;
            };
            let mut bytes = 0u64;
            for page in index.page_locations() {
                // A damaged index only makes the order less local: rows out of the group's
                // range or out of order are not page starts.
                let start = u64::try_from(page.first_row_index).map_or(end, |r| first + r);
                if bytes >= u64::from(DEFAULT_PAGE_SIZE)
                    && start < end
                    && starts.last().is_some_and(|&last| last < start)
                {
                    starts.push(start);
                    bytes = 0;
                }
                bytes += u64::try_from(page.compressed_page_size).unwrap_or(0);
            }
        }
        starts
    }
}

/// Whether a column chunk's pages go through the page cache: those that are compressed. An
/// uncompressed page is a slice of the mapping, with nothing to keep.
fn is_cached(chunk: &ColumnChunkMetaData) -> bool {
    chunk.compression() != Compression::UNCOMPRESSED
}

/// Why one value could not be read.
enum Read {
    Parquet(ParquetError),
    /// The column chunk ended before the row.
    Short,
    /// A uint64 over `i64::MAX`.
    Range(u64),
}

impl From<ParquetError> for Read {
    fn from(e: ParquetError) -> Read {
        Read::Parquet(e)
    }
}

/// Skips `skip` rows of a typed column reader, then reads the next row's value: `None` when it
/// is null.
fn next_value<T: DataType>(
    reader: &mut ColumnReaderImpl<T>,
    skip: usize,
    max_def: i16,
) -> std::result::Result<Option<T::T>, Read> {
    if reader.skip_records(skip)? < skip {
        return Err(Read::Short);
    }
    let (mut defs, mut values) = (Vec::with_capacity(1), Vec::with_capacity(1));
    let (records, _, _) = reader.read_records(1, Some(&mut defs), None, &mut values)?;
    if records == 0 {
        return Err(Read::Short);
    }
    let present = max_def == 0 || defs.first() == Some(&max_def);
    Ok(values.pop().filter(|_| present))
}

/// Skips `skip` rows of `reader`, then appends the next row's value to `out` as its field's
/// bytes; `false` when it is null.
fn read_one(
    reader: &mut ColumnReader,
    kind: Kind,
    skip: usize,
    max_def: i16,
    out: &mut Vec<u8>,
) -> std::result::Result<bool, Read> {
    let put = |bytes: &[u8], out: &mut Vec<u8>| out.extend_from_slice(bytes);
    let value = match (reader, kind) {
        (ColumnReader::ByteArrayColumnReader(r), Kind::Image) => {
            next_value(r, skip, max_def)?.map(|v| put(v.data(), out))
        }
        (ColumnReader::Int32ColumnReader(r), Kind::Int32) => {
            next_value(r, skip, max_def)?.map(|v| put(&v.to_le_bytes(), out))
        }
        // A uint32 is stored as the int32 of the same bits.
        (ColumnReader::Int32ColumnReader(r), Kind::UInt32) => {
            next_value(r, skip, max_def)?.map(|v| put(&i64::from(v as u32).to_le_bytes(), out))
        }
        (ColumnReader::Int64ColumnReader(r), Kind::Int64) => {
            next_value(r, skip, max_def)?.map(|v| put(&v.to_le_bytes(), out))
        }
        // A uint64 is stored as the int64 of the same bits: negative when over i64::MAX.
        (ColumnReader::Int64ColumnReader(r), Kind::UInt64) => match next_value(r, skip, max_def)? {
            Some(v) if v < 0 => return Err(Read::Range(v as u64)),
            v => v.map(|v| put(&v.to_le_bytes(), out)),
        },
        (ColumnReader::FloatColumnReader(r), Kind::Float) => {
            next_value(r, skip, max_def)?.map(|v| put(&v.to_le_bytes(), out))
        }
        (ColumnReader::DoubleColumnReader(r), Kind::Double) => {
            next_value(r, skip, max_def)?.map(|v| put(&(v as f32).to_le_bytes(), out))
        }
        (ColumnReader::BoolColumnReader(r), Kind::Bool) => {
            next_value(r, skip, max_def)?.map(|v| put(&[u8::from(v)], out))
        }
        _ => {
            return Err(Read::Parquet(ParquetError::General(
                "the column's reader is not of its type".into(),
            )))
        }
    };
    Ok(value.is_some())
}

impl Source for ParquetSource {
    fn len(&self) -> usize {
        self.starts[self.starts.len() - 1]
    }

    fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }

    fn describe(&self, index: usize) -> String {
        let (f, row) = self.locate(index);
        format!("{} row {row}", self.files[f].shown.display())
    }

    fn identity(&self) -> String {
        let names: Vec<String> = self
            .files
            .iter()
            .map(|f| {
                f.shown
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
            })
            .collect();
        format!(
            "parquet table of {} rows in {:?}, footers {:016x}, fields {:?}",
            self.len(),
            names,
            self.footers,
            self.fields
        )
    }

    fn pages(&self) -> Option<Vec<u64>> {
        let mut pages = Vec::with_capacity(self.len());
        let mut page = 0u64;
        for file in &self.files {
            let starts = file.quasi_random_pages();
            for (p, &start) in starts.iter().enumerate() {
                let end = starts.get(p + 1).copied().unwrap_or(file.rows());
                pages.extend(std::iter::repeat_n(page, (end - start) as usize));
                page += 1;
            }
        }
        Some(pages)
    }

    fn page_cache(&self) -> Option<PageCacheFit> {
        let mut pages = 0u64;
        for file in &self.files {
            for group in file.reader.metadata().row_groups() {
                for &(leaf, _) in &file.leaves {
                    let chunk = group.column(leaf);
                    if is_cached(chunk) {
                        let size = u64::try_from(chunk.uncompressed_size()).unwrap_or(0);
                        pages = pages.saturating_add(size);
                    }
                }
            }
        }
        Some(PageCacheFit {
            pages,
            kept: self.pages.budget(),
        })
    }

    fn read<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let at = self.locate(index);
        let mut cursors = self.cursors.take();
        cursors.resize_with(self.columns.len(), || None);
        scratch.clear();
        let mut ends = [0usize; MAX_FIELDS];
        let mut result = Ok(());
        for (k, cursor) in cursors.iter_mut().enumerate() {
            result = self.read_field(cursor, k, index, at, scratch);
            if result.is_err() {
                break;
            }
            ends[k] = scratch.len();
        }
        self.cursors.put(cursors);
        result?;
        let bytes: &'a [u8] = scratch;
        let mut sample = Sample::default();
        let mut start = 0;
        for (k, &end) in ends.iter().take(self.columns.len()).enumerate() {
            sample.set(k, &bytes[start..end]);
            start = end;
        }
        Ok(sample)
    }
}
