//! The settings of an RL run: one serde type read from TOML or JSON (flags override it), whose
//! JSON Schema is `schemas/train-rl.schema.json`. Each method starts from its paper's settings
//! ([`RlConfig::for_method`]); where a paper leaves a number out, the default says what was
//! chosen and why.

use std::path::Path;

use serde::{Deserialize, Serialize};
use toolsmith_agent::env::Family;
use toolsmith_agent::{Mode, ToolFormat};

use crate::TrainError;
use crate::optim::AdamWConfig;
use crate::rl::advantage::GroupNorm;
use crate::rl::loss::LossConfig;
pub use crate::rl::method::Method;
use crate::rl::reward::RewardConfig;
use crate::rl::training_graph::GraphConfig;
use crate::settings::{EvalConfig, WorldsData, check_lr};
use crate::settings::{Init, RunConfig, RunSettings};

/// Step credit (SEARL's tool-anchored, GiGPO's state-anchored step advantage).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StepCredit {
    /// Weight of the step advantage in `A = A_E + lambda * A_S`. By default 1 (the paper gives
    /// none; GiGPO, which SEARL's step advantage follows, uses 1). For MemPO, the weight of the
    /// memory advantage on `<mem>` tokens (the paper sums the two: 1; 0 is its ablation, GRPO
    /// with memory).
    pub lambda: f64,
    /// Discount of the return-to-go. By default 0.5 (the SEARL authors' released code; the
    /// paper gives none); GiGPO's is 0.95.
    pub gamma: f64,
    /// An anchor (a tool, a state) of a single step of the group gets no step advantage. By
    /// default on.
    pub single_vanishing: bool,
}

impl Default for StepCredit {
    fn default() -> Self {
        StepCredit { lambda: 1.0, gamma: 0.5, single_vanishing: true }
    }
}

/// An external inference engine that samples the rollouts (vLLM, SGLang, or another
/// `toolsmith serve --policy`), token in and token out through its `/v1/completions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Its OpenAI-compatible base URL, e.g. `http://127.0.0.1:8000/v1`.
    pub url: String,
    /// The model name it serves. By default `policy`.
    pub model: String,
    /// The environment variable holding its API key, if it wants one. By default none.
    pub api_key_env: Option<String>,
    /// Push the weights before the first rollouts and after every update: the policy is saved to
    /// `RUN/engine-weights` and the engine told to load it (`POST /update_weights_from_disk`, as
    /// SGLang and `toolsmith serve --policy` answer). The engine must see the run directory. By
    /// default true; without it rollouts are off-policy by however far the engine's weights are.
    pub push_weights: bool,
    /// Which log-probs the update takes as the old policy's. An engine's log-probs differ from the
    /// trainer's (other kernels, other precision, weights a step behind), and the clipped ratio
    /// then measures that gap, not the update. By default `recompute`.
    pub old_logprobs: OldLogprobs,
    /// TIS's cap on the importance weight `p_trainer / p_engine` (with `old_logprobs = "tis"`).
    /// By default 2.
    pub tis_cap: f64,
}

/// Whose log-probs the update compares against when rollouts come from an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OldLogprobs {
    /// The trainer's policy rescores the episodes (one forward pass without gradients) and its
    /// log-probs are the old ones, as verl recomputes them.
    Recompute,
    /// As `recompute`, and the policy-gradient term is also weighted per token by the truncated
    /// importance weight `min(p_trainer / p_engine, tis_cap)` (truncated importance sampling),
    /// which corrects for the engine having sampled from a slightly different distribution.
    Tis,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            url: String::new(),
            model: "policy".into(),
            api_key_env: None,
            push_weights: true,
            old_logprobs: OldLogprobs::Recompute,
            tis_cap: 2.0,
        }
    }
}

