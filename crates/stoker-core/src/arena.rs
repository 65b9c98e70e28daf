//! The arena: page-aligned batch memory, recycled.
//!
//! Batches are written into slabs from here and handed to the user as leases; a released lease
//! returns its slab to the free list, so after the first few batches no batch maps new memory.
//!
//! Idle slabs are kept only as far as recent demand needs them: the arena remembers the most
//! slabs leased at once over the last [`DEMAND_WINDOW`] acquisitions and the window before, and
//! unmaps a released slab that would leave more slabs mapped than that (see `Demand`). A burst
//! (a consumer that held many batches, a deeper prefetch that is over) is given back to the
//! system within two windows; a steady pattern keeps exactly the slabs it cycles through, so the
//! steady state maps nothing.
//! With `pin_memory`, slabs are page-locked (`mlock`) when mapped; if `RLIMIT_MEMLOCK` forbids it
//! the slab stays pageable and the fallback is counted ([`ArenaCounters::pin_failures`]). A
//! [`SlabRegistrar`] (the CUDA layer) may register each slab with a driver when it is mapped and
//! unregister it before it is unmapped.
//!
//! In a child forked after the arena was made, the free list is never touched: a parent thread
//! may have held its lock at the moment of the fork, and would never release it there. A slab
//! released in the child is unmapped at once, idle slabs are left as they are, and `acquire`
//! fails (see [`crate::fork`]).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::fork::Origin;

/// Registers host memory with a device driver (`cuMemHostRegister`), so that copies from it are
/// DMA transfers. Implemented by the CUDA layer; the arena calls it once per slab.
pub trait SlabRegistrar: Send + Sync {
    /// Called after a slab is mapped. An error fails the batch being built.
    fn register(&self, ptr: *mut u8, len: usize) -> Result<()>;
    /// Called before a registered slab is unmapped.
    fn unregister(&self, ptr: *mut u8, len: usize);
}

/// What the arena has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaCounters {
    /// Slabs mapped (each one a system allocation).
    pub slabs_mapped: u64,
    /// Slabs returned to the system: beyond recent demand, the free list's bound or the budget.
    pub slabs_unmapped: u64,
    /// Slabs page-locked successfully.
    pub slabs_pinned: u64,
    /// Slabs that should have been page-locked but `mlock` refused (RLIMIT_MEMLOCK).
    pub pin_failures: u64,
    /// Bytes currently mapped.
    pub bytes_mapped: u64,
    /// Slabs currently leased (held by a batch being built, delivered, or being copied).
    pub slabs_leased: u64,
    /// Slabs currently idle in the free list, mapped and waiting for reuse.
    pub slabs_idle: u64,
    /// The most bytes mapped at once so far.
    pub bytes_mapped_peak: u64,
}

/// Acquisitions per demand window: the arena keeps the slabs that the busiest moment of the last
/// one to two windows needed. Long enough to span a steady pattern's period many times over
/// (workers finishing in pairs, a consumer holding a few batches, an epoch's end), short enough
/// that memory a burst needed returns after a few dozen batches.
pub const DEMAND_WINDOW: u64 = 64;

/// Slabs wanted recently: the most leased at once in the current window of acquisitions and in
/// the previous one. Counted rather than timed, so that an idle loader and a slow one behave the
/// same and the rule is deterministic: a loader that stops asking keeps what it last needed
/// (at most that many slabs, freed when the arena drops), and steady use never trims a slab it
/// is about to need again.
#[derive(Debug, Default)]
struct Demand {
    /// Slabs leased now.
    leased: u64,
    /// Acquisitions in the current window.
    acquired: u64,
    /// Most leased at once in the current window, and in the previous one.
    peak: u64,
    peak_before: u64,
}

impl Demand {
    /// One more slab leased. Returns whether a new window began.
    fn acquire(&mut self) -> bool {
        self.leased += 1;
        self.peak = self.peak.max(self.leased);
        self.acquired += 1;
        if self.acquired < DEMAND_WINDOW {
            return false;
        }
        self.peak_before = self.peak;
        self.peak = self.leased;
        self.acquired = 0;
        true
    }

    fn release(&mut self) {
        self.leased = self.leased.saturating_sub(1);
    }

