//! What else runs on this process's cores. On a machine shared with other work, a worker gets
//! the share of a core the scheduler gives it, not a core, and more workers do not always get
//! more cores: Linux's autogroup shares the CPU fairly among sessions (a build in another
//! terminal gets as much as this whole process, whatever its thread count), cgroup quotas and
//! hypervisors cap it too. The model needs what the workers will actually get, so it is
//! measured, whatever the policy:
//! - one thread's share: the CPU time one spinning thread gets;
//! - the whole process's: the CPU time it gets with a thread spinning on every core;
//!
//! back to back ([`probe_cpu`]: one thread, all, one again, under a second), so that both see
//! the same other work.
//!
//! Between the two, `n` threads get `n` times one thread's share, up to the whole process's.
//! Other work's CPU time (`/proc/stat` less this process's own) is reported beside them.
//!
//! Copying is bound by memory bandwidth, which the cores share: [`copy_parallelism`] measures
//! how many threads' worth of copying the memory system sustains at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use stoker_core::autotune::process_cpu_ns;

/// Bytes each thread copies per pass when measuring bandwidth: more than caches hold.
const COPY_BYTES: usize = 32 << 20;
/// Threads at most in the bandwidth measurement (its buffers take 64 MiB each).
pub(crate) const MAX_COPY_THREADS: usize = 8;
/// How long [`probe_cpu`] spins with one thread (twice), and with one on every core.
const SPIN_ONE: Duration = Duration::from_millis(200);
const SPIN_ALL: Duration = Duration::from_millis(400);

/// What this process gets of its cores beside other work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Load {
    /// Cores' worth of CPU time other processes used while the stages were measured.
    pub(crate) others_cores: f64,
    /// The share of a core one thread of ours gets (1: it never waits for one).
    pub(crate) on_cpu: f64,
    /// Cores' worth of CPU time this process got with a thread on every core (infinite: not
    /// measured).
    pub(crate) available: f64,
}

impl Load {
    /// An idle machine.
    #[cfg(test)]
    pub(crate) const IDLE: Load = Load {
        others_cores: 0.0,
        on_cpu: 1.0,
        available: f64::INFINITY,
    };

    /// Cores' worth of CPU `runnable` CPU-hungry threads of ours get on `cores` cores: each
    /// what one got, together at most what a thread on every core got.
    pub(crate) fn cores_for(&self, runnable: f64, cores: usize) -> f64 {
        let one = self.on_cpu.clamp(0.01, 1.0);
        (runnable.max(0.0) * one)
            .min(self.available.max(one))
            .min(cores as f64)
    }

    /// The share of a core each of `runnable` CPU-hungry threads of ours gets.
    pub(crate) fn share(&self, runnable: f64, cores: usize) -> f64 {
        if runnable <= 1.0 {
            return self.on_cpu.clamp(0.01, 1.0);
        }
        self.cores_for(runnable, cores) / runnable
    }
}

/// The share of a core one thread of this process gets right now, and the cores' worth of CPU
/// time the process gets when it asks for all `cores`: threads spinning for a fraction of a
/// second.
pub(crate) fn probe_cpu(cores: usize) -> (f64, f64) {
    // One thread before and after: other work that comes or goes meanwhile weighs alike.
    let before = spin(1, SPIN_ONE);
    let all = spin(cores, SPIN_ALL);
    let one = ((before + spin(1, SPIN_ONE)) / 2.0).min(1.0);
    (one, all.max(one))
}

/// Cores' worth of CPU time `threads` spinning threads get over `period`.
fn spin(threads: usize, period: Duration) -> f64 {
    let stop = AtomicBool::new(false);
    let (start, cpu0) = (Instant::now(), process_cpu_ns());
    let (cpu1, secs) = std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                let mut x = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..1000 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                }
            });
        }
        std::thread::sleep(period);
        // Read while the threads still spin: their CPU time so far over the time so far.
        let read = (process_cpu_ns(), start.elapsed().as_secs_f64());
        stop.store(true, Ordering::Relaxed);
        read
    });
    (cpu1.saturating_sub(cpu0) as f64 / 1e9 / secs.max(1e-9)).clamp(0.0, threads.max(1) as f64)
}

