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

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::arena::Arena;
use crate::batch::Batch;
use crate::collate::{BatchKey, Collator, Scratch};
use crate::error::{panic_message, Error, Result};
use crate::sampler::BatchPlan;
use crate::stats::StatsRecorder;

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

impl Builder {
    /// Builds one batch, turning a panic into an error and counting the time as busy.
    pub fn build(&self, task: &Task, scratch: &mut Scratch) -> Result<Batch> {
        if task.generation != self.generation.load(Ordering::Acquire) {
            return Err(Error::Closed(format!(
                "batch {} of epoch {} was discarded by set_epoch",
                task.key.position, task.key.epoch
            )));
        }
        let start = Instant::now();
        let indices = task.plan.batch(task.key.position);
        let draws = task.plan.draws(task.key.position);
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
        self.stats.add_busy(start.elapsed());
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
            let handle = std::thread::Builder::new()
                .name(format!("stoker-worker-{i}"))
                .spawn(move || worker_loop(&builder, &tasks, &done))
                .map_err(|e| Error::Internal(format!("starting worker thread {i}: {e}")))?;
            pool.workers.push(handle);
        }
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

fn worker_loop(builder: &Builder, tasks: &Receiver<Task>, done: &Sender<Done>) {
    let mut scratch = Scratch::default();
    for task in tasks {
        if builder.stop.load(Ordering::Acquire) {
            break;
        }
        let outcome = builder.build(&task, &mut scratch);
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
