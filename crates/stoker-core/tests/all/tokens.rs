//! Token streams: Megatron indexed datasets and flat token files cut into windows, checked
//! token for token against a reference computed here in plain Rust; one global order dealt in
//! global batches, the same union at every world size; resume across world sizes, workers and
//! micro-batch sizes; bad files named at open.
//!
//! megatron-core is not installed here: `write_megatron` writes `.idx`/`.bin` pairs following
//! the format as Megatron-LM's `_IndexWriter` writes it (see `source::tokens::megatron`).

use std::path::{Path, PathBuf};

use stoker_core::{Batch, DType, Loader, LoaderOptions};

use crate::support::files::tmp;

/// Writes `prefix.idx` and `prefix.bin`: one sequence per document, tokens of Megatron type
/// `code` (8: uint16, 4: int32).
pub(crate) fn write_megatron(prefix: &Path, code: u8, docs: &[Vec<i64>]) {
    let size: usize = match code {
        8 => 2,
        4 => 4,
        _ => panic!("test writer: code {code}"),
    };
    let mut bin = Vec::new();
    let mut idx = b"MMIDIDX\x00\x00".to_vec();
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(code);
    idx.extend_from_slice(&(docs.len() as u64).to_le_bytes());
    idx.extend_from_slice(&(docs.len() as u64 + 1).to_le_bytes());
    for d in docs {
        idx.extend_from_slice(&(d.len() as i32).to_le_bytes());
    }
    let mut pointer = 0i64;
    for d in docs {
        idx.extend_from_slice(&pointer.to_le_bytes());
        pointer += (d.len() * size) as i64;
        for &t in d {
            match size {
                2 => bin.extend_from_slice(&(t as u16).to_le_bytes()),
                _ => bin.extend_from_slice(&(t as i32).to_le_bytes()),
            }
        }
    }
    for k in 0..=docs.len() as i64 {
        idx.extend_from_slice(&k.to_le_bytes());
    }
    let with = |ext: &str| PathBuf::from(format!("{}{ext}", prefix.display()));
    std::fs::write(with(".idx"), idx).unwrap();
    std::fs::write(with(".bin"), bin).unwrap();
}

/// `n` documents of varying lengths with distinct tokens, seeded by `base`.
fn documents(n: usize, base: i64) -> Vec<Vec<i64>> {
    (0..n)
        .map(|d| {
            let len = 3 + (d * 7 + base as usize) % 17;
            (0..len as i64).map(|k| base + d as i64 * 100 + k).collect()
        })
        .collect()
}

/// The stream and where its documents start, as the reference sees them.
struct Reference {
    tokens: Vec<i64>,
    starts: Vec<usize>,
}

impl Reference {
    fn of(datasets: &[Vec<Vec<i64>>]) -> Reference {
        let mut tokens = Vec::new();
        let mut starts = Vec::new();
        for docs in datasets {
            for d in docs {
                starts.push(tokens.len());
                tokens.extend_from_slice(d);
            }
        }
        Reference { tokens, starts }
    }

    fn samples(&self, seq: usize) -> usize {
        (self.tokens.len() - 1) / seq
    }

    fn input(&self, i: usize, seq: usize) -> Vec<i64> {
        self.tokens[i * seq..i * seq + seq].to_vec()
    }

    fn labels(&self, i: usize, seq: usize) -> Vec<i64> {
        self.tokens[i * seq + 1..i * seq + seq + 1].to_vec()
    }

    /// Documents starting strictly inside the window, as offsets, between 0 and `seq`.
    fn cu_seqlens(&self, i: usize, seq: usize) -> Vec<i64> {
        let s = i * seq;
        let mut cu = vec![0];
        cu.extend(
            self.starts
                .iter()
                .filter(|&&d| d > s && d < s + seq)
                .map(|&d| (d - s) as i64),
        );
        cu.push(seq as i64);
        cu
    }

    fn positions(&self, i: usize, seq: usize) -> Vec<i64> {
        let s = i * seq;
        (s..s + seq)
            .map(|t| {
                let doc = self.starts.iter().copied().filter(|&d| d <= t).max();
                (t - doc.unwrap_or(0).max(s)) as i64
            })
            .collect()
    }
}

/// Field `name`'s rows as i64, whatever its integer type.
fn rows(batch: &Batch, name: &str) -> Vec<Vec<i64>> {
    let f = batch.field_by_name(name).unwrap();
    let data = f.data.unwrap();
    let width: usize = f.shape[1..].iter().product();
    let values: Vec<i64> = match f.dtype {
        DType::I64 => data
            .chunks_exact(8)
            .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
            .collect(),
        DType::I32 => data
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_ne_bytes(c.try_into().unwrap())))
            .collect(),
        DType::U8 => data.iter().map(|&b| i64::from(b)).collect(),
        other => panic!("{name} is {other}"),
    };
    values.chunks(width.max(1)).map(<[i64]>::to_vec).collect()
}

fn loader(kv: &[(&str, &str)]) -> Loader {
    Loader::new(&opts(kv)).unwrap_or_else(|e| panic!("{kv:?}: {e}"))
}

