//! Dense embeddings: all-MiniLM-L6-v2 (384-d, mean pooled, L2-normalised) through fastembed on
//! ONNX Runtime, loaded from local files that `scripts/setup.sh` installs and verifies.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use fastembed::{InitOptionsUserDefined, Pooling, TextEmbedding, TokenizerFiles, UserDefinedEmbeddingModel};

use crate::RegistryError;

/// Width of every embedding.
pub const DIM: usize = 384;

/// Longest input in tokens; longer texts are truncated (tool descriptions are far shorter).
const MAX_TOKENS: usize = 256;

/// Where the model and ONNX Runtime live.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// Directory with `model.onnx`, `tokenizer.json`, `config.json`, `special_tokens_map.json`
    /// and `tokenizer_config.json`.
    pub model_dir: PathBuf,
    /// The ONNX Runtime shared library (>= 1.24).
    pub onnxruntime: PathBuf,
}

impl ModelFiles {
    /// `$TOOLSMITH_EMBEDDING_MODEL` and `$TOOLSMITH_ONNXRUNTIME` when set, else the files the setup
    /// script put in the data directory ([`toolsmith_contract::home`]).
    pub fn locate() -> ModelFiles {
        let deps = deps_dir();
        let model_dir =
            std::env::var_os("TOOLSMITH_EMBEDDING_MODEL").map(PathBuf::from).unwrap_or_else(|| deps.join("minilm"));
        let onnxruntime = std::env::var_os("TOOLSMITH_ONNXRUNTIME")
            .map(PathBuf::from)
            .unwrap_or_else(|| deps.join("onnxruntime/libonnxruntime.so"));
        ModelFiles { model_dir, onnxruntime }
    }
}

/// The data directory with what `scripts/setup.sh` fetched or `scripts/install.sh` copied (see
/// [`toolsmith_contract::home`]).
fn deps_dir() -> PathBuf {
    toolsmith_contract::home::data_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../.deps")).0
}

/// The sentence embedder. Loading takes about 0.4 s; share one per process.
pub struct Embedder {
    // fastembed's `embed` takes `&mut self`.
    model: Mutex<TextEmbedding>,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder").field("dim", &DIM).finish_non_exhaustive()
    }
}

/// ONNX Runtime allows one environment per process; it is built once and cloned.
static ORT_ENV: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();

fn ort_environment(library: &Path) -> Result<ort::environment::Environment, RegistryError> {
    ORT_ENV
        .get_or_init(|| {
            if !library.is_file() {
                return Err(format!("{} does not exist", library.display()));
            }
            ort::init_from(library)
                .map_err(|e| format!("cannot load {}: {e}", library.display()))?
                .with_name("toolsmith")
                .build()
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|message| RegistryError::Embedding(format!("ONNX Runtime: {message} (run ./scripts/setup.sh)")))
}

impl Embedder {
    /// Loads the model from `files`.
    pub fn load(files: &ModelFiles) -> Result<Embedder, RegistryError> {
        let environment = ort_environment(&files.onnxruntime)?;
        let read = |name: &str| {
            let path = files.model_dir.join(name);
            std::fs::read(&path).map_err(|e| {
                RegistryError::Embedding(format!("cannot read {}: {e} (run ./scripts/setup.sh)", path.display()))
            })
        };
        let tokenizer = TokenizerFiles {
            tokenizer_file: read("tokenizer.json")?,
            config_file: read("config.json")?,
            special_tokens_map_file: read("special_tokens_map.json")?,
            tokenizer_config_file: read("tokenizer_config.json")?,
        };
        // Sentence-transformers pools by mean; fastembed's user-defined default would be CLS.
        let model = UserDefinedEmbeddingModel::new(read("model.onnx")?, tokenizer).with_pooling(Pooling::Mean);
        let options = InitOptionsUserDefined::new().with_environment(environment).with_max_length(MAX_TOKENS);
        let model = TextEmbedding::try_new_from_user_defined(model, options)
            .map_err(|e| RegistryError::Embedding(format!("cannot load the model: {e}")))?;
        Ok(Embedder { model: Mutex::new(model) })
    }

    /// Loads the model from [`ModelFiles::locate`].
    pub fn load_default() -> Result<Embedder, RegistryError> {
        Embedder::load(&ModelFiles::locate())
    }

    /// Embeds `texts` (unit vectors, [`DIM`] wide).
    pub fn embed<S: AsRef<str> + Send + Sync>(&self, texts: &[S]) -> Result<Vec<Vec<f32>>, RegistryError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let mut model = toolsmith_contract::sync::lock(&self.model);
        let vectors =
            model.embed(texts, Some(texts.len().min(256))).map_err(|e| RegistryError::Embedding(e.to_string()))?;
        if let Some(bad) = vectors.iter().find(|v| v.len() != DIM) {
            return Err(RegistryError::Embedding(format!("expected {DIM}-d vectors, got {}", bad.len())));
        }
        Ok(vectors)
    }

    /// Embeds one text.
    pub fn embed_one(&self, text: &str) -> Result<Vec<f32>, RegistryError> {
        Ok(self.embed(&[text])?.remove(0))
    }
}

/// The text a tool is embedded by: its name in words, then its description.
pub fn tool_text(name: &str, description: &str) -> String {
    format!("{}: {}", name.replace('_', " "), description)
}

/// Cosine of two unit vectors (their dot product), in eight independent lanes that the compiler
/// turns into SIMD: this is the inner loop of every dense search.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Little-endian bytes of a vector, as stored in the database.
pub(crate) fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The inverse of [`to_bytes`]; `None` when the length is not a whole number of floats.
pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Vec<f32>> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}
