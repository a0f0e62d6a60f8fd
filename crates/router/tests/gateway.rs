//! The router over real HTTP on loopback: auth and scopes, node registration rules, routing,
//! retries, and streams cut by their node. The upstreams here are small axum servers that fail
//! on purpose (a 500, a refused connection, a stream cut mid-way): failures a real node cannot be
//! made to produce on demand. The end-to-end test with real nodes is in crates/llmr/tests/cluster.rs.

use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::post;
use llmr_cluster::{Heartbeat, MachineInfo, ModelState, ModelStatus, NodeLoad, NodeRegistered, NodeRegistration};
use llmr_router::{Router, RouterConfig, Scope};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Harness {
    base: String,
    admin: String,
    api: String,
    node: String,
    http: reqwest::Client,
    state: Arc<llmr_router::RouterState>,
    _dir: tempfile::TempDir,
}

async fn start_router(allow_cpu_nodes: bool) -> Harness {
    start_router_with(allow_cpu_nodes, Duration::from_secs(5)).await
}

async fn start_router_with(allow_cpu_nodes: bool, heartbeat_timeout: Duration) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let mut config = RouterConfig::new(dir.path().join("router.db"));
    config.allow_cpu_nodes = allow_cpu_nodes;
    config.heartbeat_interval = Duration::from_millis(100);
    config.heartbeat_timeout = heartbeat_timeout;
    let router = Router::open(config).unwrap();
    let s = router.state().clone();
    let admin = s.keys.create(&s.db, "admin", &[Scope::Admin], 0).unwrap().secret;
    let api = s.keys.create(&s.db, "app", &[Scope::Api], 0).unwrap().secret;
    let node = s.keys.create(&s.db, "nodes", &[Scope::Node], 0).unwrap().secret;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(router.serve(listener, std::future::pending()));
    Harness { base, admin, api, node, http: reqwest::Client::new(), state: s, _dir: dir }
}

/// An upstream "node": counts requests and answers with `behaviour`.
#[derive(Clone, Copy)]
enum Behaviour {
    Ok,
    Fail500,
    CutStream,
}

async fn upstream(behaviour: Behaviour) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let handler = post(move |headers: axum::http::HeaderMap| {
        let h = h.clone();
        async move {
            h.fetch_add(1, Ordering::SeqCst);
            assert_eq!(headers["authorization"], "Bearer secret-0123456789abcdef");
            match behaviour {
                Behaviour::Ok => axum::Json(json!({"object": "chat.completion", "ok": true})).into_response(),
                Behaviour::Fail500 => (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    axum::Json(json!({"error": {"message": "engine broke"}})),
                )
                    .into_response(),
                Behaviour::CutStream => {
                    // Two events, then the connection breaks (after they were flushed).
                    let chunks = futures_util::stream::unfold(0, |n| async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        match n {
                            0 | 1 => Some((Ok(bytes::Bytes::from(format!("data: {{\"n\":{}}}\n\n", n + 1))), n + 1)),
                            2 => Some((Err(std::io::Error::other("node died")), 3)),
                            _ => None,
                        }
                    });
                    ([("content-type", "text/event-stream")], Body::from_stream(chunks)).into_response()
                }
            }
        }
    });
    let app = axum::Router::new().route("/v1/chat/completions", handler.clone()).route("/v1/embeddings", handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, hits)
}

fn registration(name: &str, url: &str, gpus: bool) -> NodeRegistration {
    NodeRegistration {
        name: name.into(),
        url: url.into(),
        secret: "secret-0123456789abcdef".into(),
        machine: MachineInfo::default(),
        gpus: if gpus {
            vec![llmr_cluster::GpuInfo {
                name: "H100".into(),
                memory_total_bytes: 80 << 30,
                memory_free_bytes: 80 << 30,
            }]
        } else {
            vec![]
        },
        runtimes: vec!["LlamaCpp".into()],
        version: "test".into(),
        engines: vec![],
    }
}

fn ready(model: &str) -> Heartbeat {
    Heartbeat {
        load: NodeLoad::default(),
        models: vec![ModelStatus {
            name: model.into(),
            state: ModelState::Ready,
            message: None,
            loaded: true,
            capabilities: vec!["text".into()],
            engine: None,
            benchmarks: vec![],
        }],
        gpus: vec![],
        engines: vec![],
    }
}

