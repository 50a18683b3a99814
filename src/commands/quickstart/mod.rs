//! `toolsmith quickstart`: the main job on embedded defaults: load the bundled plugins into
//! the sandbox, call each on its manifest's examples, show what failures look like, run Python tools,
//! register the bundled tools in the tool graph and search it, serve it over MCP, and create,
//! sample, score and train one step of the tiny policy.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use toolsmith_sandbox::python::create::CreateRequest;
use toolsmith_sandbox::{Limits, Toolbox};

use super::Env;

pub fn run(env: &Env) -> Result<ExitCode> {
    println!("Toolsmith quickstart\n");
    let sandbox = env.sandbox()?;
    match sandbox.cache_dir() {
        Some(dir) => println!("sandbox: wasmtime, pooling allocator, artifact cache in {}", dir.display()),
        None => println!("sandbox: wasmtime, pooling allocator, no artifact cache"),
    }
    let toolbox = Toolbox::new(sandbox);

    let bar = ProgressBar::new(toolsmith_bundled::BUNDLED.len() as u64).with_style(
        ProgressStyle::with_template("{spinner} loading plugins {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut loads = Vec::new();
    for bundled in toolsmith_bundled::BUNDLED {
        bar.set_message(bundled.name);
        let started = Instant::now();
        let tool = super::load_bundled(&toolbox, bundled)?;
        let how = tool.component().map(|c| format!("{:?}", c.cache).to_lowercase()).unwrap_or_default();
        loads.push((bundled.name, bundled.component.len(), how, started.elapsed()));
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!("\nplugins (built from plugins/ by cargo, embedded in this binary):");
    println!("  {:<12} {:>9} {:>9} {:>10}", "tool", "size", "load", "artifact");
    for (name, size, how, took) in &loads {
        println!("  {:<12} {:>6} KiB {:>9} {:>10}", name, size / 1024, ms(*took), how);
    }

    println!("\nexamples from each manifest, run in a fresh sandbox instance, both schemas checked:");
    println!("  {:<11} {:<48} {:<44} {:>9}  ok", "tool", "input", "output", "time");
    let mut failures = 0;
    for tool in toolbox.tools() {
        for example in &tool.manifest.examples {
            let started = Instant::now();
            let outcome = toolbox.call(tool.name(), &example.input, Limits::default());
            let took = started.elapsed();
            let (shown, ok) = match &outcome {
                Ok(out) => (out.value.to_string(), out.value == example.output),
                Err(e) => (e.to_envelope().to_string(), false),
            };
            failures += usize::from(!ok);
            println!(
                "  {:<11} {:<48} {:<44} {:>9}  {}",
                tool.name(),
                clip(&example.input.to_string(), 48),
                clip(&shown, 44),
                us(took),
                if ok { "yes" } else { "NO" }
            );
        }
    }

    println!("\ncomposition: `units` evaluates an expression by calling `calculator` through the host:");
    show(&toolbox, "units", json!({"value": "60 * 60 * 24", "from": "s", "to": "d"}));

    println!("\nfailures are data an agent can read and correct:");
    show(&toolbox, "calculator", json!({"expression": 42}));
    show(&toolbox, "units", json!({"value": 3, "from": "km", "to": "kg"}));
    show(&toolbox, "calculater", json!({"expression": "1"}));

    python_section(env, &toolbox)?;
    registry_section(env)?;
    serve_section(env)?;
    policy_section(env)?;
    agent_section(env)?;
    pretrained_section(env)?;
    training_section(env)?;
    rl_section(env)?;
    daemon_training_section(env)?;

    if failures > 0 {
        println!("\n{failures} example(s) did not reproduce");
        return Ok(ExitCode::FAILURE);
    }
    println!("\nall examples reproduced. Next: `toolsmith call calculator --args '{{\"expression\": \"2^10\"}}'`");
    Ok(ExitCode::SUCCESS)
}

/// Agent-written Python: SEARL's create_and_execute_mcp, then calls by name, then hostile code.
fn python_section(env: &Env, toolbox: &Toolbox) -> Result<()> {
    println!("\nagent-written Python (CPython as a WebAssembly component, a fresh instance per call):");
    let started = Instant::now();
    let runtime = match env.python_runtime(toolbox.sandbox()) {
        Ok(runtime) => runtime,
        Err(e) => {
            println!("  skipped: {e:#}");
            return Ok(());
        }
    };
    println!("  loaded the interpreter in {} ({:?})", ms(started.elapsed()), runtime.component().cache);
    toolbox.set_python(runtime);
    let request = CreateRequest {
        name: "quadratic_solver".into(),
        description: "Solve ax^2+bx+c=0".into(),
        arguments: "a,b,c (float)".into(),
        returns: "roots list".into(),
        code: "import math\n\ndef quadratic_solver(a, b, c):\n    d = b * b - 4 * a * c\n    if d < 0:\n        \
               return []\n    r = math.sqrt(d)\n    return [(-b + r) / (2 * a), (-b - r) / (2 * a)]\n"
            .into(),
        inputs: json!({"a": 1, "b": -3, "c": 2}).as_object().cloned().unwrap_or_default(),
        timeout: 15.0,
    };
    println!(
        "  $ create_and_execute_mcp(name=\"quadratic_solver\", arguments=\"a,b,c (float)\", inputs={{a: 1, b: -3, c: 2}})"
    );
    let created = toolbox.create_python(&request, Default::default()).map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("  {}", serde_json::to_string(&created.result)?);
    if let Some(tool) = created.tool {
        println!("  derived input schema: {}", tool.manifest.input_schema);
        toolbox.register(toolbox.python_tool(tool)?);
        println!("  admitted; now called by name, validated and sandboxed like any tool:");
        show(toolbox, "quadratic_solver", json!({"a": 2, "b": -4, "c": -6}));
        show(toolbox, "quadratic_solver", json!({"a": "two", "b": -4, "c": -6}));
    }
    println!("  hostile code gets a typed outcome and the host keeps going:");
    for (label, code) in [
        ("while True: pass", "def f():\n    while True:\n        pass\n"),
        ("open('/etc/passwd')", "def f():\n    return open('/etc/passwd').read()\n"),
        ("import socket", "def f():\n    import socket\n"),
    ] {
        let limits = Limits { timeout: Duration::from_millis(300), ..Limits::default() };
        let python = toolbox.python().ok_or_else(|| anyhow::anyhow!("no Python runtime"))?;
        let outcome = match python.exec("f", code, "f", Vec::new(), Default::default(), limits, None) {
            Ok(run) => format!("ok: {}", run.result),
            Err(f) => f.error.to_string(),
        };
        println!("  {label:<22} -> {}", clip(&outcome, 90));
    }
    Ok(())
}

fn show(toolbox: &Toolbox, tool: &str, args: Value) {
    println!("  $ toolsmith call {tool} --args '{args}'");
    match toolbox.call(tool, &args, Limits::default()) {
        Ok(out) => println!("  {}", out.value),
        Err(e) => println!("  {}", e.to_envelope()),
    }
}

fn clip(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_owned()
    } else {
        let head: String = s.chars().take(width - 1).collect();
        format!("{head}…")
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{} µs", d.as_micros())
}

/// The tool graph: the bundled tools registered, then a two-step plan retrieved.
fn registry_section(env: &Env) -> Result<()> {
    let started = Instant::now();
    let mut registry = env.registry()?;
    println!(
        "\ntool graph: {} ({} tools; SQLite + tantivy BM25 + MiniLM embeddings)",
        registry.path().display(),
        registry.len()?
    );
    let queries = ["turn 5 miles into kilometres", "pull the price field out of this JSON order"];
    let hits = registry.search(&toolsmith_registry::SearchRequest::new(queries).k(1))?;
    println!("  hybrid search, one hit per sub-plan, with the score breakdown ({}):", ms(started.elapsed()));
    for h in hits {
        let e = &h.explain;
        println!(
            "  {:<46} -> {:<11} {:.3} (bm25 {:.2}, cosine {:.3})",
            format!("{:?}", e.query),
            h.name,
            h.score,
            e.sparse,
            e.cosine.unwrap_or_default()
        );
    }
    println!("  browse it: toolsmith tools list | show NAME | search TEXT --explain | graph --html graph.html");
    // The graph page, as the offline file `tools graph --html` writes (the daemon serves it live).
    let page = env.policy_dir().with_file_name("quickstart-graph.html");
    let html = toolsmith_daemon::graph::static_page(&registry)?;
    std::fs::write(&page, html).with_context(|| format!("cannot write {}", page.display()))?;
    println!("  graph page: {} (offline copy; live at /graph under `toolsmith serve --http`)", page.display());
    Ok(())
}

/// `toolsmith serve` in miniature: a real MCP session (rmcp on the server side) over an in-memory
/// pipe, speaking exactly what `serve --stdio` speaks.
fn serve_section(env: &Env) -> Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use toolsmith_daemon::{Daemon, ServeOptions, mcp};

    let toolbox = env.toolbox_maybe_python("Python tools are")?;
    let daemon = Daemon::new(env.registry()?, toolbox, ServeOptions::default())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    println!(
        "
MCP (`toolsmith serve --stdio`), one session over a pipe:"
    );
    runtime.block_on(async move {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (server_in, server_out) = tokio::io::split(server);
        let session = tokio::spawn(mcp::serve_lines(daemon, server_in, server_out));
        let (client_in, mut client_out) = tokio::io::split(client);
        let mut replies = BufReader::new(client_in).lines();
        let mut exchange = async |message: Value| -> Result<Value> {
            client_out.write_all(format!("{message}\n").as_bytes()).await?;
            if message.get("id").is_none() {
                return Ok(Value::Null);
            }
            let line = replies.next_line().await?.ok_or_else(|| anyhow::anyhow!("the server closed the session"))?;
            Ok(serde_json::from_str(&line)?)
        };
        let init = exchange(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "quickstart", "version": "0"}}}))
        .await?;
        println!(
            "  initialize        -> {} {}, protocol {}",
            init["result"]["serverInfo"]["name"].as_str().unwrap_or("?"),
            init["result"]["serverInfo"]["version"].as_str().unwrap_or("?"),
            init["result"]["protocolVersion"].as_str().unwrap_or("?")
        );
        exchange(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await?;
        let list = exchange(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await?;
        let names: Vec<&str> =
            list["result"]["tools"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect();
        println!("  tools/list        -> {}", names.join(", "));
        let call = |id: u64, name: &str, arguments: Value| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
        };
        let found = exchange(call(3, "search_tools", json!({"query": "convert a distance between units", "k": 2}))).await?;
        let found: Vec<String> = found["result"]["structuredContent"]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| format!("{} ({:.2})", t["name"].as_str().unwrap_or("?"), t["score"].as_f64().unwrap_or(0.0)))
            .collect();
        println!("  search_tools      -> {}", found.join(", "));
        let ok = exchange(call(4, "units", json!({"value": 5, "from": "mi", "to": "km"}))).await?;
        println!("  units 5 mi -> km  -> {}", ok["result"]["structuredContent"]);
        let bad = exchange(call(5, "units", json!({"value": 5, "from": "mi"}))).await?;
        println!(
            "  bad arguments     -> isError {}, kind {}",
            bad["result"]["isError"],
            bad["result"]["_meta"]["toolsmith/error"]["kind"]
        );
        // Closing our side ends the session, as closing standard input ends `serve --stdio`.
        client_out.shutdown().await?;
        session.await??;
        anyhow::Ok(())
    })?;
    println!("  serve it: toolsmith serve --stdio | --http 127.0.0.1:8750 (docs/guide/serving-mcp.md)");
    Ok(())
}

