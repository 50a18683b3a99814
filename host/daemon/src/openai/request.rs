//! `POST /v1/chat/completions` requests as OpenAI clients send them: checked field by field, and
//! turned into what the policy reads (the agent's trace grammar) and what it may write (a
//! [`TurnGrammar`]).
//!
//! Nothing reaches the policy until the whole request is known to be good: an unknown field, a
//! value out of range, a malformed tool or a message that does not fit the conversation is a 400
//! that names the item.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use toolsmith_agent::backend::{GenerateOptions, Message, plain};
use toolsmith_agent::function_calling::{self, Function};
use toolsmith_policy::constrain::JsonSchemaGrammar;
use toolsmith_policy::{CallRules, TurnGrammar};

/// Top-level fields the endpoint takes; any other is refused by name. `user` and `metadata` are
/// labels with no effect on the answer.
pub const ACCEPTED_FIELDS: &[&str] = &[
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "n",
    "seed",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "user",
    "metadata",
];

/// Choices one request may ask for.
pub const MAX_CHOICES: usize = 16;
/// Tokens one choice may ask for.
pub const MAX_TOKENS: usize = 8192;
/// Stop strings at most.
const MAX_STOPS: usize = 16;
pub use toolsmith_agent::function_calling::{CLOSE, OPEN, call_text};

/// A client's mistake, as a message that names the item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);

impl From<String> for BadRequest {
    fn from(message: String) -> Self {
        BadRequest(message)
    }
}

impl From<&str> for BadRequest {
    fn from(message: &str) -> Self {
        BadRequest(message.to_string())
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// The sampling fields both endpoints take.
#[derive(Debug, Default, Deserialize)]
pub struct SamplingFields {
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(default)]
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    /// vLLM's "no top-k" is -1.
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    repetition_penalty: Option<f64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    seed: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Raw {
    messages: Vec<Value>,
    #[serde(flatten)]
    sampling: SamplingFields,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    response_format: Option<Value>,
    #[serde(default)]
    n: Option<usize>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// One function the client lists.
#[derive(Debug, Clone)]
pub struct Tool {
    /// The function's name, as calls must give it.
    pub name: String,
    /// What the function does, shown to the model in the system prompt.
    pub description: String,
    /// The JSON Schema of the arguments.
    pub parameters: Value,
    /// Whether calls must be decoded under the parameters' grammar (a 400 when it cannot be).
    pub strict: bool,
    /// The parameters as a validator, for calls decoded without the grammar.
    pub validator: Arc<jsonschema::Validator>,
}

impl Tool {
    /// The tool as the shared rendering takes it.
    pub fn function(&self) -> Function<'_> {
        Function { name: &self.name, description: &self.description, parameters: &self.parameters }
    }
}

/// What a turn may do with the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// No calls (`"none"`, or no tools listed).
    None,
    /// Calls or text, as the model decides (`"auto"`, the default with tools).
    Auto,
    /// At least one call (`"required"`).
    Required,
    /// A call of this tool (`{"type": "function", "function": {"name": ...}}`).
    Named(String),
}

/// A checked request.
#[derive(Debug)]
pub struct ChatRequest {
    /// The conversation in the trace grammar, content marked as plain text.
    pub messages: Vec<Message>,
    /// The functions the client lists, checked.
    pub tools: Vec<Tool>,
    /// What the turn may do with them (`tool_choice`).
    pub choice: Choice,
    /// What each choice's turn may be.
    pub grammar: Option<Arc<TurnGrammar>>,
    /// How to sample (256 tokens unless `max_tokens` says otherwise; stops at an observation
    /// when tools are listed).
    pub options: GenerateOptions,
    /// Choices to answer, 1 to [`MAX_CHOICES`].
    pub n: usize,
    /// Whether the answer streams as server-sent events.
    pub stream: bool,
    /// Whether a stream ends with a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Whether the sampled tokens' log-probs are wanted.
    pub logprobs: bool,
}

impl ChatRequest {
    /// The listed tool called `name`.
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }
}

