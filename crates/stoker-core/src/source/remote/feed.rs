//! Remote shards fetched in the order a reader needs them, readable while they download.
//!
//! A streaming reader that knows every shard's sample count up front (a WebDataset `wids`
//! index lists them) need not wait for the dataset to be cached: it tells the feed which shards
//! come next ([`ShardFeed::upcoming`]), the feed keeps the first `shard_prefetch + 1` of them
//! downloading (the one being read and `shard_prefetch` ahead), and [`ShardFeed::reader`] reads
//! a shard from the start while its bytes land in the cache's partial file, waiting for each
//! byte only until it is written. So the first batch waits for one round trip and one shard's
//! first samples, not for the dataset, and later shards download while earlier ones decode.
//!
//! Each download goes through the cache exactly as in the resolve-everything path (one process
//! per node downloads a shard, the file is installed atomically after its checks): a shard
//! another process is downloading is read once it is in place. A shard already cached costs
//! one HEAD. A failed shard's reader returns the download's error (URL, status, attempts).
//! Downloaded shards stay held (not evictable) while the feed lives, as in the other path.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::cache::{CachedShard, ShardCache};
use super::fetch::{Fetcher, Watch};
use super::url::ShardUrl;
use crate::error::{Error, Result};

/// How often a waiting reader looks whether it was stopped.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Upper bound on download threads, whatever `shard_prefetch` says.
const MAX_DOWNLOADS: usize = 64;

/// Remote shards downloading ahead of a sequential reader (see the module docs).
pub struct ShardFeed {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
}

struct Inner {
    urls: Vec<ShardUrl>,
    fetcher: Fetcher,
    cache: Arc<ShardCache>,
    /// Shards downloading at once beyond the one being read.
    ahead: usize,
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    shards: Vec<Transfer>,
    /// The shards the reader needs next, in order (the first is being read).
    upcoming: Vec<usize>,
    closed: bool,
}

enum Transfer {
    Idle,
    /// Being checked or downloaded; `part` once its partial file exists.
    Fetching {
        part: Option<PathBuf>,
        written: u64,
    },
    Ready(CachedShard),
    Failed(String),
}

