//! The schema compiler: a JSON Schema becomes a tree of [`Node`]s the character machine walks,
//! with caps on every length so each document ends.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::number::{DEFAULT_INT_DIGITS, NumSpec};
use super::pattern::Pattern;
use crate::PolicyError;

/// Longest string generated when the schema gives no `maxLength`.
pub const DEFAULT_MAX_STRING: usize = 24;

/// Most array items generated when the schema gives no `maxItems`.
pub const DEFAULT_MAX_ITEMS: usize = 3;

/// A compiled schema node.
#[derive(Debug)]
pub(super) enum Node {
    Object(Vec<Property>),
    Array {
        items: Arc<Node>,
        min: usize,
        max: usize,
    },
    Str {
        min: usize,
        max: usize,
        pattern: Option<Arc<Pattern>>,
    },
    Num(NumSpec),
    Lit(Vec<String>),
    AnyOf(Vec<Arc<Node>>),
    /// An object with free keys (`additionalProperties`, `json_object`): up to `max` entries.
    Map {
        key: Arc<Node>,
        value: Arc<Node>,
        max: usize,
    },
}

/// Most entries of an object with free keys.
const DEFAULT_MAX_ENTRIES: usize = 6;

/// How deep a value of unknown shape (`json_object`, `additionalProperties: true`) may nest.
pub(super) const ANY_DEPTH: usize = 2;

/// Any JSON value, nested at most `depth` containers deep.
pub(super) fn any_value(depth: usize) -> Arc<Node> {
    let mut alts = vec![
        Arc::new(Node::Str { min: 0, max: DEFAULT_MAX_STRING, pattern: None }),
        Arc::new(Node::Num(NumSpec { integer: false, lo: None, hi: None, int_digits: DEFAULT_INT_DIGITS })),
        Arc::new(Node::Lit(vec!["true".into(), "false".into(), "null".into()])),
    ];
    if depth > 0 {
        let inner = any_value(depth - 1);
        alts.push(Arc::new(Node::Array { items: inner.clone(), min: 0, max: DEFAULT_MAX_ITEMS }));
        alts.push(free_object(inner));
    }
    Arc::new(Node::AnyOf(alts))
}

/// An object of free keys whose values are `value`s.
pub(super) fn free_object(value: Arc<Node>) -> Arc<Node> {
    let key = Arc::new(Node::Str { min: 1, max: DEFAULT_MAX_STRING, pattern: None });
    Arc::new(Node::Map { key, value, max: DEFAULT_MAX_ENTRIES })
}

/// A declared property of an object.
#[derive(Debug)]
pub(super) struct Property {
    /// The key as JSON, quotes included.
    pub(super) key: String,
    pub(super) required: bool,
    pub(super) node: Arc<Node>,
}

/// A schema the machine cannot follow.
pub(super) fn unsupported(what: String) -> PolicyError {
    PolicyError::Sampling(format!("constrained decoding: {what}"))
}

/// Compiles `schema` at nesting `depth`, refusing what the machine cannot follow.
pub(super) fn compile(schema: &Value, depth: usize) -> Result<Arc<Node>, PolicyError> {
    if depth > 32 {
        return Err(unsupported("schema nests deeper than 32 levels".into()));
    }
    let Some(obj) = schema.as_object() else {
        return match schema {
            // `true` accepts anything: a string is as good as any.
            Value::Bool(true) => Ok(Arc::new(Node::Str { min: 0, max: DEFAULT_MAX_STRING, pattern: None })),
            _ => Err(unsupported(format!("schema {schema} accepts nothing"))),
        };
    };
    refuse_unsupported(obj)?;
    if let Some(node) = compile_combinator(obj, depth)? {
        return Ok(node);
    }
    match obj.get("type") {
        Some(Value::Array(types)) => {
            let alts = types
                .iter()
                .map(|t| {
                    let mut single = obj.clone();
                    single.insert("type".into(), t.clone());
                    compile(&Value::Object(single), depth + 1)
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Arc::new(Node::AnyOf(alts)))
        }
        Some(Value::String(t)) => compile_type(t, obj, depth),
        Some(other) => Err(unsupported(format!("type {other}"))),
        // No type: infer it from the keywords present.
        None if obj.contains_key("properties") => compile_type("object", obj, depth),
        None if obj.contains_key("items") => compile_type("array", obj, depth),
        None => compile_type("string", obj, depth),
    }
}

/// Refuses keywords the machine cannot honour, rather than emit documents that fail them, and
/// combinators mixed with sibling constraints.
fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), PolicyError> {
    const UNSUPPORTED: [&str; 14] = [
        "$ref",
        "$dynamicRef",
        "not",
        "if",
        "then",
        "else",
        "uniqueItems",
        "multipleOf",
        "minProperties",
        "maxProperties",
        "prefixItems",
        "contains",
        "dependentRequired",
        "dependentSchemas",
    ];
    if let Some(k) = UNSUPPORTED.iter().find(|k| obj.contains_key(**k)) {
        return Err(unsupported(format!("the keyword `{k}` is not supported")));
    }
    let combinators = ["anyOf", "oneOf", "allOf", "enum", "const"].iter().filter(|k| obj.contains_key(**k)).count();
    let typed = ["type", "properties", "items", "required"].iter().any(|k| obj.contains_key(*k));
    if combinators > 1 || (combinators == 1 && typed && !obj.contains_key("enum") && !obj.contains_key("const")) {
        return Err(unsupported("combining anyOf/oneOf/allOf/enum/const with sibling constraints".into()));
    }
    Ok(())
}