fn policy_section(env: &Env) -> Result<()> {
    use toolsmith_policy::tokenizer::TRACE_TAGS;
    use toolsmith_policy::{LoadOptions, Policy, SamplingParams, TokenSequence};

    println!("\nthe policy (a Qwen2-style decoder on libtorch; the tiny default, untrained, on the CPU):");
    let started = Instant::now();
    let mut policy = Policy::tiny(0, LoadOptions::default())?;
    let spec = policy.config().spec()?;
    println!(
        "  init              -> {:.2} M parameters: {} layers, hidden {}, {} heads / {} key-value heads, vocab {} ({})",
        policy.state().parameters as f64 / 1e6,
        spec.layers,
        spec.hidden_size,
        spec.heads,
        spec.kv_heads,
        spec.vocab_size,
        ms(started.elapsed())
    );
    let trace = "<plan>\nTask 1: find the city - Dependencies: none\n</plan><tool_call>";
    let ids = policy.tokenizer().encode(trace)?;
    println!(
        "  tokenizer         -> byte-level BPE, {} trace tags as single tokens: {:?} is {} tokens",
        TRACE_TAGS.len(),
        trace.replace('\n', " "),
        ids.len()
    );
    let dir = env.policy_dir();
    policy.save(&dir)?;
    policy = Policy::load(&dir, LoadOptions::default())?;
    println!("  checkpoint        -> {} (safetensors + config + tokenizer + state), reloaded", dir.display());

    let prompt = "<|im_start|>user\nWhere was Ada Lovelace born?<|im_end|>\n<|im_start|>assistant\n";
    let greedy = SamplingParams::greedy(24);
    let (out, stats) = policy.generate_text(&[prompt], &greedy, None)?;
    println!(
        "  generate, greedy  -> {} tokens, {:.0} tokens/s, finish {:?} (an untrained model babbles)",
        out[0].output_ids.len(),
        stats.tokens_per_sec(),
        out[0].finish_reason
    );
    let sampled =
        SamplingParams { max_new_tokens: 24, temperature: 0.8, top_p: 0.95, seed: 1, ..SamplingParams::default() };
    let prompts = [prompt, "<plan>\nTask 1:", "<mem>"];
    let (out, stats) = policy.generate_text(&prompts, &sampled, None)?;
    println!(
        "  generate, batch 3 -> temperature 0.8, top-p 0.95, seed 1, KV cache: {} tokens at {:.0} tokens/s",
        stats.generated_tokens,
        stats.tokens_per_sec()
    );
    let (again, _) = policy.generate_text(&prompts, &sampled, None)?;
    println!("  same seed again   -> identical: {}", out == again);

    // One supervised step on a completion: its log-likelihood rises.
    let tokenizer = policy.tokenizer();
    let sequence =
        TokenSequence::completion(&tokenizer.encode(prompt)?, &tokenizer.encode("<answer>London</answer><|im_end|>")?);
    let batch = [sequence];
    let before = toolsmith_policy::tch::no_grad(|| policy.score(&batch, false))?.sequence_logprobs().double_value(&[]);
    let mut optimizer = toolsmith_policy::tch::nn::OptimizerConfig::build(
        toolsmith_policy::tch::nn::Adam::default(),
        policy.var_store(),
        1e-3,
    )?;
    let scores = policy.score(&batch, false)?;
    optimizer.backward_step(&(-scores.sequence_logprobs().sum(toolsmith_policy::tch::Kind::Float)));
    let after = toolsmith_policy::tch::no_grad(|| policy.score(&batch, false))?.sequence_logprobs().double_value(&[]);
    println!("  one SFT step      -> log p(completion | prompt) {before:.2} -> {after:.2}");
    println!("  try it: toolsmith policy generate {} --prompt 'hello' --temperature 0.8", dir.display());
    Ok(())
}

