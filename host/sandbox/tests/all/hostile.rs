//! Misbehaving tools get typed outcomes and the host keeps serving.

use std::time::Instant;

use serde_json::json;
use toolsmith_sandbox::{ErrorKind, Limits};

use crate::{assert_host_healthy, call, call_with, ms};

fn hostile(mode: &str) -> Result<toolsmith_sandbox::CallOutput, toolsmith_sandbox::StructuredError> {
    call("hostile", json!({ "mode": mode }))
}

#[test]
fn infinite_loop_times_out_near_the_deadline() {
    let deadline = ms(300);
    let started = Instant::now();
    let e = call_with("hostile", json!({"mode": "loop"}), Limits { timeout: deadline, ..Limits::default() })
        .expect_err("must time out");
    let took = started.elapsed();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(took >= deadline, "stopped early: {took:?}");
    // Generous margin: the suite runs tests in parallel on two cores.
    assert!(took < deadline + ms(1500), "stopped late: {took:?}");
    assert_host_healthy();
}

#[test]
fn unbounded_memory_growth_is_out_of_memory() {
    let limits = Limits { memory_bytes: 32 << 20, ..Limits::default() };
    let e = call_with("hostile", json!({"mode": "grow"}), limits).expect_err("must run out");
    assert_eq!(e.kind, ErrorKind::OutOfMemory, "{e}");
    assert!(e.message.contains("32 MiB"), "{}", e.message);
    assert_host_healthy();
}

#[test]
fn panic_is_a_trap_carrying_the_panic_message() {
    let e = hostile("panic").expect_err("panics");
    assert_eq!(e.kind, ErrorKind::Trap);
    assert!(e.message.contains("boom: the tool gave up"), "{}", e.message);
    assert_host_healthy();
}

#[test]
fn unreachable_is_a_trap() {
    let e = hostile("unreachable").expect_err("traps");
    assert_eq!(e.kind, ErrorKind::Trap);
    assert!(e.message.contains("unreachable"), "{}", e.message);
    assert_host_healthy();
}

#[test]
fn runaway_recursion_is_a_stack_overflow_trap() {
    // Frames on wasmtime's native stack: wasmtime's own stack-overflow trap.
    let e = hostile("stack").expect_err("overflows");
    assert_eq!(e.kind, ErrorKind::Trap);
    assert!(e.message.contains("stack overflow"), "{}", e.message);
    // Frames on the guest's shadow stack in linear memory: it runs off the start of memory.
    let e = hostile("shadow_stack").expect_err("overflows");
    assert_eq!(e.kind, ErrorKind::Trap);
    assert!(e.message.contains("stack overflow"), "{}", e.message);
    assert_host_healthy();
}

#[test]
fn output_that_is_not_json_is_invalid_output() {
    let e = hostile("not_json").expect_err("not JSON");
    assert_eq!(e.kind, ErrorKind::InvalidOutput);
    assert_eq!(e.got, Some(json!("this is not JSON")));
    assert_host_healthy();
}

#[test]
fn output_violating_the_schema_is_invalid_output_with_a_pointer() {
    let e = hostile("bad_output").expect_err("schema violation");
    assert_eq!(e.kind, ErrorKind::InvalidOutput);
    assert_eq!(e.pointer.as_deref(), Some("/ok"));
    assert_eq!(e.expected.as_deref(), Some("type boolean"));
    assert_host_healthy();
}

#[test]
fn oversized_output_is_output_too_large() {
    let e = hostile("huge").expect_err("too large");
    assert_eq!(e.kind, ErrorKind::OutputTooLarge, "{e}");
    // The same call succeeds when the cap allows it.
    let limits = Limits { output_bytes: 4 << 20, ..Limits::default() };
    let out = call_with("hostile", json!({"mode": "huge"}), limits).expect("fits under a larger cap");
    assert_eq!(out.value["pad"].as_str().map(str::len), Some(2 << 20));
}

#[test]
fn schema_violating_arguments_never_reach_the_tool() {
    let e = call("hostile", json!({"mode": "explode"})).expect_err("not in enum");
    assert_eq!(e.kind, ErrorKind::InvalidArgs);
    assert_eq!(e.pointer.as_deref(), Some("/mode"));
    let e = call("hostile", json!({"mode": "spin", "ms": -1})).expect_err("below minimum");
    assert_eq!(e.pointer.as_deref(), Some("/ms"));
    assert_eq!(e.expected.as_deref(), Some("a number >= 0"));
}

#[test]
fn call_tool_recursion_stops_at_the_depth_limit() {
    let e = hostile("recurse").expect_err("too deep");
    assert_eq!(e.kind, ErrorKind::ToolError);
    assert!(e.message.contains("call_depth_exceeded"), "{}", e.message);
    assert_host_healthy();
}

#[test]
fn call_tool_applies_the_same_checks_to_the_callee() {
    let out = hostile("compose").expect("compose");
    assert_eq!(out.value["value"], 42.0);
    let e = hostile("call_missing").expect_err("missing callee");
    assert_eq!(e.code.as_deref(), Some("not_found"));
    let e = hostile("call_bad_args").expect_err("callee args invalid");
    assert_eq!(e.code.as_deref(), Some("invalid_args"));
    assert!(e.message.contains("/expression"), "{}", e.message);
}

#[test]
fn a_callee_inherits_the_callers_remaining_deadline() {
    // `hostile` spinning for 2 s under a 300 ms deadline, reached through `call_tool`, would
    // need its own call; here the top-level call itself spins and must stop at the deadline.
    let limits = Limits { timeout: ms(300), ..Limits::default() };
    let e = call_with("hostile", json!({"mode": "spin", "ms": 5000}), limits).expect_err("deadline");
    assert_eq!(e.kind, ErrorKind::Timeout);
}

#[test]
fn log_floods_are_capped_not_fatal() {
    let out = hostile("log_flood").expect("ok despite the flood");
    let bytes: usize = out.report.logs.iter().map(|l| l.message.len()).sum();
    assert!(bytes <= Limits::default().log_bytes, "{bytes} bytes of logs kept");
    assert!(out.report.logs_dropped > 90_000, "{} dropped", out.report.logs_dropped);
}

#[test]
fn stdout_and_stderr_floods_are_absorbed() {
    let out = hostile("stdout_flood").expect("ok despite the flood");
    let stderr_bytes: usize = out.report.logs.iter().filter(|l| l.level == "stderr").map(|l| l.message.len()).sum();
    assert!(stderr_bytes > 0 && stderr_bytes <= 64 << 10, "{stderr_bytes}");
}

#[test]
fn the_host_survives_every_failure_in_sequence() {
    let limits = Limits { timeout: ms(200), memory_bytes: 16 << 20, ..Limits::default() };
    for mode in
        ["loop", "grow", "panic", "unreachable", "stack", "shadow_stack", "not_json", "bad_output", "huge", "recurse"]
    {
        let e = call_with("hostile", json!({ "mode": mode }), limits).expect_err(mode);
        assert_ne!(e.kind, ErrorKind::InvalidArgs, "{mode}");
        assert_host_healthy();
        assert!(hostile("ok").is_ok(), "after {mode}");
    }
}

#[test]
fn concurrent_calls_each_get_their_own_instance() {
    let handles: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let out = call("calculator", json!({ "expression": format!("{i} * 10") })).expect("call");
                out.value["value"].as_f64()
            })
        })
        .collect();
    let results: Vec<Option<f64>> = handles.into_iter().map(|h| h.join().expect("thread")).collect();
    assert_eq!(results, (0..8).map(|i| Some(f64::from(i * 10))).collect::<Vec<_>>());
}
