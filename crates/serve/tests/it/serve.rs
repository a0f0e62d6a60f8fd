//! `Serve` and `ClusterNode`: started, answering through the router, stopped within the grace.

use crate::support::{echo_engines, serve_config};
use llmr_node::NodeConfig;
use llmr_serve::{ClusterNode, ClusterNodeConfig, CorsOrigins, Error, Serve, STOP_GRACE};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn chat(model: &str, text: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": text}]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_completion_goes_through_the_router_to_the_embedded_node() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_config(dir.path(), "echo", 0)).await.unwrap();
    assert!(serve.addr().ip().is_loopback() && serve.addr().port() != 0);
    assert_eq!((serve.models(), serve.default_model()), (&["echo".to_string()][..], "echo"));

    let http = reqwest::Client::new();
    let url = format!("http://{}", serve.addr());
    let resp = http.post(format!("{url}/v1/chat/completions")).json(&chat("echo", "hi there", json!({}))).send().await;
    let resp = resp.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-llmr-node"], "local", "the router proxied it to the embedded node");
    let body: Value = resp.json().await.unwrap();
    // The echo engine repeats the rendered (ChatML) prompt.
    assert_eq!(
        body["choices"][0]["message"]["content"], "<|im_start|>user hi there<|im_end|> <|im_start|>assistant",
        "{body}"
    );
    let health: Value = http.get(format!("{url}/health")).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        (health["nodes_healthy"].as_u64(), health["models_loaded"].clone()),
        (Some(1), json!(["echo"])),
        "{health}"
    );

    let addr = serve.addr();
    let started = Instant::now();
    serve.stop().await;
    assert!(started.elapsed() < Duration::from_secs(2), "nothing in flight: {:?}", started.elapsed());
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "no longer listening");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_is_bounded_when_a_stream_does_not_end() {
    let dir = tempfile::tempdir().unwrap();
    // 200 words at 100 ms a word: 20 s of stream.
    let serve = Serve::start(serve_config(dir.path(), "slow", 100)).await.unwrap();
    let long = vec!["word"; 200].join(" ");
    let body = chat("slow", &long, json!({"stream": true}));
    let url = format!("http://{}/v1/chat/completions", serve.addr());
    let mut resp = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.chunk().await.unwrap().is_some(), "the stream started");

    let started = Instant::now();
    serve.stop().await;
    let took = started.elapsed();
    assert!(took >= STOP_GRACE - Duration::from_millis(500), "it waited for the stream: {took:?}");
    assert!(took < STOP_GRACE + Duration::from_secs(2), "but no longer than the grace: {took:?}");
}

