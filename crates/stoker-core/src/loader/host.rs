//! The host scheduler: sampler → pool → delivery of host batches, in sampler order or as they
//! finish. It submits up to its depth of tasks (at most `cap`; see [`super::depth`]), running
//! ahead into the next epoch, and tracks which batches of the current epoch are delivered (the
//! resume position).
//!
//! An epoch is normally dealt from the start of its global order; the epoch a job resumes in
//! is dealt from the entry where the saved job stopped (its `start`), possibly to a different
//! number of ranks. `set_epoch` starts a new *generation* of the schedule: tasks of the old one
//! still queued are discarded unbuilt, and finished ones are dropped, never delivered.
//!
//! When the pipeline starts empty — a new (or resumed) loader, a `set_epoch` or rewind that
//! discarded the work in flight — the consumer waits for one batch while each worker would
//! build a different one. So the first `num_workers` batches submitted then are split into
//! `num_workers` parts (at most [`crate::collate::MAX_PARTS`]; see [`crate::pool`]): batch `k`
//! is ready after about `(k + 1) / num_workers` of a batch's build time instead of one whole
//! batch's. Later batches are submitted whole: with every worker on its own batch there is no
//! idle worker to lend, and the scheduler already runs ahead into the next epoch, so the epoch
//! boundary needs no split.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::Batch;
use crate::close::Closer;
use crate::collate::BatchKey;
use crate::cuda::{HostBatches, Pulled};
use crate::error::{Error, Result};
use crate::hash::Fnv;
use crate::launch::Launch;
use crate::options::{LoaderOptions, OpenedSource};
use crate::pool::{Builder, Done, Pool, Task, Work, WorkerCtx};
use crate::resume::{Fingerprint, FingerprintText, Position, ResumeState, TokensPrint};
use crate::sampler::{batches_for, BatchPlan, Sampler, SamplerKind};
use crate::source::Source;
use crate::stats::StatsRecorder;

use super::assembly::{Cap, Mode, Resolved, Samples};
use super::depth::Depth;
use super::{Facts, Scheduler};

/// Epoch plans by (epoch, start); holds the two the loader is working on (delivering and
/// submitting), so a plan is computed once.
#[derive(Default)]
struct Plans {
    recent: Vec<((u64, usize), Arc<BatchPlan>)>,
}

impl Plans {
    fn get(
        &mut self,
        schedule: &Schedule,
        sampler: &Sampler,
        epoch: u64,
        start: usize,
    ) -> Arc<BatchPlan> {
        if let Some((_, plan)) = self.recent.iter().find(|(k, _)| *k == (epoch, start)) {
            return Arc::clone(plan);
        }
        let plan = Arc::new(BatchPlan::for_segment(
            sampler,
            epoch,
            start,
            schedule.batch_size,
            schedule.drop_last,
        ));
        if self.recent.len() == 2 {
            self.recent.remove(0);
        }
        self.recent.push(((epoch, start), Arc::clone(&plan)));
        plan
    }

    fn clear(&mut self) {
        self.recent.clear();
    }
}

/// Where delivery stands: epoch `epoch` is dealt from entry `start` of its global order, and
/// its batches below `position`, and those in `ahead`, are delivered; `stream` is a streaming
/// source's own position after batch `position - 1`, when it gives one.
#[derive(Clone, Debug, Default)]
pub(super) struct Cursor {
    pub(super) epoch: u64,
    pub(super) start: usize,
    pub(super) position: usize,
    pub(super) ahead: Vec<usize>,
    pub(super) stream: Option<String>,
}

/// The facts of a loader's schedule that do not change while it runs: enough to count the
/// batches of an epoch (or of its rest) and to write the resume state of a cursor, on either
/// side of the prefetch thread.
#[derive(Clone, Debug)]
pub(super) struct Schedule {
    pub(super) seed: u64,
    pub(super) launch: Launch,
    /// Entries of an epoch's global order.
    pub(super) global_len: usize,
    pub(super) sampler: Sampler,
    pub(super) batch_size: usize,
    pub(super) drop_last: bool,
    pub(super) fingerprint: Fingerprint,
    pub(super) fingerprint_text: FingerprintText,
    /// `allow_config_change` of a token stream: a state saved under other settings resumes,
    /// its count carried over.
    pub(super) allow_config_change: bool,
    /// `in_order=false`: ranks may deliver batches out of order, so each rank's state is its
    /// own and names the rank.
    pub(super) per_rank: bool,
}

