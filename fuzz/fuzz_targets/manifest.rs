//! Any text is a tool manifest that checks, or an error: never a panic. A manifest that checks
//! survives the trip through MCP's tool shape, and its schemas compile or are refused cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolsmith_contract::Manifest;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let Ok(manifest) = Manifest::from_value(value) else { return };
    if manifest.check().is_err() {
        return;
    }
    let back = Manifest::from_mcp_tool(&manifest.to_mcp_tool()).expect("an MCP tool reads back");
    assert_eq!(back.name, manifest.name);
    let _ = manifest.to_openai_function();
    let _ = toolsmith_sandbox::validate::ToolSchemas::compile(&manifest.input_schema, &manifest.output_schema);
});
