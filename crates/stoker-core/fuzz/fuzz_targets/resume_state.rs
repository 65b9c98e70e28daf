//! The resume-state string a user stores and hands back (`resume_state=...`): parsed, and an
//! accepted state must print back to a string that parses to the same state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stoker_core::ResumeState;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(state) = ResumeState::parse(text) {
        let printed = state.to_string();
        let again = ResumeState::parse(&printed).expect("a printed state parses");
        assert_eq!(again, state, "round trip of `{text}` via `{printed}`");
    }
});
