//! Closing a loader from another thread.
//!
//! Dropping (freeing) a loader stays with the thread that drives it: it joins the loader's
//! threads, and nothing else may touch the loader meanwhile. What any other thread may do is
//! *close* it through a [`Closer`]: every wait of the driving thread (for the pool's batches,
//! for a stream's workers, for the prefetch thread's device batches) also selects on this
//! signal, so a `next` blocked there returns [`Error::Closed`](crate::Error::Closed) at once,
//! and every later call does too. This is how a trainer's watchdog or signal handler stops a
//! consumer stuck on a stalled source.
//!
//! With `num_workers=0` the batch is built on the calling thread itself, which no signal can
//! interrupt: a close then takes effect when that build returns.
//!
//! In a child process forked after the loader was made, closing only marks it closed: no thread
//! of the child waits on it, and the trigger's lock may have been held by a parent thread at the
//! moment of the fork.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{select, Receiver, Sender};

use crate::fork::Origin;

/// Closes a loader from any thread (see [`crate::Loader::closer`]). Cheap to clone; closing
/// twice is closing once.
#[derive(Clone, Debug)]
pub struct Closer {
    signal: Arc<Signal>,
}

#[derive(Debug)]
struct Signal {
    closed: AtomicBool,
    /// The process the loader was made in.
    origin: Origin,
    /// Dropped by `close`: that disconnects `woken`, which wakes every `select` on it. Nothing
    /// is ever sent.
    trigger: Mutex<Option<Sender<()>>>,
    woken: Receiver<()>,
}

/// What a wait ended with.
pub(crate) enum Wait<T> {
    Got(T),
    TimedOut,
    /// Every sender is gone (the threads that would send have exited).
    Disconnected,
    Closed,
}

impl Closer {
    pub(crate) fn new() -> Closer {
        let (trigger, woken) = crossbeam_channel::bounded(0);
        Closer {
            signal: Arc::new(Signal {
                closed: AtomicBool::new(false),
                origin: Origin::here(),
                trigger: Mutex::new(Some(trigger)),
                woken,
            }),
        }
    }

    /// Closes the loader: a `next` waiting now returns `Error::Closed`, and so does every later
    /// call. The loader's threads are joined when the thread that drives it drops the loader.
    pub fn close(&self) {
        self.signal.closed.store(true, Ordering::Release);
        if self.signal.origin.is_forked() {
            return;
        }
        // A poisoned lock still holds the sender: take it all the same.
        let mut trigger = self
            .signal
            .trigger
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        drop(trigger.take());
    }

    /// Whether [`Closer::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.signal.closed.load(Ordering::Acquire)
    }

    /// Waits for a message on `rx`, at most `timeout` (`None`: without limit), or until the
    /// loader is closed.
    pub(crate) fn recv<T>(&self, rx: &Receiver<T>, timeout: Option<Duration>) -> Wait<T> {
        if self.is_closed() {
            return Wait::Closed;
        }
        let woken = &self.signal.woken;
        let got = match timeout {
            None => select! {
                recv(rx) -> msg => Some(msg),
                recv(woken) -> _ => None,
            },
            Some(t) => select! {
                recv(rx) -> msg => Some(msg),
                recv(woken) -> _ => None,
                default(t) => return Wait::TimedOut,
            },
        };
        match got {
            Some(Ok(msg)) => Wait::Got(msg),
            Some(Err(_)) => Wait::Disconnected,
            None => Wait::Closed,
        }
    }
}

/// The error of every call on a closed loader.
pub(crate) fn closed_error() -> crate::Error {
    crate::Error::Closed("the loader was closed".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_wait_returns_messages_timeouts_and_disconnection() {
        let closer = Closer::new();
        let (tx, rx) = crossbeam_channel::unbounded();
        tx.send(7).unwrap();
        assert!(matches!(closer.recv(&rx, None), Wait::Got(7)));
        assert!(matches!(
            closer.recv(&rx, Some(Duration::from_millis(10))),
            Wait::TimedOut
        ));
        drop(tx);
        assert!(matches!(closer.recv(&rx, None), Wait::Disconnected));
    }

    #[test]
    fn close_from_another_thread_wakes_a_wait_without_limit() {
        let closer = Closer::new();
        let (_tx, rx) = crossbeam_channel::unbounded::<u32>();
        let other = closer.clone();
        let start = Instant::now();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            other.close();
            other.close(); // twice is once
        });
        assert!(matches!(closer.recv(&rx, None), Wait::Closed));
        assert!(start.elapsed() < Duration::from_secs(30));
        t.join().unwrap();
        assert!(closer.is_closed());
        // Every later wait returns at once, even with a message waiting.
        let (tx, rx) = crossbeam_channel::unbounded();
        tx.send(1).unwrap();
        assert!(matches!(closer.recv(&rx, None), Wait::Closed));
    }
}
