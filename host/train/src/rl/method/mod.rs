//! Credit assignment, one file per method.
//!
//! What differs between the papers' RL is the reward of an episode and how a group's rewards
//! become the advantage of each turn (and of a turn's `<mem>` tokens). Each method is a unit
//! struct implementing [`CreditAssignment`] in its own file, and one line of [`METHODS`]
//! registers it: the config's `method` field, its JSON Schema, the CLI's `--method` and the
//! daemon's job configs all read that table, and the trainer looks the method up and never
//! branches on it (verl's registered advantage estimators are the model). Everything else is
//! shared: rollouts, token-exact sequences, [`token_advantages`], the clipped loss, checkpoints.
//!
//! A new method is a file with a `static METHOD: MethodSpec` and one more line in [`METHODS`]:
//! [`gigpo`], the fifth, was added that way (docs/architecture.md walks through it).

pub mod gap;
pub mod gigpo;
pub mod mempo;
pub mod mtr;
pub mod searl;
pub mod toolcall;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::Mutex;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use toolsmith_agent::env::Task;
use toolsmith_agent::{Mode, Trajectory};
use toolsmith_policy::Policy;

use crate::TrainError;
use crate::rl::advantage::{GroupNorm, group_advantages};
use crate::rl::config::RlConfig;
use crate::rl::episode::EpisodeSequence;
use crate::rl::reward::EpisodeReward;
use crate::sequence::SequenceBuilder;

/// Every method, in the order help texts list them. A new method is one line here.
pub static METHODS: &[&MethodSpec] =
    &[&gap::METHOD, &searl::METHOD, &mempo::METHOD, &mtr::METHOD, &gigpo::METHOD, &toolcall::METHOD];

/// A method as the table registers it.
pub struct MethodSpec {
    /// Its name in configs and on the command line.
    pub name: &'static str,
    /// Other names it answers to.
    pub aliases: &'static [&'static str],
    /// One line for help texts and the config schema.
    pub summary: &'static str,
    /// The agent mode its episodes run in.
    pub mode: Mode,
    /// Its paper's settings over the shared defaults.
    pub defaults: fn(RlConfig) -> RlConfig,
    /// Its rewards and credit assignment.
    pub assign: &'static dyn CreditAssignment,
}

impl std::fmt::Debug for MethodSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MethodSpec").field("name", &self.name).field("mode", &self.mode).finish_non_exhaustive()
    }
}

/// One task's group as a method sees it: the episodes and the rewards the method gave them
/// (DAPO's overlong shaping included).
#[derive(Debug, Clone, Copy)]
pub struct GroupView<'a> {
    /// The task.
    pub task: &'a Task,
    /// Its episodes.
    pub episodes: &'a [Trajectory],
    /// Their rewards, in the same order.
    pub rewards: &'a [EpisodeReward],
}

/// What one turn's tokens are credited with.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TurnCredit {
    /// The advantage of every token of the turn.
    pub turn: f64,
    /// Added on the turn's `<mem>...</mem>` tokens (MemPO); 0 elsewhere.
    pub memory: f64,
}

/// What a method may use beyond the group: the run's settings, the policy being trained (MemPO
/// scores its memories with it), the run's sequence builder, and the tool graph's merges.
#[derive(Clone, Copy)]
#[allow(missing_debug_implementations)] // borrows of a policy and a builder: nothing to show
pub struct CreditContext<'a> {
    /// The run's settings.
    pub config: &'a RlConfig,
    /// The policy, as it was when the group was sampled.
    pub policy: &'a Mutex<Policy>,
    /// Conversations to token sequences.
    pub builder: &'a SequenceBuilder,
    /// Created tools' names to the name the tool graph would merge them into (SEARL anchors a
    /// step on the merged tool); empty without a graph, and for names that merge nowhere.
    pub merged: &'a HashMap<String, String>,
}

/// A method's rewards and credit assignment.
pub trait CreditAssignment: Send + Sync {
    /// The reward of one episode given the task's golden answers.
    fn reward(&self, episode: &Trajectory, golden: &[String], config: &RlConfig) -> EpisodeReward;

    /// The credit of each turn of each episode of a group (`[episode][turn]`).
    fn credit(&self, group: &GroupView<'_>, context: &CreditContext<'_>) -> Result<Vec<Vec<TurnCredit>>, TrainError>;
}

/// GRPO's episode advantage on every turn: `A_E` of episode `i` from the group's totals.
pub fn episode_credit(group: &GroupView<'_>, norm: GroupNorm) -> Vec<Vec<TurnCredit>> {
    let totals: Vec<f64> = group.rewards.iter().map(|r| r.total).collect();
    group
        .episodes
        .iter()
        .zip(group_advantages(&totals, norm))
        .map(|(e, a)| vec![TurnCredit { turn: a, memory: 0.0 }; e.steps.len()])
        .collect()
}

