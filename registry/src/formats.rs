//! Tool definitions from elsewhere: Toolsmith manifests, OpenAI function lists (current, a bare
//! function object, and the legacy `{"functions": [...]}`) and MCP `tools/list` results, in one
//! JSON document or as JSON lines, read into [`Definition`]s that [`Registry::add_definitions`]
//! checks and registers.
//!
//! Names that MCP and OpenAI allow but a tool name does not (`getWeather`, `weather.get`,
//! `get-weather`) are mapped to snake_case; the original is kept so that it can become an alias,
//! because a client that read the tool elsewhere calls it by that name.
//!
//! [`Registry::add_definitions`]: crate::Registry::add_definitions

use std::fmt;

use serde::Serialize;
use serde_json::{Value, json};
use toolsmith_contract::validate::{ManifestProblem, check_manifest};
use toolsmith_contract::{Manifest, ManifestError, NAME_MAX_LEN, ToolKind, ToolName};

use crate::store::NewTool;

/// Which format a definition was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// A Toolsmith manifest (`.json`), or a component's own.
    Manifest,
    /// An OpenAI function definition (wrapped in `{"type": "function"}`, bare, or legacy).
    OpenAi,
    /// An MCP `Tool` object, as `tools/list` lists them.
    Mcp,
}

/// A tool read from a file, not yet checked against the meta-schema nor registered.
#[derive(Debug, Clone)]
pub struct Definition {
    /// The tool, under its (possibly mapped) name.
    pub tool: NewTool,
    /// The name the file gave it, when that is not a tool name and was mapped; it becomes an alias.
    pub original_name: Option<String>,
    /// The file it came from (`path:line` for JSON lines).
    pub file: String,
    /// JSON pointer of the definition inside its document (`""` for the whole document).
    pub pointer: String,
    /// The format it was written in.
    pub format: Format,
    /// JSON pointers (inside the document) of the input schema, output schema and examples, so
    /// that a problem in them is reported where the author can find it.
    fields: [String; 3],
}

/// A definition that cannot be registered: the file, the tool and the JSON pointer of what is
/// wrong, with what is wrong.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DefinitionProblem {
    /// The file (`path:line` for JSON lines).
    pub file: String,
    /// The tool's name as the file gives it, when it has one.
    pub tool: Option<String>,
    /// JSON pointer inside the file's document (`""` for the root).
    pub pointer: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for DefinitionProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(tool) = &self.tool {
            write!(f, ": tool `{tool}`")?;
        }
        let pointer = if self.pointer.is_empty() { "the root" } else { &self.pointer };
        write!(f, ": at {pointer}: {}", self.message)
    }
}

impl Definition {
    /// A tool that did not come from a definition file (a component): its manifest's own fields.
    pub fn from_tool(tool: NewTool, file: impl Into<String>) -> Definition {
        Definition {
            tool,
            original_name: None,
            file: file.into(),
            pointer: String::new(),
            format: Format::Manifest,
            fields: ["/input_schema".into(), "/output_schema".into(), "/examples".into()],
        }
    }

    /// The name the file gives the tool.
    pub fn given_name(&self) -> &str {
        self.original_name.as_deref().unwrap_or(self.tool.manifest.name.as_str())
    }

    /// A problem of this definition at `pointer` (inside the document).
    pub(crate) fn problem(&self, pointer: String, message: impl Into<String>) -> DefinitionProblem {
        DefinitionProblem {
            file: self.file.clone(),
            tool: Some(self.given_name().to_string()),
            pointer,
            message: message.into(),
        }
    }

    /// Checks the schemas against the JSON Schema meta-schema and the examples against the schemas.
    pub fn check(&self) -> Result<(), DefinitionProblem> {
        check_manifest(&self.tool.manifest).map_err(|p| {
            let pointer = problem_pointer(&p, &self.fields);
            self.problem(pointer, p.to_string())
        })
    }
}

/// The first problem of a stored or exported manifest's schemas and examples, as (JSON pointer
/// under `base`, the manifest's own pointer, what is wrong).
pub(crate) fn manifest_problem(manifest: &Manifest, base: &str) -> Option<(String, String)> {
    let fields = [format!("{base}/input_schema"), format!("{base}/output_schema"), format!("{base}/examples")];
    check_manifest(manifest).err().map(|p| (problem_pointer(&p, &fields), p.to_string()))
}

/// Where a [`ManifestProblem`] lies inside a document whose schema and example fields are at
/// `fields` (input schema, output schema, examples).
fn problem_pointer(problem: &ManifestProblem, fields: &[String; 3]) -> String {
    match problem {
        ManifestProblem::Schema { which, pointer, .. } => {
            let at = if *which == "input_schema" { &fields[0] } else { &fields[1] };
            format!("{at}{pointer}")
        }
        ManifestProblem::Example { index, part, pointer, .. } => format!("{}/{index}/{part}{pointer}", fields[2]),
        _ => fields[0].clone(),
    }
}

