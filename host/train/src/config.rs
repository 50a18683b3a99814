//! The settings of a supervised run: one serde type read from TOML or JSON (flags override it),
//! whose JSON Schema is `schemas/train-sft.schema.json` (generated; a golden test keeps it in
//! step).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toolsmith_agent::env::{Family, WorldConfig};
use toolsmith_agent::{Mode, ToolFormat};

use crate::TrainError;
use crate::optim::AdamWConfig;

/// A supervised fine-tuning run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    /// What to train on. By default the traces of generated worlds ([`WorldsData::default`]).
    pub data: DataConfig,
    /// The model to start from: `tiny` (a fresh tiny model), `smollm2-135m` (fetched by setup) or
    /// a checkpoint directory. By default
    /// `tiny`.
    pub init: String,
    /// The tiny model's context length (`max_position_embeddings`) when `init` is `tiny`. By
    /// default 3072: the longest oracle trace of the default worlds, tools listed compactly, is
    /// about 2,550 tokens, and held-out episodes need room to run longer than the oracle's.
    pub tiny_context: u64,
    /// Passes over the data (used when `steps` is not set). By default 1.
    pub epochs: f64,
    /// Optimiser steps in all; overrides `epochs`.
    pub steps: Option<u64>,
    /// Peak learning rate. By default 1e-3 (right for the tiny model; use ~1e-5 for billions of
    /// parameters).
    pub lr: f64,
    /// Final learning rate as a share of the peak (cosine decay). By default 0.1.
    pub min_lr_ratio: f64,
    /// Linear warm-up, as a share of all steps. By default 0.05.
    pub warmup_ratio: f64,
    /// AdamW's moments, epsilon and weight decay.
    pub optimizer: AdamWConfig,
    /// Global gradient-norm clipping (0 disables it). By default 1.0.
    pub max_grad_norm: f64,
    /// Loss weight of each conversation's first assistant turn relative to the other assistant
    /// tokens. The first turn is where the question is read (its type, the names to search for);
    /// it is a small share of the tokens, and a small model trained for minutes learns the rest
    /// of the trace first. By default 1 (the plain token mean).
    pub first_turn_weight: f64,
    /// Tokens per optimiser step: whole sequences are added until the next would pass this. By
    /// default 16384.
    pub batch_tokens: usize,
    /// Padded tokens per forward/backward pass; gradients of micro-batches accumulate, so this
    /// bounds memory, not the batch. By default 4096.
    pub micro_batch_tokens: usize,
    /// Seed of the initial weights (for `tiny`) and of the data order. By default 0.
    pub seed: u64,
    /// `auto` (CUDA when present), `cpu`, `cuda` or `cuda:N`. By default `auto`.
    pub device: String,
    /// Weights' precision: `auto` (bf16 with fp32 master weights on CUDA and on CPUs that train
    /// faster in it: with AMX, or AMD ones with AVX512_BF16; fp32 elsewhere), `f32` or `bf16`.
    /// By default `auto`.
    pub precision: String,
    /// CPU threads for libtorch (0: libtorch's default). By default 0.
    pub threads: usize,
    /// How prompts list tools, in the synthesised traces and in held-out evaluation (they must
    /// agree): `compact`, `json` or `brief`. By default `compact`.
    pub tool_format: ToolFormat,
    /// Held-out evaluation every this many steps (0: only before and after training). By default 0.
    pub eval_every: u64,
    /// Held-out evaluation; `null` disables it. By default a generated world of another seed.
    pub eval: Option<EvalConfig>,
    /// A checkpoint every this many steps (and one at the end). By default 100.
    pub checkpoint_every: u64,
    /// Checkpoints kept (the newest ones). By default 2.
    pub keep_checkpoints: usize,
    /// Train only the top N decoder layers (and the final norm); the embeddings, the (tied) head
    /// and the layers below stay frozen, so each step computes gradients and keeps optimiser state
    /// for those layers alone. With `lora`, only those layers get adapters. `null` trains every
    /// weight. By default `null`.
    pub trainable_layers: Option<usize>,
    /// Train LoRA adapters instead of the weights (the base stays frozen; with a KL penalty the
    /// base alone is the reference; the final policy has them merged, and `final/adapter` holds
    /// them as PEFT saves them); on the top `trainable_layers` layers only when that is set. `null`:
    /// no adapters. By default `null`.
    pub lora: Option<toolsmith_policy::LoraConfig>,
    /// Gradient checkpointing: the forward pass keeps only each trained layer's input and the
    /// backward pass recomputes the layers one at a time, so a micro-batch holds one layer's
    /// activations instead of every layer's, for one more forward pass of the trained layers
    /// (the same gradients). Not with LoRA dropout. By default false.
    pub gradient_checkpointing: bool,
}

