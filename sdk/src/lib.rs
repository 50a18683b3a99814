//! Write a Toolsmith tool as one Rust function over typed input and output.
//!
//! The [`tool!`] macro derives everything else from that function: the manifest (name, version,
//! description, examples), the input and output JSON Schemas (from `schemars`), and the
//! WebAssembly component exports of `wit/tool.wit` (the workspace's `schemas/wit/tool.wit`, shipped
//! inside the crate). Build the crate for `wasm32-wasip2` (`toolsmith plugin build DIR`) and the
//! result is a component any Toolsmith host can load.
//!
//! ```
//! use toolsmith_sdk::{Deserialize, JsonSchema, Serialize, ToolError};
//!
//! /// Greets someone.
//! #[derive(Deserialize, JsonSchema)]
//! struct Input {
//!     /// Who to greet.
//!     name: String,
//! }
//!
//! #[derive(Serialize, JsonSchema)]
//! struct Output {
//!     greeting: String,
//! }
//!
//! fn greet(input: Input) -> Result<Output, ToolError> {
//!     if input.name.is_empty() {
//!         return Err(ToolError::new("empty_name", "name must not be empty"));
//!     }
//!     Ok(Output { greeting: format!("Hello, {}!", input.name) })
//! }
//!
//! toolsmith_sdk::tool! {
//!     name: "greet",
//!     description: "Greets someone by name.",
//!     run: greet,
//!     examples: [ {"name": "Ada"} => {"greeting": "Hello, Ada!"} ],
//! }
//!
//! # fn main() {
//! // The macro also gives native access, for unit tests of the tool's logic:
//! assert_eq!(manifest().name.as_str(), "greet");
//! assert_eq!(call_json(r#"{"name":"Ada"}"#).unwrap(), r#"{"greeting":"Hello, Ada!"}"#);
//! # }
//! ```
//!
//! Inside the host a tool may log ([`log`]) and call other tools ([`call_tool`]); the host checks
//! the callee's arguments and results and runs it in its own sandbox. Nothing else is reachable
//! unless the tool declares it (`capabilities: {...}` in [`tool!`]) and an operator grants it:
//! outgoing HTTP ([`http`]), secrets ([`secret`]), read-only directories at `/dirs/<name>`
//! (`std::fs`), environment variables (`std::env`).
#![warn(missing_docs)]

use serde::de::DeserializeOwned;

pub mod http;
pub use http::secret;

pub use schemars::{self, JsonSchema};
pub use serde::{self, Deserialize, Serialize};
pub use serde_json::{self, Value, json};
pub use toolsmith_contract as contract;

/// The component bindings `wit-bindgen` generates from `schemas/wit`, public because the
/// [`tool!`] macro expands to paths into them in the tool's crate.
// Generated code: wit-bindgen writes no docs, and its output is neither ours to lint nor to
// change, so these allows cover only what it generates.
#[doc(hidden)]
#[allow(missing_docs, clippy::all, unsafe_op_in_unsafe_fn)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "tool",
        // The WIT travels inside the crate, so a packaged SDK builds on its own (a test keeps it
        // equal to the workspace's `schemas/wit`).
        path: "wit",
        pub_export_macro: true,
        default_bindings_module: "toolsmith_sdk::bindings",
    });
}

/// A failure the tool reports to its caller: a snake_case `code` and a `message` saying what went
/// wrong and, where possible, how to fix the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    /// A short snake_case category, e.g. `division_by_zero`.
    pub code: String,
    /// A sentence for the agent that made the call.
    pub message: String,
}

