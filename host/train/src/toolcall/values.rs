//! Argument values drawn from a JSON Schema: types, enums and consts, ranges, lengths, patterns,
//! formats, nested objects and arrays, local `$ref`s, `anyOf`/`oneOf`/`allOf`.
//!
//! Every value drawn is checked against the schema (the `jsonschema` crate, the validator the
//! sandbox checks calls with) before it becomes a task: a schema the sampler only half understands
//! yields an error, never a task whose ground truth the tool would refuse. What cannot be sampled
//! at all (`not`, a recursive `$ref`, a `pattern` with look-arounds) is an [`Unsampleable`] naming
//! where.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde_json::{Map, Number, Value, json};

/// Why a schema's values cannot be drawn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsampleable {
    /// A keyword the sampler does not draw from (`not`, `if`, `dependentSchemas`, ...).
    #[error("{at}: `{keyword}` cannot be sampled")]
    Keyword {
        /// The schema's location (a JSON pointer into the tool's parameters).
        at: String,
        /// The keyword.
        keyword: String,
    },
    /// A `$ref` that refers to itself, directly or not.
    #[error("{at}: `$ref` {target} is recursive")]
    Recursive {
        /// Where.
        at: String,
        /// The reference.
        target: String,
    },
    /// A `$ref` outside the schema (`#/...` only).
    #[error("{at}: `$ref` {target} does not resolve inside the schema")]
    Unresolved {
        /// Where.
        at: String,
        /// The reference.
        target: String,
    },
    /// A `pattern` whose strings cannot be generated.
    #[error("{at}: pattern {pattern:?} cannot be generated: {why}")]
    Pattern {
        /// Where.
        at: String,
        /// The pattern.
        pattern: String,
        /// The generator's reason.
        why: String,
    },
    /// Bounds no value meets (`minimum` above `maximum`, `minItems` above `maxItems`, ...).
    #[error("{at}: {why}")]
    Unsatisfiable {
        /// Where.
        at: String,
        /// Which bounds.
        why: String,
    },
    /// A drawn value the schema refuses: the sampler misread the schema, so the tool is skipped.
    #[error("a drawn value does not validate ({why}); the schema uses a combination the sampler does not model")]
    Invalid {
        /// The validator's message.
        why: String,
    },
}

/// Draws values of one tool's parameters schema.
pub struct Sampler<'a> {
    root: &'a Value,
    rng: &'a mut StdRng,
    refs: Vec<String>,
}

impl std::fmt::Debug for Sampler<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").field("refs", &self.refs).finish_non_exhaustive()
    }
}

/// Nesting depth at which the sampler gives up (schemas that deep are not argument lists).
const MAX_DEPTH: usize = 12;

/// Keywords that constrain values in ways the sampler does not draw from.
const UNSUPPORTED: [&str; 8] =
    ["not", "if", "then", "else", "dependentSchemas", "dependentRequired", "patternProperties", "contains"];

impl<'a> Sampler<'a> {
    /// A sampler over `root` (the schema `$ref`s resolve in).
    pub fn new(root: &'a Value, rng: &'a mut StdRng) -> Self {
        Sampler { root, rng, refs: Vec::new() }
    }

    /// A value of `schema` (found at `at` in the root). `name` is the property's name, which picks
    /// plausible words for free strings.
    pub fn value(&mut self, schema: &Value, at: &str, name: &str) -> Result<Value, Unsampleable> {
        self.draw(schema, at, name, 0)
    }

