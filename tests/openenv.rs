//! `toolsmith env serve` with the clients its users run: openenv-core's own validator and
//! clients (`openenv validate`, `GenericEnvClient`, `MCPToolClient`), and TRL's GRPOTrainer
//! training a model against it for two optimiser steps, its rewards the environment's.
//!
//! Needs the venvs of scripts/openenv-clients-env.sh and scripts/trl-env.sh (created on first use).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// `toolsmith env serve` on an ephemeral loopback port; killed on drop.
struct EnvServer {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for EnvServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl EnvServer {
    fn start(extra: &[&str]) -> EnvServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = common::toolsmith()
            .args(["env", "serve", "--init", "tiny", "--method", "gap", "--http", "127.0.0.1:0", "--out"])
            .arg(dir.path().join("run"))
            .args(["--max-turns", "3", "--max-tokens", "64"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start toolsmith env serve");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let base = loop {
            let line = lines.next().expect("the server exited before listening").expect("stderr");
            if let Some(rest) = line.split("OpenEnv on ").nth(1) {
                break rest.split(' ').next().expect("url").to_owned();
            }
        };
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if line.contains("ERROR") || line.contains("WARN") {
                    eprintln!("server: {line}");
                }
            }
        });
        EnvServer { child, base, _dir: dir }
    }
}

fn script(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn openenv_cores_validator_and_clients_pass_against_env_serve() {
    let python = common::client_from_script("openenv-clients-env.sh", "PyPI for openenv-core's venv");
    let server = EnvServer::start(&[]);
    let out = Command::new(&python)
        .arg(script("tests/openenv/client.py"))
        .args(["--base-url", &server.base])
        .output()
        .expect("run the OpenEnv client checks");
    let report = common::report_of(&out);
    assert!(out.status.success() && report["passed"] == true, "{report:#}\n{}", String::from_utf8_lossy(&out.stderr));
    let checks = report["checks"].as_array().expect("checks");
    assert!(checks.len() >= 7, "{report:#}");
}

#[test]
fn trls_grpo_trainer_trains_against_env_serve() {
    let python = common::client_from_script("trl-env.sh", "PyPI for the TRL venv");
    let server = EnvServer::start(&[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let report_path = dir.path().join("report.json");
    let out = Command::new(&python)
        .arg(script("examples/trl/grpo_toolsmith.py"))
        .args(["--env-url", &server.base, "--max-steps", "2", "--make-tiny"])
        .arg(dir.path().join("tiny"))
        .arg("--report")
        .arg(&report_path)
        .output()
        .expect("run the TRL script");
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&report_path).expect("report")).expect("json");
    assert!(report["global_step"].as_u64() >= Some(2), "two optimiser steps: {report:#}");
    let rewards: Vec<f64> =
        report["env_rewards"].as_array().expect("env_rewards").iter().filter_map(Value::as_f64).collect();
    assert!(!rewards.is_empty(), "episodes ran to the environment's reward: {report:#}");
    assert!(report["steps"].as_u64() >= Some(rewards.len() as u64), "{report:#}");
    // What TRL logged as its reward is the mean of the rewards the environment returned.
    let logged: Vec<f64> =
        report["logged_rewards"].as_array().expect("logged").iter().filter_map(Value::as_f64).collect();
    assert_eq!(logged.len(), 2, "{report:#}");
    let (lo, hi) = rewards.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &r| (l.min(r), h.max(r)));
    assert!(logged.iter().all(|&m| m >= lo - 1e-6 && m <= hi + 1e-6), "{report:#}");
}
