//! `autotune=true`: a live controller of the worker count and the prefetch depth, in the spirit
//! of tf.data's AUTOTUNE but visible: every decision is counted in stats and drawn in the trace.
//!
//! The loader asks the controller after each batch it delivers; every window (at least
//! [`MIN_WINDOW`] and [`MIN_BATCHES`] batches, or [`MAX_WINDOW`]) it compares what happened:
//! - the consumer's readiness (1 − time waiting / time),
//! - how busy the workers were (time building / (time × workers)),
//! - the CPU the process used, hence the cores left idle.
//!
//! Rules, one change per window, and the window after a change is discarded (the pipeline is
//! settling):
//! - readiness below [`TARGET`], workers busy, cores idle → one more worker (never more than the
//!   cores this process may run on, nor more than the memory budget holds batches);
//! - readiness below target while the workers have slack → a deeper prefetch (up to
//!   [`MAX_PREFETCH`], within the memory budget): batches come in bursts. A deeper prefetch is
//!   a trial: if the next window's readiness is not at least [`HELPED`] higher, the depth goes
//!   back and is not tried again (a consumer that waits because the cores are the limit, not
//!   the bursts, would otherwise get ever deeper prefetch and more memory for nothing);
//! - readiness below target, workers busy and no core left for another (or the memory budget
//!   full), with GPU decoding possible (`jpeg_decoder=auto`, `device=cuda`) → a larger
//!   `gpu_decode_share` by [`SHARE_STEP`]: the device decodes what the cores cannot;
//! - readiness at target, a GPU decode share in use and the workers with slack → a smaller
//!   share by [`SHARE_STEP`] (the trainer gets that GPU time back) before any worker goes;
//! - readiness at target and one worker fewer would still keep up → one worker fewer: the
//!   consumer is the bottleneck and the cores are better left to it.
//!
//! Which worker builds a batch never changes the batch, so results do not depend on any of this.

use std::time::{Duration, Instant};

/// Readiness the controller aims for.
pub const TARGET: f64 = 0.95;
/// Deepest prefetch (batches per worker) the controller sets.
pub const MAX_PREFETCH: usize = 8;
/// Shortest window between decisions...
pub const MIN_WINDOW: Duration = Duration::from_millis(200);
/// ...holding at least this many delivered batches...
pub const MIN_BATCHES: u64 = 4;
/// ...unless this much time passed with at least one.
pub const MAX_WINDOW: Duration = Duration::from_secs(2);

/// Workers busier than this are saturated.
const SATURATED: f64 = 0.85;
/// Cores idle needed to add a worker.
const IDLE_CORES: f64 = 0.5;
/// One worker fewer is enough when the rest would be at most this busy.
const SHED_BELOW: f64 = 0.7;
/// How much a deeper prefetch must raise readiness to be kept.
pub const HELPED: f64 = 0.02;
/// How far one decision moves the GPU decode share.
pub const SHARE_STEP: f64 = 0.1;

/// What the loader measured so far (cumulative counters).
#[derive(Clone, Copy, Debug)]
pub struct Observation {
    /// When the counters were read.
    pub at: Instant,
    /// Batches delivered to the consumer.
    pub batches: u64,
    /// The consumer's total wait, in nanoseconds.
    pub wait_ns: u64,
    /// The workers' total busy time, in nanoseconds.
    pub busy_ns: u64,
    /// The process's CPU time, every thread, in nanoseconds.
    pub cpu_ns: u64,
}

/// A change of settings and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// Worker threads to run from now on.
    pub workers: usize,
    /// Batches in flight per worker from now on (`prefetch_factor`).
    pub prefetch: usize,
    /// The share of samples the device decodes from now on (`None`: no GPU decoding).
    pub gpu_decode_share: Option<f64>,
    /// The window's readiness that prompted it.
    pub readiness: f64,
    /// Why, in words, as the trace shows it.
    pub reason: &'static str,
}

/// The controller's state between windows.
#[derive(Debug)]
pub struct Controller {
    /// The cores this process may run on.
    max_workers: usize,
    /// Batches the memory budget holds in flight.
    fit: usize,
    base: Option<Observation>,
    settling: bool,
    /// A deeper prefetch on trial: the depth before it and the readiness it must beat.
    trial: Option<(usize, f64)>,
    /// The deepest prefetch still worth trying (lowered when a trial fails).
    ceiling: usize,
}

