//! Crash isolation over HTTP on loopback: each model in an engine worker process of its own
//! (`llmr-engine-worker`, the real binary), the echo plugin crashing, aborting or hanging on a
//! magic prompt. A crash or hang fails only the requests on that worker, the model is served
//! again shortly after, and other models never notice.

use crate::support::{gguf_model, in_workers, install_c_echo, serve, wait_until, worker_node_config};
use llmr_node::{Node, NodeConfig, RestartPolicy};
use serde_json::{json, Value};
use std::sync::Mutex;
use std::time::Duration;

struct Running {
    url: String,
    node_models: std::sync::Arc<llmr_node::ModelManager>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A node on loopback serving echo models `a` and `b` (tokens `delay_ms` apart), each in a
/// worker, with the watchdog at `watchdog`.
async fn start(delay_ms: u64, watchdog: Duration) -> Running {
    start_with(
        delay_ms,
        watchdog,
        llmr_node::memory_guard::MemoryProbe(std::sync::Arc::new(|| None)),
        RestartPolicy::default(),
    )
    .await
}

/// [`start`] with the memory guard reading `probe`.
async fn start_with(
    delay_ms: u64,
    watchdog: Duration,
    memory_probe: llmr_node::memory_guard::MemoryProbe,
    engine_restart: RestartPolicy,
) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let engines = llmr_testkit::crashing_echo_engines(&dir.path().join("engines"), delay_ms);
    let models = ["a", "b"].iter().map(|name| gguf_model(dir.path(), name, "echo")).collect();
    let node = Node::new(NodeConfig {
        engines_dir: engines,
        models,
        cache_bytes: Some(0),
        engine_isolation: in_workers(watchdog),
        memory_probe,
        engine_restart,
        ..NodeConfig::default()
    })
    .unwrap();
    let node_models = node.models().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(node.serve(listener, async move {
        let _ = stopped.await;
    }));
    Running { url, node_models, stop: Some(stop), _dir: dir }
}

fn completion(model: &str, prompt: &str, stream: bool) -> Value {
    json!({"model": model, "prompt": prompt, "max_tokens": 400, "stream": stream})
}

async fn post(url: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new().post(format!("{url}/v1/completions")).json(body).send().await.unwrap()
}

/// A streamed completion read to its end on a task; `first` is told when the first token came.
fn stream_in_background(
    url: &str,
    model: &str,
    words: usize,
) -> (tokio::sync::oneshot::Receiver<()>, tokio::task::JoinHandle<Vec<String>>) {
    let (first_tx, first) = tokio::sync::oneshot::channel();
    let body = completion(model, &vec!["word"; words].join(" "), true);
    let url = url.to_owned();
    let task = tokio::spawn(async move {
        let mut resp = post(&url, &body).await;
        assert_eq!(resp.status(), 200);
        let mut first_tx = Some(first_tx);
        let mut text = String::new();
        while let Ok(Some(chunk)) = resp.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if text.contains("\"text\"") {
                if let Some(tx) = first_tx.take() {
                    let _ = tx.send(());
                }
            }
        }
        text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_owned).collect()
    });
    (first, task)
}

async fn ok_answer(url: &str, model: &str) -> String {
    let resp = post(url, &completion(model, "back again", false)).await;
    let status = resp.status();
    let body = resp.json::<Value>().await.unwrap();
    assert_eq!(status, 200, "{body}");
    body["choices"][0]["text"].as_str().unwrap().to_owned()
}

