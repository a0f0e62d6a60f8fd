//! `/v1/*`: validate at the router, pick a node, proxy, retry.
//!
//! A request is validated with the same `openai` crate the nodes use, so empty prompts and
//! out-of-range parameters are refused before any node sees them. Then up to 1 + 4 attempts
//! (spec 003: 100 ms, doubling, capped at 30 s): a connection failure, or a 5xx or 429 answer,
//! moves on to another ready node when there is one. Nothing is retried once bytes reached the
//! client: a non-streamed answer is read whole from the node before it is passed on (so a node
//! dying mid-answer is retried elsewhere), a stream is passed through chunk by chunk, and a
//! stream cut by its node ends with an SSE error event.
//!
//! Every attempt sends the request's id (`x-request-id`) to the node, the same on retries, so the
//! node's log of the request names the id the client got back. The request's span gets `model`
//! and `node`; the warnings logged here (a retry, a stream cut after the handler returned) name
//! `request_id`, `model` and `node` themselves, since the span is at INFO and off by default.

use crate::balance::{self, affinity_key};
use crate::metrics as m;
use crate::nodes::{InFlight, LiveNode};
use crate::state::RouterState;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use llmr_anthropic::{CountTokensRequest, MessagesRequest};
use llmr_openai::audio::{SpeechRequest, TranscriptionRequest, MAX_SPEECH_INPUT_CHARS};
use llmr_openai::{
    ApiError, ChatCompletionRequest, CompletionPrompt, CompletionRequest, EmbeddingRequest, ModelList, ResponsesRequest,
};
use llmr_telemetry::error_chain;
use llmr_telemetry::request_id::{self, RequestId};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Spec 003's retry schedule.
pub const MAX_RETRIES: u32 = 4;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Embeddings,
    /// Anthropic's Messages API.
    Messages,
    CountTokens,
    Responses,
    Transcriptions,
    Translations,
    Speech,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Messages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Transcriptions => "/v1/audio/transcriptions",
            Endpoint::Translations => "/v1/audio/translations",
            Endpoint::Speech => "/v1/audio/speech",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Messages => "messages",
            Endpoint::CountTokens => "count_tokens",
            Endpoint::Responses => "responses",
            Endpoint::Transcriptions => "transcriptions",
            Endpoint::Translations => "translations",
            Endpoint::Speech => "speech",
        }
    }

    /// A failure after a stream started, as this endpoint's clients read one.
    fn error_event(self, e: &ApiError) -> String {
        match self {
            Endpoint::Messages => llmr_anthropic::error::error_event(e),
            _ => llmr_openai::sse::error_event(e),
        }
    }
}

/// What the router needs from a request body.
pub(crate) struct Routed {
    pub model: String,
    pub stream: bool,
    pub affinity: Option<u64>,
}

/// What the router needs from a request, with the headers it must pass on as they came (a
/// multipart body's `Content-Type` names its boundary).
async fn inspect_upload(
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Routed, HeaderMap), ApiError> {
    let content_type = headers.get(header::CONTENT_TYPE).cloned();
    let routed = match endpoint {
        Endpoint::Transcriptions | Endpoint::Translations => {
            let text = content_type.as_ref().and_then(|v| v.to_str().ok());
            let form = llmr_openai::audio::Form::read(text, body.clone()).await?;
            let r = TranscriptionRequest::from_form(form, endpoint == Endpoint::Translations)?;
            Routed { model: r.model, stream: r.stream, affinity: None }
        }
        _ => inspect(endpoint, body)?,
    };
    let mut pass = HeaderMap::new();
    if let (Endpoint::Transcriptions | Endpoint::Translations, Some(v)) = (endpoint, content_type) {
        pass.insert(header::CONTENT_TYPE, v);
    }
    Ok((routed, pass))
}

