//! The arena: page-aligned batch memory, recycled.
//!
//! Batches are written into slabs from here and handed to the user as leases; a released lease
//! returns its slab to the free list, so after the first few batches no batch maps new memory.
//!
//! Idle slabs are kept only as far as recent demand needs them: the arena remembers the most
//! slabs leased at once over the last windows of [`DEMAND_WINDOW`] acquisitions or more, and
//! unmaps a released slab that would leave more slabs mapped than that (see `Demand`). A burst
//! (a consumer that held many batches, a deeper prefetch that is over) is given back to the
//! system within two windows, or a few more where the steady pattern's own busiest moments are
//! that far apart; a steady pattern keeps exactly the slabs it cycles through, so the steady
//! state maps nothing, and faults on no page (every mapping is counted in
//! [`ArenaCounters::page_faults`]). The only other bound on idle slabs is `memory_budget`.
//! With `pin_memory`, slabs are page-locked when mapped: registered with a device driver when the
//! arena has a [`SlabRegistrar`] (the CUDA layer: memory the driver and torch call pinned), else,
//! or when the driver refuses, with `mlock`; if `RLIMIT_MEMLOCK` forbids that too the slab stays
//! pageable and the fallback is counted ([`ArenaCounters::pin_failures`]). Without `pin_memory`
//! a registrar still registers every slab (a device loader's host side), and a refusal is an
//! error. A registered slab is unregistered before it is unmapped.
//!
//! In a child forked after the arena was made, the free list is never touched: a parent thread
//! may have held its lock at the moment of the fork, and would never release it there. A slab
//! released in the child is unmapped at once, idle slabs are left as they are, and `acquire`
//! fails (see [`crate::fork`]).

use std::collections::VecDeque;
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
    /// Minor page faults taken by batch memory: the mapping thread's `ru_minflt`
    /// (`getrusage(RUSAGE_THREAD)`) across mapping and pre-faulting each slab,
    /// where every page of batch memory is first touched. Faults that the copy loops take on
    /// the source's pages are not counted, nor one a later write takes on a page the kernel
    /// took away meanwhile (NUMA balancing, swap), which cannot be told apart from those.
    pub page_faults: u64,
}

/// Acquisitions per demand window, at least: a window is also at least [`WINDOW_CYCLES`] times
/// the slabs remembered as wanted, so that it spans every slab's reuse several times over
/// however deep the prefetch. Short enough that memory a burst needed returns after a few
/// dozen batches.
pub const DEMAND_WINDOW: u64 = 64;

/// A window lasts at least this many acquisitions per slab wanted.
pub const WINDOW_CYCLES: u64 = 4;

/// The most windows demand is remembered over (see `Demand::span`).
pub const MAX_SPAN: usize = 32;

/// Slabs wanted recently: the most leased at once over the last `span` windows of acquisitions
/// (the current one included). Counted rather than timed, so that an idle loader and a slow
/// one behave the same and the rule is deterministic: a loader that stops asking keeps what it
/// last needed (at most that many slabs, freed when the arena drops), and steady use never
/// trims a slab it is about to need again.
///
/// How busy the busiest moment of a window is varies with timing (which worker finishes
/// first, how many batches the consumer holds when the next arrives), so a window may miss the
/// steady pattern's peak. When a slab has to be mapped within `span` windows of a slab given
/// back for want of demand, that was such a miss, not a fall in demand: `span` doubles (from 2,
/// up to [`MAX_SPAN`]), so the arena gives back only what a burst needed and the steady
/// pattern's own peaks no longer recur often enough to claim.
#[derive(Debug)]
struct Demand {
    /// Slabs leased now.
    leased: u64,
    /// Acquisitions in the current window.
    acquired: u64,
    /// Most leased at once in the current window.
    peak: u64,
    /// The peaks of the windows before, newest first: `span - 1` of them at most.
    before: VecDeque<u64>,
    /// Windows remembered, the current one included.
    span: usize,
    /// Windows begun since a slab was last given back for want of demand; `None` if never.
    since_trim: Option<usize>,
}

impl Default for Demand {
    fn default() -> Demand {
        Demand {
            leased: 0,
            acquired: 0,
            peak: 0,
            before: VecDeque::new(),
            span: 2,
            since_trim: None,
        }
    }
}