/// A crash (`magic`) on model `a` while a stream runs on each model.
async fn crash_is_contained(magic: &str, signal: &str) {
    let node = start(25, Duration::from_secs(30)).await;
    // Both models are up (each in its own worker) before anything crashes.
    assert_eq!(ok_answer(&node.url, "a").await, "back again");
    assert_eq!(ok_answer(&node.url, "b").await, "back again");
    let (a_first, a_stream) = stream_in_background(&node.url, "a", 300);
    let (b_first, b_stream) = stream_in_background(&node.url, "b", 120);
    a_first.await.unwrap();
    b_first.await.unwrap();

    let resp = post(&node.url, &completion("a", &format!("now {magic} please"), false)).await;
    assert_eq!(resp.status(), 500);
    let error = resp.json::<Value>().await.unwrap()["error"].clone();
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(signal) && message.contains("'a'"), "{error}");

    // The stream on the crashed worker ends with an error event (then the closing [DONE]).
    let a_events = a_stream.await.unwrap();
    let error_at = a_events.iter().position(|e| e.contains("\"error\"")).expect("an error event");
    assert!(a_events[error_at].contains(signal), "{a_events:?}");
    assert_eq!(&a_events[error_at + 1..], ["[DONE]"], "nothing after the error but the end: {a_events:?}");

    // The other model's stream never noticed.
    let b_events = b_stream.await.unwrap();
    assert_eq!(b_events.last().map(String::as_str), Some("[DONE]"));
    let b_text: String = b_events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(b_text.split_whitespace().count(), 120, "{b_text:?}");

    // The supervisor reloads `a` in a new worker; a request two seconds later is served.
    let models = node.node_models.clone();
    wait_until(30, "model a is loaded again", || {
        models.loaded().iter().any(|m| m.name == "a" && m.engine.exit_reason().is_none())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(ok_answer(&node.url, "a").await, "back again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_segfault_fails_only_its_workers_requests_and_the_model_comes_back() {
    crash_is_contained("LLMR_CRASH_SEGFAULT", "SIGSEGV").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abort_fails_only_its_workers_requests_and_the_model_comes_back() {
    crash_is_contained("LLMR_CRASH_ABORT", "SIGABRT").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hang_is_a_504_and_the_model_comes_back() {
    let node = start(0, Duration::from_secs(1)).await;
    let resp = post(&node.url, &completion("a", "LLMR_HANG", false)).await;
    assert_eq!(resp.status(), 504);
    let error = resp.json::<Value>().await.unwrap()["error"].clone();
    assert!(error["message"].as_str().unwrap().contains("no progress"), "{error}");
    // A streamed request that hangs ends with an error event (or a 504 before any byte).
    let resp = post(&node.url, &completion("a", "LLMR_HANG", true)).await;
    if resp.status() == 200 {
        let text = resp.text().await.unwrap();
        assert!(text.contains("no progress"), "{text}");
    } else {
        assert_eq!(resp.status(), 504);
    }
    assert_eq!(ok_answer(&node.url, "a").await, "back again");
    assert_eq!(ok_answer(&node.url, "b").await, "back again");
}

/// Spec 000's memory guard: past 90% of memory in use, the least recently used idle model is
/// unloaded (its worker ends), one at a time, and nothing more once memory is back under.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_pressure_unloads_the_least_recently_used_idle_model() {
    let pressure = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let pressure = pressure.clone();
        llmr_node::memory_guard::MemoryProbe(std::sync::Arc::new(move || {
            Some(if pressure.load(std::sync::atomic::Ordering::SeqCst) { 0.95 } else { 0.5 })
        }))
    };
    let node = start_with(0, Duration::from_secs(30), probe, RestartPolicy::default()).await;
    assert_eq!(ok_answer(&node.url, "a").await, "back again");
    assert_eq!(ok_answer(&node.url, "b").await, "back again");
    let loaded = |m: &std::sync::Arc<llmr_node::ModelManager>| -> Vec<String> {
        m.loaded().iter().map(|l| l.name.clone()).collect()
    };
    assert_eq!(loaded(&node.node_models), ["a", "b"]);

    pressure.store(true, std::sync::atomic::Ordering::SeqCst);
    let models = node.node_models.clone();
    wait_until(30, "a (used before b) is unloaded", || loaded(&models) == ["b"]).await;
    pressure.store(false, std::sync::atomic::Ordering::SeqCst);
    // Memory is back under the mark before the guard looks again: b stays.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(loaded(&models), ["b"]);
    // An unloaded model loads again on its next request.
    assert_eq!(ok_answer(&node.url, "a").await, "back again");
}

/// Spec 000's last step: memory still past 90% with nothing idle to unload restarts the engine
/// worker holding the most memory, without failing its requests: it takes no new request,
/// finishes its stream, ends, and the model loads in a new worker on its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_pressure_with_nothing_idle_restarts_the_largest_worker_after_its_requests() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let pressure = std::sync::Arc::new(AtomicBool::new(false));
    let probe = {
        let pressure = pressure.clone();
        llmr_node::memory_guard::MemoryProbe(std::sync::Arc::new(move || {
            Some(if pressure.load(Ordering::SeqCst) { 0.95 } else { 0.5 })
        }))
    };
    let node = start_with(25, Duration::from_secs(30), probe, RestartPolicy::default()).await;
    assert_eq!(ok_answer(&node.url, "a").await, "back again");
    let models = node.node_models.clone();
    let old_a = std::sync::Arc::downgrade(&models.loaded().into_iter().find(|m| m.name == "a").unwrap());
    let (first, stream) = stream_in_background(&node.url, "a", 200);
    first.await.unwrap();

    pressure.store(true, Ordering::SeqCst);
    wait_until(30, "a's busy worker is taken out", || models.loaded().iter().all(|m| m.name != "a")).await;
    pressure.store(false, Ordering::SeqCst);
    // Its stream runs to the end on the old worker.
    let events = stream.await.unwrap();
    assert!(!events.iter().any(|e| e.contains("\"error\"")), "{events:?}");
    let text: String = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text.split_whitespace().count(), 200);
    // Then the old worker is gone, and a new one serves.
    wait_until(30, "the old engine is dropped", || old_a.strong_count() == 0).await;
    assert_eq!(ok_answer(&node.url, "a").await, "back again");
}