/// Adds `lambda * A_S` to every turn's credit: each turn's discounted return (the group's
/// `step` rewards, `gamma` from `step_credit`) against the returns of every turn of the group
/// with the same anchor (SEARL's tool, GiGPO's state); see
/// [`crate::rl::advantage::searl_step_advantages`].
pub fn add_step_credit(
    credit: &mut [Vec<TurnCredit>],
    group: &GroupView<'_>,
    anchors: &[Vec<Option<String>>],
    config: &RlConfig,
) {
    let steps: Vec<Vec<f64>> = group.rewards.iter().map(|r| r.steps.clone()).collect();
    let s = config.step_credit;
    let step_adv =
        crate::rl::advantage::searl_step_advantages(&steps, anchors, s.gamma, config.group_norm, s.single_vanishing);
    for (turns, a_s) in credit.iter_mut().zip(&step_adv) {
        for (turn, a) in turns.iter_mut().zip(a_s) {
            turn.turn += s.lambda * a;
        }
    }
}

/// The per-token advantages of one of an episode's sequences from its turns' credit.
///
/// Every token of turn `s` gets `credit[s].turn`; the tokens of its `<mem>` block (found by
/// `mem_span` from the turn's ids) get `credit[s].memory` on top. A turn for which `cut(s)` holds
/// (DAPO's overlong filtering: the budget cut it off) is taken out of the loss entirely: its
/// tokens leave the loss mask, so they count in neither the token-mean denominator nor the KL.
pub fn token_advantages(
    sequence: &mut EpisodeSequence,
    credit: &[TurnCredit],
    cut: impl Fn(usize) -> bool,
    mut mem_span: impl FnMut(&[i64]) -> Result<Option<Range<usize>>, TrainError>,
) -> Result<Vec<f64>, TrainError> {
    let mut advantages = vec![0.0; sequence.tokens.ids.len()];
    for span in &sequence.turns {
        let range = span.range.clone();
        if cut(span.step) {
            sequence.tokens.loss_mask[range].fill(false);
            continue;
        }
        let c = credit.get(span.step).copied().unwrap_or_default();
        advantages[range.clone()].fill(c.turn);
        if c.memory != 0.0
            && let Some(mem) = mem_span(&sequence.tokens.ids[range.clone()])?
        {
            for a in &mut advantages[range.start + mem.start..range.start + mem.end] {
                *a += c.memory;
            }
        }
    }
    Ok(advantages)
}

/// A registered method, by name.
#[derive(Clone, Copy)]
pub struct Method(&'static MethodSpec);

impl Method {
    /// GAP.
    pub const GAP: Method = Method(&gap::METHOD);
    /// SEARL.
    pub const SEARL: Method = Method(&searl::METHOD);
    /// MemPO.
    pub const MEMPO: Method = Method(&mempo::METHOD);
    /// MTR.
    pub const MTR: Method = Method(&mtr::METHOD);
    /// Tool calls from interfaces (`train tools`).
    pub const TOOLCALL: Method = Method(&toolcall::METHOD);

    /// Every registered method.
    pub fn all() -> impl Iterator<Item = Method> {
        METHODS.iter().map(|&spec| Method(spec))
    }

    /// A method outside [`METHODS`]: a test's, or one being written in another crate. It trains
    /// in process like any other; a config naming it is read back (`--config`, resume) only once
    /// it has its line in the table.
    pub const fn from_spec(spec: &'static MethodSpec) -> Method {
        Method(spec)
    }

    /// The method named `name` (or one of its aliases).
    pub fn parse(name: &str) -> Option<Method> {
        Method::all().find(|m| m.0.name == name || m.0.aliases.contains(&name))
    }

    /// Like [`Method::parse`], with an error that lists the choices.
    pub fn parse_or_explain(name: &str) -> Result<Method, TrainError> {
        Method::parse(name).ok_or_else(|| TrainError::Config(format!("unknown method {name:?}: {}", Method::choices())))
    }

    /// The names as a list for messages (`gap, searl, ... or gigpo`).
    pub fn choices() -> String {
        let names: Vec<&str> = METHODS.iter().map(|m| m.name).collect();
        match names.split_last() {
            Some((last, [])) => (*last).to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// The agent mode its episodes run in.
    pub fn mode(self) -> Mode {
        self.0.mode
    }

    /// Its table entry.
    pub fn spec(self) -> &'static MethodSpec {
        self.0
    }
}

impl Default for Method {
    fn default() -> Self {
        Method::GAP
    }
}

impl PartialEq for Method {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Method {}

impl fmt::Debug for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Method({})", self.0.name)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name)
    }
}

impl Serialize for Method {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0.name)
    }
}

impl<'de> Deserialize<'de> for Method {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = Cow::<'de, str>::deserialize(deserializer)?;
        Method::parse(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown method {name:?}: {}", Method::choices())))
    }
}

impl schemars::JsonSchema for Method {
    fn schema_name() -> Cow<'static, str> {
        "Method".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let choices: Vec<serde_json::Value> = METHODS
            .iter()
            .map(|m| serde_json::json!({"const": m.name, "description": m.summary, "type": "string"}))
            .collect();
        schemars::json_schema!({"description": "Whose rewards and credit assignment a run uses.", "oneOf": choices})
    }
}
