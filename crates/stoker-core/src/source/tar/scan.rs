//! Members of a tar shard, and WebDataset's rule for grouping them into samples.
//!
//! The `tar` crate parses the headers (ustar, GNU long names, pax extended headers, the header
//! checksum, base-256 sizes): those formats have enough corner cases that a well-kept parser is
//! worth more than the few hundred lines it saves. Over a `Cursor<&[u8]>` of the mapped shard
//! with `entries_with_seek`, it only reads headers; member data is never copied, we keep its
//! offset (`raw_file_position`) and size.
//!
//! Grouping follows `webdataset.tariterators` exactly:
//! - only regular files count (directories, links, pax global headers are skipped), and so do
//!   WebDataset's metadata members (`__name__` at the top level, `__x__/...`);
//! - a member path splits into key and extension at the first dot of its basename
//!   (`a/b/000123.seg.png` → key `a/b/000123`, extension `seg.png`), the extension lower-cased;
//!   a path without a dot in its basename is skipped; (the regex's corner case for a basename
//!   starting with a dot is kept too, see [`split_key`]);
//! - consecutive members with the same key form one sample; a member whose key differs starts
//!   the next one; a second member with the same key and extension is an error (WebDataset 1.x
//!   raises "duplicate file name in tar file"; older versions started a new sample).
//!
//! A shard must end with an end-of-archive block (GNU tar and Python's `tarfile` write two, GNU
//! tar accepts one): a shard that stops at a member boundary without one was cut short, most
//! often by an interrupted copy, and is reported as truncated instead of read silently short.

use std::io::Cursor;

use crate::error::{Error, Result};

/// Tar block size: headers are one block, member data is padded to a whole number of blocks.
pub(super) const BLOCK: u64 = 512;

/// The most members one sample may have (WebDataset samples have a handful); bounds the memory
/// a malformed shard can make a reader hold for one sample.
pub const MAX_MEMBERS_PER_SAMPLE: usize = 1024;

/// One regular-file member of a sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedMember {
    /// The extension, lower-cased, without the leading dot (`jpg`, `seg.png`).
    pub ext: String,
    /// Byte offset of the member's data in the shard.
    pub offset: u64,
    /// Bytes of the member's data.
    pub size: u64,
}

/// One sample: consecutive members sharing a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedSample {
    /// The WebDataset key shared by its members.
    pub key: String,
    /// Byte offset of the tar header of the sample's first member.
    pub offset: u64,
    /// The sample's members, in tar order.
    pub members: Vec<ScannedMember>,
}

/// Splits a member path into WebDataset's key and extension (not yet lower-cased), or `None`
/// when the member belongs to no sample.
///
/// This is `re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", path)`: the key runs to the first dot of
/// the basename. The regex's corner case is kept: for a basename that starts with a dot
/// (`dir/.x.jpg`) the key is the directory with its slash (`dir/`) when that directory's name
/// has no dot, and such a member at the top level has no key.
pub fn split_key(path: &str) -> Option<(&str, &str)> {
    let base_start = path.rfind('/').map_or(0, |i| i + 1);
    let base = &path[base_start..];
    let dot = base.find('.')?;
    if dot > 0 {
        let cut = base_start + dot;
        return Some((&path[..cut], &path[cut + 1..]));
    }
    // Basename starts with a dot: `[^.]+` must reach back over the last directory and its '/'.
    if base_start == 0 {
        return None;
    }
    let dir_start = path[..base_start - 1].rfind('/').map_or(0, |i| i + 1);
    if path[dir_start..base_start].contains('.') {
        return None;
    }
    Some((&path[..base_start], &path[base_start + 1..]))
}