/// A few seconds of supervised fine-tuning on oracle traces: the masks and the falling loss.
fn training_section(env: &Env) -> Result<()> {
    use std::sync::Arc;

    use toolsmith_agent::Mode;
    use toolsmith_agent::env::Corpus;
    use toolsmith_agent::tools::{Executor, LocalTools};
    use toolsmith_train::config::{DataConfig, SftConfig, WorldsData};
    use toolsmith_train::sft::{self, Event};

    println!("\ntraining (supervised fine-tuning with observation masking; `toolsmith train sft`):");
    let out = env.policy_dir().with_file_name("quickstart-sft");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("cannot clear {}", out.display()))?;
    }
    let config = SftConfig {
        data: DataConfig {
            files: Vec::new(),
            worlds: WorldsData {
                seeds: vec![5],
                countries: 2,
                tasks_per_family: 2,
                styles: vec![Mode::Gap],
                ..WorldsData::default()
            },
            ..DataConfig::default()
        },
        steps: Some(12),
        lr: 3e-3,
        warmup_ratio: 0.1,
        batch_tokens: 4096,
        micro_batch_tokens: 4096,
        device: "cpu".into(),
        eval: None,
        checkpoint_every: 12,
        ..SftConfig::default()
    };
    let tools_for = |corpus: Arc<Corpus>| -> Arc<dyn Executor> { Arc::new(LocalTools::new().with_corpus(corpus)) };
    let mut trainer = sft::prepare(config, &out, false, &tools_for)?;
    let (mut losses, mut rates) = (Vec::new(), Vec::new());
    let final_dir = trainer.run(&mut |e| match e {
        Event::Data { sequences, tokens, trained_tokens, .. } => println!(
            "  data              -> {sequences} oracle traces of world 5 (gap style): {tokens} tokens, {:.0}% of them the assistant's (the loss); observations masked",
            100.0 * trained_tokens as f64 / tokens.max(1) as f64
        ),
        Event::Step(toolsmith_train::metrics::Record::Train(m)) => {
            losses.push(m.loss);
            rates.push(m.tokens_per_sec);
        }
        _ => {}
    })?;
    rates.sort_by(f64::total_cmp);
    println!(
        "  {:<17} -> loss per assistant token {:.2} -> {:.2} (warm-up + cosine, {:.0} tokens/s)",
        format!("{} AdamW steps", losses.len()),
        losses.first().copied().unwrap_or_default(),
        losses.last().copied().unwrap_or_default(),
        rates.get(rates.len() / 2).copied().unwrap_or_default()
    );
    println!("  checkpoint        -> {} (weights, optimiser moments, data position: resumable)", final_dir.display());
    println!("  try it: toolsmith train sft --preset tiny-world --out runs/sft   (about 12 minutes on 2 cores)");
    Ok(())
}

