//! The nodes the router knows, live: registration, last heartbeat, reported load and per-model
//! readiness, and the router's own count of requests in flight to each.
//!
//! Health is two signals: heartbeats (a node silent for `heartbeat_timeout` is unhealthy until its
//! next heartbeat) and the gateway's own failures (a connection error takes the node out at once,
//! until a heartbeat arrives after the failure). The database keeps who registered; this table
//! keeps what is true now and is rebuilt from heartbeats after a router restart.

use llmr_cluster::{EngineReport, Heartbeat, ModelState, ModelStatus, NodeLoad, NodeRegistration};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

pub struct LiveNode {
    pub id: String,
    pub name: String,
    /// Base URL of the node's OpenAI API.
    pub url: String,
    /// Bearer for proxied requests (the node's per-start secret).
    pub(crate) secret: String,
    pub registration: NodeRegistration,
    state: Mutex<NodeState>,
    /// Requests the router has in flight to this node (the balancing signal; a heartbeat's load
    /// is up to an interval old).
    outstanding: AtomicU32,
}

struct NodeState {
    last_heartbeat: Instant,
    load: NodeLoad,
    models: HashMap<String, ModelStatus>,
    /// The node's plugin folders: the registration's, then the last heartbeat's.
    engines: Vec<EngineReport>,
    /// Set by a failed proxy attempt, cleared by the next heartbeat.
    failed_at: Option<Instant>,
}

