//! The oracle on the bundled world: every mode answers correctly; GAP needs fewer turns than ReAct
//! on multi-hop tasks; MemPO's peak tokens per step stay nearly flat as objectives grow while
//! ReAct's grow with the history.

use std::sync::Arc;

use toolsmith_agent::env::{Corpus, Family, World, WorldConfig};
use toolsmith_agent::eval::{Report, evaluate, evaluate_all, peak_by_objectives};
use toolsmith_agent::tools::LocalTools;
use toolsmith_agent::{Agent, AgentConfig, Mode, Oracle};
use toolsmith_policy::Tokenizer;

fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::tiny().expect("tiny tokenizer"))
}

async fn run(world: &World, mode: Mode) -> Report {
    let corpus = Arc::new(Corpus::new(&world.documents()).expect("corpus"));
    let tasks = world.tasks();
    let tools = Arc::new(LocalTools::new().with_corpus(corpus));
    let oracle = Arc::new(Oracle::new(&tasks, mode, tokenizer()));
    let agent = Agent::new(oracle, tools, AgentConfig { mode, max_turns: 16, ..AgentConfig::default() });
    let tasks: Vec<_> = tasks.into_iter().filter(|t| t.family != Family::Numeric || mode != Mode::Searl).collect();
    evaluate(&agent, &tasks, 4, |_| {}).await
}