/// Seconds of RL from the SFT checkpoint above: a group of sampled episodes decoded as one batch,
/// their rewards and advantages, token-exact rescoring, then one iteration of `train rl`.
fn rl_section(env: &Env) -> Result<()> {
    use std::sync::{Arc, Mutex};

    use toolsmith_agent::backend::{BatchConfig, BatchedBackend, GenerateOptions};
    use toolsmith_agent::env::{Corpus, World, WorldConfig};
    use toolsmith_agent::tools::{Executor, LocalTools};
    use toolsmith_agent::{Agent, AgentConfig, Mode};
    use toolsmith_policy::{LoadOptions, Policy};
    use toolsmith_train::Event;
    use toolsmith_train::config::WorldsData;
    use toolsmith_train::metrics::Record;
    use toolsmith_train::rl::advantage::{GroupNorm, group_advantages};
    use toolsmith_train::rl::episode::episode_sequences;
    use toolsmith_train::rl::{Method, RlConfig, RlTrainer};
    use toolsmith_train::sequence::SequenceBuilder;

    println!("\nreinforcement learning (group-relative; `toolsmith train rl`):");
    let init = env.policy_dir().with_file_name("quickstart-sft").join("final");
    let world = World::generate(WorldConfig { seed: 5, countries: 2, tasks_per_family: 1 });
    let task = world.tasks().into_iter().next().context("the world has no tasks")?;
    let corpus = Arc::new(Corpus::new(&world.documents())?);
    let tools: Arc<dyn Executor> = Arc::new(LocalTools::new().with_corpus(corpus));
    let policy = Arc::new(Mutex::new(Policy::load(&init, LoadOptions::default())?));
    let backend = Arc::new(BatchedBackend::new(policy.clone(), "quickstart-sft", BatchConfig::default()));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (searl, searl_config) = (Method::SEARL.spec().assign, RlConfig::for_method(Method::SEARL));
    let episodes = runtime.block_on(async {
        let handles: Vec<_> = (0..4_u64)
            .map(|seed| {
                let generate = GenerateOptions { max_tokens: 48, temperature: 1.0, seed, ..GenerateOptions::default() };
                let config = AgentConfig { mode: Mode::Searl, max_turns: 2, generate, ..AgentConfig::default() };
                let agent = Agent::new(backend.clone(), tools.clone(), config);
                let question = task.question.clone();
                tokio::spawn(async move { agent.run(&question).await })
            })
            .collect();
        let mut episodes = Vec::new();
        for h in handles {
            episodes.push(h.await?);
        }
        anyhow::Ok(episodes)
    })?;
    let rewards: Vec<f64> =
        episodes.iter().map(|e| searl.reward(e, &task.golden_answers, &searl_config).total).collect();
    let advantages = group_advantages(&rewards, GroupNorm::MeanStd);
    let show = |v: &[f64]| v.iter().map(|x| format!("{x:+.2}")).collect::<Vec<_>>().join(" ");
    println!("  a group of 4      -> episodes of one task sampled at temperature 1, their turns decoded as one batch");
    println!(
        "  SEARL rewards     -> {}   (format, execution and penalty terms; +1 for a right answer)",
        show(&rewards)
    );
    let note = if toolsmith_train::rl::advantage::informative(&rewards) {
        "(r - mean) / std within the group"
    } else {
        "all rewards equal: a group that teaches nothing, which DAPO's dynamic sampling drops"
    };
    println!("  advantages        -> {}   ({note})", show(&advantages));
    let (mut tokens, mut max_diff) = (0, 0.0_f64);
    {
        let policy = policy.lock().map_err(|_| anyhow::anyhow!("the policy lock is poisoned"))?;
        let builder = SequenceBuilder::for_policy(&policy)?;
        for e in &episodes {
            for seq in episode_sequences(&builder, e)? {
                let scores = toolsmith_policy::tch::no_grad(|| policy.score(std::slice::from_ref(&seq.tokens), false))?;
                let row = Vec::<f64>::try_from(scores.logprobs.get(0).to_kind(toolsmith_policy::tch::Kind::Double))?;
                for (i, &m) in seq.tokens.loss_mask.iter().enumerate() {
                    if m {
                        tokens += 1;
                        max_diff = max_diff.max((row[i] - seq.behaviour[i]).abs());
                    }
                }
            }
        }
    }
    println!(
        "  token-exact       -> the trainer rescored the {tokens} sampled tokens: max |log p - behaviour| = {max_diff:.1e}"
    );
    let out = env.policy_dir().with_file_name("quickstart-rl");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("cannot clear {}", out.display()))?;
    }
    let base = RlConfig::for_method(Method::SEARL);
    let config = RlConfig {
        init: init.to_string_lossy().into_owned(),
        worlds: WorldsData {
            seeds: vec![5],
            countries: 2,
            tasks_per_family: 1,
            styles: vec![Mode::Searl],
            ..WorldsData::default()
        },
        eval: None,
        iterations: 1,
        tasks_per_iteration: 2,
        group_size: 4,
        max_turns: 2,
        max_tokens: 32,
        device: "cpu".into(),
        ..base
    };
    let tools_for = |corpus: Arc<Corpus>| -> Arc<dyn Executor> { Arc::new(LocalTools::new().with_corpus(corpus)) };
    let mut trainer = RlTrainer::prepare(config, &out, false, &tools_for)?;
    trainer.run(&mut |e| {
        if let Event::Step(Record::Iteration(m)) = e {
            println!(
                "  1 iteration       -> {} episodes in {} groups: reward {:.2}, KL {:.4}, clip {:.3}, entropy {:.2}, {:.0} rollout tokens/s",
                m.episodes, m.groups, m.reward, m.kl, m.clip_fraction, m.entropy, m.rollout_tokens_per_sec
            );
            println!(
                "  tool graph        -> {} tool{} in the run's registry (episodes retrieve from it; {} admitted from this iteration's rollouts)",
                m.graph_tools,
                if m.graph_tools == 1 { "" } else { "s" },
                m.admitted
            );
        }
    })?;
    println!("  try it: toolsmith train rl --preset tiny-world --method gap --init runs/sft/final --out runs/rl");
    Ok(())
}

