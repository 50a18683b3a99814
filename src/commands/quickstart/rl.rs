//! Seconds of RL from the SFT checkpoint the training section left: a group of sampled episodes
//! decoded as one batch, their rewards and advantages, token-exact rescoring, then one iteration
//! of `train rl`.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use tokio::runtime::Runtime;
use toolsmith_agent::backend::{BatchConfig, BatchedBackend, GenerateOptions};
use toolsmith_agent::env::{Corpus, Task, World, WorldConfig};
use toolsmith_agent::tools::Executor;
use toolsmith_agent::{Agent, AgentConfig, Mode, Trajectory};
use toolsmith_policy::{LoadOptions, Policy};
use toolsmith_train::Event;
use toolsmith_train::config::WorldsData;
use toolsmith_train::metrics::Record;
use toolsmith_train::rl::advantage::{GroupNorm, group_advantages};
use toolsmith_train::rl::episode::episode_sequences;
use toolsmith_train::rl::{Method, RlConfig, RlTrainer};
use toolsmith_train::sequence::SequenceBuilder;

use super::{Env, clear_dir, corpus_tools};

/// Prints ``reinforcement learning (group-relative; `toolsmith train rl`):``, one group of episodes
/// taken apart, then one iteration of the trainer.
pub(super) fn section(env: &Env) -> Result<()> {
    println!("\nreinforcement learning (group-relative; `toolsmith train rl`):");
    let init = env.policy_dir().with_file_name("quickstart-sft").join("final");
    let world = World::generate(WorldConfig { seed: 5, countries: 2, tasks_per_family: 1 });
    let task = world.tasks().into_iter().next().context("the world has no tasks")?;
    let tools = corpus_tools(Arc::new(Corpus::new(&world.documents())?));
    let policy = Arc::new(Mutex::new(Policy::load(&init, LoadOptions::default())?));
    let backend = Arc::new(BatchedBackend::new(policy.clone(), "quickstart-sft", BatchConfig::default()));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let episodes = sample_group(&runtime, &backend, &tools, &task)?;
    score_group(&episodes, &task);
    rescore(&policy, &episodes)?;
    one_iteration(env, &init)?;
    println!("  try it: toolsmith train rl --preset tiny-world --method gap --init runs/sft/final --out runs/rl");
    Ok(())
}

/// Four episodes of `task` at temperature 1, run at once so the backend decodes their turns as
/// one batch.
fn sample_group(
    runtime: &Runtime,
    backend: &Arc<BatchedBackend>,
    tools: &Arc<dyn Executor>,
    task: &Task,
) -> Result<Vec<Trajectory>> {
    runtime.block_on(async {
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
    })
}

/// The group's SEARL rewards and the advantages normalised within it.
fn score_group(episodes: &[Trajectory], task: &Task) {
    let (searl, searl_config) = (Method::SEARL.spec().assign, RlConfig::for_method(Method::SEARL));
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
}

/// The trainer's log-probabilities of every sampled token against the sampler's: the same policy
/// must give the same numbers.
fn rescore(policy: &Mutex<Policy>, episodes: &[Trajectory]) -> Result<()> {
    let (mut tokens, mut max_diff) = (0, 0.0_f64);
    {
        let policy = policy.lock().map_err(|_| anyhow::anyhow!("the policy lock is poisoned"))?;
        let builder = SequenceBuilder::for_policy(&policy)?;
        for e in episodes {
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
    Ok(())
}

/// One iteration of `train rl` (SEARL) from the checkpoint at `init`.
fn one_iteration(env: &Env, init: &Path) -> Result<()> {
    let out = env.policy_dir().with_file_name("quickstart-rl");
    clear_dir(&out)?;
    let mut trainer = RlTrainer::prepare(rl_config(init), &out, false, &corpus_tools)?;
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
    Ok(())
}

/// SEARL's settings, cut to two tasks of four episodes, two turns each, on the CPU.
fn rl_config(init: &Path) -> RlConfig {
    let base = RlConfig::for_method(Method::SEARL);
    RlConfig {
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
        run: toolsmith_train::RunSettings {
            init: toolsmith_train::Init::Dir(init.to_path_buf()),
            device: toolsmith_train::DeviceChoice::Cpu,
            ..base.run.clone()
        },
        ..base
    }
}