impl ShardFeed {
    /// A feed over `urls` (none downloaded yet), `ahead` shards beyond the one being read.
    pub(crate) fn new(
        urls: Vec<ShardUrl>,
        fetcher: Fetcher,
        cache: Arc<ShardCache>,
        ahead: usize,
    ) -> Result<ShardFeed> {
        let ahead = ahead.clamp(1, MAX_DOWNLOADS - 1);
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                shards: urls.iter().map(|_| Transfer::Idle).collect(),
                upcoming: Vec::new(),
                closed: false,
            }),
            urls,
            fetcher,
            cache,
            ahead,
            changed: Condvar::new(),
        });
        let threads = (0..(ahead + 1).min(inner.urls.len()))
            .map(|_| {
                let inner = Arc::clone(&inner);
                std::thread::Builder::new()
                    .name("stoker-shard-feed".into())
                    .spawn(move || inner.download_loop())
                    .map_err(|e| {
                        Error::Internal(format!("cannot start a shard download thread: {e}"))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ShardFeed { inner, threads })
    }

    /// The shards read next, in order, the first being read now: of the first
    /// `shard_prefetch + 1` distinct ones, the feed downloads those not fetched yet (a failed
    /// one stays failed). Replaces the previous list.
    pub fn upcoming(&self, shards: impl IntoIterator<Item = usize>) {
        let mut window = Vec::with_capacity(self.inner.ahead + 1);
        for s in shards {
            if window.len() > self.inner.ahead {
                break;
            }
            if s < self.inner.urls.len() && !window.contains(&s) {
                window.push(s);
            }
        }
        if let Ok(mut state) = self.inner.state.lock() {
            state.upcoming = window;
        }
        self.inner.changed.notify_all();
    }

    /// Reads shard `shard` from its start, as far as it has downloaded; a read waits for more
    /// bytes (or fails with the download's error). The shard should be first in
    /// [`upcoming`](Self::upcoming), or it waits its turn. Setting `stop` makes a waiting read
    /// fail at once.
    pub fn reader(&self, shard: usize, stop: Arc<AtomicBool>) -> FeedReader {
        FeedReader {
            inner: Arc::clone(&self.inner),
            shard,
            stop,
            file: None,
            pos: 0,
        }
    }

    /// How shard `shard` is shown (its URL without credentials).
    pub fn shown(&self, shard: usize) -> &str {
        self.inner.urls.get(shard).map_or("", |u| u.shown.as_str())
    }
}

impl Drop for ShardFeed {
    fn drop(&mut self) {
        if let Ok(mut state) = self.inner.state.lock() {
            state.closed = true;
        }
        self.inner.changed.notify_all();
        // Downloads see `closed` within a poll interval (see `Watch for Progress`).
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Inner {
    fn lock(&self) -> Option<MutexGuard<'_, State>> {
        self.state.lock().ok()
    }

    /// One download thread: the first idle shard of the upcoming ones, until closed.
    fn download_loop(&self) {
        loop {
            let shard = {
                let Some(mut state) = self.lock() else { return };
                loop {
                    if state.closed {
                        return;
                    }
                    let next = state
                        .upcoming
                        .iter()
                        .copied()
                        .find(|&s| matches!(state.shards[s], Transfer::Idle));
                    if let Some(s) = next {
                        state.shards[s] = Transfer::Fetching {
                            part: None,
                            written: 0,
                        };
                        break s;
                    }
                    state = match self.changed.wait(state) {
                        Ok(s) => s,
                        Err(_) => return,
                    };
                }
            };
            let url = &self.urls[shard];
            let progress = Progress { inner: self, shard };
            let result = self.cache.get(
                url,
                || self.fetcher.head_once(url, &progress).ok(),
                |part| {
                    if let Some(mut state) = self.lock() {
                        state.shards[shard] = Transfer::Fetching {
                            part: Some(part.to_owned()),
                            written: 0,
                        };
                    }
                    self.fetcher.download(url, part, &progress)
                },
            );
            if let Some(mut state) = self.lock() {
                state.shards[shard] = match result {
                    Ok(cached) => Transfer::Ready(cached),
                    Err(e) => Transfer::Failed(e.to_string()),
                };
            }
            self.changed.notify_all();
        }
    }
}

/// Publishes one download's progress to the feed's readers.
struct Progress<'a> {
    inner: &'a Inner,
    shard: usize,
}

impl Watch for Progress<'_> {
    fn written(&self, bytes: u64) {
        if let Some(mut state) = self.inner.lock() {
            if let Transfer::Fetching { written, .. } = &mut state.shards[self.shard] {
                *written = bytes;
            }
        }
        self.inner.changed.notify_all();
    }

    fn cancelled(&self) -> bool {
        self.inner.lock().is_none_or(|s| s.closed)
    }
}

/// A shard read while it downloads (see [`ShardFeed::reader`]).
pub struct FeedReader {
    inner: Arc<Inner>,
    shard: usize,
    stop: Arc<AtomicBool>,
    /// The partial file, then (same inode once renamed, or the cached file) the shard.
    file: Option<File>,
    pos: u64,
}

impl Read for FeedReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let closed = || std::io::Error::other("the shard feed closed");
        let mut state = self.inner.lock().ok_or_else(closed)?;
        // How many bytes may be read from `pos` now, and from which file.
        let available = loop {
            if self.stop.load(Ordering::Relaxed) || state.closed {
                return Err(std::io::Error::other("the shard reader was stopped"));
            }
            match &state.shards[self.shard] {
                Transfer::Ready(cached) => {
                    if self.file.is_none() {
                        self.file = Some(File::open(&cached.path)?);
                    }
                    break cached.meta.size.saturating_sub(self.pos);
                }
                Transfer::Fetching {
                    part: Some(part),
                    written,
                } if *written > self.pos => {
                    if self.file.is_none() {
                        match File::open(part) {
                            Ok(file) => self.file = Some(file),
                            // Renamed into place just now: the state says so in a moment.
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => return Err(e),
                        }
                    }
                    if self.file.is_some() {
                        break written - self.pos;
                    }
                }
                Transfer::Failed(reason) => return Err(std::io::Error::other(reason.clone())),
                Transfer::Idle | Transfer::Fetching { .. } => {}
            }
            state = self
                .inner
                .changed
                .wait_timeout(state, STOP_POLL)
                .map_err(|_| closed())?
                .0;
        };
        drop(state);
        if available == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(available).unwrap_or(usize::MAX));
        let file = self.file.as_ref().ok_or_else(closed)?;
        let n = file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}