/// WebDataset's metadata members, skipped: `__x__` at the top level (no `/`), or any path
/// matching `re.match(r"__[^/]*__($|/)")`.
pub(super) fn is_meta(path: &str) -> bool {
    if !path.contains('/') && path.len() >= 4 && path.starts_with("__") && path.ends_with("__") {
        return true;
    }
    let Some(rest) = path.strip_prefix("__") else {
        return false;
    };
    let first = rest.split('/').next().unwrap_or("");
    // `__[^/]*__` followed by end or '/': the first component must end with "__".
    first.len() >= 2 && first.ends_with("__")
}

/// Samples being assembled from members in archive order (the WebDataset grouping rule).
pub(super) struct Grouper<M> {
    current: Option<Group<M>>,
}

#[derive(Debug)]
pub(super) struct Group<M> {
    pub key: String,
    pub offset: u64,
    /// Members as (lower-cased extension, payload).
    pub members: Vec<(String, M)>,
}

impl<M> Grouper<M> {
    pub fn new() -> Self {
        Grouper { current: None }
    }

    /// Adds a member; returns the previous sample when this member starts a new one. `Err` is
    /// the reason when the member repeats an extension of its sample or the sample has too many
    /// members.
    pub fn push(
        &mut self,
        key: &str,
        ext: String,
        header_offset: u64,
        member: M,
    ) -> std::result::Result<Option<Group<M>>, String> {
        let continues = self.current.as_ref().is_some_and(|g| g.key == key);
        let done = if continues {
            None
        } else {
            self.current.replace(Group {
                key: key.to_owned(),
                offset: header_offset,
                members: Vec::new(),
            })
        };
        let group = self.current.as_mut().expect("a current group was just set");
        if group.members.iter().any(|(e, _)| *e == ext) {
            return Err(format!(
                "sample `{key}` has a second `{ext}` member (WebDataset rejects duplicate file names)"
            ));
        }
        if group.members.len() == MAX_MEMBERS_PER_SAMPLE {
            return Err(format!(
                "sample `{key}` has more than {MAX_MEMBERS_PER_SAMPLE} members"
            ));
        }
        group.members.push((ext, member));
        Ok(done)
    }

    pub fn finish(&mut self) -> Option<Group<M>> {
        self.current.take()
    }
}

/// The name a message gives the member before a position: `after member `x``, or the start.
pub(super) fn after(prev: &Option<String>) -> String {
    match prev {
        Some(name) => format!("after member `{name}`"),
        None => "at the start of the shard".to_owned(),
    }
}

/// Rounds a member's data end up to the next header.
pub(super) fn next_header(data_end: u64) -> Option<u64> {
    data_end.checked_add(BLOCK - 1).map(|v| v & !(BLOCK - 1))
}

/// Lists every sample of an in-memory tar shard. `shard` names it in errors.
///
/// Pure (no I/O), so it doubles as a fuzz target: for any `bytes` it returns samples whose every
/// member lies inside `bytes`, or an error naming the shard, the member (or what precedes it) and
/// the byte offset.
pub fn scan_members(shard: &str, bytes: &[u8]) -> Result<Vec<ScannedSample>> {
    let fail = |reason: String| Error::format(shard, reason);
    let len = bytes.len() as u64;
    let mut archive = ::tar::Archive::new(Cursor::new(bytes));
    let entries = archive
        .entries_with_seek()
        .map_err(|e| fail(format!("cannot read as tar: {e}")))?;
    // Where the next header (or extension header) starts, and the last member seen.
    let mut end = 0u64;
    let mut prev: Option<String> = None;
    let mut grouper: Grouper<ScannedMember> = Grouper::new();
    let mut samples = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| fail(header_error(bytes, end, &prev, &e)))?;
        let header_at = entry.raw_header_position();
        let data_at = entry.raw_file_position();
        let size = entry.size();
        let name_bytes = entry.path_bytes();
        let name = std::str::from_utf8(&name_bytes).map_err(|_| {
            fail(format!(
                "member name {:?} at byte offset {header_at} is not UTF-8",
                String::from_utf8_lossy(&name_bytes)
            ))
        })?;
        let data_end = data_at
            .checked_add(size)
            .filter(|&e| e <= len)
            .ok_or_else(|| {
                fail(format!(
                    "member `{name}` is cut short: its {size} bytes at byte offset {data_at} run past the end of the shard ({len} bytes)"
                ))
            })?;
        end = next_header(data_end).ok_or_else(|| fail("size overflow".into()))?;
        let kind = entry.header().entry_type();
        if kind.is_gnu_sparse() {
            return Err(fail(format!(
                "member `{name}` at byte offset {header_at} is a GNU sparse file, which is not supported"
            )));
        }
        let regular = kind.is_file() || kind.is_contiguous();
        prev = Some(name.to_owned());
        if !regular || is_meta(name) {
            continue;
        }
        let Some((key, ext)) = split_key(name) else {
            continue;
        };
        let member = ScannedMember {
            ext: ext.to_lowercase(),
            offset: data_at,
            size,
        };
        let ext = member.ext.clone();
        let done = grouper
            .push(key, ext, header_at, member)
            .map_err(|reason| {
                fail(format!(
                    "member `{name}` at byte offset {header_at}: {reason}"
                ))
            })?;
        if let Some(group) = done {
            samples.push(to_sample(group));
        }
    }
    check_end_marker(bytes, end, &prev).map_err(fail)?;
    if let Some(group) = grouper.finish() {
        samples.push(to_sample(group));
    }
    Ok(samples)
}

