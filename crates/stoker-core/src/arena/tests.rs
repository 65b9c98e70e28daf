//! The arena's tests: recycling, demand, trimming, pinning, huge pages, faults.

use super::*;
use std::sync::atomic::AtomicUsize;

#[test]
fn slabs_are_page_aligned_and_recycled() {
    let arena = Arena::new(false, None);
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
fn released_slabs_are_kept_while_demand_for_them_is_recent() {
    let arena = Arena::new(false, None);
    let leases: Vec<_> = (0..5).map(|_| arena.acquire(4096).unwrap()).collect();
    drop(leases);
    let c = arena.counters();
    assert_eq!((c.slabs_mapped, c.slabs_unmapped, c.slabs_idle), (5, 0, 5));
    let again: Vec<_> = (0..5).map(|_| arena.acquire(4096).unwrap()).collect();
    assert_eq!(arena.counters().slabs_mapped, 5, "all five reused");
    drop(again);
}

#[test]
fn a_busiest_moment_that_recurs_every_few_windows_is_not_trimmed_between_them() {
    let page = page_size();
    let arena = Arena::new(false, None);
    // Two slabs at a time (one held while the next is taken), and three once every three
    // windows: the third slab is wanted again before it is worth giving back. Given back
    // once (two windows after it was last used), it is mapped again, and then remembered.
    // (Remembering two windows only, the arena mapped it 10 times more.)
    let mut held = arena.acquire(page).unwrap();
    // Three recurrences are enough to see a forgotten slab mapped again; Miri interprets each
    // window slowly.
    let windows = if cfg!(miri) { 9 } else { 30 };
    for i in 0..windows * DEMAND_WINDOW {
        let next = arena.acquire(page).unwrap();
        if i % (3 * DEMAND_WINDOW) == 0 {
            drop(arena.acquire(page).unwrap());
        }
        held = next;
    }
    drop(held);
    let c = arena.counters();
    assert!(c.slabs_mapped <= 4, "{c:?}");
    assert!(c.slabs_unmapped <= 1, "{c:?}");
}

#[test]
fn idle_slabs_are_kept_only_within_the_budget() {
    let page = page_size();
    let arena = Arena::new(false, None);
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
    let arena = Arena::new(false, None);
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
    let arena = Arena::new(false, None);
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
fn when_demand_falls_the_larger_slab_is_kept() {
    let page = page_size();
    let arena = Arena::new(false, None);
    let full = arena.acquire(2 * page).unwrap();
    let short = arena.acquire(page).unwrap();
    drop(short);
    drop(full);
    // Then one full batch at a time: the demand falls to one slab, and the one kept is the
    // full batch's, which also fits the short one.
    for _ in 0..2 * DEMAND_WINDOW {
        drop(arena.acquire(2 * page).unwrap());
    }
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
    let arena = Arena::new(false, None);
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
    let arena = Arena::new(false, None);
    let mut lease = arena.acquire(64).unwrap();
    drop(arena);
    lease.as_mut_slice().fill(7);
    assert!(lease.as_slice().iter().all(|&b| b == 7));
}

#[test]
fn pinning_succeeds_or_falls_back_and_is_counted() {
    let arena = Arena::new(true, None);
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
    let arena = Arena::new(false, Some(reg.clone()));
    let a = arena.acquire(100).unwrap();
    let b = arena.acquire(100).unwrap();
    assert!(a.is_registered());
    assert_eq!(reg.live.load(Ordering::SeqCst), 2);
    drop(a);
    drop(b); // both idle, still registered
    assert_eq!(reg.live.load(Ordering::SeqCst), 2);
    arena.trim();
    assert_eq!(reg.live.load(Ordering::SeqCst), 0);
    drop(arena.acquire(100).unwrap());
    assert_eq!(reg.live.load(Ordering::SeqCst), 1);
    drop(arena);
    assert_eq!(reg.live.load(Ordering::SeqCst), 0);

    let failing = Arena::new(
        false,
        Some(Arc::new(CountingRegistrar {
            live: AtomicUsize::new(0),
            fail: true,
        })),
    );
    assert!(matches!(failing.acquire(10), Err(Error::Cuda(_))));
}

/// `pin_memory` on a host loader with a driver: slabs are registered (pinned to CUDA and
/// torch) and count as pinned; when the driver refuses, `mlock` takes over and the batch
/// still comes, instead of failing as a device loader's registration does.
#[test]
fn host_pinning_registers_and_falls_back_to_mlock_when_refused() {
    let reg = Arc::new(CountingRegistrar {
        live: AtomicUsize::new(0),
        fail: false,
    });
    let arena = Arena::new(true, Some(reg.clone()));
    let lease = arena.acquire(100).unwrap();
    assert!(lease.is_registered() && lease.is_locked());
    assert_eq!(reg.live.load(Ordering::SeqCst), 1);
    assert_eq!(arena.counters().slabs_pinned, 1);

    let refusing = Arena::new(
        true,
        Some(Arc::new(CountingRegistrar {
            live: AtomicUsize::new(0),
            fail: true,
        })),
    );
    let lease = refusing
        .acquire(100)
        .expect("mlock stands in for the refused registration");
    assert!(!lease.is_registered());
    let c = refusing.counters();
    // mlock itself may be refused (RLIMIT_MEMLOCK): then the slab is counted as a failure.
    assert_eq!(c.slabs_pinned + c.pin_failures, 1, "{c:?}");
    assert_eq!(lease.is_locked(), c.slabs_pinned == 1);
}
