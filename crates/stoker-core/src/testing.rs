//! Test doubles and helpers shared by the tests of every crate (feature `testing`, off by
//! default: nothing here is in a normal build).

use std::sync::Arc;

use crate::dtype::DType;
use crate::source::{MemorySource, Source};

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
