//! Helpers shared by the integration tests.

pub mod files;

use std::sync::Arc;

use stoker_core::{LoaderOptions, Source, SourceSpec};

pub use stoker_core::testing::counting_source;

/// Options over `source` with the string options `kv` set.
pub fn options(source: Arc<dyn Source>, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(source));
    for (k, v) in kv {
        o.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
    }
    o
}