/// Whether `name` is a function name OpenAI clients send: letters, digits, `_`, `-` and `.`
/// (dotted names such as `math.factorial` are common in function-calling benchmarks), 1 to 64.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// A prompt of `/v1/completions`: text, or the token ids RL trainers send.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text, tokenized by the served policy's tokenizer.
    Text(String),
    /// Token ids, taken as they are.
    Ids(Vec<i64>),
}

#[derive(Debug, Deserialize)]
struct RawCompletion {
    // `model` and other fields are accepted and ignored, as vLLM does: the answer names the
    // checkpoint that is served.
    prompt: Prompt,
    #[serde(flatten)]
    sampling: SamplingFields,
    /// `true` or a count (OpenAI's legacy form): the sampled tokens' log-probs are returned either
    /// way; alternatives are not.
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    return_token_ids: bool,
}

/// A checked `/v1/completions` request.
#[derive(Debug)]
pub struct CompletionRequest {
    /// What to continue.
    pub prompt: Prompt,
    /// How to sample (16 tokens unless `max_tokens` says otherwise).
    pub options: GenerateOptions,
    /// Whether the sampled tokens' log-probs are wanted.
    pub logprobs: bool,
    /// Whether the prompt's and the output's token ids are wanted.
    pub return_token_ids: bool,
}

/// Parses and checks a `/v1/completions` body.
pub fn parse_completion(body: &[u8]) -> Result<CompletionRequest, BadRequest> {
    let raw: RawCompletion = serde_json::from_slice(body).map_err(|e| format!("invalid request body: {e}"))?;
    Ok(CompletionRequest {
        options: raw.sampling.options(16)?,
        prompt: raw.prompt,
        logprobs: matches!(raw.logprobs, Some(Value::Bool(true) | Value::Number(_))),
        return_token_ids: raw.return_token_ids,
    })
}

/// Parses and checks a request body.
pub fn parse(body: &[u8]) -> Result<ChatRequest, BadRequest> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("invalid request body: {e}"))?;
    let Some(fields) = value.as_object() else { return Err("the request body must be a JSON object".into()) };
    if let Some(unknown) = fields.keys().find(|k| !ACCEPTED_FIELDS.contains(&k.as_str())) {
        return Err(BadRequest(format!(
            "the field `{unknown}` is not supported by this server (accepted: {})",
            ACCEPTED_FIELDS.join(", ")
        )));
    }
    let raw: Raw = serde_json::from_value(value).map_err(|e| format!("invalid request body: {e}"))?;
    if raw.messages.is_empty() {
        return Err("messages is empty".into());
    }
    let n = raw.n.unwrap_or(1);
    if !(1..=MAX_CHOICES).contains(&n) {
        return Err(BadRequest(format!("n is {n}; this server answers 1 to {MAX_CHOICES} choices")));
    }
    if let Some(k) = raw.top_logprobs.filter(|&k| k > 0) {
        return Err(BadRequest(format!(
            "top_logprobs {k} is not supported: only the sampled token's log-prob is reported (logprobs: true)"
        )));
    }
    if raw.stream_options.is_some() && raw.stream != Some(true) {
        return Err("stream_options is only allowed with stream: true".into());
    }
    let options = raw.sampling.options(256)?;
    let tools = tools(raw.tools.as_deref().unwrap_or_default())?;
    let choice = choice(raw.tool_choice.as_ref(), &tools)?;
    let parallel = raw.parallel_tool_calls.unwrap_or(true);
    let structured = match &raw.response_format {
        None => None,
        Some(format) => response_format(format)?,
    };
    if structured.is_some() && !tools.is_empty() && choice != Choice::None {
        return Err(
            "response_format together with tools is not supported: send tool_choice \"none\" or no tools".into()
        );
    }
    let grammar = match structured {
        Some(g) => Some(Arc::new(TurnGrammar::Json(g))),
        None if tools.is_empty() => None,
        None => Some(Arc::new(TurnGrammar::Calls(call_rules(&tools, &choice, parallel)?))),
    };
    let messages = messages(&raw.messages, &tools)?;
    let mut options = options;
    if !tools.is_empty() {
        // A turn ends before an observation: results come from the client, never the model.
        options.stop.push("<observation>".into());
    }
    Ok(ChatRequest {
        messages,
        tools,
        choice,
        grammar,
        options,
        n,
        stream: raw.stream.unwrap_or(false),
        include_usage: raw.stream_options.is_some_and(|o| o.include_usage),
        logprobs: raw.logprobs.unwrap_or(false),
    })
}

