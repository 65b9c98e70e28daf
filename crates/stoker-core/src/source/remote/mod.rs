//! Shards from object stores and HTTP: `s3://`, `gs://`, `az://`, `http://`, `https://`.
//!
//! The cache is the mechanism: every remote shard is downloaded whole into a local cache
//! directory (`cache_dir`, or a private temporary one removed when the source closes), and the
//! tar readers then read the cached file exactly as a local shard, memory-mapped and indexed.
//! Packed datasets (`packed:URL`) go the same way: their index first, then the shards it lists
//! (see `packed::index::resolve_with`).
//! `shard_prefetch` downloads run at once; the shards are indexed once all are in place.
//!
//! Both tar modes need every shard's sample count before the first batch (indexed mode for its
//! random access, streaming mode for its equal-batches rule). Without a list of counts, a
//! source opens once all its shards are in the cache: the first open downloads the dataset
//! (that is the cold epoch's cost), later opens with the same `cache_dir` check each shard's
//! size and ETag with one HEAD request and read locally. A streaming source whose shards come
//! with their counts (a WebDataset `wids` index) opens at once instead: its [`feed`] downloads
//! the shards in the order the rank reads them, `shard_prefetch` ahead, and each is read while
//! it downloads.
//!
//! - `url`: parsing, the shown (credential-free) form, cache file names;
//! - `fetch`: `object_store` clients, downloads with retries (resumed by ranged reads), error
//!   classification;
//! - `feed`: shards downloading ahead of a streaming reader, readable while they download;
//! - `cache`: atomic cache files, LRU eviction within `cache_limit`, locks shared by the ranks
//!   of one node.

use std::path::PathBuf;

/// URL schemes kept as strings.
const URL_SCHEMES: &[&str] = &["http://", "https://", "s3://", "gs://", "az://", "file://"];

/// Whether `s` is a URL (kept as a string) rather than a local path.
pub fn is_url(s: &str) -> bool {
    URL_SCHEMES.iter().any(|scheme| s.starts_with(scheme))
}

/// How remote shards are fetched and cached (`shard_prefetch`, `cache_dir`, `cache_limit`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteConfig {
    /// Downloads in flight at once (0 is taken as 1).
    pub shard_prefetch: usize,
    /// The shared cache directory; `None`: a private temporary directory per source.
    pub cache_dir: Option<PathBuf>,
    /// Bytes of cached shards kept when not in use; `None`: unlimited.
    pub cache_limit: Option<u64>,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            shard_prefetch: 2,
            cache_dir: None,
            cache_limit: None,
        }
    }
}

/// The local files a shard list resolves to.
#[derive(Debug)]
pub struct ResolvedShards {
    /// One path per shard kept, in order.
    pub paths: Vec<PathBuf>,
    /// The name each is shown under (the path, or the URL without credentials).
    pub names: Vec<String>,
    /// Shards left out under `on_error=skip`, each with why.
    pub skipped: Vec<String>,
    /// Remote shards downloaded now, and their bytes (the others were found in the cache).
    pub downloaded: usize,
    /// Bytes of the shards downloaded now.
    pub downloaded_bytes: u64,
    /// Keeps the cached shards in place (and a private cache alive) while the source lives.
    pub holder: ShardHolder,
}

/// Holds remote shards in the cache while a source uses them.
#[derive(Default)]
pub struct ShardHolder {
    #[cfg(feature = "remote")]
    _held: Vec<cache::CachedShard>,
    #[cfg(feature = "remote")]
    _cache: Option<std::sync::Arc<cache::ShardCache>>,
}

impl std::fmt::Debug for ShardHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardHolder")
    }
}

#[cfg(feature = "remote")]
mod cache;
#[cfg(feature = "remote")]
pub mod feed;
#[cfg(feature = "remote")]
mod fetch;
#[cfg(feature = "remote")]
mod url;

#[cfg(feature = "remote")]
pub use feed::ShardFeed;
#[cfg(feature = "remote")]
pub use resolve::{exist, open_feed, resolve};

/// Without the `remote` feature there is no feed (no value of this type exists).
#[cfg(not(feature = "remote"))]
pub enum ShardFeed {}

#[cfg(not(feature = "remote"))]
impl ShardFeed {
    /// See the `remote` build's feed.
    pub fn upcoming(&self, _shards: impl IntoIterator<Item = usize>) {
        match *self {}
    }
    /// See the `remote` build's feed.
    pub fn reader(
        &self,
        _shard: usize,
        _stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> std::io::Empty {
        match *self {}
    }
    /// See the `remote` build's feed.
    pub fn shown(&self, _shard: usize) -> &str {
        match *self {}
    }
}

/// Without the `remote` feature: no feed (remote URLs are refused when resolved).
#[cfg(not(feature = "remote"))]
pub fn open_feed(
    _names: &[String],
    _config: &RemoteConfig,
) -> crate::error::Result<Option<ShardFeed>> {
    Ok(None)
}

/// A shard name as errors show it: without a query, fragment or user info (which may hold
/// credentials). For names that may not parse as URLs.
pub(crate) fn shown_without_credentials(name: &str) -> String {
    let mut out = name.split(['?', '#']).next().unwrap_or_default().to_owned();
    if let Some(scheme_end) = out.find("://") {
        let rest = &out[scheme_end + 3..];
        let authority_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            out = format!("{}{}", &out[..scheme_end + 3], &rest[at + 1..]);
        }
    }
    out
}

