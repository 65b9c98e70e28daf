//! [`MegatronWriter`]: writes Megatron indexed datasets (`stoker tokens`, the benches, tests).

use std::path::{Path, PathBuf};

use super::megatron::{with_extension, HEADER_BYTES, MAGIC};
use super::TokenType;
use crate::error::{Error, Result};

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
    use super::super::cache::CachePlaces;
    use super::super::megatron::{tests::index, MegatronPart};
    use super::super::Part;
    use super::*;

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
        let part = MegatronPart::open(
            &prefix,
            &with_extension(&prefix, ".idx"),
            &with_extension(&prefix, ".bin"),
            &CachePlaces::default(),
        )
        .unwrap();
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
