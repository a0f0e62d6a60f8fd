//! The router as a value: its configuration, shared state, and axum application.

use crate::db::{Db, DbError};
use crate::keys::KeyRing;
use crate::nodes::NodeTable;
use crate::registration::Registrar;
use crate::{admin, auth, gateway, metrics as m};
use anyhow::{Context, Result};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Json;
use llmr_cluster::ModelManifest;
use llmr_openai::ApiError;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// SQLite file (default `~/.llmr/router.db`).
    pub db_path: PathBuf,
    /// `false` only for a loopback-only router (`llmr serve` without a key, tests).
    pub require_auth: bool,
    /// The specs make GPUs a requirement for nodes; CPU nodes are an explicit fallback.
    pub allow_cpu_nodes: bool,
    pub heartbeat_interval: Duration,
    /// Silent this long: unhealthy (no traffic) until the next heartbeat.
    pub heartbeat_timeout: Duration,
    pub body_limit: usize,
    /// Hugging Face compatible hub for registrations (`HF_ENDPOINT`).
    pub hub_endpoint: String,
    pub hf_token: Option<String>,
    /// Process-only keys (secret, name, scopes), e.g. `llmr serve --api-key` and the embedded
    /// node's token.
    pub fixed_keys: Vec<(String, String, Vec<crate::keys::Scope>)>,
}

impl RouterConfig {
    pub fn new(db_path: PathBuf) -> Self {
        RouterConfig {
            db_path,
            require_auth: true,
            allow_cpu_nodes: false,
            heartbeat_interval: Duration::from_secs(2),
            heartbeat_timeout: Duration::from_secs(6),
            body_limit: 16 << 20,
            hub_endpoint: llmr_hub::endpoint_from_env(),
            hf_token: llmr_hub::token_from_env(),
            fixed_keys: Vec::new(),
        }
    }

    pub fn default_db_path() -> Option<PathBuf> {
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".llmr").join("router.db"))
    }
}

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
    embedded: std::sync::OnceLock<EmbeddedNode>,
}

/// What a router serving one in-process node (`llmr serve`) adds to its `/health` and `/metrics`.
pub struct EmbeddedNode {
    /// Refreshes the node's gauges (the recorder is shared, so the router's render shows them).
    pub refresh_metrics: Box<dyn Fn() + Send + Sync>,
    /// The node's `/health` fields, merged into the router's.
    pub health: Box<dyn Fn() -> serde_json::Value + Send + Sync>,
}

impl RouterState {
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
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `ApiError` as an HTTP response.
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> Self {
        HttpError(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let e = self.0;
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, [(header::CONTENT_TYPE, "application/json")], e.to_json()).into_response();
        if let Some(secs) = e.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

pub struct Router {
    state: Arc<RouterState>,
}

impl Router {
    /// Opens (creating and migrating) the database and loads keys and registered models.
    pub fn open(config: RouterConfig) -> Result<Router> {
        let db = Db::open(&config.db_path).with_context(|| format!("opening {}", config.db_path.display()))?;
        let keys = KeyRing::with_fixed(&db, &config.fixed_keys)?;
        let registered = RwLock::new(Arc::new(db.models()?));
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .context("building the HTTP client")?;
        m::install();
        let state = RouterState {
            registrar: Registrar::new(config.hub_endpoint.clone(), config.hf_token.clone()),
            nodes: NodeTable::new(config.heartbeat_timeout),
            config,
            db,
            keys,
            http,
            registered,
            models_version: AtomicU64::new(unix_now()),
            started_unix: unix_now(),
            embedded: std::sync::OnceLock::new(),
        };
        Ok(Router { state: Arc::new(state) })
    }

    pub fn state(&self) -> &Arc<RouterState> {
        &self.state
    }

    /// Makes `/health` and `/metrics` cover the node running in this process (once).
    pub fn embed_node(&self, node: EmbeddedNode) {
        let _ = self.state.embedded.set(node);
    }

    pub fn app(&self) -> axum::Router {
        let s = self.state.clone();
        let v1 = axum::Router::new()
            .route("/chat/completions", post(gateway::chat))
            .route("/completions", post(gateway::completions))
            .route("/embeddings", post(gateway::embeddings))
            .route("/models", get(gateway::list_models))
            .route("/models/{*id}", get(gateway::get_model))
            .route_layer(middleware::from_fn_with_state(s.clone(), auth::api));
        let node_calls = axum::Router::new()
            .route("/nodes", post(admin::register_node))
            .route("/nodes/{id}/heartbeat", post(admin::heartbeat))
            .route("/models", get(admin::list_manifests))
            .route("/models/registry/{*path}", get(admin::manifest))
            .route_layer(middleware::from_fn_with_state(s.clone(), auth::node));
        let admin_calls = axum::Router::new()
            .route("/models", post(admin::register_model))
            .route("/models/{*name}", delete(admin::delete_model))
            .route("/nodes", get(admin::list_nodes))
            .route("/nodes/{id}", delete(admin::delete_node))
            .route("/keys", get(admin::list_keys).post(admin::create_key))
            .route("/keys/{id}", delete(admin::revoke_key))
            .route_layer(middleware::from_fn_with_state(s.clone(), auth::admin));
        axum::Router::new()
            .nest("/v1", v1)
            .nest("/v0", node_calls.merge(admin_calls))
            .route("/health", get(health))
            .route("/metrics", get(metrics))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(DefaultBodyLimit::max(s.config.body_limit))
            .with_state(s)
    }

    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        axum::serve(listener, self.app()).with_graceful_shutdown(shutdown).await?;
        Ok(())
    }
}

async fn health(State(s): State<Arc<RouterState>>) -> Response {
    let nodes = s.nodes.all();
    let healthy = nodes.iter().filter(|n| n.is_healthy(s.nodes.heartbeat_timeout)).count();
    let mut body = serde_json::json!({
        "status": "ok",
        "nodes": nodes.len(),
        "nodes_healthy": healthy,
        "models_registered": s.registered().len(),
    });
    if let (Some(node), Some(fields)) = (s.embedded.get(), body.as_object_mut()) {
        if let serde_json::Value::Object(extra) = (node.health)() {
            fields.extend(extra.into_iter().filter(|(k, _)| k != "status"));
        }
    }
    Json(body).into_response()
}

async fn metrics(State(s): State<Arc<RouterState>>) -> Response {
    if let Some(node) = s.embedded.get() {
        (node.refresh_metrics)();
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], m::render(&s.nodes)).into_response()
}

async fn not_found(req: Request) -> HttpError {
    HttpError(ApiError::not_found(format!("no route for {} {}", req.method(), req.uri().path())))
}

async fn method_not_allowed(req: Request) -> HttpError {
    HttpError(ApiError::with_status(405, format!("{} is not allowed on {}", req.method(), req.uri().path())))
}
