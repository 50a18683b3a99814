//! LoRA adapters: low-rank updates of the linear layers that train while the base stays frozen.
//!
//! The adapters live in a var store of their own, so the base's checkpoint is never touched and
//! turning them off gives back the base model (the reference of a KL penalty, with no second
//! copy). They are saved as PEFT saves them (`adapter_config.json` + `adapter_model.safetensors`
//! with `base_model.model.` names), so `peft`/`transformers` load them, plus
//! `toolsmith-adapter.json` naming the base they were trained on, so an adapter is never applied
//! to another model. Exporting folds them into the weights (`W + alpha/r * B A`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::Tensor;

use crate::PolicyError;
use crate::decoder::{LORA_MODULES, LoraSettings, lowest_of_top};

/// PEFT's file name of an adapter's configuration.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// PEFT's file name of an adapter's weights.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// Toolsmith's note of the base model an adapter belongs to.
pub const ADAPTER_BASE: &str = "toolsmith-adapter.json";
/// PEFT's prefix of adapter tensor names.
pub(crate) const PEFT_PREFIX: &str = "base_model.model.";

/// How to adapt a model with LoRA.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// Rank of each adapter. By default 16.
    pub rank: i64,
    /// The update is scaled by `alpha / rank`. By default 32.
    pub alpha: f64,
    /// Dropout on the adapters' input while training. By default 0.05.
    pub dropout: f64,
    /// Linear layers to adapt, by PEFT's names (`q_proj`, `k_proj`, `v_proj`, `o_proj`,
    /// `gate_proj`, `up_proj`, `down_proj`), or `all-linear`. By default `all-linear`.
    pub target_modules: Vec<String>,
    /// The decoder layers that get adapters, by index from 0 (PEFT's `layers_to_transform`);
    /// `null`: every layer. The backward pass stops at the lowest adapted layer, so adapters on
    /// the top layers cost what training those layers does, with optimiser state for the
    /// adapters alone. A run's `trainable_layers` sets it to the top N. By default `null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers_to_transform: Option<Vec<usize>>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            rank: 16,
            alpha: 32.0,
            dropout: 0.05,
            target_modules: vec!["all-linear".into()],
            layers_to_transform: None,
        }
    }
}

impl LoraConfig {
    /// Checks the numbers and resolves the module names; a name the model lacks is an error that
    /// lists the ones it has.
    pub fn settings(&self) -> Result<LoraSettings, PolicyError> {
        let bad = |m: String| Err(PolicyError::Config(format!("lora: {m}")));
        if self.rank < 1 {
            return bad(format!("rank must be at least 1, got {}", self.rank));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return bad(format!("alpha must be positive, got {}", self.alpha));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("dropout must be in [0, 1), got {}", self.dropout));
        }
        if self.target_modules.is_empty() {
            return bad("target_modules is empty".into());
        }
        let mut modules = Vec::new();
        for name in &self.target_modules {
            if name == "all-linear" {
                modules.extend(LORA_MODULES.iter().map(|m| m.to_string()));
            } else if LORA_MODULES.contains(&name.as_str()) {
                modules.push(name.clone());
            } else {
                return bad(format!(
                    "the model has no module {name:?} to adapt (it has {}, or all-linear)",
                    LORA_MODULES.join(", ")
                ));
            }
        }
        modules.sort_by_key(|m| LORA_MODULES.iter().position(|x| x == m));
        modules.dedup();
        let layers = match &self.layers_to_transform {
            Some(l) if l.is_empty() => return bad("layers_to_transform is empty (null adapts every layer)".into()),
            Some(l) => {
                let mut l = l.clone();
                l.sort_unstable();
                l.dedup();
                Some(l)
            }
            None => None,
        };
        Ok(LoraSettings {
            rank: self.rank,
            scale: self.alpha / self.rank as f64,
            dropout: self.dropout,
            modules,
            layers,
            enabled: true,
        })
    }

    /// [`LoraConfig::settings`], checked against a model of `layers` decoder layers.
    pub fn settings_for(&self, layers: usize) -> Result<LoraSettings, PolicyError> {
        let settings = self.settings()?;
        if let Some(&past) = settings.layers.iter().flatten().find(|&&l| l >= layers) {
            return Err(PolicyError::Config(format!(
                "lora: layers_to_transform names layer {past}, and the model's layers are 0..{layers}"
            )));
        }
        Ok(settings)
    }

    /// These settings with adapters on the top `n` of a model's `layers` decoder layers only.
    pub fn on_top_layers(&self, n: usize, layers: usize) -> Result<Self, PolicyError> {
        let lowest = lowest_of_top(n, layers)?;
        Ok(Self { layers_to_transform: Some((lowest..layers).collect()), ..self.clone() })
    }

    /// The same adaptation with `all-linear` spelled out, the modules in the model's order and
    /// the layers sorted, so two configs compare equal when they adapt the same layers the same
    /// way.
    pub fn normalized(&self) -> Result<Self, PolicyError> {
        let settings = self.settings()?;
        Ok(Self { target_modules: settings.modules, layers_to_transform: settings.layers, ..self.clone() })
    }

    /// The config PEFT writes, as PEFT reads it.
    pub(crate) fn peft_json(&self, modules: &[String], base: &str) -> Value {
        serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": modules,
            "layers_to_transform": self.layers_to_transform,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "use_rslora": false,
            "use_dora": false,
            "modules_to_save": null,
        })
    }

    /// Reads PEFT's `adapter_config.json`: the configuration and the base it names.
    fn from_peft(path: &Path) -> Result<(Self, String), PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError::io(path, e))?;
        let json: Value =
            serde_json::from_str(&text).map_err(|e| PolicyError::checkpoint(path, format!("invalid JSON: {e}")))?;
        let field = |k: &str| json.get(k).filter(|v| !v.is_null());
        if field("peft_type").and_then(Value::as_str) != Some("LORA") {
            return Err(PolicyError::checkpoint(path, "not a LoRA adapter (peft_type is not \"LORA\")"));
        }
        for unsupported in ["use_dora", "use_rslora", "fan_in_fan_out"] {
            if field(unsupported).and_then(Value::as_bool) == Some(true) {
                return Err(PolicyError::checkpoint(path, format!("{unsupported} adapters are not supported")));
            }
        }
        let number = |k: &str| {
            field(k)
                .and_then(Value::as_f64)
                .ok_or_else(|| PolicyError::checkpoint(path, format!("{k:?} is missing or not a number")))
        };
        let target_modules = match field("target_modules") {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
            _ => return Err(PolicyError::checkpoint(path, "\"target_modules\" is missing")),
        };
        // PEFT takes one index or a list.
        let index = |v: &Value| {
            v.as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .ok_or_else(|| PolicyError::checkpoint(path, format!("layers_to_transform: {v} is not a layer index")))
        };
        let layers_to_transform = match field("layers_to_transform") {
            None => None,
            Some(Value::Array(a)) => Some(a.iter().map(index).collect::<Result<Vec<_>, _>>()?),
            Some(v) => Some(vec![index(v)?]),
        };
        let config = Self {
            rank: number("r")? as i64,
            alpha: number("lora_alpha")?,
            dropout: field("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0),
            target_modules,
            layers_to_transform,
        };
        let base = field("base_model_name_or_path").and_then(Value::as_str).unwrap_or_default().to_owned();
        Ok((config, base))
    }
}

