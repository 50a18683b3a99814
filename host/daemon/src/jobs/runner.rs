//! Running jobs: the runner thread claims the oldest queued job, trains it, records its progress
//! and how it ended; [`Control`] is what the API shares with it (live progress, cancel flags,
//! wake-ups).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::Value;
use toolsmith_agent::env::Corpus;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_contract::sync::lock;
use toolsmith_sandbox::{Limits, Toolbox};
use toolsmith_train::rl::{RlConfig, RlTrainer};
use toolsmith_train::{Event, SftConfig, TrainError, sft};

use super::publish::Publisher;
use super::store::Store;
use super::{Job, JobInputs, JobKind, JobState, Live};

/// What every handle on the jobs shares: the table and the runner's controls.
pub(super) struct Inner {
    pub(super) store: Store,
    pub(super) control: Control,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs").field("store", &self.store.path()).finish_non_exhaustive()
    }
}

/// What the API and the runner thread share about the running job.
#[derive(Debug, Default)]
pub(super) struct Control {
    live: Mutex<Option<Live>>,
    cancel: Mutex<Option<(i64, Arc<AtomicBool>)>>,
    /// Running jobs asked to stop, kept until the trainer's flag exists (a cancel can arrive
    /// while the job is still being prepared).
    requested: Mutex<HashSet<i64>>,
    /// Set when the daemon stops: the running job is interrupted but stays queued.
    stopping: AtomicBool,
    wake: (Mutex<bool>, Condvar),
}

impl Control {
    /// The running job, as the runner last heard of it.
    pub(super) fn live(&self) -> Option<Live> {
        lock(&self.live).clone()
    }

