//! Shards read while they download, ranged resumption, and a streaming tar source opened from a
//! `wids` index before its shards are fetched — against a small HTTP server on 127.0.0.1 that
//! serves real bytes with byte ranges and can hold a body half-sent until the test lets it go.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::fetch::RetryPolicy;
use super::resolve::open_feed_with;
use super::RemoteConfig;
use crate::launch::RankShare;
use crate::source::streaming::StreamSource;
use crate::source::tar::{TarConfig, TarStream};

/// How the server treats one file.
#[derive(Clone, Copy, Default)]
struct Behaviour {
    /// Every GET sends half the body, then waits until [`RangeServer::release`].
    hold: bool,
    /// The first GET sends half the body and closes the connection.
    cut_first: bool,
    /// Ranges are ignored: every GET answers 200 with the whole body.
    no_ranges: bool,
}

struct RangeServer {
    port: u16,
    /// `METHOD PATH RANGE` of each request.
    log: Arc<Mutex<Vec<String>>>,
    /// Open (true) once released; bodies on hold wait for it.
    gate: Arc<(Mutex<bool>, Condvar)>,
    /// Bodies waiting at the gate now.
    held: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RangeServer {
    /// Serves `/d/NAME` from `files` for at most 30 s; a thread per connection.
    fn start(files: HashMap<String, (Vec<u8>, Behaviour)>) -> RangeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let held = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let files = Arc::new(files);
        let gets = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
        let (log2, gate2, held2, stop2) = (log.clone(), gate.clone(), held.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && !stop2.load(Ordering::SeqCst) {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let (files, gets, log, gate, held) = (
                    files.clone(),
                    gets.clone(),
                    log2.clone(),
                    gate2.clone(),
                    held2.clone(),
                );
                std::thread::spawn(move || {
                    serve(stream, &files, &gets, &log, &gate, &held);
                });
            }
        });
        RangeServer {
            port,
            log,
            gate,
            held,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/d/{name}", self.port)
    }

    fn release(&self) {
        *self.gate.0.lock().unwrap() = true;
        self.gate.1.notify_all();
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for RangeServer {
    fn drop(&mut self) {
        self.release();
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    stream: TcpStream,
    files: &HashMap<String, (Vec<u8>, Behaviour)>,
    gets: &Mutex<HashMap<String, usize>>,
    log: &Mutex<Vec<String>>,
    gate: &(Mutex<bool>, Condvar),
    held: &AtomicUsize,
) {
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(path)) = (parts.next(), parts.next()) else {
        return;
    };
    let mut range = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
            break;
        }
        let lower = header.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("range: bytes=") {
            range = v
                .trim()
                .strip_suffix('-')
                .and_then(|n| n.parse::<usize>().ok());
        }
    }
    log.lock()
        .unwrap()
        .push(format!("{method} {path} {range:?}"));
    let mut out = stream;
    let Some((data, how)) = path.strip_prefix("/d/").and_then(|n| files.get(n)) else {
        let _ = out
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    };
    let from = range
        .filter(|_| !how.no_ranges && method == "GET")
        .unwrap_or(0);
    let body = &data[from.min(data.len())..];
    let head = if range.is_some() && !how.no_ranges && method == "GET" {
        format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {from}-{}/{}\r\nETag: \"v1\"\r\nConnection: close\r\n\r\n",
            body.len(),
            data.len() - 1,
            data.len()
        )
    } else {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nETag: \"v1\"\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n",
            data.len()
        )
    };
    let _ = out.write_all(head.as_bytes());
    if method != "GET" {
        return;
    }
    let nth = {
        let mut gets = gets.lock().unwrap();
        let n = gets.entry(path.to_owned()).or_default();
        *n += 1;
        *n
    };
    let half = body.len() / 2;
    let _ = out.write_all(&body[..half]);
    let _ = out.flush();
    if how.cut_first && nth == 1 {
        return;
    }
    if how.hold {
        held.fetch_add(1, Ordering::SeqCst);
        let (open, cv) = gate;
        let guard = open.lock().unwrap();
        let _ = cv
            .wait_timeout_while(guard, Duration::from_secs(20), |open| !*open)
            .unwrap();
        held.fetch_sub(1, Ordering::SeqCst);
    }
    let _ = out.write_all(&body[half..]);
}

