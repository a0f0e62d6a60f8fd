//! `/v1/responses`: the Responses API's state, kept in the router's database (llama-server and
//! Ollama keep none).
//!
//! `POST` validates like every endpoint, then resolves `previous_response_id`: the earlier
//! response's input items and output items come before the new input (its `instructions` do
//! not, as OpenAI documents), and the node gets the whole conversation with
//! `x-llmr-response-store` (so it accepts `previous_response_id` and reports `store: true`). The
//! answer is stored when the request did not say `store: false`: a non-streamed one as it is
//! passed on, a streamed one when its `response.completed` (or `response.incomplete`) event
//! passes through. `GET`, `DELETE` and `GET .../input_items` read it back. A response is visible
//! only to the API key that made it, and is forgotten after the configured retention
//! (`RouterConfig::responses_retention`, OpenAI's 30 days by default). A continuation stores
//! only its own input and points at the response it continues (`db/responses.rs`).

use crate::balance::affinity_key;
use crate::db::{DbError, StoredResponse};
use crate::gateway::{self, refuse, rejection_error, Endpoint, Routed};
use crate::keys::Principal;
use crate::state::RouterState;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use llmr_openai::{input_items, unix_now, ApiError, DeletedResponse, ResponseObject, ResponsesRequest};
use llmr_telemetry::RequestId;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// Tells the node that the router resolved `previous_response_id` and stores the answer.
const STORE_HEADER: HeaderName = HeaderName::from_static("x-llmr-response-store");

/// Whose responses a request may see: its API key's.
fn owner(principal: Option<&Principal>) -> String {
    principal.map(|p| p.key_id.clone()).unwrap_or_default()
}

fn db_error(e: DbError) -> ApiError {
    ApiError::server(format!("the response store failed: {e}"))
}

fn not_found(id: &str, param: Option<&str>) -> ApiError {
    let mut e = ApiError::not_found(format!("no stored response with id `{id}`"));
    e.param = param.map(str::to_owned);
    e
}

async fn load(state: &Arc<RouterState>, id: String, owner: String) -> Result<Option<StoredResponse>, ApiError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || state.db.response(&id, &owner))
        .await
        .map_err(|e| ApiError::server(format!("the response store panicked: {e}")))?
        .map_err(db_error)
}

/// A stored response with every input item it answered, earlier turns' included.
async fn load_conversation(
    state: &Arc<RouterState>,
    id: String,
    owner: String,
) -> Result<Option<(StoredResponse, Vec<Value>)>, ApiError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || state.db.response_conversation(&id, &owner))
        .await
        .map_err(|e| ApiError::server(format!("the response store panicked: {e}")))?
        .map_err(db_error)
}

pub async fn create(
    State(state): State<Arc<RouterState>>,
    id: RequestId,
    principal: Option<Extension<Principal>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let owner = owner(principal.as_deref());
    let prepared = match prepare(&state, body, &owner).await {
        Ok(p) => p,
        Err(e) => return refuse(Endpoint::Responses, e),
    };
    let mut headers = HeaderMap::new();
    headers.insert(STORE_HEADER, HeaderValue::from_static("1"));
    let resp = gateway::send(&state, id, Endpoint::Responses, prepared.routed, prepared.body, headers, started).await;
    if !prepared.store || resp.status() != StatusCode::OK {
        return resp;
    }
    let keep = Keep { state: state.clone(), owner, input: prepared.input, previous: prepared.previous };
    let is_stream =
        resp.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if is_stream {
        keep_streamed(resp, keep)
    } else {
        keep_whole(resp, keep).await
    }
}

struct Prepared {
    routed: Routed,
    /// The request with the whole conversation as its input.
    body: Bytes,
    /// The request's own input items, to store with the answer.
    input: Vec<Value>,
    /// The response it continues.
    previous: Option<String>,
    store: bool,
}

async fn prepare(
    state: &Arc<RouterState>,
    body: Result<Bytes, BytesRejection>,
    owner: &str,
) -> Result<Prepared, ApiError> {
    let bytes = body.map_err(|r| rejection_error(r, state.config.body_limit))?;
    let call = llmr_openai::parse_body::<ResponsesRequest>(&bytes)?.validate()?;
    let mut request: serde_json::Map<String, Value> = llmr_openai::parse_body(&bytes)?;
    let input = input_items(request.get("input").unwrap_or(&Value::Null))?;
    let mut conversation = input.clone();
    if let Some(previous) = &call.echo.previous_response_id {
        let (earlier, mut before) = load_conversation(state, previous.clone(), owner.to_owned())
            .await?
            .ok_or_else(|| not_found(previous, Some("previous_response_id")))?;
        let answered: ResponseObject = serde_json::from_str(&earlier.response)
            .map_err(|e| ApiError::server(format!("stored response {previous} is unreadable: {e}")))?;
        before.extend(answered.output.iter().map(|item| serde_json::to_value(item).expect("items serialize")));
        before.extend(input.iter().cloned());
        conversation = before;
        request.insert("input".into(), Value::Array(conversation.clone()));
    }
    let leading = serde_json::to_string(&conversation).unwrap_or_default();
    let routed = Routed {
        affinity: Some(affinity_key(&call.chat.model, &leading)),
        model: call.chat.model,
        stream: call.chat.stream,
    };
    let body = Bytes::from(serde_json::to_vec(&request).expect("JSON serializes"));
    Ok(Prepared { routed, body, input, previous: call.echo.previous_response_id.clone(), store: call.store })
}

