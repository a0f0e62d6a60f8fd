//! `POST /v1/completions`: a raw prompt in (no chat template), `text_completion` objects out.

use super::pipeline::{self, Encoder, GenerationRequest};
use super::{parse_json, SharedState};
use crate::generation::{Collected, Finished, Piece, Prompt};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llmr_engine_host::Capability;
use llmr_openai::{
    new_id, sse as wire, unix_now, ApiError, CompletionRequest, FinishReason, TextChoice, TextCompletion, TextLogprobs,
    Usage,
};
use llmr_telemetry::RequestId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const ENDPOINT: &str = "completions";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub async fn handle(State(state): State<SharedState>, id: RequestId, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    pipeline::respond(ENDPOINT, &id, async {
        let req = parse_json::<CompletionRequest>(body, state.body_limit)?.validate()?;
        let generation = GenerationRequest {
            endpoint: ENDPOINT,
            model: req.model.clone(),
            sampling: req.sampling.clone(),
            stream: req.stream,
            prompt_param: "prompt",
            constraint_param: req.constraint_param,
            unset: req.unset,
            arrived,
        };
        pipeline::generate(&state, &id, generation, |model| {
            model.require(Capability::Text)?;
            let echo = if req.echo { req.prompt.clone() } else { String::new() };
            let encoder = CompletionEncoder {
                id: new_id("cmpl", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
                model: model.name.clone(),
                created: unix_now(),
                fingerprint: state.fingerprint.clone(),
                include_usage: req.include_usage,
                logprobs: req.sampling.logprobs.is_some(),
                offset: echo.len(),
                echo,
            };
            let prompt = match &req.prompt_tokens {
                Some(ids) => Prompt::tokens(ids.clone()),
                None => Prompt::raw(req.prompt.clone()),
            };
            Ok((prompt, encoder))
        })
        .await
    })
    .await
}

struct CompletionEncoder {
    id: String,
    model: String,
    created: u64,
    fingerprint: String,
    include_usage: bool,
    logprobs: bool,
    /// The prompt, when the request asked for it back (`echo`).
    echo: String,
    /// Where the next piece starts in the returned text (logprobs' `text_offset`).
    offset: usize,
}

fn finish_reason(f: &Finished) -> FinishReason {
    if f.stopped {
        FinishReason::Stop
    } else {
        FinishReason::Length
    }
}

fn usage(f: &Finished) -> Usage {
    Usage::new(f.prompt_tokens, f.completion_tokens, f.cached_tokens)
}

impl CompletionEncoder {
    fn body(&self, choices: Vec<TextChoice>, usage: Option<Usage>) -> TextCompletion {
        TextCompletion {
            id: self.id.clone(),
            object: "text_completion".into(),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: Some(self.fingerprint.clone()),
            choices,
            usage,
        }
    }

    fn chunk(&self, text: String, logprobs: Option<TextLogprobs>, finish_reason: Option<FinishReason>) -> String {
        wire::event(&self.body(vec![TextChoice { text, index: 0, logprobs, finish_reason }], None))
    }
}

impl Encoder for CompletionEncoder {
    fn open(&mut self, _prompt_tokens: u32, out: &mut Vec<String>) {
        if !self.echo.is_empty() {
            let echo = std::mem::take(&mut self.echo);
            out.push(self.chunk(echo, None, None));
        }
    }

    fn piece(&mut self, piece: Piece, out: &mut Vec<String>) {
        let logprobs = piece.logprob.as_ref().map(|l| TextLogprobs::from_tokens(std::slice::from_ref(l), self.offset));
        self.offset += piece.text.len();
        if !piece.text.is_empty() || logprobs.is_some() {
            out.push(self.chunk(piece.text, logprobs, None));
        }
    }

    fn finish(&mut self, finished: Finished, out: &mut Vec<String>) {
        out.push(self.chunk(String::new(), None, Some(finish_reason(&finished))));
        if self.include_usage {
            out.push(wire::event(&self.body(Vec::new(), Some(usage(&finished)))));
        }
        out.push(wire::DONE.to_owned());
    }

    fn fail(&mut self, error: &ApiError, out: &mut Vec<String>) {
        out.push(wire::error_event(error));
        out.push(wire::DONE.to_owned());
    }

    fn complete(self, c: Collected) -> Response {
        let choice = TextChoice {
            logprobs: self.logprobs.then(|| TextLogprobs::from_tokens(&c.logprobs, self.echo.len())),
            text: self.echo.clone() + &c.text,
            index: 0,
            finish_reason: Some(finish_reason(&c.finished)),
        };
        Json(self.body(vec![choice], Some(usage(&c.finished)))).into_response()
    }
}
