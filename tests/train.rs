//! `toolsmith train` through the binary: a run killed with SIGKILL resumes to the same loss curve
//! and the same weights; bad data, configs, checkpoints and a failing disk are clear errors that
//! leave no half-written checkpoint; the report draws the curves.

mod common;

use common::ok;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn toolsmith() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_toolsmith"));
    c.env("TOOLSMITH_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"))
        .env("TOOLSMITH_REGISTRY", Path::new(env!("CARGO_TARGET_TMPDIR")).join("train-registry.db"));
    c
}

fn run(args: &[&str]) -> Output {
    toolsmith().args(args).output().expect("run toolsmith")
}

fn failed(out: &Output) -> String {
    assert!(!out.status.success(), "expected a failure; stdout: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Oracle traces of a small world (react and gap styles).
fn traces(dir: &Path) -> PathBuf {
    let path = dir.join("traces.jsonl");
    let p = path.to_str().expect("utf-8");
    ok(&run(&[
        "world",
        "traces",
        "--seed",
        "5",
        "--countries",
        "2",
        "--tasks-per-family",
        "1",
        "--style",
        "gap",
        "--style",
        "react",
        "--out",
        p,
    ]));
    path
}

fn losses(run_dir: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .expect("metrics")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json"))
        .filter(|v| v["kind"] == "train")
        .map(|v| (v["step"].as_u64().expect("step"), v["loss"].as_f64().expect("loss")))
        .collect()
}

fn sft_args<'a>(data: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "train",
        "sft",
        "--data",
        data,
        "--out",
        out,
        "--steps",
        "10",
        "--batch-tokens",
        "2500",
        "--micro-batch-tokens",
        "2500",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--no-eval",
        "--checkpoint-every",
        "3",
        "--seed",
        "3",
        "--lr",
        "3e-3",
    ]
}

#[test]
fn a_killed_run_resumes_to_the_same_loss_curve_and_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = traces(dir.path());
    let data = data.to_str().expect("utf-8");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let (a_str, b_str) = (a.to_str().expect("utf-8"), b.to_str().expect("utf-8"));
    let summary = ok(&run(&sft_args(data, a_str)));
    assert!(summary.contains("loss"), "{summary}");
    let uninterrupted = losses(&a);
    assert_eq!(uninterrupted.len(), 10);

    let mut child =
        toolsmith().args(sft_args(data, b_str)).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn");
    let started = Instant::now();
    loop {
        let done = std::fs::read_to_string(b.join("metrics.jsonl")).map(|t| t.lines().count()).unwrap_or(0);
        if done >= 5 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "the run made no progress");
        assert!(child.try_wait().expect("wait").is_none(), "the run ended before it was killed");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let killed_at = losses(&b).len();
    assert!(killed_at < 10, "killed after {killed_at} steps");

    let mut resume = sft_args(data, b_str);
    resume.push("--resume");
    let out = ok(&run(&resume));
    assert!(out.contains("loss"), "{out}");
    let resumed = losses(&b);
    // Bitwise: same data order, same moments, same schedule position, one thread.
    assert_eq!(resumed, uninterrupted, "killed after {killed_at} steps");
    let weights = |d: &Path| std::fs::read(d.join("final/model.safetensors")).expect("weights");
    assert!(weights(&a) == weights(&b), "final weights differ");
    // Nothing partial is left, and only the newest checkpoints are kept.
    let entries: Vec<String> = std::fs::read_dir(b.join("checkpoints"))
        .expect("checkpoints")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(entries.iter().all(|e| !e.contains("partial")), "{entries:?}");
    assert!(entries.contains(&"step-00000010".to_string()), "{entries:?}");

    // The report draws the curves and prints the summary.
    let out = ok(&run(&["train", "report", a_str]));
    assert!(out.contains("loss"), "{out}");
    let svg = std::fs::read_to_string(a.join("report.svg")).expect("svg");
    assert!(
        svg.starts_with("<svg") && svg.contains("training loss") && svg.contains("<polyline"),
        "{}",
        &svg[..200.min(svg.len())]
    );

    // A checkpoint paired with another tokenizer is refused.
    let foreign = dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).expect("mkdir");
    for f in std::fs::read_dir(a.join("final")).expect("final") {
        let f = f.expect("entry").path();
        std::fs::copy(&f, foreign.join(f.file_name().expect("name"))).expect("copy");
    }
    let tokenizer = foreign.join("tokenizer.json");
    let text = std::fs::read_to_string(&tokenizer).expect("tokenizer");
    std::fs::write(&tokenizer, format!("{text} ")).expect("write");
    let c = dir.path().join("c");
    let mut args = sft_args(data, c.to_str().expect("utf-8"));
    args.extend(["--init", foreign.to_str().expect("utf-8")]);
    let err = failed(&run(&args));
    assert!(err.contains("not the tokenizer this checkpoint was trained with"), "{err}");
}

