//! Storage: migrations from old files, bad files, export/import, the derived index.

use std::io::{BufReader, Cursor};

use toolsmith_registry::{Registry, RegistryError, SCHEMA_VERSION, SearchRequest};

use crate::{data, open, temp, tool};

#[test]
fn a_version_1_registry_opens_and_migrates_without_losing_data() {
    let (_d, path) = temp();
    let sql = std::fs::read_to_string(data("registry-v1.sql")).expect("fixture");
    rusqlite::Connection::open(&path).and_then(|c| c.execute_batch(&sql)).expect("write v1 fixture");
    let mut r = open(&path);
    let stats = r.stats().expect("stats");
    assert_eq!(stats.schema_version, SCHEMA_VERSION);
    assert_eq!((stats.graph.tools, stats.graph.edges, stats.graph.aliases, stats.blobs), (3, 2, 1, 1));
    assert_eq!(stats.candidates_pending, 1);
    let mean = r.show("average").expect("alias survives");
    assert_eq!(mean.tool.name, "mean");
    assert_eq!(mean.tool.stats.usage_count, 9);
    assert_eq!(mean.dependents[0].name, "word_count");
    // Version 1 rows carry no embeddings: the doctor says so, reindex embeds them.
    let report = r.doctor().expect("doctor");
    assert_eq!(report.problems.len(), 3, "{report:?}");
    assert_eq!(r.reindex().expect("reindex"), 3);
    assert!(r.doctor().expect("doctor").problems.is_empty());
    let hits = r.search(&SearchRequest::new(["fahrenheit from celsius"]).k(1)).expect("search");
    assert_eq!(hits[0].name, "celsius_to_fahrenheit");
    // And the migrated file reopens as current.
    drop(r);
    assert_eq!(open(&path).stats().expect("stats").schema_version, SCHEMA_VERSION);
}

#[test]
fn files_that_are_not_registries_are_refused_clearly_and_left_alone() {
    let (dir, _) = temp();
    let garbage = dir.path().join("garbage.db");
    let bytes: Vec<u8> = (0..8192u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(&garbage, &bytes).expect("write");
    let e = Registry::open(&garbage).expect_err("garbage");
    assert!(matches!(e, RegistryError::NotARegistry { .. }), "{e:?}");
    assert!(e.to_string().contains("not an SQLite database"), "{e}");
    assert_eq!(std::fs::read(&garbage).expect("read"), bytes, "the file is untouched");

    let foreign = dir.path().join("foreign.db");
    rusqlite::Connection::open(&foreign)
        .and_then(|c| {
            c.execute_batch("CREATE TABLE invoices (id INTEGER PRIMARY KEY); INSERT INTO invoices VALUES (1);")
        })
        .expect("foreign db");
    let e = Registry::open(&foreign).expect_err("foreign");
    assert!(e.to_string().contains("some other program"), "{e}");
    let rows: i64 = rusqlite::Connection::open(&foreign)
        .and_then(|c| c.query_row("SELECT count(*) FROM invoices", [], |r| r.get(0)))
        .expect("still readable");
    assert_eq!(rows, 1);

    let newer = dir.path().join("newer.db");
    drop(open(&newer));
    rusqlite::Connection::open(&newer).and_then(|c| c.pragma_update(None, "user_version", 99)).expect("bump");
    let e = Registry::open(&newer).expect_err("too new");
    assert!(matches!(e, RegistryError::TooNew { found: 99, .. }), "{e:?}");

    let directory = dir.path().join("a_directory");
    std::fs::create_dir(&directory).expect("mkdir");
    assert!(Registry::open(&directory).is_err());

    // A registry whose pages were overwritten in the middle.
    let (_d2, path) = temp();
    {
        let mut r = open(&path);
        let tools: Vec<_> =
            (0..200).map(|i| tool(&format!("tool_{i}"), &format!("Tool number {i} does thing {i}."))).collect();
        r.register_many(tools, false).expect("register");
    }
    rusqlite::Connection::open(&path)
        .and_then(|c| c.pragma_update(None, "wal_checkpoint", "TRUNCATE"))
        .expect("checkpoint");
    let mut bytes = std::fs::read(&path).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid..mid + 4096].fill(0xA5);
    std::fs::write(&path, &bytes).expect("corrupt");
    let outcome = Registry::open(&path).and_then(|mut r| r.doctor());
    match outcome {
        Err(e) => assert!(matches!(e, RegistryError::Corrupt { .. } | RegistryError::Sqlite(_)), "{e:?}"),
        Ok(report) => assert!(!report.problems.is_empty(), "corruption must be reported"),
    }
}

