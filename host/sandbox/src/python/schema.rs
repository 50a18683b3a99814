//! JSON Schemas for a Python function, derived from what the agent gave us.
//!
//! Inputs: the signature's annotations win; for an unannotated parameter the `arguments` text
//! (SEARL's free-form "a, b (float)" or "x: int, y: list of numbers") gives the type and a
//! description; failing both, the example input's JSON type does. Output: the return annotation,
//! else the `returns` text, else the observed result's type; every result is wrapped as
//! `{"result": ...}` because MCP and OpenAI need an object at the top.
//!
//! The annotation grammar covered is the one agents write: builtins (`int float str bool list dict
//! tuple set bytes None`), their `typing` spellings (`List[int]`, `Dict[str, float]`,
//! `Optional[x]`, `Union[a, b]`, `Tuple[int, ...]`, `Literal["a", "b"]`, `Any`), PEP 604 unions
//! (`int | None`) and PEP 585 generics (`list[int]`). Anything else means "any JSON value".

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::Signature;

/// The input schema of a function: one property per parameter that can be passed by name.
pub fn input_schema(sig: &Signature, arguments_text: &str, example: &Map<String, Value>) -> Value {
    let hints = parse_arguments_text(arguments_text);
    let mut properties = Map::new();
    let mut required = Vec::new();
    let mut open = false;
    for p in &sig.params {
        match p.kind.as_str() {
            "var_keyword" => {
                open = true;
                continue;
            }
            "var_positional" => continue,
            _ => {}
        }
        let hint = hints.get(&p.name);
        let mut schema = p
            .annotation
            .as_deref()
            .and_then(annotation_schema)
            .or_else(|| hint.and_then(|h| h.json_type).map(|t| json!({ "type": t })))
            .or_else(|| example.get(&p.name).map(value_type_schema))
            .unwrap_or_else(|| json!({}));
        if let Some(obj) = schema.as_object_mut() {
            if let Some(desc) = hint.map(|h| h.description.trim()).filter(|d| !d.is_empty()) {
                obj.insert("description".into(), json!(desc));
            }
            if p.has_default
                && let Some(default) = &p.default
            {
                obj.insert("default".into(), default.clone());
            }
        }
        if !p.has_default {
            required.push(json!(p.name));
        }
        properties.insert(p.name.clone(), schema);
    }
    let mut schema = json!({
        "type": "object",
        "properties": properties,
        "required": required,
    });
    if !open {
        schema["additionalProperties"] = json!(false);
    }
    schema
}

/// The output schema: `{"result": <schema of the return value>}`.
pub fn output_schema(sig: &Signature, returns_text: &str, observed: Option<&Value>) -> Value {
    let mut result = sig
        .returns
        .as_deref()
        .and_then(annotation_schema)
        .or_else(|| type_word(returns_text).map(|t| json!({ "type": t })))
        .or_else(|| observed.map(value_type_schema))
        .unwrap_or_else(|| json!({}));
    if let Some(obj) = result.as_object_mut()
        && !returns_text.trim().is_empty()
    {
        obj.insert("description".into(), json!(returns_text.trim()));
    }
    json!({
        "type": "object",
        "properties": {"result": result},
        "required": ["result"],
        "additionalProperties": false,
    })
}

/// The schema of a value's JSON type (`1` -> number: an agent's `1` usually means "a number").
pub fn value_type_schema(value: &Value) -> Value {
    let t = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    json!({ "type": t })
}

/// A type and a description for one parameter, from the `arguments` text.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ArgumentHint {
    /// The JSON type named, if any.
    pub json_type: Option<&'static str>,
    /// What the text says about the parameter.
    pub description: String,
}

