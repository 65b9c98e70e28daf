//! Downloading one object to a local file, with retries.
//!
//! The stores are `object_store`'s (S3, GCS, Azure, HTTP), built from each store's standard
//! environment variables (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `AWS_REGION`,
//! `GOOGLE_APPLICATION_CREDENTIALS`, `AZURE_STORAGE_ACCOUNT_NAME`, …). `object_store`'s own
//! retries are turned off and downloads are retried here instead, because a download is more
//! than a request: a GET whose body is written to disk and checked against the size the
//! response declared. A body cut short is a failed attempt like a 503 or a reset connection,
//! and the next attempt asks only for the bytes still missing (a ranged GET) of the same object
//! (same size and ETag, else the download fails: the object changed); the final error names the
//! URL (without credentials), the status and the number of attempts.
//!
//! One tokio runtime (two worker threads) serves every download of a fetcher; callers block on
//! it from their own threads, so `shard_prefetch` downloads run at once without a runtime per
//! shard.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore, RetryConfig};

use super::url::{Scheme, ShardUrl};
use crate::error::{Error, Result};

/// How downloads are retried and bounded.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RetryPolicy {
    /// Attempts in all (the first and the retries).
    pub(crate) attempts: u32,
    /// The first backoff; each next one doubles, up to `max_backoff`, with full jitter.
    pub(crate) base_backoff: Duration,
    pub(crate) max_backoff: Duration,
    /// Longest wait for a connection.
    pub(crate) connect_timeout: Duration,
    /// Longest wait for a response or for the next piece of a body: a server that stops sending
    /// fails the attempt instead of hanging it.
    pub(crate) stall_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            base_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(60),
        }
    }
}

/// What one downloaded object was, as the store described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ObjectMeta {
    pub(crate) size: u64,
    pub(crate) etag: Option<String>,
}

/// One failed attempt.
#[derive(Debug)]
struct Failure {
    /// Worth another attempt (5xx, 408, 429, a timeout, a reset, a body cut short, an ETag that
    /// changed); 401, 403, 404 and other 4xx are not.
    transient: bool,
    status: Option<u16>,
    reason: String,
}

/// Downloads objects; owns the runtime and one client per store (bucket, container or host).
pub(crate) struct Fetcher {
    runtime: tokio::runtime::Runtime,
    stores: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
    policy: RetryPolicy,
}

