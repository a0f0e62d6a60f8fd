//! The agent against a fake router (the `/v0` contract, client side) and a hub mirror serving
//! real files: registration, heartbeats, re-registration, and model sync with its reports.

use crate::support::{echo_engines, gguf, node, wait_until, FakeRouter, NODE_TOKEN, USER_TOKEN};
use llmr_cluster::{Heartbeat, ManifestFile, ModelFormat, ModelManifest, ModelSource, ModelState};
use llmr_hub::sha256_file;
use llmr_hub_mirror::HubMirror;
use llmr_node::agent::{Agent, AgentConfig, AgentError, Backoff};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SECRET: &str = "s3cret";

fn agent_config(router: &str, token: &str, store: &Path) -> AgentConfig {
    let mut c = AgentConfig::new(
        router.into(),
        token.into(),
        "test-node".into(),
        "http://127.0.0.1:9".into(),
        SECRET.into(),
        store.into(),
    );
    c.backoff = Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) };
    c.sync_retry = Duration::from_millis(300);
    c
}

fn heartbeats_from(router: &FakeRouter, id: &str) -> usize {
    router.state.lock().unwrap().heartbeats.iter().filter(|(n, _)| n == id).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_once_the_router_is_up_heartbeats_and_registers_again_when_forgotten() {
    let tmp = tempfile::tempdir().unwrap();
    let node = node(&echo_engines(&tmp.path().join("engines"), 0), vec![SECRET.into()]);
    // The router starts after the node: registration is retried until it answers.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = agent_config(&format!("http://{addr}"), NODE_TOKEN, &tmp.path().join("store"));
    let agent = Agent::new(config, node.models().clone()).unwrap();
    let registering = tokio::spawn(async move {
        let registered = agent.register().await;
        (agent, registered)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!registering.is_finished(), "no router yet");
    let router = FakeRouter::start_on(tokio::net::TcpListener::bind(addr).await.unwrap()).await;
    let (agent, registered) = tokio::time::timeout(Duration::from_secs(60), registering).await.unwrap().unwrap();
    let registered = registered.unwrap();
    assert_eq!(registered.node_id, "n1");

    let reg = router.state.lock().unwrap().registrations[0].clone();
    assert_eq!((reg.name.as_str(), reg.url.as_str(), reg.secret.as_str()), ("test-node", "http://127.0.0.1:9", SECRET));
    assert_eq!(reg.runtimes, ["LlamaCpp"]);
    assert!(reg.machine.cpu_cores >= 1 && reg.machine.memory_total_bytes > 0 && !reg.machine.hostname.is_empty());
    assert_eq!(reg.version, env!("CARGO_PKG_VERSION"));

    let running = tokio::spawn(async move { agent.run(registered).await });
    wait_until(60, "n1 sends heartbeats", || heartbeats_from(&router, "n1") >= 2).await;
    let (_, hb) = router.last_heartbeat().unwrap();
    assert_eq!((hb.load.active_requests, hb.load.queue_depth, hb.load.memory_used_bytes), (0, 0, 0));

    // The router restarts and forgets the node: 404 on the heartbeat, so it registers again.
    router.forget_nodes();
    wait_until(60, "the node registers again and heartbeats as n2", || heartbeats_from(&router, "n2") >= 2).await;
    assert_eq!(router.state.lock().unwrap().registrations.len(), 2);
    assert!(!running.is_finished(), "the agent keeps running");
    running.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_ends_registration_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let node = node(&echo_engines(&tmp.path().join("engines"), 0), vec![]);
    let router = FakeRouter::start().await;
    for (token, status, hint) in [("wrong", 401, "check --token"), (USER_TOKEN, 403, "the `node` scope")] {
        let agent =
            Agent::new(agent_config(&router.url, token, &tmp.path().join("store")), node.models().clone()).unwrap();
        let err = tokio::time::timeout(Duration::from_secs(60), agent.register()).await.unwrap().unwrap_err();
        assert!(matches!(err, AgentError::Refused { status: s, .. } if s == status), "{err}");
        let text = err.to_string();
        assert!(text.contains(hint) && text.contains(&router.url), "{text}");
    }
    assert!(router.state.lock().unwrap().registrations.is_empty());
}

fn file(path: &str, local: &Path) -> ManifestFile {
    ManifestFile {
        path: path.into(),
        size: std::fs::metadata(local).unwrap().len(),
        sha256: sha256_file(local).unwrap().1,
    }
}

fn manifest(name: &str, source: ModelSource, files: Vec<ManifestFile>, architecture: Option<&str>) -> ModelManifest {
    ModelManifest {
        name: name.into(),
        format: ModelFormat::Gguf,
        source,
        primary: files[0].path.clone(),
        files,
        quantization: None,
        architecture: architecture.map(str::to_string),
        has_chat_template: false,
        registered_at: 0,
    }
}

/// Each model's (state, message, loaded) in a heartbeat.
fn states(hb: &Heartbeat) -> BTreeMap<String, (ModelState, Option<String>, bool)> {
    hb.models.iter().map(|m| (m.name.clone(), (m.state, m.message.clone(), m.loaded))).collect()
}

fn write(path: PathBuf, bytes: &[u8]) -> PathBuf {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncs_the_routers_models_and_reports_each_ones_readiness() {
    let tmp = tempfile::tempdir().unwrap();
    let (repos, store) = (tmp.path().join("repos"), tmp.path().join("store"));
    let echo = write(repos.join("echo/echo.gguf"), &gguf("echo", 200_000));
    let llama = write(repos.join("llama/llama.gguf"), &gguf("llama", 1_000));
    // The store's own models: served and reported too.
    write(store.join("local-echo/local.gguf"), &gguf("echo", 100));
    write(store.join("local-llama/l.gguf"), &gguf("llama", 100));
    let mirror = HubMirror::start(vec![
        ("org/echo".into(), repos.join("echo")),
        ("org/llama".into(), repos.join("llama")),
        ("org/llama2".into(), repos.join("llama")),
    ])
    .await
    .unwrap();
    let hub = |repo: &str| ModelSource::Hub { endpoint: mirror.endpoint(), repo: repo.into(), revision: "main".into() };
    let echo_file = file("echo.gguf", &echo);
    let mut corrupt = echo_file.clone();
    corrupt.sha256 = "0".repeat(64);
    let mut evil = echo_file.clone();
    evil.path = "../echo.gguf".into();
    let url = format!("{}/org/echo/resolve/main/echo.gguf", mirror.endpoint());
    let shared = ModelSource::Path { dir: repos.join("echo").to_string_lossy().into_owned() };
    let models = vec![
        manifest("org/echo", hub("org/echo"), vec![echo_file.clone()], Some("echo")),
        manifest("corrupt", hub("org/echo"), vec![corrupt], Some("echo")),
        manifest("llama-downloaded", hub("org/llama"), vec![file("llama.gguf", &llama)], None),
        manifest("llama-declared", hub("org/llama2"), vec![file("llama.gguf", &llama)], Some("llama")),
        manifest("evil", hub("org/echo"), vec![evil], Some("echo")),
        manifest("shared", shared, vec![echo_file.clone()], Some("echo")),
        manifest("direct", ModelSource::Url { url }, vec![echo_file.clone()], Some("echo")),
    ];
    let router = FakeRouter::start().await;
    router.set_models(models.clone());

    let node = node(&echo_engines(&tmp.path().join("engines"), 0), vec![SECRET.into()]);
    let catalog = node.models().clone();
    let agent = Agent::new(agent_config(&router.url, NODE_TOKEN, &store), catalog.clone()).unwrap();
    let registered = agent.register().await.unwrap();
    let running = tokio::spawn(async move { agent.run(registered).await });
    let settled = |router: &FakeRouter| {
        router.last_heartbeat().is_some_and(|(_, hb)| {
            let s = states(&hb);
            s.len() == 9 && s.values().all(|(state, ..)| *state != ModelState::Downloading)
        })
    };
    wait_until(60, "every model is settled", || settled(&router)).await;

    let s = states(&router.last_heartbeat().unwrap().1);
    let state = |name: &str| s[name].0;
    let message = |name: &str| s[name].1.clone().unwrap_or_default();
    for ready in ["org/echo", "shared", "direct", "local-echo"] {
        assert_eq!(state(ready), ModelState::Ready, "{ready}: {}", message(ready));
        assert!(catalog.contains(ready), "{ready}");
    }
    for unsupported in ["llama-downloaded", "llama-declared", "local-llama"] {
        assert_eq!(state(unsupported), ModelState::Unsupported, "{unsupported}");
        assert!(message(unsupported).contains("'llama' is not supported"), "{}", message(unsupported));
        assert!(!catalog.contains(unsupported));
    }
    assert_eq!(state("corrupt"), ModelState::Failed);
    assert!(message("corrupt").contains("sha256 mismatch"), "{}", message("corrupt"));
    assert!(!store.join("corrupt/echo.gguf").exists(), "a corrupt download never takes the final name");
    assert_eq!(state("evil"), ModelState::Failed);
    assert!(message("evil").contains("refusing file path \"../echo.gguf\""), "{}", message("evil"));
    assert!(!catalog.contains("corrupt") && !catalog.contains("evil"));

    assert_eq!(std::fs::read(store.join("org/echo/echo.gguf")).unwrap(), std::fs::read(&echo).unwrap());
    assert_eq!(catalog.entry("shared").unwrap().desc.primary_file, echo, "a path source is used in place");
    assert!(
        mirror.requests().iter().all(|p| !p.starts_with("/org/llama2/")),
        "a model whose declared architecture no engine runs is not downloaded"
    );

    // The router sends its secret on /v1; nothing else gets in.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(node.serve(listener, std::future::pending()));
    let http = reqwest::Client::new();
    let list = |key: Option<&str>| {
        let request = http.get(format!("{base}/v1/models"));
        match key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
        .send()
    };
    assert_eq!(list(None).await.unwrap().status(), 401);
    assert_eq!(list(Some("guess")).await.unwrap().status(), 401);
    let listed: serde_json::Value = list(Some(SECRET)).await.unwrap().json().await.unwrap();
    let mut ids: Vec<&str> = listed["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["direct", "local-echo", "org/echo", "shared"]);
    // (The echo engine reports no chat capability, so the model is loaded directly.)
    catalog.get("org/echo").await.unwrap();
    wait_until(60, "the heartbeat shows the model loaded", || {
        router.last_heartbeat().is_some_and(|(_, hb)| states(&hb)["org/echo"].2 && hb.load.memory_used_bytes > 0)
    })
    .await;

    // Deleted at the router: out of the catalog and the reports, files kept, not "local" now.
    // The corrupt model's manifest is fixed meanwhile: the next sync makes it ready.
    let mut next: Vec<ModelManifest> = models.into_iter().filter(|m| m.name != "org/echo").collect();
    next.iter_mut().find(|m| m.name == "corrupt").unwrap().files = vec![echo_file];
    router.set_models(next);
    wait_until(60, "the deletion and the fix are reported", || {
        router.last_heartbeat().is_some_and(|(_, hb)| {
            let s = states(&hb);
            !s.contains_key("org/echo") && s["corrupt"].0 == ModelState::Ready
        })
    })
    .await;
    assert!(!catalog.contains("org/echo"));
    assert!(store.join("org/echo/echo.gguf").is_file(), "files are kept");
    assert!(catalog.contains("corrupt"));
    assert!(!running.is_finished());
    running.abort();
}
