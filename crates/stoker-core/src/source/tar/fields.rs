//! Which members of a sample become which fields, and how their bytes become field bytes.
//!
//! A field is chosen by extension; its kind follows from the extension:
//!
//! | extension | field kind | bytes delivered |
//! |---|---|---|
//! | `jpg`, `jpeg`, `png` (also after a dot: `seg.png`) | `EncodedImage` | the member, decoded and transformed by collate |
//! | `cls`, `label`, `index` | int64 scalar | the member's text (`" 42\n"`) parsed as an integer |
//! | `npy` | tensor of the header's dtype and shape | the data after the `.npy` header |
//! | `json#boxes` | ragged float32 `[n, 4]` | the JSON object's `boxes`, rows of 4 numbers |
//! | `json#labels` | ragged int64 `[n]` | the JSON object's `labels`, integers |
//! | anything else (`txt`, `json`, ...) | ragged uint8 | the member as is (padded by collate) |
//!
//! By default a sample gives `image` (its `jpg`, `jpeg` or `png` member) and `label` (its `cls`
//! or `label` member); `fields=EXT:NAME,...` replaces that list. `EXT` may list alternatives
//! separated by `;` (`jpg;png:image`, WebDataset's `to_tuple("jpg;png")`): the first one the
//! sample has is used. An `npy` field's dtype and shape come from the first sample (shapes that
//! vary in their leading dimension become a ragged field when `pad` is set, as for callback
//! sources). A sample lacking a field, a label that is not an integer or an `npy` member that does
//! not match the first one is a per-sample error, which `on_error=skip` can replace.

use super::scan::ScannedSample;
use super::stream::StreamSample;
use super::TarConfig;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::source::npy::parse_header;
use crate::source::{is_field_name, FieldKind, FieldSpec, Sample, IMAGE_EXTENSIONS, MAX_FIELDS};

/// Extensions whose text is an integer label.
pub const INT_EXTENSIONS: &[&str] = &["cls", "label", "index"];
/// The label extensions of the default fields.
const DEFAULT_LABEL_EXTENSIONS: &[&str] = &["cls", "label"];
/// Longest label text accepted (an i64 with sign and whitespace fits many times over).
const MAX_LABEL_TEXT: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Image,
    Int,
    Npy,
    Raw,
    /// `json#boxes`: the member's `boxes`, rows of 4 numbers, as float32 `[n, 4]`.
    JsonBoxes,
    /// `json#labels`: the member's `labels`, integers, as int64 `[n]`.
    JsonLabels,
}

/// The keys a `EXT#KEY` field may read from a JSON member.
const JSON_KEYS: &[&str] = &["boxes", "labels"];
/// Most boxes (or labels) one sample's JSON member may hold.
pub const MAX_JSON_ROWS: usize = 1 << 20;

/// `EXT#KEY`'s class, or why the key is not one; `None` without `#`.
fn json_class(ext: &str) -> std::result::Result<Option<Class>, String> {
    let Some((_, key)) = ext.split_once('#') else {
        return Ok(None);
    };
    match key {
        "boxes" => Ok(Some(Class::JsonBoxes)),
        "labels" => Ok(Some(Class::JsonLabels)),
        other => Err(format!(
            "`{ext}`: a JSON member's field reads the key {} (as `json#boxes`), not `{other}`",
            JSON_KEYS.join(" or ")
        )),
    }
}

fn class_of(ext: &str) -> Class {
    if let Ok(Some(class)) = json_class(ext) {
        return class;
    }
    // `seg.png`, `mask.png`: WebDataset's extension is everything after the key, and a
    // segmentation mask beside its image is commonly stored as `KEY.seg.png`.
    let last = ext.rsplit('.').next().unwrap_or(ext);
    if IMAGE_EXTENSIONS.contains(&ext) || IMAGE_EXTENSIONS.contains(&last) {
        Class::Image
    } else if INT_EXTENSIONS.contains(&ext) {
        Class::Int
    } else if ext == "npy" {
        Class::Npy
    } else {
        Class::Raw
    }
}