/// Decrements the node's in-flight count when the proxied request (or its stream) ends.
pub struct InFlight(Arc<LiveNode>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

impl LiveNode {
    pub fn outstanding(&self) -> u32 {
        self.outstanding.load(Ordering::Relaxed)
    }

    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_healthy(&self, timeout: Duration) -> bool {
        let s = self.state();
        s.failed_at.is_none() && s.last_heartbeat.elapsed() <= timeout
    }

    /// A proxy attempt could not reach the node: stop routing to it until it heartbeats again.
    pub fn mark_failed(&self) {
        self.state().failed_at = Some(Instant::now());
    }

    pub fn model(&self, name: &str) -> Option<ModelStatus> {
        self.state().models.get(name).cloned()
    }

    /// The node's plugin folders as it last reported them.
    pub fn engines(&self) -> Vec<EngineReport> {
        self.state().engines.clone()
    }

    pub fn models(&self) -> Vec<ModelStatus> {
        let mut v: Vec<_> = self.state().models.values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn load(&self) -> NodeLoad {
        self.state().load.clone()
    }

    pub fn since_heartbeat(&self) -> Duration {
        self.state().last_heartbeat.elapsed()
    }
}

pub struct NodeTable {
    nodes: RwLock<HashMap<String, Arc<LiveNode>>>,
    pub heartbeat_timeout: Duration,
}

impl NodeTable {
    pub fn new(heartbeat_timeout: Duration) -> Self {
        NodeTable { nodes: RwLock::new(HashMap::new()), heartbeat_timeout }
    }

    /// Adds or replaces (a node that registers again restarted: its old state is void).
    pub fn register(&self, id: &str, registration: NodeRegistration) -> Arc<LiveNode> {
        let node = Arc::new(LiveNode {
            id: id.to_string(),
            name: registration.name.clone(),
            url: registration.url.trim_end_matches('/').to_string(),
            secret: registration.secret.clone(),
            state: Mutex::new(NodeState {
                last_heartbeat: Instant::now(),
                load: NodeLoad::default(),
                models: HashMap::new(),
                engines: registration.engines.clone(),
                failed_at: None,
            }),
            registration,
            outstanding: AtomicU32::new(0),
        });
        self.nodes.write().unwrap_or_else(|p| p.into_inner()).insert(id.to_string(), node.clone());
        node
    }

    /// `false` when the node is unknown (the router restarted): it must register again.
    pub fn heartbeat(&self, id: &str, hb: Heartbeat) -> bool {
        let Some(node) = self.get(id) else { return false };
        let mut s = node.state();
        s.last_heartbeat = Instant::now();
        s.failed_at = None;
        s.load = hb.load;
        s.models = hb.models.into_iter().map(|m| (m.name.clone(), m)).collect();
        if !hb.engines.is_empty() {
            s.engines = hb.engines;
        }
        true
    }

    pub fn get(&self, id: &str) -> Option<Arc<LiveNode>> {
        self.nodes.read().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    pub fn remove(&self, id: &str) -> bool {
        self.nodes.write().unwrap_or_else(|p| p.into_inner()).remove(id).is_some()
    }

    pub fn all(&self) -> Vec<Arc<LiveNode>> {
        let mut v: Vec<_> = self.nodes.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Healthy nodes with `model` ready.
    pub fn ready_for(&self, model: &str) -> Vec<Arc<LiveNode>> {
        self.all()
            .into_iter()
            .filter(|n| n.is_healthy(self.heartbeat_timeout))
            .filter(|n| n.model(model).is_some_and(|m| m.state == ModelState::Ready))
            .collect()
    }

    /// Models some node reports ready (healthy or not), for `/v1/models` and model lookup.
    pub fn reported_models(&self) -> Vec<String> {
        self.reported_capabilities().into_keys().collect()
    }

    /// Models some node reports ready, each with what the nodes say it serves (all of it: nodes
    /// running different builds may know different capabilities of one model), sorted by name.
    pub fn reported_capabilities(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for status in self.all().iter().flat_map(|n| n.models()).filter(|m| m.state == ModelState::Ready) {
            let capabilities = out.entry(status.name).or_default();
            for c in status.capabilities {
                if !capabilities.contains(&c) {
                    capabilities.push(c);
                }
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use llmr_cluster::MachineInfo;

    pub fn registration(name: &str) -> NodeRegistration {
        NodeRegistration {
            name: name.into(),
            url: format!("http://127.0.0.1:1/{name}/"),
            secret: "s".into(),
            machine: MachineInfo::default(),
            gpus: vec![],
            runtimes: vec!["LlamaCpp".into()],
            version: "0".into(),
            engines: vec![],
        }
    }

    pub fn heartbeat(models: &[(&str, ModelState, bool)]) -> Heartbeat {
        Heartbeat {
            load: NodeLoad::default(),
            models: models
                .iter()
                .map(|(n, s, l)| ModelStatus {
                    name: n.to_string(),
                    state: *s,
                    message: None,
                    loaded: *l,
                    capabilities: vec![],
                    engine: None,
                    benchmarks: vec![],
                })
                .collect(),
            gpus: vec![],
            engines: vec![],
        }
    }

    /// Records a heartbeat and returns how many nodes are ready for `m` right after it. A round
    /// that took longer than the table's heartbeat timeout proves nothing (the thread was
    /// descheduled past it) and is repeated, within a bound, so a slow machine cannot fail this.
    fn ready_right_after_heartbeat(table: &NodeTable, id: &str, models: &[(&str, ModelState, bool)]) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let round = Instant::now();
            assert!(table.heartbeat(id, heartbeat(models)));
            let ready = table.ready_for("m").len();
            if ready > 0 || round.elapsed() <= table.heartbeat_timeout {
                return ready;
            }
            assert!(Instant::now() < deadline, "no round within the timeout in 60 s");
        }
    }

    #[test]
    fn readiness_follows_heartbeats_and_failures() {
        let table = NodeTable::new(Duration::from_millis(300));
        let node = table.register("a", registration("a"));
        assert_eq!(node.url, "http://127.0.0.1:1/a");
        assert!(table.ready_for("m").is_empty(), "no heartbeat yet: no models");
        let reported = [("m", ModelState::Ready, false), ("u", ModelState::Unsupported, false)];
        assert_eq!(ready_right_after_heartbeat(&table, "a", &reported), 1);
        assert!(table.ready_for("u").is_empty());
        assert_eq!(table.reported_models(), vec!["m".to_string()]);
        node.mark_failed();
        assert!(table.ready_for("m").is_empty(), "a failed node leaves at once");
        let ready = [("m", ModelState::Ready, false)];
        assert_eq!(ready_right_after_heartbeat(&table, "a", &ready), 1, "and comes back with its next heartbeat");
        // Silent for longer than the timeout (a sleep lasts at least as long as asked): unhealthy,
        // still listed, and back with the next heartbeat.
        std::thread::sleep(table.heartbeat_timeout + Duration::from_millis(50));
        assert!(table.ready_for("m").is_empty(), "silent past the timeout: unhealthy");
        assert!(!node.is_healthy(table.heartbeat_timeout));
        assert_eq!(table.all().len(), 1);
        assert_eq!(ready_right_after_heartbeat(&table, "a", &ready), 1, "healthy again after a heartbeat");
        assert!(!table.heartbeat("zzz", heartbeat(&[])), "unknown nodes must register again");
    }

    #[test]
    fn in_flight_counts_drop_with_their_guard() {
        let table = NodeTable::new(Duration::from_secs(1));
        let node = table.register("a", registration("a"));
        let g1 = node.begin();
        let g2 = node.begin();
        assert_eq!(node.outstanding(), 2);
        drop(g1);
        drop(g2);
        assert_eq!(node.outstanding(), 0);
    }
}
