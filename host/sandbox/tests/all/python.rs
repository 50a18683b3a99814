//! Agent-written Python tools through the real CPython guest.

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Map, Value, json};
use toolsmith_sandbox::python::create::{CreateRequest, PythonTool};
use toolsmith_sandbox::python::{DEFAULT_MEMORY_BYTES, PythonFailure, PythonRun, PythonRuntime, default_guest_path};
use toolsmith_sandbox::{ErrorKind, Limits, Sandbox, SandboxConfig, Toolbox};

/// A toolbox with the Python runtime (its own, so Python tools never collide with other tests').
pub fn python_toolbox() -> &'static Toolbox {
    static TOOLBOX: OnceLock<Toolbox> = OnceLock::new();
    TOOLBOX.get_or_init(|| {
        let config = SandboxConfig { cache_dir: Some(crate::cache_dir()), ..SandboxConfig::default() };
        let sandbox = Sandbox::new(config).expect("sandbox");
        let runtime = PythonRuntime::load(sandbox.clone(), &default_guest_path())
            .expect("python guest (scripts/setup.sh builds it)");
        let toolbox = Toolbox::new(sandbox);
        toolbox.set_python(runtime);
        toolbox
    })
}

pub fn runtime() -> PythonRuntime {
    python_toolbox().python().expect("runtime")
}

pub fn limits(timeout_ms: u64) -> Limits {
    Limits { timeout: Duration::from_millis(timeout_ms), memory_bytes: DEFAULT_MEMORY_BYTES, ..Limits::default() }
}

pub fn exec(code: &str, entry: &str, kwargs: Value, limits: Limits) -> Result<PythonRun, PythonFailure> {
    let kwargs: Map<String, Value> = kwargs.as_object().cloned().unwrap_or_default();
    runtime().exec(entry, code, entry, Vec::new(), kwargs, limits, Some(7))
}

pub fn create(request: Value) -> toolsmith_sandbox::python::create::Created {
    let request: CreateRequest = serde_json::from_value(request).expect("request");
    python_toolbox().create_python(&request, Default::default()).expect("runtime present")
}

fn admit(tool: PythonTool) {
    let toolbox = python_toolbox();
    toolbox.register(toolbox.python_tool(tool).expect("schemas compile"));
}

#[test]
fn searl_quadratic_solver_end_to_end() {
    let code = "def quadratic_solver(a,b,c):\n import math\n d=b*b-4*a*c\n if d>0:\n  r1=(-b+math.sqrt(d))/(2*a)\n  r2=(-b-math.sqrt(d))/(2*a)\n  return [r1,r2]\n if d==0:\n  r=-b/(2*a)\n  return [r,r]\n return 'complex roots'";
    let created = create(json!({
        "name": "quadratic_solver", "description": "Solve ax^2+bx+c=0", "arguments": "a,b,c (float)",
        "returns": "roots list", "code": code, "inputs": {"a": 1, "b": -3, "c": 2}
    }));
    assert!(created.result.creation_success, "{:?}", created.result);
    assert_eq!(created.result.execution_result, json!([2.0, 1.0]));
    let tool = created.tool.expect("candidate");
    assert_eq!(tool.manifest.kind, toolsmith_sandbox::ToolKind::Python);
    assert_eq!(tool.manifest.input_schema["properties"]["a"]["type"], "number");
    assert_eq!(tool.manifest.input_schema["required"], json!(["a", "b", "c"]));
    assert_eq!(tool.manifest.output_schema["properties"]["result"]["type"], "array");
    // Once admitted, it is called by name through the same validation and sandbox as any tool.
    admit(tool);
    let out = python_toolbox().call("quadratic_solver", &json!({"a": 1, "b": 2, "c": 1}), limits(5000)).expect("call");
    assert_eq!(out.value, json!({"result": [-1.0, -1.0]}));
    let e = python_toolbox()
        .call("quadratic_solver", &json!({"a": "one", "b": 2, "c": 1}), limits(5000))
        .expect_err("types");
    assert_eq!(e.kind, ErrorKind::InvalidArgs);
    assert_eq!(e.pointer.as_deref(), Some("/a"));
    // The derived output schema is enforced: "complex roots" is not a list.
    let e =
        python_toolbox().call("quadratic_solver", &json!({"a": 1, "b": 0, "c": 1}), limits(5000)).expect_err("schema");
    assert_eq!(e.kind, ErrorKind::InvalidOutput);
}

