//! A manifest as an MCP tool and as an OpenAI function definition.

use serde_json::{Map, Value, json};

use crate::schemas::served_schema;
use crate::{Manifest, ManifestError, ToolKind};

impl Manifest {
    /// The MCP `Tool` object (`tools/list`): `name`, `description`, `inputSchema`, `outputSchema`.
    /// Version, examples and provenance ride in `_meta` under `toolsmith/*` keys, so
    /// [`Manifest::from_mcp_tool`] restores the manifest exactly.
    pub fn to_mcp_tool(&self) -> Value {
        let mut meta = Map::new();
        meta.insert("toolsmith/version".into(), json!(self.version));
        meta.insert("toolsmith/kind".into(), json!(self.kind));
        if !self.examples.is_empty() {
            meta.insert("toolsmith/examples".into(), json!(self.examples));
        }
        if !self.provenance.is_empty() {
            meta.insert("toolsmith/provenance".into(), json!(self.provenance));
        }
        if !self.capabilities.is_empty() {
            meta.insert("toolsmith/capabilities".into(), json!(self.capabilities));
        }
        // Schemas written before formats were normalised (or by another generator) are served
        // with the standard formats only.
        json!({
            "name": self.name,
            "description": self.description,
            "inputSchema": served_schema(&self.input_schema),
            "outputSchema": served_schema(&self.output_schema),
            "_meta": meta,
        })
    }

    /// Reads an MCP `Tool` object back. A tool from another server (no `_meta`) becomes version
    /// `0.0.0`, kind `native`, no examples; a missing `outputSchema` becomes an open object schema.
    pub fn from_mcp_tool(tool: &Value) -> Result<Manifest, ManifestError> {
        let meta = tool.get("_meta").cloned().unwrap_or_default();
        let manifest = json!({
            "name": tool.get("name").cloned().unwrap_or_default(),
            "version": meta.get("toolsmith/version").cloned().unwrap_or(json!("0.0.0")),
            "description": tool.get("description").cloned().unwrap_or_default(),
            "input_schema": tool.get("inputSchema").cloned().unwrap_or_default(),
            "output_schema": tool.get("outputSchema").cloned().unwrap_or(json!({"type": "object"})),
            "examples": meta.get("toolsmith/examples").cloned().unwrap_or(json!([])),
            "kind": meta.get("toolsmith/kind").cloned().unwrap_or(json!(ToolKind::Native)),
            "provenance": meta.get("toolsmith/provenance").cloned().unwrap_or(json!({})),
            "capabilities": meta.get("toolsmith/capabilities").cloned().unwrap_or(json!({})),
        });
        Manifest::from_value(manifest)
    }

    /// The OpenAI function-calling definition (`{"type": "function", "function": {...}}`). OpenAI
    /// has no slot for an output schema; the description is all a model sees of the result.
    pub fn to_openai_function(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": served_schema(&self.input_schema),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest::from_value(json!({
            "name": "unit_convert",
            "version": "1.2.0",
            "description": "Converts a value between units.",
            "input_schema": {"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"]},
            "output_schema": {"type": "object", "properties": {"value": {"type": "number"}}},
            "examples": [{"input": {"value": 1}, "output": {"value": 100}}],
            "kind": "plugin",
            "provenance": {"author": "toolsmith", "parents": ["calculator"]}
        }))
        .expect("valid manifest")
    }

    #[test]
    fn mcp_round_trip_is_exact() {
        let manifest = sample();
        let tool = manifest.to_mcp_tool();
        assert_eq!(tool["name"], "unit_convert");
        assert_eq!(tool["inputSchema"], manifest.input_schema);
        assert_eq!(tool["outputSchema"], manifest.output_schema);
        assert_eq!(Manifest::from_mcp_tool(&tool).expect("round trip"), manifest);
    }

    #[test]
    fn foreign_mcp_tools_get_defaults() {
        let tool = json!({"name": "echo", "description": "Echoes.", "inputSchema": {"type": "object"}});
        let manifest = Manifest::from_mcp_tool(&tool).expect("foreign tool");
        assert_eq!(manifest.version, "0.0.0");
        assert_eq!(manifest.kind, ToolKind::Native);
        assert!(Manifest::from_mcp_tool(&json!({"name": "Bad Name"})).is_err());
    }

    #[test]
    fn openai_function_carries_the_input_schema() {
        let manifest = sample();
        let f = manifest.to_openai_function();
        assert_eq!(f["type"], "function");
        assert_eq!(f["function"]["name"], "unit_convert");
        assert_eq!(f["function"]["parameters"], manifest.input_schema);
    }
}
