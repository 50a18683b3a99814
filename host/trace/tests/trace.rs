//! The trace grammar and plans: every format parses into one Plan; malformed and adversarial input
//! is reported precisely and never panics.

use toolsmith_trace::plan::{self, PlanError};
use toolsmith_trace::trace::{self, Block, Tag, TraceError, boxed};

fn ids(levels: &[Vec<usize>], plan: &toolsmith_trace::Plan) -> Vec<Vec<String>> {
    levels.iter().map(|l| l.iter().map(|&i| plan.tasks()[i].id.clone()).collect()).collect()
}

#[test]
fn gap_plan_lines_parse_into_levels() {
    // As in GAP's case study: dependencies on the next line, the closing tag on the last one.
    let text = "<think>two people, one comparison</think>\n<plan>\nTask 1: Search for John Frankenheimer's occupations\n- Dependencies: none\nTask 2: Search for Tiffanie DeBartolo's occupations\n- Dependencies: none\nTask 3: Compare their occupations\n- Dependencies: Task 1, Task 2 </plan>";
    let turn = trace::parse(text);
    assert!(turn.errors.is_empty(), "{:?}", turn.errors);
    let plan = turn.plan().expect("a plan").expect("valid");
    assert_eq!(plan.tasks().len(), 3);
    assert_eq!(plan.tasks()[2].depends_on, vec!["1", "2"]);
    assert_eq!(ids(&plan.levels(), &plan), vec![vec!["1", "2"], vec!["3"]]);
    assert_eq!(plan.edges(), vec![("1", "3"), ("2", "3")]);
    // One-line form and the canonical rendering parse to the same plan.
    let again = plan::parse(&plan.to_string()).expect("round trip");
    assert_eq!(again, plan);
}

#[test]
fn gap_graph_and_searl_dag_list_parse_into_the_same_shape() {
    let graph = r#"<graph>
<node id="s1">search("capital of France")</node>
<node id="s2">search("capital of Germany") </node>
<node id="s3" depends="s1">search("population of {s1}")</node>
<node id='s4' depends="s2">search("population of {s2}")</node>
</graph>"#;
    let turn = trace::parse(graph);
    let plan = turn.plan().expect("plan").expect("valid");
    assert_eq!(ids(&plan.levels(), &plan), vec![vec!["s1", "s2"], vec!["s3", "s4"]]);
    assert_eq!(plan.task("s3").expect("s3").description, "search(\"population of {s1}\")");

    let searl = "##DAG_LIST\n[(ST1, ST3), (ST1, ST2), (ST2, ST3)]\n##ST1: find the inputs\n1. read the question.\n##ST2: compute\n1. write a tool.\n2. run it.\n##ST3: verify\n1. check.";
    let turn = trace::parse(searl);
    let plan = turn.plan().expect("plan").expect("valid");
    assert_eq!(ids(&plan.levels(), &plan), vec![vec!["ST1"], vec!["ST2"], vec!["ST3"]]);
    assert_eq!(plan.task("ST3").expect("ST3").depends_on, vec!["ST1", "ST2"]);
    assert!(plan.task("ST2").expect("ST2").description.contains("2. run it."));
    // A single task.
    let single = plan::parse("##DAG_LIST\n[(ST1)]\n##ST1: everything").expect("single");
    assert_eq!(single.levels(), vec![vec![0]]);
}

#[test]
fn plan_errors_are_precise() {
    assert_eq!(
        plan::parse("Task 1: a - Dependencies: none\nTask 1: b - Dependencies: none"),
        Err(PlanError::DuplicateId { id: "1".into() })
    );
    assert_eq!(
        plan::parse("Task 1: a - Dependencies: Task 7"),
        Err(PlanError::UnknownDependency { task: "1".into(), dependency: "7".into() })
    );
    assert_eq!(plan::parse("Task 1: a - Dependencies: Task 1"), Err(PlanError::SelfDependency { task: "1".into() }));
    let cycle = plan::parse(
        "Task 1: a - Dependencies: Task 3\nTask 2: b - Dependencies: Task 1\nTask 3: c - Dependencies: Task 2",
    );
    match cycle {
        Err(PlanError::Cycle { cycle }) => {
            assert_eq!(cycle.first(), cycle.last());
            assert_eq!(cycle.len(), 4, "{cycle:?}");
        }
        other => panic!("expected a cycle, got {other:?}"),
    }
    assert_eq!(plan::parse(""), Err(PlanError::Empty));
    assert!(matches!(plan::parse("first do this"), Err(PlanError::Malformed { line: 1, .. })));
    assert!(matches!(plan::parse("Task 1: a - Dependencies: the one before"), Err(PlanError::Malformed { .. })));
    assert!(matches!(plan::parse("<node depends=\"x\">no id</node>"), Err(PlanError::Malformed { .. })));
    assert!(matches!(plan::parse("<node id=\"a\">never closed"), Err(PlanError::Malformed { .. })));
    assert_eq!(
        plan::parse("##DAG_LIST\n[(ST1, ST9)]\n##ST1: a"),
        Err(PlanError::UnknownDependency { task: "ST9".into(), dependency: "ST1".into() })
    );
    assert!(matches!(
        plan::parse("##DAG_LIST\n[(ST1, ST2, ST3)]\n##ST1: a"),
        Err(PlanError::Malformed { line: 2, .. })
    ));
    // Errors read well as observations.
    let message = plan::parse("Task 1: a - Dependencies: Task 2").expect_err("unknown").to_string();
    assert_eq!(message, "task `1` depends on `2`, which is not a task of this plan");
}

