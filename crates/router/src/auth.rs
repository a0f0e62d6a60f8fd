//! Who may call what: `Authorization: Bearer KEY` (or `x-api-key`), verified against the key
//! ring; `/v1` needs scope `api`, node calls `node`, the rest of `/v0` `admin` (which implies all).
//! A missing or unknown key is 401, a known key without the scope 403.

use crate::keys::{Principal, Scope};
use crate::state::RouterState;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use llmr_openai::ApiError;
use std::sync::Arc;

fn presented(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim)
}

fn check(state: &RouterState, req: &Request, scope: Scope) -> Result<Option<Principal>, ApiError> {
    if !state.config.require_auth {
        return Ok(None);
    }
    let principal = presented(req).and_then(|k| state.keys.verify(&state.db, k)).ok_or_else(ApiError::unauthorized)?;
    if !principal.allows(scope) {
        return Err(ApiError::with_status(
            403,
            format!("the API key '{}' lacks the '{scope}' scope this endpoint needs", principal.name),
        )
        .with_code("insufficient_scope"));
    }
    Ok(Some(principal))
}

async fn require(state: Arc<RouterState>, scope: Scope, mut req: Request, next: Next) -> Response {
    match check(&state, &req, scope) {
        Ok(principal) => {
            if let Some(p) = principal {
                req.extensions_mut().insert(p);
            }
            next.run(req).await
        }
        Err(e) => {
            metrics::counter!(crate::metrics::REJECTED, "endpoint" => "auth", "status" => e.status.to_string())
                .increment(1);
            e.into_response()
        }
    }
}

pub async fn api(State(state): State<Arc<RouterState>>, req: Request, next: Next) -> Response {
    require(state, Scope::Api, req, next).await
}

pub async fn node(State(state): State<Arc<RouterState>>, req: Request, next: Next) -> Response {
    require(state, Scope::Node, req, next).await
}

pub async fn admin(State(state): State<Arc<RouterState>>, req: Request, next: Next) -> Response {
    require(state, Scope::Admin, req, next).await
}
