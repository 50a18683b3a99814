//! Any text parses into a turn without panicking, and what the turn reports is consistent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolsmith_trace::trace;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let turn = trace::parse(text);
    // Block offsets point inside the text, at character boundaries.
    for block in &turn.blocks {
        let offset = match block {
            trace::Block::Tagged { offset, .. } | trace::Block::Text { offset, .. } => *offset,
        };
        assert!(offset <= text.len() && text.is_char_boundary(offset));
    }
    for call in turn.tool_calls() {
        if let Ok(call) = call {
            assert!(!call.name.is_empty());
        }
    }
    if let Some(Ok(plan)) = turn.plan() {
        let levels = plan.levels();
        assert_eq!(levels.iter().map(Vec::len).sum::<usize>(), plan.tasks().len());
    }
    let _ = turn.final_answer();
    let _ = trace::boxed(text);
});
