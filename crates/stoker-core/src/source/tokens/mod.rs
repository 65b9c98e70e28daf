//! Token streams for language-model training: `megatron:PREFIX[,PREFIX…]` (Megatron-LM's
//! indexed datasets, [`megatron`]) and `tokens:PATTERN` (flat token files, `flat`), read in
//! place from read-only mappings, and `parquet:PATTERN` (a text column tokenized in the workers
//! by a Hugging Face `tokenizer.json`, `parquet`, with the cargo feature `parquet`). Remote
//! files (`s3://`, `gs://`, `az://`, `http(s)://`) are downloaded whole into the remote shard cache first (`cache_dir`, bounded by `cache_limit`,
//! [`crate::source::remote`]), then mapped as local files are; a remote flat file's sidecar of
//! lengths is looked for with a HEAD request (a 404 means none) and fetched with it.
//!
//! The files of a source are laid end to end in the order named (a pattern's expansion order)
//! into one stream of tokens. Sample `i` is the window of `seq_len + 1` tokens starting at token
//! `i · seq_len` — windows share one token, none is skipped or overlapped otherwise, as
//! Megatron's `GPTDataset` cuts a stream whose documents are not shuffled — so a source of `T`
//! tokens has `(T - 1) / seq_len` samples. Fields:
//!
//! - `input_ids`: the first `seq_len` tokens (int64, or int32 with `token_output_dtype=int32`);
//! - `labels`: the last `seq_len` (the inputs shifted by one);
//! - with `document_boundaries=reset`, `position_ids` (0 at each document's first token in the
//!   window, counting up) and `cu_seqlens` (int32: `0`, the offset of each document starting
//!   inside the window, `seq_len`; ragged, so padded per batch with `cu_seqlens_lengths`).
//!
//! Documents are Megatron's documents (runs of sequences in the document index), a flat file's
//! documents as its sidecar of lengths lists them (`NAME.lengths.npy`, module `lengths`), or the runs
//! a flat file's `eos_token` ends; a file's end always ends one.
//!
//! With `token_packing=pad` ([`Packing::Pad`]) sample `i` is document `i` instead (the documents
//! of every file, in order, empty ones included): its first `seq_len + 1` tokens (a longer
//! document is truncated, as Megatron-style fine-tuning loaders truncate), padded with
//! `pad_token` to `seq_len + 1`, then cut into `input_ids` and `labels` as above. `loss_mask`
//! (uint8) is 1 exactly where the label is a real next token of the document: at `k` for
//! `k + 1 < min(len, seq_len + 1)`. With `reset`, `cu_seqlens` is `[0, n, seq_len]` where `n`
//! (the document's tokens among the inputs, `min(len, seq_len)`) is strictly inside, else
//! `[0, seq_len]`; the padding is a segment of its own, so `position_ids` count from 0 in the
//! document and again from 0 on the padding: they restart exactly where `cu_seqlens` has an
//! entry, as in the concatenated windows. The sample count is the document count, known from
//! the indexes (and sidecars of lengths) alone; a flat file with `eos_token` would need a scan
//! of every token to count its documents, so `pad` refuses it (without `eos_token` or a sidecar
//! a flat file is one document).
//!
//! Nothing at open is O(tokens) except the check of every token id against `vocab_size`, which
//! runs only when that option is set. A Megatron index is read whole (O(documents)) only the
//! first time a dataset is opened: its tables are then cached on disk (module `cache`: beside the
//! data as `.NAME.idx.stkidx`, or in `~/.cache/stoker/token-index`) and later opens map them.
//! The tables kept are 8 bytes per Megatron sequence (where it starts in the stream), plus 8
//! per sequence only for an index whose sequences do not lie end to end in `.bin` and 8 per
//! document only for one whose documents are not one sequence each; and 8 bytes per file (16
//! under `pad`).

pub mod blend;
mod cache;
mod flat;
mod lengths;
pub mod megatron;
mod pack;
#[cfg(feature = "tokenizers")]
mod parquet;
mod token_type;
pub use pack::FlatPack;
pub use token_type::TokenType;
mod writer;
pub use writer::MegatronWriter;

