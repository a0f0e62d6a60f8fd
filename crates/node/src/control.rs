//! The control agent API of spec 002 (4.1), on a listener of its own bound to 127.0.0.1 only
//! (`--control-port`; it has no authentication and changes how every model runs): `POST /v1/policy` sets the KV policy every model runs, without a restart
//! and without dropping requests (the engines take it between two steps); `POST /v1/run-context`
//! records what the next jobs will look like; `GET /v1/metrics` reports speed, latency, memory
//! and the KV cache's levels; `GET /v1/health`. A quality budget in the run context starts the
//! slow loop's threshold re-fit and profile switching (`slow_loop.rs`). The same figures go,
//! once a second, to a JSON Lines file when one is configured (spec telemetry). Nothing here
//! carries user text.
//!
//! A patch is checked whole by `llmr_kv_policy` before any engine sees it, so a refused one
//! (400 naming the field) leaves every model's policy as it was.

use crate::http::parse_json;
use crate::metrics::{model_figures, quantile, GENERATED};
use crate::models::ModelManager;
use crate::slow_loop::Changes;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use llmr_kv_policy::{KvPolicy, PolicyPatch};
use llmr_openai::ApiError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Control requests are small; anything bigger is a mistake.
const BODY_LIMIT: usize = 64 << 10;

/// `POST /v1/policy`'s body. Sections the spec names for other runtimes (`io`, `scheduler`) have
/// no meaning here and are refused by name, as any unknown key is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyBody {
    kv: PolicyPatch,
}

/// `POST /v1/run-context`: the conditions of the next jobs.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunContext {
    pub seq_len: u32,
    pub batch: u32,
    pub target_ftl_ms: Option<f64>,
    /// The relative delta-PPL (in percent) the jobs accept.
    pub quality_budget: Option<f64>,
}

pub struct ControlState {
    models: Arc<ModelManager>,
    run_context: Mutex<Option<RunContext>>,
    /// The last reading of the generated-token counter, and the rate since the one before.
    rate: Mutex<(Instant, u64, f64)>,
    /// Threshold steps and profile switches the slow loop made (`slow_loop.rs`).
    refits: AtomicU64,
    profile_switches: AtomicU64,
}

pub type SharedControl = Arc<ControlState>;

impl ControlState {
    pub fn new(models: Arc<ModelManager>) -> SharedControl {
        let now = (Instant::now(), GENERATED.load(Ordering::Relaxed), 0.0);
        Arc::new(ControlState {
            models,
            run_context: Mutex::new(None),
            rate: Mutex::new(now),
            refits: AtomicU64::new(0),
            profile_switches: AtomicU64::new(0),
        })
    }

    pub fn models(&self) -> &ModelManager {
        &self.models
    }

    /// The run context's quality budget (relative delta-PPL, percent), when one was given.
    pub fn quality_budget(&self) -> Option<f64> {
        self.run_context.lock().unwrap().and_then(|rc| rc.quality_budget)
    }

    pub fn count_slow_loop_changes(&self, c: Changes) {
        self.refits.fetch_add(c.refits as u64, Ordering::Relaxed);
        self.profile_switches.fetch_add(c.profile_switches as u64, Ordering::Relaxed);
    }

    /// Tokens a second since the previous reading (at least half a second ago; a reading closer
    /// than that returns the last rate).
    fn tokens_per_second(&self) -> f64 {
        let mut rate = self.rate.lock().unwrap();
        let (now, total) = (Instant::now(), GENERATED.load(Ordering::Relaxed));
        let elapsed = now.duration_since(rate.0).as_secs_f64();
        if elapsed >= 0.5 {
            *rate = (now, total, (total - rate.1) as f64 / elapsed);
        }
        rate.2
    }