    fn draw(&mut self, schema: &Value, at: &str, name: &str, depth: usize) -> Result<Value, Unsampleable> {
        if depth > MAX_DEPTH {
            return Err(Unsampleable::Unsatisfiable { at: at.into(), why: "nested too deep".into() });
        }
        let Some(obj) = schema.as_object() else {
            // `true` (anything) or `{}`-like: a word.
            return Ok(Value::String(word_for(name, self.rng)));
        };
        for k in UNSUPPORTED {
            if obj.contains_key(k) {
                return Err(Unsampleable::Keyword { at: at.into(), keyword: k.into() });
            }
        }
        if let Some(target) = obj.get("$ref").and_then(Value::as_str) {
            if self.refs.iter().any(|r| r == target) {
                return Err(Unsampleable::Recursive { at: at.into(), target: target.into() });
            }
            let resolved = target
                .strip_prefix('#')
                .and_then(|p| self.root.pointer(p))
                .ok_or_else(|| Unsampleable::Unresolved { at: at.into(), target: target.into() })?;
            self.refs.push(target.into());
            let v = self.draw(resolved, target, name, depth + 1);
            self.refs.pop();
            return v;
        }
        if let Some(c) = obj.get("const") {
            return Ok(c.clone());
        }
        if let Some(Value::Array(options)) = obj.get("enum") {
            return options
                .choose(self.rng)
                .cloned()
                .ok_or_else(|| Unsampleable::Unsatisfiable { at: at.into(), why: "empty enum".into() });
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = obj.get(key) {
                let i = self.rng.random_range(0..branches.len().max(1));
                let Some(branch) = branches.get(i) else {
                    return Err(Unsampleable::Unsatisfiable { at: at.into(), why: format!("empty {key}") });
                };
                // The branch with what its parent says beside the choice (a shared `type`, shared
                // properties), as a validator reads them together.
                let mut rest = obj.clone();
                rest.remove(key);
                let merged = merge(rest, std::slice::from_ref(branch));
                return self.draw(&Value::Object(merged), &format!("{at}/{key}/{i}"), name, depth + 1);
            }
        }
        if let Some(Value::Array(parts)) = obj.get("allOf") {
            // Object parts merge (the common use: a base object and an extension); anything else
            // is drawn from the merge and left to validation.
            let mut rest = obj.clone();
            rest.remove("allOf");
            return self.draw(&Value::Object(merge(rest, parts)), at, name, depth + 1);
        }
        if let Some(d) = obj.get("default")
            && self.rng.random_bool(0.15)
        {
            return Ok(d.clone());
        }
        match type_of(obj, self.rng) {
            Some("string") => self.string(obj, at, name),
            Some("integer") => integer(obj, at, self.rng),
            Some("number") => number(obj, at, self.rng),
            Some("boolean") => Ok(Value::Bool(self.rng.random_bool(0.5))),
            Some("null") => Ok(Value::Null),
            Some("array") => self.array(obj, at, name, depth),
            Some("object") => self.object(obj, at, depth),
            Some(other) => Err(Unsampleable::Keyword { at: at.into(), keyword: format!("type {other}") }),
            None => Ok(Value::String(word_for(name, self.rng))),
        }
    }

    fn string(&mut self, obj: &Map<String, Value>, at: &str, name: &str) -> Result<Value, Unsampleable> {
        let min = obj.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
        let max = obj.get("maxLength").and_then(Value::as_u64).map(|m| m as usize);
        if max.is_some_and(|m| m < min) {
            return Err(Unsampleable::Unsatisfiable { at: at.into(), why: "minLength above maxLength".into() });
        }
        if let Some(pattern) = obj.get("pattern").and_then(Value::as_str) {
            return pattern_string(pattern, at, self.rng).map(Value::String);
        }
        if let Some(Value::Array(examples)) = obj.get("examples")
            && let Some(e) = examples.choose(self.rng)
        {
            return Ok(e.clone());
        }
        if let Some(format) = obj.get("format").and_then(Value::as_str)
            && let Some(s) = formatted(format, self.rng)
        {
            return Ok(Value::String(s));
        }
        let mut s = word_for(name, self.rng);
        while s.chars().count() < min {
            s.push_str(&format!(" {}", word_for(name, self.rng)));
        }
        if let Some(max) = max {
            s = s.chars().take(max).collect();
        }
        Ok(Value::String(s))
    }

