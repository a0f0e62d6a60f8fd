//! Request ids through the router over real HTTP on loopback: the id a client sends (or the one
//! the router makes) reaches the node on every attempt, comes back to the client, and names the
//! gateway's warnings. The nodes are small axum servers that record the `x-request-id` they get.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use futures_util::StreamExt;
use llmr_cluster::{Heartbeat, MachineInfo, ModelState, ModelStatus, NodeLoad, NodeRegistered, NodeRegistration};
use llmr_router::{Router, RouterConfig};
use serde_json::json;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// What every test's router logs at `warn` (the level `llmr` logs at by default), shared by the
/// tests of this file: each looks only for its own ids.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || Capture(sink.clone()))
            .init();
        buf
    })
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_lines_with(needle: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    text.lines().filter(|l| l.contains(needle)).map(String::from).collect()
}

/// A router without keys (loopback only), with its base URL.
async fn start_router() -> (String, tempfile::TempDir) {
    logs();
    let dir = tempfile::tempdir().unwrap();
    let mut config = RouterConfig::new(dir.path().join("router.db"));
    config.require_auth = false;
    config.allow_cpu_nodes = true;
    let router = Router::open(config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(router.serve(listener, std::future::pending()));
    (base, dir)
}

#[derive(Clone, Copy)]
enum Behaviour {
    Ok,
    Fail500,
    CutStream,
}

/// A node answering with `behaviour`; the returned list fills with the request ids it was sent.
async fn node(behaviour: Behaviour) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let handler = post(move |headers: HeaderMap| async move {
        let id = headers.get("x-request-id").map(|v| v.to_str().unwrap().to_owned());
        s.lock().unwrap().push(id.unwrap_or_else(|| "(none)".into()));
        match behaviour {
            Behaviour::Ok => axum::Json(json!({"object": "list", "data": []})).into_response(),
            Behaviour::Fail500 => {
                (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({"error": {"message": "engine broke"}})))
                    .into_response()
            }
            Behaviour::CutStream => {
                // One event, then the connection breaks (after the headers and the event went out).
                let chunks = futures_util::stream::iter([
                    Ok(bytes::Bytes::from_static(b"data: {\"n\":1}\n\n")),
                    Err(std::io::Error::other("node died")),
                ])
                .then(|item| async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    item
                });
                ([("content-type", "text/event-stream")], Body::from_stream(chunks)).into_response()
            }
        }
    });
    let app = axum::Router::new().route("/v1/chat/completions", handler.clone()).route("/v1/embeddings", handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// Registers a node serving `model` (ready) with the router.
async fn join(base: &str, name: &str, url: &str, model: &str) {
    let http = reqwest::Client::new();
    let registration = NodeRegistration {
        name: name.into(),
        url: url.into(),
        secret: "secret-0123456789abcdef".into(),
        machine: MachineInfo::default(),
        gpus: vec![],
        runtimes: vec!["LlamaCpp".into()],
        version: "test".into(),
        engines: vec![],
    };
    let r = http.post(format!("{base}/v0/nodes")).json(&registration).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let id = r.json::<NodeRegistered>().await.unwrap().node_id;
    let heartbeat = Heartbeat {
        load: NodeLoad::default(),
        models: vec![ModelStatus {
            name: model.into(),
            state: ModelState::Ready,
            message: None,
            loaded: true,
            capabilities: vec![],
            engine: None,
            benchmarks: vec![],
        }],
        gpus: vec![],
        engines: vec![],
    };
    let r = http.post(format!("{base}/v0/nodes/{id}/heartbeat")).json(&heartbeat).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

async fn send(base: &str, path: &str, body: serde_json::Value, id: Option<&str>) -> reqwest::Response {
    let mut req = reqwest::Client::new().post(format!("{base}{path}")).json(&body);
    if let Some(id) = id {
        req = req.header("x-request-id", id);
    }
    req.send().await.unwrap()
}

fn returned_id(r: &reqwest::Response) -> String {
    r.headers()["x-request-id"].to_str().unwrap().to_owned()
}

fn chat(model: &str, stream: bool) -> serde_json::Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream})
}

