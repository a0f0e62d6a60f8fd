//! `llmr serve` as a real process on loopback, with the real llama.cpp plugin and real models:
//! the node behaviours the OpenAI SDK tests (tests/e2e) do not reach.
//!
//! Needs `scripts/install-engines` (the plugin in `engines/`) and `scripts/fetch-models smollm2
//! gemma3 minilm`; `scripts/test` does both first.

use reqwest::blocking::Client;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model(file: &str) -> String {
    let dir = std::env::var_os("LLMR_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/llmr/models"));
    let path = dir.join(file);
    assert!(path.is_file(), "{} is missing: run scripts/fetch-models", path.display());
    path.display().to_string()
}

struct Server {
    child: Child,
    url: String,
    http: Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(args: &[&str]) -> Server {
    let engines = repo().join("engines");
    assert!(
        engines.join("llama_cpp/cpu/libllmr_llama_cpp.so").is_file(),
        "the llama.cpp plugin is not installed: run scripts/install-engines"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_llmr"))
        // One thread: several servers run at once under `cargo test` on a small machine, and
        // llama.cpp threads that outnumber the free cores slow everyone down by orders of magnitude.
        .args(["serve", "--port", "0", "--threads", "1", "--engines-dir", engines.to_str().unwrap()])
        .args(args)
        .env("HOME", tempfile::tempdir().unwrap().keep())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("llmr serve exited before listening").unwrap();
        if let Some(rest) = line.strip_prefix("llmr listening on ") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Server { child, url, http: Client::builder().timeout(Duration::from_secs(120)).build().unwrap() }
}

impl Server {
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self.http.post(format!("{}{path}", self.url)).json(body).send().unwrap();
        (resp.status().as_u16(), resp.json().unwrap())
    }

    fn get_text(&self, path: &str) -> String {
        self.http.get(format!("{}{path}", self.url)).send().unwrap().text().unwrap()
    }

    fn health(&self) -> Value {
        serde_json::from_str(&self.get_text("/health")).unwrap()
    }
}

fn chat(model: &str, text: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 12, "temperature": 0})
}

/// The value of a metric line `name{labels} value` (summed over label sets matching `filter`).
fn metric(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Speculative decoding drafts from the prompt for an answer that copies it, counted in
/// `/metrics`; `speculative: false` turns it off for one request.
#[test]
fn speculative_decoding_is_counted_and_can_be_turned_off_per_request() {
    let s = serve(&["--model", &format!("smollm2={}", model("smollm2-135m-instruct-q4_1.gguf"))]);
    let copy = |speculative: bool, nonce: u32| {
        let mut body = chat(
            "smollm2",
            &format!("Repeat this text word for word ({nonce}): the quick brown fox jumps over the lazy dog, then the quick brown fox jumps again."),
        );
        body["max_tokens"] = json!(40);
        body["speculative"] = json!(speculative);
        let (status, answer) = s.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{answer}");
    };
    let drafted = || metric(&s.get_text("/metrics"), "llmr_spec_decode_draft_tokens_total", "smollm2");
    copy(false, 1);
    assert_eq!(drafted(), 0.0, "speculative: false drafts nothing");
    copy(true, 2);
    let after = drafted();
    assert!(after > 0.0, "a copying answer is drafted from its prompt");
    let m = s.get_text("/metrics");
    assert!(metric(&m, "llmr_spec_decode_accepted_tokens_total", "smollm2") <= after, "{m}");
    let mut bad = chat("smollm2", "x");
    bad["speculative"] = json!("yes");
    let (status, e) = s.post("/v1/chat/completions", &bad);
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("speculative")), "{e}");
}