/// Modes run side by side report what each reports alone: the same tasks in the same order, the
/// same answers and turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modes_evaluated_side_by_side_report_as_each_alone() {
    let world = World::generate(WorldConfig::default());
    let corpus = Arc::new(Corpus::new(&world.documents()).expect("corpus"));
    let tasks: Vec<_> = world.tasks().into_iter().filter(|t| t.family != Family::Numeric).take(24).collect();
    let tools = Arc::new(LocalTools::new().with_corpus(corpus));
    let agent = |mode| {
        let oracle = Arc::new(Oracle::new(&tasks, mode, tokenizer()));
        Agent::new(oracle, tools.clone(), AgentConfig { mode, max_turns: 16, ..AgentConfig::default() })
    };
    let (react, gap) = (agent(Mode::React), agent(Mode::Gap));
    let mut done = 0;
    let both = evaluate_all(&[&react, &gap], &tasks, 5, |_| done += 1).await;
    assert_eq!(done, 2 * tasks.len());
    for (agent, together) in [&react, &gap].into_iter().zip(&both) {
        let alone = evaluate(agent, &tasks, 3, |_| {}).await;
        assert_eq!(together.mode, alone.mode);
        let ids = |r: &Report| r.results.iter().map(|t| t.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(together), tasks.iter().map(|t| t.id.clone()).collect::<Vec<_>>());
        assert_eq!(ids(together), ids(&alone));
        for (t, a) in together.results.iter().zip(&alone.results) {
            assert_eq!((&t.answer, t.trajectory.turns()), (&a.answer, a.trajectory.turns()), "{}", t.id);
            assert_eq!(t.trajectory.mode, together.mode, "{}: run by another mode's agent", t.id);
        }
        assert_eq!(together.overall.em, 1.0);
        assert_eq!(together.families.keys().collect::<Vec<_>>(), alone.families.keys().collect::<Vec<_>>());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gap_takes_fewer_turns_than_react_at_equal_accuracy() {
    let world = World::generate(WorldConfig::default());
    let react = run(&world, Mode::React).await;
    let gap = run(&world, Mode::Gap).await;
    println!("{}\n{}", react.table(), gap.table());
    for family in [Family::MultiHopParallel, Family::MultiHopSequential, Family::SingleHop] {
        let (r, g) = (&react.families[&family], &gap.families[&family]);
        assert_eq!(r.em, 1.0, "{family:?}: react {r:?}");
        assert_eq!(g.em, 1.0, "{family:?}: gap {g:?}");
    }
    let (r, g) = (&react.families[&Family::MultiHopParallel], &gap.families[&Family::MultiHopParallel]);
    assert!(g.turns < r.turns, "parallel multi-hop: gap {} turns, react {}", g.turns, r.turns);
    let (r, g) = (&react.families[&Family::MultiHopSequential], &gap.families[&Family::MultiHopSequential]);
    // A chain has one call per level: the plan cannot save turns there.
    assert_eq!(g.turns, r.turns);
    // Every call validated and every search found its article.
    for result in gap.results.iter().chain(&react.results) {
        for call in result.trajectory.calls() {
            assert!(call.ok(), "{}: {:?}", result.id, call.result);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_keeps_peak_tokens_flat_as_objectives_grow() {
    let world = World::generate(WorldConfig::default());
    let react = run(&world, Mode::React).await;
    let mem = run(&world, Mode::Mem).await;
    let (r, m) = (peak_by_objectives(&react), peak_by_objectives(&mem));
    println!("{:>10} {:>10} {:>10}", "objectives", "react PT", "mem PT");
    for (k, v) in &r {
        println!("{k:>10} {v:>10.0} {:>10.0}", m[k]);
    }
    assert_eq!(mem.families[&Family::MultiObjective].em, 1.0);
    assert_eq!(react.families[&Family::MultiObjective].em, 1.0);
    let growth = |t: &std::collections::BTreeMap<usize, f64>| t[&10] / t[&2];
    assert!(growth(&r) > 2.5, "react's peak grows with the history: {r:?}");
    assert!(growth(&m) < 1.6, "mem's peak stays nearly flat: {m:?}");
    assert!(m[&10] < r[&10] / 2.0);
}

fn examples() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/world")
}

#[test]
fn the_shipped_world_is_what_the_generator_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    toolsmith_agent::env::write_world(&World::generate(WorldConfig::default()), dir.path()).expect("write");
    for file in ["corpus.jsonl", "tasks.jsonl", "tasks-reworded.jsonl", "world.json"] {
        let shipped = std::fs::read_to_string(examples().join(file)).expect("shipped file");
        let fresh = std::fs::read_to_string(dir.path().join(file)).expect("fresh file");
        assert!(
            shipped == fresh,
            "examples/world/{file} is stale: run `toolsmith world generate --out examples/world`"
        );
    }
    let tasks = toolsmith_agent::env::load_tasks(&examples().join("tasks.jsonl")).expect("tasks load");
    assert_eq!(tasks, World::generate(WorldConfig::default()).tasks());
    let corpus = Corpus::load_jsonl(&examples().join("corpus.jsonl")).expect("corpus loads");
    let hits = corpus.search(&tasks[0].solution.as_ref().expect("solution").steps[0].query, 3).expect("search");
    assert_eq!(hits.len(), 3);
}

#[test]
fn users_task_sets_and_corpora_load_and_bad_lines_are_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(
        &tasks,
        "{\"question\": \"Who wrote Hamlet?\", \"golden_answers\": [\"Shakespeare\", \"William Shakespeare\"]}\n\n{\"question\": \"2+2?\", \"answer\": \"4\"}\n",
    )
    .expect("write");
    let loaded = toolsmith_agent::env::load_tasks(&tasks).expect("loads");
    assert_eq!(loaded.len(), 2);
    assert_eq!(loaded[0].family, Family::Custom);
    assert_eq!(loaded[1].golden_answers, vec!["4"]);
    assert_eq!(loaded[1].id, "task-0003");
    for (content, needle) in [
        ("{\"question\": \"q\"}\n", "golden_answers"),
        ("{\"question\": \"q\", \"golden_answers\": []}\n", "empty"),
        ("not json\n", "tasks.jsonl:1"),
        ("{\"question\": \"q\", \"golden_answers\": [\"a\"]}\n{oops\n", "tasks.jsonl:2"),
    ] {
        std::fs::write(&tasks, content).expect("write");
        let err = toolsmith_agent::env::load_tasks(&tasks).expect_err("refused").to_string();
        assert!(err.contains(needle), "{content:?}: {err}");
    }
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::write(&corpus, "{\"title\": \"Hamlet\", \"contents\": \"Hamlet is a tragedy by Shakespeare.\"}\n{\"title\": \"Ulysses\", \"text\": \"A novel by Joyce.\"}\n").expect("write");
    let c = Corpus::load_jsonl(&corpus).expect("loads");
    assert_eq!(c.search("tragedy Shakespeare", 3).expect("search")[0].title, "Hamlet");
    std::fs::write(&corpus, "{\"title\": \"no text\"}\n").expect("write");
    let err = Corpus::load_jsonl(&corpus).expect_err("refused").to_string();
    assert!(err.contains("corpus.jsonl:1") && err.contains("text"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reworded_tasks_ask_the_same_things_in_frames_the_generator_never_writes() {
    let world = World::generate(WorldConfig { seed: 1001, countries: 6, tasks_per_family: 6 });
    let (tasks, reworded) = (world.tasks(), world.reworded_tasks());
    assert_eq!(tasks.len(), reworded.len());
    // The generator's sentence frames, each of which every generated question of its kind uses.
    let frames = [
        "In which city was",
        "What is the occupation of",
        "What is the population of",
        "In which country is",
        "Who founded",
        "In what year was",
        "What is the capital of",
        "What is the",
        "Were ",
        "Which city has the largest population",
        "Which company was founded first",
        "Who was born earliest",
        "Answer each question",
        "What is the total population",
        "What is the sum of the founding years",
    ];
    for (t, r) in tasks.iter().zip(&reworded) {
        assert_eq!((t.family, &t.golden_answers, t.objectives), (r.family, &r.golden_answers, r.objectives));
        assert_eq!(t.solution, r.solution, "{}", t.question);
        assert_ne!(t.question, r.question);
        assert!(frames.iter().any(|f| t.question.contains(f)), "a template question without a frame: {}", t.question);
        for f in frames {
            assert!(!r.question.contains(f), "{:?} keeps the frame {f:?}", r.question);
        }
    }
    // ... and they can be answered: the oracle solves each one with the tools.
    let corpus = Arc::new(Corpus::new(&world.documents()).expect("corpus"));
    let tools = Arc::new(LocalTools::new().with_corpus(corpus));
    let oracle = Arc::new(Oracle::new(&reworded, Mode::Gap, tokenizer()));
    let agent = Agent::new(oracle, tools, AgentConfig { mode: Mode::Gap, max_turns: 16, ..AgentConfig::default() });
    let report = evaluate(&agent, &reworded, 4, |_| {}).await;
    assert_eq!(report.overall.em, 1.0, "{:?}", report.families);
}