impl ToolError {
    /// Builds the error a tool function returns; the host passes `code` and `message` to the
    /// caller unchanged.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError { code: code.into(), message: message.into() }
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ToolError {}

impl From<bindings::ToolError> for ToolError {
    fn from(e: bindings::ToolError) -> Self {
        ToolError { code: e.code, message: e.message }
    }
}

impl From<ToolError> for bindings::ToolError {
    fn from(e: ToolError) -> Self {
        bindings::ToolError { code: e.code, message: e.message }
    }
}

/// How serious a [`log`] line is; the host records it beside the line in the call's report.
pub use bindings::toolsmith::tool::host::Level;

/// Records a log line against the current call. Outside the host (native tests) it prints to
/// standard error.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    bindings::toolsmith::tool::host::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

/// Calls another tool through the host with JSON arguments and returns its JSON result. The host
/// validates both and runs the callee in its own sandbox under this call's remaining deadline.
/// A failed callee returns a [`ToolError`] whose `code` is the failure kind (`invalid_args`,
/// `timeout`, `not_found`, ...) and whose `message` is the host's structured error as JSON.
pub fn call_tool(name: &str, args: &Value) -> Result<Value, ToolError> {
    #[cfg(target_arch = "wasm32")]
    {
        let out = bindings::toolsmith::tool::host::call_tool(name, &args.to_string())?;
        serde_json::from_str(&out)
            .map_err(|e| ToolError::new("invalid_output", format!("`{name}` returned invalid JSON: {e}")))
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = args;
        Err(ToolError::new("not_in_host", format!("cannot call `{name}`: call_tool needs a Toolsmith host")))
    }
}

/// [`call_tool`] with typed arguments and result, so a composing tool can reuse its callee's
/// input and output types instead of building JSON by hand.
pub fn call_tool_typed<A: Serialize, R: DeserializeOwned>(name: &str, args: &A) -> Result<R, ToolError> {
    let args = serde_json::to_value(args)
        .map_err(|e| ToolError::new("invalid_args", format!("cannot encode arguments for `{name}`: {e}")))?;
    let out = call_tool(name, &args)?;
    serde_json::from_value(out)
        .map_err(|e| ToolError::new("invalid_output", format!("unexpected result from `{name}`: {e}")))
}

/// Declares a tool: its name, description, function and examples. See the crate docs.
///
/// The macro defines two functions in the invoking module, `manifest()` and `call_json(&str)`,
/// for native tests, and (on `wasm32`) the component exports. The tool's version is the crate's
/// `CARGO_PKG_VERSION`.
#[macro_export]
macro_rules! tool {
    (
        name: $name:literal,
        description: $description:expr,
        run: $run:path,
        examples: [ $( $input:tt => $output:tt ),+ $(,)? ] $(,)?
        $( capabilities: $capabilities:tt $(,)? )?
    ) => {
        /// This tool's manifest, derived from its function's types.
        pub fn manifest() -> $crate::contract::Manifest {
            $crate::__private::manifest(
                $name,
                env!("CARGO_PKG_VERSION"),
                $description,
                $crate::__private::schemas_of($run),
                vec![$( ($crate::json!($input), $crate::json!($output)) ),+],
                $crate::__private::or_null(&[$( $crate::json!($capabilities) )?]),
            )
        }

        /// Runs this tool on JSON arguments: the same path the component's `call` export takes.
        pub fn call_json(args: &str) -> ::core::result::Result<String, $crate::ToolError> {
            $crate::__private::call($run, args)
        }

        /// Every example in the manifest reproduces (generated by `toolsmith_sdk::tool!`).
        #[cfg(all(test, not(target_family = "wasm")))]
        #[test]
        fn toolsmith_examples_reproduce() {
            $crate::__private::check_examples(&manifest(), call_json);
        }

        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct Component;
            impl $crate::bindings::Guest for Component {
                fn manifest() -> String {
                    manifest().to_json_pretty()
                }
                fn call(args: String) -> ::core::result::Result<String, $crate::bindings::ToolError> {
                    call_json(&args).map_err(::core::convert::Into::into)
                }
            }
            $crate::__export_tool_impl!(Component with_types_in $crate::bindings);
        };
    };
}

