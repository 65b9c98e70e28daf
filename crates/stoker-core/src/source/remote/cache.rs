//! The local cache of remote shards (`cache_dir`, `cache_limit`).
//!
//! Layout, one directory, flat: for each shard `NAME` (see [`ShardUrl::cache_name`]) the data
//! file `NAME`, its description `NAME.meta` (size and ETag, one line each) and a lock file
//! `.NAME.lock`. Downloads go to `.NAME.PID.N.part`, are synced, and are renamed into place
//! after `NAME.meta`: a `NAME` file is always complete, and it is used only when its size is
//! the one its `.meta` records.
//!
//! Sharing between processes (ranks on one node) uses advisory `flock` locks:
//!
//! - `.NAME.lock`, exclusive, while a shard is checked, downloaded or evicted, so one process
//!   downloads it and the others wait, then find it in place;
//! - `NAME`, shared, for as long as a reader uses the shard; eviction takes it exclusive without
//!   waiting and skips the shard when that fails, so a shard in use is never removed.
//!
//! Eviction is least recently used by modification time (each use touches the file), down to
//! `cache_limit`, after each download.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use fs4::fs_std::FileExt;

use super::fetch::ObjectMeta;
use super::url::ShardUrl;
use crate::error::{io_reason, Error, Result};

/// A cache directory.
pub(crate) struct ShardCache {
    dir: PathBuf,
    /// Bytes of shard data kept (shards in use may exceed it); `None`: unlimited.
    limit: Option<u64>,
    /// A private directory made for one source, removed when the cache is dropped.
    private: bool,
}

/// A shard present in the cache, held (shared lock) while this lives.
#[derive(Debug)]
pub(crate) struct CachedShard {
    pub(crate) path: PathBuf,
    pub(crate) meta: ObjectMeta,
    /// Whether it was downloaded now rather than found.
    pub(crate) downloaded: bool,
    _held: File,
}

static PART_COUNTER: AtomicU64 = AtomicU64::new(0);

impl ShardCache {
    /// The cache at `dir` (created when missing), keeping at most `limit` bytes of shards not in
    /// use. Partial downloads left by processes that died are removed.
    pub(crate) fn open(dir: &Path, limit: Option<u64>) -> Result<ShardCache> {
        if dir.exists() && !dir.is_dir() {
            return Err(Error::io(dir, "cache_dir is a file, not a directory"));
        }
        fs::create_dir_all(dir).map_err(|e| io_error(dir, "create the cache directory", e))?;
        let cache = ShardCache {
            dir: dir.to_owned(),
            limit,
            private: false,
        };
        cache.remove_orphaned_parts();
        Ok(cache)
    }

