//! One tool calling another through the host.

use serde_json::json;
use toolsmith_sandbox::Toolbox;

use super::show;

/// Prints ``composition: `units` evaluates an expression by calling `calculator` through the host:``
/// and that call.
pub(super) fn section(toolbox: &Toolbox) {
    println!("\ncomposition: `units` evaluates an expression by calling `calculator` through the host:");
    show(toolbox, "units", json!({"value": "60 * 60 * 24", "from": "s", "to": "d"}));
}
