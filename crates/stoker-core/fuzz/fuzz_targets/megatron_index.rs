//! A Megatron `.idx` index as `megatron:PREFIX` checks it at open: the header against the
//! file's size, then the arrays against each other and against a `.bin` of the length the
//! first 8 bytes of the input say. Must return `Ok` or `Err`, never panic or allocate beyond
//! what the file's size bounds; an accepted index's sequences must lie inside `.bin`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_core::source::tokens::megatron::{check_index, parse_index, HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    let Some((len, idx)) = data.split_first_chunk::<8>() else {
        return;
    };
    // Bounded so that an accepted index is reachable: a .bin of at most 1 MiB.
    let bin_len = u64::from_le_bytes(*len) % (1 << 20);
    let Ok(layout) = parse_index(idx) else {
        return;
    };
    assert_eq!(
        idx.len(),
        HEADER_BYTES + 12 * layout.sequences + 8 * layout.doc_entries,
        "an accepted header's counts fill the file exactly"
    );
    if let Ok(starts) = check_index(idx, &layout, bin_len) {
        assert_eq!(starts.len(), layout.sequences + 1);
        assert!(starts.windows(2).all(|w| w[0] <= w[1]), "starts rise");
        let total = starts[starts.len() - 1];
        assert_eq!(total * layout.token.size() as u64, bin_len);
    }
});
