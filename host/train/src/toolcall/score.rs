//! Judging calls against a task's ground truth.
//!
//! **Exact-call accuracy** compares calls as syntax trees, not strings: the name must match; each
//! golden argument must be given with a value of the same JSON type that compares equal
//! (numbers by value, so `3` and `3.0` agree; strings trimmed and case-insensitively; arrays
//! item by item, in any order when the schema asks for unique items; objects key by key); an
//! optional argument the request did not state may be omitted or given its schema default, and
//! any other extra argument (invented, or not asked for) makes the call wrong. A turn is right
//! when its calls match the golden ones one to one, in any order; an irrelevant request is right
//! when no call is made.
//!
//! **The reward** (the `toolcall` method) grades the way there: 1 for an exact episode; else
//! 0.8 x the mean over golden turns of each turn's call score, where a call with the right name
//! scores 0.25 + 0.75 x its argument score (right golden arguments, less half a point per invented
//! or unasked one, over the golden count) and calls beyond the golden ones dilute the turn; and
//! 0.2 less when a turn breaks the call format (an unclosed tag, a call that is not JSON). An
//! irrelevant request scores 1 without a call and 0 with one.

use serde_json::{Map, Value};

use super::{CallFamily, CallTask, GoldenCall, Interface};

/// A call the policy made.
#[derive(Debug, Clone, PartialEq)]
pub struct Predicted {
    /// The tool's name as written.
    pub name: String,
    /// Its arguments as written.
    pub arguments: Value,
}

/// Whether `got` is `expected` under the type-aware comparison; `schema` is the value's schema
/// when known (it says whether array order matters).
pub fn values_match(expected: &Value, got: &Value, schema: Option<&Value>) -> bool {
    match (expected, got) {
        (Value::Number(a), Value::Number(b)) => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0),
            _ => false,
        },
        (Value::String(a), Value::String(b)) => a.trim().to_lowercase() == b.trim().to_lowercase(),
        (Value::Bool(a), Value::Bool(b)) => a == b,
        (Value::Null, Value::Null) => true,
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                return false;
            }
            let items = schema.and_then(|s| s.get("items"));
            let unordered = schema.and_then(|s| s.get("uniqueItems")).and_then(Value::as_bool).unwrap_or(false);
            if unordered {
                a.iter().all(|x| b.iter().any(|y| values_match(x, y, items)))
                    && b.iter().all(|y| a.iter().any(|x| values_match(x, y, items)))
            } else {
                a.iter().zip(b).all(|(x, y)| values_match(x, y, items))
            }
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter().all(|(k, x)| {
                    let sub = schema.and_then(|s| s.pointer(&format!("/properties/{k}")));
                    b.get(k).is_some_and(|y| values_match(x, y, sub))
                })
        }
        _ => false,
    }
}

fn property<'a>(tool: Option<&'a Interface>, name: &str) -> Option<&'a Value> {
    tool.and_then(|t| t.parameters.get("properties")).and_then(|p| p.get(name))
}

/// How one call's arguments compare with the golden ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArgumentCount {
    /// Golden arguments given with the right value.
    pub right: usize,
    /// Golden arguments in all.
    pub golden: usize,
    /// Arguments the schema does not have.
    pub invented: usize,
    /// Arguments the schema has but the request did not state, given a value other than the
    /// default.
    pub unasked: usize,
}

/// Counts `got`'s arguments against `golden`'s (names assumed equal).
pub fn count_arguments(tool: Option<&Interface>, golden: &GoldenCall, got: &Value) -> ArgumentCount {
    let empty = Map::new();
    let given = got.as_object().unwrap_or(&empty);
    let mut c = ArgumentCount { golden: golden.arguments.len(), ..ArgumentCount::default() };
    for (k, want) in &golden.arguments {
        if given.get(k).is_some_and(|v| values_match(want, v, property(tool, k))) {
            c.right += 1;
        }
    }
    for (k, v) in given {
        if golden.arguments.contains_key(k) {
            continue;
        }
        match property(tool, k) {
            None => c.invented += 1,
            Some(schema) => {
                if !schema.get("default").is_some_and(|d| values_match(d, v, Some(schema))) {
                    c.unasked += 1;
                }
            }
        }
    }
    c
}

/// Whether `got` is exactly `golden`.
pub fn call_exact(tool: Option<&Interface>, golden: &GoldenCall, got: &Predicted) -> bool {
    if got.name != golden.name || !got.arguments.is_object() {
        return false;
    }
    let c = count_arguments(tool, golden, &got.arguments);
    c.right == c.golden && c.invented == 0 && c.unasked == 0
}

