//! Checkpoints: Hugging Face's directory layout plus `toolsmith-state.json`, and the tiny default
//! model that trains on a CPU.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::PolicyError;
use crate::config::ModelConfig;
use crate::decoder::{FusedWeights, Transformer, WeightInit};
use crate::lora::Adapter;
use crate::tokenizer::{Tokenizer, tiny_tokenizer_config};

/// The tiny default configuration (Qwen2-style, about 4 M parameters).
pub const TINY_CONFIG: &str = include_str!("../assets/tiny-config.json");
/// The tiny model's byte-level BPE (3,377 ids, trace tags as single tokens), trained on
/// `assets/tokenizer-corpus.txt` by `toolsmith policy train-tokenizer`.
pub const TINY_TOKENIZER: &str = include_str!("../assets/tiny-tokenizer.json");

pub const STATE_FILE: &str = "toolsmith-state.json";
const STATE_FORMAT: u32 = 1;

/// Floating-point precision of the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F32,
    Bf16,
    F16,
}

impl Precision {
    pub fn kind(self) -> Kind {
        match self {
            Self::F32 => Kind::Float,
            Self::Bf16 => Kind::BFloat16,
            Self::F16 => Kind::Half,
        }
    }

    /// Parses `f32`/`float32`, `bf16`/`bfloat16`, `f16`/`float16`.
    pub fn parse(name: &str) -> Result<Self, PolicyError> {
        match name {
            "f32" | "float32" | "float" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f16" | "float16" | "half" => Ok(Self::F16),
            other => Err(PolicyError::Config(format!("unknown precision {other:?} (f32, bf16, f16)"))),
        }
    }

    /// What `auto` means on `device`: bf16 where the hardware computes it natively (CUDA, or a
    /// CPU with AVX512_BF16 or AMX; see [`cpu_has_bf16`]), f32 elsewhere. Training under bf16
    /// keeps fp32 master weights and fp32 optimizer state.
    pub fn auto(device: Device) -> Self {
        match device {
            Device::Cpu if !cpu_has_bf16() => Self::F32,
            _ => Self::Bf16,
        }
    }

    /// What `auto` means for training on `device`: bf16 on CUDA, and on a CPU only where
    /// training runs faster in it than in f32 ([`cpu_trains_in_bf16`]), f32 elsewhere.
    pub fn auto_for_training(device: Device) -> Self {
        match device {
            Device::Cpu if !cpu_trains_in_bf16() => Self::F32,
            _ => Self::Bf16,
        }
    }

    /// Refuses bf16 on a CPU that would emulate it (several times slower than f32 there).
    pub fn check(self, device: Device) -> Result<(), PolicyError> {
        if self == Self::Bf16 && device == Device::Cpu && !cpu_has_bf16() {
            return Err(PolicyError::Device(
                "bf16 was asked for, but this CPU has neither AVX512_BF16 nor AMX: use precision f32 (or auto)".into(),
            ));
        }
        Ok(())
    }

    /// The name `config.json` uses.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
        }
    }
}

/// Holds libtorch's global generator, seeded with `seed`, until dropped: two models initialised
/// at once on different threads would interleave their draws, and neither would be the seed's.
pub fn seeded(seed: u64) -> std::sync::MutexGuard<'static, ()> {
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = toolsmith_contract::sync::lock(&INIT);
    tch::manual_seed(seed as i64);
    guard
}

/// Whether this CPU computes bf16 natively (AVX512_BF16 or AMX-BF16). `TOOLSMITH_CPU_BF16=0`
/// or `=1` overrides the detection, e.g. to compare precisions or to test the refusal.
pub fn cpu_has_bf16() -> bool {
    bf16_on_this_cpu().0
}

