//! `parquet:` token sources: Parquet files the `parquet` crate's own writer writes (row groups,
//! nulls, snappy), a word-level `tokenizer.json` the `tokenizers` crate saves; windows, the
//! cached counts, `write_flat`'s file (and `write_flat_first`'s) read back as `tokens:`, and the
//! errors at open. The Python suite checks the same against pyarrow and the `tokenizers` Python
//! library.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use stoker_core::source::tokens::{Boundaries, Packing};
use stoker_core::source::{Source, TokenConfig, TokenSource, TokenSpec};
use stoker_core::DType;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::Tokenizer;

use crate::parquet_table::damage_chunk;
use crate::support::files::tmp;

const SEQ: usize = 4;
const EOS: u64 = 1;

/// A tokenizer of the words `w0`…`w49` (ids 2…51), `[UNK]` 0 and `</s>` 1.
pub(crate) fn write_tokenizer(path: &Path) {
    let mut vocab: HashMap<String, u32> = (0..50).map(|w| (format!("w{w}"), w + 2)).collect();
    vocab.insert("[UNK]".into(), 0);
    vocab.insert("</s>".into(), 1);
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Whitespace {}));
    tokenizer.save(path, false).unwrap();
}

/// `rows` (a `None` is a null) as a Parquet file of `groups` rows a row group.
pub(crate) fn write_parquet(path: &Path, rows: &[Option<String>], group: usize) {
    let schema =
        Arc::new(parse_message_type("message doc { optional binary text (UTF8); }").unwrap());
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, schema, props).unwrap();
    for chunk in rows.chunks(group) {
        let mut row_group = writer.next_row_group().unwrap();
        let mut column = row_group.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = chunk
            .iter()
            .flatten()
            .map(|t| ByteArray::from(t.as_str()))
            .collect();
        let defined: Vec<i16> = chunk.iter().map(|t| i16::from(t.is_some())).collect();
        column
            .typed::<ByteArrayType>()
            .write_batch(&values, Some(&defined), None)
            .unwrap();
        column.close().unwrap();
        row_group.close().unwrap();
    }
    writer.close().unwrap();
}

/// Rows of 0 to 10 words; every fifth a null.
pub(crate) fn rows(n: usize, base: usize) -> Vec<Option<String>> {
    (0..n)
        .map(|r| {
            (r % 5 != 3).then(|| {
                let words: Vec<String> = (0..(r * 7 + base) % 11)
                    .map(|k| format!("w{}", (r + k + base) % 50))
                    .collect();
                words.join(" ")
            })
        })
        .collect()
}

/// The tokens of a row with `EOS` after it, as the tokenizer above makes them.
fn ids(row: &Option<String>) -> Vec<i64> {
    let text = row.as_deref().unwrap_or("");
    let mut out: Vec<i64> = text
        .split_whitespace()
        .map(|w| w[1..].parse::<i64>().unwrap() + 2)
        .collect();
    out.push(EOS as i64);
    out
}

fn config(tokenizer: &Path, packing: Packing) -> TokenConfig {
    TokenConfig {
        seq_len: SEQ,
        boundaries: Boundaries::Reset,
        output: DType::I64,
        raw: None,
        eos: Some(EOS),
        vocab_size: None,
        tokenizer: Some(tokenizer.to_owned()),
        text_column: "text".into(),
        packing,
        pad_token: 0,
    }
}

fn input_ids(source: &TokenSource) -> Vec<Vec<i64>> {
    let mut scratch = Vec::new();
    (0..source.len())
        .map(|i| {
            let sample = source
                .read(i, &mut scratch)
                .unwrap_or_else(|e| panic!("{e}"));
            sample
                .get(0)
                .chunks_exact(8)
                .map(|b| i64::from_ne_bytes(b.try_into().unwrap()))
                .collect()
        })
        .collect()
}

struct Data {
    dir: PathBuf,
    rows: Vec<Option<String>>,
}

impl Data {
    fn new() -> Data {
        let dir = tmp("parquet");
        write_tokenizer(&dir.join("tokenizer.json"));
        let (a, b) = (rows(23, 0), rows(9, 5));
        write_parquet(&dir.join("docs-0.parquet"), &a, 4);
        write_parquet(&dir.join("docs-1.parquet"), &b, 9);
        Data {
            dir,
            rows: a.into_iter().chain(b).collect(),
        }
    }

    fn spec(&self) -> TokenSpec {
        TokenSpec::Parquet(format!("{}/docs-*.parquet", self.dir.display()))
    }

    fn open(&self, packing: Packing) -> stoker_core::Result<TokenSource> {
        TokenSource::open(
            &self.spec(),
            &config(&self.dir.join("tokenizer.json"), packing),
        )
    }
}

#[test]
fn windows_are_the_rows_tokens_end_to_end_across_row_groups_and_files() {
    let data = Data::new();
    let stream: Vec<i64> = data.rows.iter().flat_map(ids).collect();
    let source = data.open(Packing::Concat).unwrap();
    assert_eq!(source.total_tokens(), stream.len() as u64);
    let want: Vec<Vec<i64>> = (0..(stream.len() - 1) / SEQ)
        .map(|i| stream[i * SEQ..i * SEQ + SEQ].to_vec())
        .collect();
    assert_eq!(input_ids(&source), want);
    // Read backwards: every window decodes and tokenizes its rows afresh on this thread.
    let mut scratch = Vec::new();
    for i in (0..source.len()).rev() {
        let sample = source.read(i, &mut scratch).unwrap();
        let first = i64::from_ne_bytes(sample.get(0)[..8].try_into().unwrap());
        assert_eq!(first, want[i][0]);
    }
    // One row a sample under `pad`, the null row an EOS alone.
    let source = data.open(Packing::Pad).unwrap();
    assert_eq!(source.len(), data.rows.len());
    let padded = input_ids(&source);
    for (row, got) in data.rows.iter().zip(&padded) {
        let mut want = ids(row);
        want.resize(SEQ + 1, 0);
        assert_eq!(got[..], want[..SEQ]);
    }
}

