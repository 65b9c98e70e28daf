//! Helpers shared by the integration tests.

use std::sync::Arc;

use stoker_core::{DType, LoaderOptions, MemorySource, Source, SourceSpec};

/// `n` samples: field `x` = [i, i+1, i+2] as int64, field `y` = i as uint8.
pub fn counting_source(n: usize) -> Arc<dyn Source> {
    let x: Vec<u8> = (0..n as i64)
        .flat_map(|i| [i, i + 1, i + 2])
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let y: Vec<u8> = (0..n).map(|i| i as u8).collect();
    Arc::new(
        MemorySource::new()
            .with_tensor("x", DType::I64, &[3], x)
            .unwrap()
            .with_tensor("y", DType::U8, &[], y)
            .unwrap(),
    )
}

/// Options over `source` with the string options `kv` set.
pub fn options(source: Arc<dyn Source>, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions {
        source: Some(SourceSpec::Custom(source)),
        ..LoaderOptions::default()
    };
    for (k, v) in kv {
        o.set(k, v).unwrap();
    }
    o
}
