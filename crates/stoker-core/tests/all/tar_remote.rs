//! `tar:http://...` through the loader: the same samples as the local shards, in indexed and
//! streaming mode, the first loader downloading into `cache_dir` and the next reading from it;
//! ranks sharing one cache download each shard once; `on_error=skip` leaves out a missing
//! shard; `packed:` datasets read over HTTP through the same cache. The server is a small static file server on 127.0.0.1 written here (with the request
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

use crate::support::files::{tmp, write_tar};

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

/// `packed:` over HTTP: a dataset directory (its index, then its shards), a list of shard URLs,
/// the cache serving the next loader, and a shard that does not match the index named by URL.
#[test]
fn packed_datasets_read_over_http_as_local_ones() {
    use stoker_core::pack::{pack, PackOptions};
    use stoker_core::source::MemorySource;
    use stoker_core::DType;

    let data = tmp("packed-data");
    let n = 40usize;
    let labels: Vec<u8> = (0..n as i64).flat_map(|i| i.to_ne_bytes()).collect();
    let extra: Vec<u8> = (0..n * 3000).map(|i| (i % 253) as u8).collect();
    let source = MemorySource::new()
        .with_tensor("label", DType::I64, &[], labels)
        .unwrap()
        .with_tensor("extra", DType::U8, &[3000], extra)
        .unwrap();
    let options = PackOptions {
        page_size: 4096,
        shard_size: Some(16 << 10),
        ..PackOptions::default()
    };
    let report = pack(&source, &data.join("ds"), &options, &|_, _| {}).unwrap();
    assert!(report.files.len() >= 3, "{:?}", report.files);
    let server = FileServer::start(data.clone());
    let base = format!("http://127.0.0.1:{}/ds/", server.port);
    let packed = |spec: &str, kv: &[(&str, &str)]| {
        let mut o = LoaderOptions::new();
        o.set("source", &format!("packed:{spec}"))?;
        for (k, v) in [("batch_size", "4"), ("shuffle", "true"), ("seed", "3")]
            .iter()
            .chain(kv)
        {
            o.set(k, v)?;
        }
        Loader::new(&o)
    };
    let want = epoch(&mut packed(data.join("ds").to_str().unwrap(), &[]).unwrap());
    assert_eq!(want.len(), n);

    let cache = tmp("packed-cache");
    let cache_kv = [("cache_dir", cache.to_str().unwrap())];
    assert_eq!(epoch(&mut packed(&base, &cache_kv).unwrap()), want);
    let gets = server.gets();
    assert_eq!(
        gets,
        report.files.len() + 1,
        "the index and each shard once"
    );
    // The next loader with the same cache reads it: no download.
    assert_eq!(
        epoch(&mut packed(&format!("{base}index.stkidx"), &cache_kv).unwrap()),
        want
    );
    assert_eq!(server.gets(), gets);

    // A comma list of shard URLs (no index), into a private cache.
    let list: Vec<String> = report
        .files
        .iter()
        .map(|f| format!("{base}{}", f.file_name().unwrap().to_str().unwrap()))
        .collect();
    assert_eq!(epoch(&mut packed(&list.join(","), &[]).unwrap()), want);

    // A shard that is not the one the index lists: refused, naming its URL.
    let first = report.files[0].clone();
    let second = &report.files[1];
    fs::copy(second, &first).unwrap();
    let err = packed(&base, &[]).err().unwrap().to_string();
    let first_url = format!("{base}{}", first.file_name().unwrap().to_str().unwrap());
    assert!(
        err.contains(&first_url) && err.contains("does not match the dataset index"),
        "{err}"
    );
    // No index at the URL: an error naming it.
    let err = packed(&format!("http://127.0.0.1:{}/nothing/", server.port), &[])
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("nothing/index.stkidx") && err.contains("404"),
        "{err}"
    );
    fs::remove_dir_all(&data).unwrap();
    fs::remove_dir_all(&cache).unwrap();
}