#[test]
fn export_import_round_trip_is_exact_and_bad_imports_change_nothing() {
    let (_d, path) = temp();
    let mut r = open(&path);
    r.register_many(
        vec![
            tool("fetch_url", "Fetch a web page and return its text."),
            tool("summarise", "Summarise a long text in a few sentences.")
                .with_blob(b"def summarise(text): ...".to_vec()),
            tool("word_count", "Count the words in a text."),
        ],
        false,
    )
    .expect("register");
    r.record_plan(
        &[
            toolsmith_registry::PlanStep { id: "a".into(), tool: "fetch_url".into(), depends_on: vec![] },
            toolsmith_registry::PlanStep { id: "b".into(), tool: "summarise".into(), depends_on: vec!["a".into()] },
        ],
        0.1 + 0.2,
    )
    .expect("plan");
    r.register(tool("count_words", "Count how many words a text has."), false).expect("register");
    r.merge("word_count", "count_words").expect("merge");
    r.record_call("summarise", true, Some(0.7)).expect("call");
    r.record_calls(&[toolsmith_registry::CallUsage::new("summarise", Some("timeout"))]).expect("failure");
    r.set_meta("seeded", "1").expect("meta");
    let mut first = Vec::new();
    r.export(&mut first).expect("export");

    let (_d2, path2) = temp();
    let mut copy = open(&path2);
    let summary = copy.import(&mut BufReader::new(Cursor::new(&first))).expect("import");
    assert_eq!((summary.tools, summary.edges, summary.aliases, summary.blobs), (3, 1, 1, 1));
    let mut second = Vec::new();
    copy.export(&mut second).expect("export");
    assert_eq!(String::from_utf8_lossy(&first), String::from_utf8_lossy(&second));
    assert_eq!(copy.tool_view("summarise").expect("view").stats.failures_by_kind.get("timeout"), Some(&1));
    // The imported registry searches like the original (embeddings travelled exactly).
    let q = SearchRequest::new(["how long is this essay in words"]).k(2);
    let a: Vec<String> = r.search(&q).expect("search").into_iter().map(|h| format!("{} {}", h.name, h.score)).collect();
    let b: Vec<String> =
        copy.search(&q).expect("search").into_iter().map(|h| format!("{} {}", h.name, h.score)).collect();
    assert_eq!(a, b);

    // A bad line anywhere: nothing is imported, and the error names the line.
    let text = String::from_utf8(first).expect("utf8");
    let lines: Vec<&str> = text.lines().collect();
    for (bad_line, replacement) in [
        (
            lines.len() - 1,
            "{\"type\": \"edge\", \"src\": \"nope\", \"dst\": \"fetch_url\", \"count\": 1, \"weight\": 1.0}",
        ),
        (3, "{not json"),
        (2, "{\"type\": \"tool\"}"),
    ] {
        let (_d3, path3) = temp();
        let mut target = open(&path3);
        target.register(tool("keep_me", "A tool that must survive a failed import."), false).expect("register");
        let mut broken: Vec<&str> = lines.clone();
        broken[bad_line] = replacement;
        let input = broken.join("\n");
        let e = target.import(&mut BufReader::new(Cursor::new(input))).expect_err("must fail");
        assert!(e.to_string().contains(&format!("import line {}", bad_line + 1)), "{e}");
        let names: Vec<String> = target.list(Default::default()).expect("list").into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["keep_me"]);
    }
}