/// Under a dynamic KV policy the llama.cpp plugin evicts middle chunks of a sequence that fills
/// its context, so a request may ask for more tokens than the context holds and get them; without
/// the policy the same request is a 400 that names the context.
#[test]
fn a_dynamic_kv_policy_lets_an_answer_outgrow_its_context() {
    let gguf = format!("smollm2={}", model("smollm2-135m-instruct-q4_1.gguf"));
    // Counting goes on as long as it is let; 240 tokens are far more than a 128-token context holds.
    let body = json!({"model": "smollm2", "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 240, "temperature": 0});
    let plain = serve(&["--model", &gguf, "--ctx-size", "128"]);
    let (status, e) = plain.post("/v1/completions", &body);
    assert_eq!((status, e["error"]["code"].as_str()), (400, Some("context_length_exceeded")), "{e}");
    drop(plain);

    let s = serve(&["--model", &gguf, "--ctx-size", "128", "--kv-policy", r#"{"mode": "dynamic"}"#]);
    let (status, answer) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{answer}");
    let (prompt, completion) =
        (answer["usage"]["prompt_tokens"].as_u64().unwrap(), answer["usage"]["completion_tokens"].as_u64().unwrap());
    assert!(prompt + completion > 128, "{answer}");
    let text = answer["choices"][0]["text"].as_str().unwrap();
    assert!(text.contains("40,"), "the count goes on past the context: {text:?}");
}

#[test]
fn temperature_zero_answers_are_cached_and_metrics_count_them() {
    let s = serve(&["--model", &format!("smollm2={}", model("smollm2-135m-instruct-q4_1.gguf"))]);
    let (status, first) = s.post("/v1/chat/completions", &chat("smollm2", "Name a color."));
    assert_eq!(status, 200, "{first}");
    let (_, second) = s.post("/v1/chat/completions", &chat("smollm2", "Name a color."));
    assert_eq!(first["choices"][0]["message"], second["choices"][0]["message"]);
    assert_eq!(first["usage"]["completion_tokens"], second["usage"]["completion_tokens"]);
    let m = s.get_text("/metrics");
    assert_eq!(metric(&m, "llmr_generation_cache_hits_total", "smollm2"), 1.0, "{m}");
    // The first request generated; the second was replayed (not counted as generated again).
    let generated = metric(&m, "llmr_generated_tokens_total", "smollm2");
    assert_eq!(generated, first["usage"]["completion_tokens"].as_f64().unwrap(), "{m}");
    assert_eq!(metric(&m, "llmr_time_to_first_token_seconds_count", "smollm2"), 1.0, "{m}");
    assert!(metric(&m, "llmr_inter_token_latency_seconds_count", "smollm2") >= 1.0, "{m}");
    assert_eq!(metric(&m, "llmr_requests_total", "chat"), 2.0, "{m}");
    assert_eq!(metric(&m, "llmr_models_loaded", ""), 1.0, "{m}");
    assert!(m.contains("llmr_kv_cache_usage_ratio{model=\"smollm2\"}"), "{m}");
    assert!(m.contains("llmr_queue_depth{model=\"smollm2\"} 0"), "{m}");

    // A different setting is a different answer: not a hit.
    let mut other = chat("smollm2", "Name a color.");
    other["max_tokens"] = json!(3);
    let (_, third) = s.post("/v1/chat/completions", &other);
    assert_eq!(third["usage"]["completion_tokens"], 3);
    assert_eq!(metric(&s.get_text("/metrics"), "llmr_generation_cache_hits_total", ""), 1.0);

    // An unknown model is refused by the embedded router, counted with its status; the
    // proxied requests are counted per node.
    let (status, _) = s.post("/v1/chat/completions", &chat("nope", "x"));
    assert_eq!(status, 404);
    let m = s.get_text("/metrics");
    assert_eq!(metric(&m, "llmr_router_rejected_total", "status=\"404\""), 1.0, "{m}");
    assert_eq!(metric(&m, "llmr_router_requests_total", "node=\"local\",status=\"200\""), 3.0, "{m}");
    assert_eq!(metric(&m, "llmr_router_node_healthy", "local"), 1.0, "{m}");
}

#[test]
fn the_cache_can_be_turned_off() {
    let s = serve(&["--cache-mib", "0", "--model", &format!("smollm2={}", model("smollm2-135m-instruct-q4_1.gguf"))]);
    for _ in 0..2 {
        assert_eq!(s.post("/v1/chat/completions", &chat("smollm2", "Name a color.")).0, 200);
    }
    let m = s.get_text("/metrics");
    assert_eq!(metric(&m, "llmr_generation_cache_hits_total", ""), 0.0);
    assert_eq!(metric(&m, "llmr_time_to_first_token_seconds_count", "smollm2"), 2.0, "{m}");
}

#[test]
fn idle_models_are_unloaded_least_recently_used_first_under_the_memory_budget() {
    // Footprints (weights + KV allowance): SmolLM2 162 MB, MiniLM 110 MB, Gemma 3 317 MB. All three
    // do not fit in 450 MiB (472 MB); Gemma with MiniLM does.
    let s = serve(&[
        "--memory-budget-mib",
        "450",
        "--model",
        &format!("smollm2={}", model("smollm2-135m-instruct-q4_1.gguf")),
        "--model",
        &format!("gemma3={}", model("gemma-3-270m-q4_k_m.gguf")),
        "--model",
        &format!("minilm={}", model("all-minilm-l6-v2-f16.gguf")),
    ]);
    assert_eq!(s.post("/v1/chat/completions", &chat("smollm2", "Hi")).0, 200);
    assert_eq!(s.health()["models_loaded"], json!(["smollm2"]));
    // MiniLM is small: it fits beside SmolLM2.
    let (status, emb) = s.post("/v1/embeddings", &json!({"model": "minilm", "input": "hello"}));
    assert_eq!(status, 200, "{emb}");
    assert_eq!(s.health()["models_loaded"], json!(["minilm", "smollm2"]));
    // Gemma needs room: SmolLM2 was used least recently, so it goes, and only it.
    assert_eq!(s.post("/v1/chat/completions", &chat("gemma3", "Hi")).0, 200);
    let loaded = s.health()["models_loaded"].clone();
    assert_eq!(loaded, json!(["gemma3", "minilm"]), "{loaded}");
    // And it comes back on demand.
    assert_eq!(s.post("/v1/chat/completions", &chat("smollm2", "Hello there")).0, 200);
    assert!(s.health()["models_loaded"].as_array().unwrap().contains(&json!("smollm2")));
}

#[test]
fn oversized_bodies_wrong_keys_and_wrong_model_kinds_are_clear_errors() {
    let s = serve(&[
        "--api-key",
        "sekrit",
        "--body-limit-mib",
        "1",
        "--model",
        &format!("smollm2={}", model("smollm2-135m-instruct-q4_1.gguf")),
        "--model",
        &format!("minilm={}", model("all-minilm-l6-v2-f16.gguf")),
    ]);
    let post = |key: &str, body: String| {
        let r = s
            .http
            .post(format!("{}/v1/chat/completions", s.url))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap())
    };
    let (status, body) = post("wrong", chat("smollm2", "x").to_string());
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let big = json!({"model": "smollm2", "messages": [{"role": "user", "content": "x".repeat(2 << 20)}]});
    let (status, body) = post("sekrit", big.to_string());
    assert_eq!(status, 413, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("1048576"), "{body}");
    let (status, body) = post("sekrit", chat("minilm", "x").to_string());
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "model");
    assert!(body["error"]["message"].as_str().unwrap().contains("embedding model"), "{body}");
    // Health and metrics stay open for probes.
    assert_eq!(s.health()["status"], "ok");
    // Unknown routes are OpenAI-shaped 404s.
    let r = s.http.get(format!("{}/v1/nothing", s.url)).bearer_auth("sekrit").send().unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert!(r.json::<Value>().unwrap()["error"]["message"].as_str().unwrap().contains("/v1/nothing"));
}

#[test]
fn a_public_address_needs_an_api_key() {
    let out = Command::new(env!("CARGO_BIN_EXE_llmr"))
        .args(["serve", "--host", "0.0.0.0", "--port", "0", "--model", &model("smollm2-135m-instruct-q4_1.gguf")])
        .env("HOME", tempfile::tempdir().unwrap().keep())
        .env_remove("LLMR_API_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to listen on 0.0.0.0 without an API key"), "{err}");
}

/// A model folder of the fetch-models cache (`smollm2-hf`: SmolLM2 in Hugging Face layout).
fn model_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(model(&format!("{name}/config.json")));
    dir.parent().unwrap().to_path_buf()
}

