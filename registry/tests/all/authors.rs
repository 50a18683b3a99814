//! Tools people add: near-duplicates kept apart and reported, identical interfaces merged, other
//! systems' formats and names, schemas and examples checked whole at add, import and doctor.

use serde_json::{Value, json};
use toolsmith_contract::{NAME_MAX_LEN, ToolKind, ToolName};
use toolsmith_registry::{
    AddedTool, AuthorMerge, Definition, Format, Registered, Registry, RegistryError, read_definitions, snake_case_name,
};

use crate::{open, temp, tool};

fn definitions(file: &str, document: &Value) -> Vec<Definition> {
    read_definitions(file, &document.to_string()).expect("definitions")
}

fn add(r: &mut Registry, defs: Vec<Definition>, merge: AuthorMerge) -> Result<Vec<AddedTool>, RegistryError> {
    r.add_definitions(defs, merge, &mut |_, _| {})
}

/// Two providers' weather functions: descriptions alike (cosine above the threshold), names and
/// parameters not.
fn weather_pair() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_current_weather", "description": "Get the current weather in a city.",
          "parameters": {"type": "object", "properties": {"location": {"type": "string"}, "unit": {"enum": ["c", "f"]}}}}}
    ])
}

#[test]
fn an_authors_near_duplicate_is_kept_apart_and_reported() {
    let (_d, path) = temp();
    let mut r = open(&path);
    let out = add(&mut r, definitions("weather.json", &weather_pair()), AuthorMerge::SameInterface).expect("add");
    assert_eq!(out[0].outcome, Registered::Added { name: "get_weather".into() });
    assert_eq!(out[1].outcome, Registered::Added { name: "get_current_weather".into() });
    let near = out[1].near_duplicate.as_ref().expect("the close tool is reported");
    assert_eq!(near.name, "get_weather");
    assert!(near.similarity >= r.settings().merge_threshold, "{near:?}");
    assert_eq!((out[1].file.as_str(), out[1].pointer.as_str()), ("weather.json", "/1/function"));
    assert_eq!(r.len().expect("len"), 2);
    // SEARL's rule for agents' tools still merges them.
    let (_d2, path2) = temp();
    let mut searl = open(&path2);
    let tools = definitions("w.json", &weather_pair()).into_iter().map(|d| d.tool).collect();
    let outcomes = searl.register_many(tools, true).expect("register");
    assert!(matches!(&outcomes[1], Registered::Merged { into, .. } if into == "get_weather"), "{outcomes:?}");
}

#[test]
fn the_same_interface_merges_and_merge_asks_for_near_duplicates() {
    let (_d, path) = temp();
    let mut r = open(&path);
    add(&mut r, definitions("a.json", &weather_pair()[0]), AuthorMerge::SameInterface).expect("add");
    // The same function under another provider's name: merged, and the name resolves.
    let mut same = weather_pair()[0].clone();
    same["function"]["name"] = json!("weather_now");
    let out = add(&mut r, definitions("b.json", &same), AuthorMerge::SameInterface).expect("add");
    assert!(
        matches!(&out[0].outcome, Registered::Merged { name, into, .. } if name == "weather_now" && into == "get_weather"),
        "{out:?}"
    );
    assert_eq!(r.resolve("weather_now").expect("resolve").as_deref(), Some("get_weather"));
    // `--merge`: a near-duplicate merges too.
    let out = add(&mut r, definitions("c.json", &weather_pair()[1]), AuthorMerge::Similar).expect("add");
    assert!(matches!(&out[0].outcome, Registered::Merged { into, .. } if into == "get_weather"), "{out:?}");
    assert_eq!(r.len().expect("len"), 1);
    // `--no-merge`: even the same interface becomes its own tool.
    same["function"]["name"] = json!("weather_again");
    let out = add(&mut r, definitions("d.json", &same), AuthorMerge::Never).expect("add");
    assert_eq!(out[0].outcome, Registered::Added { name: "weather_again".into() });
}

