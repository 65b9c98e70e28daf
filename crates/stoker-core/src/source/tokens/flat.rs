//! `tokens:PATTERN`: flat token files, as nanoGPT and OLMo write them: the tokens of every
//! document one after the other, raw (`.bin`, of the type `token_dtype` says) or a 1-D `.npy`
//! array (`uint16`, `uint32` or `int32`, read from its header). Each file is mapped and read in
//! place. Documents end with `eos_token` when it is set (the token belongs to the document it
//! ends), or are listed by a sidecar of document lengths beside the file (`NAME.lengths.npy`,
//! [`super::lengths`]), not both; a file's end always ends a document.

use std::path::{Path, PathBuf};

use super::cache::{CachePlaces, Table};
use super::{lengths, Part, TokenType};
use crate::error::{Error, Result};
use crate::source::mapped::Mapping;
use crate::source::npy::parse_raw_header;
use crate::source::open_file;

/// A flat token file to open.
pub(super) struct FlatFile<'a> {
    /// Where it is (for a remote file, its copy in the cache).
    pub path: &'a Path,
    /// What messages name (a remote file's URL).
    pub shown: &'a Path,
    /// Its sidecar of document lengths, when it has one: where it is (a remote one's copy in
    /// the cache) and what messages name.
    pub sidecar: Option<(&'a Path, &'a Path)>,
}

/// One flat token file, mapped and checked.
pub(super) struct FlatPart {
    path: PathBuf,
    map: Mapping,
    token: TokenType,
    /// Where the tokens start (after an `.npy` header).
    offset: usize,
    tokens: u64,
    eos: Option<u64>,
    /// Where each document starts (documents + 1 entries, the last `tokens`), from the sidecar
    /// of document lengths when the file has one.
    docs: Option<Table>,
}

impl FlatPart {
    /// Maps `path`: an `.npy` file's type and length come from its header, a raw file's type is
    /// `raw` (`token_dtype`), required. Its documents come from its sidecar of lengths when it
    /// has one (cached in `places`), else from `eos`.
    pub(super) fn open(
        source: &FlatFile<'_>,
        raw: Option<TokenType>,
        eos: Option<u64>,
        places: &CachePlaces,
    ) -> Result<FlatPart> {
        let (file, meta) = open_file(source.path, "a token file")?;
        let path = source.shown;
        let map = Mapping::map(&file, source.path)?;
        let is_npy = path.extension().is_some_and(|e| e == "npy");
        let (token, offset, tokens) = if is_npy {
            let header = parse_raw_header(&map).map_err(|reason| Error::format(path, reason))?;
            let token = match header.descr.as_str() {
                "<u2" => TokenType::U16,
                "<u4" => TokenType::U32,
                "<i4" => TokenType::I32,
                other => {
                    return Err(Error::format(
                        path,
                        format!("holds '{other}'; token arrays must be <u2, <u4 or <i4 (uint16, uint32, int32)"),
                    ))
                }
            };
            let [n] = header.shape[..] else {
                return Err(Error::format(
                    path,
                    format!("has shape {:?}; a token array is 1-D", header.shape),
                ));
            };
            let need = (n as u128) * token.size() as u128 + header.data_offset as u128;
            if need != map.len() as u128 {
                return Err(Error::format(
                    path,
                    format!(
                        "says {n} tokens of {} after a {}-byte header ({need} bytes), but the file has {} ({})",
                        token.name(),
                        header.data_offset,
                        map.len(),
                        if (map.len() as u128) < need { "truncated" } else { "trailing bytes" }
                    ),
                ));
            }
            (token, header.data_offset, n as u64)
        } else {
            let token = raw.ok_or_else(|| {
                Error::option(
                    "token_dtype",
                    format!(
                        "{} is a raw token file: say its element type (uint16, uint32 or int32)",
                        path.display()
                    ),
                )
            })?;
            if !map.len().is_multiple_of(token.size()) {
                return Err(Error::format(
                    path,
                    format!(
                        "has {} bytes, not a whole number of {}-byte {} tokens (truncated?)",
                        map.len(),
                        token.size(),
                        token.name()
                    ),
                ));
            }
            (token, 0, (map.len() / token.size()) as u64)
        };
        let docs = if let Some((sidecar, shown)) = source.sidecar {
            if let Some(eos) = eos {
                return Err(Error::option(
                    "eos_token",
                    format!(
                        "{eos} ends documents, but {} has a sidecar of document lengths, {}: \
                         documents are said one way; unset eos_token or remove the sidecar",
                        path.display(),
                        shown.display()
                    ),
                ));
            }
            Some(lengths::document_starts(
                sidecar,
                shown,
                path,
                &meta,
                &map[..offset],
                tokens,
                places,
            )?)
        } else {
            None
        };
        let part = FlatPart {
            path: path.to_owned(),
            map,
            token,
            offset,
            tokens,
            eos,
            docs,
        };
        if let Some(eos) = eos.filter(|&eos| eos >= part.id_bound()) {
            return Err(Error::option(
                "eos_token",
                format!(
                    "{eos} cannot occur in {}, whose tokens are {} (below {}): no document \
                     would end",
                    path.display(),
                    token.name(),
                    part.id_bound()
                ),
            ));
        }
        Ok(part)
    }