use std::path::PathBuf;

use super::{FieldSpec, Sample, Source};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::hash::Fnv;
use crate::source::remote::{RemoteConfig, ShardHolder};
use crate::source::shards::expand_shards;

/// What `document_boundaries` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Boundaries {
    /// A plain window: `input_ids` and `labels`.
    #[default]
    Ignore,
    /// Also `position_ids` restarting per document and `cu_seqlens`.
    Reset,
}

/// What `token_packing` asks for: how documents become samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Packing {
    /// Windows of the concatenated stream, `seq_len` apart.
    #[default]
    Concat,
    /// One document a sample, truncated or padded to `seq_len + 1`, with `loss_mask`.
    Pad,
}

impl Packing {
    /// The option's spelling.
    pub const fn name(self) -> &'static str {
        match self {
            Packing::Concat => "concat",
            Packing::Pad => "pad",
        }
    }
}

impl Boundaries {
    /// The option's spelling.
    pub const fn name(self) -> &'static str {
        match self {
            Boundaries::Ignore => "ignore",
            Boundaries::Reset => "reset",
        }
    }
}

/// The option keys [`TokenConfig::sample_settings`] names, in its order.
pub const SAMPLE_SETTINGS: [&str; 6] = [
    "document_boundaries",
    "token_output_dtype",
    "token_dtype",
    "eos_token",
    "vocab_size",
    "pad_token",
];

/// How a token source cuts and delivers samples (the options `seq_len`, `document_boundaries`,
/// `token_output_dtype`, `token_dtype`, `eos_token`, `vocab_size`, `token_packing`,
/// `pad_token`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenConfig {
    /// Tokens per sample, the extra one for `labels` not counted.
    pub seq_len: usize,
    /// Whether documents restart positions.
    pub boundaries: Boundaries,
    /// `input_ids`, `labels` and `position_ids` are int64 or int32.
    pub output: DType,
    /// The type of raw flat files.
    pub raw: Option<TokenType>,
    /// The token ending a document in flat files.
    pub eos: Option<u64>,
    /// Every token id must be below it (checked at open, O(tokens); for a tokenizer, its
    /// vocabulary size).
    pub vocab_size: Option<u64>,
    /// The `tokenizer.json` of a `parquet:` source.
    pub tokenizer: Option<PathBuf>,
    /// The text column of a `parquet:` source.
    pub text_column: String,
    /// Windows of the stream, or one padded document a sample.
    pub packing: Packing,
    /// The token padding a short document under [`Packing::Pad`].
    pub pad_token: i64,
}

impl TokenConfig {
    /// The settings besides `seq_len`, `token_packing` and the files that change a sample's
    /// tokens, by option key ([`SAMPLE_SETTINGS`]), in the option's spelling (`none` when
    /// unset); `pad_token` only under [`Packing::Pad`]. A resume names each that differs.
    pub fn sample_settings(&self) -> Vec<(&'static str, String)> {
        let or_none = |v: Option<u64>| v.map_or("none".to_owned(), |v| v.to_string());
        let mut out = vec![
            (SAMPLE_SETTINGS[0], self.boundaries.name().to_owned()),
            (SAMPLE_SETTINGS[1], self.output.name().to_owned()),
            (
                SAMPLE_SETTINGS[2],
                self.raw.map_or("none".to_owned(), |t| t.name().to_owned()),
            ),
            (SAMPLE_SETTINGS[3], or_none(self.eos)),
            (SAMPLE_SETTINGS[4], or_none(self.vocab_size)),
        ];
        if self.packing == Packing::Pad {
            out.push((SAMPLE_SETTINGS[5], self.pad_token.to_string()));
        }
        out
    }

    /// A hash of [`TokenConfig::sample_settings`]' values, as resume states have held it
    /// since before the settings were written out (so those states still resume): under
    /// `concat` as before `token_packing` existed.
    pub fn settings_hash(&self) -> u64 {
        let common = (
            self.boundaries,
            self.output,
            self.raw,
            self.eos,
            self.vocab_size,
        );
        match self.packing {
            Packing::Concat => Fnv::of_debug(&common),
            Packing::Pad => Fnv::of_debug(&(
                common.0,
                common.1,
                common.2,
                common.3,
                common.4,
                self.pad_token,
            )),
        }
    }
}

