//! Changing the tool list by hand: merging one tool into another, removing one.

use rusqlite::{Transaction, TransactionBehavior, params};
use toolsmith_contract::Manifest;

use super::Registry;
use super::blobs::collect_blobs;
use super::links::{add_edge, resolve};
use super::rows::manifest_json;
use crate::RegistryError;

impl Registry {
    /// Merges `other` into `canonical`: every edge of `other` is redirected to `canonical` (counts
    /// and weights add up where both had the edge; edges between the two would be self-loops and
    /// are dropped), statistics add up, aliases follow, and `other` becomes an alias.
    pub fn merge(&mut self, canonical: &str, other: &str) -> Result<(), RegistryError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (keep, keep_name) =
            resolve(&tx, canonical)?.ok_or_else(|| RegistryError::NotFound(canonical.to_string()))?;
        let (gone, gone_name) = resolve(&tx, other)?.ok_or_else(|| RegistryError::NotFound(other.to_string()))?;
        if keep == gone {
            return Err(RegistryError::Invalid(format!("`{other}` is already `{keep_name}`")));
        }
        merge_into(&tx, keep, gone, &gone_name)?;
        tx.commit()?;
        tracing::info!(canonical = %keep_name, merged = %gone_name, "merged tools");
        Ok(())
    }

    /// Removes a tool, its edges and the aliases that point to it.
    pub fn remove(&mut self, name: &str) -> Result<(), RegistryError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (id, _) = resolve(&tx, name)?.ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        tx.execute("DELETE FROM tools WHERE id = ?1", [id])?;
        collect_blobs(&tx)?;
        tx.commit()?;
        Ok(())
    }
}

fn merge_into(tx: &Transaction<'_>, keep: i64, gone: i64, gone_name: &str) -> Result<(), RegistryError> {
    let edges: Vec<(i64, i64, i64, f64)> = {
        let mut stmt = tx.prepare("SELECT src, dst, count, weight FROM edges WHERE src = ?1 OR dst = ?1")?;
        stmt.query_map([gone], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect::<rusqlite::Result<_>>()?
    };
    for (src, dst, count, weight) in edges {
        let src = if src == gone { keep } else { src };
        let dst = if dst == gone { keep } else { dst };
        if src != dst {
            add_edge(tx, src, dst, count, weight)?;
        }
    }
    tx.execute(
        "UPDATE tools SET usage_count = tools.usage_count + g.usage_count, success_count = tools.success_count + g.success_count, \
         failure_count = tools.failure_count + g.failure_count, reward_sum = tools.reward_sum + g.reward_sum, \
         reward_count = tools.reward_count + g.reward_count, \
         last_used_at = nullif(max(coalesce(tools.last_used_at, 0), coalesce(g.last_used_at, 0)), 0) \
         FROM (SELECT * FROM tools WHERE id = ?2) AS g WHERE tools.id = ?1",
        params![keep, gone],
    )?;
    tx.execute(
        "INSERT INTO failures (tool, kind, count) SELECT ?1, kind, count FROM failures WHERE tool = ?2 \
         ON CONFLICT (tool, kind) DO UPDATE SET count = failures.count + excluded.count",
        params![keep, gone],
    )?;
    tx.execute("UPDATE aliases SET canonical = ?1 WHERE canonical = ?2", params![keep, gone])?;
    // Record the merge in the surviving tool's provenance.
    let manifest: String = tx.query_row("SELECT manifest FROM tools WHERE id = ?1", [keep], |r| r.get(0))?;
    if let Ok(mut m) = serde_json::from_str::<Manifest>(&manifest)
        && let Ok(parent) = toolsmith_contract::ToolName::new(gone_name)
        && !m.provenance.parents.contains(&parent)
    {
        m.provenance.parents.push(parent);
        tx.execute(
            "UPDATE tools SET manifest = ?2, parents = ?3 WHERE id = ?1",
            params![keep, manifest_json(&m), serde_json::to_string(&m.provenance.parents).unwrap_or_default()],
        )?;
    }
    tx.execute("DELETE FROM tools WHERE id = ?1", [gone])?;
    tx.execute("INSERT OR REPLACE INTO aliases (alias, canonical) VALUES (?1, ?2)", params![gone_name, keep])?;
    collect_blobs(tx)?;
    Ok(())
}
