//! Any body sent to `POST /v1/chat/completions` is a checked request or a clear 400: never a
//! panic. A request that parses has a grammar its tools compile to and a prompt section that
//! renders.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolsmith_daemon::chat::request;

fuzz_target!(|data: &[u8]| {
    match request::parse(data) {
        Ok(parsed) => {
            assert!(!parsed.messages.is_empty());
            assert!(parsed.n >= 1);
            let _ = request::tool_section(&parsed.tools);
        }
        Err(e) => assert!(!e.0.is_empty()),
    }
});
