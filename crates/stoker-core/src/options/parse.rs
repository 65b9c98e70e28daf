//! The parsers of option values: each takes the key (for its error) and the trimmed value, and
//! says in words what it expected.

use std::ops::Range;
use std::path::PathBuf;

use super::{Device, DeviceChoice, OnError, Order};
use crate::collate::RaggedLayout;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::source::pixels::InputLayout;
use crate::source::tokens::{Boundaries, Packing, TokenType};
use crate::source::{is_field_name, SourceSpec, TokenSpec, MAX_FIELDS};
use crate::transform::BoxFormat;

/// `npy:PATH`, `image_folder:ROOT`, `segmentation_folder:ROOT`, `coco:ANNOTATIONS`,
/// `coco_masks:ANNOTATIONS`, `tar:PATTERN`, `packed:PATH`, `megatron:PREFIX[,…]` or
/// `tokens:PATTERN`.
pub(super) fn parse_source(key: &str, v: &str) -> Result<SourceSpec> {
    Ok(if let Some(p) = v.strip_prefix("npy:") {
        SourceSpec::Npy(non_empty_path(key, p)?)
    } else if let Some(p) = v.strip_prefix("image_folder:") {
        SourceSpec::ImageFolder(non_empty_path(key, p)?)
    } else if let Some(p) = v.strip_prefix("segmentation_folder:") {
        SourceSpec::SegmentationFolder(non_empty_path(key, p)?)
    } else if let Some(p) = v.strip_prefix("coco:") {
        SourceSpec::Coco {
            annotations: non_empty_path(key, p)?,
            masks: false,
        }
    } else if let Some(p) = v.strip_prefix("coco_masks:") {
        SourceSpec::Coco {
            annotations: non_empty_path(key, p)?,
            masks: true,
        }
    } else if let Some(p) = v.strip_prefix("tar:") {
        // Expanded (and checked) when the loader opens the shards: a pattern may name shards
        // that do not exist yet.
        if p.is_empty() {
            return Err(Error::option(key, "the shard pattern is empty"));
        }
        SourceSpec::Tar(p.to_owned())
    } else if let Some(p) = v.strip_prefix("packed:") {
        if p.is_empty() {
            return Err(Error::option(key, "the packed path is empty"));
        }
        SourceSpec::Packed(p.to_owned())
    } else if let Some(p) = v.strip_prefix("megatron:") {
        // Expanded and checked when the loader opens them, as shard patterns are.
        if p.is_empty() {
            return Err(Error::option(key, "the Megatron prefix is empty"));
        }
        SourceSpec::Tokens(TokenSpec::Megatron(p.to_owned()))
    } else if let Some(p) = v.strip_prefix("tokens:") {
        if p.is_empty() {
            return Err(Error::option(key, "the token file pattern is empty"));
        }
        SourceSpec::Tokens(TokenSpec::Flat(p.to_owned()))
    } else if let Some(p) = v.strip_prefix("parquet:") {
        if p.is_empty() {
            return Err(Error::option(key, "the Parquet file pattern is empty"));
        }
        SourceSpec::Parquet(p.to_owned())
    } else {
        return Err(Error::option(
            key,
            format!(
                "`{v}` is not a source; expected npy:PATH, image_folder:ROOT, \
                 segmentation_folder:ROOT, coco:ANNOTATIONS, coco_masks:ANNOTATIONS, tar:PATTERN, packed:PATH, megatron:PREFIX, tokens:PATTERN or parquet:PATTERN"
            ),
        ));
    })
}

/// `W:SPEC,W:SPEC,…`, each SPEC `megatron:…`, `tokens:…` or `parquet:…`. A spec may hold commas of its own
/// (`megatron:/a,/b`, `tokens:x-{0,1}.bin`): a comma starts a new entry only where a weight and
/// a colon follow it.
pub(super) fn parse_blend(key: &str, v: &str) -> Result<Vec<(f64, TokenSpec)>> {
    let mut entries: Vec<(f64, String)> = Vec::new();
    for piece in v.split(',') {
        let weighted = piece
            .split_once(':')
            .and_then(|(w, rest)| Some((w.trim().parse::<f64>().ok()?, rest)));
        match (weighted, entries.last_mut()) {
            (Some((w, rest)), _) => entries.push((w, rest.trim().to_owned())),
            (None, Some((_, spec))) => {
                spec.push(',');
                spec.push_str(piece);
            }
            (None, None) => {
                return Err(Error::option(
                    key,
                    format!("`{piece}` does not start with a weight; expected W:SPEC,W:SPEC,…"),
                ))
            }
        }
    }
    entries
        .into_iter()
        .map(|(w, spec)| {
            if !w.is_finite() || w < 0.0 {
                return Err(Error::option(
                    key,
                    format!("weight {w} of `{spec}` is not a finite number >= 0"),
                ));
            }
            match parse_source(key, &spec)? {
                SourceSpec::Tokens(t) => Ok((w, t)),
                // In a blend, Parquet files are text read as tokens (`tokenizer`).
                SourceSpec::Parquet(p) => Ok((w, TokenSpec::Parquet(p))),
                _ => Err(Error::option(
                    key,
                    format!(
                        "`{spec}` is not a token source; a blend mixes megatron:…, tokens:… and parquet:…"
                    ),
                )),
            }
        })
        .collect()
}