    /// Idle slabs worth keeping: what recent demand needed beyond the slabs leased now.
    fn idle_wanted(&self) -> usize {
        let wanted = self.peak.max(self.peak_before).saturating_sub(self.leased);
        usize::try_from(wanted).unwrap_or(usize::MAX)
    }
}

/// The free list and the demand it is kept for, under one lock.
#[derive(Default)]
struct Idle {
    slabs: Vec<Slab>,
    demand: Demand,
}

/// A cheap handle to shared slab storage; clones share it.
#[derive(Clone)]
pub struct Arena {
    inner: Arc<ArenaInner>,
}

struct ArenaInner {
    pin: bool,
    registrar: Option<Arc<dyn SlabRegistrar>>,
    /// Most free slabs kept for reuse, whatever the demand; more are unmapped when released.
    max_free: usize,
    /// Most bytes mapped while keeping a released slab idle (`memory_budget`); above it a
    /// released slab is unmapped.
    budget: AtomicU64,
    /// Guarded by [`ArenaInner::idle`], which refuses it in a forked child.
    free: Mutex<Idle>,
    /// The process the arena was made in.
    origin: Origin,
    slabs_mapped: AtomicU64,
    slabs_unmapped: AtomicU64,
    slabs_pinned: AtomicU64,
    pin_failures: AtomicU64,
    bytes_mapped: AtomicU64,
    bytes_mapped_peak: AtomicU64,
    slabs_leased: AtomicU64,
}

/// One anonymous mapping.
struct Slab {
    ptr: NonNull<u8>,
    len: usize,
    locked: bool,
    registered: bool,
}

// SAFETY: a slab is plain memory owned by exactly one `Slab` value (in the free list or in one
// lease); nothing in it is tied to a thread.
unsafe impl Send for Slab {}
// SAFETY: `&Slab` gives out only the pointer and length; writing through the pointer needs
// `&mut SlabLease` (or a caller who holds the batch exclusively, as in zero-copy exports), so
// shared references across threads cannot race through this type.
unsafe impl Sync for Slab {}

/// Exclusive use of one slab until dropped, when the slab returns to the arena.
pub struct SlabLease {
    slab: Option<Slab>,
    /// Bytes requested; the slab may be larger.
    len: usize,
    arena: Arc<ArenaInner>,
}

/// The system's page size in bytes (4096 if `sysconf` cannot say): the granularity of slabs.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

impl Arena {
    /// `max_free` bounds the memory kept idle whatever the recent demand: the pool sets it to
    /// its in-flight cap plus the batches a consumer typically holds.
    pub fn new(pin: bool, max_free: usize, registrar: Option<Arc<dyn SlabRegistrar>>) -> Arena {
        Arena {
            inner: Arc::new(ArenaInner {
                pin,
                registrar,
                max_free: max_free.max(1),
                budget: AtomicU64::new(u64::MAX),
                free: Mutex::new(Idle::default()),
                origin: Origin::here(),
                slabs_mapped: AtomicU64::new(0),
                slabs_unmapped: AtomicU64::new(0),
                slabs_pinned: AtomicU64::new(0),
                pin_failures: AtomicU64::new(0),
                bytes_mapped: AtomicU64::new(0),
                bytes_mapped_peak: AtomicU64::new(0),
                slabs_leased: AtomicU64::new(0),
            }),
        }
    }

    /// Keeps idle slabs only while the memory mapped is at most `bytes`.
    pub fn set_budget(&self, bytes: u64) {
        self.inner.budget.store(bytes, Ordering::Relaxed);
    }

    /// Whether slabs are page-locked when mapped (`pin_memory`).
    pub fn pins(&self) -> bool {
        self.inner.pin
    }

    /// Whether slabs are registered with a device driver.
    pub fn registers(&self) -> bool {
        self.inner.registrar.is_some()
    }

