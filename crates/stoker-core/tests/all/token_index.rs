//! The cache of Megatron index tables: the first open builds it beside the data, later opens
//! load it (the same samples, the file not rewritten); a dataset changed in size, mtime or
//! header, or a damaged cache file, is never trusted: the tables are built again. Ranks opening
//! the same datasets at once each leave a whole cache file.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use stoker_core::source::tokens::{Boundaries, Packing};
use stoker_core::source::{Source, TokenConfig, TokenSource, TokenSpec};
use stoker_core::DType;

use crate::support::files::tmp;
use crate::tokens::write_megatron;

pub(crate) fn config(packing: Packing) -> TokenConfig {
    TokenConfig {
        seq_len: 5,
        boundaries: Boundaries::Reset,
        output: DType::I64,
        raw: None,
        eos: None,
        vocab_size: None,
        tokenizer: None,
        text_column: "text".into(),
        packing,
        pad_token: 0,
    }
}

/// Every sample of `spec`, each field's bytes.
pub(crate) fn samples(spec: &TokenSpec, packing: Packing) -> Vec<Vec<Vec<u8>>> {
    let source = TokenSource::open(spec, &config(packing)).unwrap_or_else(|e| panic!("{e}"));
    let mut scratch = Vec::new();
    (0..source.len())
        .map(|i| {
            let s = source.read(i, &mut scratch).unwrap();
            (0..source.fields().len())
                .map(|f| s.get(f).to_vec())
                .collect()
        })
        .collect()
}

/// `n` documents whose lengths are `lengths` cycled, tokens distinct, seeded by `base`.
pub(crate) fn docs(lengths: &[usize], base: i64) -> Vec<Vec<i64>> {
    lengths
        .iter()
        .enumerate()
        .map(|(d, &len)| (0..len as i64).map(|k| base + 100 * d as i64 + k).collect())
        .collect()
}

/// The cache file beside `prefix`'s index.
fn cache_of(prefix: &Path) -> PathBuf {
    let name = prefix.file_name().unwrap().to_string_lossy();
    prefix.with_file_name(format!(".{name}.idx.stkidx"))
}

fn inode(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .ino()
}

/// The samples of documents `docs` written fresh to a directory of their own (no cache).
pub(crate) fn fresh(tag: &str, sets: &[Vec<Vec<i64>>], packing: Packing) -> Vec<Vec<Vec<u8>>> {
    let dir = tmp(tag);
    let names: Vec<String> = (0..sets.len())
        .map(|k| {
            let p = dir.join(format!("p{k}"));
            write_megatron(&p, 8, &sets[k]);
            p.display().to_string()
        })
        .collect();
    let got = samples(&TokenSpec::Megatron(names.join(",")), packing);
    std::fs::remove_dir_all(&dir).unwrap();
    got
}