fn opts(kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new();
    for (k, v) in kv {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    o
}

/// The next batch, passing over epoch ends.
fn next(l: &mut Loader) -> Batch {
    for _ in 0..2 {
        if let Some(b) = l.next().unwrap() {
            return b;
        }
    }
    panic!("two epoch ends in a row");
}

#[test]
fn megatron_samples_are_token_exact_windows_of_the_documents() {
    let dir = tmp("megatron-windows");
    let (a, b) = (documents(9, 1000), documents(5, 50_000));
    write_megatron(&dir.join("web"), 8, &a);
    write_megatron(&dir.join("code"), 4, &b);
    let reference = Reference::of(&[a, b]);
    let seq = 7;
    let source = format!(
        "megatron:{},{}",
        dir.join("web").display(),
        dir.join("code").display()
    );
    let mut l = loader(&[
        ("source", &source),
        ("seq_len", "7"),
        ("document_boundaries", "reset"),
        ("batch_size", "3"),
        ("num_workers", "2"),
    ]);
    let n = reference.samples(seq);
    assert_eq!(l.source().map(|s| s.len()), Some(n));
    let mut i = 0;
    for batch in l.epoch_iter() {
        let batch = batch.unwrap();
        let (input, labels) = (rows(&batch, "input_ids"), rows(&batch, "labels"));
        let (positions, cu) = (rows(&batch, "position_ids"), rows(&batch, "cu_seqlens"));
        let lengths = rows(&batch, "cu_seqlens_lengths");
        for slot in 0..batch.len() {
            assert_eq!(input[slot], reference.input(i, seq), "input_ids of {i}");
            assert_eq!(labels[slot], reference.labels(i, seq), "labels of {i}");
            assert_eq!(
                positions[slot],
                reference.positions(i, seq),
                "position_ids of {i}"
            );
            let want = reference.cu_seqlens(i, seq);
            let len = lengths[slot][0] as usize;
            assert_eq!(cu[slot][..len], want[..], "cu_seqlens of {i}");
            assert!(
                cu[slot][len..].iter().all(|&p| p == seq as i64),
                "padded with seq_len: {:?}",
                cu[slot]
            );
            i += 1;
        }
    }
    // Global batches of batch_size × world_size = 3: the tail shorter than one is not dealt.
    assert_eq!(i, n / 3 * 3);
}

#[test]
fn flat_token_files_raw_and_npy_with_an_end_of_document_token() {
    let dir = tmp("flat-tokens");
    const EOS: i64 = 9;
    // Documents end with EOS; file ends end documents too.
    let docs: Vec<Vec<i64>> = (0..6)
        .map(|d| {
            let mut doc: Vec<i64> = (0..(2 + d * 3) as i64)
                .map(|k| 100 + d as i64 * 10 + k)
                .collect();
            doc.push(EOS);
            doc
        })
        .collect();
    let raw: Vec<u8> = docs[..3]
        .concat()
        .iter()
        .flat_map(|&t| (t as u16).to_le_bytes())
        .collect();
    std::fs::write(dir.join("part-0.bin"), raw).unwrap();
    let npy: Vec<u8> = docs[3..]
        .concat()
        .iter()
        .flat_map(|&t| (t as u32).to_le_bytes())
        .collect();
    // The .npy header as NumPy writes it for a 1-D '<u4' array.
    let n = docs[3..].concat().len();
    let dict = format!("{{'descr': '<u4', 'fortran_order': False, 'shape': ({n},), }}");
    let mut header = dict.into_bytes();
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut file = b"\x93NUMPY\x01\x00".to_vec();
    file.extend_from_slice(&(header.len() as u16).to_le_bytes());
    file.extend_from_slice(&header);
    file.extend_from_slice(&npy);
    std::fs::write(dir.join("part-1.npy"), file).unwrap();

    // The reference's documents: after each EOS, and at the file boundary (also after an EOS).
    let reference = Reference::of(&[docs]);
    let seq = 4;
    let pattern = format!("tokens:{}/part-{{0..1}}.*", dir.display());
    let pattern = pattern.replace("{0..1}.*", "*");
    let mut l = loader(&[
        ("source", &pattern),
        ("seq_len", "4"),
        ("token_dtype", "uint16"),
        ("eos_token", "9"),
        ("token_output_dtype", "int32"),
        ("document_boundaries", "reset"),
        ("batch_size", "2"),
        ("num_workers", "0"),
    ]);
    let mut i = 0;
    for batch in l.epoch_iter() {
        let batch = batch.unwrap();
        assert_eq!(batch.field_by_name("input_ids").unwrap().dtype, DType::I32);
        let (input, labels) = (rows(&batch, "input_ids"), rows(&batch, "labels"));
        let (positions, cu) = (rows(&batch, "position_ids"), rows(&batch, "cu_seqlens"));
        let lengths = rows(&batch, "cu_seqlens_lengths");
        for slot in 0..batch.len() {
            assert_eq!(input[slot], reference.input(i, seq), "input_ids of {i}");
            assert_eq!(labels[slot], reference.labels(i, seq), "labels of {i}");
            assert_eq!(
                positions[slot],
                reference.positions(i, seq),
                "position_ids of {i}"
            );
            let len = lengths[slot][0] as usize;
            assert_eq!(
                cu[slot][..len],
                reference.cu_seqlens(i, seq)[..],
                "cu of {i}"
            );
            i += 1;
        }
    }
    assert_eq!(i, reference.samples(seq) / 2 * 2);
}

/// A shuffled Megatron dataset of 101 samples of seq_len 4 and the keys of its loaders.
fn resumable(name: &str) -> (String, Reference) {
    let dir = tmp(name);
    let docs = documents(40, 7);
    write_megatron(&dir.join("data"), 8, &docs);
    let reference = Reference::of(&[docs]);
    (
        format!("megatron:{}", dir.join("data").display()),
        reference,
    )
}

/// Global batches `0..count` of a one-process job (batch_size = G): each a list of samples'
/// input_ids.
fn single_process(source: &str, g: usize, count: usize) -> Vec<Vec<Vec<i64>>> {
    single_process_with(source, &[], g, count)
}

/// [`single_process`] with `extra` keys.
fn single_process_with(
    source: &str,
    extra: &[(&str, &str)],
    g: usize,
    count: usize,
) -> Vec<Vec<Vec<i64>>> {
    let gs = g.to_string();
    let mut kv = vec![
        ("source", source),
        ("seq_len", "4"),
        ("shuffle", "true"),
        ("seed", "11"),
        ("batch_size", &gs),
        ("global_batch_size", &gs),
        ("num_workers", "1"),
    ];
    kv.extend_from_slice(extra);
    let mut l = loader(&kv);
    (0..count)
        .map(|_| rows(&next(&mut l), "input_ids"))
        .collect()
}

/// The ranks of a `world`-rank job with micro-batches of `batch`, resumed from `state`.
fn job(
    source: &str,
    g: usize,
    world: usize,
    batch: usize,
    workers: usize,
    state: Option<&str>,
) -> Vec<Loader> {
    job_with(source, &[], g, world, batch, workers, state)
}

/// [`job`] with `extra` keys.
fn job_with(
    source: &str,
    extra: &[(&str, &str)],
    g: usize,
    world: usize,
    batch: usize,
    workers: usize,
    state: Option<&str>,
) -> Vec<Loader> {
    (0..world)
        .map(|rank| {
            let (gs, ws, r, b, w) = (
                g.to_string(),
                world.to_string(),
                rank.to_string(),
                batch.to_string(),
                workers.to_string(),
            );
            let mut kv = vec![
                ("source", source),
                ("seq_len", "4"),
                ("shuffle", "true"),
                ("seed", "11"),
                ("batch_size", b.as_str()),
                ("global_batch_size", gs.as_str()),
                ("rank", r.as_str()),
                ("world_size", ws.as_str()),
                ("num_workers", w.as_str()),
            ];
            kv.extend_from_slice(extra);
            if let Some(s) = state {
                kv.push(("resume_state", s));
            }
            loader(&kv)
        })
        .collect()
}

/// One global step of a job: every rank's micro-batches of the step, ranks in order.
fn step(ranks: &mut [Loader], g: usize) -> Vec<Vec<i64>> {
    let world = ranks.len();
    let mut union = Vec::new();
    for l in ranks.iter_mut() {
        let mut mine = Vec::new();
        while mine.len() < g / world {
            mine.extend(rows(&next(l), "input_ids"));
        }
        assert_eq!(mine.len(), g / world, "a micro-batch crossed a step");
        union.extend(mine);
    }
    union
}

/// Every rank's state, checked identical.
fn state(ranks: &[Loader]) -> String {
    let states: Vec<String> = ranks.iter().map(Loader::save_state).collect();
    assert!(
        states.windows(2).all(|w| w[0] == w[1]),
        "ranks disagree: {states:#?}"
    );
    states[0].clone()
}

#[test]
fn every_world_size_delivers_the_same_global_batches() {
    let (source, reference) = resumable("global-batches");
    let g = 24;
    let epoch = reference.samples(4) / g;
    let want = single_process(&source, g, 2 * epoch);
    // Each global batch is a set of whole samples, and an epoch covers distinct ones.
    let first: std::collections::BTreeSet<_> = want[..epoch].concat().into_iter().collect();
    assert_eq!(first.len(), epoch * g, "an epoch repeats a sample");
    for (world, batch, workers) in [
        (1, 6, 2),
        (2, 3, 0),
        (3, 8, 3),
        (4, 2, 1),
        (6, 4, 4),
        (8, 3, 2),
    ] {
        let mut ranks = job(&source, g, world, batch, workers, None);
        for (b, global) in want.iter().enumerate() {
            assert_eq!(
                &step(&mut ranks, g),
                global,
                "global batch {b} at world_size {world}, batch_size {batch}"
            );
        }
    }
}

#[test]
fn resume_continues_bit_exactly_at_another_world_size() {
    let (source, reference) = resumable("resume-world");
    let g = 24;
    let epoch = reference.samples(4) / g;
    assert_eq!(
        epoch, 4,
        "the plan below crosses epoch boundaries at 4 and 8"
    );
    let want = single_process(&source, g, 14);
    let mut got = Vec::new();

    // 8 ranks, micro-batches of 1, in the calling thread: three steps and part of a fourth.
    let mut ranks = job(&source, g, 8, 1, 0, None);
    for _ in 0..3 {
        got.push(step(&mut ranks, g));
    }
    for l in ranks.iter_mut() {
        next(l);
    }
    let mut saved = state(&ranks);
    assert!(
        saved.contains("epoch=0;consumed=72;"),
        "the partial step is not counted: {saved}"
    );
    drop(ranks);

    // 6 ranks, micro-batches of 2, 4 workers: across the first epoch boundary.
    let mut ranks = job(&source, g, 6, 2, 4, Some(&saved));
    for _ in 0..3 {
        got.push(step(&mut ranks, g));
    }
    saved = state(&ranks);
    assert!(saved.contains("epoch=1;consumed=48;"), "{saved}");
    drop(ranks);

    // Back at 8 ranks, then two resumes in a row, each from the state the last one saved, the
    // last across the second epoch boundary.
    for (steps, batch, workers) in [(2, 3, 2), (1, 1, 0), (5, 3, 1)] {
        let mut ranks = job(&source, g, 8, batch, workers, Some(&saved));
        for _ in 0..steps {
            got.push(step(&mut ranks, g));
        }
        saved = state(&ranks);
    }
    assert_eq!(got.len(), want.len());
    for (b, (g_got, g_want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g_got, g_want, "global batch {b}");
    }
    assert!(saved.contains("epoch=3;consumed=48;"), "{saved}");
}

#[test]
fn a_changed_token_setting_is_named_on_resume() {
    let (source, _) = resumable("resume-changed");
    let mut ranks = job(&source, 24, 2, 4, 0, None);
    step(&mut ranks, 24);
    let saved = state(&ranks);
    for (key, value, needle) in [
        ("seq_len", "5", "seq_len (4 there, 5 here)"),
        (
            "global_batch_size",
            "48",
            "global_batch_size (24 there, 48 here)",
        ),
        (
            "document_boundaries",
            "reset",
            "document_boundaries (ignore there, reset here)",
        ),
        (
            "token_output_dtype",
            "int32",
            "token_output_dtype (int64 there, int32 here)",
        ),
        (
            "token_packing",
            "pad",
            "token_packing (concat there, pad here)",
        ),
    ] {
        let mut o = opts(&[
            ("source", &source),
            ("seq_len", "4"),
            ("shuffle", "true"),
            ("seed", "11"),
            ("batch_size", "4"),
            ("global_batch_size", "24"),
            ("resume_state", &saved),
        ]);
        o.set(key, value).unwrap();
        let e = Loader::new(&o)
            .expect_err("a changed setting resumes")
            .to_string();
        assert!(e.contains(needle), "{key}: {e}");
    }
    // allow_config_change carries the count over: the next global batch is the second of the
    // new configuration's epoch 0.
    let mut o = opts(&[
        ("source", &source),
        ("seq_len", "5"),
        ("shuffle", "true"),
        ("seed", "11"),
        ("batch_size", "24"),
        ("global_batch_size", "24"),
        ("resume_state", &saved),
    ]);
    let e = Loader::new(&o).expect_err("seq_len changed").to_string();
    assert!(e.contains("seq_len (4 there, 5 here)"), "{e}");
    o.set("allow_config_change", "true").unwrap();
    let mut resumed = Loader::new(&o).unwrap();
    let mut fresh = Loader::new(&opts(&[
        ("source", &source),
        ("seq_len", "5"),
        ("shuffle", "true"),
        ("seed", "11"),
        ("batch_size", "24"),
    ]))
    .unwrap();
    next(&mut fresh);
    assert_eq!(
        rows(&next(&mut resumed), "input_ids"),
        rows(&next(&mut fresh), "input_ids")
    );
    // The micro-batch size may change: the position is counted in global batches.
    let o = opts(&[
        ("source", &source),
        ("seq_len", "4"),
        ("shuffle", "true"),
        ("seed", "11"),
        ("batch_size", "12"),
        ("global_batch_size", "24"),
        ("resume_state", &saved),
    ]);
    assert!(Loader::new(&o).is_ok());
}

#[test]
fn a_global_batch_that_does_not_divide_names_the_numbers() {
    let (source, _) = resumable("global-divide");
    let o = opts(&[
        ("source", &source),
        ("seq_len", "4"),
        ("batch_size", "5"),
        ("global_batch_size", "24"),
        ("rank", "1"),
        ("world_size", "2"),
    ]);
    let e = Loader::new(&o).expect_err("24 / (2 × 5)").to_string();
    assert!(
        e.contains("global_batch_size")
            && e.contains("24")
            && e.contains("world_size 2")
            && e.contains("batch_size 5"),
        "{e}"
    );
    let e = Loader::new(&opts(&[("source", &source)]))
        .expect_err("no seq_len")
        .to_string();
    assert!(e.contains("seq_len") && e.contains("required"), "{e}");
    // Keys of flat files on a Megatron source, and token keys on another source, name the key.
    let e = Loader::new(&opts(&[
        ("source", &source),
        ("seq_len", "4"),
        ("eos_token", "2"),
    ]))
    .expect_err("eos_token on megatron")
    .to_string();
    assert!(
        e.contains("`eos_token`") && e.contains("tokens:PATTERN"),
        "{e}"
    );
    let npy = tmp("not-tokens").join("x.npy");
    stoker_core::source::write_npy(&npy, DType::U8, &[4, 2], &[0; 8]).unwrap();
    let e = Loader::new(&opts(&[
        ("source", &format!("npy:{}", npy.display())),
        ("seq_len", "4"),
    ]))
    .expect_err("seq_len on npy")
    .to_string();
    assert!(
        e.contains("`seq_len`") && e.contains("token sources only"),
        "{e}"
    );
}

#[test]
fn bad_files_are_errors_at_open_naming_the_file() {
    let dir = tmp("megatron-bad");
    let docs = documents(4, 3);
    let prefix = dir.join("d");
    let idx_path = dir.join("d.idx");
    let bin_path = dir.join("d.bin");
    let open = |extra: &[(&str, &str)]| {
        let source = format!("megatron:{}", prefix.display());
        let mut kv = vec![("source", source.as_str()), ("seq_len", "4")];
        kv.extend_from_slice(extra);
        Loader::new(&opts(&kv)).err().map(|e| e.to_string())
    };
    write_megatron(&prefix, 8, &docs);
    assert_eq!(open(&[]), None, "the good dataset opens");
    let good_idx = std::fs::read(&idx_path).unwrap();
    let good_bin = std::fs::read(&bin_path).unwrap();

    let mut magic = good_idx.clone();
    magic[0] = b'N';
    let mut version = good_idx.clone();
    version[9] = 3;
    let mut float = good_idx.clone();
    float[17] = 7;
    let mut count = good_idx.clone();
    count[18..26].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let cases: Vec<(Vec<u8>, Vec<u8>, &str, &PathBuf)> = vec![
        (magic, good_bin.clone(), "magic", &idx_path),
        (version, good_bin.clone(), "version 3", &idx_path),
        (float, good_bin.clone(), "float32", &idx_path),
        (count, good_bin.clone(), "truncated", &idx_path),
        (
            good_idx[..good_idx.len() - 8].to_vec(),
            good_bin.clone(),
            "truncated",
            &idx_path,
        ),
        (
            good_idx.clone(),
            good_bin[..good_bin.len() - 2].to_vec(),
            "outside",
            &bin_path,
        ),
        (
            good_idx.clone(),
            [&good_bin[..], &[0, 0]].concat(),
            "trailing bytes",
            &bin_path,
        ),
    ];
    for (idx, bin, needle, names) in cases {
        std::fs::write(&idx_path, &idx).unwrap();
        std::fs::write(&bin_path, &bin).unwrap();
        let e = open(&[]).expect("a bad dataset opens");
        assert!(e.contains(needle), "{needle}: {e}");
        assert!(e.contains(&names.display().to_string()), "{needle}: {e}");
    }
    std::fs::write(&idx_path, &good_idx).unwrap();
    std::fs::write(&bin_path, &good_bin).unwrap();
    // Token ids are checked against vocab_size only when it is set.
    let largest = docs.concat().into_iter().max().unwrap();
    let vocab = largest.to_string();
    let e = open(&[("vocab_size", &vocab)]).expect("a token id at vocab_size");
    let path = bin_path.display().to_string();
    assert!(
        e.contains(&format!("{path}: token {largest} at sequence "))
            && e.matches(&path).count() == 1,
        "the file once, then the place in it: {e}"
    );
    let vocab = (largest + 1).to_string();
    assert_eq!(open(&[("vocab_size", &vocab)]), None);
    // A raw flat file needs its type, and must hold whole tokens.
    std::fs::write(dir.join("odd.bin"), [1u8, 2, 3]).unwrap();
    let flat = format!("tokens:{}", dir.join("odd.bin").display());
    let e = Loader::new(&opts(&[("source", &flat), ("seq_len", "1")]))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("token_dtype"), "{e}");
    let e = Loader::new(&opts(&[
        ("source", &flat),
        ("seq_len", "1"),
        ("token_dtype", "uint16"),
    ]))
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("odd.bin") && e.contains("whole number"), "{e}");

    // An epoch without one global batch is refused, not delivered as no batch at all (a loop
    // counted in steps would spin through empty epochs).
    let total: usize = docs.iter().map(Vec::len).sum();
    let too_long = (total + 1).to_string();
    let e = open(&[("seq_len", &too_long)]).expect("no sample of that seq_len");
    assert!(e.contains("seq_len") && e.contains("no sample"), "{e}");
    let e = open(&[("global_batch_size", "1000")]).expect("fewer samples than a batch");
    assert!(
        e.contains("global_batch_size") && e.contains("fewer than one global batch of 1000"),
        "{e}"
    );
    // An eos_token the file's type cannot hold would end no document.
    std::fs::write(dir.join("u16.bin"), [1u8, 0, 2, 0, 9, 0]).unwrap();
    let flat = format!("tokens:{}", dir.join("u16.bin").display());
    let e = Loader::new(&opts(&[
        ("source", &flat),
        ("seq_len", "1"),
        ("token_dtype", "uint16"),
        ("eos_token", "128001"),
    ]))
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("eos_token") && e.contains("128001 cannot occur") && e.contains("u16.bin"),
        "{e}"
    );
}