/// Which files hold the tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenSpec {
    /// `megatron:PREFIX[,PREFIX…]` (brace ranges allowed).
    Megatron(String),
    /// `tokens:PATTERN`: flat `.bin` or `.npy` files.
    Flat(String),
    /// `parquet:PATTERN`: Parquet files of text, tokenized with `tokenizer`.
    Parquet(String),
}

impl std::fmt::Display for TokenSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSpec::Megatron(p) => write!(f, "megatron:{p}"),
            TokenSpec::Flat(p) => write!(f, "tokens:{p}"),
            TokenSpec::Parquet(p) => write!(f, "parquet:{p}"),
        }
    }
}

/// One file (or Megatron prefix) of a token stream.
pub(crate) trait Part: Send + Sync {
    /// Tokens it holds.
    fn tokens(&self) -> u64;
    /// Their stored type.
    fn token_type(&self) -> TokenType;
    /// Hands over the stored bytes of tokens `from..to` (`to <= tokens()`), in order, as
    /// contiguous runs.
    fn raw(&self, from: u64, to: u64, each: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()>;
    /// Calls `each`, rising, with the first token of every document that starts strictly
    /// between `from` and `to`.
    fn doc_starts(&self, from: u64, to: u64, each: &mut dyn FnMut(u64));
    /// Its documents, if they can be counted without reading the tokens (`Err` says why not).
    fn documents(&self) -> std::result::Result<u64, String>;
    /// Tokens `[start, end)` of document `d` (`d < documents()`).
    fn document(&self, d: u64) -> (u64, u64);
    /// Calls `each` with every document's tokens `[start, end)`, in order: from the index, or
    /// where only the tokens say where documents end, by reading them all (`stoker pack` reads
    /// every token anyway).
    fn each_document(&self, each: &mut dyn FnMut(u64, u64)) -> std::result::Result<(), String> {
        each_indexed_document(self, each)
    }
    /// Where token `t` is in its file, for messages that name the file already
    /// (`token 12`, `sequence 3`).
    fn place(&self, t: u64) -> String;
    /// Where token `t` is, file included, for messages.
    fn describe(&self, t: u64) -> String {
        format!("{} {}", self.path().display(), self.place(t))
    }
    /// What it is, wherever it is mounted (name, counts, type).
    fn identity(&self) -> String;
    /// The file errors about its tokens name.
    fn path(&self) -> PathBuf;
    /// `Err` if a mapping was truncated while in use.
    fn check(&self) -> Result<()>;
    /// Bytes of the per-sequence and per-document tables it keeps (in memory or mapped).
    fn index_bytes(&self) -> usize {
        0
    }
    /// Every token id it can hold is below this.
    fn id_bound(&self) -> u64 {
        match self.token_type() {
            TokenType::U8 => 1 << 8,
            TokenType::I8 => 1 << 7,
            TokenType::U16 => 1 << 16,
            TokenType::I16 => 1 << 15,
            TokenType::I32 | TokenType::U32 | TokenType::I64 => u64::MAX,
        }
    }
    /// `Err` naming the file and the token's place unless every token is in `0..vocab`.
    fn check_vocab(&self, vocab: u64) -> Result<()> {
        check_vocab(self, vocab)
    }
}

/// [`Part::each_document`] from the part's index of documents.
fn each_indexed_document<P: Part + ?Sized>(
    part: &P,
    each: &mut dyn FnMut(u64, u64),
) -> std::result::Result<(), String> {
    for d in 0..part.documents()? {
        let (start, end) = part.document(d);
        each(start, end);
    }
    Ok(())
}

/// A token source: the stream of its files' tokens cut into windows (see the module docs).
pub struct TokenSource {
    spec: TokenSpec,
    config: TokenConfig,
    parts: Vec<Box<dyn Part>>,
    /// Where each part starts in the stream; one more entry, the total.
    starts: Vec<u64>,
    /// Under [`Packing::Pad`], the documents before each part; one more entry, the total.
    /// Empty otherwise.
    doc_starts: Vec<u64>,
    fields: Vec<FieldSpec>,
    len: usize,
    /// Keeps remote files in the cache while the source maps them.
    _holders: Vec<ShardHolder>,
}

/// The files `names` (paths, `file://` or remote URLs) as local files: remote ones downloaded
/// whole into the remote cache (`cache_dir`, bounded by `cache_limit`), as tar shards are, then
/// mapped like local files. Each with the name messages show (a URL without credentials); the
/// holder keeps the cached copies in place while the source lives.
fn resolve_files(
    names: Vec<String>,
    remote: &RemoteConfig,
) -> Result<(Vec<PathBuf>, Vec<String>, ShardHolder)> {
    let resolved = crate::source::remote::resolve(names, remote, false)?;
    Ok((resolved.paths, resolved.names, resolved.holder))
}

impl TokenSource {
    /// Opens and checks every file `spec` names; errors name the file and what disagrees.
    /// Remote files are fetched into a private cache removed when the source closes.
    pub fn open(spec: &TokenSpec, config: &TokenConfig) -> Result<TokenSource> {
        Self::open_with(spec, config, &RemoteConfig::default())
    }

