//! What every training run is set up with, supervised or RL: where it starts ([`Init`]), where
//! and how precisely it computes ([`DeviceChoice`], [`PrecisionChoice`]), its seed, and which
//! weights train. [`RunSettings`] is flattened into [`SftConfig`](crate::SftConfig) and
//! [`RlConfig`](crate::rl::RlConfig), so a config file keeps these keys at its top level (files
//! written before the type existed read unchanged) and each is declared, documented and parsed
//! once. The values are checked when a file is read: an unknown device is an error naming the
//! key, not a failure minutes into a run.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toolsmith_agent::env::{Family, WorldConfig};
use toolsmith_agent::{Mode, ToolFormat};
use toolsmith_policy::{LoadOptions, LoraConfig, Policy, Precision};

use crate::TrainError;

/// The settings SFT and RL runs share, with the same defaults in both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct RunSettings {
    /// The model to start from: `tiny` (a fresh tiny model), a named model setup fetches
    /// (`smollm2-135m`) or a checkpoint directory (an SFT run's `final`). By default `tiny`.
    pub init: Init,
    /// Seed of the initial weights (for `tiny`), the LoRA adapters' draw, the data order and the
    /// sampler. By default 0.
    pub seed: u64,
    /// `auto` (CUDA when present), `cpu`, `cuda` or `cuda:N`. By default `auto`.
    pub device: DeviceChoice,
    /// Weights' precision: `auto` (bf16 with fp32 master weights on CUDA and on CPUs that train
    /// faster in it: with AMX, or AMD ones with AVX512_BF16; fp32 elsewhere), `f32`, `bf16` or
    /// `f16`. By default `auto`.
    pub precision: PrecisionChoice,
    /// CPU threads for libtorch (0: libtorch's default). By default 0.
    pub threads: usize,
    /// How prompts list tools, in traces, rollouts and held-out evaluation (they must agree with
    /// what the starting checkpoint was trained with): `compact`, `json` or `brief`. By default
    /// `compact`.
    pub tool_format: ToolFormat,
    /// Global gradient-norm clipping (0 disables it). By default 1.0.
    pub max_grad_norm: f64,
    /// Held-out evaluation every this many units, steps or iterations (0: only before and after
    /// training). By default 0.
    pub eval_every: u64,
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
    pub lora: Option<LoraConfig>,
    /// Gradient checkpointing: the forward pass keeps only each trained layer's input and the
    /// backward pass recomputes the layers one at a time, so a micro-batch holds one layer's
    /// activations instead of every layer's, for one more forward pass of the trained layers
    /// (the same gradients). Not with LoRA dropout. By default false.
    pub gradient_checkpointing: bool,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            init: Init::Tiny,
            seed: 0,
            device: DeviceChoice::Auto,
            precision: PrecisionChoice::Auto,
            threads: 0,
            tool_format: ToolFormat::Compact,
            max_grad_norm: 1.0,
            eval_every: 0,
            keep_checkpoints: 2,
            trainable_layers: None,
            lora: None,
            gradient_checkpointing: false,
        }
    }
}

impl RunSettings {
    /// Where and how to load the policies of this run: the device resolved, and `auto`
    /// precision made [`Precision::auto_for_training`] on it (then checked to run natively).
    pub fn load_options(&self) -> Result<LoadOptions, TrainError> {
        let device = self.device.resolve()?;
        let precision = match self.precision {
            PrecisionChoice::Auto => Precision::auto_for_training(device),
            PrecisionChoice::Fixed(p) => p,
        };
        precision.check(device)?;
        Ok(LoadOptions { device, precision: Some(precision) })
    }

    /// Checks what every run needs of these settings: which weights train (frozen layers, LoRA,
    /// and gradient checkpointing with LoRA's dropout) and how many checkpoints stay.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |m: &str| Err(TrainError::Config(m.to_string()));
        if self.trainable_layers == Some(0) {
            return bad("trainable_layers must be at least 1 (null trains every weight)");
        }
        if self.keep_checkpoints == 0 {
            return bad("keep_checkpoints must be positive");
        }
        if !(self.max_grad_norm.is_finite() && self.max_grad_norm >= 0.0) {
            return bad("max_grad_norm must be a number >= 0 (0 disables clipping)");
        }
        if let Some(lora) = &self.lora {
            if self.trainable_layers.is_some() && lora.layers_to_transform.is_some() {
                return bad("lora.layers_to_transform and trainable_layers both pick the adapted layers: set one");
            }
            lora.settings()?;
            if self.gradient_checkpointing && lora.dropout > 0.0 {
                return bad(
                    "gradient_checkpointing needs lora.dropout = 0: a recomputed layer would draw other dropout masks",
                );
            }
        }
        Ok(())
    }

    /// Applies `--lora-rank`: adapters of that rank (alpha twice the rank unless adapters were
    /// configured already, whose other settings stay).
    pub fn set_lora_rank(&mut self, rank: i64) {
        let lora = self.lora.get_or_insert_with(|| LoraConfig { alpha: 2.0 * rank as f64, ..LoraConfig::default() });
        lora.rank = rank;
    }
}

