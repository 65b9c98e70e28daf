//! The string options every binding passes through: `key=value` lines, each given to
//! `LoaderOptions::set`. Must return `Ok` or `Err` (naming the key), never panic or allocate
//! without bound, whatever the value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_core::LoaderOptions;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut options = LoaderOptions::new();
    for line in text.lines().take(64) {
        let (key, value) = line.split_once('=').unwrap_or((line, ""));
        if let Err(e) = options.set(key, value) {
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("`{key}`")),
                "error does not name `{key}`: {msg}"
            );
        }
    }
});