fn agent_section(env: &Env) -> Result<()> {
    use std::sync::{Arc, Mutex};

    use toolsmith_agent::backend::{Backend, GenerateOptions, LocalBackend, Message, OpenAiBackend};
    use toolsmith_agent::env::{Corpus, Family, World, WorldConfig};
    use toolsmith_agent::eval::{evaluate, peak_by_objectives};
    use toolsmith_agent::mcp::McpTools;
    use toolsmith_agent::simulate::{ToolActor, admit};
    use toolsmith_agent::tools::{Executor, LocalTools};
    use toolsmith_agent::{Agent, AgentConfig, Mode, Oracle};
    use toolsmith_policy::{LoadOptions, Policy, SamplingParams, Tokenizer};

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
    let mut reports = std::collections::BTreeMap::new();
    for mode in Mode::ALL {
        let oracle = Arc::new(Oracle::new(&tasks, mode, tokenizer.clone()));
        let agent = Agent::new(oracle, tools.clone(), AgentConfig { mode, max_turns: 16, ..AgentConfig::default() });
        reports.insert(mode, runtime.block_on(evaluate(&agent, &tasks, 4, |_| {})));
    }
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
    let row = |t: &std::collections::BTreeMap<usize, f64>| {
        [2, 4, 6, 8, 10].iter().filter_map(|k| t.get(k).map(|v| format!("{v:>6.0}"))).collect::<Vec<_>>().join("")
    };
    println!("  peak tokens/step, objectives 2 4 6 8 10:  react {}  ·  mem {}", row(&react), row(&mem));
    let created: usize = reports[&Mode::Searl].results.iter().map(|r| r.trajectory.created_tools().len()).sum();
    println!("  searl             -> {created} Python tools created and run for the numeric tasks (candidates)");

    // The same agent with every tool taken over MCP from a daemon serving the world's corpus.
    let options = toolsmith_daemon::ServeOptions { corpus: Some(corpus.clone()), ..Default::default() };
    let daemon =
        toolsmith_daemon::Daemon::new(env.registry()?, env.toolbox_maybe_python("Python tools are")?, options)?;
    let (addr, report) = runtime.block_on(async {
        use toolsmith_daemon::http::{HttpOptions, HttpServer};
        let server = HttpServer::bind(daemon.clone(), HttpOptions::new(([127, 0, 0, 1], 0).into())).await?;
        let addr = server.local_addr()?;
        tokio::spawn(server.serve(std::future::pending()));
        let hide = vec![toolsmith_daemon::SEARCH_TOOL.to_string()];
        let tools = McpTools::connect(&format!("http://{addr}/mcp"), None, hide).await?;
        let oracle = Arc::new(Oracle::new(&tasks, Mode::Gap, tokenizer.clone()));
        let agent = Agent::new(oracle, Arc::new(tools), AgentConfig { mode: Mode::Gap, ..AgentConfig::default() });
        anyhow::Ok((addr, evaluate(&agent, &tasks, 4, |_| {}).await))
    })?;
    println!(
        "  tools over MCP    -> gap mode, every tool from `serve --corpus` at http://{addr}/mcp: EM {:.2} on {} tasks",
        report.overall.em, report.overall.tasks
    );
    println!(
        "  try it: toolsmith run \"{}\" --mode gap",
        tasks.iter().find(|t| t.family == Family::MultiHopParallel).map_or("", |t| t.question.as_str())
    );

    // Simulated tools: observations from an untrained policy, constrained to the output schema.
    toolsmith_policy::set_threads(1);
    let policy = Policy::tiny(0, LoadOptions::default())?;
    let shared = Arc::new(Mutex::new(policy));
    let params = SamplingParams { max_new_tokens: 32, temperature: 1.0, seed: 2, ..SamplingParams::default() };
    let actor = Arc::new(ToolActor::new(shared.clone(), params)?);
    let simulated = LocalTools::new().with_simulator(actor.clone());
    let manifest = admit(
        r#"{"name": "flight_status", "description": "Status of a flight by its number.",
            "input_schema": {"type": "object", "properties": {"flight": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}, "required": ["flight"]},
            "output_schema": {"type": "object", "properties": {"status": {"enum": ["on_time", "delayed", "cancelled"]},
                "gate": {"type": "string", "pattern": "^[A-F][0-9]{1,2}$"}, "delay_min": {"type": "integer", "minimum": 0, "maximum": 600}},
                "required": ["status", "gate"]}}"#,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    simulated.add_simulated(manifest).map_err(|e| anyhow::anyhow!("{}", e.to_envelope()))?;
    for flight in ["LH123", "BA456"] {
        let out = runtime.block_on(simulated.call("flight_status", &serde_json::json!({"flight": flight})));
        match out.value {
            Ok(v) => println!("  simulated tool    -> flight_status({flight}) = {v} (validates)"),
            Err(e) => println!("  simulated tool    -> {}", e.to_envelope()),
        }
    }

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

    // The same policy as an OpenAI-compatible endpoint, called by the HTTP backend.
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

/// SmolLM2-135M-Instruct, the policy users train: bf16 where the CPU computes it, a held-out
/// question before and after a few LoRA steps, the adapter saved as PEFT saves it and swapped
/// into a served policy without reloading the base.
fn pretrained_section(env: &Env) -> Result<()> {
    use std::sync::{Arc, Mutex};

    use toolsmith_agent::backend::{GenerateOptions, LocalBackend};
    use toolsmith_agent::env::{Corpus, Family, World, WorldConfig};
    use toolsmith_agent::tools::{Executor, LocalTools};
    use toolsmith_agent::{Agent, AgentConfig, Mode, ToolFormat, Trajectory};
    use toolsmith_daemon::chat::Served;

    const STEPS: u64 = 12;
    use toolsmith_policy::{LoadOptions, LoraConfig, Policy};
    use toolsmith_train::config::{DataConfig, SftConfig, WorldsData};
    use toolsmith_train::sft::{self, Event};

    println!(
        "
the pretrained policy (SmolLM2-135M-Instruct; `--policy smollm2-135m`, `--init smollm2-135m`):"
    );
    let dir = match toolsmith_policy::locate("smollm2-135m") {
        Ok(dir) => dir,
        Err(e) => {
            println!("  skipped: {e}");
            return Ok(());
        }
    };
    // Both cores for this section (the sections before ran one libtorch thread).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    toolsmith_policy::set_threads(threads);
    let started = Instant::now();
    let policy = Policy::load(&dir, LoadOptions::default())?;
    println!(
        "  loaded            -> {:.1} M parameters in {:?} (precision auto: bf16 where the CPU has AVX512_BF16 or AMX) in {}",
        policy.state().parameters as f64 / 1e6,
        policy.state().precision,
        ms(started.elapsed())
    );
    let shared = Arc::new(Mutex::new(policy));
    let served = Served::new(LocalBackend::shared(shared.clone(), "smollm2-135m"));

    // A world none of the training data comes from: new names, new facts.
    let world = World::generate(WorldConfig { seed: 101, countries: 2, tasks_per_family: 1 });
    let task = world.tasks().into_iter().find(|t| t.family == Family::SingleHop).context("a single-hop task")?;
    let corpus = Arc::new(Corpus::new(&world.documents())?);
    let tools: Arc<dyn Executor> = Arc::new(LocalTools::new().with_corpus(corpus));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // The brief tool listing: a third of the compact one's tokens, so a 2,048-token batch holds
    // more traces and each turn prefills less.
    let config = AgentConfig {
        mode: Mode::React,
        max_turns: 2,
        generate: GenerateOptions { max_tokens: 48, temperature: 0.0, ..GenerateOptions::default() },
        tool_format: ToolFormat::Brief,
        ..AgentConfig::default()
    };
    let attempt = |label: &str| -> Result<()> {
        let agent =
            Agent::new(Arc::new(LocalBackend::shared(shared.clone(), "smollm2-135m")), tools.clone(), config.clone());
        let t: Trajectory = runtime.block_on(agent.run(&task.question));
        let calls: Vec<String> =
            t.steps.iter().flat_map(|s| s.calls.iter().map(|c| format!("{}({})", c.name, c.arguments))).collect();
        let first = t.steps.first().map_or(String::new(), |s| clip(&s.text.replace('\n', " "), 60));
        let found = t.steps.iter().any(|s| task.golden_answers.iter().any(|g| s.observation.contains(g.as_str())));
        println!(
            "  {label:<17} -> {first:?}\n  {:<17}    tool calls [{}]; the answer in an observation: {}; answered {:?} (expected {:?})",
            "",
            calls.join(", "),
            if found { "yes" } else { "no" },
            t.answer.as_deref().unwrap_or("nothing"),
            task.golden_answers.first().map(String::as_str).unwrap_or("")
        );
        Ok(())
    };
    println!("  held-out question -> {:?} (world 101, never trained on)", task.question);
    attempt("untrained")?;

    let out = env.policy_dir().with_file_name("quickstart-lora");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("cannot clear {}", out.display()))?;
    }
    let lora = LoraConfig { dropout: 0.0, ..LoraConfig::default() };
    let sft_config = SftConfig {
        init: dir.to_string_lossy().into_owned(),
        data: DataConfig {
            files: Vec::new(),
            // The question's family alone: eight steps of every family taught the search turn
            // but not when to stop searching (the answer reached an observation, then it
            // searched the answer; BENCHMARKS.md, "The quickstart, whole").
            worlds: WorldsData {
                seeds: vec![1],
                countries: 4,
                tasks_per_family: 4,
                styles: vec![Mode::React],
                family_tasks: Family::GENERATED
                    .iter()
                    .map(|&f| (f, if f == Family::SingleHop { 24 } else { 0 }))
                    .collect(),
            },
            ..DataConfig::default()
        },
        tool_format: ToolFormat::Brief,
        lora: Some(lora),
        steps: Some(STEPS),
        lr: 3e-3,
        warmup_ratio: 0.0,
        batch_tokens: 2048,
        micro_batch_tokens: 2048,
        eval: None,
        checkpoint_every: STEPS,
        ..SftConfig::default()
    };
    let tools_for = |corpus: Arc<Corpus>| -> Arc<dyn Executor> { Arc::new(LocalTools::new().with_corpus(corpus)) };
    let started = Instant::now();
    let mut trainer = sft::prepare(sft_config, &out, false, &tools_for)?;
    let trained = {
        let policy = trainer.policy();
        let policy = toolsmith_contract::sync::lock(&policy);
        policy.trained_variables().values().map(|t| t.numel() as f64).sum::<f64>() / policy.state().parameters as f64
    };
    let (mut losses, mut rates) = (Vec::new(), Vec::new());
    let final_dir = trainer.run(&mut |e| {
        if let Event::Step(toolsmith_train::metrics::Record::Train(m)) = e {
            losses.push(m.loss);
            rates.push(m.tokens_per_sec);
        }
    })?;
    rates.sort_by(f64::total_cmp);
    println!(
        "  LoRA SFT          -> rank 16 on every linear layer ({:.1}% of the weights train); {} steps of 2,048 tokens of world 1's single-hop traces: loss {:.2} -> {:.2}, {:.0} tokens/s, {}",
        100.0 * trained,
        losses.len(),
        losses.first().copied().unwrap_or_default(),
        losses.last().copied().unwrap_or_default(),
        rates.get(rates.len() / 2).copied().unwrap_or_default(),
        ms(started.elapsed())
    );
    let adapter = final_dir.join("adapter");
    let started = Instant::now();
    let step = served.swap(&adapter).map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "  adapter           -> {} (PEFT's files), swapped into the served policy at step {step} in {}: the base is not reloaded",
        adapter.display(),
        ms(started.elapsed())
    );
    attempt(&format!("after {STEPS} steps"))?;
    toolsmith_policy::set_threads(1);
    println!(
        "  try it: toolsmith train sft --preset smol-world --out runs/smol   (about 24 minutes; held-out EM: BENCHMARKS.md)"
    );
    Ok(())
}

