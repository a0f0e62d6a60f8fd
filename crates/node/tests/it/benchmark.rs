//! Benchmark-driven engine choice (spec 000) with two real plugins that both run the echo
//! architecture: the Rust echo plugin, made slow (25 ms between tokens) and first by
//! precedence, and the C template. The node benchmarks both in engine workers, moves the model
//! to the faster, keeps the figures across a restart, and measures a new version again.

use crate::support::{gguf_model, install_c_echo, serve, wait_until, worker_node_config};
use llmr_model_store::ModelDescriptor;
use llmr_node::{ModelManager, Node, NodeConfig};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;

fn set_builtin(plugin_dir: &Path, builtin: bool) {
    let path = plugin_dir.join("manifest.json");
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    manifest["builtin"] = json!(builtin);
    crate::support::replace_file(&path, &serde_json::to_vec_pretty(&manifest).unwrap());
}

fn config(engines: &Path, model: ModelDescriptor, book: &Path) -> NodeConfig {
    NodeConfig { benchmarks_file: Some(book.to_path_buf()), ..worker_node_config(engines, vec![model]) }
}

async fn answer(url: &str) -> String {
    let body = json!({"model": "m", "prompt": "one two three", "max_tokens": 8});
    let resp = reqwest::Client::new().post(format!("{url}/v1/completions")).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    v["choices"][0]["text"].as_str().unwrap().to_owned()
}

fn engine_of(models: &Arc<ModelManager>) -> String {
    models.entry("m").unwrap().plugin.id().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_best_engine_serves_once_benchmarked_and_a_new_version_is_measured_again() {
    let dir = tempfile::tempdir().unwrap();
    let engines = dir.path().join("engines");
    // The slow one comes first by precedence (third-party before built-in).
    llmr_testkit::echo_engines(&engines, 25);
    set_builtin(&engines.join("echo/cpu"), false);
    let c_echo = engines.join("c_echo/cpu");
    install_c_echo(&c_echo, "0.1.0", &[]);
    set_builtin(&c_echo, true);
    let desc = gguf_model(dir.path(), "m", "echo");
    let book = dir.path().join("store/.engine-benchmarks.json");

    let node = Node::new(config(&engines, desc.clone(), &book)).unwrap();
    let models = node.models().clone();
    assert_eq!(engine_of(&models), "echo", "before any benchmark, precedence decides");
    let (url, stop) = serve(node).await;
    // Requests are served while the benchmark runs.
    assert_eq!(answer(&url).await, "one two three");
    wait_until(120, "the benchmark moves m to the faster engine", || engine_of(&models) == "c_echo").await;
    let figures = models.benchmarks_of(&desc);
    let of = |id: &str| figures.iter().find(|b| b.engine_id == id).unwrap_or_else(|| panic!("{id}: {figures:?}"));
    let (slow, fast) = (of("echo"), of("c_echo"));
    assert!(fast.tokens_per_second > 2.0 * slow.tokens_per_second, "{figures:?}");
    // 25 ms between tokens: at most 40 tokens a second.
    assert!(slow.tokens_per_second < 45.0, "{figures:?}");
    assert!(slow.peak_memory_bytes > 0 && fast.peak_memory_bytes > 0, "the workers' peak RSS: {figures:?}");
    assert_eq!((fast.engine_version.as_str(), slow.engine_version.as_str()), ("0.1.0", "0.1.0"));
    assert_eq!(answer(&url).await, "one two three");
    assert_eq!(models.loaded().iter().find(|m| m.name == "m").unwrap().engine_id(), "c_echo");
    drop(stop);

    // A restarted node reads the figures back and starts on the faster engine.
    let node = Node::new(config(&engines, desc.clone(), &book)).unwrap();
    let models = node.models().clone();
    assert_eq!(engine_of(&models), "c_echo", "the kept benchmarks decide at once");
    let (url, _stop) = serve(node).await;

    // A new version of an engine is measured again (its old figures no longer count).
    install_c_echo(&c_echo, "0.2.0", &["-DECHO_VERSION=\"0.2.0\""]);
    let measured_again =
        || models.benchmarks_of(&desc).iter().any(|b| b.engine_id == "c_echo" && b.engine_version == "0.2.0");
    wait_until(120, "c_echo 0.2.0 is benchmarked", measured_again).await;
    assert_eq!(engine_of(&models), "c_echo");
    assert_eq!(models.registry().get("c_echo").unwrap().manifest.version.to_string(), "0.2.0");
    assert_eq!(answer(&url).await, "one two three");
    let kept: serde_json::Value = serde_json::from_slice(&std::fs::read(&book).unwrap()).unwrap();
    assert_eq!(kept.as_array().unwrap().len(), 2, "one benchmark per engine: {kept}");
}