impl Fetcher {
    pub(crate) fn new(policy: RetryPolicy) -> Result<Fetcher> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stoker-fetch")
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("starting the shard fetcher's runtime: {e}")))?;
        Ok(Fetcher {
            runtime,
            stores: Mutex::new(HashMap::new()),
            policy,
        })
    }

    /// The store serving `url`, built once per bucket / container / host.
    fn store(&self, url: &ShardUrl) -> Result<Arc<dyn ObjectStore>> {
        let key = format!(
            "{}://{}",
            url.full.scheme(),
            &url.full[url::Position::BeforeHost..url::Position::AfterPort]
        );
        let mut stores = self
            .stores
            .lock()
            .map_err(|_| Error::Internal("shard fetcher: store table poisoned".into()))?;
        if let Some(store) = stores.get(&key) {
            return Ok(store.clone());
        }
        let store = build_store(url, &self.policy)?;
        stores.insert(key, store.clone());
        Ok(store)
    }

    /// The object's size and ETag (one HEAD request, not retried: a cached copy is used when the
    /// store cannot say).
    pub(crate) fn head_once(&self, url: &ShardUrl, watch: &dyn Watch) -> Result<ObjectMeta> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        self.with_retries(url, "HEAD", 1, watch, || async {
            let meta = stall(&self.policy, store.head(&path)).await??;
            Ok(ObjectMeta {
                size: meta.size,
                etag: meta.e_tag,
            })
        })
    }

    /// Whether `url` names an object: a HEAD, retried while the failure is transient; a 404 is
    /// `false`, any other failure an error naming the URL.
    pub(crate) fn exists(&self, url: &ShardUrl) -> Result<bool> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        self.with_retries(url, "HEAD", self.policy.attempts, &(), || async {
            match stall(&self.policy, store.head(&path)).await? {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(Failure::from(e)),
            }
        })
    }

    /// Downloads `url` into `dest` (created or truncated; synced before returning), checking
    /// the body's length against the object's size. One GET, no HEAD: the response describes
    /// the object (size, ETag), and a round trip saved per shard is what a far store costs.
    ///
    /// `watch` sees the bytes as they land (a reader may follow the file while it grows) and
    /// can stop the download. Bytes once reported are never rewritten with other content: a
    /// retry after a body cut short resumes with a ranged GET from the first missing byte, and
    /// the object must keep the size and ETag of the first attempt (else the download fails:
    /// the object changed while being read). A store that answers a range with the whole
    /// object is read again from the start, over the same bytes.
    pub(crate) fn download(
        &self,
        url: &ShardUrl,
        dest: &Path,
        watch: &dyn Watch,
    ) -> Result<ObjectMeta> {
        let store = self.store(url)?;
        let path = object_path(url)?;
        let file = File::create(dest).map_err(|e| Error::os(dest, e))?;
        watch.written(0);
        // Across attempts: the object as first seen, the bytes in place, whether ranges work.
        let first: RefCell<Option<ObjectMeta>> = RefCell::new(None);
        let have = Cell::new(0u64);
        let ranged = Cell::new(true);
        self.with_retries(url, "GET", self.policy.attempts, watch, || async {
            let from = if ranged.get() { have.get() } else { 0 };
            let options = GetOptions {
                range: (from > 0).then_some(GetRange::Offset(from)),
                ..GetOptions::default()
            };
            let got = match stall(&self.policy, store.get_opts(&path, options)).await? {
                Ok(got) => got,
                Err(e) if from > 0 && ranges_refused(&e) => {
                    // The server ignores ranges: the next attempt reads from the start.
                    ranged.set(false);
                    return Err(Failure::transient(format!(
                        "the server does not serve byte ranges: {}",
                        error_chain(&e)
                    )));
                }
                Err(e) => return Err(e.into()),
            };
            // The GET's own description of the object (a range's too: its full size); the
            // first attempt's is the one every later attempt must match.
            let object = ObjectMeta {
                size: got.meta.size,
                etag: got.meta.e_tag.clone(),
            };
            let pinned = first
                .borrow_mut()
                .get_or_insert_with(|| object.clone())
                .clone();
            if pinned != object {
                return Err(Failure::permanent(format!(
                    "the object changed during the download (size {} ETag {}, now size {} ETag {})",
                    pinned.size,
                    pinned.etag.as_deref().unwrap_or("none"),
                    object.size,
                    object.etag.as_deref().unwrap_or("none")
                )));
            }
            // `&File` writes and seeks: the file is not borrowed across the awaits below.
            let mut file = &file;
            file.seek(SeekFrom::Start(from))
                .map_err(|e| local_failure(dest, "seek", e))?;
            let mut body = got.into_stream();
            let mut at = from;
            while let Some(chunk) = stall(&self.policy, body.next()).await? {
                let chunk = chunk?;
                at += chunk.len() as u64;
                if at > object.size {
                    return Err(Failure::transient(format!(
                        "the body is longer than the object's {} bytes",
                        object.size
                    )));
                }
                file.write_all(&chunk)
                    .map_err(|e| local_failure(dest, "write", e))?;
                if at > have.get() {
                    have.set(at);
                    watch.written(at);
                }
                if watch.cancelled() {
                    return Err(Failure::permanent("the download was cancelled".into()));
                }
            }
            if at != object.size {
                return Err(Failure::transient(format!(
                    "the body was cut short: {at} of {} bytes",
                    object.size
                )));
            }
            file.sync_all()
                .map_err(|e| local_failure(dest, "sync", e))?;
            Ok(object)
        })
    }

    /// Runs `attempt` until it succeeds, fails for good, or the attempts run out; sleeps a
    /// jittered exponential backoff between attempts.
    fn with_retries<T, F, Fut>(
        &self,
        url: &ShardUrl,
        what: &str,
        attempts: u32,
        watch: &dyn Watch,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, Failure>>,
    {
        let attempts = attempts.max(1);
        // Jitter differs between processes and runs (unlike sample randomness, it must not be
        // reproducible: ranks that failed together must not retry together).
        let mut jitter_state = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ (u64::from(std::process::id()) << 32);
        let mut made = 0u32;
        loop {
            made += 1;
            let failure = match self.runtime.block_on(cancelled_or(watch, attempt())) {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            if !failure.transient || made >= attempts {
                let status = failure
                    .status
                    .map_or_else(|| "no HTTP status".to_owned(), |s| format!("HTTP {s}"));
                let give_up = if failure.transient {
                    format!("gave up after {made} attempt(s)")
                } else {
                    format!("not retried, {made} attempt(s)")
                };
                return Err(Error::Io {
                    path: url.shown.clone().into(),
                    reason: url.scrub(&format!(
                        "{what} failed ({status}, {give_up}): {}",
                        failure.reason
                    )),
                });
            }
            let cap = self
                .policy
                .base_backoff
                .saturating_mul(1u32 << (made - 1).min(16))
                .min(self.policy.max_backoff);
            // Full jitter: uniform in [0, cap], so ranks that failed together do not retry
            // together.
            let unit =
                (crate::rng::splitmix64(&mut jitter_state) >> 11) as f64 / (1u64 << 53) as f64;
            let wake = std::time::Instant::now() + cap.mul_f64(unit);
            while std::time::Instant::now() < wake && !watch.cancelled() {
                std::thread::sleep(CANCEL_POLL.min(wake - std::time::Instant::now()));
            }
        }
    }
}

fn object_path(url: &ShardUrl) -> Result<object_store::path::Path> {
    object_store::path::Path::from_url_path(url.object_path()).map_err(|e| {
        Error::InvalidArgument(format!(
            "shard URL `{}`: {}",
            url.shown,
            url.scrub(&e.to_string())
        ))
    })
}

/// How often a waiting download looks at [`Watch::cancelled`].
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// Sees a download's progress and may stop it.
pub(crate) trait Watch {
    /// The first `bytes` of the object are in the destination file (called with 0 once the
    /// file exists, then after each piece of the body; never decreasing).
    fn written(&self, _bytes: u64) {}
    /// Whether to give up now (checked after each piece and while waiting).
    fn cancelled(&self) -> bool {
        false
    }
}

/// No watcher.
impl Watch for () {}

/// `attempt`, or a permanent failure as soon as `watch` says to stop.
async fn cancelled_or<T>(
    watch: &dyn Watch,
    attempt: impl std::future::Future<Output = std::result::Result<T, Failure>>,
) -> std::result::Result<T, Failure> {
    let stop = async {
        while !watch.cancelled() {
            tokio::time::sleep(CANCEL_POLL).await;
        }
    };
    let (attempt, stop) = (std::pin::pin!(attempt), std::pin::pin!(stop));
    match futures::future::select(attempt, stop).await {
        futures::future::Either::Left((result, _)) => result,
        futures::future::Either::Right(((), _)) => {
            Err(Failure::permanent("the download was cancelled".into()))
        }
    }
}

/// Bounds one await by the stall timeout.
async fn stall<F: std::future::Future>(
    policy: &RetryPolicy,
    future: F,
) -> std::result::Result<F::Output, Failure> {
    tokio::time::timeout(policy.stall_timeout, future)
        .await
        .map_err(|_| Failure {
            transient: true,
            status: None,
            reason: format!("no response for {} s", policy.stall_timeout.as_secs_f64()),
        })
}

impl Failure {
    fn transient(reason: String) -> Failure {
        Failure {
            transient: true,
            status: None,
            reason,
        }
    }

    fn permanent(reason: String) -> Failure {
        Failure {
            transient: false,
            status: None,
            reason,
        }
    }
}

fn local_failure(path: &Path, what: &str, e: std::io::Error) -> Failure {
    Failure {
        transient: false,
        status: None,
        reason: format!("{what} {}: {e}", path.display()),
    }
}

impl From<object_store::Error> for Failure {
    fn from(e: object_store::Error) -> Failure {
        use object_store::Error as E;
        let (transient, status) = match &e {
            E::NotFound { .. } => (false, Some(404)),
            E::PermissionDenied { .. } => (false, Some(403)),
            E::Unauthenticated { .. } => (false, Some(401)),
            E::InvalidPath { .. }
            | E::NotSupported { .. }
            | E::NotImplemented
            | E::UnknownConfigurationKey { .. } => (false, None),
            _ => match status_in(&e) {
                Some(s) => (s >= 500 || s == 408 || s == 429, Some(s)),
                // A certificate the reader does not trust (or that does not name the host)
                // stays so on the next attempt.
                None if error_chain(&e).contains("certificate") => (false, None),
                // No status: the connection failed, was reset or timed out, or the body broke
                // off.
                None => (true, None),
            },
        };
        Failure {
            transient,
            status,
            reason: error_chain(&e),
        }
    }
}

/// The HTTP status an `object_store` error carries. Its retry error type (which has a
/// `status()`) is private to the crate, so the status is read from the message it always
/// writes: "Server returned non-2xx status code: 503 Service Unavailable".
fn status_in(e: &object_store::Error) -> Option<u16> {
    let text = error_chain(e);
    let at = text.find("status code: ")? + "status code: ".len();
    text.get(at..at + 3)?.parse().ok()
}

/// Whether a ranged GET failed because the server answered with the whole object (the HTTP
/// store calls it "not supported", the cloud stores "non-partial response").
fn ranges_refused(e: &object_store::Error) -> bool {
    let text = error_chain(e);
    text.contains("Range request not supported") || text.contains("non-partial response")
}

/// The error and its sources, one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    let mut depth = 0;
    while let Some(s) = source {
        let line = s.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = s.source();
        depth += 1;
        if depth > 8 {
            break;
        }
    }
    text
}