#[test]
fn openai_lists_bare_functions_legacy_lists_and_mcp_lists_register_with_their_names_as_aliases() {
    let (_d, path) = temp();
    let mut r = open(&path);
    let params = json!({"type": "object", "properties": {"q": {"type": "string"}}});
    let mut defs = definitions(
        "openai.json",
        &json!([{"type": "function", "function": {"name": "getWeather", "description": "Weather forecast for a place.", "parameters": params}}]),
    );
    defs.extend(definitions(
        "bare.json",
        &json!({"name": "stock-price", "description": "Latest price of a stock ticker.", "parameters": params}),
    ));
    defs.extend(definitions(
        "legacy.json",
        &json!({"functions": [{"name": "translate_text", "description": "Translate text into another language."}]}),
    ));
    defs.extend(definitions(
        "mcp.json",
        &json!({"tools": [{"name": "files.read", "description": "Read a file from the project.", "inputSchema": params,
                           "outputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}},
                          {"name": "sendEmail", "description": "Send an email message.", "inputSchema": params}]}),
    ));
    let out = add(&mut r, defs, AuthorMerge::SameInterface).expect("add");
    let names: Vec<(&str, Option<&str>)> =
        out.iter().map(|t| (t.outcome.canonical(), t.original_name.as_deref())).collect();
    assert_eq!(
        names,
        [
            ("get_weather", Some("getWeather")),
            ("stock_price", Some("stock-price")),
            ("translate_text", None),
            ("files_read", Some("files.read")),
            ("send_email", Some("sendEmail")),
        ]
    );
    for (original, name) in
        [("getWeather", "get_weather"), ("stock-price", "stock_price"), ("files.read", "files_read")]
    {
        assert_eq!(r.resolve(original).expect("resolve").as_deref(), Some(name));
        assert_eq!(r.get(original).expect("get").name, name);
    }
    let email = r.get("sendEmail").expect("get");
    assert_eq!(email.manifest.output_schema, json!({"type": "object"}), "a missing output schema is an open object");
    assert_eq!(r.get("files_read").expect("get").manifest.output_schema["properties"]["text"]["type"], "string");
    assert_eq!(r.get("translate_text").expect("get").manifest.input_schema, json!({"type": "object"}));
    // Adding the same files again changes nothing.
    let again = definitions(
        "openai.json",
        &json!([{"type": "function", "function": {"name": "getWeather", "description": "Weather forecast for a place.", "parameters": params}}]),
    );
    let out = add(&mut r, again, AuthorMerge::SameInterface).expect("add again");
    assert_eq!(out[0].outcome, Registered::Unchanged { name: "get_weather".into() });
}

#[test]
fn our_mcp_export_comes_back_whole() {
    let (_d, path) = temp();
    let mut r = open(&path);
    let mut m = crate::manifest("word_count", "Count the words of a text.");
    m.examples = vec![serde_json::from_value(json!({"input": {"text": "a b"}, "output": {}})).expect("example")];
    let listed = json!({"tools": [m.to_mcp_tool()]});
    let out = add(&mut r, definitions("export.json", &listed), AuthorMerge::SameInterface).expect("add");
    assert_eq!(out[0].outcome, Registered::Added { name: "word_count".into() });
    assert_eq!(r.get("word_count").expect("get").manifest, m);
}

#[test]
fn a_nested_non_schema_type_is_refused_at_add_and_import_with_its_pointer() {
    let (_d, path) = temp();
    let mut r = open(&path);
    let bad = json!({"tools": [
        {"name": "fine", "description": "A fine tool.", "inputSchema": {"type": "object"}},
        {"name": "area", "description": "Area of a rectangle.", "inputSchema": {"type": "object",
          "properties": {"size": {"type": "object", "properties": {"width": {"type": "float"}}}}}}
    ]});
    let e = add(&mut r, definitions("shapes.json", &bad), AuthorMerge::SameInterface).expect_err("float");
    let RegistryError::Definitions(problems) = &e else { panic!("{e:?}") };
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].tool.as_deref(), Some("area"));
    assert_eq!(problems[0].pointer, "/tools/1/inputSchema/properties/size/properties/width/type");
    assert!(e.to_string().contains("shapes.json: tool `area`: at /tools/1/inputSchema/properties/size"), "{e}");
    assert_eq!(r.len().expect("len"), 0, "nothing of the batch was registered");
    // The library's own registration refuses it too.
    let m = definitions("shapes.json", &bad).remove(1).tool;
    assert!(r.register(m, false).is_err());

    // An export line holding such a manifest.
    let (_d2, path2) = temp();
    let mut source = open(&path2);
    source.register(tool("area", "Area of a rectangle."), false).expect("register");
    let mut export = Vec::new();
    source.export(&mut export).expect("export");
    let text: String = String::from_utf8(export)
        .expect("utf8")
        .lines()
        .map(|l| {
            let mut line: Value = serde_json::from_str(l).expect("json line");
            if line["type"] == "tool" {
                line["manifest"]["input_schema"]["properties"]["text"]["type"] = json!("float");
            }
            format!("{line}\n")
        })
        .collect();
    let e = r.import(&mut text.as_bytes()).expect_err("float in an import");
    assert!(e.to_string().contains("tool `area`: at /manifest/input_schema/properties/text/type"), "{e}");
    assert_eq!(r.len().expect("len"), 0);
}

