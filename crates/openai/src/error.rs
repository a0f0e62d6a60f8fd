//! OpenAI-shaped errors: `{"error":{"message","type","param","code"}}` with the HTTP status.
//!
//! Every message names the field it is about (`param`), so a client can tell what to fix.

use axum_core::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `not_found_error`, `rate_limit_error`, `server_error`...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
    /// Seconds a client should wait before retrying (429 and 503).
    pub retry_after: Option<u32>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

/// An error body as another server sends it: OpenAI's shape, or `{"error": "text"}`.
#[derive(Deserialize)]
struct ReceivedBody {
    error: ReceivedError,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ReceivedError {
    Shaped {
        message: String,
        #[serde(default)]
        param: Option<String>,
        #[serde(default)]
        code: Option<serde_json::Value>,
    },
    Text(String),
}

impl ApiError {
    fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }

    /// 400 about one field; the message is prefixed with the field's name.
    pub fn invalid(param: &str, message: impl std::fmt::Display) -> Self {
        let mut e = Self::new(400, "invalid_request_error", format!("{param}: {message}"));
        e.param = Some(param.to_owned());
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "invalid_request_error", message)
    }

    pub fn model_not_found(model: &str) -> Self {
        let mut e = Self::new(404, "invalid_request_error", format!("model: the model `{model}` does not exist"));
        e.param = Some("model".into());
        e.code = Some("model_not_found".into());
        e
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "not_found_error", message)
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(413, "invalid_request_error", format!("request body is larger than the limit of {limit} bytes"))
    }

    pub fn unauthorized() -> Self {
        let mut e =
            Self::new(401, "authentication_error", "invalid or missing API key (send `Authorization: Bearer KEY`)");
        e.code = Some("invalid_api_key".into());
        e
    }

    pub fn rate_limited(message: impl Into<String>, retry_after: u32) -> Self {
        let mut e = Self::new(429, "rate_limit_error", message);
        e.retry_after = Some(retry_after);
        e
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(503, "server_error", message);
        e.retry_after = Some(1);
        e
    }

    pub fn server(message: impl Into<String>) -> Self {
        Self::new(500, "server_error", message)
    }

    /// Any status, e.g. from an engine status mapping.
    pub fn with_status(status: u16, message: impl Into<String>) -> Self {
        let kind = match status {
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        Self::new(status, kind, message)
    }

    pub fn with_code(mut self, code: &str) -> Self {
        self.code = Some(code.to_owned());
        self
    }

    pub fn to_json(&self) -> String {
        let body = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code.as_deref(),
            },
        };
        serde_json::to_string(&body).expect("error body serializes")
    }
}

/// The message of an error body another server sent (`{"error": {"message": ...}}` or
/// `{"error": "..."}`); `None` when the body is not one.
pub fn error_message(body: &[u8]) -> Option<String> {
    match serde_json::from_slice::<ReceivedBody>(body).ok()?.error {
        ReceivedError::Shaped { message, .. } | ReceivedError::Text(message) => Some(message),
    }
}

impl ApiError {
    /// The error another OpenAI-compatible server answered with `status` and `body`: its message,
    /// param and code when the body has them, else the status alone.
    pub fn from_body(status: u16, body: &[u8]) -> Self {
        let mut e = Self::with_status(status, format!("HTTP {status}"));
        match serde_json::from_slice::<ReceivedBody>(body).map(|b| b.error) {
            Ok(ReceivedError::Shaped { message, param, code }) => {
                e.message = message;
                e.param = param;
                e.code = code.map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_owned));
            }
            Ok(ReceivedError::Text(message)) => e.message = message,
            Err(_) => {
                let text = String::from_utf8_lossy(body);
                if !text.trim().is_empty() {
                    e.message = format!("HTTP {status}: {}", text.trim());
                }
            }
        }
        e
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, [(header::CONTENT_TYPE, "application/json")], self.to_json()).into_response();
        if let Some(secs) = self.retry_after {
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

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_has_all_four_fields() {
        let v: serde_json::Value =
            serde_json::from_str(&ApiError::invalid("temperature", "must be <= 2").to_json()).unwrap();
        assert_eq!(v["error"]["message"], "temperature: must be <= 2");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "temperature");
        assert!(v["error"]["code"].is_null());
        let v: serde_json::Value = serde_json::from_str(&ApiError::model_not_found("x").to_json()).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
    }

    #[test]
    fn a_received_body_gives_back_the_error() {
        let sent = ApiError::invalid("top_k", "too big").with_code("x");
        let got = ApiError::from_body(400, sent.to_json().as_bytes());
        assert_eq!(
            (got.status, got.kind, &got.message, &got.param, &got.code),
            (400, sent.kind, &sent.message, &sent.param, &sent.code)
        );
        assert_eq!(ApiError::from_body(503, br#"{"error":"overloaded"}"#).message, "overloaded");
        assert_eq!(ApiError::from_body(502, b"bad gateway\n").message, "HTTP 502: bad gateway");
        assert_eq!(ApiError::from_body(500, b"").message, "HTTP 500");
        assert_eq!(ApiError::from_body(429, b"").kind, "invalid_request_error");
    }

    #[test]
    fn responses_carry_status_retry_after_and_close_on_413() {
        let r = ApiError::rate_limited("busy", 3).into_response();
        assert_eq!(
            (r.status(), r.headers()[header::RETRY_AFTER].to_str().unwrap()),
            (StatusCode::TOO_MANY_REQUESTS, "3")
        );
        let r = ApiError::payload_too_large(10).into_response();
        assert_eq!(r.headers()[header::CONNECTION], "close");
        assert!(ApiError::server("x").into_response().headers().get(header::CONNECTION).is_none());
    }
}