/// Reads SEARL-style argument descriptions: `"a, b, c (float)"`, `"a (float): first; b (int)"`,
/// `"x: int, y: list of numbers"`, one or several per line.
pub fn parse_arguments_text(text: &str) -> BTreeMap<String, ArgumentHint> {
    let mut hints = BTreeMap::new();
    for segment in text.split(['\n', ';']) {
        let segment = segment.trim();
        if segment.is_empty() {
            continue;
        }
        // "names (type): description"
        if let Some(open) = segment.find('(')
            && let Some(close) = segment[open..].find(')').map(|c| c + open)
        {
            let names: Vec<&str> = segment[..open].split(',').map(str::trim).collect();
            if !names.is_empty() && names.iter().all(|n| is_identifier(n)) {
                let ty = type_word(&segment[open + 1..close]);
                let description = segment[close + 1..].trim_start_matches([':', '-', '–', ' ']).trim();
                for name in names {
                    hints.insert(name.to_owned(), ArgumentHint { json_type: ty, description: description.to_owned() });
                }
                continue;
            }
        }
        // "x: int, y: str" or "x: the first value"
        for part in split_top_level(segment) {
            if let Some((name, rest)) = part.split_once(':') {
                let name = name.trim();
                if is_identifier(name) {
                    let rest = rest.trim();
                    let ty = annotation_schema(rest)
                        .and_then(|s| s.get("type").and_then(Value::as_str).and_then(static_type))
                        .or_else(|| type_word(rest));
                    hints.insert(name.to_owned(), ArgumentHint { json_type: ty, description: rest.to_owned() });
                }
            }
        }
    }
    hints
}

fn static_type(t: &str) -> Option<&'static str> {
    ["integer", "number", "string", "boolean", "array", "object", "null"].into_iter().find(|k| *k == t)
}

/// Splits on commas outside brackets.
fn split_top_level(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The JSON type a free-text type description names, e.g. "roots list" -> array.
pub fn type_word(text: &str) -> Option<&'static str> {
    let lower = text.to_ascii_lowercase();
    let words: Vec<&str> = lower.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
    let has = |options: &[&str]| words.iter().any(|w| options.contains(w));
    // Containers first: "list of floats" is an array.
    if has(&["list", "lists", "array", "arrays", "sequence", "tuple", "tuples", "vector", "set"]) {
        Some("array")
    } else if has(&["dict", "dictionary", "object", "mapping", "map", "json"]) {
        Some("object")
    } else if has(&["float", "floats", "number", "numbers", "double", "real", "decimal", "numeric"]) {
        Some("number")
    } else if has(&["int", "ints", "integer", "integers", "count"]) {
        Some("integer")
    } else if has(&["bool", "boolean", "flag"]) {
        Some("boolean")
    } else if has(&["str", "string", "strings", "text"]) {
        Some("string")
    } else {
        None
    }
}

/// The schema of a Python annotation, or `None` when it is not understood.
pub fn annotation_schema(annotation: &str) -> Option<Value> {
    let tokens = tokenize(annotation)?;
    let mut parser = Parser { tokens: &tokens, pos: 0 };
    let schema = parser.union()?;
    (parser.pos == tokens.len()).then_some(schema)
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Name(String),
    Str(String),
    Num(String),
    Open,
    Close,
    Comma,
    Pipe,
    Ellipsis,
}

fn tokenize(s: &str) -> Option<Vec<Token>> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = s.trim().trim_matches(|c| c == '"' || c == '\'').chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' => i += 1,
            '[' => (tokens.push(Token::Open), i += 1).1,
            ']' => (tokens.push(Token::Close), i += 1).1,
            ',' => (tokens.push(Token::Comma), i += 1).1,
            '|' => (tokens.push(Token::Pipe), i += 1).1,
            '.' if chars.get(i..i + 3) == Some(&['.', '.', '.']) => (tokens.push(Token::Ellipsis), i += 3).1,
            '"' | '\'' => {
                let end = chars[i + 1..].iter().position(|&d| d == c)? + i + 1;
                tokens.push(Token::Str(chars[i + 1..end].iter().collect()));
                i = end + 1;
            }
            c if c.is_ascii_digit() || c == '-' => {
                let start = i;
                i += 1;
                while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                    i += 1;
                }
                tokens.push(Token::Num(chars[start..i].iter().collect()));
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.') {
                    i += 1;
                }
                tokens.push(Token::Name(chars[start..i].iter().collect()));
            }
            _ => return None,
        }
    }
    Some(tokens)
}

