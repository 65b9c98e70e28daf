//! A token source written as one flat token file with its sidecar of document lengths
//! (`stoker pack SRC OUT.npy`): `OUT.npy` holds every document's tokens in the source's order
//! (uint16 when every id the source can hold fits, else int32) and `OUT.lengths.npy` their
//! lengths (int64), so `tokens:OUT.npy` reads the same stream, documents included. For a
//! `parquet:` source this is its tokenization done once, on every core, instead of in the
//! workers of every epoch.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{lengths, TokenSource};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::source::npy::npy_header;

/// Tokens one thread converts at a time (the documents of a chunk are whole, so a longer
/// document is a chunk alone).
const CHUNK_TOKENS: u64 = 1 << 20;

/// What [`TokenSource::write_flat`] wrote.
#[derive(Debug)]
pub struct FlatPack {
    /// The token file.
    pub path: PathBuf,
    /// Its sidecar of document lengths.
    pub sidecar: PathBuf,
    /// The element type of the token file (uint16 or int32).
    pub dtype: DType,
    /// Tokens written.
    pub tokens: u64,
    /// Documents written.
    pub documents: u64,
}

impl TokenSource {
    /// Writes every document of the source, in order, to `out` (a `.npy` path) and its lengths
    /// to the sidecar beside it; `progress` is told the tokens written so far. Both files are
    /// written under temporary names and renamed when whole.
    pub fn write_flat(&self, out: &Path, progress: &mut dyn FnMut(u64)) -> Result<FlatPack> {
        self.write_flat_first(out, u64::MAX, progress)
    }

    /// [`TokenSource::write_flat`] of the source's first documents only: as many whole
    /// documents as it takes to hold `tokens` tokens (the last may go past it). `stoker doctor`
    /// measures reading a text source tokenized once on such a file.
    pub fn write_flat_first(
        &self,
        out: &Path,
        tokens: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FlatPack> {
        if out.extension().is_none_or(|e| e != "npy") {
            return Err(Error::InvalidArgument(format!(
                "{}: a token file is written as .npy (its header says the type)",
                out.display()
            )));
        }
        let dtype = if self.parts.iter().all(|p| p.id_bound() <= 1 << 16) {
            DType::U16
        } else {
            DType::I32
        };
        // Each part's documents, as ranges of its tokens: from the indexes, or read from a flat
        // file's tokens where eos_token ends them.
        let mut documents = Vec::new();
        for (p, part) in self.parts.iter().enumerate() {
            part.each_document(&mut |start, end| documents.push((p, (start, end))))
                .map_err(|why| {
                    Error::InvalidArgument(format!("{}: {why}", part.path().display()))
                })?;
        }
        let mut held = 0u64;
        if let Some(enough) = documents.iter().position(|(_, (a, b))| {
            held += b - a;
            held >= tokens
        }) {
            documents.truncate(enough + 1);
        }
        let lengths: Vec<u8> = documents
            .iter()
            .flat_map(|(_, (a, b))| ((b - a) as i64).to_le_bytes())
            .collect();
        let total = documents.iter().map(|(_, (a, b))| b - a).sum::<u64>();
        // Chunks of whole documents, about CHUNK_TOKENS each.
        let mut chunks: Vec<&[(usize, (u64, u64))]> = Vec::new();
        let (mut first, mut tokens) = (0, 0);
        for (k, (_, (a, b))) in documents.iter().enumerate() {
            tokens += b - a;
            if tokens >= CHUNK_TOKENS || k + 1 == documents.len() {
                chunks.push(&documents[first..=k]);
                (first, tokens) = (k + 1, 0);
            }
        }
        let sidecar = lengths::sidecar_of(out);
        let write_error = |path: &Path, e: std::io::Error| Error::os(path, e);
        let partial = out.with_extension("npy.partial");
        let file = File::create(&partial).map_err(|e| write_error(&partial, e))?;
        let mut file = BufWriter::new(file);
        let shape = [usize::try_from(total)
            .map_err(|_| Error::Internal(format!("{total} tokens overflow usize")))?];
        file.write_all(&npy_header(dtype, &shape).map_err(|e| write_error(out, e))?)
            .map_err(|e| write_error(&partial, e))?;
        let mut written = 0u64;
        // A round of chunks at a time, one a thread, written in order: memory stays bounded by
        // the threads' chunks.
        let threads = rayon::current_num_threads().max(1);
        for round in chunks.chunks(threads) {
            let converted = crate::fork::parallel(|| {
                use rayon::prelude::*;
                round
                    .par_iter()
                    .map(|chunk| self.convert(chunk, dtype))
                    .collect::<Result<Vec<_>>>()
            })??;
            for bytes in converted {
                file.write_all(&bytes)
                    .map_err(|e| write_error(&partial, e))?;
                written += (bytes.len() / dtype.size()) as u64;
            }
            progress(written);
        }
        let file = file
            .into_inner()
            .map_err(|e| write_error(&partial, e.into_error()))?;
        file.sync_all().map_err(|e| write_error(&partial, e))?;
        let lengths_shape = [documents.len()];
        let mut side = npy_header(DType::I64, &lengths_shape).map_err(|e| write_error(out, e))?;
        side.extend_from_slice(&lengths);
        let side_partial = sidecar.with_extension("npy.partial");
        std::fs::write(&side_partial, side).map_err(|e| write_error(&side_partial, e))?;
        std::fs::rename(&side_partial, &sidecar).map_err(|e| write_error(&sidecar, e))?;
        std::fs::rename(&partial, out).map_err(|e| write_error(out, e))?;
        Ok(FlatPack {
            path: out.to_owned(),
            sidecar,
            dtype,
            tokens: total,
            documents: documents.len() as u64,
        })
    }

    /// The tokens of `documents` (whole documents of parts) as little-endian `dtype`.
    fn convert(&self, documents: &[(usize, (u64, u64))], dtype: DType) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for &(p, (a, b)) in documents {
            let part = &self.parts[p];
            let ty = part.token_type();
            let mut at = a;
            part.raw(a, b, &mut |bytes| {
                for chunk in bytes.chunks_exact(ty.size()) {
                    let v = ty.get(chunk);
                    let fits = match dtype {
                        DType::U16 => u16::try_from(v).map(|v| out.extend(v.to_le_bytes())),
                        _ => i32::try_from(v).map(|v| out.extend(v.to_le_bytes())),
                    };
                    fits.map_err(|_| {
                        Error::format(
                            part.path(),
                            format!("token {v} at {} does not fit {dtype}", part.place(at)),
                        )
                    })?;
                    at += 1;
                }
                Ok(())
            })?;
        }
        Ok(out)
    }
}
