//! The memory budget (`memory_budget`): a bound on the batch memory a loader keeps — slabs being
//! built, finished and waiting for the consumer, and idle ones kept for reuse.
//!
//! The budget is checked against the size of one batch when the loader is made: a batch that
//! does not fit is an error naming both numbers, and the in-flight cap
//! (`num_workers × prefetch_factor`) is lowered to the number of batches that fit. While the
//! loader runs, the arena unmaps a released slab instead of keeping it idle when the memory it
//! holds is over the budget (which bounds ragged batches, whose size is only known when built).
//! The budget is a ceiling, not a target: the loader builds ahead only as deep as its consumer
//! needs (the in-flight depth, `loader/depth.rs`) and keeps idle only the slabs recent demand
//! used (`arena`).
//!
//! Not counted: batches the consumer holds (they are its memory until released), the workers'
//! reused read and decode buffers (one image each, bounded by `max_image_pixels`), and device
//! memory.
//!
//! The default is half of physical memory (or of the cgroup's memory limit, if lower), shared
//! by the processes of this node: divided by `LOCAL_WORLD_SIZE` (torchrun) or
//! `OMPI_COMM_WORLD_LOCAL_SIZE` (Open MPI) when set.

use bytesize::ByteSize;

use crate::error::{Error, Result};

/// How a byte size is written, for messages (bytesize's own names its internals: "couldn't
/// parse ... into a known SI unit").
pub(crate) const SIZE_WORDS: &str = "a number and B, KB, MB, GB, TB, KiB, MiB, GiB or TiB";

/// `memory_budget` as given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoryBudget {
    /// A number of bytes, more than 0.
    Bytes(u64),
    /// A percentage of physical memory, in (0, 100].
    Percent(f64),
}

/// Fraction of physical memory the default budget takes, before dividing by the local ranks.
pub const DEFAULT_FRACTION: f64 = 0.5;

impl MemoryBudget {
    /// Parses `8GiB`, `500MB`, `1073741824` or `25%`.
    pub fn parse(key: &str, v: &str) -> Result<MemoryBudget> {
        if let Some(p) = v.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| {
                Error::option(key, format!("`{v}` is not a percentage such as 25%"))
            })?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(Error::option(
                    key,
                    format!("{p}% is out of range (0%, 100%]"),
                ));
            }
            return Ok(MemoryBudget::Percent(p));
        }
        let bytes: ByteSize = v.parse().map_err(|_| {
            Error::option(
                key,
                format!(
                    "`{v}` is not a size such as 8GiB, 500MB or 25% ({}, or a percentage)",
                    SIZE_WORDS
                ),
            )
        })?;
        if bytes.as_u64() == 0 {
            return Err(Error::option(key, "the budget must be more than 0 bytes"));
        }
        Ok(MemoryBudget::Bytes(bytes.as_u64()))
    }

    /// The budget in bytes on this machine.
    pub fn bytes(self) -> u64 {
        match self {
            MemoryBudget::Bytes(b) => b,
            MemoryBudget::Percent(p) => (physical_memory() as f64 * p / 100.0) as u64,
        }
    }
}

/// The default budget: [`DEFAULT_FRACTION`] of physical memory, divided by the processes of
/// this node ([`local_world_size`]).
pub fn default_budget() -> u64 {
    (physical_memory() as f64 * DEFAULT_FRACTION) as u64 / local_world_size()
}

/// Processes sharing this node's memory: `LOCAL_WORLD_SIZE` (torchrun), else
/// `OMPI_COMM_WORLD_LOCAL_SIZE` (Open MPI), else 1.
pub fn local_world_size() -> u64 {
    local_world_size_in(|var| std::env::var(var).ok())
}

fn local_world_size_in(env: impl Fn(&str) -> Option<String>) -> u64 {
    ["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"]
        .iter()
        .find_map(|var| env(var).and_then(|v| v.trim().parse::<u64>().ok()))
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// Physical memory in bytes, or the cgroup's memory limit when lower (a container sees the
/// host's RAM in `sysconf` but is killed at its limit).
pub fn physical_memory() -> u64 {
    // Miri, which runs the loader's tests, models neither this sysconf nor /sys: say 8 GiB.
    if cfg!(miri) {
        return 8 << 30;
    }
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let phys = if pages > 0 && page > 0 {
        (pages as u64).saturating_mul(page as u64)
    } else {
        // Unknown: assume a small machine rather than an unbounded one.
        8 << 30
    };
    // cgroup v2, then v1 ("max" or a huge number means no limit).
    let limit = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    });
    match limit {
        Some(l) if l > 0 => phys.min(l),
        _ => phys,
    }
}

/// How many batches the budget lets the loader keep, and what it reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetPlan {
    /// The budget, in bytes.
    pub budget: u64,
    /// One batch's slab, rounded up to whole pages (a lower bound for ragged fields).
    pub batch_bytes: u64,
    /// The in-flight cap asked for: `max(1, num_workers) × prefetch_factor`.
    pub requested_cap: usize,
    /// The cap the loader uses: the requested one, lowered to what fits.
    pub cap: usize,
}

