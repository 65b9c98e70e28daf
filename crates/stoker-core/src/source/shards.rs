//! Shard patterns: `train-{000000..000146}.tar`, `a.tar,b.tar`, `shards/*.tar`, URLs.
//!
//! The rules are WebDataset's, which uses Python's `braceexpand`:
//!
//! - `{a,b,c}` expands to each alternative, in order; braces nest and a pattern may have several
//!   (`{a,b}-{0..2}` is `a-0 a-1 a-2 b-0 b-1 b-2`).
//! - `{X..Y}` and `{X..Y..STEP}` are integer ranges, inclusive, ascending or descending. When
//!   either bound (other than a bare `0`) has a leading zero, every number is zero-padded to the
//!   width of the longer bound, so `{000000..000146}` keeps six digits.
//! - `\` escapes the next character (`\{`, `\,`).
//! - Commas outside braces separate whole patterns: `a.tar,b-{0..3}.tar`.
//!
//! Unlike `braceexpand`, a brace with neither `,` nor `..` (`{abc}`), an unbalanced brace or a
//! malformed range (`{0...9}`) is an error rather than literal text: in a shard list it is
//! almost always a typo.
//!
//! After brace expansion, a local path containing `*`, `?` or `[` is a glob (the `glob` crate,
//! shell rules: `*` does not cross `/` or match a leading dot), sorted; a glob matching nothing
//! is an error. URLs (`https://`, `http://`, `s3://`, `gs://`, `az://`, `file://`) are kept as
//! strings, never globbed.
//!
//! A pattern ending in `.json` is a WebDataset shard index instead ([`wids`]): the shards it
//! lists, with their sample counts.
//!
//! These are the shard lists of every sharded source: tar (indexed and streaming) and packed.
//!
//! The expanded list is bounded ([`MAX_SHARDS`]) before anything is allocated, so a pattern like
//! `{0..99999999999}` fails at once with an error naming it.

pub mod wids;

use crate::error::{Error, Result};
use crate::source::remote::is_url;

/// The most shard names one pattern may expand to.
pub const MAX_SHARDS: usize = 10_000_000;

/// The local shard files `pattern` expands to: local paths as they are, `file://` URLs as
/// paths, remote URLs downloaded into the cache (see [`crate::source::remote`]; refused in a
/// build without the `remote` feature). With `skip_failed` (`on_error=skip`), a remote shard
/// that cannot be fetched is left out and named in `skipped`.
pub fn resolve_shards(
    pattern: &str,
    remote: &crate::source::remote::RemoteConfig,
    skip_failed: bool,
) -> Result<crate::source::remote::ResolvedShards> {
    let (names, _) = shard_names(pattern, remote)?;
    crate::source::remote::resolve(names, remote, skip_failed)
}

/// The shards `pattern` stands for: its expansion, or the shards a WebDataset `wids` index
/// lists (`….json`, see [`wids`]; a remote index is fetched through the cache first),
/// then with each shard's sample count.
pub fn shard_names(
    pattern: &str,
    remote: &crate::source::remote::RemoteConfig,
) -> Result<(Vec<String>, Option<Vec<usize>>)> {
    if !wids::is_index(pattern) {
        return Ok((expand_shards(pattern)?, None));
    }
    let local = pattern.strip_prefix("file://").unwrap_or(pattern);
    let text = if is_url(local) {
        let fetched = crate::source::remote::resolve(vec![pattern.to_owned()], remote, false)?;
        let path = fetched
            .paths
            .first()
            .ok_or_else(|| Error::Internal(format!("the shard index {pattern} was not fetched")))?;
        wids::read_bounded(path)?
    } else {
        wids::read_bounded(std::path::Path::new(local))?
    };
    let list = wids::parse(&text, pattern)?;
    Ok((list.shards, Some(list.counts)))
}

/// The local files `pattern` expands to, for readers of local files only (packed shards):
/// `file://` URLs are local paths; any other URL is refused (`Unsupported`, naming it).
pub fn local_shards(pattern: &str) -> Result<Vec<std::path::PathBuf>> {
    let mut paths = Vec::new();
    for name in expand_shards(pattern)? {
        if let Some(local) = name.strip_prefix("file://") {
            paths.push(std::path::PathBuf::from(local));
        } else if is_url(&name) {
            return Err(Error::Unsupported(format!(
                "`{name}`: packed shards are read from local files only (tar: shards may be URLs)"
            )));
        } else {
            paths.push(std::path::PathBuf::from(name));
        }
    }
    Ok(paths)
}

