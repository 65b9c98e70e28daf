//! The worker pool: threads that build batches, at most `cap` in flight.
//!
//! Both schedulers build on it. The host scheduler submits batch tasks of an indexed source
//! (epoch, position, the epoch's plan); a stream's feeder thread submits batches of owned samples
//! it cut, through an `Inlet`, and passes the failures it hits and each epoch's end through
//! the same done queue. Either receives finished batches in whatever order workers finish them;
//! ordering is the scheduler's job. Workers persist across epochs; `resize` starts or stops them
//! (autotune). A panic while building a batch is caught and becomes that batch's error. Dropping
//! the pool raises the stop flag, closes the task queue and joins every thread.
//!
//! A task may be submitted split into parts (intra-batch parallelism, for the first batches of a
//! loader, when one batch is all the consumer waits for): the parts are queued one after the
//! other, so the workers free next all take parts of that batch before any later batch. Each
//! part holds a reference to the batch's shared state (`Split`); the part that drops the last
//! one — the last to end, whichever worker runs it — finishes the batch and sends it on. Nobody
//! waits for a part: a worker that ends its part takes the next job. A panic in a part is that
//! part's outcome, so the batch still finishes, with the panic as its error; a part dropped
//! unbuilt (the pool shutting down) frees the shared state, slab included, with its last
//! reference.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use crate::arena::Arena;
use crate::batch::{Batch, OneSample, OwnedSamples, ReplaceRouted, RoutedImage};
use crate::close::{Closer, Wait};
use crate::collate::{BatchKey, Collator, PartedBatch, Scratch, MAX_PARTS};
use crate::error::{panic_message, Error, Result};
use crate::sampler::BatchPlan;
use crate::source::streaming::OwnedSample;
use crate::stats::{StatsRecorder, WorkerSlot};
use crate::trace::Track;

/// One batch to build: batch `key.position`, from `work`.
pub(crate) struct Task {
    pub key: BatchKey,
    pub work: Work,
    /// The loader's schedule this task belongs to; `set_epoch` starts a new one, and tasks of
    /// an old one are discarded unbuilt.
    pub generation: u64,
}

/// What a batch is built from.
pub(crate) enum Work {
    /// Batch `key.position` of an indexed source's epoch plan.
    Planned(Arc<BatchPlan>),
    /// Samples a stream's feeder cut, in slot order; `state` is the stream's position after the
    /// last of them, handed to the scheduler with the batch (its resume state).
    Owned {
        samples: Vec<Box<dyn OwnedSample>>,
        state: Option<String>,
    },
}

/// What a worker takes from the queue.
pub(crate) enum Job {
    /// A whole batch.
    Batch(Task),
    /// Part `part` of a batch split across workers.
    Part { split: Arc<Split>, part: usize },
}

/// A batch split into parts: its key, generation and plan, and the state its parts share. Each
/// queued or running part holds one `Arc` of it, so the `Arc`'s count is the parts not yet
/// ended. Only batches of a plan are split: a stream's batches are cut whole.
pub(crate) struct Split {
    key: BatchKey,
    generation: u64,
    plan: Arc<BatchPlan>,
    batch: PartedBatch,
}

/// Room the task queue keeps for parts beyond one entry per batch: enough for [`MAX_PARTS`]
/// batches of [`MAX_PARTS`] parts. A task is split only while the parts fit in it, so the
/// queue's bound still holds and a submission never blocks on it.
const SPLIT_ROOM: usize = MAX_PARTS * MAX_PARTS;

/// What the done queue hands the scheduler.
pub(crate) enum Done {
    /// A finished task (or a stream's batch that failed before it had samples).
    Built(Built),
    /// A stream's epoch `epoch` has `batches` batches: its feeder reached the end.
    End { epoch: u64, batches: usize },
}

/// A finished task: its batch or error, and for a stream's batch the stream's state after it.
pub(crate) struct Built {
    pub key: BatchKey,
    pub generation: u64,
    pub outcome: Result<Batch>,
    pub state: Option<String>,
}

impl Built {
    /// The outcome of `task`, whose samples (a stream's) are freed here, before the batch waits
    /// in the done queue, or kept with the batch (see [`Task::settle`]).
    fn of(task: Task, mut outcome: Result<Batch>, builder: &Builder) -> Built {
        let (key, generation) = (task.key, task.generation);
        let state = task.settle(&mut outcome, builder);
        Built {
            key,
            generation,
            outcome,
            state,
        }
    }
}

