//! A WebDataset `wids` shard index's bytes → the shard list and counts a `tar:….json` source
//! reads. Must return `Ok` or `Err`, never panic; what it accepts is a non-empty list with one
//! count per shard, every shard named, resolved against the index's location.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_core::source::shards::wids;

fuzz_target!(|data: &[u8]| {
    if let Ok(list) = wids::parse(data, "https://host/data/train.json") {
        assert!(!list.shards.is_empty());
        assert_eq!(list.shards.len(), list.counts.len());
        for (shard, &count) in list.shards.iter().zip(&list.counts) {
            assert!(!shard.is_empty());
            assert!(count <= u32::MAX as usize);
        }
    }
});
