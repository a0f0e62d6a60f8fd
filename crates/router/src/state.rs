//! The router's shared state: what every handler reads, and the few things that change it.
//! It knows nothing of the handlers (they take it as `State<Arc<RouterState>>`).

use crate::config::RouterConfig;
use crate::db::{Db, DbError};
use crate::keys::KeyRing;
use crate::nodes::NodeTable;
use crate::registration::Registrar;
use anyhow::{Context, Result};
use llmr_cluster::ModelManifest;
use llmr_openai::ModelObject;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub struct RouterState {
    pub config: RouterConfig,
    pub db: Db,
    pub keys: KeyRing,
    pub nodes: NodeTable,
    pub registrar: Registrar,
    /// Pooled keep-alive connections to the nodes.
    pub http: reqwest::Client,
    /// The registered models, read from the database at start and after every change.
    registered: RwLock<Arc<Vec<ModelManifest>>>,
    /// Bumped by every registration or deletion; heartbeats carry it so nodes re-sync then.
    models_version: AtomicU64,
    pub started_unix: u64,
    /// Set by `llmr serve`: the node running in this process.
    embedded: OnceLock<EmbeddedNode>,
}

/// What a router serving one in-process node (`llmr serve`) adds to its `/health` and `/metrics`.
pub struct EmbeddedNode {
    /// Refreshes the node's gauges (the recorder is shared, so the router's render shows them).
    pub refresh_metrics: Box<dyn Fn() + Send + Sync>,
    /// The node's `/health` fields, merged into the router's.
    pub health: Box<dyn Fn() -> serde_json::Value + Send + Sync>,
}

impl RouterState {
    /// Opens (creating and migrating) the database and loads keys and registered models.
    pub fn open(config: RouterConfig) -> Result<RouterState> {
        let db = Db::open(&config.db_path).with_context(|| format!("opening {}", config.db_path.display()))?;
        let keys = KeyRing::with_fixed(&db, &config.fixed_keys)?;
        let registered = RwLock::new(Arc::new(db.models()?));
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .context("building the HTTP client")?;
        Ok(RouterState {
            registrar: Registrar::new(config.hub_endpoint.clone(), config.hf_token.clone()),
            nodes: NodeTable::new(config.heartbeat_timeout),
            config,
            db,
            keys,
            http,
            registered,
            models_version: AtomicU64::new(unix_now()),
            started_unix: unix_now(),
            embedded: OnceLock::new(),
        })
    }

    pub fn registered(&self) -> Arc<Vec<ModelManifest>> {
        self.registered.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn models_version(&self) -> u64 {
        self.models_version.load(Ordering::Relaxed)
    }

    /// Re-reads the registered models after a change and tells the nodes (through the version).
    pub fn models_changed(&self) -> Result<(), DbError> {
        let models = Arc::new(self.db.models()?);
        *self.registered.write().unwrap_or_else(|p| p.into_inner()) = models;
        self.models_version.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Models a client can ask for: registered ones and those some node serves from its own store.
    /// Each with what it serves: as the nodes serving it report it, else what a speech format
    /// says alone (a text format's capabilities wait for a node to read its files).
    pub fn model_objects(&self) -> Vec<ModelObject> {
        let mut reported = self.nodes.reported_capabilities();
        let mut out: Vec<ModelObject> = self
            .registered()
            .iter()
            .map(|m| {
                let capabilities = match reported.remove(&m.name) {
                    Some(c) if !c.is_empty() => c,
                    _ => m.format.speech_capability().map(|c| vec![c.to_string()]).unwrap_or_default(),
                };
                ModelObject::new(m.name.clone(), m.registered_at).with_capabilities(capabilities)
            })
            .collect();
        out.extend(
            reported.into_iter().map(|(name, c)| ModelObject::new(name, self.started_unix).with_capabilities(c)),
        );
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    pub fn is_known_model(&self, name: &str) -> bool {
        self.registered().iter().any(|m| m.name == name) || self.nodes.reported_models().iter().any(|m| m == name)
    }

    /// The node running in this process, when there is one.
    pub fn embedded(&self) -> Option<&EmbeddedNode> {
        self.embedded.get()
    }

    /// Makes `/health` and `/metrics` cover the node running in this process (the first call wins).
    pub(crate) fn embed(&self, node: EmbeddedNode) {
        let _ = self.embedded.set(node);
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::tests::manifest;
    use crate::nodes::tests::{heartbeat, registration};
    use llmr_cluster::{ModelFormat, ModelState};

    fn capabilities(state: &RouterState) -> Vec<(String, Vec<String>)> {
        state.model_objects().into_iter().map(|m| (m.id, m.capabilities)).collect()
    }

    #[test]
    fn listed_models_carry_what_their_nodes_report_they_serve_else_what_a_speech_format_says() {
        let dir = tempfile::tempdir().unwrap();
        let state = RouterState::open(RouterConfig::new(dir.path().join("router.db"))).unwrap();
        state.db.insert_model(&manifest("chat")).unwrap();
        state.db.insert_model(&ModelManifest { format: ModelFormat::Ggml, ..manifest("whisper") }).unwrap();
        state.models_changed().unwrap();
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // No node yet: a speech format says what it serves, a GGUF could be chat or embeddings.
        assert_eq!(capabilities(&state), [("chat".to_string(), vec![]), ("whisper".to_string(), strings(&["asr"]))]);
        // Two nodes, one reporting vision besides text for the same model, one a model of its own.
        state.nodes.register("a", registration("a"));
        state.nodes.register("b", registration("b"));
        let mut a = heartbeat(&[("chat", ModelState::Ready, true), ("own", ModelState::Ready, false)]);
        a.models[0].capabilities = strings(&["text"]);
        a.models[1].capabilities = strings(&["embedding"]);
        let mut b = heartbeat(&[("chat", ModelState::Ready, false), ("whisper", ModelState::Failed, false)]);
        b.models[0].capabilities = strings(&["text", "vision"]);
        b.models[1].capabilities = strings(&["tts"]); // not ready: not believed
        assert!(state.nodes.heartbeat("a", a) && state.nodes.heartbeat("b", b));
        assert_eq!(
            capabilities(&state),
            [
                ("chat".to_string(), strings(&["text", "vision"])),
                ("own".to_string(), strings(&["embedding"])),
                ("whisper".to_string(), strings(&["asr"])),
            ]
        );
    }
}
