//! What a job may read. A job config names files (`data.files`) and a checkpoint (`init`) that
//! the daemon opens with its own rights, on behalf of whoever can reach `POST /jobs`; so every
//! path must lie in the daemon's state directory or a directory the operator allowed with
//! `--allow-dir`, and a data file must be a regular file under a size cap.
//!
//! A path that is missing and one that is forbidden get the same answer, so the API cannot be
//! used to learn which files exist. Relative paths are taken from the state directory (the
//! daemon's own working directory means nothing to a client). Paths are resolved with symlinks
//! followed, so a link inside an allowed directory that points out of it is refused, and the
//! job keeps the resolved paths it was checked with.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::JobError;

/// Where jobs may read from and how much.
#[derive(Debug, Clone)]
pub struct JobInputs {
    /// The directories paths must resolve under (the state directory first).
    roots: Vec<PathBuf>,
    /// The largest data file in bytes.
    pub max_data_bytes: u64,
}

/// 256 MiB: ten times the largest trace set the presets write, far below the memory a run has.
pub const DEFAULT_MAX_DATA_BYTES: u64 = 256 << 20;

impl JobInputs {
    /// Paths under `state` only, data files up to [`DEFAULT_MAX_DATA_BYTES`].
    pub fn new(state: &Path) -> JobInputs {
        JobInputs { roots: vec![state.to_owned()], max_data_bytes: DEFAULT_MAX_DATA_BYTES }.canonical_roots()
    }

    /// Also allows everything under `dir`.
    pub fn allow(mut self, dir: &Path) -> JobInputs {
        self.roots.push(dir.to_owned());
        self.canonical_roots()
    }

    /// With data files of at most `bytes`.
    pub fn max_data_bytes(mut self, bytes: u64) -> JobInputs {
        self.max_data_bytes = bytes;
        self
    }

    fn canonical_roots(mut self) -> JobInputs {
        for root in &mut self.roots {
            if let Ok(real) = root.canonicalize() {
                *root = real;
            }
        }
        self
    }

    /// The allowed directories, for messages and the status of a daemon.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Checks and rewrites the paths of a job config (as JSON, either trainer's): each becomes
    /// the resolved path it was checked as.
    pub fn confine(&self, config: &mut Value) -> Result<(), JobError> {
        if let Some(files) = config.pointer_mut("/data/files").and_then(Value::as_array_mut) {
            for (i, file) in files.iter_mut().enumerate() {
                let field = format!("data.files[{i}]");
                let given = file.as_str().ok_or_else(|| JobError::Invalid(format!("{field} must be a path")))?;
                let path = self.data_file(&field, given)?;
                *file = Value::String(path.to_string_lossy().into_owned());
            }
        }
        if let Some(init) = config.get_mut("init") {
            let given = init.as_str().ok_or_else(|| JobError::Invalid("init must be a name or a path".into()))?;
            // `tiny` and the policies setup fetches are names, not paths.
            if toolsmith_train::Init::parse(given).dir().is_some() {
                let dir = self.resolve("init", given)?;
                if !dir.is_dir() {
                    return Err(JobError::Invalid(format!("init: {given:?} is not a checkpoint directory")));
                }
                *init = Value::String(dir.to_string_lossy().into_owned());
            }
        }
        Ok(())
    }

    /// Checks a data file again when its job starts (it may have changed since it was queued).
    pub fn recheck(&self, config: &Value) -> Result<(), JobError> {
        let files = config.pointer("/data/files").and_then(Value::as_array).into_iter().flatten();
        for (i, file) in files.enumerate() {
            self.data_file(&format!("data.files[{i}]"), file.as_str().unwrap_or_default())?;
        }
        Ok(())
    }

    fn data_file(&self, field: &str, given: &str) -> Result<PathBuf, JobError> {
        let path = self.resolve(field, given)?;
        // The path is allowed, so what it is may be said.
        let meta = std::fs::metadata(&path).map_err(|_| self.unreadable(field, given))?;
        if !meta.is_file() {
            let what = if meta.is_dir() { "a directory" } else { "not a regular file (a FIFO, socket or device)" };
            return Err(JobError::Invalid(format!("{field}: {given:?} is {what}; data files are JSON-lines files")));
        }
        if meta.len() > self.max_data_bytes {
            return Err(JobError::Invalid(format!(
                "{field}: {given:?} is {} MiB, over this server's cap of {} MiB per data file (--max-data-mb)",
                meta.len().div_ceil(1 << 20),
                self.max_data_bytes >> 20
            )));
        }
        Ok(path)
    }