/// The ToolActor that answers simulated tools during MTR's rollouts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SimulatorConfig {
    /// Tokens per observation at most. By default 128.
    pub max_tokens: usize,
    /// Sampling temperature of observations. By default 0.7 (varied but mostly coherent).
    pub temperature: f64,
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig { max_tokens: 128, temperature: 0.7 }
    }
}

/// An RL run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RlConfig {
    /// The method. By default `gap`.
    pub method: Method,
    /// Training worlds: the tasks rollouts are drawn from (their traces are not used). By default
    /// the SFT preset's split (seeds 1-24, 4 countries, 2 tasks per family).
    pub worlds: WorldsData,
    /// Families whose tasks rollouts draw (empty: all). A curriculum: a small policy learns from
    /// groups whose episodes differ, and a family it never solves gives none. Held-out evaluation
    /// still asks every family. By default empty.
    pub families: Vec<Family>,
    /// Held-out evaluation on a world of another seed; `null` disables it.
    pub eval: Option<EvalConfig>,
    /// Iterations (rollouts of a batch of tasks, then updates). By default 20.
    pub iterations: u64,
    /// Tasks per iteration. By default 8.
    pub tasks_per_iteration: usize,
    /// Episodes per task (the group). By default 8.
    pub group_size: usize,
    /// Turns per episode at most. By default 6.
    pub max_turns: usize,
    /// Tokens per turn at most. By default 160.
    pub max_tokens: usize,
    /// Sampling temperature. By default 1.0. Behaviour log-probs are those of the tempered
    /// distribution and the update rescores at the same temperature, so the importance ratio, the
    /// KL and the entropy all read the distribution the tokens were drawn from (top-p, top-k and
    /// the repetition penalty shape single draws and are left out, as TRL and verl do).
    pub temperature: f64,
    /// Nucleus mass. By default 1.0.
    pub top_p: f64,
    /// Top-k (0: off). By default 0.
    pub top_k: usize,
    /// Sampling repetition penalty. By default 1.0 (SEARL: 1.05).
    pub repetition_penalty: f64,
    /// Peak learning rate. By default 1e-4 for the tiny model (the papers' 1e-6 is for billions
    /// of parameters).
    pub lr: f64,
    /// Linear warm-up as a share of all updates. By default 0.
    pub warmup_ratio: f64,
    /// Final learning rate as a share of the peak. By default 1 (constant, as the papers).
    pub min_lr_ratio: f64,
    /// AdamW's settings.
    pub optimizer: AdamWConfig,
    /// Optimisation epochs over each iteration's batch (the first is on-policy). By default 1.
    pub epochs: usize,
    /// Optimiser steps per epoch (PPO's mini-batches): the iteration's episodes are dealt into
    /// this many mini-batches, each with its own token-mean loss and step, so that one batch of
    /// rollouts buys more steps at the same compute. The first step is on-policy; the later ones
    /// see episodes of a slightly older policy, which the clip bounds. By default 1.
    pub mini_batches: usize,
    /// Padded tokens per forward/backward pass: gradients of micro-batches accumulate, so this
    /// bounds the activations kept for the backward pass, not the batch. By default 2048: an
    /// iteration of SmolLM2-135M with LoRA peaked at 15.7 GB with 8192 and at 5.3 GB with 2048,
    /// which was no slower.
    pub micro_batch_tokens: usize,
    /// The clipped surrogate, KL and aggregation.
    pub loss: LossConfig,
    /// How a group's rewards become advantages. By default mean and sample std (GRPO); SEARL's
    /// defaults take the population std, as its equations do.
    pub group_norm: GroupNorm,
    /// DAPO's dynamic sampling: groups whose episodes are all right or all wrong (equal
    /// outcomes, whatever the shaping) are dropped and more tasks drawn, up to `max_refills`
    /// times. By default off.
    pub dynamic_sampling: bool,
    /// Extra draws of tasks per iteration for dynamic sampling. By default 2.
    pub max_refills: usize,
    /// Dynamic sampling's first draw takes this many tasks beyond `tasks_per_iteration` (verl's
    /// `gen_batch_size` for DAPO): their groups decode in the same batches, whose steps cost
    /// little more for a few more rows, and often spare a refill round, which costs as much as
    /// the first. At most `tasks_per_iteration` groups are kept, in the order drawn; the surplus
    /// counts as dropped. By default 0.
    #[serde(skip_serializing_if = "crate::config::is_zero")]
    pub oversample: usize,
    /// DAPO's overlong handling: the last `overlong_cache` tokens of a turn's budget ramp a
    /// penalty to -1, and a turn cut off by the budget is masked out of the loss (its tokens count
    /// in neither the loss, its token-mean denominator nor the KL). 0 disables it. By default 0.
    pub overlong_cache: usize,
    /// Sizes of the reward terms.
    pub rewards: RewardConfig,
    /// Step credit (SEARL, GiGPO).
    pub step_credit: StepCredit,
    /// The tool graph growing during training: episodes retrieve from the run's registry and
    /// the best rollouts' tools are admitted to it; `null` lists every tool of the world instead.
    /// By default on for SEARL, off otherwise.
    pub graph: Option<GraphConfig>,
    /// MTR's simulated tools: rollouts call interfaces answered by the frozen starting policy
    /// (the ToolActor, decoding under each tool's output schema) instead of the world's tools;
    /// held-out evaluation still uses the real ones. `null`: real tools. By default on for MTR.
    pub simulate: Option<SimulatorConfig>,
    /// Sample rollouts on an external engine instead of in this process. By default none.
    pub engine: Option<EngineConfig>,
    /// Tool-call tasks (JSON lines that `toolsmith train tools` writes) instead of the worlds'
    /// tasks: the `toolcall` method trains on these and only these. By default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_tasks: Option<std::path::PathBuf>,
    /// A checkpoint every this many iterations (and at the end). By default 5.
    pub checkpoint_every: u64,
    /// What every run sets: the starting policy (a checkpoint directory, an SFT run's `final`, or
    /// `tiny`, only sensible for tests: an untrained model never answers), seed, device and
    /// precision, which weights train.
    #[serde(flatten)]
    pub run: RunSettings,
}