impl Harness {
    async fn register(&self, reg: &NodeRegistration) -> reqwest::Response {
        self.http.post(format!("{}/v0/nodes", self.base)).bearer_auth(&self.node).json(reg).send().await.unwrap()
    }

    async fn join(&self, name: &str, url: &str, model: &str) -> String {
        let r = self.register(&registration(name, url, true)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let id = r.json::<NodeRegistered>().await.unwrap().node_id;
        self.heartbeat(&id, model).await;
        id
    }

    async fn heartbeat(&self, id: &str, model: &str) -> reqwest::StatusCode {
        let url = format!("{}/v0/nodes/{id}/heartbeat", self.base);
        self.http.post(url).bearer_auth(&self.node).json(&ready(model)).send().await.unwrap().status()
    }

    async fn chat(&self, model: &str, stream: bool) -> reqwest::Response {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream});
        self.http
            .post(format!("{}/v1/chat/completions", self.base))
            .bearer_auth(&self.api)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// Embeddings carry no prefix affinity, so node choice is by load, then by name.
    async fn embed(&self, model: &str) -> reqwest::Response {
        let body = json!({"model": model, "input": "hi"});
        self.http.post(format!("{}/v1/embeddings", self.base)).bearer_auth(&self.api).json(&body).send().await.unwrap()
    }

    async fn metrics(&self) -> String {
        self.http.get(format!("{}/metrics", self.base)).send().await.unwrap().text().await.unwrap()
    }
}

