//! Request ids: every request gets one, so a client's report, the router's log and the node's log
//! of the same request can be put together. An incoming `x-request-id` is kept (the router passes
//! its id on to the node this way), else one is made. The id names the request's tracing span
//! (`request_id`, with `model`, `node` and `engine` recorded once known) and comes back in the
//! response's `x-request-id` header.

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use std::convert::Infallible;
use tracing::Instrument;

pub const HEADER: &str = "x-request-id";
/// Longer incoming ids are replaced: an id is a key, not a payload.
const MAX_LEN: usize = 128;

/// This request's id (an extractor; the middleware puts it in the request's extensions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(pub String);

impl RequestId {
    /// A fresh id: 16 random bytes, hex.
    pub fn new() -> Self {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the operating system's random source works");
        RequestId(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The id a client or the router sent, when it is usable as one (visible ASCII, short).
    pub fn from_header(value: &HeaderValue) -> Option<Self> {
        let text = value.to_str().ok()?;
        let usable = !text.is_empty() && text.len() <= MAX_LEN && text.bytes().all(|b| b.is_ascii_graphic());
        usable.then(|| RequestId(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for RequestId {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<RequestId>().cloned().unwrap_or_default())
    }
}

/// The middleware: takes or makes the id, runs the request in its span, names it in the answer.
pub async fn layer(mut req: Request, next: Next) -> Response {
    let id = req.headers().get(HEADER).and_then(RequestId::from_header).unwrap_or_default();
    // At ERROR level so that it is on whenever warnings are logged (the default filter is `warn`):
    // every warning and error logged while the request runs then names it.
    let span = tracing::error_span!(
        "request",
        request_id = %id,
        method = %req.method(),
        path = %req.uri().path(),
        model = tracing::field::Empty,
        node = tracing::field::Empty,
        engine = tracing::field::Empty,
    );
    req.extensions_mut().insert(id.clone());
    let mut resp = next.run(req).instrument(span).await;
    if let Ok(value) = HeaderValue::from_str(id.as_str()) {
        resp.headers_mut().insert(HEADER, value);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use tower::ServiceExt;

    fn app() -> axum::Router {
        axum::Router::new().route("/", get(|id: RequestId| async move { id.0 })).layer(axum::middleware::from_fn(layer))
    }

    async fn call(header: Option<&str>) -> (String, String) {
        let mut req = Request::builder().uri("/");
        if let Some(h) = header {
            req = req.header(HEADER, h);
        }
        let resp = app().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        let echoed = resp.headers()[HEADER].to_str().unwrap().to_owned();
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        (echoed, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn an_incoming_id_is_kept_and_a_missing_or_unusable_one_is_made() {
        assert_eq!(call(Some("abc-123")).await, ("abc-123".into(), "abc-123".into()));
        let (made, seen) = call(None).await;
        assert_eq!((made.len(), &made), (32, &seen));
        let (other, _) = call(None).await;
        assert_ne!(made, other, "ids are unique");
        let too_long = "x".repeat(MAX_LEN + 1);
        for bad in ["has space", too_long.as_str()] {
            let (replaced, seen) = call(Some(bad)).await;
            assert!(replaced != bad && replaced.len() == 32 && replaced == seen, "{bad:?} -> {replaced}");
        }
    }
}