/// Spec 003's hot reload under load: requests at concurrency 8 while the plugin's folder gets a
/// new version; none fails and the new version serves afterwards. Then an ABI-incompatible
/// version is refused and the one before keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_plugin_version_takes_over_under_load_and_no_request_fails() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("engines/c_echo/cpu");
    install_c_echo(&plugin_dir, "0.1.0", &[]);
    let desc = gguf_model(dir.path(), "m", "echo");
    let node = Node::new(NodeConfig {
        memory_probe: llmr_node::memory_guard::MemoryProbe(Arc::new(|| None)),
        ..worker_node_config(&dir.path().join("engines"), vec![desc])
    })
    .unwrap();
    let models = node.models().clone();
    let (url, _stop) = serve(node).await;
    let expected = ok_answer(&url, "m").await;
    let version_of_m = |models: &Arc<llmr_node::ModelManager>| {
        models.loaded().iter().find(|m| m.name == "m").map(|m| m.engine_version.clone())
    };
    assert_eq!(version_of_m(&models).as_deref(), Some("0.1.0"));

    // Eight clients, each sending requests one after another until the new version has served
    // for a while and 200 requests are done.
    let (done, failed, switched) =
        (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (url, done, failed, switched, expected) =
                (url.clone(), done.clone(), failed.clone(), switched.clone(), expected.clone());
            tokio::spawn(async move {
                let mut after_switch = 0;
                while after_switch < 10 || done.load(Ordering::SeqCst) < 200 {
                    let resp = post(&url, &completion("m", "back again", false)).await;
                    let status = resp.status();
                    let body: Value = resp.json().await.unwrap_or_default();
                    if status != 200 || body["choices"][0]["text"] != expected.as_str() {
                        failed.lock().unwrap().push(format!("{status}: {body}"));
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                    if switched.load(Ordering::SeqCst) {
                        after_switch += 1;
                    }
                }
            })
        })
        .collect();
    wait_until(60, "40 requests are done", || done.load(Ordering::SeqCst) >= 40).await;
    install_c_echo(&plugin_dir, "0.2.0", &["-DECHO_VERSION=\"0.2.0\""]);
    wait_until(60, "the new version serves m", || version_of_m(&models).as_deref() == Some("0.2.0")).await;
    switched.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    assert!(done.load(Ordering::SeqCst) >= 200);
    assert_eq!(*failed.lock().unwrap(), Vec::<String>::new(), "requests failed during the reload");
    assert_eq!(models.registry().get("c_echo").unwrap().info.version, "0.2.0");
    // What the node reports to a router (`GET /v0/engines`, through heartbeats).
    let reports = models.engine_reports();
    assert_eq!((reports[0].id.as_str(), reports[0].version.as_str()), ("c_echo", "0.2.0"), "{reports:?}");

    // A version built for another ABI major is refused; 0.2.0 keeps serving.
    install_c_echo(&plugin_dir, "0.3.0", &["-DECHO_VERSION=\"0.3.0\"", "-DECHO_ABI_MAJOR=2"]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(version_of_m(&models).as_deref(), Some("0.2.0"));
    assert_eq!(models.registry().get("c_echo").unwrap().info.version, "0.2.0");
    assert_eq!(ok_answer(&url, "m").await, expected);
}