impl Schedule {
    /// Batches this rank delivers for an epoch dealt from entry `start`.
    pub(super) fn segment_batches(&self, start: usize) -> usize {
        let per_rank = self.sampler.per_rank(self.global_len.saturating_sub(start));
        batches_for(per_rank, self.batch_size, self.drop_last)
    }

    /// Batches of a whole epoch.
    pub(super) fn batches_per_epoch(&self) -> usize {
        self.segment_batches(0)
    }

    /// The job's state at `cursor`: entries of the global order consumed by all ranks, which is
    /// the same on every rank when they have delivered the same number of batches.
    pub(super) fn state_at(&self, cursor: &Cursor) -> ResumeState {
        let deal = self.sampler.deal();
        let mut base = cursor.position;
        let consumed = if cursor.position >= self.segment_batches(cursor.start) {
            // Every entry was delivered, or dropped by drop_last / shard_drop_last (or, dealt
            // in global batches, the tail shorter than one).
            self.global_len
        } else if let Some(global) = self.sampler.global_batches() {
            // Whole global batches only: the job stands at the last step every rank finished,
            // and a micro-batch of the step under way is delivered again on resume.
            let steps = cursor.position * self.batch_size / global.slice();
            base = steps * global.slice() / self.batch_size;
            (cursor.start + steps * global.size).min(self.global_len)
        } else {
            let dealt = cursor.position * self.batch_size * deal.world_size;
            (cursor.start + dealt).min(self.global_len)
        };
        ResumeState {
            seed: self.seed,
            epoch: cursor.epoch,
            at: Position::Global {
                consumed,
                world_size: deal.world_size,
                fingerprint: self.fingerprint.clone(),
                rank: self.per_rank.then_some(deal.rank),
            },
            ahead: cursor.ahead.iter().map(|p| p - base).collect(),
        }
    }
}