impl Demand {
    /// One more slab leased; `mapped`: no idle slab served it. Returns whether a new window
    /// began.
    fn acquire(&mut self, mapped: bool) -> bool {
        if mapped && self.since_trim.is_some_and(|n| n < self.span) {
            self.span = (self.span * 2).min(MAX_SPAN);
            self.since_trim = None;
        }
        self.leased += 1;
        self.peak = self.peak.max(self.leased);
        self.acquired += 1;
        if self.acquired < DEMAND_WINDOW.max(WINDOW_CYCLES * self.wanted()) {
            return false;
        }
        self.before.push_front(self.peak);
        self.before.truncate(self.span - 1);
        self.peak = self.leased;
        self.acquired = 0;
        self.since_trim = self.since_trim.map(|n| n + 1);
        true
    }

    fn release(&mut self) {
        self.leased = self.leased.saturating_sub(1);
    }

    /// Slabs given back for want of demand.
    fn trimmed(&mut self) {
        self.since_trim = Some(0);
    }

    /// The most slabs leased at once over the windows remembered.
    fn wanted(&self) -> u64 {
        self.before.iter().copied().fold(self.peak, u64::max)
    }

    /// Idle slabs worth keeping: what recent demand needed beyond the slabs leased now.
    fn idle_wanted(&self) -> usize {
        let wanted = self.wanted().saturating_sub(self.leased);
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
    page_faults: AtomicU64,
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
    /// An empty arena; `pin`: page-lock slabs (by `registrar` if any, else or when it
    /// refuses by `mlock`); `registrar`: register them with a device driver.
    pub fn new(pin: bool, registrar: Option<Arc<dyn SlabRegistrar>>) -> Arena {
        Arena {
            inner: Arc::new(ArenaInner {
                pin,
                registrar,
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
                page_faults: AtomicU64::new(0),
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
            let surplus = if idle.demand.acquire(reused.is_none()) {
                // A new window: what the one forgotten needed beyond the others goes now.
                let keep = idle.demand.idle_wanted();
                let surplus = take_surplus(&mut idle.slabs, keep);
                if !surplus.is_empty() {
                    idle.demand.trimmed();
                }
                surplus
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
            page_faults: i.page_faults.load(Ordering::Relaxed),
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

    /// Maps a slab of at least `len` bytes, pre-faulted, and page-locks and registers it as
    /// the arena is configured to.
    ///
    /// The minor faults this takes are added to `page_faults`: the calling thread's `ru_minflt`
    /// (`getrusage(RUSAGE_THREAD)`) before and after mapping and pre-faulting (page-locking
    /// pre-faulted pages takes none).
    /// Every page of batch memory is first touched here, so this counts what batch memory
    /// costs in faults (a reused slab costs none), and nothing else: not the faults on the
    /// source's pages that the workers' copy loops take, nor those of a driver registering the
    /// slab. Not counted either: a fault a later write takes on a page the kernel took away
    /// meanwhile (NUMA balancing, reclaim to swap), which the copy loop cannot tell apart from
    /// the source's.
    fn map(&self, len: usize) -> Result<Slab> {
        let before = minor_faults();
        let mapped = map_prefaulted(len);
        let slab = mapped.map(|(ptr, len)| self.adopt(ptr, len));
        self.page_faults
            .fetch_add(minor_faults().saturating_sub(before), Ordering::Relaxed);
        let mut slab = slab?;
        let registered = match &self.registrar {
            Some(registrar) => match registrar.register(slab.ptr.as_ptr(), slab.len) {
                Ok(()) => true,
                // pin_memory on the host: mlock below is the fallback.
                Err(_) if self.pin => false,
                Err(e) => {
                    self.unmap(slab); // not registered, so no unregister call
                    return Err(e);
                }
            },
            None => false,
        };
        slab.registered = registered;
        if self.pin {
            // SAFETY: the range is exactly the mapping just created.
            slab.locked =
                registered || unsafe { libc::mlock(slab.ptr.as_ptr().cast(), slab.len) } == 0;
            let counter = if slab.locked {
                &self.slabs_pinned
            } else {
                &self.pin_failures
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Ok(slab)
    }

    /// Counts a new mapping of `len` bytes at `ptr`.
    fn adopt(&self, ptr: NonNull<u8>, len: usize) -> Slab {
        self.slabs_mapped.fetch_add(1, Ordering::Relaxed);
        let mapped = self.bytes_mapped.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
        self.bytes_mapped_peak.fetch_max(mapped, Ordering::Relaxed);
        Slab {
            ptr,
            len,
            locked: false,
            registered: false,
        }
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
        let wanted = idle.slabs.len() < idle.demand.idle_wanted();
        let surplus = if !within_budget {
            slab
        } else if wanted {
            idle.slabs.push(slab);
            return;
        } else {
            // Beyond demand: keep the larger of this slab and the smallest idle one, which fits
            // more requests (an epoch's short last batch must not leave a slab no full batch
            // fits).
            idle.demand.trimmed();
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

/// Slabs this large or larger are backed by transparent huge pages where the kernel allows
/// (`madvise(MADV_HUGEPAGE)`): one fault and one zeroing per 2 MiB instead of 512 of each.
pub const HUGE_PAGE: usize = 2 << 20;

/// Maps `len` bytes (page-rounded; the rounded length is returned) of anonymous memory and
/// touches every page, so that the first batch written there does not pay for page faults
/// inside the workers' copy loops.
///
/// A slab of [`HUGE_PAGE`] or more starts on a huge-page boundary and asks for huge pages; the
/// kernel may refuse (`transparent_hugepage=never`, an old kernel), and then it is an ordinary
/// mapping. It is pre-faulted after that request, with `MADV_POPULATE_WRITE` (Linux 5.14), or
/// by writing to each page where that is refused. Smaller slabs are pre-faulted by
/// `MAP_POPULATE`. (Miri, which runs the arena's tests, models neither: there the pages are
/// faulted when first written, which changes only when, not what they hold.)
fn map_prefaulted(len: usize) -> Result<(NonNull<u8>, usize)> {
    let page = page_size();
    let len = len.max(1).div_ceil(page) * page;
    let huge = len >= HUGE_PAGE && !cfg!(miri);
    let populate = if cfg!(miri) || huge {
        0
    } else {
        libc::MAP_POPULATE
    };
    // Room to move the start to a huge-page boundary.
    let reserve = if huge { len + HUGE_PAGE } else { len };
    // SAFETY: an anonymous private mapping with no address hint; the result is checked.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            reserve,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | populate,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(Error::OutOfMemory(format!(
            "mapping a {len}-byte batch slab: {}",
            std::io::Error::last_os_error()
        )));
    }
    let base = base.cast::<u8>();
    if !huge {
        let ptr = NonNull::new(base).ok_or_else(|| Error::Internal("mmap returned NULL".into()))?;
        return Ok((ptr, len));
    }
    let head = (HUGE_PAGE - base as usize % HUGE_PAGE) % HUGE_PAGE;
    let tail = reserve - head - len;
    // SAFETY: `head <= HUGE_PAGE`, so `[base, base + reserve)` holds `[start, start + len)`;
    // the head and tail unmapped here are the parts of the fresh mapping outside it, which
    // nothing refers to.
    let start = unsafe {
        let start = base.add(head);
        if head > 0 {
            libc::munmap(base.cast(), head);
        }
        if tail > 0 {
            libc::munmap(start.add(len).cast(), tail);
        }
        start
    };
    // SAFETY: `[start, start + len)` is a private anonymous mapping of ours; neither advice
    // changes its contents (zero pages, not yet written). Failures are allowed: the first
    // leaves ordinary pages, the second is made up for below.
    let populated = unsafe {
        libc::madvise(start.cast(), len, libc::MADV_HUGEPAGE);
        libc::madvise(start.cast(), len, libc::MADV_POPULATE_WRITE) == 0
    };
    if !populated {
        for offset in (0..len).step_by(page) {
            // SAFETY: inside the mapping, which is writable; writing the zero the page holds
            // allocates it without changing what it reads as.
            unsafe { start.add(offset).write_volatile(0) };
        }
    }
    let ptr = NonNull::new(start).ok_or_else(|| Error::Internal("mmap returned NULL".into()))?;
    Ok((ptr, len))
}

/// The minor page faults the calling thread has taken so far (0 under Miri, which has no
/// `getrusage`).
fn minor_faults() -> u64 {
    if cfg!(miri) {
        return 0;
    }
    // SAFETY: `usage` is a plain C struct for getrusage to fill; it is read only on success.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_THREAD, &mut usage) == 0 {
            u64::try_from(usage.ru_minflt).unwrap_or(0)
        } else {
            0
        }
    }
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

    /// Whether this memory is page-locked for `pin_memory` (by a driver's registration or by
    /// `mlock`).
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
mod tests;
