//! Tasks from interfaces: a user request, the call(s) that answer it, what they return.
//!
//! Argument values are drawn from each tool's schema ([`super::values`]) and the request is
//! written from the tool's and its parameters' descriptions in one of several phrasings, values
//! sometimes converted (small numbers as words, flags as yes/no), so that a policy must read and
//! copy rather than recall. Distractors of the choice family are the tools most similar to the
//! target (BM25 over names, descriptions and parameter names); an irrelevant request is one for a
//! tool that is not listed, beside the listed tools least like it. Everything is seeded: the same
//! interfaces and seed give the same tasks.

use std::collections::{BTreeMap, HashMap};

use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::values::{self, Unsampleable};
use super::{CallFamily, CallTask, GoldenCall, Interface};

/// How many tasks of each family a set has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Mix {
    /// One tool, one call.
    pub single: usize,
    /// The right tool among similar ones.
    pub choice: usize,
    /// Two calls in one turn.
    pub parallel: usize,
    /// Two calls, the second on the first's result.
    pub chained: usize,
    /// No listed tool fits.
    pub irrelevant: usize,
}

impl Mix {
    /// `n` of every family.
    pub const fn each(n: usize) -> Mix {
        Mix { single: n, choice: n, parallel: n, chained: n, irrelevant: n }
    }

    fn count(&self, family: CallFamily) -> usize {
        match family {
            CallFamily::Single => self.single,
            CallFamily::Choice => self.choice,
            CallFamily::Parallel => self.parallel,
            CallFamily::Chained => self.chained,
            CallFamily::Irrelevant => self.irrelevant,
        }
    }
}

/// What a tool returns for a call: the real tool, the ToolActor, or a value of its output schema.
pub trait Observer {
    /// The result of `tool` called with `arguments`.
    fn observe(&self, tool: &Interface, arguments: &Map<String, Value>) -> Result<Value, String>;
}

/// Answers from the output schema, seeded by the call (the same call, the same answer).
#[derive(Debug, Clone, Copy, Default)]
pub struct SchemaObserver;

impl Observer for SchemaObserver {
    fn observe(&self, tool: &Interface, arguments: &Map<String, Value>) -> Result<Value, String> {
        let mut rng = StdRng::seed_from_u64(call_seed(&tool.name, arguments));
        values::output(&tool.output_schema, &mut rng).map_err(|e| e.to_string())
    }
}

/// A seed from a call's name and arguments.
pub fn call_seed(name: &str, arguments: &Map<String, Value>) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(name.as_bytes());
    h.update(&[0]);
    h.update(Value::Object(arguments.clone()).to_string().as_bytes());
    let mut word = [0_u8; 8];
    word.copy_from_slice(&h.finalize().as_bytes()[..8]);
    u64::from_le_bytes(word)
}

/// A tool left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// The tool.
    pub tool: String,
    /// Why its arguments cannot be drawn.
    pub why: String,
}

/// A generated set.
#[derive(Debug, Clone, Default)]
pub struct Generated {
    /// The tasks, family by family.
    pub tasks: Vec<CallTask>,
    /// Tools whose schemas could not be sampled.
    pub skipped: Vec<Skipped>,
    /// Families that got fewer tasks than asked, and why.
    pub short: Vec<String>,
}

/// Why no tasks can be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// No interface at all.
    #[error("no tool interfaces to make tasks from")]
    Empty,
    /// Every interface was skipped.
    #[error("no tool's arguments can be sampled: {0}")]
    NoneUsable(String),
}

/// The tools of `pool` whose arguments can be drawn, and those that cannot with the reason.
pub fn usable(pool: &[Interface], seed: u64) -> (Vec<Interface>, Vec<Skipped>) {
    let mut ok = Vec::new();
    let mut skipped = Vec::new();
    for t in pool {
        let check = (0..4).try_for_each(|k| {
            let mut rng = StdRng::seed_from_u64(seed ^ k);
            values::arguments(&t.parameters, 1.0, &mut rng).map(|_| ())
        });
        match check {
            Ok(()) => ok.push(t.clone()),
            Err(e) => skipped.push(Skipped { tool: t.name.clone(), why: e.to_string() }),
        }
    }
    (ok, skipped)
}