/// An adapter read from disk, not yet attached (the daemon reads it without holding the policy).
#[derive(Debug)]
pub struct AdapterFiles {
    config: LoraConfig,
    tensors: Vec<(String, Tensor)>,
    /// The base's fingerprint it was trained on, when Toolsmith wrote it.
    fingerprint: Option<String>,
    /// Where the base came from, as recorded.
    base: String,
    /// The training step the adapter was saved at, when Toolsmith wrote it.
    step: Option<u64>,
    dir: PathBuf,
}

impl AdapterFiles {
    /// Reads the adapter in `dir`.
    pub fn read(dir: &Path) -> Result<Self, PolicyError> {
        let (config, base) = LoraConfig::from_peft(&dir.join(ADAPTER_CONFIG))?;
        let weights = dir.join(ADAPTER_WEIGHTS);
        if !weights.is_file() {
            return Err(PolicyError::checkpoint(&weights, "missing adapter weights"));
        }
        let tensors = Tensor::read_safetensors(&weights)
            .map_err(|e| PolicyError::checkpoint(&weights, format!("unreadable safetensors: {e}")))?;
        let base_path = dir.join(ADAPTER_BASE);
        let mut step = None;
        let fingerprint = if base_path.is_file() {
            let text = std::fs::read_to_string(&base_path).map_err(|e| PolicyError::io(&base_path, e))?;
            let json: Value = serde_json::from_str(&text)
                .map_err(|e| PolicyError::checkpoint(&base_path, format!("invalid JSON: {e}")))?;
            step = json.get("step").and_then(Value::as_u64);
            Some(
                json.get("base_fingerprint")
                    .and_then(Value::as_str)
                    .ok_or_else(|| PolicyError::checkpoint(&base_path, "no \"base_fingerprint\""))?
                    .to_owned(),
            )
        } else {
            None
        };
        Ok(Self { config, tensors, fingerprint, base, step, dir: dir.to_owned() })
    }

    /// The configuration it was trained with.
    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    /// The training step it was saved at, when recorded.
    pub fn step(&self) -> Option<u64> {
        self.step
    }

    /// The directory it was read from.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The fingerprint of the base it was trained on, when Toolsmith wrote it.
    pub(crate) fn fingerprint(&self) -> Option<&str> {
        self.fingerprint.as_deref()
    }

    /// Where the base came from, as recorded.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// Each tensor by the name of the adapter variable it fills, checked against `expected` (the
    /// names and shapes of the adapters a model would attach): refused for a tensor of another
    /// base or of other modules, and when one is missing.
    pub(crate) fn tensors_for(
        &self,
        expected: &HashMap<String, Vec<i64>>,
    ) -> Result<HashMap<String, &Tensor>, PolicyError> {
        let dir = &self.dir;
        let mut values = HashMap::new();
        for (name, tensor) in &self.tensors {
            let Some(local) = name.strip_prefix(PEFT_PREFIX) else {
                return Err(PolicyError::checkpoint(dir, format!("{name}: not a PEFT adapter tensor name")));
            };
            // PEFT names the adapter in memory (`lora_A.default.weight`) but not on disk.
            let local = local.replace(".default.", ".");
            let Some(shape) = expected.get(&local) else {
                return Err(PolicyError::checkpoint(
                    dir,
                    format!("{name} does not fit this model: an adapter for another base or other modules"),
                ));
            };
            if *shape != tensor.size() {
                return Err(PolicyError::checkpoint(
                    dir,
                    format!(
                        "{name} has shape {:?}, this model needs {shape:?}: an adapter for another base",
                        tensor.size()
                    ),
                ));
            }
            values.insert(local, tensor);
        }
        if values.len() != expected.len() {
            return Err(PolicyError::checkpoint(
                dir,
                format!("{} of the {} adapter tensors are missing", expected.len() - values.len(), expected.len()),
            ));
        }
        Ok(values)
    }
}

/// Whether `dir` holds an adapter.
pub fn has_adapter(dir: &Path) -> bool {
    dir.join(ADAPTER_CONFIG).is_file()
}
