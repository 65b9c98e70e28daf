//! Iterable sources (a stream with no length) through the loader: the stream each rank opens,
//! the equal-batches rule with `num_samples`, determinism whatever `num_workers`, the shuffle
//! buffer, resume by replay and by the stream's own state, failures.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use stoker_core::{
    Batch, DType, IterableSource, Loader, LoaderOptions, SampleStream, SampleWriter, SourceSpec,
    StreamInfo,
};

/// Rank `r` of `w` streams ids `r, r + w, r + 2w, ...` below `n`, except that rank 0 stops
/// `short` samples early (uneven streams). Sample `id` fails when `id` is in `bad`. With
/// `states`, a stream saves its position (the next id) and resumes from it.
struct Ids {
    n: usize,
    short: usize,
    bad: Vec<usize>,
    states: bool,
    opened: Mutex<Vec<(StreamInfo, Option<String>)>>,
    open_fails: bool,
    /// The stream panics when it reaches this id.
    panics_at: Option<usize>,
}

impl Ids {
    fn new(n: usize) -> Ids {
        Ids {
            n,
            short: 0,
            bad: Vec::new(),
            states: false,
            opened: Mutex::new(Vec::new()),
            open_fails: false,
            panics_at: None,
        }
    }

    fn ids(&self, info: &StreamInfo) -> Vec<usize> {
        let mut ids: Vec<usize> = (info.rank..self.n).step_by(info.world_size).collect();
        if info.rank == 0 {
            ids.truncate(ids.len().saturating_sub(self.short));
        }
        ids
    }
}

struct IdStream {
    ids: Vec<usize>,
    at: usize,
    bad: Vec<usize>,
    states: bool,
    panics_at: Option<usize>,
}

impl IterableSource for Ids {
    fn open(
        &self,
        info: &StreamInfo,
        resume: Option<&str>,
    ) -> Result<Box<dyn SampleStream>, String> {
        self.opened
            .lock()
            .unwrap()
            .push((*info, resume.map(str::to_owned)));
        if self.open_fails {
            return Err("no such stream".into());
        }
        let at = match resume {
            Some(s) => s.parse().map_err(|_| format!("bad state {s}"))?,
            None => 0,
        };
        Ok(Box::new(IdStream {
            ids: self.ids(info),
            at,
            bad: self.bad.clone(),
            states: self.states,
            panics_at: self.panics_at,
        }))
    }

    fn saves_state(&self) -> bool {
        self.states
    }
}

impl SampleStream for IdStream {
    fn next(&mut self, out: &mut SampleWriter<'_>) -> Result<bool, String> {
        let Some(&id) = self.ids.get(self.at) else {
            return Ok(false);
        };
        self.at += 1;
        assert_ne!(Some(id), self.panics_at, "the stream broke at {id}");
        if self.bad.contains(&id) {
            return Err(format!("sample {id} is bad"));
        }
        out.put_tensor("x", DType::I64, &[2], &bytes(&[id as i64, -(id as i64)]))?;
        out.put_label(id as i64)?;
        Ok(true)
    }

    fn save_state(&mut self) -> Result<Option<String>, String> {
        Ok(self.states.then(|| self.at.to_string()))
    }
}

fn bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
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

fn loader(source: Arc<Ids>, kv: &[(&str, &str)]) -> stoker_core::Result<Loader> {
    let mut o = LoaderOptions::new().with_source(SourceSpec::Iterable(source));
    for (k, v) in kv {
        o.set(k, v)?;
    }
    Loader::new(&o)
}

fn epoch(l: &mut Loader) -> Vec<Vec<i64>> {
    l.epoch_iter().map(|b| labels(&b.unwrap())).collect()
}