/// The host pipeline: sampler → pool → in-order delivery of host batches.
pub(super) struct HostLoader {
    /// Whether deliveries count in stats here (off when the prefetcher's consumer counts them).
    record_delivery: bool,
    source: Arc<dyn Source>,
    builder: Arc<Builder>,
    sampler: Sampler,
    schedule: Schedule,
    batches_per_epoch: usize,
    plans: Plans,
    /// `None` when `num_workers` is 0: batches are built in `next()` by the calling thread.
    pool: Option<Pool>,
    /// The calling thread's worker context when `num_workers` is 0.
    local: Option<WorkerCtx>,
    /// The in-flight cap (moved by autotune).
    cap: Cap,
    /// How many of `cap` tasks are submitted now: deepens when the consumer's waits call for it.
    depth: Depth,
    in_order: bool,
    timeout: Option<Duration>,
    /// Tasks submitted and not yet delivered (built, being built, or waiting to be).
    in_flight: usize,
    /// Whether the last call handed the consumer a batch. It counts against the depth until the
    /// consumer asks again: it works on that batch meanwhile, and a `for batch in loader` loop
    /// still holds its previous one while it asks, so building its replacement earlier would
    /// only add a slab alive at the hand-over.
    handed_over: bool,
    /// Next task to submit: batch `submit_position` of epoch `submit_epoch` dealt from entry
    /// `submit_start`.
    submit_epoch: u64,
    submit_start: usize,
    submit_position: usize,
    /// The epoch being delivered, where its dealing starts, and which of its batches have been.
    epoch: u64,
    start: usize,
    position: usize,
    ahead: BTreeSet<usize>,
    /// No batch (or epoch end) delivered since the loader was made or its epoch set.
    fresh: bool,
    /// The schedule's generation: `set_epoch` starts a new one (see `Task::generation`).
    generation: u64,
    /// Batches still to submit split across the workers since the pipeline last started empty.
    split_left: usize,
    /// Finished batches not yet delivered, by (epoch, position).
    ready: BTreeMap<(u64, usize), Result<Batch>>,
    stats: Arc<StatsRecorder>,
    /// Wakes the consumer's wait when the loader is closed from another thread.
    closer: Closer,
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
    pub(super) fn new(options: &LoaderOptions, launch: Launch, mode: Mode) -> Result<HostLoader> {
        let resolved = Resolved::new(options, launch, mode)?;
        let resume = options
            .resume_state
            .as_deref()
            .map(ResumeState::parse)
            .transpose()?;
        // A resumed job continues with the seed it was saved with, whatever `seed` says: the
        // source (a blend's passes) is opened with it too.
        let seed = resume.as_ref().map_or(options.seed, |state| state.seed);
        let opened = options.open_source(&resolved.launch, seed, 0, None, 0)?;
        let OpenedSource::Indexed(source) = opened.source else {
            return Err(Error::Internal(
                "the host scheduler was given a stream".into(),
            ));
        };

        let launch = resolved.launch;
        let kind = options.sampler_kind_for(&*source)?;
        let mut sampler = Sampler::dealt(kind, source.len(), seed, options.deal(&launch))?;
        let tokens = options
            .is_token_stream()
            .then(|| options.token_config())
            .transpose()?;
        if tokens.is_some() {
            // One global order for any world size: each rank takes its slice of every global
            // batch (see `launch::GlobalBatches`).
            let global = options
                .global_batch_size
                .unwrap_or(options.batch_size * launch.world_size);
            sampler = sampler.in_global_batches(global, options.batch_size)?;
            options.check_a_global_batch(&*source, sampler.global_len(), global)?;
        }
        let tokens_print = match (&tokens, sampler.global_batches()) {
            (Some(config), Some(global)) => Some(TokensPrint {
                seq_len: config.seq_len,
                global_batch_size: global.size,
                settings: config.settings_hash(),
                named: config
                    .sample_settings()
                    .into_iter()
                    .map(|(key, value)| (key.to_owned(), value))
                    .collect(),
                packing: config.packing,
            }),
            _ => None,
        };
        let schedule = Schedule {
            seed,
            launch,
            global_len: sampler.global_len(),
            sampler: sampler.clone(),
            batch_size: options.batch_size,
            drop_last: options.drop_last,
            allow_config_change: options.allow_config_change,
            per_rank: !options.in_order,
            fingerprint: Fingerprint {
                source: Fnv::of_debug(&source.identity()),
                source_len: source.len(),
                sampler: Fnv::of_debug(&(sampler.kind(), sampler.deal().drop_last)),
                batch_size: options.batch_size,
                drop_last: options.drop_last,
                // NCHW whether said or not, so that states saved before `layout` could be unset
                // still resume.
                transform: Fnv::of_debug(&(
                    &options.transform,
                    options.dtype,
                    options.image_layout(),
                )),
                tokens: tokens_print,
            },
            fingerprint_text: FingerprintText {
                source: source.identity(),
                sampler: sampler_text(&sampler),
                transform: format!(
                    "transform={}, dtype={}, layout={:?}",
                    options.transform.as_deref().unwrap_or("none"),
                    options
                        .dtype
                        .map_or("default".to_owned(), |d| d.to_string()),
                    options.image_layout()
                ),
                tokens: tokens.as_ref().map_or(String::new(), |c| {
                    let settings = c.sample_settings().into_iter();
                    settings
                        .map(|(key, value)| format!("{key}={value}"))
                        .chain([
                            format!("token_packing={}", c.packing.name()),
                            format!("text_column={}", c.text_column),
                        ])
                        .collect::<Vec<_>>()
                        .join(", ")
                }),
            },
        };
        let batches_per_epoch = schedule.batches_per_epoch();
        let parts = resolved.assemble(
            options,
            Samples::Indexed(&source),
            Some(sampler.len()),
            opened.damaged.len() as u64,
            true,
        )?;

        let mut loader = HostLoader {
            record_delivery: !resolved.feed,
            source: Arc::clone(&source),
            builder: parts.builder,
            sampler,
            schedule,
            batches_per_epoch,
            plans: Plans::default(),
            pool: parts.pool,
            local: parts.local,
            cap: parts.cap,
            depth: parts.depth,
            in_order: options.in_order,
            timeout: resolved.timeout,
            in_flight: 0,
            handed_over: false,
            submit_epoch: 0,
            submit_start: 0,
            submit_position: 0,
            epoch: 0,
            start: 0,
            position: 0,
            ahead: BTreeSet::new(),
            fresh: true,
            closer: Closer::new(),
            generation: 0,
            split_left: resolved.workers,
            ready: BTreeMap::new(),
            stats: parts.stats,
        };
        if let Some(state) = resume {
            loader.restore(state)?;
        }
        loader.top_up()?;
        Ok(loader)
    }