fn inspect(endpoint: Endpoint, body: &[u8]) -> Result<Routed, ApiError> {
    match endpoint {
        Endpoint::Transcriptions | Endpoint::Translations => {
            Err(ApiError::server("a multipart upload is inspected by inspect_upload"))
        }
        Endpoint::Speech => {
            let r = SpeechRequest::parse(body, MAX_SPEECH_INPUT_CHARS)?;
            // Speech is always streamed: audio bytes pass through as the node makes them.
            Ok(Routed { model: r.model, stream: true, affinity: None })
        }
        Endpoint::Chat => {
            let r = llmr_openai::parse_body::<ChatCompletionRequest>(body)?.validate()?;
            let leading = serde_json::to_string(&r.messages).unwrap_or_default();
            Ok(Routed { affinity: Some(affinity_key(&r.model, &leading)), model: r.model, stream: r.stream })
        }
        Endpoint::Completions => {
            let r = llmr_openai::parse_body::<CompletionRequest>(body)?.validate()?;
            let leading = match r.prompts.first() {
                Some(CompletionPrompt::Text(text)) => text.clone(),
                Some(CompletionPrompt::Tokens(ids)) => format!("{ids:?}"),
                None => String::new(),
            };
            Ok(Routed { affinity: Some(affinity_key(&r.model, &leading)), model: r.model, stream: r.stream })
        }
        Endpoint::Embeddings => {
            let r = llmr_openai::parse_body::<EmbeddingRequest>(body)?.validate()?;
            Ok(Routed { model: r.model, stream: false, affinity: None })
        }
        Endpoint::Messages => {
            let r = llmr_openai::parse_body::<MessagesRequest>(body)?.validate()?;
            let leading = serde_json::to_string(&r.messages).unwrap_or_default();
            Ok(Routed { affinity: Some(affinity_key(&r.model, &leading)), model: r.model, stream: r.stream })
        }
        Endpoint::CountTokens => {
            let r = llmr_openai::parse_body::<CountTokensRequest>(body)?.validate()?;
            Ok(Routed { model: r.model, stream: false, affinity: None })
        }
        Endpoint::Responses => {
            let r = llmr_openai::parse_body::<ResponsesRequest>(body)?.validate()?;
            let leading = serde_json::to_string(&r.chat.messages).unwrap_or_default();
            Ok(Routed {
                affinity: Some(affinity_key(&r.chat.model, &leading)),
                model: r.chat.model,
                stream: r.chat.stream,
            })
        }
    }
}

pub async fn chat(state: State<Arc<RouterState>>, id: RequestId, body: Result<Bytes, BytesRejection>) -> Response {
    proxy(state, id, Endpoint::Chat, body).await
}

pub async fn completions(
    state: State<Arc<RouterState>>,
    id: RequestId,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    proxy(state, id, Endpoint::Completions, body).await
}

pub async fn messages(state: State<Arc<RouterState>>, id: RequestId, body: Result<Bytes, BytesRejection>) -> Response {
    proxy(state, id, Endpoint::Messages, body).await
}

pub async fn count_tokens(
    state: State<Arc<RouterState>>,
    id: RequestId,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    proxy(state, id, Endpoint::CountTokens, body).await
}

pub async fn embeddings(
    state: State<Arc<RouterState>>,
    id: RequestId,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    proxy(state, id, Endpoint::Embeddings, body).await
}

pub async fn transcriptions(
    state: State<Arc<RouterState>>,
    id: RequestId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    proxy_upload(state, id, Endpoint::Transcriptions, headers, body).await
}

pub async fn translations(
    state: State<Arc<RouterState>>,
    id: RequestId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    proxy_upload(state, id, Endpoint::Translations, headers, body).await
}

pub async fn speech(state: State<Arc<RouterState>>, id: RequestId, body: Result<Bytes, BytesRejection>) -> Response {
    proxy(state, id, Endpoint::Speech, body).await
}

/// [`proxy`] for the audio endpoints, whose bodies need an async read (multipart) and the
/// route's own size limit.
async fn proxy_upload(
    State(state): State<Arc<RouterState>>,
    id: RequestId,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let body = match body {
        Ok(b) => b,
        Err(r) => {
            let mut e = rejection_error(r, state.config.audio_body_limit);
            if e.status == 413 {
                e.param = Some("file".into());
            }
            return refuse(endpoint, e);
        }
    };
    match inspect_upload(endpoint, &headers, &body).await {
        Ok((routed, pass)) => send(&state, id, endpoint, routed, body, pass, started).await,
        Err(e) => refuse(endpoint, e),
    }
}

/// Models a client can ask for: registered ones and those some node serves from its own store.
pub async fn list_models(State(state): State<Arc<RouterState>>) -> Response {
    Json(ModelList::new(state.model_objects())).into_response()
}

pub async fn get_model(State(state): State<Arc<RouterState>>, Path(id): Path<String>) -> Response {
    match state.model_objects().into_iter().find(|m| m.id == id) {
        Some(m) => Json(m).into_response(),
        None => ApiError::model_not_found(&id).into_response(),
    }
}

pub(crate) fn rejection_error(rejection: BytesRejection, limit: usize) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::payload_too_large(limit)
    } else {
        ApiError::bad_request(format!("could not read the request body: {rejection}"))
    }
}

/// One validated request on its way to a node.
struct Proxied {
    id: RequestId,
    endpoint: Endpoint,
    routed: Routed,
    body: Bytes,
    /// Sent to the node besides the request's own.
    headers: HeaderMap,
}

