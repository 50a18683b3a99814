//! The agent runtime. So far: the trace grammar and the plan type every planning format parses
//! into.

pub mod plan;
pub mod trace;

pub use plan::{Plan, PlanError, Task};
pub use trace::{Block, Tag, ToolCall, TraceError, Turn};