/// Tasks over `pool` (the tools that are listed and called); irrelevant requests ask for tools
/// of `elsewhere` (tools that are never listed with them). Tasks are numbered `prefix-family-k`.
pub fn generate(
    pool: &[Interface],
    elsewhere: &[Interface],
    mix: Mix,
    seed: u64,
    observer: &dyn Observer,
    prefix: &str,
) -> Result<Generated, TaskError> {
    if pool.is_empty() {
        return Err(TaskError::Empty);
    }
    let (tools, skipped) = usable(pool, seed);
    if tools.is_empty() {
        let why: Vec<String> = skipped.iter().map(|s| format!("{}: {}", s.tool, s.why)).collect();
        return Err(TaskError::NoneUsable(why.join("; ")));
    }
    let (others, _) = usable(elsewhere, seed);
    let index = Bm25::new(&tools);
    let chains = chain_pairs(&tools);
    let mut out = Generated { skipped, ..Generated::default() };
    for (f, family) in CallFamily::ALL.into_iter().enumerate() {
        let want = mix.count(family);
        let mut made = 0;
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        for attempt in 0..want * 4 {
            if made == want {
                break;
            }
            let mut rng = StdRng::seed_from_u64(crate::rl::sampler::seed_of(&[seed, f as u64, attempt as u64]));
            let id = format!("{prefix}-{}-{made}", family.name());
            let task = match family {
                CallFamily::Single => single(&tools, &mut rng, observer, id),
                CallFamily::Choice => choice(&tools, &index, &mut rng, observer, id),
                CallFamily::Parallel => parallel(&tools, &mut rng, observer, id),
                CallFamily::Chained => chained(&tools, &chains, &mut rng, observer, id),
                CallFamily::Irrelevant => irrelevant(&tools, &others, &index, &mut rng, id),
            };
            match task {
                Ok(t) => {
                    out.tasks.push(t);
                    made += 1;
                }
                Err(why) => *reasons.entry(why).or_default() += 1,
            }
        }
        if made < want {
            let why: Vec<String> = reasons.into_iter().map(|(r, n)| format!("{r} ({n}x)")).collect();
            out.short.push(format!("{}: {made} of {want} tasks ({})", family.name(), why.join("; ")));
        }
    }
    Ok(out)
}

fn draw(tool: &Interface, rng: &mut StdRng) -> Result<Map<String, Value>, String> {
    if !tool.examples.is_empty() && rng.random_bool(0.7) {
        let picked = tool.examples.choose(rng).and_then(Value::as_object).cloned().unwrap_or_default();
        let valid =
            jsonschema::validator_for(&tool.parameters).is_ok_and(|v| v.is_valid(&Value::Object(picked.clone())));
        if valid {
            return Ok(picked);
        }
    }
    values::arguments(&tool.parameters, 0.4, rng).map_err(|e: Unsampleable| e.to_string())
}

fn observe(observer: &dyn Observer, tool: &Interface, args: &Map<String, Value>) -> Result<Value, String> {
    observer.observe(tool, args).map_err(|e| format!("{} gave no result: {e}", tool.name))
}

fn answer_after(calls: &[(&Interface, &Value)]) -> String {
    let parts: Vec<String> = calls
        .iter()
        .map(|(t, r)| {
            let mut s = r.to_string();
            if s.len() > 160 {
                s = s.chars().take(160).collect::<String>() + "...";
            }
            format!("{} returned {s}", t.name)
        })
        .collect();
    format!("Done: {}.", parts.join("; "))
}

fn single(tools: &[Interface], rng: &mut StdRng, observer: &dyn Observer, id: String) -> Result<CallTask, String> {
    let tool = tools.choose(rng).ok_or("no tools")?;
    let args = draw(tool, rng)?;
    let obs = observe(observer, tool, &args)?;
    let style = rng.random_range(0..STYLES);
    Ok(CallTask {
        id,
        family: CallFamily::Single,
        request: request(tool, &args, style, rng),
        tools: vec![tool.clone()],
        answer: answer_after(&[(tool, &obs)]),
        turns: vec![vec![GoldenCall { name: tool.name.clone(), arguments: args }]],
        observations: vec![vec![obs]],
    })
}

