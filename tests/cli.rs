//! End-to-end tests through the `toolsmith` binary.

mod common;

use common::{ok, stdout_json};

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn toolsmith(args: &[&str]) -> Output {
    toolsmith_in(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-registry.db"), args)
}

/// Runs against the registry at `registry` (never the user's own).
fn toolsmith_in(registry: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_toolsmith"))
        .args(args)
        .env("TOOLSMITH_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"))
        .env("TOOLSMITH_REGISTRY", registry)
        .output()
        .expect("run toolsmith")
}

#[test]
fn call_prints_the_result() {
    let out = toolsmith(&["call", "calculator", "--args", r#"{"expression": "2 ^ 10"}"#]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout_json(&out), serde_json::json!({"value": 1024.0}));
}

#[test]
fn call_failures_print_a_structured_error_and_exit_non_zero() {
    let out = toolsmith(&["call", "calculator", "--args", r#"{"expression": 1}"#]);
    assert_eq!(out.status.code(), Some(1));
    let e = &stdout_json(&out)["error"];
    assert_eq!(e["kind"], "invalid_args");
    assert_eq!(e["pointer"], "/expression");
    assert!(e["hint"].is_string());

    let out = toolsmith(&["call", "calculator", "--args", "{not json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout_json(&out)["error"]["kind"], "invalid_args");

    let out = toolsmith(&["call", "nonexistent_tool"]);
    assert_eq!(stdout_json(&out)["error"]["kind"], "not_found");
}

#[test]
fn call_runs_a_component_file_under_the_given_limits() {
    let hostile = toolsmith_test_programs::HOSTILE;
    let out = toolsmith(&["call", hostile, "--args", r#"{"mode": "ok"}"#]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = toolsmith(&["call", hostile, "--args", r#"{"mode": "loop"}"#, "--timeout-ms", "200"]);
    assert_eq!(stdout_json(&out)["error"]["kind"], "timeout");
    let out = toolsmith(&["call", hostile, "--args", r#"{"mode": "grow"}"#, "--memory-mb", "16"]);
    assert_eq!(stdout_json(&out)["error"]["kind"], "out_of_memory");
    // A plugin loaded from a file can compose the bundled tools.
    let out = toolsmith(&["call", hostile, "--args", r#"{"mode": "compose"}"#]);
    assert_eq!(stdout_json(&out)["value"], 42.0);
    // A component that reads files loads, but sees no file an operator did not grant.
    let out = toolsmith(&["call", toolsmith_test_programs::FS_IMPORT, "--args", r#"{"path": "/etc/passwd"}"#]);
    let e = &stdout_json(&out)["error"];
    assert_eq!(e["code"], "io_error", "{e}");
}

#[test]
fn inspect_prints_the_manifest_in_three_formats() {
    let file = toolsmith_test_programs::HOSTILE;
    let out = toolsmith(&["plugin", "inspect", file]);
    assert!(out.status.success());
    assert_eq!(stdout_json(&out)["name"], "hostile");
    let out = toolsmith(&["plugin", "inspect", file, "--format", "mcp"]);
    assert_eq!(stdout_json(&out)["inputSchema"]["required"][0], "mode");
    let out = toolsmith(&["plugin", "inspect", file, "--format", "openai"]);
    assert_eq!(stdout_json(&out)["function"]["name"], "hostile");
}

#[test]
fn schema_prints_the_committed_manifest_schema() {
    let out = toolsmith(&["schema", "manifest"]);
    let committed =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/tool-manifest.schema.json"))
            .expect("committed schema");
    assert_eq!(stdout_json(&out), serde_json::from_str::<Value>(&committed).expect("json"));
}

#[test]
fn quickstart_reproduces_every_example() {
    let out = toolsmith(&["quickstart"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("all examples reproduced"), "{stdout}");
    assert!(stdout.contains("\"kind\":\"invalid_args\""), "{stdout}");
    // The Python section: SEARL's quadratic solver created, admitted, called; hostile code typed.
    assert!(stdout.contains("\"creation_success\":true"), "{stdout}");
    assert!(stdout.contains("{\"result\":[3.0,-1.0]}"), "{stdout}");
    assert!(stdout.contains("timeout in tool `f`"), "{stdout}");
    // The MCP section: a real session through the server's stdio transport.
    assert!(stdout.contains("tools/list        -> calculator, create_and_execute_mcp"), "{stdout}");
    assert!(stdout.contains("search_tools      -> units"), "{stdout}");
    assert!(stdout.contains("isError true, kind \"invalid_args\""), "{stdout}");
    // The policy section: init, checkpoint, seeded sampling, one training step that helps.
    assert!(stdout.contains("same seed again   -> identical: true"), "{stdout}");
    let step = stdout.lines().find(|l| l.contains("one SFT step")).expect("SFT line");
    let numbers: Vec<f64> = step.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert!(numbers.len() == 2 && numbers[1] > numbers[0], "{step}");
}

#[test]
fn a_new_plugin_scaffolds_builds_inspects_and_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = dir.path().join("word_count");
    let plugin_str = plugin.to_str().expect("utf-8 path");
    let out = toolsmith(&["plugin", "new", "word_count", "--dir", plugin_str]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Share the guests' target directory so the SDK and its dependencies are already compiled.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../guests");
    let out = toolsmith(&["plugin", "build", plugin_str, "--target-dir", target.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let component = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(component.ends_with("word_count.wasm"), "{component}");
    let manifest = stdout_json(&toolsmith(&["plugin", "inspect", &component]));
    assert_eq!(manifest["name"], "word_count");
    assert_eq!(manifest["input_schema"]["properties"]["text"]["type"], "string");
    let out = toolsmith(&["call", &component, "--args", r#"{"text": "one two three"}"#]);
    assert_eq!(stdout_json(&out), serde_json::json!({"words": 3}));
    // Scaffolding refuses bad names and non-empty directories.
    assert!(!toolsmith(&["plugin", "new", "Word-Count", "--dir", plugin_str]).status.success());
    assert!(!toolsmith(&["plugin", "new", "word_count", "--dir", plugin_str]).status.success());

    // `plugin build` refuses a project whose component is not a tool, naming the source file and
    // what is wrong with it.
    let lib = plugin.join("src/lib.rs");
    let good = std::fs::read_to_string(&lib).expect("lib.rs");
    let build_fails = |source: &str, says: &str| {
        std::fs::write(&lib, source).expect("write lib.rs");
        let out = toolsmith(&["plugin", "build", plugin_str, "--target-dir", target.to_str().expect("utf-8")]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(&format!("{}:", lib.display())) && stderr.contains(says), "{stderr}");
    };
    // No `tool!`: the crate builds, but exports no tool.
    let no_tool = good.split("toolsmith_sdk::tool!").next().expect("source").to_owned();
    build_fails(&no_tool, "export");
    // A schema that is not JSON Schema (`"type": "float"`), however it was produced.
    let not_a_schema = good.replace(
        "    /// The text to analyse.\n    pub text: String,",
        "    /// The text to analyse.\n    #[schemars(schema_with = \"float\")]\n    pub text: String,",
    ) + "\nfn float(_: &mut schemars::SchemaGenerator) -> schemars::Schema {\n    schemars::json_schema!({\"type\": \"float\"})\n}\n";
    assert_ne!(not_a_schema, good);
    build_fails(&not_a_schema, "input_schema is not a valid JSON Schema: at /properties/text/type");
}

#[test]
fn create_admit_and_call_a_python_tool_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let code = dir.path().join("area.py");
    std::fs::write(&code, "def circle_area(r: float) -> float:\n    import math\n    return math.pi * r * r\n")
        .expect("write");
    let registry = dir.path().join("registry.db");
    let run = |args: &[&str]| toolsmith_in(&registry, args);
    let code = code.to_str().expect("utf-8");
    let out = run(&[
        "create",
        "--name",
        "circle_area",
        "--description",
        "Area of a circle of radius r.",
        "--arguments",
        "r (float): the radius",
        "--returns",
        "the area",
        "--code",
        code,
        "--inputs",
        r#"{"r": 2}"#,
        "--admit",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result = stdout_json(&out);
    assert_eq!(result["creation_success"], true);
    assert!((result["execution_result"].as_f64().expect("number") - 12.566370614359172).abs() < 1e-12);
    // A later process finds the admitted tool by name.
    let out = run(&["call", "circle_area", "--args", r#"{"r": 1}"#]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout_json(&out)["result"], std::f64::consts::PI);
    let out = run(&["call", "circle_area", "--args", r#"{"r": "big"}"#]);
    assert_eq!(stdout_json(&out)["error"]["kind"], "invalid_args");
    // A failing creation reports SEARL's shape with creation_success false and exits non-zero.
    let bad = dir.path().join("bad.py");
    std::fs::write(&bad, "def broken(:\n").expect("write");
    let out = run(&["create", "--name", "broken", "--description", "Broken.", "--code", bad.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    let result = stdout_json(&out);
    assert_eq!(result["creation_success"], false);
    assert!(result["error"].as_str().is_some_and(|e| e.contains("SyntaxError")), "{result}");
    // The admitted tool is a node of the tool graph, with its calls counted.
    let listed = stdout_json(&run(&["tools", "list", "--json"]));
    let tool =
        listed.as_array().expect("list").iter().find(|t| t["name"] == "circle_area").expect("registered").clone();
    assert_eq!(tool["kind"], "python");
    assert_eq!(tool["stats"]["usage_count"], 2);
    assert_eq!(tool["stats"]["success_count"], 1);
    // A near miss gets a suggestion.
    let out = run(&["call", "circle_aera", "--args", "{}"]);
    let e = &stdout_json(&out)["error"];
    assert_eq!(e["kind"], "not_found");
    assert!(e["hint"].as_str().is_some_and(|h| h.contains("circle_area")), "{e}");
}

#[test]
fn python_run_prints_result_stdout_and_structured_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("f.py");
    std::fs::write(
        &file,
        "def f(a, b=2):\n    print('adding')\n    return a + b\n\ndef loop():\n    while True:\n        pass\n",
    )
    .expect("write");
    let file = file.to_str().expect("utf-8");
    let out = toolsmith(&["python", "run", file, "--entry", "f", "--args", r#"{"a": 40}"#]);
    assert!(out.status.success());
    let v = stdout_json(&out);
    assert_eq!(v["result"], 42);
    assert_eq!(v["stdout"], "adding\n");
    let out = toolsmith(&["python", "run", file, "--entry", "f", "--args", "[1, 2]"]);
    assert_eq!(stdout_json(&out)["result"], 3);
    let out = toolsmith(&["python", "run", file, "--entry", "loop", "--timeout", "0.3"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout_json(&out)["error"]["kind"], "timeout");
    let out = toolsmith(&["python", "run", file, "--entry", "f", "--args", r#"{"a": "x"}"#]);
    let e = &stdout_json(&out)["error"];
    assert_eq!(e["kind"], "python_error");
    assert_eq!(e["exception"]["type"], "TypeError");
    // The guest is looked for in `$TOOLSMITH_DEPS` when that is set.
    let deps = dir.path().join("deps");
    let out = Command::new(env!("CARGO_BIN_EXE_toolsmith"))
        .args(["python", "run", file, "--entry", "f", "--args", r#"{"a": 1}"#])
        .env("TOOLSMITH_DEPS", &deps)
        .env("TOOLSMITH_CACHE_DIR", dir.path().join("cache"))
        .output()
        .expect("run toolsmith");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && said.contains(&*deps.join("python/runner.wasm").to_string_lossy()), "{said}");
}

#[test]
fn tools_commands_browse_and_maintain_the_graph() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = dir.path().join("registry.db");
    let run = |args: &[&str]| toolsmith_in(&reg, args);
    // A new registry starts with the bundled tools (http_get too, granted nothing), none merged.
    let list = stdout_json(&run(&["tools", "list", "--json"]));
    let names: Vec<&str> = list.as_array().expect("array").iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["calculator", "http_get", "json_query", "text", "units"]);

    let manifest = dir.path().join("fahrenheit.json");
    std::fs::write(
        &manifest,
        serde_json::json!({
            "name": "celsius_to_fahrenheit", "version": "1.0.0",
            "description": "Convert a temperature in degrees Celsius to degrees Fahrenheit.",
            "input_schema": {"type": "object", "properties": {"celsius": {"type": "number"}}},
            "output_schema": {"type": "object"}, "kind": "simulated"
        })
        .to_string(),
    )
    .expect("write manifest");
    assert!(ok(&run(&["tools", "add", manifest.to_str().expect("utf8")])).contains("added"));
    let component = toolsmith_test_programs::HOSTILE;
    assert!(ok(&run(&["tools", "add", component, "--no-merge"])).contains("added `hostile`"));

    let hits = stdout_json(&run(&["tools", "search", "how hot is 30 C in F", "-k", "2", "--json"]));
    assert_eq!(hits[0]["name"], "celsius_to_fahrenheit", "{hits}");
    assert!(hits[0]["explain"]["cosine"].is_number());
    let explained = ok(&run(&["tools", "search", "evaluate 2+2", "another sub-plan: regex", "--explain"]));
    assert!(explained.contains("cosine") && explained.contains("for: "), "{explained}");

    let show = ok(&run(&["tools", "show", "units"]));
    assert!(show.contains("code: blob") && show.contains("\"name\": \"units\""), "{show}");

    // Export, import into a fresh registry, export again: identical.
    let export = dir.path().join("export.jsonl");
    ok(&run(&["tools", "export", "--out", export.to_str().expect("utf8")]));
    let other = dir.path().join("other.db");
    ok(&toolsmith_in(&other, &["tools", "import", export.to_str().expect("utf8")]));
    let again = toolsmith_in(&other, &["tools", "export"]);
    assert_eq!(String::from_utf8_lossy(&again.stdout), std::fs::read_to_string(&export).expect("read export"));

    let html = dir.path().join("graph.html");
    let dot = ok(&run(&["tools", "graph", "--format", "dot", "--html", html.to_str().expect("utf8")]));
    assert!(dot.starts_with("digraph tools {") && dot.contains("\"units\""), "{dot}");
    let page = std::fs::read_to_string(&html).expect("html");
    let data = toolsmith_daemon::graph::static_data(&page).expect("the page carries the graph");
    let names: Vec<&str> =
        data["graph"]["nodes"].as_array().expect("nodes").iter().filter_map(|n| n["name"].as_str()).collect();
    assert!(names.contains(&"celsius_to_fahrenheit"), "{names:?}");
    let mermaid = ok(&run(&["tools", "graph", "--format", "mermaid", "--around", "units", "--depth", "1"]));
    assert!(mermaid.starts_with("graph LR"), "{mermaid}");

    ok(&run(&["tools", "merge", "calculator", "hostile"]));
    assert!(ok(&run(&["tools", "show", "hostile"])).contains("aliases: hostile"));
    ok(&run(&["tools", "remove", "celsius_to_fahrenheit"]));
    assert!(!run(&["tools", "show", "celsius_to_fahrenheit"]).status.success());
    assert!(ok(&run(&["tools", "stats"])).contains("tools      5"));
    assert!(ok(&run(&["tools", "reindex"])).contains("reindexed 5 tools"));
    assert!(ok(&run(&["tools", "doctor"])).contains("healthy"));
}

#[test]
fn a_corrupt_or_foreign_registry_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![0x5au8; 10_000]).expect("write");
    let out = toolsmith_in(&garbage, &["tools", "list"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a Toolsmith registry") && !stderr.contains("panicked"), "{stderr}");
    assert_eq!(std::fs::read(&garbage).expect("read"), vec![0x5au8; 10_000]);

    let bad_import = dir.path().join("bad.jsonl");
    std::fs::write(&bad_import, "{\"type\": \"header\", \"format\": 1}\n{oops\n").expect("write");
    let reg = dir.path().join("ok.db");
    let out = toolsmith_in(&reg, &["tools", "import", bad_import.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("import line 2"));
}

#[test]
fn tools_export_as_openai_functions_and_mcp_tools() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = dir.path().join("registry.db");
    let functions = stdout_json(&toolsmith_in(&registry, &["tools", "export", "--format", "openai"]));
    let functions = functions.as_array().expect("an array");
    assert_eq!(functions.len(), 5, "the bundled tools");
    for f in functions {
        assert_eq!(f["type"], "function");
        assert_eq!(f["function"]["parameters"]["type"], "object", "{f}");
        assert!(f["function"]["description"].as_str().is_some_and(|d| !d.is_empty()));
    }
    let names: Vec<&str> = functions.iter().filter_map(|f| f["function"]["name"].as_str()).collect();
    assert_eq!(names, ["calculator", "http_get", "json_query", "text", "units"]);

    let out = dir.path().join("tools.json");
    ok(&toolsmith_in(&registry, &["tools", "export", "--format", "mcp", "--out", out.to_str().expect("utf-8")]));
    let listed: Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("written")).expect("JSON");
    let tools = listed["tools"].as_array().expect("tools");
    assert_eq!(tools.len(), 5);
    for tool in tools {
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
        assert_eq!(tool["outputSchema"]["type"], "object", "{tool}");
        // What MCP lists reads back as the manifest the registry holds.
        let manifest = toolsmith_contract::Manifest::from_mcp_tool(tool).expect("a manifest");
        assert_eq!(manifest.kind, toolsmith_contract::ToolKind::Plugin);
    }
}

#[test]
fn policy_init_info_and_generate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("tiny");
    let model_arg = model.to_str().expect("utf-8 path");
    assert!(ok(&toolsmith(&["policy", "init", "--out", model_arg, "--seed", "3"])).contains("M parameters"));
    // An existing checkpoint is not overwritten by accident.
    let again = toolsmith(&["policy", "init", "--out", model_arg]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));

    let info = stdout_json(&toolsmith(&["policy", "info", model_arg, "--json"]));
    assert_eq!(info["architecture"], "qwen2");
    assert_eq!(info["layers"], 4);
    assert_eq!(info["step"], 0);
    let parameters = info["parameters"].as_i64().expect("parameters");
    assert!((1_000_000..=5_000_000).contains(&parameters), "{info}");

    let generate = |extra: &[&str]| {
        let mut args = vec!["policy", "generate", model_arg, "--prompt", "<plan>\nTask 1:", "--max-new-tokens", "12"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--threads", "1", "--device", "cpu", "--json"]);
        stdout_json(&toolsmith(&args))
    };
    let greedy = generate(&[]);
    assert_eq!(greedy["output_ids"].as_array().map(Vec::len), Some(12));
    let tiny = toolsmith_policy::Tokenizer::tiny().expect("tiny tokenizer");
    assert_eq!(greedy["prompt_ids"][0], tiny.token_id("<plan>").expect("a tag"), "<plan> is one token");
    let sampled = generate(&["--temperature", "1.0", "--top-p", "0.9", "--seed", "7"]);
    let again = generate(&["--temperature", "1.0", "--top-p", "0.9", "--seed", "7"]);
    assert_eq!((&sampled["output_ids"], &sampled["text"]), (&again["output_ids"], &again["text"]));
    assert_ne!(sampled["output_ids"], greedy["output_ids"]);

    // Streaming mode prints the text and the speed.
    let out = toolsmith(&["policy", "generate", model_arg, "--prompt", "hi", "--max-new-tokens", "5"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("tokens/s"), "{}", String::from_utf8_lossy(&out.stderr));

    // `eval` with the checkpoint notes when the turn budget is below what the oracle's own turns
    // need in its tokens (the budget, not the policy, then bounds the EM), and only then.
    let eval = |max_tokens: &str| {
        let args = ["eval", "--policy", model_arg, "--mode", "gap", "--limit", "2", "--max-turns", "1"];
        ok(&toolsmith(&[&args[..], &["--max-tokens", max_tokens]].concat()))
    };
    let short = eval("8");
    assert!(short.contains("ceiling 0.00: the oracle's own turns fit --max-tokens 8 on 0% of the tasks"), "{short}");
    let roomy = eval("1024");
    assert!(roomy.contains("mode gap") && !roomy.contains("ceiling"), "{roomy}");

    // Bad input: clear errors, non-zero exits.
    let bad = toolsmith(&["policy", "generate", model_arg, "--prompt", "x", "--top-p", "0"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("top_p"));
    std::fs::write(model.join("config.json"), "{").expect("corrupt the config");
    let bad = toolsmith(&["policy", "info", model_arg]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("config.json"));
    let missing = toolsmith(&["policy", "info", dir.path().join("nothing").to_str().expect("utf-8")]);
    assert!(!missing.status.success());
}

/// The agent end to end: `eval` with the oracle in each mode, `run` showing one trace, and SEARL's
/// numeric tasks teaching the tool graph (a created tool admitted, plan edges to it recorded).
#[test]
fn eval_run_and_the_graph_learning_from_trajectories() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = dir.path().join("registry.db");
    let run = |args: &[&str]| toolsmith_in(&registry, args);
    // Several modes run side by side: one report each, keyed by mode.
    let args =
        ["eval", "--mode", "react", "--mode", "gap", "--mode", "mem", "--family", "multi_hop_parallel", "--json"];
    let reports: Value = serde_json::from_str(&ok(&run(&args))).expect("one JSON object");
    for mode in ["react", "gap", "mem"] {
        let report = &reports[mode];
        assert_eq!(report["mode"], mode, "{reports}");
        assert_eq!(report["overall"]["em"], 1.0, "{report}");
        assert_eq!(report["families"]["multi_hop_parallel"]["tasks"], 12);
    }
    // Gap plans the parallel hops into fewer turns than react takes.
    assert!(reports["gap"]["overall"]["turns"].as_f64() < reports["react"]["overall"]["turns"].as_f64(), "{reports}");
    let twice = run(&["eval", "--mode", "gap", "--mode", "gap", "--limit", "1"]);
    assert!(!twice.status.success() && String::from_utf8_lossy(&twice.stderr).contains("given twice"), "{twice:?}");
    let table = ok(&run(&["eval", "--mode", "gap", "--limit", "5"]));
    assert!(table.contains("cost/pass") && table.contains("single_hop"), "{table}");
    // The same world's questions reworded are answered alike; they never become traces.
    let out = ok(&run(&["eval", "--mode", "gap", "--reworded", "--tasks-per-family", "2", "--json"]));
    let report: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(report["mode"], "gap", "one mode: its report as it is");
    assert_eq!(report["overall"]["em"], 1.0, "{report}");
    let traces = dir.path().join("traces.jsonl");
    let refused = run(&["world", "traces", "--reworded", "--out", traces.to_str().expect("utf-8")]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("kept out of training") && !traces.exists());

    let tasks = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/world/tasks.jsonl"))
        .expect("shipped tasks");
    let first: Value = serde_json::from_str(tasks.lines().next().expect("a task")).expect("json");
    let question = first["question"].as_str().expect("question");
    let trace = ok(&run(&["run", question, "--mode", "react"]));
    let two = run(&["run", question, "--mode", "react", "--mode", "gap"]);
    assert!(!two.status.success() && String::from_utf8_lossy(&two.stderr).contains("one mode"), "{two:?}");
    assert!(trace.contains("turn 1") && trace.contains("search(") && trace.contains("EM 1"), "{trace}");

    let out = run(&["eval", "--mode", "searl", "--family", "numeric", "--limit", "4", "--record", "run-1", "--admit"]);
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("4 candidate tools, 4 admitted") && stderr.contains("search -> sum_integers"), "{stderr}");
    let shown = ok(&run(&["tools", "show", "sum_integers"]));
    assert!(shown.contains("(python)") && shown.contains("fed by search (count 4"), "{shown}");
    // With retrieval from that graph, its agent-written tools are installed to run here.
    let out = run(&["eval", "--mode", "searl", "--family", "numeric", "--limit", "1", "--retrieve", "-v"]);
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("1 agent-written tools of the graph installed: sum_integers"), "{stderr}");

    // The other styles add a numeric task's values with the bundled calculator the listing offers.
    let args =
        ["eval", "--mode", "react", "--mode", "gap", "--mode", "mem", "--family", "numeric", "--limit", "3", "--json"];
    let reports: Value = serde_json::from_str(&ok(&run(&args))).expect("one JSON object");
    for mode in ["react", "gap", "mem"] {
        assert_eq!(reports[mode]["overall"]["em"], 1.0, "{reports}");
    }
    let numeric = tasks
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|t| t["family"] == "numeric")
        .expect("a numeric task");
    let trace = ok(&run(&["run", numeric["question"].as_str().expect("question"), "--mode", "gap"]));
    assert!(trace.contains("calculator(") && trace.contains("EM 1"), "{trace}");

    // A user's task file with a bad line is refused with its line number.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"question\": \"q\", \"golden_answers\": [\"a\"]}\n{oops\n").expect("write");
    let out = run(&["eval", "--tasks", bad.to_str().expect("utf-8")]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.jsonl:2"), "{stderr}");
}

/// `smollm2-135m` names the pretrained policy setup fetched; a missing one says how to get it.
#[test]
fn the_pretrained_policy_is_known_by_name() {
    let info = Command::new(env!("CARGO_BIN_EXE_toolsmith"))
        .args(["policy", "info", "smollm2-135m", "--json"])
        .output()
        .expect("run toolsmith");
    let info: Value = serde_json::from_str(&ok(&info)).expect("json");
    assert_eq!(info["layers"], 30, "{info}");
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = Command::new(env!("CARGO_BIN_EXE_toolsmith"))
        .args(["eval", "--policy", "smollm2-135m", "--limit", "1"])
        .env("TOOLSMITH_SMOLLM2", dir.path().join("nowhere"))
        .env("TOOLSMITH_REGISTRY", dir.path().join("registry.db"))
        .output()
        .expect("run toolsmith");
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("smollm2-135m policy is not here") && stderr.contains("scripts/setup.sh"), "{stderr}");
    // `TOOLSMITH_DEPS` names setup's directory for a binary built from another checkout.
    let deps = dir.path().join("deps");
    std::fs::create_dir_all(&deps).expect("mkdir");
    let elsewhere = Command::new(env!("CARGO_BIN_EXE_toolsmith"))
        .args(["policy", "info", "smollm2-135m", "--json"])
        .env("TOOLSMITH_DEPS", &deps)
        .output()
        .expect("run toolsmith");
    let stderr = String::from_utf8_lossy(&elsewhere.stderr);
    assert!(!elsewhere.status.success() && stderr.contains(&*deps.to_string_lossy()), "{stderr}");
    let fetched = Path::new(env!("CARGO_MANIFEST_DIR")).join(".deps/smollm2-135m-instruct");
    std::os::unix::fs::symlink(&fetched, deps.join("smollm2-135m-instruct")).expect("symlink");
    let elsewhere = Command::new(env!("CARGO_BIN_EXE_toolsmith"))
        .args(["policy", "info", "smollm2-135m", "--json"])
        .env("TOOLSMITH_DEPS", &deps)
        .output()
        .expect("run toolsmith");
    let info: Value = serde_json::from_str(&ok(&elsewhere)).expect("json");
    assert_eq!(info["layers"], 30, "{info}");
}

/// `eval` against an OpenAI-compatible endpoint that calls tools natively (`--tool-calls`
/// defaults to auto): a scripted stub answers the first turn with a `search` call in
/// `tool_calls` and the second with the answer; the call runs, the answer scores, and the stub
/// was sent `tools`, the call back as `tool_calls` and its result as a `tool` message.
#[test]
fn eval_drives_an_openai_endpoint_through_native_tool_calls() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::{Arc, Mutex};

    use serde_json::json;

    let dir = tempfile::tempdir().expect("tempdir");
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(&tasks, "{\"question\": \"Where was Ada born?\", \"golden_answers\": [\"London\"]}\n")
        .expect("write");
    let corpus = dir.path().join("corpus.jsonl");
    std::fs::write(&corpus, "{\"title\": \"Ada\", \"text\": \"Ada was born in London.\"}\n").expect("write");

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("address"));
    let requests = Arc::new(Mutex::new(Vec::<Value>::new()));
    let seen = requests.clone();
    // Detached: it blocks in accept until the test process ends.
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut length = 0;
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && !line.trim_end().is_empty() {
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let mut seen = seen.lock().expect("lock");
            let message = if seen.is_empty() {
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"Ada\"}"}}
                ]})
            } else {
                json!({"role": "assistant", "content": "<answer>\\boxed{London}</answer>"})
            };
            seen.push(request);
            let reply = json!({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}).to_string();
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                reply.len()
            );
            let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(reply.as_bytes()));
        }
    });

    let path = |p: &Path| p.to_str().expect("utf-8").to_string();
    let (tasks, corpus) = (path(&tasks), path(&corpus));
    let args = ["eval", "--policy", &url, "--tasks", &tasks, "--corpus", &corpus, "--mode", "react", "--json"];
    let report: Value = serde_json::from_str(&ok(&toolsmith(&args))).expect("one JSON object");
    assert_eq!(report["overall"]["em"], 1.0, "{report}");
    let requests = requests.lock().expect("lock").clone();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let names: Vec<&str> =
        requests[0]["tools"].as_array().into_iter().flatten().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert!(names.contains(&"search"), "{}", requests[0]);
    let messages = requests[1]["messages"].as_array().expect("messages");
    let assistant = messages.iter().find(|m| m["role"] == "assistant").expect("the first turn");
    assert_eq!(assistant["tool_calls"][0]["id"], "call_0_0");
    let tool = messages.iter().find(|m| m["role"] == "tool").expect("the call's result");
    assert_eq!(tool["tool_call_id"], "call_0_0");
    assert!(tool["content"].as_str().is_some_and(|c| c.contains("Ada was born in London.")), "{tool}");

    let bad = toolsmith(&["eval", "--tool-calls", "sometimes", "--limit", "1"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("--tool-calls"), "{bad:?}");
}