    fn restore(&mut self, state: ResumeState) -> Result<()> {
        let bad = |why: String| Err(Error::option("resume_state", why));
        match state.at {
            Position::Batches {
                position,
                batches_per_epoch,
            } => {
                // A stoker-state-v1 string: a batch position at an unchanged world size.
                if batches_per_epoch != self.batches_per_epoch
                    || position > self.batches_per_epoch
                    || state
                        .ahead
                        .iter()
                        .any(|&p| p <= position || p >= self.batches_per_epoch)
                {
                    return bad(format!(
                        "saved by a loader with {batches_per_epoch} batches per epoch at position {position}, but this loader has {} batches per epoch: the source, sampler, batch_size, drop_last or world_size differ",
                        self.batches_per_epoch
                    ));
                }
                // Orders are drawn from keys mixed as stoker 0.1's were not (its nearby keys
                // collided), so only an order without draws continues as it was.
                if !matches!(
                    self.sampler.kind(),
                    SamplerKind::Sequential | SamplerKind::Indices { .. }
                ) {
                    return bad(format!(
                        "was saved by stoker 0.1 (stoker-state-v1), whose random orders this \
                         version draws differently (0.1 mixed the seed, epoch and index into \
                         too few bits, so nearby keys drew the same order): the rest of epoch \
                         {} cannot be replayed as it was; start that epoch again instead \
                         (set_epoch({}) without resume_state)",
                        state.epoch, state.epoch
                    ));
                }
                self.start = 0;
                self.position = position;
                self.ahead = state.ahead.into_iter().collect();
            }
            Position::Stream { .. } => {
                return bad(
                    "was saved by a streaming loader (shuffle_buffer or an iterable source), but this one is indexed: the options differ".into(),
                );
            }
            Position::Global {
                consumed,
                world_size,
                fingerprint,
                rank,
            } => {
                let deal = self.sampler.deal();
                if let Some(saved) = rank {
                    if (saved, world_size) != (deal.rank, deal.world_size) {
                        return bad(format!(
                            "was saved by rank {saved} of {world_size} with in_order=false, which \
                             makes a state that rank's own (where its delivery stood, and the \
                             batches it delivered out of order); resume each rank from the state \
                             it saved (this is rank {} of {}), or save with in_order=true, whose \
                             state is the same on every rank",
                            deal.rank, deal.world_size
                        ));
                    }
                }
                let len = self.schedule.global_len;
                let mut consumed = consumed;
                let mut ahead = state.ahead;
                if let Some(why) = self
                    .schedule
                    .fingerprint
                    .mismatch(&fingerprint, &self.schedule.fingerprint_text)
                {
                    match self.sampler.global_batches() {
                        // A token stream told to carry on: the same epoch, the same count of
                        // its samples, in whole global batches of this configuration.
                        Some(global)
                            if self.schedule.allow_config_change
                                && fingerprint.tokens.is_some() =>
                        {
                            consumed = consumed.min(len) / global.size * global.size;
                            ahead.clear();
                        }
                        _ => return bad(why),
                    }
                }
                if consumed > len {
                    return bad(format!(
                        "says {consumed} entries of the epoch were consumed, but an epoch has {len}"
                    ));
                }
                if let Some(global) = self.sampler.global_batches() {
                    if consumed != len && !consumed.is_multiple_of(global.size) {
                        return bad(format!(
                            "says {consumed} samples were consumed, not a whole number of global \
                             batches of {}",
                            global.size
                        ));
                    }
                }
                let here = self.sampler.deal().world_size;
                if !ahead.is_empty() && world_size != here {
                    return bad(format!(
                        "was saved with in_order=false while batches were delivered out of \
                         order, at world_size {world_size}; such a state resumes only at the \
                         same world size (here {here})"
                    ));
                }
                let batches = self.schedule.segment_batches(consumed);
                if ahead.iter().any(|&p| p == 0 || p >= batches) {
                    return bad("has `ahead` positions outside the epoch".into());
                }
                self.start = consumed;
                self.position = 0;
                self.ahead = ahead.into_iter().collect();
            }
        }
        self.epoch = state.epoch;
        self.submit_epoch = self.epoch;
        self.submit_start = self.start;
        self.submit_position = self.position;
        Ok(())
    }

