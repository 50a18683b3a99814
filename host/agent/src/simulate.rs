//! Simulated tools (MTR): tools that exist only as interfaces.
//!
//! - [`ToolActor`] answers a call with an observation from the local policy, decoded under the
//!   tool's output schema, so every observation validates.
//! - [`ToolMaker`] asks a model for task-specific interfaces and admits only manifests that
//!   validate (and whose output schema the actor can follow).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use toolsmith_contract::{ErrorKind, Manifest, StructuredError, ToolKind};
use toolsmith_policy::constrain::{JsonSchemaGrammar, TokenTable};
use toolsmith_policy::{Policy, SamplingParams};
use toolsmith_sandbox::validate::ToolSchemas;

use crate::backend::{Backend, BoxFuture, GenerateOptions, Message, local::prompt_ids};
use crate::tools::Simulator;

/// Simulates tools with the local policy under JSON-Schema-constrained decoding.
#[derive(Debug, Clone)]
pub struct ToolActor {
    policy: Arc<Mutex<Policy>>,
    table: Arc<TokenTable>,
    grammars: Arc<Mutex<HashMap<String, Arc<JsonSchemaGrammar>>>>,
    params: SamplingParams,
}

impl ToolActor {
    /// An actor over a shared policy; `params` sets sampling and the token budget.
    pub fn new(policy: Arc<Mutex<Policy>>, params: SamplingParams) -> Result<Self, toolsmith_policy::PolicyError> {
        let table = {
            let p = toolsmith_contract::sync::lock(&policy);
            Arc::new(TokenTable::new(p.tokenizer())?)
        };
        Ok(ToolActor { policy, table, grammars: Arc::default(), params })
    }

    fn grammar(&self, manifest: &Manifest) -> Result<Arc<JsonSchemaGrammar>, StructuredError> {
        let key = format!("{}@{}", manifest.name.as_str(), manifest.version);
        let mut cache = toolsmith_contract::sync::lock(&self.grammars);
        if let Some(g) = cache.get(&key) {
            return Ok(g.clone());
        }
        let g = Arc::new(JsonSchemaGrammar::compile(&manifest.output_schema).map_err(|e| {
            StructuredError::new(ErrorKind::InvalidOutput, manifest.name.as_str(), e.to_string())
                .with_hint("simplify the output schema so it can be simulated")
        })?);
        cache.insert(key, g.clone());
        Ok(g)
    }

    /// The messages the actor is prompted with.
    pub fn messages(manifest: &Manifest, args: &Value) -> Vec<Message> {
        vec![
            Message::system(format!(
                "You are the tool `{}`: {}\nAnswer each call with the tool's JSON result only.",
                manifest.name.as_str(),
                manifest.description
            )),
            Message::user(format!(
                "<tool_call>{}</tool_call>",
                json!({"name": manifest.name.as_str(), "arguments": args})
            )),
        ]
    }

    /// Simulates one call on the calling thread, holding the policy for the whole decode (the
    /// async [`Simulator`] impl runs this on a blocking thread).
    pub fn simulate_blocking(&self, manifest: &Manifest, args: &Value) -> Result<Value, StructuredError> {
        let name = manifest.name.as_str();
        let grammar = self.grammar(manifest)?;
        let policy = toolsmith_contract::sync::lock(&self.policy);
        let tool_error = |e: String| StructuredError::new(ErrorKind::ToolError, name, e);
        let prompt = prompt_ids(&policy, &Self::messages(manifest, args)).map_err(|e| tool_error(e.to_string()))?;
        let params = SamplingParams { seed: call_seed(self.params.seed, manifest, args), ..self.params.clone() };
        let outputs = policy
            .generate_json(&[prompt], &[grammar.as_ref()], &self.table, &params)
            .map_err(|e| tool_error(e.to_string()))?;
        match outputs.into_iter().next() {
            Some(Ok(o)) => Ok(o.value),
            Some(Err(e)) => Err(tool_error(e.to_string())),
            None => Err(tool_error("no output".into())),
        }
    }
}