#[test]
fn a_safetensors_folder_is_served_beside_a_gguf_and_a_corrupt_one_harms_nothing() {
    let hf = model_dir("smollm2-hf");
    // The same folder with its weights cut short: a download that stopped half way.
    let broken = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(hf.join(f), broken.path().join(f)).unwrap();
    }
    let weights = std::fs::read(hf.join("model.safetensors")).unwrap();
    std::fs::write(broken.path().join("model.safetensors"), &weights[..weights.len() / 3]).unwrap();
    let s = serve(&[
        "--model",
        &format!("smol-st={}", hf.display()),
        "--model",
        &format!("smol-gguf={}", model("smollm2-135m-instruct-q4_1.gguf")),
        "--model",
        &format!("broken={}", broken.path().display()),
    ]);
    let ask = |model: &str| {
        let mut body = chat(model, "What is the capital of France?");
        body["max_tokens"] = json!(24);
        s.post("/v1/chat/completions", &body)
    };
    let (status, st) = ask("smol-st");
    assert_eq!(status, 200, "{st}");
    let answer = st["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(answer.contains("Paris"), "{st}");
    let (status, gguf) = ask("smol-gguf");
    assert_eq!(status, 200, "{gguf}");
    // The same weights through two engines and two tokenizers: the same prompt length.
    assert_eq!(st["usage"]["prompt_tokens"], gguf["usage"]["prompt_tokens"]);
    // Streaming goes through the same pipeline.
    let mut body = chat("smol-st", "Count to five.");
    body["stream"] = json!(true);
    let text = s.http.post(format!("{}/v1/chat/completions", s.url)).json(&body).send().unwrap().text().unwrap();
    assert!(text.matches("data: {").count() > 3 && text.trim_end().ends_with("data: [DONE]"), "{text}");
    // Embeddings from the safetensors decoder (its last token's hidden state) as from the GGUF.
    let embed = |model: &str| s.post("/v1/embeddings", &json!({"model": model, "input": ["Paris is in France."]}));
    let (status, st) = embed("smol-st");
    assert_eq!(status, 200, "{st}");
    assert_eq!(st["data"][0]["embedding"].as_array().unwrap().len(), 576, "SmolLM2's hidden size");
    let (status, gguf) = embed("smol-gguf");
    assert_eq!(status, 200, "{gguf}");
    assert_eq!(st["usage"]["prompt_tokens"], gguf["usage"]["prompt_tokens"]);
    // The truncated checkpoint fails to load with an error that says so; nothing else is hurt.
    let (status, err) = ask("broken");
    assert!(status >= 500, "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("model.safetensors") && message.contains("corrupt"), "{err}");
    assert_eq!(ask("smol-st").0, 200);
    let models = s.get_text("/v1/models");
    assert!(models.contains("\"smol-st\"") && models.contains("\"broken\""), "{models}");
}

/// A port free a moment ago on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn the_kv_control_api_sets_the_policy_live_and_reports_the_cache_on_loopback_only() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metrics.jsonl");
    // SmolLM2's files linked into a folder with a calibration table (`kv-eval --calibrate`'s).
    let calibrated = dir.path().join("smollm2-hf");
    std::fs::create_dir(&calibrated).unwrap();
    for entry in std::fs::read_dir(model_dir("smollm2-hf")).unwrap() {
        let entry = entry.unwrap();
        if !entry.file_name().to_string_lossy().starts_with('.') {
            std::os::unix::fs::symlink(entry.path(), calibrated.join(entry.file_name())).unwrap();
        }
    }
    let table = json!({"model": "smollm2-hf", "corpus": "test", "ctx": 2048,
        "cost": {"int8": 1.0, "int4": 3.0, "evicted": 30.0}, "points": []});
    std::fs::write(calibrated.join(".llmr-kv-calibration.json"), table.to_string()).unwrap();
    let s = serve(&[
        "--model",
        &format!("smol-st={}", calibrated.display()),
        "--model",
        &format!("smol-gguf={}", model("smollm2-135m-instruct-q4_1.gguf")),
        "--control-port",
        &port.to_string(),
        "--metrics-file",
        file.to_str().unwrap(),
        "--kv-policy",
        r#"{"mode": "dynamic", "profile": "safe"}"#,
    ]);
    let control = format!("http://127.0.0.1:{port}");
    let get = |path: &str| s.http.get(format!("{control}{path}")).send().unwrap().json::<Value>().unwrap();
    let post = |path: &str, body: String| {
        let r = s.http.post(format!("{control}{path}")).header("content-type", "application/json").body(body);
        let r = r.send().unwrap();
        let status = r.status().as_u16();
        (status, r.text().unwrap())
    };
    assert_eq!(get("/v1/health")["status"], "ok");
    // A long prompt, so that blocks leave the 64-token window and the policy stores them int8.
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(40);
    let (status, body) = s.post("/v1/chat/completions", &chat("smol-st", &long));
    assert_eq!(status, 200, "{body}");
    assert_eq!(s.post("/v1/chat/completions", &chat("smol-gguf", "Hello")).0, 200);
    let m = get("/v1/metrics");
    assert_eq!(m["kv_policy"]["profile"], "safe", "{m}");
    assert!(m["ftl_ms"].as_f64().is_some_and(|t| t > 0.0) && m["p95_ms"].as_f64() >= m["ftl_ms"].as_f64(), "{m}");
    let native = m["models"].as_array().unwrap().iter().find(|x| x["model"] == "smol-st").unwrap().clone();
    assert_eq!(native["kv_policy"]["profile"], "safe", "{m}");
    assert!(native["policy_passes_total"].as_u64().unwrap() > 0, "{m}");
    // Recall is on (the copies are kept by default); `safe` never evicts, so nothing is read.
    assert_eq!(native["kv_recalls_total"], 0, "{m}");
    assert!(m["mem"]["kv_bytes"].as_u64().unwrap() > 0 && m["mem"]["host_gb"].as_f64().unwrap() > 0.0, "{m}");
    // The estimate is the calibrated model's (the GGUF one has no table): between int8's cost
    // and 0, since its finished request's blocks are f16 or int8 under `safe`.
    let est = m["quality"]["delta_ppl_est"].as_f64().unwrap_or_else(|| panic!("no estimate: {m}"));
    assert!((est - native["delta_ppl_est"].as_f64().unwrap()).abs() < 1e-3, "{m}");
    assert!((0.0..=1.0).contains(&est), "{m}");

    // Changed live, without a restart: the loaded model takes it from its next step.
    assert_eq!(post("/v1/policy", json!({"kv": {"profile": "aggressive", "recent_window": 128}}).to_string()).0, 204);
    let m = get("/v1/metrics");
    let native = m["models"].as_array().unwrap().iter().find(|x| x["model"] == "smol-st").unwrap().clone();
    assert_eq!(
        (native["kv_policy"]["profile"].as_str(), native["kv_policy"]["recent_window"].as_u64()),
        (Some("aggressive"), Some(128))
    );
    assert_eq!(s.post("/v1/chat/completions", &chat("smol-st", &long)).0, 200);

    // Bad input: a 400 naming the field, and the running policy unchanged.
    for (body, field) in [
        (json!({"kv": {"recent_window": 4}}).to_string(), "kv.recent_window"),
        (json!({"kv": {"pressure": {"mid": 0.9, "high": 0.5}}}).to_string(), "kv.pressure"),
        (json!({"kv": {"modes": "dynamic"}}).to_string(), "modes"),
        (json!({"kv": {}, "io": {"enable_iobinding": true}}).to_string(), "io"),
        ("{\"kv\": ".to_string(), "malformed JSON"),
    ] {
        let (status, text) = post("/v1/policy", body.clone());
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(field), "{body}: {text}");
    }
    assert_eq!(get("/v1/metrics")["kv_policy"]["profile"], "aggressive");
    assert_eq!(
        post(
            "/v1/run-context",
            json!({"seq_len": 1024, "batch": 4, "target_ftl_ms": 300, "quality_budget": 0.5}).to_string()
        )
        .0,
        204
    );
    assert_eq!(post("/v1/run-context", json!({"seq_len": 0, "batch": 4}).to_string()).0, 400);
    let (status, text) = post("/v1/run-context", json!({"seq_len": 1, "batch": 1, "quality_budget": -1}).to_string());
    assert!(status == 400 && text.contains("quality_budget"), "{status}: {text}");
    assert_eq!(get("/v1/metrics")["run_context"]["batch"], 4);

    // The slow loop under that quality budget (0.5%): the calibrated model runs `aggressive`
    // (int4 outside its 128-token window), which its table prices at 3% for a whole cache, so
    // while a long request runs the estimate passes the budget. The loop first shifts the
    // profile's thresholds down, a step at a time to the end of their range (four steps at
    // least), then switches the model to a safer profile. Requests run one after another until
    // it does (the estimate counts the blocks of running requests only).
    let native_profile = |m: &Value| {
        let native = m["models"].as_array().unwrap().iter().find(|x| x["model"] == "smol-st").unwrap();
        native["kv_policy"]["profile"].as_str().unwrap().to_string()
    };
    assert_eq!(native_profile(&get("/v1/metrics")), "aggressive");
    let mut copy = chat("smol-st", &format!("Repeat this text exactly:\n\n{long}"));
    copy["max_tokens"] = json!(300);
    // One token a step, as the workload was sized: with speculation on, the re-fits alone (down
    // and back up, seven in 180 s) held the estimate about the budget without reaching the end of
    // their range, so the switch this checks never came.
    copy["speculative"] = json!(false);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let m = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (status, body) = s.post("/v1/chat/completions", &copy);
                assert_eq!(status, 200, "{body}");
            }
        });
        let start = std::time::Instant::now();
        let m = loop {
            let m = get("/v1/metrics");
            if native_profile(&m) != "aggressive" || start.elapsed() > Duration::from_secs(180) {
                break m;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        m
    });
    assert_ne!(native_profile(&m), "aggressive", "the loop switched the over-budget model: {m}");
    assert!(m["kv_profile_switches_total"].as_u64().unwrap() >= 1, "{m}");
    assert!(m["kv_threshold_refits_total"].as_u64().unwrap() >= 4, "{m}");

    // The control API is not on the public listener.
    let r = s.http.post(format!("{}/v1/policy", s.url)).json(&json!({"kv": {}})).send().unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // The metrics file: a line a second, figures only.
    let start = std::time::Instant::now();
    let lines = loop {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        if text.lines().count() >= 2 || start.elapsed() > Duration::from_secs(60) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let last: Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert!(last["t"].as_f64().is_some() && last["mem"]["kv_levels"].is_object(), "{last}");
    assert!(!lines.contains("quick brown fox"), "no user text in the metrics file");
}