/// How many threads' worth of copying memory sustains with `threads` copying at once: their
/// bandwidth together over one thread's, between 1 and `threads` (at most
/// [`MAX_COPY_THREADS`] measured; more are assumed to add nothing).
pub(crate) fn copy_parallelism(threads: usize) -> f64 {
    let threads = threads.clamp(1, MAX_COPY_THREADS);
    if threads == 1 {
        return 1.0;
    }
    // Best of two: other work only ever lowers a bandwidth.
    let best = |n| f64::max(copy_bandwidth(n), copy_bandwidth(n));
    let one = best(1);
    let all = best(threads);
    (all / one.max(1e-9)).clamp(1.0, threads as f64)
}

/// Bytes per second of CPU time `threads` threads copy together, each between its own two
/// buffers: each thread's bytes over its own CPU time, summed. CPU time, not wall time, so that
/// a thread the scheduler leaves waiting (other work on a shared machine) does not read as
/// slow memory: a copy stalled on memory still runs on its core, so CPU time keeps the
/// bandwidth contention and drops only the waiting, which [`probe_cpu`] measures on its own.
fn copy_bandwidth(threads: usize) -> f64 {
    const PASSES: usize = 6;
    let start = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let src = vec![1u8; COPY_BYTES];
                    let mut dst = vec![0u8; COPY_BYTES];
                    dst.copy_from_slice(&src); // the pages faulted in before timing
                    start.wait();
                    let cpu = thread_cpu();
                    for _ in 0..PASSES {
                        dst.copy_from_slice(std::hint::black_box(&src));
                        std::hint::black_box(&mut dst);
                    }
                    (PASSES * COPY_BYTES) as f64 / (thread_cpu() - cpu).as_secs_f64().max(1e-9)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    })
}

/// Other work's CPU time on this process's cores over an interval: [`Usage::start`], then
/// [`Usage::others_cores`].
pub(crate) struct Usage {
    at: Instant,
    busy: Option<u64>,
    ours: u64,
}

impl Usage {
    pub(crate) fn start() -> Usage {
        Usage {
            at: Instant::now(),
            busy: cores_busy_ns(),
            ours: process_cpu_ns(),
        }
    }

    /// Cores' worth of CPU time other processes used since the start (0 where `/proc/stat`
    /// cannot be read).
    pub(crate) fn others_cores(&self) -> f64 {
        let secs = self.at.elapsed().as_secs_f64().max(1e-9);
        let ours = process_cpu_ns().saturating_sub(self.ours);
        match (self.busy, cores_busy_ns()) {
            (Some(b0), Some(b1)) => b1.saturating_sub(b0).saturating_sub(ours) as f64 / 1e9 / secs,
            _ => 0.0,
        }
    }
}

/// The busy time, in nanoseconds, of the cores this process may run on: every process's user,
/// system, interrupt and stolen time from `/proc/stat`. `None` where it cannot be read.
pub(crate) fn cores_busy_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return None;
    }
    let allowed = affinity();
    let jiffies = busy_jiffies(&stat, |cpu| {
        allowed.as_ref().is_none_or(|a| a.contains(&cpu))
    })?;
    Some(jiffies.saturating_mul(1_000_000_000) / ticks as u64)
}

/// The CPUs of this process's affinity mask.
fn affinity() -> Option<Vec<usize>> {
    // SAFETY: `cpu_set_t` is plain data, valid when zeroed; sched_getaffinity writes at most
    // `size_of::<cpu_set_t>()` bytes into it, and CPU_ISSET only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
        Some((0..max).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect())
    }
}

