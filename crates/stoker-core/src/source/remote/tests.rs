//! Downloads against a small HTTP server on 127.0.0.1 that misbehaves on purpose: 503s, bodies
//! cut short, ETags that change, 403/404, a server that stops mid-shard or stops answering.
//! (A real server cannot be told to fail this way on cue; `ctests/remote_servers.sh` covers
//! nginx and an S3 server.)

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::fetch::RetryPolicy;
use super::resolve::resolve_with;
use super::RemoteConfig;

/// What the server does with the n-th request (0-based) of a method.
#[derive(Clone, Debug)]
enum Reply {
    Ok,
    Status(u16),
    /// Declares the full length, sends half, closes.
    Truncated,
    /// GET answered with another ETag (`"v2"`) than the usual `"v1"`.
    OtherEtag,
    /// Sends half the body, then the server stops listening for good.
    StopMidBody,
    /// Reads the request and answers nothing (until the connection is dropped).
    Silent,
}

struct FaultServer {
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const BODY_LEN: usize = 64 * 1024;

fn body() -> Vec<u8> {
    (0..BODY_LEN).map(|i| (i * 7 % 251) as u8).collect()
}

impl FaultServer {
    /// Serves `/d/NAME` with `plan(method, n)`; at most 64 connections, 30 s.
    fn start(plan: impl Fn(&str, usize) -> Reply + Send + 'static) -> FaultServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicUsize::new(0));
        let (log2, stop2) = (log.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut served = 0;
            let mut counts = std::collections::HashMap::<String, usize>::new();
            while served < 64 && Instant::now() < deadline && stop2.load(Ordering::SeqCst) == 0 {
                let stream = match listener.accept() {
                    Ok((s, _)) => s,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                served += 1;
                stream.set_nonblocking(false).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
                let Some((method, path)) = read_request(&stream) else {
                    continue;
                };
                log2.lock().unwrap().push(format!("{method} {path}"));
                let n = counts.entry(method.clone()).or_default();
                let reply = plan(&method, *n);
                *n += 1;
                if !path.starts_with("/d/") {
                    respond(stream, &method, 404, b"", "\"e\"", false);
                    continue;
                }
                let stop_after = matches!(reply, Reply::StopMidBody);
                serve(stream, &method, reply, &stop2);
                if stop_after {
                    break;
                }
            }
        });
        FaultServer {
            port,
            log,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/d/{name}", self.port)
    }

    fn requests(&self, method: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with(method))
            .count()
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.stop.store(1, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_request(stream: &TcpStream) -> Option<(String, String)> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 || header == "\r\n" {
            break;
        }
    }
    Some((method, path))
}

fn serve(stream: TcpStream, method: &str, reply: Reply, stop: &AtomicUsize) {
    let data = body();
    match reply {
        Reply::Ok => respond(stream, method, 200, &data, "\"v1\"", false),
        Reply::Status(code) => respond(stream, method, code, b"", "\"v1\"", false),
        Reply::Truncated => respond(stream, method, 200, &data, "\"v1\"", true),
        Reply::OtherEtag => {
            let etag = if method == "GET" { "\"v2\"" } else { "\"v1\"" };
            respond(stream, method, 200, &data, etag, false)
        }
        Reply::StopMidBody => {
            respond(stream, method, 200, &data, "\"v1\"", true);
            stop.store(1, Ordering::SeqCst);
        }
        Reply::Silent => {
            // Hold the connection open without answering until the client gives up (bounded
            // by the read timeout set on the socket).
            let mut buf = [0u8; 1];
            let _ = std::io::Read::read(&mut &stream, &mut buf);
        }
    }
}

fn respond(mut stream: TcpStream, method: &str, code: u16, data: &[u8], etag: &str, cut: bool) {
    let reason = match code {
        200 => "OK",
        403 => "Forbidden",
        404 => "Not Found",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Length: {}\r\nETag: {etag}\r\nConnection: close\r\n\r\n",
        data.len()
    );
    let _ = stream.write_all(head.as_bytes());
    if method == "GET" && code == 200 {
        let end = if cut { data.len() / 2 } else { data.len() };
        let _ = stream.write_all(&data[..end]);
    }
    let _ = stream.flush();
}

pub(super) fn policy() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        base_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        connect_timeout: Duration::from_secs(2),
        stall_timeout: Duration::from_secs(1),
    }
}

pub(super) fn cache_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stoker-remote-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

pub(super) fn config(dir: &Path) -> RemoteConfig {
    RemoteConfig {
        shard_prefetch: 2,
        cache_dir: Some(dir.to_owned()),
        cache_limit: None,
    }
}

/// Files in the cache other than lock files.
fn cache_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default()
}

fn fetch(server: &FaultServer, dir: &Path) -> crate::error::Result<super::ResolvedShards> {
    resolve_with(vec![server.url("a.tar")], &config(dir), false, policy())
}