impl SamplingFields {
    /// The generation options, `default_max` tokens unless asked otherwise; every value in its
    /// range or a 400 (never a silent clamp).
    pub fn options(&self, default_max: usize) -> Result<GenerateOptions, BadRequest> {
        sampling(self, default_max)
    }
}

/// The sampling settings, each in its range.
fn sampling(raw: &SamplingFields, default_max: usize) -> Result<GenerateOptions, BadRequest> {
    if raw.max_tokens.is_some() && raw.max_completion_tokens.is_some() {
        return Err("give max_tokens or max_completion_tokens, not both".into());
    }
    let max_tokens = raw.max_completion_tokens.or(raw.max_tokens).unwrap_or(default_max);
    if !(1..=MAX_TOKENS).contains(&max_tokens) {
        return Err(BadRequest(format!("max_tokens is {max_tokens}; it must be 1 to {MAX_TOKENS}")));
    }
    let temperature = raw.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(BadRequest(format!("temperature {temperature} is outside [0, 2]")));
    }
    let top_p = raw.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(BadRequest(format!("top_p {top_p} is outside (0, 1]")));
    }
    let top_k = match raw.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => return Err(BadRequest(format!("top_k {k} must be positive (or -1 or 0 for none)"))),
    };
    let repetition_penalty = raw.repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty > 0.0 && repetition_penalty.is_finite()) {
        return Err(BadRequest(format!("repetition_penalty {repetition_penalty} must be above 0")));
    }
    let stop = match &raw.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOPS {
        return Err(BadRequest(format!("{} stop strings; at most {MAX_STOPS}", stop.len())));
    }
    if let Some(i) = stop.iter().position(String::is_empty) {
        return Err(BadRequest(format!("stop[{i}] is empty")));
    }
    Ok(GenerateOptions {
        max_tokens,
        temperature,
        top_p,
        top_k,
        repetition_penalty,
        stop,
        seed: raw.seed.unwrap_or(GenerateOptions::default().seed),
        stop_loops: false,
    })
}

fn tools(raw: &[Value]) -> Result<Vec<Tool>, BadRequest> {
    let mut out: Vec<Tool> = Vec::with_capacity(raw.len());
    for (i, tool) in raw.iter().enumerate() {
        let at = format!("tools[{i}]");
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(BadRequest(format!("{at}.type must be \"function\"")));
        }
        let Some(function) = tool.get("function").and_then(Value::as_object) else {
            return Err(BadRequest(format!("{at}.function must be an object")));
        };
        let Some(name) = function.get("name").and_then(Value::as_str) else {
            return Err(BadRequest(format!("{at}.function.name must be a string")));
        };
        if !valid_name(name) {
            return Err(BadRequest(format!(
                "{at}.function.name `{name}` must be 1 to 64 letters, digits, `_`, `-` or `.`"
            )));
        }
        if let Some(j) = out.iter().position(|t| t.name == name) {
            return Err(BadRequest(format!("{at}: the name `{name}` is already tools[{j}]'s")));
        }
        let description = match function.get("description") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(d)) => d.clone(),
            Some(_) => return Err(BadRequest(format!("{at}.function.description must be a string"))),
        };
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(BadRequest(format!("{at}.function.parameters must be a JSON Schema object"))),
        };
        if parameters.get("type").is_some_and(|t| t != "object") {
            return Err(BadRequest(format!("{at}.function.parameters must describe an object (\"type\": \"object\")")));
        }
        let validator = jsonschema::validator_for(&parameters)
            .map_err(|e| format!("{at}.function.parameters is not a valid JSON Schema: {e}"))?;
        let strict = match function.get("strict") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(BadRequest(format!("{at}.function.strict must be a boolean"))),
        };
        if let Some(key) =
            function.keys().find(|k| !["name", "description", "parameters", "strict"].contains(&k.as_str()))
        {
            return Err(BadRequest(format!("{at}.function.{key} is not a field of a function")));
        }
        out.push(Tool { name: name.to_string(), description, parameters, strict, validator: Arc::new(validator) });
    }
    Ok(out)
}

