//! The trace grammar every agent method writes in, and the plan every planning format parses
//! into. A crate of its own: the runtime, the trainer (which masks observations by tag) and the
//! fuzz targets need it without the sandbox or libtorch.
//!
//! - [`trace`]: `<think>`, `<plan>`, `<graph>`, `<subtask>`, `<tool_call>`, `<observation>`,
//!   `<mem>`, `<reflection>`, `<answer>` with `\boxed{}`; parsing never fails.
//! - [`plan`]: GAP's plan lines and graphs and SEARL's DAG lists as one [`Plan`], with execution
//!   levels and precise errors.
#![warn(missing_docs)]

pub mod plan;
pub mod trace;

pub use plan::{Plan, PlanError, Task};
pub use trace::{Block, Tag, ToolCall, TraceError, Turn};
