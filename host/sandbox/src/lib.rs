//! The Toolsmith sandbox: runs tools in a wasmtime sandbox with every call checked against the
//! tool's JSON Schemas.
//!
//! ```no_run
//! use toolsmith_sandbox::{Limits, Sandbox, SandboxConfig, Toolbox};
//!
//! let toolbox = Toolbox::new(Sandbox::new(SandboxConfig::default())?);
//! let bytes = std::fs::read("calculator.wasm")?;
//! toolbox.add_component(&bytes)?;
//! let out = toolbox.call("calculator", &serde_json::json!({"expression": "6 * 7"}), Limits::default());
//! match out {
//!     Ok(out) => assert_eq!(out.value["value"], 42.0),
//!     // A failed call is data the agent can read and correct: kind, JSON pointer, hint.
//!     Err(e) => eprintln!("{}", e.to_envelope()),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`sandbox`]: one engine per process, components compiled once and cached on disk, a fresh
//!   instance per call, deadline, memory and output caps, typed outcomes.
//! - [`validate`]: input and output schema checks with errors an agent can act on.
//! - [`python`]: agent-written Python tools in a CPython guest, and SEARL's `create_and_execute_mcp`.
//! - [`Toolbox`]: named tools and the one call path (validate, run, validate).
#![warn(missing_docs)]

pub mod python;
pub mod sandbox;
mod toolbox;
pub mod validate;

pub use sandbox::{CallReport, Limits, LoadError, PythonComponent, Sandbox, SandboxConfig, SandboxError};
pub use toolbox::{CallOutput, Tool, Toolbox, not_found_error};
pub use toolsmith_contract::{ErrorKind, Manifest, StructuredError, ToolKind};
