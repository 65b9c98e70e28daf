//! The host scheduler: sampler → pool → delivery of host batches, in sampler order or as they
//! finish. It submits up to `cap` tasks, running ahead into the next epoch, and tracks which
//! batches of the current epoch are delivered (the resume position).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::arena::{Arena, SlabRegistrar};
use crate::batch::Batch;
use crate::collate::{BatchKey, Collator, Scratch};
use crate::cuda::{HostBatches, Pulled};
use crate::error::{Error, Result};
use crate::options::{LoaderOptions, OnError, OpenedSource};
use crate::pool::{Builder, Pool, Task};
use crate::resume::ResumeState;
use crate::sampler::{batches_for, BatchPlan, Sampler};
use crate::source::Source;
use crate::stats::{StatsHandle, StatsRecorder};

use super::{Facts, Schedule};

/// Epoch plans by epoch number; holds the two the loader is working on (delivering and
/// submitting), so a plan is computed once.
#[derive(Default)]
struct Plans {
    recent: Vec<(u64, Arc<BatchPlan>)>,
}

impl Plans {
    fn get(
        &mut self,
        sampler: &Sampler,
        batch_size: usize,
        drop_last: bool,
        epoch: u64,
    ) -> Arc<BatchPlan> {
        if let Some((_, plan)) = self.recent.iter().find(|(e, _)| *e == epoch) {
            return Arc::clone(plan);
        }
        let plan = Arc::new(BatchPlan::new(
            sampler.epoch_indices(epoch),
            batch_size,
            drop_last,
        ));
        if self.recent.len() == 2 {
            self.recent.remove(0);
        }
        self.recent.push((epoch, Arc::clone(&plan)));
        plan
    }
}

/// Where delivery stands: the batches of `epoch` below `position`, and those in `ahead`, are
/// delivered; `stream` is a streaming source's own position after batch `position - 1`, when
/// it gives one.
#[derive(Clone, Debug, Default)]
pub(super) struct Cursor {
    pub(super) epoch: u64,
    pub(super) position: usize,
    pub(super) ahead: Vec<usize>,
    pub(super) stream: Option<String>,
}

/// How the host loader is used.
pub(super) enum Mode {
    /// Batches go straight to the consumer.
    Host,
    /// Batches go to the prefetch thread; slabs are registered with the device (`pin_memory`).
    Feed {
        registrar: Option<Arc<dyn SlabRegistrar>>,
    },
}

/// The host pipeline: sampler → pool → in-order delivery of host batches.
pub(super) struct HostLoader {
    /// Whether deliveries count in stats here (off when the prefetcher's consumer counts them).
    record_delivery: bool,
    source: Arc<dyn Source>,
    builder: Arc<Builder>,
    sampler: Sampler,
    seed: u64,
    batch_size: usize,
    drop_last: bool,
    batches_per_epoch: usize,
    plans: Plans,
    /// `None` when `num_workers` is 0: batches are built in `next()` by the calling thread.
    pool: Option<Pool>,
    scratch: Scratch,
    cap: usize,
    in_order: bool,
    timeout: Option<Duration>,
    /// Tasks submitted and not yet delivered (built, being built, or waiting to be).
    in_flight: usize,
    /// Next task to submit.
    submit_epoch: u64,
    submit_position: usize,
    /// The epoch being delivered, and which of its batches have been.
    epoch: u64,
    position: usize,
    ahead: BTreeSet<usize>,
    /// Finished batches not yet delivered, by (epoch, position).
    ready: BTreeMap<(u64, usize), Result<Batch>>,
    stats: Arc<StatsRecorder>,
}

impl HostBatches for HostLoader {
    type Mark = Cursor;

    fn pull(&mut self, poll: Duration) -> Pulled<Cursor> {
        match self.next_within(Some(poll)) {
            // The poll interval passed; nothing was consumed.
            Err(Error::Timeout(_)) => Pulled::Idle,
            item => Pulled::Item(item, self.cursor()),
        }
    }
}

