//! Group rollouts: 8 episodes of one task with the tiny policy (sampled at temperature 1, real
//! search over the bundled world), run one after another on the plain local backend and all at
//! once on the batching backend, whose worker decodes concurrent turns as one batch; both keep
//! each episode's keys and values between its turns (prefix cache), and the batching backend
//! runs once more without. Prints generated tokens per second of each and the ratios. Medians
//! of 3 rounds.
//!
//!   cargo bench -p toolsmith-agent --bench rollout [-- --threads N --episodes N]

use std::sync::{Arc, Mutex};
use std::time::Instant;

use toolsmith_agent::backend::{Backend, BatchConfig, BatchedBackend, GenerateOptions, LocalBackend};
use toolsmith_agent::env::{Corpus, World, WorldConfig};
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_agent::{Agent, AgentConfig, Mode, Trajectory};
use toolsmith_policy::{LoadOptions, Policy};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).map_or(default, |w| w[1].parse().expect("a number"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn generated(episodes: &[Trajectory]) -> usize {
    episodes.iter().map(Trajectory::response_tokens).sum()
}

fn main() {
    let (threads, n) = (arg("--threads", 2), arg("--episodes", 8));
    toolsmith_policy::set_threads(threads);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio");
    let world = World::generate(WorldConfig::default());
    let corpus = Arc::new(Corpus::new(&world.documents()).expect("corpus"));
    let question = world.tasks()[0].question.clone();
    let policy = Arc::new(Mutex::new(Policy::tiny(0, LoadOptions::default()).expect("tiny policy")));
    let agent = |backend: Arc<dyn Backend>, seed: u64| {
        let config = AgentConfig {
            mode: Mode::Gap,
            max_turns: 3,
            generate: GenerateOptions { max_tokens: 96, temperature: 1.0, seed, ..GenerateOptions::default() },
            ..AgentConfig::default()
        };
        Agent::new(backend, Arc::new(LocalTools::new().with_corpus(corpus.clone())), config)
    };
    let sequential: Arc<dyn Backend> = Arc::new(LocalBackend::shared(policy.clone(), "tiny"));
    let batched: Arc<dyn Backend> = Arc::new(BatchedBackend::new(policy.clone(), "tiny", BatchConfig::default()));
    let uncached: Arc<dyn Backend> = Arc::new(BatchedBackend::new(
        policy.clone(),
        "tiny",
        BatchConfig { prefix_cache_bytes: 0, ..BatchConfig::default() },
    ));
    let together = |backend: &Arc<dyn Backend>, seed: u64| {
        let started = Instant::now();
        let episodes: Vec<Trajectory> = runtime.block_on(futures_util::future::join_all((0..n as u64).map(|i| {
            let agent = agent(backend.clone(), seed + i);
            let question = question.clone();
            async move { agent.run(&question).await }
        })));
        generated(&episodes) as f64 / started.elapsed().as_secs_f64()
    };
    println!("{n} episodes of one task, tiny policy, {threads} thread(s), up to 3 turns of 96 tokens");
    let (mut one, mut all, mut no_cache) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..3_u64 {
        let seed = round * 1000;
        let started = Instant::now();
        let episodes: Vec<Trajectory> =
            (0..n as u64).map(|i| runtime.block_on(agent(sequential.clone(), seed + i).run(&question))).collect();
        let a = generated(&episodes) as f64 / started.elapsed().as_secs_f64();
        let b = together(&batched, seed);
        let c = together(&uncached, seed);
        println!(
            "round {}: one after another {a:.0} tokens/s, batched {b:.0} tokens/s (ratio {:.2}), batched without the prefix cache {c:.0} tokens/s",
            round + 1,
            b / a
        );
        one.push(a);
        all.push(b);
        no_cache.push(c);
    }
    // Decoding alone, without the agent loop: the first prompt of the task, 96 tokens, one
    // sequence against eight (the same prompt, eight seeds).
    let prompt = {
        let guard = policy.lock().expect("policy");
        let messages = toolsmith_agent::runner::context(
            Mode::Gap.context(),
            &toolsmith_agent::runner::system_prompt(
                Mode::Gap,
                &LocalTools::new().with_corpus(corpus.clone()).manifests(),
                toolsmith_agent::ToolFormat::Compact,
            ),
            &question,
            &[],
        );
        toolsmith_agent::backend::local::prompt_ids(&guard, &messages).expect("prompt")
    };
    let params = toolsmith_policy::SamplingParams {
        max_new_tokens: 96,
        temperature: 1.0,
        ignore_eos: true,
        ..toolsmith_policy::SamplingParams::default()
    };
    let decode = |n: usize| {
        let guard = policy.lock().expect("policy");
        let prompts = vec![prompt.clone(); n];
        let seeds: Vec<u64> = (0..n as u64).collect();
        let started = Instant::now();
        let (out, _) = guard.generate_seeded(&prompts, &params, &seeds).expect("generate");
        out.iter().map(|g| g.output_ids.len()).sum::<usize>() as f64 / started.elapsed().as_secs_f64()
    };
    let (d1, d8) = (median((0..3).map(|_| decode(1)).collect()), median((0..3).map(|_| decode(n)).collect()));
    println!(
        "decoding alone ({}-token prompt, 96 tokens): 1 sequence {d1:.0} tokens/s, {n} sequences {d8:.0} tokens/s, ratio {:.2}",
        prompt.len(),
        d8 / d1
    );
    let (a, b, c) = (median(one), median(all), median(no_cache));
    println!();
    println!("| episodes | threads | one after another | batched | ratio | batched, no prefix cache |");
    println!("|---:|---:|---:|---:|---:|---:|");
    println!("| {n} | {threads} | {a:.0} tokens/s | {b:.0} tokens/s | {:.2}x | {c:.0} tokens/s |", b / a);
}
