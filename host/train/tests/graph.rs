//! SEARL's tool graph during training, with the real pieces: the CPython guest runs the tools the
//! oracle's rollouts create, the registry is SQLite with BM25 and MiniLM retrieval, and the
//! snapshot a checkpoint carries restores the graph and the tools it admitted.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use toolsmith_agent::env::{Corpus, Family, World, WorldConfig};
use toolsmith_agent::tools::{CREATE_TOOL, Executor, LocalTools};
use toolsmith_agent::{Agent, AgentConfig, Mode, Oracle, Trajectory};
use toolsmith_registry::Registry;
use toolsmith_sandbox::python::{PythonRuntime, default_guest_path};
use toolsmith_sandbox::{Limits, Sandbox, SandboxConfig, Toolbox};
use toolsmith_train::rl::reward::EpisodeReward;
use toolsmith_train::rl::training_graph::{REGISTRY_FILE, TrainingGraph};

/// The world's search and a fresh toolbox with the Python guest (no plugins: they are not what
/// this test is about).
fn tools(corpus: Arc<Corpus>) -> LocalTools {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache");
    let sandbox = Sandbox::new(SandboxConfig { cache_dir: Some(cache), ..SandboxConfig::default() }).expect("sandbox");
    let runtime =
        PythonRuntime::load(sandbox.clone(), &default_guest_path()).expect("python guest (scripts/setup.sh builds it)");
    let toolbox = Toolbox::new(sandbox);
    toolbox.set_python(runtime);
    LocalTools::new().with_corpus(corpus).with_toolbox(toolbox, Limits::default())
}

fn names(executor: &dyn Executor) -> Vec<String> {
    executor.manifests().iter().map(|m| m.name.as_str().to_string()).collect()
}