fn to_sample(group: Group<ScannedMember>) -> ScannedSample {
    ScannedSample {
        key: group.key,
        offset: group.offset,
        members: group.members.into_iter().map(|(_, m)| m).collect(),
    }
}

/// The end-of-archive rule: a zero block where the next header would be.
fn check_end_marker(
    bytes: &[u8],
    end: u64,
    prev: &Option<String>,
) -> std::result::Result<(), String> {
    let len = bytes.len() as u64;
    let block = usize::try_from(end)
        .ok()
        .and_then(|s| bytes.get(s..s.checked_add(BLOCK as usize)?));
    match block {
        Some(b) if b.iter().all(|&x| x == 0) => Ok(()),
        // The crate stops only at EOF or a zero block, so anything else is a short shard.
        _ => Err(format!(
            "truncated: no end-of-archive block at byte offset {end} {} (the shard has {len} bytes)",
            after(prev)
        )),
    }
}

/// ` for member `NAME`` from a raw header's 100-byte name field, if it reads as a name.
pub(super) fn name_hint(field: &[u8]) -> String {
    let field = &field[..field.iter().position(|&b| b == 0).unwrap_or(field.len())];
    match std::str::from_utf8(field) {
        Ok(name) if !name.is_empty() && !name.contains(char::is_control) => {
            format!(" for member `{name}`")
        }
        _ => String::new(),
    }
}