// A resume may change how long the run is (`steps`, `epochs`; the learning-rate schedule is then
// planned over the new length), and what any run may change (`run::RESUMABLE_IN_ANY_RUN`); every
// other field defines the run, and a resume that changes one is refused.
crate::run::run_config!(SftConfig, "sft", &["steps", "epochs"]);

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            data: DataConfig::default(),
            init: "tiny".into(),
            tiny_context: 3072,
            epochs: 1.0,
            steps: None,
            lr: 1e-3,
            min_lr_ratio: 0.1,
            warmup_ratio: 0.05,
            optimizer: AdamWConfig::default(),
            max_grad_norm: 1.0,
            first_turn_weight: 1.0,
            batch_tokens: 16384,
            micro_batch_tokens: 4096,
            seed: 0,
            device: "auto".into(),
            precision: "auto".into(),
            threads: 0,
            tool_format: ToolFormat::Compact,
            eval_every: 0,
            eval: Some(EvalConfig::default()),
            checkpoint_every: 100,
            keep_checkpoints: 2,
            trainable_layers: None,
            lora: None,
            gradient_checkpointing: false,
        }
    }
}

/// The training data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// JSON-lines chat files (`toolsmith world traces` output or OpenAI-style `messages`). When
    /// given, `worlds` is not used.
    pub files: Vec<PathBuf>,
    /// Oracle traces of generated worlds, used when `files` is empty.
    pub worlds: WorldsData,
    /// The share (0 to 1) of each world's tasks whose SEARL-style trace is written with the
    /// tools an agent writes for them already listed, as a tool graph lists them once it has
    /// admitted them: the oracle calls `sum_integers` instead of writing it again, so the policy
    /// learns to reuse what it wrote. 0 by default: every SEARL trace writes its tool.
    #[serde(skip_serializing_if = "is_zero")]
    pub reuse: f64,
}

/// For `skip_serializing_if`: a field left at zero stays out of a config's file (and its hash).
pub(crate) fn is_zero<T: Default + PartialEq>(x: &T) -> bool {
    *x == T::default()
}

/// Oracle traces of worlds generated from several seeds: the training split. The held-out world
/// ([`EvalConfig::world_seed`]) must not be among them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct WorldsData {
    /// World seeds. By default 1, 2, 3 and 4.
    pub seeds: Vec<u64>,
    /// Countries per world. By default 6 (72 entities).
    pub countries: usize,
    /// Tasks per family. By default 12.
    pub tasks_per_family: usize,
    /// Trace styles. By default all four: react, gap, mem, searl.
    pub styles: Vec<Mode>,
    /// Tasks per world of the families named here instead of `tasks_per_family` (which gives
    /// multi-objective nine tasks for every three): a mixture weighted towards a family the
    /// default leaves rare, e.g. `{"numeric": 6}`. Empty by default.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub family_tasks: BTreeMap<Family, usize>,
}

impl Default for WorldsData {
    fn default() -> Self {
        WorldsData {
            seeds: vec![1, 2, 3, 4],
            countries: 6,
            tasks_per_family: 12,
            styles: Mode::ALL.to_vec(),
            family_tasks: BTreeMap::new(),
        }
    }
}

