//! Which process of a distributed job this is: rank, world size, local rank and local world
//! size, from explicit options or from the variables the launcher set.
//!
//! stoker never starts processes itself: torchrun, Slurm's `srun`, Open MPI's `mpirun` and
//! PMI-based launchers (MPICH/Intel MPI's hydra, `srun --mpi=pmi2`) already say, in the
//! environment of each process they start, which one it is. [`detect`] reads them from an
//! environment given as a function, so every rule here is testable without touching the real
//! environment; [`resolve`] reads the process's own.
//!
//! The rules:
//! - explicit `rank` / `world_size` win over any variable;
//! - each launcher's variables must be complete (a rank without a size is an error) and
//!   consistent (`rank < world_size`, `local_rank < local_world_size <= world_size`);
//! - when several launchers' variables are present, the innermost launcher started this
//!   process, in the order torchrun, Open MPI, PMI, Slurm (torchrun is commonly started by
//!   `srun` or `mpirun`, one per node, and starts the trainers itself). An outer
//!   launcher's world can't hold more processes than the inner one's, and two MPI-style launchers
//!   (Open MPI, PMI, Slurm) describing worlds of the same size describe the same processes, so
//!   they must give the same rank; anything else is an error naming the variables, because it
//!   means stale variables (an `export RANK=0` left in a shell profile, say) that would make
//!   ranks read overlapping shards.

use crate::error::{Error, Result};

/// Who said which process this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// No launcher variables and no explicit values: a single process.
    None,
    /// `rank` and `world_size` were both set explicitly.
    Explicit,
    /// torchrun / `torch.distributed.run` (also `torch.multiprocessing` code that sets the same
    /// variables).
    Torchrun,
    /// Slurm's `srun`.
    Slurm,
    /// Open MPI's `mpirun` / `mpiexec`.
    OpenMpi,
    /// A PMI launcher: MPICH or Intel MPI's hydra `mpiexec`, `srun --mpi=pmi2`.
    Pmi,
}

impl Launcher {
    /// The name stats and messages use.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::None => "none",
            Launcher::Explicit => "explicit",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "slurm",
            Launcher::OpenMpi => "openmpi",
            Launcher::Pmi => "pmi",
        }
    }

    /// The number the C ABI's `stoker_launcher` gives it.
    pub fn code(self) -> u64 {
        match self {
            Launcher::None => 0,
            Launcher::Explicit => 1,
            Launcher::Torchrun => 2,
            Launcher::Slurm => 3,
            Launcher::OpenMpi => 4,
            Launcher::Pmi => 5,
        }
    }
}

impl std::fmt::Display for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// This process's place in the job, as resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank in the job, below `world_size`.
    pub rank: usize,
    /// Processes in the job.
    pub world_size: usize,
    /// Rank among the processes of this node: `device=cuda` means `cuda:local_rank`.
    pub local_rank: usize,
    /// Processes of this job on this node: `num_workers=auto` divides the cores by it.
    pub local_world_size: usize,
    /// Who said so.
    pub launcher: Launcher,
}

impl Launch {
    /// One process, no launcher.
    pub const SINGLE: Launch = Launch {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        local_world_size: 1,
        launcher: Launcher::None,
    };
}

/// A rank's equal share of each epoch: of `total` items (samples of a global order, or of the
/// shards laid end to end), every rank gets [`per_rank`](Self::per_rank) of them —
/// `ceil(total / world_size)`, the shortfall padded by repeating the head of the sequence, as
/// `DistributedSampler` pads, or `floor` with `drop_last` (`shard_drop_last`), the tail dropped.
/// Equal shares are equal batch counts, so no rank of a job waits at the end of an epoch for
/// another.
///
/// Which items make up the share is the reader's choice, and the two readers differ: the
/// sampler deals the global order strided ([`strided`](Self::strided): rank `r` takes every
/// `world_size`-th entry from `r`, `DistributedSampler`'s `indices[rank::world_size]`), while a
/// stream takes one contiguous run from [`run_start`](Self::run_start) (`r · per_rank`, wrapping
/// past the end), so that it reads whole runs of a shard sequentially.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankShare {
    /// This process's rank, `< world_size`.
    pub rank: usize,
    /// Number of ranks (`num_replicas`), at least 1.
    pub world_size: usize,
    /// Drop the tail instead of padding (`DistributedSampler(drop_last=True)`,
    /// `shard_drop_last`).
    pub drop_last: bool,
}

impl RankShare {
    /// One process: everything.
    pub const SINGLE: RankShare = RankShare {
        rank: 0,
        world_size: 1,
        drop_last: false,
    };

    /// The share of `launch`'s rank.
    pub fn of(launch: &Launch, drop_last: bool) -> RankShare {
        RankShare {
            rank: launch.rank,
            world_size: launch.world_size,
            drop_last,
        }
    }