    fn array(&mut self, obj: &Map<String, Value>, at: &str, name: &str, depth: usize) -> Result<Value, Unsampleable> {
        let min = obj.get("minItems").and_then(Value::as_u64).unwrap_or(1) as usize;
        let max = obj.get("maxItems").and_then(Value::as_u64).map_or(min.max(3), |m| m as usize);
        if max < min {
            return Err(Unsampleable::Unsatisfiable { at: at.into(), why: "minItems above maxItems".into() });
        }
        let unique = obj.get("uniqueItems").and_then(Value::as_bool).unwrap_or(false);
        let n = self.rng.random_range(min..=max.min(min + 3));
        let items = obj.get("items").cloned().unwrap_or(Value::Bool(true));
        let singular = name.strip_suffix('s').unwrap_or(name).to_string();
        let mut out: Vec<Value> = Vec::with_capacity(n);
        let mut tries = 0;
        while out.len() < n {
            let v = self.draw(&items, &format!("{at}/items"), &singular, depth + 1)?;
            tries += 1;
            if unique && out.contains(&v) {
                if tries > 20 * n {
                    return Err(Unsampleable::Unsatisfiable { at: at.into(), why: "too few distinct items".into() });
                }
                continue;
            }
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn object(&mut self, obj: &Map<String, Value>, at: &str, depth: usize) -> Result<Value, Unsampleable> {
        let mut out = Map::new();
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map_or(Vec::new(), |r| r.iter().filter_map(Value::as_str).collect());
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            for (k, s) in props {
                if required.contains(&k.as_str()) || self.rng.random_bool(0.5) {
                    out.insert(k.clone(), self.draw(s, &format!("{at}/properties/{k}"), k, depth + 1)?);
                }
            }
        }
        for k in &required {
            if !out.contains_key(*k) {
                out.insert((*k).to_string(), Value::String(word_for(k, self.rng)));
            }
        }
        Ok(Value::Object(out))
    }
}

/// `base` with each of `parts`' keywords: objects (`properties`) merge key by key, arrays
/// (`required`) concatenate, anything else the part's wins.
fn merge(mut base: Map<String, Value>, parts: &[Value]) -> Map<String, Value> {
    for part in parts {
        let Some(p) = part.as_object() else { continue };
        for (k, v) in p {
            match (base.get_mut(k), v) {
                (Some(Value::Object(have)), Value::Object(add)) => {
                    have.extend(add.iter().map(|(a, b)| (a.clone(), b.clone())))
                }
                (Some(Value::Array(have)), Value::Array(add)) => have.extend(add.iter().cloned()),
                _ => {
                    base.insert(k.clone(), v.clone());
                }
            }
        }
    }
    base
}

/// The schema's type (one of a list, `null` last).
fn type_of<'s>(obj: &'s Map<String, Value>, rng: &mut StdRng) -> Option<&'s str> {
    match obj.get("type") {
        Some(Value::String(t)) => Some(t),
        Some(Value::Array(ts)) => {
            let named: Vec<&str> = ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect();
            named.choose(rng).copied().or(Some("null"))
        }
        _ if obj.contains_key("properties") => Some("object"),
        _ if obj.contains_key("items") => Some("array"),
        _ => None,
    }
}

fn integer(obj: &Map<String, Value>, at: &str, rng: &mut StdRng) -> Result<Value, Unsampleable> {
    let (lo, hi) = bounds(obj, true, 1.0, 100.0);
    let (lo, hi) = (lo.ceil() as i64, hi.floor() as i64);
    if lo > hi {
        return Err(Unsampleable::Unsatisfiable { at: at.into(), why: "no integer within the bounds".into() });
    }
    let step = obj.get("multipleOf").and_then(Value::as_i64).filter(|m| *m > 0).unwrap_or(1);
    let first = lo.div_euclid(step) * step + if lo.rem_euclid(step) == 0 { 0 } else { step };
    if first > hi {
        return Err(Unsampleable::Unsatisfiable { at: at.into(), why: "no multiple within the bounds".into() });
    }
    let k = rng.random_range(0..=(hi - first) / step);
    Ok(json!(first + k * step))
}

fn number(obj: &Map<String, Value>, at: &str, rng: &mut StdRng) -> Result<Value, Unsampleable> {
    let (lo, hi) = bounds(obj, false, 0.0, 100.0);
    if lo > hi {
        return Err(Unsampleable::Unsatisfiable { at: at.into(), why: "minimum above maximum".into() });
    }
    // Two decimals: what a person types, and what a request can state exactly.
    let mut x = (rng.random_range(lo..=hi) * 100.0).round() / 100.0;
    if x < lo || x > hi {
        x = lo;
    }
    Ok(Number::from_f64(x).map_or(Value::Null, Value::Number))
}

/// The closed range a number is drawn from; open bounds move in by one unit (integers) or a
/// hundredth.
fn bounds(obj: &Map<String, Value>, integer: bool, lo: f64, hi: f64) -> (f64, f64) {
    let unit = if integer { 1.0 } else { 0.01 };
    let get = |k: &str| obj.get(k).and_then(Value::as_f64);
    let min = get("minimum").or(get("exclusiveMinimum").map(|m| m + unit));
    let max = get("maximum").or(get("exclusiveMaximum").map(|m| m - unit));
    match (min, max) {
        (Some(a), Some(b)) => (a, b),
        (Some(a), None) => (a, a + (hi - lo)),
        (None, Some(b)) => ((b - (hi - lo)).max(if b > 0.0 { lo } else { b - (hi - lo) }), b),
        (None, None) => (lo, hi),
    }
}

