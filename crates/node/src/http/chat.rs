//! `POST /v1/chat/completions`.

use super::{count_error, parse_json, sse, HttpError, SharedState};
use crate::generation::{self, Collected, Finished, GenEvent, Generation, GenerationInput};
use crate::metrics as m;
use crate::models::LoadedModel;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llmr_chat_template::RenderInput;
use llmr_openai::{
    new_id, sse as wire, unix_now, ApiError, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
    ChatRequest, ChunkChoice, Delta, Logprobs, ResponseMessage, ToolCallChunk, ToolChoice, Usage, WireFunctionCall,
    WireToolCall,
};
use llmr_tool_calls::{ParsedCall, StreamEvent, StreamParser, ToolCallFormat};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

const ENDPOINT: &str = "chat";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// How tool calls are read from this request's output.
#[derive(Clone)]
struct ToolParsing {
    format: ToolCallFormat,
    allowed: Vec<String>,
    /// Text the prompt ends with to force a call (`tool_choice` required or named).
    prefill: String,
}

pub async fn handle(State(state): State<SharedState>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    match run(state, body, arrived).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn run(state: SharedState, body: Result<Bytes, BytesRejection>, arrived: Instant) -> Result<Response, HttpError> {
    let wire: ChatCompletionRequest = parse_json(body, state.body_limit, ENDPOINT)?;
    let fail = |e: ApiError| count_error(ENDPOINT, e);
    let req = wire.validate().map_err(fail)?;
    let model = state.models.get(&req.model).await.map_err(fail)?;
    // Counted once the model is known: request JSON must not create metric series.
    metrics::counter!(m::REQUESTS, "endpoint" => ENDPOINT, "model" => model.name.clone()).increment(1);
    let (prompt, tools) = render(&model, &req).map_err(fail)?;
    req.sampling.check_top_k(model.engine.info().vocab_size).map_err(fail)?;
    let prompt_tokens = generation::count_tokens(&model, &prompt, false, true).await.map_err(fail)?;
    req.sampling.check_context(prompt_tokens, model.engine.info().context_length, "messages").map_err(fail)?;

    let input = GenerationInput {
        prompt,
        sampling: req.sampling.clone(),
        add_bos: false,
        parse_special: true,
        endpoint: ENDPOINT,
        arrived,
    };
    let gen = generation::begin(&model, &state.cache, input).await.map_err(fail)?;
    let id = new_id("chatcmpl", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    if req.stream {
        stream(state, model, req, tools, gen, id).await
    } else {
        let collected = generation::collect(gen).await.map_err(fail)?;
        Ok(Json(complete(&state, &model.name, &req, tools.as_ref(), collected, id)).into_response())
    }
}

/// The prompt, and how to read tool calls from the answer (when tools are offered).
fn render(model: &LoadedModel, req: &ChatRequest) -> Result<(String, Option<ToolParsing>), ApiError> {
    let templates = model
        .templates
        .as_ref()
        .ok_or_else(|| ApiError::invalid("model", format!("`{}` is an embedding model; it cannot chat", model.name)))?;
    let offer_tools = !req.tools.is_empty() && req.tool_choice != ToolChoice::None;
    let mut input = RenderInput::new(&req.messages, true);
    if offer_tools {
        input = input.with_tools(&req.tools);
    }
    input.kwargs.extend(req.template_kwargs.clone());
    let mut prompt = templates
        .render(&input)
        .map_err(|e| ApiError::invalid("messages", format!("the chat template rejected them: {e}")))?;
    if !offer_tools {
        return Ok((prompt, None));
    }
    let template = templates.select(true);
    let format = ToolCallFormat::detect(Some(template.source()), &model.engine.info().architecture);
    let prefill = match &req.tool_choice {
        ToolChoice::Required => format.forced_prefix(None),
        ToolChoice::Function(name) => format.forced_prefix(Some(name)),
        ToolChoice::Auto | ToolChoice::None => String::new(),
    };
    prompt.push_str(&prefill);
    let allowed = req.tools.iter().map(|t| t.function.name.clone()).collect();
    Ok((prompt, Some(ToolParsing { format, allowed, prefill })))
}

fn call_id(response_id: &str, index: usize) -> String {
    format!("call_{}_{index}", response_id.trim_start_matches("chatcmpl-"))
}

fn wire_call(response_id: &str, index: usize, call: ParsedCall) -> WireToolCall {
    WireToolCall {
        id: call_id(response_id, index),
        kind: "function".into(),
        function: WireFunctionCall { name: call.name, arguments: call.arguments },
    }
}

/// A generation cut by the length limit is `length` even if it made calls before (OpenAI's rule:
/// the answer is incomplete).
fn finish_reason(f: &Finished, called: bool) -> &'static str {
    match (f.stopped, called) {
        (false, _) => "length",
        (true, true) => "tool_calls",
        (true, false) => "stop",
    }
}

fn usage(f: &Finished) -> Usage {
    Usage::new(f.prompt_tokens, f.completion_tokens, f.cached_tokens)
}

fn complete(
    state: &SharedState,
    model: &str,
    req: &ChatRequest,
    tools: Option<&ToolParsing>,
    c: Collected,
    id: String,
) -> ChatCompletion {
    let (content, calls) = match tools {
        Some(t) => {
            let allowed: Vec<&str> = t.allowed.iter().map(String::as_str).collect();
            let parsed = t.format.parse_with_prefill(&t.prefill, &c.text, &allowed);
            (parsed.content, parsed.calls)
        }
        None => (c.text, Vec::new()),
    };
    let tool_calls: Vec<WireToolCall> =
        calls.into_iter().enumerate().map(|(i, call)| wire_call(&id, i, call)).collect();
    let content = if tool_calls.is_empty() || !content.trim().is_empty() { Some(content) } else { None };
    ChatCompletion {
        object: "chat.completion",
        created: unix_now(),
        model: model.to_owned(),
        system_fingerprint: state.fingerprint.clone(),
        choices: vec![ChatChoice {
            index: 0,
            finish_reason: finish_reason(&c.finished, !tool_calls.is_empty()),
            message: ResponseMessage { role: "assistant", content, refusal: None, tool_calls },
            logprobs: req.sampling.logprobs.map(|_| Logprobs::from_tokens(&c.logprobs)),
        }],
        usage: usage(&c.finished),
        id,
    }
}

/// Builds this response's chunks.
struct Chunks {
    id: String,
    model: String,
    created: u64,
    fingerprint: String,
}

impl Chunks {
    fn event(&self, delta: Delta, logprobs: Option<Logprobs>, finish: Option<&'static str>) -> String {
        wire::event(&ChatCompletionChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: &self.fingerprint,
            choices: vec![ChunkChoice { index: 0, delta, logprobs, finish_reason: finish }],
            usage: None,
        })
    }

    fn usage_event(&self, usage: Usage) -> String {
        wire::event(&ChatCompletionChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: &self.fingerprint,
            choices: Vec::new(),
            usage: Some(usage),
        })
    }

    fn content(&self, text: String, logprobs: Option<Logprobs>) -> String {
        self.event(Delta { content: Some(text), ..Default::default() }, logprobs, None)
    }

    fn call(&self, index: usize, call: ParsedCall) -> String {
        let c = wire_call(&self.id, index, call);
        let chunk = ToolCallChunk { index: index as u32, id: c.id, kind: "function", function: c.function };
        self.event(Delta { tool_calls: vec![chunk], ..Default::default() }, None, None)
    }
}