/// The daemon as an operator runs it: the policy served over HTTP, an SFT job submitted to
/// `/jobs`, its progress in `/status`, and the served weights swapped at each checkpoint.
fn daemon_training_section(env: &Env) -> Result<()> {
    use toolsmith_agent::backend::LocalBackend;
    use toolsmith_daemon::chat::{Served, served_router};
    use toolsmith_daemon::http::{HttpOptions, HttpServer};
    use toolsmith_daemon::jobs::{Jobs, jobs_router};
    use toolsmith_daemon::{Daemon, ServeOptions};
    use toolsmith_policy::{LoadOptions, Policy};

    println!("\ntraining in the daemon (`toolsmith serve --http ADDR --policy DIR`, then `toolsmith jobs`):");
    let state = env.policy_dir().with_file_name("quickstart-daemon");
    if state.exists() {
        std::fs::remove_dir_all(&state).with_context(|| format!("cannot clear {}", state.display()))?;
    }
    let base = state.join("base");
    Policy::tiny(3, LoadOptions::default())?.save(&base)?;
    let served = Served::new(LocalBackend::new(Policy::load(&base, LoadOptions::default())?, "base"));
    let daemon = Daemon::new(env.registry()?, env.toolbox()?, ServeOptions::default())?;
    let jobs = Jobs::open(&state, daemon.clone(), Some(served.clone()))?;
    let runner = jobs.spawn_runner()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(async {
        let routes = served_router(served, "base").merge(jobs_router(jobs.clone()));
        let options = HttpOptions { extra_routes: Some(routes), ..HttpOptions::new(([127, 0, 0, 1], 0).into()) };
        let server = HttpServer::bind(daemon, options).await?;
        let base_url = format!("http://{}", server.local_addr()?);
        let stop = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve(async move {
            let _ = stop.1.await;
        }));
        let http = reqwest::Client::new();
        let chat = async || -> Result<Value> {
            let body = json!({"messages": [{"role": "user", "content": "Where was Ada born?"}], "max_tokens": 4});
            Ok(http.post(format!("{base_url}/v1/chat/completions")).json(&body).send().await?.json().await?)
        };
        println!("  before            -> chat completions answered by step {}", chat().await?["toolsmith"]["step"]);
        let job = json!({"kind": "sft", "config": {
            "init": base, "steps": 4, "lr": 3e-3, "batch_tokens": 2500, "micro_batch_tokens": 2500,
            "device": "cpu", "eval": null, "checkpoint_every": 2, "tool_format": "brief",
            "data": {"worlds": {"seeds": [5], "countries": 2, "tasks_per_family": 1, "styles": ["react"]}}}});
        let submitted: Value = http.post(format!("{base_url}/jobs")).json(&job).send().await?.json().await?;
        let id = submitted["id"].as_i64().ok_or_else(|| anyhow::anyhow!("no job id: {submitted}"))?;
        println!("  POST /jobs        -> job {id} {}", submitted["state"].as_str().unwrap_or("?"));
        let mut shown = 0;
        let done = loop {
            let job: Value = http.get(format!("{base_url}/jobs/{id}")).send().await?.json().await?;
            if job["state"] != "queued" && job["state"] != "running" {
                break job;
            }
            let status: Value = http.get(format!("{base_url}/status")).send().await?.json().await?;
            let live = &status["training"]["running"];
            let step = live["step"].as_u64().unwrap_or(0);
            if step > shown {
                shown = step;
                println!(
                    "  GET /status       -> job {id} step {step}/{} loss {:.2}, served weights at step {}",
                    live["total"],
                    live["last"]["loss"].as_f64().unwrap_or(f64::NAN),
                    live["served_step"]
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        println!(
            "  job {id}             -> {} at step {}/{}; run directory {}",
            done["state"].as_str().unwrap_or("?"),
            done["step"],
            done["total"],
            done["dir"].as_str().unwrap_or("?")
        );
        println!(
            "  after             -> chat completions answered by step {} (swapped in, no restart)",
            chat().await?["toolsmith"]["step"]
        );
        let _ = stop.0.send(());
        serving.await??;
        anyhow::Ok(())
    });
    jobs.stop();
    if runner.join().is_err() {
        tracing::error!("the quickstart's job runner panicked");
    }
    result?;
    println!("  try it: toolsmith jobs submit sft --preset tiny-world --watch   (docs/guide/jobs.md)");
    Ok(())
}

async fn axum_serve(listener: tokio::net::TcpListener, app: axum::Router) {
    if let Err(e) = axum::serve(listener, app).await {
        tracing::warn!("the quickstart's chat endpoint stopped: {e}");
    }
}