#[test]
fn smoke() {
    let run = exec("def f(x):\n    print('hi')\n    return x * 2", "f", json!({"x": 21}), limits(5000)).expect("runs");
    assert_eq!(run.result, json!(42));
    assert_eq!(run.stdout, "hi\n");
}

#[test]
fn every_allowlisted_module_imports_and_works() {
    let code = r##"
def probe():
    import math, cmath, json, re, itertools, functools, collections, fractions, statistics, datetime
    import decimal, random, heapq, bisect, string, typing, dataclasses, enum, operator, copy, textwrap
    import hashlib, base64, struct
    @dataclasses.dataclass
    class P:
        x: int
    class Color(enum.Enum):
        RED = 1
    h = [5, 1, 3]
    heapq.heapify(h)
    return {
        "math": math.factorial(5), "cmath": abs(cmath.sqrt(-4)), "json": json.loads("[1]")[0],
        "re": re.sub(r"\d", "#", "a1b2"), "itertools": list(itertools.accumulate([1, 2, 3])),
        "functools": functools.reduce(operator.mul, [1, 2, 3, 4]),
        "collections": collections.Counter("aab").most_common(1)[0][0],
        "fractions": str(fractions.Fraction(1, 3) + fractions.Fraction(1, 6)),
        "statistics": statistics.median([3, 1, 2]), "datetime": datetime.date(2024, 1, 31).isoformat(),
        "decimal": str(decimal.Decimal("1.10") + decimal.Decimal("2.20")),
        "random": random.Random(1).randint(1, 1) , "heapq": heapq.heappop(h),
        "bisect": bisect.bisect([1, 3, 5], 4), "string": string.ascii_lowercase[:3],
        "typing": typing.get_origin(typing.List[int]) is list, "dataclasses": dataclasses.asdict(P(3)),
        "enum": Color.RED.name, "copy": copy.deepcopy([[1]]), "textwrap": textwrap.dedent("  x"),
        "hashlib": hashlib.sha256(b"abc").hexdigest()[:8], "base64": base64.b64encode(b"hi").decode(),
        "struct": struct.unpack("<I", struct.pack("<I", 258))[0],
    }
"##;
    let run = exec(code, "probe", json!({}), limits(10_000)).expect("all modules work");
    assert_eq!(
        run.result,
        json!({
            "math": 120, "cmath": 2.0, "json": 1, "re": "a#b#", "itertools": [1, 3, 6], "functools": 24,
            "collections": "a", "fractions": "1/2", "statistics": 2, "datetime": "2024-01-31",
            "decimal": "3.30", "random": 1, "heapq": 1, "bisect": 2, "string": "abc", "typing": true,
            "dataclasses": {"x": 3}, "enum": "RED", "copy": [[1]], "textwrap": "x",
            "hashlib": "ba7816bf", "base64": "aGk=", "struct": 258
        })
    );
}

