//! Capability grants: what an operator let one tool reach, bound to the code it was granted to,
//! with every change logged (who, when, what).
//!
//! A grant names the tool's blob (component or Python source) as it was when granted: replacing
//! the tool's code (a new version, an agent re-admitting a tool of the same name) leaves the
//! grants in place but inert ("stale") until an operator grants again, so new code never inherits
//! a reach its operator did not see. Secrets are stored as references (`env:VAR`, `file:PATH`),
//! never as values.

use rusqlite::{OptionalExtension, TransactionBehavior, params};
use serde::Serialize;
use toolsmith_contract::capabilities::{Grant, Grants};

use super::links::resolve;
use super::{Registry, now_ms};
use crate::RegistryError;

/// One granted capability of a tool, as `tools show` and the graph page list it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct GrantEntry {
    /// The capability's key: `http:https://host:443`, `dir:docs`, `secret:name`, `env:VAR`.
    pub capability: String,
    /// What it allows, in words (a secret's source, never its value).
    pub description: String,
    /// Who granted it.
    pub granted_by: String,
    /// Unix milliseconds.
    pub granted_at: i64,
    /// False when the tool's code changed since the grant: it is not applied until granted again.
    pub current: bool,
}

/// A tool's grants: the ones in force and every entry for display.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ToolGrants {
    /// What calls of the tool's current code may reach.
    pub active: Grants,
    /// Every entry, current or stale.
    pub entries: Vec<GrantEntry>,
}

/// One change in the grant log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantEvent {
    /// The tool's name at the time.
    pub tool: String,
    /// `grant` or `revoke`.
    pub action: String,
    /// The capability's key.
    pub capability: String,
    /// Who made the change.
    pub actor: String,
    /// Unix milliseconds.
    pub at: i64,
}

impl Registry {
    /// Grants `grants` to the tool `name` (adding to what it has; a capability granted again is
    /// replaced), bound to the tool's current code, and logs each by `actor`.
    pub fn grant(&mut self, name: &str, grants: &Grants, actor: &str) -> Result<Vec<String>, RegistryError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (id, tool) = resolve(&tx, name)?.ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        let blob: Option<String> = tx.query_row("SELECT blob_hash FROM tools WHERE id = ?1", [id], |r| r.get(0))?;
        let at = now_ms();
        let mut granted = Vec::new();
        for item in grants.items() {
            let (key, description) = (item.key(), item.describe());
            let spec = serde_json::to_string(&item).map_err(|e| RegistryError::Invalid(e.to_string()))?;
            tx.execute(
                "INSERT OR REPLACE INTO grants (tool, capability, spec, description, blob_hash, granted_by, granted_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![id, key, spec, description, blob, actor, at],
            )?;
            tx.execute(
                "INSERT INTO grant_log (tool, action, capability, actor, at) VALUES (?1, 'grant', ?2, ?3, ?4)",
                params![tool, key, actor, at],
            )?;
            granted.push(key);
        }
        tx.commit()?;
        tracing::info!(%tool, capabilities = ?granted, %actor, "granted");
        Ok(granted)
    }

    /// Revokes the capabilities `keys` (as [`GrantEntry::capability`] names them; all of the
    /// tool's when `keys` is empty) and logs each. Returns what was revoked; naming a
    /// capability the tool does not hold is an error and changes nothing.
    pub fn revoke(&mut self, name: &str, keys: &[String], actor: &str) -> Result<Vec<String>, RegistryError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (id, tool) = resolve(&tx, name)?.ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        let held: Vec<String> = {
            let mut stmt = tx.prepare("SELECT capability FROM grants WHERE tool = ?1 ORDER BY capability")?;
            stmt.query_map([id], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?
        };
        let revoked: Vec<String> = if keys.is_empty() { held.clone() } else { keys.to_vec() };
        if let Some(missing) = revoked.iter().find(|k| !held.contains(k)) {
            let list = if held.is_empty() { "none".to_owned() } else { held.join(", ") };
            return Err(RegistryError::Invalid(format!("`{tool}` holds no grant `{missing}` (it holds: {list})")));
        }
        let at = now_ms();
        for key in &revoked {
            tx.execute("DELETE FROM grants WHERE tool = ?1 AND capability = ?2", params![id, key])?;
            tx.execute(
                "INSERT INTO grant_log (tool, action, capability, actor, at) VALUES (?1, 'revoke', ?2, ?3, ?4)",
                params![tool, key, actor, at],
            )?;
        }
        tx.commit()?;
        tracing::info!(%tool, capabilities = ?revoked, %actor, "revoked");
        Ok(revoked)
    }

    /// The tool's grants: those bound to its current code are active, the rest are listed as
    /// stale. A tool with none has empty [`ToolGrants`].
    pub fn grants(&self, name: &str) -> Result<ToolGrants, RegistryError> {
        let Some((id, _)) = resolve(&self.conn, name)? else {
            return Err(RegistryError::NotFound(name.to_string()));
        };
        tool_grants(&self.conn, id)
    }

    /// The grant log, newest first (one tool's, or every tool's).
    pub fn grant_log(&self, name: Option<&str>, limit: usize) -> Result<Vec<GrantEvent>, RegistryError> {
        let mut stmt = self.conn.prepare(
            "SELECT tool, action, capability, actor, at FROM grant_log
             WHERE ?1 IS NULL OR tool = ?1 ORDER BY id DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![name, limit as i64], |r| {
            Ok(GrantEvent {
                tool: r.get(0)?,
                action: r.get(1)?,
                capability: r.get(2)?,
                actor: r.get(3)?,
                at: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

/// The grants of the tool with row id `id`: active when bound to its current blob.
pub(crate) fn tool_grants(conn: &rusqlite::Connection, id: i64) -> Result<ToolGrants, RegistryError> {
    let blob: Option<String> =
        conn.query_row("SELECT blob_hash FROM tools WHERE id = ?1", [id], |r| r.get(0)).optional()?.flatten();
    let mut stmt = conn.prepare_cached(
        "SELECT capability, spec, description, blob_hash, granted_by, granted_at FROM grants
         WHERE tool = ?1 ORDER BY capability",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, Option<String>>(3)?,
            r.get::<_, String>(4)?,
            r.get::<_, i64>(5)?,
        ))
    })?;
    let mut out = ToolGrants::default();
    for row in rows {
        let (capability, spec, description, granted_blob, granted_by, granted_at) = row?;
        let current = granted_blob == blob;
        if current {
            match serde_json::from_str::<Grant>(&spec) {
                Ok(grant) => out.active.add(grant),
                // A grant this build cannot read grants nothing.
                Err(e) => tracing::warn!(%capability, "unreadable grant ignored: {e}"),
            }
        }
        out.entries.push(GrantEntry { capability, description, granted_by, granted_at, current });
    }
    Ok(out)
}