fn choice(raw: Option<&Value>, tools: &[Tool]) -> Result<Choice, BadRequest> {
    let choice = match raw {
        None | Some(Value::Null) => return Ok(if tools.is_empty() { Choice::None } else { Choice::Auto }),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(BadRequest(format!(
                    "tool_choice `{other}` is not one of none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                )));
            }
        },
        Some(Value::Object(o)) => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => Choice::Named(name.to_string()),
                _ => return Err("tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}".into()),
            }
        }
        Some(_) => return Err("tool_choice must be a string or an object".into()),
    };
    if tools.is_empty() && choice != Choice::None {
        return Err("tool_choice needs tools".into());
    }
    if let Choice::Named(name) = &choice
        && !tools.iter().any(|t| &t.name == name)
    {
        let listed: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        return Err(BadRequest(format!("tool_choice names `{name}`, which is not in tools ({})", listed.join(", "))));
    }
    Ok(choice)
}

/// The schema of one call to any of `tools`, as the agent writes calls.
fn call_schema(tools: &[&Tool]) -> Value {
    let functions: Vec<Function<'_>> = tools.iter().map(|t| t.function()).collect();
    function_calling::call_schema(&functions)
}

/// The call rules of `choice`. A forced call (`required`, a named tool) and a strict tool are
/// decoded under their schemas, so their grammars must compile; under `auto` the calls are
/// decoded under the grammar whenever every tool's compiles, else left free and checked after.
fn call_rules(tools: &[Tool], choice: &Choice, parallel: bool) -> Result<CallRules, BadRequest> {
    let max = if parallel { usize::MAX } else { 1 };
    let compiled = |t: &Tool| JsonSchemaGrammar::compile(&t.parameters).map(|_| ());
    for t in tools.iter().filter(|t| t.strict) {
        compiled(t).map_err(|e| {
            format!("tools: `{}` is strict, but its parameters cannot be decoded under a grammar: {e}", t.name)
        })?;
    }
    let grammar = |listed: Vec<&Tool>| JsonSchemaGrammar::compile(&call_schema(&listed)).map_err(|e| e.to_string());
    Ok(match choice {
        Choice::None => CallRules::new(None, true, 0, 0),
        // The grammar of every tool compiles exactly when each tool's does.
        Choice::Auto => CallRules::new(grammar(tools.iter().collect()).ok(), true, 0, max),
        Choice::Required => {
            for t in tools {
                compiled(t).map_err(|e| {
                    format!("tool_choice required: `{}`'s parameters cannot be decoded under a grammar: {e}", t.name)
                })?;
            }
            CallRules::new(Some(grammar(tools.iter().collect())?), false, 1, max)
        }
        Choice::Named(name) => {
            let tool: Vec<&Tool> = tools.iter().filter(|t| &t.name == name).collect();
            for t in &tool {
                compiled(t).map_err(|e| {
                    format!("tool_choice `{name}`: its parameters cannot be decoded under a grammar: {e}")
                })?;
            }
            // A named choice is one call of that tool, as OpenAI answers it.
            CallRules::new(Some(grammar(tool)?), false, 1, 1)
        }
    })
}