#[tokio::test]
async fn a_client_id_reaches_the_node_and_comes_back() {
    let (base, _dir) = start_router().await;
    let (url, seen) = node(Behaviour::Ok).await;
    join(&base, "a", &url, "m").await;
    let r = send(&base, "/v1/chat/completions", chat("m", false), Some("client-id-42")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(returned_id(&r), "client-id-42");
    assert_eq!(r.headers()["x-llmr-node"], "a");
    assert_eq!(*seen.lock().unwrap(), ["client-id-42"]);
}

#[tokio::test]
async fn without_a_client_id_the_client_and_the_node_get_the_same_fresh_one() {
    let (base, _dir) = start_router().await;
    let (url, seen) = node(Behaviour::Ok).await;
    join(&base, "a", &url, "m").await;
    let r = send(&base, "/v1/embeddings", json!({"model": "m", "input": "hi"}), None).await;
    assert_eq!(r.status(), 200);
    let id = returned_id(&r);
    assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    assert_eq!(*seen.lock().unwrap(), [id.as_str()]);
    let again = send(&base, "/v1/embeddings", json!({"model": "m", "input": "hi"}), None).await;
    assert_ne!(returned_id(&again), id, "every request gets its own");
}

#[tokio::test]
async fn a_retried_request_reaches_the_next_node_with_the_same_id() {
    let (base, _dir) = start_router().await;
    let (bad, bad_seen) = node(Behaviour::Fail500).await;
    let (good, good_seen) = node(Behaviour::Ok).await;
    // Embeddings have no prefix affinity: equal load goes by name, so "a" is tried first.
    join(&base, "a", &bad, "m").await;
    join(&base, "b", &good, "m").await;
    let r = send(&base, "/v1/embeddings", json!({"model": "m", "input": "hi"}), Some("retried-id-7")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(returned_id(&r), "retried-id-7");
    assert_eq!(r.headers()["x-llmr-node"], "b");
    assert_eq!(*bad_seen.lock().unwrap(), ["retried-id-7"]);
    assert_eq!(*good_seen.lock().unwrap(), ["retried-id-7"]);
    let warned = log_lines_with("request_id=retried-id-7");
    assert!(
        warned.iter().any(|l| l.contains("WARN") && l.contains("status_5xx") && l.contains("node=a")),
        "{warned:?}"
    );
}

#[tokio::test]
async fn a_stream_cut_mid_way_is_logged_with_its_request_id() {
    let (base, _dir) = start_router().await;
    let (url, _) = node(Behaviour::CutStream).await;
    join(&base, "flaky", &url, "m").await;
    let r = send(&base, "/v1/chat/completions", chat("m", true), Some("cut-id-3")).await;
    assert_eq!((r.status(), returned_id(&r)), (StatusCode::OK, "cut-id-3".to_string()));
    let text = r.text().await.unwrap();
    assert!(text.contains("failed mid-stream"), "{text}");
    let warned = log_lines_with("request_id=cut-id-3");
    assert!(
        warned.iter().any(|l| l.contains("failed mid-stream") && l.contains("node=flaky") && l.contains("model=m")),
        "{warned:?}"
    );
}

#[tokio::test]
async fn refusals_and_unknown_routes_carry_an_id_too() {
    let (base, _dir) = start_router().await;
    let r = send(&base, "/v1/chat/completions", json!({"model": "m", "messages": []}), Some("bad-req-1")).await;
    assert_eq!((r.status(), returned_id(&r)), (StatusCode::BAD_REQUEST, "bad-req-1".to_string()));
    let r = reqwest::get(format!("{base}/nowhere")).await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(returned_id(&r).len(), 32);
    let r = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(returned_id(&r).len(), 32);
    let r = reqwest::get(format!("{base}/v1/chat/completions")).await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(returned_id(&r).len(), 32);
}
