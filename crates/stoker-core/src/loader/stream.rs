//! The streaming scheduler: stream → shuffle buffer → batches built by the workers.
//!
//! For tar shards in streaming mode and iterable sources. Each epoch, this rank's stream (see
//! [`crate::source::streaming`]) is read by one thread, the *feeder* ([`super::feed`]), in
//! order; its samples pass through the seeded shuffle buffer and are cut into batches of owned
//! samples, which the worker threads build (decode, transform, collate) in parallel. Reading is
//! sequential and single-threaded per rank on purpose: which samples make up batch `k` of an
//! epoch depends only on `(seed, epoch, rank, world_size)`, never on `num_workers`, and with
//! `num_workers=0` everything runs in the caller's thread and gives the same batches.
//!
//! The workers are the host scheduler's: the same [`Pool`] (whose `resize` autotune uses) and
//! everything else made by [`super::assembly`] (collator, arena, stats and trace, the memory
//! budget's cap, the autotune controller). The feeder hands the pool its batches through an
//! [`Inlet`]; they are never split (a batch is cut when its samples are read, so there is no
//! idle time a split would fill).
//!
//! In flight: the feeder takes a token for every batch it cuts (and for every epoch end); the
//! consumer returns it when it delivers that batch. There are as many tokens as the in-flight
//! depth allows (see [`super::depth`]: `workers + 1` at first, one more each time it deepens, at
//! most `cap`), so at most that many batches are cut and not delivered, and memory holds at most
//! the buffer's `N` samples plus that many batches of encoded samples. When autotune lowers the
//! cap, returned tokens are withheld until the tokens out are within it again. The feeder runs
//! ahead into the next epoch like the host scheduler.
//!
//! Resume: the epoch, the batches delivered (`position`, and `ahead` with `in_order=false`) and,
//! for an iterable source that saves its position while unbuffered, that position. Otherwise the
//! epoch's stream and buffer are replayed from the start: samples are read again but batches
//! already delivered are not built.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::assembly::{Cap, Mode, Resolved, Samples as Collated};
use super::depth::Depth;
use super::feed::{Cut, Feed, Feeder, Restart};
use super::host::Cursor;
use super::{Facts, Scheduler};
use crate::batch::Batch;
use crate::close::Closer;
use crate::cuda::{HostBatches, Pulled};
use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::options::{LoaderOptions, OpenedSource};
use crate::pool::{Builder, Done, Pool, Task, Work, WorkerCtx};
use crate::resume::{Position, ResumeState};
use crate::sampler::batches_for;
use crate::source::streaming::StreamSource;
use crate::stats::StatsRecorder;

/// A batch ready to deliver.
struct Ready {
    outcome: Result<Batch>,
    state: Option<String>,
}

/// The streaming pipeline of host batches.
pub(super) struct StreamLoader {
    record_delivery: bool,
    source: Arc<dyn StreamSource>,
    builder: Arc<Builder>,
    seed: u64,
    batches_per_epoch: Option<usize>,
    samples_per_epoch: Option<usize>,
    /// `num_workers=0`: the feed, run in `next()`.
    inline: Option<Feed>,
    /// The feeder thread (`num_workers ≥ 1`); ended before the pool (see `Drop`).
    feeder: Option<Feeder>,
    /// The workers (`num_workers ≥ 1`).
    pool: Option<Pool>,
    /// The calling thread's context when it builds batches (`num_workers=0`).
    ctx: Option<WorkerCtx>,
    in_order: bool,
    timeout: Option<Duration>,
    /// The in-flight cap (moved by autotune).
    cap: Cap,
    depth: Depth,
    /// Tokens out: in the channel, held by the feeder, or by batches cut and not delivered.
    tokens: usize,
    /// The token of the batch the last call handed over, returned when the consumer asks again
    /// (see the host scheduler's `handed_over`).
    token_owed: bool,
    /// The epoch being delivered, and which of its batches have been.
    epoch: u64,
    position: usize,
    ahead: BTreeSet<usize>,
    /// The stream's position after batch `position - 1`, and after each batch in `ahead`.
    state: Option<String>,
    ahead_states: BTreeMap<usize, Option<String>>,
    ready: BTreeMap<(u64, usize), Ready>,
    /// Batches of each epoch the feeder has finished.
    ends: BTreeMap<u64, usize>,
    stats: Arc<StatsRecorder>,
    launch: Launch,
    /// Resumed, and nothing delivered since (see [`Scheduler::set_epoch`]).
    fresh: bool,
    /// Wakes the consumer's wait when the loader is closed from another thread.
    closer: Closer,
}