impl RunConfig for RlConfig {
    const KIND: &'static str = "rl";
    // A resume may change how long the run is (the learning-rate schedule is then planned over
    // the new length), where its engine runs (its address, not how its log-probs are used), and
    // what any run may change (`run::RESUMABLE_IN_ANY_RUN`); every other field defines the run,
    // and a resume that changes one is refused.
    const RESUMABLE: &'static [&'static str] = &["iterations", "engine.url", "engine.model", "engine.api_key_env"];

    fn run(&self) -> &RunSettings {
        &self.run
    }

    fn run_mut(&mut self) -> &mut RunSettings {
        &mut self.run
    }

    fn lr_mut(&mut self) -> &mut f64 {
        &mut self.lr
    }

    fn checkpoint_every_mut(&mut self) -> &mut u64 {
        &mut self.checkpoint_every
    }

    fn eval_mut(&mut self) -> &mut Option<EvalConfig> {
        &mut self.eval
    }

    /// A `smol-` preset starts from a SmolLM2-135M checkpoint that already answers in the
    /// agent's format.
    fn check_preset(&self, name: &str) -> Result<(), TrainError> {
        if !name.starts_with("smol-") {
            return Ok(());
        }
        if let Init::Tiny | Init::Unset | Init::Named(_) = &self.run.init {
            let what = match &self.run.init {
                Init::Unset => "no --init".to_string(),
                init => format!("--init {init}"),
            };
            return Err(TrainError::Config(format!(
                "the {name} preset starts from the smol-world SFT preset's checkpoint, and got {what}: RL needs a \
                 policy that already answers in the agent's format (toolsmith train sft --preset smol-world --out \
                 SFT, then --init SFT/final)"
            )));
        }
        crate::config::check_smol_init(name, &self.run.init)
    }
}