/// A call's own seed: the actor's seed mixed with the tool's name and the call's arguments. A
/// simulated tool then answers one call one way, as a real tool does, whatever order the calls of
/// concurrent episodes reach it in, and a resumed run sees the observations an uninterrupted one
/// saw (a shared call counter gave neither). Other arguments draw other observations.
pub fn call_seed(seed: u64, manifest: &Manifest, args: &Value) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(manifest.name.as_str().as_bytes());
    hasher.update(&[0]);
    hasher.update(args.to_string().as_bytes());
    let mut word = [0_u8; 8];
    word.copy_from_slice(&hasher.finalize().as_bytes()[..8]);
    seed ^ u64::from_le_bytes(word)
}

impl Simulator for ToolActor {
    fn simulate<'a>(
        &'a self,
        manifest: &'a Manifest,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<Value, StructuredError>> {
        let this = self.clone();
        let manifest_owned = manifest.clone();
        let args = args.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || this.simulate_blocking(&manifest_owned, &args))
                .await
                .unwrap_or_else(|e| Err(StructuredError::new(ErrorKind::Trap, manifest.name.as_str(), e.to_string())))
        })
    }
}

/// Why a proposed interface was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// The model wrote no JSON object.
    #[error("no JSON object in the proposal")]
    NoJson,
    /// The manifest does not follow the contract.
    #[error("invalid manifest: {0}")]
    Manifest(String),
    /// Its schemas do not compile.
    #[error("invalid schemas: {0}")]
    Schemas(String),
    /// Its output schema cannot be simulated.
    #[error("output schema cannot be simulated: {0}")]
    Unsimulatable(String),
}

/// Proposes interfaces for a task and admits the valid ones as simulated tools.
#[derive(Debug, Clone)]
pub struct ToolMaker {
    backend: Arc<dyn Backend>,
    options: GenerateOptions,
}

impl ToolMaker {
    /// A maker that asks `backend` for proposals with `options`.
    pub fn new(backend: Arc<dyn Backend>, options: GenerateOptions) -> Self {
        ToolMaker { backend, options }
    }

    /// The prompt for one proposal.
    pub fn messages(task: &str) -> Vec<Message> {
        vec![
            Message::system(
                "Design one tool that would help with the task. Reply with its manifest as JSON: {\"name\": snake_case, \"version\": \"0.1.0\", \"description\": ..., \"input_schema\": {\"type\": \"object\", ...}, \"output_schema\": {\"type\": \"object\", ...}}.",
            ),
            Message::user(task),
        ]
    }

    /// Asks for `n` proposals; each is admitted or rejected with the reason.
    pub async fn propose(&self, task: &str, n: usize) -> Vec<Result<Manifest, Rejected>> {
        let messages = Self::messages(task);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let options = GenerateOptions { seed: self.options.seed + i as u64, ..self.options.clone() };
            let result = match self.backend.complete(&messages, &options).await {
                Ok(c) => admit(&c.text),
                Err(e) => Err(Rejected::Manifest(e.to_string())),
            };
            out.push(result);
        }
        out
    }
}

/// What a small model fills in when it designs an interface under constrained decoding: names,
/// a description and typed fields, which [`interface_manifest`] turns into JSON Schemas.
pub fn interface_schema() -> Value {
    let field = json!({"type": "object", "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{2,10}(_[a-z]{2,10}){0,2}$"},
        "type": {"enum": ["string", "integer", "number", "boolean"]}
    }, "required": ["name", "type"]});
    json!({"type": "object", "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{2,10}(_[a-z]{2,10}){0,2}$"},
        "description": {"type": "string", "minLength": 8, "maxLength": 80},
        "inputs": {"type": "array", "items": field, "minItems": 1, "maxItems": 3},
        "outputs": {"type": "array", "items": field, "minItems": 1, "maxItems": 3}
    }, "required": ["name", "description", "inputs", "outputs"]})
}

/// The manifest JSON for an interface written under [`interface_schema`]: every field required,
/// no others allowed.
pub fn interface_manifest(interface: &Value) -> Value {
    let object = |fields: &Value| {
        let mut properties = serde_json::Map::new();
        for f in fields.as_array().into_iter().flatten() {
            if let (Some(name), Some(t)) = (f["name"].as_str(), f["type"].as_str()) {
                properties.insert(name.to_string(), json!({"type": t}));
            }
        }
        let required: Vec<&String> = properties.keys().collect();
        json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
    };
    json!({
        "name": interface["name"],
        "description": interface["description"],
        "input_schema": object(&interface["inputs"]),
        "output_schema": object(&interface["outputs"]),
    })
}