fn choice(
    tools: &[Interface],
    index: &Bm25,
    rng: &mut StdRng,
    observer: &dyn Observer,
    id: String,
) -> Result<CallTask, String> {
    let i = rng.random_range(0..tools.len());
    let tool = &tools[i];
    let k = rng.random_range(2..=4);
    let near = index.nearest(i, k);
    if near.is_empty() {
        return Err("no other tool to choose among".into());
    }
    let mut listed: Vec<Interface> = near.into_iter().map(|j| tools[j].clone()).collect();
    listed.push(tool.clone());
    listed.shuffle(rng);
    let args = draw(tool, rng)?;
    let obs = observe(observer, tool, &args)?;
    let style = rng.random_range(0..STYLES);
    Ok(CallTask {
        id,
        family: CallFamily::Choice,
        request: request(tool, &args, style, rng),
        tools: listed,
        answer: answer_after(&[(tool, &obs)]),
        turns: vec![vec![GoldenCall { name: tool.name.clone(), arguments: args }]],
        observations: vec![vec![obs]],
    })
}

fn parallel(tools: &[Interface], rng: &mut StdRng, observer: &dyn Observer, id: String) -> Result<CallTask, String> {
    let a = tools.choose(rng).ok_or("no tools")?;
    // Half the time the same tool twice (two cities' forecasts), else two tools.
    let b = if tools.len() == 1 || rng.random_bool(0.5) { a } else { tools.choose(rng).ok_or("no tools")? };
    let first = draw(a, rng)?;
    let mut second = draw(b, rng)?;
    let mut tries = 0;
    while a.name == b.name && second == first {
        tries += 1;
        if tries > 8 {
            return Err("the tool's arguments take one value only".into());
        }
        second = draw(b, rng)?;
    }
    let (oa, ob) = (observe(observer, a, &first)?, observe(observer, b, &second)?);
    let style = rng.random_range(0..STYLES);
    let (ra, rb) = (request(a, &first, style, rng), request(b, &second, (style + 1) % STYLES, rng));
    let joiner =
        ["Also, at the same time: ", "And separately: ", "In parallel, "].choose(rng).copied().unwrap_or("Also: ");
    let mut listed = vec![a.clone()];
    if b.name != a.name {
        listed.push(b.clone());
    }
    listed.shuffle(rng);
    Ok(CallTask {
        id,
        family: CallFamily::Parallel,
        request: format!("{ra} {joiner}{}", lower_first(&rb)),
        tools: listed,
        answer: answer_after(&[(a, &oa), (b, &ob)]),
        turns: vec![vec![
            GoldenCall { name: a.name.clone(), arguments: first },
            GoldenCall { name: b.name.clone(), arguments: second },
        ]],
        observations: vec![vec![oa, ob]],
    })
}

/// Pairs `(a, b, field)`: `a`'s result has a field of the name and type of one of `b`'s
/// parameters.
fn chain_pairs(tools: &[Interface]) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for (i, a) in tools.iter().enumerate() {
        let Some(fields) = a.output_schema.get("properties").and_then(Value::as_object) else { continue };
        for (j, b) in tools.iter().enumerate() {
            if i == j {
                continue;
            }
            let Some(params) = b.parameters.get("properties").and_then(Value::as_object) else { continue };
            for (f, fs) in fields {
                if let Some(ps) = params.get(f)
                    && fs.get("type").is_some()
                    && accepts(ps, fs.get("type"))
                {
                    out.push((i, j, f.clone()));
                }
            }
        }
    }
    out
}

/// Whether a parameter's schema takes values of JSON `kind` (its type, or one of its branches').
fn accepts(param: &Value, kind: Option<&Value>) -> bool {
    param.get("type") == kind
        || ["anyOf", "oneOf"]
            .iter()
            .any(|k| param.get(*k).and_then(Value::as_array).is_some_and(|bs| bs.iter().any(|b| b.get("type") == kind)))
}

