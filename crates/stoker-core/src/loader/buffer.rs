//! The shuffle buffer of streaming mode (WebDataset's `shuffle(N)`): a stream read in order
//! leaves in a random order, using memory for `N` samples only.
//!
//! Filling: the first `N` samples wait in the buffer. Then each new sample takes the place of a
//! uniformly chosen one, which leaves. At the end of the stream the rest leave in random order.
//! The choices come from one generator seeded by `(seed, epoch, rank)`, so the order is a
//! function of those and of the stream alone. `N = 1` keeps the stream's order (each sample
//! leaves when the next arrives); `N = 0` is no buffer at all.

use crate::rng::Rng;

pub(super) struct ShuffleBuffer<T> {
    capacity: usize,
    items: Vec<T>,
    rng: Rng,
}

impl<T> ShuffleBuffer<T> {
    pub fn new(capacity: usize, rng: Rng) -> ShuffleBuffer<T> {
        ShuffleBuffer {
            capacity,
            // Grows as samples arrive: a buffer larger than the stream costs only what it holds.
            items: Vec::new(),
            rng,
        }
    }

    /// Takes `item`; gives back the one that leaves, if one does.
    pub fn offer(&mut self, item: T) -> Option<T> {
        if self.items.len() < self.capacity {
            self.items.push(item);
            return None;
        }
        if self.capacity == 0 {
            return Some(item);
        }
        let j = self.rng.below(self.items.len() as u64) as usize;
        Some(std::mem::replace(&mut self.items[j], item))
    }

    /// After the stream's end: a random one of those left, until none is.
    pub fn drain_one(&mut self) -> Option<T> {
        if self.items.is_empty() {
            return None;
        }
        let j = self.rng.below(self.items.len() as u64) as usize;
        Some(self.items.swap_remove(j))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Stream;

    fn run(capacity: usize, n: usize, seed: u64) -> Vec<usize> {
        let mut b = ShuffleBuffer::new(capacity, Rng::for_key(seed, Stream::Buffer, 0, 0));
        let mut out: Vec<usize> = (0..n).filter_map(|i| b.offer(i)).collect();
        while let Some(x) = b.drain_one() {
            out.push(x);
        }
        out
    }

    #[test]
    fn every_item_leaves_once_in_a_seeded_order() {
        for capacity in [0, 1, 2, 7, 100, 1000] {
            let out = run(capacity, 300, 5);
            let mut sorted = out.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..300).collect::<Vec<_>>(), "capacity {capacity}");
            assert_eq!(out, run(capacity, 300, 5));
        }
        assert_eq!(run(0, 50, 1), (0..50).collect::<Vec<_>>());
        assert_eq!(run(1, 50, 1), (0..50).collect::<Vec<_>>());
        assert_ne!(run(16, 50, 1), (0..50).collect::<Vec<_>>());
        assert_ne!(run(16, 50, 1), run(16, 50, 2));
    }

    #[test]
    fn an_item_leaves_no_earlier_than_the_buffer_allows() {
        // With capacity N, output k is one of the first k + N + 1 inputs.
        let out = run(10, 500, 3);
        for (k, &x) in out.iter().enumerate().take(490) {
            assert!(x <= k + 10, "output {k} is input {x}");
        }
    }
}