/// Megatron's greedy apportioning, written out again for the test: sample `k` goes to the
/// dataset with the largest `weight · max(k, 1) − count`, the first on a tie.
fn greedy(weights: &[f64], n: usize) -> Vec<usize> {
    let sum: f64 = weights.iter().sum();
    let mut counts = vec![0usize; weights.len()];
    (0..n)
        .map(|k| {
            let at = (k as f64).max(1.0);
            let errors: Vec<f64> = weights
                .iter()
                .zip(&counts)
                .map(|(w, &c)| w / sum * at - c as f64)
                .collect();
            let best = (0..errors.len())
                .fold(0, |best, d| if errors[d] > errors[best] { d } else { best });
            counts[best] += 1;
            best
        })
        .collect()
}

#[test]
fn a_blend_apportions_greedily_and_wraps_a_short_dataset_in_new_orders() {
    let dir = tmp("blend");
    let (big, small) = (documents(30, 1000), documents(6, 70_000));
    write_megatron(&dir.join("web"), 8, &big);
    let flat: Vec<u8> = small
        .concat()
        .iter()
        .flat_map(|&t| (t as u32).to_le_bytes())
        .collect();
    std::fs::write(dir.join("code-0.bin"), flat).unwrap();
    let seq = 4;
    let refs = [Reference::of(&[big]), Reference::of(&[small])];
    let lens = [refs[0].samples(seq), refs[1].samples(seq)];
    // Which (dataset, sample) a window of input_ids is: every token is distinct.
    let mut which = std::collections::HashMap::new();
    for (d, r) in refs.iter().enumerate() {
        for i in 0..lens[d] {
            which.insert(r.input(i, seq), (d, i));
        }
    }
    let blend = format!(
        "0.5:megatron:{},0.5:tokens:{}/code-*.bin",
        dir.join("web").display(),
        dir.display()
    );
    let n = lens[0] + lens[1];
    let ns = n.to_string();
    let mut l = loader(&[
        ("blend", &blend),
        ("seq_len", "4"),
        ("token_dtype", "uint32"),
        ("batch_size", &ns),
        ("num_workers", "2"),
        ("seed", "5"),
    ]);
    let got: Vec<(usize, usize)> = rows(&next(&mut l), "input_ids")
        .into_iter()
        .map(|row| which[&row])
        .collect();
    let datasets: Vec<usize> = got.iter().map(|&(d, _)| d).collect();
    assert_eq!(datasets, greedy(&[0.5, 0.5], n));
    let mut counts = [0usize; 2];
    for (k, &d) in datasets.iter().enumerate() {
        counts[d] += 1;
        for c in counts {
            assert!(
                (c as f64 - 0.5 * (k + 1) as f64).abs() <= 1.0,
                "after {k}: {counts:?}"
            );
        }
    }
    // The short dataset wraps: its first pass in order, each later one a permutation.
    let small_seen: Vec<usize> = got.iter().filter(|p| p.0 == 1).map(|p| p.1).collect();
    assert!(small_seen.len() > 2 * lens[1], "the plan needs two wraps");
    let passes: Vec<&[usize]> = small_seen.chunks(lens[1]).collect();
    assert_eq!(passes[0], (0..lens[1]).collect::<Vec<_>>());
    for pass in &passes[1..passes.len() - 1] {
        let mut sorted = pass.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..lens[1]).collect::<Vec<_>>());
        assert_ne!(*pass, passes[0], "a later pass in a new order");
    }
    // The big dataset is read once, in order, as far as its share goes.
    let big_seen: Vec<usize> = got.iter().filter(|p| p.0 == 0).map(|p| p.1).collect();
    assert_eq!(big_seen, (0..big_seen.len()).collect::<Vec<_>>());
    // A pure function of the configuration: another loader gives the same, and a changed
    // weight is a changed source on resume.
    let mut again = loader(&[
        ("blend", &blend),
        ("seq_len", "4"),
        ("token_dtype", "uint32"),
        ("batch_size", &ns),
        ("num_workers", "0"),
        ("seed", "5"),
    ]);
    let again: Vec<(usize, usize)> = rows(&next(&mut again), "input_ids")
        .into_iter()
        .map(|row| which[&row])
        .collect();
    assert_eq!(again, got);
    let saved = l.save_state();
    let changed = blend.replacen("0.5:", "0.6:", 1);
    let e = Loader::new(&opts(&[
        ("blend", &changed),
        ("seq_len", "4"),
        ("token_dtype", "uint32"),
        ("batch_size", &ns),
        ("seed", "5"),
        ("resume_state", &saved),
    ]))
    .expect_err("a changed blend resumes")
    .to_string();
    assert!(e.contains("its source"), "{e}");
    // A resumed blend continues with the seed it was saved with, as any resumed loader does.
    let mut resumed = Loader::new(&opts(&[
        ("blend", &blend),
        ("seq_len", "4"),
        ("token_dtype", "uint32"),
        ("batch_size", &ns),
        ("seed", "6"),
        ("resume_state", &saved),
    ]))
    .unwrap();
    assert_eq!(
        rows(&next(&mut resumed), "input_ids"),
        rows(&next(&mut l), "input_ids")
    );
}

