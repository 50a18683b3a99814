//! Graph memory: plans become edges, merges redirect them, candidates are filtered by reward.

use toolsmith_registry::{Candidate, PlanStep, Registered, SearchRequest, Settings};

use crate::{open, open_with, temp, tool};

fn step(id: &str, tool: &str, deps: &[&str]) -> PlanStep {
    PlanStep { id: id.into(), tool: tool.into(), depends_on: deps.iter().map(|d| d.to_string()).collect() }
}

fn seed(r: &mut toolsmith_registry::Registry) {
    let tools = vec![
        tool("fetch_csv", "Download a CSV file from a URL and return its rows."),
        tool("csv_to_json", "Convert CSV text into a JSON array of objects."),
        tool("mean", "Arithmetic mean of a list of numbers."),
        tool("plot_histogram", "Draw a histogram of numeric values as an SVG image."),
        tool("translate_text", "Translate text between natural languages."),
    ];
    for outcome in r.register_many(tools, false).expect("register") {
        assert!(matches!(outcome, Registered::Added { .. }), "{outcome:?}");
    }
}

#[test]
fn plans_accumulate_tool_level_edges() {
    let (_d, path) = temp();
    let mut r = open(&path);
    seed(&mut r);
    let plan = [
        step("a", "fetch_csv", &[]),
        step("b", "csv_to_json", &["a"]),
        step("c", "mean", &["b"]),
        step("d", "mean", &["b"]), // the same tool edge twice in one plan counts once
        step("e", "nonexistent_tool", &["c"]),
    ];
    let rec = r.record_plan(&plan, 1.0).expect("record");
    assert_eq!(rec.edges, vec![("csv_to_json".into(), "mean".into()), ("fetch_csv".into(), "csv_to_json".into())]);
    assert_eq!(rec.unknown, vec!["nonexistent_tool".to_string()]);
    r.record_plan(&plan[..3], 0.5).expect("record again");
    let show = r.show("csv_to_json").expect("show");
    assert_eq!(show.dependents.len(), 1);
    assert_eq!((show.dependents[0].name.as_str(), show.dependents[0].count), ("mean", 2));
    assert!((show.dependents[0].weight - 1.5).abs() < 1e-9);
    assert_eq!(show.dependencies[0].name, "fetch_csv");

    let bad = r.record_plan(&[step("x", "mean", &["missing"])], 1.0).expect_err("unknown step");
    assert!(bad.to_string().contains("unknown step `missing`"), "{bad}");
    assert!(r.record_plan(&plan, f64::NAN).is_err());
}

#[test]
fn graph_expansion_adds_weighted_neighbours() {
    let (_d, path) = temp();
    let mut r = open(&path);
    seed(&mut r);
    let plan = [step("a", "fetch_csv", &[]), step("b", "csv_to_json", &["a"]), step("c", "mean", &["b"])];
    r.record_plan(&plan, 3.0).expect("record");
    r.record_plan(&[step("a", "fetch_csv", &[]), step("b", "plot_histogram", &["a"])], 1.0).expect("record");
    let req = SearchRequest::new(["download the spreadsheet rows from this URL"]).k(1);
    let plain = r.search(&req.clone().expand(false)).expect("search");
    assert_eq!(plain.len(), 1);
    assert_eq!(plain[0].name, "fetch_csv");
    let hits = r.search(&req).expect("search");
    let names: Vec<&str> = hits.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["fetch_csv", "csv_to_json", "plot_histogram"], "{hits:#?}");
    let via = hits[1].explain.via.clone().expect("reached along an edge");
    assert_eq!(via.0, "fetch_csv");
    assert!((via.1 - 1.0).abs() < 1e-6);
    assert!((hits[2].explain.via.as_ref().expect("via").1 - 1.0 / 3.0).abs() < 1e-6);
    assert!(hits[1].score > hits[2].score);
}

