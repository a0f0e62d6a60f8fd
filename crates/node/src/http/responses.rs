//! `POST /v1/responses` (OpenAI's Responses API): the request's items become the same domain
//! chat request as `/v1/chat/completions`; the answer is a response object with message and
//! `function_call` items, or its typed events.
//!
//! The node keeps nothing: `previous_response_id` is resolved, and the response stored, by the
//! router, which says so with [`STORE_HEADER`] and sends the earlier items in `input`. Sent to a
//! node directly, `previous_response_id` is a 400 and `store` is reported `false`.

use super::pipeline::{self, Encoder, GenerationRequest};
use super::{parse_json, SharedState};
use crate::answer::{AnswerEvent, AnswerReader, Reading};
use crate::generation::{Collected, Finished, Piece};
use crate::prompt::render_chat;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llmr_openai::{unix_now, ApiError, Ending, ResponseObject, ResponseStream, ResponseUsage, ResponsesRequest};
use llmr_telemetry::RequestId;
use std::time::Instant;

const ENDPOINT: &str = "responses";

/// Sent by the router: it resolved `previous_response_id` and stores this response.
pub const STORE_HEADER: &str = "x-llmr-response-store";

pub async fn handle(
    State(state): State<SharedState>,
    id: RequestId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrived = Instant::now();
    pipeline::respond(ENDPOINT, &id, async {
        let call = parse_json::<ResponsesRequest>(body, state.body_limit)?.validate()?;
        let router_stores = headers.contains_key(STORE_HEADER);
        if call.echo.previous_response_id.is_some() && !router_stores {
            return Err(ApiError::invalid(
                "previous_response_id",
                "a node stores no responses: send the request through `llmr router` or `llmr serve`",
            ));
        }
        let req = call.chat;
        let generation = GenerationRequest::chat(ENDPOINT, &req, "input", arrived);
        let (echo, store) = (call.echo, call.store && router_stores);
        pipeline::generate(&state, &id, generation, |model| {
            let (prompt, reading) = render_chat(model, &req)?;
            let response_id = format!("resp_{}", RequestId::new());
            let start = ResponseObject::in_progress(response_id, model.name.clone(), unix_now(), &echo, store);
            let reader = reading.reader();
            Ok((vec![prompt], ResponsesEncoder { stream: ResponseStream::new(start), reading, reader }))
        })
        .await
    })
    .await
}

struct ResponsesEncoder {
    stream: ResponseStream,
    reading: Reading,
    /// Reads thinking and tool calls out of a streamed answer.
    reader: AnswerReader,
}

fn ending(f: &Finished) -> Ending {
    if f.stopped {
        Ending::Completed
    } else {
        Ending::Incomplete
    }
}

fn usage(f: &Finished) -> ResponseUsage {
    ResponseUsage::new(f.prompt_tokens, f.completion_tokens, f.cached_tokens)
}

impl ResponsesEncoder {
    fn call_id(&self, index: usize) -> String {
        format!("call_{}_{index}", self.stream.id().trim_start_matches("resp_"))
    }

    fn parsed(&mut self, events: Vec<AnswerEvent>, out: &mut Vec<String>) {
        for ev in events {
            match ev {
                AnswerEvent::Reasoning(text) => self.stream.reasoning(text, out),
                AnswerEvent::Content(text) => self.stream.text(text, out),
                AnswerEvent::Call { index, call } => {
                    let call_id = self.call_id(index);
                    self.stream.function_call(call_id, call.name, call.arguments, out);
                }
            }
        }
    }
}

impl Encoder for ResponsesEncoder {
    fn open(&mut self, _prompt_tokens: u32, out: &mut Vec<String>) {
        self.stream.open(out);
    }

    fn piece(&mut self, _choice: usize, piece: Piece, out: &mut Vec<String>) {
        let events = self.reader.push(&piece.text);
        self.parsed(events, out);
    }

    fn finish(&mut self, _choice: usize, finished: Finished, out: &mut Vec<String>) {
        let events = self.reader.finish();
        self.parsed(events, out);
        self.stream.finish(usage(&finished), ending(&finished), unix_now(), out);
    }

    /// One choice: its finish event was the last.
    fn end(&mut self, _total: Finished, _out: &mut Vec<String>) {}

    fn fail(&mut self, error: &ApiError, out: &mut Vec<String>) {
        self.stream.fail(error, out);
    }

    fn complete(mut self, collected: Vec<Collected>) -> Response {
        let c = collected.into_iter().next().expect("one choice");
        let answer = self.reading.read(&c.text);
        let (text, calls) = (answer.content, answer.calls);
        // The same events a stream would send, kept only for the object they build.
        let mut discard = Vec::new();
        self.stream.reasoning(answer.reasoning, &mut discard);
        if !text.is_empty() && (calls.is_empty() || !text.trim().is_empty()) {
            self.stream.text(text, &mut discard);
        }
        for (i, call) in calls.into_iter().enumerate() {
            let call_id = self.call_id(i);
            self.stream.function_call(call_id, call.name, call.arguments, &mut discard);
        }
        self.stream.finish(usage(&c.finished), ending(&c.finished), unix_now(), &mut discard);
        Json(self.stream.into_response_object()).into_response()
    }
}