impl WorldsData {
    /// The `smol-` presets' training worlds: seeds 1-16, 4 countries, 2 tasks per family, every
    /// style. Many small worlds: every trace brings new names.
    pub fn smol() -> Self {
        WorldsData {
            seeds: (1..=16).collect(),
            countries: 4,
            tasks_per_family: 2,
            styles: Mode::ALL.to_vec(),
            family_tasks: BTreeMap::new(),
        }
    }

    /// The world of `seed`.
    pub fn world(&self, seed: u64) -> WorldConfig {
        WorldConfig { seed, countries: self.countries, tasks_per_family: self.tasks_per_family }
    }
}

/// Held-out evaluation with the real agent loop on a world of another seed: new names and new
/// facts, so a policy can only answer by searching and reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// The held-out world's seed. By default 1000.
    pub world_seed: u64,
    /// Its countries. By default 6.
    pub countries: usize,
    /// Tasks per family taken from it (the first ones). By default 3.
    pub tasks_per_family: usize,
    /// Modes evaluated. By default all four.
    pub modes: Vec<Mode>,
    /// Turn budget per task. By default 8.
    pub max_turns: usize,
    /// Tokens per turn at most. By default 160.
    pub max_tokens: usize,
    /// Episodes running at once: their turns decode together in batches and their tool calls
    /// overlap. By default 16.
    pub parallel: usize,
    /// Evaluate before the first step as well as after the last. By default true. A pretrained
    /// model that does not yet speak the agent's format runs every episode to its turn budget,
    /// which makes that pass the slowest of the run.
    pub before: bool,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            world_seed: 1000,
            countries: 6,
            tasks_per_family: 3,
            modes: Mode::ALL.to_vec(),
            max_turns: 8,
            max_tokens: 160,
            parallel: 16,
            before: true,
        }
    }
}

impl EvalConfig {
    /// The `smol-` presets' held-out evaluation: 10 questions per family, up to 6 turns of 256
    /// tokens, 40 episodes decoded at once. The oracle's own gap plans take 180-260 SmolLM2 tokens
    /// for three or four parallel lookups and up to 550 for ten objectives: 128 left 24 of the 50
    /// answerable in gap mode and 18 in searl mode, 256 leaves 41-44 and 37 (BENCHMARKS.md).
    pub fn smol() -> Self {
        EvalConfig { tasks_per_family: 10, max_turns: 6, max_tokens: 256, parallel: 40, ..EvalConfig::default() }
    }
}

