//! Request ids: every request gets one, so a client's report, the router's log and the node's log
//! of the same request can be put together. An incoming `x-request-id` is kept (the router passes
//! its id on to the node this way), else one is made. The id comes back in the response's
//! `x-request-id` header and names the request's tracing span (`request_id`, with `model`, `node`
//! and `engine` recorded once known).
//!
//! The span is at INFO: off under the default `warn` filter, where a span would cost every
//! request its creation and field formatting (measured: about a tenth of the router's added
//! latency) for no line logged. So the warnings and errors logged about a request name
//! `request_id` themselves; with `LLMR_LOG=info` or finer, everything logged while a request runs
//! is in its span as well.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, Request, Response};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};
use tower_layer::Layer;
use tower_service::Service;
use tracing::instrument::{Instrument, Instrumented};

pub const HEADER: &str = "x-request-id";
/// Longer incoming ids are replaced: an id is a key, not a payload.
const MAX_LEN: usize = 128;

/// This request's id (an extractor; the middleware puts it in the request's extensions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(pub String);

/// A process's random key, drawn once: ids of different processes differ, and a request's id
/// tells nothing of how many came before it.
fn process_key() -> &'static [u64; 2] {
    static KEY: OnceLock<[u64; 2]> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the operating system's random source works");
        let (a, b) = bytes.split_at(8);
        [u64::from_le_bytes(a.try_into().unwrap()), u64::from_le_bytes(b.try_into().unwrap())]
    })
}

/// SplitMix64's finalizer: a bijection of `u64`, so distinct counters give distinct ids.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl RequestId {
    /// A fresh id: 32 hex digits, unique within the process (a counter through a bijection keyed
    /// per process) and, across processes, by the process's random key. No system call.
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let [k0, k1] = *process_key();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut id = String::with_capacity(32);
        for word in [k0, mix(n ^ k1)] {
            for shift in (0..64).step_by(4).rev() {
                id.push(char::from(b"0123456789abcdef"[(word >> shift) as usize & 15]));
            }
        }
        RequestId(id)
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

/// The middleware, as a tower layer: takes or makes the id, runs the request in its span, names
/// it in the answer. (A plain layer rather than `axum::middleware::from_fn`, which boxes the rest
/// of the stack for every request: this runs on every request of router and node.)
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestIdLayer;

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestIdService { inner }
    }
}

#[derive(Clone, Debug)]
pub struct RequestIdService<S> {
    inner: S,
}

impl<S, B, R> Service<Request<B>> for RequestIdService<S>
where
    S: Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = WithRequestId<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let id = req.headers().get(HEADER).and_then(RequestId::from_header).unwrap_or_default();
        let span = tracing::info_span!(
            "request",
            request_id = %id,
            method = %req.method(),
            path = %req.uri().path(),
            model = tracing::field::Empty,
            node = tracing::field::Empty,
            engine = tracing::field::Empty,
        );
        let header = HeaderValue::from_str(id.as_str()).ok();
        req.extensions_mut().insert(id);
        let future = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        WithRequestId { future: future.instrument(span), header }
    }
}

pin_project_lite::pin_project! {
    /// The inner service's answer, in the request's span, with the id's header added.
    pub struct WithRequestId<F> {
        #[pin]
        future: Instrumented<F>,
        header: Option<HeaderValue>,
    }
}

impl<F, R, E> Future for WithRequestId<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut resp = ready!(this.future.poll(cx))?;
        if let Some(value) = this.header.take() {
            resp.headers_mut().insert(HEADER, value);
        }
        Poll::Ready(Ok(resp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use tower::ServiceExt;

    fn app() -> axum::Router {
        axum::Router::new().route("/", get(|id: RequestId| async move { id.0 })).layer(RequestIdLayer)
    }

    async fn call(header: Option<&str>) -> (String, String) {
        let mut req = axum::http::Request::builder().uri("/");
        if let Some(h) = header {
            req = req.header(HEADER, h);
        }
        let resp = app().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        let echoed = resp.headers()[HEADER].to_str().unwrap().to_owned();
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        (echoed, String::from_utf8(body.to_vec()).unwrap())
    }

    #[test]
    fn made_ids_are_distinct_hex() {
        let ids: std::collections::HashSet<String> = (0..10_000).map(|_| RequestId::new().0).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())));
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