/// The fault tests' policy, with a longer stall timeout: a body held at the gate must not time
/// out on a loaded machine before the test lets it go.
fn policy() -> RetryPolicy {
    RetryPolicy {
        stall_timeout: Duration::from_secs(10),
        ..super::tests::policy()
    }
}

fn config(dir: &Path, prefetch: usize) -> RemoteConfig {
    RemoteConfig {
        shard_prefetch: prefetch,
        ..super::tests::config(dir)
    }
}

fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 253) as u8).collect()
}

/// Waits (bounded) until `done()`.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A feed over one shard of `len` bytes whose body the server holds after its first half, and
/// a reader (stopped through `stop`) that has read that half.
struct HalfRead {
    data: Vec<u8>,
    server: RangeServer,
    dir: PathBuf,
    feed: super::ShardFeed,
    reader: super::feed::FeedReader,
}

fn half_read_held_shard(tag: &str, len: usize, stop: Arc<AtomicBool>) -> HalfRead {
    let data = bytes(len);
    let hold = Behaviour {
        hold: true,
        ..Behaviour::default()
    };
    let server = RangeServer::start(HashMap::from([("a.tar".to_owned(), (data.clone(), hold))]));
    let dir = super::tests::cache_dir(tag);
    let feed = open_feed_with(&[server.url("a.tar")], &config(&dir, 1), policy())
        .unwrap()
        .unwrap();
    feed.upcoming([0]);
    let mut reader = feed.reader(0, stop);
    let mut first = vec![0u8; len / 2];
    reader.read_exact(&mut first).unwrap();
    assert_eq!(first, data[..len / 2]);
    HalfRead {
        data,
        server,
        dir,
        feed,
        reader,
    }
}