/// Parses the `fields` option, `EXT:NAME,...` (`jpg;png:image,cls:label,json:meta`), into
/// (extensions, name) pairs; extensions are lower-cased.
pub fn parse_fields(s: &str) -> Result<Vec<(String, String)>> {
    let bad = |reason: String| Error::option("fields", reason);
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in s.split(',') {
        let entry = entry.trim();
        let (exts, name) = entry.split_once(':').ok_or_else(|| {
            bad(format!(
                "`{entry}` is not EXT:NAME (e.g. jpg:image,cls:label)"
            ))
        })?;
        let name = name.trim();
        let exts: Vec<String> = exts
            .split(';')
            .map(|e| e.trim().trim_start_matches('.').to_lowercase())
            .collect();
        if exts.iter().any(|e| e.is_empty()) {
            return Err(bad(format!("`{entry}` has an empty extension")));
        }
        if !is_field_name(name) {
            return Err(bad(format!(
                "`{entry}`: a field name is letters, digits and `_`"
            )));
        }
        if out.iter().any(|(_, n)| n == name) {
            return Err(bad(format!("field `{name}` is named twice")));
        }
        for e in &exts {
            json_class(e).map_err(&bad)?;
        }
        let classes: Vec<Class> = exts.iter().map(|e| class_of(e)).collect();
        if classes.iter().any(|c| *c != classes[0]) {
            return Err(bad(format!(
                "`{entry}`: alternatives must be of one kind (images, integer labels, npy or raw bytes)"
            )));
        }
        out.push((exts.join(";"), name.to_owned()));
    }
    if out.len() > MAX_FIELDS {
        return Err(bad(format!("more than {MAX_FIELDS} fields")));
    }
    Ok(out)
}

#[derive(Clone, Debug)]
struct Rule {
    name: String,
    exts: Vec<String>,
    class: Class,
}

/// The resolved fields of a tar source: which members, which kinds, and the conversion of
/// member bytes into field bytes. Shared by the indexed source and the streaming reader.
#[derive(Clone, Debug)]
pub struct TarFields {
    rules: Vec<Rule>,
    specs: Vec<FieldSpec>,
}

/// A field's member, found in a sample.
#[derive(Clone, Copy, Debug)]
pub(super) struct Located<'a> {
    /// Which of the field's extensions it has.
    pub alt: usize,
    pub bytes: &'a [u8],
    /// Byte offset of the member's data in the shard.
    pub offset: u64,
    /// Larger than `max_member_bytes` (indexed mode; `bytes` is then empty).
    pub too_big: bool,
}

/// Names a sample in errors: its index, its description, its key.
pub(super) struct SampleRef<'s> {
    pub index: u64,
    pub what: &'s dyn Fn() -> String,
    pub key: &'s str,
    pub max_member_bytes: u64,
}

