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
        let generation = GenerationRequest::chat(ENDPOINT, &req, "messages", arrived);
        pipeline::generate(&state, &id, generation, |model| {
            let (prompt, reading) = render_chat(model, &req)?;
            let n = req.n as usize;
            let encoder = ChatEncoder {
                id: new_id("chatcmpl", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
                model: model.name.clone(),
                created: unix_now(),
                fingerprint: state.fingerprint.clone(),
                include_usage: req.include_usage,
                logprobs: req.sampling.logprobs.is_some(),
                reading,
                readers: Vec::new(),
                called: vec![false; n],
                n,
            };
            Ok((vec![prompt], encoder))
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
    /// Read thinking and tool calls out of each choice's streamed answer (made when the stream
    /// opens, when there is anything to read out).
    readers: Vec<AnswerReader>,
    /// Which choices streamed a tool call.
    called: Vec<bool>,
    /// Choices (`n`).
    n: usize,
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
    fn call_id(&self, choice: usize, index: usize) -> String {
        let id = self.id.trim_start_matches("chatcmpl-");
        if self.n == 1 {
            format!("call_{id}_{index}")
        } else {
            format!("call_{id}_{choice}_{index}")
        }
    }

    fn wire_call(&self, choice: usize, index: usize, call: ParsedCall) -> WireToolCall {
        WireToolCall {
            id: self.call_id(choice, index),
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

    fn delta(
        &self,
        choice: usize,
        delta: Delta,
        logprobs: Option<Logprobs>,
        finish_reason: Option<FinishReason>,
    ) -> String {
        self.chunk(vec![ChunkChoice { index: choice as u32, delta, logprobs, finish_reason }], None)
    }

    fn content(&self, choice: usize, text: String, logprobs: Option<Logprobs>) -> String {
        self.delta(choice, Delta { content: Some(text), ..Default::default() }, logprobs, None)
    }

    fn parsed(&mut self, choice: usize, events: Vec<AnswerEvent>, out: &mut Vec<String>) {
        for ev in events {
            match ev {
                AnswerEvent::Reasoning(text) => out.push(self.delta(
                    choice,
                    Delta { reasoning_content: Some(text), ..Default::default() },
                    None,
                    None,
                )),
                AnswerEvent::Content(text) => out.push(self.content(choice, text, None)),
                AnswerEvent::Call { index, call } => {
                    self.called[choice] = true;
                    let c = self.wire_call(choice, index, call);
                    let chunk = ToolCallChunk { index: index as u32, id: c.id, kind: c.kind, function: c.function };
                    out.push(self.delta(choice, Delta { tool_calls: vec![chunk], ..Default::default() }, None, None));
                }
            }
        }
    }
}

impl Encoder for ChatEncoder {
    fn open(&mut self, _prompt_tokens: u32, out: &mut Vec<String>) {
        if !self.reading.is_plain() {
            self.readers = (0..self.n).map(|_| self.reading.reader()).collect();
        }
        for choice in 0..self.n {
            let role = Delta { role: Some(Role::Assistant), content: Some(String::new()), ..Default::default() };
            out.push(self.delta(choice, role, None, None));
        }
    }

    fn piece(&mut self, choice: usize, piece: Piece, out: &mut Vec<String>) {
        match self.readers.get_mut(choice) {
            Some(reader) => {
                let events = reader.push(&piece.text);
                self.parsed(choice, events, out);
            }
            None if piece.text.is_empty() => {}
            None => {
                let logprobs = (self.logprobs)
                    .then(|| piece.logprob.as_ref().map(|l| Logprobs::from_tokens(std::slice::from_ref(l))))
                    .flatten();
                out.push(self.content(choice, piece.text, logprobs));
            }
        }
    }

    fn finish(&mut self, choice: usize, finished: Finished, out: &mut Vec<String>) {
        if let Some(reader) = self.readers.get_mut(choice) {
            let events = reader.finish();
            self.parsed(choice, events, out);
        }
        let reason = finish_reason(&finished, self.called[choice]);
        out.push(self.delta(choice, Delta::default(), None, Some(reason)));
    }

    fn end(&mut self, total: Finished, out: &mut Vec<String>) {
        if self.include_usage {
            out.push(self.chunk(Vec::new(), Some(usage(&total))));
        }
        out.push(wire::DONE.to_owned());
    }

    fn fail(&mut self, error: &ApiError, out: &mut Vec<String>) {
        out.push(wire::error_event(error));
        out.push(wire::DONE.to_owned());
    }

    fn complete(self, collected: Vec<Collected>) -> Response {
        let finished: Vec<Finished> = collected.iter().map(|c| c.finished).collect();
        let mut choices = Vec::with_capacity(collected.len());
        for (choice, c) in collected.into_iter().enumerate() {
            let answer = self.reading.read(&c.text);
            let reasoning = (!answer.reasoning.is_empty()).then_some(answer.reasoning);
            let tool_calls: Vec<WireToolCall> =
                answer.calls.into_iter().enumerate().map(|(i, call)| self.wire_call(choice, i, call)).collect();
            let content = answer.content;
            let content = if tool_calls.is_empty() || !content.trim().is_empty() { Some(content) } else { None };
            choices.push(ChatChoice {
                index: choice as u32,
                finish_reason: finish_reason(&c.finished, !tool_calls.is_empty()),
                message: ResponseMessage {
                    role: Role::Assistant,
                    content,
                    reasoning_content: reasoning,
                    refusal: None,
                    tool_calls,
                },
                logprobs: self.logprobs.then(|| Logprobs::from_tokens(&c.logprobs)),
            });
        }
        let body = ChatCompletion {
            object: "chat.completion".into(),
            created: self.created,
            model: self.model,
            system_fingerprint: Some(self.fingerprint),
            choices,
            usage: Some(usage(&pipeline::total(&finished, self.n))),
            id: self.id,
        };
        Json(body).into_response()
    }
}