    /// A slab of at least `len` bytes (contents unspecified). Reuses the smallest free slab that
    /// fits without wasting more than half of it; otherwise maps a new one. Fails with
    /// `Unsupported` in a child forked after the arena was made.
    pub fn acquire(&self, len: usize) -> Result<SlabLease> {
        let inner = &self.inner;
        let rounded = len.max(1).div_ceil(page_size()) * page_size();
        let (reused, surplus) = {
            let Some(mut idle) = inner.idle() else {
                return Err(inner.origin.error());
            };
            let best = idle
                .slabs
                .iter()
                .enumerate()
                .filter(|(_, s)| s.len >= rounded && s.len / 2 <= rounded)
                .min_by_key(|(_, s)| s.len)
                .map(|(i, _)| i);
            let reused = best.map(|i| idle.slabs.swap_remove(i));
            // Counted as leased before a new slab is mapped, so that a failed mapping is undone
            // below and concurrent releases see this one as wanted.
            let surplus = if idle.demand.acquire() {
                // A new window: what the old one needed beyond the current peak goes now.
                let keep = idle.demand.idle_wanted();
                take_surplus(&mut idle.slabs, keep)
            } else {
                Vec::new()
            };
            (reused, surplus)
        };
        for slab in surplus {
            inner.unmap(slab);
        }
        let slab = match reused {
            Some(slab) => slab,
            None => match inner.map(len) {
                Ok(slab) => slab,
                Err(e) => {
                    if let Some(mut idle) = inner.idle() {
                        idle.demand.release();
                    }
                    return Err(e);
                }
            },
        };
        inner.slabs_leased.fetch_add(1, Ordering::Relaxed);
        Ok(SlabLease {
            slab: Some(slab),
            len,
            arena: Arc::clone(inner),
        })
    }

    /// Unmaps every idle slab now (the free list empties; leased slabs are untouched). Does
    /// nothing in a child forked after the arena was made.
    pub fn trim(&self) {
        let Some(mut idle) = self.inner.idle() else {
            return;
        };
        let slabs = std::mem::take(&mut idle.slabs);
        drop(idle);
        for slab in slabs {
            self.inner.unmap(slab);
        }
    }

    /// What the arena has done so far, as of now. In a child forked after the arena was made,
    /// `slabs_idle` is 0: the free list is the parent's (see the module's documentation).
    pub fn counters(&self) -> ArenaCounters {
        let i = &self.inner;
        ArenaCounters {
            slabs_mapped: i.slabs_mapped.load(Ordering::Relaxed),
            slabs_unmapped: i.slabs_unmapped.load(Ordering::Relaxed),
            slabs_pinned: i.slabs_pinned.load(Ordering::Relaxed),
            pin_failures: i.pin_failures.load(Ordering::Relaxed),
            bytes_mapped: i.bytes_mapped.load(Ordering::Relaxed),
            slabs_leased: i.slabs_leased.load(Ordering::Relaxed),
            slabs_idle: i.idle().map_or(0, |idle| idle.slabs.len() as u64),
            bytes_mapped_peak: i.bytes_mapped_peak.load(Ordering::Relaxed),
        }
    }
}

