//! `/v0/*`: model registration and manifests, node registration and heartbeats, API keys.

use crate::db::DbError;
use crate::keys::{random_token, Scope};
use crate::state::{unix_now, RouterState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llmr_cluster::{EngineBenchmark, Heartbeat, HeartbeatAck, NodeRegistered, NodeRegistration, RegisterModel};
use llmr_openai::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

type Result<T> = std::result::Result<T, ApiError>;

fn parse<T: serde::de::DeserializeOwned>(body: std::result::Result<Bytes, BytesRejection>) -> Result<T> {
    let bytes =
        body.map_err(|r| ApiError::with_status(r.status().as_u16(), format!("could not read the request body: {r}")))?;
    llmr_openai::parse_body(&bytes)
}

fn db_error(e: DbError) -> ApiError {
    match e {
        DbError::Exists(what) => ApiError::with_status(409, format!("{what} already exists")).with_code("conflict"),
        other => {
            tracing::error!("router database: {other}");
            ApiError::server(format!("router database: {other}"))
        }
    }
}

// ---- models ----

pub async fn register_model(
    State(s): State<Arc<RouterState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let req: RegisterModel = parse(body)?;
    let manifest = s.registrar.manifest(&req, unix_now()).await.map_err(|e| e.into_api_error())?;
    s.db.insert_model(&manifest).map_err(db_error)?;
    s.models_changed().map_err(db_error)?;
    tracing::info!(model = %manifest.name, format = manifest.format.as_str(), files = manifest.files.len(), "model registered");
    Ok((StatusCode::CREATED, Json(manifest)).into_response())
}

/// `GET /v0/models`: the registered manifests, each with the nodes' engine benchmarks of it
/// (`benchmarks`: node, engine, figures, and whether the node runs the model with that engine).
pub async fn list_manifests(State(s): State<Arc<RouterState>>) -> Result<Response> {
    let benchmarks = s.db.benchmarks().map_err(db_error)?;
    let nodes = s.nodes.all();
    let data: Vec<Value> = s
        .registered()
        .iter()
        .map(|m| {
            let mut object = serde_json::to_value(m).expect("a manifest serializes");
            let of_model: Vec<Value> = benchmarks
                .iter()
                .filter(|b| b.model == m.name)
                .map(|b| {
                    let node = nodes.iter().find(|n| n.id == b.node_id);
                    let runs = node.and_then(|n| n.models().into_iter().find(|st| st.name == m.name)?.engine);
                    let mut row = serde_json::to_value(&b.benchmark).expect("a benchmark serializes");
                    row["node_id"] = json!(b.node_id);
                    row["node"] = json!(node.map(|n| n.name.clone()));
                    row["chosen"] = json!(runs.as_deref() == Some(b.benchmark.engine_id.as_str()));
                    row
                })
                .collect();
            object["benchmarks"] = Value::Array(of_model);
            object
        })
        .collect();
    Ok(Json(json!({ "object": "list", "data": data })).into_response())
}

/// `GET /v0/models/registry/{name}/manifest.json` (names contain `/`).
pub async fn manifest(State(s): State<Arc<RouterState>>, Path(path): Path<String>) -> Result<Response> {
    let name = path
        .strip_suffix("/manifest.json")
        .ok_or_else(|| ApiError::not_found(format!("no route for /v0/models/registry/{path}")))?;
    let registered = s.registered();
    let m = registered.iter().find(|m| m.name == name).ok_or_else(|| ApiError::model_not_found(name))?;
    Ok(Json(m).into_response())
}

pub async fn delete_model(State(s): State<Arc<RouterState>>, Path(name): Path<String>) -> Result<Response> {
    if !s.db.delete_model(&name).map_err(db_error)? {
        return Err(ApiError::model_not_found(&name));
    }
    s.models_changed().map_err(db_error)?;
    tracing::info!(model = %name, "model deleted");
    Ok(Json(json!({ "id": name, "object": "model", "deleted": true })).into_response())
}

// ---- nodes ----

fn check_registration(r: &NodeRegistration) -> std::result::Result<(), ApiError> {
    let name_ok = !r.name.is_empty()
        && r.name.len() <= 64
        && r.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !r.name.starts_with('.');
    if !name_ok {
        return Err(ApiError::invalid("name", "1 to 64 characters of [A-Za-z0-9-_.], not starting with '.'"));
    }
    let url = reqwest::Url::parse(&r.url).map_err(|e| ApiError::invalid("url", e))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(ApiError::invalid("url", "must be an http(s) URL with a host"));
    }
    if r.secret.len() < 16 || r.secret.len() > 256 {
        return Err(ApiError::invalid("secret", "must be 16 to 256 characters"));
    }
    Ok(())
}

pub async fn register_node(
    State(s): State<Arc<RouterState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let reg: NodeRegistration = parse(body)?;
    check_registration(&reg)?;
    if reg.gpus.is_empty() && !s.config.allow_cpu_nodes {
        return Err(ApiError::with_status(
            403,
            format!(
                "node '{}' reports no GPU; the router accepts CPU-only nodes only when started with --allow-cpu-nodes",
                reg.name
            ),
        )
        .with_code("gpu_required"));
    }
    let mut info = serde_json::to_value(&reg).expect("serializable");
    info.as_object_mut().expect("an object").remove("secret");
    let stored =
        s.db.upsert_node(&reg.name, &reg.url, &info.to_string(), unix_now(), &format!("node_{}", random_token(12)))
            .map_err(db_error)?;
    let node = s.nodes.register(&stored.id, reg);
    tracing::info!(node = %node.name, id = %node.id, url = %node.url, "node registered");
    Ok(Json(NodeRegistered {
        node_id: stored.id,
        heartbeat_interval_ms: s.config.heartbeat_interval.as_millis() as u64,
    })
    .into_response())
}