fn chained(
    tools: &[Interface],
    chains: &[(usize, usize, String)],
    rng: &mut StdRng,
    observer: &dyn Observer,
    id: String,
) -> Result<CallTask, String> {
    let (i, j, field) = chains.choose(rng).ok_or("no tool's result feeds another tool's parameter")?;
    let (a, b) = (&tools[*i], &tools[*j]);
    let first = draw(a, rng)?;
    let oa = observe(observer, a, &first)?;
    let value = oa.get(field).cloned().ok_or_else(|| format!("{}'s result has no `{field}`", a.name))?;
    let mut second = draw(b, rng)?;
    second.insert(field.clone(), value);
    let b_validator = jsonschema::validator_for(&b.parameters).map_err(|e| e.to_string())?;
    if !b_validator.is_valid(&Value::Object(second.clone())) {
        return Err(format!("{}'s `{field}` does not accept {}'s value", b.name, a.name));
    }
    let ob = observe(observer, b, &second)?;
    let style = rng.random_range(0..STYLES);
    let ra = request(a, &first, style, rng);
    let mut rest = second.clone();
    rest.remove(field);
    let label = label_of(b, field, rng);
    let then = if rest.is_empty() {
        format!("Then {} using the {label} from that result.", purpose(&b.name, &b.description))
    } else {
        let stated: Vec<String> =
            rest.iter().map(|(k, v)| format!("{} {}", label_of(b, k, rng), verbal(v, style))).collect();
        format!(
            "Then {} with the {label} from that result, and {}.",
            purpose(&b.name, &b.description),
            and_list(&stated)
        )
    };
    let mut listed = vec![a.clone(), b.clone()];
    listed.shuffle(rng);
    Ok(CallTask {
        id,
        family: CallFamily::Chained,
        request: format!("First: {ra} {then}"),
        tools: listed,
        answer: answer_after(&[(b, &ob)]),
        turns: vec![
            vec![GoldenCall { name: a.name.clone(), arguments: first }],
            vec![GoldenCall { name: b.name.clone(), arguments: second }],
        ],
        observations: vec![vec![oa], vec![ob]],
    })
}

fn irrelevant(
    tools: &[Interface],
    others: &[Interface],
    index: &Bm25,
    rng: &mut StdRng,
    id: String,
) -> Result<CallTask, String> {
    let asked = others.choose(rng).ok_or("no unlisted tool to ask for")?;
    let args = draw(asked, rng)?;
    let style = rng.random_range(0..STYLES);
    let text = request(asked, &args, style, rng);
    let k = rng.random_range(1..=3);
    // A listed tool that shares a parameter with the asked one might do the job: never listed.
    let asked_params = parameter_names(asked);
    let listed: Vec<Interface> = index
        .farthest(&tokens(&text), tools.len())
        .into_iter()
        .map(|j| &tools[j])
        .filter(|t| t.name != asked.name && parameter_names(t).iter().all(|p| !asked_params.contains(p)))
        .take(k)
        .cloned()
        .collect();
    if listed.is_empty() {
        return Err("every tool is like the request's".into());
    }
    Ok(CallTask {
        id,
        family: CallFamily::Irrelevant,
        request: text,
        answer: format!(
            "None of the available tools can {}, so I cannot do this with them.",
            purpose(&asked.name, &asked.description)
        ),
        tools: listed,
        turns: vec![Vec::new()],
        observations: Vec::new(),
    })
}

fn parameter_names(tool: &Interface) -> Vec<String> {
    tool.parameters.get("properties").and_then(Value::as_object).map_or(Vec::new(), |p| p.keys().cloned().collect())
}

/// How many request phrasings there are.
pub const STYLES: usize = 6;