#[test]
fn each_rank_reads_its_own_stream_until_it_ends() {
    let src = Arc::new(Ids::new(23));
    let mut l = loader(
        Arc::clone(&src),
        &[("batch_size", "4"), ("num_workers", "2"), ("seed", "7")],
    )
    .unwrap();
    assert_eq!(l.batches_per_epoch_i64(), -1, "no length");
    assert!(l.is_streaming());
    let first = epoch(&mut l);
    assert_eq!(
        first.concat(),
        (0..23).collect::<Vec<i64>>(),
        "stream order"
    );
    assert_eq!(first.last().unwrap().len(), 3, "short last batch");
    let x = {
        let b = l.next().unwrap().unwrap();
        b.field_by_name("x").unwrap().data.unwrap()[8..16].to_vec()
    };
    assert_eq!(x, 0i64.to_ne_bytes(), "x = [id, -id]");
    let opened: Vec<StreamInfo> = src.opened.lock().unwrap().iter().map(|o| o.0).collect();
    assert_eq!(
        opened[..2],
        [
            StreamInfo {
                rank: 0,
                world_size: 1,
                worker: 0,
                num_workers: 1,
                seed: 7,
                epoch: 0
            },
            StreamInfo {
                rank: 0,
                world_size: 1,
                worker: 0,
                num_workers: 1,
                seed: 7,
                epoch: 1
            }
        ],
        "the stream the fields were learnt from is epoch 0's, not opened twice"
    );
}

