//! How far ahead the schedulers build: the in-flight depth.
//!
//! The in-flight cap (`max(1, num_workers) × prefetch_factor`, lowered to what `memory_budget`
//! holds) is the most batches a scheduler may have submitted (host) or cut (stream) and not
//! delivered; each one holds an arena slab once it is built, so the cap is also what the
//! loader's batch memory can grow to. Building that far ahead pays only when the consumer is
//! irregular: a consumer faster than the workers finds nothing built ahead anyway, and one slower
//! than them only ever needs the next batch ready. So a scheduler starts at `workers + 1` (every
//! worker busy, plus one task waiting for whichever finishes first, so that a worker never idles
//! behind a slower neighbour's batch that in-order delivery waits for) and deepens, one batch at
//! a time up to the cap, only when the consumer's waits show that building further ahead would
//! have fed it.
//!
//! The evidence: while the depth is full, the builders (host workers, or a stream's feeder) wait
//! for work; when the consumer then has to wait for a batch, up to `min(its wait, the builders'
//! held-back time since its previous wait / builders)` of that wait could have been spent
//! building ahead. Those amounts are summed over a window of [`WINDOW`] deliveries; if they reach
//! 1/[`DEEPEN_AT`] of the window's time, the depth grows by one. A consumer faster than the
//! workers waits for every batch, but its workers are never held back for more than a thread
//! wake-up, so the depth stays at `workers + 1`; a slower consumer never waits; a bursty one
//! (a pause, then batches faster than the workers build them) deepens the prefetch until its
//! pauses are covered or the cap is reached. The depth never shrinks: a pattern that once
//! needed it is likely to recur, and shrinking would trade a recurring stall for memory the cap
//! already allows.
//!
//! The batch the last call handed over counts against the depth until the consumer asks again
//! ([`Depth::limit`]): the consumer works on it meanwhile, and a `for batch in loader` loop
//! still holds its previous batch while it asks for the next, so submitting the replacement at
//! the hand-over would only add a slab alive at that moment. With a consumer faster than the
//! workers, the slabs alive are then at most `workers + 2`: the workers' own, the batch handed
//! over and the one the loop still holds.

use std::time::{Duration, Instant};

/// Deliveries per window over which waits are weighed: short, so that a bursty consumer reaches
/// the depth it needs within a few dozen batches; the threshold is a share of the window's time,
/// so a short window does not make a steady consumer's brief waits count more.
pub(super) const WINDOW: usize = 8;

/// The depth deepens when the waits it could have saved reach 1/`DEEPEN_AT` of a window's time.
pub(super) const DEEPEN_AT: u64 = 50;

/// The in-flight depth of one scheduler (see the module documentation).
#[derive(Debug)]
pub(super) struct Depth {
    /// Batches in flight allowed now (the cap may be lower).
    now: usize,
    /// The builders' held-back time (ns, summed) when the consumer last waited.
    idle_seen: u64,
    /// In this window: the consumer's waiting time that a deeper prefetch could have saved.
    saved_ns: u64,
    deliveries: usize,
    window_start: Instant,
}

impl Depth {
    /// Starts at `workers + 1`.
    pub(super) fn new(workers: usize) -> Depth {
        Depth {
            now: workers.max(1) + 1,
            idle_seen: 0,
            saved_ns: 0,
            deliveries: 0,
            window_start: Instant::now(),
        }
    }

    /// The depth under `cap`.
    pub(super) fn of(&self, cap: usize) -> usize {
        self.now.min(cap).max(1)
    }

    /// Tasks to keep in flight under `cap` when the consumer holds a batch the last call handed
    /// over (`handed_over`), which counts against the depth until the consumer asks again. Never
    /// fewer than the cap allows up to the workers: the depth is at least `workers + 1`, so
    /// every worker still has a task.
    pub(super) fn limit(&self, cap: usize, handed_over: bool) -> usize {
        (self.now - usize::from(handed_over)).min(cap).max(1)
    }

