//! WebDataset tar shards: shards written by Python's `webdataset.TarWriter` (committed fixtures,
//! see `tests/data/tar/make_fixtures.py`) and by GNU `tar` (made here, in gnu and pax formats)
//! read identically, in indexed and streaming mode; the index cache; every corrupt-shard case.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use stoker_core::source::tar::{
    read_samples, IndexOrigin, ReadOptions, ShardReader, StreamSample, TarConfig, TarFields,
    TarSource,
};
use stoker_core::source::{FieldKind, Source};
use stoker_core::{DType, Error, Loader, LoaderOptions, SourceSpec};

use crate::support::files::tmp;

const LABELS: [i64; 8] = [3, 1, 4, 1, 5, 9, 2, 6];
const SHARDS: [&str; 2] = ["wds-000000", "wds-000001"];

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tar")
}

fn key_of(i: usize) -> String {
    match i {
        5 => "part/s0005".into(),
        6 => format!("long_{}_s0006", "k".repeat(100)),
        _ => format!("s{i:04}"),
    }
}

/// Copies the committed webdataset shards into `dir` (index files then land there, not in the
/// source tree).
fn wds_shards(dir: &Path) -> Vec<PathBuf> {
    SHARDS
        .iter()
        .map(|s| {
            let to = dir.join(format!("{s}.tar"));
            fs::copy(data_dir().join(format!("{s}.tar")), &to).unwrap();
            to
        })
        .collect()
}