/// Checks a peak learning rate.
pub(crate) fn check_lr(lr: f64) -> Result<(), TrainError> {
    if !(lr.is_finite() && lr > 0.0) {
        return Err(TrainError::Config("lr must be a positive number".into()));
    }
    Ok(())
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

/// Where a run's policy starts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum Init {
    /// A fresh tiny model, drawn from the run's seed (for tests and the quickstart).
    #[default]
    Tiny,
    /// A model setup fetches, by name ([`toolsmith_policy::NAMED_POLICIES`]).
    Named(String),
    /// A checkpoint directory.
    Dir(PathBuf),
    /// Not given yet: a preset that must start from a checkpoint leaves it to `--init`.
    Unset,
}

impl Init {
    /// Reads a config's or a flag's value: `tiny`, a known name, empty (unset) or a directory.
    pub fn parse(spec: &str) -> Init {
        match spec {
            "" => Init::Unset,
            "tiny" => Init::Tiny,
            name if toolsmith_policy::NAMED_POLICIES.iter().any(|n| n.name == name) => Init::Named(name.to_string()),
            dir => Init::Dir(PathBuf::from(dir)),
        }
    }

    /// The value as a config file writes it.
    pub fn as_str(&self) -> Cow<'_, str> {
        match self {
            Init::Tiny => "tiny".into(),
            Init::Named(name) => name.as_str().into(),
            Init::Dir(dir) => dir.to_string_lossy(),
            Init::Unset => "".into(),
        }
    }

    /// The directory, when `init` names one (not a model setup fetches).
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Init::Dir(dir) => Some(dir),
            _ => None,
        }
    }

    /// Loads the starting policy: a tiny model drawn from `seed` (of `tiny_context` positions
    /// when given; SFT sets it), or a checkpoint (a named one from where setup put it).
    pub fn load(&self, seed: u64, options: LoadOptions, tiny_context: Option<u64>) -> Result<Policy, TrainError> {
        let spec = match self {
            Init::Tiny => return tiny(seed, options, tiny_context),
            Init::Unset => {
                return Err(TrainError::Config("init is not set: give --init (a checkpoint directory)".into()));
            }
            Init::Named(name) => name.as_str(),
            Init::Dir(dir) => dir.to_str().ok_or_else(|| TrainError::Config(format!("init: {dir:?} is not UTF-8")))?,
        };
        Ok(Policy::load(&toolsmith_policy::locate(spec)?, options)?)
    }
}

/// A fresh tiny model; with `context`, its context length and its tokenizer's length limit.
fn tiny(seed: u64, options: LoadOptions, context: Option<u64>) -> Result<Policy, TrainError> {
    let Some(context) = context else { return Ok(Policy::tiny(seed, options)?) };
    let mut config: serde_json::Value = serde_json::from_str(toolsmith_policy::TINY_CONFIG)
        .map_err(|e| TrainError::Config(format!("tiny config: {e}")))?;
    config["max_position_embeddings"] = serde_json::Value::from(context);
    let mut tokenizer_config = toolsmith_policy::tokenizer::tiny_tokenizer_config();
    tokenizer_config["model_max_length"] = serde_json::Value::from(context);
    Ok(Policy::init(
        config,
        toolsmith_policy::TINY_TOKENIZER.as_bytes().to_vec(),
        Some(tokenizer_config),
        seed,
        options,
    )?)
}

impl fmt::Display for Init {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str())
    }
}

impl From<String> for Init {
    fn from(spec: String) -> Self {
        Init::parse(&spec)
    }
}

impl From<&str> for Init {
    fn from(spec: &str) -> Self {
        Init::parse(spec)
    }
}

impl From<Init> for String {
    fn from(init: Init) -> String {
        init.as_str().into_owned()
    }
}

impl schemars::JsonSchema for Init {
    fn schema_name() -> Cow<'static, str> {
        "Init".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "examples": ["tiny", "smollm2-135m", "runs/sft/final"]
        })
    }
}