    /// An error (option `key`) unless `0 <= rank < world_size`.
    pub(crate) fn check(&self, key: &str) -> Result<()> {
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(Error::option(
                key,
                format!(
                    "rank {} is out of range for world_size {} (need 0 <= rank < world_size)",
                    self.rank, self.world_size
                ),
            ));
        }
        Ok(())
    }

    /// Items each rank gets of `total` (`DistributedSampler.num_samples`).
    pub fn per_rank(&self, total: usize) -> usize {
        // With drop_last, torch's `ceil((m - world) / world)` equals `floor(m / world)` whenever
        // `m % world != 0`, and both are `m / world` when it divides.
        if self.drop_last {
            total / self.world_size
        } else {
            total.div_ceil(self.world_size)
        }
    }

    /// This rank's entries of `order` (a whole epoch, or the rest of one), dealt strided:
    /// entry `j` of the share is `order[(rank + j · world_size) % len]`.
    pub fn strided(&self, order: &[usize]) -> Vec<usize> {
        let m = order.len();
        (0..self.per_rank(m))
            .map(|j| order[(self.rank + j * self.world_size) % m])
            .collect()
    }

    /// Where this rank's contiguous run of `per_rank` items starts in the sequence of all
    /// items (positions past the end wrap around to its start).
    pub fn run_start(&self, per_rank: usize) -> u64 {
        self.rank as u64 * per_rank as u64
    }
}

/// The other way of dealing a global order, for token streams: cut it into global batches of
/// `size` entries and give rank `r` of `W` the contiguous slice `[r·size/W, (r+1)·size/W)` of
/// every one. Global batch `b` is then the same entries in the same order whatever the world
/// size, the worker count or the micro-batch size, and the job's position after `k` global
/// batches is `k · size` entries at any world size. An epoch is its whole global batches: the
/// tail shorter than one global batch is not delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalBatches {
    /// This process's rank, `< world_size`.
    pub rank: usize,
    /// Number of ranks, at least 1, dividing `size`.
    pub world_size: usize,
    /// Entries in one global batch (`global_batch_size`).
    pub size: usize,
}

impl GlobalBatches {
    /// The deal of `size`-entry global batches to `share`'s rank, in micro-batches of
    /// `batch_size`: `size` must divide by `world_size × batch_size` (an error naming the
    /// numbers otherwise).
    pub fn new(share: RankShare, size: usize, batch_size: usize) -> Result<GlobalBatches> {
        share.check("rank")?;
        let per_step = share.world_size.checked_mul(batch_size);
        if size == 0 || per_step.is_none_or(|p| p == 0 || !size.is_multiple_of(p)) {
            return Err(Error::option(
                "global_batch_size",
                format!(
                    "{size} does not divide into world_size {} × batch_size {batch_size}: each \
                     rank takes an equal slice of every global batch, cut into whole micro-batches",
                    share.world_size
                ),
            ));
        }
        Ok(GlobalBatches {
            rank: share.rank,
            world_size: share.world_size,
            size,
        })
    }

    /// Entries of one global batch this rank takes (`size / world_size`).
    pub fn slice(&self) -> usize {
        self.size / self.world_size
    }

    /// Entries this rank takes of `total` entries: a slice of every whole global batch.
    pub fn per_rank(&self, total: usize) -> usize {
        total / self.size * self.slice()
    }

    /// This rank's entries of `order`, global batch after global batch.
    pub fn dealt(&self, order: &[usize]) -> Vec<usize> {
        let slice = self.slice();
        order
            .chunks_exact(self.size)
            .flat_map(|batch| &batch[self.rank * slice..(self.rank + 1) * slice])
            .copied()
            .collect()
    }

    /// The entry of the global order (counted from where dealing started) that this rank's
    /// `j`-th entry is.
    pub fn position(&self, j: usize) -> usize {
        let slice = self.slice();
        (j / slice) * self.size + self.rank * slice + j % slice
    }
}

/// The variables one launcher sets, in precedence order (innermost launcher first).
struct Vars {
    launcher: Launcher,
    rank: &'static str,
    /// Alternatives, first present wins.
    size: &'static [&'static str],
    local_rank: &'static str,
    local_size: &'static [&'static str],
}