impl Controller {
    /// A controller that never runs more than `max_workers` workers (the cores this process may
    /// run on) nor more than `fit` batches in flight (what the memory budget holds).
    pub fn new(max_workers: usize, fit: usize) -> Controller {
        Controller {
            max_workers: max_workers.max(1),
            fit: fit.max(1),
            base: None,
            settling: false,
            trial: None,
            ceiling: MAX_PREFETCH,
        }
    }

    /// Whether a window may have ended at `now` (a cheap check before measuring).
    pub fn due(&self, now: Instant) -> bool {
        self.base
            .is_none_or(|b| now.saturating_duration_since(b.at) >= MIN_WINDOW)
    }

    /// Takes `obs` into account with `workers`, `prefetch` and the GPU decode `share` (`None`:
    /// no GPU decoding) as they are now; returns the new settings when they should change.
    pub fn observe(
        &mut self,
        obs: Observation,
        (workers, prefetch): (usize, usize),
        share: Option<f64>,
    ) -> Option<Decision> {
        let Some(base) = self.base else {
            self.base = Some(obs);
            return None;
        };
        let dt = obs.at.saturating_duration_since(base.at);
        let batches = obs.batches.saturating_sub(base.batches);
        let ended =
            (dt >= MIN_WINDOW && batches >= MIN_BATCHES) || (dt >= MAX_WINDOW && batches >= 1);
        if !ended {
            return None;
        }
        self.base = Some(obs);
        if std::mem::replace(&mut self.settling, false) {
            return None;
        }
        let secs = dt.as_secs_f64().max(1e-9);
        let readiness =
            (1.0 - obs.wait_ns.saturating_sub(base.wait_ns) as f64 / 1e9 / secs).clamp(0.0, 1.0);
        let workers = workers.max(1);
        let busy =
            (obs.busy_ns.saturating_sub(base.busy_ns) as f64 / 1e9 / (secs * workers as f64))
                .clamp(0.0, 1.0);
        let cpu = obs.cpu_ns.saturating_sub(base.cpu_ns) as f64 / 1e9 / secs;
        let idle = self.max_workers as f64 - cpu;

        let decision = |workers, prefetch, reason| Decision {
            workers,
            prefetch,
            gpu_decode_share: share,
            readiness,
            reason,
        };
        let shared = |share: f64, reason| Decision {
            gpu_decode_share: Some((share * 10.0).round() / 10.0),
            ..decision(workers, prefetch, reason)
        };
        let chosen = if let Some((before, readiness_before)) = self.trial.take() {
            (readiness < readiness_before + HELPED && prefetch > before).then(|| {
                self.ceiling = before;
                decision(workers, before, "deeper prefetch did not help: back")
            })
        } else if readiness < TARGET {
            if busy >= SATURATED {
                if workers < self.max_workers && idle >= IDLE_CORES && workers < self.fit {
                    Some(decision(
                        workers + 1,
                        prefetch.min(self.fit / (workers + 1)).max(1),
                        "starved: workers busy, cores idle",
                    ))
                } else {
                    share.filter(|s| *s < 1.0).map(|s| {
                        shared(
                            (s + SHARE_STEP).min(1.0),
                            "starved: cores busy, more JPEGs to the GPU",
                        )
                    })
                }
            } else {
                (prefetch < self.ceiling && workers * (prefetch + 1) <= self.fit).then(|| {
                    self.trial = Some((prefetch, readiness));
                    decision(
                        workers,
                        prefetch + 1,
                        "starved while workers have slack: deeper prefetch",
                    )
                })
            }
        } else if let Some(s) = share.filter(|s| *s > 0.0 && busy <= SHED_BELOW) {
            Some(shared(
                (s - SHARE_STEP).max(0.0),
                "consumer-bound: the CPU takes JPEGs back from the GPU",
            ))
        } else {
            (workers > 1 && busy * workers as f64 / (workers - 1) as f64 <= SHED_BELOW).then(|| {
                decision(
                    workers - 1,
                    prefetch,
                    "consumer-bound: fewer workers keep up",
                )
            })
        };
        self.settling = chosen.is_some();
        chosen
    }
}