impl TarFields {
    /// Resolves the configured fields against the first sample of the dataset, given as its
    /// members' (extension, bytes). `shard` and `key` name that sample in errors.
    pub fn resolve(
        config: &TarConfig,
        shard: &str,
        key: &str,
        first: &[(&str, &[u8])],
    ) -> Result<TarFields> {
        let has = |exts: &[&str]| first.iter().any(|(e, _)| exts.contains(e));
        let present = || {
            first
                .iter()
                .map(|(e, _)| format!("{key}.{e}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let rules: Vec<Rule> = match &config.fields {
            None => {
                for (exts, what) in [
                    (IMAGE_EXTENSIONS, "image (jpg, jpeg or png)"),
                    (DEFAULT_LABEL_EXTENSIONS, "label (cls or label)"),
                ] {
                    if !has(exts) {
                        return Err(Error::format(
                            shard,
                            format!(
                                "the first sample, `{key}`, has no {what} member (it has {}); the default fields are image and label: set fields=EXT:NAME,... to choose others",
                                present()
                            ),
                        ));
                    }
                }
                vec![
                    Rule {
                        name: "image".into(),
                        exts: IMAGE_EXTENSIONS.iter().map(|e| e.to_string()).collect(),
                        class: Class::Image,
                    },
                    Rule {
                        name: "label".into(),
                        exts: DEFAULT_LABEL_EXTENSIONS
                            .iter()
                            .map(|e| e.to_string())
                            .collect(),
                        class: Class::Int,
                    },
                ]
            }
            Some(list) => {
                if list.is_empty() || list.len() > MAX_FIELDS {
                    return Err(Error::option(
                        "fields",
                        format!("between 1 and {MAX_FIELDS} fields"),
                    ));
                }
                let mut rules = Vec::with_capacity(list.len());
                for (exts, name) in list {
                    let exts: Vec<String> = exts.split(';').map(|e| e.to_lowercase()).collect();
                    for e in &exts {
                        json_class(e).map_err(|reason| Error::option("fields", reason))?;
                    }
                    let class = class_of(&exts[0]);
                    if exts.iter().any(|e| e.is_empty() || class_of(e) != class) {
                        return Err(Error::option(
                            "fields",
                            format!(
                                "`{}:{name}`: alternatives must be non-empty and of one kind",
                                exts.join(";")
                            ),
                        ));
                    }
                    if rules.iter().any(|r: &Rule| r.name == *name) {
                        return Err(Error::option(
                            "fields",
                            format!("field `{name}` is named twice"),
                        ));
                    }
                    // The member's extension, without the JSON key.
                    let exts = exts
                        .iter()
                        .map(|e| e.split('#').next().unwrap_or(e).to_owned())
                        .collect();
                    rules.push(Rule {
                        name: name.clone(),
                        exts,
                        class,
                    });
                }
                rules
            }
        };
        let mut specs = Vec::with_capacity(rules.len());
        for rule in &rules {
            specs.push(match rule.class {
                Class::Image => FieldSpec::encoded_image(&rule.name),
                Class::Int => FieldSpec::tensor(&rule.name, DType::I64, &[]),
                Class::Raw => FieldSpec::ragged(&rule.name, DType::U8, &[]),
                Class::JsonBoxes => FieldSpec::ragged(&rule.name, DType::F32, &[4]),
                Class::JsonLabels => FieldSpec::ragged(&rule.name, DType::I64, &[]),
                Class::Npy => {
                    let found = rule
                        .exts
                        .iter()
                        .find_map(|x| first.iter().find(|(e, _)| e == x));
                    let Some((ext, bytes)) = found else {
                        return Err(Error::format(
                            shard,
                            format!(
                                "field `{}`: the first sample, `{key}`, has no {} member to learn its dtype and shape from (it has {})",
                                rule.name,
                                rule.exts.join("/"),
                                present()
                            ),
                        ));
                    };
                    let header = parse_header(bytes).map_err(|reason| {
                        Error::format(shard, format!("member `{key}.{ext}`: {reason}"))
                    })?;
                    if config.pad && !header.shape.is_empty() {
                        FieldSpec::ragged(&rule.name, header.dtype, &header.shape[1..])
                    } else {
                        FieldSpec::tensor(&rule.name, header.dtype, &header.shape)
                    }
                }
            });
        }
        Ok(TarFields { rules, specs })
    }

    /// Resolves the fields from the first sample of a stream (read with `wanted: None`, so that
    /// every member is there to choose from).
    pub fn resolve_streamed(config: &TarConfig, first: &StreamSample) -> Result<TarFields> {
        let members: Vec<(&str, &[u8])> = first
            .members
            .iter()
            .map(|m| (m.ext.as_str(), &m.data[..]))
            .collect();
        TarFields::resolve(config, &first.shard, &first.key, &members)
    }

    /// Resolves the fields from a scanned sample whose members lie in `shard_bytes`.
    pub(super) fn resolve_scanned(
        config: &TarConfig,
        shard: &str,
        shard_bytes: &[u8],
        first: &ScannedSample,
    ) -> Result<TarFields> {
        let members: Vec<(&str, &[u8])> = first
            .members
            .iter()
            .map(|m| {
                let start = m.offset as usize;
                (m.ext.as_str(), &shard_bytes[start..start + m.size as usize])
            })
            .collect();
        TarFields::resolve(config, shard, &first.key, &members)
    }

    /// The fields every sample has, in order.
    pub fn specs(&self) -> &[FieldSpec] {
        &self.specs
    }

    /// Every extension some field reads (for a streaming reader to keep only those).
    pub fn wanted_extensions(&self) -> Vec<String> {
        let mut all: Vec<String> = self.rules.iter().flat_map(|r| r.exts.clone()).collect();
        all.sort();
        all.dedup();
        all
    }

    /// Field `field`'s extensions, in order of preference.
    pub fn extensions(&self, field: usize) -> &[String] {
        &self.rules[field].exts
    }

    /// The first of field `field`'s extensions that `find` locates in a sample.
    pub(super) fn locate<T>(
        &self,
        field: usize,
        mut find: impl FnMut(&str) -> Option<T>,
    ) -> Option<(usize, T)> {
        self.rules[field]
            .exts
            .iter()
            .enumerate()
            .find_map(|(alt, ext)| find(ext).map(|t| (alt, t)))
    }

    /// Turns the located members of one sample into its field bytes: views of the members for
    /// images, raw bytes and npy data; parsed integers written into `scratch`.
    pub(super) fn assemble<'a>(
        &self,
        located: &[Option<Located<'a>>],
        sample: &SampleRef<'_>,
        scratch: &'a mut Vec<u8>,
    ) -> Result<Sample<'a>> {
        scratch.clear();
        let mut views: [&'a [u8]; MAX_FIELDS] = [&[]; MAX_FIELDS];
        // Field bytes written into `scratch`: where they start and how many.
        let mut int_at: [Option<(usize, usize)>; MAX_FIELDS] = [None; MAX_FIELDS];
        for (f, rule) in self.rules.iter().enumerate() {
            let fail = |reason: String| Error::Sample {
                index: sample.index,
                what: (sample.what)(),
                reason,
            };
            let Some(member) = located[f] else {
                return Err(fail(format!(
                    "no member for field `{}` ({})",
                    rule.name,
                    rule.exts
                        .iter()
                        .map(|e| format!("{}.{e}", sample.key))
                        .collect::<Vec<_>>()
                        .join(" or ")
                )));
            };
            let name = || {
                format!(
                    "member `{}.{}` at byte offset {}",
                    sample.key, rule.exts[member.alt], member.offset
                )
            };
            if member.too_big {
                return Err(fail(format!(
                    "{} is larger than max_member_bytes={}",
                    name(),
                    sample.max_member_bytes
                )));
            }
            match rule.class {
                Class::Image | Class::Raw => views[f] = member.bytes,
                Class::Int => {
                    let value = parse_int(member.bytes).ok_or_else(|| {
                        let shown: String = String::from_utf8_lossy(
                            &member.bytes[..member.bytes.len().min(MAX_LABEL_TEXT)],
                        )
                        .into_owned();
                        fail(format!("{}: {shown:?} is not an integer label", name()))
                    })?;
                    int_at[f] = Some((scratch.len(), 8));
                    scratch.extend_from_slice(&value.to_ne_bytes());
                }
                Class::JsonBoxes | Class::JsonLabels => {
                    let start = scratch.len();
                    let boxes = rule.class == Class::JsonBoxes;
                    json_rows(member.bytes, boxes, scratch)
                        .map_err(|reason| fail(format!("{}: {reason}", name())))?;
                    int_at[f] = Some((start, scratch.len() - start));
                }
                Class::Npy => {
                    views[f] = npy_data(member.bytes, &self.specs[f].kind)
                        .map_err(|reason| fail(format!("{}: {reason}", name())))?;
                }
            }
        }
        let scratch: &'a [u8] = scratch;
        let mut out = Sample::default();
        for f in 0..self.rules.len() {
            match int_at[f] {
                Some((at, len)) => out.set(f, &scratch[at..at + len]),
                None => out.set(f, views[f]),
            }
        }
        Ok(out)
    }

    /// The field bytes of a sample from a [`ShardReader`](super::ShardReader). `index` and
    /// `what` name it in errors (the streaming engine's position and, say,
    /// [`StreamSample::describe`]).
    pub fn stream_sample<'a>(
        &self,
        sample: &'a StreamSample,
        index: u64,
        what: &dyn Fn() -> String,
        scratch: &'a mut Vec<u8>,
    ) -> Result<Sample<'a>> {
        let mut located = [None; MAX_FIELDS];
        for (f, slot) in located.iter_mut().enumerate().take(self.rules.len()) {
            *slot = self
                .locate(f, |ext| sample.members.iter().find(|m| m.ext == ext))
                .map(|(alt, m)| Located {
                    alt,
                    bytes: &m.data,
                    offset: m.offset,
                    too_big: false,
                });
        }
        let sample_ref = SampleRef {
            index,
            what,
            key: &sample.key,
            max_member_bytes: u64::MAX,
        };
        self.assemble(&located[..self.rules.len()], &sample_ref, scratch)
    }
}

