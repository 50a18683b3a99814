//! An Atropos rollout handler (`toolsmith env atropos`): groups sampled on an OpenAI-compatible
//! engine, scored and credited by the run's method, posted to the Atropos API, where a trainer
//! (verl's Atropos recipe, or any consumer of `/batch`) pulls them.
//!
//! Each iteration is `train rl`'s own up to the update: [`Sampler::sample`] draws the same tasks
//! with the same seeds, the method's rewards and DAPO's dynamic sampling decide the groups, and
//! [`Sampler::credited`] gives every token its advantage. A group is posted as Atropos's
//! `ScoredData`: the sequences' `tokens`; `masks` with each sampled token's id and -100 on
//! prompt and observation tokens (exactly the trainer's loss mask); one score per sequence (its
//! episode's reward); token-level `advantages`; and the engine's `inference_logprobs`.
//!
//! Delivery: a group is kept until the API has answered its post with success. A post that
//! could not reach the API (refused, reset before an answer came) is sent again once the API is
//! back, after registering again (a restarted API has forgotten this environment); a post the
//! API answered is never sent again, so a consumer sees each group once. Backpressure: before
//! sampling, the handler waits while the API's queue holds `max_queue` groups or more. Staleness:
//! a group sampled more than `max_staleness` trainer steps ago is dropped, not posted.

use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use toolsmith_train::rl::sampler::{CreditedSequence, Group, Sampler};

use crate::EnvError;

/// Where and how to post.
#[derive(Debug, Clone)]
pub struct AtroposOptions {
    /// The API's base URL, e.g. `http://127.0.0.1:8000`.
    pub url: String,
    /// The name this environment registers under.
    pub name: String,
    /// Its sampling weight among the API's environments.
    pub weight: f64,
    /// The longest sequence it posts, in tokens (registered with the API).
    pub max_token_length: usize,
    /// Wait before sampling while the API's queue holds this many groups or more.
    pub max_queue: usize,
    /// Drop a group sampled more than this many trainer steps before it could be posted.
    pub max_staleness: u64,
    /// How long to wait between attempts while the API is down.
    pub retry: Duration,
    /// Give up when the API stays unreachable this long.
    pub give_up: Duration,
}

impl Default for AtroposOptions {
    fn default() -> Self {
        AtroposOptions {
            url: "http://127.0.0.1:8000".into(),
            name: "toolsmith".into(),
            weight: 1.0,
            max_token_length: 8192,
            max_queue: 64,
            max_staleness: 4,
            retry: Duration::from_millis(500),
            give_up: Duration::from_secs(600),
        }
    }
}

/// One group as Atropos's `ScoredData`.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ScoredData {
    /// Each sequence's ids.
    pub tokens: Vec<Vec<i64>>,
    /// Each sequence's ids where the loss counts, -100 elsewhere.
    pub masks: Vec<Vec<i64>>,
    /// One score per sequence: its episode's reward.
    pub scores: Vec<f64>,
    /// The advantage of every token (0 outside the mask).
    pub advantages: Vec<Vec<f64>>,
    /// The engine's log-prob of every token (0 outside the mask).
    pub inference_logprobs: Vec<Vec<f64>>,
    /// Which environment posted it (set once registered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env_id: Option<i64>,
    /// Per-group fields the trainer may read: the task, the method, the iteration.
    pub group_overrides: Value,
}

/// Atropos's mask value for a token outside the loss.
pub const IGNORED: i64 = -100;

/// The scored groups of credited sequences (in the order of `groups`; a group none of whose
/// sequences survived is left out).
pub fn scored_groups(groups: &[Group], credited: &[CreditedSequence], method: &str, iteration: u64) -> Vec<ScoredData> {
    groups
        .iter()
        .enumerate()
        .filter_map(|(number, group)| {
            let sequences: Vec<&CreditedSequence> = credited.iter().filter(|c| c.group == number).collect();
            if sequences.is_empty() {
                return None;
            }
            let mut data = ScoredData {
                tokens: Vec::new(),
                masks: Vec::new(),
                scores: Vec::new(),
                advantages: Vec::new(),
                inference_logprobs: Vec::new(),
                env_id: None,
                group_overrides: json!({"task_id": group.task.id, "world": group.world, "method": method, "iteration": iteration}),
            };
            for c in sequences {
                let t = &c.sequence.tokens;
                data.masks.push(t.ids.iter().zip(&t.loss_mask).map(|(&id, &m)| if m { id } else { IGNORED }).collect());
                data.tokens.push(t.ids.clone());
                data.scores.push(c.reward);
                data.advantages.push(c.advantages.clone());
                data.inference_logprobs.push(c.sequence.behaviour.clone());
            }
            Some(data)
        })
        .collect()
}