#[test]
fn response_formats_give_documents_that_parse_from_both_engines() {
    let s = serve(&[
        "--model",
        &format!("smol-st={}", model_dir("smollm2-hf").display()),
        "--model",
        &format!("smol-gguf={}", model("smollm2-135m-instruct-q4_1.gguf")),
    ]);
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20},
        "population_millions": {"type": "number"}},
        "required": ["city", "country", "population_millions"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "json_schema": {"name": "capital", "strict": true, "schema": schema}});
    for name in ["smol-st", "smol-gguf"] {
        // Sampled hot, where an unconstrained 135M model rarely writes the document asked for.
        let mut body = chat(name, "Name the capital of France as JSON.");
        body["max_tokens"] = json!(100);
        body["temperature"] = json!(1.3);
        body["seed"] = json!(5);
        body["response_format"] = format.clone();
        let (status, answer) = s.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{name}: {answer}");
        assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{name}: {answer}");
        let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
        let doc: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{name}: {content:?}: {e}"));
        assert!(
            doc["city"].is_string() && doc["country"].is_string() && doc["population_millions"].is_number(),
            "{doc}"
        );
        // Streamed, `json_object`: the deltas add up to one object.
        let mut body = chat(name, "Describe Paris as JSON.");
        body["max_tokens"] = json!(200);
        body["stream"] = json!(true);
        body["response_format"] = json!({"type": "json_object"});
        let text = s.http.post(format!("{}/v1/chat/completions", s.url)).json(&body).send().unwrap().text().unwrap();
        let mut content = String::new();
        let mut finish = None;
        for line in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|l| *l != "[DONE]") {
            let chunk: Value = serde_json::from_str(line).unwrap();
            content.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or_default());
            finish = finish.or(chunk["choices"][0]["finish_reason"].as_str().map(str::to_owned));
        }
        match finish.as_deref() {
            Some("stop") => {
                assert!(serde_json::from_str::<Value>(&content).is_ok_and(|v| v.is_object()), "{content:?}")
            }
            // An honest cut: the object was still open at max_tokens.
            Some("length") => assert!(content.starts_with('{'), "{content:?}"),
            other => panic!("{name}: finish {other:?}: {text}"),
        }
        // A schema the grammar engine cannot compile is the client's error, on its field.
        let mut body = chat(name, "hi");
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "nonsense"}}});
        let (status, e) = s.post("/v1/chat/completions", &body);
        assert_eq!((status, e["error"]["param"].as_str()), (400, Some("response_format.json_schema.schema")), "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains("nonsense"), "{e}");
    }
}