/// Reads every tool definition of one file's text: one JSON document (a manifest, an OpenAI
/// function or list of them, `{"functions": [...]}`, an MCP `tools/list` result or an array of MCP
/// tools) or JSON lines of those. Every problem is returned, not only the first.
pub fn read_definitions(file: &str, text: &str) -> Result<Vec<Definition>, Vec<DefinitionProblem>> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    match serde_json::from_str::<Value>(text) {
        Ok(document) => read_document(file, &document, &mut out, &mut problems),
        // More than one line that does not parse as a whole: JSON lines, one document a line.
        Err(_) if text.trim().lines().count() > 1 => {
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let at = format!("{file}:{}", i + 1);
                match serde_json::from_str::<Value>(line) {
                    Ok(document) => read_document(&at, &document, &mut out, &mut problems),
                    Err(e) => problems.push(file_problem(&at, "", format!("not JSON: {e}"))),
                }
            }
        }
        Err(e) => problems.push(file_problem(file, "", format!("not JSON: {e}"))),
    }
    if problems.is_empty() { Ok(out) } else { Err(problems) }
}

fn file_problem(file: &str, pointer: &str, message: impl Into<String>) -> DefinitionProblem {
    DefinitionProblem { file: file.to_string(), tool: None, pointer: pointer.to_string(), message: message.into() }
}

fn read_document(file: &str, document: &Value, out: &mut Vec<Definition>, problems: &mut Vec<DefinitionProblem>) {
    let mut element = |value: &Value, pointer: String| match read_element(file, value, pointer) {
        Ok(definition) => out.push(definition),
        Err(problem) => problems.push(problem),
    };
    match document {
        Value::Array(items) => items.iter().enumerate().for_each(|(i, v)| element(v, format!("/{i}"))),
        Value::Object(o) if !o.contains_key("name") => {
            // `{"tools": [...]}` (MCP `tools/list`, also OpenAI's `tools` request field) or the
            // legacy `{"functions": [...]}`.
            let list = ["tools", "functions"].into_iter().find_map(|k| o.get(k).map(|v| (k, v)));
            match list {
                Some((key, Value::Array(items))) => {
                    items.iter().enumerate().for_each(|(i, v)| element(v, format!("/{key}/{i}")))
                }
                Some((key, _)) => problems.push(file_problem(file, &format!("/{key}"), "expected an array of tools")),
                None => element(document, String::new()),
            }
        }
        _ => element(document, String::new()),
    }
}

/// One tool definition at `pointer`, in whichever format it is written.
fn read_element(file: &str, value: &Value, pointer: String) -> Result<Definition, DefinitionProblem> {
    let Some(object) = value.as_object() else {
        return Err(file_problem(file, &pointer, "expected a tool definition (a JSON object)"));
    };
    if object.get("type").and_then(Value::as_str) == Some("function") && object.contains_key("function") {
        let function = &value["function"];
        return openai(file, function, format!("{pointer}/function"));
    }
    if object.contains_key("inputSchema") {
        return mcp(file, value, pointer);
    }
    if object.contains_key("input_schema") {
        return manifest(file, value, pointer);
    }
    if object.contains_key("name") && !object.contains_key("type") {
        return openai(file, value, pointer);
    }
    Err(file_problem(
        file,
        &pointer,
        "not a tool definition: expected a Toolsmith manifest, an OpenAI function or an MCP tool",
    ))
}

/// The tool name for `given`, and `given` itself when it had to be mapped.
fn name_of(file: &str, value: &Value, pointer: &str) -> Result<(String, Option<String>), DefinitionProblem> {
    let given = match value.get("name") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        _ => return Err(file_problem(file, &format!("{pointer}/name"), "the tool has no name")),
    };
    if ToolName::new(given.as_str()).is_ok() {
        return Ok((given, None));
    }
    Ok((snake_case_name(&given), Some(given)))
}