/// Where a run computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DeviceChoice {
    /// CUDA device 0 when libtorch sees one, the CPU otherwise.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// A CUDA device: `cuda` (device 0, written as given) or `cuda:N`.
    Cuda(Option<usize>),
}

impl DeviceChoice {
    /// Reads `auto`, `cpu`, `cuda` or `cuda:N`.
    pub fn parse(name: &str) -> Result<Self, TrainError> {
        match name {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(None)),
            other => match other.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()) {
                Some(n) => Ok(DeviceChoice::Cuda(Some(n))),
                None => Err(TrainError::Config(format!("device: unknown device {other:?} (auto, cpu, cuda, cuda:N)"))),
            },
        }
    }

    /// The libtorch device, checked to exist here.
    pub fn resolve(self) -> Result<toolsmith_policy::tch::Device, TrainError> {
        Ok(toolsmith_policy::parse_device(&self.to_string())?)
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(None) => f.write_str("cuda"),
            DeviceChoice::Cuda(Some(n)) => write!(f, "cuda:{n}"),
        }
    }
}

/// The weights' precision a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum PrecisionChoice {
    /// bf16 where training runs faster in it, f32 elsewhere ([`Precision::auto_for_training`]).
    #[default]
    Auto,
    /// This precision, refused where the hardware would emulate it.
    Fixed(Precision),
}

impl PrecisionChoice {
    /// Reads `auto` or a precision ([`Precision::parse`]: `f32`, `bf16`, `f16` and their long
    /// names).
    pub fn parse(name: &str) -> Result<Self, TrainError> {
        match name {
            "auto" => Ok(PrecisionChoice::Auto),
            other => Precision::parse(other).map(PrecisionChoice::Fixed).map_err(|_| {
                TrainError::Config(format!("precision: unknown precision {other:?} (auto, f32, bf16, f16)"))
            }),
        }
    }
}

impl fmt::Display for PrecisionChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PrecisionChoice::Auto => "auto",
            PrecisionChoice::Fixed(Precision::F32) => "f32",
            PrecisionChoice::Fixed(Precision::Bf16) => "bf16",
            PrecisionChoice::Fixed(Precision::F16) => "f16",
        })
    }
}

// Both settings are strings in a file, parsed into their type as the file is read, so a bad
// value is an error naming its key before the run starts.
impl TryFrom<String> for DeviceChoice {
    type Error = TrainError;
    fn try_from(name: String) -> Result<Self, TrainError> {
        DeviceChoice::parse(&name)
    }
}

impl From<DeviceChoice> for String {
    fn from(device: DeviceChoice) -> String {
        device.to_string()
    }
}

impl TryFrom<String> for PrecisionChoice {
    type Error = TrainError;
    fn try_from(name: String) -> Result<Self, TrainError> {
        PrecisionChoice::parse(&name)
    }
}

impl From<PrecisionChoice> for String {
    fn from(precision: PrecisionChoice) -> String {
        precision.to_string()
    }
}

impl schemars::JsonSchema for DeviceChoice {
    fn schema_name() -> Cow<'static, str> {
        "DeviceChoice".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "pattern": "^(auto|cpu|cuda|cuda:[0-9]+)$" })
    }
}

impl schemars::JsonSchema for PrecisionChoice {
    fn schema_name() -> Cow<'static, str> {
        "PrecisionChoice".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // The long names are what Hugging Face configs say; they read as the short ones.
        schemars::json_schema!({
            "type": "string",
            "enum": ["auto", "f32", "bf16", "f16", "float32", "float", "bfloat16", "float16", "half"]
        })
    }
}

/// What the trainer core and the command line need of a run's settings (SFT's and RL's configs).
pub trait RunConfig: Serialize + serde::de::DeserializeOwned {
    /// `sft` or `rl`.
    const KIND: &'static str;
    /// The settings of this kind of run a resume may change, besides
    /// `run::RESUMABLE_IN_ANY_RUN`.
    const RESUMABLE: &'static [&'static str];
    /// The shared settings.
    fn run(&self) -> &RunSettings;
    /// The shared settings, to change.
    fn run_mut(&mut self) -> &mut RunSettings;
    /// The peak learning rate, to change.
    fn lr_mut(&mut self) -> &mut f64;
    /// Units between checkpoints, to change.
    fn checkpoint_every_mut(&mut self) -> &mut u64;
    /// Held-out evaluation, to change.
    fn eval_mut(&mut self) -> &mut Option<EvalConfig>;
    /// Checks that settings made from preset `name`, flags applied, still suit the model the
    /// preset was tuned for.
    fn check_preset(&self, name: &str) -> Result<(), TrainError>;
}
