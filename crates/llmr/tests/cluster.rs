//! The cluster acceptance test, with real processes on loopback: a Hugging Face compatible hub
//! (`llmr-hub-mirror`, in this process) serving the real SmolLM2 GGUF, `llmr router`, and two
//! `llmr node`s that download the model from the hub through the router's manifest.
//!
//! One test, in stages: keys and registration (201, 400, 401, 403); both nodes ready; 300
//! non-streamed requests at concurrency 16 with node `a` killed (SIGKILL) midway while a stream
//! it serves is open: no request is lost (retried on `b`), the stream ends with an SSE error
//! event, `a` is marked unhealthy and the retries are counted;
//! then `a` restarts with the same name and store: same id, its model ready again without a
//! download, and traffic again.
//!
//! Needs `scripts/install-engines` (the plugin in `engines/`) and `scripts/fetch-models smollm2`.

use llmr_hub_mirror::HubMirror;
use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF";
const FILE: &str = "smollm2-135m-instruct-q4_1.gguf";
const MODEL: &str = "smollm2";
const HEARTBEAT_INTERVAL_MS: u64 = 300;
/// Long enough that a live node on a slow or busy machine is never taken for a silent one (the
/// killed node is taken out at its first refused connection, or after this).
const HEARTBEAT_TIMEOUT_MS: u64 = 10_000;
const REQUESTS: usize = 300;
const CONCURRENCY: usize = 16;
/// Node `a` is killed once this many requests of the batch completed.
const KILL_AFTER: usize = 100;
/// Lines of each process's log kept for failure messages.
const LOG_LINES: usize = 150;
/// Bounds of the waits below. They only end a hung test, so they are several times what a slow
/// machine needs: on a 2-core machine shared with other builds, the first 100 requests of the
/// batch took 55 s (a quiet one: a few seconds). No assertion depends on how fast anything is.
const START: Duration = Duration::from_secs(120);
const READY: Duration = Duration::from_secs(300);
const REQUEST: Duration = Duration::from_secs(300);
const BATCH: Duration = Duration::from_secs(900);

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model_file() -> PathBuf {
    let dir = std::env::var_os("LLMR_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/llmr/models"));
    let path = dir.join(FILE);
    assert!(path.is_file(), "{} is missing: run `scripts/fetch-models smollm2`", path.display());
    path
}

fn engines() -> PathBuf {
    let engines = repo_root().join("engines");
    assert!(
        engines.join("llama_cpp/cpu/libllmr_llama_cpp.so").is_file(),
        "the llama.cpp plugin is not installed: run scripts/install-engines"
    );
    engines
}