impl SftConfig {
    /// Reads a TOML (`.toml`) or JSON file. Unknown keys are errors.
    pub fn from_file(path: &Path) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
        let is_toml = path.extension().is_some_and(|e| e == "toml");
        let config: SftConfig = if is_toml {
            toml::from_str(&text).map_err(|e| TrainError::Config(format!("{}: {e}", path.display())))?
        } else {
            serde_json::from_str(&text).map_err(|e| TrainError::Config(format!("{}: {e}", path.display())))?
        };
        config.validate()?;
        Ok(config)
    }

    /// A named preset.
    ///
    /// `tiny-world`: the tiny policy on oracle traces of 24 small training worlds (seeds 1-24)
    /// in every style, evaluated on the held-out world of seed 1000 in every mode; sized for 2
    /// CPU cores: about 9.5 minutes of training (540 steps of up to 4,096 tokens) and 3 of
    /// data synthesis and evaluation.
    ///
    /// `smol-world`: SmolLM2-135M-Instruct, fully fine-tuned on oracle traces of 16 small
    /// training worlds in every style (100 steps of up to 2,048 tokens), evaluated after
    /// training on 10 questions per family of the held-out world in every mode (40 episodes at
    /// once, turns of 256 tokens); on 2 cores of a Zen 5, 8.5-14 minutes of training in bf16 and
    /// about 24 in all; on an Intel Xeon with AVX512_BF16 but no AMX, 23.5 minutes of training in
    /// bf16, and training's `auto` picks f32 there, 1.3x faster; about 90 minutes in f32 on an
    /// older CPU. No evaluation before training (see `before`).
    pub fn preset(name: &str) -> Result<Self, TrainError> {
        match name {
            "tiny-world" => Ok(SftConfig {
                // Many small worlds rather than a few large ones: with four worlds the tiny model
                // memorised their ~300 names and wrote them into held-out queries instead of
                // copying the question's; with 24 it must read them.
                data: DataConfig {
                    files: Vec::new(),
                    worlds: WorldsData {
                        seeds: (1..=24).collect(),
                        countries: 4,
                        tasks_per_family: 2,
                        styles: Mode::ALL.to_vec(),
                        family_tasks: BTreeMap::new(),
                    },
                    reuse: 0.0,
                },
                // More, smaller steps: at 200 steps of 12,288 tokens the model learned the trace
                // format but not yet to attend to the question (same tokens, fewer updates).
                steps: Some(540),
                lr: 2e-3,
                // The system prompt was half of every sequence's tokens with the compact listing.
                // (`first_turn_weight` 5 was tried on seed 1 and changed neither EM nor how well
                // the first turn reads the question; see BENCHMARKS.md.)
                tool_format: ToolFormat::Brief,
                batch_tokens: 4096,
                micro_batch_tokens: 4096,
                threads: 2,
                checkpoint_every: 100,
                eval_every: 0,
                ..SftConfig::default()
            }),
            "smol-world" => Ok(SftConfig {
                init: "smollm2-135m".into(),
                // Many worlds, each small: every trace brings new names, so the model learns to
                // copy names from the question and the observations instead of remembering them.
                data: DataConfig { worlds: WorldsData::smol(), ..DataConfig::default() },
                // 100 steps of 2,048 tokens: about 11 minutes of full bf16 fine-tuning here.
                // 1e-4 took held-out single-hop EM from 0 to 0.44 in 40 such steps of ReAct traces.
                steps: Some(100),
                lr: 1e-4,
                tool_format: ToolFormat::Brief,
                batch_tokens: 2048,
                micro_batch_tokens: 2048,
                threads: 2,
                checkpoint_every: 25,
                eval_every: 0,
                eval: Some(EvalConfig {
                    // The base model never answers in the agent's format (held-out EM 0, every
                    // episode to its turn budget: BENCHMARKS.md), and that pass alone would
                    // take longer than the whole preset.
                    before: false,
                    ..EvalConfig::smol()
                }),
                ..SftConfig::default()
            }),
            other => Err(TrainError::Config(format!("unknown preset {other:?} (tiny-world, smol-world)"))),
        }
    }

    /// Checks that settings made from preset `name`, flags applied, still suit the model the
    /// preset was tuned for (its learning rate and budget are a 135M pretrained model's).
    pub fn check_preset(&self, name: &str) -> Result<(), TrainError> {
        if name.starts_with("smol-") {
            check_smol_init(name, &self.init)?;
        }
        Ok(())
    }

    /// Checks values a run cannot start with.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |m: &str| Err(TrainError::Config(m.to_string()));
        check_training(self.lr, self.trainable_layers, self.lora.as_ref(), self.gradient_checkpointing)?;
        if !(self.first_turn_weight.is_finite() && self.first_turn_weight > 0.0) {
            return bad("first_turn_weight must be a positive number");
        }
        if self.steps == Some(0)
            || (self.steps.is_none() && self.epochs.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater))
        {
            return bad("train for at least one step (steps > 0 or epochs > 0)");
        }
        if self.batch_tokens == 0 || self.micro_batch_tokens == 0 {
            return bad("batch_tokens and micro_batch_tokens must be positive");
        }
        if !(0.0..1.0).contains(&self.warmup_ratio) {
            return bad("warmup_ratio must be in [0, 1)");
        }
        if self.checkpoint_every == 0 || self.keep_checkpoints == 0 {
            return bad("checkpoint_every and keep_checkpoints must be positive");
        }
        if let Some(eval) = &self.eval
            && self.data.files.is_empty()
            && self.data.worlds.seeds.contains(&eval.world_seed)
        {
            return bad("the held-out world's seed is also a training world: evaluation would measure memory");
        }
        if !(0.0..=1.0).contains(&self.data.reuse) {
            return bad("data.reuse is a share of the tasks: between 0 and 1");
        }
        if self.data.reuse > 0.0 && !self.data.worlds.styles.contains(&Mode::Searl) {
            return bad("data.reuse shapes SEARL-style traces, and data.worlds.styles has no searl");
        }
        if self.data.files.is_empty() && self.data.worlds.seeds.is_empty() {
            return bad("no data: give data.files or data.worlds.seeds");
        }
        Ok(())
    }
}

