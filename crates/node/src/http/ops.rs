//! `/health` and `/metrics`.

use super::SharedState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;

pub async fn health(State(state): State<SharedState>) -> impl IntoResponse {
    Json(health_report(&state.models))
}

/// `/health`'s body (an embedding router merges it into its own).
pub fn health_report(models: &crate::models::ModelManager) -> serde_json::Value {
    let loaded: Vec<String> = models.loaded().iter().map(|m| m.name.clone()).collect();
    let available: Vec<String> = models.entries().iter().map(|e| e.desc.name.clone()).collect();
    serde_json::json!({ "status": "ok", "models_loaded": loaded, "models_available": available })
}

pub async fn metrics(State(state): State<SharedState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], crate::metrics::render(&state.models))
}