#[test]
fn bad_data_and_configs_name_the_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = traces(dir.path());
    let first = std::fs::read_to_string(&data).expect("data").lines().next().expect("a line").to_string();
    let cases = [
        ("{\"messages\": [", "not JSON"),
        (r#"{"messages": [{"role": "oracle", "content": "x"}]}"#, "unknown role"),
        (
            r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]}"#,
            "empty assistant turn",
        ),
    ];
    for (i, (bad, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.jsonl"));
        std::fs::write(&path, format!("{first}\n{bad}\n")).expect("write");
        let out = dir.path().join(format!("run{i}"));
        let err = failed(&run(&sft_args(path.to_str().expect("utf-8"), out.to_str().expect("utf-8"))));
        assert!(err.contains(&format!("bad{i}.jsonl:2: ")) && err.contains(expected), "{err}");
    }
    // A sequence past the model's context names its line.
    let config = dir.path().join("short.toml");
    std::fs::write(&config, "tiny_context = 128\n").expect("write");
    let out = dir.path().join("short");
    let mut args = sft_args(data.to_str().expect("utf-8"), out.to_str().expect("utf-8"));
    args.extend(["--config", config.to_str().expect("utf-8")]);
    let err = failed(&run(&args));
    assert!(err.contains("traces.jsonl:1: ") && err.contains("longer than the model's context of 128"), "{err}");
    // An unknown key in the config file.
    std::fs::write(&config, "step = 3\n").expect("write");
    let err = failed(&run(&args));
    assert!(err.contains("unknown field `step`") && err.contains("short.toml"), "{err}");

    // Settings that cannot work are refused before any work, and nothing is written.
    let data = data.to_str().expect("utf-8");
    let refused = dir.path().join("refused");
    let refused_str = refused.to_str().expect("utf-8");
    let lora = dir.path().join("lora.toml");
    std::fs::write(&lora, "[lora]\nrank = 4\ntarget_modules = [\"q_proj\", \"attn\"]\n").expect("write");
    let cases: [(&[&str], &str); 3] = [
        (&["--config", lora.to_str().expect("utf-8")], "no module \"attn\""),
        (&["--lora-rank", "0"], "rank must be at least 1"),
        (&["--trainable-layers", "9"], "trainable_layers must be between 1 and the model's 4 layers"),
    ];
    for (extra, expected) in cases {
        let mut args = sft_args(data, refused_str);
        args.extend(extra);
        let err = failed(&run(&args));
        assert!(err.contains(expected), "{extra:?}: {err}");
        assert!(!refused.exists(), "{extra:?}: a refused run wrote {}", refused.display());
    }
    // A preset tuned for SmolLM2 asked for the tiny model (by name, or a tiny checkpoint).
    let tiny_checkpoint = dir.path().join("tiny");
    std::fs::create_dir(&tiny_checkpoint).expect("mkdir");
    std::fs::write(
        tiny_checkpoint.join("config.json"),
        r#"{"model_type": "qwen2", "num_hidden_layers": 4, "hidden_size": 256}"#,
    )
    .expect("write");
    for (init, expected) in
        [("tiny", "is the tiny model"), (tiny_checkpoint.to_str().expect("utf-8"), "4 layers of width 256")]
    {
        let err = failed(&run(&["train", "sft", "--preset", "smol-world", "--init", init, "--out", refused_str]));
        assert!(err.contains("tuned for SmolLM2-135M") && err.contains(expected), "{init}: {err}");
        assert!(!refused.exists());
    }
    // The RL presets start from a SmolLM2 checkpoint that answers already; the name picks the
    // method, and a --method that disagrees is refused.
    let tiny_str = tiny_checkpoint.to_str().expect("utf-8");
    let rl_cases: [(&[&str], &str); 6] = [
        (&["--preset", "smol-gap"], "got no --init"),
        (&["--preset", "smol-gap", "--init", "smollm2-135m"], "already answers in the agent's format"),
        (&["--preset", "smol-searl", "--init", "tiny"], "got --init tiny"),
        (&["--preset", "smol-mem", "--init", tiny_str], "4 layers of width 256"),
        (&["--preset", "smol-gap", "--method", "mtr", "--init", tiny_str], "for gap, not mtr"),
        (&["--preset", "smol-ppo", "--init", tiny_str], "smol-<method>"),
    ];
    for (extra, expected) in rl_cases {
        let err = failed(&run(&[&["train", "rl", "--out", refused_str][..], extra].concat()));
        assert!(err.contains(expected), "{extra:?}: {err}");
        assert!(!refused.exists(), "{extra:?}: a refused run wrote {}", refused.display());
        // A daemon's job gets the same checks, on the client, before anything is sent (no server
        // listens at this address: the refusal must come first).
        let err = failed(&run(&[&["jobs", "--server", "http://127.0.0.1:9", "submit", "rl"][..], extra].concat()));
        assert!(err.contains(expected), "jobs submit {extra:?}: {err}");
    }
    let err = failed(&run(&["jobs", "--server", "http://127.0.0.1:9", "submit", "sft", "--iterations", "3"]));
    assert!(err.contains("for rl jobs"), "{err}");
    // A held-out world that is also a training world.
    let err = failed(&run(&["train", "sft", "--train-worlds", "3,4", "--eval-world", "4", "--out", refused_str]));
    assert!(err.contains("also a training world"), "{err}");
    assert!(!refused.exists());
    let both =
        failed(&run(&[sft_args(data, refused_str), vec!["--lora-rank", "4", "--trainable-layers", "2"]].concat()));
    assert!(both.contains("--trainable-layers") || both.contains("exclude"), "{both}");
    // bf16 on a CPU that would emulate it (detection overridden to "no").
    let cfg = dir.path().join("bf16.toml");
    std::fs::write(&cfg, "precision = \"bf16\"\n").expect("write");
    let mut args = sft_args(data, refused_str);
    args.extend(["--config", cfg.to_str().expect("utf-8")]);
    let err = failed(&toolsmith().args(&args).env("TOOLSMITH_CPU_BF16", "0").output().expect("run toolsmith"));
    assert!(err.contains("neither AVX512_BF16 nor AMX"), "{err}");
    assert!(!refused.exists());
    // ... while `auto` falls back to f32 there and trains.
    std::fs::write(&cfg, "precision = \"auto\"\n").expect("write");
    let out = toolsmith().args(&args).env("TOOLSMITH_CPU_BF16", "0").output().expect("run toolsmith");
    ok(&out);
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(refused.join("final/toolsmith-state.json")).expect("state"))
            .expect("json");
    assert_eq!(state["precision"], "f32");
}

