//! Precompiled components on disk.
//!
//! Compiling a component with Cranelift takes from tens of milliseconds (a small plugin) to
//! seconds (the Python interpreter); loading a precompiled artifact by `mmap` takes about a
//! millisecond. Artifacts are keyed by the BLAKE3 hash of the component bytes (SHA-256 took 50 ms
//! on the 19 MB interpreter, longer than the load itself) and by the engine's
//! compatibility fingerprint (wasmtime version and every codegen setting), so a new wasmtime or a
//! changed setting never loads a stale artifact. Files are written to a temporary name and renamed,
//! so a crash never leaves a half-written artifact under a real key.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// Whether a load compiled the component or found it in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded a precompiled artifact.
    Hit,
    /// Compiled (and stored, when a cache directory is configured).
    Compiled,
}

/// The on-disk artifact cache. `dir == None` disables it.
#[derive(Debug, Clone)]
pub(crate) struct ArtifactCache {
    dir: Option<PathBuf>,
    fingerprint: String,
}

impl ArtifactCache {
    pub(crate) fn new(engine: &Engine, dir: Option<PathBuf>) -> Self {
        let mut hasher = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let fingerprint = format!("{:016x}", hasher.finish());
        if let Some(dir) = &dir
            && let Err(e) = create_private_dir(dir)
        {
            tracing::warn!(dir = %dir.display(), error = %e, "component cache disabled: cannot create its directory");
            return ArtifactCache { dir: None, fingerprint };
        }
        ArtifactCache { dir, fingerprint }
    }

    /// The directory artifacts live in, if caching is on.
    pub(crate) fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Loads `bytes` as a component: from the cache when a matching artifact exists, else by
    /// compiling (and then storing the artifact).
    pub(crate) fn load(&self, engine: &Engine, bytes: &[u8]) -> wasmtime::Result<(Component, CacheOutcome, String)> {
        let hash = blake3::hash(bytes).to_hex().to_string();
        let Some(dir) = &self.dir else {
            return Ok((Component::new(engine, bytes)?, CacheOutcome::Compiled, hash));
        };
        let path = dir.join(format!("{hash}-{}.cwasm", self.fingerprint));
        if path.exists() {
            // SAFETY: `deserialize_file` trusts the file to be an artifact this engine produced.
            // It is one: only `store` below writes into this private (0700) directory, under a
            // name that includes the engine fingerprint, via write-to-temp-then-rename, so a file
            // under this name is complete and compatible. wasmtime still checks the header.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => return Ok((component, CacheOutcome::Hit, hash)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "discarding unusable cached artifact");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let artifact = engine.precompile_component(bytes)?;
        if let Err(e) = store(dir, &path, &artifact) {
            tracing::warn!(path = %path.display(), error = %e, "cannot cache compiled component");
        }
        // SAFETY: `artifact` was produced just now by this engine's `precompile_component`.
        let component = unsafe { Component::deserialize(engine, &artifact)? };
        Ok((component, CacheOutcome::Compiled, hash))
    }
}

fn store(dir: &Path, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(artifact)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(()); // an existing directory keeps the permissions its owner gave it
    }
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}
