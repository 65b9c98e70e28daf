//! Decompressed pages of a table's column chunks, shared by the reading threads.
//!
//! Shuffled rows are read a page each, and a page may hold a whole row group: pyarrow checks the
//! page size only every 1,024 values, so row groups of 100 images, as earlier releases of Hugging
//! Face `datasets` wrote image datasets, are one page each (`datasets` 5.2.0 writes
//! content-defined pages of 256 KiB to 1 MiB instead). Without this cache every shuffled row
//! decompressed its group again: 690-760 µs a row for 100 KB images against 10-14 µs in row
//! order, on one thread (`examples/parquet_reads.rs`). With it each page is decompressed once or
//! twice while its rows are read, least recently used dropped first, up to a byte budget. Only
//! pages of compressed chunks are kept: an uncompressed page is a slice of the mapped file and
//! costs nothing to read again.
//!
//! A page is kept on its second decompression within the last budget's worth of them, not its
//! first. When the rows read are spread over more pages than the budget holds (`order=random`
//! over a large table) few pages are read twice while kept, and keeping every page only churned
//! memory: with 50 MB kept of a 190 MB table, each miss decompressing into fresh memory, shuffled
//! reads were 1.4-1.6x slower than with none kept (one thread). Pages read again soon
//! (`order=quasi_random`'s window, a table that fits) are kept on their second read.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::errors::Result;

/// Where a page is: its file, row group and leaf column, and its place in the column chunk
/// (0 the first page, a dictionary page included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct PageKey {
    pub(super) file: usize,
    pub(super) group: usize,
    pub(super) leaf: usize,
    pub(super) page: usize,
}

/// Pages decompressed and not kept, remembered for their second decompression: at most this
/// many.
const MISSES_REMEMBERED: usize = 1 << 16;

/// The pages kept, within `budget` bytes of decompressed data.
pub(super) struct PageCache {
    budget: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Each page and the tick of its last use.
    pages: HashMap<PageKey, (Page, u64)>,
    /// The pages by last use, oldest first.
    by_use: BTreeMap<u64, PageKey>,
    bytes: usize,
    tick: u64,
    /// Pages decompressed once and not kept, with their sizes, within `budget` bytes and
    /// [`MISSES_REMEMBERED`] pages.
    missed: HashMap<PageKey, usize>,
    /// The keys of `missed`, oldest first (some since kept, or forgotten and missed again).
    missed_order: VecDeque<PageKey>,
    missed_bytes: usize,
}

impl State {
    /// The next use tick, with `key` filed under it.
    fn stamp(&mut self, key: PageKey) -> u64 {
        self.tick += 1;
        self.by_use.insert(self.tick, key);
        self.tick
    }
}

impl PageCache {
    /// A cache of `budget` bytes (0: none).
    pub(super) fn new(budget: u64) -> PageCache {
        PageCache {
            budget: usize::try_from(budget).unwrap_or(usize::MAX),
            state: Mutex::default(),
        }
    }

    /// The bytes of decompressed pages kept at most.
    pub(super) fn budget(&self) -> u64 {
        self.budget as u64
    }