/// Expands a shard pattern into shard paths or URLs, in order.
pub fn expand_shards(spec: &str) -> Result<Vec<String>> {
    let bad = |reason: String| Error::InvalidArgument(format!("shard pattern `{spec}`: {reason}"));
    let parts = split_top_level(spec).map_err(bad)?;
    let mut nodes = Vec::with_capacity(parts.len());
    for part in &parts {
        if part.is_empty() {
            return Err(bad("empty entry in the comma-separated list".into()));
        }
        nodes.push(parse_seq(part).map_err(bad)?);
    }
    let total = nodes
        .iter()
        .fold(0u128, |acc, n| acc.saturating_add(seq_count(n)));
    if total > MAX_SHARDS as u128 {
        return Err(bad(format!(
            "expands to {total} names, more than the limit of {MAX_SHARDS}"
        )));
    }
    let mut expanded = Vec::with_capacity(total as usize);
    for node in &nodes {
        expand_from(node, String::new(), &mut expanded);
    }
    let mut out = Vec::with_capacity(expanded.len());
    for name in expanded {
        if !is_url(&name) && name.contains(['*', '?', '[']) {
            let matched = glob_local(&name).map_err(bad)?;
            if out.len() + matched.len() > MAX_SHARDS {
                return Err(bad(format!("matches more than {MAX_SHARDS} files")));
            }
            out.extend(matched);
        } else {
            out.push(name);
        }
    }
    Ok(out)
}

fn glob_local(pattern: &str) -> std::result::Result<Vec<String>, String> {
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        // Shell behaviour; it also keeps the hidden `.NAME.idx` index files out of `*`.
        require_literal_leading_dot: true,
    };
    let paths = glob::glob_with(pattern, options).map_err(|e| format!("glob `{pattern}`: {e}"))?;
    let mut found = Vec::new();
    for path in paths {
        let path = path.map_err(|e| format!("glob `{pattern}`: {e}"))?;
        let name = path
            .into_os_string()
            .into_string()
            .map_err(|p| format!("glob `{pattern}` matched a non-UTF-8 path {p:?}"))?;
        found.push(name);
        if found.len() > MAX_SHARDS {
            return Err(format!(
                "glob `{pattern}` matches more than {MAX_SHARDS} files"
            ));
        }
    }
    if found.is_empty() {
        return Err(format!("glob `{pattern}` matches no file"));
    }
    found.sort();
    Ok(found)
}

/// Splits at commas outside braces (escapes honoured, kept for the brace parser).
fn split_top_level(spec: &str) -> std::result::Result<Vec<String>, String> {
    let mut parts = vec![String::new()];
    let mut depth = 0usize;
    let mut chars = spec.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let last = parts.last_mut().expect("parts is never empty");
                last.push('\\');
                if let Some(next) = chars.next() {
                    last.push(next);
                }
                continue;
            }
            '{' => depth += 1,
            '}' => depth = depth.checked_sub(1).ok_or("unbalanced `}`")?,
            ',' if depth == 0 => {
                parts.push(String::new());
                continue;
            }
            _ => {}
        }
        parts.last_mut().expect("parts is never empty").push(c);
    }
    if depth != 0 {
        return Err("unbalanced `{`".into());
    }
    Ok(parts)
}

/// A parsed pattern: a sequence of pieces, each a literal or a brace.
#[derive(Debug)]
enum Piece {
    Literal(String),
    /// `{a,b,...}`: each alternative is itself a sequence.
    Alternatives(Vec<Vec<Piece>>),
    /// `{first..last..step}` with `width`-digit zero padding (0 = none).
    Range {
        first: i128,
        last: i128,
        step: i128,
        width: usize,
    },
}

impl Piece {
    fn count(&self) -> u128 {
        match self {
            Piece::Literal(_) => 1,
            Piece::Alternatives(alts) => alts
                .iter()
                .fold(0u128, |acc, a| acc.saturating_add(seq_count(a))),
            Piece::Range {
                first, last, step, ..
            } => ((*last - *first).unsigned_abs() / step.unsigned_abs()) + 1,
        }
    }
}

fn seq_count(seq: &[Piece]) -> u128 {
    seq.iter()
        .fold(1u128, |acc, p| acc.saturating_mul(p.count()))
}

/// Appends every expansion of `seq` after `prefix`, in braceexpand's order.
fn expand_from(seq: &[Piece], mut prefix: String, out: &mut Vec<String>) {
    let Some((head, rest)) = seq.split_first() else {
        out.push(prefix);
        return;
    };
    match head {
        Piece::Literal(text) => {
            prefix.push_str(text);
            expand_from(rest, prefix, out);
        }
        Piece::Alternatives(alts) => {
            for alt in alts {
                let mut heads = Vec::new();
                expand_from(alt, prefix.clone(), &mut heads);
                for h in heads {
                    expand_from(rest, h, out);
                }
            }
        }
        Piece::Range {
            first,
            last,
            step,
            width,
        } => {
            let step = if first <= last { *step } else { -*step };
            let mut n = *first;
            loop {
                let digits = format!("{:0width$}", n.unsigned_abs(), width = *width);
                let number = if n < 0 { format!("-{digits}") } else { digits };
                expand_from(rest, format!("{prefix}{number}"), out);
                if n == *last {
                    break;
                }
                n += step;
                if (step > 0 && n > *last) || (step < 0 && n < *last) {
                    break;
                }
            }
        }
    }
}