#[tokio::test]
async fn a_public_address_without_a_key_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = serve_config(dir.path(), "echo", 0);
    config.host = "0.0.0.0".into();
    match Serve::start(config).await {
        Err(e @ Error::Exposed { .. }) => {
            assert!(e.to_string().starts_with("refusing to listen on 0.0.0.0 without an API key"), "{e}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("served on 0.0.0.0 without a key"),
    }
    assert!(!dir.path().join("router.db").exists(), "the router was not opened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_registers_with_the_router_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_config(dir.path(), "echo", 0)).await.unwrap();
    let url = format!("http://{}", serve.addr());
    let config = ClusterNodeConfig {
        node: NodeConfig { engines_dir: echo_engines(&dir.path().join("engines-b"), 0), ..NodeConfig::default() },
        router: url.clone(),
        // The router of a `Serve` without a key requires none.
        token: "any".into(),
        name: "b".into(),
        host: "127.0.0.1".into(),
        port: 0,
        advertise: None,
        api_key: None,
        store: dir.path().join("store-b"),
    };
    let mut node = ClusterNode::start(config).await.unwrap();
    assert_eq!(node.registration().url, format!("http://{}", node.addr()));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let id = tokio::select! {
        r = node.run(move |registered| { let _ = tx.send(registered.node_id.clone()); }) => panic!("run ended: {r:?}"),
        id = rx => id.unwrap(),
    };
    let nodes: Value = reqwest::get(format!("{url}/v0/nodes")).await.unwrap().json().await.unwrap();
    let names: Vec<&str> = nodes["data"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"b") && names.contains(&"local"), "{nodes}");
    assert!(nodes["data"].as_array().unwrap().iter().any(|n| n["id"] == id.as_str()), "{nodes}");
    // The engine info API: each node's plugin folders, with their manifests and state.
    let engines: Value = reqwest::get(format!("{url}/v0/engines")).await.unwrap().json().await.unwrap();
    let b = engines["data"].as_array().unwrap().iter().find(|n| n["node"] == "b").expect("node b");
    assert_eq!(b["node_id"], id.as_str());
    let echo = &b["engines"][0];
    assert_eq!((&echo["folder"], &echo["id"], &echo["state"]), (&json!("echo/cpu"), &json!("echo"), &json!("loaded")));
    assert_eq!((&echo["version"], &echo["formats"]), (&json!("0.1.0"), &json!(["gguf"])), "{echo}");
    assert!(echo["abi"].as_str().unwrap().starts_with("1."), "{echo}");

    let started = Instant::now();
    node.stop().await;
    serve.stop().await;
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}

/// A browser's preflight and the request after it, from `origin`; the preflight's and the
/// answer's `Access-Control-Allow-Origin`, and the answer's status.
async fn from_browser(url: &str, origin: &str, key: Option<&str>) -> (Option<String>, Option<String>, u16, String) {
    let http = reqwest::Client::new();
    let preflight = http
        .request(reqwest::Method::OPTIONS, format!("{url}/v1/chat/completions"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization,content-type,x-stainless-os")
        .send()
        .await
        .unwrap();
    assert!(preflight.status().is_success(), "a preflight is answered before authentication: {}", preflight.status());
    let allowed = |r: &reqwest::Response, h: &str| r.headers().get(h).map(|v| v.to_str().unwrap().to_owned());
    let pre_origin = allowed(&preflight, "access-control-allow-origin");
    if pre_origin.is_some() {
        let headers = allowed(&preflight, "access-control-allow-headers").unwrap_or_default();
        assert!(headers.contains("x-stainless-os") && headers.contains("authorization"), "{headers}");
    }
    let mut post =
        http.post(format!("{url}/v1/chat/completions")).header("origin", origin).json(&chat("echo", "hi", json!({})));
    if let Some(key) = key {
        post = post.bearer_auth(key);
    }
    let resp = post.send().await.unwrap();
    let origin_back = allowed(&resp, "access-control-allow-origin");
    let exposed = allowed(&resp, "access-control-expose-headers").unwrap_or_default();
    (pre_origin, origin_back, resp.status().as_u16(), exposed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_may_call_from_this_machines_pages_or_the_origins_given() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(serve_config(dir.path(), "echo", 0)).await.unwrap();
    let url = format!("http://{}", serve.addr());
    let local = "http://localhost:5173";
    let (pre, back, status, exposed) = from_browser(&url, local, None).await;
    assert_eq!((pre.as_deref(), back.as_deref(), status), (Some(local), Some(local), 200));
    assert!(exposed.contains("x-request-id"), "{exposed}");
    // A page elsewhere gets no permission: the browser withholds the answer from it.
    let (pre, back, _, _) = from_browser(&url, "https://evil.example", None).await;
    assert_eq!((pre, back), (None, None));
    serve.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let mut config = serve_config(dir.path(), "echo", 0);
    config.cors = CorsOrigins::parse(&["https://app.example.com".into()]).unwrap();
    config.api_key = Some("sk-test".into());
    let serve = Serve::start(config).await.unwrap();
    let url = format!("http://{}", serve.addr());
    let app = "https://app.example.com";
    let (pre, back, status, _) = from_browser(&url, app, Some("sk-test")).await;
    assert_eq!((pre.as_deref(), back.as_deref(), status), (Some(app), Some(app), 200));
    // The key is still required, and the refusal is readable by the page.
    let (_, back, status, _) = from_browser(&url, app, None).await;
    assert_eq!((back.as_deref(), status), (Some(app), 401));
    let (pre, _, _, _) = from_browser(&url, "http://localhost:5173", Some("sk-test")).await;
    assert_eq!(pre, None, "named origins replace the loopback default");
    serve.stop().await;
}

/// Issue 16 under a router: a node whose engine worker crashes answers 500 for the requests it
/// held, and the router sends each of them to another node, so none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_on_a_node_whose_engine_crashes_are_retried_on_another_node() {
    let dir = tempfile::tempdir().unwrap();
    // The router's own node: the plain echo engine, in process.
    let serve = Serve::start(serve_config(dir.path(), "echo", 0)).await.unwrap();
    let url = format!("http://{}", serve.addr());
    // Node b: the same model on an echo engine that aborts on a magic prompt, in a worker.
    let config = ClusterNodeConfig {
        node: NodeConfig {
            engines_dir: llmr_testkit::crashing_echo_engines(&dir.path().join("engines-b"), 0),
            models: vec![crate::support::echo_model(&dir.path().join("b.gguf"), "echo")],
            engine_isolation: llmr_node::EngineIsolation::Worker {
                command: llmr_node::WorkerCommand { program: llmr_testkit::engine_worker_program(), args: vec![] },
                watchdog: None,
            },
            ..NodeConfig::default()
        },
        router: url.clone(),
        token: "any".into(),
        name: "b".into(),
        host: "127.0.0.1".into(),
        port: 0,
        advertise: None,
        api_key: None,
        store: dir.path().join("store-b"),
    };
    let mut node = ClusterNode::start(config).await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let running = tokio::spawn(async move {
        let _ = node
            .run(move |_| {
                let _ = tx.send(());
            })
            .await;
    });
    rx.await.unwrap();
    let client = reqwest::Client::new();
    // Until the router has seen b report the model ready, it sends nothing there.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes: Value = client.get(format!("{url}/v0/nodes")).send().await.unwrap().json().await.unwrap();
        let b = nodes["data"].as_array().unwrap().iter().find(|n| n["name"] == "b").cloned().unwrap_or_default();
        if b.to_string().contains("\"echo\"") {
            break;
        }
        assert!(Instant::now() < deadline, "node b never reported the model: {nodes}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Distinct prompts spread over both nodes (prefix affinity); every one that lands on b
    // crashes its worker there and is retried on the router's own node.
    let asks: Vec<_> = (0..24)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let body = chat("echo", &format!("question {i} LLMR_CRASH_ABORT"), json!({}));
                let resp = client.post(format!("{url}/v1/chat/completions")).json(&body).send().await.unwrap();
                let status = resp.status();
                let served_by = resp.headers().get("x-llmr-node").map(|v| v.to_str().unwrap().to_owned());
                let text: Value = resp.json().await.unwrap();
                (i, status, served_by, text)
            })
        })
        .collect();
    for ask in asks {
        let (i, status, served_by, body) = ask.await.unwrap();
        assert_eq!(status, 200, "request {i} was lost: {body}");
        assert_eq!(served_by.as_deref(), Some("local"), "only the router's own node can answer it");
        let content = body["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(content.contains(&format!("question {i}")), "{body}");
    }
    let metrics = client.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    let retried = metrics
        .lines()
        .any(|l| l.starts_with("llmr_router_retries_total") && l.contains("node=\"b\"") && l.contains("status_5xx"));
    assert!(retried, "no request reached b and was retried (24 distinct prompts): {metrics}");
    running.abort();
    serve.stop().await;
}