    /// `GET /v1/metrics`'s body: no prompt or output text, only figures.
    pub fn report(&self) -> serde_json::Value {
        let mut first_token = Vec::new();
        let mut levels = [0u64; 4];
        let (mut kv_bytes, mut kv_budget, mut policy_errors) = (0u64, 0u64, 0u64);
        let mut models = Vec::new();
        let mut delta_ppl_est: Option<f64> = None;
        for m in self.models.loaded() {
            first_token.extend(m.first_token_times.samples());
            let figures = m.engine.metrics().map(|v| model_figures(&v).clone()).unwrap_or_default();
            let kv_levels = figures.get("kv_levels");
            if let Some(l) = kv_levels {
                for (i, name) in ["L0", "L1", "L2", "L3"].iter().enumerate() {
                    levels[i] += l[name].as_u64().unwrap_or(0);
                }
            }
            let get = |key: &str| figures[key].as_u64().unwrap_or(0);
            kv_bytes += get("kv_bytes");
            kv_budget += get("kv_budget_bytes");
            policy_errors += get("policy_errors_total");
            if let Some(est) = figures["delta_ppl_est"].as_f64() {
                delta_ppl_est = Some(delta_ppl_est.map_or(est, |e| e.max(est)));
            }
            models.push(serde_json::json!({
                "model": m.name,
                "engine": m.engine_id(),
                "kv_policy": figures.get("kv_policy"),
                "kv_levels": kv_levels,
                "kv_bytes": figures.get("kv_bytes"),
                "kv_budget_bytes": figures.get("kv_budget_bytes"),
                "kv_cache_type": figures.get("kv_cache_type"),
                "policy_passes_total": figures.get("policy_passes_total"),
                "policy_seconds_total": figures.get("policy_seconds_total"),
                "policy_blocks_changed_total": figures.get("policy_blocks_changed_total"),
                "policy_blocks_promoted_total": figures.get("policy_blocks_promoted_total"),
                "kv_recalls_total": figures.get("kv_recalls_total"),
                "policy_errors_total": figures.get("policy_errors_total"),
                // Sequences the engine set aside for room: pressure the policy
                // did not absorb.
                "preemptions_total": figures.get("preemptions_total"),
                "delta_ppl_est": figures.get("delta_ppl_est"),
            }));
        }
        let ms = |s: Option<f64>| s.map(|s| (s * 1e4).round() / 10.0);
        serde_json::json!({
            "tps": (self.tokens_per_second() * 10.0).round() / 10.0,
            "ftl_ms": ms(quantile(&mut first_token, 0.5)),
            "p95_ms": ms(quantile(&mut first_token, 0.95)),
            "mem": {
                "host_gb": resident_bytes().map(|b| (b as f64 / 1e7).round() / 100.0),
                "kv_bytes": kv_bytes,
                "kv_budget_bytes": kv_budget,
                "kv_levels": { "L0": levels[0], "L1": levels[1], "L2": levels[2], "L3": levels[3] },
            },
            // Relative delta-PPL in percent, the worst of the models that have a calibration
            // table (`kv-eval --calibrate`); null where none has.
            "quality": { "delta_ppl_est": delta_ppl_est.map(|e| (e * 1e4).round() / 1e4) },
            "kv_policy": self.models.kv_policy(),
            "policy_errors_total": policy_errors,
            "kv_threshold_refits_total": self.refits.load(Ordering::Relaxed),
            "kv_profile_switches_total": self.profile_switches.load(Ordering::Relaxed),
            "run_context": *self.run_context.lock().unwrap(),
            "models": models,
        })
    }
}

/// The process's resident memory, from `/proc/self/statm` (Linux).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

pub fn router(state: SharedControl) -> Router {
    Router::new()
        .route("/v1/policy", post(set_policy))
        .route("/v1/run-context", post(set_run_context))
        .route("/v1/metrics", get(metrics))
        .route("/v1/health", get(health))
        .with_state(state)
}

async fn set_policy(
    State(state): State<SharedControl>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let body: PolicyBody = parse_json(body, BODY_LIMIT)?;
    let current = state.models.kv_policy().unwrap_or_else(KvPolicy::baseline);
    let policy = current.patched(&body.kv).map_err(|e| ApiError::invalid(&format!("kv.{}", e.field), e))?;
    let models = state.models.clone();
    // Engine calls block (briefly: each takes the policy between two steps).
    tokio::task::spawn_blocking(move || models.set_kv_policy(policy))
        .await
        .map_err(|e| ApiError::server(format!("applying the policy failed: {e}")))?;
    tracing::info!(policy = %serde_json::to_string(&policy).unwrap_or_default(), "KV policy set");
    Ok(StatusCode::NO_CONTENT)
}

async fn set_run_context(
    State(state): State<SharedControl>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let rc: RunContext = parse_json(body, BODY_LIMIT)?;
    if rc.seq_len == 0 || rc.batch == 0 {
        return Err(ApiError::invalid(if rc.seq_len == 0 { "seq_len" } else { "batch" }, "must be positive"));
    }
    if rc.target_ftl_ms.is_some_and(|t| !(t.is_finite() && t > 0.0)) {
        return Err(ApiError::invalid("target_ftl_ms", "must be a positive number of milliseconds"));
    }
    if rc.quality_budget.is_some_and(|q| !(q.is_finite() && q >= 0.0)) {
        return Err(ApiError::invalid("quality_budget", "must be a relative delta-PPL in percent, 0 or more"));
    }
    *state.run_context.lock().unwrap() = Some(rc);
    Ok(StatusCode::NO_CONTENT)
}

async fn metrics(State(state): State<SharedControl>) -> Json<serde_json::Value> {
    let s = state.clone();
    Json(tokio::task::spawn_blocking(move || s.report()).await.unwrap_or_default())
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

/// Appends `report()` with a timestamp to `path` once a second until the process ends
/// (spec 002's telemetry: JSON Lines, figures only).
pub fn spawn_metrics_file(state: SharedControl, path: PathBuf) {
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let file = tokio::fs::OpenOptions::new().create(true).append(true).open(&path).await;
        let mut file = match file {
            Ok(f) => f,
            Err(e) => return tracing::error!(path = %path.display(), "cannot open the metrics file: {e}"),
        };
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let s = state.clone();
            let Ok(mut line) = tokio::task::spawn_blocking(move || s.report()).await else { continue };
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            line["t"] = (t.as_millis() as f64 / 1e3).into();
            let mut text = line.to_string();
            text.push('\n');
            if let Err(e) = file.write_all(text.as_bytes()).await {
                return tracing::error!(path = %path.display(), "writing the metrics file failed: {e}");
            }
        }
    });
}