    /// [`open`](Self::open), remote files (`s3://`, `gs://`, `az://`, `http(s)://`) downloaded
    /// whole into the cache `remote` says (`cache_dir`, `cache_limit`, `shard_prefetch`).
    pub fn open_with(
        spec: &TokenSpec,
        config: &TokenConfig,
        remote: &RemoteConfig,
    ) -> Result<TokenSource> {
        if config.seq_len == 0 {
            return Err(Error::option("seq_len", "must be at least 1"));
        }
        if !matches!(config.output, DType::I64 | DType::I32) {
            return Err(Error::option(
                "token_output_dtype",
                format!(
                    "tokens are delivered as int64 or int32, not {}",
                    config.output
                ),
            ));
        }
        let mut holders = Vec::new();
        let parts: Vec<Box<dyn Part>> = match spec {
            // `token_dtype` and `eos_token` are for flat files: a Megatron index says the type
            // and the documents itself.
            TokenSpec::Megatron(prefixes) => {
                let prefixes = expand_shards(prefixes)?;
                let names = prefixes
                    .iter()
                    .flat_map(|p| [format!("{p}.idx"), format!("{p}.bin")])
                    .collect();
                let (paths, shown, holder) = resolve_files(names, remote)?;
                holders.push(holder);
                let places = cache::CachePlaces::default();
                let datasets: Vec<(PathBuf, &[PathBuf])> = shown
                    .chunks_exact(2)
                    .zip(paths.chunks_exact(2))
                    .map(|(names, files)| {
                        let prefix = names[0].strip_suffix(".idx").unwrap_or(&names[0]);
                        (PathBuf::from(prefix), files)
                    })
                    .collect();
                crate::fork::parallel(|| {
                    use rayon::prelude::*;
                    datasets
                        .par_iter()
                        .map(|(prefix, files)| {
                            megatron::MegatronPart::open(prefix, &files[0], &files[1], &places)
                                .map(|m| Box::new(m) as Box<dyn Part>)
                        })
                        .collect::<Result<Vec<_>>>()
                })??
            }
            TokenSpec::Flat(pattern) => {
                // Sidecars of document lengths are read with their token files, never as one.
                let named = expand_shards(pattern)?;
                let names: Vec<String> = named
                    .iter()
                    .filter(|n| !lengths::is_sidecar(n))
                    .cloned()
                    .collect();
                if names.is_empty() {
                    return Err(Error::InvalidArgument(format!(
                        "{spec} names only sidecars of document lengths ({}), no token file",
                        named.first().map_or("", String::as_str)
                    )));
                }
                // Each file's sidecar of lengths is looked for beside it, a remote one with a
                // HEAD request (a 404 means none), and fetched with the files when found.
                let sidecars: Vec<Option<String>> =
                    names.iter().map(|n| lengths::sidecar_name(n)).collect();
                let asked: Vec<String> = sidecars.iter().flatten().cloned().collect();
                let mut found = crate::source::remote::exist(&asked, remote)?.into_iter();
                let sidecars: Vec<Option<String>> = sidecars
                    .into_iter()
                    .map(|s| s.filter(|_| found.next().unwrap_or(false)))
                    .collect();
                let count = names.len();
                let mut all = names;
                all.extend(sidecars.iter().flatten().cloned());
                let (paths, shown, holder) = resolve_files(all, remote)?;
                holders.push(holder);
                let shown: Vec<PathBuf> = shown
                    .iter()
                    .map(|n| PathBuf::from(n.strip_prefix("file://").unwrap_or(n)))
                    .collect();
                let mut sidecar_at = count;
                let files: Vec<flat::FlatFile<'_>> = (0..count)
                    .map(|k| flat::FlatFile {
                        path: &paths[k],
                        shown: &shown[k],
                        sidecar: sidecars[k].as_ref().map(|_| {
                            sidecar_at += 1;
                            (&*paths[sidecar_at - 1], &*shown[sidecar_at - 1])
                        }),
                    })
                    .collect();
                let places = cache::CachePlaces::default();
                crate::fork::parallel(|| {
                    use rayon::prelude::*;
                    files
                        .par_iter()
                        .map(|source| {
                            flat::FlatPart::open(source, config.raw, config.eos, &places)
                                .map(|f| Box::new(f) as Box<dyn Part>)
                        })
                        .collect::<Result<Vec<_>>>()
                })??
            }
            TokenSpec::Parquet(pattern) => {
                let names = expand_shards(pattern)?;
                let (paths, shown, holder) = resolve_files(names, remote)?;
                holders.push(holder);
                open_parquet(&paths, &shown, config)?
            }
        };
        let mut starts = Vec::with_capacity(parts.len() + 1);
        let mut total = 0u64;
        starts.push(0);
        for part in &parts {
            total = total
                .checked_add(part.tokens())
                .ok_or_else(|| Error::Internal("token count overflows u64".into()))?;
            starts.push(total);
        }
        if let Some(vocab) = config.vocab_size {
            crate::fork::parallel(|| {
                use rayon::prelude::*;
                parts.par_iter().try_for_each(|p| p.check_vocab(vocab))
            })??;
        }
        let mut doc_starts = Vec::new();
        let samples = match config.packing {
            Packing::Concat => total.saturating_sub(1) / config.seq_len as u64,
            Packing::Pad => {
                if config.output == DType::I32 && i32::try_from(config.pad_token).is_err() {
                    return Err(Error::option(
                        "pad_token",
                        format!("{} does not fit token_output_dtype=int32", config.pad_token),
                    ));
                }
                if let Some(vocab) = config.vocab_size {
                    if !(0..i128::from(vocab)).contains(&i128::from(config.pad_token)) {
                        return Err(Error::option(
                            "pad_token",
                            format!(
                                "{} is outside vocab_size {vocab}: the padding is fed to the \
                                 embedding as the tokens are (ids must be in 0..{vocab})",
                                config.pad_token
                            ),
                        ));
                    }
                }
                // The document count of every part comes from its index (or is 1 for a flat
                // file without `eos_token`): nothing here reads the tokens. Counting the
                // documents of a flat file with `eos_token` would scan every token at open, so
                // such a file is refused, naming what to do instead.
                doc_starts.reserve_exact(parts.len() + 1);
                doc_starts.push(0u64);
                let mut docs = 0u64;
                for part in &parts {
                    let n = part.documents().map_err(|why| {
                        Error::option(
                            "token_packing",
                            format!("pad: {}: {why}", part.path().display()),
                        )
                    })?;
                    docs = docs
                        .checked_add(n)
                        .ok_or_else(|| Error::Internal("document count overflows u64".into()))?;
                    doc_starts.push(docs);
                }
                docs
            }
        };
        let len = usize::try_from(samples)
            .map_err(|_| Error::Internal(format!("{samples} samples overflow usize")))?;
        let seq = config.seq_len;
        let mut fields = vec![
            FieldSpec::tensor("input_ids", config.output, &[seq]),
            FieldSpec::tensor("labels", config.output, &[seq]),
        ];
        if config.boundaries == Boundaries::Reset {
            fields.push(FieldSpec::tensor("position_ids", config.output, &[seq]));
            fields.push(FieldSpec::ragged("cu_seqlens", DType::I32, &[]));
        }
        if config.packing == Packing::Pad {
            fields.push(FieldSpec::tensor("loss_mask", DType::U8, &[seq]));
        }
        Ok(TokenSource {
            spec: spec.clone(),
            config: config.clone(),
            parts,
            starts,
            doc_starts,
            fields,
            len,
            _holders: holders,
        })
    }

