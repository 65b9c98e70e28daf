//! `source=tar:PATTERN` through the loader, in indexed mode (`shuffle_buffer=0`) and streaming
//! mode (`shuffle_buffer=N`): coverage across ranks and workers with uneven shards, the
//! equal-batches rule, determinism whatever `num_workers`, mid-epoch resume, shuffle quality,
//! raw-bytes fields, gzip shards, and damaged shards under `on_error=raise` and `skip`.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;

use stoker_core::{Batch, Error, Loader, LoaderOptions};

use crate::support::files::{tmp, write_tar};

/// Shards of `sizes` samples each: sample `g` (numbered across shards in order) has
/// `g.cls` = g and `g.txt` = "s" repeated 1 + g % 5 times. Returns the pattern.
fn write_shards(dir: &Path, sizes: &[usize]) -> String {
    let mut g = 0usize;
    for (s, &n) in sizes.iter().enumerate() {
        let mut members = Vec::new();
        for _ in 0..n {
            members.push((format!("k{g:06}.cls"), g.to_string().into_bytes()));
            members.push((format!("k{g:06}.txt"), vec![b's'; 1 + g % 5]));
            g += 1;
        }
        write_tar(&dir.join(format!("shard-{s:03}.tar")), &members);
    }
    format!(
        "{}/shard-{{000..{:03}}}.tar",
        dir.display(),
        sizes.len() - 1
    )
}

fn loader(pattern: &str, kv: &[(&str, &str)]) -> Result<Loader, Error> {
    let mut o = LoaderOptions::new();
    o.set("source", &format!("tar:{pattern}"))?;
    o.set("fields", "cls:label")?;
    for (k, v) in kv {
        o.set(k, v)?;
    }
    Loader::new(&o)
}

