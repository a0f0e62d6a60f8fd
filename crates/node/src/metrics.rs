//! Prometheus metrics (`/metrics`): one process-wide recorder, histograms with buckets sized for
//! LLM latencies, and gauges refreshed from the engines at scrape time.

use crate::models::ModelManager;
use metrics_exporter_prometheus::PrometheusHandle;

pub const REQUESTS: &str = "llmr_requests_total";
pub const ERRORS: &str = "llmr_request_errors_total";
pub const TTFT: &str = "llmr_time_to_first_token_seconds";
pub const INTER_TOKEN: &str = "llmr_inter_token_latency_seconds";
pub const REQUEST_DURATION: &str = "llmr_request_duration_seconds";
pub const PROMPT_TOKENS: &str = "llmr_prompt_tokens_total";
pub const GENERATED_TOKENS: &str = "llmr_generated_tokens_total";
pub const DECODE_RATE: &str = "llmr_decode_tokens_per_second";
pub const CACHE_HITS: &str = "llmr_generation_cache_hits_total";
pub const QUEUE_DEPTH: &str = "llmr_queue_depth";
pub const SLOTS_BUSY: &str = "llmr_slots_busy";
pub const MODELS_LOADED: &str = "llmr_models_loaded";
pub const KV_USAGE: &str = "llmr_kv_cache_usage_ratio";
pub const PREFIX_CACHE_BYTES: &str = "llmr_prefix_cache_bytes";
pub const MODEL_LOADS: &str = "llmr_model_loads_total";

/// Installs the process-wide recorder (shared with an embedded router) and describes the node's metrics.
pub fn handle() -> &'static PrometheusHandle {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    let handle = llmr_telemetry::prometheus();
    DESCRIBED.call_once(describe);
    handle
}

fn describe() {
    metrics::describe_counter!(REQUESTS, "Requests for served models, by endpoint and model");
    metrics::describe_counter!(ERRORS, "Requests that ended in an error, by endpoint and HTTP status");
    metrics::describe_histogram!(TTFT, metrics::Unit::Seconds, "Time from request arrival to the first token");
    metrics::describe_histogram!(INTER_TOKEN, metrics::Unit::Seconds, "Time between consecutive streamed tokens");
    metrics::describe_histogram!(REQUEST_DURATION, metrics::Unit::Seconds, "Time from arrival to the last token");
    metrics::describe_counter!(PROMPT_TOKENS, "Prompt tokens processed");
    metrics::describe_counter!(GENERATED_TOKENS, "Tokens generated");
    metrics::describe_histogram!(DECODE_RATE, "Per-request decode speed (tokens/s after the first token)");
    metrics::describe_counter!(CACHE_HITS, "Temperature-0 requests answered from the generation cache");
    metrics::describe_gauge!(QUEUE_DEPTH, "Requests waiting for a slot, by model");
    metrics::describe_gauge!(SLOTS_BUSY, "Slots running a request, by model");
    metrics::describe_gauge!(MODELS_LOADED, "Models loaded in memory");
    metrics::describe_gauge!(KV_USAGE, "Fraction of KV-cache cells in use, by model");
    metrics::describe_gauge!(
        PREFIX_CACHE_BYTES,
        metrics::Unit::Bytes,
        "Host memory holding saved prompt prefixes (idle KV caches), by model"
    );
    metrics::describe_counter!(MODEL_LOADS, "Model loads, by model");
}

/// Refreshes the gauges that are read from state rather than counted, then renders.
pub fn render(models: &ModelManager) -> String {
    refresh(models);
    handle().render()
}

/// Sets the gauges that are read from state rather than counted (queue depth, busy slots, KV use).
pub fn refresh(models: &ModelManager) {
    handle();
    let loaded = models.loaded();
    metrics::gauge!(MODELS_LOADED).set(loaded.len() as f64);
    for entry in models.entries() {
        let name = entry.desc.name.clone();
        match loaded.iter().find(|m| m.name == name) {
            Some(m) => {
                metrics::gauge!(QUEUE_DEPTH, "model" => name.clone()).set(m.admission.waiting() as f64);
                metrics::gauge!(SLOTS_BUSY, "model" => name.clone()).set(m.admission.busy() as f64);
                if let Some(v) = m.engine.metrics() {
                    let used = v["kv_cells_used"].as_f64().unwrap_or(0.0);
                    let total = v["kv_cells_total"].as_f64().unwrap_or(0.0);
                    metrics::gauge!(KV_USAGE, "model" => name.clone()).set(if total > 0.0 {
                        used / total
                    } else {
                        0.0
                    });
                    let saved = v["prefix_cache_bytes"].as_f64().unwrap_or(0.0);
                    metrics::gauge!(PREFIX_CACHE_BYTES, "model" => name).set(saved);
                }
            }
            None => {
                metrics::gauge!(QUEUE_DEPTH, "model" => name.clone()).set(0.0);
                metrics::gauge!(SLOTS_BUSY, "model" => name.clone()).set(0.0);
                metrics::gauge!(KV_USAGE, "model" => name.clone()).set(0.0);
                metrics::gauge!(PREFIX_CACHE_BYTES, "model" => name).set(0.0);
            }
        }
    }
}
