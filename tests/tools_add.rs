//! `toolsmith tools add` and `tools import` through the binary: directories of definitions in
//! every accepted format, near-duplicates reported rather than merged, other systems' names, and
//! schemas checked whole.

mod common;

use std::path::Path;
use std::process::Output;

use common::ok;
use serde_json::{Value, json};

fn toolsmith_in(registry: &Path, args: &[&str]) -> Output {
    common::toolsmith().env("TOOLSMITH_REGISTRY", registry).args(args).output().expect("run toolsmith")
}

fn write(path: &Path, value: &Value) -> String {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    std::fs::write(path, serde_json::to_string_pretty(value).expect("json")).expect("write");
    path.to_str().expect("utf8").to_string()
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_str(&ok(out)).expect("stdout is JSON")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn function(name: &str, description: &str, properties: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "description": description,
           "parameters": {"type": "object", "properties": properties}}})
}

#[test]
fn a_directory_of_every_format_registers_in_one_process_under_its_original_names_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = dir.path().join("registry.db");
    let tools = dir.path().join("tools");
    let s = json!({"type": "string"});
    write(
        &tools.join("openai.json"),
        &json!([
            function("getWeather", "Current weather for a city.", json!({"city": s})),
            function("searchFlights", "Search flights between two airports on a date.", json!({"from": s, "to": s})),
        ]),
    );
    write(
        &tools.join("bare.json"),
        &json!({"name": "convert-currency", "description": "Convert an amount between currencies.",
                                             "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}}}),
    );
    write(
        &tools.join("legacy.json"),
        &json!({"functions": [{"name": "book_hotel", "description": "Book a hotel room for some nights."}]}),
    );
    write(
        &tools.join("servers/mcp.json"),
        &json!({"tools": [
            {"name": "files.read", "description": "Read a file of the project as text.", "inputSchema": {"type": "object", "properties": {"path": s}}},
            {"name": "git.log", "description": "Recent commits of the repository.", "inputSchema": {"type": "object"},
             "outputSchema": {"type": "object", "properties": {"commits": {"type": "array"}}}}
        ]}),
    );
    let manifest = |name: &str, description: &str| {
        json!({"name": name, "version": "1.0.0", "description": description, "input_schema": {"type": "object"},
               "output_schema": {"type": "object"}, "kind": "simulated"})
    };
    std::fs::write(
        tools.join("lines.jsonl"),
        format!(
            "{}\n{}\n",
            manifest("moon_phase", "Phase of the moon on a date."),
            manifest("tide_times", "High and low tide times at a port.")
        ),
    )
    .expect("write");
    std::fs::write(tools.join("README.md"), "not a tool").expect("write");

    let out = toolsmith_in(&reg, &["tools", "add", tools.to_str().expect("utf8"), "--json"]);
    let added = stdout_json(&out);
    let summary = stderr(&out);
    assert!(summary.contains("8 tools from 5 file(s)") && summary.contains("tools/s"), "{summary}");
    let got: Vec<(&str, &str, Option<&str>)> = added
        .as_array()
        .expect("array")
        .iter()
        .map(|t| (t["outcome"].as_str().unwrap_or(""), t["name"].as_str().unwrap_or(""), t["original_name"].as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("added", "convert_currency", Some("convert-currency")),
            ("added", "book_hotel", None),
            ("added", "moon_phase", None),
            ("added", "tide_times", None),
            ("added", "get_weather", Some("getWeather")),
            ("added", "search_flights", Some("searchFlights")),
            ("added", "files_read", Some("files.read")),
            ("added", "git_log", Some("git.log")),
        ],
        "{added}"
    );
    let list = stdout_json(&toolsmith_in(&reg, &["tools", "list", "--json"]));
    assert_eq!(list.as_array().map(Vec::len), Some(5 + 8), "the bundled tools and the eight");
    // The original names reach the tools: `show`, and `call` (these are interfaces only, so the
    // call is answered by the tool with what it is).
    let show = ok(&toolsmith_in(&reg, &["tools", "show", "files.read"]));
    assert!(show.starts_with("files_read 0.0.0 (simulated)") && show.contains("aliases: files.read"), "{show}");
    let call = toolsmith_in(&reg, &["call", "getWeather", "--args", r#"{"city": "Oslo"}"#]);
    let error = &serde_json::from_slice::<Value>(&call.stdout).expect("json")["error"];
    assert!(error["message"].as_str().is_some_and(|m| m.contains("`get_weather` is a simulated tool")), "{error}");
    // The plain output says what was mapped.
    let again = ok(&toolsmith_in(&reg, &["tools", "add", tools.join("openai.json").to_str().expect("utf8")]));
    assert!(again.contains("`get_weather` is already registered as given; named `getWeather` in"), "{again}");
}

#[test]
fn near_duplicates_are_reported_the_same_interface_merges_and_merge_merges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = dir.path().join("registry.db");
    let s = json!({"type": "string"});
    let weather = function("get_weather", "Get the current weather for a city.", json!({"city": s}));
    let a = write(&dir.path().join("a.json"), &json!([weather]));
    ok(&toolsmith_in(&reg, &["tools", "add", &a]));
    let b = write(
        &dir.path().join("b.json"),
        &json!([function(
            "get_current_weather",
            "Get the current weather in a city.",
            json!({"location": s, "units": s})
        )]),
    );
    let out = ok(&toolsmith_in(&reg, &["tools", "add", &b]));
    assert!(
        out.contains("added `get_current_weather`; near-duplicate of `get_weather` (cosine 0.9")
            && out.contains("kept as its own tool"),
        "{out}"
    );
    let mut same = weather.clone();
    same["function"]["name"] = json!("weatherNow");
    let c = write(&dir.path().join("c.json"), &json!([same]));
    let out = ok(&toolsmith_in(&reg, &["tools", "add", &c]));
    assert!(out.contains("`weather_now` merged into `get_weather`") && out.contains("named `weatherNow`"), "{out}");
    assert!(ok(&toolsmith_in(&reg, &["tools", "show", "weatherNow"])).starts_with("get_weather "));
    let d = write(
        &dir.path().join("d.json"),
        &json!([function("current_weather", "Get the current weather of a city.", json!({"town": s}))]),
    );
    let out = ok(&toolsmith_in(&reg, &["tools", "add", &d, "--merge"]));
    assert!(out.contains("`current_weather` merged into `get"), "{out}");
}

#[test]
fn schemas_and_examples_are_checked_whole_naming_the_file_the_tool_and_the_pointer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = dir.path().join("registry.db");
    let bad = write(
        &dir.path().join("shapes.json"),
        &json!({"tools": [{"name": "rectangleArea", "description": "Area of a rectangle.",
                "inputSchema": {"type": "object", "properties": {"size": {"type": "object", "properties": {"width": {"type": "float"}}}}}}]}),
    );
    for command in ["add", "import"] {
        let out = toolsmith_in(&reg, &["tools", command, &bad]);
        let e = stderr(&out);
        assert!(!out.status.success(), "{command}: {e}");
        assert!(
            e.contains(
                "shapes.json: tool `rectangleArea`: at /tools/0/inputSchema/properties/size/properties/width/type"
            ),
            "{command}: {e}"
        );
    }
    let example = write(
        &dir.path().join("double.json"),
        &json!({"name": "double", "version": "1.0.0", "description": "Double a number.",
                "input_schema": {"type": "object", "properties": {"n": {"type": "number"}}},
                "output_schema": {"type": "object"}, "examples": [{"input": {"n": "two"}, "output": {}}], "kind": "simulated"}),
    );
    let out = toolsmith_in(&reg, &["tools", "add", &example]);
    assert!(stderr(&out).contains("double.json: tool `double`: at /examples/0/input/n"), "{}", stderr(&out));
    let list = stdout_json(&toolsmith_in(&reg, &["tools", "list", "--json"]));
    assert!(list.as_array().expect("array").iter().all(|t| t["name"] != "rectangle_area" && t["name"] != "double"));
    assert!(ok(&toolsmith_in(&reg, &["tools", "doctor"])).contains("healthy"));
}

#[test]
fn import_reads_openai_and_mcp_exports_and_keeps_the_held_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = dir.path().join("registry.db");
    for format in ["openai", "mcp"] {
        let file = dir.path().join(format!("{format}.json"));
        ok(&toolsmith_in(&reg, &["tools", "export", "--format", format, "--out", file.to_str().expect("utf8")]));
        // Read back into the registry that wrote it: the bundled tools keep their components.
        let out = ok(&toolsmith_in(&reg, &["tools", "import", file.to_str().expect("utf8")]));
        assert!(out.contains("`calculator` is already registered as given"), "{format}: {out}");
        let call = ok(&toolsmith_in(&reg, &["call", "calculator", "--args", r#"{"expression": "6*7"}"#]));
        assert!(call.contains("42"), "{call}");
        // And into a new one, as interfaces (OpenAI) or whole manifests (MCP).
        let other = dir.path().join(format!("{format}.db"));
        let out = toolsmith_in(&other, &["tools", "import", file.to_str().expect("utf8")]);
        ok(&out);
        assert!(ok(&toolsmith_in(&other, &["tools", "doctor"])).contains("healthy"));
    }
}