    /// Whether a batch handed over counts against the depth: only while the depth, not a cap of
    /// `workers` or fewer, is what binds.
    pub(super) fn counts_handed_over(&self, cap: usize) -> bool {
        self.now <= cap
    }

    /// The workers changed (autotune): the depth is at least `workers + 1`.
    pub(super) fn set_workers(&mut self, workers: usize) {
        self.now = self.now.max(workers.max(1) + 1);
    }

    /// The consumer was blocked for `waited` with nothing to deliver. `idle_ns`: the builders'
    /// total held-back time so far; `builders`: how many threads it is summed over.
    pub(super) fn waited(&mut self, waited: Duration, idle_ns: u64, builders: usize) {
        let idle = idle_ns.saturating_sub(self.idle_seen) / builders.max(1) as u64;
        self.idle_seen = idle_ns;
        let waited = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.saved_ns = self.saved_ns.saturating_add(waited.min(idle));
    }

    /// A batch was delivered. At the end of a window, deepens by one (up to `cap`) if the
    /// consumer's waits warrant it; returns whether it did.
    pub(super) fn delivered(&mut self, cap: usize) -> bool {
        self.deliveries += 1;
        if self.deliveries < WINDOW {
            return false;
        }
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.window_start);
        let elapsed = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let deepen = self.saved_ns > 0
            && self.saved_ns.saturating_mul(DEEPEN_AT) >= elapsed
            && self.now < cap;
        if deepen {
            self.now += 1;
        }
        self.saved_ns = 0;
        self.deliveries = 0;
        self.window_start = now;
        deepen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn starts_at_one_task_more_than_the_workers_within_the_cap() {
        assert_eq!(Depth::new(2).of(8), 3);
        assert_eq!(Depth::new(2).of(2), 2, "prefetch_factor=1: the cap");
        assert_eq!(
            Depth::new(0).of(4),
            2,
            "num_workers=0 counts as one builder"
        );
        let mut d = Depth::new(2);
        d.set_workers(4);
        assert_eq!(d.of(16), 5);
        d.set_workers(1);
        assert_eq!(d.of(16), 5, "fewer workers do not shrink it");
    }

    #[test]
    fn a_batch_handed_over_counts_against_the_depth_but_never_idles_a_worker() {
        let d = Depth::new(2);
        assert_eq!((d.limit(8, false), d.limit(8, true)), (3, 2));
        assert!(d.counts_handed_over(8));
        // A cap of the workers (prefetch_factor=1) is the cap, held or not.
        assert_eq!((d.limit(2, false), d.limit(2, true)), (2, 2));
        assert!(!d.counts_handed_over(2));
    }

    #[test]
    fn waits_with_no_held_back_builders_do_not_deepen_it() {
        // A consumer faster than the workers: it waits for every batch, the workers never wait
        // for a task.
        let mut d = Depth::new(2);
        for _ in 0..4 * WINDOW {
            d.waited(ms(40), 0, 2);
            assert!(!d.delivered(8));
        }
        assert_eq!(d.of(8), 3);
    }

    #[test]
    fn a_consumer_that_never_waits_does_not_deepen_it() {
        // A slower consumer: the workers are held back all the time, the consumer never waits.
        let mut d = Depth::new(2);
        for _ in 0..4 * WINDOW {
            assert!(!d.delivered(8));
        }
        assert_eq!(d.of(8), 3);
    }

    #[test]
    fn waits_that_held_back_builders_could_have_saved_deepen_it_up_to_the_cap() {
        // Workers held back for longer than the consumer then waits, in every window: each
        // window's end adds one, until the cap.
        let mut d = Depth::new(2);
        let mut idle = 0;
        let mut deepened = 0;
        for _ in 0..10 * WINDOW {
            idle += 2 * ms(50).as_nanos() as u64;
            d.waited(ms(20), idle, 2);
            deepened += usize::from(d.delivered(5));
        }
        assert_eq!((deepened, d.of(5)), (2, 5));
        assert_eq!(d.of(4), 4, "never beyond a lowered cap");
    }
}
