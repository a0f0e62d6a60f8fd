//! Engines, models and a fake router for the tests.

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use llmr_cluster::{Heartbeat, HeartbeatAck, ModelManifest, NodeRegistered, NodeRegistration};
use llmr_node::{Node, NodeConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The echo plugin built by `cargo build -p llmr-echo-engine` (or installed in `engines/`).
fn echo_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap().parent().unwrap();
    let name = format!("{}llmr_echo_engine{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let installed = Path::new(REPO).join("engines/echo/cpu").join(&name);
    [profile.join(&name), installed].into_iter().find(|p| p.is_file()).expect(
        "the echo plugin is missing: run `cargo build -p llmr-echo-engine` before the tests (scripts/test does)",
    )
}

/// An engines folder holding the echo plugin, declared as a `LlamaCpp` runtime so that it runs
/// GGUF models of architecture `echo` from the store (and nothing else).
pub fn echo_engines(root: &Path) -> PathBuf {
    echo_engines_with_delay(root, 0)
}

/// [`echo_engines`] with `delay_ms` between generated tokens (the manifest's `token_delay_ms`).
pub fn echo_engines_with_delay(root: &Path, delay_ms: u64) -> PathBuf {
    let dir = root.join("echo").join("cpu");
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(Path::new(REPO).join("engines/echo/cpu/manifest.json")).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    manifest["runtimes"] = serde_json::json!(["LlamaCpp"]);
    manifest["parameters"]["token_delay_ms"] = serde_json::json!(delay_ms);
    manifest.as_object_mut().unwrap().remove("$schema");
    std::fs::write(dir.join("manifest.json"), serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
    let lib = echo_library();
    std::fs::copy(&lib, dir.join(lib.file_name().unwrap())).unwrap();
    root.to_path_buf()
}

pub fn node(engines: &Path, api_keys: Vec<String>) -> Node {
    Node::new(NodeConfig {
        engines_dir: engines.to_path_buf(),
        api_keys,
        cache_bytes: Some(0),
        ..NodeConfig::default()
    })
    .unwrap()
}

/// A GGUF with only `general.architecture`, followed by `data` bytes of filler.
pub fn gguf(arch: &str, data: usize) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend(1u64.to_le_bytes());
    let key = "general.architecture";
    out.extend((key.len() as u64).to_le_bytes());
    out.extend(key.as_bytes());
    out.extend(8u32.to_le_bytes());
    out.extend((arch.len() as u64).to_le_bytes());
    out.extend(arch.as_bytes());
    out.resize(out.len().div_ceil(32) * 32 + data, 0x5a);
    out
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