    /// `given` resolved (relative to the state directory, symlinks followed), when it exists
    /// under an allowed directory.
    fn resolve(&self, field: &str, given: &str) -> Result<PathBuf, JobError> {
        let joined = match Path::new(given) {
            p if p.is_absolute() => p.to_owned(),
            p => self.roots[0].join(p),
        };
        let real = joined.canonicalize().map_err(|_| self.unreadable(field, given))?;
        if !self.roots.iter().any(|root| real.starts_with(root)) {
            tracing::warn!(field, path = given, "refused a job path outside the allowed directories");
            return Err(self.unreadable(field, given));
        }
        Ok(real)
    }

    fn unreadable(&self, field: &str, given: &str) -> JobError {
        let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
        JobError::Invalid(format!(
            "{field}: {given:?} is not a file this server reads: paths must exist under {} \
             (relative paths start in the first; `toolsmith serve --allow-dir DIR` adds one)",
            roots.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn setup() -> (tempfile::TempDir, tempfile::TempDir, JobInputs) {
        let state = tempfile::tempdir().expect("state");
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(state.path().join("ok.jsonl"), "{}\n").expect("write");
        std::fs::write(outside.path().join("secret.jsonl"), "{}\n").expect("write");
        std::fs::create_dir(state.path().join("ckpt")).expect("mkdir");
        let inputs = JobInputs::new(state.path()).max_data_bytes(64);
        (state, outside, inputs)
    }

    fn files(paths: &[&str]) -> Value {
        json!({"data": {"files": paths}})
    }

    #[test]
    fn allowed_files_resolve_and_others_are_refused_alike() {
        let (state, outside, inputs) = setup();
        let mut config = files(&["ok.jsonl"]);
        inputs.confine(&mut config).expect("a file in the state directory");
        let real = state.path().canonicalize().expect("real").join("ok.jsonl");
        assert_eq!(config["data"]["files"][0], json!(real.to_string_lossy()));

        let secret = outside.path().join("secret.jsonl");
        let missing = state.path().join("missing.jsonl");
        let errors: Vec<String> = [secret.to_str().expect("utf-8"), missing.to_str().expect("utf-8"), "/etc/passwd"]
            .iter()
            .map(|p| inputs.confine(&mut files(&[p])).expect_err("refused").to_string())
            .collect();
        // A forbidden file and a missing one read the same, but for the path given.
        for (e, p) in errors.iter().zip([&secret, &missing]) {
            assert_eq!(
                e.replace(p.to_str().expect("utf-8"), "P"),
                errors[1].replace(missing.to_str().expect("utf-8"), "P")
            );
        }
        assert!(errors[2].contains("data.files[0]") && errors[2].contains("not a file this server reads"));
        let escape = inputs.confine(&mut files(&["../../../../../../etc/passwd"])).expect_err("refused");
        assert!(escape.to_string().contains("not a file this server reads"), "{escape}");
    }

    #[test]
    fn links_out_and_special_files_are_refused() {
        let (state, outside, inputs) = setup();
        std::os::unix::fs::symlink(outside.path().join("secret.jsonl"), state.path().join("link.jsonl"))
            .expect("symlink");
        let link = inputs.confine(&mut files(&["link.jsonl"])).expect_err("a link out");
        assert!(link.to_string().contains("not a file this server reads"), "{link}");

        let dir = inputs.confine(&mut files(&["ckpt"])).expect_err("a directory");
        assert!(dir.to_string().contains("a directory"), "{dir}");

        let fifo = state.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
        assert!(made.success());
        let fifo = inputs.confine(&mut files(&["fifo"])).expect_err("a FIFO");
        assert!(fifo.to_string().contains("not a regular file"), "{fifo}");

        std::fs::write(state.path().join("big.jsonl"), vec![b' '; 65]).expect("write");
        let big = inputs.confine(&mut files(&["big.jsonl"])).expect_err("over the cap");
        assert!(big.to_string().contains("over this server's cap"), "{big}");
    }

    #[test]
    fn init_is_a_name_or_an_allowed_directory() {
        let (state, outside, inputs) = setup();
        for name in ["tiny", "smollm2-135m"] {
            let mut config = json!({"init": name});
            inputs.confine(&mut config).expect("a name");
            assert_eq!(config["init"], name);
        }
        let mut config = json!({"init": "ckpt"});
        inputs.confine(&mut config).expect("a checkpoint in the state directory");
        assert!(
            config["init"]
                .as_str()
                .expect("path")
                .starts_with(state.path().canonicalize().expect("real").to_str().expect("utf-8"))
        );
        let out = inputs.confine(&mut json!({"init": outside.path()})).expect_err("outside");
        assert!(out.to_string().starts_with("init: "), "{out}");
        let allowed = inputs.clone().allow(outside.path());
        allowed.confine(&mut json!({"init": outside.path()})).expect("allowed with --allow-dir");
    }
}