impl HostLoader {
    pub(super) fn new(options: &LoaderOptions, mode: Mode) -> Result<HostLoader> {
        let opened = options.open_source(options.seed, 0, None, 0)?;
        let OpenedSource::Indexed(source) = opened.source else {
            return Err(Error::Internal(
                "the host scheduler was given a stream".into(),
            ));
        };
        let image = options.image_stages(source.fields())?.map(Arc::new);
        let collator = Collator::new(
            Arc::clone(&source),
            options.pad,
            image,
            options.on_error == OnError::Skip,
        )?;

        let mut seed = options.seed;
        let resume = options
            .resume_state
            .as_deref()
            .map(ResumeState::parse)
            .transpose()?;
        if let Some(state) = &resume {
            seed = state.seed;
        }
        let sampler = Sampler::new(options.sampler_kind(source.len())?, source.len(), seed)?;
        let batches_per_epoch = batches_for(sampler.len(), options.batch_size, options.drop_last);

        let workers = options.resolved_workers();
        let cap = options.in_flight_cap();
        // For a device, `pin_memory` means registration with its driver (which page-locks the
        // slab itself), not mlock.
        let (pin, registrar, feed) = match mode {
            Mode::Host => (options.pin_memory.unwrap_or(false), None, false),
            Mode::Feed { registrar } => (false, registrar, true),
        };
        // Idle slabs kept: the in-flight cap plus a few the consumer is holding.
        let arena = Arena::new(pin, cap + 2, registrar);
        let stats = Arc::new(StatsRecorder::new(workers));
        stats.add_skipped(opened.damaged.len() as u64);
        let builder = Arc::new(Builder {
            collator,
            arena,
            stats: Arc::clone(&stats),
            stop: AtomicBool::new(false),
        });
        let pool = if workers > 0 {
            Some(Pool::start(Arc::clone(&builder), workers, cap)?)
        } else {
            None
        };

        let mut loader = HostLoader {
            record_delivery: !feed,
            source: Arc::clone(&source),
            builder,
            sampler,
            seed,
            batch_size: options.batch_size,
            drop_last: options.drop_last,
            batches_per_epoch,
            plans: Plans::default(),
            pool,
            scratch: Scratch::default(),
            cap,
            in_order: options.in_order,
            // Fed to a prefetch thread, the consumer's timeout applies on the consumer's side.
            timeout: (options.timeout_ms > 0 && !feed)
                .then(|| Duration::from_millis(options.timeout_ms)),
            in_flight: 0,
            submit_epoch: 0,
            submit_position: 0,
            epoch: 0,
            position: 0,
            ahead: BTreeSet::new(),
            ready: BTreeMap::new(),
            stats,
        };
        if let Some(state) = resume {
            loader.restore(state)?;
        }
        loader.top_up()?;
        Ok(loader)
    }

    fn restore(&mut self, state: ResumeState) -> Result<()> {
        if state.streaming {
            return Err(Error::option(
                "resume_state",
                "saved by a streaming loader (shuffle_buffer or an iterable source), but this one is indexed: the options differ",
            ));
        }
        if state.batches_per_epoch != self.batches_per_epoch
            || state.position > self.batches_per_epoch
            || state
                .ahead
                .iter()
                .any(|&p| p <= state.position || p >= self.batches_per_epoch)
        {
            return Err(Error::option(
                "resume_state",
                format!(
                    "saved by a loader with {} batches per epoch at position {}, but this loader has {} batches per epoch: the source, sampler, batch_size or drop_last differ",
                    state.batches_per_epoch, state.position, self.batches_per_epoch
                ),
            ));
        }
        self.epoch = state.epoch;
        self.position = state.position;
        self.ahead = state.ahead.into_iter().collect();
        self.submit_epoch = self.epoch;
        self.submit_position = self.position;
        Ok(())
    }