/// A tool name for any name another system allows: camelCase and PascalCase split into words,
/// every other character a word break, lowercase; a leading digit gets a `tool_` prefix, and a name
/// too long is cut with a hash of the whole, so that two long names stay two tools.
pub fn snake_case_name(given: &str) -> String {
    let chars: Vec<char> = given.chars().collect();
    let mut words = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            words.push('_');
            continue;
        }
        if c.is_ascii_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            // `getWeather` -> get_weather; `HTTPServer` -> http_server; `v2Api` -> v2_api.
            if prev.is_ascii_lowercase() || prev.is_ascii_digit() || (prev.is_ascii_uppercase() && next_lower) {
                words.push('_');
            }
        }
        words.push(c.to_ascii_lowercase());
    }
    let mut name = words.split('_').filter(|w| !w.is_empty()).collect::<Vec<_>>().join("_");
    let hash = || blake3::hash(given.as_bytes()).to_hex()[..8].to_string();
    if name.is_empty() {
        return format!("tool_{}", hash());
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert_str(0, "tool_");
    }
    if name.len() > NAME_MAX_LEN {
        name.truncate(NAME_MAX_LEN - 9);
        let kept = name.trim_end_matches('_').len();
        name.truncate(kept);
        name = format!("{name}_{}", hash());
    }
    name
}

/// An OpenAI function (`{name, description, parameters}`): an interface only, so a simulated tool.
fn openai(file: &str, function: &Value, pointer: String) -> Result<Definition, DefinitionProblem> {
    let (name, original_name) = name_of(file, function, &pointer)?;
    // OpenAI lets a function without arguments leave `parameters` out (or empty).
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object"}),
        Some(Value::Object(o)) if o.is_empty() => json!({"type": "object"}),
        Some(p) => p.clone(),
    };
    let value = json!({
        "name": name,
        "version": "0.0.0",
        "description": function.get("description").cloned().unwrap_or(json!("")),
        "input_schema": parameters,
        // OpenAI has no slot for the result.
        "output_schema": {"type": "object"},
        "kind": ToolKind::Simulated,
    });
    let fields = [format!("{pointer}/parameters"), pointer.clone(), format!("{pointer}/examples")];
    build(file, Manifest::from_value(value), &name, pointer, original_name, Format::OpenAi, fields)
}

/// An MCP `Tool` object. One that `tools export --format mcp` wrote carries its version, kind,
/// examples and provenance in `_meta`; one from another server is an interface only (simulated).
fn mcp(file: &str, tool: &Value, pointer: String) -> Result<Definition, DefinitionProblem> {
    let (name, original_name) = name_of(file, tool, &pointer)?;
    let mut tool = tool.clone();
    tool["name"] = json!(name);
    if tool.get("_meta").and_then(|m| m.get("toolsmith/kind")).is_none() {
        let meta = tool.as_object_mut().map(|o| o.entry("_meta").or_insert_with(|| json!({})));
        if let Some(Value::Object(meta)) = meta {
            meta.insert("toolsmith/kind".into(), json!(ToolKind::Simulated));
        }
    }
    let fields = [
        format!("{pointer}/inputSchema"),
        format!("{pointer}/outputSchema"),
        format!("{pointer}/_meta/toolsmith~1examples"),
    ];
    build(file, Manifest::from_mcp_tool(&tool), &name, pointer, original_name, Format::Mcp, fields)
}

/// A Toolsmith manifest; only its name may need mapping.
fn manifest(file: &str, value: &Value, pointer: String) -> Result<Definition, DefinitionProblem> {
    let (name, original_name) = name_of(file, value, &pointer)?;
    let mut value = value.clone();
    value["name"] = json!(name);
    let fields = [format!("{pointer}/input_schema"), format!("{pointer}/output_schema"), format!("{pointer}/examples")];
    build(file, Manifest::from_value(value), &name, pointer, original_name, Format::Manifest, fields)
}

/// The definition of a parsed manifest, or its problem at the field it concerns.
fn build(
    file: &str,
    manifest: Result<Manifest, ManifestError>,
    name: &str,
    pointer: String,
    original_name: Option<String>,
    format: Format,
    fields: [String; 3],
) -> Result<Definition, DefinitionProblem> {
    let manifest = manifest.map_err(|e| manifest_error(file, &original_name, name, &pointer, &fields, e))?;
    Ok(Definition { tool: NewTool::new(manifest), original_name, file: file.to_string(), pointer, format, fields })
}

/// A manifest's shape problem, at the field it concerns.
fn manifest_error(
    file: &str,
    original_name: &Option<String>,
    name: &str,
    pointer: &str,
    fields: &[String; 3],
    e: ManifestError,
) -> DefinitionProblem {
    let at = match &e {
        ManifestError::InvalidVersion { .. } => format!("{pointer}/version"),
        ManifestError::EmptyDescription => format!("{pointer}/description"),
        ManifestError::NotAnObjectSchema { which, .. } => {
            let schema = if *which == "input_schema" { &fields[0] } else { &fields[1] };
            format!("{schema}/type")
        }
        _ => pointer.to_string(),
    };
    DefinitionProblem {
        file: file.to_string(),
        tool: Some(original_name.clone().unwrap_or_else(|| name.to_string())),
        pointer: at,
        message: e.to_string(),
    }
}
