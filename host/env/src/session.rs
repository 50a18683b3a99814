//! One episode driven from outside, a turn at a time.
//!
//! The agent loop is the trainer's own ([`toolsmith_agent::Agent::run`], built by
//! [`Sampler::agent`]): the session hands it a backend whose every completion is a turn the
//! environment's client sends. When the agent asks for a turn, the session returns the context
//! (the observation); `step` answers that request with the client's text (or token ids), the
//! agent parses it, runs its calls in the sandbox (a GAP level in parallel) and asks again or
//! finishes. The rewards are the method's ([`Sampler::reward`]), so an OpenEnv trainer is paid
//! exactly what `train rl` pays.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use toolsmith_agent::backend::{BackendError, BoxFuture, Completion, GenerateOptions, Message, TurnTokens, Usage};
use toolsmith_agent::env::Task;
use toolsmith_agent::{Backend, Trajectory};
use toolsmith_contract::Manifest;
use toolsmith_policy::{FinishReason, Tokenizer};
use toolsmith_train::rl::reward::{EpisodeReward, correct};
use toolsmith_train::rl::sampler::Sampler;

use crate::EnvError;

/// What the agent asks the client for: the next turn after these messages.
#[derive(Debug)]
struct TurnRequest {
    messages: Vec<Message>,
    tools: Vec<Manifest>,
    reply: oneshot::Sender<Result<Completion, BackendError>>,
}

/// The backend of a session's agent: each completion is asked of the session's client.
#[derive(Debug)]
struct ClientTurns {
    requests: mpsc::Sender<TurnRequest>,
}

impl Backend for ClientTurns {
    fn name(&self) -> String {
        "env-client".into()
    }

    fn complete<'a>(
        &'a self,
        messages: &'a [Message],
        options: &'a GenerateOptions,
    ) -> BoxFuture<'a, Result<Completion, BackendError>> {
        self.complete_with_tools(messages, &[], options)
    }

    fn complete_with_tools<'a>(
        &'a self,
        messages: &'a [Message],
        tools: &'a [Manifest],
        _options: &'a GenerateOptions,
    ) -> BoxFuture<'a, Result<Completion, BackendError>> {
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let request = TurnRequest { messages: messages.to_vec(), tools: tools.to_vec(), reply };
            self.requests.send(request).await.map_err(|_| BackendError::Http("the session was closed".into()))?;
            answer.await.map_err(|_| BackendError::Http("the session was closed before its turn".into()))?
        })
    }
}

/// The model's turn as a client sends it.
#[derive(Debug, Clone, Default)]
pub struct ClientTurn {
    /// The turn as text in the trace grammar.
    pub text: Option<String>,
    /// The turn as the ids the model sampled (decoded with the environment's tokenizer).
    pub ids: Option<Vec<i64>>,
    /// The behaviour log-prob of each id, when the client has them: the episode is then
    /// token-exact, as the trainer's own rollouts are.
    pub logprobs: Option<Vec<f64>>,
}

/// What a client sees after `reset` and after each `step`.
#[derive(Debug, Clone, Serialize)]
pub struct Observation {
    /// The episode's question.
    pub question: String,
    /// The context of the next turn, as chat messages (system prompt with the tool listing,
    /// the question, earlier turns and observations; MemPO's truncated context in `mem`).
    pub messages: Vec<Value>,
    /// The tools listed in the system prompt, as OpenAI function definitions.
    pub tools: Vec<Value>,
    /// What the runtime wrote back after the last turn (empty after `reset`).
    pub observation: String,
    /// Turns taken so far.
    pub turn: usize,
}

/// A step's outcome, in OpenEnv's terms.
#[derive(Debug, Clone, Serialize)]
pub struct StepResult {
    /// The next observation (after the last turn: the final context).
    pub observation: Observation,
    /// The turn's reward: 0 until the episode ends, then the method's episode reward.
    pub reward: f64,
    /// Whether the episode ended.
    pub done: bool,
    /// The method's reward parts and the episode's outcome, once it ended.
    pub info: Value,
}

/// Where an episode stands.
#[derive(Debug, Clone, Serialize)]
pub struct SessionState {
    /// The session's id.
    pub episode_id: String,
    /// The task.
    pub task_id: String,
    /// The world the task is from.
    pub world: usize,
    /// Turns taken.
    pub step_count: usize,
    /// Whether the episode ended.
    pub done: bool,
    /// The episode reward, once it ended.
    pub reward: Option<f64>,
}

