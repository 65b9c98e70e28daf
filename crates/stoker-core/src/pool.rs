//! The worker pool: threads that build batches, at most `cap` in flight.
//!
//! The loader submits batch tasks (epoch, position, the epoch's plan) and receives finished
//! batches, in whatever order workers finish them; ordering is the loader's job. Workers persist
//! across epochs. A panic while building a batch is caught and becomes that batch's error. Dropping
//! the pool raises the stop flag, closes the task queue and joins every thread.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use crate::arena::Arena;
use crate::batch::Batch;
use crate::close::{Closer, Wait};
use crate::collate::{BatchKey, Collator, Scratch};
use crate::error::{panic_message, Error, Result};
use crate::sampler::BatchPlan;
use crate::stats::{StatsRecorder, WorkerSlot};
use crate::trace::Track;

/// One batch to build: batch `key.position` of `plan`.
pub(crate) struct Task {
    pub key: BatchKey,
    pub plan: Arc<BatchPlan>,
    /// The loader's schedule this task belongs to; `set_epoch` starts a new one, and tasks of
    /// an old one are discarded unbuilt.
    pub generation: u64,
}

/// A finished task.
pub(crate) struct Done {
    pub key: BatchKey,
    pub generation: u64,
    pub outcome: Result<Batch>,
}

/// Everything needed to build a batch, shared by the workers (and by the calling thread when
/// `num_workers` is 0).
pub(crate) struct Builder {
    pub collator: Collator,
    pub arena: Arena,
    pub stats: Arc<StatsRecorder>,
    pub stop: AtomicBool,
    /// The loader's current schedule (see [`Task::generation`]).
    pub generation: AtomicU64,
}

/// What one thread that builds batches keeps: its scratch memory and its counters.
pub(crate) struct WorkerCtx {
    pub(crate) scratch: Scratch,
    pub(crate) slot: Arc<WorkerSlot>,
}

impl WorkerCtx {
    /// A new worker's context, registered in `stats` and named `name(its number)` in the trace.
    pub fn new(stats: &StatsRecorder, name: impl FnOnce(usize) -> String) -> WorkerCtx {
        let slot = stats.register_worker();
        if let Some(trace) = stats.trace() {
            trace.name_track(Track::Worker(slot.id), name(slot.id));
        }
        WorkerCtx {
            scratch: Scratch::default(),
            slot,
        }
    }
}

impl Drop for WorkerCtx {
    fn drop(&mut self) {
        self.slot.retire();
    }
}

impl Builder {
    /// Builds one batch, turning a panic into an error, and records its time: busy time and
    /// stages in the worker's counters, spans in the trace. A task of an earlier generation
    /// (before a `set_epoch`) is discarded unbuilt.
    pub fn build(&self, task: &Task, ctx: &mut WorkerCtx) -> Result<Batch> {
        if task.generation != self.generation.load(Ordering::Acquire) {
            return Err(Error::Closed(format!(
                "batch {} of epoch {} was discarded by set_epoch",
                task.key.position, task.key.epoch
            )));
        }
        let start = Instant::now();
        let indices = task.plan.batch(task.key.position);
        let draws = task.plan.draws(task.key.position);
        let scratch = &mut ctx.scratch;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            self.collator
                .build(task.key, indices, draws, &self.arena, scratch)
        }))
        .unwrap_or_else(|panic| {
            // The scratch buffers may be half-written; start afresh.
            *scratch = Scratch::default();
            Err(Error::Internal(format!(
                "panic while building batch {} of epoch {}: {}",
                task.key.position,
                task.key.epoch,
                panic_message(&*panic)
            )))
        });
        let end = Instant::now();
        if let Some(trace) = self.stats.trace() {
            trace.batch_built(
                ctx.slot.id,
                task.key.epoch,
                task.key.position,
                start,
                end,
                ctx.scratch.spans.spans(),
            );
        }
        ctx.slot.add_batch(end - start, &mut ctx.scratch.spans);
        outcome
    }
}

pub(crate) struct Pool {
    builder: Arc<Builder>,
    tasks: Option<Sender<Task>>,
    done: Receiver<Done>,
    /// Kept to start more workers later (autotune).
    task_rx: Receiver<Task>,
    done_tx: Sender<Done>,
    /// Live workers, in start order.
    workers: Vec<Worker>,
    /// Workers told to stop, joined when the pool drops (or earlier, once they have ended).
    retired: Vec<JoinHandle<()>>,
}

struct Worker {
    handle: JoinHandle<()>,
    /// Dropping it tells the worker to stop after the batch it is building, if any.
    retire: Sender<()>,
}