#[test]
fn merge_redirects_edges_and_keeps_counts() {
    let (_d, path) = temp();
    let mut r = open(&path);
    seed(&mut r);
    r.register(tool("csv_parse_to_json", "Parse comma separated values into JSON objects."), false).expect("add");
    // fetch_csv -> csv_parse_to_json (2), csv_parse_to_json -> mean (1), fetch_csv -> csv_to_json (1),
    // csv_to_json -> csv_parse_to_json (1, becomes a self-loop and is dropped).
    r.record_plan(
        &[step("a", "fetch_csv", &[]), step("b", "csv_parse_to_json", &["a"]), step("c", "mean", &["b"])],
        1.0,
    )
    .expect("plan");
    r.record_plan(&[step("a", "fetch_csv", &[]), step("b", "csv_parse_to_json", &["a"])], 1.0).expect("plan");
    r.record_plan(&[step("a", "fetch_csv", &[]), step("b", "csv_to_json", &["a"])], 1.0).expect("plan");
    r.record_plan(&[step("a", "csv_to_json", &[]), step("b", "csv_parse_to_json", &["a"])], 1.0).expect("plan");
    r.record_call("csv_parse_to_json", true, Some(1.0)).expect("call");
    r.record_call("csv_to_json", false, Some(0.0)).expect("call");

    r.merge("csv_to_json", "csv_parse_to_json").expect("merge");
    assert_eq!(r.resolve("csv_parse_to_json").expect("resolve").as_deref(), Some("csv_to_json"));
    let show = r.show("csv_parse_to_json").expect("show through the alias");
    assert_eq!(show.tool.name, "csv_to_json");
    assert_eq!(show.aliases, ["csv_parse_to_json"]);
    assert_eq!(show.tool.stats.usage_count, 2);
    assert_eq!(show.tool.stats.success_count, 1);
    assert_eq!(show.tool.mean_reward, Some(0.5));
    assert_eq!(show.tool.manifest.provenance.parents[0].as_str(), "csv_parse_to_json");
    let into: Vec<(String, i64)> = show.dependencies.iter().map(|n| (n.name.clone(), n.count)).collect();
    assert_eq!(into, [("fetch_csv".to_string(), 3)]);
    let out: Vec<(String, i64)> = show.dependents.iter().map(|n| (n.name.clone(), n.count)).collect();
    assert_eq!(out, [("mean".to_string(), 1)]);
    assert_eq!(r.list(Default::default()).expect("list").len(), 5);
    assert!(r.merge("csv_to_json", "csv_parse_to_json").is_err(), "already merged");
    assert!(r.merge("csv_to_json", "no_such_tool").is_err());
    // Plans that name the alias now strengthen the canonical tool's edges.
    r.record_plan(&[step("a", "csv_parse_to_json", &[]), step("b", "mean", &["a"])], 1.0).expect("plan");
    assert_eq!(r.show("csv_to_json").expect("show").dependents[0].count, 2);
    // The search index forgot the merged tool.
    let hits = r.search(&SearchRequest::new(["parse comma separated values"]).k(10).expand(false)).expect("search");
    assert!(hits.iter().all(|h| h.name != "csv_parse_to_json"));
    assert!(r.doctor().expect("doctor").problems.is_empty());
}

#[test]
fn near_duplicates_merge_on_registration() {
    let (_d, path) = temp();
    let mut r = open_with(&path, Settings { merge_threshold: 0.9, ..Settings::default() });
    seed(&mut r);
    let dup = r
        .register(tool("csv_into_json", "Convert CSV text into a JSON array of objects, one per row."), true)
        .expect("register");
    match dup {
        Registered::Merged { name, into, similarity } => {
            assert_eq!((name.as_str(), into.as_str()), ("csv_into_json", "csv_to_json"));
            assert!(similarity >= 0.9, "{similarity}");
        }
        other => panic!("expected a merge, got {other:?}"),
    }
    let distinct = r.register(tool("median", "Median of a list of numbers."), true).expect("register");
    assert_eq!(distinct, Registered::Added { name: "median".into() });
    // Registering the same manifest again changes nothing; a changed one updates in place.
    assert_eq!(
        r.register(tool("median", "Median of a list of numbers."), true).expect("again"),
        Registered::Unchanged { name: "median".into() }
    );
    assert_eq!(
        r.register(tool("median", "Middle value of a list of numbers."), true).expect("update"),
        Registered::Updated { name: "median".into() }
    );
}

