//! `toolsmith tools doctor`: checks of the database, its stored values and the search index.

use serde::Serialize;
use toolsmith_contract::Manifest;

use super::Registry;
use super::blobs::blob_hash;
use crate::RegistryError;
use crate::embed;
use crate::formats::manifest_problem;

/// What `toolsmith tools doctor` found; `problems` empty means healthy.
#[derive(Debug, Clone, Serialize, Default)]
pub struct DoctorReport {
    /// What was checked, in order.
    pub checks: Vec<String>,
    /// What is wrong, each with what to do where there is something.
    pub problems: Vec<String>,
}

impl Registry {
    /// Checks the database (`PRAGMA integrity_check`, foreign keys, stored manifests and vectors)
    /// and that the search index holds exactly the registry's tools.
    pub fn doctor(&mut self) -> Result<DoctorReport, RegistryError> {
        let mut report = DoctorReport::default();
        self.check_sqlite(&mut report)?;
        self.check_tool_rows(&mut report)?;
        self.check_blobs(&mut report)?;
        self.check_index(&mut report)?;
        Ok(report)
    }

    /// SQLite's own integrity check and the foreign keys.
    fn check_sqlite(&self, report: &mut DoctorReport) -> Result<(), RegistryError> {
        let integrity: Vec<String> = {
            let mut stmt = self.conn.prepare("PRAGMA integrity_check")?;
            stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?
        };
        if integrity != ["ok"] {
            report.problems.extend(integrity.into_iter().map(|l| format!("integrity_check: {l}")));
        }
        report.checks.push("SQLite integrity_check".into());
        let fk: i64 = self.conn.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| r.get(0))?;
        if fk > 0 {
            report.problems.push(format!("{fk} rows break foreign keys"));
        }
        report.checks.push("foreign keys".into());
        Ok(())
    }

    /// Every tool's stored manifest parses and its embedding is whole.
    fn check_tool_rows(&self, report: &mut DoctorReport) -> Result<(), RegistryError> {
        let mut stmt = self.conn.prepare("SELECT name, manifest, embedding FROM tools")?;
        let mut rows = stmt.query([])?;
        let mut names = 0;
        while let Some(row) = rows.next()? {
            names += 1;
            let name: String = row.get(0)?;
            let manifest: String = row.get(1)?;
            match Manifest::from_json(&manifest) {
                Err(e) => report.problems.push(format!("`{name}`: stored manifest is invalid: {e}")),
                // Rows written before schemas were checked whole (or by hand) may hold a schema
                // that is no JSON Schema, or examples that their schemas refuse.
                Ok(m) => {
                    if let Some((pointer, message)) = manifest_problem(&m, "") {
                        report.problems.push(format!("`{name}`: at {pointer}: {message}"));
                    }
                }
            }
            let embedding: Option<Vec<u8>> = row.get(2)?;
            if embedding.as_ref().is_none_or(|e| e.len() != embed::DIM * 4) {
                report
                    .problems
                    .push(format!("`{name}`: no {}-d embedding (run `toolsmith tools reindex`)", embed::DIM));
            }
        }
        report.checks.push(format!("{names} manifests (schemas against the JSON Schema meta-schema, examples against their schemas) and embeddings"));
        Ok(())
    }

    /// Every blob a tool names is there, and every blob matches its hash.
    fn check_blobs(&self, report: &mut DoctorReport) -> Result<(), RegistryError> {
        let missing_blobs: i64 = self.conn.query_row(
            "SELECT count(*) FROM tools WHERE blob_hash IS NOT NULL AND blob_hash NOT IN (SELECT hash FROM blobs)",
            [],
            |r| r.get(0),
        )?;
        if missing_blobs > 0 {
            report.problems.push(format!("{missing_blobs} tools point to missing blobs"));
        }
        let mut stmt = self.conn.prepare("SELECT hash, bytes FROM blobs")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let hash: String = row.get(0)?;
            let bytes: Vec<u8> = row.get(1)?;
            if blob_hash(&bytes) != hash {
                report.problems.push(format!("blob {hash} does not match its content"));
            }
        }
        report.checks.push("blob hashes".into());
        Ok(())
    }

    /// The search index holds exactly the registry's tools (after bringing it up to date).
    fn check_index(&mut self, report: &mut DoctorReport) -> Result<(), RegistryError> {
        self.sync()?;
        if let Some(bm25) = &self.bm25 {
            let mut indexed = bm25.ids()?;
            indexed.sort_unstable();
            let mut stmt = self.conn.prepare("SELECT id FROM tools ORDER BY id")?;
            let ids: Vec<i64> = stmt.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
            if indexed != ids {
                report.problems.push(format!(
                    "search index holds {} documents for {} tools (run `toolsmith tools reindex`)",
                    bm25.num_docs(),
                    ids.len()
                ));
            }
            report.checks.push("search index matches the tools".into());
        }
        Ok(())
    }
}