/// Parses one comma-free (at top level) pattern into pieces.
fn parse_seq(text: &str) -> std::result::Result<Vec<Piece>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut at = 0;
    let seq = parse_until(&chars, &mut at, false)?;
    Ok(seq)
}

/// Parses pieces from `chars[*at..]` until the end, or (inside a brace) until a top-level `,`
/// or `}` which is left for the caller.
fn parse_until(
    chars: &[char],
    at: &mut usize,
    in_brace: bool,
) -> std::result::Result<Vec<Piece>, String> {
    let mut seq = Vec::new();
    let mut literal = String::new();
    while *at < chars.len() {
        let c = chars[*at];
        match c {
            '\\' => {
                *at += 1;
                if let Some(&next) = chars.get(*at) {
                    literal.push(next);
                    *at += 1;
                }
            }
            ',' | '}' if in_brace => break,
            '}' => return Err("unbalanced `}`".into()),
            '{' => {
                if !literal.is_empty() {
                    seq.push(Piece::Literal(std::mem::take(&mut literal)));
                }
                seq.push(parse_brace(chars, at)?);
            }
            _ => {
                literal.push(c);
                *at += 1;
            }
        }
    }
    if !literal.is_empty() {
        seq.push(Piece::Literal(literal));
    }
    Ok(seq)
}

/// Parses a brace starting at `chars[*at] == '{'`, leaving `*at` after its `}`.
fn parse_brace(chars: &[char], at: &mut usize) -> std::result::Result<Piece, String> {
    let open = *at;
    *at += 1;
    // A range has no nested brace, comma or escape: try it on the raw text up to the next `}`.
    if let Some(len) = chars[*at..].iter().position(|&c| c == '}') {
        let body: String = chars[*at..*at + len].iter().collect();
        if body.contains("..") && !body.contains([',', '{', '\\']) {
            *at += len + 1;
            return parse_range(&body);
        }
    }
    let mut alts = Vec::new();
    loop {
        alts.push(parse_until(chars, at, true)?);
        match chars.get(*at) {
            Some(',') => *at += 1,
            Some('}') => {
                *at += 1;
                break;
            }
            _ => return Err("unbalanced `{`".into()),
        }
    }
    if alts.len() < 2 {
        let body: String = chars[open..*at].iter().collect();
        return Err(format!(
            "brace `{body}` has neither `,` (alternatives) nor `..` (a range)"
        ));
    }
    Ok(Piece::Alternatives(alts))
}

