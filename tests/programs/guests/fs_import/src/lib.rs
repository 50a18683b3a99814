//! A component that reads a file, and so imports `wasi:filesystem`: the host must refuse it.

use toolsmith_sdk::bindings::{Guest, ToolError};

struct FsImport;

impl Guest for FsImport {
    fn manifest() -> String {
        r#"{"name": "fs_import", "version": "0.1.0", "description": "Reads /etc/passwd.",
            "input_schema": {"type": "object"}, "output_schema": {"type": "object"}}"#
            .to_owned()
    }

    fn call(_args: String) -> Result<String, ToolError> {
        let text = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        Ok(serde_json::json!({ "text": text }).to_string())
    }
}

toolsmith_sdk::__export_tool_impl!(FsImport with_types_in toolsmith_sdk::bindings);