    /// The next batch, waiting at most `timeout` for the pool (`Err(Timeout)` consumes nothing).
    fn next_within(&mut self, timeout: Option<Duration>) -> Result<Option<Batch>> {
        let start = Instant::now();
        if self.position == self.batches_per_epoch {
            self.epoch += 1;
            self.position = 0;
            self.ahead.clear();
            self.top_up()?;
            return Ok(None);
        }
        loop {
            if let Some((key, outcome)) = self.take_ready() {
                self.mark_delivered(key.1);
                self.top_up()?;
                let batch = outcome?;
                if self.record_delivery {
                    self.stats
                        .delivered(batch.len(), batch.skipped(), start.elapsed());
                }
                return Ok(Some(batch));
            }
            match &self.pool {
                Some(pool) => {
                    let remaining = match timeout {
                        None => None,
                        Some(t) => Some(
                            t.checked_sub(start.elapsed())
                                .ok_or(Error::Timeout(t.as_millis() as u64))?,
                        ),
                    };
                    let done = pool.recv(remaining).map_err(|e| match (e, timeout) {
                        (Error::Timeout(_), Some(t)) => Error::Timeout(t.as_millis() as u64),
                        (e, _) => e,
                    })?;
                    self.ready
                        .insert((done.key.epoch, done.key.position), done.outcome);
                }
                None => {
                    // num_workers = 0: build the next batch here, in order.
                    let plan =
                        self.plans
                            .get(&self.sampler, self.batch_size, self.drop_last, self.epoch);
                    let key = self.key(self.epoch, self.position);
                    let outcome = self.builder.build(&Task { key, plan }, &mut self.scratch);
                    self.ready.insert((key.epoch, key.position), outcome);
                }
            }
        }
    }

    /// A finished batch that may be delivered now: the next in sampler order, or with
    /// `in_order=false` any of the current epoch.
    fn take_ready(&mut self) -> Option<((u64, usize), Result<Batch>)> {
        let key = if self.in_order {
            (self.epoch, self.position)
        } else {
            *self
                .ready
                .range((self.epoch, 0)..(self.epoch + 1, 0))
                .next()?
                .0
        };
        let outcome = self.ready.remove(&key)?;
        Some((key, outcome))
    }

    fn mark_delivered(&mut self, position: usize) {
        if self.pool.is_some() {
            self.in_flight -= 1;
        }
        if position == self.position {
            self.position += 1;
            while self.ahead.remove(&self.position) {
                self.position += 1;
            }
        } else {
            self.ahead.insert(position);
        }
    }

    fn key(&self, epoch: u64, position: usize) -> BatchKey {
        BatchKey {
            seed: self.seed,
            epoch,
            position,
        }
    }

    /// Submits tasks until `cap` are in flight, running ahead into later epochs.
    fn top_up(&mut self) -> Result<()> {
        let Some(pool) = &self.pool else {
            return Ok(());
        };
        if self.batches_per_epoch == 0 {
            return Ok(());
        }
        while self.in_flight < self.cap {
            if self.submit_position == self.batches_per_epoch {
                self.submit_epoch += 1;
                self.submit_position = 0;
            }
            let (epoch, position) = (self.submit_epoch, self.submit_position);
            self.submit_position += 1;
            if epoch == self.epoch && self.ahead.contains(&position) {
                continue; // delivered before a resume
            }
            let plan = self
                .plans
                .get(&self.sampler, self.batch_size, self.drop_last, epoch);
            pool.submit(Task {
                key: BatchKey {
                    seed: self.seed,
                    epoch,
                    position,
                },
                plan,
            })?;
            self.in_flight += 1;
        }
        Ok(())
    }
}

impl Schedule for HostLoader {
    fn next(&mut self) -> Result<Option<Batch>> {
        self.next_within(self.timeout)
    }

    fn cursor(&self) -> Cursor {
        Cursor {
            epoch: self.epoch,
            position: self.position,
            ahead: self.ahead.iter().copied().collect(),
            stream: None,
        }
    }

    fn facts(&self) -> Facts {
        Facts {
            seed: self.seed,
            batches_per_epoch: Some(self.batches_per_epoch),
            samples_per_epoch: Some(self.sampler.len()),
            source: Some(Arc::clone(&self.source)),
            fields: self.source.fields().to_vec(),
            stats: StatsHandle {
                recorder: Arc::clone(&self.stats),
                arena: self.builder.arena.clone(),
            },
            streaming: false,
        }
    }
}