/// One sample under `token_packing=pad`, as the reference builds it from a document: its
/// fields as i64 rows.
struct Padded {
    input: Vec<i64>,
    labels: Vec<i64>,
    loss_mask: Vec<i64>,
    positions: Vec<i64>,
    cu_seqlens: Vec<i64>,
}

impl Padded {
    /// The document's first `seq + 1` tokens, padded with `pad`; the mask 1 where the label is
    /// the document's own next token; the padding a segment of its own.
    fn of(doc: &[i64], seq: usize, pad: i64) -> Padded {
        let mut window: Vec<i64> = doc.iter().copied().take(seq + 1).collect();
        let real = window.len();
        window.resize(seq + 1, pad);
        let loss_mask = (0..seq).map(|k| i64::from(k + 1 < real)).collect();
        let inputs = real.min(seq);
        let positions = (0..seq)
            .map(|k| if k < inputs { k } else { k - inputs } as i64)
            .collect();
        let cu_seqlens = if inputs > 0 && inputs < seq {
            vec![0, inputs as i64, seq as i64]
        } else {
            vec![0, seq as i64]
        };
        Padded {
            input: window[..seq].to_vec(),
            labels: window[1..].to_vec(),
            loss_mask,
            positions,
            cu_seqlens,
        }
    }
}

