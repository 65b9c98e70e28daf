//! `tar:http://...` through the loader: the same samples as the local shards, in indexed and
//! streaming mode, the first loader downloading into `cache_dir` and the next reading from it;
//! ranks sharing one cache download each shard once; `on_error=skip` leaves out a missing
//! shard. The server is a small static file server on 127.0.0.1 written here (with the request
//! log the assertions need); `ctests/remote_servers.sh` runs the same reads against nginx and an
//! S3 server.
#![cfg(feature = "remote")]

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stoker_core::{Batch, Loader, LoaderOptions};

mod files;
use files::{tmp, write_tar};

/// Shards of `sizes` samples; sample `g` has `g.cls` = g. Returns the file names.
fn write_shards(dir: &Path, sizes: &[usize]) -> Vec<String> {
    let mut g = 0usize;
    let mut names = Vec::new();
    for (s, &n) in sizes.iter().enumerate() {
        let members: Vec<_> = (0..n)
            .map(|_| {
                g += 1;
                (
                    format!("k{:06}.cls", g - 1),
                    (g - 1).to_string().into_bytes(),
                )
            })
            .collect();
        let name = format!("shard-{s:03}.tar");
        write_tar(&dir.join(&name), &members);
        names.push(name);
    }
    names
}

/// Serves the files of `root` (GET, HEAD) with Content-Length and an ETag, one thread per
/// connection, until dropped (at most 60 s).
struct FileServer {
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl FileServer {
    fn start(root: PathBuf) -> FileServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (log2, stop2) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop2.load(Ordering::SeqCst) && Instant::now() < deadline {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                let (root, log) = (root.clone(), log2.clone());
                std::thread::spawn(move || {
                    stream.set_nonblocking(false).unwrap();
                    stream
                        .set_read_timeout(Some(Duration::from_secs(10)))
                        .unwrap();
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut stream = stream;
                    // Keep-alive: answer requests on this connection until it closes.
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        loop {
                            let mut h = String::new();
                            if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                                break;
                            }
                        }
                        let mut parts = line.split_whitespace();
                        let method = parts.next().unwrap_or("").to_owned();
                        let path = parts.next().unwrap_or("").to_owned();
                        log.lock().unwrap().push(format!("{method} {path}"));
                        let file = root.join(path.trim_start_matches('/'));
                        let reply = match fs::read(&file) {
                            Ok(data) => {
                                let head = format!(
                                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nETag: \"{}\"\r\n\r\n",
                                    data.len(),
                                    data.len()
                                );
                                let mut out = head.into_bytes();
                                if method == "GET" {
                                    out.extend_from_slice(&data);
                                }
                                out
                            }
                            Err(_) => {
                                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec()
                            }
                        };
                        if stream.write_all(&reply).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        FileServer { port, log, stop }
    }

    fn gets(&self) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("GET"))
            .count()
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn loader(source: &str, kv: &[(&str, &str)]) -> Loader {
    let mut o = LoaderOptions::new();
    o.set("source", &format!("tar:{source}")).unwrap();
    o.set("fields", "cls:label").unwrap();
    o.set("batch_size", "4").unwrap();
    for (k, v) in kv {
        o.set(k, v).unwrap();
    }
    Loader::new(&o).unwrap()
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

fn epoch(l: &mut Loader) -> Vec<i64> {
    l.epoch_iter().flat_map(|b| labels(&b.unwrap())).collect()
}

const SIZES: [usize; 4] = [9, 3, 12, 6]; // 30 samples

#[test]
fn http_shards_read_as_local_ones_and_the_cache_serves_the_next_loader() {
    let data = tmp("data");
    write_shards(&data, &SIZES);
    let server = FileServer::start(data.clone());
    let cache = tmp("cache");
    let url = format!("http://127.0.0.1:{}/shard-{{000..003}}.tar", server.port);
    let local = format!("{}/shard-{{000..003}}.tar", data.display());
    let cache_dir = cache.to_str().unwrap();
    for mode in [
        &[("shuffle_buffer", "0"), ("shuffle", "true")][..],
        &[("shuffle_buffer", "8")][..],
    ] {
        let mut want = loader(&local, mode);
        let want = epoch(&mut want);
        assert_eq!(want.len(), 30);
        let mut kv = mode.to_vec();
        kv.push(("cache_dir", cache_dir));
        let mut got = loader(&url, &kv);
        assert_eq!(epoch(&mut got), want, "{mode:?}");
        // The second epoch reads the cached files.
        let gets = server.gets();
        got.set_epoch(1).unwrap();
        assert_eq!(epoch(&mut got).len(), 30);
        assert_eq!(server.gets(), gets);
    }
    // Both loaders together downloaded each shard once; each cached shard is whole.
    assert_eq!(server.gets(), 4);
    for name in ["shard-000.tar", "shard-003.tar"] {
        let cached: Vec<_> = fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_str().unwrap().ends_with(name))
            .collect();
        assert_eq!(cached.len(), 1, "{cached:?}");
        assert_eq!(
            fs::read(&cached[0]).unwrap(),
            fs::read(data.join(name)).unwrap()
        );
    }
    // Without cache_dir: a private cache, downloaded again, removed with the loader.
    let mut private = loader(&url, &[]);
    assert_eq!(epoch(&mut private).len(), 30);
    assert_eq!(server.gets(), 8);
    drop(private);
    fs::remove_dir_all(&data).unwrap();
    fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn ranks_sharing_a_cache_download_each_shard_once() {
    let data = tmp("ranks-data");
    write_shards(&data, &SIZES);
    let server = FileServer::start(data.clone());
    let cache = tmp("ranks-cache");
    let url = format!("http://127.0.0.1:{}/shard-{{000..003}}.tar", server.port);
    let ranks: Vec<_> = (0..4)
        .map(|rank| {
            let (url, cache) = (url.clone(), cache.clone());
            std::thread::spawn(move || {
                let rank = rank.to_string();
                let mut l = loader(
                    &url,
                    &[
                        ("rank", &rank),
                        ("world_size", "4"),
                        ("shuffle_buffer", "4"),
                        ("cache_dir", cache.to_str().unwrap()),
                    ],
                );
                epoch(&mut l)
            })
        })
        .collect();
    let mut all: Vec<i64> = ranks.into_iter().flat_map(|t| t.join().unwrap()).collect();
    all.sort();
    all.dedup();
    assert_eq!(all, (0..30).collect::<Vec<_>>());
    assert_eq!(server.gets(), 4);
    fs::remove_dir_all(&data).unwrap();
    fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn missing_shard_fails_naming_it_or_is_skipped() {
    let data = tmp("missing-data");
    write_shards(&data, &SIZES);
    let server = FileServer::start(data.clone());
    let url = format!("http://127.0.0.1:{}/shard-{{000..004}}.tar", server.port);
    let mut o = LoaderOptions::new();
    o.set("source", &format!("tar:{url}")).unwrap();
    o.set("fields", "cls:label").unwrap();
    let err = Loader::new(&o).err().unwrap().to_string();
    assert!(err.contains("shard-004.tar"), "{err}");
    assert!(err.contains("HTTP 404"), "{err}");
    let mut skip = loader(&url, &[("on_error", "skip")]);
    assert_eq!(epoch(&mut skip).len(), 30);
    assert_eq!(skip.stats().samples_skipped, 1);
    fs::remove_dir_all(&data).unwrap();
}