impl ArenaInner {
    /// The free list, locked; `None` in a child forked after the arena was made, where a parent
    /// thread may have held the lock at the moment of the fork (it would never be released).
    fn idle(&self) -> Option<MutexGuard<'_, Idle>> {
        if self.origin.is_forked() {
            return None;
        }
        // A panic while holding this lock cannot leave the list inconsistent: recover the guard.
        Some(self.free.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn map(&self, len: usize) -> Result<Slab> {
        let page = page_size();
        let len = len.max(1).div_ceil(page) * page;
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        // MAP_POPULATE pre-faults the pages so the first batch written here does not pay for
        // page faults inside the workers' copy loops. (Miri, which runs the arena's tests, does
        // not model MAP_POPULATE; it changes only when pages are faulted, not what they hold.)
        let populate = if cfg!(miri) { 0 } else { libc::MAP_POPULATE };
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | populate,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::OutOfMemory(format!(
                "mapping a {len}-byte batch slab: {}",
                std::io::Error::last_os_error()
            )));
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| Error::Internal("mmap returned NULL".into()))?;
        let mut slab = Slab {
            ptr,
            len,
            locked: false,
            registered: false,
        };
        self.slabs_mapped.fetch_add(1, Ordering::Relaxed);
        let mapped = self.bytes_mapped.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
        self.bytes_mapped_peak.fetch_max(mapped, Ordering::Relaxed);
        if self.pin {
            // SAFETY: the range is exactly the mapping just created.
            if unsafe { libc::mlock(ptr.as_ptr().cast(), len) } == 0 {
                slab.locked = true;
                self.slabs_pinned.fetch_add(1, Ordering::Relaxed);
            } else {
                self.pin_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(registrar) = &self.registrar {
            if let Err(e) = registrar.register(slab.ptr.as_ptr(), len) {
                self.unmap(slab); // not registered, so no unregister call
                return Err(e);
            }
            slab.registered = true;
        }
        Ok(slab)
    }

    fn unmap(&self, slab: Slab) {
        // In a forked child the driver the slab was registered with cannot be called (CUDA does
        // not survive fork); the registration goes with the child's address space.
        if slab.registered && !self.origin.is_forked() {
            if let Some(registrar) = &self.registrar {
                registrar.unregister(slab.ptr.as_ptr(), slab.len);
            }
        }
        self.bytes_mapped
            .fetch_sub(slab.len as u64, Ordering::Relaxed);
        self.slabs_unmapped.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `slab` owns this mapping and nothing else refers to it: a slab in the free list
        // or in a dropped lease has no outstanding borrows. munmap also releases any mlock.
        unsafe {
            libc::munmap(slab.ptr.as_ptr().cast(), slab.len);
        }
    }

    /// Keeps a released slab idle while recent demand wants it, the free list has room and the
    /// memory mapped is within the budget; otherwise unmaps it (munmap: the pages return to the
    /// system at once and leave RSS, which `madvise(MADV_FREE)` would not do until memory
    /// pressure, and which `MADV_DONTNEED` cannot do for page-locked or registered slabs).
    /// In a child forked after the arena was made, the slab is unmapped at once.
    fn release(&self, slab: Slab) {
        let Some(mut idle) = self.idle() else {
            self.unmap(slab);
            return;
        };
        idle.demand.release();
        let within_budget =
            self.bytes_mapped.load(Ordering::Relaxed) <= self.budget.load(Ordering::Relaxed);
        let wanted = idle.slabs.len() < idle.demand.idle_wanted().min(self.max_free);
        let surplus = if !within_budget {
            slab
        } else if wanted {
            idle.slabs.push(slab);
            return;
        } else {
            // Full: keep the larger of this slab and the smallest idle one, which fits more
            // requests (an epoch's short last batch must not leave a slab no full batch fits).
            match idle.slabs.iter_mut().min_by_key(|s| s.len) {
                Some(smallest) if smallest.len < slab.len => std::mem::replace(smallest, slab),
                _ => slab,
            }
        };
        drop(idle);
        self.unmap(surplus);
    }
}

/// Removes the idle slabs beyond the `keep` largest (the largest fit the most requests).
fn take_surplus(slabs: &mut Vec<Slab>, keep: usize) -> Vec<Slab> {
    if slabs.len() <= keep {
        return Vec::new();
    }
    slabs.sort_by_key(|s| std::cmp::Reverse(s.len));
    slabs.split_off(keep)
}

impl Drop for ArenaInner {
    fn drop(&mut self) {
        // In a forked child the idle slabs are left mapped: the list may be half-updated by a
        // parent thread that held its lock at the moment of the fork.
        let Some(mut idle) = self.idle() else {
            return;
        };
        let slabs = std::mem::take(&mut idle.slabs);
        drop(idle);
        for slab in slabs {
            self.unmap(slab);
        }
    }
}

impl SlabLease {
    /// The requested length (not the slab's rounded-up size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the requested length was 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this memory is page-locked by `mlock`.
    pub fn is_locked(&self) -> bool {
        self.slab.as_ref().is_some_and(|s| s.locked)
    }

    /// Whether this memory is registered with a device driver.
    pub fn is_registered(&self) -> bool {
        self.slab.as_ref().is_some_and(|s| s.registered)
    }

    /// The start of the slab, page-aligned; writable through for [`len`](Self::len) bytes while
    /// the lease is held exclusively.
    pub fn as_ptr(&self) -> *mut u8 {
        self.slab
            .as_ref()
            .map_or(std::ptr::null_mut(), |s| s.ptr.as_ptr())
    }

