//! `npy:PATH`: a NumPy `.npy` array, memory-mapped once and shared by every worker. Sample `i`
//! is row `i` of the first axis, handed out as a view into the mapping (no copy until collate).

use std::path::{Path, PathBuf};

use super::mapped::Mapping;
use super::{fields_text, open_file, FieldSpec, Sample, Source};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::hash::Fnv;

/// A C-order `.npy` array mapped read-only.
pub struct NpyArray {
    path: PathBuf,
    map: Mapping,
    dtype: DType,
    shape: Vec<usize>,
    data_offset: usize,
    row_bytes: usize,
}

impl NpyArray {
    /// Maps `path` and validates its header and size.
    pub fn open(path: &Path) -> Result<NpyArray> {
        let (file, _) = open_file(path, "an .npy file")?;
        // Guarded against a truncation while mapped (see `mapped`); the size is validated below
        // against the header.
        let map = Mapping::map(&file, path)?;
        let header = parse_header(&map).map_err(|reason| Error::format(path, reason))?;
        if header.shape.is_empty() {
            return Err(Error::format(
                path,
                "a 0-d array has no samples; need at least one axis",
            ));
        }
        // Checked at every step: the shape is the file's word, and a product that wraps could
        // pass the size check below with rows far larger than the file.
        let overflow = || {
            Error::format(
                path,
                format!(
                    "{} shape {:?} overflows the address space",
                    header.dtype, header.shape
                ),
            )
        };
        let row_bytes = header.shape[1..]
            .iter()
            .try_fold(header.dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(overflow)?;
        let expected = header.shape[0]
            .checked_mul(row_bytes)
            .and_then(|b| b.checked_add(header.data_offset))
            .ok_or_else(overflow)?;
        if map.len() != expected {
            return Err(Error::format(
                path,
                format!(
                    "{} shape {:?} needs {} bytes of data after the {}-byte header, but the file has {} ({})",
                    header.dtype,
                    header.shape,
                    expected - header.data_offset,
                    header.data_offset,
                    map.len().saturating_sub(header.data_offset),
                    if map.len() < expected { "truncated" } else { "trailing bytes" }
                ),
            ));
        }
        Ok(NpyArray {
            path: path.to_owned(),
            map,
            dtype: header.dtype,
            shape: header.shape,
            data_offset: header.data_offset,
            row_bytes,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The full shape, first axis included.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Rows: the length of the first axis.
    pub fn rows(&self) -> usize {
        self.shape[0]
    }

    /// The bytes of row `i` (`i < rows()`).
    pub fn row(&self, i: usize) -> &[u8] {
        let start = self.data_offset + i * self.row_bytes;
        &self.map[start..start + self.row_bytes]
    }

    /// `Err(Io)` naming the file if it was truncated while mapped (see [`Mapping::check`]).
    pub fn check(&self) -> Result<()> {
        self.map.check()
    }

    /// Every element as `i64`, for small integer arrays such as labels.
    fn to_i64(&self) -> Result<Vec<i64>> {
        let data = &self.map[self.data_offset..];
        let values = match self.dtype {
            DType::U8 => data.iter().map(|&b| b as i64).collect(),
            DType::I32 => data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            DType::I64 => data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
            other => {
                return Err(Error::format(
                    &self.path,
                    format!("labels must be integers (uint8, int32 or int64), not {other}"),
                ))
            }
        };
        Ok(values)
    }
}

impl std::fmt::Debug for NpyArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NpyArray")
            .field("path", &self.path)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish()
    }
}

/// What an `.npy` header says. Also used for `npy` members of tar shards.
pub(crate) struct Header {
    pub dtype: DType,
    /// Empty for a 0-d array (a scalar).
    pub shape: Vec<usize>,
    /// Where the data starts.
    pub data_offset: usize,
}

/// What an `.npy` header says, with the element type as written (`<u2`): for readers that take
/// element types the batch has none of (token files of uint16 or uint32).
pub(crate) struct RawHeader {
    pub descr: String,
    /// Empty for a 0-d array (a scalar).
    pub shape: Vec<usize>,
    /// Where the data starts.
    pub data_offset: usize,
}

/// Parses the NPY header (format versions 1.0, 2.0 and 3.0).
pub(crate) fn parse_header(bytes: &[u8]) -> std::result::Result<Header, String> {
    let raw = parse_raw_header(bytes)?;
    let dtype = match raw.descr.as_str() {
        "|u1" | "<u1" | "u1" => DType::U8,
        "<u2" => DType::U16,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "<f2" => DType::F16,
        "<f4" => DType::F32,
        other => {
            return Err(format!(
            "unsupported dtype '{other}' (supported: |u1, <u2, <i4, <i8, <f2, <f4; little-endian)"
        ))
        }
    };
    Ok(Header {
        dtype,
        shape: raw.shape,
        data_offset: raw.data_offset,
    })
}

/// Parses the NPY header (format versions 1.0, 2.0 and 3.0), leaving the element type as text.
pub(crate) fn parse_raw_header(bytes: &[u8]) -> std::result::Result<RawHeader, String> {
    const MAGIC: &[u8] = b"\x93NUMPY";
    if bytes.len() < 10 || !bytes.starts_with(MAGIC) {
        return Err("not an .npy file (missing \\x93NUMPY magic)".into());
    }
    let (len_bytes, header_start) = match bytes[6] {
        1 => (2, 10),
        2 | 3 => (4, 12),
        v => return Err(format!("unsupported .npy format version {v}")),
    };
    if bytes.len() < header_start {
        return Err("truncated .npy header".into());
    }
    let header_len = if len_bytes == 2 {
        u16::from_le_bytes([bytes[8], bytes[9]]) as usize
    } else {
        u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize
    };
    let data_offset = header_start + header_len;
    let text = bytes
        .get(header_start..data_offset)
        .ok_or("truncated .npy header")?;
    let text = std::str::from_utf8(text).map_err(|_| "header is not text")?;

    let descr = dict_value(text, "descr").ok_or("header has no 'descr'")?;
    let descr = descr
        .trim()
        .trim_matches(|c| c == '\'' || c == '"')
        .to_owned();
    let fortran = dict_value(text, "fortran_order").ok_or("header has no 'fortran_order'")?;
    if fortran.trim() != "False" {
        return Err(
            "Fortran-order arrays are not supported; save with np.ascontiguousarray".into(),
        );
    }
    let shape_text = dict_value(text, "shape").ok_or("header has no 'shape'")?;
    let shape_text = shape_text
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or("malformed 'shape'")?;
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| format!("malformed shape entry '{s}'"))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RawHeader {
        descr,
        shape,
        data_offset,
    })
}