    /// A private cache in the temporary directory, removed when dropped.
    pub(crate) fn private() -> Result<ShardCache> {
        let dir = std::env::temp_dir().join(format!(
            "stoker-shards-{}-{}",
            std::process::id(),
            PART_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).map_err(|e| io_error(&dir, "create a private shard cache", e))?;
        Ok(ShardCache {
            dir,
            limit: None,
            private: true,
        })
    }

    #[cfg(test)]
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shard `url`, from the cache when it is there and matches `current()` (the store's
    /// size and ETag now, asked only when a cached copy exists; `None`: unknown, the copy is
    /// used), else downloaded by `download(temporary path)`.
    pub(crate) fn get(
        &self,
        url: &ShardUrl,
        current: impl FnOnce() -> Option<ObjectMeta>,
        download: impl FnOnce(&Path) -> Result<ObjectMeta>,
    ) -> Result<CachedShard> {
        let name = url.cache_name();
        let data = self.dir.join(&name);
        let meta_path = self.dir.join(format!("{name}.meta"));
        let lock = self.lock_file(&name)?;
        lock.lock_exclusive().map_err(|e| {
            io_error(
                &self.dir,
                &format!("lock the cache entry of {}", url.shown),
                e,
            )
        })?;
        let found = read_meta(&meta_path)
            .filter(|meta| fs::metadata(&data).is_ok_and(|m| m.len() == meta.size))
            .filter(|meta| {
                current().is_none_or(|now| {
                    now.size == meta.size && (now.etag.is_none() || now.etag == meta.etag)
                })
            });
        let (meta, downloaded) = match found {
            Some(meta) => (meta, false),
            None => {
                let _ = fs::remove_file(&data);
                let part = self.dir.join(format!(
                    ".{name}.{}.{}.part",
                    std::process::id(),
                    PART_COUNTER.fetch_add(1, Ordering::Relaxed)
                ));
                let meta = match download(&part) {
                    Ok(meta) => meta,
                    Err(e) => {
                        let _ = fs::remove_file(&part);
                        return Err(e);
                    }
                };
                let installed = write_meta(&meta_path, &meta)
                    .and_then(|()| fs::rename(&part, &data))
                    .and_then(|()| File::open(&self.dir)?.sync_all());
                if let Err(e) = installed {
                    let _ = fs::remove_file(&part);
                    return Err(io_error(&data, "install the downloaded shard", e));
                }
                (meta, true)
            }
        };
        let held = File::open(&data).map_err(|e| io_error(&data, "open the cached shard", e))?;
        FileExt::lock_shared(&held).map_err(|e| io_error(&data, "lock the cached shard", e))?;
        // Least recently used is by modification time; failing to touch only ages the entry.
        if let Ok(file) = OpenOptions::new().write(true).open(&data) {
            let _ = file.set_modified(SystemTime::now());
        }
        drop(lock);
        if downloaded {
            self.evict(&name);
        }
        Ok(CachedShard {
            path: data,
            meta,
            downloaded,
            _held: held,
        })
    }

    fn lock_file(&self, name: &str) -> Result<File> {
        let path = self.dir.join(format!(".{name}.lock"));
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_error(&path, "open the cache lock", e))
    }

    /// Removes least recently used shards not in use until the cache holds at most the limit
    /// (`keep`, just downloaded, stays).
    fn evict(&self, keep: &str) {
        let Some(limit) = self.limit else { return };
        let mut entries = self.entries();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        if total <= limit {
            return;
        }
        entries.sort_by_key(|e| e.2);
        for (name, size, _) in entries {
            if total <= limit {
                break;
            }
            if name == keep {
                continue;
            }
            if self.remove_if_unused(&name) {
                total = total.saturating_sub(size);
            }
        }
    }

    /// Shard files: (name, size, last use).
    fn entries(&self) -> Vec<(String, u64, SystemTime)> {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                if name.starts_with('.') || name.ends_with(".meta") {
                    return None;
                }
                let meta = e.metadata().ok()?;
                meta.is_file().then(|| {
                    (
                        name,
                        meta.len(),
                        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    )
                })
            })
            .collect()
    }

    fn remove_if_unused(&self, name: &str) -> bool {
        let Ok(lock) = self.lock_file(name) else {
            return false;
        };
        if !lock.try_lock_exclusive().unwrap_or(false) {
            return false;
        }
        let data = self.dir.join(name);
        let Ok(file) = File::open(&data) else {
            return false;
        };
        if !file.try_lock_exclusive().unwrap_or(false) {
            return false;
        }
        let _ = fs::remove_file(self.dir.join(format!("{name}.meta")));
        fs::remove_file(&data).is_ok()
    }

    /// `.NAME.PID.N.part` files whose process is gone.
    fn remove_orphaned_parts(&self) {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in dir.filter_map(|e| e.ok()) {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let Some(stem) = name.strip_suffix(".part") else {
                continue;
            };
            let pid = stem
                .rsplit('.')
                .nth(1)
                .and_then(|p| p.parse::<libc::pid_t>().ok());
            if pid.is_some_and(|pid| !process_alive(pid)) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

impl Drop for ShardCache {
    fn drop(&mut self) {
        if self.private {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn process_alive(pid: libc::pid_t) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn read_meta(path: &Path) -> Option<ObjectMeta> {
    let text = fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let size = lines.next()?.strip_prefix("size ")?.parse().ok()?;
    let etag = lines
        .next()
        .and_then(|l| l.strip_prefix("etag "))
        .map(str::to_owned);
    Some(ObjectMeta { size, etag })
}

fn write_meta(path: &Path, meta: &ObjectMeta) -> std::io::Result<()> {
    let mut text = format!("size {}\n", meta.size);
    if let Some(etag) = &meta.etag {
        text.push_str(&format!("etag {}\n", etag.replace('\n', " ")));
    }
    let part = path.with_extension(format!("meta.{}.part", std::process::id()));
    fs::write(&part, text)?;
    File::open(&part)?.sync_all()?;
    fs::rename(&part, path)
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::Io {
        path: path.to_owned(),
        reason: format!("{what}: {}", io_reason(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    fn url(name: &str) -> ShardUrl {
        ShardUrl::parse(&format!("https://127.0.0.1/d/{name}")).unwrap()
    }

    fn write(bytes: &[u8]) -> impl FnOnce(&Path) -> Result<ObjectMeta> + '_ {
        move |p| {
            fs::write(p, bytes).unwrap();
            Ok(ObjectMeta {
                size: bytes.len() as u64,
                etag: Some("\"e1\"".into()),
            })
        }
    }

    fn tempdir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "stoker-cache-test-{tag}-{}-{}",
            std::process::id(),
            PART_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_cache_dir_that_is_a_file_is_said_so() {
        let dir = tempdir("file");
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cache");
        fs::write(&file, b"x").unwrap();
        let err = ShardCache::open(&file, None)
            .err()
            .expect("a file is no cache directory");
        let msg = err.to_string();
        assert!(
            msg.contains(&file.display().to_string()) && msg.contains("is a file, not a directory"),
            "{msg}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn download_once_then_hit() {
        let dir = tempdir("hit");
        let cache = ShardCache::open(&dir, None).unwrap();
        let a = cache.get(&url("a.tar"), || None, write(b"hello")).unwrap();
        assert!(a.downloaded);
        assert_eq!(fs::read(&a.path).unwrap(), b"hello");
        let again = cache
            .get(
                &url("a.tar"),
                || None,
                |_| panic!("must not download again"),
            )
            .unwrap();
        assert!(!again.downloaded);
        // A changed ETag at the store makes the entry stale.
        let now = ObjectMeta {
            size: 5,
            etag: Some("\"e2\"".into()),
        };
        let fresh = cache
            .get(&url("a.tar"), || Some(now), write(b"world"))
            .unwrap();
        assert!(fresh.downloaded);
        assert_eq!(fs::read(&fresh.path).unwrap(), b"world");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn failed_download_leaves_nothing() {
        let dir = tempdir("fail");
        let cache = ShardCache::open(&dir, None).unwrap();
        let err = cache
            .get(
                &url("b.tar"),
                || None,
                |p| {
                    fs::write(p, b"partial").unwrap();
                    Err(Error::Io {
                        path: "x".into(),
                        reason: "cut short".into(),
                    })
                },
            )
            .unwrap_err();
        assert!(err.to_string().contains("cut short"));
        let left: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.ends_with(".lock"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // A truncated data file (size differs from .meta) is downloaded again.
        let ok = cache.get(&url("b.tar"), || None, write(b"12345")).unwrap();
        drop(ok);
        fs::write(dir.join(url("b.tar").cache_name()), b"12").unwrap();
        let again = cache.get(&url("b.tar"), || None, write(b"12345")).unwrap();
        assert!(again.downloaded);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lru_eviction_spares_shards_in_use() {
        let dir = tempdir("lru");
        let cache = ShardCache::open(&dir, Some(10)).unwrap();
        let held = cache.get(&url("1.tar"), || None, write(b"11111")).unwrap();
        drop(cache.get(&url("2.tar"), || None, write(b"22222")).unwrap());
        // 10 bytes: within the limit. Adding 3 makes 15: 1 is older but in use, so 2 goes.
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(cache.get(&url("3.tar"), || None, write(b"33333")).unwrap());
        let present = |n: &str| dir.join(url(n).cache_name()).exists();
        assert!(present("1.tar"), "in use");
        assert!(!present("2.tar"), "least recently used, not in use");
        assert!(present("3.tar"), "just downloaded");
        drop(held);
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(cache.get(&url("4.tar"), || None, write(b"44444")).unwrap());
        assert!(!present("1.tar"), "no longer in use: evicted");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_users_download_once() {
        let dir = tempdir("locks");
        let downloads = Arc::new(AtomicU64::new(0));
        let barrier = Arc::new(Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let dir = dir.clone();
                let downloads = downloads.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    // Each thread opens its own cache (its own lock file descriptors), as
                    // another process would.
                    let cache = ShardCache::open(&dir, None).unwrap();
                    barrier.wait();
                    let shard = cache
                        .get(
                            &url("s.tar"),
                            || None,
                            |p| {
                                downloads.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(std::time::Duration::from_millis(100));
                                fs::write(p, b"shard").unwrap();
                                Ok(ObjectMeta {
                                    size: 5,
                                    etag: None,
                                })
                            },
                        )
                        .unwrap();
                    fs::read(&shard.path).unwrap()
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), b"shard");
        }
        assert_eq!(downloads.load(Ordering::SeqCst), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn orphaned_parts_are_removed_and_private_caches_vanish() {
        let dir = tempdir("orphan");
        fs::create_dir_all(&dir).unwrap();
        // No process has pid 2^22 + 1 (above Linux's pid_max default of 2^22).
        let orphan = dir.join(".x.tar.4194305.0.part");
        let live = dir.join(format!(".y.tar.{}.0.part", std::process::id()));
        fs::write(&orphan, b"p").unwrap();
        fs::write(&live, b"p").unwrap();
        let _cache = ShardCache::open(&dir, None).unwrap();
        assert!(!orphan.exists());
        assert!(live.exists());
        fs::remove_dir_all(&dir).unwrap();

        let private = ShardCache::private().unwrap();
        let path = private.dir().to_owned();
        drop(private.get(&url("p.tar"), || None, write(b"x")).unwrap());
        assert!(path.exists());
        drop(private);
        assert!(!path.exists());
    }
}
