//! Any body sent to `POST /jobs` is refused with a message or becomes a config that validates:
//! the SFT and RL configs parse, check their rules and confine their paths without a panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use toolsmith_daemon::jobs::{JobInputs, Submission};
use toolsmith_train::SftConfig;
use toolsmith_train::rl::RlConfig;

/// A state directory of its own, for the path checks (shared by every run of the process).
fn inputs() -> &'static JobInputs {
    static STATE: OnceLock<(tempfile::TempDir, JobInputs)> = OnceLock::new();
    &STATE
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let inputs = JobInputs::new(dir.path());
            (dir, inputs)
        })
        .1
}

fuzz_target!(|data: &[u8]| {
    let Ok(submission) = serde_json::from_slice::<Submission>(data) else { return };
    let mut config = submission.config;
    if inputs().confine(&mut config).is_err() {
        return;
    }
    if let Ok(sft) = serde_json::from_value::<SftConfig>(config.clone()) {
        let _ = sft.validate();
    }
    if let Ok(rl) = serde_json::from_value::<RlConfig>(config) {
        let _ = rl.validate();
    }
});