    /// Under [`Packing::Pad`]: the part holding document `i` and the document's tokens
    /// `[start, end)` in the stream (`i < len`).
    fn document(&self, i: u64) -> (usize, u64, u64) {
        let p = self.doc_starts.partition_point(|&s| s <= i) - 1;
        let (start, end) = self.parts[p].document(i - self.doc_starts[p]);
        (p, self.starts[p] + start, self.starts[p] + end)
    }

    /// Tokens in the stream.
    pub fn total_tokens(&self) -> u64 {
        self.starts[self.starts.len() - 1]
    }

    /// Bytes of the index tables the source keeps, in memory or mapped from the cache: its
    /// files' tables and its own per-file tables.
    pub fn index_bytes(&self) -> usize {
        let own = 8 * (self.starts.len() + self.doc_starts.len());
        self.parts.iter().map(|p| p.index_bytes()).sum::<usize>() + own
    }

    /// The spec it was opened from.
    pub fn spec(&self) -> &TokenSpec {
        &self.spec
    }

    /// The part holding stream token `t` (`t < total`).
    fn part_of(&self, t: u64) -> usize {
        self.starts.partition_point(|&s| s <= t) - 1
    }

    /// Appends tokens `from..to` of the stream to `out` in the output type.
    fn window(&self, from: u64, to: u64, out: &mut Vec<u8>) -> Result<()> {
        let wide = self.config.output == DType::I64;
        let mut p = self.part_of(from);
        let mut t = from;
        while t < to {
            let (start, end) = (self.starts[p], self.starts[p + 1]);
            let stop = end.min(to);
            if stop > t {
                let part = &self.parts[p];
                let ty = part.token_type();
                part.raw(t - start, stop - start, &mut |bytes| {
                    for chunk in bytes.chunks_exact(ty.size()) {
                        let v = ty.get(chunk);
                        if wide {
                            out.extend_from_slice(&v.to_ne_bytes());
                        } else {
                            let v = i32::try_from(v).map_err(|_| {
                                Error::format(
                                    part.path(),
                                    format!("token id {v} does not fit token_output_dtype=int32"),
                                )
                            })?;
                            out.extend_from_slice(&v.to_ne_bytes());
                        }
                    }
                    Ok(())
                })?;
                t = stop;
            }
            p += 1;
        }
        Ok(())
    }

