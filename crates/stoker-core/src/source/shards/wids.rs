//! WebDataset's shard index (`wids`): `tar:PATH_OR_URL.json` names a JSON file listing the
//! shards and their sample counts, as `widsindex create` writes it:
//!
//! ```json
//! {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "train",
//!  "shardlist": [{"url": "train-000.tar", "nsamples": 1000, "filesize": 104857600}, ...]}
//! ```
//!
//! Shard URLs relative to the index are resolved against its `base_path` when it has one
//! (itself relative to the index's directory), else the index's directory — WebDataset's rule.
//! The counts are what let a streaming reader of remote shards start before any shard is
//! downloaded (see [`crate::source::remote::feed`]); with local shards they are not needed and
//! the shards are indexed as usual.

use crate::error::{Error, Result};

/// The largest index file read (a listing of ten million shards is far below it).
pub const MAX_INDEX_BYTES: u64 = 1 << 30;

/// Whether `pattern` names a `wids` index rather than shards.
pub fn is_index(pattern: &str) -> bool {
    let path = pattern.split(['?', '#']).next().unwrap_or_default();
    !pattern.contains(',') && path.ends_with(".json")
}

/// The shards a `wids` index lists, in order, with their sample counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardList {
    /// Each shard's path or URL, resolved against the index's location.
    pub shards: Vec<String>,
    /// Samples in each shard, as the index says.
    pub counts: Vec<usize>,
}

/// Parses the index `text`, found at `location` (a path or URL: where relative shard URLs
/// start from).
pub fn parse(text: &[u8], location: &str) -> Result<ShardList> {
    let shown = crate::source::remote::shown_without_credentials(location);
    let bad = |reason: String| Error::format(&shown, format!("wids shard index: {reason}"));
    let doc: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    if let Some(version) = doc.get("wids_version") {
        if version.as_u64() != Some(1) {
            return Err(bad(format!("wids_version {version} (only 1 is read)")));
        }
    }
    let list = doc
        .get("shardlist")
        .and_then(|l| l.as_array())
        .ok_or_else(|| bad("no `shardlist` array".into()))?;
    if list.is_empty() {
        return Err(bad("the `shardlist` is empty".into()));
    }
    if list.len() > super::MAX_SHARDS {
        return Err(bad(format!(
            "{} shards listed (at most {})",
            list.len(),
            super::MAX_SHARDS
        )));
    }
    let dir = parent(location);
    let base = match doc.get("base_path").and_then(|b| b.as_str()) {
        Some(b) => join(&dir, b),
        None => dir,
    };
    let mut out = ShardList {
        shards: Vec::with_capacity(list.len()),
        counts: Vec::with_capacity(list.len()),
    };
    for (i, entry) in list.iter().enumerate() {
        let url = entry
            .get("url")
            .and_then(|u| u.as_str())
            .filter(|u| !u.is_empty())
            .ok_or_else(|| bad(format!("shard #{i} has no `url` string")))?;
        let count = entry
            .get("nsamples")
            .and_then(|n| n.as_u64())
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= u32::MAX as usize)
            .ok_or_else(|| {
                bad(format!(
                    "shard #{i} ({url}): `nsamples` is not a count (a whole number up to 2^32 - 1)"
                ))
            })?;
        out.shards.push(join(&base, url));
        out.counts.push(count);
    }
    Ok(out)
}

/// Reads an index file (at most [`MAX_INDEX_BYTES`]).
pub fn read_bounded(path: &std::path::Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let (file, _) = crate::source::open_file(path, "a shard index")?;
    let mut text = Vec::new();
    file.take(MAX_INDEX_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| Error::os(path, e))?;
    if text.len() as u64 > MAX_INDEX_BYTES {
        return Err(Error::format(
            path,
            format!("wids shard index: larger than {MAX_INDEX_BYTES} bytes"),
        ));
    }
    Ok(text)
}

/// The directory part of a path or URL (query and fragment dropped), `""` for a bare name.
fn parent(location: &str) -> String {
    let location = location.split(['?', '#']).next().unwrap_or_default();
    let after_scheme = location.find("://").map_or(0, |i| i + 3);
    match location[after_scheme..].rfind('/') {
        Some(i) => location[..after_scheme + i].to_owned(),
        None if after_scheme > 0 => location.to_owned(),
        None => String::new(),
    }
}

/// `name` resolved against `base`: absolute paths and URLs as they are.
fn join(base: &str, name: &str) -> String {
    if name.starts_with('/') || crate::source::remote::is_url(name) || base.is_empty() {
        return name.to_owned();
    }
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        name.trim_start_matches("./")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const INDEX: &str = r#"{"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "t",
        "shardlist": [{"url": "train-0.tar", "nsamples": 3, "filesize": 10240},
                      {"url": "s3://other/b.tar", "nsamples": 0, "filesize": 1024}]}"#;

    #[test]
    fn shards_resolve_against_the_index_location() {
        let list = parse(INDEX.as_bytes(), "https://h:8/data/train.json?sig=x").unwrap();
        assert_eq!(
            list.shards,
            ["https://h:8/data/train-0.tar", "s3://other/b.tar"]
        );
        assert_eq!(list.counts, [3, 0]);
        let local = parse(INDEX.as_bytes(), "/d/train.json").unwrap();
        assert_eq!(local.shards[0], "/d/train-0.tar");
        let bare = parse(INDEX.as_bytes(), "train.json").unwrap();
        assert_eq!(bare.shards[0], "train-0.tar");
        let based = parse(
            br#"{"base_path": "shards", "shardlist": [{"url": "a.tar", "nsamples": 1}]}"#,
            "s3://b/x/i.json",
        )
        .unwrap();
        assert_eq!(based.shards, ["s3://b/x/shards/a.tar"]);
    }

    #[test]
    fn malformed_indexes_are_refused_with_the_reason() {
        for (text, reason) in [
            ("[", "not JSON"),
            ("{}", "no `shardlist`"),
            (r#"{"shardlist": []}"#, "empty"),
            (
                r#"{"wids_version": 2, "shardlist": [{"url": "a", "nsamples": 1}]}"#,
                "wids_version 2",
            ),
            (
                r#"{"shardlist": [{"nsamples": 1}]}"#,
                "shard #0 has no `url`",
            ),
            (
                r#"{"shardlist": [{"url": "a", "nsamples": -1}]}"#,
                "`nsamples` is not a count",
            ),
            (
                r#"{"shardlist": [{"url": "a", "nsamples": 1e12}]}"#,
                "`nsamples` is not a count",
            ),
        ] {
            let e = parse(text.as_bytes(), "https://u:secret@h/i.json")
                .unwrap_err()
                .to_string();
            assert!(e.contains(reason), "{text}: {e}");
            assert!(
                e.contains("https://h/i.json") && !e.contains("secret"),
                "{e}"
            );
        }
    }

    #[test]
    fn only_json_names_are_indexes() {
        assert!(is_index("https://h/train.json"));
        assert!(is_index("/d/train.json"));
        assert!(!is_index("/d/train-{0..3}.tar"));
        assert!(!is_index("a.json,b.tar"));
    }
}