const LAUNCHERS: [Vars; 4] = [
    Vars {
        launcher: Launcher::Torchrun,
        rank: "RANK",
        size: &["WORLD_SIZE"],
        local_rank: "LOCAL_RANK",
        local_size: &["LOCAL_WORLD_SIZE"],
    },
    Vars {
        launcher: Launcher::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: &["OMPI_COMM_WORLD_SIZE"],
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: &["OMPI_COMM_WORLD_LOCAL_SIZE"],
    },
    Vars {
        launcher: Launcher::Pmi,
        rank: "PMI_RANK",
        size: &["PMI_SIZE"],
        // Set by hydra (MPICH, Intel MPI) next to PMI_RANK.
        local_rank: "MPI_LOCALRANKID",
        local_size: &["MPI_LOCALNRANKS"],
    },
    Vars {
        launcher: Launcher::Slurm,
        rank: "SLURM_PROCID",
        // srun sets the step's task count in both; SLURM_NPROCS is the older spelling.
        size: &["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"],
        local_rank: "SLURM_LOCALID",
        // Read from SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE with SLURM_NODEID first
        // (see `slurm_local_size`); this is the fallback.
        local_size: &["SLURM_NTASKS_PER_NODE"],
    },
];

/// What one launcher's variables say, with the `NAME=value` text for messages.
#[derive(Clone, Debug)]
struct Seen {
    launcher: Launcher,
    rank: usize,
    world: usize,
    local: Option<(usize, usize)>,
    said: String,
}

/// The launch for explicit `rank` / `world_size` (`None`: `auto`) and the environment `env`.
pub fn detect(
    env: &dyn Fn(&str) -> Option<String>,
    rank: Option<usize>,
    world_size: Option<usize>,
) -> Result<Launch> {
    let detected = detect_launcher(env);
    let launch = match (rank, world_size) {
        (Some(rank), Some(world_size)) => {
            if rank >= world_size {
                return Err(Error::option(
                    "rank",
                    format!(
                        "rank {rank} is not below world_size {world_size} (both set explicitly)"
                    ),
                ));
            }
            // Explicit values win; a launcher that agrees on the world still says where on the
            // node this process is (for device=cuda and num_workers=auto).
            let (local_rank, local_world_size) = match &detected {
                Ok(Some(seen)) if seen.world == world_size => seen.local.unwrap_or((0, 1)),
                _ => (0, 1),
            };
            Launch {
                rank,
                world_size,
                local_rank,
                local_world_size,
                launcher: Launcher::Explicit,
            }
        }
        _ => {
            let seen = detected?;
            let (auto_rank, auto_world, local, launcher, said) = match seen {
                Some(s) => (s.rank, s.world, s.local, s.launcher, s.said),
                None => (0, 1, None, Launcher::None, "no launcher variables".into()),
            };
            let rank_v = rank.unwrap_or(auto_rank);
            let world_v = world_size.unwrap_or(auto_world);
            if rank_v >= world_v {
                let from = |explicit: bool, what: &str| {
                    if explicit {
                        format!("{what} set explicitly")
                    } else {
                        format!("{what} from {said}")
                    }
                };
                return Err(Error::option(
                    if rank.is_some() { "rank" } else { "world_size" },
                    format!(
                        "rank {rank_v} ({}) is not below world_size {world_v} ({}); set both \
                         rank and world_size, or neither",
                        from(rank.is_some(), "rank"),
                        from(world_size.is_some(), "world_size"),
                    ),
                ));
            }
            let (local_rank, local_world_size) = match local {
                Some(l) if world_size.is_none() || world_size == Some(auto_world) => l,
                _ => (0, 1),
            };
            Launch {
                rank: rank_v,
                world_size: world_v,
                local_rank,
                local_world_size,
                launcher,
            }
        }
    };
    Ok(launch)
}

/// [`detect`] on this process's environment.
pub fn resolve(rank: Option<usize>, world_size: Option<usize>) -> Result<Launch> {
    detect(&|k| std::env::var(k).ok(), rank, world_size)
}