#[test]
fn a_checkpoint_that_cannot_be_written_leaves_nothing_half_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = traces(dir.path());
    let out = dir.path().join("full");
    let args = sft_args(data.to_str().expect("utf-8"), out.to_str().expect("utf-8"));
    // Files may not grow past 4 MiB (the weights are ~15 MB): the write fails as on a full disk.
    let script = format!("trap '' XFSZ; ulimit -f 4096; exec \"$0\" {}", args.join(" "));
    let result = Command::new("bash")
        .args(["-c", &script, env!("CARGO_BIN_EXE_toolsmith")])
        .env("TOOLSMITH_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"))
        .output()
        .expect("bash");
    let err = failed(&result);
    assert!(err.contains("File too large") && err.contains(".partial"), "{err}");
    let left: Vec<String> = std::fs::read_dir(out.join("checkpoints"))
        .expect("checkpoints")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // The metrics of the steps before the failure are intact.
    assert_eq!(losses(&out).len(), 3);
}

fn rl_args(out: &str) -> Vec<&str> {
    vec![
        "train",
        "rl",
        "--method",
        "searl",
        "--init",
        "tiny",
        "--out",
        out,
        "--iterations",
        "3",
        "--group-size",
        "2",
        "--tasks-per-iteration",
        "2",
        "--max-turns",
        "2",
        "--max-tokens",
        "16",
        "--train-worlds",
        "5",
        "--no-eval",
        "--checkpoint-every",
        "1",
        "--threads",
        "1",
        "--device",
        "cpu",
    ]
}