/// `ignore` or `reset`.
pub(super) fn parse_boundaries(key: &str, v: &str) -> Result<Boundaries> {
    match v {
        "ignore" => Ok(Boundaries::Ignore),
        "reset" => Ok(Boundaries::Reset),
        _ => Err(Error::option(
            key,
            format!("`{v}` is not a boundary rule; expected ignore or reset"),
        )),
    }
}

/// `concat` or `pad`.
pub(super) fn parse_packing(key: &str, v: &str) -> Result<Packing> {
    match v {
        "concat" => Ok(Packing::Concat),
        "pad" => Ok(Packing::Pad),
        _ => Err(Error::option(
            key,
            format!("`{v}` is not a token packing; expected concat or pad"),
        )),
    }
}

/// `pad` or `offsets`.
pub(super) fn parse_ragged(key: &str, v: &str) -> Result<RaggedLayout> {
    match v {
        "pad" => Ok(RaggedLayout::Pad),
        "offsets" => Ok(RaggedLayout::Offsets),
        _ => Err(Error::option(
            key,
            format!("`{v}` is not a ragged layout; expected pad or offsets"),
        )),
    }
}

/// `xyxy`, `xywh` or `cxcywh`.
pub(super) fn parse_box_format(key: &str, v: &str) -> Result<BoxFormat> {
    BoxFormat::parse(v).ok_or_else(|| {
        Error::option(
            key,
            format!("`{v}` is not a box format; expected xyxy, xywh or cxcywh"),
        )
    })
}

/// `int64` or `int32`.
pub(super) fn parse_token_output(key: &str, v: &str) -> Result<DType> {
    match v {
        "int64" => Ok(DType::I64),
        "int32" => Ok(DType::I32),
        _ => Err(Error::option(
            key,
            format!("`{v}` is not a token output type; expected int64 or int32"),
        )),
    }
}

/// `uint16`, `uint32` or `int32`.
pub(super) fn parse_token_type(key: &str, v: &str) -> Result<TokenType> {
    TokenType::parse_raw(v).map_err(|reason| Error::option(key, reason))
}

/// `npy:PATH`.
pub(super) fn parse_labels(key: &str, v: &str) -> Result<PathBuf> {
    let p = v.strip_prefix("npy:").ok_or_else(|| {
        Error::option(
            key,
            format!("`{v}` is not a labels source; expected npy:PATH"),
        )
    })?;
    non_empty_path(key, p)
}

fn non_empty_path(key: &str, p: &str) -> Result<PathBuf> {
    if p.is_empty() {
        return Err(Error::option(key, "the path is empty"));
    }
    Ok(PathBuf::from(p))
}

/// `None` for an empty value: the key's default.
pub(super) fn non_empty(v: &str) -> Option<&str> {
    (!v.is_empty()).then_some(v)
}

/// A share from 0 to 1, or `auto` (`None`).
pub(super) fn parse_share(key: &str, v: &str) -> Result<Option<f64>> {
    if v == "auto" {
        return Ok(None);
    }
    match v.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(Some(share)),
        _ => Err(Error::option(
            key,
            format!("{v}: expected a number from 0 to 1, or auto"),
        )),
    }
}

pub(super) fn parse_bool(key: &str, v: &str) -> Result<bool> {
    // In any case: Python's `str(True)` is `True`.
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(Error::option(
            key,
            format!("`{v}` is not a boolean; expected true or false"),
        )),
    }
}

pub(super) fn parse_int(key: &str, v: &str, min: u64, max: u64) -> Result<u64> {
    let n: u64 = v
        .parse()
        .map_err(|_| Error::option(key, format!("`{v}` is not a non-negative integer")))?;
    if n < min || n > max {
        return Err(Error::option(
            key,
            format!("{n} is out of range [{min}, {max}]"),
        ));
    }
    Ok(n)
}

/// `auto` (or its alias `env`): `None`, resolved when the loader is made; else an integer in
/// `min..=max`.
pub(super) fn parse_auto(key: &str, v: &str, min: u64, max: u64) -> Result<Option<usize>> {
    if v == "auto" || v == "env" {
        return Ok(None);
    }
    Ok(Some(parse_int(key, v, min, max)? as usize))
}

/// A finite number.
pub(super) fn parse_finite(key: &str, v: &str) -> Result<f64> {
    v.parse::<f64>()
        .ok()
        .filter(|p| p.is_finite())
        .ok_or_else(|| Error::option(key, format!("`{v}` is not a finite number")))
}

/// `w0,w1,...`, each finite and ≥ 0.
pub(super) fn parse_weights(key: &str, v: &str) -> Result<Vec<f64>> {
    v.split(',')
        .map(|w| {
            w.trim()
                .parse::<f64>()
                .ok()
                .filter(|w| w.is_finite() && *w >= 0.0)
                .ok_or_else(|| Error::option(key, format!("`{w}` is not a finite weight >= 0")))
        })
        .collect()
}