struct StreamState {
    gen: Generation,
    chunks: Chunks,
    parser: Option<StreamParser>,
    called: bool,
    include_usage: bool,
    logprobs: bool,
    pending: std::collections::VecDeque<String>,
    done: bool,
    _model: Arc<LoadedModel>,
}

impl StreamState {
    fn on_parser_events(&mut self, events: Vec<StreamEvent>) {
        for ev in events {
            match ev {
                StreamEvent::Content(text) if text.is_empty() => {}
                StreamEvent::Content(text) => self.pending.push_back(self.chunks.content(text, None)),
                StreamEvent::Call { index, call } => {
                    self.called = true;
                    self.pending.push_back(self.chunks.call(index, call));
                }
            }
        }
    }

    fn on_event(&mut self, ev: GenEvent) {
        match ev {
            GenEvent::Piece(p) => match self.parser.as_mut() {
                Some(parser) => {
                    let events = parser.push(&p.text);
                    self.on_parser_events(events);
                }
                None if p.text.is_empty() => {}
                None => {
                    let lp = if self.logprobs {
                        p.logprob.as_ref().map(|l| Logprobs::from_tokens(std::slice::from_ref(l)))
                    } else {
                        None
                    };
                    self.pending.push_back(self.chunks.content(p.text, lp));
                }
            },
            GenEvent::Done(Ok(f)) => {
                if let Some(parser) = self.parser.as_mut() {
                    let events = parser.finish();
                    self.on_parser_events(events);
                }
                let reason = finish_reason(&f, self.called);
                self.pending.push_back(self.chunks.event(Delta::default(), None, Some(reason)));
                if self.include_usage {
                    self.pending.push_back(self.chunks.usage_event(usage(&f)));
                }
                self.pending.push_back(wire::DONE.to_owned());
                self.done = true;
            }
            GenEvent::Done(Err(e)) => {
                metrics::counter!(m::ERRORS, "endpoint" => ENDPOINT, "status" => e.status.to_string()).increment(1);
                self.pending.push_back(wire::error_event(&e));
                self.pending.push_back(wire::DONE.to_owned());
                self.done = true;
            }
        }
    }
}

async fn stream(
    state: SharedState,
    model: Arc<LoadedModel>,
    req: ChatRequest,
    tools: Option<ToolParsing>,
    mut gen: Generation,
    id: String,
) -> Result<Response, HttpError> {
    // Wait for the first event before answering, so an engine error is still a plain HTTP error.
    let first = gen.events.recv().await.ok_or_else(|| ApiError::server("the engine stopped before the first token"))?;
    if let GenEvent::Done(Err(e)) = first {
        return Err(count_error(ENDPOINT, e));
    }
    let chunks = Chunks { id, model: model.name.clone(), created: unix_now(), fingerprint: state.fingerprint.clone() };
    let role =
        chunks.event(Delta { role: Some("assistant"), content: Some(String::new()), ..Default::default() }, None, None);
    let mut st = StreamState {
        gen,
        chunks,
        parser: tools.map(|t| StreamParser::new(t.format, t.allowed).with_prefill(&t.prefill)),
        called: false,
        include_usage: req.include_usage,
        logprobs: req.sampling.logprobs.is_some(),
        pending: [role].into(),
        done: false,
        _model: model,
    };
    st.on_event(first);
    let events = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(e) = st.pending.pop_front() {
                return Some((e, st));
            }
            if st.done {
                return None;
            }
            match st.gen.events.recv().await {
                Some(ev) => st.on_event(ev),
                None => return None,
            }
        }
    });
    Ok(sse::response(events))
}
