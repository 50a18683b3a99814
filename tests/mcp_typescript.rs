//! `toolsmith serve --http` driven by the official TypeScript MCP SDK (`@modelcontextprotocol/sdk`
//! from npm, pinned by `tests/mcp/ts/package-lock.json` and installed into a cache by
//! `scripts/mcp-ts-client-env.sh`), the SDK most MCP hosts are built on. The scenario is
//! `tests/mcp/ts/client.mjs`, the counterpart of the Python SDK's `tests/mcp/client.py`.
//!
//! This SDK is stricter than the Python one where it matters to a server: it checks every
//! `structuredContent` against the tool's listed `outputSchema`, error results included, so a
//! failed call must carry its structured error in `_meta["toolsmith/error"]` (and a JSON text
//! block), never in `structuredContent`; and it raises JSON-RPC errors as `McpError` with `code` and
//! `data`, which is how an unknown tool and a bogus cursor come back (MCP 2025-11-25). So every
//! error kind a call can end in is read back here as data, through the SDK's own parsing.

mod common;

use common::{HttpServer, curl};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::{Value, json};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The client script beside the installed SDK (installed once, then cached): ES modules resolve
/// their imports next to the importing file, so the script runs from the install, not the clone.
fn client() -> &'static Path {
    static CLIENT: OnceLock<PathBuf> = OnceLock::new();
    CLIENT.get_or_init(|| common::client_from_script("mcp-ts-client-env.sh", "node, npm and the npm registry"))
}

/// Runs the client and returns its JSON report (it prints one in every case, failures included).
fn ts_client(args: &[&str]) -> (Output, Value) {
    let out = Command::new("node").arg(client()).args(args).output().expect("run node");
    let report = common::report_of(&out);
    (out, report)
}

/// The SDK version `tests/mcp/ts/package.json` pins.
fn pinned_sdk() -> String {
    let text = std::fs::read_to_string(Path::new(ROOT).join("tests/mcp/ts/package.json")).expect("package.json");
    let package: Value = serde_json::from_str(&text).expect("package.json is JSON");
    package["dependencies"]["@modelcontextprotocol/sdk"].as_str().expect("a pinned SDK").to_owned()
}

#[test]
fn typescript_sdk_client_over_streamable_http_with_a_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "correct horse\n").expect("write token");
    // A short call deadline, so the runaway tool the client creates is stopped quickly.
    let server = HttpServer::start(&["--timeout-ms", "3000", "--token-file", token_file.to_str().expect("utf-8")]);
    let (out, report) = ts_client(&[&server.mcp(), "--token", "correct horse"]);
    assert!(
        out.status.success() && report["ok"] == true,
        "the TypeScript MCP client's checks failed: {}\nstderr: {}",
        serde_json::to_string_pretty(&report["failures"]).unwrap_or_default(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(report["sdk"]["version"], pinned_sdk().as_str(), "{}", report["sdk"]);
    let steps = &report["steps"];

    // Listing and calling: the calculator's result passed the SDK's own outputSchema check (all
    // tools fit one page at the default page size, so the SDK holds every tool's validator).
    assert_eq!(steps["calculator"]["structuredContent"]["value"].as_f64(), Some(14.0), "{}", steps["calculator"]);
    assert_eq!(steps["calculator"]["sdk_validated"], true, "{}", steps["calculator"]);
    let found = steps["search_tools"]["names"].as_array().expect("names");
    assert!(found.contains(&json!("calculator")), "{found:?}");

    // Each kind of failed call came back as a result (the SDK did not throw), with the same kind
    // in `_meta` and in the JSON text block, and no structuredContent.
    for kind in ["invalid_args", "tool_error", "python_error", "timeout"] {
        let step = &steps[kind];
        assert_eq!(step["outcome"], "result", "{kind}: {step}");
        assert_eq!(step["isError"], true, "{kind}: {step}");
        assert_eq!(step["kind"], kind, "{kind}: {step}");
        assert_eq!(step["kindFromText"], kind, "{kind}: {step}");
        assert_eq!(step["hasStructuredContent"], false, "{kind}: {step}");
    }
    assert_eq!(steps["invalid_args"]["tool"], "calculator");
    assert_eq!(steps["tool_error"]["code"], "not_finite", "the calculator's own code: {}", steps["tool_error"]);
    let raised = steps["python_error"]["message"].as_str().unwrap_or_default();
    assert!(raised.contains("ZeroDivisionError"), "{}", steps["python_error"]);
    // The server's deadline stopped the loop, not the client's request timeout (60 s).
    let elapsed = steps["timeout"]["elapsed_s"].as_f64().expect("elapsed");
    assert!((2.5..30.0).contains(&elapsed), "the runaway call took {elapsed} s");

    // Protocol errors, with the structured error as the JSON-RPC error's data.
    assert_eq!(steps["unknown_tool"]["outcome"], "protocol_error", "{}", steps["unknown_tool"]);
    assert_eq!(steps["unknown_tool"]["code"], -32602, "{}", steps["unknown_tool"]);
    assert_eq!(steps["unknown_tool"]["data"]["error"]["kind"], "not_found", "{}", steps["unknown_tool"]);
    assert_eq!(steps["bogus_cursor"]["outcome"], "protocol_error", "{}", steps["bogus_cursor"]);
    assert_eq!(steps["bogus_cursor"]["code"], -32602, "{}", steps["bogus_cursor"]);

    // A created tool: announced with list_changed, listed, and callable.
    let created = &steps["create_and_execute_mcp"];
    assert_eq!(created["structuredContent"]["creation_success"], true, "{created}");
    assert_eq!(created["list_changed_observed"], true, "{created}");
    assert_eq!(created["listed_after"], true, "{created}");
    assert_eq!(created["call"]["structuredContent"]["result"].as_f64(), Some(18.0), "{created}");
    let notifications = report["notifications"].as_array().expect("notifications");
    assert!(!notifications.is_empty(), "no notification at all");
    assert!(notifications.iter().all(|n| n == "notifications/tools/list_changed"), "{notifications:?}");

    // The status API counted one failure of each kind, and the three created tools are nodes of
    // the graph beside the 4 bundled ones (none was merged into another).
    let status = curl(&server, &["-H", "Authorization: Bearer correct horse", &format!("{}/status", server.base)]);
    let status: Value = serde_json::from_str(&status.body).expect("status JSON");
    for kind in ["invalid_args", "tool_error", "python_error", "timeout", "not_found"] {
        assert_eq!(status["failures_by_kind"][kind], 1, "{kind}: {status}");
    }
    assert_eq!(status["tools"], 8, "5 bundled tools and 3 created ones: {status}");
    assert_eq!(status["status"], "ok");

    // Without the token the client gets nowhere, and its report says why.
    let (out, report) = ts_client(&[&server.mcp(), "--token", "wrong", "--timeout", "20"]);
    assert!(!out.status.success());
    assert!(report["failures"].to_string().contains("401"), "{report}");
}
