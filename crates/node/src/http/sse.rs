//! SSE responses: `text/event-stream` bodies fed from a stream of ready-made events.

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use std::convert::Infallible;

pub fn response<S>(events: S) -> Response
where
    S: Stream<Item = String> + Send + 'static,
{
    use futures_util::StreamExt;
    let body = Body::from_stream(events.map(|e| Ok::<_, Infallible>(Bytes::from(e))));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        body,
    )
        .into_response()
}
