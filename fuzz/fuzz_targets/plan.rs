//! Any text either builds a valid plan or a precise error: never a panic. A valid plan's levels
//! cover every task once and respect every dependency.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use toolsmith_trace::plan;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for parsed in [plan::parse(text), plan::parse_lines(text), plan::parse_graph(text), plan::parse_searl(text)] {
        let Ok(plan) = parsed else { continue };
        let mut level_of = HashMap::new();
        for (l, level) in plan.levels().iter().enumerate() {
            for &i in level {
                assert!(level_of.insert(plan.tasks()[i].id.clone(), l).is_none(), "a task in two levels");
            }
        }
        assert_eq!(level_of.len(), plan.tasks().len());
        for t in plan.tasks() {
            for d in &t.depends_on {
                assert!(level_of[d] < level_of[&t.id], "{} runs before its dependency {d}", t.id);
            }
        }
        let _ = plan.to_string();
    }
});