/// The iteration records of a run's metrics.
fn iteration_records(run_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "iteration")
        .collect()
}

fn iterations(run_dir: &Path) -> Vec<u64> {
    iteration_records(run_dir).iter().map(|v| v["iteration"].as_u64().expect("iteration")).collect()
}

#[test]
fn an_rl_run_killed_mid_iteration_resumes_from_its_last_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("rl");
    let out_str = out.to_str().expect("utf-8");
    let mut child =
        toolsmith().args(rl_args(out_str)).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn");
    let started = Instant::now();
    while iterations(&out).is_empty() {
        assert!(started.elapsed() < Duration::from_secs(300), "the run made no progress");
        assert!(child.try_wait().expect("wait").is_none(), "the run ended before it was killed");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let done = iterations(&out).len();
    assert!(done < 3, "killed after {done} iterations");
    let mut resume = rl_args(out_str);
    resume.push("--resume");
    let summary = ok(&run(&resume));
    assert!(summary.contains("policy:") && summary.contains("iterations 1..3"), "{summary}");
    // At most the iteration in flight was lost; every iteration is recorded once, in order.
    assert_eq!(iterations(&out), vec![1, 2, 3]);
    assert!(out.join("final/model.safetensors").exists());
    let entries: Vec<String> = std::fs::read_dir(out.join("checkpoints"))
        .expect("checkpoints")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(entries.iter().all(|e| !e.contains("partial")), "{entries:?}");
    // SEARL's tool graph came back with the weights and is sound.
    let registry = out.join("registry.db");
    let doctor = ok(&run(&["tools", "doctor", "--registry", registry.to_str().expect("utf-8")]));
    assert!(doctor.contains("healthy"), "{doctor}");
    // The killed and resumed run took the same updates as one that was never interrupted:
    // the same rollouts (seeded by iteration), rewards and losses, to 1e-5. (A random model's
    // SEARL rewards are all equal, so these updates are zero: `tests/rl.rs` in the trainer
    // crate resumes a run whose updates move the weights.)
    let straight = dir.path().join("straight");
    ok(&run(&rl_args(straight.to_str().expect("utf-8"))));
    let (resumed, uninterrupted) = (iteration_records(&out), iteration_records(&straight));
    assert_eq!(resumed.len(), uninterrupted.len());
    for (a, b) in resumed.iter().zip(&uninterrupted) {
        for field in ["loss", "reward", "kl", "grad_norm", "response_tokens"] {
            let (x, y) = (a[field].as_f64().expect("a number"), b[field].as_f64().expect("a number"));
            assert!((x - y).abs() <= 1e-5, "iteration {}: {field} {x} vs {y}", a["iteration"]);
        }
    }
}

#[test]
fn rl_settings_are_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("rl");
    let out_str = out.to_str().expect("utf-8");
    let mut args = rl_args(out_str);
    args[3] = "sorcery";
    let err = failed(&run(&args));
    // The choices come from the trainer's table of methods.
    assert!(err.contains("'sorcery'") && err.contains("gap, searl, mempo, mtr, gigpo, toolcall"), "{err}");
    let config = dir.path().join("rl.toml");
    std::fs::write(&config, "method = \"sorcery\"\n").expect("write");
    let err = failed(&run(&["train", "rl", "--config", config.to_str().expect("utf-8"), "--out", out_str]));
    assert!(err.contains("unknown method \"sorcery\": gap, searl, mempo, mtr, gigpo or toolcall"), "{err}");
    std::fs::write(&config, "method = \"mtr\"\ngroup_size = 1\n").expect("write");
    let err = failed(&run(&["train", "rl", "--config", config.to_str().expect("utf-8"), "--out", out_str]));
    assert!(err.contains("group_size must be at least 2"), "{err}");
    std::fs::write(&config, "method = \"mtr\"\n[loss]\nclip = 0.3\n").expect("write");
    let err = failed(&run(&["train", "rl", "--config", config.to_str().expect("utf-8"), "--out", out_str]));
    assert!(err.contains("unknown field `clip`") && err.contains("rl.toml"), "{err}");
    let schema = ok(&run(&["train", "schema", "rl"]));
    assert!(schema.contains("\"group_size\""), "{schema}");
}