impl Default for RlConfig {
    fn default() -> Self {
        RlConfig::for_method(Method::GAP)
    }
}

impl RlConfig {
    /// The settings of `method`, from its paper where it gives them.
    pub fn for_method(method: Method) -> Self {
        let base = RlConfig {
            method,
            worlds: WorldsData {
                seeds: (1..=24).collect(),
                countries: 4,
                tasks_per_family: 2,
                styles: vec![method.mode()],
                ..WorldsData::default()
            },
            families: Vec::new(),
            eval: Some(EvalConfig { modes: vec![method.mode()], ..EvalConfig::default() }),
            iterations: 20,
            tasks_per_iteration: 8,
            group_size: 8,
            max_turns: 6,
            max_tokens: 160,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            repetition_penalty: 1.0,
            lr: 1e-4,
            warmup_ratio: 0.0,
            min_lr_ratio: 1.0,
            optimizer: AdamWConfig { weight_decay: 0.0, ..AdamWConfig::default() },
            epochs: 1,
            mini_batches: 1,
            micro_batch_tokens: 2048,
            loss: LossConfig::default(),
            group_norm: GroupNorm::MeanStd,
            dynamic_sampling: false,
            max_refills: 2,
            oversample: 0,
            overlong_cache: 0,
            rewards: RewardConfig::default(),
            step_credit: StepCredit::default(),
            graph: None,
            simulate: None,
            engine: None,
            call_tasks: None,
            checkpoint_every: 5,
            run: RunSettings::default(),
        };
        (method.spec().defaults)(base)
    }

