//! Every bundled tool called on its manifest's examples, each output compared with the expected.

use std::time::Instant;

use toolsmith_sandbox::{Limits, Toolbox};

use super::{clip, us};

/// Prints `examples from each manifest, run in a fresh sandbox instance, both schemas checked:`
/// and one row per example; returns how many did not reproduce (the quickstart's exit code).
pub(super) fn section(toolbox: &Toolbox) -> usize {
    println!("\nexamples from each manifest, run in a fresh sandbox instance, both schemas checked:");
    println!("  {:<11} {:<48} {:<44} {:>9}  ok", "tool", "input", "output", "time");
    let mut failures = 0;
    for tool in toolbox.tools() {
        for example in &tool.manifest.examples {
            let started = Instant::now();
            let outcome = toolbox.call(tool.name(), &example.input, Limits::default());
            let took = started.elapsed();
            let (shown, ok) = match &outcome {
                Ok(out) => (out.value.to_string(), out.value == example.output),
                Err(e) => (e.to_envelope().to_string(), false),
            };
            failures += usize::from(!ok);
            println!(
                "  {:<11} {:<48} {:<44} {:>9}  {}",
                tool.name(),
                clip(&example.input.to_string(), 48),
                clip(&shown, 44),
                us(took),
                if ok { "yes" } else { "NO" }
            );
        }
    }
    failures
}
