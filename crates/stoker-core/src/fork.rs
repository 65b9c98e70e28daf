//! Fork safety: a loader's threads do not survive `fork`.
//!
//! `fork()` copies the calling thread only. In the child, a loader made before the fork is
//! memory that describes threads which do not exist there — its worker pool, a stream's feeder,
//! the CUDA prefetch thread, a remote source's tokio runtime — and locks that one of those
//! threads may have held at the moment of the fork, held forever. Waiting on either would hang
//! the child (a `multiprocessing` worker, a torch `DataLoader` worker, a pre-forking server).
//!
//! So the process counts its forks: a `pthread_atfork` child handler, registered before stoker
//! starts its first thread, bumps a generation, and what a loader is made of records the
//! `Origin` it was made in: the loader, its arena, its stats, its closer, each device batch's
//! buffer. In a child (a later generation):
//! - every call that would wait on the parent's threads or take their locks returns
//!   [`Error::Unsupported`] saying so: `next`, `set_epoch`, the stats, `write_trace`, a device
//!   batch's `wait` and `synchronize`;
//! - dropping the loader joins nothing and runs none of its threads' destructors: what it owns
//!   is leaked on purpose (see [`crate::Loader`]'s `Drop`);
//! - releasing a host batch unmaps its slab at once, without the arena's free list, whose lock a
//!   parent thread may have held; releasing a device batch leaks its device buffer (the CUDA
//!   driver cannot be used in a forked child);
//! - what reads only the loader's own memory (epoch, position, `save_state`) keeps working.
//!
//! A loader made in the child is an ordinary loader of the child, and the parent's loaders go on
//! as before. Rayon's global pool is one more set of threads a child does not have: stoker's
//! parallel indexing runs through `parallel`, which uses a pool of its own in a forked child.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Forks counted since the handler was registered: 0 in the process that first used stoker.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Whether [`register`] has run (a plain flag, not a `Once`: a `Once` being run by another thread
/// at the moment of a fork would stay "running" in the child, and block it).
static REGISTERED: AtomicBool = AtomicBool::new(false);

extern "C" fn forked_child() {
    // Runs in the child, inside `fork()`, before it returns: only an atomic add, which is
    // async-signal-safe.
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Registers the child handler, once per process (a child inherits it). Called before anything
/// starts a thread. Two threads racing here may both register it; the generation then moves by
/// two per fork, which changes nothing, since generations are only compared for equality.
fn register() {
    if REGISTERED.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: `forked_child` is an `extern "C"` function with no arguments that lives as long as
    // the program and only touches an atomic; no prepare or parent handler is given.
    let rc = unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    // pthread_atfork fails only for lack of memory. Then forks go uncounted and a child can hang
    // as if the handler did not exist; there is nothing better to do, and no caller to tell.
    if rc == 0 {
        REGISTERED.store(true, Ordering::Release);
    }
}

/// The process a loader (or a part of one) was made in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Origin {
    generation: u64,
    pid: u32,
}

impl Origin {
    /// This process, now. Registers the fork handler first, so any fork after this is counted.
    pub(crate) fn here() -> Origin {
        register();
        Origin {
            generation: GENERATION.load(Ordering::Acquire),
            pid: std::process::id(),
        }
    }

    /// Whether this process is a child forked after the origin was recorded.
    pub(crate) fn is_forked(&self) -> bool {
        GENERATION.load(Ordering::Acquire) != self.generation
    }

    /// `Ok` in the process of origin; in a forked child, the error that says why this loader
    /// cannot be used there and what to do instead.
    pub(crate) fn check(&self) -> Result<()> {
        if self.is_forked() {
            return Err(self.error());
        }
        Ok(())
    }

    /// The error of a call that needs the threads of a loader made before a fork.
    pub(crate) fn error(&self) -> Error {
        Error::Unsupported(format!(
            "this loader was created in process {} before fork(); its threads do not exist in \
             this child process ({}): create a new loader after the fork (e.g. in the worker's \
             init function)",
            self.pid,
            std::process::id()
        ))
    }
}

/// Runs `work`, whose rayon calls (`par_iter`) go to the global pool in the process that first
/// used stoker, and to a pool made for this call in a forked child: the global pool's threads,
/// started before the fork, do not exist there, and a job sent to them would never run.
pub(crate) fn parallel<R: Send>(work: impl FnOnce() -> R + Send) -> Result<R> {
    register();
    if GENERATION.load(Ordering::Acquire) == 0 {
        return Ok(work());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("stoker-index-{i}"))
        .build()
        .map_err(|e| Error::Internal(format!("starting threads to index the source: {e}")))?;
    Ok(pool.install(work))
}
