//! Many ranks: every sampler dealt to ranks in equal shares, elastic exact resume across world
//! sizes, the resume fingerprint, `set_epoch`, and launcher variables reaching the loader.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use stoker_core::testing::counting_indices;
use stoker_core::{Batch, Launcher, Loader, LoaderOptions, Sample, Source, SourceSpec};

use crate::support::{counting_source, options};

/// One rank's loader over `n` counting samples.
fn rank_loader(n: usize, kv: &[(&str, &str)], rank: usize, world: usize) -> Loader {
    let (r, w) = (rank.to_string(), world.to_string());
    let mut all: Vec<(&str, &str)> = kv.to_vec();
    all.extend([("rank", r.as_str()), ("world_size", w.as_str())]);
    Loader::new(&options(counting_source(n), &all)).unwrap()
}

fn ids(b: &Batch) -> Vec<i64> {
    counting_indices(b)
}

/// The rest of the current epoch, batch by batch.
fn rest(l: &mut Loader) -> Vec<Vec<i64>> {
    l.epoch_iter().map(|b| ids(&b.unwrap())).collect()
}

/// An epoch's global order: the one rank of a one-process job, in one batch.
fn global_order(n: usize, kv: &[(&str, &str)], epoch: u64) -> Vec<i64> {
    let mut all: Vec<(&str, &str)> = kv
        .iter()
        .copied()
        .filter(|(k, _)| *k != "batch_size" && *k != "drop_last")
        .collect();
    let b = n.max(1).to_string();
    all.push(("batch_size", b.as_str()));
    let mut l = rank_loader(n, &all, 0, 1);
    l.set_epoch(epoch).unwrap();
    rest(&mut l).concat()
}

/// `order` dealt to `world` ranks as DistributedSampler deals (padding by repeating the head).
fn dealt(order: &[i64], world: usize, drop_last: bool) -> Vec<Vec<i64>> {
    let m = order.len();
    let per = if drop_last {
        m / world
    } else {
        m.div_ceil(world)
    };
    (0..world)
        .map(|r| (0..per).map(|j| order[(r + j * world) % m]).collect())
        .collect()
}

fn multiset(v: impl IntoIterator<Item = i64>) -> BTreeMap<i64, usize> {
    let mut m = BTreeMap::new();
    for i in v {
        *m.entry(i).or_default() += 1;
    }
    m
}

const SAMPLERS: &[&[(&str, &str)]] = &[
    &[],
    &[("shuffle", "true")],
    &[("replacement", "true"), ("num_samples", "30")],
    &[("num_samples", "40")],
    &[("weights", "1,2,0,4,1,1,1,1,3,1,1,1,1,1,1,1,1,1,1,1,1,1,1")],
    &[("subset", "3..20")],
    &[("indices", "22,0,5,5,9,1..4")],
    &[("shuffle", "true"), ("shard_drop_last", "true")],
];

#[test]
fn every_sampler_is_dealt_to_ranks_in_equal_shares_of_one_global_order() {
    let n = 23;
    for sampler in SAMPLERS {
        let mut kv = sampler.to_vec();
        kv.extend([("batch_size", "3"), ("seed", "5"), ("num_workers", "2")]);
        let drop = kv.contains(&("shard_drop_last", "true"));
        for epoch in [0u64, 2] {
            let order = global_order(n, &kv, epoch);
            for world in 1..=4 {
                let shares: Vec<Vec<i64>> = (0..world)
                    .map(|r| {
                        let mut l = rank_loader(n, &kv, r, world);
                        l.set_epoch(epoch).unwrap();
                        let batches = rest(&mut l);
                        assert_eq!(batches.len(), l.batches_per_epoch(), "{kv:?}");
                        batches.concat()
                    })
                    .collect();
                assert_eq!(
                    shares,
                    dealt(&order, world, drop),
                    "{kv:?}, world {world}, epoch {epoch}"
                );
            }
        }
    }
}