    /// A named preset, for `method` where the name does not say it (`--method`).
    ///
    /// `tiny-world`: the tiny policy from `init`, the SFT preset's worlds.
    ///
    /// `smol-<method>` (`smol-gap`, `smol-searl`, `smol-mem`, `smol-mtr`): SmolLM2-135M from the
    /// `smol-world` SFT preset's checkpoint (`init`), its top 8 layers trained in bf16 on the SFT
    /// preset's 16 training worlds (the families the method's effect shows on), 10 iterations of
    /// 4 tasks x 8 episodes (5 turns of 128 tokens), evaluated before and after on 10 questions
    /// per family of the held-out world in the method's mode, as the SFT preset evaluates;
    /// `smol-gap` takes 11.5-15.5 minutes on 2 cores of a Zen 5 (bf16), 21-23 on CPUs without
    /// AVX512_BF16; on an Intel Xeon with AVX512_BF16 but no AMX (f32 training) an iteration
    /// takes 164 s.
    pub fn preset(name: &str, method: Option<Method>) -> Result<Self, TrainError> {
        if name == "tiny-world" {
            let method = method.unwrap_or(Method::GAP);
            let base = RlConfig::for_method(method);
            let run = RunSettings { threads: 2, tool_format: ToolFormat::Brief, ..base.run.clone() };
            return Ok(RlConfig { run, ..base });
        }
        let Some(named) = name.strip_prefix("smol-").and_then(Method::parse) else {
            return Err(TrainError::Config(format!(
                "unknown preset {name:?} (tiny-world, or smol-<method> with <method> one of {})",
                Method::choices()
            )));
        };
        if named == Method::TOOLCALL {
            return Err(TrainError::Config(
                "smol-toolcall: the toolcall method trains on tool-call tasks; its preset is `toolsmith train tools \
                 --preset smol-tools`"
                    .into(),
            ));
        }
        if let Some(given) = method
            && given != named
        {
            return Err(TrainError::Config(format!(
                "the {name} preset is for {}, not {}: leave --method out or pick smol-{}",
                named.name(),
                given.name(),
                given.name()
            )));
        }
        let base = RlConfig::for_method(named);
        // The families whose groups differ: the SFT checkpoint answers single-hop questions half
        // the time and multi-hop ones sometimes, but almost never eight-objective or arithmetic
        // ones at temperature 1, whose groups are dropped (all wrong) and cost a round of
        // rollouts each. Each method keeps the family its paper's effect shows on.
        let families = match named.mode() {
            Mode::Searl => vec![Family::SingleHop, Family::MultiHopParallel, Family::Numeric],
            Mode::Mem => vec![Family::SingleHop, Family::MultiObjective],
            _ => vec![Family::SingleHop, Family::MultiHopSequential, Family::MultiHopParallel],
        };
        Ok(RlConfig {
            families,
            worlds: WorldsData { styles: base.worlds.styles.clone(), ..WorldsData::smol() },
            eval: Some(EvalConfig {
                modes: base.eval.as_ref().map_or_else(|| vec![named.mode()], |e| e.modes.clone()),
                ..EvalConfig::smol()
            }),
            // An iteration takes a median 53-72 s on 2 cores with AVX512_BF16 (2-2.7 minutes on
            // others), about half of it decoding 32-40 episodes, and an
            // evaluation 1-2 at 128-token turns: ten ran in 20-29 minutes (BENCHMARKS.md). The
            // evaluations' 256-token turns cost an SFT checkpoint about 1.5x that (not yet timed
            // in this preset). Six at lr 2e-5 moved held-out EM by 0.03 and format errors hardly
            // at all.
            iterations: 10,
            tasks_per_iteration: 4,
            group_size: 8,
            // A plan takes about 100 tokens: 96 cut most of them (reward -0.9 from the overlong
            // penalty, EM 0.02 over the first 64 episodes). The oracle's plans for three or four
            // parallel lookups take 180-260 tokens, so 128 still cuts about half of those
            // (the trainer warns); a longer budget lengthens every turn's decoding, which the
            // 30-minute budget does not leave room for.
            max_turns: 5,
            max_tokens: 128,
            // Each batch is used twice (the second pass clipped), and the step is larger than
            // the papers' 1e-6, which is for billions of parameters: at 5e-5 about 0.5% of the
            // second pass's tokens clip.
            epochs: 2,
            lr: 5e-5,
            // Dynamic sampling's refills cost a whole round of rollouts each.
            max_refills: 1,
            overlong_cache: base.overlong_cache.min(32),
            micro_batch_tokens: 4096,
            checkpoint_every: 2,
            run: RunSettings {
                // Set by --init: the preset starts from a checkpoint, never from a name.
                init: Init::Unset,
                // The top 8 layers: 2.4x the speed of a full update and a third of its memory
                // (BENCHMARKS.md), and the lower layers' keys and values stay valid across
                // updates.
                trainable_layers: Some(8),
                threads: 2,
                tool_format: ToolFormat::Brief,
                ..base.run.clone()
            },
            ..base
        })
    }

    /// The same settings with a turn budget of `max_tokens`: DAPO's overlong window, when on,
    /// keeps its share of the budget (GAP's quarter of 160 is 40; of 512, 128), so a longer
    /// budget is not shaped over a sliver of it and a shorter one is not refused for a window
    /// wider than itself.
    pub fn with_max_tokens(self, max_tokens: usize) -> Self {
        let overlong_cache = match self.max_tokens {
            0 => self.overlong_cache,
            old => (self.overlong_cache as f64 * max_tokens as f64 / old as f64).round() as usize,
        };
        RlConfig { max_tokens, overlong_cache: overlong_cache.min(max_tokens), ..self }
    }