#[test]
fn the_graph_admits_the_best_rollouts_tools_reuses_them_and_restores_from_a_checkpoint() {
    let world = World::generate(WorldConfig { seed: 5, countries: 2, tasks_per_family: 1 });
    let task = world.tasks().into_iter().find(|t| t.family == Family::Numeric).expect("a numeric task");
    let compute = task.solution.as_ref().and_then(|s| s.compute.clone()).expect("the oracle writes a tool for it");
    let corpus = Arc::new(Corpus::new(&world.documents()).expect("corpus"));
    let executor: Arc<LocalTools> = Arc::new(tools(corpus.clone()));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(REGISTRY_FILE);
    let graph = TrainingGraph::create(&path, &executor.manifests()).expect("graph");
    assert!(!names(executor.as_ref()).contains(&compute.name));

    // A group of two SEARL rollouts of the task, both writing the same tool and equally good:
    // the first one's tool is admitted, the other's rejected.
    let tokenizer = Arc::new(toolsmith_policy::Tokenizer::tiny().expect("tokenizer"));
    let oracle = Oracle::new(std::slice::from_ref(&task), Mode::Searl, tokenizer.clone());
    let agent = Agent::new(
        Arc::new(oracle),
        executor.clone(),
        AgentConfig { mode: Mode::Searl, max_turns: 12, ..AgentConfig::default() },
    );
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let episodes: Vec<Trajectory> = (0..2).map(|_| runtime.block_on(agent.run(&task.question))).collect();
    for e in &episodes {
        assert!(e.calls().any(|c| c.name == CREATE_TOOL && c.created.is_some()), "{e:?}");
    }
    // First a group whose best rollout wrote no tool (a GAP-style one): the worse rollout's tool
    // is not a candidate.
    let plain = {
        let oracle = Oracle::new(std::slice::from_ref(&task), Mode::Gap, tokenizer.clone());
        let config = AgentConfig { mode: Mode::Gap, max_turns: 12, ..AgentConfig::default() };
        runtime.block_on(Agent::new(Arc::new(oracle), executor.clone(), config).run(&task.question))
    };
    assert!(!plain.calls().any(|c| c.name == CREATE_TOOL));
    let searches = |e: &[Trajectory]| e.iter().flat_map(|e| e.calls()).filter(|c| c.name == "search").count();
    let mixed = [episodes[0].clone(), plain];
    let right = |total| EpisodeReward { total, outcome: 1.0, steps: Vec::new() };
    let wrong = |total| EpisodeReward { total, outcome: 0.0, steps: Vec::new() };
    let update = graph
        .learn(1, &[("t", mixed.as_slice(), &[right(0.4), right(1.0)])], true, &[executor.as_ref()])
        .expect("learn");
    assert_eq!((update.candidates, update.admitted), (0, 0), "{update:?}");
    // Nor does a group where every rollout answered wrong add anything, though SEARL's shaping
    // (well-formed, planned, executed turns) gave them totals above 0.
    let update = graph
        .learn(1, &[("t", episodes.as_slice(), &[wrong(0.3), wrong(0.3)])], true, &[executor.as_ref()])
        .expect("learn");
    assert_eq!((update.candidates, update.admitted), (0, 0), "{update:?}");
    let update = graph
        .learn(1, &[(task.id.as_str(), episodes.as_slice(), &[right(1.0), right(1.0)])], true, &[executor.as_ref()])
        .expect("learn");
    assert_eq!((update.candidates, update.admitted, update.merged), (2, 1, 0), "{update:?}");
    assert_eq!(graph.admitted_names().expect("names"), vec![compute.name.clone()]);
    let inspect = Registry::open(&path).expect("registry");
    let statuses: Vec<String> =
        inspect.candidates("rl", 1).expect("candidates").into_iter().map(|c| c.status).collect();
    assert_eq!(statuses, ["admitted", "rejected"]);
    // Every rollout's calls were counted, whatever its reward (three groups learned from).
    let search = inspect.get("search").expect("search node");
    assert_eq!(search.stats.usage_count as usize, searches(&mixed) + 2 * searches(&episodes));
    // A reward counts once per episode that used the tool, not once per call.
    let using = |e: &[Trajectory]| e.iter().filter(|e| e.calls().any(|c| c.name == "search")).count();
    assert_eq!(search.stats.reward_count as usize, using(&mixed) + 2 * using(&episodes));
    assert!(
        searches(&mixed) + 2 * searches(&episodes) > using(&mixed) + 2 * using(&episodes),
        "some episode searched twice"
    );
    drop(inspect);

    // Installed: the next rollouts can call it like any tool, and retrieval finds it.
    assert!(names(executor.as_ref()).contains(&compute.name));
    let sum = runtime.block_on(executor.call(&compute.name, &json!({"values": [2, 3, 5]})));
    assert_eq!(sum.value.as_ref().ok(), Some(&json!({"result": 10})), "{:?}", sum.value);
    let found = runtime.block_on(graph.retriever().retrieve(std::slice::from_ref(&compute.description), 3));
    assert!(found.iter().any(|m| m.name.as_str() == compute.name), "{found:?}");

    // A checkpoint's snapshot; the live registry then moves on (an iteration the crash loses).
    let checkpoint = dir.path().join("step-1");
    std::fs::create_dir_all(&checkpoint).expect("mkdir");
    graph.snapshot(&checkpoint).expect("snapshot");
    graph
        .learn(2, &[(task.id.as_str(), episodes.as_slice(), &[right(1.0), right(1.0)])], true, &[executor.as_ref()])
        .expect("learn");
    drop(graph);

    // Resume in a fresh process: new executors that know nothing of the tool.
    let fresh = tools(corpus);
    assert!(!names(&fresh).contains(&compute.name));
    let restored = TrainingGraph::restore(&path, &checkpoint).expect("restore");
    assert_eq!(restored.install_all(&[&fresh]).expect("install"), 1);
    assert!(names(&fresh).contains(&compute.name));
    let sum = runtime.block_on(fresh.call(&compute.name, &json!({"values": [1, 1]})));
    assert_eq!(sum.value.as_ref().ok(), Some(&json!({"result": 2})), "{:?}", sum.value);
    let mut inspect = Registry::open(&path).expect("registry");
    assert!(inspect.candidates("rl", 2).expect("candidates").is_empty(), "iteration 2 was after the snapshot");
    let report = inspect.doctor().expect("doctor");
    assert!(report.problems.is_empty(), "{:?}", report.problems);

    // A checkpoint without a snapshot is a clear error, not an empty graph.
    let empty = dir.path().join("step-0");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let err = TrainingGraph::restore(&dir.path().join("other.db"), &empty).expect_err("no snapshot").to_string();
    assert!(err.contains("no tool registry snapshot"), "{err}");
}

