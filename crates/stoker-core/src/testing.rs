//! Test doubles and helpers shared by the tests of every crate (feature `testing`, off by
//! default: nothing here is in a normal build).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dtype::DType;
use crate::error::Result;
use crate::source::{FieldSpec, MemorySource, Sample, Source};

pub use crate::cuda::{FailAt, FakeCounters, FakeDevice};

/// `n` samples: field `x` = `[i, i+1, i+2]` as int64, field `y` = `i` as uint8 (wrapping).
pub fn counting_source(n: usize) -> Arc<dyn Source> {
    let x: Vec<u8> = (0..n as i64)
        .flat_map(|i| [i, i + 1, i + 2])
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let y: Vec<u8> = (0..n).map(|i| i as u8).collect();
    Arc::new(
        MemorySource::new()
            .with_tensor("x", DType::I64, &[3], x)
            .expect("x is n rows of 3 int64")
            .with_tensor("y", DType::U8, &[], y)
            .expect("y is n bytes"),
    )
}

/// The sample indices of a batch of [`counting_source`]: its `x[:, 0]`.
pub fn counting_indices(batch: &crate::Batch) -> Vec<i64> {
    batch
        .field_by_name("x")
        .and_then(|f| f.data)
        .map(|data| {
            data.chunks_exact(24)
                .map(|row| i64::from_ne_bytes(row[..8].try_into().expect("8 bytes")))
                .collect()
        })
        .unwrap_or_default()
}

/// `inner` with every read taking at least `delay`: a slow disk or network.
pub struct SlowRead {
    /// The source read.
    pub inner: Arc<dyn Source>,
    /// Least time each read takes.
    pub delay: Duration,
}

impl Source for SlowRead {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn fields(&self) -> &[FieldSpec] {
        self.inner.fields()
    }
    fn describe(&self, index: usize) -> String {
        self.inner.describe(index)
    }
    fn read<'a>(&'a self, index: usize, scratch: &'a mut Vec<u8>) -> Result<Sample<'a>> {
        std::thread::sleep(self.delay);
        self.inner.read(index, scratch)
    }
}

/// [`counting_source`] of `n` samples behind a [`SlowRead`] of `delay`.
pub fn slow_counting_source(n: usize, delay: Duration) -> Arc<dyn Source> {
    Arc::new(SlowRead {
        inner: counting_source(n),
        delay,
    })
}

/// Waits until `cond` holds (the loader's threads run concurrently), failing the test after
/// `limit` with what was awaited.
pub fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}