    /// Bytes of decompressed pages held now.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing that can panic runs under the lock; a poisoned lock's state is whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, key: &PageKey) -> Option<Page> {
        let mut state = self.lock();
        let used = state.pages.get(key)?.1;
        state.by_use.remove(&used);
        let now = state.stamp(*key);
        let (page, used) = state.pages.get_mut(key)?;
        *used = now;
        Some(page.clone())
    }

    /// Keeps `page` (a clone shares its buffer) if it was decompressed once before, recently
    /// (see the module docs), dropping the least recently used pages until it fits; else
    /// remembers it. A page larger than the whole budget is not kept.
    fn put(&self, key: PageKey, page: &Page) {
        let size = page.buffer().len();
        if size > self.budget {
            return;
        }
        let mut state = self.lock();
        if state.pages.contains_key(&key) {
            return;
        }
        match state.missed.remove(&key) {
            Some(missed) => state.missed_bytes -= missed,
            None => {
                state.missed.insert(key, size);
                state.missed_order.push_back(key);
                state.missed_bytes += size;
                while state.missed_bytes > self.budget
                    || state.missed_order.len() > MISSES_REMEMBERED
                {
                    let Some(oldest) = state.missed_order.pop_front() else {
                        break;
                    };
                    // A key kept since, or forgotten and missed again (then this entry is not
                    // its latest), is forgotten now: its page is decompressed once more.
                    if let Some(missed) = state.missed.remove(&oldest) {
                        state.missed_bytes -= missed;
                    }
                }
                return;
            }
        }
        while state.bytes + size > self.budget {
            let Some((_, oldest)) = state.by_use.pop_first() else {
                break;
            };
            if let Some((dropped, _)) = state.pages.remove(&oldest) {
                state.bytes -= dropped.buffer().len();
            }
        }
        let now = state.stamp(key);
        state.pages.insert(key, (page.clone(), now));
        state.bytes += size;
    }

    /// `pages`, the page reader of the chunk `key` names (its `page` 0), taking pages from this
    /// cache (unless it has no room at all).
    pub(super) fn reader(
        self: &Arc<Self>,
        pages: Box<dyn PageReader>,
        key: PageKey,
    ) -> Box<dyn PageReader> {
        if self.budget == 0 {
            return pages;
        }
        Box::new(CachedPages {
            pages,
            cache: Arc::clone(self),
            next: key,
        })
    }
}

/// A column chunk's page reader that takes each page from the cache when it is there, stepping
/// its own reader past it by the header alone, and offers the cache each page it decompresses.
struct CachedPages {
    pages: Box<dyn PageReader>,
    cache: Arc<PageCache>,
    /// The next page's key.
    next: PageKey,
}

impl Iterator for CachedPages {
    type Item = Result<Page>;

    fn next(&mut self) -> Option<Result<Page>> {
        self.get_next_page().transpose()
    }
}

impl PageReader for CachedPages {
    fn get_next_page(&mut self) -> Result<Option<Page>> {
        let page = match self.cache.get(&self.next) {
            Some(page) => {
                self.pages.skip_next_page()?;
                Some(page)
            }
            None => {
                let page = self.pages.get_next_page()?;
                if let Some(page) = &page {
                    self.cache.put(self.next, page);
                }
                page
            }
        };
        self.next.page += 1;
        Ok(page)
    }

    fn peek_next_page(&mut self) -> Result<Option<PageMetadata>> {
        self.pages.peek_next_page()
    }

    fn skip_next_page(&mut self) -> Result<()> {
        self.pages.skip_next_page()?;
        self.next.page += 1;
        Ok(())
    }

    // Dictionary pages are not deferred (the trait's default): the column reader reads them
    // with `get_next_page`, from the cache.
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use bytes::Bytes;
    use parquet::basic::Encoding;

    fn page(len: usize) -> Page {
        Page::DictionaryPage {
            buf: Bytes::from(vec![7u8; len]),
            num_values: 1,
            encoding: Encoding::PLAIN,
            is_sorted: false,
        }
    }

    fn key(page: usize) -> PageKey {
        PageKey {
            file: 0,
            group: 0,
            leaf: 0,
            page,
        }
    }

    /// A chunk's pages, counting those it decompresses (`get_next_page`) and skips.
    struct Chunk {
        pages: Vec<Page>,
        next: usize,
        decompressed: Arc<AtomicUsize>,
        skipped: Arc<AtomicUsize>,
    }

    impl Iterator for Chunk {
        type Item = Result<Page>;

        fn next(&mut self) -> Option<Result<Page>> {
            self.get_next_page().transpose()
        }
    }

    impl PageReader for Chunk {
        fn get_next_page(&mut self) -> Result<Option<Page>> {
            let page = self.pages.get(self.next).cloned();
            self.next += 1;
            self.decompressed.fetch_add(1, Ordering::Relaxed);
            Ok(page)
        }

        fn peek_next_page(&mut self) -> Result<Option<PageMetadata>> {
            Ok(None)
        }