/// Whether training (forward and backward passes, fp32 master weights) runs faster in bf16 than
/// in f32 on this CPU: with AMX-BF16, or with AVX512_BF16 on an AMD CPU (on a Zen 5, SmolLM2's
/// SFT steps run about 3x f32's). An Intel CPU with AVX512_BF16 but no AMX (or with AMX hidden by
/// a hypervisor) decodes faster in bf16 but trains slower: SFT at 0.76x f32's tokens/s, an RL
/// update at 0.6x (BENCHMARKS.md). `TOOLSMITH_CPU_BF16=0|1` overrides this as it does
/// [`cpu_has_bf16`].
pub fn cpu_trains_in_bf16() -> bool {
    bf16_on_this_cpu().1
}

/// ([`cpu_has_bf16`], [`cpu_trains_in_bf16`]), detected once.
fn bf16_on_this_cpu() -> (bool, bool) {
    static DETECTED: std::sync::OnceLock<(bool, bool)> = std::sync::OnceLock::new();
    *DETECTED.get_or_init(|| match std::env::var("TOOLSMITH_CPU_BF16").as_deref() {
        Ok("0") => (false, false),
        Ok("1") => (true, true),
        _ => {
            let features = CpuFeatures::detect();
            (features.has_bf16(), features.trains_in_bf16())
        }
    })
}

/// The features that decide how this CPU computes bf16.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    pub avx512_bf16: bool,
    pub amx_bf16: bool,
    pub amd: bool,
}

impl CpuFeatures {
    /// This machine's, from `/proc/cpuinfo` where it exists (AMX's feature names are not stable
    /// in `is_x86_feature_detected!`; the kernel lists them).
    pub fn detect() -> Self {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let mut features = Self::from_cpuinfo(&info);
        features.avx512_bf16 |= detect_avx512_bf16();
        features
    }

    /// The features the first processor of a `/proc/cpuinfo` text lists.
    pub fn from_cpuinfo(info: &str) -> Self {
        let field = |name: &str| {
            info.lines().filter_map(|l| l.split_once(':')).find(|(k, _)| k.trim() == name).map_or("", |(_, v)| v.trim())
        };
        let flags: Vec<&str> = field("flags").split_whitespace().collect();
        CpuFeatures {
            avx512_bf16: flags.contains(&"avx512_bf16"),
            amx_bf16: flags.contains(&"amx_bf16"),
            amd: field("vendor_id") == "AuthenticAMD",
        }
    }

    /// Whether bf16 is native at all: AVX512_BF16 or AMX-BF16.
    pub fn has_bf16(self) -> bool {
        self.avx512_bf16 || self.amx_bf16
    }

