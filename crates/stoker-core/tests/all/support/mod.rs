//! Helpers shared by the integration tests.

pub mod files;

use std::sync::Arc;

use stoker_core::testing::FakeDevice;
use stoker_core::{Batch, LoaderOptions, Source, SourceSpec};

pub use stoker_core::testing::counting_source;

/// Options over `source` with the string options `kv` set.
pub fn options(source: Arc<dyn Source>, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(source));
    for (k, v) in kv {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    o
}

/// Every field of a device batch on the fake device as bytes, read back once its work completed.
pub fn device_bytes(fake: &FakeDevice, b: &Batch) -> Vec<Vec<u8>> {
    b.synchronize().unwrap();
    b.fields()
        .map(|f| {
            let len = f.shape.iter().product::<usize>() * f.dtype.size();
            fake.read(f.address, len).unwrap()
        })
        .collect()
}
