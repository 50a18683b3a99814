//! Token-in, token-out episodes: the trainer scores exactly the ids the policy sampled, in the
//! contexts it sampled them in, and gets back the behaviour log-probs.

mod common;

use std::sync::{Arc, Mutex};

use toolsmith_agent::backend::{GenerateOptions, LocalBackend, local::prompt_ids};
use toolsmith_agent::env::{Corpus, World, WorldConfig};
use toolsmith_agent::tools::LocalTools;
use toolsmith_agent::{Agent, AgentConfig, Mode, Trajectory};
use toolsmith_policy::tch;
use toolsmith_policy::{LoadOptions, Policy};
use toolsmith_train::rl::episode::episode_sequences;
use toolsmith_train::sequence::SequenceBuilder;

fn episodes(policy: &Arc<Mutex<Policy>>, mode: Mode, seed: u64, temperature: f64) -> Vec<Trajectory> {
    let world = World::generate(WorldConfig { seed: 3, countries: 2, tasks_per_family: 1 });
    let corpus = Arc::new(Corpus::new(&world.documents()).expect("corpus"));
    let config = AgentConfig {
        mode,
        max_turns: 3,
        generate: GenerateOptions { max_tokens: 40, temperature, seed, ..GenerateOptions::default() },
        ..AgentConfig::default()
    };
    let agent = Agent::new(
        Arc::new(LocalBackend::shared(policy.clone(), "tiny")),
        Arc::new(LocalTools::new().with_corpus(corpus)),
        config,
    );
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    world.tasks().iter().take(3).map(|t| runtime.block_on(agent.run(&t.question))).collect()
}

#[test]
fn the_trainer_recomputes_the_behaviour_log_probs_of_sampled_episodes() {
    tch::set_num_threads(1);
    let policy = Arc::new(Mutex::new(
        Policy::tiny(11, LoadOptions { precision: Some(toolsmith_policy::Precision::F32), ..Default::default() })
            .expect("tiny policy"),
    ));
    let guard = policy.lock().expect("policy");
    let builder = SequenceBuilder::for_policy(&guard).expect("builder");
    drop(guard);
    let (mut turns, mut scored, mut max_diff, mut retokenized_differ) = (0, 0, 0.0_f64, 0);
    for (mode, seed) in [(Mode::Gap, 1), (Mode::Mem, 2), (Mode::React, 3)] {
        for trajectory in episodes(&policy, mode, seed, 1.0) {
            let policy = policy.lock().expect("policy");
            let sequences = episode_sequences(&builder, &trajectory).expect("sequences");
            // Every turn is scored once. Full history: one sequence. MemPO: a turn shares a
            // sequence only with the turn before it whose whole context it saw (the first two).
            let covered: Vec<usize> = sequences.iter().flat_map(|s| s.turns.iter().map(|t| t.step)).collect();
            assert_eq!(covered, (0..trajectory.steps.len()).collect::<Vec<_>>(), "{mode}");
            if mode == Mode::Mem {
                assert!(sequences.len() + 1 >= trajectory.steps.len(), "{mode}: {} sequences", sequences.len());
            } else {
                assert_eq!(sequences.len(), 1, "{mode}");
            }
            let contexts = trajectory.contexts();
            for seq in &sequences {
                for span in &seq.turns {
                    turns += 1;
                    let step = &trajectory.steps[span.step];
                    let tokens = step.tokens.as_ref().expect("sampled tokens");
                    // The sequence up to the turn is the prompt the policy was given, and the
                    // turn is the ids it sampled.
                    let prompt = prompt_ids(&policy, &contexts[span.step]).expect("prompt");
                    assert_eq!(&seq.tokens.ids[..span.range.start], &prompt[..], "{mode} turn {}", span.step);
                    assert_eq!(&seq.tokens.ids[span.range.clone()], &tokens.output_ids[..span.range.len()]);
                    let text_ids = policy.tokenizer().encode(&step.text).expect("encodes");
                    retokenized_differ += usize::from(text_ids != tokens.content_ids());
                }
                let (n, diff) = common::rescore(&policy, seq, 1.0);
                scored += n;
                max_diff = max_diff.max(diff);
            }
        }
    }
    println!(
        "{turns} sampled turns, {scored} tokens scored: max |trainer - behaviour| log-prob = {max_diff:.2e}; \
         {retokenized_differ} turns' text tokenizes to other ids than were sampled"
    );
    assert!(turns >= 9 && scored > 200, "{turns} turns, {scored} tokens");
    assert!(max_diff < 1e-3, "max abs log-prob difference {max_diff}");
}

#[test]
fn tokens_sampled_at_a_temperature_rescore_to_their_behaviour_log_probs() {
    tch::set_num_threads(1);
    let policy = Arc::new(Mutex::new(
        Policy::tiny(11, LoadOptions { precision: Some(toolsmith_policy::Precision::F32), ..Default::default() })
            .expect("tiny policy"),
    ));
    let builder = SequenceBuilder::for_policy(&policy.lock().expect("policy")).expect("builder");
    let (mut scored, mut max_diff, mut untempered) = (0, 0.0_f64, 0.0_f64);
    for (mode, seed) in [(Mode::Gap, 4), (Mode::React, 5)] {
        for trajectory in episodes(&policy, mode, seed, 0.7) {
            let policy = policy.lock().expect("policy");
            for seq in episode_sequences(&builder, &trajectory).expect("sequences") {
                let (n, diff) = common::rescore(&policy, &seq, 0.7);
                scored += n;
                max_diff = max_diff.max(diff);
                untempered = untempered.max(common::rescore(&policy, &seq, 1.0).1);
            }
        }
    }
    println!(
        "{scored} tokens sampled at T = 0.7: max |trainer - behaviour| = {max_diff:.2e} (untempered: {untempered:.2e})"
    );
    assert!(scored > 100, "{scored} tokens");
    assert!(max_diff < 1e-4, "max abs log-prob difference {max_diff}");
    // Scoring the untempered distribution would be another distribution: the test can tell.
    assert!(untempered > 1e-2, "{untempered}");
}