#[test]
fn prompts_and_embedding_inputs_may_be_token_ids() {
    let s = serve(&[
        "--model",
        &format!("smol-st={}", model_dir("smollm2-hf").display()),
        "--model",
        &format!("smol-gguf={}", model("smollm2-135m-instruct-q4_1.gguf")),
    ]);
    // SmolLM2's ids of "The capital of France is" (llama.cpp and the tokenizer.json agree).
    let ids = json!([504, 3575, 282, 4649, 314]);
    for name in ["smol-st", "smol-gguf"] {
        let text = json!({"model": name, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0});
        let (status, by_text) = s.post("/v1/completions", &text);
        assert_eq!(status, 200, "{by_text}");
        let (status, by_ids) =
            s.post("/v1/completions", &json!({"model": name, "prompt": ids, "max_tokens": 6, "temperature": 0}));
        assert_eq!(status, 200, "{by_ids}");
        assert_eq!(by_ids["usage"]["prompt_tokens"], 5, "the ids as given: {by_ids}");
        // SmolLM2 adds no BOS to a raw prompt: the same five tokens, the same answer.
        assert_eq!(by_ids["choices"][0]["text"], by_text["choices"][0]["text"], "{by_ids}");
        assert!(by_ids["choices"][0]["text"].as_str().unwrap().contains("Paris"), "{by_ids}");
        let (status, e) = s.post("/v1/completions", &json!({"model": name, "prompt": [504, 49152], "max_tokens": 2}));
        assert_eq!((status, e["error"]["param"].as_str()), (400, Some("prompt[1]")), "{e}");
        let (status, emb) = s.post("/v1/embeddings", &json!({"model": name, "input": [[504, 3575], [282]]}));
        assert_eq!(status, 200, "{emb}");
        assert_eq!((emb["data"].as_array().unwrap().len(), emb["usage"]["prompt_tokens"].as_u64()), (2, Some(3)));
        let (status, e) = s.post("/v1/embeddings", &json!({"model": name, "input": [[504], [99999]]}));
        assert_eq!((status, e["error"]["param"].as_str()), (400, Some("input[1][0]")), "{e}");
    }
}

#[test]
fn a_models_recommended_sampling_fills_what_a_request_leaves_unset() {
    // SmolLM2's folder, recommending greedy decoding (its own ships no recommendation).
    let hf = model_dir("smollm2-hf");
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(hf.join(f), dir.path().join(f)).unwrap();
    }
    std::os::unix::fs::symlink(hf.join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    std::fs::write(dir.path().join("generation_config.json"), r#"{"eos_token_id": 2, "temperature": 0.0}"#).unwrap();
    let s = serve(&["--cache-mib", "0", "--model", &format!("greedy={}", dir.path().display())]);
    let ask = |extra: Value| {
        let mut body =
            json!({"model": "greedy", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 24});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, answer) = s.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{answer}");
        answer["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
    };
    let greedy = ask(json!({"temperature": 0}));
    // No temperature: the model's 0, not OpenAI's 1 (unseeded, two answers at 1 would differ).
    assert_eq!(ask(json!({})), greedy);
    assert_eq!(ask(json!({})), greedy);
    // A client's own temperature wins.
    let hot: Vec<String> = (0..3).map(|seed| ask(json!({"temperature": 1.5, "seed": seed}))).collect();
    assert!(hot.iter().any(|a| *a != greedy), "{hot:?}");
}
