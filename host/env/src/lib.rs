//! Toolsmith as the environment of other trainers.
//!
//! Toolsmith's own trainer is one process; the papers' 3B-7B policies train on clusters with
//! verl, OpenRLHF or TRL. What those lack is the environment: sandboxed tools, the tool graph,
//! the four papers' rewards and credit, token-exact multi-turn episodes. This crate serves that
//! over the two protocols the field uses:
//!
//! - [`openenv`]: an OpenEnv environment over HTTP and WebSocket (`toolsmith env serve`): each
//!   session is one episode of a task, the client sends the model's turns, the environment runs
//!   their calls and returns observations and the method's reward. TRL's GRPOTrainer, SkyRL and
//!   torchforge train against it.
//! - [`atropos`]: an Atropos rollout handler (`toolsmith env atropos`): whole groups sampled on
//!   an OpenAI-compatible engine, scored and credited token by token, posted to the Atropos API
//!   for a trainer (verl's Atropos recipe) to pull.
//!
//! Both sit on the trainer's seam, [`toolsmith_train::rl::sampler::Sampler`]: the same agents,
//! rewards and credit assignment as `train rl`, looked up in the one method table.

#![warn(missing_docs)]

pub mod atropos;
pub mod openenv;
mod session;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use toolsmith_agent::backend::{BackendError, BoxFuture, Completion, GenerateOptions, Message};
use toolsmith_agent::{Backend, Trajectory};
use toolsmith_contract::Manifest;
use toolsmith_contract::sync::lock;
use toolsmith_policy::Tokenizer;
use toolsmith_train::rl::reward::EpisodeReward;
use toolsmith_train::rl::sampler::{Group, Sampler, seed_of};

use session::Session;
pub use session::{ClientTurn, Observation, SessionState, StepResult};

/// Why an environment request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// No such session (never started, closed, or reaped after idling).
    #[error("unknown episode {0:?}: reset first (sessions idle for too long are closed)")]
    UnknownSession(String),
    /// The episode already ended.
    #[error("episode {0:?} has ended: reset for a new one")]
    Finished(String),
    /// The session table is full.
    #[error(
        "{0} episodes are open, the most this environment runs at once: close one, or start it with more --max-sessions"
    )]
    Full(usize),
    /// The model's turn cannot be taken.
    #[error("bad turn: {0}")]
    BadTurn(String),
    /// A reset asked for a task that is not there.
    #[error("{0}")]
    BadReset(String),
    /// The agent took longer than the step's wait to ask for the next turn.
    #[error("episode {session:?}: no next turn within {seconds:.0} s (the session is closed)")]
    Timeout {
        /// The session.
        session: String,
        /// The wait.
        seconds: f64,
    },
    /// The Atropos API failed or refused a request.
    #[error("atropos: {0}")]
    Atropos(String),
    /// Training code failed (credit assignment, sequences, the tool graph).
    #[error(transparent)]
    Train(#[from] toolsmith_train::TrainError),
    /// Something that should not happen.
    #[error("{0}")]
    Internal(String),
}

/// How an environment runs its sessions.
#[derive(Debug, Clone)]
pub struct EnvOptions {
    /// Episodes open at once at most; a reset beyond it is refused.
    pub max_sessions: usize,
    /// A session no client touched for this long is closed (with its agent and tool calls).
    pub idle_timeout: Duration,
    /// How long a step (the turn's calls) may take before the session is closed.
    pub step_timeout: Duration,
    /// Seed of the task order and the episodes' sampling seeds.
    pub seed: u64,
}

impl Default for EnvOptions {
    fn default() -> Self {
        EnvOptions {
            max_sessions: 256,
            idle_timeout: Duration::from_secs(600),
            step_timeout: Duration::from_secs(120),
            seed: 0,
        }
    }
}

/// Which task an episode is.
#[derive(Debug, Clone, Default)]
pub struct ResetRequest {
    /// The session's id; a fresh one when absent. Resetting an open id starts it over.
    pub episode_id: Option<String>,
    /// A task by id (with `world`, when ids repeat across worlds).
    pub task_id: Option<String>,
    /// The world of `task_id` (0 by default).
    pub world: Option<usize>,
    /// A seed that picks the task (the same seed, the same task); without it and without
    /// `task_id`, tasks are dealt in a seeded order.
    pub seed: Option<u64>,
}

/// A SEARL group being gathered: the finished episodes of one task, until there are a group's
/// worth of them.
type Pending = HashMap<(usize, String), Vec<(Trajectory, EpisodeReward)>>;

