//! What the graph page reads: usage statistics written in batches, failures by kind, aliases as
//! nodes, a tool in full, and a checkpoint's snapshot read without writing to it.

use toolsmith_registry::{CallUsage, EdgeKind, NodeKind, PlanStep, Snapshot, UsageLog};

use crate::{open, temp, tool};

fn step(id: &str, tool: &str, deps: &[&str]) -> PlanStep {
    PlanStep { id: id.into(), tool: tool.into(), depends_on: deps.iter().map(|d| d.to_string()).collect() }
}

#[test]
fn calls_count_failures_by_kind_and_rewards_once_per_episode() {
    let (_d, path) = temp();
    let mut r = open(&path);
    r.register_many(vec![tool("fetch_rows", "Fetch rows."), tool("mean_of", "Mean of numbers.")], false)
        .expect("register");
    let before = r.activity().expect("activity");
    let recorded = r
        .record_calls(&[
            CallUsage::new("fetch_rows", None).with_reward(Some(1.0)),
            CallUsage::new("fetch_rows", Some("timeout")),
            CallUsage::new("fetch_rows", Some("timeout")).with_reward(Some(0.0)),
            CallUsage::new("fetch_rows", Some("invalid_args")),
            CallUsage::new("made_up_tool", None),
            CallUsage::new("mean_of", None).with_reward(Some(f64::NAN)),
        ])
        .expect("record");
    assert_eq!((recorded.recorded, recorded.unknown), (5, 1));
    let after = r.activity().expect("activity");
    assert!(after.activity > before.activity, "{before:?} -> {after:?}");
    assert_eq!(after.generation, before.generation, "calls do not change the tool list");

    let view = r.tool_view("fetch_rows").expect("view");
    // The caller's `invalid_args` is kept by kind but is not the tool's failure.
    assert_eq!((view.stats.calls, view.stats.successes, view.stats.failures), (4, 1, 2));
    assert_eq!(view.stats.failures_by_kind.get("timeout"), Some(&2));
    assert_eq!(view.stats.failures_by_kind.get("invalid_args"), Some(&1));
    assert_eq!((view.stats.reward_count, view.stats.reward_mean), (2, Some(0.5)));
    // A non-finite reward is not a reward.
    let mean = r.tool_view("mean_of").expect("view");
    assert_eq!((mean.stats.calls, mean.stats.reward_count), (1, 0));
    // `tools show` reads the same columns.
    assert_eq!(r.get("fetch_rows").expect("get").stats.usage_count, 4);
    assert!(matches!(r.record_call("made_up_tool", true, None), Err(toolsmith_registry::RegistryError::NotFound(_))));
}

#[test]
fn merged_failures_add_up_and_aliases_become_nodes() {
    let (_d, path) = temp();
    let mut r = open(&path);
    r.register_many(
        vec![tool("csv_to_json", "Convert CSV."), tool("csv_parse", "Parse CSV."), tool("mean_of", "Mean.")],
        false,
    )
    .expect("register");
    r.record_plan(&[step("a", "csv_parse", &[]), step("b", "mean_of", &["a"])], 1.0).expect("plan");
    r.record_calls(&[CallUsage::new("csv_parse", Some("trap")), CallUsage::new("csv_to_json", Some("trap"))])
        .expect("calls");
    r.merge("csv_to_json", "csv_parse").expect("merge");

    let view = r.tool_view("csv_parse").expect("through the alias");
    assert_eq!(view.name, "csv_to_json");
    assert_eq!(view.aliases, ["csv_parse"]);
    assert_eq!(view.stats.failures_by_kind.get("trap"), Some(&2));
    assert_eq!(view.provenance.parents[0].as_str(), "csv_parse");
    assert!(view.last_used_at.is_some(), "the merged tools' calls keep their time");

    let graph = r.graph_view().expect("graph");
    assert_eq!((graph.stats.tools, graph.stats.aliases, graph.stats.edges, graph.stats.calls), (2, 1, 1, 2));
    let alias = graph.nodes.iter().find(|n| n.name == "csv_parse").expect("alias node");
    assert_eq!((alias.kind, alias.canonical.as_deref()), (NodeKind::Alias, Some("csv_to_json")));
    let kinds: Vec<(&str, &str, EdgeKind)> =
        graph.edges.iter().map(|e| (e.src.as_str(), e.dst.as_str(), e.kind)).collect();
    assert_eq!(kinds, [("csv_to_json", "mean_of", EdgeKind::Plan), ("csv_parse", "csv_to_json", EdgeKind::Alias)]);
    assert!(matches!(r.tool_view("no_such_tool"), Err(toolsmith_registry::RegistryError::NotFound(_))));
    r.register(tool("never_called", "Never called."), false).expect("register");
    r.register(tool("never_called_either", "Never called either."), false).expect("register");
    r.merge("never_called", "never_called_either").expect("merge");
    assert_eq!(r.get("never_called").expect("merged").last_used_at, None, "a merge invents no last use");
}