impl Task {
    /// Once `outcome` is built: frees a stream's samples, or hands them to the batch when it
    /// left images to the device and a bad one is to be replaced (`on_error=skip`: the
    /// candidates are the batch's own samples, see [`DeviceDecodes::owned`]). Returns the
    /// stream's state after the task.
    pub(crate) fn settle(self, outcome: &mut Result<Batch>, builder: &Builder) -> Option<String> {
        let Work::Owned { samples, state } = self.work else {
            return None;
        };
        if builder.collator.replaces_routed() {
            if let Some(decodes) = outcome.as_mut().ok().and_then(Batch::decodes_mut) {
                decodes.owned = Some(OwnedSamples::new(samples));
            }
        }
        state
    }
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
    /// Whether a worker's wait for a job is time the in-flight depth held it back (see
    /// `loader/depth.rs`): so for the host scheduler, which submits up to its depth. A stream's
    /// feeder is what its tokens hold back (it records its own waits); its workers wait for the
    /// feeder, which a deeper prefetch would not shorten.
    pub workers_held_back: bool,
    /// Bytes of the device buffer a batch of the largest size needs (its fields at their device
    /// types, with the uint8 staging of `gpu_normalize`); 0 for a host loader.
    pub device_batch_bytes: usize,
}

impl Builder {
    /// What replaces, on the prefetch thread, an image neither the device nor the CPU could
    /// decode: `builder`, when one is to be replaced (`on_error=skip`).
    pub fn replacer(builder: &Arc<Builder>) -> Option<Arc<dyn ReplaceRouted>> {
        let replacer: Arc<dyn ReplaceRouted> = builder.clone();
        builder.collator.replaces_routed().then_some(replacer)
    }
}

impl ReplaceRouted for Builder {
    fn replace(
        &self,
        image: &RoutedImage,
        owned: Option<&OwnedSamples>,
        err: Error,
    ) -> Result<OneSample> {
        self.collator.replace_routed(image, owned, err)
    }
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
            return Err(discarded(task.key));
        }
        let start = Instant::now();
        let scratch = &mut ctx.scratch;
        let outcome = catch_unwind(AssertUnwindSafe(|| match &task.work {
            Work::Planned(plan) => {
                let indices = plan.batch(task.key.position);
                let draws = plan.draws(task.key.position);
                self.collator
                    .build(task.key, indices, draws, &self.arena, scratch)
            }
            Work::Owned { samples, .. } => {
                self.collator
                    .build_owned(task.key, samples, &self.arena, scratch)
            }
        }))
        .unwrap_or_else(|panic| {
            // The scratch buffers may be half-written; start afresh.
            *scratch = Scratch::default();
            Err(panicked(task.key, &*panic))
        });
        self.record(ctx, task.key, None, start);
        outcome
    }

    /// Builds part `part` of a split batch, like [`Builder::build`] a whole one; when this part
    /// is the last to end, finishes the batch (verify, mixup/cutmix) and returns it.
    pub fn build_part(&self, split: Arc<Split>, part: usize, ctx: &mut WorkerCtx) -> Option<Done> {
        let (key, generation) = (split.key, split.generation);
        let start = Instant::now();
        let current = generation == self.generation.load(Ordering::Acquire);
        if current {
            let indices = split.plan.batch(key.position);
            let draws = split.plan.draws(key.position);
            let scratch = &mut ctx.scratch;
            let built = catch_unwind(AssertUnwindSafe(|| {
                self.collator
                    .build_part(&split.batch, part, indices, draws, &self.arena, scratch)
            }));
            if let Err(panic) = built {
                *scratch = Scratch::default();
                split.batch.abort(part, panicked(key, &*panic));
            }
        } else {
            split.batch.abort(part, discarded(key));
        }
        let parts = split.batch.parts();
        // Exactly one part gets the shared state back: the last to end, after every other
        // part's writes (`into_inner` orders them before it).
        let done = Arc::into_inner(split).map(|Split { batch, .. }| {
            let outcome = catch_unwind(AssertUnwindSafe(|| self.collator.finish_parted(batch)))
                .unwrap_or_else(|panic| Err(panicked(key, &*panic)));
            Done::Built(Built {
                key,
                generation,
                outcome,
                state: None,
            })
        });
        // A discarded part built nothing and records nothing, like a discarded task.
        if current {
            self.record(ctx, key, Some((part, parts)), start);
        }
        done
    }

    /// Records the batch (or part `part` of `parts`) the worker of `ctx` built since `start`:
    /// busy time and stages in its counters, spans in the trace.
    fn record(
        &self,
        ctx: &mut WorkerCtx,
        key: BatchKey,
        part: Option<(usize, usize)>,
        start: Instant,
    ) {
        let end = Instant::now();
        if let Some(trace) = self.stats.trace() {
            let spans = ctx.scratch.spans.spans();
            match part {
                None => trace.batch_built(ctx.slot.id, key.epoch, key.position, start, end, spans),
                Some(part) => trace.part_built(
                    ctx.slot.id,
                    key.epoch,
                    key.position,
                    part,
                    start,
                    end,
                    spans,
                ),
            }
        }
        ctx.slot.add_batch(end - start, &mut ctx.scratch.spans);
    }
}

fn panicked(key: BatchKey, panic: &(dyn std::any::Any + Send)) -> Error {
    Error::Internal(format!(
        "panic while building batch {} of epoch {}: {}",
        key.position,
        key.epoch,
        panic_message(panic)
    ))
}

fn discarded(key: BatchKey) -> Error {
    Error::Closed(format!(
        "batch {} of epoch {} was discarded by set_epoch",
        key.position, key.epoch
    ))
}