pub async fn heartbeat(
    State(s): State<Arc<RouterState>>,
    Path(id): Path<String>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let hb: Heartbeat = parse(body)?;
    let live = s.nodes.get(&id);
    let was_healthy = live.as_ref().map(|n| n.is_healthy(s.nodes.heartbeat_timeout));
    // Benchmarks are written when they change, not at every heartbeat.
    let before = live.map(|n| n.models()).unwrap_or_default();
    let new_benchmarks: Vec<(String, Vec<EngineBenchmark>)> = hb
        .models
        .iter()
        .filter(|m| !m.benchmarks.is_empty())
        .filter(|m| before.iter().find(|b| b.name == m.name).is_none_or(|b| b.benchmarks != m.benchmarks))
        .map(|m| (m.name.clone(), m.benchmarks.clone()))
        .collect();
    if !s.nodes.heartbeat(&id, hb) {
        return Err(ApiError::not_found(format!("node '{id}' is not registered with this router; register again"))
            .with_code("node_unknown"));
    }
    for (model, benchmarks) in new_benchmarks {
        if let Err(e) = s.db.record_benchmarks(&id, &model, &benchmarks) {
            tracing::warn!(node = %id, model = %model, "engine benchmarks not kept: {e}");
        }
    }
    if was_healthy == Some(false) {
        tracing::info!(node = %id, "node healthy again");
    }
    Ok(Json(HeartbeatAck { models_version: s.models_version() }).into_response())
}

pub async fn list_nodes(State(s): State<Arc<RouterState>>) -> Response {
    let timeout = s.nodes.heartbeat_timeout;
    let data: Vec<_> = s
        .nodes
        .all()
        .iter()
        .map(|n| {
            json!({
                "id": n.id,
                "name": n.name,
                "url": n.url,
                "healthy": n.is_healthy(timeout),
                "seconds_since_heartbeat": n.since_heartbeat().as_secs_f64(),
                "requests_in_flight": n.outstanding(),
                "load": n.load(),
                "models": n.models(),
                "machine": n.registration.machine,
                "gpus": n.registration.gpus,
                "runtimes": n.registration.runtimes,
                "version": n.registration.version,
            })
        })
        .collect();
    Json(json!({ "object": "list", "data": data })).into_response()
}

/// `GET /v0/engines`: every node's plugin folders, each with its manifest and whether the node
/// loaded it or why not (spec 000's engine info API).
pub async fn list_engines(State(s): State<Arc<RouterState>>) -> Response {
    let timeout = s.nodes.heartbeat_timeout;
    let data: Vec<_> = s
        .nodes
        .all()
        .iter()
        .map(|n| {
            json!({
                "node_id": n.id,
                "node": n.name,
                "healthy": n.is_healthy(timeout),
                "engines": n.engines(),
            })
        })
        .collect();
    Json(json!({ "object": "list", "data": data })).into_response()
}

pub async fn delete_node(State(s): State<Arc<RouterState>>, Path(id): Path<String>) -> Result<Response> {
    let in_db = s.db.delete_node(&id).map_err(db_error)?;
    let live = s.nodes.remove(&id);
    if !in_db && !live {
        return Err(ApiError::not_found(format!("node '{id}' does not exist")));
    }
    Ok(Json(json!({ "id": id, "deleted": true })).into_response())
}

// ---- keys ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    name: String,
    scopes: Vec<String>,
}

pub async fn create_key(
    State(s): State<Arc<RouterState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let req: CreateKey = parse(body)?;
    if req.name.trim().is_empty() || req.name.len() > 128 {
        return Err(ApiError::invalid("name", "must be 1 to 128 characters"));
    }
    let scopes = parse_scopes(&req.scopes)
        .map_err(|bad| ApiError::invalid("scopes", format!("unknown scope '{bad}' (api, node, admin)")))?;
    if scopes.is_empty() {
        return Err(ApiError::invalid("scopes", "name at least one of api, node, admin"));
    }
    let key = s.keys.create(&s.db, &req.name, &scopes, unix_now()).map_err(db_error)?;
    let scopes: Vec<&str> = key.scopes.iter().map(|s| s.as_str()).collect();
    Ok((StatusCode::CREATED, Json(json!({ "id": key.id, "name": req.name, "key": key.secret, "scopes": scopes })))
        .into_response())
}

pub fn parse_scopes(names: &[String]) -> std::result::Result<Vec<Scope>, String> {
    names.iter().map(|n| Scope::parse(n).ok_or_else(|| n.clone())).collect()
}

pub async fn list_keys(State(s): State<Arc<RouterState>>) -> Result<Response> {
    let data: Vec<_> = s
        .db
        .keys()
        .map_err(db_error)?
        .into_iter()
        .map(|k| json!({ "id": k.id, "name": k.name, "prefix": k.prefix, "scopes": k.scopes, "created_at": k.created_at, "revoked": k.revoked }))
        .collect();
    Ok(Json(json!({ "object": "list", "data": data })).into_response())
}

pub async fn revoke_key(State(s): State<Arc<RouterState>>, Path(id): Path<String>) -> Result<Response> {
    if !s.keys.revoke(&s.db, &id, unix_now()).map_err(db_error)? {
        return Err(ApiError::not_found(format!("no active key '{id}'")));
    }
    Ok(Json(json!({ "id": id, "revoked": true })).into_response())
}