#[test]
fn num_samples_gives_every_rank_the_same_batches_with_uneven_streams() {
    for world in 1..=3usize {
        for workers in ["0", "1", "2"] {
            for shard_drop_last in ["false", "true"] {
                let what = format!("world={world} workers={workers} drop={shard_drop_last}");
                let n = 31;
                let mut per_rank = Vec::new();
                let mut counts = Vec::new();
                for rank in 0..world {
                    let mut src = Ids::new(n);
                    src.short = 3; // rank 0's stream is 3 shorter
                    let mut l = loader(
                        Arc::new(src),
                        &[
                            ("batch_size", "4"),
                            ("num_workers", workers),
                            ("num_samples", &n.to_string()),
                            ("shard_drop_last", shard_drop_last),
                            ("shuffle_buffer", "5"),
                            ("rank", &rank.to_string()),
                            ("world_size", &world.to_string()),
                        ],
                    )
                    .unwrap();
                    counts.push(l.batches_per_epoch());
                    let b = epoch(&mut l);
                    assert_eq!(b.len(), l.batches_per_epoch(), "{what}");
                    per_rank.push(b.concat());
                }
                assert!(
                    counts.windows(2).all(|w| w[0] == w[1]),
                    "{what}: {counts:?}"
                );
                let expect = if shard_drop_last == "true" {
                    n / world
                } else {
                    n.div_ceil(world)
                };
                for (rank, ids) in per_rank.iter().enumerate() {
                    assert_eq!(ids.len(), expect, "{what} rank {rank}");
                    // Every id of the rank's stream at least once (wrapping repeats some).
                    let mut stream: Vec<i64> = (rank..n).step_by(world).map(|i| i as i64).collect();
                    if rank == 0 {
                        stream.truncate(stream.len() - 3);
                    }
                    let mut got = ids.clone();
                    got.sort_unstable();
                    got.dedup();
                    if expect >= stream.len() {
                        assert_eq!(got, stream, "{what} rank {rank}");
                    } else {
                        assert!(got.iter().all(|i| stream.contains(i)), "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn same_batches_whatever_num_workers_and_a_new_buffer_order_each_epoch() {
    let run = |workers: &str| {
        let mut l = loader(
            Arc::new(Ids::new(50)),
            &[
                ("batch_size", "6"),
                ("num_workers", workers),
                ("shuffle_buffer", "10"),
                ("seed", "11"),
            ],
        )
        .unwrap();
        (0..3).map(|_| epoch(&mut l)).collect::<Vec<_>>()
    };
    let reference = run("0");
    assert_ne!(reference[0].concat(), (0..50).collect::<Vec<i64>>());
    assert_ne!(reference[0], reference[1], "the buffer is seeded by epoch");
    for workers in ["1", "3"] {
        assert_eq!(run(workers), reference, "num_workers={workers}");
    }
}

#[test]
fn resume_replays_or_restores_the_stream_state() {
    for (states, buffer) in [(false, "0"), (false, "7"), (true, "0"), (true, "7")] {
        let what = format!("states={states} shuffle_buffer={buffer}");
        let make = || {
            let mut src = Ids::new(40);
            src.states = states;
            Arc::new(src)
        };
        let kv = [
            ("batch_size", "3"),
            ("num_workers", "2"),
            ("shuffle_buffer", buffer),
            ("seed", "5"),
        ];
        let mut whole = loader(make(), &kv).unwrap();
        let first = epoch(&mut whole);
        let second = epoch(&mut whole);
        for stop in [1, 5, first.len()] {
            let mut l = loader(make(), &kv).unwrap();
            let mut got: Vec<Vec<i64>> = (0..stop)
                .map(|_| labels(&l.next().unwrap().unwrap()))
                .collect();
            let state = l.save_state();
            drop(l);
            let src = make();
            let mut kv2 = kv.to_vec();
            kv2.push(("resume_state", &state));
            let mut resumed = loader(Arc::clone(&src), &kv2).unwrap();
            got.extend(epoch(&mut resumed));
            assert_eq!(got, first, "{what} stop={stop}");
            assert_eq!(epoch(&mut resumed), second, "{what} stop={stop}");
            let opened = src.opened.lock().unwrap();
            let restored = opened[0].1.is_some();
            // The stream's own state is used only when it saves one and nothing is buffered.
            assert_eq!(
                restored,
                states && buffer == "0" && stop < first.len(),
                "{what} stop={stop}: {state}"
            );
            if restored {
                assert_eq!(
                    opened[0].1.as_deref(),
                    Some((stop * 3).to_string().as_str())
                );
            }
        }
    }
}

#[test]
fn failed_samples_fail_their_batch_or_are_replaced_and_open_failures_are_errors() {
    let make = || {
        let mut src = Ids::new(20);
        src.bad = vec![6];
        Arc::new(src)
    };
    let mut l = loader(make(), &[("batch_size", "4"), ("num_workers", "1")]).unwrap();
    let outcomes: Vec<_> = l.epoch_iter().collect();
    assert_eq!(outcomes.len(), 5);
    let e = outcomes[1].as_ref().err().unwrap().to_string();
    assert!(e.contains("sample 6 is bad") && e.contains("rank 0"), "{e}");

    let mut l = loader(
        make(),
        &[
            ("batch_size", "4"),
            ("num_workers", "1"),
            ("on_error", "skip"),
        ],
    )
    .unwrap();
    let all = epoch(&mut l);
    assert_eq!(all[1].len(), 4);
    assert!(!all[1].contains(&6) && all[1].iter().all(|i| (4..8).contains(i)));
    assert_eq!(l.stats().samples_skipped, 1);

    let mut src = Ids::new(5);
    src.open_fails = true;
    let e = loader(Arc::new(src), &[]).err().unwrap().to_string();
    assert!(e.contains("no such stream") && e.contains("rank 0"), "{e}");

    let e = loader(Arc::new(Ids::new(0)), &[])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("gave no sample"), "{e}");

    // Keys that pick a sampler make no sense for a stream.
    let e = loader(Arc::new(Ids::new(5)), &[("weights", "1,2")])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("`weights`"), "{e}");
}

#[test]
fn dropping_a_loader_mid_epoch_closes_the_streams() {
    static CLOSED: AtomicUsize = AtomicUsize::new(0);
    struct Closing(Box<dyn SampleStream>);
    impl SampleStream for Closing {
        fn next(&mut self, out: &mut SampleWriter<'_>) -> Result<bool, String> {
            self.0.next(out)
        }
    }
    impl Drop for Closing {
        fn drop(&mut self) {
            CLOSED.fetch_add(1, Ordering::SeqCst);
        }
    }
    struct Wrap(Ids);
    impl IterableSource for Wrap {
        fn open(
            &self,
            info: &StreamInfo,
            resume: Option<&str>,
        ) -> Result<Box<dyn SampleStream>, String> {
            Ok(Box::new(Closing(self.0.open(info, resume)?)))
        }
    }
    let src = Arc::new(Wrap(Ids::new(1000)));
    let mut o = LoaderOptions::new().with_source(SourceSpec::Iterable(src));
    o.set("batch_size", "8").unwrap();
    o.set("num_workers", "2").unwrap();
    let mut l = Loader::new(&o).unwrap();
    l.next().unwrap().unwrap();
    drop(l);
    assert_eq!(CLOSED.load(Ordering::SeqCst), 1);
}

/// The memory budget's numbers of a loader over `source` with `kv`, or its error.
fn budget_stats(
    source: SourceSpec,
    kv: &[(&str, &str)],
) -> stoker_core::Result<(u64, u64, u64, u64)> {
    let mut o = LoaderOptions::new().with_source(source);
    for (k, v) in kv {
        o.set(k, v)?;
    }
    let s = Loader::new(&o)?.stats();
    Ok((
        s.memory_budget,
        s.batch_bytes,
        s.in_flight_cap,
        s.in_flight_cap_requested,
    ))
}

#[test]
fn the_memory_budget_lowers_the_cap_and_refuses_a_batch_as_for_an_indexed_source() {
    // The same fields in memory, read by the host scheduler: x = [id, -id], label = id.
    let n = 40;
    let ids: Vec<i64> = (0..n as i64).collect();
    let x: Vec<i64> = ids.iter().flat_map(|&i| [i, -i]).collect();
    let memory = Arc::new(
        stoker_core::MemorySource::new()
            .with_tensor("x", DType::I64, &[2], bytes(&x))
            .unwrap()
            .with_tensor("label", DType::I64, &[], bytes(&ids))
            .unwrap(),
    );
    let page = stoker_core::arena::page_size() as u64;
    let budget = (3 * page).to_string();
    // Batches of one page; 2 workers × prefetch 4 ask for 8 in flight, the budget holds 3.
    let kv = [
        ("batch_size", "4"),
        ("num_workers", "2"),
        ("prefetch_factor", "4"),
        ("memory_budget", budget.as_str()),
    ];
    let host = budget_stats(SourceSpec::Custom(memory.clone()), &kv).unwrap();
    assert_eq!(host, (3 * page, page, 3, 8));
    let stream = budget_stats(SourceSpec::Iterable(Arc::new(Ids::new(n))), &kv).unwrap();
    assert_eq!(stream, host);
    let mut l = loader(Arc::new(Ids::new(n)), &kv).unwrap();
    assert_eq!(epoch(&mut l).concat(), ids, "every sample, in stream order");

    let small = [("batch_size", "4"), ("memory_budget", "100")];
    let host = budget_stats(SourceSpec::Custom(memory), &small).unwrap_err();
    let stream = budget_stats(SourceSpec::Iterable(Arc::new(Ids::new(n))), &small).unwrap_err();
    assert!(
        matches!(&stream, stoker_core::Error::InvalidOption { key, .. } if key == "memory_budget"),
        "{stream}"
    );
    assert_eq!(stream.to_string(), host.to_string());
}

#[test]
fn a_panicking_stream_fails_its_batch_and_ends_the_epoch() {
    for workers in ["0", "2"] {
        let mut src = Ids::new(20);
        src.panics_at = Some(9);
        let mut l = loader(
            Arc::new(src),
            &[("batch_size", "4"), ("num_workers", workers)],
        )
        .unwrap();
        // Batches 0 and 1 are whole; the panic at id 9 fails batch 2, and the epoch ends there,
        // as when a stream fails to open.
        for want in [[0, 1, 2, 3], [4, 5, 6, 7]] {
            assert_eq!(
                labels(&l.next().unwrap().unwrap()),
                want,
                "num_workers={workers}"
            );
        }
        let err = l.next().expect_err("the panic");
        assert!(
            err.to_string().contains("the stream broke at 9"),
            "num_workers={workers}: {err}"
        );
        assert!(l.next().unwrap().is_none(), "num_workers={workers}");
        // The next epoch opens the stream again.
        assert_eq!(labels(&l.next().unwrap().unwrap()), [0, 1, 2, 3]);
    }
}