fn response_format(format: &Value) -> Result<Option<JsonSchemaGrammar>, BadRequest> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(JsonSchemaGrammar::any_object())),
        Some("json_schema") => {
            let Some(schema) = format.pointer("/json_schema/schema") else {
                return Err("response_format.json_schema.schema is missing".into());
            };
            jsonschema::validator_for(schema)
                .map_err(|e| format!("response_format.json_schema.schema is not a valid JSON Schema: {e}"))?;
            JsonSchemaGrammar::compile(schema)
                .map(Some)
                .map_err(|e| BadRequest(format!("response_format.json_schema.schema: {e}")))
        }
        _ => Err("response_format.type must be text, json_object or json_schema".into()),
    }
}

/// A message's text: a string, a list of text parts, or nothing.
fn text_of(content: Option<&Value>, at: &str) -> Result<Option<String>, BadRequest> {
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some(other), _) if other != "text" => {
                        return Err(BadRequest(format!(
                            "{at}.content[{j}] is a `{other}` part; this server reads text parts only"
                        )));
                    }
                    _ => {
                        return Err(BadRequest(format!(
                            "{at}.content[{j}] must be {{\"type\": \"text\", \"text\": ...}}"
                        )));
                    }
                }
            }
            Ok(Some(text))
        }
        Some(_) => Err(BadRequest(format!("{at}.content must be a string, a list of text parts, or null"))),
    }
}

/// The system prompt's tool section: the agent's call instructions and its listing.
pub fn tool_section(tools: &[Tool]) -> String {
    let functions: Vec<Function<'_>> = tools.iter().map(Tool::function).collect();
    function_calling::tool_section(&functions)
}

