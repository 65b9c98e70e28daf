//! The worker pool: threads that build batches, at most `cap` in flight.
//!
//! The loader submits batch tasks (epoch, position, the epoch's plan) and receives finished
//! batches, in whatever order workers finish them; ordering is the loader's job. Workers persist
//! across epochs. A panic while building a batch is caught and becomes that batch's error. Dropping
//! the pool raises the stop flag, closes the task queue and joins every thread.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::arena::Arena;
use crate::batch::Batch;
use crate::collate::{BatchKey, Collator, Scratch};
use crate::error::{panic_message, Error, Result};
use crate::sampler::BatchPlan;
use crate::stats::{StatsRecorder, WorkerSlot};
use crate::trace::Track;

/// One batch to build: batch `key.position` of `plan`.
pub(crate) struct Task {
    pub key: BatchKey,
    pub plan: Arc<BatchPlan>,
}

/// A finished task.
pub(crate) struct Done {
    pub key: BatchKey,
    pub outcome: Result<Batch>,
}

/// Everything needed to build a batch, shared by the workers (and by the calling thread when
/// `num_workers` is 0).
pub(crate) struct Builder {
    pub collator: Collator,
    pub arena: Arena,
    pub stats: Arc<StatsRecorder>,
    pub stop: AtomicBool,
}

/// What one thread that builds batches keeps: its scratch memory and its counters.
pub(crate) struct WorkerCtx {
    scratch: Scratch,
    slot: Arc<WorkerSlot>,
}

impl WorkerCtx {
    /// A new worker's context, registered in `stats` (and named `name` in the trace).
    pub fn new(stats: &StatsRecorder, name: &str) -> WorkerCtx {
        let slot = stats.register_worker();
        if let Some(trace) = stats.trace() {
            trace.name_track(Track::Worker(slot.id), name.to_owned());
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
    /// stages in the worker's counters, spans in the trace.
    pub fn build(&self, task: &Task, ctx: &mut WorkerCtx) -> Result<Batch> {
        let start = Instant::now();
        let indices = task.plan.batch(task.key.position);
        let scratch = &mut ctx.scratch;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            self.collator.build(task.key, indices, &self.arena, scratch)
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
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    pub fn start(builder: Arc<Builder>, workers: usize, cap: usize) -> Result<Pool> {
        // Both queues hold at most `cap` entries because the loader never has more than `cap`
        // tasks submitted and undelivered.
        let (task_tx, task_rx) = crossbeam_channel::bounded::<Task>(cap);
        let (done_tx, done_rx) = crossbeam_channel::bounded::<Done>(cap);
        let mut pool = Pool {
            builder: Arc::clone(&builder),
            tasks: Some(task_tx),
            done: done_rx,
            workers: Vec::with_capacity(workers),
        };
        for i in 0..workers {
            let (builder, tasks, done) = (Arc::clone(&builder), task_rx.clone(), done_tx.clone());
            let name = format!("stoker-worker-{i}");
            let ctx = WorkerCtx::new(&builder.stats, &name);
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(move || worker_loop(&builder, ctx, &tasks, &done))
                .map_err(|e| Error::Internal(format!("starting worker thread {i}: {e}")))?;
            pool.workers.push(handle);
        }
        builder.stats.set_current_workers(workers);
        Ok(pool)
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

    /// The next finished batch; `Err(Timeout)` if none arrives within `timeout`.
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Done> {
        let disconnected = || Error::Internal("every worker thread has exited".into());
        match timeout {
            None => self.done.recv().map_err(|_| disconnected()),
            Some(t) => self.done.recv_timeout(t).map_err(|e| match e {
                RecvTimeoutError::Timeout => Error::Timeout(t.as_millis() as u64),
                RecvTimeoutError::Disconnected => disconnected(),
            }),
        }
    }
}

fn worker_loop(builder: &Builder, mut ctx: WorkerCtx, tasks: &Receiver<Task>, done: &Sender<Done>) {
    for task in tasks {
        if builder.stop.load(Ordering::Acquire) {
            break;
        }
        let outcome = builder.build(&task, &mut ctx);
        if done
            .send(Done {
                key: task.key,
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
        // Closing both queues ends every worker: one waiting for a task sees the task queue
        // closed, one finishing a batch fails to send it. Finished batches still queued drop here
        // and return their slabs.
        drop(self.tasks.take());
        drop(std::mem::replace(
            &mut self.done,
            crossbeam_channel::never(),
        ));
        for worker in self.workers.drain(..) {
            // A worker cannot panic outside `catch_unwind`; if one did, there is nothing to add.
            let _ = worker.join();
        }
    }
}