#[test]
fn the_search_index_is_derived_and_rebuilt_when_lost_or_damaged() {
    let (_d, path) = temp();
    let mut r = open(&path);
    r.register_many(
        vec![
            tool("sha256_hex", "SHA-256 digest of a string as hex."),
            tool("base64_encode", "Encode bytes as base64 text."),
        ],
        false,
    )
    .expect("register");
    let q = SearchRequest::new(["sha256"]).k(1).mode(toolsmith_registry::Mode::Bm25);
    assert_eq!(r.search(&q).expect("search")[0].name, "sha256_hex");
    let index = r.index_dir();
    drop(r);
    std::fs::remove_dir_all(&index).expect("delete index");
    let mut r = open(&path);
    assert_eq!(r.search(&q).expect("search after deletion")[0].name, "sha256_hex");
    drop(r);
    std::fs::write(index.join("meta.json"), b"{ this is not json").expect("damage");
    let mut r = open(&path);
    assert_eq!(r.search(&q).expect("search after damage")[0].name, "sha256_hex");
    assert!(r.doctor().expect("doctor").problems.is_empty());
    r.reindex().expect("reindex");
    assert_eq!(r.search(&q).expect("search after reindex")[0].name, "sha256_hex");
}

#[test]
fn a_search_index_locked_by_another_writer_is_searched_as_it_is() {
    let (_d, path) = temp();
    let mut r = open(&path);
    r.register(tool("sha256_hex", "SHA-256 digest of a string as hex."), false).expect("register");
    let bm25 = SearchRequest::new(["sha256"]).k(1).mode(toolsmith_registry::Mode::Bm25);
    assert_eq!(r.search(&bm25).expect("search")[0].name, "sha256_hex");
    // Someone else holds the index writer (tantivy's lock file) and does not let go.
    let index = tantivy::Index::open_in_dir(r.index_dir()).expect("open index");
    let writer: tantivy::IndexWriter = index.writer(15_000_000).expect("take the writer lock");
    r.register(tool("md5_hex", "MD5 digest of a string as hex."), false).expect("the database still takes writes");
    // After waiting for the lock, search goes on with the index as it was: BM25 does not know the
    // new tool yet, the dense side (read from the database) does.
    let hits = r.search(&SearchRequest::new(["md5 digest"]).k(2).expand(false)).expect("search despite the lock");
    assert!(hits.iter().any(|h| h.name == "md5_hex" && h.explain.bm25.is_none()), "{hits:#?}");
    drop(writer);
    let hits = r.search(&SearchRequest::new(["md5"]).k(1).mode(toolsmith_registry::Mode::Bm25)).expect("search");
    assert_eq!(hits[0].name, "md5_hex", "the index catches up once the lock is free");
}

/// A caller's mistake (`invalid_args`, `not_found`, `busy`) is kept by kind but is not the tool's
/// failure: only `tool_error`, `trap`, `timeout`, ... lower its success rate.
#[test]
fn callers_mistakes_are_not_the_tools_failures() {
    let (_d, path) = temp();
    let mut r = open(&path);
    r.register(tool("summarise", "Summarise a text in a sentence."), false).expect("register");
    let call = |kind: Option<&str>| toolsmith_registry::CallUsage::new("summarise", kind);
    r.record_calls(&[call(None), call(Some("invalid_args")), call(Some("busy")), call(Some("timeout")), call(None)])
        .expect("calls");
    let stats = r.get("summarise").expect("get").stats;
    assert_eq!((stats.usage_count, stats.success_count, stats.failure_count), (5, 2, 1));
    assert_eq!(stats.caller_errors(), 2);
    assert_eq!(stats.success_rate(), Some(2.0 / 3.0));
    let view = r.tool_view("summarise").expect("view").stats;
    assert_eq!((view.calls, view.successes, view.failures), (5, 2, 1));
    assert_eq!(view.failures_by_kind.get("invalid_args"), Some(&1));
}

/// The meta tools' names are the server's: no tool may take them, whichever way it arrives.
#[test]
fn meta_tool_names_are_reserved() {
    let (_d, path) = temp();
    let mut r = open(&path);
    for name in toolsmith_contract::RESERVED_TOOL_NAMES {
        let err = r.register(tool(name, "Shadows a meta tool of the server."), false).expect_err("reserved");
        assert!(err.to_string().contains("meta tool"), "{err}");
    }
    assert_eq!(r.len().expect("len"), 0);
}
