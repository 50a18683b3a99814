//! [`Jobs`], the handle the API and the CLI hold: submitting, listing, cancelling and resuming
//! jobs, starting and stopping the runner.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use toolsmith_train::SftConfig;
use toolsmith_train::rl::RlConfig;

use super::publish::Publisher;
use super::runner::{Control, Inner, Runner};
use super::store::Store;
use super::{Job, JobError, JobInputs, JobKind, JobState, JobsStatus};
use crate::Daemon;
use crate::openai::Served;

/// The job queue and its runner. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Jobs {
    inner: Arc<Inner>,
    daemon: Daemon,
    publisher: Publisher,
    /// What job configs may name.
    inputs: Arc<JobInputs>,
}

impl Jobs {
    /// Opens (or creates) the jobs of the state directory `root`, for `daemon`, swapping `served`
    /// after each checkpoint. Jobs a dead daemon left running are queued again.
    pub fn open(root: &Path, daemon: Daemon, served: Option<Served>) -> Result<Jobs, JobError> {
        let store = Store::open(root)?;
        let orphans = store.requeue_orphans()?;
        if orphans > 0 {
            tracing::warn!(orphans, "jobs left running by a daemon that stopped are queued again; they resume");
        }
        let inner = Arc::new(Inner { store, control: Control::default() });
        daemon.set_jobs_status(StatusSource(inner.clone()));
        let inputs = Arc::new(JobInputs::new(root));
        let publisher = Publisher::new(daemon.clone(), served);
        Ok(Jobs { inner, daemon, publisher, inputs })
    }

    /// With the paths and sizes job configs may name (by default: the state directory only,
    /// data files up to [`super::DEFAULT_MAX_DATA_BYTES`]).
    pub fn with_inputs(mut self, inputs: JobInputs) -> Jobs {
        self.inputs = Arc::new(inputs);
        self
    }

    /// Queues a job after checking its config the way `toolsmith train` does, and its paths
    /// against what this daemon may read ([`JobInputs`]).
    pub fn submit(&self, kind: JobKind, mut config: Value) -> Result<Job, JobError> {
        if !config.is_object() {
            return Err(JobError::Invalid(format!("config must be an object, not {config}")));
        }
        self.inputs.confine(&mut config)?;
        let normalised = normalise(kind, config)?;
        let job = self.inner.store.insert(kind, &normalised)?;
        tracing::info!(id = job.id, kind = %kind, "job queued");
        self.inner.control.wake();
        Ok(job)
    }

    /// One job.
    pub fn get(&self, id: i64) -> Result<Job, JobError> {
        self.inner.store.get(id)
    }

    /// Every job, oldest first.
    pub fn list(&self) -> Result<Vec<Job>, JobError> {
        self.inner.store.list()
    }

    /// Training progress for `/status`.
    pub fn status(&self) -> JobsStatus {
        StatusSource(self.inner.clone()).status()
    }

    /// Cancels a queued job at once, or asks a running one to stop after its current step (with
    /// a checkpoint); returns the job as it is now.
    pub fn cancel(&self, id: i64) -> Result<Job, JobError> {
        let store = &self.inner.store;
        if store.transition(id, &[JobState::Queued], JobState::Cancelled, None)? {
            return store.get(id);
        }
        let job = store.get(id)?;
        match job.state {
            JobState::Running => {
                self.inner.control.request_cancel(id);
                Ok(job)
            }
            state => Err(JobError::Conflict { id, state, why: "only queued or running jobs cancel" }),
        }
    }

    /// Queues a cancelled or failed job again; it continues from its last checkpoint.
    pub fn resume(&self, id: i64) -> Result<Job, JobError> {
        let store = &self.inner.store;
        if store.transition(id, &[JobState::Cancelled, JobState::Failed], JobState::Queued, None)? {
            self.inner.control.wake();
            return store.get(id);
        }
        let job = store.get(id)?;
        Err(JobError::Conflict { id, state: job.state, why: "only cancelled or failed jobs resume" })
    }

    /// Interrupts the running job (it stays queued, with a checkpoint) and ends the runner.
    pub fn stop(&self) {
        self.inner.control.stop();
    }

    /// Starts the runner thread: it runs queued jobs one at a time until [`Jobs::stop`].
    pub fn spawn_runner(&self) -> std::io::Result<std::thread::JoinHandle<()>> {
        let runner =
            Runner::new(self.inner.clone(), self.daemon.toolbox().clone(), self.inputs.clone(), self.publisher.clone());
        // A plain thread, not a tokio blocking task: the RL trainer drives its own runtime.
        std::thread::Builder::new().name("toolsmith-jobs".into()).spawn(move || runner.run_loop())
    }

    /// Registers the agent-written tools of the checkpoint's tool graph in the daemon's registry
    /// (an unchanged tool is left alone, so this repeats safely); returns how many changed it.
    pub fn publish_tools(&self, checkpoint: &Path) -> Result<usize, String> {
        self.publisher.publish_tools(checkpoint)
    }
}

/// `config` as the trainer of `kind` reads it, checked by its rules, with defaults filled in.
fn normalise(kind: JobKind, config: Value) -> Result<Value, JobError> {
    match kind {
        JobKind::Sft => {
            let c: SftConfig = serde_json::from_value(config)
                .map_err(|e| JobError::Invalid(format!("the SFT config is invalid: {e}")))?;
            c.validate().map_err(|e| JobError::Invalid(e.to_string()))?;
            serde_json::to_value(c)
        }
        JobKind::Rl => {
            let c: RlConfig = serde_json::from_value(config)
                .map_err(|e| JobError::Invalid(format!("the RL config is invalid: {e}")))?;
            c.validate().map_err(|e| JobError::Invalid(e.to_string()))?;
            serde_json::to_value(c)
        }
    }
    .map_err(|e| JobError::Invalid(e.to_string()))
}

/// A handle on [`Jobs`] state that the daemon's status can read without owning the runner.
#[derive(Clone, Debug)]
pub(crate) struct StatusSource(Arc<Inner>);

impl StatusSource {
    /// The running job and the length of the queue.
    pub(crate) fn status(&self) -> JobsStatus {
        JobsStatus { running: self.0.control.live(), queued: self.0.store.queued().unwrap_or(0) }
    }

    /// Every job's checkpoints that kept a tool graph (RL with the graph on), by job and step.
    pub(crate) fn checkpoint_graphs(&self) -> Vec<(crate::graph_page::CheckpointGraph, PathBuf)> {
        let store = &self.0.store;
        let mut jobs: Vec<i64> = std::fs::read_dir(store.jobs_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        jobs.sort_unstable();
        jobs.into_iter()
            .flat_map(|id| crate::graph_page::job_checkpoint_graphs(&id.to_string(), &store.dir_of(id)))
            .collect()
    }
}