    fn bytes(&self, from: u64, to: u64) -> &[u8] {
        let size = self.token.size();
        &self.map[self.offset + from as usize * size..self.offset + to as usize * size]
    }
}

impl Part for FlatPart {
    fn tokens(&self) -> u64 {
        self.tokens
    }

    fn token_type(&self) -> TokenType {
        self.token
    }

    fn raw(&self, from: u64, to: u64, each: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        each(self.bytes(from, to))
    }

    fn doc_starts(&self, from: u64, to: u64, each: &mut dyn FnMut(u64)) {
        if let Some(docs) = &self.docs {
            let docs = docs.as_slice();
            // The first document starting after `from`; the last entry is the file's end.
            let first = docs.partition_point(|&s| s <= from);
            let inner = docs.get(first..docs.len().saturating_sub(1)).unwrap_or(&[]);
            for &start in inner {
                if start >= to {
                    break;
                }
                each(start);
            }
            return;
        }
        let Some(eos) = self.eos else { return };
        // A document starts after each end-of-document token; the one at `to - 1` starts one
        // at `to`, outside the range.
        let size = self.token.size();
        let end = to.saturating_sub(1);
        if end <= from {
            return;
        }
        for (k, chunk) in self.bytes(from, end).chunks_exact(size).enumerate() {
            if self.token.get(chunk) == eos as i64 {
                each(from + k as u64 + 1);
            }
        }
    }

    fn documents(&self) -> std::result::Result<u64, String> {
        if let Some(docs) = &self.docs {
            return Ok(docs.len() as u64 - 1);
        }
        // The documents `eos_token` ends are known only by reading every token, which opening
        // never does (it would be O(tokens) at every start); without it the file is one.
        match self.eos {
            None => Ok(1),
            Some(eos) => Err(format!(
                "a flat token file's documents (ended by eos_token {eos}) are found only by \
                 reading all its tokens, which opening does not do; write their lengths beside \
                 it as a sidecar ({}, a 1-D integer .npy) in place of eos_token, or the \
                 documents as a Megatron dataset (megatron:PREFIX), or use token_packing=concat",
                lengths::sidecar_of(&self.path).display()
            )),
        }
    }

    fn each_document(&self, each: &mut dyn FnMut(u64, u64)) -> std::result::Result<(), String> {
        if self.docs.is_some() || self.eos.is_none() {
            return super::each_indexed_document(self, each);
        }
        // The documents eos_token ends: each from the token after the last end.
        let mut start = 0;
        self.doc_starts(0, self.tokens, &mut |next| {
            each(start, next);
            start = next;
        });
        each(start, self.tokens);
        Ok(())
    }

    fn document(&self, d: u64) -> (u64, u64) {
        match &self.docs {
            Some(docs) => {
                let docs = docs.as_slice();
                let at = |d: u64| {
                    usize::try_from(d)
                        .ok()
                        .and_then(|d| docs.get(d))
                        .map_or(self.tokens, |&t| t.min(self.tokens))
                };
                let start = at(d);
                (start, at(d + 1).max(start))
            }
            None => (0, self.tokens),
        }
    }

    fn place(&self, t: u64) -> String {
        format!("token {t}")
    }

    fn identity(&self) -> String {
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        format!("tokens {name}: {} of {}", self.tokens, self.token.name())
    }

    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn check(&self) -> Result<()> {
        if let Some(Table::Mapped { map, .. }) = &self.docs {
            map.check()?;
        }
        self.map.check()
    }

    fn index_bytes(&self) -> usize {
        self.docs.as_ref().map_or(0, |d| 8 * d.len())
    }
}
