//! The Toolsmith agent runtime.
//!
//! - [`trace`] and [`plan`] (re-exported from `toolsmith-trace`): one tagged grammar for every method; GAP's plan lines and graphs and
//!   SEARL's DAG lists parse into one [`Plan`].
//! - [`schedule`]: a level's independent calls run concurrently under a cap and per-call timeouts.
//! - [`runner`]: the agent loop in ReAct, GAP, MemPO and SEARL modes, with retrieval from the tool
//!   graph and token accounting (TT, PT).
//! - [`tools`]: the search tool, sandboxed tools, `create_and_execute_mcp` and simulated tools.
//! - [`mcp_client`]: the tools of an MCP server (e.g. `toolsmith serve`), as an executor.
//! - [`tool_graph`]: retrieval from the registry's tool graph, and what a finished trajectory
//!   teaches it (plan edges, candidate tools, usage).
//! - [`backend`]: the local policy, any OpenAI-compatible endpoint, and the [`oracle`].
//! - [`env`](mod@env): the bundled offline world, users' task sets and corpora, and metrics.
#![warn(missing_docs)]

pub mod backend;
pub mod env;
pub mod eval;
pub mod function_calling;
pub mod mcp_client;
pub mod oracle;
pub mod runner;
pub mod schedule;
pub mod simulate;
pub mod tool_graph;
pub mod tools;

// The modules' names before they were named by role; the CLI and the trainer still import them
// by these paths.
pub use mcp_client as mcp;
pub use tool_graph as graph;

pub use toolsmith_trace::{plan, trace};

pub use backend::{Backend, BackendError, Completion, GenerateOptions, Message, Role, TurnTokens, Usage};
pub use oracle::Oracle;
pub use plan::{Plan, PlanError, Task};
pub use runner::{Agent, AgentConfig, ContextPolicy, Finish, Mode, ToolFormat, Trajectory};
pub use schedule::{CallRecord, Scheduler};
pub use trace::{Block, Tag, ToolCall, TraceError, Turn};