/// The text of `key`'s value in a Python dict literal: up to the next top-level comma or brace.
fn dict_value<'t>(text: &'t str, key: &str) -> Option<&'t str> {
    let quoted = [format!("'{key}'"), format!("\"{key}\"")];
    let at = quoted
        .iter()
        .find_map(|q| text.find(q.as_str()).map(|i| i + q.len()))?;
    let rest = text[at..].trim_start().strip_prefix(':')?;
    let mut depth = 0i32;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(&rest[..i]),
            _ => {}
        }
    }
    None
}

/// A file's name, not its directory, for identities: the same data may be mounted elsewhere
/// on resume.
fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// An npy array as a source with field `data` (row `i`) and, given a labels array, `label`
/// (int64).
pub struct NpySource {
    data: NpyArray,
    /// Labels as native-endian int64 bytes, 8 per sample.
    labels: Option<Vec<u8>>,
    /// The labels in the identity: their file's name and a hash of their values (computed once,
    /// so that a job resumed with other labels is told).
    labels_identity: Option<String>,
    fields: Vec<FieldSpec>,
}

impl NpySource {
    /// Maps the `.npy` at `path` as field `data` and, with `labels`, a `.npy` of one integer per
    /// row as int64 field `label`.
    pub fn open(path: &Path, labels: Option<&Path>) -> Result<NpySource> {
        let data = NpyArray::open(path)?;
        let mut fields = vec![FieldSpec::tensor("data", data.dtype(), &data.shape()[1..])];
        let labels_path = labels;
        let labels = match labels {
            None => None,
            Some(lpath) => {
                let arr = NpyArray::open(lpath)?;
                let per_row: usize = arr.shape()[1..].iter().product();
                if arr.rows() != data.rows() || per_row != 1 {
                    return Err(Error::format(
                        lpath,
                        format!(
                            "labels have shape {:?}; expected ({},) to match {}",
                            arr.shape(),
                            data.rows(),
                            path.display()
                        ),
                    ));
                }
                fields.push(FieldSpec::tensor("label", DType::I64, &[]));
                Some(
                    arr.to_i64()?
                        .iter()
                        .flat_map(|v| v.to_ne_bytes())
                        .collect::<Vec<u8>>(),
                )
            }
        };
        let labels_identity = labels.as_deref().zip(labels_path).map(|(values, path)| {
            format!("labels from {} ({:016x})", file_name(path), Fnv::of(values))
        });
        Ok(NpySource {
            data,
            labels,
            labels_identity,
            fields,
        })
    }
}

