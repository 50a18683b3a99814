//! The agent on the bundled offline world: every mode driven by the oracle, the same agent with its
//! tools over MCP, simulated tools and the tool maker from an untrained policy, and that policy
//! behind an OpenAI-compatible endpoint.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use tokio::runtime::Runtime;
use toolsmith_agent::backend::{Backend, GenerateOptions, LocalBackend, Message, OpenAiBackend};
use toolsmith_agent::env::{Corpus, Family, Task, World, WorldConfig};
use toolsmith_agent::eval::{Report, evaluate, peak_by_objectives};
use toolsmith_agent::mcp::McpTools;
use toolsmith_agent::simulate::{ToolActor, admit};
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_agent::{Agent, AgentConfig, Mode, Oracle};
use toolsmith_policy::{LoadOptions, Policy, SamplingParams, Tokenizer};

use super::Env;

/// A tool the untrained policy simulates: its schemas constrain what it may answer.
const FLIGHT_STATUS: &str = r#"{"name": "flight_status", "description": "Status of a flight by its number.",
            "input_schema": {"type": "object", "properties": {"flight": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}, "required": ["flight"]},
            "output_schema": {"type": "object", "properties": {"status": {"enum": ["on_time", "delayed", "cancelled"]},
                "gate": {"type": "string", "pattern": "^[A-F][0-9]{1,2}$"}, "delay_min": {"type": "integer", "minimum": 0, "maximum": 600}},
                "required": ["status", "gate"]}}"#;

/// Prints `the agent on the bundled offline world (oracle traces; CPU, no trained model needed):`,
/// the world, a table of mean turns per family and mode, then one line per further phase.
pub(super) fn section(env: &Env) -> Result<()> {
    println!("\nthe agent on the bundled offline world (oracle traces; CPU, no trained model needed):");
    let world = World::generate(WorldConfig::default());
    let tasks = world.tasks();
    let corpus = Arc::new(Corpus::new(&world.documents())?);
    println!(
        "  world             -> {} entities as {} documents, BM25 top-3 search; {} tasks in {} families",
        world.entities.len(),
        corpus.len(),
        tasks.len(),
        Family::GENERATED.len()
    );
    let toolbox = env.toolbox_maybe_python("Python tools are")?;
    let tools: Arc<dyn Executor> = Arc::new(
        LocalTools::new().with_corpus(corpus.clone()).with_toolbox(toolbox, toolsmith_sandbox::Limits::default()),
    );
    let tokenizer = Arc::new(Tokenizer::tiny()?);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let reports = every_mode(&runtime, &tasks, &tools, &tokenizer);
    print_reports(&reports);

    tools_over_mcp(env, &runtime, &tasks, &corpus, &tokenizer)?;
    println!(
        "  try it: toolsmith run \"{}\" --mode gap",
        tasks.iter().find(|t| t.family == Family::MultiHopParallel).map_or("", |t| t.question.as_str())
    );

    let actor = simulated_tools(&runtime)?;
    tool_maker(&actor)?;
    chat_endpoint(&runtime)
}

/// Every task of the world in every mode, the oracle writing the traces.
fn every_mode(
    runtime: &Runtime,
    tasks: &[Task],
    tools: &Arc<dyn Executor>,
    tokenizer: &Arc<Tokenizer>,
) -> BTreeMap<Mode, Report> {
    let mut reports = BTreeMap::new();
    for mode in Mode::ALL {
        let oracle = Arc::new(Oracle::new(tasks, mode, tokenizer.clone()));
        let agent = Agent::new(oracle, tools.clone(), AgentConfig { mode, max_turns: 16, ..AgentConfig::default() });
        reports.insert(mode, runtime.block_on(evaluate(&agent, tasks, 4, |_| {})));
    }
    reports
}

/// The table of turns and EM per family and mode, peak context per objective count, and the
/// Python tools SEARL created.
fn print_reports(reports: &BTreeMap<Mode, Report>) {
    println!(
        "  {:<22} {:>8} {:>8} {:>8} {:>8}   (mean turns; EM in brackets)",
        "family", "react", "gap", "mem", "searl"
    );
    for family in Family::GENERATED {
        let cell = |m: Mode| {
            reports[&m].families.get(&family).map_or("-".to_string(), |s| format!("{:.2} [{:.0}]", s.turns, s.em))
        };
        println!(
            "  {:<22} {:>8} {:>8} {:>8} {:>8}",
            family.name(),
            cell(Mode::React),
            cell(Mode::Gap),
            cell(Mode::Mem),
            cell(Mode::Searl)
        );
    }
    let (react, mem) = (peak_by_objectives(&reports[&Mode::React]), peak_by_objectives(&reports[&Mode::Mem]));
    let row = |t: &BTreeMap<usize, f64>| {
        [2, 4, 6, 8, 10].iter().filter_map(|k| t.get(k).map(|v| format!("{v:>6.0}"))).collect::<Vec<_>>().join("")
    };
    println!("  peak tokens/step, objectives 2 4 6 8 10:  react {}  ·  mem {}", row(&react), row(&mem));
    let created: usize = reports[&Mode::Searl].results.iter().map(|r| r.trajectory.created_tools().len()).sum();
    println!("  searl             -> {created} Python tools created and run for the numeric tasks (candidates)");
}