fn build_store(url: &ShardUrl, policy: &RetryPolicy) -> Result<Arc<dyn ObjectStore>> {
    // Retries are ours (see the module docs).
    let retry = RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    };
    let client = ClientOptions::new()
        .with_connect_timeout(policy.connect_timeout)
        // A whole-request timeout would cut large shards on slow links; the stall timeout
        // bounds each wait instead.
        .with_timeout_disabled();
    let bad = |e: object_store::Error| {
        Error::InvalidArgument(format!(
            "shard URL `{}`: cannot configure its store: {}",
            url.shown,
            url.scrub(&error_chain(&e))
        ))
    };
    let text = url.full.as_str();
    let store: Arc<dyn ObjectStore> = match url.scheme {
        Scheme::S3 => {
            // An endpoint given as http:// (a local S3-compatible server) is the user's explicit
            // choice of plain HTTP.
            let plain = ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
                .iter()
                .any(|k| std::env::var(k).is_ok_and(|v| v.starts_with("http://")));
            let client = if plain {
                client.with_allow_http(true)
            } else {
                client
            };
            Arc::new(
                object_store::aws::AmazonS3Builder::from_env()
                    .with_url(text)
                    .with_retry(retry)
                    .with_client_options(client)
                    .build()
                    .map_err(bad)?,
            )
        }
        Scheme::Gcs => Arc::new(
            object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(text)
                .with_retry(retry)
                .with_client_options(client)
                .build()
                .map_err(bad)?,
        ),
        Scheme::Azure => Arc::new(
            object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(text)
                .with_retry(retry)
                .with_client_options(client)
                .build()
                .map_err(bad)?,
        ),
        Scheme::Http => {
            let base = &url.full[..url::Position::BeforePath];
            Arc::new(
                object_store::http::HttpBuilder::new()
                    .with_url(base)
                    .with_retry(retry)
                    .with_client_options(client.with_allow_http(true))
                    .build()
                    .map_err(bad)?,
            )
        }
    };
    Ok(store)
}