impl Source for NpySource {
    fn len(&self) -> usize {
        self.data.rows()
    }

    fn fields(&self) -> &[FieldSpec] {
        &self.fields
    }

    fn describe(&self, index: usize) -> String {
        format!("{} row {index}", self.data.path().display())
    }

    fn identity(&self) -> String {
        let labels = self
            .labels_identity
            .as_ref()
            .map_or(String::new(), |l| format!(", {l}"));
        format!(
            "npy {} of {} rows: {}{labels}",
            file_name(self.data.path()),
            self.len(),
            fields_text(&self.fields)
        )
    }

    fn read<'a>(&'a self, index: usize, _scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        let mut sample = Sample::default();
        sample.set(0, self.data.row(index));
        if let Some(labels) = &self.labels {
            sample.set(1, &labels[index * 8..index * 8 + 8]);
        }
        Ok(sample)
    }

    fn verify(&self) -> Result<()> {
        self.data.check()
    }
}

/// The `.npy` type string of `dtype` (little-endian, as the reader accepts); `None` for
/// bfloat16, which NumPy has no type for.
pub fn npy_descr(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::U8 => Some("|u1"),
        DType::I32 => Some("<i4"),
        DType::I64 => Some("<i8"),
        DType::F16 => Some("<f2"),
        DType::BF16 => None,
        DType::F32 => Some("<f4"),
        DType::U16 => Some("<u2"),
    }
}

/// Writes `data` (C order, native little-endian elements) as a version-1.0 `.npy` file of
/// `dtype` and `shape` that NumPy and [`NpySource`] read.
pub fn write_npy(path: &Path, dtype: DType, shape: &[usize], data: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, npy_bytes(dtype, shape, data)?)
}

/// The bytes of the `.npy` file [`write_npy`] writes.
pub fn npy_bytes(dtype: DType, shape: &[usize], data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = npy_header(dtype, shape)?;
    out.extend_from_slice(data);
    Ok(out)
}

#[cfg(test)]
fn write_npy_descr(path: &Path, descr: &str, shape: &[usize], data: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, encode_npy(descr, shape, data)?)
}

/// The header of a version-1.0 `.npy` file of `dtype` and `shape` (the data follows it), for
/// writers that stream the data themselves.
pub fn npy_header(dtype: DType, shape: &[usize]) -> std::io::Result<Vec<u8>> {
    let descr = npy_descr(dtype).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "bfloat16 has no .npy type",
        )
    })?;
    header_of(descr, shape)
}

#[cfg(test)]
fn encode_npy(descr: &str, shape: &[usize], data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = header_of(descr, shape)?;
    out.extend_from_slice(data);
    Ok(out)
}