/// A call's partial score in [0, 1] (0 for another tool).
pub fn call_score(tool: Option<&Interface>, golden: &GoldenCall, got: &Predicted) -> f64 {
    if got.name != golden.name {
        return 0.0;
    }
    let c = count_arguments(tool, golden, &got.arguments);
    let penalty = 0.5 * (c.invented + c.unasked) as f64;
    let args = if c.golden == 0 {
        (1.0 - penalty).max(0.0)
    } else {
        ((c.right as f64 - penalty) / c.golden as f64).clamp(0.0, 1.0)
    };
    0.25 + 0.75 * args
}

/// The best one-to-one assignment of `got` to `golden` under `value` (the sum), by brute force:
/// turns have a handful of calls.
fn best_assignment(golden: &[GoldenCall], got: &[Predicted], value: &dyn Fn(&GoldenCall, &Predicted) -> f64) -> f64 {
    fn go(
        golden: &[GoldenCall],
        got: &[Predicted],
        used: &mut Vec<bool>,
        value: &dyn Fn(&GoldenCall, &Predicted) -> f64,
    ) -> f64 {
        let Some((first, rest)) = golden.split_first() else { return 0.0 };
        // Leaving this golden call unmatched is always possible.
        let mut best = go(rest, got, used, value);
        for j in 0..got.len() {
            if used[j] {
                continue;
            }
            used[j] = true;
            best = best.max(value(first, &got[j]) + go(rest, got, used, value));
            used[j] = false;
        }
        best
    }
    if golden.len() > 6 || got.len() > 6 {
        // Past a handful, in order: nothing a task generates.
        return golden.iter().zip(got).map(|(g, p)| value(g, p)).sum();
    }
    go(golden, got, &mut vec![false; got.len()], value)
}

/// Whether a turn's calls are the golden ones, one to one, in any order.
pub fn turn_exact(task: &CallTask, golden: &[GoldenCall], got: &[Predicted]) -> bool {
    if golden.len() != got.len() {
        return false;
    }
    let exact = |g: &GoldenCall, p: &Predicted| if call_exact(task.tool(&g.name), g, p) { 1.0 } else { 0.0 };
    best_assignment(golden, got, &exact) as usize == golden.len()
}

/// A turn's partial score: the best assignment's call scores over the larger of the golden and
/// the made calls (so extra calls dilute it).
pub fn turn_score(task: &CallTask, golden: &[GoldenCall], got: &[Predicted]) -> f64 {
    let n = golden.len().max(got.len());
    if n == 0 {
        return 1.0;
    }
    let score = |g: &GoldenCall, p: &Predicted| call_score(task.tool(&g.name), g, p);
    best_assignment(golden, got, &score) / n as f64
}

/// Whether an episode's calls (turn by turn) are exactly the task's.
pub fn episode_exact(task: &CallTask, turns: &[Vec<Predicted>]) -> bool {
    if task.family == CallFamily::Irrelevant {
        return turns.iter().all(Vec::is_empty);
    }
    task.turns.iter().enumerate().all(|(i, golden)| turns.get(i).is_some_and(|got| turn_exact(task, golden, got)))
        && turns.iter().skip(task.turns.len()).all(Vec::is_empty)
}

