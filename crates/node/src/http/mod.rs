//! The node's HTTP surface: OpenAI `/v1/*`, `/health`, `/metrics`.

mod chat;
mod completions;
mod embeddings;
mod models;
mod ops;
pub use ops::health_report;
mod sse;

use crate::cache::GenerationCache;
use crate::metrics as m;
use crate::models::ModelManager;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use llmr_openai::ApiError;
use serde::de::DeserializeOwned;
use std::sync::Arc;

pub struct AppState {
    pub models: Arc<ModelManager>,
    pub cache: Arc<GenerationCache>,
    /// Any of these opens `/v1`; empty: no authentication.
    pub api_keys: Vec<String>,
    pub body_limit: usize,
    /// `system_fingerprint`: names this build, so clients can tell servers apart.
    pub fingerprint: String,
}

pub type SharedState = Arc<AppState>;

/// `ApiError` as an HTTP response (the orphan rule keeps the impl here, not in `openai`).
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> Self {
        HttpError(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let e = self.0;
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, [(header::CONTENT_TYPE, "application/json")], e.to_json()).into_response();
        if let Some(secs) = e.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body is never read, so the connection cannot serve another request:
            // say so, or a client reusing it races the close (hyper's IncompleteMessage).
            resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// Parses a JSON body; a body over the limit is a 413, anything unreadable a 400 naming where.
pub fn parse_json<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
    endpoint: &'static str,
) -> Result<T, HttpError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(limit)
        } else {
            ApiError::bad_request(format!("could not read the request body: {rejection}"))
        }
    });
    bytes.and_then(|b| llmr_openai::parse_body(&b)).map_err(|e| count_error(endpoint, e))
}

/// Counts an error for `/metrics` and passes it on.
pub fn count_error(endpoint: &'static str, e: ApiError) -> HttpError {
    metrics::counter!(m::ERRORS, "endpoint" => endpoint, "status" => e.status.to_string()).increment(1);
    HttpError(e)
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
            return count_error("auth", ApiError::unauthorized()).into_response();
        }
    }
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(req: Request) -> HttpError {
    HttpError(ApiError::not_found(format!("no route for {} {}", req.method(), req.uri().path())))
}

async fn method_not_allowed(req: Request) -> HttpError {
    HttpError(ApiError::with_status(405, format!("{} is not allowed on {}", req.method(), req.uri().path())))
}

pub fn router(state: SharedState) -> Router {
    let v1 = Router::new()
        .route("/chat/completions", post(chat::handle))
        .route("/completions", post(completions::handle))
        .route("/embeddings", post(embeddings::handle))
        .route("/models", get(models::list))
        .route("/models/{*id}", get(models::get))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    Router::new()
        .nest("/v1", v1)
        .route("/health", get(ops::health))
        .route("/metrics", get(ops::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.body_limit))
        .with_state(state)
}