/// The environment: the sampler's worlds and method, and the open sessions.
pub struct Environment {
    sampler: Arc<Sampler>,
    tokenizer: Option<Arc<Tokenizer>>,
    options: EnvOptions,
    sessions: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Session>>>>,
    next_id: AtomicU64,
    dealt: AtomicU64,
    /// SEARL's candidate pool: episodes gathered per task, learned from a group at a time.
    pending: Mutex<Pending>,
    learned: AtomicU64,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment").field("sampler", &self.sampler).field("options", &self.options).finish()
    }
}

/// The backend of a sampler that samples nothing itself: every turn comes from a client.
#[derive(Debug)]
pub struct ClientsOnly;

impl Backend for ClientsOnly {
    fn name(&self) -> String {
        "clients".into()
    }

    fn complete<'a>(
        &'a self,
        _messages: &'a [Message],
        _options: &'a GenerateOptions,
    ) -> BoxFuture<'a, Result<Completion, BackendError>> {
        Box::pin(async { Err(BackendError::Http("this environment's turns come from its clients".into())) })
    }
}

impl Environment {
    /// An environment over `sampler`'s worlds and method. With a tokenizer, clients may send
    /// turns as token ids.
    pub fn new(sampler: Sampler, tokenizer: Option<Tokenizer>, options: EnvOptions) -> Environment {
        Environment {
            sampler: Arc::new(sampler),
            tokenizer: tokenizer.map(Arc::new),
            options,
            sessions: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            dealt: AtomicU64::new(0),
            pending: Mutex::new(HashMap::new()),
            learned: AtomicU64::new(0),
        }
    }

    /// The sampler.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// The options.
    pub fn options(&self) -> &EnvOptions {
        &self.options
    }