impl BudgetPlan {
    /// Fits `requested_cap` batches of `batch_bytes` into `budget`, keeping `reserved` slabs
    /// outside the cap (the ones the prefetch thread holds while their copies run). Fails when not even one
    /// batch fits.
    pub fn new(
        budget: u64,
        batch_bytes: u64,
        requested_cap: usize,
        reserved: usize,
        batch_size: usize,
    ) -> Result<BudgetPlan> {
        let fit = budget / batch_bytes.max(1);
        let needed = 1 + reserved as u64;
        if fit < needed {
            return Err(Error::option(
                "memory_budget",
                format!(
                    "one batch of {batch_size} samples takes {} ({batch_bytes} bytes) and the loader needs {needed} of them at least, but the budget is {} ({budget} bytes); raise memory_budget or lower batch_size",
                    human(batch_bytes),
                    human(budget),
                ),
            ));
        }
        let fit = usize::try_from(fit - reserved as u64).unwrap_or(usize::MAX);
        Ok(BudgetPlan {
            budget,
            batch_bytes,
            requested_cap,
            cap: requested_cap.min(fit).max(1),
        })
    }

    /// How many batches of this size fit, beyond `reserved`.
    pub fn fit(&self, reserved: usize) -> usize {
        usize::try_from((self.budget / self.batch_bytes.max(1)).saturating_sub(reserved as u64))
            .unwrap_or(usize::MAX)
    }
}

/// `8.0 GiB`.
pub fn human(bytes: u64) -> String {
    ByteSize::b(bytes).display().iec().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_and_percentages() {
        let p = |v: &str| MemoryBudget::parse("memory_budget", v);
        assert_eq!(p("8GiB").unwrap(), MemoryBudget::Bytes(8 << 30));
        assert_eq!(p("500MB").unwrap(), MemoryBudget::Bytes(500_000_000));
        assert_eq!(p("4096").unwrap(), MemoryBudget::Bytes(4096));
        assert_eq!(p("25%").unwrap(), MemoryBudget::Percent(25.0));
        for bad in ["0", "lots", "-3GiB", "0%", "101%", "x%"] {
            let e = p(bad).unwrap_err().to_string();
            assert!(e.contains("`memory_budget`"), "{bad}: {e}");
        }
        let half = MemoryBudget::Percent(50.0).bytes();
        assert!(half > 0 && half <= physical_memory() / 2 + 1);
    }

    #[test]
    fn the_cap_is_lowered_to_what_fits() {
        let plan = BudgetPlan::new(10 << 20, 1 << 20, 16, 0, 8).unwrap();
        assert_eq!((plan.cap, plan.requested_cap), (10, 16));
        let plan = BudgetPlan::new(10 << 20, 1 << 20, 4, 0, 8).unwrap();
        assert_eq!(plan.cap, 4, "a cap that fits is kept");
        let plan = BudgetPlan::new(3 << 20, 1 << 20, 16, 1, 8).unwrap();
        assert_eq!(plan.cap, 2, "the prefetcher's slab is reserved");
    }

    #[test]
    fn a_batch_that_does_not_fit_names_the_numbers() {
        let e = BudgetPlan::new(1 << 20, 3 << 20, 4, 0, 256)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`memory_budget`"), "{e}");
        assert!(e.contains("256 samples"), "{e}");
        assert!(
            e.contains("3145728 bytes") && e.contains("1048576 bytes"),
            "{e}"
        );
        assert!(e.contains("3.0 MiB") && e.contains("1.0 MiB"), "{e}");
        // With a device, the prefetcher's slab must fit too.
        assert!(BudgetPlan::new(4 << 20, 3 << 20, 4, 1, 256).is_err());
    }

    #[test]
    fn local_ranks_come_from_torchrun_or_open_mpi() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |var: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == var)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(local_world_size_in(env(&[])), 1);
        assert_eq!(local_world_size_in(env(&[("LOCAL_WORLD_SIZE", "8")])), 8);
        assert_eq!(
            local_world_size_in(env(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "4")])),
            4
        );
        assert_eq!(
            local_world_size_in(env(&[
                ("LOCAL_WORLD_SIZE", "2"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
            ])),
            2
        );
        assert_eq!(local_world_size_in(env(&[("LOCAL_WORLD_SIZE", "0")])), 1);
        assert_eq!(local_world_size_in(env(&[("LOCAL_WORLD_SIZE", "x")])), 1);
    }

    #[test]
    fn the_default_is_shared_by_the_local_ranks() {
        // Whatever this process's environment says, the default is a share of half the memory.
        let n = local_world_size();
        let expected = (physical_memory() as f64 * DEFAULT_FRACTION) as u64 / n;
        assert_eq!(default_budget(), expected);
    }
}