impl Drop for StreamLoader {
    /// Ends the feeder before the pool: the feeder holds the pool's inlet, whose queues stay
    /// open while it lives.
    fn drop(&mut self) {
        drop(self.feeder.take());
        drop(self.pool.take());
    }
}

impl StreamLoader {
    pub(super) fn new(options: &LoaderOptions, launch: Launch, mode: Mode) -> Result<StreamLoader> {
        let resolved = Resolved::new(options, launch, mode)?;
        let resume = options
            .resume_state
            .as_deref()
            .map(ResumeState::parse)
            .transpose()?;
        let launch = resolved.launch;
        // A streaming state: (epoch, this rank's batch position, absolute `ahead` positions,
        // batches per epoch, the stream's own state).
        let resume = match resume {
            None => None,
            Some(ResumeState {
                seed,
                epoch,
                at:
                    Position::Stream {
                        position,
                        world_size,
                        batches_per_epoch,
                        state,
                    },
                ahead,
            }) => {
                if world_size != launch.world_size {
                    return Err(Error::option(
                        "resume_state",
                        format!(
                            "was saved by a streaming loader at world_size {world_size}, but this one has world_size {}: each rank reads its own stream, so a streaming state resumes (by replay) at the same world size only",
                            launch.world_size
                        ),
                    ));
                }
                Some((seed, epoch, position, ahead, batches_per_epoch, state))
            }
            Some(_) => {
                return Err(Error::option(
                    "resume_state",
                    "saved by an indexed loader, but this one streams (shuffle_buffer or an iterable source): the options differ",
                ));
            }
        };
        let seed = resume.as_ref().map_or(options.seed, |s| s.0);
        let (start_epoch, start_state, start_given) = match &resume {
            Some((_, epoch, position, _, _, state)) => (
                *epoch,
                state.clone(),
                (*position * options.batch_size) as u64,
            ),
            None => (0, None, 0),
        };
        let opened = options.open_source(
            &resolved.launch,
            seed,
            start_epoch,
            start_state.as_deref(),
            if start_state.is_some() {
                start_given
            } else {
                0
            },
        )?;
        let OpenedSource::Stream(source) = opened.source else {
            return Err(Error::Internal(
                "the streaming scheduler was given a map-style source".into(),
            ));
        };
        let samples_per_epoch = source.samples_per_epoch();
        let batches_per_epoch =
            samples_per_epoch.map(|n| batches_for(n, options.batch_size, options.drop_last));
        // The feeder's waits for tokens are what the depth holds back, not the workers'.
        let parts = resolved.assemble(
            options,
            Collated::Streamed(source.fields()),
            samples_per_epoch,
            opened.damaged.len() as u64,
            false,
        )?;

        let want_states = source.restores_state() && options.shuffle_buffer == 0;
        let mut loader = StreamLoader {
            record_delivery: !resolved.feed,
            source: Arc::clone(&source),
            builder: parts.builder,
            seed,
            batches_per_epoch,
            samples_per_epoch,
            inline: None,
            feeder: None,
            pool: parts.pool,
            ctx: parts.local,
            in_order: options.in_order,
            timeout: resolved.timeout,
            cap: parts.cap,
            depth: parts.depth,
            tokens: 0,
            token_owed: false,
            epoch: 0,
            position: 0,
            ahead: BTreeSet::new(),
            state: None,
            ahead_states: BTreeMap::new(),
            ready: BTreeMap::new(),
            ends: BTreeMap::new(),
            stats: parts.stats,
            launch,
            fresh: false,
            closer: Closer::new(),
        };
        let mut restart = None;
        if let Some((_, epoch, position, ahead, saved, stream_state)) = resume {
            let saved = saved.unwrap_or(usize::MAX);
            let ours = batches_per_epoch.unwrap_or(usize::MAX);
            if saved != ours
                || (ours != usize::MAX && (position > ours || ahead.iter().any(|&p| p >= ours)))
                || ahead.iter().any(|&p| p <= position)
            {
                return Err(Error::option(
                    "resume_state",
                    format!(
                        "saved by a loader with {} batches per epoch at position {}, but this loader has {}: the source, ranks, batch_size or drop_last differ",
                        count(saved),
                        position,
                        count(ours)
                    ),
                ));
            }
            loader.epoch = epoch;
            loader.position = position;
            loader.ahead = ahead.iter().copied().collect();
            loader.state = stream_state.filter(|_| want_states);
            loader.fresh = true;
            restart = Some(Restart {
                epoch,
                position,
                ahead: loader.ahead.clone(),
                state: loader.state.clone(),
            });
        }
        let feed = Feed::new(
            source,
            options,
            seed,
            launch.rank,
            want_states,
            loader.epoch,
            restart,
        );
        match &loader.pool {
            None => loader.inline = Some(feed),
            Some(pool) => {
                loader.tokens = loader.depth.of(loader.cap.cap);
                loader.feeder = Some(Feeder::start(
                    feed,
                    pool.inlet()?,
                    Arc::clone(&loader.stats),
                    parts.capacity,
                    loader.tokens,
                )?);
            }
        }
        Ok(loader)
    }