impl Pool {
    /// Starts `workers` threads. `capacity` bounds both queues: the most tasks the loader will
    /// ever have submitted and undelivered (the in-flight cap, or its ceiling under autotune).
    pub fn start(builder: Arc<Builder>, workers: usize, capacity: usize) -> Result<Pool> {
        let (task_tx, task_rx) = crossbeam_channel::bounded::<Task>(capacity.max(1));
        let (done_tx, done_rx) = crossbeam_channel::bounded::<Done>(capacity.max(1));
        let mut pool = Pool {
            builder,
            tasks: Some(task_tx),
            done: done_rx,
            task_rx,
            done_tx,
            workers: Vec::with_capacity(workers),
            retired: Vec::new(),
        };
        pool.resize(workers)?;
        Ok(pool)
    }

    /// Worker threads running (not told to stop).
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Starts or stops workers until `n` run. A stopped worker finishes the batch it is
    /// building; which worker builds a batch never changes the batch.
    pub fn resize(&mut self, n: usize) -> Result<()> {
        while self.workers.len() > n {
            if let Some(w) = self.workers.pop() {
                drop(w.retire);
                self.retired.push(w.handle);
            }
        }
        // Join the retired workers that have ended, so that churn does not pile up handles.
        let (ended, running): (Vec<_>, Vec<_>) =
            self.retired.drain(..).partition(JoinHandle::is_finished);
        self.retired = running;
        for handle in ended {
            // A worker cannot panic outside `catch_unwind`; if one did, there is nothing to add.
            let _ = handle.join();
        }
        while self.workers.len() < n {
            let builder = Arc::clone(&self.builder);
            let (tasks, done) = (self.task_rx.clone(), self.done_tx.clone());
            let (retire_tx, retire_rx) = crossbeam_channel::bounded::<()>(0);
            let ctx = WorkerCtx::new(&builder.stats, |id| format!("stoker-worker-{id}"));
            let name = format!("stoker-worker-{}", ctx.slot.id);
            let handle = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || worker_loop(&builder, ctx, &tasks, &retire_rx, &done))
                .map_err(|e| Error::Internal(format!("starting worker thread {name}: {e}")))?;
            self.workers.push(Worker {
                handle,
                retire: retire_tx,
            });
        }
        self.builder.stats.set_current_workers(n);
        Ok(())
    }

    pub fn submit(&self, task: Task) -> Result<()> {
        let tasks = self
            .tasks
            .as_ref()
            .ok_or_else(|| Error::Closed("pool is shut down".into()))?;
        tasks
            .send(task)
            .map_err(|_| Error::Internal("every worker thread has exited".into()))
    }

    /// A finished batch if one is waiting, without blocking.
    pub fn try_recv(&self) -> Option<Done> {
        self.done.try_recv().ok()
    }

    /// The next finished batch; `Err(Timeout)` if none arrives within `timeout`, `Err(Closed)`
    /// as soon as the loader is closed from another thread.
    pub fn recv(&self, timeout: Option<Duration>, closer: &Closer) -> Result<Done> {
        match closer.recv(&self.done, timeout) {
            Wait::Got(done) => Ok(done),
            Wait::TimedOut => Err(Error::Timeout(
                timeout.unwrap_or_default().as_millis() as u64
            )),
            Wait::Disconnected => Err(Error::Internal("every worker thread has exited".into())),
            Wait::Closed => Err(crate::close::closed_error()),
        }
    }
}

fn worker_loop(
    builder: &Builder,
    mut ctx: WorkerCtx,
    tasks: &Receiver<Task>,
    retire: &Receiver<()>,
    done: &Sender<Done>,
) {
    loop {
        // A worker told to stop takes no new task, even when tasks are waiting.
        if let Err(TryRecvError::Disconnected) = retire.try_recv() {
            break;
        }
        let task = match tasks.try_recv() {
            Ok(task) => task,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                // No task: the scheduler's in-flight depth is full (or it has not submitted
                // yet). The time held back is what lets it judge whether to build deeper.
                let idle = Instant::now();
                let task = crossbeam_channel::select! {
                    recv(tasks) -> task => match task {
                        Ok(task) => task,
                        Err(_) => break,
                    },
                    recv(retire) -> _ => break,
                };
                builder.stats.held_back(idle.elapsed());
                task
            }
        };
        if builder.stop.load(Ordering::Acquire) {
            break;
        }
        let outcome = builder.build(&task, &mut ctx);
        if done
            .send(Done {
                key: task.key,
                generation: task.generation,
                outcome,
            })
            .is_err()
        {
            break;
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.builder.stop.store(true, Ordering::Release);
        // Closing the task queue and every retire channel ends every worker: one waiting for a
        // task sees them closed, one finishing a batch fails to send it. Finished batches still
        // queued drop here and return their slabs.
        drop(self.tasks.take());
        drop(std::mem::replace(
            &mut self.done,
            crossbeam_channel::never(),
        ));
        let workers: Vec<Worker> = self.workers.drain(..).collect();
        let handles: Vec<JoinHandle<()>> = workers
            .into_iter()
            .map(|w| {
                drop(w.retire);
                w.handle
            })
            .chain(self.retired.drain(..))
            .collect();
        for handle in handles {
            // A worker cannot panic outside `catch_unwind`; if one did, there is nothing to add.
            let _ = handle.join();
        }
    }
}