    /// The first [`len`](Self::len) bytes of the slab.
    pub fn as_slice(&self) -> &[u8] {
        match &self.slab {
            // SAFETY: the slab is at least `len` bytes, mapped read-write, and exclusively ours
            // for the lease's lifetime; the returned borrow is tied to `&self`.
            Some(s) => unsafe { std::slice::from_raw_parts(s.ptr.as_ptr(), self.len) },
            None => &[],
        }
    }

    /// The first [`len`](Self::len) bytes of the slab, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.slab {
            // SAFETY: as in `as_slice`, and `&mut self` makes this the only borrow.
            Some(s) => unsafe { std::slice::from_raw_parts_mut(s.ptr.as_ptr(), self.len) },
            None => &mut [],
        }
    }
}

impl Drop for SlabLease {
    fn drop(&mut self) {
        if let Some(slab) = self.slab.take() {
            self.arena.slabs_leased.fetch_sub(1, Ordering::Relaxed);
            self.arena.release(slab);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn slabs_are_page_aligned_and_recycled() {
        let arena = Arena::new(false, 4, None);
        let a = arena.acquire(10_000).unwrap();
        assert_eq!(a.as_ptr() as usize % page_size(), 0);
        assert_eq!(a.len(), 10_000);
        let ptr = a.as_ptr();
        drop(a);
        let b = arena.acquire(9_000).unwrap();
        assert_eq!(b.as_ptr(), ptr, "a fitting free slab is reused");
        assert_eq!(arena.counters().slabs_mapped, 1);
        // A much smaller request does not take a much larger slab.
        drop(b);
        let small = arena.acquire(100).unwrap();
        assert_ne!(small.as_ptr(), ptr);
        assert_eq!(arena.counters().slabs_mapped, 2);
    }

    #[test]
    fn free_list_is_bounded() {
        let arena = Arena::new(false, 2, None);
        let leases: Vec<_> = (0..5).map(|_| arena.acquire(4096).unwrap()).collect();
        drop(leases);
        let c = arena.counters();
        assert_eq!(c.slabs_mapped, 5);
        assert_eq!(c.slabs_unmapped, 3);
        assert_eq!(c.bytes_mapped, 2 * 4096);
    }

    #[test]
    fn idle_slabs_are_kept_only_within_the_budget() {
        let page = page_size();
        let arena = Arena::new(false, 8, None);
        arena.set_budget(3 * page as u64);
        let leases: Vec<_> = (0..5).map(|_| arena.acquire(page).unwrap()).collect();
        drop(leases);
        let c = arena.counters();
        assert_eq!(c.slabs_unmapped, 2, "{c:?}");
        assert_eq!(c.bytes_mapped, 3 * page as u64);
    }

    #[test]
    fn idle_slabs_beyond_recent_demand_are_unmapped() {
        let page = page_size();
        let arena = Arena::new(false, 16, None);
        // A burst: 8 slabs at once, all released. Recent demand was 8, so they stay mapped.
        let burst: Vec<_> = (0..8).map(|_| arena.acquire(page).unwrap()).collect();
        drop(burst);
        let c = arena.counters();
        assert_eq!(
            (c.slabs_idle, c.bytes_mapped),
            (8, 8 * page as u64),
            "{c:?}"
        );
        // Then one batch at a time, for two demand windows: the burst is forgotten and every
        // slab but the one in use is unmapped; the one in use was reused, never mapped anew.
        for _ in 0..2 * DEMAND_WINDOW {
            drop(arena.acquire(page).unwrap());
        }
        let c = arena.counters();
        assert_eq!(c.slabs_mapped, 8, "{c:?}");
        assert_eq!(c.slabs_unmapped, 7, "{c:?}");
        assert_eq!((c.slabs_idle, c.bytes_mapped), (1, page as u64), "{c:?}");
        assert_eq!(c.bytes_mapped_peak, 8 * page as u64);
    }

    #[test]
    fn a_steady_pattern_reuses_its_slabs_and_maps_nothing_more() {
        let page = page_size();
        let arena = Arena::new(false, 16, None);
        // Three slabs alive at the busiest moment, one or two otherwise, over many windows.
        let mut held = std::collections::VecDeque::new();
        for i in 0..4 * DEMAND_WINDOW {
            held.push_back(arena.acquire(page).unwrap());
            if held.len() == 3 || i % 2 == 0 {
                held.pop_front();
            }
        }
        let c = arena.counters();
        assert_eq!((c.slabs_mapped, c.slabs_unmapped), (3, 0), "{c:?}");
    }

    #[test]
    fn a_full_free_list_keeps_the_larger_slab() {
        let page = page_size();
        let arena = Arena::new(false, 1, None);
        let full = arena.acquire(2 * page).unwrap();
        let short = arena.acquire(page).unwrap();
        drop(short);
        drop(full);
        // Room for one idle slab: the full batch's, which also fits the short one.
        let c = arena.counters();
        assert_eq!(
            (c.slabs_idle, c.bytes_mapped),
            (1, 2 * page as u64),
            "{c:?}"
        );
        let again = arena.acquire(2 * page).unwrap();
        assert_eq!(arena.counters().slabs_mapped, 2, "reused, not mapped");
        drop(again);
    }

    #[test]
    fn trim_unmaps_every_idle_slab_and_leaves_leases_alone() {
        let arena = Arena::new(false, 8, None);
        let mut kept = arena.acquire(100).unwrap();
        drop(
            (0..4)
                .map(|_| arena.acquire(100).unwrap())
                .collect::<Vec<_>>(),
        );
        assert_eq!(arena.counters().slabs_idle, 4);
        arena.trim();
        let c = arena.counters();
        assert_eq!((c.slabs_idle, c.slabs_leased), (0, 1), "{c:?}");
        assert_eq!(c.bytes_mapped, page_size() as u64);
        kept.as_mut_slice().fill(1);
        drop(kept);
        assert_eq!(
            arena.counters().slabs_idle,
            1,
            "a released lease is kept again"
        );
    }

    #[test]
    fn leases_outlive_the_arena_handle() {
        let arena = Arena::new(false, 2, None);
        let mut lease = arena.acquire(64).unwrap();
        drop(arena);
        lease.as_mut_slice().fill(7);
        assert!(lease.as_slice().iter().all(|&b| b == 7));
    }

    #[test]
    fn pinning_succeeds_or_falls_back_and_is_counted() {
        let arena = Arena::new(true, 2, None);
        // 64 MiB is above the default 8 MiB RLIMIT_MEMLOCK of an unprivileged process.
        let big = arena.acquire(64 << 20).unwrap();
        let small = arena.acquire(4096).unwrap();
        let c = arena.counters();
        assert_eq!(c.slabs_pinned + c.pin_failures, 2);
        assert_eq!(
            big.is_locked() as u64 + small.is_locked() as u64,
            c.slabs_pinned
        );
    }

    struct CountingRegistrar {
        live: AtomicUsize,
        fail: bool,
    }

    impl SlabRegistrar for CountingRegistrar {
        fn register(&self, _: *mut u8, _: usize) -> Result<()> {
            if self.fail {
                return Err(Error::Cuda("register refused".into()));
            }
            self.live.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn unregister(&self, _: *mut u8, _: usize) {
            self.live.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn registrar_sees_every_slab_registered_then_unregistered() {
        let reg = Arc::new(CountingRegistrar {
            live: AtomicUsize::new(0),
            fail: false,
        });
        let arena = Arena::new(false, 1, Some(reg.clone()));
        let a = arena.acquire(100).unwrap();
        let b = arena.acquire(100).unwrap();
        assert!(a.is_registered());
        assert_eq!(reg.live.load(Ordering::SeqCst), 2);
        drop(a);
        drop(b); // the free list holds one; the other is unregistered and unmapped
        assert_eq!(reg.live.load(Ordering::SeqCst), 1);
        drop(arena);
        assert_eq!(reg.live.load(Ordering::SeqCst), 0);

        let failing = Arena::new(
            false,
            1,
            Some(Arc::new(CountingRegistrar {
                live: AtomicUsize::new(0),
                fail: true,
            })),
        );
        assert!(matches!(failing.acquire(10), Err(Error::Cuda(_))));
    }
}
