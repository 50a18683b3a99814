//! The job queue against a real SQLite store, registry and sandbox: jobs survive a restart,
//! bad submissions and a corrupt database are clear errors, and tools an RL checkpoint admitted
//! reach the daemon's tool list.

use std::path::Path;

use serde_json::json;
use toolsmith_contract::Manifest;
use toolsmith_daemon::jobs::{JobError, JobKind, JobState, Jobs};
use toolsmith_daemon::{Daemon, ServeOptions};
use toolsmith_registry::{NewTool, Registry};
use toolsmith_sandbox::{Sandbox, SandboxConfig, Toolbox};

fn daemon(dir: &Path) -> Daemon {
    let registry = Registry::open(&dir.join("registry.db")).expect("registry");
    let toolbox = Toolbox::new(Sandbox::new(SandboxConfig::default()).expect("sandbox"));
    Daemon::new(registry, toolbox, ServeOptions::default()).expect("daemon")
}

#[test]
fn jobs_are_stored_checked_and_known_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let jobs = Jobs::open(&state, daemon(dir.path()), None).expect("jobs");
    let first = jobs.submit(JobKind::Sft, json!({"steps": 3, "eval": null})).expect("sft");
    let second = jobs.submit(JobKind::Rl, json!({"method": "gap", "iterations": 2})).expect("rl");
    assert_eq!((first.id, first.state, second.id, second.state), (1, JobState::Queued, 2, JobState::Queued));
    // The stored config is the whole config, defaults filled in.
    assert_eq!(first.config["steps"], 3);
    assert!(first.config["lr"].as_f64().is_some_and(|lr| lr > 0.0), "{}", first.config);
    assert_eq!(first.dir, state.join("jobs").join("1"));

    // A queued job cancels at once and resumes into the queue; a queued one cannot resume.
    assert_eq!(jobs.cancel(2).expect("cancel").state, JobState::Cancelled);
    assert!(matches!(jobs.cancel(2), Err(JobError::Conflict { .. })));
    assert_eq!(jobs.resume(2).expect("resume").state, JobState::Queued);
    assert!(matches!(jobs.resume(1), Err(JobError::Conflict { .. })));
    assert!(matches!(jobs.get(7), Err(JobError::NotFound(7))));

    // Bad submissions are refused with what is wrong, and nothing is stored.
    let unknown = jobs.submit(JobKind::Sft, json!({"stepz": 3})).expect_err("unknown field");
    assert!(unknown.to_string().contains("stepz"), "{unknown}");
    let invalid = jobs.submit(JobKind::Sft, json!({"lr": -1.0})).expect_err("negative lr");
    assert!(matches!(invalid, JobError::Invalid(_)), "{invalid}");
    assert_eq!(jobs.list().expect("list").len(), 2);
    // While this daemon owns the jobs, another one on the same state directory is refused.
    let second = Jobs::open(&state, daemon(dir.path()), None).expect_err("owned");
    assert!(matches!(second, JobError::Locked(_)), "{second}");
    assert!(second.to_string().contains("--state-dir"), "{second}");
    drop(jobs);

    // Another daemon on the same state knows both jobs.
    let again = Jobs::open(&state, daemon(dir.path()), None).expect("reopen");
    let listed: Vec<(i64, JobKind, JobState)> =
        again.list().expect("list").iter().map(|j| (j.id, j.kind, j.state)).collect();
    assert_eq!(listed, vec![(1, JobKind::Sft, JobState::Queued), (2, JobKind::Rl, JobState::Queued)]);
    assert_eq!(again.status().queued, 2);
}

#[test]
fn a_corrupt_jobs_database_is_a_clear_error_and_is_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("mkdir");
    let garbage = b"this is not a SQLite database, and it must not be overwritten".repeat(100);
    std::fs::write(state.join("jobs.db"), &garbage).expect("write");
    let e = Jobs::open(&state, daemon(dir.path()), None).expect_err("corrupt");
    assert!(e.to_string().contains("jobs.db"), "{e}");
    assert_eq!(std::fs::read(state.join("jobs.db")).expect("read"), garbage);
}

