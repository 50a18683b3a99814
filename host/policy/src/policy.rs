//! The policy: a decoder's weights with the configuration, tokenizer and training state they came
//! with, and the identities that tell caches when the weights changed. Loading and saving go
//! through [`crate::checkpoint`]; LoRA adapters ride in a var store of their own ([`crate::lora`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde_json::Value;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::PolicyError;
use crate::checkpoint::{self, PolicyState, STATE_FILE};
use crate::config::TINY_CONFIG;
use crate::decoder::{FusedWeights, Transformer, WeightInit, layer_of, lowest_of_top};
use crate::lora::{ADAPTER_BASE, ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterFiles, LoraConfig, PEFT_PREFIX, has_adapter};
use crate::models::ModelConfig;
use crate::precision::Precision;
use crate::runtime::seeded;
use crate::tokenizer::{self, TINY_TOKENIZER, Tokenizer, tiny_tokenizer_config};

/// Where and how to load a policy.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Where the weights live and the passes run.
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

/// A loaded policy: model weights, configuration, tokenizer and training state.
#[derive(Debug)]
pub struct Policy {
    vs: VarStore,
    model: Transformer,
    config: ModelConfig,
    config_json: Value,
    tokenizer: Tokenizer,
    tokenizer_json: Vec<u8>,
    tokenizer_config: Option<Value>,
    state: PolicyState,
    /// Changes whenever the weights may have changed (see [`Policy::weights_id`]).
    weights_id: u64,
    /// Changes whenever weights that take no gradients may have changed (see
    /// [`Policy::frozen_id`]).
    frozen_id: u64,
    /// LoRA adapters, in a var store of their own.
    adapter: Option<Adapter>,
    /// The directory the weights were loaded from.
    source: Option<PathBuf>,
    /// Generation's fused copies of the weights, with the [`Policy::weights_id`] they were made at.
    fused: Mutex<Option<(u64, FusedWeights)>>,
}

/// An adapter attached to a policy: its variables and configuration.
#[derive(Debug)]
struct Adapter {
    vs: VarStore,
    config: LoraConfig,
    /// Where the base came from (PEFT's `base_model_name_or_path`).
    base: String,
}