/// The `boxes` (float32 rows of 4, `boxes`) or `labels` (int64) of a JSON member
/// (`{"boxes": [[x, y, w, h], ...], "labels": [3, ...]}`), appended to `out` as native-endian
/// bytes. Errors say which key, which entry and what is wrong.
fn json_rows(bytes: &[u8], boxes: bool, out: &mut Vec<u8>) -> std::result::Result<(), String> {
    let key = if boxes { "boxes" } else { "labels" };
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let object = value
        .as_object()
        .ok_or_else(|| format!("a JSON object with `{key}` was expected"))?;
    let list = object
        .get(key)
        .ok_or_else(|| format!("the JSON object has no `{key}` key"))?
        .as_array()
        .ok_or_else(|| format!("`{key}` is not a list"))?;
    if list.len() > MAX_JSON_ROWS {
        return Err(format!(
            "`{key}` has {} entries, more than {MAX_JSON_ROWS}",
            list.len()
        ));
    }
    for (i, entry) in list.iter().enumerate() {
        if boxes {
            let row = entry
                .as_array()
                .filter(|r| r.len() == 4)
                .ok_or_else(|| format!("`boxes[{i}]` is not a list of 4 numbers: {entry}"))?;
            for v in row {
                let x = v
                    .as_f64()
                    .ok_or_else(|| format!("`boxes[{i}]` holds {v}, not a number"))?;
                let x = x as f32;
                if !x.is_finite() {
                    return Err(format!("`boxes[{i}]` holds {v}, too large for float32"));
                }
                out.extend_from_slice(&x.to_ne_bytes());
            }
        } else {
            let label = entry
                .as_i64()
                .ok_or_else(|| format!("`labels[{i}]` is {entry}, not an integer"))?;
            out.extend_from_slice(&label.to_ne_bytes());
        }
    }
    Ok(())
}