    fn next_within(&mut self, timeout: Option<Duration>) -> Result<Option<Batch>> {
        let start = Instant::now();
        if std::mem::take(&mut self.token_owed) {
            self.return_token();
        }
        loop {
            if self.ends.get(&self.epoch) == Some(&self.position) {
                self.ends.remove(&self.epoch);
                self.return_token();
                self.epoch += 1;
                self.position = 0;
                self.ahead.clear();
                self.ahead_states.clear();
                self.state = None;
                return Ok(None);
            }
            let next = super::take_ready(&mut self.ready, self.in_order, self.epoch, self.position);
            if let Some((position, ready)) = next {
                if self.depth.counts_handed_over(self.cap.cap) {
                    self.token_owed = true;
                } else {
                    self.return_token();
                }
                if self.pool.is_some() && self.depth.delivered(self.cap.cap) {
                    self.stats.set_depth(self.depth.of(self.cap.cap));
                }
                self.cap
                    .tune(self.pool.as_mut(), &mut self.depth, &self.stats)?;
                // Deeper, or more workers: more tokens out.
                self.add_tokens();
                self.mark_delivered(position, ready.state);
                let batch = ready.outcome?;
                if self.record_delivery {
                    self.stats.delivered(&batch, start);
                }
                return Ok(Some(batch));
            }
            if let Some(feed) = self.inline.as_mut() {
                match feed.next_cut() {
                    Cut::Batch {
                        key,
                        samples,
                        state,
                    } => {
                        let ctx = self.ctx.as_mut().ok_or_else(|| {
                            Error::Internal("no worker context for num_workers=0".into())
                        })?;
                        let task = Task {
                            key,
                            work: Work::Owned {
                                samples,
                                state: None,
                            },
                            generation: 0,
                        };
                        let mut outcome = self.builder.build(&task, ctx);
                        // The samples' memory goes before the batch waits to be delivered,
                        // unless the batch keeps them (see `Task::settle`).
                        task.settle(&mut outcome, &self.builder);
                        self.ready
                            .insert((key.epoch, key.position), Ready { outcome, state });
                    }
                    Cut::Failed { key, error } => {
                        self.ready.insert(
                            (key.epoch, key.position),
                            Ready {
                                outcome: Err(error),
                                state: None,
                            },
                        );
                    }
                    Cut::End { epoch, batches } => {
                        self.ends.insert(epoch, batches);
                    }
                }
                continue;
            }
            let Some(pool) = &self.pool else {
                return Err(Error::Internal("a streaming loader with no feed".into()));
            };
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
                    // Nothing delivered yet: the consumer waits, which the depth weighs (the
                    // feeder is the one builder its tokens hold back).
                    let blocked = Instant::now();
                    let done = pool.recv(remaining, &self.closer);
                    self.depth
                        .waited(blocked.elapsed(), self.stats.held_back_ns(), 1);
                    done.map_err(|e| match (e, timeout) {
                        (Error::Timeout(_), Some(t)) => Error::Timeout(t.as_millis() as u64),
                        (e, _) => e,
                    })?
                }
            };
            match done {
                Done::Built(built) => {
                    self.ready.insert(
                        (built.key.epoch, built.key.position),
                        Ready {
                            outcome: built.outcome,
                            state: built.state,
                        },
                    );
                }
                Done::End { epoch, batches } => {
                    self.ends.insert(epoch, batches);
                }
            }
        }
    }

    /// The token of a batch delivered (or of an epoch's end) goes back to the feeder, unless
    /// more are out than the depth now allows (autotune lowered the cap): then it is withheld.
    fn return_token(&mut self) {
        let Some(feeder) = &self.feeder else {
            return;
        };
        if self.tokens > self.depth.of(self.cap.cap) {
            self.tokens -= 1;
        } else {
            feeder.give_token();
        }
    }

    /// Gives the feeder tokens until as many are out as the depth allows.
    fn add_tokens(&mut self) {
        let Some(feeder) = &self.feeder else {
            return;
        };
        while self.tokens < self.depth.of(self.cap.cap) {
            feeder.give_token();
            self.tokens += 1;
        }
    }

    fn mark_delivered(&mut self, position: usize, state: Option<String>) {
        self.fresh = false;
        if position == self.position {
            self.state = state;
            self.position += 1;
            while self.ahead.remove(&self.position) {
                self.state = self.ahead_states.remove(&self.position).flatten();
                self.position += 1;
            }
        } else {
            self.ahead.insert(position);
            self.ahead_states.insert(position, state);
        }
    }
}

