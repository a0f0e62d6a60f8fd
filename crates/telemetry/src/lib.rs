//! Observability shared by the router, the node and the binary:
//!
//! - One Prometheus recorder per process. `llmr serve` runs the router and a node in one
//!   process, and the `metrics` facade has a single global recorder, so both install and render
//!   through here.
//! - [`request_id`]: every request's id, in its span and its answer.
//! - [`error_chain`]: how an error and its sources are written into logs and messages.
#![forbid(unsafe_code)]

pub mod error_chain;
pub mod request_id;

pub use error_chain::error_chain;
pub use request_id::RequestId;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Latency buckets (seconds) for every `*_seconds` histogram: LLM requests span milliseconds
/// (proxy overhead, inter-token) to a minute (long generations).
pub const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Buckets for `*_tokens_per_second` histograms.
pub const RATE_BUCKETS: &[f64] = &[1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0, 800.0];

/// Installs the recorder (once per process; later calls return the same handle).
pub fn prometheus() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_tokens_per_second".into()), RATE_BUCKETS))
            .expect("bucket lists are non-empty")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder (a test harness's) may already be installed; ours still renders.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}
