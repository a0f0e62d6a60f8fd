//! Engines, models and a fake router for the tests.

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use llmr_cluster::{Heartbeat, HeartbeatAck, ModelManifest, NodeRegistered, NodeRegistration};
use llmr_node::{Node, NodeConfig};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use llmr_testkit::{echo_engines, gguf_with_architecture as gguf};

pub fn node(engines: &Path, api_keys: Vec<String>) -> Node {
    Node::new(NodeConfig {
        engines_dir: engines.to_path_buf(),
        api_keys,
        cache_bytes: Some(0),
        ..NodeConfig::default()
    })
    .unwrap()
}

/// Polls `check` until it holds, or panics after `secs` seconds with `what`.
pub async fn wait_until(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub const NODE_TOKEN: &str = "node-token";
/// A valid key without the `node` scope.
pub const USER_TOKEN: &str = "user-token";

#[derive(Default)]
pub struct RouterState {
    pub registrations: Vec<NodeRegistration>,
    /// Node ids the router knows now (a restart forgets them).
    pub known: Vec<String>,
    pub heartbeats: Vec<(String, Heartbeat)>,
    pub models: Vec<ModelManifest>,
    pub models_version: u64,
    pub model_fetches: usize,
}

/// The router's `/v0` contract, with its state open to the test.
#[derive(Clone)]
pub struct FakeRouter {
    pub url: String,
    pub state: Arc<Mutex<RouterState>>,
}

type Shared = Arc<Mutex<RouterState>>;

/// The answer to a request without a valid node token, if it has none.
fn refusal(headers: &HeaderMap) -> Option<Response> {
    let token = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match token {
        Some(NODE_TOKEN) => None,
        Some(USER_TOKEN) => Some(
            (StatusCode::FORBIDDEN, Json(serde_json::json!({"error": {"message": "this key lacks the node scope"}})))
                .into_response(),
        ),
        _ => Some(
            (StatusCode::UNAUTHORIZED, Json(serde_json::json!({"error": {"message": "invalid API key"}})))
                .into_response(),
        ),
    }
}

async fn register(State(s): State<Shared>, headers: HeaderMap, Json(reg): Json<NodeRegistration>) -> Response {
    if let Some(r) = refusal(&headers) {
        return r;
    }
    let mut s = s.lock().unwrap();
    s.registrations.push(reg);
    let node_id = format!("n{}", s.registrations.len());
    s.known.push(node_id.clone());
    Json(NodeRegistered { node_id, heartbeat_interval_ms: 30 }).into_response()
}

async fn heartbeat(
    State(s): State<Shared>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
    Json(hb): Json<Heartbeat>,
) -> Response {
    if let Some(r) = refusal(&headers) {
        return r;
    }
    let mut s = s.lock().unwrap();
    if !s.known.contains(&id) {
        return (StatusCode::NOT_FOUND, Json(serde_json::json!({"error": {"message": "unknown node"}})))
            .into_response();
    }
    s.heartbeats.push((id, hb));
    Json(HeartbeatAck { models_version: s.models_version }).into_response()
}

async fn models(State(s): State<Shared>, headers: HeaderMap) -> Response {
    if let Some(r) = refusal(&headers) {
        return r;
    }
    let mut s = s.lock().unwrap();
    s.model_fetches += 1;
    Json(serde_json::json!({"object": "list", "data": s.models})).into_response()
}

impl FakeRouter {
    pub async fn start() -> FakeRouter {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(listener).await
    }

    pub async fn start_on(listener: tokio::net::TcpListener) -> FakeRouter {
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state: Shared = Arc::default();
        let app = axum::Router::new()
            .route("/v0/nodes", post(register))
            .route("/v0/nodes/{id}/heartbeat", post(heartbeat))
            .route("/v0/models", get(models))
            .with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeRouter { url, state }
    }

    /// As after a restart without its database: every node id is unknown.
    pub fn forget_nodes(&self) {
        self.state.lock().unwrap().known.clear();
    }

    pub fn set_models(&self, models: Vec<ModelManifest>) {
        let mut s = self.state.lock().unwrap();
        s.models = models;
        s.models_version += 1;
    }

    pub fn last_heartbeat(&self) -> Option<(String, Heartbeat)> {
        self.state.lock().unwrap().heartbeats.last().cloned()
    }
}

/// Writes `contents` to `path` by renaming a sibling into place, as one installs a plugin.
pub fn replace_file(path: &std::path::Path, contents: &[u8]) {
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The C template plugin (`-D` flags), built and installed into `plugin_dir` with its manifest
/// declaring `version`.
pub fn install_c_echo(plugin_dir: &std::path::Path, version: &str, flags: &[&str]) {
    let build = tempfile::tempdir().unwrap();
    let lib = llmr_testkit::build_c_template(build.path(), flags);
    let mut manifest = llmr_testkit::c_template_manifest();
    manifest["runtimes"] = serde_json::json!(["LlamaCpp"]);
    manifest["version"] = serde_json::json!(version);
    std::fs::create_dir_all(plugin_dir).unwrap();
    replace_file(&plugin_dir.join("libllmr_c_echo.so"), &std::fs::read(lib).unwrap());
    replace_file(&plugin_dir.join("manifest.json"), &serde_json::to_vec_pretty(&manifest).unwrap());
}

/// Each model in an engine worker (the real `llmr-engine-worker`), with the watchdog at `watchdog`.
pub fn in_workers(watchdog: Duration) -> llmr_node::EngineIsolation {
    llmr_node::EngineIsolation::Worker {
        command: llmr_node::WorkerCommand { program: llmr_testkit::engine_worker_program(), args: Vec::new() },
        watchdog: Some(watchdog),
    }
}

/// A GGUF model of architecture `arch` in `dir`, served as `name`.
pub fn gguf_model(dir: &Path, name: &str, arch: &str) -> llmr_model_store::ModelDescriptor {
    let path = dir.join(format!("{name}.gguf"));
    std::fs::write(&path, gguf(arch, 64)).unwrap();
    let mut desc = llmr_model_store::ModelDescriptor::from_gguf_file(&path).unwrap();
    desc.name = name.to_owned();
    desc
}

/// A node's configuration with `models`, each in an engine worker (30 s watchdog), no answer
/// cache.
pub fn worker_node_config(engines: &Path, models: Vec<llmr_model_store::ModelDescriptor>) -> NodeConfig {
    NodeConfig {
        engines_dir: engines.to_path_buf(),
        models,
        cache_bytes: Some(0),
        engine_isolation: in_workers(Duration::from_secs(30)),
        ..NodeConfig::default()
    }
}

/// Serves `node` on loopback; returns its URL, and a sender that stops it when sent to or
/// dropped.
pub async fn serve(node: Node) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(node.serve(listener, async move {
        let _ = stopped.await;
    }));
    (url, stop)
}
