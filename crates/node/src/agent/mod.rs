//! The node's side of the control plane (`/v0`): the [`Agent`] registers the node with a
//! router, sends heartbeats, and syncs the router's models into the local store and the catalog.
//!
//! - [`register`]: the router client; registration retried with backoff (the router may start
//!   later); 401/403 end the agent with a clear error.
//! - [`heartbeat`]: every `heartbeat_interval_ms`, load and per-model readiness; a 404 means the
//!   router forgot the node (it restarted): register again. A new `models_version` starts a sync.
//! - [`sync`]: one task owns the sync state: fetches the manifests, starts a fetch per model
//!   (at most a few at a time), adds what is ready to the catalog, removes what the router
//!   deleted (files kept), and reports the local store's own models too.
//! - [`files`]: one model's files: downloaded (resumed, sha256-checked, renamed into place) or
//!   used in place, then described.
//! - [`machine`]: host, OS, cores, memory and GPUs.

pub mod engines;
mod files;
mod heartbeat;
pub mod machine;
mod register;
mod sync;

use crate::models::ModelManager;
use llmr_cluster::{NodeRegistered, NodeRegistration};
use register::RouterClient;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Exponential backoff between tries: `initial`, doubling up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The router's base URL (`http://router:8080`).
    pub router: String,
    /// A router API key with the `node` scope.
    pub token: String,
    /// Stable across restarts (a restarted node takes its place back).
    pub name: String,
    /// Where the router reaches this node's OpenAI API (`http://host:port`).
    pub url: String,
    /// What the router must send as Bearer on proxied requests; the node requires it on `/v1`.
    pub secret: String,
    /// The model store: synced models go to `<store>/<model name>/`; its own models are served too.
    pub store: PathBuf,
    /// Between registration tries while the router cannot be reached.
    pub backoff: Backoff,
    /// After a failed download (or a failed manifest fetch), the next try.
    pub sync_retry: Duration,
    /// Models fetched at the same time.
    pub parallel_fetches: usize,
    /// Serve and report the store's own models (`llmr serve --model X` turns it off: only the
    /// models it was given, which the catalog already holds, are reported).
    pub scan_store: bool,
}

impl AgentConfig {
    pub fn new(router: String, token: String, name: String, url: String, secret: String, store: PathBuf) -> Self {
        AgentConfig {
            router,
            token,
            name,
            url,
            secret,
            store,
            backoff: Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(30) },
            sync_retry: Duration::from_secs(60),
            parallel_fetches: 2,
            scan_store: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid router URL {url:?}: {reason}")]
    InvalidRouter { url: String, reason: String },
    #[error("the router at {router} refused the node token (HTTP {status}: {message}); {}", if *status == 401 {
        "check --token (LLMR_NODE_TOKEN): it must be a router API key"
    } else {
        "the key needs the `node` scope"
    })]
    Refused { router: String, status: u16, message: String },
    #[error("the router at {router} rejected {what} (HTTP {status}): {message}")]
    Rejected { router: String, what: &'static str, status: u16, message: String },
    #[error("the model store {}: {source}", path.display())]
    Store {
        path: PathBuf,
        #[source]
        source: llmr_model_store::StoreError,
    },
}

/// A fresh secret for `NodeRegistration::secret`: 32 random bytes, hex.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source works");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Registers a node with a router and keeps it registered, reporting and synced.
pub struct Agent {
    config: AgentConfig,
    client: RouterClient,
    models: Arc<ModelManager>,
    registration: NodeRegistration,
}

impl Agent {
    /// Describes the machine (blocking: may run `nvidia-smi`) and checks the router URL.
    pub fn new(config: AgentConfig, models: Arc<ModelManager>) -> Result<Agent, AgentError> {
        let client = RouterClient::new(&config.router, &config.token)?;
        let registration = NodeRegistration {
            name: config.name.clone(),
            url: config.url.clone(),
            secret: config.secret.clone(),
            machine: machine::machine_info(),
            gpus: models.gpus(),
            runtimes: models.runtimes(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            engines: models.engine_reports(),
        };
        Ok(Agent { config, client, models, registration })
    }

    pub fn registration(&self) -> &NodeRegistration {
        &self.registration
    }

    /// `POST /v0/nodes`, retried with backoff while the router cannot be reached; fails at once
    /// when it refuses the token (401/403) or the registration.
    pub async fn register(&self) -> Result<NodeRegistered, AgentError> {
        let registered = self.client.register_until_done(&self.registration, &self.config.backoff).await?;
        tracing::info!(router = self.client.router(), node_id = %registered.node_id, "registered");
        Ok(registered)
    }

    /// Heartbeats and model sync until a fatal error (the token is refused); never returns
    /// otherwise. Dropping the future stops both (a download in progress finishes its current
    /// file in the background, or is resumed at the next start).
    pub async fn run(&self, registered: NodeRegistered) -> Result<(), AgentError> {
        let (versions_tx, versions_rx) = watch::channel(None);
        let (reports_tx, reports_rx) = watch::channel(Vec::new());
        let syncer = sync::Syncer::new(&self.config, &self.client, self.models.clone(), reports_tx)?;
        let heartbeats = heartbeat::Heartbeats {
            client: &self.client,
            registration: &self.registration,
            backoff: &self.config.backoff,
            models: &self.models,
            reports: reports_rx,
            versions: versions_tx,
        };
        tokio::select! {
            result = heartbeats.run(registered) => result,
            result = syncer.run(versions_rx) => result,
        }
    }
}