pub(crate) struct Pool {
    builder: Arc<Builder>,
    tasks: Option<Sender<Job>>,
    done: Receiver<Done>,
    /// Kept to start more workers later (autotune).
    task_rx: Receiver<Job>,
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
    /// ever have submitted and undelivered (the in-flight cap, or its ceiling under autotune);
    /// the task queue holds [`SPLIT_ROOM`] more entries for the parts of split tasks.
    pub fn start(builder: Arc<Builder>, workers: usize, capacity: usize) -> Result<Pool> {
        let (task_tx, task_rx) = crossbeam_channel::bounded::<Job>(capacity.max(1) + SPLIT_ROOM);
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

    /// Queues `task`, split into (at most) `parts` parts when it can be: a batch of a plan that
    /// the collator can build in parts ([`Collator::parted`]), and the queue has room for them
    /// (see [`SPLIT_ROOM`]); otherwise whole.
    pub fn submit(&self, task: Task, parts: usize) -> Result<()> {
        let tasks = self
            .tasks
            .as_ref()
            .ok_or_else(|| Error::Closed("pool is shut down".into()))?;
        let send = |job: Job| {
            tasks
                .send(job)
                .map_err(|_| Error::Internal("every worker thread has exited".into()))
        };
        // Each batch queued takes one entry of `capacity`; its other queued parts take entries
        // of SPLIT_ROOM. Those are fewer than the entries queued now, so splitting only while
        // `len + parts - 1 <= SPLIT_ROOM` keeps them within it and `send` never waits for room
        // (only this thread sends, and workers only shorten the queue meanwhile).
        let room = tasks.len() + parts.min(MAX_PARTS) <= SPLIT_ROOM + 1;
        let plan = match &task.work {
            Work::Planned(plan) if parts > 1 && room => Arc::clone(plan),
            _ => return send(Job::Batch(task)),
        };
        let n = plan.batch(task.key.position).len();
        let Some(batch) = self.builder.collator.parted(task.key, n, parts) else {
            return send(Job::Batch(task));
        };
        let parts = batch.parts();
        let split = Arc::new(Split {
            key: task.key,
            generation: task.generation,
            plan,
            batch,
        });
        for part in 0..parts - 1 {
            send(Job::Part {
                split: Arc::clone(&split),
                part,
            })?;
        }
        // The last part takes this reference: the queue's parts must hold them all, or the
        // batch would never finish.
        send(Job::Part {
            split,
            part: parts - 1,
        })
    }

    /// Where a stream's feeder thread hands the pool its batches, and the scheduler what it
    /// learns without building (a failed epoch, an epoch's end). Its queues stay open while it
    /// lives: drop it (end the feeder) before the pool.
    pub fn inlet(&self) -> Result<Inlet> {
        let tasks = self
            .tasks
            .as_ref()
            .ok_or_else(|| Error::Closed("pool is shut down".into()))?;
        Ok(Inlet {
            tasks: tasks.clone(),
            done: self.done_tx.clone(),
        })
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

/// A stream feeder's side of the pool (see [`Pool::inlet`]). Its batches are never split, and
/// every send it makes is bounded by the stream's tokens, which are at most the queues'
/// capacity, so a send never waits for room.
pub(crate) struct Inlet {
    tasks: Sender<Job>,
    done: Sender<Done>,
}

impl Inlet {
    /// Queues a whole batch; `false` once the pool is gone.
    pub fn submit(&self, task: Task) -> bool {
        self.tasks.send(Job::Batch(task)).is_ok()
    }

    /// Hands the scheduler `done` directly; `false` once the pool is gone.
    pub fn pass(&self, done: Done) -> bool {
        self.done.send(done).is_ok()
    }
}

fn worker_loop(
    builder: &Builder,
    mut ctx: WorkerCtx,
    tasks: &Receiver<Job>,
    retire: &Receiver<()>,
    done: &Sender<Done>,
) {
    loop {
        // A worker told to stop takes no new task, even when tasks are waiting.
        if let Err(TryRecvError::Disconnected) = retire.try_recv() {
            break;
        }
        let job = match tasks.try_recv() {
            Ok(job) => job,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                // No job: the scheduler's in-flight depth is full (or it has not submitted
                // yet). The time held back is what lets it judge whether to build deeper.
                let idle = Instant::now();
                let job = crossbeam_channel::select! {
                    recv(tasks) -> job => match job {
                        Ok(job) => job,
                        Err(_) => break,
                    },
                    recv(retire) -> _ => break,
                };
                if builder.workers_held_back {
                    builder.stats.held_back(idle.elapsed());
                }
                job
            }
        };
        if builder.stop.load(Ordering::Acquire) {
            break;
        }
        let finished = match job {
            Job::Batch(task) => {
                let outcome = builder.build(&task, &mut ctx);
                Some(Done::Built(Built::of(task, outcome, builder)))
            }
            // Only the part that ends the batch hands it on.
            Job::Part { split, part } => builder.build_part(split, part, &mut ctx),
        };
        if let Some(finished) = finished {
            if done.send(finished).is_err() {
                break;
            }
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