/// Runs `world` ranks for `k` batches each and returns their (equal) saved state with what
/// they delivered.
fn run_and_save(n: usize, kv: &[(&str, &str)], world: usize, k: usize) -> (String, Vec<i64>) {
    let mut states = Vec::new();
    let mut seen = Vec::new();
    for r in 0..world {
        let mut l = rank_loader(n, kv, r, world);
        for _ in 0..k {
            seen.extend(ids(&l.next().unwrap().expect("mid-epoch")));
        }
        states.push(l.save_state());
    }
    assert!(
        states.iter().all(|s| *s == states[0]),
        "every rank writes the same state: {states:?}"
    );
    (states.remove(0), seen)
}

#[test]
fn elastic_resume_deals_the_rest_of_the_epoch_to_the_new_ranks() {
    let n = 29;
    let weighted = [("weights", "1,2,3"), ("num_samples", "29")];
    for sampler in [&[("shuffle", "true")][..], &weighted[..], &[][..]] {
        let mut kv = sampler.to_vec();
        kv.extend([("batch_size", "2"), ("seed", "11"), ("num_workers", "2")]);
        let n = if kv[0].0 == "weights" { 3 } else { n };
        for (w, w2, k) in [
            (2, 3, 3),
            (3, 2, 2),
            (1, 4, 5),
            (4, 1, 1),
            (2, 2, 4),
            (3, 5, 0),
        ] {
            let (state, before) = run_and_save(n, &kv, w, k);
            let order = global_order(n, &kv, 0);
            let consumed = (k * 2 * w).min(order.len());
            assert_eq!(
                multiset(before.iter().copied()),
                multiset(order[..consumed].iter().copied()),
                "{kv:?}: {w} ranks x {k} batches consumed exactly the order's prefix"
            );
            // Resume at w2 ranks: the rest of epoch 0, then epoch 1 as a fresh w2 job runs it.
            let mut after = Vec::new();
            let mut next_epoch = Vec::new();
            let mut counts = Vec::new();
            for r in 0..w2 {
                let (rs, ws) = (r.to_string(), w2.to_string());
                let mut o = options(counting_source(n), &kv);
                o.set("rank", &rs).unwrap();
                o.set("world_size", &ws).unwrap();
                o.set("resume_state", &state).unwrap();
                let mut l = Loader::new(&o).unwrap();
                assert_eq!(l.epoch(), 0);
                let mine = rest(&mut l);
                counts.push(mine.len());
                after.push(mine.concat());
                next_epoch.push(rest(&mut l).concat());
            }
            assert!(
                counts.iter().all(|c| *c == counts[0]),
                "equal batches per rank"
            );
            assert_eq!(
                after,
                dealt(&order[consumed..], w2, false),
                "{kv:?}: {w}→{w2} after {k} batches: {state}"
            );
            let fresh: Vec<Vec<i64>> = (0..w2)
                .map(|r| {
                    let mut l = rank_loader(n, &kv, r, w2);
                    l.set_epoch(1).unwrap();
                    rest(&mut l).concat()
                })
                .collect();
            assert_eq!(next_epoch, fresh, "{kv:?}: the next epoch is a whole one");
        }
    }
}

#[test]
fn a_state_saved_after_a_resume_resumes_again() {
    // 2 ranks stop after 2 batches, 3 ranks go on for 1 batch and stop, 1 rank finishes.
    let kv = [("batch_size", "2"), ("shuffle", "true"), ("seed", "3")];
    let n = 31;
    let order = global_order(n, &kv, 0);
    let (s1, mut seen) = run_and_save(n, &kv, 2, 2);
    let mut states = Vec::new();
    for r in 0..3 {
        let mut o = options(counting_source(n), &kv);
        o.set("rank", &r.to_string()).unwrap();
        o.set("world_size", "3").unwrap();
        o.set("resume_state", &s1).unwrap();
        let mut l = Loader::new(&o).unwrap();
        seen.extend(ids(&l.next().unwrap().unwrap()));
        states.push(l.save_state());
    }
    assert!(states.iter().all(|s| *s == states[0]));
    let mut o = options(counting_source(n), &kv);
    o.set("resume_state", &states[0]).unwrap();
    let mut l = Loader::new(&o).unwrap();
    seen.extend(rest(&mut l).concat());
    assert_eq!(multiset(seen), multiset(order), "each sample exactly once");
}