    /// Reads a TOML (`.toml`) or JSON file over `method`'s defaults. Unknown keys are errors.
    pub fn from_file(path: &Path) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
        let is_toml = path.extension().is_some_and(|e| e == "toml");
        let value: serde_json::Value = if is_toml {
            toml::from_str(&text).map_err(|e| TrainError::Config(format!("{}: {e}", path.display())))?
        } else {
            serde_json::from_str(&text).map_err(|e| TrainError::Config(format!("{}: {e}", path.display())))?
        };
        // The method's defaults first, then the file's keys over them.
        let method = match value.get("method") {
            Some(m) => serde_json::from_value(m.clone())
                .map_err(|e| TrainError::Config(format!("{}: method: {e}", path.display())))?,
            None => Method::GAP,
        };
        // A file that sets the turn budget but not the overlong window gets the method's window
        // at its share of that budget (GAP's quarter), not of the default budget.
        let mut defaults = RlConfig::for_method(method);
        if let Some(max_tokens) = value.get("max_tokens").and_then(serde_json::Value::as_u64) {
            defaults = defaults.with_max_tokens(usize::try_from(max_tokens).unwrap_or(usize::MAX));
        }
        let mut merged = serde_json::to_value(defaults).map_err(|e| TrainError::Config(e.to_string()))?;
        merge(&mut merged, value);
        let config: RlConfig =
            serde_json::from_value(merged).map_err(|e| TrainError::Config(format!("{}: {e}", path.display())))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks values a run cannot start with.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |m: String| Err(TrainError::Config(m));
        check_lr(self.lr)?;
        self.run.validate()?;
        if self.iterations == 0 || self.tasks_per_iteration == 0 || self.epochs == 0 || self.mini_batches == 0 {
            return bad("iterations, tasks_per_iteration, epochs and mini_batches must be positive".into());
        }
        if self.group_size < 2 {
            return bad(format!("group_size must be at least 2 to compare episodes, got {}", self.group_size));
        }
        if let Some(e) = &self.engine
            && !(e.url.starts_with("http://") || e.url.starts_with("https://"))
        {
            return bad(format!("engine.url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {:?}", e.url));
        }
        if let Some(e) = &self.engine
            && !(e.tis_cap >= 1.0 && e.tis_cap.is_finite())
        {
            return bad(format!("engine.tis_cap must be a number >= 1, got {}", e.tis_cap));
        }
        let toolcall = self.method == crate::rl::Method::TOOLCALL;
        if toolcall != self.call_tasks.is_some() {
            return bad(if toolcall {
                "method toolcall trains on tool-call tasks (call_tasks): run it through `toolsmith train tools`".into()
            } else {
                format!(
                    "call_tasks are tool-call tasks, which only method toolcall trains on (method is {})",
                    self.method
                )
            });
        }
        if self.max_turns == 0 || self.max_tokens == 0 || self.micro_batch_tokens == 0 {
            return bad("max_turns, max_tokens and micro_batch_tokens must be positive".into());
        }
        if self.oversample > 0 && !self.dynamic_sampling {
            return bad(format!(
                "oversample ({}) draws extra tasks for dynamic sampling, which is off: set dynamic_sampling = true or \
                 leave oversample out",
                self.oversample
            ));
        }
        if self.overlong_cache > self.max_tokens {
            return bad("overlong_cache cannot exceed max_tokens".into());
        }
        if self.checkpoint_every == 0 {
            return bad("checkpoint_every must be positive".into());
        }
        if self.worlds.seeds.is_empty() {
            return bad("no training worlds: worlds.seeds is empty".into());
        }
        if let Some(f) = self.families.iter().find(|f| !Family::GENERATED.contains(f)) {
            return bad(format!("families: the generated worlds have no {} tasks", f.name()));
        }
        if let Some(eval) = &self.eval
            && self.worlds.seeds.contains(&eval.world_seed)
        {
            return bad("the held-out world's seed is also a training world: evaluation would measure memory".into());
        }
        self.loss.validate().map_err(TrainError::Config)
    }
}

/// Object keys of `patch` replace (recursively) those of `base`.
fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(&k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, p) => *b = p,
    }
}

/// The JSON Schema of [`RlConfig`] (`schemas/train-rl.schema.json`).
pub fn schema() -> serde_json::Value {
    crate::config::schema_of::<RlConfig>()
}
