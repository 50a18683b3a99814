//! Any body sent to `POST /v1/completions` (what RL trainers send) is a checked request or a
//! clear 400: never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolsmith_daemon::chat::request;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = request::parse_completion(data) {
        assert!(!e.0.is_empty());
    }
});