/// A string matching `pattern`. JSON Schema patterns are unanchored; a generated string that
/// matches the whole pattern matches it anywhere, so outer anchors are dropped first.
fn pattern_string(pattern: &str, at: &str, rng: &mut StdRng) -> Result<String, Unsampleable> {
    let bare = pattern.strip_prefix('^').unwrap_or(pattern);
    let bare = bare.strip_suffix('$').filter(|b| !b.ends_with('\\')).unwrap_or(bare);
    let generator = rand_regex::Regex::compile(bare, 4).map_err(|e| Unsampleable::Pattern {
        at: at.into(),
        pattern: pattern.into(),
        why: e.to_string(),
    })?;
    Ok(rng.sample::<String, _>(&generator))
}

/// A value of a string `format`, or `None` for a format without a generator here.
fn formatted(format: &str, rng: &mut StdRng) -> Option<String> {
    let (y, m, d) = (rng.random_range(2015..=2030), rng.random_range(1..=12), rng.random_range(1..=28));
    let (h, min) = (rng.random_range(0..24), rng.random_range(0..60) / 5 * 5);
    let user = ["ana", "li.wei", "sam", "noor", "kofi", "ines", "mateo"].choose(rng)?;
    let host = ["example.com", "example.org", "mail.example.net"].choose(rng)?;
    Some(match format {
        "date" => format!("{y:04}-{m:02}-{d:02}"),
        "date-time" => format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:00Z"),
        "time" => format!("{h:02}:{min:02}:00"),
        "email" => format!("{user}@{host}"),
        "uri" | "url" | "iri" => format!("https://{host}/{}", rng.random_range(1..999)),
        "hostname" => (*host).to_string(),
        "ipv4" => format!("192.0.2.{}", rng.random_range(1..255)),
        "uuid" => {
            let n: u128 = rng.random();
            let h = format!("{n:032x}");
            format!("{}-{}-4{}-a{}-{}", &h[..8], &h[8..12], &h[13..16], &h[17..20], &h[20..32])
        }
        _ => return None,
    })
}

/// Words for a free string, picked by what the property's name suggests.
pub fn word_for(name: &str, rng: &mut StdRng) -> String {
    let n = name.to_ascii_lowercase();
    let has = |keys: &[&str]| keys.iter().any(|k| n.contains(k));
    let list: &[&str] = if has(&["city", "town", "location", "place", "destination", "origin"]) {
        &["Lisbon", "Nairobi", "Osaka", "Quito", "Tallinn", "Perth", "Accra", "Bergen", "Cusco", "Hanoi"]
    } else if has(&["country", "nation"]) {
        &["Portugal", "Kenya", "Japan", "Ecuador", "Estonia", "Ghana", "Norway", "Peru", "Vietnam"]
    } else if has(&["name", "person", "author", "user", "owner", "contact", "recipient"]) {
        &["Amara Okafor", "Jonas Berg", "Mei Tanaka", "Rafael Duarte", "Leila Haddad", "Tomasz Nowak"]
    } else if has(&["lang"]) {
        &["French", "Swahili", "Korean", "Portuguese", "Finnish", "Hindi"]
    } else if has(&["color", "colour"]) {
        &["teal", "amber", "crimson", "olive", "indigo", "ivory"]
    } else if has(&["code", "id", "sku", "number", "ref"]) {
        return format!(
            "{}{}-{}",
            (b'A' + rng.random_range(0..26)) as char,
            (b'A' + rng.random_range(0..26)) as char,
            rng.random_range(100..9999)
        );
    } else {
        &[
            "spring catalogue",
            "quarterly review",
            "river delta",
            "night shift",
            "blue notebook",
            "garden party",
            "solar panel",
            "harbour view",
            "mountain trail",
            "jazz trio",
            "winter coat",
            "paper lantern",
        ]
    };
    list.choose(rng).map_or_else(|| "item".to_string(), |s| (*s).to_string())
}

