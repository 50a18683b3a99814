//! The contract shared by every Toolsmith host and every tool.
//!
//! A tool is an interface before it is code: a [`Manifest`] names it, describes it, and fixes the
//! JSON Schemas (2020-12) of its input and output. The host checks arguments against the input
//! schema before a call and results against the output schema after it; a failure becomes a
//! [`StructuredError`] that an agent can read and correct. This crate holds those types and nothing
//! that runs code, so both sides of the sandbox (the guest SDK compiled to WebAssembly and the
//! wasmtime host) depend on it.
//!
//! ```
//! use toolsmith_contract::Manifest;
//!
//! let manifest = Manifest::from_json(r#"{
//!     "name": "add_numbers",
//!     "version": "1.0.0",
//!     "description": "Adds two numbers.",
//!     "input_schema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
//!                      "required": ["a", "b"]},
//!     "output_schema": {"type": "object", "properties": {"sum": {"type": "number"}}},
//!     "examples": [{"input": {"a": 1, "b": 2}, "output": {"sum": 3}}],
//!     "kind": "plugin"
//! }"#)?;
//! assert_eq!(manifest.name.as_str(), "add_numbers");
//! // The same tool as an MCP tool and as an OpenAI function definition.
//! assert_eq!(manifest.to_mcp_tool()["inputSchema"]["required"][0], "a");
//! assert_eq!(manifest.to_openai_function()["function"]["name"], "add_numbers");
//! # Ok::<(), toolsmith_contract::ManifestError>(())
//! ```
#![warn(missing_docs)]

pub mod capabilities;
mod convert;
mod error;
pub mod home;
mod manifest;
pub mod schemas;
pub mod sync;
#[cfg(feature = "validate")]
pub mod validate;

pub use capabilities::{Capabilities, Grants};
pub use error::{ErrorKind, PythonException, StructuredError};

/// Names the server's meta tools answer to (`search_tools`, SEARL's `create_and_execute_mcp`):
/// no tool of a registry may take them, or clients would see it described with the meta tool's
/// text and reach a different tool than the one they read about.
pub const RESERVED_TOOL_NAMES: [&str; 2] = ["search_tools", "create_and_execute_mcp"];
pub use manifest::{Example, Manifest, ManifestError, NAME_MAX_LEN, NAME_PATTERN, Provenance, ToolKind, ToolName};