#[test]
fn a_second_open_loads_the_cached_tables_and_gives_the_same_samples() {
    let dir = tmp("token-cache-hit");
    let sets = [docs(&[3, 9, 1, 4], 1000), docs(&[7, 2, 6], 5000)];
    let prefixes: Vec<PathBuf> = (0..2).map(|k| dir.join(format!("part-{k}"))).collect();
    for (p, d) in prefixes.iter().zip(&sets) {
        write_megatron(p, 8, d);
    }
    let spec = TokenSpec::Megatron(format!("{}/part-{{0..1}}", dir.display()));
    for packing in [Packing::Concat, Packing::Pad] {
        let first = samples(&spec, packing);
        let inodes: Vec<u64> = prefixes.iter().map(|p| inode(&cache_of(p))).collect();
        assert!(!first.is_empty());
        assert_eq!(
            samples(&spec, packing),
            first,
            "{packing:?}: from the cache"
        );
        let again: Vec<u64> = prefixes.iter().map(|p| inode(&cache_of(p))).collect();
        assert_eq!(again, inodes, "a good cache is loaded, not written again");
    }
    // A pattern never names a cache file.
    let listed: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Writes `documents` as the Megatron dataset at `prefix` over the one there, then sets both
/// files' mtimes back to what they were, as `utime` (or a copy keeping times) can.
fn rewrite_keeping_mtimes(prefix: &Path, documents: &[Vec<i64>]) {
    let files = ["idx", "bin"].map(|ext| PathBuf::from(format!("{}.{ext}", prefix.display())));
    let before = files
        .clone()
        .map(|p| std::fs::metadata(p).unwrap().modified().unwrap());
    write_megatron(prefix, 8, documents);
    for (p, t) in files.iter().zip(before) {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
}

#[test]
fn a_changed_dataset_is_indexed_again() {
    let dir = tmp("token-cache-stale");
    let prefix = dir.join("data");
    let spec = TokenSpec::Megatron(prefix.display().to_string());

    // A different size (more tokens, a newer mtime).
    write_megatron(&prefix, 8, &docs(&[4, 4, 4], 10));
    samples(&spec, Packing::Pad);
    let longer = docs(&[4, 4, 4, 8], 10);
    write_megatron(&prefix, 8, &longer);
    assert_eq!(
        samples(&spec, Packing::Pad),
        fresh("token-cache-stale-a", &[longer], Packing::Pad)
    );

    // The same sizes and mtimes, another index: documents of other lengths. The header hash
    // (the index's header and tail) tells them apart.
    let moved = docs(&[8, 4, 4, 4], 10);
    rewrite_keeping_mtimes(&prefix, &moved);
    assert_eq!(
        samples(&spec, Packing::Pad),
        fresh("token-cache-stale-b", &[moved], Packing::Pad)
    );

    // The same sizes, mtimes, header and tail: two documents at the start swap lengths, in an
    // index longer than the tail hashed. The inode and ctime tell them apart (`utime` sets
    // mtime back, never ctime).
    let mut lengths = vec![2, 6];
    lengths.extend([4; 3000]);
    write_megatron(&prefix, 8, &docs(&lengths, 10));
    samples(&spec, Packing::Pad);
    lengths.swap(0, 1);
    let swapped = docs(&lengths, 10);
    rewrite_keeping_mtimes(&prefix, &swapped);
    assert_eq!(
        samples(&spec, Packing::Pad),
        fresh("token-cache-stale-c", &[swapped], Packing::Pad)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_damaged_cache_is_built_again_never_trusted() {
    let dir = tmp("token-cache-corrupt");
    let prefix = dir.join("data");
    let spec = TokenSpec::Megatron(prefix.display().to_string());
    let data = docs(&[3, 5, 2, 9, 4, 6], 300);
    write_megatron(&prefix, 8, &data);
    let want = samples(&spec, Packing::Concat);
    let cache = cache_of(&prefix);
    let good = std::fs::read(&cache).unwrap();
    let mut damaged = Vec::new();
    // A flipped byte in the header, in the tables, and at the end; a truncated file; another
    // file altogether.
    for at in [0, 20, 111, 120, good.len() - 1] {
        let mut b = good.clone();
        b[at] ^= 0x40;
        damaged.push(b);
    }
    damaged.push(good[..good.len() - 8].to_vec());
    damaged.push(b"not a cache".to_vec());
    for (k, bytes) in damaged.iter().enumerate() {
        std::fs::write(&cache, bytes).unwrap();
        assert_eq!(samples(&spec, Packing::Concat), want, "damage {k}");
        assert_eq!(
            std::fs::read(&cache).unwrap(),
            good,
            "damage {k}: rewritten"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ranks_opening_at_once_each_leave_a_whole_cache() {
    let dir = tmp("token-cache-race");
    let sets: Vec<Vec<Vec<i64>>> = (0..12)
        .map(|k| docs(&[5, 1, 7, 3, 2, 8, 4][..3 + k % 5], 1000 * k as i64))
        .collect();
    for (k, d) in sets.iter().enumerate() {
        write_megatron(&dir.join(format!("p{k}")), 8, d);
    }
    let spec = TokenSpec::Megatron(format!("{}/p{{0..11}}", dir.display()));
    let want = fresh("token-cache-race-ref", &sets, Packing::Concat);
    let ranks = 8;
    let barrier = std::sync::Barrier::new(ranks);
    std::thread::scope(|s| {
        for _ in 0..ranks {
            s.spawn(|| {
                barrier.wait();
                assert_eq!(samples(&spec, Packing::Concat), want);
            });
        }
    });
    // Whole files only: every one loads (no rewrite on the next open), and no temporary is
    // left behind.
    let inodes: Vec<u64> = (0..12)
        .map(|k| inode(&cache_of(&dir.join(format!("p{k}")))))
        .collect();
    assert_eq!(samples(&spec, Packing::Concat), want);
    let again: Vec<u64> = (0..12)
        .map(|k| inode(&cache_of(&dir.join(format!("p{k}")))))
        .collect();
    assert_eq!(again, inodes);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Writes a uint16 Megatron dataset whose sequences lie in `.bin` in reverse order and whose
/// documents are runs of sequences (`doc_index`, as with sentence splitting).
fn write_scattered(prefix: &Path, seqs: &[Vec<i64>], doc_index: &[i64]) {
    let mut idx = b"MMIDIDX\x00\x00".to_vec();
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(8);
    idx.extend_from_slice(&(seqs.len() as u64).to_le_bytes());
    idx.extend_from_slice(&(doc_index.len() as u64).to_le_bytes());
    for s in seqs {
        idx.extend_from_slice(&(s.len() as i32).to_le_bytes());
    }
    let mut bin = Vec::new();
    let mut pointers = vec![0i64; seqs.len()];
    for (k, s) in seqs.iter().enumerate().rev() {
        pointers[k] = bin.len() as i64;
        for &t in s {
            bin.extend_from_slice(&(t as u16).to_le_bytes());
        }
    }
    for p in pointers {
        idx.extend_from_slice(&p.to_le_bytes());
    }
    for d in doc_index {
        idx.extend_from_slice(&d.to_le_bytes());
    }
    std::fs::write(format!("{}.idx", prefix.display()), idx).unwrap();
    std::fs::write(format!("{}.bin", prefix.display()), bin).unwrap();
}

#[test]
fn scattered_sequences_and_multi_sequence_documents_are_cached_too() {
    let dir = tmp("token-cache-scattered");
    let prefix = dir.join("s");
    let seqs = docs(&[2, 3, 4, 1, 5, 3], 7);
    // Documents: sequences 0-1, 2, 3-5.
    write_scattered(&prefix, &seqs, &[0, 2, 3, 6]);
    let spec = TokenSpec::Megatron(prefix.display().to_string());
    let joined: Vec<Vec<i64>> = vec![seqs[..2].concat(), seqs[2].clone(), seqs[3..].concat()];
    for packing in [Packing::Concat, Packing::Pad] {
        let want = fresh(
            "token-cache-scattered-ref",
            std::slice::from_ref(&joined),
            packing,
        );
        assert_eq!(samples(&spec, packing), want, "{packing:?}: built");
        let at = inode(&cache_of(&prefix));
        assert_eq!(samples(&spec, packing), want, "{packing:?}: loaded");
        assert_eq!(inode(&cache_of(&prefix)), at);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