/// One episode between a client and the agent loop.
pub struct Session {
    id: String,
    world: usize,
    task: Task,
    requests: mpsc::Receiver<TurnRequest>,
    pending: Option<oneshot::Sender<Result<Completion, BackendError>>>,
    finished: Option<oneshot::Receiver<Trajectory>>,
    agent: tokio::task::JoinHandle<()>,
    last: Observation,
    turns: usize,
    outcome: Option<(Trajectory, EpisodeReward)>,
    /// When a client last touched the session (idle sessions are closed).
    pub(crate) touched: Instant,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("id", &self.id).field("task", &self.task.id).finish_non_exhaustive()
    }
}

impl Drop for Session {
    /// A session that goes away (closed, reaped, its client gone) takes its agent with it: the
    /// loop stops at its next await, and its tool calls are dropped with it.
    fn drop(&mut self) {
        self.agent.abort();
    }
}

impl Session {
    /// Starts an episode of `task` (from `world`) and waits for the agent's first request.
    pub(crate) async fn start(
        id: String,
        sampler: &Sampler,
        world: usize,
        task: Task,
        seed: u64,
        wait: Duration,
    ) -> Result<Session, EnvError> {
        let (sender, requests) = mpsc::channel(1);
        let (done, finished) = oneshot::channel();
        let agent = sampler.agent(world, seed, Arc::new(ClientTurns { requests: sender }));
        let question = task.question.clone();
        let handle = tokio::spawn(async move {
            let trajectory = agent.run(&question).await;
            // The backend's sender goes with the agent, which tells the session the loop ended.
            drop(agent);
            let _ = done.send(trajectory);
        });
        let empty = Observation {
            question: task.question.clone(),
            messages: Vec::new(),
            tools: Vec::new(),
            observation: String::new(),
            turn: 0,
        };
        let mut session = Session {
            id,
            world,
            task,
            requests,
            pending: None,
            finished: Some(finished),
            agent: handle,
            last: empty,
            turns: 0,
            outcome: None,
            touched: Instant::now(),
        };
        // The first request is the system prompt and the question; an episode that ends before
        // asking (no budget) is done at once.
        session.advance(sampler, wait).await?;
        Ok(session)
    }

    /// The current observation.
    pub fn observation(&self) -> &Observation {
        &self.last
    }

    /// Whether the episode ended.
    pub fn done(&self) -> bool {
        self.outcome.is_some()
    }

    /// The finished episode and its reward.
    pub fn outcome(&self) -> Option<&(Trajectory, EpisodeReward)> {
        self.outcome.as_ref()
    }

    /// The task.
    pub fn task(&self) -> &Task {
        &self.task
    }

    /// The world.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Where the episode stands.
    pub fn state(&self) -> SessionState {
        SessionState {
            episode_id: self.id.clone(),
            task_id: self.task.id.clone(),
            world: self.world,
            step_count: self.turns,
            done: self.done(),
            reward: self.outcome.as_ref().map(|(_, r)| r.total),
        }
    }

    /// Gives the agent the client's turn and runs it: the calls, then the next request or the
    /// end of the episode.
    pub(crate) async fn step(
        &mut self,
        sampler: &Sampler,
        turn: ClientTurn,
        tokenizer: Option<&Tokenizer>,
        wait: Duration,
    ) -> Result<StepResult, EnvError> {
        self.touched = Instant::now();
        if self.done() {
            return Err(EnvError::Finished(self.id.clone()));
        }
        let Some(reply) = self.pending.take() else {
            return Err(EnvError::Finished(self.id.clone()));
        };
        let completion = match completion(turn, tokenizer) {
            Ok(c) => c,
            Err(e) => {
                // The turn is refused, not lost: the agent keeps waiting for a valid one.
                self.pending = Some(reply);
                return Err(e);
            }
        };
        // The agent may have stopped since (an aborted session); then the episode is over.
        let _ = reply.send(Ok(completion));
        self.turns += 1;
        self.advance(sampler, wait).await?;
        let (reward, info) = match &self.outcome {
            Some((trajectory, reward)) => (reward.total, outcome_info(trajectory, reward, &self.task)),
            None => (0.0, json!({})),
        };
        Ok(StepResult { observation: self.last.clone(), reward, done: self.done(), info })
    }

