//! Read-only file mappings that survive the file being truncated under the reader.
//!
//! DESIGN: npy arrays and tar shards are read straight from a read-only mapping: no copy until
//! collate, no system call per sample. If another process truncates the file meanwhile, touching
//! a page past the new end raises SIGBUS, which by default kills the process (NumPy's
//! `mmap_mode`, Arrow and LMDB readers all die this way). Reading with `pread` instead would
//! cost a second copy and a system call per sample. So the mapping stays, and a SIGBUS handler,
//! installed once and chained to whatever handler was there before, looks the faulting address
//! up in a table of our mappings. When it is ours, the handler maps a page of zeros over the
//! faulting page and flags the mapping: the interrupted copy finishes with zeros, and
//! [`Mapping::check`], which readers call after copying a batch, turns the flag into an I/O error
//! naming the file, so the zeros are never delivered. Any other SIGBUS goes to the previous
//! handler, as if this one were not there.
//!
//! The table holds [`SLOTS`] mappings at a time; a mapping made while it is full still works but
//! is not guarded (a truncation then kills the process, as without this module).

use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use memmap2::Mmap;

use crate::error::{Error, Result};

/// Mappings guarded at one time (shards of a tar dataset are each one mapping).
pub const SLOTS: usize = 1 << 16;

/// A read-only mapping of a whole file, guarded against truncation (see the module docs).
pub struct Mapping {
    map: Mmap,
    path: PathBuf,
    slot: Option<usize>,
}

impl Mapping {
    /// Maps `file` (opened from `path`, which errors name) read-only.
    pub fn map(file: &File, path: &Path) -> Result<Mapping> {
        // SAFETY: a read-only private mapping of a file we only read. Another process may still
        // truncate the file: the SIGBUS that raises on a page past the new end is caught for
        // this mapping (it is registered below before anyone reads it) and reported by `check`.
        let map = unsafe { Mmap::map(file) }.map_err(|e| Error::os(path, e))?;
        let slot = if map.is_empty() {
            None
        } else {
            guard::register(map.as_ptr() as usize, map.len())
        };
        Ok(Mapping {
            map,
            path: path.to_owned(),
            slot,
        })
    }

    /// `Err(Io)` naming the file once a read of this mapping has hit a page past the file's
    /// end (the file was truncated while mapped); every later check fails too. Bytes copied out
    /// of the mapping before a successful check are the file's.
    pub fn check(&self) -> Result<()> {
        match self.slot {
            Some(slot) if guard::truncated(slot) => {
                let now = std::fs::metadata(&self.path)
                    .map(|m| format!("it now has {} bytes", m.len()))
                    .unwrap_or_else(|e| format!("it can no longer be read: {e}"));
                Err(Error::io(
                    &self.path,
                    format!(
                        "the file was truncated while in use (it had {} bytes when opened; {now}); \
                         open it again",
                        self.map.len()
                    ),
                ))
            }
            _ => Ok(()),
        }
    }
}

/// Whether any guarded mapping of this process has hit a truncated file: the cheap test that
/// lets a source of many mappings skip checking each one.
pub fn any_truncated() -> bool {
    TRUNCATIONS.load(Ordering::Acquire) > 0
}

/// Truncations caught so far (process-wide).
static TRUNCATIONS: AtomicUsize = AtomicUsize::new(0);

impl Mapping {
    /// Passes an access-pattern hint for the whole mapping to the kernel (`madvise`).
    pub fn advise(&self, advice: memmap2::Advice) -> std::io::Result<()> {
        self.map.advise(advice)
    }
}

impl Deref for Mapping {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            guard::unregister(slot);
        }
    }
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("path", &self.path)
            .field("len", &self.map.len())
            .finish()
    }
}

#[cfg(not(miri))]
mod guard {
    //! The table of guarded mappings and the SIGBUS handler. Everything the handler touches is
    //! an atomic or written once before the handler is installed, and its only call is `mmap`
    //! (a system call), so it is safe to run in a signal handler.