/// An engine folder installed while the node runs is picked up: the models no plugin could run
/// until then are served by it, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_engine_installed_while_serving_serves_the_models_it_can_run() {
    let dir = tempfile::tempdir().unwrap();
    let engines = llmr_testkit::echo_engines(&dir.path().join("engines"), 0);
    let desc = gguf_model(dir.path(), "m", "c_arch");
    let node = Node::new(worker_node_config(&engines, vec![desc])).unwrap();
    let models = node.models().clone();
    assert!(!models.contains("m"), "no plugin runs c_arch yet");
    let (url, _stop) = serve(node).await;
    assert_eq!(post(&url, &completion("m", "hello there", false)).await.status(), 404);

    // Installed the way a plugin is: built elsewhere, then renamed into place.
    let staging = dir.path().join("staging");
    install_c_echo(&staging, "0.1.0", &[]);
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(staging.join("manifest.json")).unwrap()).unwrap();
    manifest["architectures"] = json!(["c_arch"]);
    std::fs::write(staging.join("manifest.json"), serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
    std::fs::create_dir_all(engines.join("c_echo")).unwrap();
    std::fs::rename(&staging, engines.join("c_echo/cpu")).unwrap();

    wait_until(60, "m is served by the new engine", || models.contains("m")).await;
    assert_eq!(ok_answer(&url, "m").await, "back again");
    assert_eq!(models.entry("m").unwrap().plugin.id(), "c_echo");
    let reports = models.engine_reports();
    assert!(reports.iter().any(|r| r.id == "c_echo" && r.state == "loaded"), "{reports:?}");
}

/// A plugin whose library crashes as it is opened is refused, naming the signal, and the node
/// serves with the others: with engines in workers, every plugin is opened in a probe process
/// of its own before the node opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_that_crashes_when_opened_is_refused_and_the_node_serves() {
    let dir = tempfile::tempdir().unwrap();
    let engines = llmr_testkit::echo_engines(&dir.path().join("engines"), 0);
    install_c_echo(&engines.join("c_echo/cpu"), "0.1.0", &["-DECHO_CRASH_ON_OPEN"]);
    let desc = gguf_model(dir.path(), "m", "echo");
    let node = Node::new(worker_node_config(&engines, vec![desc])).unwrap();
    let models = node.models().clone();
    let reports = models.engine_reports();
    let c_echo = reports.iter().find(|r| r.folder == "c_echo/cpu").expect("reported");
    assert_eq!(c_echo.state, "refused");
    assert!(c_echo.reason.as_deref().unwrap_or_default().contains("SIGABRT"), "{c_echo:?}");
    assert_eq!(models.entry("m").unwrap().plugin.id(), "echo");
    let (url, _stop) = serve(node).await;
    assert_eq!(ok_answer(&url, "m").await, "back again");
}

/// Spec 003's periodic restart: after every 20 requests a model gets a new engine worker, loaded
/// beside the old one; clients sending all along see no failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn periodic_restarts_drop_no_request() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let restart = RestartPolicy { after: None, after_requests: Some(20) };
    let node =
        start_with(20, Duration::from_secs(30), llmr_node::memory_guard::MemoryProbe(Arc::new(|| None)), restart).await;
    let failed = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (url, failed, done) = (node.url.clone(), failed.clone(), done.clone());
            tokio::spawn(async move {
                while done.fetch_add(1, Ordering::SeqCst) < 120 {
                    let resp = post(&url, &completion("a", "one two three four", false)).await;
                    let status = resp.status();
                    let body: Value = resp.json().await.unwrap_or_default();
                    if status != 200 || body["choices"][0]["text"] != "one two three four" {
                        failed.lock().unwrap().push(format!("{status}: {body}"));
                    }
                }
            })
        })
        .collect();
    // Each engine `a` had while the clients ran, by when it was loaded.
    let mut engines = std::collections::BTreeSet::new();
    while !clients.iter().all(|c| c.is_finished()) {
        if let Some(m) = node.node_models.loaded().iter().find(|m| m.name == "a") {
            engines.insert(m.loaded_at);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for client in clients {
        client.await.unwrap();
    }
    assert_eq!(*failed.lock().unwrap(), Vec::<String>::new());
    assert!(engines.len() >= 3, "120 requests, a restart every 20: saw {} engines", engines.len());
}
