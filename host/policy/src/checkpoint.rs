//! Checkpoints on disk: Hugging Face's directory layout (`config.json`, `model.safetensors` or
//! sharded `model-*.safetensors` with their index, the tokenizer's files) plus
//! `toolsmith-state.json`. Reading and writing the weights happens here; what a policy is made of
//! is [`crate::Policy`]'s.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::Tensor;
use tch::nn::VarStore;

use crate::PolicyError;
use crate::models::ModelConfig;
use crate::precision::Precision;
use crate::tokenizer::Tokenizer;

/// Toolsmith's file in a checkpoint directory (see [`PolicyState`]).
pub const STATE_FILE: &str = "toolsmith-state.json";
const STATE_FORMAT: u32 = 1;

/// Toolsmith's part of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyState {
    /// The version of this file's layout.
    pub format: u32,
    /// The model family (`qwen2`, `llama`), as `config.json`'s `model_type` names it.
    pub architecture: String,
    /// Optimizer steps taken so far.
    pub step: u64,
    /// BLAKE3 of `tokenizer.json`: a checkpoint paired with another tokenizer is refused.
    pub tokenizer_hash: String,
    /// Optimizer state file, relative to the checkpoint directory, when a trainer saved one.
    pub optimizer_state: Option<String>,
    /// The precision the weights were loaded (or trained) in.
    pub precision: Precision,
    /// The number of values in the base's weights.
    pub parameters: i64,
    /// A copy of `config.json`, so the state alone says what model it belongs to.
    pub config: Value,
}

impl PolicyState {
    /// The state of a model that has not been trained by Toolsmith yet.
    pub(crate) fn fresh(
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

/// The state saved in `dir`, if there is one; refused when it was saved with another tokenizer
/// than `tokenizer`.
pub(crate) fn read_state(dir: &Path, tokenizer: &Tokenizer) -> Result<Option<PolicyState>, PolicyError> {
    let state_path = dir.join(STATE_FILE);
    if !state_path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&state_path).map_err(|e| PolicyError::io(&state_path, e))?;
    let state: PolicyState =
        serde_json::from_str(&text).map_err(|e| PolicyError::checkpoint(&state_path, format!("invalid state: {e}")))?;
    if state.tokenizer_hash != tokenizer.hash() {
        return Err(PolicyError::checkpoint(
            dir,
            "tokenizer.json is not the tokenizer this checkpoint was trained with (hash differs)",
        ));
    }
    Ok(Some(state))
}

/// The number of values in every variable of `vs`.
pub(crate) fn count_parameters(vs: &VarStore) -> i64 {
    vs.variables().values().map(Tensor::numel).map(|n| n as i64).sum()
}

/// Copies every variable from the checkpoint's safetensors file(s), checking names and shapes.
pub(crate) fn load_weights(vs: &VarStore, dir: &Path, tied: bool) -> Result<(), PolicyError> {
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

/// Where a file is written before it is renamed to `path`.
pub(crate) fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    path.with_file_name(name)
}

/// Renames `from` to `to`, an error naming `to`.
pub(crate) fn rename(from: &Path, to: &Path) -> Result<(), PolicyError> {
    std::fs::rename(from, to).map_err(|e| PolicyError::io(to, e))
}

/// Writes `bytes` to `path` through [`partial_path`], so a crash never leaves half a file.
pub(crate) fn write_bytes(path: &Path, bytes: &[u8]) -> Result<(), PolicyError> {
    let partial = partial_path(path);
    std::fs::write(&partial, bytes).map_err(|e| PolicyError::io(&partial, e))?;
    rename(&partial, path)
}

/// Writes `value` to `path`, pretty-printed, as [`write_bytes`] does.
pub(crate) fn write_json(path: &Path, value: &Value) -> Result<(), PolicyError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| PolicyError::Config(e.to_string()))?;
    text.push('\n');
    write_bytes(path, text.as_bytes())
}

/// Writes `named` (in that order) as a safetensors file at `path`, as [`write_bytes`] does.
pub(crate) fn write_safetensors(path: &Path, named: &[(String, Tensor)]) -> Result<(), PolicyError> {
    let partial = partial_path(path);
    Tensor::write_safetensors(named, &partial).map_err(|e| PolicyError::checkpoint(&partial, e.to_string()))?;
    rename(&partial, path)
}