    /// Whether training runs faster in bf16 than in f32 (see [`cpu_trains_in_bf16`]).
    pub fn trains_in_bf16(self) -> bool {
        self.amx_bf16 || (self.avx512_bf16 && self.amd)
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_avx512_bf16() -> bool {
    std::arch::is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_avx512_bf16() -> bool {
    false
}

/// Where and how to load a policy.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    pub device: Device,
    /// `None`: [`Precision::auto`] for the device.
    pub precision: Option<Precision>,
}

impl LoadOptions {
    /// The precision these options load in.
    pub fn precision(&self) -> Precision {
        self.precision.unwrap_or_else(|| Precision::auto(self.device))
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { device: Device::Cpu, precision: None }
    }
}

/// Toolsmith's part of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyState {
    pub format: u32,
    pub architecture: String,
    /// Optimizer steps taken so far.
    pub step: u64,
    /// BLAKE3 of `tokenizer.json`: a checkpoint paired with another tokenizer is refused.
    pub tokenizer_hash: String,
    /// Optimizer state file, relative to the checkpoint directory, when a trainer saved one.
    pub optimizer_state: Option<String>,
    pub precision: Precision,
    pub parameters: i64,
    /// A copy of `config.json`, so the state alone says what model it belongs to.
    pub config: Value,
}

impl PolicyState {
    /// The state of a model that has not been trained by Toolsmith yet.
    fn fresh(
        config: &ModelConfig,
        config_json: &Value,
        tokenizer: &Tokenizer,
        precision: Precision,
        parameters: i64,
    ) -> Self {
        Self {
            format: STATE_FORMAT,
            architecture: config.architecture().into(),
            step: 0,
            tokenizer_hash: tokenizer.hash().into(),
            optimizer_state: None,
            precision,
            parameters,
            config: config_json.clone(),
        }
    }
}

/// A loaded policy: model weights, configuration, tokenizer and training state.
#[derive(Debug)]
pub struct Policy {
    pub(crate) vs: VarStore,
    pub(crate) model: Transformer,
    config: ModelConfig,
    config_json: Value,
    pub(crate) tokenizer: Tokenizer,
    tokenizer_json: Vec<u8>,
    tokenizer_config: Option<Value>,
    state: PolicyState,
    /// Changes whenever the weights may have changed (see [`Policy::weights_id`]).
    weights_id: u64,
    /// Changes whenever weights that take no gradients may have changed (see
    /// [`Policy::frozen_id`]).
    frozen_id: u64,
    /// LoRA adapters, in a var store of their own.
    pub(crate) adapter: Option<Adapter>,
    /// The directory the weights were loaded from.
    pub(crate) source: Option<PathBuf>,
    /// Generation's fused copies of the weights, with the [`Policy::weights_id`] they were made at.
    fused: Mutex<Option<(u64, FusedWeights)>>,
}

/// The decoder layer a weight belongs to (`model.layers.N.` names), if any.
pub(crate) fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?.split('.').next()?.parse().ok()
}

/// The lowest of the top `n` of `total` decoder layers; refused when `n` is 0 or above `total`.
pub(crate) fn lowest_of_top(n: usize, total: usize) -> Result<usize, PolicyError> {
    if n == 0 || n > total {
        return Err(PolicyError::Config(format!(
            "trainable_layers must be between 1 and the model's {total} layers, got {n}"
        )));
    }
    Ok(total - n)
}

/// A process-wide counter, so that a policy swapped for another never reuses an identity.
fn next_weights_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn precision_of(kind: Kind) -> Precision {
    match kind {
        Kind::BFloat16 => Precision::Bf16,
        Kind::Half => Precision::F16,
        _ => Precision::F32,
    }
}

/// What a policy is made of besides its weights: the files that describe it.
struct Files {
    config: ModelConfig,
    config_json: Value,
    tokenizer: Tokenizer,
    tokenizer_json: Vec<u8>,
    tokenizer_config: Option<Value>,
}

impl Policy {
    /// The one place a policy is put together: each constructor builds the weights its way.
    fn assemble(vs: VarStore, model: Transformer, files: Files, state: PolicyState) -> Self {
        let Files { config, config_json, tokenizer, tokenizer_json, tokenizer_config } = files;
        Self {
            vs,
            model,
            config,
            config_json,
            tokenizer,
            tokenizer_json,
            tokenizer_config,
            state,
            weights_id: next_weights_id(),
            frozen_id: next_weights_id(),
            adapter: None,
            source: None,
            fused: Mutex::new(None),
        }
    }

    /// Records that the weights (or what the forward pass applies) changed.
    pub(crate) fn touch(&mut self) {
        self.frozen_id = next_weights_id();
        self.touch_trained();
    }