/// This process's CPU time (every thread), in nanoseconds.
pub fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and the clock id is a constant of the platform.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window of 1 s with `batches` delivered, the consumer waiting `wait` of it, the workers
    /// busy `busy` (fraction each) and the process using `cpu` cores.
    struct Sim {
        at: Instant,
        obs: Observation,
    }

    impl Sim {
        fn new() -> Sim {
            let at = Instant::now();
            Sim {
                at,
                obs: Observation {
                    at,
                    batches: 0,
                    wait_ns: 0,
                    busy_ns: 0,
                    cpu_ns: 0,
                },
            }
        }

        fn window(&mut self, workers: usize, wait: f64, busy: f64, cpu: f64) -> Observation {
            self.at += Duration::from_secs(1);
            self.obs = Observation {
                at: self.at,
                batches: self.obs.batches + 10,
                wait_ns: self.obs.wait_ns + (wait * 1e9) as u64,
                busy_ns: self.obs.busy_ns + (busy * workers as f64 * 1e9) as u64,
                cpu_ns: self.obs.cpu_ns + (cpu * 1e9) as u64,
            };
            self.obs
        }
    }

    #[test]
    fn adds_workers_while_starved_busy_and_cores_idle_then_stops_at_the_cores() {
        let mut c = Controller::new(3, 100);
        let mut sim = Sim::new();
        assert_eq!(
            c.observe(sim.window(1, 0.0, 0.0, 0.0), (1, 2), None),
            None,
            "first: a baseline"
        );
        let d = c
            .observe(sim.window(1, 0.5, 1.0, 0.1), (1, 2), None)
            .unwrap();
        assert_eq!((d.workers, d.prefetch), (2, 2));
        assert!((d.readiness - 0.5).abs() < 1e-9);
        assert_eq!(
            c.observe(sim.window(2, 0.5, 1.0, 0.1), (2, 2), None),
            None,
            "settling"
        );
        assert_eq!(
            c.observe(sim.window(2, 0.5, 1.0, 0.1), (2, 2), None)
                .unwrap()
                .workers,
            3
        );
        c.observe(sim.window(3, 0.5, 1.0, 0.1), (3, 2), None);
        assert_eq!(
            c.observe(sim.window(3, 0.5, 1.0, 0.1), (3, 2), None),
            None,
            "at the cores"
        );
    }

    #[test]
    fn busy_cores_or_the_memory_budget_stop_growth() {
        let mut c = Controller::new(8, 100);
        let mut sim = Sim::new();
        c.observe(sim.window(2, 0.0, 0.0, 0.0), (2, 2), None);
        // Every core is used: another worker would only take time from the others.
        assert_eq!(c.observe(sim.window(2, 0.5, 1.0, 7.8), (2, 2), None), None);
        // The budget holds two batches: two workers with one batch each at most.
        let mut c = Controller::new(8, 2);
        c.observe(sim.window(2, 0.0, 0.0, 0.0), (2, 1), None);
        assert_eq!(c.observe(sim.window(2, 0.5, 1.0, 0.1), (2, 1), None), None);
    }

    #[test]
    fn with_the_cores_busy_the_gpu_takes_a_larger_share_and_gives_it_back_when_not_needed() {
        let mut c = Controller::new(3, 100);
        let mut sim = Sim::new();
        c.observe(sim.window(3, 0.0, 0.0, 0.0), (3, 2), Some(0.0));
        // Starved, every worker busy, no core left: the device decodes a tenth more.
        let d = c
            .observe(sim.window(3, 0.5, 1.0, 3.0), (3, 2), Some(0.0))
            .unwrap();
        assert_eq!(
            (d.workers, d.prefetch, d.gpu_decode_share),
            (3, 2, Some(0.1))
        );
        assert!(d.reason.contains("GPU"), "{}", d.reason);
        c.observe(sim.window(3, 0.5, 1.0, 3.0), (3, 2), Some(0.1)); // settling
        let d = c
            .observe(sim.window(3, 0.5, 1.0, 3.0), (3, 2), Some(0.9))
            .unwrap();
        assert_eq!(d.gpu_decode_share, Some(1.0));
        c.observe(sim.window(3, 0.5, 1.0, 3.0), (3, 2), Some(1.0));
        assert_eq!(
            c.observe(sim.window(3, 0.5, 1.0, 3.0), (3, 2), Some(1.0)),
            None,
            "all on the GPU already"
        );
        // The consumer keeps up and the workers have slack: the share goes down first.
        let d = c
            .observe(sim.window(3, 0.0, 0.3, 1.0), (3, 2), Some(0.3))
            .unwrap();
        assert_eq!((d.workers, d.gpu_decode_share), (3, Some(0.2)));
        // Without GPU decoding, busy cores stop growth as before.
        let mut c = Controller::new(3, 100);
        c.observe(sim.window(3, 0.0, 0.0, 0.0), (3, 2), None);
        assert_eq!(c.observe(sim.window(3, 0.5, 1.0, 3.0), (3, 2), None), None);
    }

    #[test]
    fn starved_with_idle_workers_deepens_prefetch_within_bounds() {
        let mut c = Controller::new(8, 100);
        let mut sim = Sim::new();
        c.observe(sim.window(2, 0.0, 0.0, 0.0), (2, 2), None);
        let d = c
            .observe(sim.window(2, 0.3, 0.5, 1.0), (2, 2), None)
            .unwrap();
        assert_eq!((d.workers, d.prefetch), (2, 3));
        let mut c = Controller::new(8, 100);
        c.observe(sim.window(2, 0.0, 0.0, 0.0), (2, MAX_PREFETCH), None);
        assert_eq!(
            c.observe(sim.window(2, 0.3, 0.5, 1.0), (2, MAX_PREFETCH), None),
            None
        );
    }

    #[test]
    fn a_deeper_prefetch_that_does_not_raise_readiness_goes_back_and_is_not_tried_again() {
        let mut c = Controller::new(8, 100);
        let mut sim = Sim::new();
        c.observe(sim.window(2, 0.0, 0.0, 0.0), (2, 2), None);
        let d = c
            .observe(sim.window(2, 0.3, 0.5, 1.0), (2, 2), None)
            .unwrap();
        assert_eq!(d.prefetch, 3);
        assert_eq!(
            c.observe(sim.window(2, 0.3, 0.5, 1.0), (2, 3), None),
            None,
            "settling"
        );
        let d = c
            .observe(sim.window(2, 0.3, 0.5, 1.0), (2, 3), None)
            .unwrap();
        assert_eq!((d.workers, d.prefetch), (2, 2), "{}", d.reason);
        assert!(d.reason.contains("did not help"));
        c.observe(sim.window(2, 0.3, 0.5, 1.0), (2, 2), None);
        for _ in 0..4 {
            assert_eq!(c.observe(sim.window(2, 0.3, 0.5, 1.0), (2, 2), None), None);
        }
    }

    #[test]
    fn a_deeper_prefetch_that_helps_is_kept_and_the_next_one_tried() {
        let mut c = Controller::new(8, 100);
        let mut sim = Sim::new();
        c.observe(sim.window(2, 0.0, 0.0, 0.0), (2, 2), None);
        assert_eq!(
            c.observe(sim.window(2, 0.3, 0.5, 1.0), (2, 2), None)
                .unwrap()
                .prefetch,
            3
        );
        c.observe(sim.window(2, 0.2, 0.5, 1.0), (2, 3), None);
        assert_eq!(
            c.observe(sim.window(2, 0.2, 0.5, 1.0), (2, 3), None),
            None,
            "kept"
        );
        assert_eq!(
            c.observe(sim.window(2, 0.2, 0.5, 1.0), (2, 3), None)
                .unwrap()
                .prefetch,
            4
        );
    }

    #[test]
    fn sheds_a_worker_when_the_consumer_is_the_bottleneck() {
        let mut c = Controller::new(8, 100);
        let mut sim = Sim::new();
        c.observe(sim.window(4, 0.0, 0.0, 0.0), (4, 2), None);
        let d = c
            .observe(sim.window(4, 0.0, 0.3, 1.2), (4, 2), None)
            .unwrap();
        assert_eq!(d.workers, 3);
        assert!(d.reason.contains("consumer"));
        // Busy workers are kept even when the consumer keeps up.
        let mut c = Controller::new(8, 100);
        c.observe(sim.window(2, 0.0, 0.0, 0.0), (2, 2), None);
        assert_eq!(c.observe(sim.window(2, 0.0, 0.8, 1.6), (2, 2), None), None);
    }

    #[test]
    fn short_windows_wait_for_more() {
        let mut c = Controller::new(8, 100);
        let t0 = Instant::now();
        let obs = |ms: u64, batches: u64| Observation {
            at: t0 + Duration::from_millis(ms),
            batches,
            wait_ns: ms * 900_000,
            busy_ns: ms * 1_000_000,
            cpu_ns: 0,
        };
        c.observe(obs(0, 0), (1, 2), None);
        assert!(!c.due(t0 + Duration::from_millis(50)));
        assert_eq!(c.observe(obs(100, 10), (1, 2), None), None, "too short");
        assert_eq!(
            c.observe(obs(300, 2), (1, 2), None),
            None,
            "too few batches"
        );
        assert!(
            c.observe(obs(2500, 3), (1, 2), None).is_some(),
            "long enough with one batch"
        );
    }

    #[test]
    fn process_cpu_time_advances() {
        let a = process_cpu_ns();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(process_cpu_ns() > a);
    }
}