/// `const`, `enum`, `anyOf`, `oneOf` or a single-schema `allOf`; `None` when `obj` has none.
fn compile_combinator(obj: &Map<String, Value>, depth: usize) -> Result<Option<Arc<Node>>, PolicyError> {
    if let Some(c) = obj.get("const") {
        return Ok(Some(Arc::new(Node::Lit(vec![c.to_string()]))));
    }
    if let Some(values) = obj.get("enum").and_then(Value::as_array) {
        if values.is_empty() {
            return Err(unsupported("empty enum".into()));
        }
        return Ok(Some(Arc::new(Node::Lit(values.iter().map(Value::to_string).collect()))));
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(alts) = obj.get(key).and_then(Value::as_array) {
            if alts.is_empty() {
                return Err(unsupported(format!("empty {key}")));
            }
            let alts = alts.iter().map(|a| compile(a, depth + 1)).collect::<Result<Vec<_>, _>>()?;
            // oneOf needs exactly one branch to match: numbers of both numeric kinds could match two.
            let numeric = alts.iter().filter(|a| matches!(&***a, Node::Num(_))).count();
            if key == "oneOf" && numeric > 1 {
                return Err(unsupported("oneOf with more than one numeric branch".into()));
            }
            return Ok(Some(Arc::new(Node::AnyOf(alts))));
        }
    }
    if let Some(all) = obj.get("allOf").and_then(Value::as_array) {
        return match all.as_slice() {
            [only] => compile(only, depth + 1).map(Some),
            _ => Err(unsupported("allOf with more than one schema".into())),
        };
    }
    Ok(None)
}

fn usize_of(obj: &Map<String, Value>, key: &str) -> Option<usize> {
    obj.get(key).and_then(Value::as_u64).map(|v| v as usize)
}

/// A schema of type `t` (`obj` its keywords).
fn compile_type(t: &str, obj: &Map<String, Value>, depth: usize) -> Result<Arc<Node>, PolicyError> {
    Ok(Arc::new(match t {
        "object" => return compile_object(obj, depth),
        "array" => compile_array(obj, depth)?,
        "string" => compile_string(obj)?,
        "integer" | "number" => Node::Num(compile_number(t == "integer", obj)?),
        "boolean" => Node::Lit(vec!["true".into(), "false".into()]),
        "null" => Node::Lit(vec!["null".into()]),
        other => return Err(unsupported(format!("type `{other}`"))),
    }))
}

/// An object: its declared properties in order, or free keys when it declares none.
fn compile_object(obj: &Map<String, Value>, depth: usize) -> Result<Arc<Node>, PolicyError> {
    let required: Vec<&str> = obj
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let additional = obj.get("additionalProperties");
    if !obj.contains_key("properties") && required.is_empty() && additional != Some(&Value::Bool(false)) {
        // No declared keys: any keys, with values of `additionalProperties` (any value
        // when it is absent or `true`).
        let value = match additional {
            None | Some(Value::Bool(true)) => any_value(ANY_DEPTH),
            Some(schema) => compile(schema, depth + 1)?,
        };
        return Ok(free_object(value));
    }
    let mut props = Vec::new();
    if let Some(p) = obj.get("properties").and_then(Value::as_object) {
        for (name, schema) in p {
            props.push(Property {
                key: Value::String(name.clone()).to_string(),
                required: required.contains(&name.as_str()),
                node: compile(schema, depth + 1)?,
            });
        }
    }
    for r in &required {
        // Keys are stored as JSON text, quotes included.
        let key = Value::String((*r).to_string()).to_string();
        if !props.iter().any(|p| p.key == key) {
            return Err(unsupported(format!("required property `{r}` has no schema")));
        }
    }
    Ok(Arc::new(Node::Object(props)))
}