/// A batch count for messages.
fn count(n: usize) -> String {
    if n == usize::MAX {
        "an unknown number of".into()
    } else {
        n.to_string()
    }
}

impl HostBatches for StreamLoader {
    type Mark = Cursor;

    fn pull(&mut self, poll: Duration) -> Pulled<Cursor> {
        match self.next_within(Some(poll)) {
            Err(Error::Timeout(_)) => Pulled::Idle,
            item => Pulled::Item(item, self.cursor()),
        }
    }
}

impl Scheduler for StreamLoader {
    fn next(&mut self) -> Result<Option<Batch>> {
        self.next_within(self.timeout)
    }

    fn cursor(&self) -> Cursor {
        Cursor {
            epoch: self.epoch,
            position: self.position,
            start: 0,
            ahead: self.ahead.iter().copied().collect(),
            stream: self.state.clone(),
        }
    }

    fn facts(&self) -> Facts {
        Facts {
            seed: self.seed,
            launch: self.launch,
            schedule: None,
            batches_per_epoch: self.batches_per_epoch,
            samples_per_epoch: self.samples_per_epoch,
            source: None,
            fields: self.source.fields().to_vec(),
            stats: super::assembly::stats_handle(&self.builder, self.launch),
            streaming: true,
            closer: self.closer.clone(),
            device_batch_bytes: self.builder.device_batch_bytes,
            device_scratch_bytes: self.builder.collator.device_scratch_bytes(),
            casts_on_device: self.builder.collator.casts_on_device(),
            decodes_on_device: self.builder.collator.decodes_on_device(),
            replace: Builder::replacer(&self.builder),
        }
    }

    fn set_epoch(&mut self, epoch: u64) -> Result<()> {
        check_set_epoch(&self.cursor(), self.fresh, epoch)
    }

    /// Not called by [`super::Loader`], which checks a streaming loader's `set_epoch` on the
    /// consumer's side (a stream cannot rewind what the prefetch thread copied ahead); it
    /// moves the cursor only.
    fn rewind_to(&mut self, cursor: &Cursor, fresh: bool) {
        self.epoch = cursor.epoch;
        self.position = cursor.position;
        self.ahead = cursor.ahead.iter().copied().collect();
        self.state = cursor.stream.clone();
        self.fresh = fresh;
    }
}

/// `set_epoch(epoch)` on a streaming loader whose consumer stands at `cursor` (`fresh`: resumed
/// or made, and nothing delivered since). A stream is read in order, once per epoch: the next
/// batch can be the first of `epoch` when the loader stands at that epoch's start (or was just
/// resumed into it), the usual `set_epoch(e)` before each epoch's loop; nothing changes then.
/// Jumping elsewhere would mean reopening the streams mid-flight, which is refused.
pub(super) fn check_set_epoch(cursor: &Cursor, fresh: bool, epoch: u64) -> Result<()> {
    let at_start = cursor.epoch == epoch && cursor.position == 0 && cursor.ahead.is_empty();
    if at_start || (fresh && cursor.epoch == epoch) {
        return Ok(());
    }
    Err(Error::Unsupported(format!(
        "set_epoch({epoch}) on a streaming loader (shuffle_buffer or an iterable source) that stands at batch {} of epoch {}: a stream moves to an epoch only from that epoch's start; make a new loader (with resume_state to continue elsewhere)",
        cursor.position, cursor.epoch
    )))
}