/// The tool's description as an imperative phrase: "Looks up a flight." -> "look up a flight".
pub fn purpose(name: &str, description: &str) -> String {
    let first = description.split(['\n']).next().unwrap_or(description);
    let first = first.split(". ").next().unwrap_or(first).trim().trim_end_matches('.');
    // Asides and what the tool gives back are not part of what is asked.
    let mut bare = String::new();
    let mut depth = 0_usize;
    for ch in first.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => bare.push(ch),
            _ => {}
        }
    }
    let mut first = bare.split_whitespace().collect::<Vec<_>>().join(" ").replace(" ,", ",");
    for cut in [", and return", " and return", ", returning"] {
        if let Some(i) = first.find(cut) {
            first.truncate(i);
        }
    }
    if first.split_whitespace().count() > 10
        && let Some(i) = first.find(',')
    {
        first.truncate(i);
    }
    // "Text utilities: regex find, replace, split" names a kit rather than an action.
    if let Some((_, rest)) = first.split_once(": ") {
        let what = rest.split(',').next().unwrap_or(rest).trim();
        return format!("use the {name} tool for {what}");
    }
    let mut s = first;
    for prefix in ["Use this tool to ", "Use this to ", "This tool ", "Tool that ", "A tool that ", "Function that "] {
        if let Some(rest) = s.strip_prefix(prefix) {
            s = rest.to_string();
        }
    }
    let (head, rest) = s.split_once(' ').map_or((s.as_str(), ""), |(h, r)| (h, r));
    let lower = head.to_lowercase();
    let base = if lower.ends_with("ies") {
        format!("{}y", &lower[..lower.len() - 3])
    } else if lower.ends_with("sses") || lower.ends_with("shes") || lower.ends_with("ches") || lower.ends_with("xes") {
        lower[..lower.len() - 2].to_string()
    } else if lower.ends_with('s') && !lower.ends_with("ss") && lower.len() > 3 {
        lower[..lower.len() - 1].to_string()
    } else {
        lower
    };
    if rest.is_empty() { base } else { format!("{base} {rest}") }
}

/// Lower-cases the first letter, unless the word is an acronym ("IATA code" stays).
fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    if s.chars().nth(1).is_some_and(char::is_uppercase) {
        return s.to_string();
    }
    c.next().map_or_else(String::new, |f| f.to_lowercase().chain(c).collect())
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    c.next().map_or_else(String::new, |f| f.to_uppercase().chain(c).collect())
}

/// "departure_airport" / "departureAirport" -> "departure airport".
pub fn humanize(name: &str) -> String {
    let mut out = String::new();
    for (i, ch) in name.chars().enumerate() {
        if ch == '_' || ch == '-' || ch == '.' {
            out.push(' ');
        } else if ch.is_uppercase() && i > 0 {
            out.push(' ');
            out.extend(ch.to_lowercase());
        } else {
            out.push(ch);
        }
    }
    out.trim().to_string()
}

/// What a request calls a parameter: its name in words, or the start of its description.
fn label_of(tool: &Interface, name: &str, rng: &mut StdRng) -> String {
    let about = tool
        .parameters
        .pointer(&format!("/properties/{}/description", name.replace('~', "~0").replace('/', "~1")))
        .and_then(Value::as_str)
        .map(|d| {
            let clause = d.split([',', '.', '(', ';', ':', '\n']).next().unwrap_or(d).trim();
            let clause = clause.strip_prefix("The ").or_else(|| clause.strip_prefix("the ")).unwrap_or(clause);
            clause.split_whitespace().take(8).collect::<Vec<_>>().join(" ")
        })
        .filter(|c| !c.is_empty());
    match about {
        Some(a) if rng.random_bool(0.35) => lower_first(&a),
        _ => humanize(name),
    }
}

const SMALL: [&str; 13] =
    ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"];

/// A value as a request states it; some styles convert (numbers to words, flags to yes/no).
fn verbal(v: &Value, style: usize) -> String {
    match v {
        Value::String(s) if style == 1 || style == 5 => format!("\"{s}\""),
        Value::String(s) => s.clone(),
        Value::Bool(b) => match style {
            0 | 4 => if *b { "yes" } else { "no" }.into(),
            2 => b.to_string(),
            _ => if *b { "on" } else { "off" }.into(),
        },
        Value::Number(n) if style == 3 || style == 5 => match n.as_u64() {
            Some(k) if (k as usize) < SMALL.len() => SMALL[k as usize].to_string(),
            _ => n.to_string(),
        },
        Value::Number(n) => n.to_string(),
        Value::Array(items) => and_list(&items.iter().map(|i| verbal(i, style)).collect::<Vec<_>>()),
        other => other.to_string(),
    }
}