/// Documents of every length around `seq + 1`: empty, one token, shorter, `seq`, `seq + 1`,
/// `seq + 2` and much longer, distinct tokens from `base`.
fn ragged_documents(seq: usize, base: i64) -> Vec<Vec<i64>> {
    [3, 0, seq, 1, seq + 1, seq + 2, 5 * seq, seq - 1, 2]
        .iter()
        .enumerate()
        .map(|(d, &len)| (0..len as i64).map(|k| base + d as i64 * 100 + k).collect())
        .collect()
}

#[test]
fn padded_samples_are_each_document_truncated_or_padded_with_a_loss_mask() {
    let dir = tmp("pad-megatron");
    let seq = 6;
    let (a, b) = (ragged_documents(seq, 1000), ragged_documents(seq, 40_000));
    write_megatron(&dir.join("web"), 8, &a);
    write_megatron(&dir.join("code"), 4, &b);
    let docs: Vec<Vec<i64>> = a.iter().chain(&b).cloned().collect();
    let source = format!(
        "megatron:{},{}",
        dir.join("web").display(),
        dir.join("code").display()
    );
    for (output, boundaries, pad) in [
        ("int64", "reset", "7"),
        ("int32", "reset", "0"),
        ("int64", "ignore", "3"),
    ] {
        let pad_value: i64 = pad.parse().unwrap();
        let mut l = loader(&[
            ("source", &source),
            ("seq_len", "6"),
            ("token_packing", "pad"),
            ("pad_token", pad),
            ("token_output_dtype", output),
            ("document_boundaries", boundaries),
            ("batch_size", "3"),
            ("num_workers", "2"),
        ]);
        assert_eq!(
            l.source().map(|s| s.len()),
            Some(docs.len()),
            "one sample a document, the empty one included"
        );
        let mut i = 0;
        for batch in l.epoch_iter() {
            let batch = batch.unwrap();
            let mask = batch.field_by_name("loss_mask").unwrap();
            assert_eq!((mask.dtype, mask.shape), (DType::U8, &[3, seq][..]));
            assert_eq!(
                batch.field_by_name("position_ids").is_some(),
                boundaries == "reset"
            );
            let (input, labels) = (rows(&batch, "input_ids"), rows(&batch, "labels"));
            let loss_mask = rows(&batch, "loss_mask");
            for slot in 0..batch.len() {
                let want = Padded::of(&docs[i], seq, pad_value);
                assert_eq!(input[slot], want.input, "input_ids of document {i}");
                assert_eq!(labels[slot], want.labels, "labels of document {i}");
                assert_eq!(loss_mask[slot], want.loss_mask, "loss_mask of document {i}");
                if boundaries == "reset" {
                    assert_eq!(rows(&batch, "position_ids")[slot], want.positions, "{i}");
                    let len = rows(&batch, "cu_seqlens_lengths")[slot][0] as usize;
                    assert_eq!(
                        rows(&batch, "cu_seqlens")[slot][..len],
                        want.cu_seqlens[..],
                        "cu_seqlens of document {i}"
                    );
                }
                i += 1;
            }
        }
        assert_eq!(i, docs.len(), "{output} {boundaries}");
    }
    // The cases the reference covers, spelled out for one: a document of `seq` tokens has
    // inputs all its own and one padded label.
    let exact = Padded::of(&a[2], seq, 7);
    assert_eq!(exact.loss_mask, [1, 1, 1, 1, 1, 0]);
    assert_eq!(exact.labels[seq - 1], 7);
    assert_eq!(exact.cu_seqlens, [0, seq as i64]);
    let long = Padded::of(&a[6], seq, 7);
    assert_eq!(long.labels, a[6][1..=seq]);
    assert_eq!(long.loss_mask, [1; 6]);
}