/// Without the `remote` feature: whether each local file exists (URLs are refused).
#[cfg(not(feature = "remote"))]
pub fn exist(names: &[String], config: &RemoteConfig) -> crate::error::Result<Vec<bool>> {
    let resolved = resolve(names.to_vec(), config, false)?;
    Ok(resolved.paths.iter().map(|p| p.exists()).collect())
}

/// Without the `remote` feature: local paths and `file://` only.
#[cfg(not(feature = "remote"))]
pub fn resolve(
    names: Vec<String>,
    _config: &RemoteConfig,
    _skip_failed: bool,
) -> crate::error::Result<ResolvedShards> {
    let mut paths = Vec::with_capacity(names.len());
    for name in &names {
        if let Some(local) = name.strip_prefix("file://") {
            paths.push(PathBuf::from(local));
        } else if is_url(name) {
            return Err(crate::error::Error::Unsupported(format!(
                "`{}`: this build of stoker has no remote file support (built without the `remote` feature)",
                shown_without_credentials(name)
            )));
        } else {
            paths.push(PathBuf::from(name));
        }
    }
    Ok(ResolvedShards {
        paths,
        names,
        skipped: Vec::new(),
        downloaded: 0,
        downloaded_bytes: 0,
        holder: ShardHolder::default(),
    })
}