fn and_list(items: &[String]) -> String {
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// A request for `tool` with `args`, in phrasing `style`.
pub fn request(tool: &Interface, args: &Map<String, Value>, style: usize, rng: &mut StdRng) -> String {
    let what = purpose(&tool.name, &tool.description);
    let mut pairs: Vec<(String, String)> =
        args.iter().map(|(k, v)| (label_of(tool, k, rng), verbal(v, style))).collect();
    pairs.shuffle(rng);
    let joined = |f: &dyn Fn(&(String, String)) -> String| and_list(&pairs.iter().map(f).collect::<Vec<_>>());
    if pairs.is_empty() {
        return format!("Please {what}.");
    }
    match style % STYLES {
        0 => {
            format!("Please {what}: {}.", pairs.iter().map(|(l, v)| format!("{l} {v}")).collect::<Vec<_>>().join(", "))
        }
        1 => format!("I need to {what}. Use {}.", joined(&|(l, v)| format!("{v} for the {l}"))),
        2 => format!("Can you {what}? {}.", upper_first(&joined(&|(l, v)| format!("the {l} is {v}")))),
        3 => format!("{} with {}.", upper_first(&what), joined(&|(l, v)| format!("{l} set to {v}"))),
        4 => format!(
            "{}\nWith those, {what}.",
            pairs.iter().map(|(l, v)| format!("{}: {v}", upper_first(l))).collect::<Vec<_>>().join("\n")
        ),
        _ => format!("Could you help me {what}, using {}?", joined(&|(l, v)| format!("{v} as the {l}"))),
    }
}

/// Lower-case words of a text, names split at `_`, `-` and case changes.
fn tokens(text: &str) -> Vec<String> {
    humanize(text)
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
        .map(str::to_string)
        .collect()
}

fn document(t: &Interface) -> Vec<String> {
    let mut words = tokens(&t.name);
    words.extend(tokens(&t.description));
    if let Some(props) = t.parameters.get("properties").and_then(Value::as_object) {
        for k in props.keys() {
            words.extend(tokens(k));
        }
    }
    words
}

/// Okapi BM25 over the tools' names, descriptions and parameter names: what makes distractors
/// similar and irrelevant listings unlike the request.
struct Bm25 {
    docs: Vec<HashMap<String, f64>>,
    lengths: Vec<f64>,
    idf: HashMap<String, f64>,
    mean: f64,
}

impl Bm25 {
    fn new(tools: &[Interface]) -> Self {
        let docs: Vec<Vec<String>> = tools.iter().map(document).collect();
        let n = docs.len() as f64;
        let mut df: HashMap<String, f64> = HashMap::new();
        for d in &docs {
            let mut seen: Vec<&String> = d.iter().collect();
            seen.sort();
            seen.dedup();
            for w in seen {
                *df.entry(w.clone()).or_default() += 1.0;
            }
        }
        let idf = df.into_iter().map(|(w, f)| (w, ((n - f + 0.5) / (f + 0.5) + 1.0).ln())).collect();
        let lengths: Vec<f64> = docs.iter().map(|d| d.len() as f64).collect();
        let mean = lengths.iter().sum::<f64>() / n.max(1.0);
        let docs = docs
            .into_iter()
            .map(|d| {
                let mut tf = HashMap::new();
                for w in d {
                    *tf.entry(w).or_default() += 1.0;
                }
                tf
            })
            .collect();
        Bm25 { docs, lengths, idf, mean }
    }

    fn score(&self, query: &[String], doc: usize) -> f64 {
        let (k1, b) = (1.2, 0.75);
        query
            .iter()
            .map(|w| {
                let tf = self.docs[doc].get(w).copied().unwrap_or(0.0);
                let idf = self.idf.get(w).copied().unwrap_or(0.0);
                idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * self.lengths[doc] / self.mean.max(1.0)))
            })
            .sum()
    }

    fn ranked(&self, query: &[String]) -> Vec<(usize, f64)> {
        let mut all: Vec<(usize, f64)> = (0..self.docs.len()).map(|d| (d, self.score(query, d))).collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all
    }

    /// The `k` tools most like tool `i` (itself left out).
    fn nearest(&self, i: usize, k: usize) -> Vec<usize> {
        let query: Vec<String> = self.docs[i].keys().cloned().collect();
        self.ranked(&query).into_iter().filter(|(d, _)| *d != i).take(k).map(|(d, _)| d).collect()
    }

    /// The `k` tools least like `query`.
    fn farthest(&self, query: &[String], k: usize) -> Vec<usize> {
        let mut ranked = self.ranked(query);
        ranked.reverse();
        ranked.into_iter().take(k).map(|(d, _)| d).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::synthetic::{Split, interfaces};
    use super::*;

    fn set(seed: u64) -> Generated {
        let pool = interfaces(Split::Train, 60, seed);
        let others = interfaces(Split::HeldOut, 20, seed);
        generate(&pool, &others, Mix::each(12), seed, &SchemaObserver, "t").expect("tasks")
    }

    #[test]
    fn every_family_is_made_with_ground_truth_that_validates() {
        let g = set(1);
        assert!(g.short.is_empty(), "{:?}", g.short);
        assert_eq!(g.tasks.len(), 60);
        for t in &g.tasks {
            for turn in &t.turns {
                for call in turn {
                    let tool = t.tool(&call.name).expect("the golden tool is listed");
                    let v = jsonschema::validator_for(&tool.parameters).expect("schema");
                    assert!(v.is_valid(&Value::Object(call.arguments.clone())), "{}: {:?}", t.id, call.arguments);
                }
            }
            match t.family {
                CallFamily::Irrelevant => assert!(t.turns == vec![Vec::new()]),
                CallFamily::Chained => {
                    assert_eq!(t.turns.len(), 2);
                    // The second call carries a value of the first one's result.
                    let first = &t.observations[0][0];
                    let shared = t.turns[1][0].arguments.iter().any(|(k, v)| first.get(k) == Some(v));
                    assert!(shared, "{}", t.id);
                }
                CallFamily::Parallel => assert_eq!(t.turns[0].len(), 2),
                CallFamily::Choice => assert!(t.tools.len() >= 3),
                CallFamily::Single => assert_eq!(t.tools.len(), 1),
            }
        }
    }

    #[test]
    fn tasks_are_deterministic_per_seed_and_phrased_many_ways() {
        let (a, b, c) = (set(4), set(4), set(5));
        assert_eq!(a.tasks, b.tasks);
        assert_ne!(a.tasks, c.tasks);
        let openings: std::collections::BTreeSet<String> =
            a.tasks.iter().map(|t| t.request.split_whitespace().take(2).collect::<Vec<_>>().join(" ")).collect();
        assert!(openings.len() >= 6, "{openings:?}");
    }

    #[test]
    fn unsampleable_tools_are_reported_and_an_empty_pool_refused() {
        let mut pool = interfaces(Split::Train, 10, 2);
        pool.push(Interface {
            name: "negated".into(),
            description: "Refuses strings.".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"x": {"not": {"type": "string"}}}, "required": ["x"]}),
            output_schema: serde_json::json!({"type": "object"}),
            real: false,
            examples: Vec::new(),
        });
        let g = generate(&pool, &[], Mix::each(2), 2, &SchemaObserver, "t").expect("tasks");
        assert_eq!(g.skipped.len(), 1);
        assert!(g.skipped[0].why.contains("not"), "{}", g.skipped[0].why);
        assert!(g.tasks.iter().all(|t| t.tools.iter().all(|l| l.name != "negated")));
        assert_eq!(generate(&[], &[], Mix::each(1), 0, &SchemaObserver, "t").err(), Some(TaskError::Empty));
        assert!(matches!(
            generate(&pool[10..], &[], Mix::each(1), 0, &SchemaObserver, "t"),
            Err(TaskError::NoneUsable(_))
        ));
    }

    #[test]
    fn purposes_read_as_imperatives() {
        assert_eq!(purpose("t", "Looks up a flight given its number."), "look up a flight given its number");
        assert_eq!(purpose("t", "Use this to book a flight."), "book a flight");
        assert_eq!(purpose("t", "Evaluates an arithmetic expression."), "evaluate an arithmetic expression");
        assert_eq!(purpose("t", "Fetches the page. More text"), "fetch the page");
        assert_eq!(humanize("departureAirport"), "departure airport");
        assert_eq!(purpose("text", "Text utilities: regex find, replace, split."), "use the text tool for regex find");
        assert_eq!(
            purpose(
                "t",
                "Evaluates an arithmetic expression with operator precedence, parentheses, functions (sqrt, exp, ...) and constants (pi, e), and returns its value as a number."
            ),
            "evaluate an arithmetic expression with operator precedence"
        );
        assert_eq!(
            purpose(
                "t",
                "Selects values from a JSON document with a JSONPath query (RFC 9535: $.a.b) and returns the matches."
            ),
            "select values from a JSON document with a JSONPath query"
        );
    }
}