/// The conversation in the trace grammar. System and developer messages are the system prompt
/// (the tool listing joins the first, or opens the conversation); an assistant's calls become
/// `<tool_call>` blocks; the `tool` messages after them one user turn of `<observation>`s, each
/// next to its call's name. Clients' text is marked plain, so no tag or control token in it is
/// read as one.
fn messages(raw: &[Value], tools: &[Tool]) -> Result<Vec<Message>, BadRequest> {
    let mut out: Vec<Message> = Vec::with_capacity(raw.len() + 1);
    // Call ids of the latest assistant turn, with their names, not yet answered.
    let mut pending: HashMap<String, String> = HashMap::new();
    // Observations of the tool messages in a row, flushed as one user turn.
    let mut observations: Vec<String> = Vec::new();
    let flush = |observations: &mut Vec<String>, out: &mut Vec<Message>| {
        if !observations.is_empty() {
            out.push(Message::user(observations.join("\n")));
            observations.clear();
        }
    };
    let mut listed = tools.is_empty();
    for (i, m) in raw.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(BadRequest(format!("{at}.role must be a string")));
        };
        let content = text_of(m.get("content"), &at)?;
        if role != "tool" {
            flush(&mut observations, &mut out);
        }
        match role {
            "system" | "developer" => {
                let mut text = plain(content.as_deref().unwrap_or_default());
                if !listed {
                    text = format!("{text}\n\n{}", tool_section(tools));
                    listed = true;
                }
                out.push(Message::system(text));
            }
            "user" => {
                let Some(text) = content else { return Err(BadRequest(format!("{at}.content is missing"))) };
                out.push(Message::user(plain(&text)));
            }
            "assistant" => {
                // The model's own words (trace tags included) read as it wrote them.
                let mut text = content.clone().unwrap_or_default();
                pending.clear();
                let calls = match m.get("tool_calls") {
                    None | Some(Value::Null) => &[][..],
                    Some(Value::Array(calls)) => calls.as_slice(),
                    Some(_) => return Err(BadRequest(format!("{at}.tool_calls must be a list"))),
                };
                for (j, call) in calls.iter().enumerate() {
                    let at = format!("{at}.tool_calls[{j}]");
                    let id = call.get("id").and_then(Value::as_str).ok_or(format!("{at}.id must be a string"))?;
                    let name = call
                        .pointer("/function/name")
                        .and_then(Value::as_str)
                        .ok_or(format!("{at}.function.name must be a string"))?;
                    let arguments = call
                        .pointer("/function/arguments")
                        .and_then(Value::as_str)
                        .ok_or(format!("{at}.function.arguments must be a string"))?;
                    let arguments: Value = serde_json::from_str(arguments)
                        .map_err(|e| format!("{at}.function.arguments is not JSON: {e}"))?;
                    if !arguments.is_object() {
                        return Err(BadRequest(format!("{at}.function.arguments must be a JSON object")));
                    }
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&call_text(name, &arguments));
                    pending.insert(id.to_string(), name.to_string());
                }
                if content.is_none() && calls.is_empty() {
                    return Err(BadRequest(format!("{at} has neither content nor tool_calls")));
                }
                out.push(Message::assistant(text));
            }
            "tool" => {
                let Some(id) = m.get("tool_call_id").and_then(Value::as_str) else {
                    return Err(BadRequest(format!("{at}.tool_call_id must be a string")));
                };
                let Some(name) = pending.remove(id) else {
                    return Err(BadRequest(format!(
                        "{at}: tool_call_id `{id}` matches no unanswered call of the assistant message before it"
                    )));
                };
                let text = content.unwrap_or_default();
                // A result that is JSON is shown as JSON, as the agent's own observations are.
                let result = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
                observations.push(function_calling::observation_text(&name, &result));
            }
            other => {
                return Err(BadRequest(format!(
                    "{at}.role `{other}` is not one of system, developer, user, assistant, tool"
                )));
            }
        }
    }
    flush(&mut observations, &mut out);
    if !listed {
        out.insert(0, Message::system(format!("{} {}", function_calling::PREAMBLE, tool_section(tools))));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Result<ChatRequest, BadRequest> {
        parse(body.to_string().as_bytes())
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "getWeather", "description": "Weather now.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn bad_requests_name_the_item() {
        let user = json!([{"role": "user", "content": "hi"}]);
        let cases = [
            (json!({"messages": user, "frobnicate": 1}), "frobnicate"),
            (json!({"messages": user, "n": 1000}), "n is 1000"),
            (json!({"messages": user, "top_p": 0}), "top_p"),
            (json!({"messages": user, "max_tokens": 0}), "max_tokens"),
            (json!({"messages": user, "stop": ""}), "stop[0]"),
            (json!({"messages": user, "repetition_penalty": 0}), "repetition_penalty"),
            (json!({"messages": user, "tools": [weather(), weather()]}), "tools[1]"),
            (
                json!({"messages": user, "tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "nope",
            ),
            (
                json!({"messages": user, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "1"}]}),
                "messages[1]",
            ),
            (json!({"messages": user, "tools": [{"type": "function", "function": {"name": "bad name"}}]}), "bad name"),
            (
                json!({"messages": user, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"not": {}}}}}}}),
                "not",
            ),
        ];
        for (body, named) in cases {
            let e = request(body.clone()).expect_err(&body.to_string());
            assert!(e.0.contains(named), "{body}: {}", e.0);
        }
    }

    #[test]
    fn calls_and_results_come_back_in_the_trace_grammar() {
        let r = request(json!({"tools": [weather()], "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Oslo?"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "getWeather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"celsius\": 3}"},
        ]}))
        .expect("valid");
        assert_eq!(r.messages.len(), 4);
        assert!(
            r.messages[0].content.contains("- getWeather(city: string): Weather now."),
            "{}",
            r.messages[0].content
        );
        assert_eq!(
            r.messages[2].content,
            r#"<tool_call>{"arguments":{"city":"Oslo"},"name":"getWeather"}</tool_call>"#
        );
        assert!(r.messages[3].content.starts_with("<observation>"), "{}", r.messages[3].content);
        assert!(r.messages[3].content.contains(r#""result":{"celsius":3}"#), "{}", r.messages[3].content);
        assert_eq!(r.choice, Choice::Auto);
        assert!(
            matches!(r.grammar.as_deref(), Some(TurnGrammar::Calls(c)) if c.call.is_some() && c.max_calls == usize::MAX)
        );
    }
}