    /// Open sessions.
    pub fn open_sessions(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// Every task, as `(world, task id, question)`.
    pub fn tasks(&self) -> Vec<(usize, String, String)> {
        self.sampler
            .worlds()
            .iter()
            .enumerate()
            .flat_map(|(w, world)| world.tasks.iter().map(move |t| (w, t.id.clone(), t.question.clone())))
            .collect()
    }

    /// The tools of world 0, as MCP lists them.
    pub fn tools(&self) -> Vec<Manifest> {
        self.sampler.worlds().first().map(|w| w.tools.manifests()).unwrap_or_default()
    }

    /// Calls a tool of world 0 directly (MCP `tools/call`): the same executor episodes use.
    pub async fn call_tool(&self, name: &str, arguments: Value) -> Result<Value, toolsmith_contract::StructuredError> {
        let Some(world) = self.sampler.worlds().first() else {
            return Err(toolsmith_contract::StructuredError::new(
                toolsmith_contract::ErrorKind::NotFound,
                name,
                "this environment has no tools",
            ));
        };
        world.tools.call(name, &arguments).await.value
    }

    /// Starts an episode; returns its id and first observation.
    pub async fn reset(&self, request: ResetRequest) -> Result<(String, Observation), EnvError> {
        self.reap();
        let (world, task) = self.pick(&request)?;
        let id = request.episode_id.clone().unwrap_or_else(|| self.fresh_id());
        {
            let mut sessions = lock(&self.sessions);
            // Resetting an open episode replaces it (its agent stops with it).
            sessions.remove(&id);
            if sessions.len() >= self.options.max_sessions {
                return Err(EnvError::Full(self.options.max_sessions));
            }
        }
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let seed = seed_of(&[self.options.seed, request.seed.unwrap_or(n), n]);
        let session = Session::start(id.clone(), &self.sampler, world, task, seed, self.options.step_timeout).await?;
        let observation = session.observation().clone();
        let mut sessions = lock(&self.sessions);
        if sessions.len() >= self.options.max_sessions {
            return Err(EnvError::Full(self.options.max_sessions));
        }
        sessions.insert(id.clone(), Arc::new(tokio::sync::Mutex::new(session)));
        Ok((id, observation))
    }

    /// Takes the model's turn in episode `id`.
    pub async fn step(&self, id: &str, turn: ClientTurn) -> Result<StepResult, EnvError> {
        let session = self.session(id)?;
        let mut session = session.lock().await;
        let result = session.step(&self.sampler, turn, self.tokenizer.as_deref(), self.options.step_timeout).await;
        match &result {
            Err(EnvError::Timeout { .. }) => {
                drop(session);
                self.close(id);
            }
            Ok(r) if r.done => {
                if let Some((trajectory, reward)) = session.outcome().cloned() {
                    let key = (session.world(), session.task().id.clone());
                    let task = session.task().clone();
                    drop(session);
                    self.gather(key, task, trajectory, reward).await?;
                }
            }
            _ => {}
        }
        result
    }

    /// Where episode `id` stands.
    pub async fn state(&self, id: &str) -> Result<SessionState, EnvError> {
        let session = self.session(id)?;
        let state = session.lock().await.state();
        Ok(state)
    }

    /// Closes episode `id` (nothing happens for an unknown one).
    pub fn close(&self, id: &str) -> bool {
        lock(&self.sessions).remove(id).is_some()
    }

    /// Closes sessions idle longer than the idle timeout; returns how many.
    pub fn reap(&self) -> usize {
        let idle = self.options.idle_timeout;
        let mut sessions = lock(&self.sessions);
        let before = sessions.len();
        // A session whose lock is held is in use, so not idle.
        sessions.retain(|_, s| s.try_lock().map_or(true, |s| s.touched.elapsed() < idle));
        before - sessions.len()
    }

    fn session(&self, id: &str) -> Result<Arc<tokio::sync::Mutex<Session>>, EnvError> {
        lock(&self.sessions).get(id).cloned().ok_or_else(|| EnvError::UnknownSession(id.to_string()))
    }

    fn fresh_id(&self) -> String {
        format!("ep-{:016x}{:04x}", rand_u64(), self.next_id.load(Ordering::Relaxed) & 0xffff)
    }

    /// The task a reset asks for.
    fn pick(&self, request: &ResetRequest) -> Result<(usize, toolsmith_agent::env::Task), EnvError> {
        let worlds = self.sampler.worlds();
        let total: usize = worlds.iter().map(|w| w.tasks.len()).sum();
        if total == 0 {
            return Err(EnvError::BadReset("this environment has no tasks".into()));
        }
        if let Some(id) = &request.task_id {
            let w = request.world.unwrap_or(0);
            let world = worlds.get(w).ok_or_else(|| EnvError::BadReset(format!("no world {w}")))?;
            let task = world
                .tasks
                .iter()
                .find(|t| &t.id == id)
                .ok_or_else(|| EnvError::BadReset(format!("world {w} has no task {id:?}")))?;
            return Ok((w, task.clone()));
        }
        let index = match request.seed {
            Some(seed) => seed_of(&[self.options.seed, seed]) as usize % total,
            None => {
                // Dealt in a seeded order, a whole pass before any task repeats.
                let n = self.dealt.fetch_add(1, Ordering::Relaxed);
                let pass = n / total as u64;
                let order = self.sampler.draw_tasks(pass, (n % total as u64) as usize, 1);
                return order.into_iter().next().ok_or_else(|| EnvError::Internal("no task drawn".into()));
            }
        };
        let mut left = index;
        for (w, world) in worlds.iter().enumerate() {
            if left < world.tasks.len() {
                return Ok((w, world.tasks[left].clone()));
            }
            left -= world.tasks.len();
        }
        Err(EnvError::Internal("task index out of range".into()))
    }

    /// SEARL: a finished episode joins its task's pool; a group's worth of them is learned from
    /// at once, with the trainer's best-reward admission, so a session's tools reach the shared
    /// graph only as `train rl`'s would.
    async fn gather(
        &self,
        key: (usize, String),
        task: toolsmith_agent::env::Task,
        trajectory: Trajectory,
        reward: EpisodeReward,
    ) -> Result<(), EnvError> {
        if self.sampler.graph().is_none() {
            return Ok(());
        }
        let group_size = self.sampler.config().group_size.max(1);
        let ready = {
            let mut pending = lock(&self.pending);
            let pool = pending.entry(key.clone()).or_default();
            pool.push((trajectory, reward));
            if pool.len() < group_size { None } else { pending.remove(&key) }
        };
        let Some(pool) = ready else { return Ok(()) };
        let (episodes, rewards) = pool.into_iter().unzip();
        let group = Group { world: key.0, task, episodes, rewards };
        let iteration = self.learned.fetch_add(1, Ordering::Relaxed);
        let sampler = self.sampler.clone();
        let update = tokio::task::spawn_blocking(move || sampler.learn_tools(iteration, &[&group]))
            .await
            .map_err(|e| EnvError::Internal(format!("the tool graph's update stopped: {e}")))??;
        tracing::info!(
            admitted = update.admitted,
            candidates = update.candidates,
            "a SEARL group reached the tool graph"
        );
        Ok(())
    }
}

/// A random number for session ids (not for anything that must be reproducible).
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}