/// What storing an answer needs.
struct Keep {
    state: Arc<RouterState>,
    owner: String,
    /// The request's own input items.
    input: Vec<Value>,
    previous: Option<String>,
}

impl Keep {
    /// Stores `response` (the object's JSON). A failure is logged: the client has its answer.
    async fn store(self, response: Value) {
        let Ok(object) = serde_json::from_value::<ResponseObject>(response.clone()) else {
            tracing::warn!("a node's response object did not parse; not stored");
            return;
        };
        let row = StoredResponse {
            id: object.id.clone(),
            owner: self.owner,
            model: object.model.clone(),
            created_at: object.created_at,
            input: Value::Array(self.input).to_string(),
            response: response.to_string(),
            previous_id: self.previous,
        };
        let expire_before = unix_now().saturating_sub(self.state.config.responses_retention.as_secs());
        let state = self.state;
        let stored = tokio::task::spawn_blocking(move || state.db.insert_response(&row, expire_before)).await;
        match stored {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(response = %object.id, "storing the response failed: {e}"),
            Err(e) => tracing::warn!(response = %object.id, "storing the response panicked: {e}"),
        }
    }
}

async fn keep_whole(resp: Response, keep: Keep) -> Response {
    let (parts, body) = resp.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => return ApiError::with_status(502, format!("reading the node's answer failed: {e}")).into_response(),
    };
    if let Ok(object) = serde_json::from_slice::<Value>(&bytes) {
        keep.store(object).await;
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// Passes the stream on as it comes, and stores the final response object when its event
/// passes through (only whole events are parsed; the rest of the stream is not buffered).
fn keep_streamed(resp: Response, keep: Keep) -> Response {
    let (parts, body) = resp.into_parts();
    let mut tap = FinalEvent::default();
    let mut keep = Some(keep);
    let stream = body.into_data_stream().then(move |chunk| {
        let found = match &chunk {
            Ok(bytes) => tap.push(bytes),
            Err(_) => None,
        };
        let keep = found.and_then(|response| keep.take().map(|k| (k, response)));
        async move {
            if let Some((keep, response)) = keep {
                keep.store(response).await;
            }
            chunk
        }
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Finds the final `response.completed` / `response.incomplete` event in a stream of SSE bytes.
#[derive(Default)]
struct FinalEvent {
    /// The bytes of the event not yet complete.
    pending: Vec<u8>,
}

impl FinalEvent {
    fn push(&mut self, chunk: &[u8]) -> Option<Value> {
        self.pending.extend_from_slice(chunk);
        let mut found = None;
        while let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            let Ok(text) = std::str::from_utf8(&event) else { continue };
            let (mut name, mut data) = ("", "");
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    name = v;
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = v;
                }
            }
            if name == "response.completed" || name == "response.incomplete" {
                found = serde_json::from_str::<Value>(data).ok().and_then(|v| v.get("response").cloned());
            }
        }
        found
    }
}

pub async fn retrieve(
    State(state): State<Arc<RouterState>>,
    principal: Option<Extension<Principal>>,
    Path(id): Path<String>,
    Query(query): Query<RetrieveQuery>,
) -> Response {
    if query.stream == Some(true) {
        return ApiError::invalid("stream", "replaying a stored response as a stream is not supported").into_response();
    }
    match load(&state, id.clone(), owner(principal.as_deref())).await {
        Ok(Some(stored)) => ([(header::CONTENT_TYPE, "application/json")], stored.response).into_response(),
        Ok(None) => not_found(&id, None).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize)]
pub struct RetrieveQuery {
    stream: Option<bool>,
}

pub async fn delete(
    State(state): State<Arc<RouterState>>,
    principal: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> Response {
    let owner = owner(principal.as_deref());
    let (db_state, key) = (state.clone(), id.clone());
    let deleted = tokio::task::spawn_blocking(move || db_state.db.delete_response(&key, &owner)).await;
    match deleted {
        Ok(Ok(true)) => Json(DeletedResponse { id, object: "response.deleted".into(), deleted: true }).into_response(),
        Ok(Ok(false)) => not_found(&id, None).into_response(),
        Ok(Err(e)) => db_error(e).into_response(),
        Err(e) => ApiError::server(format!("the response store panicked: {e}")).into_response(),
    }
}

#[derive(Deserialize)]
pub struct ItemsQuery {
    #[serde(default)]
    order: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    after: Option<String>,
}

/// OpenAI's bounds on a page of input items.
const DEFAULT_ITEMS: usize = 20;
const MAX_ITEMS: usize = 100;

/// `GET /v1/responses/{id}/input_items`: the items the response answered, newest first by
/// default, in pages (`limit`, `after`). Items without an id get one that names their place.
pub async fn input_items_list(
    State(state): State<Arc<RouterState>>,
    principal: Option<Extension<Principal>>,
    Path(id): Path<String>,
    Query(query): Query<ItemsQuery>,
) -> Response {
    let limit = query.limit.unwrap_or(DEFAULT_ITEMS);
    if !(1..=MAX_ITEMS).contains(&limit) {
        return ApiError::invalid("limit", format!("must be between 1 and {MAX_ITEMS}")).into_response();
    }
    let descending = match query.order.as_deref() {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return ApiError::invalid("order", format!("`{other}` is not one of `asc`, `desc`")).into_response()
        }
    };
    let stored = match load_conversation(&state, id.clone(), owner(principal.as_deref())).await {
        Ok(Some((_, items))) => items,
        Ok(None) => return not_found(&id, None).into_response(),
        Err(e) => return e.into_response(),
    };
    let suffix = id.trim_start_matches("resp_");
    let mut items: Vec<Value> =
        stored.into_iter().enumerate().map(|(i, item)| listed_item(item, format!("item_{suffix}_{i}"))).collect();
    if descending {
        items.reverse();
    }
    let start = match &query.after {
        Some(after) => match items.iter().position(|it| it["id"] == after.as_str()) {
            Some(i) => i + 1,
            None => {
                return ApiError::invalid("after", format!("`{after}` is not an item of this response")).into_response()
            }
        },
        None => 0,
    };
    let page: Vec<Value> = items.iter().skip(start).take(limit).cloned().collect();
    let has_more = start + page.len() < items.len();
    Json(json!({
        "object": "list",
        "data": page,
        "first_id": page.first().map(|it| it["id"].clone()),
        "last_id": page.last().map(|it| it["id"].clone()),
        "has_more": has_more,
    }))
    .into_response()
}

/// An input item as the API lists it: every item has an id and a status, a message's content is
/// a list of parts (`input_text`, or `output_text` with its annotations for the assistant's).
fn listed_item(mut item: Value, id: String) -> Value {
    let Some(fields) = item.as_object_mut() else { return item };
    fields.entry("id").or_insert(Value::String(id));
    fields.entry("status").or_insert(Value::String("completed".into()));
    if fields.get("type").is_none() && fields.contains_key("role") {
        fields.insert("type".into(), Value::String("message".into()));
    }
    if fields.get("type").and_then(Value::as_str) != Some("message") {
        return item;
    }
    let assistant = fields.get("role").and_then(Value::as_str) == Some("assistant");
    let part = |text: Value| {
        if assistant {
            json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
        } else {
            json!({"type": "input_text", "text": text})
        }
    };
    match fields.get_mut("content") {
        Some(Value::String(text)) => {
            let text = Value::String(std::mem::take(text));
            fields.insert("content".into(), json!([part(text)]));
        }
        Some(Value::Array(parts)) => {
            for p in parts.iter_mut().filter_map(Value::as_object_mut) {
                if p.get("type").and_then(Value::as_str) == Some("output_text") {
                    p.entry("annotations").or_insert(json!([]));
                    p.entry("logprobs").or_insert(json!([]));
                }
            }
        }
        _ => {}
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_event_is_found_across_chunk_boundaries() {
        let stream = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n",
            "event: response.output_text.delta\ndata: {\"delta\":\"hi\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"status\":\"completed\"}}\n\n",
        );
        for split in 1..stream.len() {
            let mut tap = FinalEvent::default();
            let (a, b) = stream.as_bytes().split_at(split);
            let found = tap.push(a).or_else(|| tap.push(b));
            assert_eq!(found, Some(json!({"id": "r", "status": "completed"})), "split at {split}");
        }
        let mut tap = FinalEvent::default();
        assert_eq!(tap.push(b"event: response.failed\ndata: {\"response\":{}}\n\n"), None);
    }

    #[test]
    fn listed_items_have_ids_statuses_and_parts() {
        let user = listed_item(json!({"role": "user", "content": "hi"}), "item_0".into());
        assert_eq!(
            user,
            json!({"id": "item_0", "status": "completed", "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "hi"}]})
        );
        let answer = listed_item(
            json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "yo"}]}),
            "item_1".into(),
        );
        assert_eq!(answer["id"], "msg_1");
        assert_eq!(answer["content"][0]["annotations"], json!([]));
        let output =
            listed_item(json!({"type": "function_call_output", "call_id": "c", "output": "x"}), "item_2".into());
        assert_eq!((output["id"].as_str(), output["status"].as_str()), (Some("item_2"), Some("completed")));
    }
}
