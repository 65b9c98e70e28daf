//! A value per reading thread that a source keeps between reads (a Parquet column reader's place,
//! the last row group decoded): a worker that reads rows in order picks up where it stopped.
//!
//! A thread takes its value out while it reads and puts it back after, so no lock is held
//! during a read. Values are caches: when more threads than [`PerThread::limit`] have one (a
//! pool that autotune grew and shrank leaves the values of ended threads behind), the idle
//! values are dropped, and their threads start afresh.

use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::ThreadId;

/// One `T` per thread that read last (see the module docs).
pub(crate) struct PerThread<T> {
    values: Mutex<HashMap<ThreadId, T>>,
    limit: usize,
}

impl<T: Default> PerThread<T> {
    /// Keeps up to four values per core (workers, the caller's thread, the prefetch thread).
    pub(crate) fn new() -> PerThread<T> {
        let cores = std::thread::available_parallelism().map_or(8, |n| n.get());
        PerThread {
            values: Mutex::new(HashMap::new()),
            limit: 4 * cores.max(2),
        }
    }

    /// This thread's value (a default one the first time), taken out until [`put`](Self::put).
    pub(crate) fn take(&self) -> T {
        let me = std::thread::current().id();
        let taken = self.values.lock().ok().and_then(|mut v| v.remove(&me));
        taken.unwrap_or_default()
    }

    /// Puts this thread's value back.
    pub(crate) fn put(&self, value: T) {
        if let Ok(mut values) = self.values.lock() {
            if values.len() >= self.limit {
                values.clear();
            }
            values.insert(std::thread::current().id(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_gets_back_what_it_put_and_the_idle_ones_are_bounded() {
        let kept = PerThread::<Vec<u32>>::new();
        assert!(kept.take().is_empty());
        kept.put(vec![1]);
        assert_eq!(kept.take(), [1], "this thread's own value");
        kept.put(vec![2]);
        std::thread::scope(|s| {
            s.spawn(|| {
                assert!(kept.take().is_empty(), "another thread's is its own");
                kept.put(vec![3]);
            });
        });
        assert_eq!(kept.take(), [2]);
        for _ in 0..kept.limit * 2 {
            std::thread::scope(|s| {
                s.spawn(|| kept.put(vec![4]));
            });
        }
        assert!(kept.values.lock().unwrap().len() <= kept.limit);
    }
}