        fn skip_next_page(&mut self) -> Result<()> {
            self.next += 1;
            self.skipped.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    #[test]
    fn a_chunk_read_again_takes_its_pages_from_the_cache() {
        let cache = Arc::new(PageCache::new(1 << 20));
        let (decompressed, skipped) = (Arc::default(), Arc::default());
        let reader = |group: usize| {
            let chunk = Chunk {
                pages: (1..=3).map(page).collect(),
                next: 0,
                decompressed: Arc::clone(&decompressed),
                skipped: Arc::clone(&skipped),
            };
            let first = PageKey { group, ..key(0) };
            cache.reader(Box::new(chunk), first)
        };
        let lengths = |reader: Box<dyn PageReader>| -> Vec<usize> {
            reader.map(|p| p.unwrap().buffer().len()).collect()
        };
        let count = |c: &Arc<AtomicUsize>| c.load(Ordering::Relaxed);
        // Read once (three pages and the end), and again: each page kept on its second read.
        assert_eq!(lengths(reader(0)), [1, 2, 3]);
        assert_eq!((count(&decompressed), count(&skipped)), (4, 0));
        assert_eq!(lengths(reader(0)), [1, 2, 3]);
        assert_eq!((count(&decompressed), count(&skipped)), (8, 0));
        // Then each page comes from the cache, the chunk's own reader stepped past it unread.
        assert_eq!(lengths(reader(0)), [1, 2, 3]);
        assert_eq!((count(&decompressed), count(&skipped)), (9, 3));
        // A page skipped keeps the places of those after it.
        let mut fourth = reader(0);
        fourth.skip_next_page().unwrap();
        assert_eq!(fourth.get_next_page().unwrap().unwrap().buffer().len(), 2);
        assert_eq!((count(&decompressed), count(&skipped)), (9, 5));
        // Another row group's chunk is another chunk.
        assert_eq!(lengths(reader(1)), [1, 2, 3]);
        assert_eq!((count(&decompressed), count(&skipped)), (13, 5));
    }

    #[test]
    fn a_page_is_kept_on_its_second_decompression_within_a_budget_of_them() {
        let cache = PageCache::new(300);
        cache.put(key(0), &page(100));
        assert!(cache.get(&key(0)).is_none());
        cache.put(key(0), &page(100));
        assert!(cache.get(&key(0)).is_some());
        // Four pages missed once: 400 bytes, so the first of them is forgotten, and missed
        // again it is remembered again (forgetting page 2).
        for k in 1..=4 {
            cache.put(key(k), &page(100));
        }
        cache.put(key(1), &page(100));
        assert!(cache.get(&key(1)).is_none());
        cache.put(key(4), &page(100));
        assert!(cache.get(&key(4)).is_some());
        cache.put(key(2), &page(100));
        assert!(cache.get(&key(2)).is_none());
        assert_eq!(cache.bytes(), 200);
    }

    /// `page` kept: decompressed twice.
    fn keep(cache: &PageCache, k: usize, page: &Page) {
        cache.put(key(k), page);
        cache.put(key(k), page);
    }

    #[test]
    fn the_least_recently_used_pages_go_first_and_the_budget_holds() {
        let cache = PageCache::new(300);
        for k in 0..3 {
            keep(&cache, k, &page(100));
        }
        assert_eq!(cache.bytes(), 300);
        // Page 0 used again: page 1 is now the oldest and goes for page 3.
        assert!(cache.get(&key(0)).is_some());
        keep(&cache, 3, &page(100));
        assert!(cache.get(&key(1)).is_none());
        for k in [0, 2, 3] {
            assert_eq!(
                cache.get(&key(k)).map(|p| p.buffer().len()),
                Some(100),
                "page {k}"
            );
        }
        // A larger page drops as many as it needs, oldest first: 0, then 2.
        keep(&cache, 4, &page(150));
        assert_eq!(cache.bytes(), 250);
        assert!(cache.get(&key(0)).is_none() && cache.get(&key(2)).is_none());
        assert!(cache.get(&key(3)).is_some() && cache.get(&key(4)).is_some());
        // A page larger than the budget is not kept, and drops nothing.
        keep(&cache, 5, &page(301));
        assert!(cache.get(&key(5)).is_none());
        assert_eq!(cache.bytes(), 250);
    }
}
