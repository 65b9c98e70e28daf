//! A packed file's bytes → the checks the packed reader runs at open, then every field of every
//! sample (at most 4096) read as a loader would. Must return `Ok` or `Err`, never panic; every
//! field it hands out lies inside the input. Each input is tried as it is and with its checksum
//! recomputed, so mutations also reach the schema, table and per-field checks behind it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_core::source::packed::format::{checksum, Header, HEADER_BYTES};
use stoker_core::source::packed::Layout;

fn read_all(data: &[u8]) {
    let Ok(layout) = Layout::parse(data) else {
        return;
    };
    let start = data.as_ptr() as usize;
    for i in 0..layout.len().min(4096) {
        for f in 0..layout.fields().len() {
            if let Ok((bytes, _)) = layout.field_bytes(data, i, f) {
                let at = bytes.as_ptr() as usize - start;
                assert!(at + bytes.len() <= data.len(), "field past the end");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    read_all(data);
    let Ok(header) = Header::decode(data) else {
        return;
    };
    let schema_end = HEADER_BYTES.saturating_add(header.schema_len as usize);
    let table_at = header.table_offset as usize;
    if schema_end <= data.len() && table_at <= data.len() {
        let sum = checksum(&header, &data[HEADER_BYTES..schema_end], &data[table_at..]);
        let mut fixed = data.to_vec();
        fixed[56..60].copy_from_slice(&sum.to_le_bytes());
        read_all(&fixed);
    }
});
