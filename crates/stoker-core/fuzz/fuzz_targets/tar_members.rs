//! A WebDataset shard's bytes → the member scan the indexed tar source runs at open. Must
//! return `Ok` or `Err`, never panic; every member it accepts lies inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_core::source::tar::scan_members;

fuzz_target!(|data: &[u8]| {
    if let Ok(samples) = scan_members("fuzz.tar", data) {
        for sample in &samples {
            for m in &sample.members {
                let end = m.offset.checked_add(m.size).expect("member end overflows");
                assert!(end <= data.len() as u64, "member past the end: {m:?}");
            }
        }
    }
});
