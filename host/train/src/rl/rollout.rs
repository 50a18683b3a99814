//! What sampling shares with the rest of the trainer: seeds, the task pool's hash, simulated
//! tools (MTR) and dynamic sampling's choice of groups; the sampling itself is
//! [`super::sampler`]'s.

use std::sync::Arc;

use toolsmith_agent::simulate::ToolActor;
use toolsmith_agent::tools::{Executor, LocalTools};
use toolsmith_contract::ToolKind;

use crate::TrainError;
use crate::rl::sampler::TrainWorld;

/// A seed from a few numbers (SplitMix64 finaliser over their mix).
pub(super) fn mix(parts: &[u64]) -> u64 {
    let mut z = 0x9E37_79B9_7F4A_7C15_u64;
    for &p in parts {
        z ^= p.wrapping_add(0x9E37_79B9_7F4A_7C15).wrapping_add(z << 6).wrapping_add(z >> 2);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
    }
    z
}

/// BLAKE3 of the task pool (ids and questions), so a resumed run draws from the same tasks.
pub(super) fn pool_hash(worlds: &[TrainWorld]) -> String {
    let mut h = blake3::Hasher::new();
    for w in worlds {
        for t in &w.tasks {
            h.update(t.id.as_bytes());
            h.update(t.question.as_bytes());
        }
    }
    h.finalize().to_hex().to_string()
}

/// The interfaces of `real`'s tools, answered by `actor` (MTR). Tool creation is left out: its
/// result is code that ran, which a simulation cannot stand in for.
pub(super) fn simulated(real: &dyn Executor, actor: ToolActor) -> Result<Arc<dyn Executor>, TrainError> {
    let tools = LocalTools::new().with_simulator(Arc::new(actor));
    for mut manifest in real.manifests() {
        if manifest.name.as_str() == toolsmith_agent::tools::CREATE_TOOL {
            continue;
        }
        manifest.kind = ToolKind::Simulated;
        tools
            .add_simulated(manifest)
            .map_err(|e| TrainError::Agent(format!("cannot simulate `{}`: {}", e.tool, e.message)))?;
    }
    Ok(Arc::new(tools))
}

/// Dynamic sampling's choice among one draw's groups, in the order drawn: the first `room` that
/// `informative` accepts are kept; the rest, uninformative or surplus, are dropped.
pub(super) fn select_groups<G>(groups: Vec<G>, room: usize, informative: impl Fn(&G) -> bool) -> (Vec<G>, Vec<G>) {
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for g in groups {
        if kept.len() < room && informative(&g) { kept.push(g) } else { dropped.push(g) }
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::select_groups;

    #[test]
    fn dynamic_sampling_keeps_the_first_informative_groups_up_to_the_room() {
        // Odd numbers stand for groups whose rewards differ.
        let odd = |g: &u32| g % 2 == 1;
        assert_eq!(select_groups(vec![1, 2, 3, 5, 4, 7], 3, odd), (vec![1, 3, 5], vec![2, 4, 7]));
        assert_eq!(select_groups(vec![2, 4], 3, odd), (vec![], vec![2, 4]));
        assert_eq!(select_groups(vec![1, 3], 0, odd), (vec![], vec![1, 3]));
        assert_eq!(select_groups(Vec::<u32>::new(), 2, odd), (vec![], vec![]));
    }
}
