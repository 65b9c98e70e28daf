//! The first batches of a loader split across its workers (intra-batch parallelism): the same
//! batches, errors, replacements and stats as when one worker builds each batch, and a loader
//! dropped or closed while a split batch is in flight stops cleanly.
//!
//! With `num_workers = W > 1`, the first W batches after the loader is made (or after a
//! `set_epoch` that discards the work in flight) are built in W parts on W workers; the trace
//! shows one `batch` span per part, which is how these tests see that a batch was split.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use stoker_core::source::{FieldSpec, Sample};
use stoker_core::testing::SlowRead;
use stoker_core::{Error, ImageFolderSource, Loader, LoaderOptions, Source, SourceSpec, Stats};

const WORKERS: [&str; 4] = ["0", "1", "2", "4"];

fn fixture(name: &str) -> Vec<u8> {
    fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/images")
            .join(name),
    )
    .unwrap()
}

const PHOTOS: [&str; 6] = [
    "photo_444.jpg",
    "photo_baseline.jpg",
    "photo_progressive.jpg",
    "photo_gray.jpg",
    "photo_cmyk.jpg",
    "photo_png_named.JPEG",
];

/// A fresh directory for one test.
fn temp(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("stoker-split-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root).unwrap();
    root
}

/// An image folder of `n` real photographs, `per_class` to a class folder (`c0`, `c1`, …), files
/// `00.jpg`, `01.jpg`, … numbered across classes; `bad` replaces the bytes of some of them
/// (by number). In sequential order, sample `i` is file `i`.
fn folder(name: &str, n: usize, per_class: usize, bad: &[(usize, Vec<u8>)]) -> PathBuf {
    let root = temp(name);
    for i in 0..n {
        let dir = root.join(format!("c{}", i / per_class));
        fs::create_dir_all(&dir).unwrap();
        let bytes = match bad.iter().find(|(at, _)| *at == i) {
            Some((_, bytes)) => bytes.clone(),
            None => fixture(PHOTOS[i % PHOTOS.len()]),
        };
        fs::write(dir.join(format!("{i:02}.jpg")), bytes).unwrap();
    }
    root
}

fn options(source: SourceSpec, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new().with_source(source);
    for (k, v) in kv {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    o
}

fn image_folder(root: &Path) -> SourceSpec {
    SourceSpec::ImageFolder(root.to_owned())
}

/// A batch as bytes: every field's data, in order.
type Bytes = Vec<Vec<u8>>;

fn bytes(b: &stoker_core::Batch) -> Bytes {
    b.fields().map(|f| f.data.unwrap().to_vec()).collect()
}

/// What `next()` gave for each batch of `epochs` epochs: its bytes, or its error's message.
fn outcomes(l: &mut Loader, epochs: usize) -> Vec<Result<Bytes, String>> {
    let mut out = Vec::new();
    for _ in 0..epochs {
        loop {
            match l.next() {
                Ok(Some(b)) => out.push(Ok(bytes(&b))),
                Ok(None) => break,
                Err(e) => out.push(Err(e.to_string())),
            }
        }
    }
    out
}

/// Every batch of two epochs, then of epoch 0 again after `set_epoch` (which discards what was
/// built ahead and splits the first batches again).
fn run(o: &LoaderOptions) -> Vec<Result<Bytes, String>> {
    let mut l = Loader::new(o).unwrap();
    let mut out = outcomes(&mut l, 2);
    l.next().unwrap().unwrap(); // epoch 2 started: set_epoch(0) has work to discard
    l.set_epoch(0).unwrap();
    out.extend(outcomes(&mut l, 1));
    out
}

/// What a trace file holds: the `batch` spans, where each `sample` span lies, and the stage
/// spans' total duration in nanoseconds by stage name.
struct Trace {
    batches: Vec<Value>,
    /// (epoch, position) of the enclosing batch, slot, phase of every `sample` span.
    samples: Vec<((u64, u64), u64, String)>,
    stage_ns: BTreeMap<String, u64>,
}

fn read_trace(path: &Path) -> Trace {
    let json: Value = serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
    let events: Vec<&Value> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect();
    let ns = |v: &Value| (v.as_f64().unwrap() * 1000.0).round() as i64;
    let span = |e: &Value| {
        (
            e["tid"].as_u64().unwrap(),
            ns(&e["ts"]),
            ns(&e["ts"]) + ns(&e["dur"]),
        )
    };
    let batches: Vec<&Value> = events
        .iter()
        .copied()
        .filter(|e| e["name"] == "batch")
        .collect();
    let mut samples = Vec::new();
    for s in events.iter().filter(|e| e["name"] == "sample") {
        let (tid, start, end) = span(s);
        let parent = batches
            .iter()
            .find(|b| {
                let (btid, bstart, bend) = span(b);
                btid == tid && bstart <= start && end <= bend
            })
            .unwrap_or_else(|| panic!("{s} is in no batch"));
        let key = (
            parent["args"]["epoch"].as_u64().unwrap(),
            parent["args"]["position"].as_u64().unwrap(),
        );
        samples.push((
            key,
            s["args"]["slot"].as_u64().unwrap(),
            s["args"]["phase"].as_str().unwrap().to_owned(),
        ));
    }
    let mut stage_ns = BTreeMap::new();
    for e in &events {
        let name = e["name"].as_str().unwrap();
        if ["read", "decode", "transform", "collate"].contains(&name) {
            *stage_ns.entry(name.to_owned()).or_insert(0) += ns(&e["dur"]) as u64;
        }
    }
    Trace {
        batches: batches.into_iter().cloned().collect(),
        samples,
        stage_ns,
    }
}

const TRANSFORM: &str = "random_resized_crop(32, scale=0.2:1) | hflip | normalize(imagenet)";

#[test]
fn split_batches_are_identical_for_any_num_workers() {
    let root = folder("identical", 17, 6, &[]);
    let mixed = format!(
        "{TRANSFORM} | mixup(alpha=0.8, num_classes=3, label_smoothing=0.1) | \
         cutmix(alpha=1.0, num_classes=3, switch=0.5)"
    );
    for (transform, dtype) in [(TRANSFORM, "float32"), (mixed.as_str(), "bfloat16")] {
        let runs: Vec<_> = WORKERS
            .iter()
            .map(|w| {
                run(&options(
                    image_folder(&root),
                    &[
                        ("batch_size", "5"),
                        ("shuffle", "true"),
                        ("seed", "77"),
                        ("num_workers", w),
                        ("dtype", dtype),
                        ("transform", transform),
                    ],
                ))
            })
            .collect();
        // 4 batches an epoch (the last one of 2), three epochs, all built.
        assert_eq!(runs[0].len(), 12);
        assert!(runs[0].iter().all(Result::is_ok));
        for (w, r) in WORKERS.iter().zip(&runs).skip(1) {
            assert!(*r == runs[0], "num_workers={w} ({transform})");
        }
        // The epochs differ, and the restarted epoch 0 is epoch 0 again.
        assert_ne!(runs[0][0], runs[0][4]);
        assert_eq!(runs[0][..4], runs[0][8..]);
    }

    // A tensor source (copied, not decoded) is split the same way.
    let counting = stoker_core::testing::counting_source(37);
    let runs: Vec<_> = WORKERS
        .iter()
        .map(|w| {
            run(&options(
                SourceSpec::Custom(Arc::clone(&counting)),
                &[("batch_size", "8"), ("shuffle", "true"), ("num_workers", w)],
            ))
        })
        .collect();
    assert!(runs.iter().all(|r| *r == runs[0]));
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn the_first_batches_are_split_into_one_part_per_worker_and_ragged_ones_are_not() {
    let root = folder("parts", 17, 6, &[]);
    let dir = temp("parts-trace");
    for (workers, parts) in [(2u64, 2u64), (4, 4)] {
        let path = dir.join(format!("trace-{workers}.json"));
        let o = options(
            image_folder(&root),
            &[
                ("batch_size", "5"),
                ("num_workers", &workers.to_string()),
                ("transform", TRANSFORM),
                ("trace", path.to_str().unwrap()),
            ],
        );
        let mut l = Loader::new(&o).unwrap();
        outcomes(&mut l, 1);
        // A set_epoch that discards the batches built ahead splits the first ones again.
        l.next().unwrap().unwrap();
        l.set_epoch(5).unwrap();
        outcomes(&mut l, 1);
        drop(l); // writes the trace
        let trace = read_trace(&path);
        let mut seen: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
        for b in &trace.batches {
            let args = &b["args"];
            let key = (
                args["epoch"].as_u64().unwrap(),
                args["position"].as_u64().unwrap(),
            );
            seen.entry(key)
                .or_default()
                .push(args["parts"].as_u64().unwrap_or(1));
        }
        assert!(seen.contains_key(&(0, 0)) && seen.contains_key(&(5, 0)));
        for ((epoch, position), counts) in &seen {
            // The first `workers` batches of the loader's life, and after the set_epoch, are
            // split, one span per part, into parts of at least one sample (the last batch of
            // an epoch has 2).
            let size = if *position == 3 { 2 } else { 5 };
            let want = if (*epoch == 0 || *epoch == 5) && *position < workers {
                parts.min(size)
            } else {
                1
            };
            assert_eq!(
                counts,
                &vec![want; want as usize],
                "batch {position} of epoch {epoch}"
            );
        }
    }

    // A ragged field's padded length needs every sample read first: such batches stay whole.
    let rows: Vec<u8> = (0..40u8).collect();
    let ragged = stoker_core::MemorySource::new()
        .with_ragged(
            "tokens",
            stoker_core::DType::U8,
            &[],
            (0..10).map(|i| rows[..i * 4].to_vec()).collect(),
        )
        .unwrap();
    let path = dir.join("trace-ragged.json");
    let o = options(
        SourceSpec::Custom(Arc::new(ragged)),
        &[
            ("batch_size", "4"),
            ("num_workers", "2"),
            ("trace", path.to_str().unwrap()),
        ],
    );
    let mut l = Loader::new(&o).unwrap();
    assert_eq!(outcomes(&mut l, 1).len(), 3);
    drop(l);
    let trace = read_trace(&path);
    assert!(!trace.batches.is_empty());
    assert!(trace.batches.iter().all(|b| b["args"]["parts"].is_null()));
    fs::remove_dir_all(&root).unwrap();
    fs::remove_dir_all(&dir).unwrap();
}

/// 20 files in classes of 8, read in order with batches of 8: batch 0 has a file that does
/// not decode at slot 1 and an empty file (refused when read) at slot 6; batch 1 files that
/// do not decode at slots 10 and 13.
fn bad_folder(name: &str) -> PathBuf {
    let photo = fixture("photo_baseline.jpg");
    let random: Vec<u8> = (0..3000u32).map(|i| (i * 7919 % 251) as u8).collect();
    folder(
        name,
        20,
        8,
        &[
            (1, random.clone()),
            (6, Vec::new()),
            (10, random),
            (13, photo[..photo.len() / 2].to_vec()),
        ],
    )
}

#[test]
fn a_sample_error_in_a_split_batch_is_the_one_a_whole_build_reports() {
    let root = bad_folder("raise");
    let runs: Vec<_> = WORKERS
        .iter()
        .map(|w| {
            let o = options(
                image_folder(&root),
                &[
                    ("batch_size", "8"),
                    ("num_workers", w),
                    ("transform", TRANSFORM),
                ],
            );
            outcomes(&mut Loader::new(&o).unwrap(), 2)
        })
        .collect();
    for (w, r) in WORKERS.iter().zip(&runs).skip(1) {
        assert!(*r == runs[0], "num_workers={w}");
    }
    // Per batch, in order: phase 1 (reading every slot) fails before phase 2 (writing them)
    // begins, so batch 0 reports the empty file at slot 6, not the undecodable one at slot 1;
    // batch 1 reports its first undecodable file.
    let errors: Vec<&String> = runs[0].iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(runs[0].len(), 6);
    assert_eq!(errors.len(), 4, "{errors:?}");
    let first = &runs[0][0].as_ref().unwrap_err();
    assert!(first.contains("06.jpg"), "{first}");
    let second = &runs[0][1].as_ref().unwrap_err();
    assert!(second.contains("10.jpg"), "{second}");
    assert!(runs[0][2].is_ok());
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn replacements_in_a_split_batch_are_the_ones_a_whole_build_makes() {
    let root = bad_folder("skip");
    let dir = temp("skip-trace");
    let mut stats: Vec<Stats> = Vec::new();
    let mut runs = Vec::new();
    for w in WORKERS {
        let path = dir.join(format!("trace-{w}.json"));
        let o = options(
            image_folder(&root),
            &[
                ("batch_size", "8"),
                ("num_workers", w),
                ("on_error", "skip"),
                ("transform", TRANSFORM),
                ("trace", path.to_str().unwrap()),
            ],
        );
        let mut l = Loader::new(&o).unwrap();
        runs.push(outcomes(&mut l, 2));
        let handle = l.stats_handle();
        drop(l); // joins the workers (their counters are final) and writes the trace
        let s = handle.snapshot();

        // Counts: every slot filled; four bad files an epoch, each replaced (a replacement
        // drawn bad is replaced again and counted too), the same for every num_workers.
        assert_eq!((s.batches, s.samples), (6, 40), "{w}: {s:?}");
        assert!(s.samples_skipped >= 8, "{w}: {s:?}");
        if let Some(first) = stats.first() {
            assert_eq!(s.samples_skipped, first.samples_skipped, "{w}");
        }
        // Busy time split by worker, and the stages inside it.
        assert_eq!(s.worker_busy_ns.len(), w.parse::<usize>().unwrap().max(1));
        assert_eq!(s.worker_busy_ns.iter().sum::<u64>(), s.busy_ns);
        let stages = s.read_ns + s.decode_ns + s.transform_ns + s.collate_ns;
        assert!(stages <= s.busy_ns, "{w}: {s:?}");
        assert!(
            s.decode_ns > 0 && s.transform_ns > 0 && s.read_ns > 0,
            "{s:?}"
        );

        // The trace holds every span the stats counted, parts included.
        let trace = read_trace(&path);
        for (stage, ns) in [
            ("read", s.read_ns),
            ("decode", s.decode_ns),
            ("transform", s.transform_ns),
            ("collate", s.collate_ns),
        ] {
            assert_eq!(
                trace.stage_ns.get(stage).copied().unwrap_or(0),
                ns,
                "{w}: {stage}"
            );
        }
        // Each slot of each batch once per phase, whichever part wrote it.
        let mut slots: BTreeMap<(u64, u64), Vec<(u64, String)>> = BTreeMap::new();
        for (key, slot, phase) in trace.samples {
            slots.entry(key).or_default().push((slot, phase));
        }
        for ((epoch, position), mut got) in slots {
            if epoch > 1 {
                continue; // built ahead when the loader dropped
            }
            got.sort();
            let size = if position == 2 { 4 } else { 8 };
            let want: Vec<(u64, String)> = (0..size)
                .flat_map(|s| [(s, "read".to_owned()), (s, "write".to_owned())])
                .collect();
            assert_eq!(got, want, "{w}: batch {position} of epoch {epoch}");
        }
        stats.push(s);
    }
    assert!(runs.iter().all(|r| r.iter().all(Result::is_ok)));
    for (w, r) in WORKERS.iter().zip(&runs).skip(1) {
        assert!(*r == runs[0], "num_workers={w}");
    }
    fs::remove_dir_all(&root).unwrap();
    fs::remove_dir_all(&dir).unwrap();
}

/// An image folder whose read of one sample panics.
struct PanicAt {
    inner: ImageFolderSource,
    index: usize,
}

impl Source for PanicAt {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn fields(&self) -> &[FieldSpec] {
        self.inner.fields()
    }
    fn describe(&self, index: usize) -> String {
        self.inner.describe(index)
    }
    fn read<'a>(
        &'a self,
        index: usize,
        scratch: &'a mut Vec<u8>,
    ) -> stoker_core::Result<Sample<'a>> {
        assert_ne!(index, self.index, "a bug in the source's read");
        self.inner.read(index, scratch)
    }
}

#[test]
fn a_panic_in_one_part_is_that_batchs_error() {
    let root = folder("panic", 20, 8, &[]);
    let source: Arc<dyn Source> = Arc::new(PanicAt {
        inner: ImageFolderSource::open(&root).unwrap(),
        index: 6, // batch 0, in the last part of any split
    });
    let runs: Vec<_> = WORKERS
        .iter()
        .map(|w| {
            let o = options(
                SourceSpec::Custom(Arc::clone(&source)),
                &[
                    ("batch_size", "8"),
                    ("num_workers", w),
                    ("transform", TRANSFORM),
                ],
            );
            outcomes(&mut Loader::new(&o).unwrap(), 2)
        })
        .collect();
    let err = runs[0][0].as_ref().unwrap_err();
    assert!(
        err.contains("panic while building batch 0 of epoch 0") && err.contains("a bug"),
        "{err}"
    );
    // The loader goes on: the other batches of the epoch are built, and the next epoch.
    assert_eq!(runs[0].len(), 6);
    assert_eq!(runs[0].iter().filter(|r| r.is_err()).count(), 2);
    for (w, r) in WORKERS.iter().zip(&runs).skip(1) {
        assert!(*r == runs[0], "num_workers={w}");
    }
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn dropping_or_closing_a_loader_while_a_split_batch_is_built_returns_every_slab() {
    let root = folder("drop", 24, 8, &[]);
    // Slow reads keep the split batches in flight for a while.
    let source: Arc<dyn Source> = Arc::new(SlowRead {
        inner: Arc::new(ImageFolderSource::open(&root).unwrap()),
        delay: Duration::from_millis(15),
    });
    let o = options(
        SourceSpec::Custom(source),
        &[
            ("batch_size", "8"),
            ("num_workers", "4"),
            ("transform", TRANSFORM),
        ],
    );

    // Dropped at once: parts queued and parts running.
    let l = Loader::new(&o).unwrap();
    let arena = l.arena().clone();
    std::thread::sleep(Duration::from_millis(20));
    drop(l);
    assert_eq!(arena.counters().slabs_leased, 0);

    // Dropped right after a set_epoch split the new schedule's first batches.
    let mut l = Loader::new(&o).unwrap();
    let arena = l.arena().clone();
    let first = l.next().unwrap().unwrap();
    l.set_epoch(1).unwrap();
    drop(l);
    drop(first);
    assert_eq!(arena.counters().slabs_leased, 0);

    // Closed from another thread while the consumer waits for a split batch.
    let mut l = Loader::new(&o).unwrap();
    let arena = l.arena().clone();
    let closer = l.closer();
    let closing = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(10));
        closer.close();
    });
    let waited = l.next();
    closing.join().unwrap();
    // The batch may have been ready before the close; otherwise the wait ends closed.
    if let Err(e) = &waited {
        assert!(matches!(e, Error::Closed(_)), "{e}");
    }
    drop(waited);
    drop(l);
    assert_eq!(arena.counters().slabs_leased, 0);
    fs::remove_dir_all(&root).unwrap();
}