/// Explains a header the crate rejected at or after byte `at`.
fn header_error(bytes: &[u8], at: u64, prev: &Option<String>, err: &std::io::Error) -> String {
    let len = bytes.len() as u64;
    if at.saturating_add(BLOCK) > len {
        return format!(
            "truncated: the shard ends inside the tar header at byte offset {at} {} (the shard has {len} bytes)",
            after(prev)
        );
    }
    // The header's own name field, when readable, says which member it was meant to be.
    let start = at as usize;
    let hint = name_hint(&bytes[start..start + 100]);
    format!(
        "bad tar header{hint} at byte offset {at} {}: {err}",
        after(prev)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_key_follows_webdataset_regex() {
        let cases: &[(&str, Option<(&str, &str)>)] = &[
            ("000123.jpg", Some(("000123", "jpg"))),
            ("a/b/000123.seg.png", Some(("a/b/000123", "seg.png"))),
            ("a.b/c.d/x.y.z", Some(("a.b/c.d/x", "y.z"))),
            ("noext", None),
            ("dir/noext", None),
            ("dir.x/noext", None),
            (".hidden.jpg", None),
            ("dir/.hidden.jpg", Some(("dir/", "hidden.jpg"))),
            ("a/dir/.h", Some(("a/dir/", "h"))),
            ("a.b/.h", None),
            ("x.", Some(("x", ""))),
        ];
        for (path, want) in cases {
            assert_eq!(split_key(path), *want, "{path}");
        }
    }

    #[test]
    fn meta_members_are_recognised() {
        for m in ["__meta__", "__x__/a.json", "____"] {
            assert!(is_meta(m), "{m}");
        }
        for m in ["__key__.txt", "a/__meta__", "__x", "_a_.jpg", "__x/y__"] {
            assert!(!is_meta(m), "{m}");
        }
    }

    #[test]
    fn grouping_splits_on_key_change_and_rejects_repeats() {
        let mut g: Grouper<u32> = Grouper::new();
        let mut done = Vec::new();
        for (i, (k, e)) in [("a", "jpg"), ("a", "cls"), ("b", "jpg"), ("a", "cls")]
            .iter()
            .enumerate()
        {
            if let Some(s) = g.push(k, e.to_string(), i as u64, i as u32).unwrap() {
                done.push(s);
            }
        }
        done.extend(g.finish());
        let seen: Vec<(String, u64, Vec<u32>)> = done
            .into_iter()
            .map(|s| {
                (
                    s.key,
                    s.offset,
                    s.members.into_iter().map(|m| m.1).collect(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("a".to_string(), 0, vec![0, 1]),
                ("b".to_string(), 2, vec![2]),
                ("a".to_string(), 3, vec![3]),
            ]
        );
        let mut g: Grouper<u32> = Grouper::new();
        g.push("a", "jpg".into(), 0, 0).unwrap();
        let e = g.push("a", "jpg".into(), 1, 1).unwrap_err();
        assert!(e.contains("second `jpg`"), "{e}");
    }

    /// A one-block ustar header for a regular file.
    fn header(name: &str, size: usize) -> Vec<u8> {
        let mut h = ::tar::Header::new_ustar();
        h.set_path(name).unwrap();
        h.set_size(size as u64);
        h.set_mode(0o644);
        h.set_entry_type(::tar::EntryType::Regular);
        h.set_cksum();
        h.as_bytes().to_vec()
    }

    fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in members {
            out.extend(header(name, data.len()));
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.extend([0u8; 1024]);
        out
    }

    #[test]
    fn scans_offsets_without_copying() {
        let bytes = tar_of(&[
            ("s/0001.JPG", b"jpeg-0"),
            ("s/0001.cls", b"3"),
            ("s/0002.jpg", b"jpeg-two"),
            ("dir.d/README", b"not a member of any sample"),
            ("s/0002.cls", b"4"),
        ]);
        let samples = scan_members("mem.tar", &bytes).unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].key, "s/0001");
        assert_eq!(samples[0].offset, 0);
        let m = &samples[0].members[0];
        assert_eq!(m.ext, "jpg");
        assert_eq!(
            &bytes[m.offset as usize..(m.offset + m.size) as usize],
            b"jpeg-0"
        );
        // The README belongs to no sample and, as in WebDataset, does not split s/0002.
        assert_eq!(samples[1].key, "s/0002");
        let exts: Vec<&str> = samples[1].members.iter().map(|m| m.ext.as_str()).collect();
        assert_eq!(exts, ["jpg", "cls"]);
    }

    #[test]
    fn empty_and_garbage_inputs_are_errors() {
        let e = scan_members("e.tar", b"").unwrap_err().to_string();
        assert!(
            e.contains("e.tar") && e.contains("truncated") && e.contains("offset 0"),
            "{e}"
        );
        let e = scan_members("g.tar", &[7u8; 1024]).unwrap_err().to_string();
        assert!(e.contains("g.tar") && e.contains("byte offset 0"), "{e}");
        // Only end-of-archive blocks: a valid empty archive.
        assert!(scan_members("z.tar", &[0u8; 1024]).unwrap().is_empty());
    }
}