/// With `in_order=false` a rank may have delivered batches out of order, so each rank saves
/// its own state, which names the rank: each rank resumes from its own, and a rank given
/// another's (the habit of checkpointing rank 0's only) is refused, where it lost samples.
#[test]
fn an_out_of_order_state_is_its_ranks_own_and_resumes_that_rank_only() {
    let kv = [
        ("batch_size", "4"),
        ("shuffle", "true"),
        ("in_order", "false"),
        ("num_workers", "2"),
    ];
    let mut states = Vec::new();
    let mut seen = Vec::new();
    for r in 0..2 {
        let mut l = rank_loader(30, &kv, r, 2);
        for _ in 0..2 {
            seen.extend(ids(&l.next().unwrap().expect("mid-epoch")));
        }
        let state = l.save_state();
        assert!(state.ends_with(&format!(";rank={r}")), "{state}");
        states.push(state);
    }
    let resumed = |state: &str, rank: usize, world: usize| {
        let (r, w) = (rank.to_string(), world.to_string());
        let mut o = options(counting_source(30), &kv);
        for (k, v) in [
            ("rank", r.as_str()),
            ("world_size", &w),
            ("resume_state", state),
        ] {
            o.set(k, v).unwrap();
        }
        Loader::new(&o)
    };
    for (r, state) in states.iter().enumerate() {
        seen.extend(rest(&mut resumed(state, r, 2).unwrap()).concat());
    }
    assert_eq!(
        multiset(seen),
        multiset(0..30),
        "each rank from its own state"
    );
    for (rank, world) in [(1, 2), (0, 3)] {
        let e = resumed(&states[0], rank, world).err().unwrap().to_string();
        assert!(
            e.contains("saved by rank 0 of 2 with in_order=false")
                && e.contains(&format!("this is rank {rank} of {world}")),
            "{e}"
        );
    }
}

#[test]
fn resume_fingerprint_mismatches_name_what_differs() {
    let kv = [("batch_size", "4"), ("shuffle", "true")];
    let (state, _) = run_and_save(30, &kv, 2, 1);
    let resume = |n: usize, kv: &[(&str, &str)]| {
        let mut o = options(counting_source(n), kv);
        o.set("world_size", "3").unwrap();
        o.set("rank", "0").unwrap();
        o.set("resume_state", &state).unwrap();
        Loader::new(&o).err().map(|e| e.to_string())
    };
    assert_eq!(resume(30, &kv), None, "another world size is fine");
    for (n, kv, needle) in [
        (
            30,
            vec![("batch_size", "3"), ("shuffle", "true")],
            "batch_size (4 there, 3 here)",
        ),
        (
            31,
            kv.to_vec(),
            "its source (30 samples there; here 31 samples",
        ),
        (30, vec![("batch_size", "4")], "its sampler settings"),
        (
            30,
            vec![
                ("batch_size", "4"),
                ("shuffle", "true"),
                ("drop_last", "true"),
            ],
            "drop_last (false there, true here)",
        ),
        (
            30,
            vec![
                ("batch_size", "4"),
                ("shuffle", "true"),
                ("shard_drop_last", "true"),
            ],
            "shard_drop_last",
        ),
    ] {
        let e = resume(n, &kv).unwrap_or_else(|| panic!("{kv:?} resumed"));
        assert!(
            e.contains("resume_state") && e.contains(needle),
            "{kv:?}: {e}"
        );
    }
    // The same length but other data: the fields differ.
    let other: Arc<dyn Source> = Arc::new(
        stoker_core::MemorySource::new()
            .with_tensor("y", stoker_core::DType::U8, &[], vec![0; 30])
            .unwrap(),
    );
    let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(other));
    for (k, v) in kv {
        o.set(k, v).unwrap();
    }
    o.set("resume_state", &state).unwrap();
    let e = Loader::new(&o).err().unwrap().to_string();
    assert!(
        e.contains("its source (of as many samples, 30, but other files, fields or labels")
            && e.contains("here: 30 samples of y uint8 []"),
        "{e}"
    );
}

