//! Choosing a node for a request: fewest requests in flight, preferring nodes that have the
//! model loaded, with prefix affinity so requests sharing a leading prompt meet the same prefix
//! cache while that node's load allows.
//!
//! Affinity is rendezvous hashing (highest hash of prefix key and node id wins): it needs no
//! shared state, and when a node leaves only the prefixes it owned move.

use crate::nodes::LiveNode;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

/// A node without the model loaded must load it first (seconds): count it as this many requests.
const NOT_LOADED_PENALTY: u32 = 2;
/// The affinity node is kept while its cost is within this of the cheapest node.
const AFFINITY_SLACK: u32 = 2;
/// Bytes of leading prompt that make the affinity key (a shared system prompt is longer).
pub const AFFINITY_PREFIX_BYTES: usize = 1024;

/// The affinity key of a prompt: model plus its leading bytes.
pub fn affinity_key(model: &str, leading_prompt: &str) -> u64 {
    let mut end = leading_prompt.len().min(AFFINITY_PREFIX_BYTES);
    while !leading_prompt.is_char_boundary(end) {
        end -= 1;
    }
    let mut h = DefaultHasher::new();
    model.hash(&mut h);
    leading_prompt[..end].hash(&mut h);
    h.finish()
}

fn cost(node: &LiveNode, model: &str) -> u32 {
    let loaded = node.model(model).is_some_and(|m| m.loaded);
    node.outstanding() + if loaded { 0 } else { NOT_LOADED_PENALTY }
}

fn rendezvous(key: u64, node: &LiveNode) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    node.id.hash(&mut h);
    h.finish()
}

/// Picks among `candidates` (all ready for `model`), skipping `tried` unless nothing else is left.
pub fn choose(
    candidates: &[Arc<LiveNode>],
    model: &str,
    affinity: Option<u64>,
    tried: &[String],
) -> Option<Arc<LiveNode>> {
    let fresh: Vec<&Arc<LiveNode>> = candidates.iter().filter(|n| !tried.contains(&n.id)).collect();
    let pool: Vec<&Arc<LiveNode>> = if fresh.is_empty() { candidates.iter().collect() } else { fresh };
    let cheapest = pool.iter().map(|n| cost(n, model)).min()?;
    if let Some(key) = affinity {
        let owner = pool.iter().max_by_key(|n| rendezvous(key, n)).expect("pool is not empty");
        if cost(owner, model) <= cheapest + AFFINITY_SLACK {
            return Some((*owner).clone());
        }
    }
    // Ties go to the node with the fewest in flight, then by name for determinism.
    pool.iter().min_by(|a, b| cost(a, model).cmp(&cost(b, model)).then(a.name.cmp(&b.name))).map(|n| (*n).clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::tests::{heartbeat, registration};
    use crate::nodes::NodeTable;
    use llmr_cluster::ModelState::Ready;
    use std::time::Duration;

    fn table(loaded: &[bool]) -> (NodeTable, Vec<Arc<LiveNode>>) {
        let t = NodeTable::new(Duration::from_secs(60));
        for (i, l) in loaded.iter().enumerate() {
            let id = format!("n{i}");
            t.register(&id, registration(&id));
            t.heartbeat(&id, heartbeat(&[("m", Ready, *l)]));
        }
        let all = t.ready_for("m");
        (t, all)
    }

    #[test]
    fn least_outstanding_wins_and_loaded_nodes_are_preferred() {
        let (_t, nodes) = table(&[true, true]);
        let _busy = nodes[0].begin();
        assert_eq!(choose(&nodes, "m", None, &[]).unwrap().id, "n1");
        let (_t, nodes) = table(&[false, true]);
        let _a = nodes[1].begin();
        assert_eq!(choose(&nodes, "m", None, &[]).unwrap().id, "n1", "loaded with 1 in flight beats a cold node");
    }

    #[test]
    fn affinity_sticks_until_load_differs_and_spreads_keys() {
        let (_t, nodes) = table(&[true, true, true]);
        let key = affinity_key("m", "You are a helpful assistant. ".repeat(100).as_str());
        let first = choose(&nodes, "m", Some(key), &[]).unwrap();
        let mut guards = vec![first.begin(), first.begin()];
        assert_eq!(choose(&nodes, "m", Some(key), &[]).unwrap().id, first.id, "within the slack");
        guards.push(first.begin());
        assert_ne!(choose(&nodes, "m", Some(key), &[]).unwrap().id, first.id, "beyond it, load wins");
        drop(guards);
        let owners: std::collections::HashSet<String> = (0..64)
            .map(|i| choose(&nodes, "m", Some(affinity_key("m", &format!("prompt {i}"))), &[]).unwrap().id.clone())
            .collect();
        assert_eq!(owners.len(), 3, "different prefixes spread over every node");
    }

    #[test]
    fn tried_nodes_are_skipped_unless_nothing_else_is_left() {
        let (_t, nodes) = table(&[true, true]);
        let first = choose(&nodes, "m", None, &[]).unwrap();
        let second = choose(&nodes, "m", None, std::slice::from_ref(&first.id)).unwrap();
        assert_ne!(first.id, second.id);
        assert!(choose(&nodes, "m", None, &["n0".into(), "n1".into()]).is_some());
        assert!(choose(&[], "m", None, &[]).is_none());
    }

    #[test]
    fn affinity_key_cuts_at_a_char_boundary() {
        let s = "é".repeat(AFFINITY_PREFIX_BYTES);
        assert_eq!(affinity_key("m", &s), affinity_key("m", &(s.clone() + "tail")));
    }
}