#[test]
fn merged_names_say_where_tools_would_go_and_write_nothing() {
    let (_d, path) = temp();
    let mut r = open_with(&path, Settings { merge_threshold: 0.9, ..Settings::default() });
    seed(&mut r);
    let dup = tool("csv_into_json", "Convert CSV text into a JSON array of objects, one per row.");
    assert!(matches!(r.register(dup, true).expect("register"), Registered::Merged { .. }));
    let before = r.len().expect("len");
    let names = r
        .merged_names(&[
            // An alias goes to its canonical tool, a held tool keeps its name.
            ("csv_into_json", "anything"),
            ("mean", "Arithmetic mean of a list of numbers."),
            // A near-duplicate of a held tool, a new tool, then a near-duplicate of that one and
            // the new tool's own name again.
            ("csv_rows_to_json", "Convert CSV text into a JSON array of objects."),
            ("median", "Median of a list of numbers."),
            ("list_median", "Median of a list of numbers."),
            ("median", "The middle value of a list of numbers."),
        ])
        .expect("names");
    assert_eq!(names, ["csv_to_json", "mean", "csv_to_json", "median", "median", "median"]);
    assert_eq!(r.len().expect("len"), before, "nothing is registered");
    assert_eq!(r.resolve("median").expect("resolve"), None);
    assert!(r.merged_names(&[]).expect("none").is_empty());
}

#[test]
fn register_best_admits_only_the_best_trajectory_per_task() {
    let (_d, path) = temp();
    let mut r = open(&path);
    seed(&mut r);
    let cand = |task: &str, traj: &str, reward: f64, name: &str, desc: &str| Candidate {
        run: "run-7".into(),
        iteration: 3,
        task: task.into(),
        trajectory: traj.into(),
        reward,
        tool: tool(name, desc).with_blob(format!("def {name}(): pass").into_bytes()),
    };
    for c in [
        cand("quadratic", "t1", 0.2, "solve_quadratic_naive", "Solve a quadratic equation by trial and error."),
        cand("quadratic", "t2", 1.0, "solve_quadratic", "Roots of a*x^2 + b*x + c = 0 by the quadratic formula."),
        cand("quadratic", "t2", 1.0, "discriminant", "Discriminant b^2 - 4ac of a quadratic."),
        cand("quadratic", "t3", 1.0, "quadratic_roots_late", "Roots of a quadratic, found later with the same reward."),
        cand("primes", "t4", 0.0, "is_prime_slow", "Decide whether an integer is prime by trial division."),
        cand("primes", "t5", 0.5, "is_prime", "Miller-Rabin primality test for an integer."),
    ] {
        r.add_candidate(&c).expect("candidate");
    }
    // Another iteration's candidates are not touched.
    r.add_candidate(&Candidate { iteration: 4, ..cand("primes", "t9", 9.0, "sieve", "Sieve of Eratosthenes.") })
        .expect("candidate");
    let admitted = r.register_best("run-7", 3).expect("register best");
    let mut names: Vec<&str> = admitted.iter().map(|a| a.outcome.canonical()).collect();
    names.sort_unstable();
    assert_eq!(names, ["discriminant", "is_prime", "solve_quadratic"]);
    for gone in ["solve_quadratic_naive", "quadratic_roots_late", "is_prime_slow", "sieve"] {
        assert_eq!(r.resolve(gone).expect("resolve"), None, "{gone} must not be admitted");
    }
    let statuses = r.candidates("run-7", 3).expect("candidates");
    assert_eq!(statuses.iter().filter(|c| c.status == "admitted").count(), 3);
    assert_eq!(statuses.iter().filter(|c| c.status == "rejected").count(), 3);
    assert_eq!(r.candidates("run-7", 4).expect("candidates")[0].status, "pending");
    let t = r.get("solve_quadratic").expect("admitted");
    let source = r.blob(t.blob_hash.as_deref().expect("has code")).expect("blob").expect("present");
    assert_eq!(source, b"def solve_quadratic(): pass");
    // A second call finds nothing pending.
    assert!(r.register_best("run-7", 3).expect("again").is_empty());
}
