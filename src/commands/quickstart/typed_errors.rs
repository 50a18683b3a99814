//! Failed calls as the structured errors an agent reads: bad arguments, a failed conversion,
//! a misspelt tool.

use serde_json::json;
use toolsmith_sandbox::Toolbox;

use super::show;

/// Prints `failures are data an agent can read and correct:` and three failing calls.
pub(super) fn section(toolbox: &Toolbox) {
    println!("\nfailures are data an agent can read and correct:");
    show(toolbox, "calculator", json!({"expression": 42}));
    show(toolbox, "units", json!({"value": 3, "from": "km", "to": "kg"}));
    show(toolbox, "calculater", json!({"expression": "1"}));
}
