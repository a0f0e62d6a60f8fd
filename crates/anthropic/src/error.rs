//! Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}` with the HTTP status,
//! and in a stream an `event: error`.
//!
//! Handlers, authentication and the router's gateway all fail with [`ApiError`] in OpenAI's
//! shape; [`anthropic_errors`], a layer on the Anthropic routes, rewrites such bodies in one place
//! (so a 401, an unknown model or a node's refusal reach an Anthropic client in its own shape). It
//! also sends the request id as `request-id`, the header Anthropic's SDKs read.

use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use llmr_openai::ApiError;
use llmr_telemetry::RequestId;
use serde_json::json;

/// Anthropic's error type for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

pub fn error_json(e: &ApiError) -> String {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}}).to_string()
}

/// A failure after the stream started.
pub fn error_event(e: &ApiError) -> String {
    format!("event: error\ndata: {}\n\n", error_json(e))
}

/// Error bodies bigger than this are not an `ApiError` of ours: passed on as they are.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The layer: error answers in OpenAI's shape become Anthropic's; the rest passes unchanged.
pub async fn anthropic_errors(req: Request, next: Next) -> Response {
    let id = req.extensions().get::<RequestId>().and_then(|id| HeaderValue::from_str(id.as_str()).ok());
    let resp = next.run(req).await;
    let (mut parts, body) = resp.into_parts();
    if let Some(id) = id {
        parts.headers.insert("request-id", id);
    }
    let is_json =
        parts.headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if parts.status.as_u16() < 400 || !is_json {
        return Response::from_parts(parts, body);
    }
    let Ok(bytes) = to_bytes(body, MAX_ERROR_BODY).await else {
        return Response::from_parts(parts, Body::from("error body too large"));
    };
    let already = serde_json::from_slice::<serde_json::Value>(&bytes).is_ok_and(|v| v["type"] == "error");
    if already {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let e = ApiError::from_body(parts.status.as_u16(), &bytes);
    let body = error_json(&e);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Response::from_parts(parts, Body::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_is_anthropics() {
        let v: serde_json::Value =
            serde_json::from_str(&error_json(&ApiError::invalid("messages[0].content[1].type", "nope"))).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["message"], "messages[0].content[1].type: nope");
        assert_eq!(error_type(401), "authentication_error");
        assert_eq!(error_type(503), "overloaded_error");
        assert!(error_event(&ApiError::server("boom")).starts_with("event: error\ndata: {"));
    }
}