    /// Starts a new generation: tasks in flight are discarded when they come back, and
    /// finished batches not yet delivered are dropped (their slabs go back to the arena now).
    fn discard_in_flight(&mut self) {
        self.generation += 1;
        self.builder
            .generation
            .store(self.generation, Ordering::Release);
        // Finished batches were counted in flight until delivered.
        if self.pool.is_some() {
            self.in_flight -= self.ready.len();
        }
        self.ready.clear();
        self.plans.clear();
        // The consumer now waits for the new schedule's first batch.
        self.split_left = self.pool.as_ref().map_or(0, Pool::workers);
    }

    /// The next batch, waiting at most `timeout` for the pool (`Err(Timeout)` consumes nothing).
    fn next_within(&mut self, timeout: Option<Duration>) -> Result<Option<Batch>> {
        let start = Instant::now();
        self.fresh = false;
        if std::mem::take(&mut self.handed_over) {
            self.top_up()?;
        }
        if self.position == self.schedule.segment_batches(self.start) {
            self.epoch += 1;
            self.start = 0;
            self.position = 0;
            self.ahead.clear();
            self.top_up()?;
            return Ok(None);
        }
        loop {
            let next = super::take_ready(&mut self.ready, self.in_order, self.epoch, self.position);
            if let Some((position, outcome)) = next {
                self.mark_delivered(position);
                self.handed_over = true;
                if self.pool.is_some() && self.depth.delivered(self.cap.cap) {
                    self.stats.set_depth(self.depth.of(self.cap.cap));
                }
                self.cap
                    .tune(self.pool.as_mut(), &mut self.depth, &self.stats)?;
                self.top_up()?;
                let batch = outcome?;
                if self.record_delivery {
                    self.stats.delivered(&batch, start);
                }
                return Ok(Some(batch));
            }
            match &self.pool {
                Some(pool) => {
                    let done = match pool.try_recv() {
                        Some(done) => done,
                        None => {
                            // A built batch is taken whatever the timeout: only waits are bounded.
                            let remaining = match timeout {
                                None => None,
                                Some(t) => Some(
                                    t.checked_sub(start.elapsed())
                                        .ok_or(Error::Timeout(t.as_millis() as u64))?,
                                ),
                            };
                            // Nothing finished: the consumer waits, which the depth weighs.
                            let blocked = Instant::now();
                            let done = pool.recv(remaining, &self.closer);
                            self.depth.waited(
                                blocked.elapsed(),
                                self.stats.held_back_ns(),
                                pool.workers(),
                            );
                            done.map_err(|e| match (e, timeout) {
                                (Error::Timeout(_), Some(t)) => {
                                    Error::Timeout(t.as_millis() as u64)
                                }
                                (e, _) => e,
                            })?
                        }
                    };
                    let Done::Built(done) = done else {
                        return Err(Error::Internal(
                            "an epoch's end reached the host scheduler".into(),
                        ));
                    };
                    if done.generation != self.generation {
                        // Submitted before set_epoch: discarded (its slab, if any, returns now).
                        self.in_flight -= 1;
                        self.top_up()?;
                        continue;
                    }
                    self.ready
                        .insert((done.key.epoch, done.key.position), done.outcome);
                }
                None => {
                    // num_workers = 0: build the next batch here, in order.
                    let plan =
                        self.plans
                            .get(&self.schedule, &self.sampler, self.epoch, self.start);
                    let key = self.key(self.epoch, self.position);
                    let ctx = self.local.as_mut().ok_or_else(|| {
                        Error::Internal("no worker context for num_workers=0".into())
                    })?;
                    let task = Task {
                        key,
                        work: Work::Planned(plan),
                        generation: self.generation,
                    };
                    let outcome = self.builder.build(&task, ctx);
                    self.ready.insert((key.epoch, key.position), outcome);
                }
            }
        }
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
            seed: self.schedule.seed,
            epoch,
            position,
            rank: self.schedule.launch.rank,
        }
    }

    /// Submits tasks until the depth (within `cap`) is in flight, running ahead into later
    /// epochs.
    fn top_up(&mut self) -> Result<()> {
        let Some(pool) = &self.pool else {
            return Ok(());
        };
        if self.batches_per_epoch == 0 {
            return Ok(());
        }
        while self.in_flight < self.depth.limit(self.cap.cap, self.handed_over) {
            if self.submit_position == self.schedule.segment_batches(self.submit_start) {
                self.submit_epoch += 1;
                self.submit_start = 0;
                self.submit_position = 0;
                continue;
            }
            let (epoch, start, position) =
                (self.submit_epoch, self.submit_start, self.submit_position);
            self.submit_position += 1;
            if epoch == self.epoch && self.ahead.contains(&position) {
                continue; // delivered before a resume
            }
            let plan = self.plans.get(&self.schedule, &self.sampler, epoch, start);
            let parts = if self.split_left > 0 {
                self.split_left -= 1;
                pool.workers()
            } else {
                1
            };
            let task = Task {
                key: self.key(epoch, position),
                work: Work::Planned(plan),
                generation: self.generation,
            };
            pool.submit(task, parts)?;
            self.in_flight += 1;
        }
        Ok(())
    }
}