async fn proxy(
    State(state): State<Arc<RouterState>>,
    id: RequestId,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let routed =
        body.map_err(|r| rejection_error(r, state.config.body_limit)).and_then(|b| Ok((inspect(endpoint, &b)?, b)));
    let (routed, body) = match routed {
        Ok(ok) => ok,
        Err(e) => return refuse(endpoint, e),
    };
    send(&state, id, endpoint, routed, body, HeaderMap::new(), started).await
}

/// Sends a validated request to a node: picks, forwards, retries.
pub(crate) async fn send(
    state: &Arc<RouterState>,
    id: RequestId,
    endpoint: Endpoint,
    routed: Routed,
    body: Bytes,
    headers: HeaderMap,
    started: Instant,
) -> Response {
    if !state.is_known_model(&routed.model) {
        return refuse(endpoint, ApiError::model_not_found(&routed.model));
    }
    // Recorded once known to be a model (a registered or reported name, not any client text).
    tracing::Span::current().record("model", tracing::field::display(&routed.model));
    let req = Proxied { id, endpoint, routed, body, headers };
    let routed = &req.routed;
    let mut tried: Vec<String> = Vec::new();
    // The last failure: a node's own reply when there was one, else our description of it.
    let mut last: Option<Result<Response, ApiError>> = None;
    // Waits follow failures; a busy node (429) sends us to the next one at once.
    let mut failures = 0;
    for attempt in 0..=MAX_RETRIES {
        if attempt > 0 && failures > 0 {
            tokio::time::sleep(backoff(failures)).await;
        }
        let candidates = state.nodes.ready_for(&routed.model);
        let Some(node) = balance::choose(&candidates, &routed.model, routed.affinity, &tried) else {
            break;
        };
        tried.push(node.id.clone());
        tracing::Span::current().record("node", tracing::field::display(&node.name));
        let in_flight = node.begin();
        match forward(state, &node, &req, in_flight).await {
            Attempt::Done(resp) => {
                record(endpoint, &routed.model, &node.name, resp.status().as_u16(), started);
                return resp;
            }
            Attempt::Busy(reply) => {
                if state.nodes.ready_for(&routed.model).iter().all(|n| tried.contains(&n.id)) {
                    record(endpoint, &routed.model, &node.name, reply.status().as_u16(), started);
                    return reply;
                }
                metrics::counter!(m::RETRIES, "node" => node.name.clone(), "reason" => "status_429").increment(1);
                last = Some(Ok(reply));
            }
            Attempt::Retry { error, reason, reply } => {
                tracing::warn!(request_id = %req.id, node = %node.name, model = %routed.model, attempt, "{reason}: {}", error.message);
                metrics::counter!(m::RETRIES, "node" => node.name.clone(), "reason" => reason).increment(1);
                failures += 1;
                last = Some(reply.ok_or(error));
            }
        }
    }
    let resp = match last {
        Some(Ok(reply)) => reply,
        Some(Err(e)) => e.into_response(),
        None => ApiError::unavailable(format!(
            "model `{}` is registered but no healthy node has it ready yet; retry shortly",
            routed.model
        ))
        .with_code("model_not_ready")
        .into_response(),
    };
    record(endpoint, &routed.model, "none", resp.status().as_u16(), started);
    resp
}

fn backoff(attempt: u32) -> Duration {
    (FIRST_BACKOFF * 2u32.saturating_pow(attempt.saturating_sub(1))).min(MAX_BACKOFF)
}

pub(crate) fn refuse(endpoint: Endpoint, e: ApiError) -> Response {
    metrics::counter!(m::REJECTED, "endpoint" => endpoint.label(), "status" => e.status.to_string()).increment(1);
    // A 413 says `Connection: close` itself: the rest of the body was never read.
    e.into_response()
}

fn record(endpoint: Endpoint, model: &str, node: &str, status: u16, started: Instant) {
    metrics::counter!(m::REQUESTS, "endpoint" => endpoint.label(), "model" => model.to_string(), "node" => node.to_string(), "status" => status.to_string())
        .increment(1);
    metrics::histogram!(m::HEADERS_LATENCY, "model" => model.to_string(), "node" => node.to_string())
        .record(started.elapsed().as_secs_f64());
}

enum Attempt {
    Done(Response),
    /// 429: worth trying another node at once, never the same one again.
    Busy(Response),
    /// `reply`: the node's own answer, when it sent one.
    Retry {
        error: ApiError,
        reason: &'static str,
        reply: Option<Response>,
    },
}