#[tokio::test]
async fn keys_and_scopes_guard_every_endpoint() {
    let h = start_router(true).await;
    let get = |path: &str, key: Option<&str>| {
        let mut r = h.http.get(format!("{}{path}", h.base));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    assert_eq!(get("/v1/models", None).await.unwrap().status(), 401);
    assert_eq!(get("/v1/models", Some("llmr_not_a_key")).await.unwrap().status(), 401);
    assert_eq!(get("/v1/models", Some(&h.api)).await.unwrap().status(), 200);
    assert_eq!(get("/v1/models", Some(&h.node)).await.unwrap().status(), 403, "a node key is not an API key");
    let r = get("/v0/nodes", Some(&h.api)).await.unwrap();
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "insufficient_scope");
    assert_eq!(get("/v0/nodes", Some(&h.admin)).await.unwrap().status(), 200);
    assert_eq!(get("/v0/models", Some(&h.node)).await.unwrap().status(), 200, "nodes read manifests");
    // A node with a wrong token cannot register.
    let r = h
        .http
        .post(format!("{}/v0/nodes", h.base))
        .bearer_auth("llmr_wrong")
        .json(&registration("n", "http://127.0.0.1:9", true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = h
        .http
        .post(format!("{}/v0/nodes", h.base))
        .bearer_auth(&h.api)
        .json(&registration("n", "http://127.0.0.1:9", true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // Keys made over the API work at once; revoked ones stop.
    let r = h
        .http
        .post(format!("{}/v0/keys", h.base))
        .bearer_auth(&h.admin)
        .json(&json!({"name": "x", "scopes": ["api"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let key = created["key"].as_str().unwrap();
    assert_eq!(get("/v1/models", Some(key)).await.unwrap().status(), 200);
    let listed = get("/v0/keys", Some(&h.admin)).await.unwrap().text().await.unwrap();
    assert!(!listed.contains(key), "listings never show secrets");
    let r = h
        .http
        .delete(format!("{}/v0/keys/{}", h.base, created["id"].as_str().unwrap()))
        .bearer_auth(&h.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(get("/v1/models", Some(key)).await.unwrap().status(), 401);
    let r = h
        .http
        .post(format!("{}/v0/keys", h.base))
        .bearer_auth(&h.admin)
        .json(&json!({"name": "x", "scopes": ["root"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn cpu_nodes_need_the_flag_and_registrations_are_checked() {
    let h = start_router(false).await;
    let r = h.register(&registration("cpu", "http://127.0.0.1:9", false)).await;
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "gpu_required");
    assert_eq!(h.register(&registration("gpu", "http://127.0.0.1:9", true)).await.status(), 200);
    let r = h.register(&registration("../evil", "http://127.0.0.1:9", true)).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "name");
    assert_eq!(h.register(&registration("n2", "file:///etc/passwd", true)).await.status(), 400);
    assert_eq!(h.heartbeat("node_unknown", "m").await, 404, "an unknown node must register again");
}

#[tokio::test]
async fn requests_are_validated_before_any_node_and_unknown_models_are_404() {
    let h = start_router(true).await;
    let (url, hits) = upstream(Behaviour::Ok).await;
    h.join("a", &url, "m").await;
    let r = h
        .http
        .post(format!("{}/v1/chat/completions", h.base))
        .bearer_auth(&h.api)
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "top_p");
    let r = h
        .http
        .post(format!("{}/v1/completions", h.base))
        .bearer_auth(&h.api)
        .json(&json!({"model": "m", "prompt": ""}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(hits.load(Ordering::SeqCst), 0, "no node saw a bad request");
    let r = h.chat("nope", false).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "model_not_found");
    let r = h.chat("m", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-llmr-node"], "a");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let models: Value =
        h.http.get(format!("{}/v1/models", h.base)).bearer_auth(&h.api).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "m");
    assert_eq!(models["data"][0]["capabilities"], json!(["text"]), "as the node reported it");
}

#[tokio::test]
async fn a_5xx_or_a_dead_node_is_retried_on_another_node() {
    let h = start_router(true).await;
    let (bad, bad_hits) = upstream(Behaviour::Fail500).await;
    let (good, good_hits) = upstream(Behaviour::Ok).await;
    // A dead node: a port nothing listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    h.join("bad", &bad, "m").await;
    h.join("dead", &dead, "m").await;
    h.join("good", &good, "m").await;
    for _ in 0..6 {
        let r = h.embed("m").await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-llmr-node"], "good");
    }
    assert_eq!(good_hits.load(Ordering::SeqCst), 6);
    assert!(bad_hits.load(Ordering::SeqCst) >= 1);
    let metrics = h.metrics().await;
    assert!(metrics.contains("llmr_router_retries_total{node=\"dead\",reason=\"connect\"}"), "{metrics}");
    assert!(metrics.contains("llmr_router_retries_total{node=\"bad\",reason=\"status_5xx\"}"), "{metrics}");
    // The dead node was taken out at once; the 500 node stays (it answers).
    let nodes: Value =
        h.http.get(format!("{}/v0/nodes", h.base)).bearer_auth(&h.admin).send().await.unwrap().json().await.unwrap();
    let health: Vec<(String, bool)> = nodes["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap().to_string(), n["healthy"].as_bool().unwrap()))
        .collect();
    assert!(health.contains(&("dead".into(), false)), "{health:?}");
    assert!(health.contains(&("good".into(), true)), "{health:?}");
}

#[tokio::test]
async fn only_failing_nodes_give_the_last_error_after_four_retries() {
    let h = start_router(true).await;
    let (bad, hits) = upstream(Behaviour::Fail500).await;
    h.join("bad", &bad, "m").await;
    let started = Instant::now();
    let r = h.embed("m").await;
    assert_eq!(r.status(), 500);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["message"], "engine broke");
    assert_eq!(hits.load(Ordering::SeqCst), 5, "one try and four retries");
    assert!(started.elapsed() >= Duration::from_millis(1500), "100+200+400+800 ms of backoff");
}

#[tokio::test]
async fn a_stream_cut_by_its_node_ends_with_an_sse_error_event() {
    let h = start_router(true).await;
    let (url, _) = upstream(Behaviour::CutStream).await;
    h.join("flaky", &url, "m").await;
    let r = h.chat("m", true).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.starts_with("data: {\"n\":1}\n\ndata: {\"n\":2}\n\n"), "{text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let event: Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
    assert!(event["error"]["message"].as_str().unwrap().contains("failed mid-stream"), "{event}");
    assert!(h.metrics().await.contains("llmr_router_streams_cut_total{node=\"flaky\"} 1"));
}

/// Sends a heartbeat, then a chat request; returns the request's status. A round that took longer
/// than `timeout` proves nothing (the node may have gone silent meanwhile on a slow machine) and is
/// repeated, within a bound.
async fn status_right_after_heartbeat(h: &Harness, id: &str, timeout: Duration) -> reqwest::StatusCode {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let round = Instant::now();
        assert_eq!(h.heartbeat(id, "m").await, 200);
        let status = h.chat("m", false).await.status();
        if status == 200 || round.elapsed() <= timeout {
            return status;
        }
        assert!(Instant::now() < deadline, "no heartbeat and request within {timeout:?} in 60 s");
    }
}

#[tokio::test]
async fn silent_nodes_stop_getting_traffic_and_come_back() {
    let timeout = Duration::from_millis(1000);
    let h = start_router_with(true, timeout).await;
    let (url, hits) = upstream(Behaviour::Ok).await;
    let id = h.join("a", &url, "m").await;
    assert_eq!(status_right_after_heartbeat(&h, &id, timeout).await, 200);
    let served = hits.load(Ordering::SeqCst);
    // Silent for longer than the timeout (a sleep lasts at least as long as asked).
    tokio::time::sleep(timeout + Duration::from_millis(100)).await;
    let r = h.chat("m", false).await;
    assert_eq!(r.status(), 503, "past the heartbeat timeout");
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(hits.load(Ordering::SeqCst), served, "nothing was sent to the silent node");
    assert_eq!(status_right_after_heartbeat(&h, &id, timeout).await, 200, "back after a heartbeat");
    assert_eq!(hits.load(Ordering::SeqCst), served + 1);
}

/// Spec 000's benchmarks "kept with the model": a node's heartbeat carries its benchmarks of a
/// registered model; the router keeps them in its database and lists them in `/v0/models`,
/// saying which engine the node chose.
#[tokio::test]
async fn engine_benchmarks_from_heartbeats_are_kept_and_listed_with_the_model() {
    let h = start_router(true).await;
    let manifest = llmr_cluster::ModelManifest {
        name: "m".into(),
        format: llmr_cluster::ModelFormat::Gguf,
        source: llmr_cluster::ModelSource::Hub {
            endpoint: "http://127.0.0.1:1".into(),
            repo: "o/r".into(),
            revision: "main".into(),
        },
        files: vec![llmr_cluster::ManifestFile { path: "m.gguf".into(), size: 10, sha256: "ab".repeat(32) }],
        primary: "m.gguf".into(),
        quantization: None,
        architecture: Some("llama".into()),
        has_chat_template: true,
        registered_at: 1,
    };
    h.state.db.insert_model(&manifest).unwrap();
    h.state.models_changed().unwrap();
    let r = h.register(&registration("n1", "http://127.0.0.1:9", true)).await;
    let id = r.json::<NodeRegistered>().await.unwrap().node_id;
    let bench = |engine: &str, tps: f64| llmr_cluster::EngineBenchmark {
        engine_id: engine.into(),
        engine_version: "1.2.0".into(),
        tokens_per_second: tps,
        ttft_ms: 40.0,
        peak_memory_bytes: 1 << 30,
        measured_at: 1_700_000_000,
    };
    let mut hb = ready("m");
    hb.models[0].engine = Some("fast".into());
    hb.models[0].benchmarks = vec![bench("fast", 90.0), bench("slow", 30.0)];
    let url = format!("{}/v0/nodes/{id}/heartbeat", h.base);
    let r = h.http.post(&url).bearer_auth(&h.node).json(&hb).send().await.unwrap();
    assert_eq!(r.status(), 200);

    let listed = |key: String| {
        let (http, url) = (h.http.clone(), format!("{}/v0/models", h.base));
        async move { http.get(url).bearer_auth(key).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let body = listed(h.admin.clone()).await;
    let rows = body["data"][0]["benchmarks"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 2, "{body}");
    assert_eq!(rows[0]["engine_id"], "fast");
    assert_eq!(rows[0]["tokens_per_second"], 90.0);
    assert_eq!(rows[0]["node"], "n1");
    assert_eq!(rows[0]["chosen"], true);
    assert_eq!(rows[1]["chosen"], false);
    // Nodes read the same listing as manifests.
    let manifests: Vec<llmr_cluster::ModelManifest> =
        serde_json::from_value(listed(h.node.clone()).await["data"].clone()).unwrap();
    assert_eq!(manifests, [manifest]);
    // Kept in the database, where a restarted router reads them back.
    let kept = h.state.db.benchmarks().unwrap();
    assert_eq!(kept.len(), 2);
    assert_eq!(kept[1].benchmark, bench("slow", 30.0));
}