/// What [`tool!`]'s expansion calls; public only so the macro can reach it from the tool's crate.
#[doc(hidden)]
pub mod __private {
    use super::*;
    use toolsmith_contract::{Example, Manifest, Provenance, ToolKind, ToolName};

    /// The macro's optional `capabilities`, or null.
    pub fn or_null(given: &[Value]) -> Value {
        given.first().cloned().unwrap_or(Value::Null)
    }

    /// The input and output schemas of a tool function, read from its types.
    pub fn schemas_of<I: JsonSchema, O: JsonSchema>(_run: fn(I) -> Result<O, ToolError>) -> (Value, Value) {
        (toolsmith_contract::schemas::tool_schema_for::<I>(), toolsmith_contract::schemas::tool_schema_for::<O>())
    }

    /// Builds and checks the manifest; panics on a bad one, which is the tool author's bug.
    pub fn manifest(
        name: &str,
        version: &str,
        description: &str,
        (input_schema, output_schema): (Value, Value),
        examples: Vec<(Value, Value)>,
        capabilities: Value,
    ) -> Manifest {
        // A bad literal is the tool author's bug, like a bad name.
        let capabilities: toolsmith_contract::Capabilities = if capabilities.is_null() {
            Default::default()
        } else {
            serde_json::from_value(capabilities).unwrap_or_else(|e| panic!("bad capabilities for tool `{name}`: {e}"))
        };
        let manifest = Manifest {
            // A bad literal name is the tool author's bug; the host reports it at load.
            name: ToolName::new(name).unwrap_or_else(|e| panic!("{e}")),
            version: version.to_owned(),
            description: description.to_owned(),
            input_schema,
            output_schema,
            examples: examples
                .into_iter()
                .map(|(input, output)| Example { input, output, description: None })
                .collect(),
            kind: ToolKind::Plugin,
            provenance: Provenance::default(),
            capabilities,
        };
        if let Err(e) = manifest.check() {
            panic!("invalid manifest for tool `{name}`: {e}");
        }
        manifest
    }

    /// Checks every example against the tool's own schemas, then runs it through `call` and
    /// asserts it returns the declared output. Natively only: a component carries no validator.
    #[cfg(not(target_family = "wasm"))]
    pub fn check_examples(manifest: &Manifest, call: fn(&str) -> Result<String, ToolError>) {
        assert!(!manifest.examples.is_empty(), "tool `{}` declares no examples", manifest.name);
        // The host refuses a plugin whose examples do not validate (at build, add and doctor):
        // find out here, where the fix is.
        if let Err(problem) = toolsmith_contract::validate::check_manifest(manifest) {
            panic!("tool `{}`: {problem}", manifest.name);
        }
        for example in &manifest.examples {
            let out = match call(&example.input.to_string()) {
                Ok(out) => out,
                // Composition needs a host; the host's own tests run these examples in the sandbox.
                Err(e) if e.code == "not_in_host" => {
                    eprintln!("skipped natively (needs call_tool): example {}", example.input);
                    continue;
                }
                Err(e) => panic!("example {} of `{}` failed: {e}", example.input, manifest.name),
            };
            let out: Value = serde_json::from_str(&out).expect("tools return JSON");
            assert_eq!(out, example.output, "example {} of `{}`", example.input, manifest.name);
        }
    }

    /// Decodes the arguments, runs the tool function and encodes its result.
    pub fn call<I: DeserializeOwned, O: Serialize>(
        run: fn(I) -> Result<O, ToolError>,
        args: &str,
    ) -> Result<String, ToolError> {
        let input: I = serde_json::from_str(args)
            .map_err(|e| ToolError::new("invalid_args", format!("arguments do not match the input type: {e}")))?;
        let output = run(input)?;
        serde_json::to_string(&output)
            .map_err(|e| ToolError::new("invalid_output", format!("cannot encode the result: {e}")))
    }
}