/// A child process whose stderr is kept (its last lines) and which is killed when dropped.
struct Proc {
    name: String,
    child: Child,
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Proc {
    /// Spawns `cmd` and waits (until `deadline`) for the stderr line starting with `ready`.
    fn spawn(name: &str, mut cmd: Command, ready: &str, deadline: Duration) -> (Proc, String) {
        let mut child = cmd
            .env_remove("LLMR_API_KEY")
            .env_remove("HF_TOKEN")
            .env("LLMR_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = mpsc::channel();
        let (kept, prefix) = (log.clone(), ready.to_string());
        let stderr = child.stderr.take().unwrap();
        // Drains stderr for the life of the process (a full pipe would block it).
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.starts_with(&prefix) {
                    let _ = tx.send(line.clone());
                }
                let mut log = kept.lock().unwrap();
                if log.len() == LOG_LINES {
                    log.pop_front();
                }
                log.push_back(line);
            }
        });
        let proc = Proc { name: name.to_string(), child, log };
        match rx.recv_timeout(deadline) {
            Ok(line) => (proc, line),
            Err(_) => panic!("{name} did not print `{ready}...` within {deadline:?}\n{}", proc.logs()),
        }
    }

    fn logs(&self) -> String {
        let lines: Vec<String> = self.log.lock().unwrap().iter().cloned().collect();
        format!("---- {} log (last {} lines) ----\n{}\n", self.name, lines.len(), lines.join("\n"))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn llmr() -> Command {
    Command::new(env!("CARGO_BIN_EXE_llmr"))
}

/// `llmr keys create`: the secret it prints.
fn create_key(db: &Path, name: &str, scope: &str) -> String {
    let out = llmr()
        .args(["keys", "create", "--name", name, "--scope", scope])
        .arg("--db")
        .arg(db)
        .env_remove("LLMR_ROUTER_DB")
        .output()
        .unwrap();
    assert!(out.status.success(), "llmr keys create: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

struct Keys {
    admin: String,
    api: String,
    node: String,
}

/// The router, its nodes and the hub; everything is killed (and the temp dirs removed) on drop.
struct Cluster {
    router: Proc,
    url: String,
    keys: Keys,
    nodes: BTreeMap<String, Proc>,
    /// Each node's store (kept across a restart).
    stores: BTreeMap<String, PathBuf>,
    http: Client,
    dir: tempfile::TempDir,
    mirror: HubMirror,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let hub = dir.path().join("hub");
        std::fs::create_dir_all(&hub).unwrap();
        std::os::unix::fs::symlink(model_file(), hub.join(FILE)).unwrap();
        std::fs::write(hub.join("config.json"), br#"{"model_type": "llama"}"#).unwrap();
        let mirror = HubMirror::start_blocking(vec![(REPO.into(), hub)]).unwrap();

        let db = dir.path().join("router.db");
        let keys = Keys {
            admin: create_key(&db, "admin", "admin"),
            api: create_key(&db, "app", "api"),
            node: create_key(&db, "nodes", "node"),
        };
        let mut cmd = llmr();
        cmd.args(["router", "--host", "127.0.0.1", "--port", "0", "--allow-cpu-nodes"])
            .args(["--heartbeat-interval-ms", &HEARTBEAT_INTERVAL_MS.to_string()])
            .args(["--heartbeat-timeout-ms", &HEARTBEAT_TIMEOUT_MS.to_string()])
            .arg("--db")
            .arg(&db)
            .env("HOME", dir.path())
            .env("HF_ENDPOINT", mirror.endpoint());
        let (router, line) = Proc::spawn("router", cmd, "llmr router listening on ", START);
        let url = line["llmr router listening on ".len()..].split_whitespace().next().unwrap().to_string();
        let http = Client::builder().timeout(REQUEST).build().unwrap();
        Cluster { router, url, keys, nodes: BTreeMap::new(), stores: BTreeMap::new(), http, dir, mirror }
    }

    /// Every process's recent log, for failure messages.
    fn logs(&self) -> String {
        let mut s = self.router.logs();
        for n in self.nodes.values() {
            s.push_str(&n.logs());
        }
        s
    }

    /// Starts (or restarts, with the same store) node `name`; returns its id at the router.
    fn start_node(&mut self, name: &str) -> String {
        let store = self
            .stores
            .entry(name.to_string())
            .or_insert_with(|| self.dir.path().join(format!("store-{name}")))
            .clone();
        let mut cmd = llmr();
        cmd.args(["node", "--router", &self.url, "--token", &self.keys.node, "--name", name])
            .args(["--threads", "1", "--slots", "4", "--port", "0"])
            .arg("--store")
            .arg(&store)
            .arg("--engines-dir")
            .arg(engines())
            .env("HOME", self.dir.path());
        let (node, line) = Proc::spawn(&format!("node {name}"), cmd, "llmr node listening on ", START);
        self.nodes.insert(name.to_string(), node);
        let id = line.rsplit("(id ").next().and_then(|s| s.strip_suffix(')'));
        id.unwrap_or_else(|| panic!("no id in `{line}`")).to_string()
    }

    fn kill_node(&mut self, name: &str) {
        self.nodes.get_mut(name).expect("a started node").kill();
    }

    fn get(&self, path: &str, key: &str) -> Value {
        let r = self.http.get(format!("{}{path}", self.url)).bearer_auth(key).send().unwrap();
        assert_eq!(r.status(), 200, "GET {path}");
        r.json().unwrap()
    }

    fn nodes(&self) -> Vec<Value> {
        self.get("/v0/nodes", &self.keys.admin)["data"].as_array().unwrap().clone()
    }

    fn metrics(&self) -> String {
        self.http.get(format!("{}/metrics", self.url)).send().unwrap().text().unwrap()
    }

    /// Polls `/v0/nodes` until `pred` holds of node `name`, or fails after `limit`.
    fn wait_node(&self, name: &str, what: &str, limit: Duration, pred: impl Fn(&Value) -> bool) -> Duration {
        let start = Instant::now();
        loop {
            if self.nodes().iter().any(|n| n["name"] == name && pred(n)) {
                return start.elapsed();
            }
            if start.elapsed() > limit {
                panic!("node {name} not {what} within {limit:?}: {:#?}\n{}", self.nodes(), self.logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_ready(&self, name: &str, limit: Duration) {
        self.wait_node(name, "healthy with smollm2 ready", limit, |n| n["healthy"] == true && model_ready(n));
    }

    /// Waits for `thread` until `limit`, or fails with the logs (the children die with `self`).
    fn join_within<T>(&self, thread: JoinHandle<T>, limit: Duration, what: &str) -> T {
        let start = Instant::now();
        while !thread.is_finished() {
            assert!(start.elapsed() < limit, "{what} did not finish within {limit:?}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
        thread.join().unwrap_or_else(|_| panic!("{what}: its thread panicked"))
    }

    /// The `/resolve/` requests the hub received (file downloads and registration reads).
    fn downloads(&self) -> usize {
        self.mirror.requests().iter().filter(|p| p.contains("/resolve/") && p.ends_with(FILE)).count()
    }
}

fn model_ready(node: &Value) -> bool {
    node["models"].as_array().is_some_and(|ms| ms.iter().any(|m| m["name"] == MODEL && m["state"] == "ready"))
}

fn chat(prompt: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
}

/// The value of the metric lines `name{labels} value` whose labels contain every `filter`.
fn metric(text: &str, name: &str, filters: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| filters.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One answer of the batch: which node served it (`x-llmr-node`) or what went wrong.
type Outcome = Result<String, String>;

fn answer(http: &Client, url: &str, key: &str, body: &Value) -> Outcome {
    let r = http
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let node = r.headers().get("x-llmr-node").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let text = r.text().map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("HTTP {status}: {text}"));
    }
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
    match v["choices"][0]["message"]["content"].as_str() {
        Some(c) if !c.trim().is_empty() => Ok(node),
        _ => Err(format!("no content from node {node}: {text}")),
    }
}

/// Sends `prompts` at `concurrency`; `done` counts completed requests.
fn batch(
    cluster: &Cluster,
    prompts: Vec<String>,
    concurrency: usize,
    done: Arc<AtomicUsize>,
) -> JoinHandle<Vec<Outcome>> {
    let (url, key) = (cluster.url.clone(), cluster.keys.api.clone());
    std::thread::spawn(move || {
        let http = Client::builder().timeout(REQUEST).build().unwrap();
        let next = AtomicUsize::new(0);
        let results = Mutex::new(vec![Err("not sent".to_string()); prompts.len()]);
        std::thread::scope(|s| {
            for _ in 0..concurrency {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(prompt) = prompts.get(i) else { break };
                    let outcome = answer(&http, &url, &key, &chat(prompt, 8, false));
                    results.lock().unwrap()[i] = outcome;
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        results.into_inner().unwrap()
    })
}

/// Counts of answers per node; panics with the failures and logs when any request failed.
fn served_by(cluster: &Cluster, outcomes: &[Outcome]) -> BTreeMap<String, usize> {
    let failed: Vec<(usize, &String)> =
        outcomes.iter().enumerate().filter_map(|(i, o)| o.as_ref().err().map(|e| (i, e))).collect();
    if !failed.is_empty() {
        panic!(
            "{} of {} requests failed, e.g. {:#?}\n{}",
            failed.len(),
            outcomes.len(),
            &failed[..failed.len().min(5)],
            cluster.logs()
        );
    }
    let mut counts = BTreeMap::new();
    for node in outcomes.iter().flatten() {
        *counts.entry(node.clone()).or_insert(0) += 1;
    }
    counts
}

/// Opens streams with varied prompts until one lands on `node`; returns it after its first
/// content chunk.
fn open_stream_on(cluster: &Cluster, http: &Client, node: &str) -> BufReader<Response> {
    for i in 0..40 {
        // SmolLM2 writes such stories to the token limit at temperature 0.
        let prompt = format!("Write a very long story about a dragon named Rex {i}.");
        let r = http
            .post(format!("{}/v1/chat/completions", cluster.url))
            .bearer_auth(&cluster.keys.api)
            .json(&chat(&prompt, 4000, true))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "opening a stream\n{}", cluster.logs());
        if r.headers().get("x-llmr-node").is_some_and(|v| v == node) {
            let mut reader = BufReader::new(r);
            let mut line = String::new();
            while !line.starts_with("data: ") {
                line.clear();
                assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended before its first chunk");
            }
            eprintln!("stream {i} landed on node {node}");
            return reader;
        }
        // Another node: dropping the response closes the stream there.
    }
    panic!("no stream of 40 landed on node {node}\n{}", cluster.logs());
}

#[test]
fn two_nodes_serve_through_the_router_and_a_killed_node_loses_no_request() {
    let started = Instant::now();
    let mut c = Cluster::start();

    // Registration and its guards.
    let register = |key: Option<&str>, body: &Value| {
        let mut req = c.http.post(format!("{}/v0/models", c.url)).json(body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let r = req.send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let body = json!({"repo": REPO, "name": MODEL});
    assert_eq!(register(None, &body).0, 401);
    assert_eq!(register(Some("llmr-wrong-key"), &body).0, 401);
    assert_eq!(register(Some(&c.keys.api), &body).0, 403);
    assert_eq!(register(Some(&c.keys.node), &body).0, 403);
    let (status, text) = register(Some(&c.keys.admin), &json!({"repo": REPO, "name": "../escape"}));
    assert_eq!(status, 400, "{text}");
    let (status, text) = register(Some(&c.keys.admin), &body);
    assert_eq!(status, 201, "{text}\n{}", c.logs());
    let manifest: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(manifest["primary"], FILE, "{manifest}");

    // Two nodes download the model from the hub and report it ready.
    let id_a = c.start_node("a");
    c.start_node("b");
    c.wait_ready("a", READY);
    c.wait_ready("b", READY);
    let store_a = c.stores["a"].join(MODEL).join(FILE);
    let modified = std::fs::metadata(&store_a).unwrap().modified().unwrap();
    let downloads = c.downloads();
    eprintln!("cluster ready after {:?}", started.elapsed());

    // A stream served by a, open while the batch runs and a is killed.
    // Its whole life: open until node a is killed, which waits for KILL_AFTER requests.
    let stream_http = Client::builder().timeout(2 * BATCH).build().unwrap();
    let mut stream = open_stream_on(&c, &stream_http, "a");
    let stream_rest = std::thread::spawn(move || {
        let mut events = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            match stream.read_line(&mut line) {
                Ok(0) => return Ok(events),
                Ok(_) => {
                    if let Some(data) = line.trim_end().strip_prefix("data: ") {
                        events.push(data.to_string());
                    }
                }
                Err(e) => return Err(format!("{e} after {} events", events.len())),
            }
        }
    });

    let prompts = (0..REQUESTS)
        .map(|i| format!("Request {i}: name a fruit that starts with the letter {}.", (b'a' + (i % 26) as u8) as char))
        .collect();
    let done = Arc::new(AtomicUsize::new(0));
    let batch_started = Instant::now();
    let running = batch(&c, prompts, CONCURRENCY, done.clone());
    let deadline = Instant::now() + BATCH;
    while done.load(Ordering::SeqCst) < KILL_AFTER {
        let n = done.load(Ordering::SeqCst);
        assert!(Instant::now() < deadline, "only {n} requests done in {BATCH:?}\n{}", c.logs());
        assert!(!stream_rest.is_finished(), "the stream ended before node a was killed\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!stream_rest.is_finished(), "the stream ended before node a was killed\n{}", c.logs());
    c.kill_node("a");
    let killed = Instant::now();
    eprintln!("killed node a after {} requests in {:?}", done.load(Ordering::SeqCst), batch_started.elapsed());

    // The router marks a unhealthy: at its first failed connection, or when its heartbeats stop
    // for the heartbeat timeout. Waited for, not timed: the router is busy with the batch, and a
    // slow machine must not fail the test.
    c.wait_node("a", "unhealthy", Duration::from_secs(120), |n| n["healthy"] == false);
    eprintln!("node a unhealthy {:?} after the kill", killed.elapsed());

    // The stream ends with an SSE error event.
    let events = c.join_within(stream_rest, READY, "the rest of the stream");
    let events = events.unwrap_or_else(|e| panic!("reading the stream failed: {e}\n{}", c.logs()));
    let last = events.last().expect("stream events");
    let last: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"));
    assert!(last["error"]["message"].as_str().is_some_and(|m| m.contains("node 'a'")), "{last}");
    assert!(!events.iter().any(|e| e == "[DONE]"), "a cut stream has no [DONE]");

    // No request was lost: those a could not answer were retried on b.
    let outcomes = c.join_within(running, BATCH, "the batch");
    let counts = served_by(&c, &outcomes);
    eprintln!("{REQUESTS} requests in {:?}, served by {counts:?}", batch_started.elapsed());
    assert_eq!(counts.values().sum::<usize>(), REQUESTS);
    assert!(counts.get("a").is_some_and(|&n| n > 0) && counts.get("b").is_some_and(|&n| n > 0), "{counts:?}");
    let m = c.metrics();
    eprintln!("{}", m.lines().filter(|l| l.starts_with("llmr_router_retries_total")).collect::<Vec<_>>().join("\n"));
    assert!(metric(&m, "llmr_router_retries_total", &["node=\"a\""]) >= 1.0, "{m}");
    assert_eq!(metric(&m, "llmr_router_streams_cut_total", &["node=\"a\""]), 1.0, "{m}");
    assert!(m.contains("llmr_router_node_healthy{node=\"a\"} 0"), "{m}");
    let ok = metric(&m, "llmr_router_requests_total", &["endpoint=\"chat\"", "status=\"200\""]);
    assert!(ok >= REQUESTS as f64, "{m}");

    // a restarts with its name and store: same id, ready without a download, traffic again.
    let id = c.start_node("a");
    assert_eq!(id, id_a, "a restarted node keeps its id");
    c.wait_ready("a", READY);
    assert_eq!(c.downloads(), downloads, "the restarted node downloaded again: {:#?}", c.mirror.requests());
    assert_eq!(std::fs::metadata(&store_a).unwrap().modified().unwrap(), modified, "its file was rewritten");
    let prompts = (0..20).map(|i| format!("After the restart, question {i}: what is {i} plus one?")).collect();
    let running = batch(&c, prompts, 4, Arc::new(AtomicUsize::new(0)));
    let outcomes = c.join_within(running, BATCH, "the requests after the restart");
    let counts = served_by(&c, &outcomes);
    assert!(counts.get("a").is_some_and(|&n| n > 0), "the restarted node got no traffic: {counts:?}\n{}", c.logs());
    eprintln!("after the restart: {counts:?}; whole test {:?}", started.elapsed());
}