/// A process-wide counter, so that a policy swapped for another never reuses an identity.
fn next_weights_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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
    fn touch(&mut self) {
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
    pub fn trained_variables(&self) -> BTreeMap<String, Tensor> {
        let mut all: BTreeMap<String, Tensor> = self.vs.variables().into_iter().collect();
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
        let state = PolicyState::fresh(&config, &config_json, &tokenizer, precision, checkpoint::count_parameters(&vs));
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
        let (tokenizer_json, tokenizer_config) = tokenizer::read_files(&tokenizer_path)?;
        let tokenizer = Tokenizer::from_bytes(&tokenizer_json, tokenizer_config.as_ref())
            .map_err(|e| PolicyError::checkpoint(&tokenizer_path, e.to_string()))?;
        let saved_state = checkpoint::read_state(dir, &tokenizer)?;
        let mut vs = VarStore::new(options.device);
        let model = Transformer::new(&vs.root(), &spec, WeightInit::Zeros);
        vs.set_kind(precision.kind());
        checkpoint::load_weights(&vs, dir, spec.tie_word_embeddings)?;
        let parameters = checkpoint::count_parameters(&vs);
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
        if has_adapter(dir) {
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
    fn save_weights(&self, dir: &Path, replaced: &[(String, Tensor)]) -> Result<(), PolicyError> {
        std::fs::create_dir_all(dir).map_err(|e| PolicyError::io(dir, e))?;
        let mut config = self.config_json.clone();
        if let Some(obj) = config.as_object_mut() {
            let key = if obj.contains_key("torch_dtype") { "torch_dtype" } else { "dtype" };
            obj.insert(key.into(), Value::from(Precision::of_kind(self.model.kind()).hf_name()));
        }
        checkpoint::write_json(&dir.join("config.json"), &config)?;
        let weights = dir.join("model.safetensors");
        let mut named: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        for (name, tensor) in &mut named {
            if let Some((_, new)) = replaced.iter().find(|(n, _)| n == name) {
                *tensor = new.shallow_clone();
            }
        }
        named.sort_by(|a, b| a.0.cmp(&b.0));
        checkpoint::write_safetensors(&weights, &named)?;
        // A sharded index from an earlier save of a loaded model would now point at stale shards,
        // and an adapter from an earlier save would be applied on top of these weights.
        for stale in ["model.safetensors.index.json", ADAPTER_CONFIG, ADAPTER_WEIGHTS, ADAPTER_BASE] {
            let path = dir.join(stale);
            if path.exists() {
                std::fs::remove_file(&path).map_err(|e| PolicyError::io(&path, e))?;
            }
        }
        checkpoint::write_bytes(&dir.join("tokenizer.json"), &self.tokenizer_json)?;
        if let Some(tc) = &self.tokenizer_config {
            checkpoint::write_json(&dir.join("tokenizer_config.json"), tc)?;
        }
        let state = PolicyState { config, ..self.state.clone() };
        checkpoint::write_json(
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

    /// The decoder.
    pub fn model(&self) -> &Transformer {
        &self.model
    }

    /// The tokenizer it was trained with.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The model's `config.json`, parsed.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Toolsmith's training state (step, tokenizer hash, optimiser state file).
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

    /// The variables, to change them: counts as a change of every weight (see
    /// [`Policy::weights_id`] and [`Policy::frozen_id`]).
    pub fn var_store_mut(&mut self) -> &mut VarStore {
        self.touch();
        &mut self.vs
    }

    /// Where the weights live.
    pub fn device(&self) -> Device {
        self.vs.device()
    }
}

impl Policy {
    /// Attaches fresh LoRA adapters (`A` drawn from libtorch's generator seeded with `seed`, `B`
    /// zero) and freezes every base weight. Refused, before anything changes, for a module the
    /// model lacks or numbers out of range; an adapter already attached is replaced.
    pub fn add_lora(&mut self, config: &LoraConfig, seed: u64) -> Result<(), PolicyError> {
        let settings = config.settings_for(self.layer_count())?;
        let mut vs = VarStore::new(self.vs.device());
        vs.set_kind(self.model.kind());
        {
            let _guard = seeded(seed);
            self.model.attach_lora(&vs.root(), settings, WeightInit::Random);
        }
        self.vs.freeze();
        let base = self.source.as_ref().map_or_else(|| "tiny".into(), |p| p.to_string_lossy().into_owned());
        self.adapter = Some(Adapter { vs, config: config.clone(), base });
        self.touch();
        Ok(())
    }

    /// The number of decoder layers.
    pub fn layer_count(&self) -> usize {
        usize::try_from(self.model.spec().layers).unwrap_or(0)
    }

    /// The LoRA configuration, when adapters are attached.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.adapter.as_ref().map(|a| &a.config)
    }

    /// Turns the adapters off (the base model alone) or back on. No-op without adapters.
    pub fn set_adapters_enabled(&mut self, enabled: bool) {
        if self.adapter.is_some() {
            self.model.set_adapters_enabled(enabled);
            self.touch();
        }
    }

    /// Applies an adapter read by [`AdapterFiles::read`]: checked against this base (its
    /// fingerprint when recorded, every tensor's name and shape) before anything changes; the
    /// adapter attached before (if any) is replaced. The base is not reloaded.
    pub fn apply_adapter(&mut self, files: &AdapterFiles) -> Result<(), PolicyError> {
        let dir = files.dir();
        if let Some(fingerprint) = files.fingerprint()
            && fingerprint != self.base_fingerprint()
        {
            return Err(PolicyError::checkpoint(
                dir,
                "this adapter was trained on another base model (its fingerprint differs from the loaded model's)",
            ));
        }
        let settings =
            files.config().settings_for(self.layer_count()).map_err(|e| PolicyError::checkpoint(dir, e.to_string()))?;
        let expected: HashMap<String, Vec<i64>> = self.model.lora_shapes(&settings).into_iter().collect();
        let values = files.tensors_for(&expected)?;
        let mut vs = VarStore::new(self.vs.device());
        vs.set_kind(self.model.kind());
        // Zeros: the loaded values replace them, and a draw from libtorch's global generator
        // would shift the dropout masks of a training unit in this process (the daemon swaps
        // adapters while it trains).
        self.model.attach_lora(&vs.root(), settings, WeightInit::Zeros);
        for (name, var) in vs.variables() {
            if let Some(value) = values.get(&name) {
                let mut var = var;
                tch::no_grad(|| var.f_copy_(value))?;
            }
        }
        self.vs.freeze();
        self.adapter = Some(Adapter { vs, config: files.config().clone(), base: files.base().to_owned() });
        self.touch();
        Ok(())
    }

    /// Reads and applies the adapter in `dir` (see [`Policy::apply_adapter`]).
    pub fn load_adapter(&mut self, dir: &Path) -> Result<(), PolicyError> {
        self.apply_adapter(&AdapterFiles::read(dir)?)
    }

    /// Writes the adapter as PEFT does, plus the base's fingerprint. Nothing is written without
    /// adapters.
    pub fn save_adapter(&self, dir: &Path) -> Result<(), PolicyError> {
        let Some(adapter) = &self.adapter else { return Ok(()) };
        let modules = self.model.lora().map(|l| l.modules.clone()).unwrap_or_default();
        let mut named: Vec<(String, Tensor)> =
            adapter.vs.variables().into_iter().map(|(n, t)| (format!("{PEFT_PREFIX}{n}"), t)).collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        std::fs::create_dir_all(dir).map_err(|e| PolicyError::io(dir, e))?;
        let weights = dir.join(ADAPTER_WEIGHTS);
        checkpoint::write_safetensors(&weights, &named)?;
        checkpoint::write_json(&dir.join(ADAPTER_CONFIG), &adapter.config.peft_json(&modules, &adapter.base))?;
        checkpoint::write_json(
            &dir.join(ADAPTER_BASE),
            &serde_json::json!({ "base_fingerprint": self.base_fingerprint(), "step": self.state().step }),
        )
    }

    /// Writes the model with the adapters folded into its weights, in Hugging Face's layout (no
    /// adapter files: it loads anywhere as a plain model). Without adapters, [`Policy::save`].
    pub fn save_merged(&self, dir: &Path) -> Result<(), PolicyError> {
        self.save_weights(dir, &self.model.merged_weights())
    }

    /// A fingerprint of the base an adapter belongs to: the architecture, the tokenizer and a
    /// strided sample of every base weight (rounded to bf16, so it does not depend on the
    /// precision the base was loaded in).
    pub fn base_fingerprint(&self) -> String {
        let mut hasher = blake3::Hasher::new();
        hasher.update(format!("{:?}", self.model.spec()).as_bytes());
        hasher.update(self.tokenizer.hash().as_bytes());
        let mut variables: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        variables.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, var) in variables {
            let sample = tch::no_grad(|| {
                let flat = var.flatten(0, -1);
                let stride = (flat.numel() as i64 / 1024).max(1);
                flat.slice(0, 0, None, stride).to_kind(Kind::BFloat16).to_kind(Kind::Float).to_device(tch::Device::Cpu)
            });
            hasher.update(name.as_bytes());
            for v in Vec::<f32>::try_from(&sample).unwrap_or_default() {
                hasher.update(&v.to_le_bytes());
            }
        }
        hasher.finalize().to_hex().to_string()
    }
}
