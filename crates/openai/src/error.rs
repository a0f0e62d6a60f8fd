//! OpenAI-shaped errors: `{"error":{"message","type","param","code"}}` with the HTTP status.
//!
//! Every message names the field it is about (`param`), so a client can tell what to fix.

use serde::Serialize;

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
}