#[test]
fn the_counts_are_cached_and_write_flat_reads_back_as_a_tokens_file() {
    let data = Data::new();
    let first = data.open(Packing::Concat).unwrap();
    let cache = data.dir.join(".docs-0.parquet.stkidx");
    let written = std::fs::metadata(&cache).unwrap().modified().unwrap();
    let again = data.open(Packing::Concat).unwrap();
    assert_eq!(
        std::fs::metadata(&cache).unwrap().modified().unwrap(),
        written
    );
    assert_eq!(input_ids(&again), input_ids(&first));

    let out = data.dir.join("flat.npy");
    let report = first.write_flat(&out, &mut |_| {}).unwrap();
    assert_eq!(report.dtype, DType::U16, "52 tokens fit uint16");
    assert_eq!(report.documents, data.rows.len() as u64);
    let flat = TokenSource::open(
        &TokenSpec::Flat(out.display().to_string()),
        &TokenConfig {
            eos: None,
            tokenizer: None,
            ..config(Path::new(""), Packing::Concat)
        },
    )
    .unwrap();
    let mut scratch = (Vec::new(), Vec::new());
    for i in 0..first.len() {
        let a = first.read(i, &mut scratch.0).unwrap();
        let b = flat.read(i, &mut scratch.1).unwrap();
        for f in 0..first.fields().len() {
            assert_eq!(a.get(f), b.get(f), "sample {i} field {f}");
        }
    }
}

#[test]
fn write_flat_first_writes_the_whole_documents_that_hold_the_tokens_asked_for() {
    let data = Data::new();
    let full = data.open(Packing::Pad).unwrap();
    let lengths: Vec<u64> = data.rows.iter().map(|r| ids(r).len() as u64).collect();
    // One token into the third document: it is written whole.
    let asked = lengths[0] + lengths[1] + 1;
    let out = data.dir.join("first.npy");
    let report = full.write_flat_first(&out, asked, &mut |_| {}).unwrap();
    assert_eq!(report.documents, 3);
    assert_eq!(report.tokens, lengths[..3].iter().sum::<u64>());
    let first = TokenSource::open(
        &TokenSpec::Flat(out.display().to_string()),
        &TokenConfig {
            eos: None,
            tokenizer: None,
            ..config(Path::new(""), Packing::Pad)
        },
    )
    .unwrap();
    assert_eq!(first.len(), 3, "a sample a document under pad");
    assert_eq!(input_ids(&first)[..], input_ids(&full)[..3]);
    // More tokens than the source holds: all of it.
    let all = full
        .write_flat_first(&data.dir.join("all.npy"), u64::MAX - 1, &mut |_| {})
        .unwrap();
    assert_eq!(all.documents, data.rows.len() as u64);
}

#[test]
fn bad_files_and_options_are_named_at_open() {
    let data = Data::new();
    let tokenizer = data.dir.join("tokenizer.json");
    let open = |spec: TokenSpec, config: TokenConfig| match TokenSource::open(&spec, &config) {
        Ok(_) => panic!("{spec} opened"),
        Err(e) => e.to_string(),
    };
    let e = open(
        data.spec(),
        TokenConfig {
            text_column: "body".into(),
            ..config(&tokenizer, Packing::Concat)
        },
    );
    assert!(
        e.contains("docs-0.parquet") && e.contains("no column `body`") && e.contains("text"),
        "{e}"
    );
    let e = open(
        data.spec(),
        TokenConfig {
            tokenizer: None,
            ..config(&tokenizer, Packing::Concat)
        },
    );
    assert!(e.contains("tokenizer") && e.contains("required"), "{e}");
    let e = open(
        data.spec(),
        TokenConfig {
            vocab_size: Some(10),
            ..config(&tokenizer, Packing::Concat)
        },
    );
    assert!(e.contains("vocab_size") && e.contains("52 tokens"), "{e}");
    let truncated = data.dir.join("truncated.parquet");
    let bytes = std::fs::read(data.dir.join("docs-0.parquet")).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let e = open(
        TokenSpec::Parquet(truncated.display().to_string()),
        config(&tokenizer, Packing::Concat),
    );
    assert!(
        e.contains("truncated.parquet") && e.contains("not a Parquet file"),
        "{e}"
    );
    // A page header declaring 2^31 - 1 booleans it does not hold (see `damage_chunk`): refused
    // as the first open counts row group 2's tokens, at once.
    let damaged = data.dir.join("damaged.parquet");
    std::fs::write(&damaged, damage_chunk(&bytes, 2, "text", false)).unwrap();
    let e = open(
        TokenSpec::Parquet(damaged.display().to_string()),
        config(&tokenizer, Packing::Concat),
    );
    assert!(
        e.contains("damaged.parquet: row group 2, column 0: a page header is damaged")
            && e.contains("declares 2147483647 elements"),
        "{e}"
    );
}