/// `X..Y` or `X..Y..STEP` with integer bounds.
fn parse_range(body: &str) -> std::result::Result<Piece, String> {
    let malformed = || format!("range `{{{body}}}` is not X..Y or X..Y..STEP with integers");
    let parts: Vec<&str> = body.split("..").collect();
    let (a, b, step) = match parts.as_slice() {
        [a, b] => (*a, *b, None),
        [a, b, s] => (*a, *b, Some(*s)),
        _ => return Err(malformed()),
    };
    // 30 digits keeps every value (and their difference) well inside i128.
    let int = |s: &str| -> Option<i128> {
        let digits = s.strip_prefix('-').unwrap_or(s);
        if digits.is_empty() || digits.len() > 30 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let first = int(a).ok_or_else(malformed)?;
    let last = int(b).ok_or_else(malformed)?;
    let step = match step {
        None => 1,
        Some(s) => int(s).ok_or_else(malformed)?.abs(),
    };
    if step == 0 {
        return Err(format!("range `{{{body}}}` has a step of 0"));
    }
    // braceexpand: pad when a bound other than "0"/"-0" starts with a zero.
    let padded = [a, b]
        .iter()
        .any(|s| !matches!(*s, "0" | "-0") && (s.starts_with('0') || s.starts_with("-0")));
    let width = if padded { a.len().max(b.len()) } else { 0 };
    let count = (last - first).unsigned_abs() / step as u128 + 1;
    if count > MAX_SHARDS as u128 {
        return Err(format!(
            "range `{{{body}}}` has {count} values, more than the limit of {MAX_SHARDS}"
        ));
    }
    Ok(Piece::Range {
        first,
        last,
        step,
        width,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(spec: &str) -> Vec<String> {
        expand_shards(spec).unwrap_or_else(|e| panic!("{spec}: {e}"))
    }

    fn err(spec: &str) -> String {
        match expand_shards(spec) {
            Ok(v) => panic!("{spec} expanded to {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn numeric_ranges_keep_zero_padding() {
        let v = ok("train-{000000..000146}.tar");
        assert_eq!(v.len(), 147);
        assert_eq!(v[0], "train-000000.tar");
        assert_eq!(v[146], "train-000146.tar");
        assert_eq!(ok("s{8..11}"), ["s8", "s9", "s10", "s11"]);
        assert_eq!(ok("s{08..11}"), ["s08", "s09", "s10", "s11"]);
        // Only one padded bound is enough, as in braceexpand.
        assert_eq!(ok("s{0..2}"), ["s0", "s1", "s2"]);
        assert_eq!(ok("s{7..010}"), ["s007", "s008", "s009", "s010"]);
        assert_eq!(ok("s{3..1}"), ["s3", "s2", "s1"]);
        assert_eq!(ok("s{0..10..5}"), ["s0", "s5", "s10"]);
        assert_eq!(ok("s{10..0..4}"), ["s10", "s6", "s2"]);
    }

    #[test]
    fn alternatives_nesting_and_several_braces() {
        assert_eq!(ok("{a,b}.tar"), ["a.tar", "b.tar"]);
        assert_eq!(
            ok("{a,b}-{0..1}.tar"),
            ["a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"]
        );
        assert_eq!(ok("x{a,b{1..2},}y"), ["xay", "xb1y", "xb2y", "xy"]);
        assert_eq!(ok(r"a\{b\}\,c"), ["a{b},c"]);
    }

    #[test]
    fn top_level_commas_split_but_commas_in_braces_do_not() {
        assert_eq!(
            ok("a.tar,b-{0,1}.tar,c{2..3}.tar"),
            ["a.tar", "b-0.tar", "b-1.tar", "c2.tar", "c3.tar"]
        );
        assert!(err("a.tar,,b.tar").contains("empty entry"));
    }

    #[test]
    fn urls_are_kept_and_not_globbed() {
        assert_eq!(
            ok("https://h/x/{0..1}.tar?sig=*,s3://b/k-[0].tar,gs://b/*,az://c/d,file:///x/*.tar"),
            [
                "https://h/x/0.tar?sig=*",
                "https://h/x/1.tar?sig=*",
                "s3://b/k-[0].tar",
                "gs://b/*",
                "az://c/d",
                "file:///x/*.tar"
            ]
        );
    }

    #[test]
    fn globs_are_sorted_and_must_match() {
        let dir = std::env::temp_dir().join(format!("stoker-pattern-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["b-2.tar", "a-1.tar", "a-0.tar", ".a-9.tar", "c.txt"] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let d = dir.display();
        assert_eq!(
            ok(&format!("{d}/*.tar")),
            [
                format!("{d}/a-0.tar"),
                format!("{d}/a-1.tar"),
                format!("{d}/b-2.tar")
            ]
        );
        assert_eq!(
            ok(&format!("{d}/{{a,b}}-?.tar")),
            [
                format!("{d}/a-0.tar"),
                format!("{d}/a-1.tar"),
                format!("{d}/b-2.tar")
            ]
        );
        assert_eq!(ok(&format!("{d}/a-[1].tar")), [format!("{d}/a-1.tar")]);
        let e = err(&format!("{d}/*.tgz"));
        assert!(e.contains("matches no file") && e.contains("*.tgz"), "{e}");
        // A path without glob characters is kept even if it does not exist (open reports it).
        assert_eq!(ok(&format!("{d}/nope.tar")), [format!("{d}/nope.tar")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn malformed_patterns_are_errors_naming_the_pattern() {
        for (spec, what) in [
            ("a{0..3.tar", "unbalanced `{`"),
            ("a}b", "unbalanced `}`"),
            ("a{x}b", "neither"),
            ("a{0...9}", "not X..Y"),
            ("a{0..x}", "not X..Y"),
            ("a{0..9..0}", "step of 0"),
        ] {
            let e = err(spec);
            assert!(e.contains(spec) && e.contains(what), "{spec}: {e}");
        }
    }

    #[test]
    fn expansion_is_bounded_before_allocating() {
        let e = err("s{0..99999999999}.tar");
        assert!(
            e.contains("more than the limit") && e.contains("s{0..99999999999}"),
            "{e}"
        );
        // Each range is small but the product is not.
        let e = err("{0..9999}{0..9999}");
        assert!(e.contains("expands to 100000000 names"), "{e}");
        let e = err(&"{0..99}".repeat(30));
        assert!(e.contains("more than the limit"), "{e}");
        // Exactly at a moderate size is fine.
        assert_eq!(ok("{0..999}{0..99}").len(), 100_000);
    }
}
