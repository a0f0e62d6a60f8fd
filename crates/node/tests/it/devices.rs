//! Spec 003's multi-GPU placement on a node described by an injected device inventory (this
//! machine has no GPU): the echo plugin installed as a CUDA plugin, each model in an engine
//! worker, and the GPU each instance was created for read back from the plugin's own metrics.

use crate::support::{gguf_model, serve, wait_until, worker_node_config};
use llmr_engine_host::GpuBackend;
use llmr_node::{Device, DeviceInventory, ModelManager, Node, NodeConfig};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};

const GIB: u64 = 1 << 30;

fn gpu(index: u32, total_gib: u64, free_gib: u64) -> Device {
    Device {
        index,
        name: format!("Test GPU {index}"),
        memory_total_bytes: total_gib * GIB,
        memory_free_bytes: free_gib * GIB,
    }
}

/// The echo plugin (crashing on demand) as a CUDA plugin: `engines/echo/cuda/`.
fn cuda_echo_engines(root: &Path) -> std::path::PathBuf {
    let dir = root.join("echo/cuda");
    std::fs::create_dir_all(&dir).unwrap();
    let mut manifest = llmr_testkit::echo_manifest();
    manifest["runtimes"] = json!(["LlamaCpp"]);
    manifest["gpu_backends"] = json!(["cuda"]);
    manifest["parameters"] = json!({ "crash_on_demand": true, "token_delay_ms": 10 });
    manifest.as_object_mut().unwrap().remove("$schema");
    std::fs::write(dir.join("manifest.json"), serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
    let lib = llmr_testkit::echo_library();
    std::fs::copy(&lib, dir.join(lib.file_name().unwrap())).unwrap();
    root.to_path_buf()
}

struct Running {
    url: String,
    models: Arc<ModelManager>,
    gpus: Arc<Mutex<Vec<Device>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

/// A node with the GPUs `gpus` and echo models of these (name, bytes on disk), copies of each
/// on `replicas` GPUs.
async fn start(gpus: Vec<Device>, models: &[(&str, u64)], replicas: u32) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let engines = cuda_echo_engines(&dir.path().join("engines"));
    let descs = models
        .iter()
        .map(|(name, size)| {
            let mut desc = gguf_model(dir.path(), name, "echo");
            // What the placement counts: the model as big as said (the echo engine reads nothing).
            desc.size_bytes = *size;
            desc
        })
        .collect();
    let gpus = Arc::new(Mutex::new(gpus));
    let read = gpus.clone();
    let node = Node::new(NodeConfig {
        devices: DeviceInventory::new(GpuBackend::Cuda, move || read.lock().unwrap().clone()),
        gpu_replicas: replicas,
        memory_probe: llmr_node::memory_guard::MemoryProbe(Arc::new(|| None)),
        ..worker_node_config(&engines, descs)
    })
    .unwrap();
    let models = node.models().clone();
    let (url, stop) = serve(node).await;
    Running { url, models, gpus, _stop: stop, _dir: dir }
}

async fn complete(url: &str, model: &str, prompt: &str) -> (u16, Value) {
    let body = json!({"model": model, "prompt": prompt, "max_tokens": 8});
    let resp = reqwest::Client::new().post(format!("{url}/v1/completions")).json(&body).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// (node's device, the plugin's own `device_id`) of each loaded copy of `model`, sorted.
fn placed(models: &ModelManager, model: &str) -> Vec<(Option<u32>, i64)> {
    let mut out: Vec<_> = models
        .loaded()
        .iter()
        .filter(|m| m.name == model && m.engine.exit_reason().is_none())
        .map(|m| (m.device, m.engine.metrics().unwrap()["device_id"].as_i64().unwrap()))
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_model_goes_to_the_gpu_with_the_most_free_memory_checked_before_each_load() {
    let node = start(vec![gpu(0, 16, 4), gpu(1, 16, 12), gpu(2, 16, 8)], &[("a", GIB), ("b", GIB)], 1).await;
    assert_eq!(complete(&node.url, "a", "one two").await.0, 200);
    assert_eq!(placed(&node.models, "a"), [(Some(1), 1)], "GPU 1 has the most free memory");
    // Something else takes GPU 1's memory: the next model goes to GPU 2.
    node.gpus.lock().unwrap()[1].memory_free_bytes = 2 * GIB;
    assert_eq!(complete(&node.url, "b", "one two").await.0, 200);
    assert_eq!(placed(&node.models, "b"), [(Some(2), 2)]);
    // What the node reports to a router.
    let reported: Vec<u64> = node.models.gpus().iter().map(|g| g.memory_free_bytes / GIB).collect();
    assert_eq!(reported, [4, 2, 8]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_room_on_any_gpu_idle_models_are_unloaded_and_then_it_is_a_503() {
    // One 4 GiB GPU; each model takes 2.5 GiB and its KV allowance: one fits at a time.
    let big = 5 * GIB / 2;
    let node = start(vec![gpu(0, 4, 4)], &[("a", big), ("b", big), ("huge", 8 * GIB)], 1).await;
    assert_eq!(complete(&node.url, "a", "one").await.0, 200);
    assert_eq!(placed(&node.models, "a"), [(Some(0), 0)]);
    // The node counts what it placed even where the driver's figure lags.
    assert_eq!(complete(&node.url, "b", "one").await.0, 200);
    assert_eq!(placed(&node.models, "b"), [(Some(0), 0)]);
    assert!(placed(&node.models, "a").is_empty(), "a was idle: unloaded to make room for b");
    // With b busy, nothing can make room for a.
    let busy = {
        let (url, words) = (node.url.clone(), vec!["w"; 300].join(" "));
        tokio::spawn(async move {
            let body = json!({"model": "b", "prompt": words, "max_tokens": 300});
            reqwest::Client::new().post(format!("{url}/v1/completions")).json(&body).send().await.unwrap().status()
        })
    };
    let models = node.models.clone();
    wait_until(30, "b is busy", || models.loaded().iter().any(|m| m.name == "b" && !m.is_idle())).await;
    let (status, body) = complete(&node.url, "a", "one").await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("no GPU has room for `a`"), "{body}");
    assert_eq!(busy.await.unwrap(), 200, "the busy model kept serving");
    // A model larger than any one GPU is left to the engine, which spreads it (no device given).
    assert_eq!(complete(&node.url, "huge", "one").await.0, 200);
    assert_eq!(placed(&node.models, "huge"), [(None, -1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_take_requests_in_turn_and_a_crashed_one_is_skipped_until_it_is_back() {
    let node = start(vec![gpu(0, 16, 4), gpu(1, 16, 12), gpu(2, 16, 8)], &[("a", GIB)], 2).await;
    assert_eq!(complete(&node.url, "a", "one two").await.0, 200);
    assert_eq!(placed(&node.models, "a"), [(Some(1), 1), (Some(2), 2)], "the two GPUs with the most free memory");
    for _ in 0..10 {
        assert_eq!(complete(&node.url, "a", "one two").await.0, 200);
    }
    let mut served: Vec<u64> =
        node.models.loaded().iter().map(|m| m.requests.load(std::sync::atomic::Ordering::Relaxed)).collect();
    served.sort();
    // 11 requests in turn: 5 and 6.
    assert_eq!(served, [5, 6], "round robin");

    let (status, body) = complete(&node.url, "a", "LLMR_CRASH_SEGFAULT").await;
    assert_eq!(status, 500, "{body}");
    // The other replica serves every request while the crashed one is reloaded.
    for _ in 0..10 {
        let (status, body) = complete(&node.url, "a", "still here").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["text"], "still here");
    }
    let models = node.models.clone();
    wait_until(60, "both replicas serve again", || placed(&models, "a").len() == 2).await;
    assert_eq!(placed(&node.models, "a"), [(Some(1), 1), (Some(2), 2)], "back on the GPU it left");
}

/// Spec 000's memory guard on GPUs: a GPU past 90% in use (as its driver reports it) has its
/// idle models unloaded; the models on other GPUs stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gpu_past_ninety_percent_unloads_its_idle_models_only() {
    let node = start(vec![gpu(0, 16, 10), gpu(1, 16, 12)], &[("a", GIB), ("b", GIB)], 1).await;
    assert_eq!(complete(&node.url, "a", "one").await.0, 200);
    node.gpus.lock().unwrap()[1].memory_free_bytes = 6 * GIB;
    assert_eq!(complete(&node.url, "b", "one").await.0, 200);
    assert_eq!((placed(&node.models, "a"), placed(&node.models, "b")), (vec![(Some(1), 1)], vec![(Some(0), 0)]));
    // Another process fills GPU 0.
    node.gpus.lock().unwrap()[0].memory_free_bytes = GIB;
    let models = node.models.clone();
    wait_until(30, "b is unloaded from the full GPU", || placed(&models, "b").is_empty()).await;
    assert_eq!(placed(&node.models, "a"), [(Some(1), 1)], "the model on the other GPU stays");
}