    use std::ffi::c_void;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Once, OnceLock};

    use super::{Slot, SLOTS};

    static TABLE: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
    /// Where the next registration starts looking for a free slot.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    static PAGE: AtomicUsize = AtomicUsize::new(4096);
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
    static INSTALL: Once = Once::new();
    static INSTALLED: AtomicBool = AtomicBool::new(false);

    pub(super) fn register(start: usize, len: usize) -> Option<usize> {
        INSTALL.call_once(install);
        if !INSTALLED.load(Ordering::Acquire) {
            return None;
        }
        let first = NEXT.fetch_add(1, Ordering::Relaxed);
        (0..SLOTS).map(|i| (first + i) % SLOTS).find(|&i| {
            let slot = &TABLE[i];
            if slot
                .start
                .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                return false;
            }
            slot.truncated.store(false, Ordering::Relaxed);
            slot.end.store(start + len, Ordering::Release);
            true
        })
    }

    pub(super) fn unregister(slot: usize) {
        let slot = &TABLE[slot];
        slot.end.store(0, Ordering::Release);
        slot.start.store(0, Ordering::Release);
    }

    pub(super) fn truncated(slot: usize) -> bool {
        TABLE[slot].truncated.load(Ordering::Acquire)
    }

    fn install() {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: an all-zero sigaction is a valid value to be overwritten; `sigaction` with a
        // null new action only reads the current one into `previous`.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) } != 0 {
            return;
        }
        if PREVIOUS.set(previous).is_err() {
            return;
        }
        // SAFETY: as above, a zeroed sigaction filled in field by field; `sa_mask` is emptied
        // with sigemptyset. The handler is an `extern "C"` function of the right signature for
        // SA_SIGINFO, and SA_ONSTACK lets it run on the thread's alternate stack when there is
        // one (as there is for Rust threads).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) == 0 {
                INSTALLED.store(true, Ordering::Release);
            }
        }
    }

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo; for SIGBUS `si_addr` is
        // the faulting address.
        let addr = unsafe { (*info).si_addr() } as usize;
        let hit = TABLE.iter().find(|slot| {
            let start = slot.start.load(Ordering::Acquire);
            start != 0 && addr >= start && addr < slot.end.load(Ordering::Acquire)
        });
        if let Some(slot) = hit {
            let page = PAGE.load(Ordering::Relaxed);
            // SAFETY: replaces one page of our own read-only file mapping (the page holding
            // `addr`, inside the registered range) with a private page of zeros. MAP_FIXED on a
            // range this process maps is what it is for; no Rust reference promises the bytes
            // of that page (readers check the flag before trusting what they copied).
            let zeros = unsafe {
                libc::mmap(
                    (addr & !(page - 1)) as *mut c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if zeros != libc::MAP_FAILED {
                slot.truncated.store(true, Ordering::Release);
                super::TRUNCATIONS.fetch_add(1, Ordering::Release);
                return; // the faulting read runs again, on zeros
            }
        }
        chain(sig, info, ctx);
    }

    /// Hands a SIGBUS that is not ours to the handler installed before this one.
    fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        let previous = PREVIOUS.get();
        match previous.map(|p| p.sa_sigaction) {
            Some(h) if h != libc::SIG_DFL && h != libc::SIG_IGN => {
                let flags = previous.map_or(0, |p| p.sa_flags);
                // SAFETY: `h` is the handler that was installed for SIGBUS, called as the kernel
                // would have called it: with siginfo and context when it asked for them.
                unsafe {
                    if flags & libc::SA_SIGINFO != 0 {
                        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                            std::mem::transmute(h);
                        f(sig, info, ctx);
                    } else {
                        let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
                        f(sig);
                    }
                }
            }
            _ => {
                // The default action: restore it and return, so that the fault repeats and
                // ends the process as it would have without this handler.
                // SAFETY: a zeroed sigaction with SIG_DFL (0) as its handler is valid.
                unsafe {
                    let mut action: libc::sigaction = std::mem::zeroed();
                    action.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(sig, &action, std::ptr::null_mut());
                }
            }
        }
    }
}

/// Miri cannot run signal handlers: mappings are not guarded there.
#[cfg(miri)]
mod guard {
    pub(super) fn register(_start: usize, _len: usize) -> Option<usize> {
        None
    }
    pub(super) fn unregister(_slot: usize) {}
    pub(super) fn truncated(_slot: usize) -> bool {
        false
    }
}

/// One guarded mapping: `[start, end)`, and whether a read hit a page past the file's end.
/// `start == 0`: free.
#[cfg_attr(miri, allow(dead_code))]
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    truncated: AtomicBool,
}

impl Slot {
    #[cfg_attr(miri, allow(dead_code))]
    const fn new() -> Slot {
        Slot {
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            truncated: AtomicBool::new(false),
        }
    }
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_the_file_and_checks_clean() {
        let dir = std::env::temp_dir().join(format!("stoker-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.bin");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&[7u8; 10_000])
            .unwrap();
        let m = Mapping::map(&File::open(&path).unwrap(), &path).unwrap();
        assert_eq!(m.len(), 10_000);
        assert!(m.iter().all(|&b| b == 7));
        m.check().unwrap();
        drop(m);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_read_past_a_truncation_reads_zeros_and_check_names_the_file() {
        let dir = std::env::temp_dir().join(format!("stoker-mapped-t-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("b.bin");
        std::fs::write(&path, vec![9u8; 64 * 1024]).unwrap();
        let m = Mapping::map(&File::open(&path).unwrap(), &path).unwrap();
        assert_eq!(m[60_000], 9);
        m.check().unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096)
            .unwrap();
        // Without the guard this read kills the process with SIGBUS.
        let past: u32 = m[32_768..32_868].iter().map(|&b| u32::from(b)).sum();
        assert_eq!(past, 0);
        let err = m.check().unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Io);
        let msg = err.to_string();
        assert!(msg.contains("b.bin") && msg.contains("truncated"), "{msg}");
        assert!(msg.contains("65536") && msg.contains("4096"), "{msg}");
        // Another mapping of another file is unaffected.
        let other = dir.join("c.bin");
        std::fs::write(&other, vec![1u8; 8192]).unwrap();
        let n = Mapping::map(&File::open(&other).unwrap(), &other).unwrap();
        assert_eq!(n[8000], 1);
        n.check().unwrap();
        drop((m, n));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