#[test]
fn a_shard_is_read_while_it_downloads() {
    let HalfRead {
        data,
        server,
        dir,
        feed,
        mut reader,
    } = half_read_held_shard("feed-while", 256 * 1024, Arc::new(AtomicBool::new(false)));
    // The first half was read while the server holds the second (it counts itself as holding
    // just after sending the first).
    eventually("the server to hold the body", || {
        server.held.load(Ordering::SeqCst) == 1
    });
    assert!(!dir
        .join(
            super::url::ShardUrl::parse(&server.url("a.tar"))
                .unwrap()
                .cache_name()
        )
        .exists());
    server.release();
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, data[data.len() / 2..]);
    drop(feed);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cut_download_resumes_with_a_range_and_falls_back_without_one() {
    let data = bytes(100_000);
    for no_ranges in [false, true] {
        let how = Behaviour {
            cut_first: true,
            no_ranges,
            ..Behaviour::default()
        };
        let server = RangeServer::start(HashMap::from([("a.tar".to_owned(), (data.clone(), how))]));
        let dir = super::tests::cache_dir(&format!("feed-range-{no_ranges}"));
        let feed = open_feed_with(&[server.url("a.tar")], &config(&dir, 1), policy())
            .unwrap()
            .unwrap();
        feed.upcoming([0]);
        let mut got = Vec::new();
        feed.reader(0, Arc::new(AtomicBool::new(false)))
            .read_to_end(&mut got)
            .unwrap();
        assert!(
            got == data,
            "no_ranges={no_ranges}: the shard read back differs"
        );
        let gets: Vec<String> = server
            .log()
            .into_iter()
            .filter(|l| l.starts_with("GET"))
            .collect();
        if no_ranges {
            // The ranged retry got the whole object; the next attempt reads it from the start.
            assert_eq!(gets.len(), 3, "{gets:?}");
            assert!(
                gets[1].ends_with(&format!("Some({})", data.len() / 2)),
                "{gets:?}"
            );
            assert!(gets[2].ends_with("None"), "{gets:?}");
        } else {
            assert_eq!(gets.len(), 2, "{gets:?}");
            assert!(gets[0].ends_with("None"), "{gets:?}");
            assert!(
                gets[1].ends_with(&format!("Some({})", data.len() / 2)),
                "{gets:?}"
            );
        }
        drop(feed);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_stopped_reader_does_not_wait_for_the_download() {
    let stop = Arc::new(AtomicBool::new(false));
    let HalfRead {
        server,
        dir,
        feed,
        mut reader,
        ..
    } = half_read_held_shard("feed-stop", 64 * 1024, Arc::clone(&stop));
    let waiting =
        std::thread::spawn(move || reader.read(&mut [0u8; 16]).map_err(|e| e.to_string()));
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::SeqCst);
    let outcome = waiting.join().unwrap();
    assert!(outcome.unwrap_err().contains("stopped"));
    // Closing the feed cancels the held download, and leaves no partial file in the cache.
    let started = Instant::now();
    drop(feed);
    assert!(started.elapsed() < Duration::from_secs(5));
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tar shard of `n` samples `{tag}{i}` (jpg + cls).
fn tar_shard(tag: &str, n: usize) -> Vec<u8> {
    let mut b = ::tar::Builder::new(Vec::new());
    for i in 0..n {
        for (ext, data) in [
            ("jpg", vec![i as u8; 20_000 + i]),
            ("cls", i.to_string().into_bytes()),
        ] {
            let mut h = ::tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, format!("{tag}{i:03}.{ext}"), &data[..])
                .unwrap();
        }
    }
    b.into_inner().unwrap()
}

/// `sample KEY (offset N)` of each sample of `stream`'s epoch, without the shard's name.
fn keys(stream: &TarStream, epoch: u64, take: usize) -> Vec<String> {
    let mut epoch = stream.open(epoch, None, 0).unwrap();
    let mut out = Vec::new();
    while out.len() < take {
        let Some(sample) = epoch.next_sample() else {
            break;
        };
        let mut scratch = Vec::new();
        sample.read(&mut scratch).unwrap();
        let d = sample.describe();
        out.push(d[d.find(" sample ").unwrap()..].to_owned());
    }
    out
}

#[test]
fn a_streaming_source_opens_from_a_wids_index_before_its_shards_download() {
    let dir = super::tests::cache_dir("feed-wids");
    let local = dir.join("local");
    std::fs::create_dir_all(&local).unwrap();
    let names = ["s0.tar", "s1.tar", "s2.tar", "s3.tar"];
    let shards: Vec<Vec<u8>> = names
        .iter()
        .enumerate()
        .map(|(i, _)| tar_shard(&format!("k{i}-"), 5 + i))
        .collect();
    let paths: Vec<PathBuf> = names.iter().map(|n| local.join(n)).collect();
    for (p, s) in paths.iter().zip(&shards) {
        std::fs::write(p, s).unwrap();
    }
    let (share, seed) = (RankShare::SINGLE, 7);
    let tar_config = |cache: &Path| TarConfig {
        index_dir: Some(dir.join("idx")),
        index_beside: false,
        remote: config(cache, 1),
        ..TarConfig::default()
    };
    let reference =
        TarStream::open(&paths, tar_config(&dir.join("c0")), share, seed, "local").unwrap();
    let want = keys(&reference, 0, usize::MAX);
    // Hold the shard read last in epoch 0 (shard_prefetch=1 starts it while the one before it
    // is read): everything before it must come through while its body is held.
    let runs = reference.epoch_runs(0);
    let last = runs.last().unwrap().0;
    let before: usize = runs[..runs.len() - 1].iter().map(|r| r.2).sum();
    let index = format!(
        r#"{{"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": [{}]}}"#,
        names
            .iter()
            .zip(&shards)
            .enumerate()
            .map(|(i, (n, s))| format!(
                r#"{{"url": "{n}", "nsamples": {}, "filesize": {}}}"#,
                5 + i,
                s.len()
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut files: HashMap<String, (Vec<u8>, Behaviour)> = names
        .iter()
        .zip(&shards)
        .enumerate()
        .map(|(i, (n, s))| {
            let how = Behaviour {
                hold: i == last,
                ..Behaviour::default()
            };
            ((*n).to_owned(), (s.clone(), how))
        })
        .collect();
    files.insert(
        "train.json".into(),
        (index.into_bytes(), Behaviour::default()),
    );
    let server = RangeServer::start(files);
    let cache = dir.join("cache");
    let stream =
        TarStream::open_pattern(&server.url("train.json"), tar_config(&cache), share, seed)
            .unwrap();
    assert_eq!(stream.total_samples(), want.len());
    assert_eq!(stream.shard_counts(), [5, 6, 7, 8]);
    let mut epoch = stream.open(0, None, 0).unwrap();
    let mut got = Vec::new();
    for _ in 0..before {
        let sample = epoch.next_sample().unwrap();
        let d = sample.describe();
        got.push(d[d.find(" sample ").unwrap()..].to_owned());
    }
    // Every shard before the held one was read while the held one is still downloading.
    eventually("the last shard's download to start", || {
        server.held.load(Ordering::SeqCst) == 1
    });
    server.release();
    while let Some(sample) = epoch.next_sample() {
        let mut scratch = Vec::new();
        sample.read(&mut scratch).unwrap();
        let d = sample.describe();
        got.push(d[d.find(" sample ").unwrap()..].to_owned());
    }
    assert_eq!(
        got, want,
        "the same samples in the same order as the local shards"
    );
    // The second epoch reads the cache: no more GETs.
    let gets = |s: &RangeServer| s.log().iter().filter(|l| l.starts_with("GET")).count();
    let before_epoch_1 = gets(&server);
    assert_eq!(
        keys(&stream, 1, usize::MAX),
        keys(&reference, 1, usize::MAX)
    );
    assert_eq!(gets(&server), before_epoch_1);
    drop(stream);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_shard_fails_its_samples_with_the_url_and_status() {
    let dir = super::tests::cache_dir("feed-missing");
    let index =
        r#"{"shardlist": [{"url": "a.tar", "nsamples": 3}, {"url": "gone.tar", "nsamples": 2}]}"#;
    let files = HashMap::from([
        (
            "a.tar".to_owned(),
            (tar_shard("a", 3), Behaviour::default()),
        ),
        (
            "i.json".to_owned(),
            (index.as_bytes().to_vec(), Behaviour::default()),
        ),
    ]);
    let server = RangeServer::start(files);
    let config = TarConfig {
        index_dir: Some(dir.join("idx")),
        remote: config(&dir.join("cache"), 2),
        ..TarConfig::default()
    };
    // The source reads its first shard to learn the fields: with the missing shard first in
    // epoch 0 it fails to open; with it second, its samples fail. Seeds give both orders.
    let (mut failed_open, mut failed_samples) = (false, false);
    for seed in 0..16 {
        let stream = match TarStream::open_pattern(
            &server.url("i.json"),
            config.clone(),
            RankShare::SINGLE,
            seed,
        ) {
            Ok(s) => s,
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("/d/gone.tar") && e.contains("HTTP 404"), "{e}");
                failed_open = true;
                continue;
            }
        };
        let mut epoch = stream.open(0, None, 0).unwrap();
        let mut errors = Vec::new();
        let mut ok = 0;
        while let Some(sample) = epoch.next_sample() {
            match sample.read(&mut Vec::new()) {
                Ok(_) => ok += 1,
                Err(e) => errors.push(e.to_string()),
            }
        }
        // The failed run is made up from the samples after it: the count stays the same.
        assert_eq!(ok + errors.len(), 5);
        assert!(
            errors
                .iter()
                .any(|e| e.contains("/d/gone.tar") && e.contains("HTTP 404")),
            "{errors:?}"
        );
        failed_samples = true;
    }
    assert!(failed_open && failed_samples);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
