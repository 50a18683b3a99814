//! The counters a watcher polls to learn that the graph changed.

use serde::{Deserialize, Serialize};

use crate::{Registry, RegistryError};

/// What changes when the graph does: a watcher compares two of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Activity {
    /// Tool list changes (added, updated, merged, removed).
    pub generation: i64,
    /// Calls recorded and plan edges added or strengthened.
    pub activity: i64,
}

impl Registry {
    /// Counters that move when tools, calls or edges change (one read).
    pub fn activity(&self) -> Result<Activity, RegistryError> {
        let mut stmt = self.conn.prepare_cached("SELECT name, value FROM counters")?;
        let mut activity = Activity::default();
        for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
            let (name, value) = row?;
            match name.as_str() {
                "generation" => activity.generation = value,
                "activity" => activity.activity = value,
                _ => {}
            }
        }
        Ok(activity)
    }
}