/// The busy jiffies of the `cpuN` lines of `/proc/stat` whose N `include` accepts: user, nice,
/// system, irq, softirq and steal (guest time is already in user).
fn busy_jiffies(stat: &str, include: impl Fn(usize) -> bool) -> Option<u64> {
    let mut total = 0u64;
    let mut seen = false;
    for line in stat.lines() {
        let mut fields = line.split_whitespace();
        let Some(cpu) = fields
            .next()
            .and_then(|name| name.strip_prefix("cpu"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if !include(cpu) {
            continue;
        }
        let v: Vec<u64> = fields.map(|f| f.parse().unwrap_or(0)).collect();
        // user nice system idle iowait irq softirq steal ...
        let busy = [0, 1, 2, 5, 6, 7]
            .iter()
            .map(|&i| v.get(i).copied().unwrap_or(0))
            .sum::<u64>();
        total = total.saturating_add(busy);
        seen = true;
    }
    seen.then_some(total)
}

/// This thread's time on a CPU and waiting for one (runnable but not running: cores shared with
/// other work), from Linux's schedstat; without it, the CPU time alone.
pub(crate) fn thread_times() -> (Duration, Duration) {
    let sched = std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|f| f.parse::<u64>().ok());
            Some((it.next()??, it.next()??))
        });
    match sched {
        Some((run, wait)) => (Duration::from_nanos(run), Duration::from_nanos(wait)),
        None => (thread_cpu(), Duration::ZERO),
    }
}

/// This thread's CPU time.
pub(crate) fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux defines.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_machine_gives_whole_cores() {
        assert_eq!(Load::IDLE.cores_for(1.0, 2), 1.0);
        assert_eq!(Load::IDLE.cores_for(2.0, 2), 2.0);
        assert_eq!(Load::IDLE.share(2.0, 2), 1.0);
        assert_eq!(
            Load::IDLE.share(4.0, 2),
            0.5,
            "our own threads share the cores"
        );
    }

    #[test]
    fn more_threads_get_no_more_than_the_process_got() {
        // Group scheduling beside one busy session on 2 cores: one thread runs freely, but
        // the whole process gets one core.
        let load = Load {
            others_cores: 1.0,
            on_cpu: 1.0,
            available: 1.0,
        };
        assert_eq!(load.cores_for(1.0, 2), 1.0);
        assert_eq!(load.cores_for(2.0, 2), 1.0);
        assert_eq!(load.share(2.0, 2), 0.5);
        // Thread-fair sharing beside two busy threads: 2/3 of a core for one, 1 for two.
        let load = Load {
            others_cores: 4.0 / 3.0,
            on_cpu: 2.0 / 3.0,
            available: 1.0,
        };
        assert!((load.share(1.0, 2) - 2.0 / 3.0).abs() < 1e-9);
        assert!((load.cores_for(2.0, 2) - 1.0).abs() < 1e-9);
        // Half a thread's worth of CPU work gets its share of a core.
        assert!((load.share(0.5, 2) - 2.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn spinning_threads_get_some_cpu_and_no_more_than_the_cores() {
        let (one, all) = probe_cpu(2);
        assert!(one > 0.0 && one <= 1.0, "{one}");
        assert!(all >= one && all <= 2.0, "{all}");
    }

    #[test]
    fn copy_parallelism_is_between_one_and_the_threads() {
        assert_eq!(copy_parallelism(1), 1.0);
        let p = copy_parallelism(2);
        assert!((1.0..=2.0).contains(&p), "{p}");
    }

    #[test]
    fn proc_stat_busy_time_of_the_allowed_cpus() {
        let stat = "cpu  30 3 30 900 9 3 3 3 0 0\n\
                    cpu0 10 1 10 300 3 1 1 1 0 0\n\
                    cpu1 20 2 20 600 6 2 2 2 0 0\n\
                    intr 12345\n";
        assert_eq!(busy_jiffies(stat, |_| true), Some(24 + 48));
        assert_eq!(busy_jiffies(stat, |cpu| cpu == 1), Some(48));
        assert_eq!(busy_jiffies("intr 1\n", |_| true), None);
        assert!(cores_busy_ns().is_some(), "this is Linux");
    }
}
