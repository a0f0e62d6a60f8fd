//! `POST /v1/messages` (Anthropic's Messages API): the request becomes the same domain chat
//! request as `/v1/chat/completions` (rendered, constrained and tool-parsed by the same code);
//! the answer is a `message` with text and `tool_use` blocks, or its stream of events.
//! `POST /v1/messages/count_tokens`: the rendered prompt's length.
//!
//! Errors leave as `ApiError`; the routes' `anthropic_errors` layer gives them Anthropic's shape.

use super::pipeline::{self, Encoder, GenerationRequest};
use super::{parse_json, SharedState};
use crate::answer::{AnswerEvent, AnswerReader, Reading};
use crate::generation::{self, Collected, Finished, Piece};
use crate::prompt::render_chat;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llmr_anthropic::{
    error::error_event, tool_input, BlockWriter, ContentBlock, CountTokensRequest, Message, MessageDelta,
    MessagesRequest, StopReason, StreamEvent, TokenCount, Usage,
};
use llmr_openai::{new_underscore_id, ApiError};
use llmr_telemetry::RequestId;
use llmr_tool_calls::ParsedCall;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const ENDPOINT: &str = "messages";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub async fn handle(State(state): State<SharedState>, id: RequestId, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    pipeline::respond(ENDPOINT, &id, async {
        let req = parse_json::<MessagesRequest>(body, state.body_limit)?.validate()?;
        let generation = GenerationRequest::chat(ENDPOINT, &req, "messages", arrived);
        pipeline::generate(&state, &id, generation, |model| {
            let (prompt, reading) = render_chat(model, &req)?;
            let encoder = MessagesEncoder {
                id: new_underscore_id("msg", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
                model: model.name.clone(),
                reader: reading.reader(),
                reading,
                blocks: BlockWriter::default(),
                calls: 0,
                stops: req.sampling.stop.clone(),
            };
            Ok((vec![prompt], encoder))
        })
        .await
    })
    .await
}

pub async fn count_tokens(
    State(state): State<SharedState>,
    id: RequestId,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    pipeline::respond("count_tokens", &id, async {
        let req = parse_json::<CountTokensRequest>(body, state.body_limit)?.validate()?;
        let model = state.models.get(&req.model).await?;
        pipeline::record_model(&model);
        let (prompt, _) = render_chat(&model, &req)?;
        let input_tokens = generation::count_tokens(&model, &prompt).await?;
        Ok(Json(TokenCount { input_tokens }).into_response())
    })
    .await
}

struct MessagesEncoder {
    id: String,
    model: String,
    reading: Reading,
    /// Reads thinking and tool calls out of a streamed answer.
    reader: AnswerReader,
    blocks: BlockWriter,
    /// Tool calls made so far.
    calls: usize,
    /// The request's `stop_sequences`, to name the one that ended the answer.
    stops: Vec<String>,
}

/// A generation cut by the length limit is `max_tokens` even after calls (the answer is cut);
/// one ended by a stop sequence is `stop_sequence`, with the sequence.
fn stop_reason(f: &Finished, called: bool, stops: &[String]) -> (StopReason, Option<String>) {
    let matched = f.stop_index.and_then(|i| stops.get(i as usize)).cloned();
    match (f.stopped, called, matched) {
        (false, _, _) => (StopReason::MaxTokens, None),
        (true, _, Some(stop)) => (StopReason::StopSequence, Some(stop)),
        (true, true, None) => (StopReason::ToolUse, None),
        (true, false, None) => (StopReason::EndTurn, None),
    }
}

fn usage(f: &Finished) -> Usage {
    Usage {
        input_tokens: f.prompt_tokens,
        output_tokens: f.completion_tokens,
        cache_read_input_tokens: f.cached_tokens,
        cache_creation_input_tokens: 0,
    }
}

impl MessagesEncoder {
    fn call_id(&self, index: usize) -> String {
        format!("toolu_{}_{index}", self.id.trim_start_matches("msg_"))
    }

    fn parsed(&mut self, events: Vec<AnswerEvent>, out: &mut Vec<String>) {
        for ev in events {
            match ev {
                AnswerEvent::Reasoning(thinking) => self.blocks.thinking(thinking, out),
                AnswerEvent::Content(text) => self.blocks.text(text, out),
                AnswerEvent::Call { index, call } => {
                    self.calls += 1;
                    let ParsedCall { name, arguments } = call;
                    self.blocks.tool_use(self.call_id(index), name, arguments, out);
                }
            }
        }
    }
}

impl Encoder for MessagesEncoder {
    fn open(&mut self, prompt_tokens: u32, out: &mut Vec<String>) {
        let usage = Usage { input_tokens: prompt_tokens, ..Default::default() };
        out.push(StreamEvent::MessageStart { message: Message::new(self.id.clone(), self.model.clone(), usage) }.sse());
    }

    fn piece(&mut self, _choice: usize, piece: Piece, out: &mut Vec<String>) {
        let events = self.reader.push(&piece.text);
        self.parsed(events, out);
    }

    fn finish(&mut self, _choice: usize, finished: Finished, out: &mut Vec<String>) {
        let events = self.reader.finish();
        self.parsed(events, out);
        self.blocks.close(out);
        let (stop_reason, stop_sequence) = stop_reason(&finished, self.calls > 0, &self.stops);
        let delta = MessageDelta { stop_reason, stop_sequence };
        out.push(StreamEvent::MessageDelta { delta, usage: usage(&finished) }.sse());
        out.push(StreamEvent::MessageStop.sse());
    }

    /// One choice: its finish event was the last.
    fn end(&mut self, _total: Finished, _out: &mut Vec<String>) {}

    fn fail(&mut self, error: &ApiError, out: &mut Vec<String>) {
        out.push(error_event(error));
    }

    fn complete(self, collected: Vec<Collected>) -> Response {
        let c = collected.into_iter().next().expect("one choice");
        let answer = self.reading.read(&c.text);
        let (text, calls) = (answer.content, answer.calls);
        let mut content = Vec::with_capacity(calls.len() + 2);
        if !answer.reasoning.is_empty() {
            content.push(ContentBlock::Thinking { thinking: answer.reasoning, signature: String::new() });
        }
        if !text.is_empty() && (calls.is_empty() || !text.trim().is_empty()) {
            content.push(ContentBlock::Text { text });
        }
        let called = !calls.is_empty();
        for (i, call) in calls.into_iter().enumerate() {
            content.push(ContentBlock::ToolUse {
                id: self.call_id(i),
                name: call.name,
                input: tool_input(&call.arguments),
            });
        }
        let mut message = Message::new(self.id, self.model, usage(&c.finished));
        message.content = content;
        let (stop_reason, stop_sequence) = stop_reason(&c.finished, called, &self.stops);
        message.stop_reason = Some(stop_reason);
        message.stop_sequence = stop_sequence;
        Json(message).into_response()
    }
}
