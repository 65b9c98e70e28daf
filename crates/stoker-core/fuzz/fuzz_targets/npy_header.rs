//! An `.npy` file as the npy source opens it: header parse, size validation against the file,
//! row views, and the labels path (integer conversion). Must return `Ok` or `Err`, never panic,
//! and an accepted array's rows must lie inside the file.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stoker_core::source::{NpyArray, NpySource};
use stoker_core::Source;

/// One scratch file per process (in RAM where /dev/shm exists): the parser is reached only
/// through `open`, which maps a path, exactly as a loader does.
fn scratch_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = PathBuf::from("/dev/shm");
        let dir = if dir.is_dir() {
            dir
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("stoker-fuzz-npy-{}.npy", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let path = scratch_path();
    std::fs::write(path, data).expect("writing the fuzz scratch file");
    if let Ok(array) = NpyArray::open(path) {
        let shape = array.shape();
        assert!(!shape.is_empty());
        let row_bytes: usize = shape[1..]
            .iter()
            .try_fold(array.dtype().size(), |acc, &d| acc.checked_mul(d))
            .expect("an accepted shape's row size fits in usize");
        let data_bytes = array
            .rows()
            .checked_mul(row_bytes)
            .expect("an accepted shape's size fits in usize");
        assert!(
            data_bytes <= data.len(),
            "rows reach past the end of the file"
        );
        // A few rows, first and last, must be views of exactly one row inside the mapping.
        let rows = array.rows();
        for i in [0, rows / 2, rows.saturating_sub(1)] {
            if i < rows {
                assert_eq!(array.row(i).len(), row_bytes);
            }
        }
    }
    // The same file as data and labels: exercises the labels checks and integer conversion.
    if let Ok(source) = NpySource::open(path, Some(path)) {
        let mut scratch = Vec::new();
        if !source.is_empty() {
            let sample = source
                .read(source.len() - 1, &mut scratch)
                .expect("reading the last row of an accepted npy source");
            assert_eq!(sample.get(1).len(), 8, "a label is one int64");
        }
    }
});
