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
    pub fn model_objects(&self) -> Vec<ModelObject> {
        let mut out: Vec<ModelObject> =
            self.registered().iter().map(|m| ModelObject::new(m.name.clone(), m.registered_at)).collect();
        for name in self.nodes.reported_models() {
            if !out.iter().any(|m| m.id == name) {
                out.push(ModelObject::new(name, self.started_unix));
            }
        }
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
