//! A component whose manifest is invalid (a name that is not snake_case).

use toolsmith_sdk::bindings::{Guest, ToolError};

struct BadManifest;

impl Guest for BadManifest {
    fn manifest() -> String {
        r#"{"name": "Bad Name", "version": "0.1.0", "description": "x",
            "input_schema": {"type": "object"}, "output_schema": {"type": "object"}}"#
            .to_owned()
    }

    fn call(_args: String) -> Result<String, ToolError> {
        Ok("{}".to_owned())
    }
}

toolsmith_sdk::__export_tool_impl!(BadManifest with_types_in toolsmith_sdk::bindings);