impl Scheduler for HostLoader {
    fn next(&mut self) -> Result<Option<Batch>> {
        self.next_within(self.timeout)
    }

    fn cursor(&self) -> Cursor {
        Cursor {
            epoch: self.epoch,
            start: self.start,
            position: self.position,
            ahead: self.ahead.iter().copied().collect(),
            stream: None,
        }
    }

    /// Makes the next batch the first of epoch `epoch`: in-flight work is discarded (queued
    /// tasks unbuilt, finished batches dropped). Nothing changes when the loader already stands
    /// at that epoch's start, or was just resumed into it (so the usual
    /// `set_epoch(e); for batch in loader` loop continues a resumed epoch).
    fn set_epoch(&mut self, epoch: u64) -> Result<()> {
        let at_start =
            self.epoch == epoch && self.start == 0 && self.position == 0 && self.ahead.is_empty();
        if at_start || (self.fresh && self.epoch == epoch) {
            return self.top_up();
        }
        self.discard_in_flight();
        self.epoch = epoch;
        self.start = 0;
        self.position = 0;
        self.ahead.clear();
        self.submit_epoch = epoch;
        self.submit_start = 0;
        self.submit_position = 0;
        self.fresh = false;
        self.top_up()
    }

    /// Moves delivery back to `cursor` (what the consumer of a prefetch thread, which ran
    /// ahead, last saw), discarding the work done past it. `fresh`: whether that consumer has
    /// had nothing from this loader yet.
    fn rewind_to(&mut self, cursor: &Cursor, fresh: bool) {
        self.discard_in_flight();
        self.epoch = cursor.epoch;
        self.start = cursor.start;
        self.position = cursor.position;
        self.ahead = cursor.ahead.iter().copied().collect();
        self.submit_epoch = cursor.epoch;
        self.submit_start = cursor.start;
        self.submit_position = cursor.position;
        self.fresh = fresh;
    }

    fn facts(&self) -> Facts {
        Facts {
            seed: self.schedule.seed,
            launch: self.schedule.launch,
            schedule: Some(self.schedule.clone()),
            batches_per_epoch: Some(self.batches_per_epoch),
            samples_per_epoch: Some(self.sampler.len()),
            source: Some(Arc::clone(&self.source)),
            fields: self.source.fields().to_vec(),
            stats: super::assembly::stats_handle(&self.builder, self.schedule.launch),
            streaming: false,
            closer: self.closer.clone(),
            device_batch_bytes: self.builder.device_batch_bytes,
            device_scratch_bytes: self.builder.collator.device_scratch_bytes(),
            casts_on_device: self.builder.collator.casts_on_device(),
            decodes_on_device: self.builder.collator.decodes_on_device(),
            replace: Builder::replacer(&self.builder),
        }
    }
}

/// The sampler in words, for resume messages.
fn sampler_text(sampler: &Sampler) -> String {
    use crate::sampler::SamplerKind;
    let order = match sampler.kind() {
        SamplerKind::Sequential => "sequential".to_owned(),
        SamplerKind::Random {
            replacement,
            num_samples,
        } => format!(
            "random, replacement={replacement}, num_samples={}",
            num_samples.map_or("dataset size".to_owned(), |n| n.to_string())
        ),
        SamplerKind::SubsetRandom { indices } => format!("subset of {} indices", indices.len()),
        SamplerKind::Indices { indices } => format!("{} explicit indices", indices.len()),
        SamplerKind::WeightedRandom {
            weights,
            num_samples,
            replacement,
        } => format!(
            "{} weights, num_samples={num_samples}, replacement={replacement}",
            weights.len()
        ),
        SamplerKind::QuasiRandom { window, .. } => {
            format!("quasi_random, windows of {window} pages")
        }
        SamplerKind::Distributed { .. } => "distributed".to_owned(),
    };
    format!("{order}, shard_drop_last={}", sampler.deal().drop_last)
}