    /// Calls `each`, rising and without repeats, with every stream token strictly between
    /// `from` and `to` that starts a document (a part's first token starts one).
    fn boundaries(&self, from: u64, to: u64, each: &mut dyn FnMut(u64)) {
        let mut last = from;
        let mut emit = |t: u64| {
            if t > last && t < to {
                last = t;
                each(t);
            }
        };
        let mut p = self.part_of(from);
        while p < self.parts.len() && self.starts[p] < to {
            let (start, end) = (self.starts[p], self.starts[p + 1]);
            emit(start);
            let (a, b) = (from.max(start), to.min(end));
            if b > a {
                self.parts[p].doc_starts(a - start, b - start, &mut |t| emit(t + start));
            }
            p += 1;
        }
    }
}

impl TokenSource {
    /// Sample `index` under [`Packing::Pad`] (`index < len`): document `index`, truncated or
    /// padded to `seq_len + 1` tokens (see the module docs).
    fn read_padded<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let seq = self.config.seq_len;
        let size = self.config.output.size();
        let (_, start, end) = self.document(index as u64);
        // At most `seq_len + 1` tokens are read, whatever the document's length: the buffer is
        // bounded by `seq_len`, which the options bound.
        let real = (end - start).min(seq as u64 + 1) as usize;
        scratch.clear();
        self.window(start, start + real as u64, scratch)?;
        let pad = self.config.pad_token;
        // `open` checked that the pad token fits int32 when that is the output type.
        let pad_bytes = pad.to_ne_bytes();
        let pad_narrow = (pad as i32).to_ne_bytes();
        let pad: &[u8] = if size == 8 { &pad_bytes } else { &pad_narrow };
        for _ in real..=seq {
            scratch.extend_from_slice(pad);
        }
        // The label at `k` is token `k + 1`: a real next token while `k + 1 < real`.
        let mask_at = scratch.len();
        let targets = real.saturating_sub(1);
        scratch.resize(mask_at + seq, 0);
        scratch[mask_at..mask_at + targets].fill(1);
        let mut extra = None;
        if self.config.boundaries == Boundaries::Reset {
            // The document's inputs, then the padding as a segment of its own: positions
            // restart exactly at the entries of `cu_seqlens`, as in concatenated windows.
            let inputs = real.min(seq);
            let cu_at = scratch.len();
            scratch.extend_from_slice(&0i32.to_ne_bytes());
            if inputs > 0 && inputs < seq {
                scratch.extend_from_slice(&(inputs as i32).to_ne_bytes());
            }
            scratch.extend_from_slice(&(seq as i32).to_ne_bytes());
            let pos_at = scratch.len();
            for k in 0..seq {
                let pos = if k < inputs { k } else { k - inputs } as i64;
                if size == 8 {
                    scratch.extend_from_slice(&pos.to_ne_bytes());
                } else {
                    scratch.extend_from_slice(&(pos as i32).to_ne_bytes());
                }
            }
            extra = Some((cu_at, pos_at));
        }
        let buf: &'a [u8] = scratch;
        let mut sample = Sample::default();
        sample.set(0, &buf[..seq * size]);
        sample.set(1, &buf[size..(seq + 1) * size]);
        let mask = &buf[mask_at..mask_at + seq];
        match extra {
            Some((cu_at, pos_at)) => {
                sample.set(2, &buf[pos_at..]);
                sample.set(3, &buf[cu_at..pos_at]);
                sample.set(4, mask);
            }
            None => sample.set(2, mask),
        }
        Ok(sample)
    }
}