/// The same agent with every tool taken over MCP from a daemon serving the world's corpus.
fn tools_over_mcp(
    env: &Env,
    runtime: &Runtime,
    tasks: &[Task],
    corpus: &Arc<Corpus>,
    tokenizer: &Arc<Tokenizer>,
) -> Result<()> {
    use toolsmith_daemon::http::{HttpOptions, HttpServer};

    let options = toolsmith_daemon::ServeOptions { corpus: Some(corpus.clone()), ..Default::default() };
    let daemon =
        toolsmith_daemon::Daemon::new(env.registry()?, env.toolbox_maybe_python("Python tools are")?, options)?;
    let (addr, report) = runtime.block_on(async {
        let server = HttpServer::bind(daemon.clone(), HttpOptions::new(([127, 0, 0, 1], 0).into())).await?;
        let addr = server.local_addr()?;
        tokio::spawn(server.serve(std::future::pending()));
        let hide = vec![toolsmith_daemon::SEARCH_TOOL.to_string()];
        let tools = McpTools::connect(&format!("http://{addr}/mcp"), None, hide).await?;
        let oracle = Arc::new(Oracle::new(tasks, Mode::Gap, tokenizer.clone()));
        let agent = Agent::new(oracle, Arc::new(tools), AgentConfig { mode: Mode::Gap, ..AgentConfig::default() });
        anyhow::Ok((addr, evaluate(&agent, tasks, 4, |_| {}).await))
    })?;
    println!(
        "  tools over MCP    -> gap mode, every tool from `serve --corpus` at http://{addr}/mcp: EM {:.2} on {} tasks",
        report.overall.em, report.overall.tasks
    );
    Ok(())
}

/// Simulated tools: observations from an untrained policy, constrained to the output schema. The
/// actor it returns designs tools next.
fn simulated_tools(runtime: &Runtime) -> Result<Arc<ToolActor>> {
    toolsmith_policy::set_threads(1);
    let policy = Policy::tiny(0, LoadOptions::default())?;
    let shared = Arc::new(Mutex::new(policy));
    let params = SamplingParams { max_new_tokens: 32, temperature: 1.0, seed: 2, ..SamplingParams::default() };
    let actor = Arc::new(ToolActor::new(shared.clone(), params)?);
    let simulated = LocalTools::new().with_simulator(actor.clone());
    let manifest = admit(FLIGHT_STATUS).map_err(|e| anyhow::anyhow!("{e}"))?;
    simulated.add_simulated(manifest).map_err(|e| anyhow::anyhow!("{}", e.to_envelope()))?;
    for flight in ["LH123", "BA456"] {
        let out = runtime.block_on(simulated.call("flight_status", &serde_json::json!({"flight": flight})));
        match out.value {
            Ok(v) => println!("  simulated tool    -> flight_status({flight}) = {v} (validates)"),
            Err(e) => println!("  simulated tool    -> {}", e.to_envelope()),
        }
    }
    Ok(actor)
}

/// The tool maker: the untrained policy designs tools for a task, each admitted or rejected.
fn tool_maker(actor: &ToolActor) -> Result<()> {
    let designed = actor.design("Track a parcel and estimate its delivery date.", 2)?;
    for d in designed {
        match d {
            Ok(m) => println!(
                "  tool maker        -> the untrained policy designed `{}` ({} -> {}): admitted, simulatable",
                m.name.as_str(),
                m.input_schema["properties"],
                m.output_schema["properties"]
            ),
            Err(e) => println!("  tool maker        -> rejected: {e}"),
        }
    }
    Ok(())
}

/// The same policy as an OpenAI-compatible endpoint, called by the HTTP backend.
fn chat_endpoint(runtime: &Runtime) -> Result<()> {
    let local = LocalBackend::new(Policy::tiny(0, LoadOptions::default())?, "tiny");
    let reply = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = toolsmith_daemon::chat::chat_router(local, "tiny");
        tokio::spawn(async move { axum_serve(listener, app).await });
        let remote = OpenAiBackend::new(format!("http://{addr}/v1"), "tiny", None);
        let options = GenerateOptions { max_tokens: 12, ..GenerateOptions::default() };
        let messages = [Message::user("Where was Ada Lovelace born?")];
        anyhow::Ok((addr, remote.complete(&messages, &options).await?))
    })?;
    println!(
        "  chat completions  -> POST http://{}/v1/chat/completions: {} prompt + {} completion tokens, finish {}",
        reply.0, reply.1.usage.prompt_tokens, reply.1.usage.completion_tokens, reply.1.finish_reason
    );
    println!("  serve it: toolsmith serve --http 127.0.0.1:8750 --policy DIR; evaluate: toolsmith eval --mode gap");
    Ok(())
}

async fn axum_serve(listener: tokio::net::TcpListener, app: axum::Router) {
    if let Err(e) = axum::serve(listener, app).await {
        tracing::warn!("the quickstart's chat endpoint stopped: {e}");
    }
}