impl ToolActor {
    /// ToolMaker with the local policy: `n` interfaces for `task`, each decoded under
    /// [`interface_schema`] and admitted like any proposal (so even an untrained model proposes
    /// tools that can be registered and simulated).
    pub fn design(
        &self,
        task: &str,
        n: usize,
    ) -> Result<Vec<Result<Manifest, Rejected>>, toolsmith_policy::PolicyError> {
        let grammar = JsonSchemaGrammar::compile(&interface_schema())?;
        let policy = toolsmith_contract::sync::lock(&self.policy);
        let prompt = prompt_ids(&policy, &ToolMaker::messages(task))
            .map_err(|e| toolsmith_policy::PolicyError::Sampling(format!("cannot render the prompt: {e}")))?;
        let prompts = vec![prompt; n];
        let grammars = vec![&grammar; n];
        let params = SamplingParams { max_new_tokens: 96, ..self.params.clone() };
        let outputs = policy.generate_json(&prompts, &grammars, &self.table, &params)?;
        Ok(outputs
            .into_iter()
            .map(|o| match o {
                Ok(o) => admit(&interface_manifest(&o.value).to_string()),
                Err(e) => Err(Rejected::Manifest(format!("generation failed: {e}"))),
            })
            .collect())
    }
}

/// Admits a proposal: the first JSON object in `text` must be a valid manifest with compiling
/// schemas and a simulatable output schema. The admitted tool is of kind `simulated`.
pub fn admit(text: &str) -> Result<Manifest, Rejected> {
    let value = first_json_object(text).ok_or(Rejected::NoJson)?;
    let mut value = value;
    if let Some(obj) = value.as_object_mut() {
        obj.insert("kind".into(), json!("simulated"));
        obj.entry("version").or_insert(json!("0.1.0"));
    }
    let manifest = Manifest::from_value(value).map_err(|e| Rejected::Manifest(e.to_string()))?;
    ToolSchemas::compile(&manifest.input_schema, &manifest.output_schema)
        .map_err(|e| Rejected::Schemas(e.to_string()))?;
    JsonSchemaGrammar::compile(&manifest.output_schema).map_err(|e| Rejected::Unsimulatable(e.to_string()))?;
    debug_assert_eq!(manifest.kind, ToolKind::Simulated);
    Ok(manifest)
}

/// The first complete JSON object in `text` (models wrap JSON in prose and code fences).
fn first_json_object(text: &str) -> Option<Value> {
    let mut start = 0;
    while let Some(offset) = text[start..].find('{') {
        let from = start + offset;
        let mut stream = serde_json::Deserializer::from_str(&text[from..]).into_iter::<Value>();
        if let Some(Ok(v)) = stream.next()
            && v.is_object()
        {
            return Some(v);
        }
        start = from + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_valid_simulatable_manifests_are_admitted() {
        let good = r#"Here it is: ```json
{"name": "flight_status", "description": "Status of a flight by number.",
 "input_schema": {"type": "object", "properties": {"flight": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}, "required": ["flight"]},
 "output_schema": {"type": "object", "properties": {"status": {"enum": ["on_time", "delayed"]}, "delay_min": {"type": "integer", "minimum": 0}}, "required": ["status"]}}
```"#;
        let m = admit(good).expect("admitted");
        assert_eq!(m.kind, ToolKind::Simulated);
        assert_eq!(m.name.as_str(), "flight_status");
        assert_eq!(admit("no json here"), Err(Rejected::NoJson));
        assert!(matches!(
            admit(
                r#"{"name": "Bad Name", "description": "x", "input_schema": {"type": "object"}, "output_schema": {"type": "object"}}"#
            ),
            Err(Rejected::Manifest(_))
        ));
        assert!(matches!(
            admit(
                r#"{"name": "t", "description": "x", "input_schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}, "output_schema": {"type": "object"}}"#
            ),
            Err(Rejected::Schemas(_))
        ));
        assert!(matches!(
            admit(
                r#"{"name": "t", "description": "x", "input_schema": {"type": "object"}, "output_schema": {"type": "object", "required": ["x"]}}"#
            ),
            Err(Rejected::Unsimulatable(_))
        ));
    }
}