fn labels(b: &Batch) -> Vec<i64> {
    b.field_by_name("label")
        .unwrap()
        .data
        .unwrap()
        .chunks_exact(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// Every batch of the loader's current epoch, as labels.
fn epoch(l: &mut Loader) -> Vec<Vec<i64>> {
    l.epoch_iter().map(|b| labels(&b.unwrap())).collect()
}

const UNEVEN: [usize; 6] = [17, 3, 0, 29, 1, 11]; // 61 samples

/// Across the ranks of one epoch: every sample at least once, and the extra deliveries are the
/// padding (exactly `per_rank * world - total` of them).
fn check_coverage(per_rank_batches: &[Vec<Vec<i64>>], total: usize, what: &str) {
    let mut count: BTreeMap<i64, usize> = BTreeMap::new();
    for batches in per_rank_batches {
        for b in batches {
            for &l in b {
                *count.entry(l).or_default() += 1;
            }
        }
    }
    let delivered: usize = count.values().sum();
    let keys: Vec<i64> = count.keys().copied().collect();
    assert_eq!(
        keys,
        (0..total as i64).collect::<Vec<_>>(),
        "{what}: every sample"
    );
    let samples_per_rank: Vec<usize> = per_rank_batches
        .iter()
        .map(|r| r.iter().map(Vec::len).sum())
        .collect();
    assert!(
        samples_per_rank.windows(2).all(|w| w[0] == w[1]),
        "{what}: equal samples per rank {samples_per_rank:?}"
    );
    let world = per_rank_batches.len();
    let per_rank = total.div_ceil(world);
    assert_eq!(delivered, per_rank * world, "{what}: padding only");
}

#[test]
fn every_sample_once_per_epoch_across_ranks_and_workers_in_both_modes() {
    let dir = tmp("cover");
    let pattern = write_shards(&dir, &UNEVEN);
    let total: usize = UNEVEN.iter().sum();
    for buffer in ["0", "1", "8"] {
        for world in 1..=3usize {
            for workers in ["0", "1", "2"] {
                let what = format!("shuffle_buffer={buffer} world={world} workers={workers}");
                let mut epochs: Vec<Vec<Vec<Vec<i64>>>> = vec![Vec::new(); 2];
                let mut counts = Vec::new();
                for rank in 0..world {
                    let mut l = loader(
                        &pattern,
                        &[
                            ("batch_size", "4"),
                            ("shuffle", "true"),
                            ("seed", "9"),
                            ("shuffle_buffer", buffer),
                            ("num_workers", workers),
                            ("rank", &rank.to_string()),
                            ("world_size", &world.to_string()),
                        ],
                    )
                    .unwrap();
                    counts.push(l.batches_per_epoch());
                    for e in &mut epochs {
                        let batches = epoch(&mut l);
                        assert_eq!(batches.len(), l.batches_per_epoch(), "{what}");
                        e.push(batches);
                    }
                }
                assert!(
                    counts.windows(2).all(|w| w[0] == w[1]),
                    "{what}: {counts:?}"
                );
                check_coverage(&epochs[0], total, &what);
                check_coverage(&epochs[1], total, &what);
                assert_ne!(epochs[0], epochs[1], "{what}: a new order each epoch");
            }
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn streaming_batches_are_the_same_whatever_num_workers() {
    let dir = tmp("workers");
    let pattern = write_shards(&dir, &UNEVEN);
    let run = |workers: &str, in_order: &str| {
        let mut l = loader(
            &pattern,
            &[
                ("batch_size", "5"),
                ("seed", "3"),
                ("shuffle_buffer", "16"),
                ("num_workers", workers),
                ("in_order", in_order),
                ("prefetch_factor", "3"),
                ("world_size", "2"),
                ("rank", "1"),
            ],
        )
        .unwrap();
        let mut out = Vec::new();
        for _ in 0..3 {
            let mut batches: Vec<(usize, Vec<i64>)> = l
                .epoch_iter()
                .map(|b| {
                    let b = b.unwrap();
                    (b.position(), labels(&b))
                })
                .collect();
            batches.sort();
            out.push(batches);
        }
        out
    };
    let reference = run("0", "true");
    for workers in ["1", "2", "4"] {
        assert_eq!(run(workers, "true"), reference, "num_workers={workers}");
    }
    assert_eq!(run("3", "false"), reference, "in_order=false, sorted");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn equal_batch_counts_on_every_rank_with_drop_last_and_shard_drop_last() {
    let dir = tmp("equal");
    let pattern = write_shards(&dir, &UNEVEN);
    for (drop_last, shard_drop_last) in [("true", "false"), ("false", "true"), ("true", "true")] {
        for world in [2usize, 3, 4, 7] {
            let mut per_rank = Vec::new();
            for rank in 0..world {
                let mut l = loader(
                    &pattern,
                    &[
                        ("batch_size", "4"),
                        ("shuffle_buffer", "4"),
                        ("num_workers", "1"),
                        ("drop_last", drop_last),
                        ("shard_drop_last", shard_drop_last),
                        ("rank", &rank.to_string()),
                        ("world_size", &world.to_string()),
                    ],
                )
                .unwrap();
                let batches = epoch(&mut l);
                assert_eq!(batches.len(), l.batches_per_epoch());
                if drop_last == "true" {
                    assert!(batches.iter().all(|b| b.len() == 4));
                }
                per_rank.push(batches);
            }
            let n: Vec<usize> = per_rank.iter().map(Vec::len).collect();
            assert!(n.windows(2).all(|w| w[0] == w[1]), "world {world}: {n:?}");
            if shard_drop_last == "true" {
                // No padding: no sample twice.
                let mut all: Vec<i64> = per_rank.concat().concat();
                let len = all.len();
                all.sort_unstable();
                all.dedup();
                assert_eq!(all.len(), len, "world {world}");
                assert_eq!(
                    len,
                    61 / world * world
                        - if drop_last == "true" {
                            (61 / world) % 4 * world
                        } else {
                            0
                        }
                );
            }
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mid_epoch_resume_continues_exactly_in_both_modes() {
    let dir = tmp("resume");
    let pattern = write_shards(&dir, &UNEVEN);
    for buffer in ["0", "12"] {
        for in_order in ["true", "false"] {
            let kv = [
                ("batch_size", "3"),
                ("shuffle", "true"),
                ("seed", "21"),
                ("shuffle_buffer", buffer),
                ("num_workers", "2"),
                ("in_order", in_order),
                ("world_size", "2"),
                ("rank", "0"),
            ];
            let mut whole = loader(&pattern, &kv).unwrap();
            let first = epoch(&mut whole);
            let second = epoch(&mut whole);
            // By content: an indexed loader resumed from a global state numbers the rest of
            // the epoch from 0 (it may be dealt to a different number of ranks).
            let sorted = |v: Vec<(usize, Vec<i64>)>| {
                let mut v: Vec<Vec<i64>> = v.into_iter().map(|(_, b)| b).collect();
                v.sort();
                v
            };
            let first_sorted = {
                let mut l = loader(&pattern, &kv).unwrap();
                sorted(
                    l.epoch_iter()
                        .map(|b| {
                            let b = b.unwrap();
                            (b.position(), labels(&b))
                        })
                        .collect(),
                )
            };
            for stop in [0, 1, 4, first.len() - 1, first.len()] {
                let mut l = loader(&pattern, &kv).unwrap();
                let mut got: Vec<(usize, Vec<i64>)> = Vec::new();
                for _ in 0..stop {
                    let b = l.next().unwrap().unwrap();
                    got.push((b.position(), labels(&b)));
                }
                let state = l.save_state();
                drop(l);
                let mut kv2 = kv.to_vec();
                kv2.push(("resume_state", &state));
                let mut resumed = loader(&pattern, &kv2).unwrap();
                while let Some(b) = resumed.next().unwrap() {
                    got.push((b.position(), labels(&b)));
                }
                if in_order == "true" {
                    let in_order: Vec<Vec<i64>> = got.iter().map(|(_, b)| b.clone()).collect();
                    assert_eq!(
                        in_order, first,
                        "buffer={buffer} stop={stop}: the same order"
                    );
                }
                assert_eq!(
                    sorted(got),
                    first_sorted,
                    "buffer={buffer} in_order={in_order} stop={stop}"
                );
                if in_order == "true" {
                    assert_eq!(epoch(&mut resumed), second, "the next epoch too");
                }
            }
        }
    }
    // A state from the other mode is refused, naming the key.
    let mut l = loader(&pattern, &[("shuffle_buffer", "4")]).unwrap();
    l.next().unwrap();
    let state = l.save_state();
    let e = loader(&pattern, &[("resume_state", &state)]).err().unwrap();
    assert!(e.to_string().contains("resume_state"), "{e}");
    fs::remove_dir_all(&dir).unwrap();
}

/// A streaming state is this rank's place in its own stream: it resumes at the same world size
/// (by replay), and a different world size is an error saying so. Indexed states of the same
/// shards resume at any world size.
#[test]
fn a_streaming_state_resumes_at_the_same_world_size_only() {
    let dir = tmp("stream-world");
    let pattern = write_shards(&dir, &UNEVEN);
    let at = |ws: &'static str, buffer: &'static str| {
        vec![
            ("batch_size", "2"),
            ("seed", "5"),
            ("shuffle", "true"),
            ("shuffle_buffer", buffer),
            ("num_workers", "1"),
            ("world_size", ws),
            ("rank", "1"),
        ]
    };
    let mut l = loader(&pattern, &at("2", "8")).unwrap();
    l.next().unwrap().unwrap();
    let state = l.save_state();
    assert!(
        state.starts_with("stoker-state-v2;") && state.contains(";mode=stream;"),
        "{state}"
    );
    assert!(state.contains(";world_size=2;"), "{state}");
    let mut kv = at("3", "8");
    kv.push(("resume_state", &state));
    let e = loader(&pattern, &kv).err().unwrap().to_string();
    assert!(
        e.contains("resume_state") && e.contains("world_size 2") && e.contains("same world size"),
        "{e}"
    );
    let mut kv = at("2", "8");
    kv.push(("resume_state", &state));
    let mut resumed = loader(&pattern, &kv).unwrap();
    assert_eq!(resumed.position(), 1);
    assert_eq!(resumed.next().unwrap().unwrap().position(), 1);

    // Indexed tar (shuffle_buffer=0): a global state, resumable at another world size.
    let mut l = loader(&pattern, &at("2", "0")).unwrap();
    l.next().unwrap().unwrap();
    let state = l.save_state();
    assert!(!state.contains("mode=stream"), "{state}");
    let mut kv = at("3", "0");
    kv.push(("resume_state", &state));
    assert!(loader(&pattern, &kv).unwrap().next().unwrap().is_some());
    fs::remove_dir_all(&dir).unwrap();
}

/// `set_epoch(e)` before each epoch's loop works on a stream; moving a stream elsewhere
/// mid-epoch is refused with an error saying why, and the loader goes on.
#[test]
fn set_epoch_on_a_stream_continues_at_epoch_starts_and_refuses_jumps() {
    let dir = tmp("stream-set-epoch");
    let pattern = write_shards(&dir, &UNEVEN);
    let kv = [
        ("batch_size", "4"),
        ("seed", "9"),
        ("shuffle_buffer", "8"),
        ("num_workers", "2"),
    ];
    let mut whole = loader(&pattern, &kv).unwrap();
    let first = epoch(&mut whole);
    let second = epoch(&mut whole);
    let mut l = loader(&pattern, &kv).unwrap();
    l.set_epoch(0).unwrap();
    assert_eq!(epoch(&mut l), first);
    l.set_epoch(1).unwrap();
    let b = l.next().unwrap().unwrap();
    assert_eq!(labels(&b), second[0]);
    let e = l.set_epoch(7).unwrap_err().to_string();
    assert!(e.contains("set_epoch(7)") && e.contains("streaming"), "{e}");
    let rest: Vec<Vec<i64>> = l.epoch_iter().map(|b| labels(&b.unwrap())).collect();
    assert_eq!(rest, second[1..]);
    fs::remove_dir_all(&dir).unwrap();
}

/// Spearman's rank correlation of a permutation of `0..n` with the identity.
fn spearman(order: &[i64]) -> f64 {
    let n = order.len() as f64;
    let d2: f64 = order
        .iter()
        .enumerate()
        .map(|(i, &x)| (i as f64 - x as f64).powi(2))
        .sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

#[test]
fn a_large_shuffle_buffer_decorrelates_delivered_and_storage_order() {
    let dir = tmp("spearman");
    // 6000 samples in 300 shards: storage order is the label.
    let pattern = write_shards(&dir, &[20; 300]);
    let epochs = |buffer: &str| -> Vec<Vec<i64>> {
        let mut l = loader(
            &pattern,
            &[
                ("batch_size", "50"),
                ("seed", "1234"),
                ("shuffle_buffer", buffer),
                ("num_workers", "2"),
            ],
        )
        .unwrap();
        (0..3).map(|_| epoch(&mut l).concat()).collect()
    };
    let adjacent = |o: &[i64]| o.windows(2).filter(|w| w[1] == w[0] + 1).count();
    for (e, order) in epochs("1000").iter().enumerate() {
        let rho = spearman(order);
        assert!(rho.abs() < 0.1, "epoch {e}: rho = {rho}");
        // Neighbours in storage are rarely neighbours when delivered.
        assert!(adjacent(order) < 30, "epoch {e}: {}", adjacent(order));
    }
    // A buffer of 1 keeps each shard's own order: the measures can fail.
    let plain = &epochs("1")[0];
    assert!(adjacent(plain) > 5000, "{}", adjacent(plain));
    assert!(
        plain
            .chunks(20)
            .all(|c| c[0] % 20 == 0 && c.windows(2).all(|w| w[1] == w[0] + 1)),
        "whole shards, each in its own order"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn raw_bytes_fields_pad_with_zero_without_pad_option() {
    let dir = tmp("raw");
    let pattern = write_shards(&dir, &[6, 4]);
    for buffer in ["0", "3"] {
        let mut o = LoaderOptions::new();
        for (k, v) in [
            ("source", format!("tar:{pattern}").as_str()),
            ("fields", "cls:label,txt:caption"),
            ("batch_size", "10"),
            ("shuffle_buffer", buffer),
            ("num_workers", "1"),
        ] {
            o.set(k, v).unwrap();
        }
        let mut l = Loader::new(&o).unwrap();
        let b = l.next().unwrap().unwrap();
        let caption = b.field_by_name("caption").unwrap();
        assert_eq!(caption.shape, &[10, 5]);
        let lengths: Vec<i64> = b
            .field_by_name("caption_lengths")
            .unwrap()
            .data
            .unwrap()
            .chunks_exact(8)
            .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        let data = caption.data.unwrap();
        for (i, label) in labels(&b).into_iter().enumerate() {
            let len = 1 + label as usize % 5;
            assert_eq!(lengths[i], len as i64);
            let row = &data[i * 5..(i + 1) * 5];
            assert!(row[..len].iter().all(|&c| c == b's'));
            assert!(row[len..].iter().all(|&c| c == 0), "padded with 0");
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gzip_shards_stream_and_are_refused_indexed() {
    let dir = tmp("gzip");
    let pattern = write_shards(&dir, &[5, 7]);
    for s in 0..2 {
        let plain = dir.join(format!("shard-{s:03}.tar"));
        let bytes = fs::read(&plain).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).unwrap();
        fs::write(
            dir.join(format!("shard-{s:03}.tar.gz")),
            gz.finish().unwrap(),
        )
        .unwrap();
        fs::remove_file(plain).unwrap();
    }
    let gz_pattern = format!("{pattern}.gz");
    for world in [1usize, 2] {
        let mut all = Vec::new();
        for rank in 0..world {
            let mut l = loader(
                &gz_pattern,
                &[
                    ("batch_size", "4"),
                    ("shuffle_buffer", "3"),
                    ("num_workers", "1"),
                    ("rank", &rank.to_string()),
                    ("world_size", &world.to_string()),
                ],
            )
            .unwrap();
            all.push(epoch(&mut l));
        }
        check_coverage(&all, 12, &format!("gzip world {world}"));
    }
    let e = loader(&gz_pattern, &[]).err().unwrap().to_string();
    assert!(e.contains("shuffle_buffer"), "{e}");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn streaming_shards_with_images_decode_and_transform() {
    let dir = tmp("images");
    let jpeg = fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/images/photo_baseline.jpg"),
    )
    .unwrap();
    let members: Vec<(String, Vec<u8>)> = (0..10)
        .flat_map(|i| {
            [
                (format!("{i:04}.jpg"), jpeg.clone()),
                (format!("{i:04}.cls"), (i % 3).to_string().into_bytes()),
            ]
        })
        .collect();
    write_tar(&dir.join("img.tar"), &members);
    let pattern = format!("{}/img.tar", dir.display());
    let run = |buffer: &str, workers: &str| {
        let mut o = LoaderOptions::new();
        for (k, v) in [
            ("source", format!("tar:{pattern}").as_str()),
            ("batch_size", "4"),
            ("shuffle_buffer", buffer),
            ("num_workers", workers),
            ("transform", "random_resized_crop(16) | hflip"),
            ("dtype", "uint8"),
            ("seed", "5"),
        ] {
            o.set(k, v).unwrap();
        }
        let mut l = Loader::new(&o).unwrap();
        let mut out = Vec::new();
        while let Some(b) = l.next().unwrap() {
            let image = b.field_by_name("image").unwrap();
            assert_eq!(image.shape[1..], [3, 16, 16]);
            out.push((image.data.unwrap().to_vec(), labels(&b)));
        }
        out
    };
    let a = run("4", "0");
    assert_eq!(a.len(), 3);
    assert_eq!(
        a,
        run("4", "2"),
        "augmentation is the same whatever num_workers"
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// Byte offset of the header of the member named `name`.
fn header_of(bytes: &[u8], name: &[u8]) -> usize {
    (0..bytes.len())
        .step_by(512)
        .find(|&at| bytes[at..].starts_with(name) && bytes[at + name.len()] == 0)
        .unwrap()
}

fn rewrite_checksum(header: &mut [u8]) {
    header[148..156].fill(b' ');
    let sum: u32 = header[..512].iter().map(|&b| b as u32).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

/// Three shards of 10 samples (labels 0..30); `damage` rewrites the bytes of the second.
fn damaged_set(dir: &Path, damage: impl Fn(&mut Vec<u8>)) -> String {
    let pattern = write_shards(dir, &[10, 10, 10]);
    let second = dir.join("shard-001.tar");
    let mut bytes = fs::read(&second).unwrap();
    damage(&mut bytes);
    fs::write(&second, bytes).unwrap();
    pattern
}

fn run_epoch(l: &mut Loader) -> (Vec<i64>, Vec<String>) {
    let mut labels_seen = Vec::new();
    let mut errors = Vec::new();
    for b in l.epoch_iter() {
        match b {
            Ok(b) => labels_seen.extend(labels(&b)),
            Err(e) => errors.push(e.to_string()),
        }
    }
    (labels_seen, errors)
}

#[test]
fn damaged_shards_fail_with_raise_and_keep_their_readable_part_with_skip() {
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Damage, Vec<&str>)> = vec![
        (
            "truncated",
            Box::new(|b: &mut Vec<u8>| {
                let at = header_of(b, b"k000016.txt");
                b.truncate(at + 512 + 1);
            }),
            vec!["member `k000016.txt`", "cut short", "byte offset"],
        ),
        (
            "checksum",
            Box::new(|b: &mut Vec<u8>| {
                let at = header_of(b, b"k000014.cls");
                b[at + 140] ^= 1;
            }),
            vec!["k000014.cls", "checksum", "byte offset"],
        ),
        (
            "cut-short",
            Box::new(|b: &mut Vec<u8>| {
                let at = header_of(b, b"k000017.cls");
                b[at + 124..at + 136].copy_from_slice(format!("{:011o}\0", 100_000).as_bytes());
                rewrite_checksum(&mut b[at..at + 512]);
            }),
            vec!["member `k000017.cls`", "cut short", "byte offset"],
        ),
        (
            "utf8",
            Box::new(|b: &mut Vec<u8>| {
                let at = header_of(b, b"k000015.txt");
                b[at + 2] = 0xff;
                rewrite_checksum(&mut b[at..at + 512]);
            }),
            vec!["not UTF-8", "byte offset"],
        ),
    ];
    for (name, damage, needles) in cases {
        let dir = tmp(&format!("damage-{name}"));
        let pattern = damaged_set(&dir, damage);
        for buffer in ["0", "5"] {
            let what = format!("{name}, shuffle_buffer={buffer}");
            let kv = [
                ("batch_size", "4"),
                ("shuffle_buffer", buffer),
                ("num_workers", "2"),
            ];
            let e = loader(&pattern, &kv).err().unwrap();
            let msg = e.to_string();
            assert!(msg.contains("shard-001.tar"), "{what}: {msg}");
            for n in &needles {
                assert!(msg.contains(n), "{what}: `{n}` not in {msg}");
            }

            let mut skip = kv.to_vec();
            skip.push(("on_error", "skip"));
            let mut l = loader(&pattern, &skip).unwrap();
            let (mut seen, errors) = run_epoch(&mut l);
            assert!(errors.is_empty(), "{what}: {errors:?}");
            seen.sort_unstable();
            let kept: Vec<i64> = seen
                .iter()
                .copied()
                .filter(|l| (10..20).contains(l))
                .collect();
            let others: Vec<i64> = seen
                .iter()
                .copied()
                .filter(|l| !(10..20).contains(l))
                .collect();
            assert_eq!(
                others,
                (0..10).chain(20..30).collect::<Vec<i64>>(),
                "{what}: the other shards whole"
            );
            assert_eq!(
                kept,
                (10..10 + kept.len() as i64).collect::<Vec<_>>(),
                "{what}: a prefix"
            );
            assert!(kept.len() < 10, "{what}");
            assert_eq!(
                l.stats().samples_skipped,
                1,
                "{what}: one damaged shard counted"
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_sample_without_its_field_fails_its_batch_or_is_replaced() {
    let dir = tmp("missing");
    let pattern = damaged_set(&dir, |b| {
        // k000013.cls becomes k000013.xyz: the sample has no label.
        let at = header_of(b, b"k000013.cls");
        b[at + 8..at + 11].copy_from_slice(b"xyz");
        rewrite_checksum(&mut b[at..at + 512]);
    });
    for buffer in ["0", "5"] {
        let what = format!("shuffle_buffer={buffer}");
        let kv = [
            ("batch_size", "4"),
            ("shuffle_buffer", buffer),
            ("num_workers", "2"),
        ];
        let mut l = loader(&pattern, &kv).unwrap();
        let (seen, errors) = run_epoch(&mut l);
        assert_eq!(errors.len(), 1, "{what}: {errors:?}");
        for n in [
            "shard-001.tar",
            "sample k000013",
            "offset",
            "no member for field `label`",
        ] {
            assert!(errors[0].contains(n), "{what}: `{n}` not in {}", errors[0]);
        }
        assert_eq!(seen.len(), 26, "{what}: the failed batch only is lost");
        // The next epoch runs: an error consumes its batch only.
        let (seen, errors) = run_epoch(&mut l);
        assert_eq!((seen.len(), errors.len()), (26, 1), "{what}");

        let mut skip = kv.to_vec();
        skip.push(("on_error", "skip"));
        let mut l = loader(&pattern, &skip).unwrap();
        let (mut seen, errors) = run_epoch(&mut l);
        assert!(errors.is_empty(), "{what}: {errors:?}");
        assert_eq!(seen.len(), 30, "{what}: replaced, not dropped");
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 29, "{what}: 13 replaced by another");
        assert!(!seen.contains(&13));
        assert_eq!(l.stats().samples_skipped, 1, "{what}");
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn streaming_to_a_device_matches_the_host_and_resumes() {
    use stoker_core::testing::FakeDevice;
    let dir = tmp("device");
    let pattern = write_shards(&dir, &UNEVEN);
    let kv = [
        ("batch_size", "4"),
        ("seed", "8"),
        ("shuffle_buffer", "6"),
        ("num_workers", "2"),
    ];
    let host = epoch(&mut loader(&pattern, &kv).unwrap());
    let mut o = LoaderOptions::new();
    o.set("source", &format!("tar:{pattern}")).unwrap();
    o.set("fields", "cls:label").unwrap();
    for (k, v) in kv {
        o.set(k, v).unwrap();
    }
    let fake = FakeDevice::new(0).unwrap();
    let read = |l: &mut Loader| -> Option<Vec<i64>> {
        let b = l.next().unwrap()?;
        b.synchronize().unwrap();
        let meta = b.field_meta(0).unwrap();
        let bytes = fake
            .read(b.field(0).unwrap().address, meta.num_bytes())
            .unwrap();
        Some(
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
                .collect(),
        )
    };
    let mut l = Loader::with_device_backend(&o, fake.clone()).unwrap();
    // set_epoch at the epoch's start changes nothing (batches copied ahead are kept); a jump
    // mid-epoch is refused and the loader goes on.
    l.set_epoch(0).unwrap();
    let mut device = Vec::new();
    for _ in 0..3 {
        device.push(read(&mut l).unwrap());
    }
    let e = l.set_epoch(4).unwrap_err().to_string();
    assert!(e.contains("streaming"), "{e}");
    let state = l.save_state();
    drop(l);
    o.set("resume_state", &state).unwrap();
    let mut l = Loader::with_device_backend(&o, fake.clone()).unwrap();
    l.set_epoch(0).unwrap();
    while let Some(b) = read(&mut l) {
        device.push(b);
    }
    assert_eq!(device, host);
    fs::remove_dir_all(&dir).unwrap();
}

/// One worker decodes every member, in indexed and streaming mode: a damaged JPEG member (the
/// kinds that left libjpeg-turbo's decompressor broken) fails or replaces only its own sample,
/// and every good one decodes to the pixels a shard without damage gives.
#[test]
fn a_damaged_jpeg_member_affects_only_its_own_sample() {
    let dir = tmp("damaged-members");
    let jpeg = fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/images/photo_baseline.jpg"),
    )
    .unwrap();
    let damaged: Vec<Vec<u8>> = stoker_core::testing::damaged_jpegs(&jpeg)
        .into_iter()
        .filter(|d| d.name.contains("Huffman") || d.name.contains("width zero"))
        .map(|d| d.bytes)
        .collect();
    assert_eq!(damaged.len(), 2);
    let shard = |name: &str, bad: bool| {
        let members: Vec<(String, Vec<u8>)> = (0..8)
            .flat_map(|i| {
                let image = match i {
                    2 | 5 if bad => damaged[usize::from(i == 5)].clone(),
                    _ => jpeg.clone(),
                };
                [
                    (format!("{i:04}.jpg"), image),
                    (format!("{i:04}.cls"), i.to_string().into_bytes()),
                ]
            })
            .collect();
        write_tar(&dir.join(name), &members);
        format!("{}/{name}", dir.display())
    };
    let (clean, bad) = (shard("clean.tar", false), shard("bad.tar", true));
    // A transform without randomness: a sample's pixels do not depend on its slot, so a
    // replacement can be checked against the clean shard too.
    let run = |pattern: &str, buffer: &str, on_error: &str| {
        let mut o = LoaderOptions::new();
        for (k, v) in [
            ("source", format!("tar:{pattern}").as_str()),
            // Two: a streamed sample is replaced by another of its batch.
            ("batch_size", "2"),
            ("shuffle_buffer", buffer),
            ("num_workers", "1"),
            ("transform", "resize(48) | center_crop(40)"),
            ("dtype", "uint8"),
            ("on_error", on_error),
        ] {
            o.set(k, v).unwrap();
        }
        let mut l = Loader::new(&o).unwrap();
        let mut out = BTreeMap::new();
        let mut errors = 0;
        loop {
            match l.next() {
                Ok(Some(b)) => {
                    let image = b.field_by_name("image").unwrap().data.unwrap();
                    let rows = image.chunks_exact(image.len() / 2);
                    for (label, row) in labels(&b).into_iter().zip(rows) {
                        out.insert(label, row.to_vec());
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    assert!(e.to_string().contains("bad.tar"), "{e}");
                    errors += 1;
                }
            }
        }
        (out, errors, l.stats().samples_skipped)
    };
    for buffer in ["0", "4"] {
        let (expected, _, _) = run(&clean, buffer, "raise");
        assert_eq!(expected.len(), 8);
        // Samples 2 and 5 fail their batches (of two) under raise.
        let (good, errors, _) = run(&bad, buffer, "raise");
        assert_eq!(errors, 2, "shuffle_buffer={buffer}");
        assert_eq!(good.len(), 4, "shuffle_buffer={buffer}");
        for (label, image) in &good {
            assert!(
                image == &expected[label],
                "shuffle_buffer={buffer}: sample {label}"
            );
        }
        let (delivered, _, skipped) = run(&bad, buffer, "skip");
        assert_eq!(skipped, 2, "shuffle_buffer={buffer}");
        for (label, image) in &delivered {
            assert!(
                image == &expected[label],
                "shuffle_buffer={buffer}, skip: sample {label}"
            );
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}