#[cfg(feature = "remote")]
mod resolve {
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};

    use super::cache::{CachedShard, ShardCache};
    use super::fetch::{Fetcher, RetryPolicy};
    use super::url::ShardUrl;
    use super::{is_url, RemoteConfig, ResolvedShards, ShardFeed, ShardHolder};
    use crate::error::{Error, Result};

    /// Upper bound on concurrent downloads, whatever `shard_prefetch` says.
    const MAX_CONCURRENT: usize = 64;

    /// A feed over `names` when every one is a remote URL (`None` otherwise: local shards need
    /// no feed), downloading into the configured cache `shard_prefetch` ahead of the reader.
    pub fn open_feed(names: &[String], config: &RemoteConfig) -> Result<Option<ShardFeed>> {
        open_feed_with(names, config, RetryPolicy::default())
    }

    pub(crate) fn open_feed_with(
        names: &[String],
        config: &RemoteConfig,
        policy: RetryPolicy,
    ) -> Result<Option<ShardFeed>> {
        let remote = |n: &&String| !n.starts_with("file://") && is_url(n);
        if names.is_empty() || !names.iter().all(|n| remote(&n)) {
            return Ok(None);
        }
        let urls = names
            .iter()
            .map(|n| ShardUrl::parse(n))
            .collect::<Result<Vec<_>>>()?;
        let cache = Arc::new(match &config.cache_dir {
            Some(dir) => ShardCache::open(dir, config.cache_limit)?,
            None => ShardCache::private()?,
        });
        let fetcher = Fetcher::new(policy)?;
        ShardFeed::new(urls, fetcher, cache, config.shard_prefetch).map(Some)
    }

    /// Whether each of `names` (local paths, `file://` or remote URLs) exists: a file on disk,
    /// an object a HEAD finds (404: no). Other failures are errors naming the URL. For the
    /// optional companions of remote files, such as a flat token file's sidecar of lengths.
    pub fn exist(names: &[String], config: &RemoteConfig) -> Result<Vec<bool>> {
        let mut found: Vec<bool> = Vec::with_capacity(names.len());
        let mut remote = Vec::new();
        for (k, name) in names.iter().enumerate() {
            if let Some(local) = name.strip_prefix("file://") {
                found.push(PathBuf::from(local).exists());
            } else if is_url(name) {
                found.push(false);
                remote.push((k, ShardUrl::parse(name)?));
            } else {
                found.push(PathBuf::from(name).exists());
            }
        }
        if remote.is_empty() {
            return Ok(found);
        }
        let fetcher = Fetcher::new(RetryPolicy::default())?;
        let workers = config.shard_prefetch.clamp(1, MAX_CONCURRENT);
        for batch in remote.chunks(workers) {
            let answers: Vec<Result<bool>> = std::thread::scope(|scope| {
                let asked: Vec<_> = batch
                    .iter()
                    .map(|(_, url)| scope.spawn(|| fetcher.exists(url)))
                    .collect();
                asked
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::Internal("a HEAD request thread panicked".into()))
                        })
                    })
                    .collect()
            });
            for ((k, _), answer) in batch.iter().zip(answers) {
                found[*k] = answer?;
            }
        }
        Ok(found)
    }

    /// Turns shard names (local paths, `file://` or remote URLs) into local files, downloading
    /// remote shards into the cache (see the module docs). With `skip_failed`, a shard that
    /// cannot be fetched is left out and named in `skipped`; otherwise its error is returned.
    pub fn resolve(
        names: Vec<String>,
        config: &RemoteConfig,
        skip_failed: bool,
    ) -> Result<ResolvedShards> {
        resolve_with(names, config, skip_failed, RetryPolicy::default())
    }

    pub(crate) fn resolve_with(
        names: Vec<String>,
        config: &RemoteConfig,
        skip_failed: bool,
        policy: RetryPolicy,
    ) -> Result<ResolvedShards> {
        enum Item {
            Local(PathBuf),
            Remote(ShardUrl),
        }
        let mut items = Vec::with_capacity(names.len());
        for name in &names {
            if let Some(local) = name.strip_prefix("file://") {
                items.push(Item::Local(PathBuf::from(local)));
            } else if is_url(name) {
                items.push(Item::Remote(ShardUrl::parse(name)?));
            } else {
                items.push(Item::Local(PathBuf::from(name)));
            }
        }
        let remote: Vec<(usize, &ShardUrl)> = items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| match item {
                Item::Remote(u) => Some((i, u)),
                Item::Local(_) => None,
            })
            .collect();
        if remote.is_empty() {
            let paths = items
                .into_iter()
                .filter_map(|i| match i {
                    Item::Local(p) => Some(p),
                    Item::Remote(_) => None,
                })
                .collect();
            return Ok(ResolvedShards {
                paths,
                names,
                skipped: Vec::new(),
                downloaded: 0,
                downloaded_bytes: 0,
                holder: ShardHolder::default(),
            });
        }
        let cache = Arc::new(match &config.cache_dir {
            Some(dir) => ShardCache::open(dir, config.cache_limit)?,
            None => ShardCache::private()?,
        });
        let fetcher = Fetcher::new(policy)?;
        let fetched = fetch_all(&fetcher, &cache, &remote, config.shard_prefetch);
        let mut results: Vec<Option<Result<CachedShard>>> =
            (0..items.len()).map(|_| None).collect();
        for ((i, _), r) in remote.iter().zip(fetched) {
            results[*i] = Some(r);
        }
        let mut paths = Vec::with_capacity(items.len());
        let mut shown = Vec::with_capacity(items.len());
        let mut skipped = Vec::new();
        let mut held = Vec::with_capacity(remote.len());
        let (mut downloaded, mut downloaded_bytes) = (0, 0);
        for ((item, result), name) in items.into_iter().zip(results).zip(&names) {
            match (item, result) {
                (Item::Local(p), _) => {
                    paths.push(p);
                    shown.push(name.clone());
                }
                (Item::Remote(u), Some(Ok(shard))) => {
                    paths.push(shard.path.clone());
                    shown.push(u.shown.clone());
                    if shard.downloaded {
                        downloaded += 1;
                        downloaded_bytes += shard.meta.size;
                    }
                    held.push(shard);
                }
                (Item::Remote(_), Some(Err(e))) if skip_failed => skipped.push(e.to_string()),
                (Item::Remote(_), Some(Err(e))) => return Err(e),
                (Item::Remote(u), None) => {
                    return Err(Error::Internal(format!(
                        "shard {} was not fetched",
                        u.shown
                    )))
                }
            }
        }
        Ok(ResolvedShards {
            paths,
            names: shown,
            skipped,
            downloaded,
            downloaded_bytes,
            holder: ShardHolder {
                _held: held,
                _cache: Some(cache),
            },
        })
    }

    /// Fetches every remote shard, `prefetch` at a time, each on its own thread blocking on the
    /// fetcher's runtime. A shard already cached costs one HEAD (its size and ETag now); when
    /// the store cannot be reached the cached copy is used as it is.
    fn fetch_all(
        fetcher: &Fetcher,
        cache: &ShardCache,
        remote: &[(usize, &ShardUrl)],
        prefetch: usize,
    ) -> Vec<Result<CachedShard>> {
        let slots: Vec<Mutex<Option<Result<CachedShard>>>> =
            remote.iter().map(|_| Mutex::new(None)).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let workers = prefetch.clamp(1, MAX_CONCURRENT).min(remote.len());
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((_, url)) = remote.get(k) else { break };
                    let result = cache.get(
                        url,
                        || fetcher.head_once(url, &()).ok(),
                        |part| fetcher.download(url, part, &()),
                    );
                    if let Ok(mut slot) = slots[k].lock() {
                        *slot = Some(result);
                    }
                });
            }
        });
        slots
            .into_iter()
            .map(|slot| {
                slot.into_inner().ok().flatten().unwrap_or_else(|| {
                    Err(Error::Internal("a shard download thread panicked".into()))
                })
            })
            .collect()
    }
}

#[cfg(all(test, feature = "remote"))]
mod tests;

#[cfg(all(test, feature = "remote"))]
mod feed_tests;