fn run_tar(args: &[&OsStr]) {
    let out = Command::new("tar")
        .args(args)
        .output()
        .expect("GNU tar runs");
    assert!(
        out.status.success(),
        "tar {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The same shards written by GNU tar in `format` (`gnu`: long names as `././@LongLink`; `pax`:
/// as pax `path` records), members in the order the webdataset shard has them.
fn gnu_shards(dir: &Path, format: &str) -> Vec<PathBuf> {
    SHARDS
        .iter()
        .map(|s| {
            let listing = Command::new("tar")
                .arg("-tf")
                .arg(data_dir().join(format!("{s}.tar")))
                .output()
                .unwrap();
            assert!(listing.status.success());
            let list = dir.join(format!("{s}.{format}.list"));
            fs::write(&list, &listing.stdout).unwrap();
            let out = dir.join(format!("{s}.{format}.tar"));
            let members = data_dir().join("members").join(s);
            run_tar(&[
                OsStr::new(&format!("--format={format}")),
                OsStr::new("-cf"),
                out.as_os_str(),
                OsStr::new("-C"),
                members.as_os_str(),
                OsStr::new("--no-recursion"),
                OsStr::new("-T"),
                list.as_os_str(),
            ]);
            out
        })
        .collect()
}

/// A GNU tar shard of `members` (name, bytes), in that order.
fn gnu_tar_of(dir: &Path, name: &str, members: &[(&[u8], &[u8])]) -> PathBuf {
    let src = dir.join(format!("{name}.members"));
    let _ = fs::remove_dir_all(&src);
    fs::create_dir_all(&src).unwrap();
    let mut args: Vec<Vec<u8>> = Vec::new();
    for (member, bytes) in members {
        let path = src.join(OsStr::from_bytes(member));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, bytes).unwrap();
        args.push(member.to_vec());
    }
    let out = dir.join(name);
    let mut cmd: Vec<&OsStr> = vec![
        OsStr::new("--format=gnu"),
        OsStr::new("-cf"),
        out.as_os_str(),
        OsStr::new("-C"),
        src.as_os_str(),
        OsStr::new("--"),
    ];
    cmd.extend(args.iter().map(|a| OsStr::from_bytes(a)));
    run_tar(&cmd);
    out
}

fn all_fields() -> TarConfig {
    TarConfig {
        fields: Some(
            stoker_core::source::tar::parse_fields(
                "jpg;jpeg;png:image,cls:label,txt:caption,npy:vec",
            )
            .unwrap(),
        ),
        ..TarConfig::default()
    }
}

/// Every sample's field bytes, in order.
fn read_all(src: &dyn Source) -> Vec<Vec<Vec<u8>>> {
    let mut scratch = Vec::new();
    (0..src.len())
        .map(|i| {
            let s = src.read(i, &mut scratch).unwrap();
            (0..src.fields().len()).map(|f| s.get(f).to_vec()).collect()
        })
        .collect()
}

fn member_file(shard: usize, name: &str) -> Vec<u8> {
    fs::read(data_dir().join("members").join(SHARDS[shard]).join(name)).unwrap()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn webdataset_and_gnu_tar_shards_read_identically() {
    let dir = tmp("identical");
    let wds = wds_shards(&dir);
    let gnu = gnu_shards(&dir, "gnu");
    let pax = gnu_shards(&dir, "pax");
    // The GNU format stores the 100+ character name in a ././@LongLink member.
    let gnu_bytes = fs::read(&gnu[1]).unwrap();
    assert!(gnu_bytes.windows(13).any(|w| w == b"././@LongLink"));

    let mut reads = Vec::new();
    for shards in [&wds, &gnu, &pax] {
        let src = TarSource::open(shards, all_fields()).unwrap();
        assert_eq!(src.len(), 8);
        assert_eq!(src.shard_starts(), [0, 5, 8]);
        let kinds: Vec<(&str, &FieldKind)> = src
            .fields()
            .iter()
            .map(|f| (f.name.as_str(), &f.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("image", &FieldKind::EncodedImage),
                (
                    "label",
                    &FieldKind::Tensor {
                        dtype: DType::I64,
                        shape: vec![]
                    }
                ),
                (
                    "caption",
                    &FieldKind::Ragged {
                        dtype: DType::U8,
                        inner_shape: vec![]
                    }
                ),
                (
                    "vec",
                    &FieldKind::Tensor {
                        dtype: DType::F32,
                        shape: vec![3]
                    }
                ),
            ]
        );
        let keys: Vec<String> = (0..8).map(|i| src.key(i).to_owned()).collect();
        assert_eq!(keys, (0..8).map(key_of).collect::<Vec<_>>());
        reads.push(read_all(&src));
    }
    assert_eq!(reads[0], reads[1], "webdataset vs GNU tar (gnu format)");
    assert_eq!(reads[0], reads[2], "webdataset vs GNU tar (pax format)");

    // And the values are the ones written.
    for (i, sample) in reads[0].iter().enumerate() {
        let (shard, ext) = match i {
            3 => (0, "png"),
            7 => (1, "JPG"),
            _ => (usize::from(i >= 5), "jpg"),
        };
        let key = key_of(i);
        assert_eq!(
            sample[0],
            member_file(shard, &format!("{key}.{ext}")),
            "image {i}"
        );
        assert_eq!(sample[1], LABELS[i].to_ne_bytes(), "label {i}");
        assert_eq!(
            sample[2],
            format!("caption of sample {i}").as_bytes(),
            "caption {i}"
        );
        let i = i as f32;
        // `0.0 - i`, not `-i`: Python wrote the integer -0, which is +0.0.
        assert_eq!(sample[3], f32s(&[i, i + 0.5, 0.0 - i]), "npy {i}");
    }

    // The default fields are image and label.
    let src = TarSource::open(&wds, TarConfig::default()).unwrap();
    assert_eq!(src.fields().len(), 2);
    let defaults = read_all(&src);
    for (i, s) in defaults.iter().enumerate() {
        assert_eq!(s[..], reads[0][i][..2]);
    }
    assert_eq!(
        src.describe(5),
        format!("shard {} sample part/s0005 (offset 0)", wds[1].display())
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// Samples of a shard read by the streaming reader, as field bytes.
fn stream_fields(
    reader: impl Iterator<Item = stoker_core::Result<StreamSample>>,
    fields: &TarFields,
) -> Vec<Vec<Vec<u8>>> {
    let mut scratch = Vec::new();
    reader
        .enumerate()
        .map(|(i, s)| {
            let s = s.unwrap();
            let what = || s.describe();
            let sample = fields
                .stream_sample(&s, i as u64, &what, &mut scratch)
                .unwrap();
            (0..fields.specs().len())
                .map(|f| sample.get(f).to_vec())
                .collect()
        })
        .collect()
}

#[test]
fn streaming_reads_what_indexed_mode_reads_plain_and_gzip() {
    let dir = tmp("stream");
    let wds = wds_shards(&dir);
    let gz = dir.join("wds-000000.tgz-named-anything");
    fs::copy(data_dir().join("wds-000000.tar.gz"), &gz).unwrap();
    let pax = gnu_shards(&dir, "pax");
    let gnu = gnu_shards(&dir, "gnu");

    let indexed = TarSource::open(&wds, all_fields()).unwrap();
    let expected = read_all(&indexed);
    let fields = indexed.tar_fields();
    // Streaming mode learns the same fields from its first sample.
    let mut learn = ShardReader::open(&gz, ReadOptions::new(&all_fields(), None)).unwrap();
    let first = learn.next_sample().unwrap().unwrap();
    drop(learn);
    let learnt = TarFields::resolve_streamed(&all_fields(), &first).unwrap();
    assert_eq!(learnt.specs(), indexed.fields());
    let options = ReadOptions::new(&all_fields(), Some(fields));
    assert_eq!(
        options.wanted.as_deref().unwrap(),
        ["cls", "jpeg", "jpg", "npy", "png", "txt"]
    );

    for shards in [
        [&wds[0], &wds[1]],
        [&gz, &wds[1]],
        [&pax[0], &pax[1]],
        [&gnu[0], &gnu[1]],
    ] {
        let mut streamed = Vec::new();
        for shard in shards {
            let reader = ShardReader::open(shard, options.clone()).unwrap();
            streamed.extend(stream_fields(reader, fields));
        }
        assert_eq!(streamed, expected, "{shards:?}");
    }

    // Keys and offsets agree with indexed mode; unwanted members are not kept.
    let mut samples = Vec::new();
    let narrow = ReadOptions {
        max_member_bytes: 1 << 20,
        wanted: Some(vec!["cls".into()]),
    };
    read_samples("mem", fs::File::open(&wds[1]).unwrap(), &narrow, |s| {
        samples.push(s);
        true
    })
    .unwrap();
    assert_eq!(samples.len(), 3);
    for (j, s) in samples.iter().enumerate() {
        assert_eq!(s.key, indexed.key(5 + j));
        assert_eq!(
            indexed.describe(5 + j).split_once(" sample ").unwrap().1,
            s.describe().split_once(" sample ").unwrap().1
        );
        assert_eq!(s.members.len(), 1);
        assert_eq!(s.members[0].ext, "cls");
    }

    // Stopping early (emit returns false) and dropping a reader mid-shard are clean.
    let mut n = 0;
    read_samples("mem", fs::File::open(&wds[0]).unwrap(), &narrow, |_| {
        n += 1;
        n < 2
    })
    .unwrap();
    assert_eq!(n, 2);
    let mut reader = ShardReader::open(&wds[0], options.clone()).unwrap();
    assert!(reader.next_sample().unwrap().is_some());
    drop(reader);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gzip_shards_are_refused_in_indexed_mode_with_advice() {
    let dir = tmp("gz-indexed");
    let gz = dir.join("wds-000000.tar.gz");
    fs::copy(data_dir().join("wds-000000.tar.gz"), &gz).unwrap();
    let err = TarSource::open(&[gz], TarConfig::default()).err().unwrap();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("wds-000000.tar.gz") && msg.contains("shuffle_buffer"),
        "{msg}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

fn origins(src: &TarSource) -> Vec<IndexOrigin> {
    src.index_origins().cloned().collect()
}

fn cache_only(dir: &Path) -> TarConfig {
    TarConfig {
        index_dir: Some(dir.join("cache")),
        ..TarConfig::default()
    }
}

#[test]
fn index_is_saved_beside_reused_and_rebuilt_when_the_shard_changes() {
    let dir = tmp("index");
    let shards = wds_shards(&dir);
    let config = cache_only(&dir);
    let first = TarSource::open(&shards, config.clone()).unwrap();
    let beside: Vec<PathBuf> = SHARDS
        .iter()
        .map(|s| dir.join(format!(".{s}.tar.idx")))
        .collect();
    assert_eq!(
        origins(&first),
        beside
            .iter()
            .map(|p| IndexOrigin::Scanned {
                saved: Some(p.clone())
            })
            .collect::<Vec<_>>()
    );
    let expected = read_all(&first);
    let written = fs::metadata(&beside[0]).unwrap().modified().unwrap();

    // Second open: read from the index files, not scanned, not rewritten.
    let second = TarSource::open(&shards, config.clone()).unwrap();
    assert_eq!(
        origins(&second),
        beside
            .iter()
            .map(|p| IndexOrigin::Loaded(p.clone()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        fs::metadata(&beside[0]).unwrap().modified().unwrap(),
        written
    );
    assert_eq!(read_all(&second), expected);
    // A glob over the directory does not pick up the (hidden) index files.
    let globbed =
        stoker_core::source::shards::expand_shards(&format!("{}/*", dir.display())).unwrap();
    assert_eq!(globbed.len(), 2, "{globbed:?}");

    // The shard changes (same path, other content): the index is stale and rebuilt. (The
    // sources mapping the old content are dropped first: truncating a mapped file is undefined
    // for readers of the mapping.)
    drop((first, second));
    fs::copy(data_dir().join("wds-000001.tar"), &shards[0]).unwrap();
    let third = TarSource::open(&shards, config.clone()).unwrap();
    assert_eq!(third.len(), 6);
    assert!(matches!(origins(&third)[0], IndexOrigin::Scanned { .. }));
    assert!(matches!(origins(&third)[1], IndexOrigin::Loaded(_)));

    // Only the mtime changes: rebuilt too.
    let f = fs::File::options().write(true).open(&shards[1]).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(12345))
        .unwrap();
    drop(f);
    assert!(matches!(
        origins(&TarSource::open(&shards, config.clone()).unwrap())[1],
        IndexOrigin::Scanned { .. }
    ));

    // A corrupt index file (or one of another version) is ignored and rewritten.
    fs::write(&beside[1], b"STKTARIX\x63\x00\x00\x00 not really").unwrap();
    let src = TarSource::open(&shards, config.clone()).unwrap();
    assert!(matches!(origins(&src)[1], IndexOrigin::Scanned { .. }));
    assert_eq!(read_all(&src)[3..], expected[5..]);
    assert!(matches!(
        origins(&TarSource::open(&shards, config).unwrap())[1],
        IndexOrigin::Loaded(_)
    ));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn index_falls_back_to_the_cache_dir_then_to_memory() {
    let dir = tmp("fallback");
    let shards = wds_shards(&dir);
    // Beside the shard is not writable: here, because a non-empty directory sits where the
    // index file would go (a rename cannot replace it, even as root).
    for s in SHARDS {
        let blocker = dir.join(format!(".{s}.tar.idx"));
        fs::create_dir_all(blocker.join("x")).unwrap();
    }
    let config = cache_only(&dir);
    let src = TarSource::open(&shards, config.clone()).unwrap();
    let saved: Vec<PathBuf> = origins(&src)
        .into_iter()
        .map(|o| match o {
            IndexOrigin::Scanned { saved: Some(p) } => p,
            other => panic!("{other:?}"),
        })
        .collect();
    for (p, s) in saved.iter().zip(SHARDS) {
        assert!(p.starts_with(dir.join("cache")), "{}", p.display());
        assert!(p
            .file_name()
            .unwrap()
            .to_string_lossy()
            .ends_with(&format!("-{s}.tar.idx")));
    }
    let again = TarSource::open(&shards, config).unwrap();
    assert_eq!(
        origins(&again),
        saved
            .iter()
            .map(|p| IndexOrigin::Loaded(p.clone()))
            .collect::<Vec<_>>()
    );
    assert_eq!(read_all(&again), read_all(&src));

    // Neither place writable (the cache dir would be under a regular file): memory only.
    let file = dir.join("a-file");
    fs::write(&file, b"").unwrap();
    let nowhere = TarConfig {
        index_dir: Some(file.join("cache")),
        ..TarConfig::default()
    };
    let src = TarSource::open(&shards, nowhere.clone()).unwrap();
    assert_eq!(origins(&src), vec![IndexOrigin::Scanned { saved: None }; 2]);
    assert_eq!(src.len(), 8);
    // Not writing beside at all is a choice too.
    let no_beside = TarConfig {
        index_beside: false,
        ..nowhere
    };
    assert_eq!(
        origins(&TarSource::open(&shards, no_beside).unwrap()),
        vec![IndexOrigin::Scanned { saved: None }; 2]
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// A read-only shard directory through permission bits, where they apply: a non-root user.
/// (As root, permission bits do not stop writes; the test above covers the fallback then.)
#[test]
fn read_only_shard_directory_uses_the_cache_dir_when_permissions_apply() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp("readonly");
    let shard_dir = dir.join("shards");
    fs::create_dir_all(&shard_dir).unwrap();
    let shards = wds_shards(&shard_dir);
    fs::set_permissions(&shard_dir, fs::Permissions::from_mode(0o555)).unwrap();
    let probe = shard_dir.join("probe");
    let enforced = fs::write(&probe, b"").is_err();
    let result = TarSource::open(&shards, cache_only(&dir));
    fs::set_permissions(&shard_dir, fs::Permissions::from_mode(0o755)).unwrap();
    let src = result.unwrap();
    if enforced {
        for o in origins(&src) {
            match o {
                IndexOrigin::Scanned { saved: Some(p) } => {
                    assert!(p.starts_with(dir.join("cache")))
                }
                other => panic!("{other:?}"),
            }
        }
    } else {
        eprintln!(
            "permission bits are not enforced for this user (root): only the open is checked"
        );
        let _ = fs::remove_file(&probe);
    }
    assert_eq!(src.len(), 8);
    fs::remove_dir_all(&dir).unwrap();
}

// ---- corrupt shards -------------------------------------------------------------------------

/// The error of opening `shard` indexed and of streaming it.
fn both_errors(shard: &Path) -> (String, String) {
    let config = TarConfig {
        index_beside: false,
        index_dir: None,
        ..TarConfig::default()
    };
    let indexed = TarSource::open(&[shard.to_owned()], config)
        .err()
        .expect("indexed open fails")
        .to_string();
    let options = ReadOptions {
        max_member_bytes: 1 << 20,
        wanted: None,
    };
    let reader = ShardReader::open(shard, options).unwrap();
    let streamed = reader
        .into_iter()
        .find_map(|r| r.err())
        .expect("streaming fails")
        .to_string();
    (indexed, streamed)
}

fn assert_names(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "`{p}` not in: {msg}");
    }
}

/// A small valid GNU tar shard: s0000.jpg, s0000.cls, s0001.jpg, s0001.cls (data 700 bytes each
/// for images, so the layout is 512-byte header + 1024 data for a jpg and 512 + 512 for a cls).
fn small_shard(dir: &Path, name: &str) -> (PathBuf, Vec<u8>) {
    let jpg = member_file(0, "s0000.jpg");
    let path = gnu_tar_of(
        dir,
        name,
        &[
            (b"s0000.jpg", &jpg[..]),
            (b"s0000.cls", b"3"),
            (b"s0001.jpg", &jpg[..]),
            (b"s0001.cls", b"4"),
        ],
    );
    let bytes = fs::read(&path).unwrap();
    (path, bytes)
}

/// Byte offset of the header of the member named `name`.
fn header_of(bytes: &[u8], name: &str) -> usize {
    (0..bytes.len())
        .step_by(512)
        .find(|&at| bytes[at..].starts_with(name.as_bytes()) && bytes[at + name.len()] == 0)
        .unwrap()
}

fn rewrite_checksum(header: &mut [u8]) {
    header[148..156].fill(b' ');
    let sum: u32 = header[..512].iter().map(|&b| b as u32).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

#[test]
fn truncated_shards_name_shard_member_and_offset() {
    let dir = tmp("truncated");
    let (path, bytes) = small_shard(&dir, "ok.tar");
    let shard = path.display().to_string();
    let second_jpg = header_of(&bytes, "s0001.jpg");

    // Cut inside the data of s0001.jpg.
    let cut = dir.join("cut-data.tar");
    fs::write(&cut, &bytes[..second_jpg + 512 + 100]).unwrap();
    let (indexed, streamed) = both_errors(&cut);
    let data_at = (second_jpg + 512).to_string();
    for msg in [&indexed, &streamed] {
        assert_names(
            msg,
            &[
                "cut-data.tar",
                "member `s0001.jpg`",
                "cut short",
                &format!("byte offset {data_at}"),
            ],
        );
    }

    // Cut at a header boundary, after s0001.jpg: no end-of-archive block.
    let boundary = header_of(&bytes, "s0001.cls");
    let cut = dir.join("cut-boundary.tar");
    fs::write(&cut, &bytes[..boundary]).unwrap();
    let (indexed, streamed) = both_errors(&cut);
    for msg in [&indexed, &streamed] {
        assert_names(
            msg,
            &[
                "cut-boundary.tar",
                "truncated",
                "after member `s0001.jpg`",
                &boundary.to_string(),
            ],
        );
    }

    // Cut inside a header.
    let cut = dir.join("cut-header.tar");
    fs::write(&cut, &bytes[..boundary + 100]).unwrap();
    let (indexed, streamed) = both_errors(&cut);
    for msg in [&indexed, &streamed] {
        assert_names(
            msg,
            &[
                "cut-header.tar",
                "truncated",
                "s0001.jpg",
                &boundary.to_string(),
            ],
        );
    }
    assert!(shard.ends_with("ok.tar"));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_header_checksum_names_the_member_and_offset() {
    let dir = tmp("checksum");
    let (_, mut bytes) = small_shard(&dir, "ok.tar");
    let at = header_of(&bytes, "s0001.jpg");
    bytes[at + 140] ^= 1; // inside the mtime field: the name stays readable
    let bad = dir.join("bad-sum.tar");
    fs::write(&bad, &bytes).unwrap();
    let (indexed, streamed) = both_errors(&bad);
    for msg in [&indexed, &streamed] {
        assert_names(
            msg,
            &[
                "bad-sum.tar",
                "member `s0001.jpg`",
                &format!("byte offset {at}"),
                "after member `s0000.cls`",
                "checksum",
            ],
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_member_whose_size_runs_past_the_end_is_cut_short() {
    let dir = tmp("size");
    let (_, mut bytes) = small_shard(&dir, "ok.tar");
    let at = header_of(&bytes, "s0001.cls");
    // A valid header (checksum rewritten) claiming 100000 bytes.
    bytes[at + 124..at + 136].copy_from_slice(format!("{:011o}\0", 100_000).as_bytes());
    rewrite_checksum(&mut bytes[at..at + 512]);
    let bad = dir.join("long-member.tar");
    fs::write(&bad, &bytes).unwrap();
    let (indexed, streamed) = both_errors(&bad);
    for msg in [&indexed, &streamed] {
        assert_names(
            msg,
            &[
                "long-member.tar",
                "member `s0001.cls`",
                "cut short",
                &format!("byte offset {}", at + 512),
                "100000 bytes",
            ],
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_non_utf8_member_name_is_an_error_naming_its_offset() {
    let dir = tmp("utf8");
    let jpg = member_file(0, "s0000.jpg");
    let path = gnu_tar_of(
        &dir,
        "bad-name.tar",
        &[
            (b"s0000.jpg", &jpg[..]),
            (b"s0000.cls", b"1"),
            (b"s\xff01.jpg", b"x"),
        ],
    );
    let bytes = fs::read(&path).unwrap();
    let at = (0..bytes.len())
        .step_by(512)
        .find(|&a| bytes[a..].starts_with(b"s\xff01.jpg"))
        .unwrap();
    let (indexed, streamed) = both_errors(&path);
    for msg in [&indexed, &streamed] {
        assert_names(
            msg,
            &[
                "bad-name.tar",
                "s\u{fffd}01.jpg",
                "not UTF-8",
                &format!("byte offset {at}"),
            ],
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_repeated_member_is_an_error_like_in_webdataset() {
    let dir = tmp("dup");
    let (_, bytes) = small_shard(&dir, "ok.tar");
    // Append the s0001.cls member again: concatenate the last header + data before the end.
    let at = header_of(&bytes, "s0001.cls");
    let mut dup = bytes[..at + 1024].to_vec();
    dup.extend_from_slice(&bytes[at..]);
    let bad = dir.join("dup.tar");
    fs::write(&bad, &dup).unwrap();
    let (indexed, streamed) = both_errors(&bad);
    for msg in [&indexed, &streamed] {
        assert_names(
            msg,
            &[
                "dup.tar",
                "member `s0001.cls`",
                &format!("byte offset {}", at + 1024),
                "second `cls`",
            ],
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// Per-sample errors (`Error::Sample`, which on_error=skip replaces) in both modes.
fn sample_errors(path: &Path, config: TarConfig) -> Vec<(usize, String)> {
    let src = TarSource::open(&[path.to_owned()], config.clone()).unwrap();
    let mut scratch = Vec::new();
    let indexed: Vec<(usize, String)> = (0..src.len())
        .filter_map(|i| {
            let e = src.read(i, &mut scratch).err()?;
            assert!(
                matches!(e, Error::Sample { .. }) && e.is_sample_error(),
                "{e}"
            );
            Some((i, e.to_string()))
        })
        .collect();
    // Streaming gives the same errors through the same conversion.
    let options = ReadOptions {
        max_member_bytes: u64::MAX,
        wanted: Some(src.tar_fields().wanted_extensions()),
    };
    let reader = ShardReader::open(path, options).unwrap();
    let streamed: Vec<(usize, String)> = reader
        .enumerate()
        .filter_map(|(i, s)| {
            let s = s.unwrap();
            let what = || s.describe();
            let e = src
                .tar_fields()
                .stream_sample(&s, i as u64, &what, &mut scratch)
                .err()?;
            Some((i, e.to_string()))
        })
        .collect();
    assert_eq!(indexed, streamed);
    indexed
}

#[test]
fn missing_fields_and_bad_labels_are_sample_errors_naming_shard_key_and_offset() {
    let dir = tmp("samples");
    let jpg = member_file(0, "s0000.jpg");
    let path = gnu_tar_of(
        &dir,
        "mixed.tar",
        &[
            (b"s0000.jpg", &jpg[..]),
            (b"s0000.cls", b"7\n"),
            (b"s0001.cls", b"2"),     // no image
            (b"s0002.jpg", &jpg[..]), // no label
            (b"s0003.jpg", &jpg[..]),
            (b"s0003.cls", b"cat"), // not an integer
            (b"s0004.jpeg", &jpg[..]),
            (b"s0004.label", b" -5 "),
        ],
    );
    let bytes = fs::read(&path).unwrap();
    let shard = path.display().to_string();
    let errors = sample_errors(
        &path,
        TarConfig {
            index_dir: Some(dir.join("c")),
            ..TarConfig::default()
        },
    );
    assert_eq!(errors.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2, 3]);
    let h = |name| header_of(&bytes, name);
    assert_names(
        &errors[0].1,
        &[
            &shard,
            "sample s0001",
            &format!("offset {}", h("s0001.cls")),
            "field `image`",
            "s0001.jpg or s0001.jpeg or s0001.png",
        ],
    );
    assert_names(
        &errors[1].1,
        &[
            &shard,
            "sample s0002",
            &format!("offset {}", h("s0002.jpg")),
            "field `label`",
            "s0002.cls",
        ],
    );
    assert_names(
        &errors[2].1,
        &[
            &shard,
            "member `s0003.cls`",
            &format!("byte offset {}", h("s0003.cls") + 512),
            "\"cat\" is not an integer",
        ],
    );

    // The good samples read: 7 (with a newline) and -5 (from a `.label` member, spaces around).
    let src = TarSource::open(
        std::slice::from_ref(&path),
        TarConfig {
            index_dir: Some(dir.join("c")),
            ..TarConfig::default()
        },
    )
    .unwrap();
    let mut scratch = Vec::new();
    assert_eq!(
        src.read(0, &mut scratch).unwrap().get(1),
        7i64.to_ne_bytes()
    );
    assert_eq!(
        src.read(4, &mut scratch).unwrap().get(1),
        (-5i64).to_ne_bytes()
    );
    assert_eq!(src.read(4, &mut scratch).unwrap().get(0), &jpg[..]);

    // A member over max_member_bytes: a sample error in indexed mode...
    let small = TarConfig {
        max_member_bytes: 100,
        index_dir: Some(dir.join("c")),
        ..TarConfig::default()
    };
    let src = TarSource::open(std::slice::from_ref(&path), small).unwrap();
    let e = src.read(0, &mut scratch).unwrap_err().to_string();
    assert_names(
        &e,
        &[
            &shard,
            "member `s0000.jpg`",
            &format!("byte offset {}", h("s0000.jpg") + 512),
            "max_member_bytes=100",
        ],
    );
    // ...and an error before allocating in streaming mode.
    let options = ReadOptions {
        max_member_bytes: 100,
        wanted: None,
    };
    let e = ShardReader::open(&path, options)
        .unwrap()
        .find_map(|r| r.err())
        .unwrap()
        .to_string();
    assert_names(&e, &[&shard, "member `s0000.jpg`", "max_member_bytes=100"]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn default_fields_need_an_image_and_a_label_in_the_first_sample() {
    let dir = tmp("defaults");
    let path = gnu_tar_of(
        &dir,
        "text.tar",
        &[(b"a.txt", b"hello"), (b"a.json", b"{}")],
    );
    let err = TarSource::open(std::slice::from_ref(&path), TarConfig::default())
        .err()
        .unwrap()
        .to_string();
    assert_names(&err, &["text.tar", "`a`", "image", "fields=", "a.txt"]);
    // With fields=, raw members become ragged uint8 fields.
    let config = TarConfig {
        fields: Some(stoker_core::source::tar::parse_fields("txt:text,json:meta").unwrap()),
        ..TarConfig::default()
    };
    let src = TarSource::open(&[path], config).unwrap();
    let got = read_all(&src);
    assert_eq!(got, [[b"hello".to_vec(), b"{}".to_vec()]]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn npy_fields_take_dtype_and_shape_from_the_first_sample() {
    let dir = tmp("npy");
    let npy = |n: usize| {
        let data: Vec<u8> = (0..n as i32).flat_map(|v| v.to_le_bytes()).collect();
        stoker_core::source::npy_bytes(stoker_core::DType::I32, &[n], &data).unwrap()
    };
    let (a, b, c) = (npy(2), npy(2), npy(3));
    let path = gnu_tar_of(
        &dir,
        "npy.tar",
        &[(b"x0.npy", &a), (b"x1.npy", &b), (b"x2.npy", &c)],
    );
    let fields = Some(stoker_core::source::tar::parse_fields("npy:v").unwrap());
    let fixed = TarConfig {
        fields: fields.clone(),
        ..TarConfig::default()
    };
    let src = TarSource::open(std::slice::from_ref(&path), fixed).unwrap();
    assert_eq!(
        src.fields()[0].kind,
        FieldKind::Tensor {
            dtype: DType::I32,
            shape: vec![2]
        }
    );
    let mut scratch = Vec::new();
    assert_eq!(src.read(1, &mut scratch).unwrap().get(0), &b[b.len() - 8..]);
    let e = src.read(2, &mut scratch).unwrap_err().to_string();
    assert_names(&e, &["npy.tar", "member `x2.npy`", "int32 [3]", "pad="]);

    let padded = TarConfig {
        fields,
        pad: true,
        ..TarConfig::default()
    };
    let src = TarSource::open(&[path], padded).unwrap();
    assert_eq!(
        src.fields()[0].kind,
        FieldKind::Ragged {
            dtype: DType::I32,
            inner_shape: vec![]
        }
    );
    assert_eq!(src.read(2, &mut scratch).unwrap().get(0).len(), 12);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn loader_reads_tar_shards_end_to_end() {
    let dir = tmp("loader");
    let shards = wds_shards(&dir);
    let src = TarSource::open(&shards, TarConfig::default()).unwrap();
    let mut options = LoaderOptions::new().with_source(SourceSpec::Custom(Arc::new(src)));
    for (k, v) in [
        ("batch_size", "4"),
        ("num_workers", "2"),
        ("transform", "resize(8, 8)"),
        ("dtype", "uint8"),
    ] {
        options.set(k, v).unwrap();
    }
    let mut loader = Loader::new(&options).unwrap();
    let mut labels = Vec::new();
    while let Some(batch) = loader.next().unwrap() {
        let image = batch.field_by_name("image").unwrap();
        assert_eq!(image.shape[1..], [3, 8, 8]);
        labels.extend(
            batch
                .field_by_name("label")
                .unwrap()
                .data
                .unwrap()
                .chunks_exact(8)
                .map(|c| i64::from_ne_bytes(c.try_into().unwrap())),
        );
    }
    assert_eq!(labels, LABELS);
    fs::remove_dir_all(&dir).unwrap();
}
