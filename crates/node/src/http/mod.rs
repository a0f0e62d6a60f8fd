//! The node's HTTP surface: OpenAI `/v1/*`, `/health`, `/metrics`.
//!
//! Every generating endpoint runs the one pipeline in [`pipeline`] and differs only by its
//! encoder; every error becomes an `ApiError` through the one mapping in `error.rs`.

mod audio_error;
mod cancel_guard;
mod chat;
mod completions;
mod embeddings;
mod error;
mod messages;
mod models;
mod ops;
pub mod pipeline;
pub mod responses;
pub use ops::health_report;
mod speech;
mod sse;
mod transcriptions;

use crate::cache::GenerationCache;
use crate::models::ModelManager;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use llmr_openai::ApiError;
use llmr_telemetry::RequestId;
use serde::de::DeserializeOwned;
use std::sync::Arc;

pub struct AppState {
    pub models: Arc<ModelManager>,
    pub cache: Arc<GenerationCache>,
    /// Any of these opens `/v1`; empty: no authentication.
    pub api_keys: Vec<String>,
    pub body_limit: usize,
    pub audio: crate::node::AudioLimits,
    /// `system_fingerprint`: names this build, so clients can tell servers apart.
    pub fingerprint: String,
}

pub type SharedState = Arc<AppState>;

/// Parses a JSON body; a body over the limit is a 413, anything unreadable a 400 naming where.
pub fn parse_json<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(limit)
        } else {
            ApiError::bad_request(format!("could not read the request body: {rejection}"))
        }
    })?;
    llmr_openai::parse_body(&bytes)
}

async fn require_api_key(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    if !state.api_keys.is_empty() {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()));
        let known =
            |g: &str| state.api_keys.iter().fold(false, |ok, k| constant_time_eq(g.as_bytes(), k.as_bytes()) | ok);
        if !given.is_some_and(known) {
            let e = ApiError::unauthorized();
            let id = req.extensions().get::<RequestId>().cloned().unwrap_or_default();
            pipeline::count_error("auth", &id, &e);
            return e.into_response();
        }
    }
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!("no route for {} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::with_status(405, format!("{} is not allowed on {}", req.method(), req.uri().path()))
}

pub fn router(state: SharedState) -> Router {
    let v1 = Router::new()
        .route("/chat/completions", post(chat::handle))
        .route("/completions", post(completions::handle))
        .route("/embeddings", post(embeddings::handle))
        .route("/responses", post(responses::handle))
        .route("/models", get(models::list))
        .route("/models/{*id}", get(models::get))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    // Anthropic's Messages API: its errors (authentication's too) in Anthropic's shape.
    let anthropic = Router::new()
        .route("/messages", post(messages::handle))
        .route("/messages/count_tokens", post(messages::count_tokens))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key))
        .route_layer(middleware::from_fn(llmr_anthropic::error::anthropic_errors));
    // Uploads of audio have their own size limit (OpenAI's 25 MiB by default).
    let audio = Router::new()
        .route("/audio/transcriptions", post(transcriptions::transcriptions))
        .route("/audio/translations", post(transcriptions::translations))
        .route("/audio/speech", post(speech::handle))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key))
        .layer(DefaultBodyLimit::max(state.audio.max_upload_bytes));
    Router::new()
        .nest("/v1", v1.merge(anthropic).merge(audio))
        .route("/health", get(ops::health))
        .route("/metrics", get(ops::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.body_limit))
        .layer(llmr_telemetry::request_id::RequestIdLayer)
        .with_state(state)
}