/// The episode's reward and whether it was exact.
pub fn reward(task: &CallTask, turns: &[Vec<Predicted>], format_ok: bool) -> (f64, bool) {
    let exact = episode_exact(task, turns);
    if task.family == CallFamily::Irrelevant {
        return (if exact { 1.0 } else { 0.0 }, exact);
    }
    let base = if exact {
        1.0
    } else {
        let n = task.turns.len().max(1) as f64;
        let sum: f64 = task
            .turns
            .iter()
            .enumerate()
            .map(|(i, golden)| turns.get(i).map_or(0.0, |got| turn_score(task, golden, got)))
            .sum();
        0.8 * sum / n
    };
    (if format_ok { base } else { base - 0.2 }, exact)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn task(family: CallFamily, turns: Vec<Vec<GoldenCall>>) -> CallTask {
        let tool = Interface {
            name: "forecast".into(),
            description: "Fetches a forecast.".into(),
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"},
                "units": {"type": "string", "enum": ["metric", "imperial"], "default": "metric"},
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}},
                "required": ["city"]}),
            output_schema: json!({"type": "object"}),
            real: false,
            examples: Vec::new(),
        };
        CallTask {
            id: "t".into(),
            family,
            request: "r".into(),
            tools: vec![tool],
            turns,
            observations: Vec::new(),
            answer: "a".into(),
        }
    }

    fn golden(args: Value) -> GoldenCall {
        GoldenCall { name: "forecast".into(), arguments: args.as_object().cloned().unwrap_or_default() }
    }

    fn call(name: &str, args: Value) -> Predicted {
        Predicted { name: name.into(), arguments: args }
    }

    #[test]
    fn values_compare_by_type() {
        assert!(values_match(&json!(3), &json!(3.0), None));
        assert!(!values_match(&json!(3), &json!("3"), None));
        assert!(values_match(&json!("Lisbon"), &json!(" lisbon"), None));
        assert!(!values_match(&json!(true), &json!("true"), None));
        let unique = json!({"uniqueItems": true});
        assert!(values_match(&json!(["a", "b"]), &json!(["b", "a"]), Some(&unique)));
        assert!(!values_match(&json!(["a", "b"]), &json!(["b", "a"]), None));
        assert!(values_match(&json!({"x": 1}), &json!({"x": 1.0}), None));
        assert!(!values_match(&json!({"x": 1}), &json!({"x": 1, "y": 2}), None));
    }

    #[test]
    fn optional_arguments_may_be_omitted_or_defaulted_but_not_invented() {
        let t = task(CallFamily::Single, vec![vec![golden(json!({"city": "Lisbon", "days": 3}))]]);
        let g = &t.turns[0][0];
        let tool = t.tool("forecast");
        assert!(call_exact(tool, g, &call("forecast", json!({"city": "Lisbon", "days": 3}))));
        assert!(call_exact(tool, g, &call("forecast", json!({"city": "Lisbon", "days": 3, "units": "metric"}))));
        assert!(!call_exact(tool, g, &call("forecast", json!({"city": "Lisbon", "days": 3, "units": "imperial"}))));
        assert!(!call_exact(tool, g, &call("forecast", json!({"city": "Lisbon", "days": 3, "country": "PT"}))));
        assert!(!call_exact(tool, g, &call("forecast", json!({"city": "Lisbon"}))));
        assert!(!call_exact(tool, g, &call("weather", json!({"city": "Lisbon", "days": 3}))));
    }

    #[test]
    fn rewards_are_the_documented_arithmetic() {
        let t = task(CallFamily::Single, vec![vec![golden(json!({"city": "Lisbon", "days": 3}))]]);
        let exact = vec![vec![call("forecast", json!({"city": "Lisbon", "days": 3}))]];
        assert_eq!(reward(&t, &exact, true), (1.0, true));
        // One of two arguments right: 0.8 x (0.25 + 0.75 x 1/2) = 0.5.
        let half = vec![vec![call("forecast", json!({"city": "Lisbon", "days": 4}))]];
        assert!((reward(&t, &half, true).0 - 0.5).abs() < 1e-12);
        // Both right and one invented: 0.8 x (0.25 + 0.75 x (2 - 0.5) / 2) = 0.65.
        let invented = vec![vec![call("forecast", json!({"city": "Lisbon", "days": 3, "zip": "1100"}))]];
        assert!((reward(&t, &invented, true).0 - 0.65).abs() < 1e-12);
        // The right call twice: the extra call halves the turn: 0.8 x 1 / 2 = 0.4.
        let twice = vec![exact[0].iter().chain(&exact[0]).cloned().collect()];
        assert!((reward(&t, &twice, true).0 - 0.4).abs() < 1e-12);
        // Another tool: 0; a broken format costs 0.2.
        let wrong = vec![vec![call("weather", json!({"city": "Lisbon", "days": 3}))]];
        assert_eq!(reward(&t, &wrong, true), (0.0, false));
        assert!((reward(&t, &half, false).0 - 0.3).abs() < 1e-12);
        assert_eq!(reward(&t, &[], true), (0.0, false));
    }

    #[test]
    fn parallel_calls_match_in_any_order_and_irrelevance_wants_none() {
        let t =
            task(CallFamily::Parallel, vec![vec![golden(json!({"city": "Lisbon"})), golden(json!({"city": "Osaka"}))]]);
        let swapped =
            vec![vec![call("forecast", json!({"city": "Osaka"})), call("forecast", json!({"city": "Lisbon"}))]];
        assert_eq!(reward(&t, &swapped, true), (1.0, true));
        // One of two: 0.8 x 1 / 2.
        let one = vec![vec![call("forecast", json!({"city": "Osaka"}))]];
        assert!((reward(&t, &one, true).0 - 0.4).abs() < 1e-12);
        let irrelevant = task(CallFamily::Irrelevant, vec![Vec::new()]);
        assert_eq!(reward(&irrelevant, &[Vec::new()], true), (1.0, true));
        assert_eq!(reward(&irrelevant, &[vec![call("forecast", json!({"city": "Osaka"}))]], true), (0.0, false));
    }
}