#[test]
fn padding_takes_a_flat_file_without_eos_as_one_document_and_refuses_one_with_eos() {
    let dir = tmp("pad-flat");
    let seq = 5;
    let files: [Vec<i64>; 3] = [
        (100..103).collect(),
        (200..220).collect(),
        (300..306).collect(),
    ];
    for (k, doc) in files.iter().enumerate() {
        let raw: Vec<u8> = doc.iter().flat_map(|&t| (t as u16).to_le_bytes()).collect();
        std::fs::write(dir.join(format!("doc-{k}.bin")), raw).unwrap();
    }
    let pattern = format!("tokens:{}/doc-{{0..2}}.bin", dir.display());
    let mut l = loader(&[
        ("source", &pattern),
        ("seq_len", "5"),
        ("token_dtype", "uint16"),
        ("token_packing", "pad"),
        ("pad_token", "1"),
        ("batch_size", "3"),
    ]);
    let batch = next(&mut l);
    for (k, doc) in files.iter().enumerate() {
        let want = Padded::of(doc, seq, 1);
        assert_eq!(rows(&batch, "input_ids")[k], want.input, "file {k}");
        assert_eq!(rows(&batch, "labels")[k], want.labels, "file {k}");
        assert_eq!(rows(&batch, "loss_mask")[k], want.loss_mask, "file {k}");
    }
    // With eos_token the documents are known only by reading every token: refused, saying
    // what to do.
    let e = Loader::new(&opts(&[
        ("source", &pattern),
        ("seq_len", "5"),
        ("token_dtype", "uint16"),
        ("eos_token", "205"),
        ("token_packing", "pad"),
    ]))
    .expect_err("pad over eos_token")
    .to_string();
    assert!(
        e.contains("`token_packing`")
            && e.contains("doc-0.bin")
            && e.contains("megatron:PREFIX")
            && e.contains("token_packing=concat"),
        "{e}"
    );
    // pad_token without pad, and one that does not fit the output type, name the key.
    let e = Loader::new(&opts(&[
        ("source", &pattern),
        ("seq_len", "5"),
        ("token_dtype", "uint16"),
        ("pad_token", "1"),
    ]))
    .expect_err("pad_token under concat")
    .to_string();
    assert!(
        e.contains("`pad_token`") && e.contains("token_packing=pad"),
        "{e}"
    );
    let e = Loader::new(&opts(&[
        ("source", &pattern),
        ("seq_len", "5"),
        ("token_dtype", "uint16"),
        ("token_packing", "pad"),
        ("pad_token", "4294967296"),
        ("token_output_dtype", "int32"),
    ]))
    .expect_err("a pad token beyond int32")
    .to_string();
    assert!(e.contains("`pad_token`") && e.contains("int32"), "{e}");
    let e = Loader::new(&opts(&[
        ("source", &pattern),
        ("seq_len", "5"),
        ("token_dtype", "uint16"),
        ("token_packing", "pad"),
        ("pad_token", "400"),
        ("vocab_size", "400"),
    ]))
    .expect_err("a pad token outside the vocabulary")
    .to_string();
    assert!(
        e.contains("`pad_token`") && e.contains("vocab_size 400"),
        "{e}"
    );
    let e = LoaderOptions::new()
        .set("token_packing", "pack")
        .expect_err("an unknown packing")
        .to_string();
    assert!(e.contains("concat or pad"), "{e}");
}