/// The parts of a `parquet:` source: `paths` (shown as `shown`) tokenized with `tokenizer`.
#[cfg(feature = "tokenizers")]
fn open_parquet(
    paths: &[PathBuf],
    shown: &[String],
    config: &TokenConfig,
) -> Result<Vec<Box<dyn Part>>> {
    let tokenizer = config.tokenizer.as_deref().ok_or_else(|| {
        Error::option(
            "tokenizer",
            "required for a parquet: source: the path of a Hugging Face tokenizer.json that \
             turns its text into tokens",
        )
    })?;
    let tokenizer = std::sync::Arc::new(parquet::TextTokenizer::load(
        tokenizer,
        config.eos,
        config.vocab_size,
    )?);
    let places = cache::CachePlaces::default();
    // One file after the other: the files' row groups are counted in parallel.
    paths
        .iter()
        .zip(shown)
        .map(|(path, name)| {
            let shown = std::path::Path::new(name.strip_prefix("file://").unwrap_or(name));
            parquet::ParquetPart::open(path, shown, &config.text_column, &tokenizer, &places)
                .map(|p| Box::new(p) as Box<dyn Part>)
        })
        .collect()
}

/// Without the cargo feature `tokenizers`, a `parquet:` token source is refused.
#[cfg(not(feature = "tokenizers"))]
fn open_parquet(
    _paths: &[PathBuf],
    _shown: &[String],
    _config: &TokenConfig,
) -> Result<Vec<Box<dyn Part>>> {
    Err(Error::Unsupported(
        "parquet: token sources need stoker built with its `tokenizers` feature (on by default)"
            .into(),
    ))
}

