//! Reading tools back: one by name, all of them sorted, one with its surroundings.

use serde::Serialize;

use super::links::{aliases_of, neighbours, resolve};
use super::rows::{TOOL_COLUMNS, ToolRecord, tool_from_row};
use super::{Neighbour, Registry};
use crate::RegistryError;

/// A tool with its surroundings, for `toolsmith tools show`.
#[derive(Debug, Clone, Serialize)]
pub struct ToolDetails {
    /// The tool itself.
    pub tool: ToolRecord,
    /// Names merged into this tool.
    pub aliases: Vec<String>,
    /// Tools this one feeds (edges out).
    pub dependents: Vec<Neighbour>,
    /// Tools that feed this one (edges in).
    pub dependencies: Vec<Neighbour>,
    /// What an operator granted it (references only: no secret values).
    pub grants: super::ToolGrants,
    /// The latest changes to its grants, newest first.
    pub grant_log: Vec<super::GrantEvent>,
}

/// Orders for [`Registry::list`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortBy {
    /// By name.
    #[default]
    Name,
    /// Most called first.
    Usage,
    /// Highest mean reward first; tools never scored last.
    Reward,
    /// Most recently used (or created) first.
    Recency,
}

impl Registry {
    /// A tool by name or alias.
    pub fn get(&self, name: &str) -> Result<ToolRecord, RegistryError> {
        let (id, _) = resolve(&self.conn, name)?.ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        self.get_by_id(id)
    }

    pub(crate) fn get_by_id(&self, id: i64) -> Result<ToolRecord, RegistryError> {
        Ok(self.conn.query_row(&format!("SELECT {TOOL_COLUMNS} FROM tools WHERE id = ?1"), [id], tool_from_row)?)
    }

    /// Every tool, sorted.
    pub fn list(&self, sort: SortBy) -> Result<Vec<ToolRecord>, RegistryError> {
        let order = match sort {
            SortBy::Name => "name",
            SortBy::Usage => "usage_count DESC, name",
            SortBy::Reward => "CASE WHEN reward_count > 0 THEN reward_sum / reward_count END DESC NULLS LAST, name",
            SortBy::Recency => "coalesce(last_used_at, created_at) DESC, name",
        };
        let mut stmt = self.conn.prepare(&format!("SELECT {TOOL_COLUMNS} FROM tools ORDER BY {order}"))?;
        let rows = stmt.query_map([], tool_from_row)?.collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// A tool with its aliases and neighbours.
    pub fn show(&self, name: &str) -> Result<ToolDetails, RegistryError> {
        let tool = self.get(name)?;
        let aliases = aliases_of(&self.conn, tool.id)?;
        let (dependencies, dependents) = neighbours(&self.conn, tool.id)?;
        let grants = self.grants(&tool.name)?;
        let grant_log = self.grant_log(Some(&tool.name), 10)?;
        Ok(ToolDetails { tool, aliases, dependents, dependencies, grants, grant_log })
    }
}
