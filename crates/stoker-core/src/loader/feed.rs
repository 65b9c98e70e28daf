//! The streaming scheduler's feed: the one thread (or, with `num_workers=0`, the caller) that
//! reads this rank's stream in order through the seeded shuffle buffer and cuts it into batches
//! of owned samples, one in-flight token each (see [`super::stream`]).

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::buffer::ShuffleBuffer;
use crate::collate::BatchKey;
use crate::error::{panic_message, Error, Result};
use crate::options::LoaderOptions;
use crate::pool::{Built, Done, Inlet, Task, Work};
use crate::rng::{Rng, Stream};
use crate::source::streaming::{EpochStream, OwnedSample, StreamSource};
use crate::stats::StatsRecorder;

type Samples = Vec<Box<dyn OwnedSample>>;

/// What the feeder produces next.
pub(super) enum Cut {
    /// A batch of samples to build; `state` is the stream's position after its last sample.
    Batch {
        key: BatchKey,
        samples: Samples,
        state: Option<String>,
    },
    /// A batch that failed before it had samples (the epoch's stream did not open); the epoch
    /// ends after it.
    Failed { key: BatchKey, error: Error },
    /// The epoch `epoch` has `batches` batches.
    End { epoch: u64, batches: usize },
}

/// Where a resumed loader starts.
pub(super) struct Restart {
    pub(super) epoch: u64,
    pub(super) position: usize,
    pub(super) ahead: BTreeSet<usize>,
    /// The stream's own position after batch `position - 1` (then no replay).
    pub(super) state: Option<String>,
}

/// The stream reader and batch cutter: runs on the feeder thread, or in the caller's thread
/// with `num_workers=0`.
pub(super) struct Feed {
    source: Arc<dyn StreamSource>,
    seed: u64,
    rank: usize,
    batch_size: usize,
    drop_last: bool,
    buffer_capacity: usize,
    /// Ask the stream for its position after each batch (a resumable, unbuffered iterable).
    want_states: bool,
    epoch: u64,
    /// Next batch position to cut in `epoch`.
    position: usize,
    stream: Option<Box<dyn EpochStream>>,
    buffer: ShuffleBuffer<Box<dyn OwnedSample>>,
    stream_done: bool,
    /// The epoch's stream failed to open: it ends after the failed batch.
    broken: bool,
    restart: Option<Restart>,
}

impl Feed {
    /// A feed of `source` for `rank` that starts at `epoch` (and, resumed, skips what `restart`
    /// says was delivered).
    pub(super) fn new(
        source: Arc<dyn StreamSource>,
        options: &LoaderOptions,
        seed: u64,
        rank: usize,
        want_states: bool,
        epoch: u64,
        restart: Option<Restart>,
    ) -> Feed {
        Feed {
            source,
            seed,
            rank,
            batch_size: options.batch_size,
            drop_last: options.drop_last,
            buffer_capacity: options.shuffle_buffer,
            want_states,
            epoch,
            position: 0,
            stream: None,
            buffer: ShuffleBuffer::new(0, Rng::for_key(seed, Stream::Buffer, 0, 0)),
            stream_done: false,
            broken: false,
            restart,
        }
    }

    fn buffer_for(&self, epoch: u64) -> ShuffleBuffer<Box<dyn OwnedSample>> {
        let rng = Rng::for_key(self.seed, Stream::Buffer, epoch, self.rank as u64);
        ShuffleBuffer::new(self.buffer_capacity, rng)
    }

    fn key(&self, position: usize) -> BatchKey {
        BatchKey {
            seed: self.seed,
            epoch: self.epoch,
            position,
            rank: self.rank,
        }
    }

    /// Whether batch `position` of the current epoch was delivered before a resume.
    fn delivered_before(&self, position: usize) -> bool {
        match &self.restart {
            Some(r) if r.epoch == self.epoch => {
                position < r.position || r.ahead.contains(&position)
            }
            _ => false,
        }
    }

    /// The next sample out of the buffer.
    fn pull(&mut self) -> Option<Box<dyn OwnedSample>> {
        while !self.stream_done {
            let stream = self.stream.as_mut()?;
            match stream.next_sample() {
                Some(sample) => {
                    if let Some(out) = self.buffer.offer(sample) {
                        return Some(out);
                    }
                }
                None => self.stream_done = true,
            }
        }
        self.buffer.drain_one()
    }

    /// The next cut. A panic in the stream (the user's iterable) fails the batch being cut and
    /// ends the epoch after it, as a stream that fails to open does: the feeder goes on, and the
    /// next epoch opens a new stream.
    pub(super) fn next_cut(&mut self) -> Cut {
        match catch_unwind(AssertUnwindSafe(|| self.cut())) {
            Ok(cut) => cut,
            Err(panic) => {
                self.stream = None;
                self.broken = true;
                let key = self.key(self.position);
                self.position += 1;
                Cut::Failed {
                    key,
                    error: Error::Internal(format!(
                        "panic while reading the stream of epoch {} for batch {}: {}",
                        key.epoch,
                        key.position,
                        panic_message(&*panic)
                    )),
                }
            }
        }
    }