/// `3,5,9` or ranges `0..100` (end exclusive), mixed; kept as ranges (see `subset`).
pub(super) fn parse_indices(key: &str, v: &str) -> Result<Vec<Range<usize>>> {
    let mut out = Vec::new();
    for part in v.split(',').map(str::trim) {
        let bad = || Error::option(key, format!("`{part}` is not an index or a range a..b"));
        if let Some((a, b)) = part.split_once("..") {
            let a: usize = a.trim().parse().map_err(|_| bad())?;
            let b: usize = b.trim().parse().map_err(|_| bad())?;
            if b < a {
                return Err(Error::option(
                    key,
                    format!("`{part}` is an empty range (end < start)"),
                ));
            }
            out.push(a..b);
        } else {
            let i: usize = part.parse().map_err(|_| bad())?;
            out.push(i..i.saturating_add(1));
        }
    }
    if out.iter().all(Range::is_empty) {
        return Err(Error::option(
            key,
            format!("`{v}` selects no sample: every epoch would deliver nothing"),
        ));
    }
    Ok(out)
}

pub(super) fn parse_input_layout(key: &str, v: &str) -> Result<InputLayout> {
    match v {
        "hwc" => Ok(InputLayout::Hwc),
        "chw" => Ok(InputLayout::Chw),
        _ => Err(Error::option(key, format!("`{v}` is not hwc or chw"))),
    }
}

/// `cpu`, `cuda` (the local rank's device, once the launch is known) or `cuda:N`.
pub(super) fn parse_device(key: &str, v: &str) -> Result<DeviceChoice> {
    match v {
        "cpu" => Ok(DeviceChoice::Given(Device::Cpu)),
        "cuda" => Ok(DeviceChoice::CudaLocal),
        _ => match v.strip_prefix("cuda:").map(str::parse::<u32>) {
            Some(Ok(n)) => Ok(DeviceChoice::Given(Device::Cuda(n))),
            _ => Err(Error::option(
                key,
                format!("`{v}` is not a device; expected cpu, cuda or cuda:N"),
            )),
        },
    }
}

/// A `CUstream` as an address, decimal or `0x` hex.
pub(super) fn parse_stream(key: &str, v: &str) -> Result<usize> {
    let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => usize::from_str_radix(hex, 16),
        None => v.parse::<usize>(),
    };
    parsed.map_err(|_| {
        Error::option(
            key,
            format!(
                "`{v}` is not a stream address; expected a CUstream as decimal or 0x-prefixed hex"
            ),
        )
    })
}

pub(super) fn parse_order(key: &str, v: &str) -> Result<Order> {
    match v {
        "random" => Ok(Order::Random),
        "quasi_random" => Ok(Order::QuasiRandom),
        _ => Err(Error::option(
            key,
            format!("`{v}` is not an order; expected random or quasi_random"),
        )),
    }
}

pub(super) fn parse_on_error(key: &str, v: &str) -> Result<OnError> {
    match v {
        "raise" => Ok(OnError::Raise),
        "skip" => Ok(OnError::Skip),
        _ => Err(Error::option(
            key,
            format!("`{v}` is not a policy; expected raise or skip"),
        )),
    }
}

/// Bytes as `500GB` or `64GiB`.
pub(super) fn parse_size(key: &str, v: &str) -> Result<u64> {
    let bytes: bytesize::ByteSize = v.parse().map_err(|_| {
        Error::option(
            key,
            format!(
                "`{v}` is not a size such as 500GB or 64GiB ({})",
                crate::memory::SIZE_WORDS
            ),
        )
    })?;
    Ok(bytes.as_u64())
}

/// Parses `columns`, `COLUMN[:NAME],…`: the columns to deliver and their field names (the
/// column's own name when it is one: letters, digits and `_`).
pub(super) fn parse_columns(v: &str) -> Result<Vec<(String, String)>> {
    let bad = |why: String| Error::option("columns", why);
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in v.split(',') {
        let entry = entry.trim();
        let (column, name) = entry.split_once(':').unwrap_or((entry, entry));
        let (column, name) = (column.trim(), name.trim());
        if column.is_empty() {
            return Err(bad(format!("`{entry}` names no column")));
        }
        if !is_field_name(name) {
            return Err(bad(format!(
                "`{entry}`: a field name is letters, digits and `_` (write COLUMN:NAME)"
            )));
        }
        if out.iter().any(|(_, n)| n == name) {
            return Err(bad(format!("field `{name}` is named twice")));
        }
        out.push((column.to_owned(), name.to_owned()));
    }
    if out.len() > MAX_FIELDS {
        return Err(bad(format!("more than {MAX_FIELDS} fields")));
    }
    Ok(out)
}

/// A transform spec, checked as far as it can be alone (its operations and their arguments);
/// what depends on the source (sizes, fields, channel counts) is checked when a loader is made.
pub(super) fn parse_transform(key: &str, v: &str) -> Result<Option<String>> {
    match non_empty(v) {
        None => Ok(None),
        Some(spec) => crate::transform::parse(spec)
            .map(|_| Some(spec.to_owned()))
            .map_err(|e| Error::option(key, e)),
    }
}