/// An array of `items` (any value when absent), `minItems` to `maxItems` of them.
fn compile_array(obj: &Map<String, Value>, depth: usize) -> Result<Node, PolicyError> {
    let items = match obj.get("items") {
        Some(s) => compile(s, depth + 1)?,
        None => compile(&Value::Bool(true), depth + 1)?,
    };
    let min = usize_of(obj, "minItems").unwrap_or(0);
    let max = usize_of(obj, "maxItems").unwrap_or(DEFAULT_MAX_ITEMS.max(min));
    if max < min {
        return Err(unsupported(format!("maxItems {max} < minItems {min}")));
    }
    Ok(Node::Array { items, min, max })
}

/// A string of `minLength` to `maxLength` characters, matching `pattern` where given.
fn compile_string(obj: &Map<String, Value>) -> Result<Node, PolicyError> {
    let min = usize_of(obj, "minLength").unwrap_or(0);
    let pattern = match obj.get("pattern").and_then(Value::as_str) {
        None => None,
        Some(p) => Some(Arc::new(Pattern::compile(p).ok_or_else(|| {
            unsupported(format!(
                "the pattern `{p}` cannot be followed (unsupported syntax, too large, or no printable-ASCII match)"
            ))
        })?)),
    };
    // A pattern may need more than the usual cap: never less than its shortest match.
    let shortest = pattern.as_ref().and_then(|p| p.distance_to_accept(p.start)).unwrap_or(0);
    let default_max = if pattern.is_some() { shortest.max(64) } else { DEFAULT_MAX_STRING };
    let max = usize_of(obj, "maxLength").unwrap_or(default_max.max(min));
    if max < min {
        return Err(unsupported(format!("maxLength {max} < minLength {min}")));
    }
    Ok(Node::Str { min, max, pattern })
}

/// A number (an integer when `integer`) within `minimum`/`maximum` and their exclusive forms.
fn compile_number(integer: bool, obj: &Map<String, Value>) -> Result<NumSpec, PolicyError> {
    for k in ["exclusiveMinimum", "exclusiveMaximum"] {
        if obj.get(k).is_some_and(Value::is_boolean) {
            return Err(unsupported(format!("draft-4 boolean `{k}`")));
        }
    }
    // Both forms may be present: the tighter bound wins (exclusive on a tie).
    let bound = |inclusive: &str, exclusive: &str, lower: bool| {
        let ex = obj.get(exclusive).and_then(Value::as_f64).map(|v| (v, true));
        let inc = obj.get(inclusive).and_then(Value::as_f64).map(|v| (v, false));
        match (ex, inc) {
            (Some(e), Some(i)) => Some(if (lower && i.0 > e.0) || (!lower && i.0 < e.0) { i } else { e }),
            (e, i) => e.or(i),
        }
    };
    let lo = bound("minimum", "exclusiveMinimum", true);
    let hi = bound("maximum", "exclusiveMaximum", false);
    let digits = |v: f64| (v.abs().max(1.0).log10().floor() as usize) + 1;
    let int_digits = match (lo, hi) {
        (Some((a, _)), Some((b, _))) => digits(a).max(digits(b)),
        // One side open: room past the known bound.
        (Some((v, _)), None) | (None, Some((v, _))) => (digits(v) + 1).max(DEFAULT_INT_DIGITS),
        (None, None) => DEFAULT_INT_DIGITS,
    };
    if int_digits > 15 {
        return Err(unsupported("numbers beyond 15 digits".into()));
    }
    if let (Some((a, _)), Some((b, _))) = (lo, hi)
        && a > b
    {
        return Err(unsupported(format!("minimum {a} > maximum {b}")));
    }
    Ok(NumSpec { integer, lo, hi, int_digits })
}

/// The declared properties of an object node (none for other nodes).
pub(super) fn props(node: &Node) -> &[Property] {
    match node {
        Node::Object(p) => p,
        _ => &[],
    }
}

/// Property indices a key may name after `next`: up to and including the first required one.
pub(super) fn key_candidates(node: &Node, next: usize) -> (Vec<usize>, bool) {
    let ps = props(node);
    let mut out = Vec::new();
    for (i, p) in ps.iter().enumerate().skip(next) {
        out.push(i);
        if p.required {
            return (out, false);
        }
    }
    (out, true)
}