    fn cut(&mut self) -> Cut {
        loop {
            if self.stream.is_none() && !self.broken {
                let (resume, given) = match &self.restart {
                    Some(r) if r.epoch == self.epoch && r.state.is_some() => {
                        self.position = r.position;
                        (r.state.clone(), (r.position * self.batch_size) as u64)
                    }
                    _ => (None, 0),
                };
                match self.source.open(self.epoch, resume.as_deref(), given) {
                    Ok(stream) => {
                        self.stream = Some(stream);
                        self.stream_done = false;
                        self.buffer = self.buffer_for(self.epoch);
                    }
                    Err(error) => {
                        self.broken = true;
                        let key = self.key(self.position);
                        self.position += 1;
                        return Cut::Failed { key, error };
                    }
                }
            }
            let mut samples = Vec::with_capacity(self.batch_size);
            if !self.broken {
                while samples.len() < self.batch_size {
                    match self.pull() {
                        Some(s) => samples.push(s),
                        None => break,
                    }
                }
            }
            if samples.is_empty() || (samples.len() < self.batch_size && self.drop_last) {
                let end = Cut::End {
                    epoch: self.epoch,
                    batches: self.position,
                };
                if self.restart.as_ref().is_some_and(|r| r.epoch == self.epoch) {
                    self.restart = None;
                }
                self.epoch += 1;
                self.position = 0;
                self.stream = None;
                self.broken = false;
                return end;
            }
            let position = self.position;
            self.position += 1;
            if self.delivered_before(position) {
                continue; // replayed: read, not built
            }
            let state = match (self.want_states, self.stream.as_mut()) {
                // A state that cannot be saved only costs a replay on resume.
                (true, Some(stream)) => stream.state().ok().flatten(),
                _ => None,
            };
            return Cut::Batch {
                key: self.key(position),
                samples,
                state,
            };
        }
    }
}

impl Cut {
    /// Hands this cut to the pool: a batch to build, or what the scheduler learns without
    /// building (a failed batch, an epoch's end). `false` once the pool is gone.
    pub(super) fn send(self, inlet: &Inlet) -> bool {
        match self {
            Cut::Batch {
                key,
                samples,
                state,
            } => inlet.submit(Task {
                key,
                work: Work::Owned { samples, state },
                generation: 0,
            }),
            Cut::Failed { key, error } => inlet.pass(Done::Built(Built {
                key,
                generation: 0,
                outcome: Err(error),
                state: None,
            })),
            Cut::End { epoch, batches } => inlet.pass(Done::End { epoch, batches }),
        }
    }
}

/// The feeder thread (`num_workers ≥ 1`): reads the stream and cuts batches into the pool, one
/// token each.
pub(super) struct Feeder {
    /// Tokens go back to the feeder as batches are delivered; dropping it ends the feeder.
    tokens: Option<Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl Feeder {
    /// Starts the feeder with `tokens` tokens; more may be given later, up to `capacity` in all.
    pub(super) fn start(
        mut feed: Feed,
        inlet: Inlet,
        stats: Arc<StatsRecorder>,
        capacity: usize,
        tokens: usize,
    ) -> Result<Feeder> {
        let (token_tx, token_rx) = crossbeam_channel::bounded::<()>(capacity);
        for _ in 0..tokens.min(capacity) {
            // Cannot fail: the channel holds `capacity`.
            let _ = token_tx.send(());
        }
        let handle = std::thread::Builder::new()
            .name("stoker-feeder".into())
            .spawn(move || {
                while take_token(&token_rx, &stats) {
                    if !feed.next_cut().send(&inlet) {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Internal(format!("starting the feeder thread: {e}")))?;
        Ok(Feeder {
            tokens: Some(token_tx),
            handle: Some(handle),
        })
    }

    pub(super) fn give_token(&self) {
        if let Some(tokens) = &self.tokens {
            // The feeder may be gone (shutting down); then there is no one to give it to.
            let _ = tokens.try_send(());
        }
    }
}

/// Waits for a token; `false` once the consumer is gone. Time spent waiting is the feeder held
/// back by the in-flight depth, which the depth weighs against the consumer's waits.
fn take_token(tokens: &Receiver<()>, stats: &StatsRecorder) -> bool {
    match tokens.try_recv() {
        Ok(()) => true,
        Err(TryRecvError::Disconnected) => false,
        Err(TryRecvError::Empty) => {
            let idle = Instant::now();
            let got = tokens.recv().is_ok();
            stats.held_back(idle.elapsed());
            got
        }
    }
}

impl Drop for Feeder {
    /// Ends the feeder: waiting for a token, it sees the channel closed; cutting a batch, it
    /// ends after it (its sends never wait: the tokens bound them within the pool's queues).
    fn drop(&mut self) {
        drop(self.tokens.take());
        if let Some(handle) = self.handle.take() {
            // A panic in the stream's own code ended the feeder already; nothing to add.
            let _ = handle.join();
        }
    }
}