/// SFT's `data.reuse`: the chosen tasks' SEARL traces are written where the tool an agent
/// writes for them is installed and listed already, so they call it (run in the guest) instead
/// of writing it again; the others write it.
#[test]
fn reuse_traces_call_the_listed_tool_an_agent_wrote_instead_of_writing_it() {
    use toolsmith_train::config::{DataConfig, SftConfig, WorldsData};
    use toolsmith_train::conversation::{Chat, Content};

    let worlds = WorldsData {
        seeds: vec![5],
        countries: 2,
        tasks_per_family: 1,
        styles: vec![Mode::Searl],
        ..WorldsData::default()
    };
    let world = World::generate(worlds.world(5));
    let task = world.tasks().into_iter().find(|t| t.family == Family::Numeric).expect("a numeric task");
    let compute = task.solution.as_ref().and_then(|s| s.compute.clone()).expect("a tool to write");
    let config = |reuse: f64| SftConfig {
        data: DataConfig { worlds: worlds.clone(), reuse, ..DataConfig::default() },
        ..SftConfig::default()
    };
    let tools_for = |corpus: Arc<Corpus>| -> Arc<dyn Executor> { Arc::new(tools(corpus)) };
    let text = |chat: &Chat, i: usize| match &chat.turns[i].content {
        Content::Text(t) => t.clone(),
        Content::Ids(_) => panic!("a text turn"),
    };
    let numeric_trace = |reuse: f64| -> Chat {
        let chats = toolsmith_train::sft::load_chats(&config(reuse), &tools_for).expect("traces");
        assert_eq!(chats.len(), world.tasks().len(), "one SEARL trace per task");
        chats.into_iter().map(|(_, c)| c).find(|c| text(c, 1) == task.question).expect("the numeric task's trace")
    };
    let call = format!("\"name\":\"{}\"", compute.name);

    let writes = numeric_trace(0.0);
    let reuses = numeric_trace(1.0);
    // Same conversation length: only the arithmetic turn and what it observes differ.
    assert_eq!(writes.turns.len(), reuses.turns.len());
    assert!(!text(&writes, 0).contains(&format!("- {}(", compute.name)), "{}", text(&writes, 0));
    assert!(text(&reuses, 0).contains(&format!("- {}(", compute.name)), "listed: {}", text(&reuses, 0));
    let n = reuses.turns.len();
    let (tool_turn, observation, answer) = (n - 3, n - 2, n - 1);
    assert!(text(&writes, tool_turn).contains(CREATE_TOOL), "{}", text(&writes, tool_turn));
    assert!(text(&reuses, tool_turn).contains(&call), "{}", text(&reuses, tool_turn));
    assert!(!text(&reuses, tool_turn).contains(CREATE_TOOL));
    // The guest ran the listed tool on the task's values: the observation holds the sum.
    let sum = &task.golden_answers[0];
    assert!(text(&reuses, observation).contains(&format!("\"result\":{sum}")), "{}", text(&reuses, observation));
    assert_eq!(text(&writes, answer), text(&reuses, answer));

    // A share of the tasks: of the world's tasks, that many SEARL traces list the tool.
    let half = toolsmith_train::sft::load_chats(&config(0.5), &tools_for).expect("traces");
    let listing = half.iter().filter(|(_, c)| text(c, 0).contains(&format!("- {}(", compute.name))).count();
    assert_eq!(listing, (0.5 * world.tasks().len() as f64).round() as usize);

    // Bad values are refused before any work.
    for (reuse, styles, expected) in [(1.5, vec![Mode::Searl], "between 0 and 1"), (0.5, vec![Mode::Gap], "no searl")] {
        let mut c = config(reuse);
        c.data.worlds.styles = styles;
        c.eval = None;
        let err = c.validate().expect_err("refused").to_string();
        assert!(err.contains(expected), "{err}");
    }
}