/// An npy source's labels are part of its identity, by their values: resuming with another
/// labels file (or the same file rewritten) is refused, where it trained on the wrong labels.
#[test]
fn a_resume_with_other_labels_is_refused() {
    let dir = crate::support::files::tmp("resume-labels");
    let data: Vec<u8> = (0..20).collect();
    stoker_core::source::write_npy(&dir.join("x.npy"), stoker_core::DType::U8, &[20], &data)
        .unwrap();
    let labels = |name: &str, values: Vec<i64>| {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let path = dir.join(name);
        stoker_core::source::write_npy(&path, stoker_core::DType::I64, &[20], &bytes).unwrap();
        format!("npy:{}", path.display())
    };
    let (y, reversed) = (
        labels("y.npy", (0..20).collect()),
        labels("z.npy", (0..20).rev().collect()),
    );
    let source = format!("npy:{}", dir.join("x.npy").display());
    let loader = |labels: &str, state: Option<&str>| {
        let mut o = LoaderOptions::new();
        for (k, v) in [
            ("source", source.as_str()),
            ("labels", labels),
            ("batch_size", "4"),
        ] {
            o.set(k, v).unwrap();
        }
        if let Some(state) = state {
            o.set("resume_state", state).unwrap();
        }
        Loader::new(&o)
    };
    let mut l = loader(&y, None).unwrap();
    l.next().unwrap();
    let state = l.save_state();
    assert!(loader(&y, Some(&state)).is_ok());
    let e = loader(&reversed, Some(&state)).err().unwrap().to_string();
    assert!(e.contains("labels from z.npy"), "{e}");
    // The same file name, other values.
    let rewritten = labels("y.npy", (0..20).map(|v| v % 3).collect());
    assert_eq!(rewritten, y);
    let e = loader(&y, Some(&state)).err().unwrap().to_string();
    assert!(e.contains("other files, fields or labels"), "{e}");
}

/// stoker 0.1's states: an order without draws resumes at the same world size; a drawn one
/// cannot be replayed (0.1 mixed its keys differently), which the error says with what to do.
#[test]
fn first_format_states_still_resume_at_the_same_world_size() {
    let v1 = "stoker-state-v1;seed=7;epoch=0;position=3;ahead=;batches=8";
    let kv = [("batch_size", "4"), ("seed", "7")];
    let mut full = Loader::new(&options(counting_source(30), &kv)).unwrap();
    let uninterrupted = rest(&mut full);
    let mut o = options(counting_source(30), &kv);
    o.set("resume_state", v1).unwrap();
    let mut l = Loader::new(&o).unwrap();
    assert_eq!(rest(&mut l), uninterrupted[3..]);
    let mut o = options(
        counting_source(30),
        &[("batch_size", "4"), ("shuffle", "true"), ("seed", "7")],
    );
    o.set("resume_state", v1).unwrap();
    let e = Loader::new(&o).err().unwrap().to_string();
    assert!(
        e.contains("saved by stoker 0.1") && e.contains("set_epoch(0) without resume_state"),
        "{e}"
    );
    let mut o = options(counting_source(30), &[("batch_size", "3")]);
    o.set(
        "resume_state",
        "stoker-state-v1;seed=7;epoch=0;position=3;ahead=;batches=8",
    )
    .unwrap();
    let e = Loader::new(&o).err().unwrap().to_string();
    assert!(e.contains("8 batches per epoch"), "{e}");
}

/// A counting source whose reads take `ms` milliseconds, so work is in flight when asked.
fn slow_source(n: usize, ms: u64) -> Arc<dyn Source> {
    struct Slow(Arc<dyn Source>, u64);
    impl Source for Slow {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn fields(&self) -> &[stoker_core::FieldSpec] {
            self.0.fields()
        }
        fn describe(&self, i: usize) -> String {
            self.0.describe(i)
        }
        fn read<'a>(&'a self, i: usize, s: &'a mut Vec<u8>) -> stoker_core::Result<Sample<'a>> {
            std::thread::sleep(Duration::from_millis(self.1));
            self.0.read(i, s)
        }
    }
    Arc::new(Slow(counting_source(n), ms))
}