#[test]
fn several_tool_calls_in_one_turn_and_their_errors() {
    let text = r#"<think>two lookups at once</think>
<tool_call>{"name": "search", "arguments": {"query": "Ada Lovelace"}}</tool_call>
<tool_call>{"name": "search", "arguments": "{\"query\": \"Alan Turing\"}"}</tool_call>
<tool_call>{"name": "calculator"</tool_call>
<tool_call>["search"]</tool_call>
<tool_call>{"name": "", "arguments": {}}</tool_call>
<tool_call>{"name": "x", "arguments": [1], "extra": 1}</tool_call>"#;
    let turn = trace::parse(text);
    assert!(turn.errors.is_empty());
    let calls = turn.tool_calls();
    assert_eq!(calls.len(), 6);
    let first = calls[0].as_ref().expect("valid");
    assert_eq!((first.name.as_str(), &first.arguments["query"]), ("search", &serde_json::json!("Ada Lovelace")));
    let second = calls[1].as_ref().expect("arguments as a JSON string are accepted");
    assert_eq!(second.arguments["query"], "Alan Turing");
    for (i, call) in calls.iter().enumerate().skip(2) {
        match call {
            Err(TraceError::InvalidToolCall { message, .. }) => assert!(!message.is_empty()),
            other => panic!("call {i}: expected an error, got {other:?}"),
        }
    }
}

#[test]
fn mem_answer_and_boxed() {
    let turn = trace::parse(
        "<mem>Q1 done: 42.</mem><subtask>Q2</subtask><mem>Q1: 42; Q2 open</mem>\n<answer>The result is \\boxed{\\frac{1}{2}}.</answer>",
    );
    assert_eq!(turn.mem(), Some("Q1: 42; Q2 open"));
    assert_eq!(turn.contents(Tag::Subtask).collect::<Vec<_>>(), vec!["Q2"]);
    assert_eq!(turn.final_answer().as_deref(), Some("\\frac{1}{2}"));
    assert_eq!(boxed("a \\boxed{1} then \\boxed{2}"), Some("2".into()));
    assert_eq!(boxed("\\boxed{unbalanced"), None);
    assert_eq!(trace::parse("<answer>Paris</answer>").final_answer().as_deref(), Some("Paris"));
}

#[test]
fn malformed_turns_keep_what_was_said_and_report_the_rest() {
    let turn = trace::parse("text before </think> <think>a <plan> b</think> <answer>cut off");
    let kinds: Vec<&TraceError> = turn.errors.iter().collect();
    assert!(matches!(kinds[0], TraceError::UnexpectedClose { offset: 12, .. }), "{kinds:?}");
    assert!(matches!(kinds[1], TraceError::Nested { .. }));
    assert!(matches!(kinds[2], TraceError::Unclosed { .. }));
    assert_eq!(turn.answer(), Some("cut off"), "a truncated answer is still read");
    assert!(matches!(&turn.blocks[0], Block::Text { content, .. } if content == "text before </think>"));
    // Unknown tags and stray angle brackets are plain text.
    let turn = trace::parse("1 < 2 and <b>bold</b> <search>x</search>");
    assert!(turn.errors.is_empty());
    assert_eq!(turn.blocks.len(), 1);
}

#[test]
fn adversarial_input_does_not_panic_or_blow_up() {
    let long = "<".repeat(200_000);
    let turn = trace::parse(&long);
    assert!(turn.errors.is_empty());
    let deep = "<think>".repeat(10_000) + &"</think>".repeat(10_000);
    let turn = trace::parse(&deep);
    assert!(!turn.errors.is_empty());
    for text in [
        "<tool_call>",
        "</tool_call>",
        "<",
        "<>",
        "<\u{e9}>",
        "é<plan>Task é: ü - Dependencies: none</plan>",
        "\u{0}<mem>\u{0}</mem>",
    ] {
        let turn = trace::parse(text);
        let _ = (turn.plan(), turn.tool_calls(), turn.final_answer(), turn.to_string());
    }
    for text in [
        "Task",
        "Task :",
        "Task 1:",
        "- Dependencies: none",
        "##DAG_LIST",
        "##DAG_LIST\n[",
        "##DAG_LIST\n[((,)]",
        "<node id=",
        "<node id=\"",
        "<node id='a' depends='a'>x</node>",
    ] {
        let _ = plan::parse(text);
    }
}

#[test]
fn levels_never_run_a_task_before_its_dependencies() {
    // Random DAGs (edges only from earlier to later tasks, written in shuffled order).
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    for _ in 0..200 {
        let n = 1 + next(30) as usize;
        let mut tasks: Vec<toolsmith_trace::Task> = (0..n)
            .map(|i| toolsmith_trace::Task {
                id: format!("t{i}"),
                description: format!("step {i}"),
                depends_on: (0..i).filter(|_| next(4) == 0).map(|j| format!("t{j}")).collect(),
            })
            .collect();
        for i in (1..tasks.len()).rev() {
            tasks.swap(i, next(i as u64 + 1) as usize);
        }
        let plan = toolsmith_trace::Plan::new(tasks).expect("acyclic by construction");
        let levels = plan.levels();
        let level_of =
            |id: &str| levels.iter().position(|l| l.iter().any(|&i| plan.tasks()[i].id == id)).expect("placed");
        assert_eq!(levels.iter().map(Vec::len).sum::<usize>(), n, "every task exactly once");
        for task in plan.tasks() {
            let mine = level_of(&task.id);
            let deepest = task.depends_on.iter().map(|d| level_of(d) + 1).max().unwrap_or(0);
            assert_eq!(mine, deepest, "{} runs as early as its dependencies allow, no earlier", task.id);
        }
    }
}