struct Parser<'a> {
    tokens: &'a [Token],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn eat(&mut self, t: &Token) -> bool {
        if self.peek() == Some(t) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// `a | b | c`
    fn union(&mut self) -> Option<Value> {
        let mut options = vec![self.primary()?];
        while self.eat(&Token::Pipe) {
            options.push(self.primary()?);
        }
        Some(any_of(options))
    }

    /// `[a, b, ...]` after a generic's name.
    fn args(&mut self) -> Option<Vec<Value>> {
        if !self.eat(&Token::Open) {
            return Some(Vec::new());
        }
        let mut args = Vec::new();
        loop {
            if self.eat(&Token::Ellipsis) {
                args.push(json!({"$ellipsis": true}));
            } else {
                args.push(self.union()?);
            }
            if self.eat(&Token::Close) {
                return Some(args);
            }
            if !self.eat(&Token::Comma) {
                return None;
            }
        }
    }

    fn primary(&mut self) -> Option<Value> {
        let name = match self.peek()? {
            Token::Name(n) => n.clone(),
            _ => return None,
        };
        self.pos += 1;
        let base = name.rsplit('.').next().unwrap_or(&name).to_owned();
        if base == "Literal" {
            return self.literal();
        }
        let args = self.args()?;
        let first = || args.first().cloned().unwrap_or_else(|| json!({}));
        Some(match base.as_str() {
            "int" => json!({"type": "integer"}),
            "float" => json!({"type": "number"}),
            "str" => json!({"type": "string"}),
            "bool" => json!({"type": "boolean"}),
            "None" | "NoneType" => json!({"type": "null"}),
            "bytes" | "bytearray" => json!({"type": "string"}),
            "Any" | "object" => json!({}),
            "list" | "List" | "Sequence" | "Iterable" | "Collection" | "MutableSequence" => {
                if args.is_empty() {
                    json!({"type": "array"})
                } else {
                    json!({"type": "array", "items": first()})
                }
            }
            "set" | "Set" | "frozenset" | "FrozenSet" => {
                let mut s = json!({"type": "array", "uniqueItems": true});
                if !args.is_empty() {
                    s["items"] = first();
                }
                s
            }
            "tuple" | "Tuple" => {
                let variadic = args.len() == 2 && args[1].get("$ellipsis").is_some();
                if args.is_empty() {
                    json!({"type": "array"})
                } else if variadic {
                    json!({"type": "array", "items": first()})
                } else {
                    json!({"type": "array", "prefixItems": args, "minItems": args.len(), "maxItems": args.len()})
                }
            }
            "dict" | "Dict" | "Mapping" | "MutableMapping" => match args.get(1) {
                Some(values) => json!({"type": "object", "additionalProperties": values}),
                None => json!({"type": "object"}),
            },
            "Optional" => any_of(vec![first(), json!({"type": "null"})]),
            "Union" => any_of(args),
            _ => return None,
        })
    }

    fn literal(&mut self) -> Option<Value> {
        if !self.eat(&Token::Open) {
            return None;
        }
        let mut values = Vec::new();
        loop {
            let v = match self.peek()? {
                Token::Str(s) => json!(s),
                Token::Num(n) => serde_json::from_str::<Value>(n).ok()?,
                Token::Name(n) if n == "True" => json!(true),
                Token::Name(n) if n == "False" => json!(false),
                Token::Name(n) if n == "None" => Value::Null,
                _ => return None,
            };
            self.pos += 1;
            values.push(v);
            if self.eat(&Token::Close) {
                return Some(json!({ "enum": values }));
            }
            if !self.eat(&Token::Comma) {
                return None;
            }
        }
    }
}

