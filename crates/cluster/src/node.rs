//! Node registration (`POST /v0/nodes`) and heartbeats (`POST /v0/nodes/{id}/heartbeat`).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    pub hostname: String,
    pub os: String,
    pub cpu_cores: u32,
    pub memory_total_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub name: String,
    pub memory_total_bytes: u64,
    pub memory_free_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRegistration {
    /// Stable across restarts (a restarted node takes its place back).
    pub name: String,
    /// Where the router reaches the node's OpenAI API: `http://host:port`.
    pub url: String,
    /// Bearer the router must send on proxied requests (the node makes one per start).
    pub secret: String,
    pub machine: MachineInfo,
    pub gpus: Vec<GpuInfo>,
    /// Runtimes of the node's loaded plugins (`LlamaCpp`, ...).
    pub runtimes: Vec<String>,
    pub version: String,
    /// Every plugin folder the node found, loaded or not (the router's `GET /v0/engines`).
    #[serde(default)]
    pub engines: Vec<EngineReport>,
}

/// One plugin folder of a node: its manifest and whether the node loaded it (spec 000's engine
/// info API).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineReport {
    /// `engine_id/backend`, the folder under the engines directory.
    pub folder: String,
    /// The manifest's id and version; empty where the manifest could not be read.
    pub id: String,
    pub version: String,
    /// `loaded`, `refused` (invalid: `reason` says why) or `skipped` (not for this node).
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `major.minor` as the loaded binary reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abi: Option<String>,
    #[serde(default)]
    pub gpu_backends: Vec<String>,
    #[serde(default)]
    pub runtimes: Vec<String>,
    #[serde(default)]
    pub formats: Vec<String>,
    #[serde(default)]
    pub architectures: Vec<String>,
    #[serde(default)]
    pub modalities: Vec<String>,
    #[serde(default)]
    pub builtin: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRegistered {
    pub node_id: String,
    /// How often the router expects a heartbeat.
    pub heartbeat_interval_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelState {
    /// Files present and verified, an engine can run it: routable.
    Ready,
    Downloading,
    /// Download or verification failed (the message says why); retried later.
    Failed,
    /// No plugin on this node runs it: not an error, just not here.
    Unsupported,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelStatus {
    pub name: String,
    pub state: ModelState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Loaded in memory now (the router prefers such nodes).
    #[serde(default)]
    pub loaded: bool,
    /// What the model serves (`text`, `embedding`, `vision`, `asr`, `tts`), once the node has
    /// its files: the router lists them in `/v1/models`. Strings, so that a router keeps a name
    /// a newer node knows and it does not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// The engine (plugin id) the node runs the model with, once it has its files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// The node's benchmarks of the model, one per engine that can run it (spec 000: they
    /// decide among several); none when only one engine can.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub benchmarks: Vec<EngineBenchmark>,
}

/// A short benchmark of one model with one engine on one node (spec 000: the engine choice
/// among plugins that can run the same model weighs these three figures).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineBenchmark {
    pub engine_id: String,
    pub engine_version: String,
    /// Generated tokens per second after the first (embedding models: prompt tokens per second).
    pub tokens_per_second: f64,
    /// Milliseconds from the request to its first token (embedding models: to the vector).
    pub ttft_ms: f64,
    /// The most memory the engine held: its worker's peak resident set, or what the engine
    /// reported where it runs in the node's process.
    pub peak_memory_bytes: u64,
    /// Unix seconds.
    pub measured_at: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeLoad {
    pub active_requests: u32,
    pub queue_depth: u32,
    pub memory_used_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub load: NodeLoad,
    /// Every model the node knows: synced from manifests and local to the node.
    pub models: Vec<ModelStatus>,
    #[serde(default)]
    pub gpus: Vec<GpuInfo>,
    /// The node's plugin folders now (a plugin may have been reloaded since registration);
    /// empty from a node that does not report them: the registration's stand.
    #[serde(default)]
    pub engines: Vec<EngineReport>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatAck {
    /// Changes whenever a model is registered or deleted, so nodes re-sync only then.
    pub models_version: u64,
}
