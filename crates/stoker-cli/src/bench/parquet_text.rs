//! A language model's raw corpus as `parquet:` with `tokenizer=` sees it: generated English-like
//! text, a document a row, in Parquet files of a `text` column (snappy, row groups of 1,000 rows),
//! and a byte-level BPE of 8,000 tokens trained on it (GPT-2's kind of tokenizer, made by the
//! `tokenizers` crate). `bench/compare_tokens.py` makes the same kind of data in Python.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use stoker_core::rng::{Rng, Stream};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, TokenizerBuilder};

/// Files the rows are spread over.
const FILES: usize = 8;
/// Rows per row group.
const ROWS_PER_GROUP: usize = 1000;
/// The tokenizer's vocabulary.
const VOCAB: usize = 8000;
/// The end-of-text token: the tokenizer's only special token, so its id is 0.
pub(crate) const EOS_TOKEN: u32 = 0;
/// Distinct words in the text (Zipf-distributed), and words per document.
const WORDS: usize = 20_000;
const DOCUMENT_WORDS: std::ops::Range<u64> = 40..600;
/// Letters by frequency in English; a word's letters are drawn with weight 1/rank.
const LETTERS: &[u8] = b"etaoinshrdlucmfwypvbgkjqxz";

/// The text of `rows` documents in the folder `dir/text-ROWS`, written once: its `parquet:`
/// source, the folder, and the path of its `tokenizer.json`.
pub(crate) fn text_in(dir: &Path, rows: usize) -> Result<(String, PathBuf, PathBuf), String> {
    if rows < FILES {
        return Err(format!(
            "--text-rows {rows}: at least {FILES}, a row a file"
        ));
    }
    let root = dir.join(format!("text-{rows}"));
    let source = format!("parquet:{}/train-*.parquet", root.display());
    let tokenizer = root.join("tokenizer.json");
    if root.exists() {
        return Ok((source, root, tokenizer));
    }
    // Written whole under another name, then renamed: a folder there is complete.
    let partial = dir.join(format!("text-{rows}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    eprintln!(
        "writing {rows} documents of text and training a tokenizer into {} ...",
        root.display()
    );
    let documents = generate(rows);
    for (f, part) in documents.chunks(rows.div_ceil(FILES)).enumerate() {
        let path = partial.join(format!("train-{f}.parquet"));
        write(&path, part).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let path = partial.join("tokenizer.json");
    train(&documents, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::rename(&partial, &root).map_err(|e| format!("{}: {e}", root.display()))?;
    Ok((source, root, tokenizer))
}

/// `rows` documents of words drawn from a Zipf distribution over made-up words.
fn generate(rows: usize) -> Vec<String> {
    let mut rng = Rng::for_key(0, Stream::Order, 0, 0);
    let letter_weights = by_rank(LETTERS.len());
    let words: Vec<String> = (0..WORDS)
        .map(|_| {
            let len = 1 + rng.below(9) as usize;
            (0..len)
                .map(|_| char::from(LETTERS[draw(&mut rng, &letter_weights)]))
                .collect()
        })
        .collect();
    let word_weights = by_rank(WORDS);
    (0..rows)
        .map(|_| {
            let n = DOCUMENT_WORDS.start + rng.below(DOCUMENT_WORDS.end - DOCUMENT_WORDS.start);
            let mut text: Vec<&str> = (0..n)
                .map(|_| words[draw(&mut rng, &word_weights)].as_str())
                .collect();
            text.push(".");
            text.join(" ")
        })
        .collect()
}

/// The running sums of the weights 1/rank of `n` items (Zipf's law).
fn by_rank(n: usize) -> Vec<f64> {
    (1..=n)
        .scan(0.0, |sum, r| {
            *sum += 1.0 / r as f64;
            Some(*sum)
        })
        .collect()
}

/// An index drawn with the weights whose running sums are `sums`.
fn draw(rng: &mut Rng, sums: &[f64]) -> usize {
    let total = sums.last().copied().unwrap_or(0.0);
    let at = rng.unit_f64() * total;
    sums.partition_point(|&s| s <= at).min(sums.len() - 1)
}

fn write(path: &Path, rows: &[String]) -> Result<(), String> {
    let schema = parse_message_type("message doc { required binary text (UTF8); }")
        .map_err(|e| e.to_string())?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let file = std::fs::File::create(path).map_err(|e| e.to_string())?;
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props))
        .map_err(|e| e.to_string())?;
    for group in rows.chunks(ROWS_PER_GROUP) {
        let mut row_group = writer.next_row_group().map_err(|e| e.to_string())?;
        let mut column = row_group
            .next_column()
            .map_err(|e| e.to_string())?
            .ok_or("the schema has a column")?;
        let values: Vec<ByteArray> = group.iter().map(|t| ByteArray::from(t.as_str())).collect();
        column
            .typed::<ByteArrayType>()
            .write_batch(&values, None, None)
            .map_err(|e| e.to_string())?;
        column.close().map_err(|e| e.to_string())?;
        row_group.close().map_err(|e| e.to_string())?;
    }
    writer.close().map_err(|e| e.to_string())?;
    Ok(())
}

/// A byte-level BPE of [`VOCAB`] tokens trained on `documents`, saved as `tokenizer.json`.
fn train(documents: &[String], path: &Path) -> Result<(), String> {
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(VOCAB)
        .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer =
        TokenizerBuilder::<BPE, NormalizerWrapper, ByteLevel, ByteLevel, ByteLevel>::new()
            .with_model(BPE::default())
            .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
            .with_post_processor(Some(ByteLevel::default()))
            .with_decoder(Some(ByteLevel::default()))
            .build()
            .map_err(|e| e.to_string())?;
    tokenizer
        .train(&mut trainer, documents.iter())
        .map_err(|e| e.to_string())?
        .save(path, false)
        .map_err(|e| e.to_string())?;
    Ok(())
}