fn any_of(mut options: Vec<Value>) -> Value {
    if options.len() == 1 {
        return options.remove(0);
    }
    if options.iter().any(|o| o.as_object().is_some_and(|m| m.is_empty())) {
        return json!({}); // `Any | x` is any
    }
    json!({ "anyOf": options })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::Param;

    fn param(name: &str, annotation: Option<&str>, has_default: bool) -> Param {
        Param {
            name: name.into(),
            kind: "positional_or_keyword".into(),
            annotation: annotation.map(Into::into),
            has_default,
            default: has_default.then(|| json!(2)),
        }
    }

    #[test]
    fn annotations_map_to_schemas() {
        for (annotation, schema) in [
            ("int", json!({"type": "integer"})),
            ("list[float]", json!({"type": "array", "items": {"type": "number"}})),
            ("List[int]", json!({"type": "array", "items": {"type": "integer"}})),
            ("typing.Dict[str, float]", json!({"type": "object", "additionalProperties": {"type": "number"}})),
            ("Optional[str]", json!({"anyOf": [{"type": "string"}, {"type": "null"}]})),
            ("int | None", json!({"anyOf": [{"type": "integer"}, {"type": "null"}]})),
            (
                "tuple[int, str]",
                json!({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2, "maxItems": 2}),
            ),
            ("Tuple[float, ...]", json!({"type": "array", "items": {"type": "number"}})),
            ("Literal['a', 'b', 3]", json!({"enum": ["a", "b", 3]})),
            ("Any", json!({})),
        ] {
            assert_eq!(annotation_schema(annotation), Some(schema), "{annotation}");
        }
        assert_eq!(annotation_schema("np.ndarray"), None);
        assert_eq!(annotation_schema("list[int"), None);
    }

    #[test]
    fn searl_argument_texts_are_understood() {
        let h = parse_arguments_text("a,b,c (float)");
        assert_eq!(h.len(), 3);
        assert!(h.values().all(|x| x.json_type == Some("number")));
        let h = parse_arguments_text("a (float): coefficient a; n (int): how many");
        assert_eq!(h["n"].json_type, Some("integer"));
        assert_eq!(h["a"].description, "coefficient a");
        let h = parse_arguments_text("xs: list[int], label: str");
        assert_eq!(h["xs"].json_type, Some("array"));
        assert_eq!(h["label"].json_type, Some("string"));
        assert_eq!(type_word("roots list"), Some("array"));
        assert_eq!(type_word("the area as a float"), Some("number"));
    }

    #[test]
    fn input_schema_prefers_annotation_then_text_then_example() {
        let sig = Signature {
            params: vec![
                param("a", Some("int"), false),
                param("b", None, false),
                param("c", None, true),
                param("d", None, false),
            ],
            returns: None,
            doc: None,
        };
        let example = json!({"a": 1, "b": 2.5, "c": 3, "d": "x"});
        let schema = input_schema(&sig, "b (float): the second", example.as_object().expect("object"));
        assert_eq!(schema["properties"]["a"]["type"], "integer");
        assert_eq!(schema["properties"]["b"], json!({"type": "number", "description": "the second"}));
        assert_eq!(schema["properties"]["c"], json!({"type": "number", "default": 2}));
        assert_eq!(schema["properties"]["d"]["type"], "string");
        assert_eq!(schema["required"], json!(["a", "b", "d"]));
        assert_eq!(schema["additionalProperties"], false);
    }

    #[test]
    fn output_schema_wraps_the_result() {
        let sig = Signature { params: vec![], returns: Some("list[float]".into()), doc: None };
        let schema = output_schema(&sig, "roots", Some(&json!([1.0])));
        assert_eq!(schema["properties"]["result"]["items"]["type"], "number");
        let sig = Signature { params: vec![], returns: None, doc: None };
        let schema = output_schema(&sig, "", Some(&json!("x")));
        assert_eq!(schema["properties"]["result"]["type"], "string");
    }
}