#[test]
fn retries_503_then_succeeds_and_caches() {
    let server = FaultServer::start(|m, n| {
        if m == "GET" && n < 2 {
            Reply::Status(503)
        } else {
            Reply::Ok
        }
    });
    let dir = cache_dir("503");
    let shards = fetch(&server, &dir).unwrap();
    assert_eq!(std::fs::read(&shards.paths[0]).unwrap(), body());
    assert_eq!(server.requests("GET"), 3);
    assert_eq!(shards.names[0], server.url("a.tar"));
    assert_eq!(
        (shards.downloaded, shards.downloaded_bytes),
        (1, BODY_LEN as u64)
    );
    drop(shards);
    // Second open: one HEAD to revalidate, no GET.
    let again = fetch(&server, &dir).unwrap();
    assert_eq!(std::fs::read(&again.paths[0]).unwrap(), body());
    assert_eq!(server.requests("GET"), 3);
    assert_eq!(again.downloaded, 0);
    drop(again);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncated_body_is_retried_then_reported() {
    let server = FaultServer::start(|m, n| {
        if m == "GET" && n == 0 {
            Reply::Truncated
        } else {
            Reply::Ok
        }
    });
    let dir = cache_dir("trunc-once");
    let shards = fetch(&server, &dir).unwrap();
    assert_eq!(std::fs::read(&shards.paths[0]).unwrap(), body());
    drop(shards);
    std::fs::remove_dir_all(&dir).unwrap();

    let server = FaultServer::start(|_, _| Reply::Truncated);
    let dir = cache_dir("trunc-always");
    let err = fetch(&server, &dir).unwrap_err().to_string();
    assert!(err.contains(&server.url("a.tar")), "{err}");
    assert!(err.contains("3 attempt(s)"), "{err}");
    assert!(cache_files(&dir).is_empty(), "{:?}", cache_files(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_object_replaced_mid_download_is_reported() {
    // The first GET is cut short; the retry finds another version of the object.
    let server = FaultServer::start(|m, n| match (m, n) {
        ("GET", 0) => Reply::Truncated,
        _ => Reply::OtherEtag,
    });
    let dir = cache_dir("etag");
    let err = fetch(&server, &dir).unwrap_err().to_string();
    assert!(
        err.contains("the object changed during the download"),
        "{err}"
    );
    assert!(err.contains("\"v1\"") && err.contains("\"v2\""), "{err}");
    // Attempts: cut short; a range this server ignores; the whole object, another version.
    assert!(err.contains("not retried, 3 attempt(s)"), "{err}");
    assert!(cache_files(&dir).is_empty(), "{:?}", cache_files(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn not_found_and_forbidden_fail_at_once() {
    for code in [404u16, 403] {
        let server = FaultServer::start(move |_, _| Reply::Status(code));
        let dir = cache_dir(&format!("s{code}"));
        let err = fetch(&server, &dir).unwrap_err().to_string();
        assert!(err.contains(&format!("HTTP {code}")), "{err}");
        assert!(err.contains("not retried, 1 attempt(s)"), "{err}");
        assert_eq!(server.requests("GET") + server.requests("HEAD"), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn server_stopped_mid_shard() {
    let server = FaultServer::start(|_, _| Reply::StopMidBody);
    let dir = cache_dir("stop");
    let start = Instant::now();
    let err = fetch(&server, &dir).unwrap_err().to_string();
    assert!(err.contains("3 attempt(s)"), "{err}");
    assert!(err.contains(&server.url("a.tar")), "{err}");
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(cache_files(&dir).is_empty(), "{:?}", cache_files(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn silent_server_times_out() {
    let server = FaultServer::start(|_, _| Reply::Silent);
    let dir = cache_dir("silent");
    let start = Instant::now();
    let err = fetch(&server, &dir).unwrap_err().to_string();
    assert!(err.contains("no response"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(20));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn credentials_stay_out_of_errors() {
    let server = FaultServer::start(|_, _| Reply::Status(503));
    let dir = cache_dir("creds");
    let url = format!(
        "http://reader:s3cr3tpass@127.0.0.1:{}/d/a.tar?sig=t0ps3cr3t",
        server.port
    );
    let err = resolve_with(vec![url], &config(&dir), false, policy())
        .unwrap_err()
        .to_string();
    assert!(!err.contains("s3cr3tpass"), "{err}");
    assert!(!err.contains("t0ps3cr3t"), "{err}");
    assert!(err.contains("HTTP 503"), "{err}");
    assert!(
        err.contains(&format!("127.0.0.1:{}/d/a.tar", server.port)),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn skip_leaves_out_failed_shards() {
    let server = FaultServer::start(|_, _| Reply::Ok);
    let dir = cache_dir("skip");
    let good = server.url("a.tar");
    let bad = format!("http://127.0.0.1:{}/missing/b.tar", server.port);
    let shards = resolve_with(vec![good.clone(), bad], &config(&dir), true, policy()).unwrap();
    assert_eq!(shards.names, vec![good]);
    assert_eq!(shards.skipped.len(), 1);
    assert!(
        shards.skipped[0].contains("HTTP 404"),
        "{:?}",
        shards.skipped
    );
    drop(shards);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn private_cache_is_removed_with_the_source() {
    let server = FaultServer::start(|_, _| Reply::Ok);
    let cfg = RemoteConfig::default();
    let shards = resolve_with(vec![server.url("a.tar")], &cfg, false, policy()).unwrap();
    let path = shards.paths[0].clone();
    assert_eq!(std::fs::read(&path).unwrap(), body());
    drop(shards);
    assert!(!path.exists());
}