/// Checks what SFT and RL settings share: the learning rate and which weights train (frozen
/// layers, LoRA, and gradient checkpointing with LoRA's dropout).
pub(crate) fn check_training(
    lr: f64,
    trainable_layers: Option<usize>,
    lora: Option<&toolsmith_policy::LoraConfig>,
    gradient_checkpointing: bool,
) -> Result<(), TrainError> {
    let bad = |m: &str| Err(TrainError::Config(m.to_string()));
    if !(lr.is_finite() && lr > 0.0) {
        return bad("lr must be a positive number");
    }
    if trainable_layers == Some(0) {
        return bad("trainable_layers must be at least 1 (null trains every weight)");
    }
    if let Some(lora) = lora {
        if trainable_layers.is_some() && lora.layers_to_transform.is_some() {
            return bad("lora.layers_to_transform and trainable_layers both pick the adapted layers: set one");
        }
        lora.settings()?;
        if gradient_checkpointing && lora.dropout > 0.0 {
            return bad(
                "gradient_checkpointing needs lora.dropout = 0: a recomputed layer would draw other dropout masks",
            );
        }
    }
    Ok(())
}

/// Refuses a `smol-*` preset for a model other than SmolLM2-135M (by name, or a checkpoint of
/// its shape: a Llama of 30 layers of width 576).
pub fn check_smol_init(preset: &str, init: &str) -> Result<(), TrainError> {
    if init == "smollm2-135m" {
        return Ok(());
    }
    let refuse = |what: String| {
        Err(TrainError::Config(format!(
            "the {preset} preset is tuned for SmolLM2-135M, and --init {init} is {what}: use --init smollm2-135m \
             (or one of its checkpoints), or the tiny-world preset for the tiny model"
        )))
    };
    if init == "tiny" {
        return refuse("the tiny model".into());
    }
    let path = Path::new(init).join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| TrainError::io(&path, e))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| TrainError::Config(format!("{}: {e}", path.display())))?;
    let shape = (config["model_type"].as_str(), config["num_hidden_layers"].as_u64(), config["hidden_size"].as_u64());
    match shape {
        (Some("llama"), Some(30), Some(576)) => Ok(()),
        (kind, layers, width) => refuse(format!(
            "a {} model of {} layers of width {}",
            kind.unwrap_or("unknown"),
            layers.map_or("?".into(), |l| l.to_string()),
            width.map_or("?".into(), |w| w.to_string())
        )),
    }
}

/// The JSON Schema of [`SftConfig`] (`schemas/train-sft.schema.json`).
pub fn schema() -> serde_json::Value {
    schema_of::<SftConfig>()
}

/// A config type's JSON Schema (draft 2020-12, subschemas inlined).
pub fn schema_of<T: schemars::JsonSchema>() -> serde_json::Value {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12();
    settings.inline_subschemas = true;
    settings.into_generator().into_root_schema_for::<T>().to_value()
}
