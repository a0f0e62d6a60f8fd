//! `/health` and `/metrics`.

use super::SharedState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;

pub async fn health(State(state): State<SharedState>) -> impl IntoResponse {
    let loaded: Vec<String> = state.models.loaded().iter().map(|m| m.name.clone()).collect();
    let available: Vec<&str> = state.models.entries().map(|e| e.desc.name.as_str()).collect();
    Json(serde_json::json!({ "status": "ok", "models_loaded": loaded, "models_available": available }))
}

pub async fn metrics(State(state): State<SharedState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], crate::metrics::render(&state.models))
}
