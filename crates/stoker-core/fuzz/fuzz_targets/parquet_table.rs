//! A Parquet file's bytes → `parquet:` opened as a table (the footer, the schema, the columns
//! chosen, the row groups counted), then every field of every row (at most 4096) read as a worker
//! reads them: in order, then backwards (each read a fresh column reader). Must return `Ok` or
//! `Err`, never panic or allocate beyond a bound; a number field read is its type's size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_core::source::remote::RemoteConfig;
use stoker_core::source::{FieldKind, ParquetSource, Source};

fuzz_target!(
    // The source turns a panic inside the parquet crate into the file's or the row's error
    // (`source::parquet::guarded`), so libFuzzer's hook, which aborts at any panic, gives way to
    // the default one here: a panic that escapes the source still aborts, at the target's end.
    init: drop(std::panic::take_hook()),
    |data: &[u8]| {
        // The source maps a file: one per fuzzing process, written again for each input.
        let name = format!("stoker-fuzz-{}.parquet", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, data).expect("the fuzzer's scratch file must be writable");
        let Some(pattern) = path.to_str() else {
            return;
        };
        let Ok(source) = ParquetSource::open(pattern, None, &RemoteConfig::default()) else {
            return;
        };
        let rows = source.len().min(4096);
        let mut scratch = Vec::new();
        for index in (0..rows).chain((0..rows).rev()) {
            let Ok(sample) = source.read(index, &mut scratch) else {
                continue;
            };
            for (k, field) in source.fields().iter().enumerate() {
                if let FieldKind::Tensor { dtype, .. } = field.kind {
                    assert_eq!(sample.get(k).len(), dtype.size(), "row {index}, {field:?}");
                }
            }
        }
        let _ = source.pages();
        let _ = source.identity();
    }
);