    /// Waits (at most `wait`) for the agent's next request, or for the end of its episode.
    async fn advance(&mut self, sampler: &Sampler, wait: Duration) -> Result<(), EnvError> {
        let next = tokio::time::timeout(wait, self.requests.recv())
            .await
            .map_err(|_| EnvError::Timeout { session: self.id.clone(), seconds: wait.as_secs_f64() })?;
        match next {
            Some(request) => {
                let observation = request
                    .messages
                    .last()
                    .filter(|m| self.turns > 0 && m.role == toolsmith_agent::Role::User)
                    .map(|m| m.content.clone())
                    .unwrap_or_default();
                self.last = Observation {
                    question: self.task.question.clone(),
                    messages: request.messages.iter().map(message_json).collect(),
                    tools: request.tools.iter().map(Manifest::to_openai_function).collect(),
                    observation,
                    turn: self.turns,
                };
                self.pending = Some(request.reply);
            }
            None => {
                let finished = self.finished.take().ok_or_else(|| EnvError::Finished(self.id.clone()))?;
                let trajectory = finished
                    .await
                    .map_err(|_| EnvError::Internal(format!("the agent of session {} stopped", self.id)))?;
                let reward = sampler.reward(&trajectory, &self.task);
                self.last.observation = trajectory.steps.last().map(|s| s.observation.clone()).unwrap_or_default();
                self.last.turn = self.turns;
                self.outcome = Some((trajectory, reward));
            }
        }
        Ok(())
    }
}

/// A message as OpenAI's chat format writes it.
fn message_json(m: &Message) -> Value {
    json!({"role": m.role, "content": m.content})
}

/// The method's reward parts and the episode's outcome, for `info`.
fn outcome_info(trajectory: &Trajectory, reward: &EpisodeReward, task: &Task) -> Value {
    json!({
        "reward": reward.total,
        "outcome": reward.outcome,
        "step_rewards": reward.steps,
        "correct": correct(trajectory, &task.golden_answers),
        "answer": trajectory.answer,
        "finish": trajectory.finish,
        "turns": trajectory.turns(),
        "task_id": task.id,
    })
}

/// The client's turn as a completion the agent takes: text as sent, or ids decoded (out of the
/// vocabulary, or with no tokenizer to decode them, is an error the client sees).
fn completion(turn: ClientTurn, tokenizer: Option<&Tokenizer>) -> Result<Completion, EnvError> {
    match (turn.text, turn.ids) {
        (Some(_), Some(_)) => Err(EnvError::BadTurn("send the turn as text or as token ids, not both".into())),
        (None, None) => Err(EnvError::BadTurn("the action has no turn: send `text` (or `ids`)".into())),
        (Some(text), None) => {
            if turn.logprobs.is_some() {
                return Err(EnvError::BadTurn("`logprobs` come with `ids`, not with text".into()));
            }
            let completion_tokens = tokenizer.and_then(|t| t.encode(&text).ok()).map_or(0, |ids| ids.len());
            Ok(Completion {
                text,
                usage: Usage { prompt_tokens: 0, completion_tokens },
                finish_reason: "stop".into(),
                tokens: None,
                raw: None,
            })
        }
        (None, Some(ids)) => {
            let tokenizer = tokenizer.ok_or_else(|| {
                EnvError::BadTurn("this environment has no tokenizer to decode ids: start it with --tokenizer".into())
            })?;
            let vocab = tokenizer.vocab_size() as i64;
            if let Some(bad) = ids.iter().find(|&&id| id < 0 || id >= vocab) {
                return Err(EnvError::BadTurn(format!("token id {bad} is outside the vocabulary (0..{vocab})")));
            }
            let text = tokenizer.decode(&ids).map_err(|e| EnvError::BadTurn(e.to_string()))?;
            let tokens = match turn.logprobs {
                Some(logprobs) if logprobs.len() != ids.len() => {
                    return Err(EnvError::BadTurn(format!("{} ids but {} logprobs", ids.len(), logprobs.len())));
                }
                Some(logprobs) => Some(TurnTokens {
                    closed: ids.last().is_some_and(|last| tokenizer.eos_ids().contains(last)),
                    output_ids: ids.clone(),
                    logprobs,
                    finish: FinishReason::Eos,
                }),
                None => None,
            };
            Ok(Completion {
                text,
                usage: Usage { prompt_tokens: 0, completion_tokens: ids.len() },
                finish_reason: "stop".into(),
                tokens,
                raw: None,
            })
        }
    }
}
