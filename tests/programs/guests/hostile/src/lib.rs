//! A tool that misbehaves in the way its `mode` argument names. It implements the raw WIT
//! exports (not the SDK's `tool!` macro) so it can return anything, including invalid JSON.

use std::hint::black_box;

use serde_json::{Value, json};
use toolsmith_sdk::bindings::toolsmith::tool::host::{Level, call_tool, log};
use toolsmith_sdk::bindings::{Guest, ToolError};

struct Hostile;

const MODES: &[&str] = &[
    "ok",
    "loop",
    "grow",
    "panic",
    "unreachable",
    "not_json",
    "bad_output",
    "huge",
    "stack",
    "shadow_stack",
    "recurse",
    "call_missing",
    "call_bad_args",
    "log_flood",
    "stdout_flood",
    "spin",
    "compose",
];

impl Guest for Hostile {
    fn manifest() -> String {
        json!({
            "name": "hostile",
            "version": "0.1.0",
            "description": "Misbehaves on purpose, as `mode` says.",
            "input_schema": {
                "type": "object",
                "properties": {
                    "mode": {"enum": MODES},
                    "ms": {"type": "integer", "minimum": 0, "description": "Milliseconds to spin."}
                },
                "required": ["mode"],
                "additionalProperties": false
            },
            "output_schema": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}, "pad": {"type": "string"}, "value": {}},
                "required": ["ok"]
            },
            "examples": [{"input": {"mode": "ok"}, "output": {"ok": true}}],
            "kind": "plugin"
        })
        .to_string()
    }

    fn call(args: String) -> Result<String, ToolError> {
        let args: Value = serde_json::from_str(&args).unwrap_or_default();
        let ok = || Ok(r#"{"ok":true}"#.to_owned());
        match args["mode"].as_str().unwrap_or_default() {
            "ok" => ok(),
            "loop" => {
                let mut i = 0u64;
                loop {
                    i = black_box(i.wrapping_add(1));
                }
            }
            "grow" => {
                let mut hoard = Vec::new();
                loop {
                    hoard.push(black_box(vec![7u8; 1 << 20]));
                }
            }
            "panic" => panic!("boom: the tool gave up"),
            "unreachable" => core::arch::wasm32::unreachable(),
            "not_json" => Ok("this is not JSON".to_owned()),
            "bad_output" => Ok(r#"{"ok":"yes"}"#.to_owned()),
            "huge" => Ok(format!(r#"{{"ok":true,"pad":"{}"}}"#, "x".repeat(2 << 20))),
            "stack" => Ok(format!(r#"{{"ok":true,"value":{}}}"#, recurse(black_box(1)))),
            "shadow_stack" => Ok(format!(r#"{{"ok":true,"value":{}}}"#, recurse_padded(black_box(1)))),
            "recurse" => call_tool("hostile", r#"{"mode":"recurse"}"#),
            "call_missing" => call_tool("no_such_tool", "{}"),
            "call_bad_args" => call_tool("calculator", r#"{"expression": 5}"#),
            "compose" => {
                let out = call_tool("calculator", r#"{"expression": "6 * 7"}"#)?;
                let value: Value = serde_json::from_str(&out).unwrap_or_default();
                Ok(json!({"ok": true, "value": value["value"]}).to_string())
            }
            "log_flood" => {
                for i in 0..100_000 {
                    log(Level::Info, &format!("line {i} {}", "x".repeat(100)));
                }
                ok()
            }
            "stdout_flood" => {
                let line = "y".repeat(1000);
                for _ in 0..10_000 {
                    println!("{line}");
                    eprintln!("{line}");
                }
                ok()
            }
            "spin" => {
                let ms = args["ms"].as_u64().unwrap_or(0) as u128;
                let start = std::time::Instant::now();
                while start.elapsed().as_millis() < ms {
                    black_box(0);
                }
                ok()
            }
            other => Err(ToolError { code: "unknown_mode".into(), message: format!("unknown mode {other:?}") }),
        }
    }
}

/// Recursion whose frames live on wasmtime's native stack (no locals in linear memory).
fn recurse(n: u64) -> u64 {
    if black_box(n) == 0 { 0 } else { recurse(n + 1).wrapping_add(black_box(1)) }
}

/// Recursion whose frames hold an array, which lives on the shadow stack in linear memory.
fn recurse_padded(n: u64) -> u64 {
    let mut pad = [0u8; 512];
    pad[0] = n as u8;
    black_box(&mut pad);
    if black_box(n) == 0 { 0 } else { recurse_padded(n + 1).wrapping_add(pad[0] as u64) }
}

toolsmith_sdk::__export_tool_impl!(Hostile with_types_in toolsmith_sdk::bindings);