#[test]
fn failures_are_structured_results_not_host_errors() {
    // Syntax error: creation fails, with the line.
    let created = create(json!({"name": "broken", "description": "Broken on purpose.",
        "code": "def broken(x):\n    return x +\n", "inputs": {"x": 1}}));
    assert!(!created.result.creation_success);
    let e = created.failure.expect("failure");
    assert_eq!(e.kind, ErrorKind::PythonError);
    let ex = e.exception.expect("exception");
    assert_eq!(ex.kind, "SyntaxError");
    assert_eq!(ex.line, Some(2));
    assert!(created.result.error.as_deref().is_some_and(|m| m.contains("SyntaxError")));

    // An exception at run time: type, message and a traceback pointing into the tool's code.
    let created = create(json!({"name": "divide", "description": "Divides a by b.",
        "arguments": "a, b (float)", "code": "def divide(a, b):\n    print('dividing')\n    return a / b\n",
        "inputs": {"a": 1, "b": 0}}));
    assert!(!created.result.creation_success);
    assert_eq!(created.result.stdout, "dividing\n");
    let ex = created.failure.expect("failure").exception.expect("exception");
    assert_eq!(ex.kind, "ZeroDivisionError");
    assert!(ex.traceback.contains("line 3") && ex.traceback.contains("return a / b"), "{}", ex.traceback);

    // The function must exist under the tool's name.
    let created = create(json!({"name": "missing_entry", "description": "Has no such function.",
        "code": "def other():\n    return 1\n"}));
    let e = created.failure.expect("failure");
    assert_eq!(e.exception.expect("exception").kind, "EntryNotFound");
    assert!(e.message.contains("other"), "{}", e.message);

    // Wrong argument types are caught by the derived schema before any code runs.
    let created = create(json!({"name": "square", "description": "Squares an integer.",
        "code": "def square(n: int) -> int:\n    return n * n\n", "inputs": {"n": "seven"}}));
    let e = created.failure.expect("failure");
    assert_eq!(e.kind, ErrorKind::InvalidArgs);
    assert_eq!(e.pointer.as_deref(), Some("/n"));

    // A result that contradicts the return annotation is invalid_output.
    let created = create(json!({"name": "liar", "description": "Claims to return an int.",
        "code": "def liar() -> int:\n    return 'no'\n"}));
    assert_eq!(created.failure.expect("failure").kind, ErrorKind::InvalidOutput);

    // Names are checked, and a plugin's name cannot be taken.
    let created = create(json!({"name": "Bad-Name", "description": "x", "code": "def f(): pass"}));
    assert_eq!(created.failure.expect("failure").kind, ErrorKind::InvalidArgs);
}

#[test]
fn creating_an_existing_python_tool_makes_a_new_version() {
    let first = create(json!({"name": "twice", "description": "Doubles a number.",
        "code": "def twice(x: float) -> float:\n    return 2 * x\n", "inputs": {"x": 2}}));
    let tool = first.tool.unwrap_or_else(|| panic!("{:?}", first.result));
    assert_eq!(tool.manifest.version, "0.1.0");
    admit(tool);
    let second = create(json!({"name": "twice", "description": "Doubles a number, faster.",
        "code": "def twice(x: float) -> float:\n    return x + x\n", "inputs": {"x": 2}}));
    assert_eq!(second.tool.expect("created").manifest.version, "0.2.0");
}

#[test]
fn results_that_are_not_json_use_the_documented_encoding() {
    let code = r#"
import dataclasses, datetime, decimal, enum, fractions
@dataclasses.dataclass
class Point:
    x: int
    y: int
class Mode(enum.Enum):
    FAST = "fast"
class Opaque:
    def __repr__(self):
        return "<opaque>"
def values():
    return {
        "tuple": (1, 2), "set": {3, 1, 2}, "complex": 1 + 2j, "fraction": fractions.Fraction(1, 3),
        "decimal": decimal.Decimal("1.10"), "date": datetime.date(2024, 2, 29),
        "delta": datetime.timedelta(minutes=1), "bytes": b"hi", "nan": float("nan"), "inf": float("-inf"),
        "big": 2 ** 70, "int_keys": {1: "a"}, "point": Point(1, 2), "mode": Mode.FAST, "other": Opaque(),
    }
"#;
    let run = exec(code, "values", json!({}), limits(5000)).expect("runs");
    assert_eq!(
        run.result,
        json!({
            "tuple": [1, 2], "set": {"$set": [1, 2, 3]}, "complex": {"$complex": [1.0, 2.0]},
            "fraction": {"$fraction": "1/3"}, "decimal": {"$decimal": "1.10"}, "date": {"$date": "2024-02-29"},
            "delta": {"$timedelta": 60.0}, "bytes": {"$bytes": "aGk="}, "nan": {"$float": "nan"},
            "inf": {"$float": "-inf"}, "big": {"$int": "1180591620717411303424"}, "int_keys": {"$dict": [[1, "a"]]},
            "point": {"x": 1, "y": 2}, "mode": "fast", "other": {"$repr": "<opaque>"}
        })
    );
}