#[test]
fn a_part_of_the_graph_is_the_tools_near_one_with_their_aliases() {
    let (_d, path) = temp();
    let mut r = open(&path);
    let names = ["fetch_rows", "csv_parse", "mean_of", "plot_values", "lonely_tool", "old_parse"];
    r.register_many(names.iter().map(|n| tool(n, &format!("The {n} tool."))).collect(), false).expect("register");
    let plan = [step("a", "fetch_rows", &[]), step("b", "csv_parse", &["a"]), step("c", "mean_of", &["b"])];
    r.record_plan(&plan, 1.0).expect("plan");
    r.record_plan(&[step("a", "mean_of", &[]), step("b", "plot_values", &["a"])], 1.0).expect("plan");
    r.record_calls(&[CallUsage::new("csv_parse", None), CallUsage::new("plot_values", None)]).expect("calls");
    r.merge("csv_parse", "old_parse").expect("merge");
    let graph = r.graph_view().expect("graph");

    // Asked for by its alias, one hop either way along plan edges; the alias comes along.
    let part = graph.around("old_parse", 1).expect("around");
    let nodes: Vec<&str> = part.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(nodes, ["csv_parse", "fetch_rows", "mean_of", "old_parse"]);
    let edges: Vec<(&str, &str, EdgeKind)> =
        part.edges.iter().map(|e| (e.src.as_str(), e.dst.as_str(), e.kind)).collect();
    assert_eq!(
        edges,
        [
            ("csv_parse", "mean_of", EdgeKind::Plan),
            ("fetch_rows", "csv_parse", EdgeKind::Plan),
            ("old_parse", "csv_parse", EdgeKind::Alias)
        ]
    );
    assert_eq!((part.stats.tools, part.stats.aliases, part.stats.edges, part.stats.calls), (3, 1, 2, 1));
    assert_eq!((part.format, part.generation), (graph.format, graph.generation));

    let alone = graph.around("csv_parse", 0).expect("depth 0");
    assert_eq!(alone.tools().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["csv_parse"]);
    assert_eq!(alone.plan_edges().count(), 0);
    let reachable = graph.around("fetch_rows", 10).expect("far");
    assert_eq!(reachable.stats.tools, 4, "everything but the tool no plan used");
    assert_eq!(graph.stats, r.view_stats().expect("totals"), "the totals of the whole graph, counted by SQL");
    assert!(matches!(graph.around("no_such_tool", 1), Err(toolsmith_registry::RegistryError::NotFound(_))));
}

#[test]
fn an_admitted_tool_names_the_episode_it_came_from() {
    let (_d, path) = temp();
    let mut r = open(&path);
    for (task, reward) in [("task-7", 0.4), ("task-9", 0.9)] {
        r.add_candidate(&toolsmith_registry::Candidate {
            run: "rl-1".into(),
            iteration: 3,
            task: task.into(),
            trajectory: "{}".into(),
            reward,
            tool: tool("sum_integers", "Add a list of integers exactly."),
        })
        .expect("candidate");
    }
    r.register_best("rl-1", 3).expect("admit");
    let view = r.tool_view("sum_integers").expect("view");
    let origin = view.origin.expect("an origin");
    assert_eq!((origin.run.as_str(), origin.iteration, origin.task.as_str()), ("rl-1", 3, "task-9"));
    assert_eq!(origin.reward, 0.9);
    r.register(tool("by_hand", "Registered by a person."), false).expect("register");
    assert_eq!(r.tool_view("by_hand").expect("view").origin, None);
}

#[test]
fn the_usage_log_batches_and_agrees_with_a_count() {
    let (dir, path) = temp();
    let mut r = open(&path);
    r.register(tool("fetch_rows", "Fetch rows."), false).expect("register");
    let log = UsageLog::open(&path).expect("usage log");
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..250u32 {
                    let failure = i.is_multiple_of(10).then_some("tool_error");
                    log.record(CallUsage::new("fetch_rows", failure).with_reward(Some(f64::from(t))));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    log.flush().expect("flush");
    let view = r.tool_view("fetch_rows").expect("view");
    assert_eq!((view.stats.calls, view.stats.failures, view.stats.reward_count), (1000, 100, 1000));
    assert_eq!(view.stats.reward_mean, Some(1.5));
    // The last clone dropped commits what is still queued.
    log.record(CallUsage::new("fetch_rows", None));
    drop(log);
    assert_eq!(r.get("fetch_rows").expect("get").stats.usage_count, 1001);
    // A file that is not a registry is refused up front, not discovered by the writer thread.
    let foreign = dir.path().join("foreign.db");
    std::fs::write(&foreign, b"not a database, only some bytes that are not SQLite").expect("write");
    assert!(UsageLog::open(&foreign).is_err());
}

#[test]
fn a_snapshot_is_read_without_writing() {
    let (dir, path) = temp();
    let mut r = open(&path);
    r.register(tool("fetch_rows", "Fetch rows. <script>alert(1)</script>"), false).expect("register");
    let copy = dir.path().join("snapshot.db");
    r.snapshot(&copy).expect("snapshot");
    let modified = std::fs::metadata(&copy).and_then(|m| m.modified()).expect("mtime");
    let snapshot = Snapshot::open(&copy).expect("open snapshot");
    let graph = snapshot.graph_view().expect("graph");
    assert_eq!(graph.nodes.len(), 1);
    assert_eq!(graph.nodes[0].description, "Fetch rows. <script>alert(1)</script>");
    assert_eq!(snapshot.tool_view("fetch_rows").expect("tool").name, "fetch_rows");
    drop(snapshot);
    assert_eq!(std::fs::metadata(&copy).and_then(|m| m.modified()).expect("mtime"), modified);
    assert!(!dir.path().join("snapshot.db-wal").exists());

    let foreign = dir.path().join("foreign.db");
    rusqlite::Connection::open(&foreign).and_then(|c| c.execute_batch("CREATE TABLE t (x)")).expect("foreign");
    let err = Snapshot::open(&foreign).expect_err("foreign");
    assert!(err.to_string().contains("not a Toolsmith registry"), "{err}");
    std::fs::write(dir.path().join("garbage.db"), b"not sqlite at all, just bytes........").expect("write");
    assert!(Snapshot::open(&dir.path().join("garbage.db")).is_err());
    assert!(Snapshot::open(&dir.path().join("absent.db")).is_err());
}