/// The launcher that started this process, checked against the others whose variables are
/// present.
fn detect_launcher(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Seen>> {
    let mut present = Vec::new();
    for vars in &LAUNCHERS {
        if let Some(seen) = read_launcher(env, vars)? {
            present.push(seen);
        }
    }
    let Some((inner, outer)) = present.split_first() else {
        return Ok(None);
    };
    for other in outer {
        let same_processes = inner.launcher != Launcher::Torchrun && other.world == inner.world;
        if other.world > inner.world || (same_processes && other.rank != inner.rank) {
            return Err(Error::option(
                "rank",
                format!(
                    "the launchers' variables disagree: {} ({}) and {} ({}); unset the stale \
                     ones or set rank and world_size explicitly",
                    inner.said, inner.launcher, other.said, other.launcher
                ),
            ));
        }
    }
    Ok(Some(inner.clone()))
}

/// One launcher's variables: `None` when none of its rank and size variables is set.
fn read_launcher(env: &dyn Fn(&str) -> Option<String>, vars: &Vars) -> Result<Option<Seen>> {
    let rank = env(vars.rank);
    let size = first_set(env, vars.size);
    let (rank_s, (size_name, size_s)) = match (rank, size) {
        (None, None) => return Ok(None),
        (Some(r), Some(s)) => (r, s),
        (Some(r), None) => {
            return Err(Error::option(
                "world_size",
                format!(
                    "{}={r} is set but {} is not ({} variables are incomplete)",
                    vars.rank, vars.size[0], vars.launcher
                ),
            ))
        }
        (None, Some((name, s))) => {
            return Err(Error::option(
                "rank",
                format!(
                    "{name}={s} is set but {} is not ({} variables are incomplete)",
                    vars.rank, vars.launcher
                ),
            ))
        }
    };
    let rank = parse_var(vars.rank, &rank_s)?;
    let world = parse_var(size_name, &size_s)?;
    let mut said = format!("{}={rank_s}, {size_name}={size_s}", vars.rank);
    if world == 0 || rank >= world {
        return Err(Error::option(
            "rank",
            format!("{said}: the rank must be below the world size, which must be at least 1"),
        ));
    }
    let local_rank = env(vars.local_rank)
        .map(|v| parse_var(vars.local_rank, &v).map(|n| (n, v)))
        .transpose()?;
    let local_size = match vars.launcher {
        Launcher::Slurm => slurm_local_size(env)?,
        _ => None,
    };
    let local_size = match local_size {
        Some(found) => Some(found),
        None => first_set(env, vars.local_size)
            .map(|(name, v)| parse_var(name, &v).map(|n| (n, format!("{name}={v}"))))
            .transpose()?,
    };
    let local = match (local_rank, local_size) {
        (Some((lr, lr_s)), Some((ls, ls_said))) => {
            said.push_str(&format!(", {}={lr_s}, {ls_said}", vars.local_rank));
            if lr >= ls || ls > world {
                return Err(Error::option(
                    "rank",
                    format!(
                        "{said}: need local rank < local world size <= world size ({} variables)",
                        vars.launcher
                    ),
                ));
            }
            Some((lr, ls))
        }
        (Some((lr, lr_s)), None) => {
            // The node's process count is unknown: this process may use the node's cores.
            said.push_str(&format!(", {}={lr_s}", vars.local_rank));
            Some((lr, lr + 1))
        }
        _ => None,
    };
    Ok(Some(Seen {
        launcher: vars.launcher,
        rank,
        world,
        local,
        said,
    }))
}

/// Slurm's tasks on this node: entry `SLURM_NODEID` of `SLURM_STEP_TASKS_PER_NODE` (or
/// `SLURM_TASKS_PER_NODE`), a compressed list such as `2(x3),1`.
fn slurm_local_size(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<(usize, String)>> {
    let Some(node) = env("SLURM_NODEID") else {
        return Ok(None);
    };
    let node = parse_var("SLURM_NODEID", &node)?;
    let Some((name, list)) = first_set(env, &["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"])
    else {
        return Ok(None);
    };
    let bad = || {
        Error::option(
            "rank",
            format!("{name}={list} is not a Slurm task list such as 2(x3),1"),
        )
    };
    let mut seen = 0usize;
    for part in list.split(',') {
        let (count, repeat) = match part.split_once("(x") {
            Some((c, r)) => (c, r.strip_suffix(')').ok_or_else(bad)?),
            None => (part, "1"),
        };
        let count: usize = count.trim().parse().map_err(|_| bad())?;
        let repeat: usize = repeat.trim().parse().map_err(|_| bad())?;
        seen = seen.saturating_add(repeat);
        if node < seen {
            return Ok(Some((
                count,
                format!("{name}={list} at SLURM_NODEID={node}"),
            )));
        }
    }
    Err(Error::option(
        "rank",
        format!("SLURM_NODEID={node} is past the nodes of {name}={list}"),
    ))
}

fn first_set(
    env: &dyn Fn(&str) -> Option<String>,
    names: &[&'static str],
) -> Option<(&'static str, String)> {
    names.iter().find_map(|&n| env(n).map(|v| (n, v)))
}

fn parse_var(name: &str, value: &str) -> Result<usize> {
    value
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n <= 1 << 20)
        .ok_or_else(|| {
            Error::option(
                "rank",
                format!("{name}={value} is not a process number (an integer 0..=1048576)"),
            )
        })
}

/// Cores this process may run on: its affinity mask (`sched_getaffinity`), which launchers and
/// cgroup cpusets narrow, bounded by the cgroup CPU quota that the standard library reads.
pub fn usable_cores() -> usize {
    let quota = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    affinity_cores().map_or(quota, |n| n.min(quota)).max(1)
}

fn affinity_cores() -> Option<usize> {
    // SAFETY: `cpu_set_t` is plain data, valid when zeroed; sched_getaffinity writes at most
    // `size_of::<cpu_set_t>()` bytes into it, and CPU_COUNT only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        usize::try_from(libc::CPU_COUNT(&set))
            .ok()
            .filter(|n| *n > 0)
    }
}

#[cfg(test)]
mod tests;