/// The Atropos API, as one environment sees it.
#[derive(Debug)]
pub struct AtroposClient {
    http: reqwest::Client,
    options: AtroposOptions,
    group_size: usize,
    env_id: Option<i64>,
    /// Groups posted with success.
    pub posted: usize,
    /// Groups dropped as too stale.
    pub stale: usize,
}

/// Whether a request failed before the API answered it (so sending it again cannot duplicate).
fn unanswered(e: &reqwest::Error) -> bool {
    e.is_connect() || (e.is_request() && !e.is_timeout() && e.status().is_none())
}

impl AtroposClient {
    /// A client for groups of `group_size` episodes.
    pub fn new(options: AtroposOptions, group_size: usize) -> Result<AtroposClient, EnvError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| EnvError::Atropos(format!("cannot build the HTTP client: {e}")))?;
        Ok(AtroposClient { http, options, group_size, env_id: None, posted: 0, stale: 0 })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.options.url.trim_end_matches('/'))
    }

    /// Waits `retry` after a request that never reached the API, or fails once it has been
    /// unreachable for `give_up` since `started`. A restarted API has forgotten this environment,
    /// so the next request registers again.
    async fn unreachable(
        &mut self,
        what: &str,
        e: &reqwest::Error,
        started: std::time::Instant,
    ) -> Result<(), EnvError> {
        if started.elapsed() > self.options.give_up {
            return Err(EnvError::Atropos(format!(
                "{what}: the API at {} stayed unreachable for {:.0} s: {e}",
                self.options.url,
                self.options.give_up.as_secs_f64()
            )));
        }
        if self.env_id.is_some() {
            tracing::warn!("{what}: the Atropos API at {} is unreachable ({e}); retrying", self.options.url);
        }
        self.env_id = None;
        tokio::time::sleep(self.options.retry).await;
        Ok(())
    }

    /// Registers this environment (again, after the API restarted). The API answers "wait for
    /// trainer" until a trainer registered; the handler waits too.
    pub async fn register(&mut self) -> Result<i64, EnvError> {
        let body = json!({
            "max_token_length": self.options.max_token_length,
            "desired_name": self.options.name,
            "weight": self.options.weight,
            "group_size": self.group_size,
            "min_batch_allocation": null,
        });
        let started = std::time::Instant::now();
        loop {
            let sent = self.http.post(self.url("register-env")).json(&body).send().await;
            let reply: Value = match sent.and_then(reqwest::Response::error_for_status) {
                Ok(r) => r.json().await.map_err(|e| EnvError::Atropos(format!("register-env: {e}")))?,
                Err(e) if unanswered(&e) => {
                    self.unreachable("register-env", &e, started).await?;
                    continue;
                }
                Err(e) => return Err(EnvError::Atropos(format!("register-env: {e}"))),
            };
            if let Some(id) = reply.get("env_id").and_then(Value::as_i64) {
                tracing::info!(env_id = id, "registered with the Atropos API");
                self.env_id = Some(id);
                return Ok(id);
            }
            if started.elapsed() > self.options.give_up {
                return Err(EnvError::Atropos(format!("register-env: no env_id after waiting: {reply}")));
            }
            tracing::debug!("register-env: {reply}");
            tokio::time::sleep(self.options.retry).await;
        }
    }

    async fn ensure_registered(&mut self) -> Result<i64, EnvError> {
        match self.env_id {
            Some(id) => Ok(id),
            None => self.register().await,
        }
    }

    /// The API's view of this environment: its `current_step` (the trainer's) and queue.
    pub async fn status(&mut self) -> Result<Value, EnvError> {
        let started = std::time::Instant::now();
        loop {
            let id = self.ensure_registered().await?;
            let sent = self.http.get(self.url("status-env")).json(&json!({"env_id": id})).send().await;
            match sent.and_then(reqwest::Response::error_for_status) {
                Ok(r) => return r.json().await.map_err(|e| EnvError::Atropos(format!("status-env: {e}"))),
                Err(e) if unanswered(&e) => self.unreachable("status-env", &e, started).await?,
                Err(e) => return Err(EnvError::Atropos(format!("status-env: {e}"))),
            }
        }
    }

    /// The trainer's step, as the API reports it.
    pub async fn trainer_step(&mut self) -> Result<u64, EnvError> {
        Ok(self.status().await?.get("current_step").and_then(Value::as_u64).unwrap_or(0))
    }

    /// Waits while the API's queue holds `max_queue` groups or more (the trainer is behind).
    pub async fn wait_for_room(&mut self) -> Result<(), EnvError> {
        loop {
            let status = self.status().await?;
            let queued = status.get("queue_size").and_then(Value::as_u64).unwrap_or(0) as usize;
            if queued < self.options.max_queue {
                return Ok(());
            }
            tracing::debug!(queued, "the Atropos queue is full; waiting for the trainer");
            tokio::time::sleep(self.options.retry).await;
        }
    }

    /// Posts `groups`, sampled at trainer step `sampled_at`; each is posted exactly once, or
    /// dropped when the trainer has moved more than `max_staleness` steps on since.
    pub async fn post(&mut self, groups: Vec<ScoredData>, sampled_at: u64) -> Result<usize, EnvError> {
        let mut sent = 0;
        for mut group in groups {
            let started = std::time::Instant::now();
            loop {
                let step = self.trainer_step().await?;
                if step > sampled_at + self.options.max_staleness {
                    tracing::warn!(step, sampled_at, "a group is too stale to post; dropped");
                    self.stale += 1;
                    break;
                }
                // The API buffers a group whose size differs from the registered one until others
                // fill it up to that size, which would mix tasks in one group (MemPO's episodes are
                // several sequences): such a group goes straight to the queue, under no id.
                group.env_id = self.env_id.filter(|_| group.tokens.len() == self.group_size);
                let reply = self.http.post(self.url("scored_data")).json(&group).send().await;
                match reply.and_then(reqwest::Response::error_for_status) {
                    Ok(r) => {
                        tracing::debug!(status = %r.status(), "posted a group");
                        self.posted += 1;
                        sent += 1;
                        break;
                    }
                    // Never reached the API: safe to send again, once registered anew.
                    Err(e) if unanswered(&e) => self.unreachable("scored_data", &e, started).await?,
                    Err(e) => return Err(EnvError::Atropos(format!("scored_data: {e}"))),
                }
            }
        }
        Ok(sent)
    }
}

/// Runs `iterations` iterations from `first`: sample (after the queue has room), credit, post.
/// Returns the groups posted.
pub async fn run(
    env: &toolsmith_train::rl::sampler::Environment,
    client: &mut AtroposClient,
    first: u64,
    iterations: u64,
    mut on_iteration: impl FnMut(u64, usize, usize),
) -> Result<usize, EnvError> {
    let sampler: &Sampler = &env.sampler;
    let method = sampler.config().method.name();
    let mut total = 0;
    for iteration in first..first + iterations {
        client.wait_for_room().await?;
        let sampled_at = client.trainer_step().await?;
        let sampled = sampler.sample(iteration).await;
        let all: Vec<&Group> = sampled.kept.iter().chain(&sampled.dropped).collect();
        sampler.learn_tools(iteration, &all)?;
        let credited = sampler.credited(&sampled.kept, &env.policy, &env.builder)?;
        let groups = scored_groups(&sampled.kept, &credited, method, iteration);
        let n = groups.len();
        let posted = client.post(groups, sampled_at).await?;
        total += posted;
        on_iteration(iteration, n, posted);
    }
    Ok(total)
}