/// An integer label as WebDataset writes it (`str(int)`, maybe with whitespace around).
fn parse_int(bytes: &[u8]) -> Option<i64> {
    if bytes.len() > MAX_LABEL_TEXT {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// The data of an `npy` member, checked against the field's dtype and shape.
fn npy_data<'a>(bytes: &'a [u8], kind: &FieldKind) -> std::result::Result<&'a [u8], String> {
    let header = parse_header(bytes)?;
    let (dtype, fits) = match kind {
        FieldKind::Tensor { dtype, shape } => (*dtype, header.shape == *shape),
        FieldKind::Ragged { dtype, inner_shape } => (
            *dtype,
            header.shape.len() == inner_shape.len() + 1 && header.shape[1..] == inner_shape[..],
        ),
        FieldKind::EncodedImage => return Err("not an npy field".into()),
    };
    if header.dtype != dtype || !fits {
        let expected = match kind {
            FieldKind::Ragged { inner_shape, .. } => format!("{dtype} [n, ...{inner_shape:?}]"),
            _ => format!(
                "{dtype} {:?}",
                match kind {
                    FieldKind::Tensor { shape, .. } => shape.clone(),
                    _ => Vec::new(),
                }
            ),
        };
        return Err(format!(
            "array is {} {:?} but the first sample's was {expected}{}",
            header.dtype,
            header.shape,
            if matches!(kind, FieldKind::Tensor { .. }) {
                "; set pad=VALUE or ragged=offsets to allow a varying leading dimension"
            } else {
                ""
            }
        ));
    }
    let elems = header
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or("shape overflows")?;
    let data = bytes.get(header.data_offset..).ok_or("truncated header")?;
    if data.len() != elems {
        return Err(format!(
            "{} bytes of data for {} {:?}, which needs {elems}",
            data.len(),
            header.dtype,
            header.shape
        ));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_fields_option() {
        assert_eq!(
            parse_fields("jpg;PNG:image, cls:label,.json:meta").unwrap(),
            [
                ("jpg;png".to_string(), "image".to_string()),
                ("cls".to_string(), "label".to_string()),
                ("json".to_string(), "meta".to_string())
            ]
        );
        for (bad, why) in [
            ("jpg", "not EXT:NAME"),
            ("jpg:", "field name"),
            (":x", "empty extension"),
            ("jpg:a,png:a", "named twice"),
            ("jpg;cls:x", "one kind"),
            ("a:b c", "field name"),
        ] {
            let e = parse_fields(bad).unwrap_err().to_string();
            assert!(e.contains("fields") && e.contains(why), "{bad}: {e}");
        }
        let nine: Vec<String> = (0..9).map(|i| format!("e{i}:f{i}")).collect();
        assert!(parse_fields(&nine.join(",")).is_err());
    }

    #[test]
    fn labels_parse_like_python_int() {
        assert_eq!(parse_int(b"42"), Some(42));
        assert_eq!(parse_int(b" -7\n"), Some(-7));
        assert_eq!(parse_int(b"+3"), Some(3));
        assert_eq!(parse_int(b"3.0"), None);
        assert_eq!(parse_int(b"cat"), None);
        assert_eq!(parse_int(b""), None);
        assert_eq!(parse_int(&[0xff, b'1']), None);
    }
}