#[test]
fn an_example_outside_its_schema_is_refused_at_add() {
    let (_d, path) = temp();
    let mut r = open(&path);
    let manifest = json!({
        "name": "double", "version": "1.0.0", "description": "Double a number.",
        "input_schema": {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]},
        "output_schema": {"type": "object", "properties": {"n": {"type": "number"}}},
        "examples": [{"input": {"n": 2}, "output": {"n": 4}}, {"input": {"n": "two"}, "output": {"n": 4}}],
        "kind": "simulated"
    });
    let e = add(&mut r, definitions("double.json", &manifest), AuthorMerge::SameInterface).expect_err("example");
    let RegistryError::Definitions(problems) = &e else { panic!("{e:?}") };
    assert_eq!(problems[0].pointer, "/examples/1/input/n", "{e}");
}

#[test]
fn doctor_reports_bad_schemas_and_examples_already_in_a_database() {
    let (_d, path) = temp();
    let mut r = open(&path);
    r.register_many(vec![tool("area", "Area of a rectangle."), tool("double", "Double a number.")], false)
        .expect("register");
    assert!(r.doctor().expect("doctor").problems.is_empty());
    drop(r);
    // Rows written before schemas were checked whole.
    let conn = rusqlite::Connection::open(&path).expect("sqlite");
    conn.execute(
        "UPDATE tools SET manifest = json_set(manifest, '$.input_schema.properties.text.type', 'float') WHERE name = 'area'",
        [],
    )
    .expect("raw update");
    conn.execute(
        r#"UPDATE tools SET manifest = json_set(manifest, '$.examples', json('[{"input": {"text": 3}, "output": {}}]')) WHERE name = 'double'"#,
        [],
    )
    .expect("raw update");
    drop(conn);
    let mut r = open(&path);
    let report = r.doctor().expect("doctor");
    assert_eq!(report.problems.len(), 2, "{report:?}");
    assert!(report.problems[0].starts_with("`area`: at /input_schema/properties/text/type: "), "{report:?}");
    assert!(report.problems[1].starts_with("`double`: at /examples/0/input/text: "), "{report:?}");
}

#[test]
fn one_name_defined_twice_differently_registers_nothing() {
    let (_d, path) = temp();
    let mut r = open(&path);
    let defs = definitions(
        "two.json",
        &json!([{"name": "getWeather", "description": "Weather now."}, {"name": "get-weather", "description": "Weather tomorrow."}]),
    );
    let e = add(&mut r, defs, AuthorMerge::SameInterface).expect_err("two interfaces, one name");
    assert!(e.to_string().contains("also defined, differently, by `getWeather`"), "{e}");
    assert_eq!(r.len().expect("len"), 0);
}

#[test]
fn a_directory_sized_batch_registers_in_one_call() {
    let (_d, path) = temp();
    let mut r = open(&path);
    let functions: Vec<Value> = (0..120)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool{i}Run"),
                   "description": format!("Runs job number {i} of batch {}.", i % 7),
                   "parameters": {"type": "object", "properties": {format!("arg{i}"): {"type": "integer"}}}}})
        })
        .collect();
    let mut seen = Vec::new();
    let out = r
        .add_definitions(definitions("many.json", &Value::Array(functions)), AuthorMerge::SameInterface, &mut |d, t| {
            seen.push((d, t))
        })
        .expect("add");
    assert_eq!(out.len(), 120);
    assert!(out.iter().all(|t| matches!(t.outcome, Registered::Added { .. })), "none merged by surprise");
    assert_eq!(r.len().expect("len"), 120);
    assert_eq!(seen.last(), Some(&(120, 120)));
    assert_eq!(r.resolve("tool7Run").expect("resolve").as_deref(), Some("tool7_run"));
}

