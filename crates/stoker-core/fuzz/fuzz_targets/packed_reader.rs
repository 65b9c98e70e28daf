//! A packed file's bytes → the checks the packed reader runs at open, then every field of every
//! sample (at most 4096) read as a loader would. Must return `Ok` or `Err`, never panic; every
//! field it hands out lies inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_core::source::packed::Layout;

fuzz_target!(|data: &[u8]| {
    let Ok(layout) = Layout::parse(data) else {
        return;
    };
    let start = data.as_ptr() as usize;
    for i in 0..layout.len().min(4096) {
        for f in 0..layout.fields().len() {
            if let Ok(bytes) = layout.field_bytes(data, i, f) {
                let at = bytes.as_ptr() as usize - start;
                assert!(at + bytes.len() <= data.len(), "field past the end");
            }
        }
    }
});