#[test]
fn set_epoch_starts_that_epoch_and_discards_work_in_flight() {
    for in_order in ["true", "false"] {
        for workers in ["0", "2"] {
            let kv = [
                ("batch_size", "2"),
                ("shuffle", "true"),
                ("num_workers", workers),
                ("prefetch_factor", "3"),
                ("in_order", in_order),
            ];
            let reference = |epoch: u64| {
                let mut l = Loader::new(&options(counting_source(20), &kv)).unwrap();
                for _ in 0..epoch {
                    rest(&mut l);
                }
                rest(&mut l)
            };
            let sorted = |mut v: Vec<Vec<i64>>| {
                v.sort();
                v
            };
            let mut l = Loader::new(&options(slow_source(20, 3), &kv)).unwrap();
            let held = l.next().unwrap().unwrap();
            l.set_epoch(5).unwrap();
            assert_eq!((l.epoch(), l.position()), (5, 0));
            let mut got = rest(&mut l);
            if in_order == "true" {
                assert_eq!(got, reference(5), "in order: exactly epoch 5");
            }
            got.sort();
            assert_eq!(
                got,
                sorted(reference(5)),
                "in_order={in_order}, workers={workers}"
            );
            assert_eq!(l.epoch(), 6);
            // Back to an earlier epoch, mid-epoch.
            l.next().unwrap().unwrap();
            l.set_epoch(1).unwrap();
            assert_eq!(sorted(rest(&mut l)), sorted(reference(1)));
            assert_eq!(
                l.stats().batches,
                1 + 10 + 1 + 10,
                "nothing stale delivered"
            );
            // Nothing leaks: the held batch and the work in flight only.
            let leased = l.arena().counters().slabs_leased;
            assert!(leased <= 1 + 6, "{leased} slabs leased");
            assert_eq!(ids(&held).len(), 2, "a held batch stays valid");
        }
    }
}

#[test]
fn set_epoch_is_a_no_op_at_that_epochs_start_and_after_resuming_into_it() {
    let kv = [
        ("batch_size", "2"),
        ("shuffle", "true"),
        ("num_workers", "2"),
    ];
    let mut l = Loader::new(&options(counting_source(12), &kv)).unwrap();
    let e0 = rest(&mut l);
    l.set_epoch(1).unwrap(); // the loader is at the start of epoch 1: the work ahead is kept
    let e1 = rest(&mut l);
    assert_ne!(e0, e1);
    // A resumed loader continues its epoch through the usual set_epoch(e) loop.
    let mut a = Loader::new(&options(counting_source(12), &kv)).unwrap();
    rest(&mut a);
    a.next().unwrap();
    a.next().unwrap();
    let state = a.save_state();
    let mut o = options(counting_source(12), &kv);
    o.set("resume_state", &state).unwrap();
    let mut b = Loader::new(&o).unwrap();
    b.set_epoch(1).unwrap();
    assert_eq!(rest(&mut b), e1[2..]);
    // Once it delivered something, set_epoch of the same epoch restarts it.
    let mut c = Loader::new(&o).unwrap();
    c.next().unwrap();
    c.set_epoch(1).unwrap();
    assert_eq!(rest(&mut c), e1);
}

#[test]
fn an_explicit_distributed_sampler_still_deals_itself() {
    let mut o = options(counting_source(10), &[("batch_size", "10")]);
    o.set_sampler(stoker_core::SamplerKind::Distributed {
        rank: 1,
        world_size: 2,
        shuffle: false,
        drop_last: false,
    });
    let mut l = Loader::new(&o).unwrap();
    assert_eq!(rest(&mut l), vec![vec![1, 3, 5, 7, 9]]);
}

#[test]
fn stats_say_what_was_resolved() {
    let l = rank_loader(10, &[], 2, 3);
    let s = l.stats();
    assert_eq!((s.rank, s.world_size), (2, 3));
    assert_eq!(s.launcher, Launcher::Explicit.code());
    assert_eq!(l.launch().launcher, Launcher::Explicit);
    let e = Loader::new(&options(
        counting_source(10),
        &[("rank", "3"), ("world_size", "3")],
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("rank 3"), "{e}");
}
