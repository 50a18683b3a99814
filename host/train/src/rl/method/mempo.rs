//! MemPO (self-memory policy optimisation): the agent writes a `<mem>` summary that replaces its
//! history. The trajectory reward is 1 for a right answer with every turn well-formed; every
//! token carries the episode's advantage, and the tokens of each `<mem>` block also carry a
//! memory advantage: how much more likely the policy finds the golden answer given that memory
//! than given the one before it, normalised over the group's memories.
//!
//! The pool of the memory advantage holds only the turns that wrote a `<mem>` (the paper's memory
//! group is the set of memories generated; a turn without one has no memory to compare), so
//! turns without one neither shift its mean and spread nor receive a memory term.

use std::ops::Range;

use toolsmith_agent::backend::Message;
use toolsmith_agent::{Mode, Trajectory};
use toolsmith_policy::score::micro_batches;
use toolsmith_policy::tch::{self, Kind};
use toolsmith_policy::{TokenSequence, Tokenizer};

use crate::TrainError;
use crate::rl::advantage::{answer_probability, memory_advantages};
use crate::rl::config::RlConfig;
use crate::rl::episode::{mem_text, tokens_covering};
use crate::rl::loss::Aggregation;
use crate::rl::method::{CreditAssignment, CreditContext, GroupView, MethodSpec, TurnCredit, episode_credit};
use crate::rl::reward::{EpisodeReward, correct};

/// The table entry.
pub static METHOD: MethodSpec = MethodSpec {
    name: "mempo",
    aliases: &["mem"],
    summary: "MemPO: `<mem>` summaries replace the history; a memory advantage on `<mem>` tokens.",
    mode: Mode::Mem,
    defaults,
    assign: &MemPo,
};

struct MemPo;

/// GRPO with a sequence-mean loss and a small KL.
fn defaults(base: RlConfig) -> RlConfig {
    RlConfig { loss: base.loss.grpo(0.001, Aggregation::SequenceMean), ..base }
}

/// 1 iff the answer is right and every turn was well-formed.
pub fn reward(trajectory: &Trajectory, golden: &[String]) -> EpisodeReward {
    let well_formed = trajectory.steps.iter().all(|s| s.errors.is_empty());
    let outcome = f64::from(u8::from(correct(trajectory, golden) && well_formed));
    EpisodeReward { total: outcome, outcome, steps: Vec::new() }
}

/// The `<mem>` of each turn of each episode, if it wrote one: the block whose tokens get the
/// memory advantage ([`mem_text`]).
fn memories(group: &GroupView<'_>) -> Vec<Vec<Option<String>>> {
    group.episodes.iter().map(|e| e.steps.iter().map(|s| mem_text(&s.text).map(str::to_string)).collect()).collect()
}

/// The tokens of `golden` in a probe's answer turn `<answer>{golden}</answer>` (`answer`, a range
/// of `ids`): MemPO's answer probability is over the gold answer's tokens, not the tags around
/// it, which are near-certain and would pull every memory's score towards 1. The whole turn when
/// the answer is empty or its text is not found where it was written.
pub fn golden_tokens(tokenizer: &Tokenizer, ids: &[i64], answer: Range<usize>, golden: &str) -> Range<usize> {
    let golden = golden.trim();
    let Ok((text, ends)) = tokenizer.decode_with_ends(&ids[answer.clone()]) else { return answer };
    let open = "<answer>";
    let found = text.find(open).map(|at| at + open.len()).filter(|&start| text[start..].starts_with(golden));
    match found {
        Some(start) if !golden.is_empty() => tokens_covering(&ends, start, start + golden.len())
            .map(|r| answer.start + r.start..answer.start + r.end)
            .unwrap_or(answer),
        _ => {
            tracing::warn!("the memory probe's answer {golden:?} was not found in its turn: scoring the whole turn");
            answer
        }
    }
}

/// The memory reward of every turn that wrote a `<mem>`: the probability of the golden answer
/// given the question and that memory (the geometric mean of the gold answer's token
/// probabilities: [`golden_tokens`]), minus the same given the memory before it (the question
/// alone for the first).
fn memory_rewards(group: &GroupView<'_>, context: &CreditContext<'_>) -> Result<Vec<Vec<Option<f64>>>, TrainError> {
    let golden = group.task.golden_answers.first().cloned().unwrap_or_default();
    let system = group.episodes.first().map(|e| e.system.clone()).unwrap_or_default();
    let probe = |mem: Option<&str>| -> Vec<Message> {
        let question = match mem {
            Some(m) => format!("{}\n<mem>{m}</mem>", group.task.question),
            None => group.task.question.clone(),
        };
        vec![
            Message::system(&system),
            Message::user(question),
            Message::assistant(format!("<answer>{golden}</answer>")),
        ]
    };
    let mems = memories(group);
    // Every distinct context, scored once.
    let mut contexts: Vec<Option<&str>> = vec![None];
    for m in mems.iter().flatten().flatten() {
        if !contexts.contains(&Some(m.as_str())) {
            contexts.push(Some(m.as_str()));
        }
    }
    let mut sequences = Vec::with_capacity(contexts.len());
    for c in &contexts {
        let encoded = context.builder.encode(&probe(*c))?;
        let Some((_, answer)) = encoded.assistant.last().cloned() else {
            return Err(TrainError::Agent("the memory probe has no answer turn".into()));
        };
        let mut mask = vec![false; encoded.ids.len()];
        mask[golden_tokens(context.builder.tokenizer(), &encoded.ids, answer, &golden)].fill(true);
        sequences.push(TokenSequence { ids: encoded.ids, loss_mask: mask });
    }
    let policy = toolsmith_contract::sync::lock(context.policy);
    let mut probability = Vec::with_capacity(sequences.len());
    for range in micro_batches(&sequences, context.config.micro_batch_tokens) {
        let scores = tch::no_grad(|| policy.score(&sequences[range.clone()], false))?;
        for (row, i) in range.enumerate() {
            let lp = Vec::<f64>::try_from(scores.logprobs.get(row as i64).to_kind(Kind::Double))?;
            let taken: Vec<f64> =
                sequences[i].loss_mask.iter().zip(&lp).filter(|(m, _)| **m).map(|(_, l)| *l).collect();
            probability.push(answer_probability(&taken));
        }
    }
    let p = |m: Option<&str>| probability[contexts.iter().position(|c| *c == m).unwrap_or(0)];
    Ok(mems
        .iter()
        .map(|episode| {
            let mut before = p(None);
            episode
                .iter()
                .map(|m| {
                    m.as_deref().map(|m| {
                        let now = p(Some(m));
                        let r = now - before;
                        before = now;
                        r
                    })
                })
                .collect()
        })
        .collect())
}

impl CreditAssignment for MemPo {
    fn reward(&self, episode: &Trajectory, golden: &[String], _: &RlConfig) -> EpisodeReward {
        reward(episode, golden)
    }

    fn credit(&self, group: &GroupView<'_>, context: &CreditContext<'_>) -> Result<Vec<Vec<TurnCredit>>, TrainError> {
        let mut credit = episode_credit(group, context.config.group_norm);
        let weight = context.config.step_credit.lambda;
        if weight == 0.0 {
            // The ablation: no memory term, and no probe of the memories to compute one.
            return Ok(credit);
        }
        let memory = memory_advantages(&memory_rewards(group, context)?, context.config.group_norm);
        for (turns, m) in credit.iter_mut().zip(&memory) {
            for (turn, &m) in turns.iter_mut().zip(m) {
                turn.memory = weight * m;
            }
        }
        Ok(credit)
    }
}