    /// Records an optimiser's step: only weights that take gradients changed.
    fn touch_trained(&mut self) {
        self.weights_id = next_weights_id();
        // The copies are stale now: free them until the next generation.
        *self.fused.get_mut().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Fused copies of the current weights for generation, made on first use after a change.
    pub(crate) fn fused_weights(&self) -> FusedWeights {
        let mut slot = self.fused.lock().unwrap_or_else(PoisonError::into_inner);
        match &*slot {
            Some((id, fused)) if *id == self.weights_id => fused.shallow_clone(),
            _ => {
                let fused = self.model.fuse();
                *slot = Some((self.weights_id, fused.shallow_clone()));
                fused
            }
        }
    }

    /// Every variable an optimiser may train (those that take gradients): the base's and the
    /// adapters'.
    pub fn trained_variables(&self) -> std::collections::BTreeMap<String, Tensor> {
        let mut all: std::collections::BTreeMap<String, Tensor> = self.vs.variables().into_iter().collect();
        if let Some(adapter) = &self.adapter {
            all.extend(adapter.vs.variables());
        }
        all.retain(|_, v| v.requires_grad());
        all
    }

    /// Trains only the top `layers` decoder layers and the final norm: the embeddings (and so a
    /// tied head), an untied head and every lower layer stop taking gradients, so the backward
    /// pass stops at the lowest trained layer and the optimiser keeps state for the trained
    /// weights alone. `None` trains every weight. Refused, before anything changes, when `layers`
    /// is 0 or more than the model has.
    pub fn set_trainable_layers(&mut self, layers: Option<usize>) -> Result<(), PolicyError> {
        if self.adapter.is_some() {
            // With adapters the base stays frozen whole.
            return match layers {
                None => Ok(()),
                Some(_) => Err(PolicyError::Config("trainable_layers and LoRA adapters exclude each other".into())),
            };
        }
        let total = usize::try_from(self.model.spec().layers).unwrap_or(0);
        let lowest = layers.map(|n| lowest_of_top(n, total)).transpose()?;
        // Weights frozen before may have trained since: rows they computed are not trusted.
        self.touch();
        for (name, var) in self.vs.variables() {
            let trains = match lowest {
                None => true,
                Some(lowest) => match layer_of(&name) {
                    Some(i) => i >= lowest,
                    None => name.starts_with("model.norm."),
                },
            };
            let _ = var.set_requires_grad(trains);
        }
        Ok(())
    }

    /// The context length in tokens (the model's `max_position_embeddings`).
    pub fn context_len(&self) -> usize {
        usize::try_from(self.config.common().max_position_embeddings).unwrap_or(usize::MAX)
    }

    /// Bytes of keys and values one token occupies in a generation's cache (and in a
    /// [`crate::PrefixCache`]): all layers, keys and values, at the model's precision.
    pub fn kv_bytes_per_token(&self) -> usize {
        let spec = self.model().spec();
        let per_layer = 2 * spec.kv_heads * spec.head_dim;
        usize::try_from(spec.layers * per_layer).unwrap_or(usize::MAX) * self.model().kind().elt_size_in_bytes()
    }

    /// A freshly initialised model (weights drawn with the config's `initializer_range` from
    /// libtorch's generator seeded with `seed`).
    pub fn init(
        config_json: Value,
        tokenizer_json: Vec<u8>,
        tokenizer_config: Option<Value>,
        seed: u64,
        options: LoadOptions,
    ) -> Result<Self, PolicyError> {
        let precision = options.precision();
        precision.check(options.device)?;
        let config = ModelConfig::from_json(&config_json)?;
        let spec = config.spec()?;
        let tokenizer = Tokenizer::from_bytes(&tokenizer_json, tokenizer_config.as_ref())?;
        if tokenizer.vocab_size() as i64 > spec.vocab_size {
            return Err(PolicyError::Config(format!(
                "the tokenizer has {} tokens but vocab_size is {}",
                tokenizer.vocab_size(),
                spec.vocab_size
            )));
        }
        let guard = seeded(seed);
        let mut vs = VarStore::new(options.device);
        let model = Transformer::new(&vs.root(), &spec, WeightInit::Random);
        drop(guard);
        vs.set_kind(precision.kind());
        let state = PolicyState::fresh(&config, &config_json, &tokenizer, precision, count_parameters(&vs));
        Ok(Self::assemble(vs, model, Files { config, config_json, tokenizer, tokenizer_json, tokenizer_config }, state))
    }

    /// The tiny default model with its tokenizer.
    pub fn tiny(seed: u64, options: LoadOptions) -> Result<Self, PolicyError> {
        let config = serde_json::from_str(TINY_CONFIG).map_err(|e| PolicyError::Config(e.to_string()))?;
        Self::init(config, TINY_TOKENIZER.as_bytes().to_vec(), Some(tiny_tokenizer_config()), seed, options)
    }

    /// Loads a checkpoint directory.
    pub fn load(dir: &Path, options: LoadOptions) -> Result<Self, PolicyError> {
        let precision = options.precision();
        precision.check(options.device)?;
        if !dir.is_dir() {
            return Err(PolicyError::checkpoint(dir, "not a directory"));
        }
        let (config, config_json) = ModelConfig::from_file(&dir.join("config.json"))?;
        let spec = config.spec()?;
        let tokenizer_path = dir.join("tokenizer.json");
        let (tokenizer_json, tokenizer_config) = crate::tokenizer::read_files(&tokenizer_path)?;
        let tokenizer = Tokenizer::from_bytes(&tokenizer_json, tokenizer_config.as_ref())
            .map_err(|e| PolicyError::checkpoint(&tokenizer_path, e.to_string()))?;
        let state_path = dir.join(STATE_FILE);
        let saved_state: Option<PolicyState> = if state_path.exists() {
            let text = std::fs::read_to_string(&state_path).map_err(|e| PolicyError::io(&state_path, e))?;
            let state: PolicyState = serde_json::from_str(&text)
                .map_err(|e| PolicyError::checkpoint(&state_path, format!("invalid state: {e}")))?;
            if state.tokenizer_hash != tokenizer.hash() {
                return Err(PolicyError::checkpoint(
                    dir,
                    "tokenizer.json is not the tokenizer this checkpoint was trained with (hash differs)",
                ));
            }
            Some(state)
        } else {
            None
        };
        let mut vs = VarStore::new(options.device);
        let model = Transformer::new(&vs.root(), &spec, WeightInit::Zeros);
        vs.set_kind(precision.kind());
        load_weights(&vs, dir, spec.tie_word_embeddings)?;
        let parameters = count_parameters(&vs);
        let state = match saved_state {
            Some(state) => PolicyState { precision, parameters, ..state },
            None => PolicyState::fresh(&config, &config_json, &tokenizer, precision, parameters),
        };
        let mut policy = Self::assemble(
            vs,
            model,
            Files { config, config_json, tokenizer, tokenizer_json, tokenizer_config },
            state,
        );
        policy.source = Some(dir.canonicalize().unwrap_or_else(|_| dir.to_owned()));
        if crate::lora::has_adapter(dir) {
            policy.load_adapter(dir)?;
        }
        Ok(policy)
    }

    /// Writes the checkpoint to `dir` (created if needed): the base weights and, with LoRA, the
    /// adapter beside them (which [`Policy::load`] attaches again). Each file is written beside
    /// its final name and renamed into place, so a crash never leaves a half-written file behind.
    pub fn save(&self, dir: &Path) -> Result<(), PolicyError> {
        self.save_weights(dir, &[])?;
        self.save_adapter(dir)
    }

    /// [`Policy::save`] of the base with `replaced` variables written instead of the stored ones,
    /// and without adapter files (stale ones from an earlier save are removed).
    pub(crate) fn save_weights(&self, dir: &Path, replaced: &[(String, Tensor)]) -> Result<(), PolicyError> {
        std::fs::create_dir_all(dir).map_err(|e| PolicyError::io(dir, e))?;
        let mut config = self.config_json.clone();
        if let Some(obj) = config.as_object_mut() {
            let key = if obj.contains_key("torch_dtype") { "torch_dtype" } else { "dtype" };
            obj.insert(key.into(), Value::from(precision_of(self.model.kind()).hf_name()));
        }
        write_json(&dir.join("config.json"), &config)?;
        let weights = dir.join("model.safetensors");
        let partial = partial_path(&weights);
        let mut named: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        for (name, tensor) in &mut named {
            if let Some((_, new)) = replaced.iter().find(|(n, _)| n == name) {
                *tensor = new.shallow_clone();
            }
        }
        named.sort_by(|a, b| a.0.cmp(&b.0));
        Tensor::write_safetensors(&named, &partial).map_err(|e| PolicyError::checkpoint(&partial, e.to_string()))?;
        rename(&partial, &weights)?;
        // A sharded index from an earlier save of a loaded model would now point at stale shards,
        // and an adapter from an earlier save would be applied on top of these weights.
        for stale in [
            "model.safetensors.index.json",
            crate::lora::ADAPTER_CONFIG,
            crate::lora::ADAPTER_WEIGHTS,
            crate::lora::ADAPTER_BASE,
        ] {
            let path = dir.join(stale);
            if path.exists() {
                std::fs::remove_file(&path).map_err(|e| PolicyError::io(&path, e))?;
            }
        }
        write_bytes(&dir.join("tokenizer.json"), &self.tokenizer_json)?;
        if let Some(tc) = &self.tokenizer_config {
            write_json(&dir.join("tokenizer_config.json"), tc)?;
        }
        let state = PolicyState { config, ..self.state.clone() };
        write_json(
            &dir.join(STATE_FILE),
            &serde_json::to_value(&state).map_err(|e| PolicyError::Config(e.to_string()))?,
        )
    }

    /// A frozen copy of the weights (no gradients), e.g. the reference policy of a KL penalty;
    /// adapters are folded into the copy's weights.
    pub fn reference(&self) -> Result<Self, PolicyError> {
        let spec = self.config.spec()?;
        let mut vs = VarStore::new(self.vs.device());
        let model = Transformer::new(&vs.root(), &spec, WeightInit::Zeros);
        vs.set_kind(self.model.kind());
        vs.copy(&self.vs)?;
        let mut variables = vs.variables();
        for (name, merged) in self.model.merged_weights() {
            if let Some(var) = variables.get_mut(&name) {
                tch::no_grad(|| var.f_copy_(&merged))?;
            }
        }
        vs.freeze();
        let files = Files {
            config: self.config.clone(),
            config_json: self.config_json.clone(),
            tokenizer: self.tokenizer.clone(),
            tokenizer_json: self.tokenizer_json.clone(),
            tokenizer_config: self.tokenizer_config.clone(),
        };
        Ok(Self::assemble(vs, model, files, self.state.clone()))
    }

    pub fn model(&self) -> &Transformer {
        &self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn state(&self) -> &PolicyState {
        &self.state
    }

    /// The training state. Trainers record each optimiser step here, so taking it counts as a
    /// change of the weights (see [`Policy::weights_id`]).
    pub fn state_mut(&mut self) -> &mut PolicyState {
        self.touch_trained();
        &mut self.state
    }

    /// An identity of the current weights, for caches of what they computed (the key/value
    /// rows of a [`crate::PrefixCache`]). It changes when the weights are reached mutably
    /// ([`Policy::var_store_mut`]) or a trainer records a step ([`Policy::state_mut`]); an
    /// optimiser holding the variables must record its steps there, as the trainers do. No two
    /// policies of a process share one.
    pub fn weights_id(&self) -> u64 {
        self.weights_id
    }

    /// An identity of the frozen lowest layers ([`Transformer::frozen_layers`], with the
    /// embeddings below them) and their count, for rows they computed; `None` when none is
    /// frozen. A trainer's step ([`Policy::state_mut`]) leaves it as it is, since the optimiser
    /// holds only weights that take gradients; any other change of the weights or of which of
    /// them train ([`Policy::var_store_mut`], [`Policy::set_trainable_layers`], adapters)
    /// replaces it.
    pub fn frozen_id(&self) -> Option<(u64, usize)> {
        let layers = self.model.frozen_layers();
        (layers > 0).then_some((self.frozen_id, layers))
    }

    /// The variables, for an optimizer.
    pub fn var_store(&self) -> &VarStore {
        &self.vs
    }

    pub fn var_store_mut(&mut self) -> &mut VarStore {
        self.touch();
        &mut self.vs
    }

    pub fn device(&self) -> Device {
        self.vs.device()
    }
}

fn count_parameters(vs: &VarStore) -> i64 {
    vs.variables().values().map(Tensor::numel).map(|n| n as i64).sum()
}

/// Copies every variable from the checkpoint's safetensors file(s), checking names and shapes.
fn load_weights(vs: &VarStore, dir: &Path, tied: bool) -> Result<(), PolicyError> {
    let index_path = dir.join("model.safetensors.index.json");
    let files: Vec<PathBuf> = if index_path.exists() {
        let text = std::fs::read_to_string(&index_path).map_err(|e| PolicyError::io(&index_path, e))?;
        let index: Value = serde_json::from_str(&text)
            .map_err(|e| PolicyError::checkpoint(&index_path, format!("invalid JSON: {e}")))?;
        let map = index
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| PolicyError::checkpoint(&index_path, "no \"weight_map\" object"))?;
        let mut shards: Vec<&str> = map.values().filter_map(Value::as_str).collect();
        shards.sort_unstable();
        shards.dedup();
        if shards.iter().any(|s| s.contains('/') || s.contains("..")) {
            return Err(PolicyError::checkpoint(&index_path, "shard names must be plain file names"));
        }
        shards.into_iter().map(|s| dir.join(s)).collect()
    } else {
        vec![dir.join("model.safetensors")]
    };
    let mut variables = vs.variables();
    let mut loaded = HashSet::new();
    let mut unexpected = Vec::new();
    for file in &files {
        if !file.exists() {
            return Err(PolicyError::checkpoint(file, "missing weights file"));
        }
        let tensors = Tensor::read_safetensors(file)
            .map_err(|e| PolicyError::checkpoint(file, format!("unreadable safetensors: {e}")))?;
        for (name, tensor) in tensors {
            match variables.get_mut(&name) {
                Some(var) => {
                    if var.size() != tensor.size() {
                        return Err(PolicyError::checkpoint(
                            file,
                            format!("{name} has shape {:?}, the config expects {:?}", tensor.size(), var.size()),
                        ));
                    }
                    tch::no_grad(|| var.f_copy_(&tensor))?;
                    loaded.insert(name);
                }
                // Tied heads are sometimes saved anyway; the embedding is the truth.
                None if tied && name == "lm_head.weight" => {}
                None => unexpected.push(name),
            }
        }
    }
    let mut missing: Vec<&String> = variables.keys().filter(|k| !loaded.contains(*k)).collect();
    if !missing.is_empty() {
        missing.sort();
        let shown: Vec<&str> = missing.iter().take(5).map(|s| s.as_str()).collect();
        return Err(PolicyError::checkpoint(
            dir,
            format!("{} weight(s) missing, e.g. {}", missing.len(), shown.join(", ")),
        ));
    }
    if !unexpected.is_empty() {
        tracing::warn!(count = unexpected.len(), first = %unexpected[0], "checkpoint tensors not used by the model");
    }
    Ok(())
}

pub(crate) fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    path.with_file_name(name)
}

pub(crate) fn rename(from: &Path, to: &Path) -> Result<(), PolicyError> {
    std::fs::rename(from, to).map_err(|e| PolicyError::io(to, e))
}

fn write_bytes(path: &Path, bytes: &[u8]) -> Result<(), PolicyError> {
    let partial = partial_path(path);
    std::fs::write(&partial, bytes).map_err(|e| PolicyError::io(&partial, e))?;
    rename(&partial, path)
}

pub(crate) fn write_json(path: &Path, value: &Value) -> Result<(), PolicyError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| PolicyError::Config(e.to_string()))?;
    text.push('\n');
    write_bytes(path, text.as_bytes())
}