#[test]
fn a_blend_of_padded_sources_is_a_blend_of_their_documents() {
    let dir = tmp("pad-blend");
    let seq = 4;
    let (big, small) = (ragged_documents(seq, 1000), ragged_documents(seq, 70_000));
    let big: Vec<Vec<i64>> = big.iter().chain(&documents(6, 5000)).cloned().collect();
    let small = small[..4].to_vec();
    write_megatron(&dir.join("web"), 8, &big);
    write_megatron(&dir.join("code"), 4, &small);
    let sets = [big, small];
    let blend = format!(
        "0.5:megatron:{},0.5:megatron:{}",
        dir.join("web").display(),
        dir.join("code").display()
    );
    let n = sets[0].len() + sets[1].len();
    let ns = n.to_string();
    let mut l = loader(&[
        ("blend", &blend),
        ("seq_len", "4"),
        ("token_packing", "pad"),
        ("pad_token", "9"),
        ("document_boundaries", "reset"),
        ("batch_size", &ns),
        ("seed", "5"),
    ]);
    let batch = next(&mut l);
    let (input, mask) = (rows(&batch, "input_ids"), rows(&batch, "loss_mask"));
    let positions = rows(&batch, "position_ids");
    let datasets = greedy(&[0.5, 0.5], n);
    let mut seen = [Vec::new(), Vec::new()];
    for (k, &d) in datasets.iter().enumerate() {
        // Which document of dataset `d` sample `k` is: within a dataset the padded forms are
        // distinct (one empty document each).
        let j = (0..sets[d].len())
            .find(|&j| Padded::of(&sets[d][j], seq, 9).input == input[k])
            .unwrap_or_else(|| panic!("sample {k} is no document of dataset {d}"));
        let want = Padded::of(&sets[d][j], seq, 9);
        assert_eq!(mask[k], want.loss_mask, "loss_mask of sample {k}");
        assert_eq!(positions[k], want.positions, "position_ids of sample {k}");
        seen[d].push(j);
    }
    // The big dataset in order as far as its share goes; the small one wraps, its first pass
    // in order, each later pass a permutation.
    assert_eq!(seen[0], (0..seen[0].len()).collect::<Vec<_>>());
    let passes: Vec<&[usize]> = seen[1].chunks(sets[1].len()).collect();
    assert!(passes.len() > 2, "the plan needs two wraps");
    assert_eq!(passes[0], (0..sets[1].len()).collect::<Vec<_>>());
    for pass in &passes[1..passes.len() - 1] {
        let mut sorted = pass.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..sets[1].len()).collect::<Vec<_>>());
    }
}