// The formats and the name mapping on their own.
#[test]
fn other_systems_names_map_to_snake_case() {
    for (given, want) in [
        ("getWeather", "get_weather"),
        ("weather.get", "weather_get"),
        ("get-weather", "get_weather"),
        ("GetWeather", "get_weather"),
        ("HTTPServerStatus", "http_server_status"),
        ("v2Api", "v2_api"),
        ("__odd--name__", "odd_name"),
        ("3d.render", "tool_3d_render"),
    ] {
        assert_eq!(snake_case_name(given), want, "{given}");
        assert!(ToolName::new(snake_case_name(given)).is_ok());
    }
    let long = format!("a{}", "B".repeat(100));
    let mapped = snake_case_name(&long);
    assert!(mapped.len() <= NAME_MAX_LEN && ToolName::new(mapped.as_str()).is_ok(), "{mapped}");
    assert_ne!(mapped, snake_case_name(&format!("{long}c")));
    assert!(ToolName::new(snake_case_name("???")).is_ok());
}

#[test]
fn every_format_reads_with_pointers() {
    let f = json!({"name": "getWeather", "description": "Weather for a city.",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}});
    let list = json!([{"type": "function", "function": f}]);
    let defs = read_definitions("a.json", &list.to_string()).expect("openai list");
    assert_eq!(defs[0].tool.manifest.name.as_str(), "get_weather");
    assert_eq!(defs[0].original_name.as_deref(), Some("getWeather"));
    assert_eq!((defs[0].pointer.as_str(), defs[0].format), ("/0/function", Format::OpenAi));
    assert_eq!(defs[0].tool.manifest.kind, ToolKind::Simulated);
    assert_eq!(read_definitions("b.json", &f.to_string()).expect("bare")[0].pointer, "");
    let legacy = json!({"functions": [f]});
    assert_eq!(read_definitions("c.json", &legacy.to_string()).expect("legacy")[0].pointer, "/functions/0");
    let mcp = json!({"tools": [{"name": "weather.get", "description": "d", "inputSchema": {"type": "object"}}]});
    let defs = read_definitions("d.json", &mcp.to_string()).expect("mcp");
    assert_eq!(defs[0].tool.manifest.name.as_str(), "weather_get");
    assert_eq!(defs[0].tool.manifest.output_schema, json!({"type": "object"}));
    let lines = format!("{f}\n{}\n", json!({"name": "x", "description": "d"}));
    let defs = read_definitions("e.jsonl", &lines).expect("json lines");
    assert_eq!((defs.len(), defs[1].file.as_str()), (2, "e.jsonl:2"));
}

#[test]
fn problems_name_the_file_the_tool_and_the_pointer() {
    let bad = json!([{"type": "function", "function": {"name": "f", "description": "d",
                      "parameters": {"type": "object", "properties": {"x": {"type": "float"}}}}}]);
    let defs = read_definitions("a.json", &bad.to_string()).expect("shape is fine");
    let problem = defs[0].check().expect_err("float is not a JSON type");
    assert_eq!(problem.pointer, "/0/function/parameters/properties/x/type");
    assert!(problem.to_string().starts_with("a.json: tool `f`: at /0/function/parameters/properties/x/type"));
    let dict = json!({"name": "g", "description": "d", "parameters": {"type": "dict"}});
    let problems = read_definitions("b.json", &dict.to_string()).expect_err("dict is not object");
    assert_eq!(problems[0].pointer, "/parameters/type");
    let problems = read_definitions("c.json", "[1, {\"nothing\": 2}]").expect_err("not tools");
    assert_eq!(problems.iter().map(|p| p.pointer.as_str()).collect::<Vec<_>>(), ["/0", "/1"]);
}