async fn forward(state: &RouterState, node: &Arc<LiveNode>, req: &Proxied, in_flight: InFlight) -> Attempt {
    let sent = state
        .http
        .post(format!("{}{}", node.url, req.endpoint.path()))
        .header(header::CONTENT_TYPE, "application/json")
        .header(request_id::HEADER, req.id.as_str())
        .headers(req.headers.clone())
        .bearer_auth(&node.secret)
        .body(req.body.clone())
        .send()
        .await;
    let upstream = match sent {
        Ok(r) => r,
        Err(e) => {
            node.mark_failed();
            // Not connecting, or connected and then no answer (the node died while working on it:
            // non-streamed answers send their headers only when finished). Either way no byte
            // reached the client.
            let (what, reason) = if e.is_connect() {
                ("could not be reached", "connect")
            } else {
                ("failed before answering", "no_answer")
            };
            return Attempt::Retry {
                error: ApiError::with_status(502, format!("node '{}' {what}: {}", node.name, error_chain(&e))),
                reason,
                reply: None,
            };
        }
    };
    let status = upstream.status();
    // 501 (the engine cannot do this) would fail the same way anywhere.
    if (status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED) || status == StatusCode::TOO_MANY_REQUESTS {
        let headers = pass_headers(upstream.headers());
        let body = upstream.bytes().await.unwrap_or_default();
        let error = ApiError::from_body(status.as_u16(), &body);
        // Passed on as the node sent it when no other attempt does better.
        let reply = with_headers(Response::new(Body::from(body)), status, headers, node);
        if status.is_server_error() {
            return Attempt::Retry { error, reason: "status_5xx", reply: Some(reply) };
        }
        return Attempt::Busy(reply);
    }
    let headers = pass_headers(upstream.headers());
    let is_sse = headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    // Speech streams its audio itself (not as SSE) unless the client asked for events.
    let streams = is_sse || req.endpoint == Endpoint::Speech;
    if req.routed.stream && streams && status.is_success() {
        let name = node.name.clone();
        let (id, model, endpoint) = (req.id.clone(), req.routed.model.clone(), req.endpoint);
        let mut guard = Some(in_flight);
        // Chunks pass through as they come; an error ends the stream with one SSE error event.
        let body = upstream.bytes_stream().scan(false, move |cut, chunk| {
            let item = match chunk {
                _ if *cut => None,
                Ok(bytes) => Some(Ok::<Bytes, std::convert::Infallible>(bytes)),
                Err(e) => {
                    *cut = true;
                    guard.take();
                    metrics::counter!(m::STREAMS_CUT, "node" => name.clone()).increment(1);
                    let e = ApiError::with_status(502, format!("node '{name}' failed mid-stream: {}", error_chain(&e)));
                    // Polled by the server after the handler returned: outside the request's span.
                    tracing::warn!(request_id = %id, node = %name, model = %model, "{}", e.message);
                    // Audio simply ends early: an event in the middle of it would be noise.
                    is_sse.then(|| Ok(Bytes::from(endpoint.error_event(&e))))
                }
            };
            std::future::ready(item)
        });
        return Attempt::Done(with_headers(Response::new(Body::from_stream(body)), status, headers, node));
    }
    match upstream.bytes().await {
        Ok(bytes) => {
            drop(in_flight);
            Attempt::Done(with_headers(Response::new(Body::from(bytes)), status, headers, node))
        }
        Err(e) => {
            node.mark_failed();
            Attempt::Retry {
                error: ApiError::with_status(
                    502,
                    format!("node '{}' failed mid-answer: {}", node.name, error_chain(&e)),
                ),
                reason: "body",
                reply: None,
            }
        }
    }
}

fn pass_headers(from: &reqwest::header::HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in [header::CONTENT_TYPE, header::CACHE_CONTROL, header::RETRY_AFTER] {
        if let Some(v) = from.get(name.as_str()).and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok()) {
            out.insert(name, v);
        }
    }
    out
}

/// Names the node that answered (operators and tests want to know; it reveals no address).
pub const NODE_HEADER: &str = "x-llmr-node";

fn with_headers(mut resp: Response, status: StatusCode, mut headers: HeaderMap, node: &LiveNode) -> Response {
    *resp.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(&node.name) {
        headers.insert(NODE_HEADER, v);
    }
    resp.headers_mut().extend(headers);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_follows_spec_003() {
        let waits: Vec<u128> = (1..=MAX_RETRIES).map(|a| backoff(a).as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 800]);
        assert_eq!(backoff(40), MAX_BACKOFF);
    }

    #[test]
    fn bad_requests_are_refused_with_the_field_named() {
        let e =
            inspect(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":7}"#)
                .err()
                .unwrap();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("temperature")));
        let e = inspect(Endpoint::Completions, br#"{"model":"m","prompt":""}"#).err().unwrap();
        assert_eq!(e.status, 400);
        let r = inspect(Endpoint::Chat, br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#)
            .unwrap();
        assert!(r.stream && r.model == "m" && r.affinity.is_some());
    }
}