#[test]
fn tools_a_checkpoint_admitted_are_registered_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = daemon(dir.path());
    let jobs = Jobs::open(&dir.path().join("state"), daemon.clone(), None).expect("jobs");
    let checkpoint = dir.path().join("step-00000002");
    std::fs::create_dir_all(&checkpoint).expect("mkdir");
    {
        let mut graph = Registry::open(&checkpoint.join("registry.db")).expect("graph");
        let manifest = Manifest::from_value(json!({
            "name": "celsius_to_fahrenheit", "version": "0.1.0",
            "description": "Convert a temperature from Celsius to Fahrenheit",
            "input_schema": {"type": "object", "properties": {"c": {"type": "number", "description": "degrees"}}},
            "output_schema": {"type": "object"}, "kind": "python",
        }))
        .expect("manifest");
        let code = b"def run(c):\n    return {'f': c * 9 / 5 + 32}\n".to_vec();
        graph.register(NewTool::new(manifest).with_blob(code), true).expect("register");
    }
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let names = |d: &Daemon| -> Vec<String> {
        let page = runtime.block_on(d.list_tools(None)).expect("list");
        page.tools.iter().map(|t| t.name.to_string()).collect()
    };
    assert!(!names(&daemon).contains(&"celsius_to_fahrenheit".to_owned()));
    assert_eq!(jobs.publish_tools(&checkpoint), Ok(1));
    assert!(names(&daemon).contains(&"celsius_to_fahrenheit".to_owned()));
    // The next checkpoint holds the same tool: nothing changes.
    assert_eq!(jobs.publish_tools(&checkpoint), Ok(0));
    // A checkpoint without a tool graph (SFT) publishes nothing.
    assert_eq!(jobs.publish_tools(dir.path()), Ok(0));
}

#[test]
fn an_rl_job_runs_to_the_end_with_its_tool_graph_in_each_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs = Jobs::open(&dir.path().join("state"), daemon(dir.path()), None).expect("jobs");
    let runner = jobs.spawn_runner().expect("runner");
    let job = jobs
        .submit(
            JobKind::Rl,
            json!({
                "method": "searl", "init": "tiny", "graph": {}, "eval": null, "device": "cpu", "threads": 1,
                "worlds": {"seeds": [5], "countries": 2, "tasks_per_family": 1, "styles": ["searl"]},
                "iterations": 2, "tasks_per_iteration": 2, "group_size": 2, "max_turns": 2, "max_tokens": 24,
                "overlong_cache": 6, "trainable_layers": 2,
                "checkpoint_every": 1,
            }),
        )
        .expect("submit");
    let started = std::time::Instant::now();
    let done = loop {
        let now = jobs.get(job.id).expect("get");
        if now.state.is_terminal() {
            break now;
        }
        assert!(started.elapsed().as_secs() < 300, "stuck: {now:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    jobs.stop();
    runner.join().expect("runner");
    assert_eq!((done.state, done.step, done.total, done.runs), (JobState::Succeeded, 2, 2, 1), "{done:?}");
    let checkpoint = done.checkpoint.expect("a checkpoint");
    assert!(checkpoint.join("registry.db").is_file(), "{}", checkpoint.display());
    assert!(done.dir.join("final").is_dir());
    assert!(jobs.status().running.is_none());
    // Only the top two of the tiny model's four layers (and the final norm) trained.
    let start = toolsmith_policy::Policy::tiny(0, Default::default()).expect("tiny");
    let trained = toolsmith_policy::Policy::load(&done.dir.join("final"), Default::default()).expect("final");
    let (before, after) = (start.var_store().variables(), trained.var_store().variables());
    for (name, w) in &before {
        if !(name.starts_with("model.layers.2.")
            || name.starts_with("model.layers.3.")
            || name.starts_with("model.norm."))
        {
            assert_eq!((w - &after[name]).abs().max().double_value(&[]), 0.0, "{name} is frozen");
        }
    }
    // A job asking for no trainable layer is refused when submitted.
    let err = jobs.submit(JobKind::Rl, json!({"trainable_layers": 0})).expect_err("zero layers");
    assert!(err.to_string().contains("trainable_layers"), "{err}");
}
