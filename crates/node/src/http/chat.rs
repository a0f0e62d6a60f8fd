//! `POST /v1/chat/completions`: the chat template renders the prompt; the answer is a chat
//! completion, or `chat.completion.chunk` events, with tool calls read out of the text.

use super::pipeline::{self, Encoder, GenerationRequest};
use super::{parse_json, SharedState};
use crate::answer::{AnswerEvent, AnswerReader, Reading};
use crate::generation::{Collected, Finished, Piece};
use crate::prompt::render_chat;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llmr_openai::{
    new_id, sse as wire, unix_now, ApiError, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
    ChunkChoice, Delta, FinishReason, Logprobs, ResponseMessage, Role, ToolCallChunk, Usage, WireFunctionCall,
    WireToolCall,
};
use llmr_telemetry::RequestId;
use llmr_tool_calls::ParsedCall;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const ENDPOINT: &str = "chat";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub async fn handle(State(state): State<SharedState>, id: RequestId, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    pipeline::respond(ENDPOINT, &id, async {
        let req = parse_json::<ChatCompletionRequest>(body, state.body_limit)?.validate()?;
        let generation = GenerationRequest {
            endpoint: ENDPOINT,
            model: req.model.clone(),
            sampling: req.sampling.clone(),
            stream: req.stream,
            prompt_param: "messages",
            constraint_param: req.constraint_param,
            unset: req.unset,
            arrived,
        };
        pipeline::generate(&state, &id, generation, |model| {
            let (prompt, reading) = render_chat(model, &req)?;
            let encoder = ChatEncoder {
                id: new_id("chatcmpl", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
                model: model.name.clone(),
                created: unix_now(),
                fingerprint: state.fingerprint.clone(),
                include_usage: req.include_usage,
                logprobs: req.sampling.logprobs.is_some(),
                reading,
                reader: None,
                called: false,
            };
            Ok((prompt, encoder))
        })
        .await
    })
    .await
}

struct ChatEncoder {
    id: String,
    model: String,
    created: u64,
    fingerprint: String,
    include_usage: bool,
    logprobs: bool,
    reading: Reading,
    /// Reads thinking and tool calls out of a streamed answer (made when the stream opens,
    /// when there is anything to read out).
    reader: Option<AnswerReader>,
    /// A tool call was streamed.
    called: bool,
}

/// A generation cut by the length limit is `length` even if it made calls before (OpenAI's rule:
/// the answer is incomplete).
fn finish_reason(f: &Finished, called: bool) -> FinishReason {
    match (f.stopped, called) {
        (false, _) => FinishReason::Length,
        (true, true) => FinishReason::ToolCalls,
        (true, false) => FinishReason::Stop,
    }
}

fn usage(f: &Finished) -> Usage {
    Usage::new(f.prompt_tokens, f.completion_tokens, f.cached_tokens)
}

impl ChatEncoder {
    fn call_id(&self, index: usize) -> String {
        format!("call_{}_{index}", self.id.trim_start_matches("chatcmpl-"))
    }

    fn wire_call(&self, index: usize, call: ParsedCall) -> WireToolCall {
        WireToolCall {
            id: self.call_id(index),
            kind: "function".into(),
            function: WireFunctionCall { name: call.name, arguments: call.arguments },
        }
    }

    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> String {
        wire::event(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: Some(self.fingerprint.clone()),
            choices,
            usage,
        })
    }

    fn delta(&self, delta: Delta, logprobs: Option<Logprobs>, finish_reason: Option<FinishReason>) -> String {
        self.chunk(vec![ChunkChoice { index: 0, delta, logprobs, finish_reason }], None)
    }

    fn content(&self, text: String, logprobs: Option<Logprobs>) -> String {
        self.delta(Delta { content: Some(text), ..Default::default() }, logprobs, None)
    }

    fn parsed(&mut self, events: Vec<AnswerEvent>, out: &mut Vec<String>) {
        for ev in events {
            match ev {
                AnswerEvent::Reasoning(text) => {
                    out.push(self.delta(Delta { reasoning_content: Some(text), ..Default::default() }, None, None))
                }
                AnswerEvent::Content(text) => out.push(self.content(text, None)),
                AnswerEvent::Call { index, call } => {
                    self.called = true;
                    let c = self.wire_call(index, call);
                    let chunk = ToolCallChunk { index: index as u32, id: c.id, kind: c.kind, function: c.function };
                    out.push(self.delta(Delta { tool_calls: vec![chunk], ..Default::default() }, None, None));
                }
            }
        }
    }
}

impl Encoder for ChatEncoder {
    fn open(&mut self, _prompt_tokens: u32, out: &mut Vec<String>) {
        self.reader = (!self.reading.is_plain()).then(|| self.reading.reader());
        let role = Delta { role: Some(Role::Assistant), content: Some(String::new()), ..Default::default() };
        out.push(self.delta(role, None, None));
    }

    fn piece(&mut self, piece: Piece, out: &mut Vec<String>) {
        match self.reader.as_mut() {
            Some(reader) => {
                let events = reader.push(&piece.text);
                self.parsed(events, out);
            }
            None if piece.text.is_empty() => {}
            None => {
                let logprobs = (self.logprobs)
                    .then(|| piece.logprob.as_ref().map(|l| Logprobs::from_tokens(std::slice::from_ref(l))))
                    .flatten();
                out.push(self.content(piece.text, logprobs));
            }
        }
    }

    fn finish(&mut self, finished: Finished, out: &mut Vec<String>) {
        if let Some(reader) = self.reader.as_mut() {
            let events = reader.finish();
            self.parsed(events, out);
        }
        out.push(self.delta(Delta::default(), None, Some(finish_reason(&finished, self.called))));
        if self.include_usage {
            out.push(self.chunk(Vec::new(), Some(usage(&finished))));
        }
        out.push(wire::DONE.to_owned());
    }

    fn fail(&mut self, error: &ApiError, out: &mut Vec<String>) {
        out.push(wire::error_event(error));
        out.push(wire::DONE.to_owned());
    }

    fn complete(self, c: Collected) -> Response {
        let answer = self.reading.read(&c.text);
        let (content, calls) = (answer.content, answer.calls);
        let reasoning = (!answer.reasoning.is_empty()).then_some(answer.reasoning);
        let tool_calls: Vec<WireToolCall> =
            calls.into_iter().enumerate().map(|(i, call)| self.wire_call(i, call)).collect();
        let content = if tool_calls.is_empty() || !content.trim().is_empty() { Some(content) } else { None };
        let body = ChatCompletion {
            object: "chat.completion".into(),
            created: self.created,
            model: self.model,
            system_fingerprint: Some(self.fingerprint),
            choices: vec![ChatChoice {
                index: 0,
                finish_reason: finish_reason(&c.finished, !tool_calls.is_empty()),
                message: ResponseMessage {
                    role: Role::Assistant,
                    content,
                    reasoning_content: reasoning,
                    refusal: None,
                    tool_calls,
                },
                logprobs: self.logprobs.then(|| Logprobs::from_tokens(&c.logprobs)),
            }],
            usage: Some(usage(&c.finished)),
            id: self.id,
        };
        Json(body).into_response()
    }
}
