//! Simulated tools (MTR): an interface-only tool answered by the ToolActor over an untrained tiny
//! policy; every observation validates, and bad arguments never reach the model.

use std::sync::{Arc, Mutex};

use serde_json::json;
use toolsmith_agent::simulate::{ToolActor, admit};
use toolsmith_agent::tools::{Executor, LocalTools, Verdict};
use toolsmith_policy::{LoadOptions, Policy, SamplingParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_tools_answer_with_valid_observations() {
    toolsmith_policy::set_threads(1);
    let policy = Arc::new(Mutex::new(Policy::tiny(3, LoadOptions::default()).expect("tiny")));
    let params = SamplingParams { max_new_tokens: 32, temperature: 1.0, seed: 5, ..SamplingParams::default() };
    let actor = Arc::new(ToolActor::new(policy, params).expect("actor"));
    let tools = LocalTools::new().with_simulator(actor);
    let manifest = admit(
        r#"{"name": "flight_status", "description": "Status of a flight.",
            "input_schema": {"type": "object", "properties": {"flight": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}, "required": ["flight"]},
            "output_schema": {"type": "object", "properties": {
                "status": {"enum": ["on_time", "delayed", "cancelled"]},
                "delay_min": {"type": "integer", "minimum": 0, "maximum": 600},
                "gate": {"type": "string", "pattern": "^[A-F][0-9]{1,2}$"}
            }, "required": ["status", "gate"]}}"#,
    )
    .expect("admitted");
    tools.add_simulated(manifest).expect("schemas compile");
    assert!(tools.manifests().iter().any(|m| m.name.as_str() == "flight_status"));
    let mut outputs = Vec::new();
    for i in 0..20 {
        let args = json!({"flight": format!("LH{:03}", 100 + i)});
        let out = tools.call("flight_status", &args).await.value.expect("a valid observation");
        outputs.push(out.clone());
        assert!(["on_time", "delayed", "cancelled"].contains(&out["status"].as_str().expect("status")), "{out}");
        let gate = out["gate"].as_str().expect("gate");
        assert!(gate.starts_with(|c: char| ('A'..='F').contains(&c)) && gate.len() <= 3, "{out}");
    }
    // One call, one answer: the same arguments draw the same observation whatever was called
    // in between (concurrent episodes), other arguments another draw.
    let first = tools.call("flight_status", &json!({"flight": "LH100"})).await.value.expect("valid");
    let again = tools.call("flight_status", &json!({"flight": "LH100"})).await.value.expect("valid");
    assert_eq!(first, again);
    // A new actor (a resumed run) answers its first call as this one answered its first: the
    // seed does not depend on the calls before it. (Later calls of one policy may round
    // differently from a first one, through its caches, and a draw at temperature 1 may follow.)
    let fresh = Arc::new(
        ToolActor::new(
            Arc::new(Mutex::new(Policy::tiny(3, LoadOptions::default()).expect("tiny"))),
            SamplingParams { max_new_tokens: 32, temperature: 1.0, seed: 5, ..SamplingParams::default() },
        )
        .expect("actor"),
    );
    let tools_again = LocalTools::new().with_simulator(fresh);
    tools_again
        .add_simulated(tools.manifests().into_iter().find(|m| m.name.as_str() == "flight_status").expect("tool"))
        .expect("added");
    assert_eq!(tools_again.call("flight_status", &json!({"flight": "LH100"})).await.value.expect("valid"), outputs[0]);
    let manifest = tools.manifests().into_iter().find(|m| m.name.as_str() == "flight_status").expect("tool");
    let seeds: std::collections::HashSet<u64> = (0..20)
        .map(|i| toolsmith_agent::simulate::call_seed(5, &manifest, &json!({"flight": format!("LH{:03}", 100 + i)})))
        .collect();
    assert_eq!(seeds.len(), 20, "other arguments, other seeds");
    let bad = tools.call("flight_status", &json!({"flight": "nope"})).await;
    assert_eq!(Verdict::of(&bad.value), Verdict::InvalidArgs);
    let missing = tools.call("flight_statu", &json!({})).await;
    assert_eq!(Verdict::of(&missing.value), Verdict::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_maker_designs_admissible_interfaces_with_an_untrained_policy() {
    toolsmith_policy::set_threads(1);
    let policy = Arc::new(Mutex::new(Policy::tiny(4, LoadOptions::default()).expect("tiny")));
    let params = SamplingParams { temperature: 1.0, seed: 9, ..SamplingParams::default() };
    let actor = Arc::new(ToolActor::new(policy, params).expect("actor"));
    let designed = actor.design("Plan a trip: flights, hotels and the weather.", 8).expect("generation");
    assert_eq!(designed.len(), 8);
    let tools = LocalTools::new().with_simulator(actor.clone());
    let mut names = std::collections::HashSet::new();
    for manifest in designed {
        let manifest = manifest.expect("every constrained design is admitted");
        names.insert(manifest.name.as_str().to_string());
        // A designed tool is simulated at once: its observations validate.
        let args: serde_json::Map<String, serde_json::Value> = manifest.input_schema["properties"]
            .as_object()
            .expect("properties")
            .iter()
            .map(|(k, v)| {
                let value = match v["type"].as_str() {
                    Some("string") => json!("x"),
                    Some("boolean") => json!(true),
                    _ => json!(1),
                };
                (k.clone(), value)
            })
            .collect();
        let name = manifest.name.as_str().to_string();
        tools.add_simulated(manifest).expect("schemas compile");
        let out = tools.call(&name, &serde_json::Value::Object(args)).await;
        assert_eq!(Verdict::of(&out.value), Verdict::Valid, "{:?}", out.value);
    }
    // Each design draws with its own seed. How many of a random model's 8 names coincide depends
    // on the CPU's rounding (8 distinct on one machine, 4 on another); a shared seed would give 1.
    assert!(names.len() >= 4, "sampled designs differ: {names:?}");
}
