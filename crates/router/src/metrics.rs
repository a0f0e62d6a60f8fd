//! The router's Prometheus metrics (`/metrics`), through the process-wide recorder it shares
//! with an embedded node. Node and model labels only ever come from registered or reporting
//! names, never from raw request JSON.

use crate::nodes::NodeTable;

pub const REQUESTS: &str = "llmr_router_requests_total";
pub const REJECTED: &str = "llmr_router_rejected_total";
pub const RETRIES: &str = "llmr_router_retries_total";
pub const STREAMS_CUT: &str = "llmr_router_streams_cut_total";
/// Arrival to the node's response headers (streams: the first token), router overhead included.
pub const HEADERS_LATENCY: &str = "llmr_router_upstream_headers_seconds";
pub const NODE_HEALTHY: &str = "llmr_router_node_healthy";
pub const NODE_OUTSTANDING: &str = "llmr_router_node_requests_in_flight";
pub const NODE_HEARTBEAT_AGE: &str = "llmr_router_node_heartbeat_age_seconds";
pub const NODE_MODELS_READY: &str = "llmr_router_node_models_ready";

pub fn install() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    let handle = llmr_telemetry::prometheus();
    DESCRIBED.call_once(|| {
        metrics::describe_counter!(REQUESTS, "Proxied requests by endpoint, model, node and final status");
        metrics::describe_counter!(REJECTED, "Requests refused at the router (validation, auth, unknown model)");
        metrics::describe_counter!(RETRIES, "Proxy attempts that failed and were retried, by node and reason");
        metrics::describe_counter!(STREAMS_CUT, "Streams cut by their node after bytes reached the client");
        metrics::describe_histogram!(HEADERS_LATENCY, metrics::Unit::Seconds, "Arrival to the node's response headers");
        metrics::describe_gauge!(NODE_HEALTHY, "1 when the node heartbeats and answers");
        metrics::describe_gauge!(NODE_OUTSTANDING, "Requests the router has in flight to the node");
        metrics::describe_gauge!(NODE_HEARTBEAT_AGE, "Seconds since the node's last heartbeat");
        metrics::describe_gauge!(NODE_MODELS_READY, "Models the node reports ready");
    });
    handle
}

/// Refreshes the per-node gauges, then renders everything the process records.
pub fn render(nodes: &NodeTable) -> String {
    let handle = install();
    for n in nodes.all() {
        let healthy = n.is_healthy(nodes.heartbeat_timeout);
        metrics::gauge!(NODE_HEALTHY, "node" => n.name.clone()).set(if healthy { 1.0 } else { 0.0 });
        metrics::gauge!(NODE_OUTSTANDING, "node" => n.name.clone()).set(n.outstanding() as f64);
        metrics::gauge!(NODE_HEARTBEAT_AGE, "node" => n.name.clone()).set(n.since_heartbeat().as_secs_f64());
        let ready = n.models().iter().filter(|m| m.state == llmr_cluster::ModelState::Ready).count();
        metrics::gauge!(NODE_MODELS_READY, "node" => n.name.clone()).set(ready as f64);
    }
    handle.render()
}