fn header_of(descr: &str, shape: &[usize]) -> std::io::Result<Vec<u8>> {
    let shape_text = match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    // Pad so the data starts 64-byte aligned, as NumPy does.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let header_len = u16::try_from(header.len()).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "npy header over 64 KiB")
    })?;
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&header_len.to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Test files with any `descr`, including ones the reader refuses.
    pub(crate) fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) {
        write_npy_descr(path, descr, shape, data).unwrap();
    }

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stoker-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn reads_rows_and_labels() {
        let p = tmp("ok.npy");
        let data: Vec<u8> = (0..24u8).collect();
        write_npy(&p, "|u1", &[4, 2, 3], &data);
        let l = tmp("labels.npy");
        let labels: Vec<u8> = [7i64, 8, 9, 10]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        write_npy(&l, "<i8", &[4], &labels);
        let src = NpySource::open(&p, Some(&l)).unwrap();
        assert_eq!(src.len(), 4);
        assert_eq!(
            src.fields()[0],
            FieldSpec::tensor("data", DType::U8, &[2, 3])
        );
        let mut scratch = Vec::new();
        let s = src.read(2, &mut scratch).unwrap();
        assert_eq!(s.get(0), &data[12..18]);
        assert_eq!(s.get(1), &9i64.to_ne_bytes());
    }

    #[test]
    fn float_and_int_dtypes() {
        for (descr, dtype) in [
            ("<u2", DType::U16),
            ("<i4", DType::I32),
            ("<i8", DType::I64),
            ("<f2", DType::F16),
            ("<f4", DType::F32),
        ] {
            let p = tmp(&format!("d{}.npy", dtype.name()));
            write_npy(&p, descr, &[3, 2], &vec![1u8; 6 * dtype.size()]);
            let arr = NpyArray::open(&p).unwrap();
            assert_eq!(arr.dtype(), dtype);
            assert_eq!(arr.row(2).len(), 2 * dtype.size());
        }
    }

    #[test]
    fn bad_files_name_the_file_and_reason() {
        let missing = tmp("nope.npy");
        let e = NpyArray::open(&missing).unwrap_err();
        assert!(matches!(e, Error::Io { .. }));
        assert!(e.to_string().contains("nope.npy"), "{e}");

        let trunc = tmp("trunc.npy");
        write_npy(&trunc, "|u1", &[4, 3], &[0u8; 10]);
        let e = NpyArray::open(&trunc).unwrap_err().to_string();
        assert!(e.contains("trunc.npy") && e.contains("truncated"), "{e}");

        let long = tmp("long.npy");
        write_npy(&long, "|u1", &[2], &[0u8; 3]);
        let e = NpyArray::open(&long).unwrap_err().to_string();
        assert!(e.contains("trailing bytes"), "{e}");

        let garbage = tmp("garbage.npy");
        std::fs::write(&garbage, b"hello world, not numpy").unwrap();
        let e = NpyArray::open(&garbage).unwrap_err().to_string();
        assert!(e.contains("garbage.npy") && e.contains("magic"), "{e}");

        let cut_header = tmp("cut_header.npy");
        std::fs::write(&cut_header, b"\x93NUMPY\x01\x00\x76\x00{'descr'").unwrap();
        let e = NpyArray::open(&cut_header).unwrap_err().to_string();
        assert!(e.contains("truncated .npy header"), "{e}");

        let big_endian = tmp("be.npy");
        write_npy(&big_endian, ">f4", &[1], &[0u8; 4]);
        let e = NpyArray::open(&big_endian).unwrap_err().to_string();
        assert!(e.contains("unsupported dtype '>f4'"), "{e}");

        let fortran = tmp("fortran.npy");
        std::fs::write(&fortran, {
            let mut v = b"\x93NUMPY\x01\x00".to_vec();
            let h = "{'descr': '|u1', 'fortran_order': True, 'shape': (1, 1), }\n";
            v.extend_from_slice(&(h.len() as u16).to_le_bytes());
            v.extend_from_slice(h.as_bytes());
            v.push(0);
            v
        })
        .unwrap();
        let e = NpyArray::open(&fortran).unwrap_err().to_string();
        assert!(e.contains("Fortran"), "{e}");

        // Found by fuzzing (npy_header): a row size that overflows panicked in debug builds and
        // wrapped in release, where (1, 2**62, 4) uint8 wrapped to 0-byte rows and was accepted.
        for (name, descr, shape) in [
            ("overflow_i8.npy", "<i8", vec![4, 9_223_372_036_854_775_807]),
            ("overflow_wrap.npy", "|u1", vec![1, 1 << 62, 4]),
            ("overflow_rows.npy", "<f4", vec![usize::MAX / 2, 2]),
        ] {
            let p = tmp(name);
            write_npy(&p, descr, &shape, &[0u8; 8]);
            let e = NpyArray::open(&p).unwrap_err();
            assert!(matches!(e, Error::Format { .. }), "{e}");
            let e = e.to_string();
            assert!(e.contains(name) && e.contains("overflows"), "{e}");
        }

        let p = tmp("rows.npy");
        write_npy(&p, "|u1", &[3, 2], &[0u8; 6]);
        let l = tmp("badlabels.npy");
        write_npy(&l, "<i8", &[2], &[0u8; 16]);
        let e = NpySource::open(&p, Some(&l)).err().unwrap().to_string();
        assert!(
            e.contains("badlabels.npy") && e.contains("expected (3,)"),
            "{e}"
        );
    }
}
