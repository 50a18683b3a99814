//! Exact-call accuracy by family, decoded greedily in batches, with or without schema-constrained
//! decoding (the served endpoint's `tool_choice: auto` grammar: free text, and any call decoded
//! under the union of the listed tools' schemas).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toolsmith_agent::backend::Message;
use toolsmith_agent::backend::local::prompt_ids;
use toolsmith_agent::function_calling::{Function, call_schema};
use toolsmith_policy::constrain::{JsonSchemaGrammar, TokenTable};
use toolsmith_policy::{CallRules, Policy, SamplingParams, TurnConstraint, TurnGrammar, TurnMatcher};

use super::episode::{continues, observation, parse_turn, results};
use super::score::{Predicted, episode_exact};
use super::{CallFamily, CallTask, Interface};
use crate::TrainError;

/// Accuracy of one family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Accuracy {
    /// Tasks.
    pub tasks: usize,
    /// Tasks whose calls were exact.
    pub exact: usize,
}

impl Accuracy {
    /// The share exact (0 with no tasks).
    pub fn rate(&self) -> f64 {
        if self.tasks == 0 { 0.0 } else { self.exact as f64 / self.tasks as f64 }
    }
}

/// Accuracy by family and overall.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// By family name.
    pub families: BTreeMap<String, Accuracy>,
    /// All tasks.
    pub overall: Accuracy,
}

/// One evaluated episode: what the policy wrote, turn by turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    /// The task.
    pub id: String,
    /// Its family.
    pub family: CallFamily,
    /// Each turn's text.
    pub turns: Vec<String>,
    /// Whether the calls were exact.
    pub exact: bool,
}

/// How to decode.
#[derive(Debug, Clone, Copy)]
pub struct Decoding {
    /// Under the call grammar.
    pub constrained: bool,
    /// Tokens per turn.
    pub max_tokens: usize,
    /// Prompts per forward batch.
    pub batch: usize,
}

struct Episode<'a> {
    task: &'a CallTask,
    history: Vec<Message>,
    turns: Vec<Vec<Predicted>>,
    texts: Vec<String>,
    /// The call grammar of the task's tools (constrained decoding only), compiled once.
    grammar: Option<Arc<TurnGrammar>>,
    done: bool,
}

fn grammar_of(tools: &[Interface]) -> Option<Arc<TurnGrammar>> {
    let functions: Vec<Function<'_>> = tools.iter().map(Interface::function).collect();
    let grammar = JsonSchemaGrammar::compile(&call_schema(&functions)).ok();
    // As the endpoint under `auto`: a call schema that does not compile is decoded freely.
    grammar.map(|g| Arc::new(TurnGrammar::Calls(CallRules::new(Some(g), true, 0, usize::MAX))))
}

/// Runs every task and counts exact episodes by family; `progress` is told each finished task.
/// The transcripts come in the order of `tasks`.
pub fn evaluate(
    policy: &Policy,
    tasks: &[CallTask],
    decoding: Decoding,
    progress: &dyn Fn(usize),
) -> Result<(Report, Vec<Transcript>), TrainError> {
    let table = if decoding.constrained { Some(TokenTable::new(policy.tokenizer())?) } else { None };
    let mut episodes: Vec<Episode<'_>> = tasks
        .iter()
        .map(|t| Episode {
            task: t,
            history: vec![Message::system(t.system()), Message::user(&t.request)],
            turns: Vec::new(),
            texts: Vec::new(),
            grammar: if decoding.constrained { grammar_of(&t.tools) } else { None },
            done: false,
        })
        .collect();
    let params = SamplingParams { max_new_tokens: decoding.max_tokens, temperature: 0.0, ..SamplingParams::default() };
    let most = tasks.iter().map(|t| t.turns.len()).max().unwrap_or(1).max(1);
    for turn in 0..most {
        let mut active: Vec<usize> = (0..episodes.len()).filter(|&i| !episodes[i].done).collect();
        if active.is_empty() {
            break;
        }
        let prompts: Vec<Vec<i64>> = active
            .iter()
            .map(|&i| prompt_ids(policy, &episodes[i].history).map_err(|e| TrainError::Agent(e.to_string())))
            .collect::<Result<_, _>>()?;
        // Similar lengths batch with less padding.
        let mut order: Vec<usize> = (0..active.len()).collect();
        order.sort_by_key(|&k| prompts[k].len());
        active = order.iter().map(|&k| active[k]).collect();
        let prompts: Vec<Vec<i64>> = order.iter().map(|&k| prompts[k].clone()).collect();
        for (chunk, ids) in active.chunks(decoding.batch.max(1)).zip(prompts.chunks(decoding.batch.max(1))) {
            let texts: Vec<String> = match &table {
                Some(table) => {
                    let rows: Vec<Option<TurnMatcher>> =
                        chunk.iter().map(|&i| episodes[i].grammar.clone().map(TurnMatcher::new)).collect();
                    let mut constraint = TurnConstraint::new(table, policy.tokenizer().eos_ids(), rows);
                    let (g, _) = policy.generate_with(ids, &params, None, Some(&mut constraint))?;
                    g.into_iter().map(|g| g.text).collect()
                }
                None => policy.generate(ids, &params, None)?.0.into_iter().map(|g| g.text).collect(),
            };
            for (&i, text) in chunk.iter().zip(texts) {
                let e = &mut episodes[i];
                let (calls, _) = parse_turn(&text);
                let go_on = continues(e.task, turn, &calls);
                let seen = results(e.task, turn, &calls);
                e.history.push(Message::assistant(&text));
                e.history.push(Message::user(observation(&calls, &seen)));
                e.turns.push(calls);
                e.texts.push(text);
                if !go_on {
                    e.done = true;
                    progress(1);
                }
            }
        }
    }
    let mut report = Report::default();
    for family in CallFamily::ALL {
        report.families.insert(family.name().into(), Accuracy::default());
    }
    let mut transcripts = Vec::with_capacity(episodes.len());
    for e in episodes {
        let exact = episode_exact(e.task, &e.turns);
        for a in [report.families.entry(e.task.family.name().into()).or_default(), &mut report.overall] {
            a.tasks += 1;
            a.exact += usize::from(exact);
        }
        transcripts.push(Transcript { id: e.task.id.clone(), family: e.task.family, turns: e.texts, exact });
    }
    report.families.retain(|_, a| a.tasks > 0);
    Ok((report, transcripts))
}

/// A report as one line: `single 0.62 (31/50) · choice ...`.
pub fn summary(report: &Report) -> String {
    let mut parts: Vec<String> =
        report.families.iter().map(|(f, a)| format!("{f} {:.2} ({}/{})", a.rate(), a.exact, a.tasks)).collect();
    parts.push(format!("all {:.2}", report.overall.rate()));
    parts.join(" · ")
}