#[test]
fn padded_resume_continues_bit_exactly_at_another_world_size() {
    let dir = tmp("pad-resume");
    let docs: Vec<Vec<i64>> = documents(60, 7);
    write_megatron(&dir.join("data"), 8, &docs);
    let source = format!("megatron:{}", dir.join("data").display());
    let pad = [("token_packing", "pad"), ("document_boundaries", "reset")];
    let g = 12;
    // 60 documents: 5 global batches an epoch; the plan crosses the boundary at 5.
    let want = single_process_with(&source, &pad, g, 9);
    let every: std::collections::BTreeSet<_> = want[..5].concat().into_iter().collect();
    let padded: std::collections::BTreeSet<_> =
        docs.iter().map(|d| Padded::of(d, 4, 0).input).collect();
    assert_eq!(every, padded, "an epoch is every document once");
    let mut got = Vec::new();

    let mut ranks = job_with(&source, &pad, g, 4, 1, 0, None);
    for _ in 0..2 {
        got.push(step(&mut ranks, g));
    }
    for l in ranks.iter_mut() {
        next(l);
    }
    let mut saved = state(&ranks);
    assert!(
        saved.contains("epoch=0;consumed=24;") && saved.contains(";token_packing=pad;"),
        "{saved}"
    );
    drop(ranks);
    for (world, batch, workers, steps) in [(3, 2, 2, 4), (6, 1, 1, 3)] {
        let mut ranks = job_with(&source, &pad, g, world, batch, workers, Some(&saved));
        for _ in 0..steps {
            got.push(step(&mut ranks, g));
        }
        saved = state(&ranks);
    }
    assert_eq!(got.len(), want.len());
    for (b, (g_got, g_want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g_got, g_want, "global batch {b}");
    }
    assert!(saved.contains("epoch=1;consumed=48;"), "{saved}");
    // A changed packing or pad token is named.
    let e = Loader::new(&opts(&[
        ("source", &source),
        ("seq_len", "4"),
        ("shuffle", "true"),
        ("seed", "11"),
        ("batch_size", "12"),
        ("global_batch_size", "12"),
        ("document_boundaries", "reset"),
        ("resume_state", &saved),
    ]))
    .expect_err("pad resumed as concat")
    .to_string();
    assert!(e.contains("token_packing (pad there, concat here)"), "{e}");
    let mut o = opts(&[
        ("source", &source),
        ("seq_len", "4"),
        ("shuffle", "true"),
        ("seed", "11"),
        ("batch_size", "12"),
        ("global_batch_size", "12"),
        ("resume_state", &saved),
    ]);
    for (k, v) in pad.iter().chain(&[("pad_token", "5")]) {
        o.set(k, v).unwrap();
    }
    let e = Loader::new(&o).expect_err("another pad token").to_string();
    assert!(e.contains("its pad_token (0 there, 5 here)"), "{e}");
}