#[test]
fn random_is_reseeded_per_call() {
    let code = "import random\ndef draw():\n    return [random.random() for _ in range(3)]\n";
    let kwargs = Map::new();
    let r = runtime();
    let a = r.exec("draw", code, "draw", vec![], kwargs.clone(), limits(5000), Some(1)).expect("a").result;
    let b = r.exec("draw", code, "draw", vec![], kwargs.clone(), limits(5000), Some(1)).expect("b").result;
    let c = r.exec("draw", code, "draw", vec![], kwargs.clone(), limits(5000), None).expect("c").result;
    let d = r.exec("draw", code, "draw", vec![], kwargs, limits(5000), None).expect("d").result;
    assert_eq!(a, b, "same seed, same draws");
    assert_ne!(c, d, "fresh seeds differ (the pre-initialised snapshot must not freeze the state)");
}

/// One case of `host/sandbox/tests/data/python_hostile.jsonl`.
#[derive(Debug, serde::Deserialize)]
struct HostileCase {
    name: String,
    code: String,
    entry: String,
    #[serde(default)]
    kwargs: Value,
    expect: String,
    #[serde(default)]
    error_type: Option<String>,
    #[serde(default)]
    error_types: Vec<String>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    stdout_contains: Option<String>,
    #[serde(default)]
    followup: Option<Followup>,
}

#[derive(Debug, serde::Deserialize)]
struct Followup {
    code: String,
    entry: String,
    #[serde(default)]
    kwargs: Value,
    result: Value,
}

#[test]
fn hostile_corpus_gets_typed_outcomes_and_leaks_nothing() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/python_hostile.jsonl");
    let text = std::fs::read_to_string(&path).expect("corpus");
    let cases: Vec<HostileCase> =
        text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("case parses")).collect();
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    // Only the cases that must time out get a short deadline. Every other case
    // ends by itself, and a generous deadline keeps a loaded machine (CI runs
    // test binaries side by side) from turning a slow trap into a timeout.
    let limits = Limits {
        timeout: Duration::from_secs(30),
        memory_bytes: 128 << 20,
        output_bytes: 1 << 20,
        ..Limits::default()
    };
    let short = Limits { timeout: Duration::from_millis(1000), ..limits };
    let mut failures = Vec::new();
    for case in &cases {
        let case_limits = if case.expect == "timeout" { short } else { limits };
        let outcome = exec(&case.code, &case.entry, case.kwargs.clone(), case_limits);
        let verdict = match (&outcome, case.expect.as_str()) {
            (Ok(run), "ok") => match (&case.result, &case.stdout_contains) {
                (Some(expected), _) if &run.result != expected => Err(format!("result {} != {expected}", run.result)),
                (_, Some(s)) if !run.stdout.contains(s.as_str()) => Err(format!("stdout lacks {s:?}")),
                _ => Ok(()),
            },
            (Err(f), "python_error") if f.error.kind == ErrorKind::PythonError => {
                let got = f.error.exception.as_ref().map(|e| e.kind.clone()).unwrap_or_default();
                let allowed: Vec<&String> = case.error_type.iter().chain(case.error_types.iter()).collect();
                if allowed.is_empty() || allowed.iter().any(|t| **t == got) {
                    Ok(())
                } else {
                    Err(format!("exception {got}, expected one of {allowed:?}"))
                }
            }
            (Err(f), expect) if f.error.kind.as_str() == expect => Ok(()),
            (Ok(run), expect) => Err(format!("expected {expect}, got ok: {}", clip(&run.result.to_string()))),
            (Err(f), expect) => Err(format!("expected {expect}, got {}: {}", f.error.kind, clip(&f.error.message))),
        };
        if let Err(why) = verdict {
            failures.push(format!("{}: {why}", case.name));
        }
        if let Some(follow) = &case.followup {
            match exec(&follow.code, &follow.entry, follow.kwargs.clone(), limits) {
                Ok(run) if run.result == follow.result => {}
                Ok(run) => failures.push(format!("{} (followup): state leaked: {}", case.name, run.result)),
                Err(f) => failures.push(format!("{} (followup): {}", case.name, f.error)),
            }
        }
        // The host survives every case and keeps serving correctly.
        let sanity =
            exec("def ok():\n    return sum(range(10))\n", "ok", json!({}), limits).expect("host still serves");
        assert_eq!(sanity.result, json!(45), "after {}", case.name);
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

fn clip(s: &str) -> String {
    s.chars().take(200).collect()
}
