//! SmolLM2-135M-Instruct, the policy users train: bf16 where the CPU computes it, a held-out
//! question before and after a few LoRA steps, the adapter saved as PEFT saves it and swapped
//! into a served policy without reloading the base.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use tokio::runtime::Runtime;
use toolsmith_agent::backend::{GenerateOptions, LocalBackend};
use toolsmith_agent::env::{Corpus, Family, Task, World, WorldConfig};
use toolsmith_agent::tools::Executor;
use toolsmith_agent::{Agent, AgentConfig, Mode, ToolFormat, Trajectory};
use toolsmith_daemon::chat::Served;
use toolsmith_policy::{LoadOptions, LoraConfig, Policy};
use toolsmith_train::config::{DataConfig, SftConfig, WorldsData};
use toolsmith_train::sft::{self, Event};

use super::{Env, clear_dir, clip, corpus_tools, ms};

/// LoRA steps between the two attempts at the held-out question.
const STEPS: u64 = 12;

/// Prints ``the pretrained policy (SmolLM2-135M-Instruct; `--policy smollm2-135m`, `--init smollm2-135m`):``,
/// then `  skipped: …` and nothing more when the checkpoint was never fetched.
pub(super) fn section(env: &Env) -> Result<()> {
    println!("\nthe pretrained policy (SmolLM2-135M-Instruct; `--policy smollm2-135m`, `--init smollm2-135m`):");
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
    let shared = load(&dir)?;
    let served = Served::new(LocalBackend::shared(shared.clone(), "smollm2-135m"));
    let probe = Probe::new(shared)?;
    println!("  held-out question -> {:?} (world 101, never trained on)", probe.task.question);
    probe.attempt("untrained")?;

    let final_dir = lora_sft(env, &dir)?;
    swap_adapter(&served, &final_dir.join("adapter"))?;
    probe.attempt(&format!("after {STEPS} steps"))?;
    toolsmith_policy::set_threads(1);
    println!(
        "  try it: toolsmith train sft --preset smol-world --out runs/smol   (about 24 minutes; held-out EM: BENCHMARKS.md)"
    );
    Ok(())
}

/// Loads the checkpoint at its automatic precision, saying what it got and how long it took.
fn load(dir: &Path) -> Result<Arc<Mutex<Policy>>> {
    let started = Instant::now();
    let policy = Policy::load(dir, LoadOptions::default())?;
    println!(
        "  loaded            -> {:.1} M parameters in {:?} (precision auto: bf16 where the CPU has AVX512_BF16 or AMX) in {}",
        policy.state().parameters as f64 / 1e6,
        policy.state().precision,
        ms(started.elapsed())
    );
    Ok(Arc::new(Mutex::new(policy)))
}

/// One held-out question the agent attempts with the shared policy, before and after training.
struct Probe {
    policy: Arc<Mutex<Policy>>,
    task: Task,
    tools: Arc<dyn Executor>,
    runtime: Runtime,
    config: AgentConfig,
}

impl Probe {
    fn new(policy: Arc<Mutex<Policy>>) -> Result<Self> {
        // A world none of the training data comes from: new names, new facts.
        let world = World::generate(WorldConfig { seed: 101, countries: 2, tasks_per_family: 1 });
        let task = world.tasks().into_iter().find(|t| t.family == Family::SingleHop).context("a single-hop task")?;
        let tools = corpus_tools(Arc::new(Corpus::new(&world.documents())?));
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
        Ok(Probe { policy, task, tools, runtime, config })
    }

    /// Runs the agent on the question and prints its first turn, its tool calls and its answer.
    fn attempt(&self, label: &str) -> Result<()> {
        let Probe { policy, task, tools, runtime, config } = self;
        let agent =
            Agent::new(Arc::new(LocalBackend::shared(policy.clone(), "smollm2-135m")), tools.clone(), config.clone());
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
    }
}

/// [`STEPS`] LoRA steps on world 1's single-hop traces, from the checkpoint at `init`; returns
/// the final checkpoint's directory.
fn lora_sft(env: &Env, init: &Path) -> Result<PathBuf> {
    let out = env.policy_dir().with_file_name("quickstart-lora");
    clear_dir(&out)?;
    let config = lora_config(init);
    let started = Instant::now();
    let mut trainer = sft::prepare(config, &out, false, &corpus_tools)?;
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
    Ok(final_dir)
}

/// The LoRA run's settings: rank-16 adapters, no dropout, single-hop traces only.
fn lora_config(init: &Path) -> SftConfig {
    let lora = LoraConfig { dropout: 0.0, ..LoraConfig::default() };
    SftConfig {
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
        steps: Some(STEPS),
        lr: 3e-3,
        warmup_ratio: 0.0,
        batch_tokens: 2048,
        micro_batch_tokens: 2048,
        eval: None,
        checkpoint_every: STEPS,
        run: toolsmith_train::RunSettings {
            init: toolsmith_train::Init::Dir(init.to_path_buf()),
            tool_format: ToolFormat::Brief,
            lora: Some(lora),
            ..SftConfig::default().run
        },
        ..SftConfig::default()
    }
}

/// Swaps the trained adapter into the served policy, saying how long the swap took.
fn swap_adapter(served: &Served, adapter: &Path) -> Result<()> {
    let started = Instant::now();
    let step = served.swap(adapter).map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "  adapter           -> {} (PEFT's files), swapped into the served policy at step {step} in {}: the base is not reloaded",
        adapter.display(),
        ms(started.elapsed())
    );
    Ok(())
}
