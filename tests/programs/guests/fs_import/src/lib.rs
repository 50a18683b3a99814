//! A component that reads files, and so imports `wasi:filesystem`: it sees nothing unless an
//! operator granted it a directory, and then only that directory, read-only, at `/dirs/<name>`.

use toolsmith_sdk::bindings::{Guest, ToolError};

struct FsImport;

impl Guest for FsImport {
    fn manifest() -> String {
        r#"{"name": "fs_import", "version": "0.1.0", "description": "Reads a file, or writes one when `write` is set.",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "write": {"type": "boolean"}},
                             "required": ["path"]},
            "output_schema": {"type": "object"},
            "capabilities": {"dirs": [{"name": "docs", "description": "the documents it reads"}]}}"#
            .to_owned()
    }

    fn call(args: String) -> Result<String, ToolError> {
        let args: serde_json::Value = serde_json::from_str(&args).map_err(|e| io_error(e.to_string()))?;
        let path = args["path"].as_str().unwrap_or_default();
        if args["write"].as_bool() == Some(true) {
            std::fs::write(path, "written").map_err(|e| io_error(e.to_string()))?;
            return Ok(r#"{"wrote": true}"#.to_owned());
        }
        let text = std::fs::read_to_string(path).map_err(|e| io_error(e.to_string()))?;
        Ok(serde_json::json!({ "text": text }).to_string())
    }
}

fn io_error(message: String) -> ToolError {
    ToolError { code: "io_error".into(), message }
}

toolsmith_sdk::__export_tool_impl!(FsImport with_types_in toolsmith_sdk::bindings);