    /// Asks running job `id` to stop after its current step.
    pub(super) fn request_cancel(&self, id: i64) {
        lock(&self.requested).insert(id);
        if let Some((running, flag)) = lock(&self.cancel).as_ref()
            && *running == id
        {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// Interrupts the running job and tells the runner to end.
    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        if let Some((_, flag)) = lock(&self.cancel).as_ref() {
            flag.store(true, Ordering::Relaxed);
        }
        self.wake();
    }

    /// Tells a waiting runner to look at the queue now.
    pub(super) fn wake(&self) {
        let (flag, cv) = &self.wake;
        *lock(flag) = true;
        cv.notify_all();
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Waits for [`Control::wake`], or a second at most.
    fn wait(&self) {
        let (flag, cv) = &self.wake;
        let mut woken = lock(flag);
        if !*woken {
            woken = cv.wait_timeout(woken, Duration::from_secs(1)).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
        *woken = false;
    }

    /// Job `id`'s trainer is ready and stops when `flag` is set.
    fn running(&self, id: i64, flag: Arc<AtomicBool>) {
        // A cancel or a shutdown that arrived while the job was being prepared still counts.
        if self.stopping() || lock(&self.requested).contains(&id) {
            flag.store(true, Ordering::Relaxed);
        }
        *lock(&self.cancel) = Some((id, flag));
    }

    /// Job `id` ended: nothing runs.
    fn finished(&self, id: i64) {
        *lock(&self.cancel) = None;
        lock(&self.requested).remove(&id);
        *lock(&self.live) = None;
    }

    fn set_live(&self, live: Live) {
        *lock(&self.live) = Some(live);
    }

    fn update_live(&self, f: impl FnOnce(&mut Live)) {
        if let Some(live) = lock(&self.live).as_mut() {
            f(live);
        }
    }
}

/// The runner thread's work: queued jobs one at a time, until the daemon stops.
pub(super) struct Runner {
    inner: Arc<Inner>,
    toolbox: Toolbox,
    inputs: Arc<JobInputs>,
    publisher: Publisher,
}

impl Runner {
    /// A runner of `inner`'s queue whose jobs call tools through `toolbox`, read what `inputs`
    /// allows and publish through `publisher`.
    pub(super) fn new(inner: Arc<Inner>, toolbox: Toolbox, inputs: Arc<JobInputs>, publisher: Publisher) -> Runner {
        Runner { inner, toolbox, inputs, publisher }
    }

    fn control(&self) -> &Control {
        &self.inner.control
    }

    /// Runs queued jobs until [`Control::stop`].
    pub(super) fn run_loop(&self) {
        while !self.control().stopping() {
            match self.inner.store.claim_next() {
                Ok(Some(job)) => self.run_job(job),
                Ok(None) => self.control().wait(),
                Err(e) => {
                    tracing::error!("the job runner cannot read the queue: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }

    fn run_job(&self, job: Job) {
        let id = job.id;
        tracing::info!(id, kind = %job.kind, run = job.runs, dir = %job.dir.display(), "job started");
        self.control().set_live(Live { id, kind: Some(job.kind), phase: "preparing".into(), ..Live::default() });
        let result = self.train(&job);
        self.control().finished(id);
        self.record_end(id, result);
    }

    /// Stores how job `id` ended; a finished job's final policy is served first.
    fn record_end(&self, id: i64, result: Result<PathBuf, TrainError>) {
        let store = &self.inner.store;
        let running = [JobState::Running];
        let outcome = match result {
            Ok(final_dir) => {
                self.swap(id, &final_dir);
                store.transition(id, &running, JobState::Succeeded, None)
            }
            Err(TrainError::Cancelled) if self.control().stopping() => {
                tracing::info!(id, "job interrupted by shutdown; it resumes at the next start");
                store.transition(id, &running, JobState::Queued, None)
            }
            Err(TrainError::Cancelled) => store.transition(id, &running, JobState::Cancelled, None),
            Err(e) => {
                tracing::error!(id, "job failed: {e}");
                store.transition(id, &running, JobState::Failed, Some(&e.to_string()))
            }
        };
        match outcome {
            Ok(_) => tracing::info!(id, state = ?store.get(id).map(|j| j.state).ok(), "job ended"),
            Err(e) => tracing::error!(id, "cannot record how the job ended: {e}"),
        }
    }

    fn train(&self, job: &Job) -> Result<PathBuf, TrainError> {
        let toolbox = self.toolbox.clone();
        let tools_for = move |corpus: Arc<Corpus>| -> Arc<dyn Executor> {
            Arc::new(LocalTools::new().with_corpus(corpus).with_toolbox(toolbox.clone(), Limits::default()))
        };
        // A run with a checkpoint continues from it (after a cancel, a failure or a crash); one
        // without starts fresh.
        let resume = toolsmith_train::checkpoint::RunDir::create(&job.dir)?.has_checkpoint();
        // Files checked at submission may have been replaced while the job waited.
        self.inputs.recheck(&job.config).map_err(|e| TrainError::Config(e.to_string()))?;
        match job.kind {
            JobKind::Sft => {
                let config: SftConfig =
                    serde_json::from_value(job.config.clone()).map_err(|e| TrainError::Config(e.to_string()))?;
                let mut trainer = sft::prepare(config, &job.dir, resume, &tools_for)?;
                self.control().running(job.id, trainer.cancel_flag());
                trainer.run(&mut |event| self.on_event(job.id, event, false))
            }
            JobKind::Rl => {
                let config: RlConfig =
                    serde_json::from_value(job.config.clone()).map_err(|e| TrainError::Config(e.to_string()))?;
                let graph = config.graph.is_some();
                let mut trainer = RlTrainer::prepare(config, &job.dir, resume, &tools_for)?;
                self.control().running(job.id, trainer.cancel_flag());
                trainer.run(&mut |event| self.on_event(job.id, event, graph))
            }
        }
    }

    /// What a running job's events do: progress in the store and in `/status`, and at each
    /// checkpoint the served policy swapped (and, with `graph`, its admitted tools registered).
    fn on_event(&self, id: i64, event: Event<'_>, graph: bool) {
        match event {
            Event::Data { .. } => {}
            Event::Started { step, total } => self.started(id, step, total),
            Event::Step(record) => self.stepped(id, record.step(), record.figures()),
            Event::EvalStarted { .. } => self.phase("evaluating"),
            Event::Eval(_) => self.phase("training"),
            Event::Checkpoint { step, dir } => self.checkpoint(id, step, dir, graph),
        }
    }

    fn phase(&self, phase: &str) {
        self.control().update_live(|live| live.phase = phase.into());
    }

    fn started(&self, id: i64, step: u64, total: u64) {
        self.control().update_live(|live| (live.step, live.total, live.phase) = (step, total, "training".into()));
        if let Err(e) = self.inner.store.progress(id, step, Some(total), None) {
            tracing::warn!(id, "cannot record progress: {e}");
        }
    }

    fn stepped(&self, id: i64, step: u64, figures: Option<Value>) {
        self.control().update_live(|live| (live.step, live.last) = (step, figures));
        if let Err(e) = self.inner.store.progress(id, step, None, None) {
            tracing::warn!(id, "cannot record progress: {e}");
        }
    }

    fn checkpoint(&self, id: i64, step: u64, dir: &Path, graph: bool) {
        if let Err(e) = self.inner.store.progress(id, step, None, Some(dir)) {
            tracing::warn!(id, "cannot record the checkpoint: {e}");
        }
        self.control().update_live(|live| live.checkpoint_step = Some(step));
        if graph {
            match self.publisher.publish_tools(dir) {
                Ok(0) => {}
                Ok(n) => tracing::info!(id, step, tools = n, "tools admitted by training registered"),
                Err(e) => tracing::warn!(id, "cannot register the tools training admitted: {e}"),
            }
        }
        self.swap(id, dir);
    }

    /// Serves the weights in `dir` (the trainer is paused meanwhile, so the checkpoint cannot be
    /// pruned under the load) and shows the served step in `/status`.
    fn swap(&self, id: i64, dir: &Path) {
        if let Some(step) = self.publisher.swap(id, dir) {
            self.control().update_live(|live| live.served_step = Some(step));
        }
    }
}
