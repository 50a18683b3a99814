//! Several processes on one registry: concurrent readers and writers, and a writer killed with
//! SIGKILL in the middle of its transactions. The children are this test binary, re-run with an
//! environment variable that makes `child_process` do the work.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use toolsmith_registry::{PlanStep, SearchRequest};

use crate::{open, temp, tool};

const ROLE: &str = "TOOLSMITH_TEST_CHILD_ROLE";
const DB: &str = "TOOLSMITH_TEST_CHILD_DB";
const ID: &str = "TOOLSMITH_TEST_CHILD_ID";

fn spawn(role: &str, db: &Path, id: usize) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["processes::child_process", "--exact", "--nocapture", "--test-threads", "1"])
        .env(ROLE, role)
        .env(DB, db)
        .env(ID, id.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child")
}

/// Does nothing unless started by `spawn`.
#[test]
fn child_process() {
    let (Ok(role), Some(db), Ok(id)) = (std::env::var(ROLE), std::env::var_os(DB), std::env::var(ID)) else {
        return;
    };
    let mut r = open(Path::new(&db));
    let mut out = std::io::stdout();
    match role.as_str() {
        "writer" => {
            for i in 0..15 {
                let a = format!("w{id}_fetch_{i}");
                let b = format!("w{id}_parse_{i}");
                r.register_many(
                    vec![
                        tool(&a, &format!("Writer {id} fetches record set {i} from storage.")),
                        tool(&b, &format!("Writer {id} parses record set {i} into fields.")),
                    ],
                    false,
                )
                .expect("register");
                let plan = [
                    PlanStep { id: "a".into(), tool: a.clone(), depends_on: vec![] },
                    PlanStep { id: "b".into(), tool: b.clone(), depends_on: vec!["a".into()] },
                ];
                r.record_plan(&plan, 1.0).expect("plan");
                r.record_call(&a, true, Some(1.0)).expect("call");
            }
        }
        "reader" => {
            for _ in 0..40 {
                let hits = r.search(&SearchRequest::new(["parse a record set"]).k(3)).expect("search while writing");
                assert!(hits.len() <= 3 + 3 * 3);
                r.list(Default::default()).expect("list while writing");
            }
        }
        "killed" => {
            for i in 0.. {
                let names: Vec<String> = (0..5).map(|j| format!("k_{i}_{j}")).collect();
                let tools = names.iter().map(|n| tool(n, &format!("Killed writer tool {n}."))).collect();
                r.register_many(tools, false).expect("register");
                writeln!(out, "committed {}", names.join(" ")).expect("stdout");
                out.flush().expect("flush");
            }
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn concurrent_readers_and_writers_in_several_processes() {
    let (_d, path) = temp();
    // Create the registry first so the children race on data, not on creation.
    drop(open(&path));
    let mut children: Vec<(String, Child)> = Vec::new();
    for id in 0..3 {
        children.push((format!("writer {id}"), spawn("writer", &path, id)));
    }
    for id in 0..2 {
        children.push((format!("reader {id}"), spawn("reader", &path, id)));
    }
    for (name, child) in children {
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "{name} failed: {}", String::from_utf8_lossy(&out.stdout));
    }
    let mut r = open(&path);
    let stats = r.stats().expect("stats");
    assert_eq!(stats.graph.tools, 3 * 15 * 2);
    assert_eq!(stats.graph.edges, 3 * 15);
    assert_eq!(stats.graph.calls, 3 * 15);
    assert!(r.doctor().expect("doctor").problems.is_empty());
    // Every writer's tools reached this process's index.
    let hits = r.search(&SearchRequest::new(["Writer 2 parses record set 14"]).k(1).expand(false)).expect("search");
    assert_eq!(hits[0].name, "w2_parse_14");
}

#[test]
fn a_writer_killed_mid_transaction_loses_no_committed_row() {
    let (_d, path) = temp();
    drop(open(&path));
    let mut child = spawn("killed", &path, 0);
    let stdout = child.stdout.take().expect("stdout");
    let mut committed: Vec<String> = Vec::new();
    let mut lines = BufReader::new(stdout).lines();
    while committed.len() < 20 * 5 {
        let line = lines.next().expect("child output").expect("read");
        if let Some(names) = line.strip_prefix("committed ") {
            committed.extend(names.split(' ').map(String::from));
        }
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let integrity: String = rusqlite::Connection::open(&path)
        .and_then(|c| c.query_row("PRAGMA integrity_check", [], |r| r.get(0)))
        .expect("integrity check");
    assert_eq!(integrity, "ok");
    let mut r = open(&path);
    for name in &committed {
        assert!(r.resolve(name).expect("resolve").is_some(), "committed tool {name} was lost");
    }
    // Transactions are all or nothing: every batch of five is whole.
    let n = r.len().expect("len");
    assert_eq!(n % 5, 0, "a partial transaction survived: {n} tools");
    assert!(n >= committed.len());
    assert!(r.doctor().expect("doctor").problems.is_empty());
}
