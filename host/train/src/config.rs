//! The settings of a supervised run: one serde type read from TOML or JSON (flags override it),
//! whose JSON Schema is `schemas/train-sft.schema.json` (generated; a golden test keeps it in
//! step).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toolsmith_agent::{Mode, ToolFormat};

use crate::TrainError;
use crate::optim::AdamWConfig;
pub use crate::settings::{EvalConfig, WorldsData};
use crate::settings::{Init, RunConfig, RunSettings, check_lr};

/// A supervised fine-tuning run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    /// What to train on. By default the traces of generated worlds ([`WorldsData::default`]).
    pub data: DataConfig,
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
    /// Held-out evaluation; `null` disables it. By default a generated world of another seed.
    pub eval: Option<EvalConfig>,
    /// A checkpoint every this many steps (and one at the end). By default 100.
    pub checkpoint_every: u64,
    /// What every run sets: the starting model, seed, device and precision, which weights train.
    #[serde(flatten)]
    pub run: RunSettings,
}

impl RunConfig for SftConfig {
    const KIND: &'static str = "sft";
    // A resume may change how long the run is (the learning-rate schedule is then planned over
    // the new length), and what any run may change (`run::RESUMABLE_IN_ANY_RUN`); every other
    // field defines the run, and a resume that changes one is refused.
    const RESUMABLE: &'static [&'static str] = &["steps", "epochs"];

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

    fn check_preset(&self, name: &str) -> Result<(), TrainError> {
        if name.starts_with("smol-") {
            check_smol_init(name, &self.run.init)?;
        }
        Ok(())
    }
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            data: DataConfig::default(),
            tiny_context: 3072,
            epochs: 1.0,
            steps: None,
            lr: 1e-3,
            min_lr_ratio: 0.1,
            warmup_ratio: 0.05,
            optimizer: AdamWConfig::default(),
            first_turn_weight: 1.0,
            batch_tokens: 16384,
            micro_batch_tokens: 4096,
            eval: Some(EvalConfig::default()),
            checkpoint_every: 100,
            run: RunSettings::default(),
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
                batch_tokens: 4096,
                micro_batch_tokens: 4096,
                checkpoint_every: 100,
                run: RunSettings { tool_format: ToolFormat::Brief, threads: 2, ..RunSettings::default() },
                ..SftConfig::default()
            }),
            "smol-world" => Ok(SftConfig {
                // Many worlds, each small: every trace brings new names, so the model learns to
                // copy names from the question and the observations instead of remembering them.
                data: DataConfig { worlds: WorldsData::smol(), ..DataConfig::default() },
                // 100 steps of 2,048 tokens: about 11 minutes of full bf16 fine-tuning here.
                // 1e-4 took held-out single-hop EM from 0 to 0.44 in 40 such steps of ReAct traces.
                steps: Some(100),
                lr: 1e-4,
                batch_tokens: 2048,
                micro_batch_tokens: 2048,
                checkpoint_every: 25,
                eval: Some(EvalConfig {
                    // The base model never answers in the agent's format (held-out EM 0, every
                    // episode to its turn budget: BENCHMARKS.md), and that pass alone would
                    // take longer than the whole preset.
                    before: false,
                    ..EvalConfig::smol()
                }),
                run: RunSettings {
                    init: Init::Named("smollm2-135m".into()),
                    tool_format: ToolFormat::Brief,
                    threads: 2,
                    ..RunSettings::default()
                },
                ..SftConfig::default()
            }),
            other => Err(TrainError::Config(format!("unknown preset {other:?} (tiny-world, smol-world)"))),
        }
    }

    /// Checks values a run cannot start with.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |m: &str| Err(TrainError::Config(m.to_string()));
        check_lr(self.lr)?;
        self.run.validate()?;
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
        if self.checkpoint_every == 0 {
            return bad("checkpoint_every must be positive");
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

/// Refuses a `smol-*` preset for a model other than SmolLM2-135M (by name, or a checkpoint of
/// its shape: a Llama of 30 layers of width 576).
pub fn check_smol_init(preset: &str, init: &Init) -> Result<(), TrainError> {
    let dir = match init {
        Init::Named(name) if name == "smollm2-135m" => return Ok(()),
        Init::Dir(dir) => dir,
        Init::Tiny => return refuse_smol(preset, init, "the tiny model".into()),
        Init::Named(_) | Init::Unset => return refuse_smol(preset, init, "not a SmolLM2-135M checkpoint".into()),
    };
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| TrainError::io(&path, e))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| TrainError::Config(format!("{}: {e}", path.display())))?;
    let shape = (config["model_type"].as_str(), config["num_hidden_layers"].as_u64(), config["hidden_size"].as_u64());
    match shape {
        (Some("llama"), Some(30), Some(576)) => Ok(()),
        (kind, layers, width) => refuse_smol(
            preset,
            init,
            format!(
                "a {} model of {} layers of width {}",
                kind.unwrap_or("unknown"),
                layers.map_or("?".into(), |l| l.to_string()),
                width.map_or("?".into(), |w| w.to_string())
            ),
        ),
    }
}

fn refuse_smol(preset: &str, init: &Init, what: String) -> Result<(), TrainError> {
    Err(TrainError::Config(format!(
        "the {preset} preset is tuned for SmolLM2-135M, and --init {init} is {what}: use --init smollm2-135m \
         (or one of its checkpoints), or the tiny-world preset for the tiny model"
    )))
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