/// Arguments for `parameters`: every required property and each optional one with probability
/// `optional`, validated against the schema.
pub fn arguments(parameters: &Value, optional: f64, rng: &mut StdRng) -> Result<Map<String, Value>, Unsampleable> {
    let validator = jsonschema::validator_for(parameters).map_err(|e| Unsampleable::Invalid { why: e.to_string() })?;
    let props = parameters.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
    let required: Vec<String> = parameters
        .get("required")
        .and_then(Value::as_array)
        .map_or(Vec::new(), |r| r.iter().filter_map(Value::as_str).map(String::from).collect());
    for k in UNSUPPORTED {
        if parameters.get(k).is_some() {
            return Err(Unsampleable::Keyword { at: String::new(), keyword: k.into() });
        }
    }
    let mut out = Map::new();
    let mut sampler = Sampler::new(parameters, rng);
    if props.is_empty() && ["oneOf", "anyOf", "allOf", "$ref"].iter().any(|k| parameters.get(*k).is_some()) {
        // Arguments that are one of several shapes: the whole schema is drawn at once.
        let v = sampler.value(parameters, "", "arguments")?;
        if let Some(e) = validator.iter_errors(&v).next() {
            return Err(Unsampleable::Invalid { why: format!("{e} at {}", e.instance_path()) });
        }
        return v.as_object().cloned().ok_or(Unsampleable::Invalid { why: "the arguments are not an object".into() });
    }
    for (k, s) in &props {
        let pick = required.contains(k) || sampler.rng.random_bool(optional);
        // Draw optional ones too, so that a schema the sampler cannot read is found on every call.
        let v = sampler.value(s, &format!("/properties/{k}"), k)?;
        if pick {
            out.insert(k.clone(), v);
        }
    }
    let value = Value::Object(out);
    if let Some(e) = validator.iter_errors(&value).next() {
        return Err(Unsampleable::Invalid { why: format!("{e} at {}", e.instance_path()) });
    }
    let Value::Object(out) = value else { unreachable!("built as an object") };
    Ok(out)
}

/// A value of an output schema (a simulated tool's answer when no real tool or actor gives one).
pub fn output(schema: &Value, rng: &mut StdRng) -> Result<Value, Unsampleable> {
    let mut sampler = Sampler::new(schema, rng);
    let v = sampler.value(schema, "", "result")?;
    if let Ok(validator) = jsonschema::validator_for(schema)
        && let Some(e) = validator.iter_errors(&v).next()
    {
        return Err(Unsampleable::Invalid { why: e.to_string() });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn draw(schema: Value, seed: u64) -> Result<Map<String, Value>, Unsampleable> {
        arguments(&schema, 1.0, &mut StdRng::seed_from_u64(seed))
    }

    #[test]
    fn values_meet_every_bound_they_are_drawn_under() {
        let schema = json!({"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 10, "maximum": 20, "multipleOf": 5},
            "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "unit": {"enum": ["kg", "lb"]},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            "day": {"type": "string", "format": "date"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 2, "maxItems": 2, "uniqueItems": true},
            "box": {"type": "object", "properties": {"w": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["w"]},
            "pick": {"$ref": "#/$defs/side"}
        }, "required": ["n", "code"], "$defs": {"side": {"enum": ["left", "right"]}}});
        for seed in 0..50 {
            let v = draw(schema.clone(), seed).expect("samples");
            let n = v["n"].as_i64().expect("integer");
            assert!([10, 15, 20].contains(&n), "{n}");
            let x = v["x"].as_f64().expect("number");
            assert!(x > 0.0 && x <= 1.0, "{x}");
            let code = v["code"].as_str().expect("string");
            assert_eq!(code.len(), 6, "{code}");
            assert_eq!(v["tags"].as_array().map(Vec::len), Some(2));
            assert!(["left", "right"].contains(&v["pick"].as_str().expect("ref")));
        }
    }

    #[test]
    fn unsampleable_schemas_are_named_not_guessed() {
        let not = json!({"type": "object", "properties": {"a": {"not": {"type": "string"}}}});
        assert!(matches!(draw(not, 0), Err(Unsampleable::Keyword { keyword, .. }) if keyword == "not"));
        let recursive = json!({"type": "object", "properties": {"t": {"$ref": "#/$defs/tree"}},
            "$defs": {"tree": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}, "required": ["kids"]}}});
        assert!(matches!(draw(recursive, 0), Err(Unsampleable::Recursive { .. })));
        let look = json!({"type": "object", "properties": {"p": {"type": "string", "pattern": "\\bword\\b"}}});
        assert!(matches!(draw(look, 0), Err(Unsampleable::Pattern { .. })));
        let empty = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 4}}});
        assert!(matches!(draw(empty, 0), Err(Unsampleable::Unsatisfiable { .. })));
    }

    #[test]
    fn the_same_seed_draws_the_same_values() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}});
        assert_eq!(draw(schema.clone(), 7).ok(), draw(schema, 7).ok());
    }
}