/// `Err` naming the file and the token's place unless every token of `part` is in
/// `0..vocab`.
fn check_vocab(part: &(impl Part + ?Sized), vocab: u64) -> Result<()> {
    let ty = part.token_type();
    let mut at = 0u64;
    part.raw(0, part.tokens(), &mut |bytes| {
        for chunk in bytes.chunks_exact(ty.size()) {
            let v = ty.get(chunk);
            if v < 0 || v as u64 >= vocab {
                return Err(Error::format(
                    part.path(),
                    format!(
                        "token {v} at {} is outside vocab_size {vocab} (ids must be in 0..{vocab})",
                        part.place(at)
                    ),
                ));
            }
            at += 1;
        }
        Ok(())
    })
}

impl Source for TokenSource {
    fn len(&self) -> usize {
        self.len
    }

    fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }

    fn describe(&self, index: usize) -> String {
        if self.config.packing == Packing::Pad {
            if index >= self.len {
                return format!("{} document {index} (past the end)", self.spec);
            }
            let (p, start, _) = self.document(index as u64);
            return format!(
                "{} document {index} (from {})",
                self.spec,
                self.parts[p].describe(start - self.starts[p])
            );
        }
        let first = index as u64 * self.config.seq_len as u64;
        if first >= self.total_tokens() {
            return format!("{} sample {index} (past the end)", self.spec);
        }
        let p = self.part_of(first);
        format!(
            "{} sample {index} (from {})",
            self.spec,
            self.parts[p].describe(first - self.starts[p])
        )
    }

    fn identity(&self) -> String {
        let parts: Vec<String> = self.parts.iter().map(|p| p.identity()).collect();
        format!("{} samples of {}", self.len, parts.join("; "))
    }

    fn read<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        if index >= self.len {
            return Err(Error::InvalidArgument(format!(
                "sample {index} is out of range for {} samples of {}",
                self.len, self.spec
            )));
        }
        if self.config.packing == Packing::Pad {
            return self.read_padded(index, scratch);
        }
        let seq = self.config.seq_len;
        let size = self.config.output.size();
        let first = index as u64 * seq as u64;
        scratch.clear();
        self.window(first, first + seq as u64 + 1, scratch)?;
        let mut extra = None;
        if self.config.boundaries == Boundaries::Reset {
            // cu_seqlens: 0, each document start inside the window, seq_len.
            let cu_at = scratch.len();
            scratch.extend_from_slice(&0i32.to_ne_bytes());
            self.boundaries(first, first + seq as u64, &mut |t| {
                scratch.extend_from_slice(&((t - first) as i32).to_ne_bytes())
            });
            scratch.extend_from_slice(&(seq as i32).to_ne_bytes());
            let pos_at = scratch.len();
            scratch.resize(pos_at + seq * size, 0);
            let (head, positions) = scratch.split_at_mut(pos_at);
            let bounds = head[cu_at..]
                .chunks_exact(4)
                .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as usize);
            let mut doc_start = 0usize;
            let mut next = bounds.skip(1);
            let mut doc_end = next.next().unwrap_or(seq);
            for (k, slot) in positions.chunks_exact_mut(size).enumerate() {
                while k >= doc_end {
                    doc_start = doc_end;
                    doc_end = next.next().unwrap_or(seq);
                }
                let pos = (k - doc_start) as i64;
                if size == 8 {
                    slot.copy_from_slice(&pos.to_ne_bytes());
                } else {
                    slot.copy_from_slice(&(pos as i32).to_ne_bytes());
                }
            }
            extra = Some((cu_at, pos_at));
        }
        let buf: &'a [u8] = scratch;
        let mut sample = Sample::default();
        sample.set(0, &buf[..seq * size]);
        sample.set(1, &buf[size..(seq + 1) * size]);
        if let Some((cu_at, pos_at)) = extra {
            sample.set(2, &buf[pos_at..]);
            sample.set(3, &buf[cu_at..pos_at]);
        }
        Ok(sample)
    }

    fn verify(&self) -> Result<()> {
        if crate::source::mapped::any_truncated() {
            for part in &self.parts {
                part.check()?;
            }
        }
        Ok(())
    }
}
